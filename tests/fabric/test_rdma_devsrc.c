/*
 * A device tensor as the RDMA source (GPUDirect source, docs/protocol.md
 * § 25.1 decision 70), through the sans-IO sessions and the fake fabric.
 *
 * The served tensor is written by a slow producer on the device
 * (a gate, then the copy of NEW over OLD) whose end is the tensor's event
 * (ADR-018 P2).  The host runs the session's work through hr_work.start,
 * as the engine does, so the wait for the event happens on the device and
 * the test thread never blocks in it.
 *
 *  - GPUDirect GETs, tagged and RMA-written: the source registration
 *    is the device's memory, the bytes are exactly NEW, both records say
 *    RDMA without a fallback, the descriptor is producer-synced.
 *  - The same producer declared without its event (skipping the wait) is
 *    shown to deliver OLD: the wait is what makes the cases above right.
 *  - Where GPUDirect cannot be the source (the source registration
 *    refused, a fabric without FI_HMEM, no RDMA_GPUDIRECT in the HELLOs):
 *    staged into one pinned host region after the event, then RDMA from
 *    that region (decision 76), the record says why; the fabric refusing
 *    the region too sends frames from it;
 *  - staged sources' failures: the region's allocation, the copy's wait
 *    for the event, the budget spent or off (frames), a cancel, a PUT's
 *    cancel and a session's teardown while the copy runs (the region goes
 *    once, after the copy), the peer answering ERROR instead of READY
 *    (the client retries with frames); a wrong producer is caught staged
 *    as unstaged;
 *  - Failures of GPUDirect:
 *    the producer's event failing on the device (the GET fails, nothing
 *    stays registered); the peer gone in the middle of the write (the
 *    client retries with frames); a cancel while the event is awaited.
 *  - The same for a client PUT of the device tensor (roles reversed):
 *    GPUDirect from the device after the event, the skipped event caught,
 *    no FI_HMEM (staged, RDMA, the client's record says why), the
 *    event failing (that PUT only).
 *  - Decision 79: staged regions are reused (the sessions share one
 *    account, as an engine's do): a second GET and a PUT take the idle
 *    region and deliver their own bytes, its registrations stay until the
 *    memory goes; rdma_stage_keep 0 frees every region; idle regions give
 *    their budget to a stage of another size; a failed copy into a reused
 *    region puts it back, and the next GET reuses it.
 *  - Decision 78: a PUT whose first staging chunk fails inside
 *    hr_session_put() calls back at the next hr_session_handle_expiry()
 *    (or hr_session_terminate()), never inside the call; a GPUDirect PUT
 *    cancelled or cut off while its RMA write from the device is under
 *    way calls back only after the fabric ended it and the tensor was
 *    released; a served GET ended the same way releases its tensor only
 *    after the fabric.
 *  - A GPUDirect PUT retried (decisions 44, 45b): the server cannot post
 *    its receives or they fail (RDMA_SETUP_FAILED: the retry goes as
 *    frames), the client cannot write into the server's destination
 *    (GPUDIRECT_UNAVAILABLE sent: the retry goes tagged, still from the
 *    device) or the peer goes mid-write (frames): one callback, the
 *    retry's, after the first try's registration went, byte-exact NEW.
 *
 * Usage: test_rdma_devsrc [backend] (default "sim").  Another backend
 * (Vulkan on lavapipe) runs the same cases: the fake fabric cannot read its
 * memory, so each must take the staged RDMA source and still be
 * byte-exact.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/fabric.h>
#include <hurray/gpu.h>
#include <hurray/session.h>
#include <hurray/tensor.h>

#include "../gpu/gpu_testutil.h"
#include "common/test_util.h"
#include "engine/core/hr_rdma_stage.h"
#include "fabric/hr_fab_fake.h"
#include "rdma_pair.h"

#define SIZE ((uint64_t)1 << 20)
#define GATE_NS 150000000ull /* the producer's gate: 150 ms */
#define GD (HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT)

static int is_sim(void) {
  return strcmp(gt_backend, "sim") == 0;
}

/* ---- the device, optionally with a failing stream-wait ------------------ */

static const hr_gpu_ops *base_ops;
static hr_gpu_ops fail_ops;
static atomic_int wait_fails;   /* stream_wait_event answers HR_ERR_IO */
static atomic_int pinned_fails; /* pinned allocations answer NOMEM */

static int failing_wait(void *dev, void *s, void *e) {
  if (atomic_load(&wait_fails))
    return HR_ERR_IO;
  return base_ops->stream_wait_event(dev, s, e);
}

static int failing_alloc(void *dev, int kind, uint64_t size,
                         hr_gpu_mem_info *out) {
  if (kind == HR_GPU_MEM_PINNED && atomic_load(&pinned_fails))
    return HR_ERR_NOMEM;
  return base_ops->mem_alloc(dev, kind, size, out);
}

typedef struct dev {
  hr_gpu *g;
  hr_gpu_caps caps;
  hr_gpu_stream *P; /* the producer's stream */
} dev;

static void dev_open(dev *d) {
  assert_int_equal(gt_open(&d->g, 0, 0), 0);
  /* Reopened through a table whose stream-wait can be made to fail. */
  base_ops = hr_gpu_get_ops(d->g);
  fail_ops = *base_ops;
  fail_ops.stream_wait_event = failing_wait;
  fail_ops.mem_alloc = failing_alloc;
  assert_int_equal(hr_gpu_del(d->g), 0);
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.ops = &fail_ops;
  assert_int_equal(hr_gpu_open(&d->g, &cfg, NULL, NULL), 0);
  assert_int_equal(hr_gpu_query(d->g, &d->caps), 0);
  assert_int_equal(hr_gpu_stream_new(d->g, &d->P), 0);
  atomic_store(&wait_fails, 0);
  atomic_store(&pinned_fails, 0);
}

static void dev_close(dev *d) {
  assert_int_equal(hr_gpu_stream_sync(d->P), 0);
  hr_gpu_stream_del(d->P);
  assert_int_equal(hr_gpu_del(d->g), 0);
}

/* A device tensor of SIZE bytes holding OLD, then written NEW by a slow
 * producer on P whose end is p.ev (the tensor's event when with_event). */
typedef struct produced {
  tu_produced p;
  hr_tensor *t;
} produced;

static void produce(dev *d, produced *pr, int with_event) {
  tu_produce(d->g, d->P, SIZE, GATE_NS, &pr->p);
  hr_descriptor desc = tu_bytes_desc(SIZE, 0, d->caps.device_tag);
  desc.buffers[0].device_index = d->caps.device_index;
  assert_int_equal(hr_tensor_wrap_device(&pr->t, &desc, &pr->p.dev,
                                         with_event ? pr->p.ev : NULL, NULL,
                                         NULL, NULL),
                   0);
}

static void produced_free(dev *d, produced *pr) {
  assert_int_equal(hr_gpu_stream_sync(d->P), 0);
  hr_tensor_unref(pr->t);
  tu_produced_free(d->P, &pr->p);
}

static int bytes_are(hr_tensor *t, hr_gpu_buf *want) {
  return t && hr_tensor_bytes(t) == SIZE &&
         memcmp(hr_tensor_buffer(t, 0), hr_gpu_buf_host_ptr(want), SIZE) == 0;
}

/* ---- two sessions over the fake fabric ---------------------------------- */

typedef struct world {
  hr__fake_world *fw;
  hr__fake_ep *ec, *es;
  uint8_t ext_c[RP_EXT_CAP], ext_s[RP_EXT_CAP];
  hr_session *c, *s;
  hr_tstamp now;
  tu_pipe c2s, s2c;
  rp_store st; /* what the server serves, and the last PUT stored */
  hr_transfer_record srv_rec;
  int srv_recs;
  rp_result r; /* the client's completion */
  dev d;       /* the device, opened first */
  produced pr; /* the served tensor, produced last */
  /* Work the sessions submitted: started on the device, completed from
   * its thread; reported done on this thread by pump(). */
  rp_works works;
  int started, ran_inline;
  int inline_work;     /* submit_work refuses: the session runs work inline */
  int in_request;      /* inside hr_session_put() */
  int cb_in_request;   /* a PUT callback ran inside hr_session_put() */
  atomic_int released; /* the PUT tensor's releases (put_release) */
  int released_at_cb;  /* `released` when the PUT callback ran */
  /* The client's fabric at a retried PUT's callback: registrations
   * open, operations not yet ended (on_put_retry). */
  int cb_live_regs, cb_pending;
  hr_stage_account *acct; /* the sessions' shared account, or NULL */
  /* A second served tensor (serve_second), its pattern, its memory. */
  hr_tensor *t2;
  hr_gpu_buf *hb2, *db2;
} world;

static int submit_work(hr_session *s, hr_work *w, void *ud) {
  world *wd = ud;
  if (wd->inline_work)
    return 1;
  rp_works_add(&wd->works, s, w);
  if (w->start && w->start(w, rp_works_finish, &wd->works) == 0) {
    wd->started++;
    return 0;
  }
  /* Not started: the host runs it (here, inline) and reports it. */
  wd->ran_inline++;
  w->run(w);
  rp_works_finish(w, &wd->works);
  return 0;
}

/* Reports finished work; returns how many are still out (*reported: how
 * many were reported now, when not NULL). */
static int works_drain_n(world *w, int *reported) {
  return rp_works_drain(&w->works, w->now, reported);
}

static int works_drain(world *w) {
  return works_drain_n(w, NULL);
}

static void on_transfer(hr_session *s, const hr_transfer_record *r, void *ud) {
  world *w = ud;
  if (s == w->s) {
    w->srv_rec = *r;
    w->srv_recs++;
  }
}

static void pump(world *w);

/* The device, two sessions over the fake fabric, and a tensor produced
 * on the device (with its event when `with_event`) that the server
 * serves.  `hmem`: both fake endpoints reach the simulated device's
 * memory (only the simulated device's: the fake copies with memcpy). */
static world *world_open_x(uint32_t caps, int dest, int hmem, int with_event,
                           uint64_t budget, uint64_t keep,
                           hr_stage_account *acct) {
  world *w = calloc(1, sizeof *w);
  assert_non_null(w);
  dev_open(&w->d);
  rp_works_init(&w->works);
  w->acct = acct;
  rp_fabric_open(&w->fw, &w->ec, &w->es);
  if (hmem && is_sim()) {
    hr__fake_set_hmem(w->ec, HR_GPU_DEV_SIM);
    hr__fake_set_hmem(w->es, HR_GPU_DEV_SIM);
  }
  hr_settings sc, ss;
  rp_settings(&sc, w->ec, w->ext_c, caps, dest);
  rp_settings(&ss, w->es, w->ext_s, caps, dest);
  ss.shard_bytes = SIZE / 4;
  sc.rdma_stage_budget = budget;
  ss.rdma_stage_budget = budget;
  sc.rdma_stage_keep = keep;
  ss.rdma_stage_keep = keep;
  sc.rdma_stage_account = acct;
  ss.rdma_stage_account = acct;
  hr_provider prov;
  rp_provider(&prov, &w->st);
  hr_session_callbacks cbs;
  memset(&cbs, 0, sizeof cbs);
  cbs.size = sizeof cbs;
  cbs.submit_work = submit_work;
  cbs.on_transfer = on_transfer;
  w->now = 1000;
  assert_int_equal(
      hr_session_new(&w->c, HR_ROLE_CLIENT, &sc, &cbs, NULL, w, w->now, NULL),
      0);
  assert_int_equal(
      hr_session_new(&w->s, HR_ROLE_SERVER, &ss, &cbs, &prov, w, w->now, NULL),
      0);
  pump(w);
  assert_non_null(hr_session_peer_hello(w->c));
  produce(&w->d, &w->pr, with_event);
  w->st.served = hr_tensor_ref(w->pr.t);
  return w;
}

static world *world_open_b(uint32_t caps, int dest, int hmem, int with_event,
                           uint64_t budget) {
  hr_settings def;
  hr_settings_default(&def);
  return world_open_x(caps, dest, hmem, with_event, budget, def.rdma_stage_keep,
                      NULL);
}

static world *world_open(uint32_t caps, int dest, int hmem, int with_event) {
  hr_settings def;
  hr_settings_default(&def);
  return world_open_b(caps, dest, hmem, with_event, def.rdma_stage_budget);
}

static void world_close(world *w) {
  /* Work still out finishes first (its device copies end). */
  for (int i = 0; i < 2000 && works_drain(w); i++)
    hr__test_sleep(1000000);
  assert_int_equal(works_drain(w), 0);
  hr_session_del(w->c);
  hr_session_del(w->s);
  /* The account's idle regions are the device's pinned memory: they go
   * with its last reference, before the device (as an engine's go with
   * the engine), and their registrations with them. */
  hr__stage_account_unref(w->acct);
  rp_fabric_close(w->fw, w->ec, w->es);
  rp_store_free(&w->st);
  hr_tensor_unref(w->r.got);
  tu_pipe_free(&w->c2s);
  tu_pipe_free(&w->s2c);
  rp_works_fini(&w->works);
  hr_tensor_unref(w->t2);
  hr_gpu_buf_del(w->db2);
  if (w->hb2)
    tu_host_buf_del(w->hb2);
  produced_free(&w->d, &w->pr);
  dev_close(&w->d);
  free(w);
}

/* Runs both sessions and both endpoints until nothing moves and no work
 * is out (the device's completions arrive on its threads). */
static void pump_until(world *w, const int *stop) {
  for (int idle = 0, i = 0; i < 200000; i++) {
    w->now += 1000;
    int a = tu_pipe_move(&w->c2s, w->c, w->s, w->now, -1);
    int b = tu_pipe_move(&w->s2c, w->s, w->c, w->now, -1);
    int c = hr__fake_progress(w->ec) > 0;
    int d = hr__fake_progress(w->es) > 0;
    int e = 0, out = works_drain_n(w, &e);
    /* Due deadlines, as a host runs them (a PUT's callback may be due). */
    hr_session *both[2] = {w->c, w->s};
    int before = w->r.done;
    for (int k = 0; k < 2; k++)
      if (hr_session_get_expiry(both[k]) <= w->now)
        hr_session_handle_expiry(both[k], w->now);
    e |= w->r.done != before;
    if (stop && *stop)
      return;
    idle = a || b || c || d || e ? 0 : idle + 1;
    if (idle >= 3 && !out)
      return;
    if (idle >= 3)
      hr__test_sleep(200000);
  }
}

static void pump(world *w) {
  pump_until(w, NULL);
}

static void get(world *w, uint32_t *sid) {
  rp_get_start(w->c, &w->r, "t", NULL, 0, sid);
  pump(w);
}

static void want_fallback(const hr_transfer_record *r, const char *what) {
  if (!strstr(r->fallback, what))
    fail_msg("fallback \"%s\" lacks \"%s\"", r->fallback, what);
}

/* ---- tests --------------------------------------------------------------- */

/* A GET of a device tensor whose producer is still running: GPUDirect
 * (on the simulated device) reads exactly NEW, after the event. */
static void gpudirect_get(int dest) {
  world *w = world_open(GD, dest, 1, 1);
  if (is_sim())
    assert_int_equal(hr_gpu_event_query(w->pr.p.ev), HR_ERR_WOULDBLOCK);
  get(w, NULL);
  assert_true(w->r.done);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->r.got, w->pr.p.newb));
  /* Network descriptors are producer-synced. */
  assert_int_equal(hr_tensor_descriptor(w->r.got)->buffers[0].sync_mode,
                   HR_SYNC_PRODUCER_SYNCED);
  /* The wait went through the device (start), never inline; with
   * GPUDirect it was the only work: nothing was staged.  Staged, the
   * host region's allocation is the one item this host runs itself. */
  assert_true(w->started > 0);
  assert_int_equal(w->ran_inline, is_sim() ? 0 : 1);
  if (is_sim())
    assert_int_equal(w->started, 1);
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  if (is_sim()) {
    assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
    assert_string_equal(w->srv_rec.fallback, "");
    assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
    /* The source registration was the device's memory, and the bytes
     * left from it (RMA writes into the destination, or tagged sends). */
    assert_int_equal(st.last_reg_device_tag, HR_GPU_DEV_SIM);
    assert_int_equal(st.bytes, SIZE);
    assert_int_equal(dest ? st.writes : st.sends, 1);
  } else {
    /* The fake cannot read this device's memory: staged into host
     * memory, then RDMA from there (decision 76). */
    assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
    want_fallback(&w->srv_rec, "device tensor staged for RDMA");
    assert_int_equal(st.last_reg_device_tag, HR_DEV_CPU);
    assert_int_equal(st.bytes, SIZE);
  }
  world_close(w);
}

static void test_get_tagged(void **state) {
  (void)state;
  gpudirect_get(0);
}

static void test_get_destination(void **state) {
  (void)state;
  gpudirect_get(1);
}

/* A parallel GET: each shard's region is its range of the device buffer,
 * each shard waits for the producer's event on its own. */
static void test_get_parallel(void **state) {
  (void)state;
  world *w = world_open(GD, 1, 1, 1);
  hr_get_opts o;
  rp_get_opts(&o, "t");
  o.flags = HR_REQ_PARALLEL_OK;
  o.max_shards = 4;
  w->r.done = 0;
  assert_int_equal(hr_session_get(w->c, &o, rp_on_get, &w->r, NULL), 0);
  pump(w);
  assert_true(w->r.done);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->r.got, w->pr.p.newb));
  assert_int_equal(w->r.rec.shards, 4);
  assert_int_equal(w->srv_recs, 4);
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  if (is_sim()) {
    assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
    assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
    assert_int_equal(st.regs, 4);
    assert_int_equal(st.writes, 4);
    assert_int_equal(st.bytes, SIZE);
    assert_int_equal(w->started, 4); /* one wait per shard, no staging */
  } else {
    /* Each shard staged its own range, then RDMA from it. */
    assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
    assert_int_equal(st.regs, 4);
    assert_int_equal(st.bytes, SIZE);
    assert_int_equal(st.last_reg_device_tag, HR_DEV_CPU);
  }
  world_close(w);
}

/* The same producer declared without its event (a lying P1 producer):
 * the data plane reads the device at once and the client gets OLD.  The
 * cases above would fail the same way if the engine skipped the event. */
static void test_skipped_event_is_caught(void **state) {
  (void)state;
  if (!is_sim())
    skip(); /* only the simulated device's gate is slow for sure */
  world *w = world_open(GD, 1, 1, 0);
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
  assert_false(bytes_are(w->r.got, w->pr.p.newb));
  assert_true(bytes_are(w->r.got, w->pr.p.oldb));
  world_close(w);
}

/* Cases where GPUDirect cannot be the source: the tensor is staged into
 * one host region (after its event: NEW) and goes over RDMA from there,
 * the server's record says why; a fabric that refuses the region too
 * gets frames from it. */
static void staged_case(uint32_t caps, int hmem, int reg_fault,
                        const char *why, int refused) {
  world *w = world_open(caps, 0, hmem, 1);
  hr__fake_faults_of(w->es)->reg_source = reg_fault;
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->r.got, w->pr.p.newb));
  want_fallback(&w->srv_rec, "device tensor staged for RDMA: ");
  if (is_sim())
    want_fallback(&w->srv_rec, why);
  assert_null(strstr(w->srv_rec.fallback, "staged and framed"));
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  if (refused) {
    assert_int_equal(w->srv_rec.data_plane, HR_PLANE_FRAMES);
    want_fallback(&w->srv_rec, "RDMA refused the staged copy");
    assert_int_equal(st.regs, 0);
    assert_int_equal(st.bytes, 0);
  } else {
    assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
    assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
    /* One registration, of host memory: the staged region. */
    assert_int_equal(st.regs, 1);
    assert_int_equal(st.last_reg_device_tag, HR_DEV_CPU);
    assert_int_equal(st.bytes, SIZE);
  }
  world_close(w);
}

static void test_registration_refused(void **state) {
  (void)state;
  /* Only the simulated device has a GPUDirect registration to refuse. */
  staged_case(GD, 1, is_sim(), "registering the source failed: injected",
              0);
}

/* No GPUDirect, and the fabric refuses the staged region as well: frames
 * from the host copy (NEW), the record says both. */
static void test_staged_region_refused(void **state) {
  (void)state;
  staged_case(HR_CAP_RDMA_DATA_PLANE, 1, 1,
              "RDMA_GPUDIRECT is not in both HELLOs", 1);
}

static void test_no_hmem(void **state) {
  (void)state;
  staged_case(GD, 0, 0, "needs FI_HMEM", 0);
}

static void test_no_gpudirect(void **state) {
  (void)state;
  staged_case(HR_CAP_RDMA_DATA_PLANE, 1, 0,
              "RDMA_GPUDIRECT is not in both HELLOs", 0);
}

/* The producer's event fails on the device: the GET fails with the
 * staging error, and the registration made for it is gone. */
static void test_event_fails(void **state) {
  (void)state;
  world *w = world_open(GD, 1, 1, 1);
  atomic_store(&wait_fails, 1);
  get(w, NULL);
  atomic_store(&wait_fails, 0);
  assert_true(w->r.done);
  assert_int_not_equal(w->r.status, 0);
  assert_null(w->r.got);
  assert_int_equal(w->r.rec.wire_error, HR_WIRE_INTERNAL);
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.live_regs, 0);
  assert_int_equal(st.bytes, 0);
  world_close(w);
}

/* The peer goes away in the middle of the transfer from device memory:
 * the stream fails, the client retries once with frames (staged), and
 * gets exactly NEW. */
static void peer_gone(int dest) {
  world *w = world_open(GD, dest, 1, 1);
  hr__fake_faults_of(w->es)->peer_gone_after = 4096;
  uint32_t sid = 0;
  get(w, &sid);
  assert_true(w->r.done);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->r.got, w->pr.p.newb));
  if (is_sim()) {
    assert_true(w->r.sid != sid); /* completed as the retry */
    want_fallback(&w->r.rec, dest ? "GPUDIRECT_UNAVAILABLE from the peer"
                                  : "transfer failed");
    assert_int_equal(w->srv_rec.data_plane, HR_PLANE_FRAMES);
    want_fallback(&w->srv_rec, "frames since");
  }
  world_close(w);
}

static void test_peer_gone_tagged(void **state) {
  (void)state;
  peer_gone(0);
}

static void test_peer_gone_write(void **state) {
  (void)state;
  peer_gone(1);
}

/* The client cancels while the server waits for the producer's event:
 * the stream ends, the registration made for it goes, and the wait's late
 * completion touches nothing. */
static void test_cancel_while_waiting(void **state) {
  (void)state;
  if (!is_sim())
    skip();
  world *w = world_open(GD, 1, 1, 1);
  uint32_t sid = 0;
  rp_get_start(w->c, &w->r, "t", NULL, 0, &sid);
  /* Until the server holds the registration and waits. */
  hr__fake_stats st;
  for (int i = 0; i < 100; i++) {
    w->now += 1000;
    tu_pipe_move(&w->c2s, w->c, w->s, w->now, -1);
    tu_pipe_move(&w->s2c, w->s, w->c, w->now, -1);
    hr__fake_get_stats(w->es, &st);
    if (st.live_regs)
      break;
  }
  assert_int_equal(st.live_regs, 1);
  assert_int_equal(hr_gpu_event_query(w->pr.p.ev), HR_ERR_WOULDBLOCK);
  assert_int_equal(hr_session_cancel(w->c, sid), 0);
  pump(w);
  assert_true(w->r.done);
  assert_int_not_equal(w->r.status, 0);
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.live_regs, 0);
  assert_int_equal(st.bytes, 0);
  /* The connection is fine afterwards. */
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->r.got, w->pr.p.newb));
  world_close(w);
}

/* ---- PUT: the client is the source (decision 75) ------------------------ */

/* Queues a PUT of `t` under "t"; *sid its stream (sid may be NULL). */
static void put_start(world *w, hr_tensor *t, uint32_t *sid) {
  w->r.done = 0;
  assert_int_equal(hr_session_put(w->c, (const uint8_t *)"t", 1, HR_PUT_REPLACE,
                                  t, rp_on_put, &w->r, sid),
                   0);
}

static void put(world *w, hr_tensor *t) {
  put_start(w, t, NULL);
  pump(w);
  assert_int_equal(w->r.done, 1);
}

/* A PUT of a device tensor whose producer is still running: GPUDirect
 * (simulated device) sends exactly NEW from the device memory, after the
 * event; on another backend it is staged into host memory and goes over
 * RDMA from there, and says so. */
static void gpudirect_put(int dest) {
  world *w = world_open(GD, dest, 1, 1);
  if (is_sim())
    assert_int_equal(hr_gpu_event_query(w->pr.p.ev), HR_ERR_WOULDBLOCK);
  put(w, w->pr.t);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  assert_true(w->started > 0);
  assert_int_equal(w->ran_inline, is_sim() ? 0 : 1);
  hr__fake_stats st;
  hr__fake_get_stats(w->ec, &st);
  if (is_sim()) {
    assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
    assert_string_equal(w->r.rec.fallback, "");
    /* Only the wait for the event ran on the device: nothing staged. */
    assert_int_equal(w->started, 1);
    assert_int_equal(st.last_reg_device_tag, HR_GPU_DEV_SIM);
    assert_int_equal(st.bytes, SIZE);
  } else {
    assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
    want_fallback(&w->r.rec, "device tensor staged for RDMA");
    assert_int_equal(st.last_reg_device_tag, HR_DEV_CPU);
    assert_int_equal(st.bytes, SIZE);
  }
  world_close(w);
}

static void test_put_tagged(void **state) {
  (void)state;
  gpudirect_put(0);
}

static void test_put_destination(void **state) {
  (void)state;
  gpudirect_put(1);
}

/* The producer declared without its event: the PUT sends OLD, which
 * gpudirect_put would catch. */
static void test_put_skipped_event(void **state) {
  (void)state;
  world *w = world_open(GD, 1, 1, 0);
  put(w, w->pr.t);
  assert_int_equal(w->r.status, 0);
  assert_false(bytes_are(w->st.committed, w->pr.p.newb));
  assert_true(bytes_are(w->st.committed, w->pr.p.oldb));
  world_close(w);
}

/* A fabric that cannot reach the device's memory: staged, then RDMA from
 * the host region, the client's record says why, the bytes are NEW. */
static void test_put_no_hmem(void **state) {
  (void)state;
  world *w = world_open(GD, 0, 0, 1);
  put(w, w->pr.t);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
  want_fallback(&w->r.rec, "device tensor staged for RDMA: ");
  if (is_sim())
    want_fallback(&w->r.rec, "needs FI_HMEM");
  hr__fake_stats st;
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.regs, 1);
  assert_int_equal(st.last_reg_device_tag, HR_DEV_CPU);
  assert_int_equal(st.bytes, SIZE);
  world_close(w);
}

/* The producer's event fails on the device while GPUDirect waits for it:
 * that PUT fails with the device's error, nothing stays registered, and
 * the next PUT goes. */
static void test_put_event_fails(void **state) {
  (void)state;
  world *w = world_open(GD, 1, 1, 1);
  atomic_store(&wait_fails, 1);
  put(w, w->pr.t);
  atomic_store(&wait_fails, 0);
  assert_int_equal(w->r.status, HR_ERR_IO);
  assert_null(w->st.committed);
  hr__fake_stats st;
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.live_regs, 0);
  assert_int_equal(st.bytes, 0);
  put(w, w->pr.t);
  if (w->r.status)
    printf("PUT: %s: %s (wire 0x%x)\n", hr_strerror(w->r.status),
           w->r.rec.message, w->r.rec.wire_error);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  world_close(w);
}

/* A cancel while the GPUDirect source waits for the producer's event,
 * before its TENSOR_PUT went: it ends here (the server never saw it),
 * its callback comes once the wait landed, the registration goes, and
 * the connection PUTs again. */
static void test_put_cancel_while_waiting(void **state) {
  (void)state;
  if (!is_sim())
    skip();
  world *w = world_open(GD, 1, 1, 1);
  uint32_t sid = 0;
  put_start(w, w->pr.t, &sid);
  for (int i = 0; i < 20; i++) {
    w->now += 1000;
    tu_pipe_move(&w->c2s, w->c, w->s, w->now, -1);
    tu_pipe_move(&w->s2c, w->s, w->c, w->now, -1);
  }
  hr__fake_stats st;
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.live_regs, 1);
  assert_int_equal(hr_gpu_event_query(w->pr.p.ev), HR_ERR_WOULDBLOCK);
  assert_int_equal(hr_session_cancel(w->c, sid), 0);
  /* Not before the device got past the wait. */
  assert_int_equal(w->r.done, 0);
  pump(w);
  assert_int_equal(w->r.done, 1);
  assert_int_equal(w->r.status, HR_ERR_CLOSED);
  assert_int_equal(hr_gpu_event_query(w->pr.p.ev), 0);
  assert_null(w->st.committed);
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.live_regs, 0);
  assert_int_equal(st.bytes, 0);
  put(w, w->pr.t);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  world_close(w);
}

/* ---- decision 78: no callback inside hr_session_put(); none before the
 * fabric let go of the device memory ------------------------------------ */

static void put_release(void *ctx) {
  world *w = ctx;
  atomic_fetch_add(&w->released, 1);
}

/* The world's device memory and event as a tensor whose release `w`
 * counts. */
static hr_tensor *counted_tensor(world *w) {
  hr_descriptor desc = tu_bytes_desc(SIZE, 0, w->d.caps.device_tag);
  desc.buffers[0].device_index = w->d.caps.device_index;
  hr_tensor *t;
  assert_int_equal(hr_tensor_wrap_device(&t, &desc, &w->pr.p.dev, w->pr.p.ev,
                                         put_release, w, NULL),
                   0);
  return t;
}

/* rp_on_put, noting whether it ran inside hr_session_put() and whether
 * the tensor's release had come. */
static void on_put_78(hr_session *s, uint32_t sid,
                      const hr_transfer_record *rec, void *ud) {
  world *w = ud;
  if (w->in_request)
    w->cb_in_request++;
  w->released_at_cb = atomic_load(&w->released);
  rp_on_put(s, sid, rec, &w->r);
}

/* Queues a PUT of `t` as the application does, marking the call. */
static void put_78(world *w, hr_tensor *t, uint32_t *sid) {
  w->r.done = 0;
  w->in_request = 1;
  assert_int_equal(hr_session_put(w->c, (const uint8_t *)"t", 1, HR_PUT_REPLACE,
                                  t, on_put_78, w, sid),
                   0);
  w->in_request = 0;
  assert_int_equal(w->cb_in_request, 0);
}

/* The first staging chunk fails inside hr_session_put() (no pinned
 * memory; or, with the work run inline, the device refusing the wait for
 * the producer): the callback does not run inside the call, the session's
 * deadline is due at once, and the next hr_session_handle_expiry() runs
 * it, after the tensor's release.  The connection PUTs again. */
static void put_fails_at_once(int inline_wait) {
  world *w = world_open(0, 0, 0, 1);
  hr_tensor *t = counted_tensor(w);
  if (inline_wait) {
    w->inline_work = 1;
    atomic_store(&wait_fails, 1);
  } else {
    atomic_store(&pinned_fails, 1);
  }
  uint32_t sid = 0;
  put_78(w, t, &sid);
  hr_tensor_unref(t);
  assert_int_equal(w->r.done, 0);
  assert_true(sid != 0);
  assert_int_equal(atomic_load(&w->released), 1);
  /* Due now: the host's next step runs it. */
  assert_true(hr_session_get_expiry(w->c) <= w->now);
  assert_int_equal(hr_session_handle_expiry(w->c, w->now), 0);
  assert_int_equal(w->r.done, 1);
  assert_int_equal(w->r.sid, sid);
  assert_int_equal(w->r.status, inline_wait ? HR_ERR_IO : HR_ERR_NOMEM);
  assert_int_equal(w->released_at_cb, 1);
  assert_true(hr_session_get_expiry(w->c) > w->now);
  atomic_store(&wait_fails, 0);
  atomic_store(&pinned_fails, 0);
  w->inline_work = 0;
  pump(w);
  assert_int_equal(w->r.done, 1);
  assert_null(w->st.committed);
  put(w, w->pr.t);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  world_close(w);
}

static void test_put_no_pinned_at_once(void **state) {
  (void)state;
  put_fails_at_once(0);
}

static void test_put_wait_fails_inline(void **state) {
  (void)state;
  put_fails_at_once(1);
}

/* A due callback also comes with the connection's end, which a host
 * reports without asking for the deadline first. */
static void test_put_due_at_terminate(void **state) {
  (void)state;
  world *w = world_open(0, 0, 0, 1);
  atomic_store(&pinned_fails, 1);
  put_78(w, w->pr.t, NULL);
  atomic_store(&pinned_fails, 0);
  assert_int_equal(w->r.done, 0);
  assert_int_equal(hr_session_callbacks_parked(w->c), 0); /* due, not held */
  hr_session_terminate(w->c, w->now);
  assert_int_equal(w->r.done, 1);
  assert_int_equal(w->r.status, HR_ERR_NOMEM);
  world_close(w);
}

/* Moves messages, runs `run`'s fabric (not `hold`'s) and the device's
 * completions, until `hold` has an operation started and not yet run
 * (the NIC reading the memory) or `steps` steps passed. */
static void pump_holding(world *w, hr__fake_ep *run, hr__fake_ep *hold,
                         int until_started, int steps) {
  for (int i = 0; i < steps; i++) {
    if (until_started && hr__fake_pending(hold) > 0)
      return;
    w->now += 1000;
    int a = tu_pipe_move(&w->c2s, w->c, w->s, w->now, -1);
    int b = tu_pipe_move(&w->s2c, w->s, w->c, w->now, -1);
    int c = hr__fake_progress(run) > 0;
    int e = 0;
    works_drain_n(w, &e);
    if (!a && !b && !c && !e)
      hr__test_sleep(200000);
  }
}

/* A GPUDirect PUT ends early (cancelled, or its connection lost) while
 * the client's RMA write from the device has started and not finished:
 * neither the tensor's release nor the callback comes before the fabric
 * reports the operation ended; then the release, then the callback. */
static void put_ends_while_nic_reads(int lost) {
  if (!is_sim())
    skip();
  world *w = world_open(GD, 1, 1, 1);
  hr_tensor *t = counted_tensor(w);
  uint32_t sid = 0;
  put_78(w, t, &sid);
  hr_tensor_unref(t);
  pump_holding(w, w->es, w->ec, 1, 20000);
  assert_true(hr__fake_pending(w->ec) > 0);
  assert_int_equal(w->r.done, 0);
  if (lost) {
    hr_session_terminate(w->c, w->now);
  } else {
    assert_int_equal(hr_session_cancel(w->c, sid), 0);
    /* The CANCEL goes, the server's ERROR CANCELLED comes back. */
    pump_holding(w, w->es, w->ec, 0, 50);
  }
  if (hr_session_get_expiry(w->c) <= w->now)
    hr_session_handle_expiry(w->c, w->now);
  assert_true(hr__fake_pending(w->ec) > 0);
  assert_int_equal(w->r.done, 0);
  assert_int_equal(atomic_load(&w->released), 0);
  /* What a host asks before it deletes the session (the engine waits). */
  assert_int_equal(hr_session_callbacks_parked(w->c), 1);
  /* The fabric reports the write ended (cancelled): the registration is
   * released, the tensor with it, and only then does the PUT call back. */
  hr__fake_progress(w->ec);
  assert_int_equal(hr_session_callbacks_parked(w->c), 0);
  assert_int_equal(w->r.done, 1);
  assert_int_equal(w->r.sid, sid);
  assert_int_not_equal(w->r.status, 0);
  assert_int_equal(w->released_at_cb, 1);
  assert_null(w->st.committed);
  if (!lost) {
    put(w, w->pr.t);
    assert_int_equal(w->r.status, 0);
    assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  }
  world_close(w);
}

static void test_put_cancel_while_nic_reads(void **state) {
  (void)state;
  put_ends_while_nic_reads(0);
}

static void test_put_lost_while_nic_reads(void **state) {
  (void)state;
  put_ends_while_nic_reads(1);
}

/* A served GET of a device tensor ends (the client cancels, or the
 * server's connection is lost) while the server's RMA write from the
 * device has started: the tensor's release waits for the fabric. */
static void get_ends_while_nic_reads(int lost) {
  if (!is_sim())
    skip();
  world *w = world_open(GD, 1, 1, 1);
  hr_tensor_unref(w->st.served);
  w->st.served = counted_tensor(w);
  uint32_t sid = 0;
  rp_get_start(w->c, &w->r, "t", NULL, 0, &sid);
  pump_holding(w, w->ec, w->es, 1, 20000);
  assert_true(hr__fake_pending(w->es) > 0);
  /* The session's references are the last ones. */
  hr_tensor_unref(w->st.served);
  w->st.served = NULL;
  if (lost) {
    hr_session_terminate(w->s, w->now);
  } else {
    assert_int_equal(hr_session_cancel(w->c, sid), 0);
    pump_holding(w, w->ec, w->es, 0, 50);
    assert_int_equal(w->srv_recs, 1); /* the server's stream ended */
  }
  assert_true(hr__fake_pending(w->es) > 0);
  assert_int_equal(atomic_load(&w->released), 0);
  hr__fake_progress(w->es);
  assert_int_equal(atomic_load(&w->released), 1);
  world_close(w);
}

static void test_get_cancel_while_nic_reads(void **state) {
  (void)state;
  get_ends_while_nic_reads(0);
}

static void test_get_lost_while_nic_reads(void **state) {
  (void)state;
  get_ends_while_nic_reads(1);
}

/* ---- staged sources (decision 76) ---------------------------------------- */

/* No RDMA_GPUDIRECT: every device tensor is staged into a host region. */
#define STAGED HR_CAP_RDMA_DATA_PLANE

/* Moves messages (draining finished work) until the staging copy is on
 * the device, waiting for the producer's gate. */
static void until_copy_started(world *w) {
  for (int i = 0; i < 2000 && w->started == 0; i++) {
    w->now += 1000;
    tu_pipe_move(&w->c2s, w->c, w->s, w->now, -1);
    tu_pipe_move(&w->s2c, w->s, w->c, w->now, -1);
    works_drain(w);
  }
  assert_int_equal(w->started, 1);
}

/* A wrong producer (no event declared) staged: the copy reads the device
 * at once and the client gets OLD over RDMA; staged_case shows the right
 * one gets NEW.  The same for a PUT. */
static void test_staged_skipped_event(void **state) {
  (void)state;
  if (!is_sim())
    skip(); /* only the simulated device's gate is slow for sure */
  world *w = world_open(STAGED, 0, 0, 0);
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
  assert_false(bytes_are(w->r.got, w->pr.p.newb));
  assert_true(bytes_are(w->r.got, w->pr.p.oldb));
  produced pr2;
  produce(&w->d, &pr2, 0);
  put(w, pr2.t);
  assert_int_equal(w->r.status, 0);
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
  assert_true(bytes_are(w->st.committed, pr2.p.oldb));
  produced_free(&w->d, &pr2);
  world_close(w);
}

/* The host region cannot be allocated: that GET fails with
 * RESOURCE_EXHAUSTED, that PUT with HR_ERR_NOMEM (before its TENSOR_PUT
 * went: locally), nothing is registered, and the next ones go. */
static void test_staged_alloc_fails(void **state) {
  (void)state;
  world *w = world_open(STAGED, 0, 0, 1);
  atomic_store(&pinned_fails, 1);
  get(w, NULL);
  assert_true(w->r.done);
  assert_int_not_equal(w->r.status, 0);
  assert_null(w->r.got);
  assert_int_equal(w->r.rec.wire_error, HR_WIRE_RESOURCE_EXHAUSTED);
  put(w, w->pr.t);
  assert_int_equal(w->r.status, HR_ERR_NOMEM);
  assert_int_equal(w->r.rec.wire_error, 0);
  assert_null(w->st.committed);
  atomic_store(&pinned_fails, 0);
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.regs, 0);
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.regs, 0);
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->r.got, w->pr.p.newb));
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
  put(w, w->pr.t);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  world_close(w);
}

/* The staging copy's wait for the producer's event fails on the device:
 * that GET fails with INTERNAL, that PUT with HR_ERR_IO, the region goes,
 * nothing is registered. */
static void test_staged_copy_fails(void **state) {
  (void)state;
  world *w = world_open(STAGED, 0, 0, 1);
  atomic_store(&wait_fails, 1);
  get(w, NULL);
  assert_true(w->r.done);
  assert_null(w->r.got);
  assert_int_equal(w->r.rec.wire_error, HR_WIRE_INTERNAL);
  put(w, w->pr.t);
  assert_int_equal(w->r.status, HR_ERR_IO);
  assert_null(w->st.committed);
  atomic_store(&wait_fails, 0);
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.regs, 0);
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.regs, 0);
  put(w, w->pr.t);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  world_close(w);
}

/* A budget too small for the tensor, and a budget of 0: staged and framed
 * as before, the record says why. */
static void test_staged_budget(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++) {
    world *w = world_open_b(STAGED, 0, 0, 1, i ? 0 : SIZE / 2);
    get(w, NULL);
    assert_int_equal(w->r.status, 0);
    assert_true(bytes_are(w->r.got, w->pr.p.newb));
    assert_int_equal(w->srv_rec.data_plane, HR_PLANE_FRAMES);
    want_fallback(&w->srv_rec, "device tensor staged and framed");
    want_fallback(&w->srv_rec,
                  i ? "RDMA staging is off" : "RDMA staging budget is spent");
    put(w, w->pr.t);
    assert_int_equal(w->r.status, 0);
    assert_int_equal(w->r.rec.data_plane, HR_PLANE_FRAMES);
    assert_true(bytes_are(w->st.committed, w->pr.p.newb));
    hr__fake_stats st;
    hr__fake_get_stats(w->es, &st);
    assert_int_equal(st.regs, 0);
    world_close(w);
  }
}

/* The client cancels while the server's staging copy waits for the
 * producer: the stream ends at once, the region goes once the copy
 * landed (the budget, room for one region, takes the next GET), nothing
 * was registered. */
static void test_staged_cancel(void **state) {
  (void)state;
  if (!is_sim())
    skip();
  world *w = world_open_b(STAGED, 0, 0, 1, SIZE + 4096);
  uint32_t sid = 0;
  rp_get_start(w->c, &w->r, "t", NULL, 0, &sid);
  until_copy_started(w);
  assert_int_equal(hr_gpu_event_query(w->pr.p.ev), HR_ERR_WOULDBLOCK);
  assert_int_equal(hr_session_cancel(w->c, sid), 0);
  pump(w);
  assert_true(w->r.done);
  assert_int_not_equal(w->r.status, 0);
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.regs, 0);
  assert_int_equal(st.bytes, 0);
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->r.got, w->pr.p.newb));
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
  world_close(w);
}

/* A PUT cancelled while its staging copy waits for the producer: it ends
 * here (its TENSOR_PUT never went), its one callback comes only once the
 * copy landed (ADR-018 § 5), and the connection PUTs again. */
static void test_staged_put_cancel(void **state) {
  (void)state;
  if (!is_sim())
    skip();
  world *w = world_open(STAGED, 0, 0, 1);
  uint32_t sid = 0;
  put_start(w, w->pr.t, &sid);
  until_copy_started(w);
  assert_int_equal(hr_gpu_event_query(w->pr.p.ev), HR_ERR_WOULDBLOCK);
  assert_int_equal(hr_session_cancel(w->c, sid), 0);
  assert_int_equal(w->r.done, 0);
  pump(w);
  assert_int_equal(w->r.done, 1);
  assert_int_equal(w->r.status, HR_ERR_CLOSED);
  assert_int_equal(hr_gpu_event_query(w->pr.p.ev), 0);
  assert_null(w->st.committed);
  hr__fake_stats st;
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.regs, 0);
  put(w, w->pr.t);
  assert_int_equal(w->r.status, 0);
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  world_close(w);
}

/* The serving session is deleted while its staging copy runs: the copy
 * finishes on its own, the region goes with it, nothing stays
 * registered, and the client's GET fails once. */
static void test_staged_teardown(void **state) {
  (void)state;
  if (!is_sim())
    skip();
  world *w = world_open(STAGED, 0, 0, 1);
  rp_get_start(w->c, &w->r, "t", NULL, 0, NULL);
  until_copy_started(w);
  hr_session_del(w->s);
  w->s = NULL;
  for (int i = 0; i < 2000 && works_drain(w); i++)
    hr__test_sleep(1000000);
  assert_int_equal(works_drain(w), 0);
  assert_int_equal(hr_gpu_event_query(w->pr.p.ev), 0);
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.regs, 0);
  assert_false(w->r.done);
  hr_session_del(w->c);
  w->c = NULL;
  assert_int_equal(w->r.done, 1);
  assert_int_not_equal(w->r.status, 0);
  world_close(w);
}

/* The client cannot post its receives and answers ERROR instead of
 * RDMA_READY: the server's staged source ends, the client retries once,
 * with frames, and gets NEW.  The same for a PUT whose server cannot
 * post its receives: the retry goes as frames from the staged copy. */
static void test_staged_peer_refuses(void **state) {
  (void)state;
  world *w = world_open(STAGED, 0, 0, 1);
  hr__fake_faults_of(w->ec)->recv_start = 1;
  uint32_t sid = 0;
  get(w, &sid);
  assert_true(w->r.done);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->r.got, w->pr.p.newb));
  assert_true(w->r.sid != sid); /* completed as the retry */
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_FRAMES);
  want_fallback(&w->srv_rec, "frames since");
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.live_regs, 0);
  world_close(w);
  w = world_open(STAGED, 0, 0, 1);
  hr__fake_faults_of(w->es)->recv_start = 1;
  put_start(w, w->pr.t, &sid);
  pump(w);
  assert_int_equal(w->r.done, 1); /* one callback, the retry's */
  assert_int_equal(w->r.status, 0);
  assert_true(w->r.sid != sid);
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_FRAMES);
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.live_regs, 0);
  world_close(w);
}

/* ---- reused staged regions (decision 79) --------------------------------- */

/* Serves a complete device tensor of `n` bytes holding gt_fill()
 * pattern `seed` (no event) from now on; w->hb2 holds the pattern.  The
 * world frees it (once per world). */
static void serve_second(world *w, uint64_t n, unsigned seed) {
  assert_null(w->t2);
  w->hb2 = tu_host_buf(w->d.g, n);
  gt_fill(hr_gpu_buf_host_ptr(w->hb2), n, seed);
  assert_int_equal(hr_gpu_buf_alloc(w->d.g, HR_GPU_MEM_DEVICE, n, &w->db2), 0);
  assert_int_equal(hr_gpu_copy_async(w->d.P, w->db2, 0, w->hb2, 0, n), 0);
  assert_int_equal(hr_gpu_stream_sync(w->d.P), 0);
  hr_descriptor desc = tu_bytes_desc(n, 0, w->d.caps.device_tag);
  desc.buffers[0].device_index = w->d.caps.device_index;
  assert_int_equal(
      hr_tensor_wrap_device(&w->t2, &desc, &w->db2, NULL, NULL, NULL, NULL), 0);
  hr_tensor_unref(w->st.served);
  w->st.served = hr_tensor_ref(w->t2);
}

static int got_is(hr_tensor *t, hr_gpu_buf *want, uint64_t n) {
  return t && hr_tensor_bytes(t) == n &&
         memcmp(hr_tensor_buffer(t, 0), hr_gpu_buf_host_ptr(want), n) == 0;
}

static hr__stage_stats acct_stats(hr_stage_account *a) {
  hr__stage_stats st;
  hr__stage_account_stats(a, &st);
  return st;
}

/* The account's stats, after checking how many regions it made, how
 * many times it reused one, and how many are idle. */
static hr__stage_stats want_regions(hr_stage_account *a, uint64_t made,
                                    uint64_t reused, unsigned idle_regions) {
  hr__stage_stats st = acct_stats(a);
  assert_int_equal(st.made, made);
  assert_int_equal(st.reused, reused);
  assert_int_equal(st.idle_regions, idle_regions);
  return st;
}

/* Registrations the server's fabric revoked so far. */
static uint64_t srv_invalidations(world *w) {
  hr__fake_stats fs;
  hr__fake_get_stats(w->es, &fs);
  return fs.invalidations;
}

/* staged_world()'s budget or keep: the defaults'. */
#define STAGE_DEFAULT UINT64_MAX

/* A world whose sessions stage device tensors for RDMA through one
 * fresh account (*a, which the world holds), with `budget` and `keep`
 * (STAGE_DEFAULT: the defaults'). */
static world *staged_world(uint64_t budget, uint64_t keep,
                           hr_stage_account **a) {
  hr_settings def;
  hr_settings_default(&def);
  *a = hr__stage_account_new(NULL);
  assert_non_null(*a);
  return world_open_x(STAGED, 0, 0, 1,
                      budget == STAGE_DEFAULT ? def.rdma_stage_budget : budget,
                      keep == STAGE_DEFAULT ? def.rdma_stage_keep : keep, *a);
}

/* A GET that succeeds over RDMA with the `n` bytes of `want`. */
static void get_rdma(world *w, hr_gpu_buf *want, uint64_t n) {
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_true(got_is(w->r.got, want, n));
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
}

/* Two GETs of different tensors of one size and a PUT: one region,
 * allocated once, each transfer's own bytes; while it is idle its
 * registration is not revoked, and nothing is counted but the region. */
static void test_staged_reuse(void **state) {
  (void)state;
  hr_stage_account *a;
  world *w = staged_world(STAGE_DEFAULT, STAGE_DEFAULT, &a);
  get_rdma(w, w->pr.p.newb, SIZE);
  hr__stage_stats st = want_regions(a, 1, 0, 1);
  assert_true(st.idle >= SIZE && st.idle <= SIZE + SIZE / 8 + (64 << 10));
  assert_int_equal(st.used, st.idle);
  assert_int_equal(srv_invalidations(w), 0);
  /* Another tensor of the same size: the idle region, refilled. */
  serve_second(w, SIZE, 7);
  get_rdma(w, w->hb2, SIZE);
  want_fallback(&w->srv_rec, "device tensor staged for RDMA");
  want_regions(a, 1, 1, 1);
  /* The client's PUT stages through the same account: the same region. */
  put(w, w->pr.t);
  assert_int_equal(w->r.status, 0);
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  st = want_regions(a, 1, 2, 1);
  assert_int_equal(st.used, st.idle);
  assert_int_equal(srv_invalidations(w), 0);
  world_close(w);
}

/* rdma_stage_keep 0: every region is freed when its transfer ends (its
 * registration revoked then), nothing stays counted. */
static void test_staged_keep_none(void **state) {
  (void)state;
  hr_stage_account *a;
  world *w = staged_world(STAGE_DEFAULT, 0, &a);
  for (int i = 0; i < 2; i++)
    get_rdma(w, w->pr.p.newb, SIZE);
  assert_int_equal(want_regions(a, 2, 0, 0).used, 0);
  for (int i = 0; i < 10; i++)
    hr__fake_progress(w->es);
  assert_true(srv_invalidations(w) >= 2);
  world_close(w);
}

/* The budget holds one region of SIZE and not one of SIZE / 2 beside
 * it: the idle region gives its budget back, and the smaller tensor goes
 * over RDMA, not as frames. */
static void test_staged_idle_gives_budget(void **state) {
  (void)state;
  hr_stage_account *a;
  world *w = staged_world(SIZE + SIZE / 4, STAGE_DEFAULT, &a);
  get_rdma(w, w->pr.p.newb, SIZE);
  want_regions(a, 1, 0, 1);
  serve_second(w, SIZE / 2, 9);
  get_rdma(w, w->hb2, SIZE / 2);
  hr__stage_stats st = want_regions(a, 2, 0, 1); /* idle: the smaller one */
  assert_true(st.idle < SIZE);
  assert_int_equal(st.used, st.idle);
  world_close(w);
}

/* The copy into a reused region fails (the wait for the producer's
 * event): that GET fails with INTERNAL, the region goes back idle with
 * its bytes still counted once, and the next GET reuses it. */
static void test_staged_reuse_copy_fails(void **state) {
  (void)state;
  hr_stage_account *a;
  world *w = staged_world(STAGE_DEFAULT, STAGE_DEFAULT, &a);
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  uint64_t idle = acct_stats(a).idle;
  atomic_store(&wait_fails, 1);
  get(w, NULL);
  assert_true(w->r.done);
  assert_null(w->r.got);
  assert_int_equal(w->r.rec.wire_error, HR_WIRE_INTERNAL);
  atomic_store(&wait_fails, 0);
  hr__stage_stats st = want_regions(a, 1, 1, 1);
  assert_int_equal(st.idle, idle);
  assert_int_equal(st.used, idle);
  /* An allocation failure does not matter to a reused region (the
   * failure is off again before the checks, which may end the test). */
  atomic_store(&pinned_fails, 1);
  get(w, NULL);
  atomic_store(&pinned_fails, 0);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->r.got, w->pr.p.newb));
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
  want_regions(a, 1, 2, 1);
  world_close(w);
}

/* ---- a GPUDirect PUT retried (decisions 44, 45b, 70, 78) ---------------- */

/* How the first try of a GPUDirect PUT fails. */
typedef enum {
  RETRY_SRV_RECV,     /* the server cannot post its receives (tagged) */
  RETRY_SRV_RECV_ERR, /* the server's receives fail (tagged) */
  RETRY_CLI_WRITE,    /* the client cannot start its RMA write into the
                       * server's destination */
  RETRY_CLI_GONE,     /* the peer goes in the middle of that write */
} retry_fault;

/* The PUT's callback, noting what the client's fabric still held then. */
static void on_put_retry(hr_session *s, uint32_t sid,
                         const hr_transfer_record *rec, void *ud) {
  world *w = ud;
  hr__fake_stats st;
  hr__fake_get_stats(w->ec, &st);
  w->cb_live_regs = (int)st.live_regs;
  w->cb_pending = (int)hr__fake_pending(w->ec);
  rp_on_put(s, sid, rec, &w->r);
}

/* A PUT of the device tensor (its producer still running) goes GPUDirect
 * and its first try fails as `f` says: the stream ends with
 * RDMA_SETUP_FAILED or GPUDIRECT_UNAVAILABLE, the client repeats the PUT
 * once under a new stream id on `plane` (frames, or tagged messages
 * instead of the destination), and the application sees exactly one
 * callback, the retry's, whose record says why (`why`), after the first
 * try's registration of the device memory went; the server stores the
 * bytes the producer wrote (NEW), and the connection PUTs again. */
static void put_retry(retry_fault f, int dest, int plane, const char *why) {
  if (!is_sim())
    skip(); /* only the simulated device is a GPUDirect source here */
  world *w = world_open(GD, dest, 1, 1);
  hr__fake_faults *fs = hr__fake_faults_of(w->es);
  hr__fake_faults *fc = hr__fake_faults_of(w->ec);
  switch (f) {
  case RETRY_SRV_RECV: fs->recv_start = 1; break;
  case RETRY_SRV_RECV_ERR: fs->recv_error = 1; break;
  case RETRY_CLI_WRITE: fc->write_start = 1; break;
  case RETRY_CLI_GONE: fc->peer_gone_after = 4096; break;
  }
  hr_tensor *t = counted_tensor(w);
  uint32_t sid = 0;
  w->r.done = 0;
  w->cb_live_regs = w->cb_pending = -1;
  assert_int_equal(hr_session_put(w->c, (const uint8_t *)"t", 1,
                                  HR_PUT_REPLACE, t, on_put_retry, w, &sid),
                   0);
  hr_tensor_unref(t);
  assert_int_equal(w->r.done, 0);
  hr__fake_stats st;
  pump(w);
  if (w->r.status)
    printf("PUT: %s: %s (wire 0x%x)\n", hr_strerror(w->r.status),
           w->r.rec.message, w->r.rec.wire_error);
  assert_int_equal(w->r.done, 1);
  assert_int_equal(w->r.status, 0);
  assert_true(w->r.sid != sid); /* completed as the retry */
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  assert_int_equal(w->r.rec.data_plane, plane);
  want_fallback(&w->r.rec, why);
  /* The first try read the device memory itself (GPUDirect); by the
   * callback its fabric had let go of it. */
  hr__fake_get_stats(w->ec, &st);
  assert_true(st.regs >= 1);
  if (plane == HR_PLANE_RDMA) {
    /* Tagged instead of the destination, and still from the device
     * memory: the GPUDIRECT_UNAVAILABLE was ours, not the peer's
     * (decision 70 stops GPUDirect on the one it came from). */
    assert_int_equal(st.writes, 0);
    assert_int_equal(st.sends, 1);
    assert_int_equal(st.bytes, SIZE);
    assert_int_equal(st.last_reg_device_tag, HR_GPU_DEV_SIM);
  } else {
    /* Frames: whatever went over the fabric was the first try's. */
    assert_true(st.writes + st.sends <= 1);
    assert_true(st.bytes <= SIZE);
  }
  assert_int_equal(w->cb_live_regs, 0);
  assert_int_equal(w->cb_pending, 0);
  assert_int_equal(st.live_regs, 0);
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.live_regs, 0);
  /* The tensor went with the request. */
  assert_int_equal(atomic_load(&w->released), 1);
  /* Nothing more comes, and the connection PUTs again. */
  pump(w);
  assert_int_equal(w->r.done, 1);
  *fs = (hr__fake_faults){.peer_gone_after = -1};
  *fc = (hr__fake_faults){.peer_gone_after = -1};
  put(w, w->pr.t);
  assert_int_equal(w->r.status, 0);
  assert_true(bytes_are(w->st.committed, w->pr.p.newb));
  world_close(w);
}

static void test_put_retry_setup_refused(void **state) {
  (void)state;
  put_retry(RETRY_SRV_RECV, 0, HR_PLANE_FRAMES,
            "frames since: RDMA_SETUP_FAILED from the peer");
}

static void test_put_retry_receive_failed(void **state) {
  (void)state;
  put_retry(RETRY_SRV_RECV_ERR, 0, HR_PLANE_FRAMES,
            "frames since: RDMA_SETUP_FAILED from the peer");
}

static void test_put_retry_gpudirect_unavailable(void **state) {
  (void)state;
  put_retry(RETRY_CLI_WRITE, 1, HR_PLANE_RDMA, "GPUDIRECT_UNAVAILABLE sent");
}

static void test_put_retry_peer_gone(void **state) {
  (void)state;
  put_retry(RETRY_CLI_GONE, 1, HR_PLANE_FRAMES,
            "the RMA write into the destination failed");
}

int main(int argc, char **argv) {
  int rv = gt_main_prologue(argc, argv);
  if (rv)
    return rv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_tagged),
      cmocka_unit_test(test_get_destination),
      cmocka_unit_test(test_get_parallel),
      cmocka_unit_test(test_skipped_event_is_caught),
      cmocka_unit_test(test_registration_refused),
      cmocka_unit_test(test_no_hmem),
      cmocka_unit_test(test_no_gpudirect),
      cmocka_unit_test(test_staged_region_refused),
      cmocka_unit_test(test_event_fails),
      cmocka_unit_test(test_peer_gone_tagged),
      cmocka_unit_test(test_peer_gone_write),
      cmocka_unit_test(test_cancel_while_waiting),
      cmocka_unit_test(test_put_tagged),
      cmocka_unit_test(test_put_destination),
      cmocka_unit_test(test_put_skipped_event),
      cmocka_unit_test(test_put_no_hmem),
      cmocka_unit_test(test_put_event_fails),
      cmocka_unit_test(test_put_cancel_while_waiting),
      cmocka_unit_test(test_put_no_pinned_at_once),
      cmocka_unit_test(test_put_due_at_terminate),
      cmocka_unit_test(test_put_wait_fails_inline),
      cmocka_unit_test(test_put_cancel_while_nic_reads),
      cmocka_unit_test(test_put_lost_while_nic_reads),
      cmocka_unit_test(test_get_cancel_while_nic_reads),
      cmocka_unit_test(test_get_lost_while_nic_reads),
      cmocka_unit_test(test_staged_skipped_event),
      cmocka_unit_test(test_staged_alloc_fails),
      cmocka_unit_test(test_staged_copy_fails),
      cmocka_unit_test(test_staged_budget),
      cmocka_unit_test(test_staged_cancel),
      cmocka_unit_test(test_staged_put_cancel),
      cmocka_unit_test(test_staged_teardown),
      cmocka_unit_test(test_staged_peer_refuses),
      cmocka_unit_test(test_put_retry_setup_refused),
      cmocka_unit_test(test_put_retry_receive_failed),
      cmocka_unit_test(test_put_retry_gpudirect_unavailable),
      cmocka_unit_test(test_put_retry_peer_gone),
      cmocka_unit_test(test_staged_reuse),
      cmocka_unit_test(test_staged_keep_none),
      cmocka_unit_test(test_staged_idle_gives_budget),
      cmocka_unit_test(test_staged_reuse_copy_fails),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
