/*
 * A GET into device memory in the sans-IO session (engine/core/hr_devrx.c),
 * on the simulated device, with the piece copies' work items held back by
 * the host (async work, run only when the harness says):
 *
 *  - with every slot of a small ring waiting for its copy, the session
 *    reports hr_session_recv_paused(); a host that feeds bytes anyway has
 *    them kept aside (the spill) and placed once copies complete; the
 *    device bytes are right, through the copying path and the zero-copy
 *    (recv_target) path, P1 and P2;
 *  - a host that ignores the pause past the spill's bound fails that GET
 *    (RESOURCE_EXHAUSTED to the server), and the session goes on;
 *  - the pinned memory in use never exceeds the ring (live pinned blocks of
 *    the device are counted through a wrapper of its ops);
 *  - the device memory is allocated by a work item: input waits for it,
 *    with no deadline meanwhile.
 */
#include <stdatomic.h>

#include <hurray/gpu.h>

#include "common/test_util.h"
#include "engine_core/harness.h"

#define PIECE 4096u

/* Pinned memory alive, counted around the sim backend's ops. */
static const hr_gpu_ops *base_ops;
static hr_gpu_ops cnt_ops;
static uint64_t pinned_live, pinned_peak;
static uint64_t device_live, device_allocs; /* device buffers alive, made */

static int cnt_alloc(void *dev, int kind, uint64_t size, hr_gpu_mem_info *out) {
  int rv = base_ops->mem_alloc(dev, kind, size, out);
  if (rv == 0 && kind == HR_GPU_MEM_DEVICE) {
    device_live++;
    device_allocs++;
  }
  if (rv == 0 && kind == HR_GPU_MEM_PINNED) {
    pinned_live += size;
    if (pinned_live > pinned_peak)
      pinned_peak = pinned_live;
  }
  return rv;
}

static void cnt_free(void *dev, const hr_gpu_mem_info *m) {
  if (m->kind == HR_GPU_MEM_DEVICE)
    device_live--;
  if (m->kind == HR_GPU_MEM_PINNED)
    pinned_live -= m->size;
  base_ops->mem_free(dev, m);
}

/* The simulated device, device allocations above `max` bytes failing
 * (0: none). */
static hr_gpu *open_sim_max(uint64_t max) {
  hr_gpu_config cfg;
  hr_gpu *g;
  hr_gpu_config_default(&cfg);
  cfg.backend = "sim";
  cfg.sim_max_device_alloc = max;
  assert_int_equal(hr_gpu_open(&g, &cfg, NULL, NULL), 0);
  base_ops = hr_gpu_get_ops(g);
  cnt_ops = *base_ops;
  cnt_ops.mem_alloc = cnt_alloc;
  cnt_ops.mem_free = cnt_free;
  assert_int_equal(hr_gpu_del(g), 0);
  cfg.ops = &cnt_ops;
  assert_int_equal(hr_gpu_open(&g, &cfg, NULL, NULL), 0);
  pinned_live = pinned_peak = 0;
  device_live = device_allocs = 0;
  return g;
}

static hr_gpu *open_sim(void) {
  return open_sim_max(0);
}

/* Opens `p` (its fields set by the caller; client settings `cs`, NULL:
 * the defaults) and stores an n-byte tensor of pattern `seed` under "k". */
static hr_tensor *open_pair_k(pair *p, const hr_settings *cs, uint64_t n,
                              uint64_t seed) {
  assert_int_equal(pair_open(p, cs, NULL), 0);
  uint64_t shape[1] = {n};
  hr_tensor *t =
      dense(HR_ELEM_UINT8, HR_LAYOUT_ROW_MAJOR, 1, shape, NULL, 0, seed);
  store_put(&p->st, "k", t);
  return t;
}

/* Opens a pair whose client receives into `g` through a 2 x PIECE ring,
 * work items held back, and stores an n-byte tensor under "k". */
static hr_tensor *open_pair(pair *p, int zero_copy, uint64_t n) {
  memset(p, 0, sizeof *p);
  p->async_work = 1;
  p->chunked = 1;
  p->zero_copy = zero_copy;
  hr_settings cs;
  hr_settings_default(&cs);
  cs.device_piece = PIECE;
  cs.device_pieces = 2;
  return open_pair_k(p, &cs, n, 11);
}

/* Starts a GET of "k" into device `g` (`sync`) completing into `r`
 * (zeroed first). */
static void get_k(pair *p, hr_gpu *g, uint8_t sync, result *r, uint32_t *sid) {
  hr_get_opts o = get_opts("k");
  o.device = g;
  o.device_sync = sync;
  memset(r, 0, sizeof *r);
  assert_int_equal(hr_session_get(p->c, &o, on_get_done, r, sid), 0);
}

/* Moves bytes both ways without running work; returns 1 if any moved. */
static int pump_only(pair *p) {
  int64_t a = pump(p, p->c, p->s), b = pump(p, p->s, p->c);
  assert_true(a >= 0 && b >= 0);
  return a > 0 || b > 0;
}

static void get_through_spill(int zero_copy, uint8_t sync) {
  pair p;
  const uint64_t n = 40 * PIECE + 3;
  hr_gpu *g = open_sim();
  hr_tensor *t = open_pair(&p, zero_copy, n);
  result r;
  get_k(&p, g, sync, &r, NULL);
  /* Every byte reaches the client while no copy completes: the ring
   * fills, the session asks to pause, the rest is kept aside. */
  int paused = 0;
  while (pump_only(&p))
    paused |= hr_session_recv_paused(p.c);
  assert_true(paused);
  assert_true(hr_session_recv_paused(p.c));
  assert_int_equal(r.calls, 0);
  assert_true(pinned_live <= 2 * PIECE);
  /* The copies complete, the spill lands, the GET ends. */
  assert_int_equal(run(&p), 0);
  assert_false(hr_session_recv_paused(p.c));
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, 0);
  assert_non_null(r.t);
  assert_true(hr_tensor_on_device(r.t));
  assert_int_equal(hr_tensor_descriptor(r.t)->buffers[0].sync_mode, sync);
  assert_true(tu_device_equals(g, r.t, hr_tensor_buffer(t, 0), n));
  assert_true(pinned_peak <= 2 * PIECE);
  hr_tensor_unref(r.t);
  hr_tensor_unref(t);
  pair_close(&p);
  assert_int_equal(hr_gpu_del(g), 0);
}

static void spill_copying_p1(void **state) {
  (void)state;
  get_through_spill(0, HR_SYNC_PRODUCER_SYNCED);
}

static void spill_zero_copy_p2(void **state) {
  (void)state;
  get_through_spill(1, HR_SYNC_EVENT);
}

/* A host that never honours the pause nor runs the copies: past the
 * spill's bound the GET fails, the server hears of it, the session stays
 * usable (a PING still goes round). */
static void spill_bound(void **state) {
  (void)state;
  pair p;
  const uint64_t n = (uint64_t)6 << 20;
  hr_gpu *g = open_sim();
  hr_tensor *t = open_pair(&p, 0, n);
  result r;
  get_k(&p, g, HR_SYNC_PRODUCER_SYNCED, &r, NULL);
  while (pump_only(&p))
    ;
  assert_int_equal(r.calls, 1);
  assert_int_not_equal(r.status, 0);
  assert_null(r.t);
  /* The held-back copies finish; nothing is left behind. */
  assert_int_equal(run(&p), 0);
  result pr;
  memset(&pr, 0, sizeof pr);
  assert_int_equal(hr_session_ping(p.c, on_ping_done, &pr), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(pr.calls, 1);
  assert_int_equal(pr.status, 0);
  hr_tensor_unref(t);
  pair_close(&p);
  assert_int_equal(pinned_live, 0);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* ---- paused input and the connection's timers --------------------------- */

#define SEC 1000000000ull

/* The server's output as a socket would hold it for a host that honours
 * hr_session_recv_paused(): bytes wait here while the client is paused. */
typedef struct wire {
  uint8_t *b;
  size_t len, pos;
} wire;

/* Moves the client's requests to the server, the server's output onto the
 * wire, and from the wire into the client as long as it takes input (a
 * host reads at most this much past a pause, as the engine's staging read
 * may).  Returns 1 if any byte moved. */
static int pump_honouring(pair *p, wire *w) {
  int moved = pump(p, p->c, p->s) > 0;
  uint8_t *out;
  int64_t total = pull_all(p->s, 64, p->now, &out);
  assert_true(total >= 0);
  if (total) {
    w->b = realloc(w->b, w->len + (size_t)total);
    assert_non_null(w->b);
    memcpy(w->b + w->len, out, (size_t)total);
    w->len += (size_t)total;
    free(out);
    moved = 1;
  }
  while (w->pos < w->len && !hr_session_recv_paused(p->c)) {
    size_t k = w->len - w->pos < 1000 ? w->len - w->pos : 1000;
    assert_true(hr_session_recv(p->c, w->b + w->pos, k, p->now) >= 0);
    w->pos += k;
    moved = 1;
  }
  return moved;
}

/* A GET whose ring is full: the client pauses its input, inside a
 * TENSOR_DATA payload, with the rest of the tensor waiting on the wire. */
static hr_tensor *start_paused(pair *p, wire *w, hr_gpu *g, result *r,
                               uint64_t n) {
  memset(p, 0, sizeof *p);
  memset(w, 0, sizeof *w);
  p->async_work = 1;
  p->now = 1000 * SEC;
  hr_settings cs;
  hr_settings_default(&cs);
  cs.device_piece = PIECE;
  cs.device_pieces = 2;
  cs.read_timeout = 1 * SEC;
  cs.keepalive_interval = 1 * SEC;
  hr_tensor *t = open_pair_k(p, &cs, n, 7);
  get_k(p, g, HR_SYNC_PRODUCER_SYNCED, r, NULL);
  while (pump_honouring(p, w))
    ;
  /* First the device memory is allocated (a work item, off the driving
   * thread): input waits, and nothing is due meanwhile. */
  assert_true(hr_session_recv_paused(p->c));
  assert_int_equal(hr_session_get_expiry(p->c), HR_TSTAMP_NEVER);
  assert_int_equal(run_work(p), 1);
  while (pump_honouring(p, w))
    ;
  assert_true(hr_session_recv_paused(p->c));
  assert_true(w->pos < w->len); /* the peer is not done: we are slow */
  assert_int_equal(r->calls, 0);
  return t;
}

/* A device slower than the read timeout and the keepalive interval
 * together: the paused time counts against neither, the connection
 * stays, no PING goes out, and once the copies complete the timers run
 * again from the moment input resumed (issue 6). */
static void paused_time_not_counted(void **state) {
  (void)state;
  pair p;
  wire w;
  result r;
  const uint64_t n = 24 * PIECE + 5;
  hr_gpu *g = open_sim();
  hr_tensor *t = start_paused(&p, &w, g, &r, n);
  /* Nothing is due while paused: the host would sleep for good. */
  assert_int_equal(hr_session_get_expiry(p.c), HR_TSTAMP_NEVER);
  p.now += 10 * SEC;
  assert_int_equal(hr_session_handle_expiry(p.c, p.now), 0);
  assert_int_equal(p.errors_c, 0);
  assert_int_equal(pump(&p, p.c, NULL), 0); /* no PING, no ERROR */
  /* The device catches up: input resumes, the timers restart now. */
  assert_int_equal(run_work(&p), 2);
  assert_false(hr_session_recv_paused(p.c));
  assert_int_equal(hr_session_get_expiry(p.c), p.now + 1 * SEC);
  /* The rest arrives, each pause ending as the copies complete. */
  for (int rounds = 0; r.calls == 0 && rounds < 10000; rounds++) {
    p.now += SEC / 2; /* half the timeout at each step: never due */
    pump_honouring(&p, &w);
    assert_int_equal(hr_session_handle_expiry(p.c, p.now), 0);
    run_work(&p);
  }
  assert_int_equal(p.errors_c, 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, 0);
  assert_true(tu_device_equals(g, r.t, hr_tensor_buffer(t, 0), n));
  /* The record counts the pauses, the long one included. */
  assert_true(r.rec.recv_pauses >= 2);
  assert_true(r.rec.recv_paused_ns >= 10 * SEC);
  assert_int_equal(r.rec.device_pieces, 25);
  assert_true(r.rec.device_tail_ns <= SEC / 2); /* one step of copies */
  result_clear(&r);
  hr_tensor_unref(t);
  free(w.b);
  pair_close(&p);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* The control: a peer that stalls inside a message while the client takes
 * input is still cut by the read timeout, counted from the resume. */
static void stall_after_resume_times_out(void **state) {
  (void)state;
  pair p;
  wire w;
  result r;
  hr_gpu *g = open_sim();
  hr_tensor *t = start_paused(&p, &w, g, &r, 24 * PIECE + 5);
  p.now += 10 * SEC;
  assert_int_equal(hr_session_handle_expiry(p.c, p.now), 0);
  assert_int_equal(run_work(&p), 2);
  assert_false(hr_session_recv_paused(p.c));
  /* The peer sends nothing more (the wire is left as it is). */
  p.now += SEC - 1;
  assert_int_equal(hr_session_handle_expiry(p.c, p.now), 0);
  assert_int_equal(p.errors_c, 0);
  p.now += 1;
  hr_session_handle_expiry(p.c, p.now);
  assert_int_equal(p.errors_c, 1);
  assert_int_equal(p.last_err_c, HR_WIRE_TIMEOUT);
  assert_int_equal(r.calls, 1);
  assert_int_not_equal(r.status, 0);
  result_clear(&r);
  hr_tensor_unref(t);
  free(w.b);
  pair_close(&p);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* ---- the device memory's allocation (decisions 73, 74) ------------------ */

/* Out of device memory, inline (a host without submit_work) and as a
 * work item: that GET fails with HR_ERR_LIMIT and RESOURCE_EXHAUSTED
 * sent; the session goes on, nothing is left allocated. */
static void alloc_fails(int async) {
  pair p;
  memset(&p, 0, sizeof p);
  p.async_work = async;
  hr_gpu *g = open_sim_max(1000);
  hr_tensor *t = open_pair_k(&p, NULL, 5000, 3);
  result r;
  get_k(&p, g, HR_SYNC_PRODUCER_SYNCED, &r, NULL);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, HR_ERR_LIMIT);
  /* Inline, the descriptor's arrival fails it (ERROR to the server); the
   * held-back item fails it once every byte arrived (no ERROR then). */
  if (!async)
    assert_int_equal(r.rec.wire_error, HR_WIRE_RESOURCE_EXHAUSTED);
  assert_non_null(
      strstr(r.rec.message, async ? "out of device memory"
                                  : "device memory could not be allocated"));
  assert_null(r.t);
  assert_int_equal(device_live, 0);
  result pr;
  memset(&pr, 0, sizeof pr);
  assert_int_equal(hr_session_ping(p.c, on_ping_done, &pr), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(pr.status, 0);
  assert_int_equal(p.errors_c, 0);
  hr_tensor_unref(t);
  pair_close(&p);
  assert_int_equal(device_live, 0);
  assert_int_equal(pinned_live, 0);
  assert_int_equal(hr_gpu_del(g), 0);
}

static void alloc_fails_inline(void **state) {
  (void)state;
  alloc_fails(0);
}

static void alloc_fails_work(void **state) {
  (void)state;
  alloc_fails(1);
}

/* A cancel while the allocation is held back: the GET ends once the
 * server's answer is read (input is not paused for it any more), before
 * the allocation returns; the allocation frees its buffer when it does. */
static void cancel_while_allocating(void **state) {
  (void)state;
  pair p;
  wire w;
  result r;
  memset(&p, 0, sizeof p);
  memset(&w, 0, sizeof w);
  p.async_work = 1;
  hr_gpu *g = open_sim();
  hr_tensor *t = open_pair_k(&p, NULL, 100000, 5);
  uint32_t sid;
  get_k(&p, g, HR_SYNC_PRODUCER_SYNCED, &r, &sid);
  while (pump_honouring(&p, &w))
    ;
  assert_true(hr_session_recv_paused(p.c));
  assert_int_equal(p.wq.n, 1); /* the allocation */
  assert_int_equal(hr_session_cancel(p.c, sid), 0);
  assert_false(hr_session_recv_paused(p.c));
  while (pump_honouring(&p, &w))
    ;
  assert_int_equal(r.calls, 1);
  assert_int_not_equal(r.status, 0);
  assert_null(r.t);
  assert_int_equal(p.wq.n, 1); /* still out */
  /* It comes back with its buffer, which is freed. */
  assert_int_equal(device_allocs, 0);
  assert_int_equal(run_work(&p), 1);
  assert_int_equal(device_allocs, 1);
  assert_int_equal(device_live, 0);
  assert_int_equal(p.errors_c, 0);
  result pr;
  memset(&pr, 0, sizeof pr);
  assert_int_equal(hr_session_ping(p.c, on_ping_done, &pr), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(pr.status, 0);
  hr_tensor_unref(t);
  free(w.b);
  pair_close(&p);
  assert_int_equal(device_live, 0);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* The session deleted while the allocation is out: the item comes back
 * to a deleted session and frees what it got. */
static void delete_while_allocating(void **state) {
  (void)state;
  pair p;
  memset(&p, 0, sizeof p);
  p.async_work = 1;
  hr_gpu *g = open_sim();
  hr_tensor *t = open_pair_k(&p, NULL, 100000, 6);
  result r;
  get_k(&p, g, HR_SYNC_PRODUCER_SYNCED, &r, NULL);
  while (pump_only(&p))
    ;
  assert_int_equal(p.wq.n, 1);
  hr_tensor_unref(t);
  pair_close(&p);
  assert_int_equal(r.calls, 1);
  /* The deleted client waits for its item, which frees its buffer. */
  assert_int_equal(device_allocs, 0);
  assert_int_equal(run_work(&p), 1);
  assert_int_equal(device_allocs, 1);
  assert_int_not_equal(r.status, 0);
  assert_int_equal(device_live, 0);
  assert_int_equal(pinned_live, 0);
  assert_int_equal(hr_gpu_del(g), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(spill_copying_p1),
      cmocka_unit_test(spill_zero_copy_p2),
      cmocka_unit_test(spill_bound),
      cmocka_unit_test(paused_time_not_counted),
      cmocka_unit_test(stall_after_resume_times_out),
      cmocka_unit_test(alloc_fails_inline),
      cmocka_unit_test(alloc_fails_work),
      cmocka_unit_test(cancel_while_allocating),
      cmocka_unit_test(delete_while_allocating),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
