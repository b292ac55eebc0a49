/*
 * A GET into device memory over the RDMA data plane allocates that memory
 * on a worker (docs/protocol.md § 25.1 decision 73; hr_devrx.c): the
 * receive's setup (the GPUDirect registration, the receives, RDMA_READY)
 * waits for it, through the sans-IO sessions and the fake fabric, with the
 * simulated device's allocation delay and failure:
 *
 *  - a slow allocation (sim_alloc_delay_ns) runs on a worker thread: a
 *    second connection driven by the same thread gets its GET answered
 *    meanwhile, nothing of the device GET is registered before the memory
 *    is there, and then the bytes land exactly (GPUDirect RMA write,
 *    GPUDirect tagged receives, and the host landing without GPUDirect);
 *  - out of device memory (sim_max_device_alloc): that GET fails with
 *    HR_ERR_LIMIT, the server's handshake ends on RESOURCE_EXHAUSTED, no
 *    registration stays, and the connection serves the next GET over RDMA;
 *  - a cancel, and the connection deleted, while the allocation runs: the
 *    memory is freed exactly once (the device closes with nothing alive;
 *    the sanitizers see the rest);
 *  - a sender that goes on before our RDMA_READY fails the GET with
 *    PROTOCOL_VIOLATION.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <hurray/fabric.h>
#include <hurray/gpu.h>
#include <hurray/session.h>
#include <hurray/tensor.h>

#include "common/test_util.h"
#include "fabric/hr_fab_fake.h"
#include "rdma_pair.h"

#define SIZE ((uint64_t)1 << 20)
#define SMALL ((uint64_t)64 << 10)
#define DELAY_NS                                                               \
  300000000ull /* per allocation: device, then a pinned piece                  \
                */
#define GD (HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT)

/* One connection: a client and a server session. */
typedef struct conn {
  hr_session *c, *s;
  tu_pipe c2s, s2c;
  rp_result r; /* the client's completion */
  hr_transfer_record srv_rec;
  int srv_recs;
  struct world *w;
} conn;

typedef struct world {
  hr__fake_world *fw;
  hr__fake_ep *ec, *es;
  uint8_t ext_c[RP_EXT_CAP], ext_s[RP_EXT_CAP];
  hr_tstamp now;
  hr_tensor *served, *small;
  conn a; /* RDMA, the device GETs */
  conn b; /* frames: the other connection of the loop */
  /* Work the sessions submitted, each run on a thread of its own. */
  rp_works works;
} world;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* ---- work on threads ------------------------------------------------------
 */

typedef struct wctx {
  rp_works *k;
  hr_work *work;
} wctx;

static void *work_thread(void *arg) {
  wctx *x = arg;
  x->work->run(x->work);
  rp_works_finish(x->work, x->k);
  free(x);
  return NULL;
}

static int submit_work(hr_session *s, hr_work *w, void *ud) {
  conn *c = ud;
  wctx *x = malloc(sizeof *x);
  assert_non_null(x);
  x->k = &c->w->works;
  x->work = w;
  rp_works_add(x->k, s, w);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, work_thread, x), 0);
  rp_works_set_thread(&c->w->works, w, th);
  return 0;
}

/* Reports finished work on this (the driving) thread; returns how many
 * are still out (*reported: how many were reported now). */
static int works_drain_n(world *w, int *reported) {
  return rp_works_drain(&w->works, w->now, reported);
}

static int works_drain(world *w) {
  return works_drain_n(w, NULL);
}

/* ---- sessions -------------------------------------------------------------
 */

static int p_get(hr_session *s, hr_srv_get *g, void *ud) {
  conn *c = ud;
  (void)s;
  return hr_get_answer(g, c == &c->w->b ? c->w->small : c->w->served);
}

static void on_transfer(hr_session *s, const hr_transfer_record *r, void *ud) {
  conn *c = ud;
  if (s == c->s) {
    c->srv_rec = *r;
    c->srv_recs++;
  }
}

/* One turn of the loop over both connections; 1 when anything moved. */
static int turn(world *w) {
  w->now += 1000;
  int m = 0;
  if (w->a.c) {
    m |= tu_pipe_move(&w->a.c2s, w->a.c, w->a.s, w->now, -1);
    m |= tu_pipe_move(&w->a.s2c, w->a.s, w->a.c, w->now, -1);
  }
  m |= tu_pipe_move(&w->b.c2s, w->b.c, w->b.s, w->now, -1);
  m |= tu_pipe_move(&w->b.s2c, w->b.s, w->b.c, w->now, -1);
  m |= hr__fake_progress(w->ec) > 0;
  m |= hr__fake_progress(w->es) > 0;
  return m;
}

/* Runs the loop until *stop, or until nothing moves and no work is out. */
static void pump_until(world *w, const int *stop) {
  for (int idle = 0, i = 0; i < 400000; i++) {
    int m = turn(w);
    int e = 0, out = works_drain_n(w, &e);
    if (stop && *stop)
      return;
    idle = m || e ? 0 : idle + 1;
    if (idle >= 3 && !out)
      return;
    if (idle >= 3)
      sleep_ns(200000);
  }
  fail_msg("the loop never settled");
}

static void pump(world *w) {
  pump_until(w, NULL);
}

/* Turns the loop until nothing moves, with work still out. */
static void pump_quiet(world *w) {
  for (int idle = 0; idle < 3;)
    idle = turn(w) ? 0 : idle + 1;
}

static void conn_open(world *w, conn *c, hr__fake_ep *ec, hr__fake_ep *es,
                      uint32_t caps, int dest) {
  hr_settings sc, ss;
  rp_settings(&sc, ec, w->ext_c, caps, dest);
  rp_settings(&ss, es, w->ext_s, caps, dest);
  hr_provider prov;
  memset(&prov, 0, sizeof prov);
  prov.size = sizeof prov;
  prov.user_data = c;
  prov.on_get = p_get;
  hr_session_callbacks cbs;
  memset(&cbs, 0, sizeof cbs);
  cbs.size = sizeof cbs;
  cbs.submit_work = submit_work;
  cbs.on_transfer = on_transfer;
  c->w = w;
  assert_int_equal(
      hr_session_new(&c->c, HR_ROLE_CLIENT, &sc, &cbs, NULL, c, w->now, NULL),
      0);
  assert_int_equal(
      hr_session_new(&c->s, HR_ROLE_SERVER, &ss, &cbs, &prov, c, w->now, NULL),
      0);
}

static world *world_open(uint32_t caps, int dest, int hmem) {
  world *w = calloc(1, sizeof *w);
  assert_non_null(w);
  rp_works_init(&w->works);
  rp_fabric_open(&w->fw, &w->ec, &w->es);
  if (hmem)
    hr__fake_set_hmem(w->ec, HR_GPU_DEV_SIM);
  w->now = 1000;
  w->served = rp_make_tensor(SIZE, 7);
  w->small = rp_make_tensor(SMALL, 9);
  conn_open(w, &w->a, w->ec, w->es, caps, dest);
  conn_open(w, &w->b, NULL, NULL, 0, 0);
  pump(w);
  assert_non_null(hr_session_peer_hello(w->a.c));
  assert_non_null(hr_session_peer_hello(w->b.c));
  return w;
}

static void conn_close(conn *c) {
  hr_session_del(c->c);
  hr_session_del(c->s);
  hr_tensor_unref(c->r.got);
  tu_pipe_free(&c->c2s);
  tu_pipe_free(&c->s2c);
}

static void world_close(world *w) {
  for (int i = 0; i < 5000 && works_drain(w); i++)
    sleep_ns(1000000);
  assert_int_equal(works_drain(w), 0);
  conn_close(&w->a);
  conn_close(&w->b);
  rp_fabric_close(w->fw, w->ec, w->es);
  hr_tensor_unref(w->served);
  hr_tensor_unref(w->small);
  rp_works_fini(&w->works);
  free(w);
}

/* Asks for key "t" (the 1 MiB tensor) or "small"; into `g` when set. */
static uint32_t get_start(conn *c, hr_gpu *g, const char *key) {
  uint32_t sid = 0;
  rp_get_start(c->c, &c->r, key, g, HR_SYNC_PRODUCER_SYNCED, &sid);
  return sid;
}

static hr_gpu *dev_open(uint64_t delay_ns, uint64_t max) {
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.backend = "sim";
  cfg.sim_alloc_delay_ns = delay_ns;
  cfg.sim_max_device_alloc = max;
  hr_gpu *g = NULL;
  assert_int_equal(hr_gpu_open(&g, &cfg, NULL, NULL), 0);
  return g;
}

/* Starts a device GET on connection a and turns the loop until only the
 * allocation is left: the descriptor and the sender's RDMA_REGISTER
 * (SOURCE) are in, nothing is registered on our side yet. */
static uint32_t start_slow(world *w, hr_gpu *g) {
  uint32_t sid = get_start(&w->a, g, "t");
  pump_quiet(w);
  assert_false(w->a.r.done);
  assert_int_equal(works_drain(w), 1);
  hr__fake_stats st;
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.regs, 0);
  assert_int_equal(st.live_regs, 0);
  return sid;
}

/* ---- tests ----------------------------------------------------------------
 */

static void slow_case(uint32_t caps, int dest, int hmem) {
  hr_gpu *g = dev_open(DELAY_NS, 0);
  world *w = world_open(caps, dest, hmem);
  uint64_t t0 = now_ns();
  start_slow(w, g);
  /* The other connection is served while the allocation sleeps. */
  get_start(&w->b, NULL, "s");
  pump_until(w, &w->b.r.done);
  assert_true(w->b.r.done);
  assert_int_equal(w->b.r.status, 0);
  assert_memory_equal(hr_tensor_buffer(w->b.r.got, 0),
                      hr_tensor_buffer(w->small, 0), SMALL);
  assert_true(now_ns() - t0 < DELAY_NS);
  assert_false(w->a.r.done);
  /* Then the device GET goes on, exactly. */
  pump_until(w, &w->a.r.done);
  assert_true(w->a.r.done);
  assert_true(now_ns() - t0 >= DELAY_NS);
  assert_int_equal(w->a.r.status, 0);
  assert_true(hr_tensor_on_device(w->a.r.got));
  assert_true(
      tu_device_equals(g, w->a.r.got, hr_tensor_buffer(w->served, 0), SIZE));
  assert_int_equal(w->a.r.rec.data_plane, HR_PLANE_RDMA);
  hr__fake_stats st;
  hr__fake_get_stats(w->ec, &st);
  if (hmem) {
    assert_string_equal(w->a.r.rec.fallback, "");
    assert_int_equal(st.last_reg_device_tag, HR_GPU_DEV_SIM);
  } else {
    assert_non_null(strstr(w->a.r.rec.fallback,
                           "RDMA into host memory, copied to the "
                           "device"));
  }
  pump(w);
  assert_int_equal(w->a.srv_rec.data_plane, HR_PLANE_RDMA);
  assert_int_equal(w->a.srv_rec.status, 0);
  hr__fake_get_stats(w->es, &st);
  if (dest)
    assert_true(st.writes > 0);
  else
    assert_true(st.sends > 0);
  hr_tensor_unref(w->a.r.got);
  w->a.r.got = NULL;
  world_close(w);
  assert_int_equal(hr_gpu_del(g), 0);
}

static void test_slow_gpudirect_write(void **state) {
  (void)state;
  slow_case(GD, 1, 1);
}

static void test_slow_gpudirect_tagged(void **state) {
  (void)state;
  slow_case(GD, 0, 1);
}

static void test_slow_host_landing(void **state) {
  (void)state;
  slow_case(HR_CAP_RDMA_DATA_PLANE, 0, 0);
}

/* Out of device memory: this GET fails, the handshake ends cleanly on
 * both sides, and the connection goes on over RDMA. */
static void test_alloc_fails(void **state) {
  (void)state;
  hr_gpu *g = dev_open(DELAY_NS / 10, SIZE / 2);
  world *w = world_open(GD, 1, 1);
  get_start(&w->a, g, "t");
  pump_until(w, &w->a.r.done);
  assert_true(w->a.r.done);
  assert_int_equal(w->a.r.status, HR_ERR_LIMIT);
  assert_null(w->a.r.got);
  pump(w);
  assert_int_equal(w->a.srv_recs, 1);
  assert_int_not_equal(w->a.srv_rec.status, 0);
  hr__fake_stats st;
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.regs, 0);
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.live_regs, 0);
  assert_int_equal(st.writes, 0);
  /* The same connection serves the next GET (host memory) over RDMA. */
  get_start(&w->a, NULL, "t");
  pump_until(w, &w->a.r.done);
  assert_int_equal(w->a.r.status, 0);
  assert_int_equal(w->a.r.rec.data_plane, HR_PLANE_RDMA);
  assert_memory_equal(hr_tensor_buffer(w->a.r.got, 0),
                      hr_tensor_buffer(w->served, 0), SIZE);
  world_close(w);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* Cancelled while the memory is allocated: the GET ends as cancelled, the
 * sender's handshake ends, and the memory, once there, is freed. */
static void test_cancel_during_alloc(void **state) {
  (void)state;
  hr_gpu *g = dev_open(DELAY_NS / 3, 0);
  world *w = world_open(GD, 1, 1);
  uint32_t sid = start_slow(w, g);
  assert_int_equal(hr_session_cancel(w->a.c, sid), 0);
  pump(w);
  assert_true(w->a.r.done);
  assert_int_not_equal(w->a.r.status, 0);
  assert_null(w->a.r.got);
  assert_int_equal(w->a.srv_recs, 1);
  assert_int_not_equal(w->a.srv_rec.status, 0);
  hr__fake_stats st;
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.regs, 0);
  world_close(w);
  /* Nothing of the device is alive: freed (and only once: ASan). */
  assert_int_equal(hr_gpu_del(g), 0);
}

/* The connection goes (the client session deleted) during the
 * allocation: the work's report frees what it allocated. */
static void test_conn_gone_during_alloc(void **state) {
  (void)state;
  hr_gpu *g = dev_open(DELAY_NS / 3, 0);
  world *w = world_open(GD, 1, 1);
  start_slow(w, g);
  hr_session_del(w->a.c);
  w->a.c = NULL;
  hr_session_del(w->a.s);
  w->a.s = NULL;
  assert_true(w->a.r.done); /* completed with HR_ERR_CLOSED */
  assert_int_not_equal(w->a.r.status, 0);
  world_close(w);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* A sender that goes on before our RDMA_READY (here: an RDMA_READY of
 * its own while the memory is allocated) breaks the handshake: the GET
 * fails with PROTOCOL_VIOLATION, and the memory is freed when it comes. */
static void test_message_before_ready(void **state) {
  (void)state;
  hr_gpu *g = dev_open(DELAY_NS / 3, 0);
  world *w = world_open(GD, 1, 1);
  uint32_t sid = start_slow(w, g);
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_RDMA_READY;
  m.hdr.stream_id = sid;
  uint8_t buf[64];
  int64_t n = hr_wire_encode(&m, buf, sizeof buf);
  assert_true(n > 0);
  assert_true(hr_session_recv(w->a.c, buf, (size_t)n, w->now) >= 0);
  assert_true(w->a.r.done);
  assert_int_equal(w->a.r.status, HR_ERR_PROTO);
  assert_int_equal(w->a.r.rec.wire_error, HR_WIRE_PROTOCOL_VIOLATION);
  pump(w);
  /* The sender's handshake ended on our ERROR. */
  assert_int_equal(w->a.srv_recs, 1);
  assert_int_not_equal(w->a.srv_rec.status, 0);
  hr__fake_stats st;
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.regs, 0);
  world_close(w);
  assert_int_equal(hr_gpu_del(g), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slow_gpudirect_write),
      cmocka_unit_test(test_slow_gpudirect_tagged),
      cmocka_unit_test(test_slow_host_landing),
      cmocka_unit_test(test_alloc_fails),
      cmocka_unit_test(test_cancel_during_alloc),
      cmocka_unit_test(test_conn_gone_during_alloc),
      cmocka_unit_test(test_message_before_ready),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
