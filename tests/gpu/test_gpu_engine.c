/*
 * The engine and device memory, over loopback (issue 6, "On the network").
 *
 *  - Serving a device tensor: the engine stages it through pinned memory
 *    after the producer's event; the client gets exactly the producer's
 *    bytes.  A provider that lies (no event while its producer still
 *    writes) is shown to deliver stale bytes: the ordering is what makes
 *    the first case right, and the test would catch its loss.
 *  - Device selection: a client asking for the device gets the device's
 *    tag in the descriptor (the bytes still come in host frames).
 *  - Receiving into device memory, P1 and P2; with P2 a consumer that
 *    skips the event reads stale bytes on the simulated device.
 *  - The loop never blocks: a PING is answered while slow staging runs
 *    (server and client share one loop thread).
 *  - A GET into device memory far larger than its staging ring, on a slow
 *    device: the pinned memory it holds never exceeds the ring (counted by
 *    a wrapper around the backend's ops), the bytes are right (the socket
 *    waited while the ring was full); over a Unix socket with the SHM
 *    plane, the mapped segment is copied to the device piece by piece.
 *
 * Usage: test_gpu_engine [backend]  (default "sim"; 77 when unavailable).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/shm.h>
#include <hurray/tensor.h>

#include "common/test_util.h"
#include "gpu_testutil.h"
#include "tc.h"

/* The producer's "kernel" time: long enough that a GET made right after
 * it started is staged before it ends, even on a loaded machine under
 * ThreadSanitizer. */
#define GATE_NS 800000000ull
#define CHUNK (256u * 1024u)

typedef struct fx {
  tl_env *env;
  tl_server srv;
  tc_conn cli;
  hr_gpu *g;
  hr_gpu_caps caps;
  hr_gpu_stream *P, *C;
  uint8_t devs[2];
} fx;

static int is_sim(void) {
  return strcmp(gt_backend, "sim") == 0;
}

/* Pinned memory alive and its peak, counted by a wrapper around the
 * backend's ops (fx_open_ring). */
static const hr_gpu_ops *cnt_base;
static hr_gpu_ops cnt_ops;
static _Atomic uint64_t cnt_live, cnt_peak;

static int cnt_alloc(void *dev, int kind, uint64_t size, hr_gpu_mem_info *out) {
  int rv = cnt_base->mem_alloc(dev, kind, size, out);
  if (rv == 0 && kind == HR_GPU_MEM_PINNED) {
    uint64_t now = atomic_fetch_add(&cnt_live, size) + size;
    uint64_t peak = atomic_load(&cnt_peak);
    while (now > peak && !atomic_compare_exchange_weak(&cnt_peak, &peak, now)) {
    }
  }
  return rv;
}

static void cnt_free(void *dev, const hr_gpu_mem_info *m) {
  if (m->kind == HR_GPU_MEM_PINNED)
    atomic_fetch_sub(&cnt_live, m->size);
  cnt_base->mem_free(dev, m);
}

/* Opens the device (paced at `bps` on the simulated one) and a server and
 * client that both advertise it next to the CPU; the client receives into
 * the device through a ring of `pieces` x `piece` bytes (0: defaults),
 * and pinned memory is counted when `piece` is set. */
static fx *fx_open_ring(uint64_t delay_ns, uint64_t bps, uint64_t piece,
                        uint32_t pieces) {
  fx *f = calloc(1, sizeof *f);
  assert_non_null(f);
  assert_int_equal(gt_open(&f->g, is_sim() ? delay_ns : 0, is_sim() ? bps : 0),
                   0);
  if (piece) {
    /* Reopen the same device through the counting table. */
    cnt_base = hr_gpu_get_ops(f->g);
    cnt_ops = *cnt_base;
    cnt_ops.mem_alloc = cnt_alloc;
    cnt_ops.mem_free = cnt_free;
    assert_int_equal(hr_gpu_del(f->g), 0);
    hr_gpu_config cfg;
    hr_gpu_config_default(&cfg);
    cfg.ops = &cnt_ops;
    cfg.sim_op_delay_ns = is_sim() ? delay_ns : 0;
    cfg.sim_bytes_per_sec = is_sim() ? bps : 0;
    assert_int_equal(hr_gpu_open(&f->g, &cfg, NULL, NULL), 0);
  }
  assert_int_equal(hr_gpu_query(f->g, &f->caps), 0);
  assert_int_equal(hr_gpu_stream_new(f->g, &f->P), 0);
  assert_int_equal(hr_gpu_stream_new(f->g, &f->C), 0);
  f->devs[0] = HR_DEV_CPU;
  f->devs[1] = f->caps.device_tag;
  f->env = tl_new(TL_EPOLL);
  hr_engine_config ec;
  hr_engine_config_default(&ec);
  ec.session.devices = f->devs;
  ec.session.device_count = 2;
  ec.session.transcode_chunk = CHUNK;
  ec.session.device_piece = piece;
  ec.session.device_pieces = pieces;
  tl_server_start(f->env, &f->srv, &ec, NULL);
  hr_engine *ce = tl_engine(f->env, &ec);
  tc_open(f->env, ce, f->srv.url, &f->cli);
  return f;
}

static fx *fx_open_d(uint64_t delay_ns, uint64_t bps) {
  return fx_open_ring(delay_ns, bps, 0, 0);
}

static fx *fx_open(uint64_t bps) {
  return fx_open_d(0, bps);
}

/* Closes the network side (the device stays open). */
static void fx_close_net(fx *f) {
  hr_engine *ce = f->cli.e;
  tc_close(&f->cli);
  tl_engine_finish(f->env, ce);
  tl_server_stop(f->env, &f->srv);
  tl_free(f->env);
  f->env = NULL;
}

static void fx_close(fx *f) {
  if (f->env)
    fx_close_net(f);
  hr_gpu_stream_del(f->P);
  hr_gpu_stream_del(f->C);
  assert_int_equal(hr_gpu_del(f->g), 0);
  free(f);
}

/* A served device tensor: rank 1 uint8 of n bytes, the producer's state. */
typedef struct served {
  tu_produced p; /* OLD, then NEW after the gate; the end in p.ev */
  int released;
} served;

static void served_release(void *ctx) {
  ((served *)ctx)->released++;
}

/* Resets the device buffer to OLD, then starts a slow producer writing
 * NEW (a gate, then the copy) on P; records its end in sv->p.ev. */
static void produce(fx *f, served *sv, uint64_t n) {
  tu_produce(f->g, f->P, n, GATE_NS, &sv->p);
}

static void served_free(fx *f, served *sv) {
  tu_produced_free(f->P, &sv->p);
}

/* GETs `key` to the host; returns 1 when the bytes are NEW. */
static int get_is_new(fx *f, const char *key, uint8_t pref, served *sv,
                      uint64_t n, tc_res *r) {
  hr_get_opts o;
  tc_opts(&o, key);
  o.preferred_device = pref;
  int rc = tc_get(&f->cli, &o, r);
  if (rc)
    printf("GET %s: %s, wire 0x%x: %s\n", key, hr_strerror(rc),
           r->rec.wire_error, r->rec.message);
  assert_int_equal(rc, 0);
  assert_int_equal(hr_tensor_bytes(r->t), n);
  return memcmp(hr_tensor_buffer(r->t, 0), hr_gpu_buf_host_ptr(sv->p.newb),
                n) == 0;
}

/* Reads bytes [off, off + n) of a device tensor's buffer 0 on stream s,
 * optionally after waiting on its event; returns 1 when they equal
 * want[off..off + n). */
static int device_range_equals(fx *f, hr_tensor *t, hr_gpu_stream *s, int wait,
                               const uint8_t *want, uint64_t off, uint64_t n) {
  hr_gpu_buf *out = tu_host_buf(f->g, n);
  memset(hr_gpu_buf_host_ptr(out), 0, n);
  if (wait && hr_tensor_gpu_event(t))
    assert_int_equal(hr_gpu_stream_wait_event(s, hr_tensor_gpu_event(t)), 0);
  assert_int_equal(
      hr_gpu_copy_async(s, out, 0, hr_tensor_gpu_buf(t, 0), off, n), 0);
  assert_int_equal(hr_gpu_stream_sync(s), 0);
  int eq = memcmp(hr_gpu_buf_host_ptr(out), want + off, n) == 0;
  tu_host_buf_del(out);
  return eq;
}

static int device_equals(fx *f, hr_tensor *t, hr_gpu_stream *s, int wait,
                         const uint8_t *want, uint64_t n) {
  return device_range_equals(f, t, s, wait, want, 0, n);
}

/* The engine stages after the producer's event: exactly NEW, although the
 * GET was answered while the producer still ran. */
static void serve_device_p2(void **state) {
  (void)state;
  fx *f = fx_open(0);
  uint64_t n = 5 * CHUNK + 12345; /* several chunks, a ragged last one */
  served sv = {0};
  produce(f, &sv, n);
  hr_descriptor d = tu_bytes_desc(n, 0, f->caps.device_tag);
  hr_tensor *t;
  assert_int_equal(hr_tensor_wrap_device(&t, &d, &sv.p.dev, sv.p.ev,
                                         served_release, &sv, NULL),
                   0);
  assert_true(hr_tensor_on_device(t));
  tl_put(&f->srv, "dev", t);
  hr_tensor_unref(t);
  /* The producer is still inside its gate. */
  if (is_sim())
    assert_int_equal(hr_gpu_event_query(sv.p.ev), HR_ERR_WOULDBLOCK);
  tc_res r;
  assert_true(get_is_new(f, "dev", HR_DEV_CPU, &sv, n, &r));
  assert_int_equal(r.rec.device, HR_DEV_CPU);
  /* Network descriptors are producer-synced. */
  assert_int_equal(hr_tensor_descriptor(r.t)->buffers[0].sync_mode,
                   HR_SYNC_PRODUCER_SYNCED);
  tc_res_clear(&r);
  /* Device selection: a client asking for the device (and landing there)
   * gets the device's tag; the bytes still came in host frames. */
  hr_get_opts o;
  tc_opts(&o, "dev");
  o.preferred_device = f->caps.device_tag;
  o.device = f->g;
  o.device_sync = HR_SYNC_PRODUCER_SYNCED;
  assert_int_equal(tc_get(&f->cli, &o, &r), 0);
  assert_int_equal(r.rec.device, f->caps.device_tag);
  assert_true(hr_tensor_on_device(r.t));
  assert_true(
      device_equals(f, r.t, f->C, 1, hr_gpu_buf_host_ptr(sv.p.newb), n));
  tc_res_clear(&r);
  assert_int_equal(hr_store_remove(f->srv.store, "dev", 3), 0);
  fx_close_net(f);
  assert_int_equal(sv.released, 1);
  served_free(f, &sv);
  fx_close(f);
}

/* The same tensor declared without its event (a lying P1 producer): the
 * staging copies run at once and read OLD.  Proves the test above fails
 * if the engine ignores the event. */
static void serve_device_stale(void **state) {
  (void)state;
  fx *f = fx_open(0);
  uint64_t n = 2 * CHUNK;
  served sv = {0};
  produce(f, &sv, n);
  hr_descriptor d = tu_bytes_desc(n, 0, f->caps.device_tag);
  hr_tensor *t;
  assert_int_equal(
      hr_tensor_wrap_device(&t, &d, &sv.p.dev, NULL, served_release, &sv, NULL),
      0);
  tl_put(&f->srv, "dev", t);
  hr_tensor_unref(t);
  tc_res r;
  assert_false(get_is_new(f, "dev", HR_DEV_CPU, &sv, n, &r));
  assert_int_equal(
      memcmp(hr_tensor_buffer(r.t, 0), hr_gpu_buf_host_ptr(sv.p.oldb), n), 0);
  tc_res_clear(&r);
  assert_int_equal(hr_store_remove(f->srv.store, "dev", 3), 0);
  served_free(f, &sv);
  fx_close(f);
}

/* A GET of an n-byte host tensor into the device on `c` (NULL: the
 * fixture's connection); with `shm`, the server holds it in a segment. */
static void get_into_device_on(fx *f, tc_conn *c, int shm, uint8_t sync,
                               uint64_t n, int stale) {
  uint64_t shape[1] = {n};
  hr_tensor *src = tl_dense(HR_ELEM_UINT8, 1, shape, 7);
  if (shm) {
    hr_tensor *seg;
    assert_int_equal(hr_shm_tensor_copy(&seg, src, NULL), 0);
    tl_put(&f->srv, "host", seg);
    hr_tensor_unref(seg);
  } else {
    tl_put(&f->srv, "host", src);
  }
  hr_get_opts o;
  tc_opts(&o, "host");
  o.device = f->g;
  o.device_sync = sync;
  tc_res r;
  assert_int_equal(tc_get(c ? c : &f->cli, &o, &r), 0);
  assert_int_equal(r.rec.data_plane, shm ? HR_PLANE_SHM : HR_PLANE_FRAMES);
  assert_true(hr_tensor_on_device(r.t));
  const hr_descriptor *d = hr_tensor_descriptor(r.t);
  assert_int_equal(d->buffers[0].device_tag, f->caps.device_tag);
  assert_int_equal(d->buffers[0].sync_mode, sync);
  if (sync == HR_SYNC_EVENT) {
    assert_non_null(hr_tensor_gpu_event(r.t));
    /* A consumer that skips the event and reads the last piece: the
     * engine's copies are still queued on the slow simulated device (see
     * get_device_p2), so its bytes are not there yet. */
    if (is_sim() && stale)
      assert_false(device_range_equals(
          f, r.t, f->C, 0, hr_tensor_buffer(src, 0), n - CHUNK, CHUNK));
  } else {
    assert_null(hr_tensor_gpu_event(r.t));
  }
  /* The right consumer: P1 at once, P2 after the event. */
  assert_true(device_equals(f, r.t, f->C, 1, hr_tensor_buffer(src, 0), n));
  tc_res_clear(&r);
  hr_tensor_unref(src);
}

static void get_into_device(fx *f, uint8_t sync, uint64_t n) {
  get_into_device_on(f, NULL, 0, sync, n, 1);
}

static void get_device_p1(void **state) {
  (void)state;
  fx *f = fx_open(64ull << 20);
  get_into_device(f, HR_SYNC_PRODUCER_SYNCED, 3 * CHUNK + 99);
  /* A second GET reuses the pinned landing block. */
  get_into_device(f, HR_SYNC_PRODUCER_SYNCED, 3 * CHUNK + 99);
  fx_close(f);
}

static void get_device_p2(void **state) {
  (void)state;
  /* Every device operation waits 40 ms, then copies at 1 MiB/s: the
   * pieces' copies queue up on the engine's stream (about 290 ms each), so
   * the last one starts some 870 ms after the first piece landed, while
   * the consumer's own read of it is done 290 ms after delivery. */
  fx *f = fx_open_d(40000000ull, 1ull << 20);
  get_into_device(f, HR_SYNC_EVENT, 4 * CHUNK);
  fx_close(f);
}

/* A client PUT of a device tensor goes through the same staging (after
 * the producer's event). */
static void put_device_tensor(void **state) {
  (void)state;
  fx *f = fx_open(0);
  uint64_t n = 3 * CHUNK + 7;
  served sv = {0};
  produce(f, &sv, n);
  /* The descriptor's device tag is the PUT's destination (the store keeps
   * host memory): CPU, while the bytes come from the device. */
  hr_descriptor d = tu_bytes_desc(n, 0, HR_DEV_CPU);
  hr_tensor *t;
  assert_int_equal(hr_tensor_wrap_device(&t, &d, &sv.p.dev, sv.p.ev,
                                         served_release, &sv, NULL),
                   0);
  tc_res r;
  assert_int_equal(tc_put(&f->cli, "up", 0, t, &r), 0);
  hr_tensor_unref(t);
  tc_res_clear(&r);
  assert_true(get_is_new(f, "up", HR_DEV_CPU, &sv, n, &r));
  tc_res_clear(&r);
  fx_close_net(f);
  assert_int_equal(sv.released, 1);
  served_free(f, &sv);
  fx_close(f);
}

/* Invalid combinations are refused up front. */
static void get_device_args(void **state) {
  (void)state;
  fx *f = fx_open(0);
  hr_get_opts o;
  tc_opts(&o, "k");
  o.device = f->g;
  o.device_sync = HR_SYNC_CONSUMER_STREAM;
  tc_res r;
  assert_int_equal(tc_get_start(&f->cli, &o, &r, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  o.device_sync = HR_SYNC_PRODUCER_SYNCED;
  o.flags = HR_REQ_PARALLEL_OK;
  o.max_shards = 2;
  assert_int_equal(tc_get_start(&f->cli, &o, &r, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  fx_close(f);
}

/* Server and client share the loop thread: a PING is answered while the
 * (slow) staging of a device tensor is in flight, so the loop was never
 * blocked by it. */
static void loop_never_blocks(void **state) {
  (void)state;
  if (!is_sim())
    skip();
  /* 2 MiB at 2 MiB/s: the staging takes about a second. */
  fx *f = fx_open(2ull << 20);
  uint64_t n = 8 * CHUNK;
  hr_gpu_buf *dev, *src = tu_host_buf(f->g, n);
  gt_fill(hr_gpu_buf_host_ptr(src), n, 3);
  assert_int_equal(hr_gpu_buf_alloc(f->g, HR_GPU_MEM_DEVICE, n, &dev), 0);
  assert_int_equal(hr_gpu_copy_async(f->P, dev, 0, src, 0, n), 0);
  assert_int_equal(hr_gpu_stream_sync(f->P), 0);
  hr_descriptor d = tu_bytes_desc(n, 0, f->caps.device_tag);
  hr_tensor *t;
  served sv = {0};
  assert_int_equal(
      hr_tensor_wrap_device(&t, &d, &dev, NULL, served_release, &sv, NULL), 0);
  tl_put(&f->srv, "dev", t);
  hr_tensor_unref(t);
  hr_get_opts o;
  tc_opts(&o, "dev");
  tc_res g, p;
  assert_int_equal(tc_get_start(&f->cli, &o, &g, NULL), 0);
  tl_spin(f->env, 20); /* the request reaches the server; staging starts */
  assert_false(g.done);
  assert_int_equal(tc_ping(&f->cli, &p), 0);
  assert_false(g.done);
  assert_true(p.rtt < 500000000ull);
  assert_true(tc_wait(&f->cli, &g, 20000));
  assert_int_equal(g.status, 0);
  assert_memory_equal(hr_tensor_buffer(g.t, 0), hr_gpu_buf_host_ptr(src), n);
  tc_res_clear(&g);
  assert_int_equal(hr_store_remove(f->srv.store, "dev", 3), 0);
  fx_close_net(f);
  assert_int_equal(sv.released, 1);
  hr_gpu_buf_del(dev);
  tu_host_buf_del(src);
  fx_close(f);
}

/* 40 pieces through a ring of 2 on a slow device (every operation waits
 * 2 ms): the receive outruns the copies, so the socket must wait; the
 * pinned memory held stays within the ring, and the bytes are right. */
static void get_device_ring(void **state) {
  (void)state;
  const uint64_t piece = 64u << 10, n = 40 * piece + 99;
  fx *f = fx_open_ring(2000000ull, 256ull << 20, piece, 2);
  for (int i = 0; i < 2; i++) {
    uint8_t sync = i ? HR_SYNC_EVENT : HR_SYNC_PRODUCER_SYNCED;
    cnt_peak = cnt_live;
    uint64_t base = cnt_live;
    get_into_device_on(f, NULL, 0, sync, n, 0);
    /* The ring's two pieces, and the checker's own n-byte pinned buffer
     * (device_equals, after the GET). */
    assert_true(cnt_peak - base <= 2 * piece + n);
    assert_true(cnt_live - base <= 2 * piece);
  }
  fx_close(f);
}

/* Over a Unix socket with the SHM plane: the client maps the server's
 * segment and copies it to the device through the ring. */
static void get_device_shm(void **state) {
  (void)state;
  const uint64_t piece = 64u << 10, n = 16 * piece + 5;
  fx *f = fx_open_ring(1000000ull, 0, piece, 2);
  char dir[64] = "/tmp/hr_gpu_shm_XXXXXX", path[128], url[160];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/s.sock", dir);
  snprintf(url, sizeof url, "unix:%s", path);
  hr_provider prov;
  hr_store_provider(f->srv.store, &prov);
  assert_int_equal(hr_engine_listen(f->srv.e, url, &prov, NULL), 0);
  tc_conn c;
  tc_open(f->env, f->cli.e, url, &c);
  for (int i = 0; i < 2; i++) {
    uint64_t base = cnt_live;
    get_into_device_on(f, &c, 1, i ? HR_SYNC_EVENT : HR_SYNC_PRODUCER_SYNCED, n,
                       0);
    assert_true(cnt_live - base <= 2 * piece);
  }
  tc_close(&c);
  fx_close(f);
  unlink(path);
  assert_int_equal(rmdir(dir), 0);
}

int main(int argc, char **argv) {
  int rv = gt_main_prologue(argc, argv);
  if (rv != 0)
    return rv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(serve_device_p2),   cmocka_unit_test(serve_device_stale),
      cmocka_unit_test(get_device_p1),     cmocka_unit_test(get_device_p2),
      cmocka_unit_test(get_device_args),   cmocka_unit_test(loop_never_blocks),
      cmocka_unit_test(put_device_tensor), cmocka_unit_test(get_device_ring),
      cmocka_unit_test(get_device_shm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
