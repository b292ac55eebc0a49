/*
 * A client PUT of a tensor in device memory (issues 6 and 8), over
 * loopback, checked against the bytes the server stored.
 *
 *  - P2: the producer still writes (a gated kernel, then its event) when
 *    the PUT starts; the staging copies wait for the event on the device
 *    and the server stores exactly the new bytes.  P1: a producer that
 *    synced first, no event.
 *  - A wrong producer (the event left out while it still writes) is shown
 *    to deliver the old bytes: the ordering is what makes P2 right.
 *  - Failures end that PUT only, with one callback and one release of the
 *    tensor, never before its copies finished: pinned staging memory
 *    refused, the producer's event failing, a cancel while the copies
 *    wait for the producer, the connection lost meanwhile.  The same
 *    connection then PUTs again.
 *  - No callback inside hr_session_put(): a first chunk failing there
 *    calls back on the loop's next turn; hr_client_put() returns that
 *    error at once, not after its timeout (decision 78).
 *
 * Usage: test_gpu_put [backend]  (default "sim"; 77 when unavailable).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include <hurray/client.h>
#include <hurray/store.h>
#include <hurray/tensor.h>

#include "common/test_util.h"
#include "gpu_testutil.h"
#include "tc.h"

/* The producer's "kernel": long enough that the PUT's staging is queued
 * before it ends, even on a loaded machine under ThreadSanitizer. */
#define GATE_NS 600000000ull
#define CHUNK (256u * 1024u)

/* Fault injection through a wrapper around the backend's ops. */
static const hr_gpu_ops *base;
static hr_gpu_ops wrap;
static _Atomic int fail_pinned, fail_wait;

static int w_alloc(void *dev, int kind, uint64_t size, hr_gpu_mem_info *out) {
  if (kind == HR_GPU_MEM_PINNED && atomic_load(&fail_pinned))
    return HR_ERR_NOMEM;
  return base->mem_alloc(dev, kind, size, out);
}

static int w_wait(void *dev, void *s, void *e) {
  if (atomic_load(&fail_wait))
    return HR_ERR_IO;
  return base->stream_wait_event(dev, s, e);
}

typedef struct fx {
  tl_env *env;
  tl_server srv;
  tc_conn cli;
  hr_gpu *g;
  hr_gpu_caps caps;
  hr_gpu_stream *P;
  uint8_t devs[2];
} fx;

static fx *fx_open(void) {
  fx *f = calloc(1, sizeof *f);
  assert_non_null(f);
  atomic_store(&fail_pinned, 0);
  atomic_store(&fail_wait, 0);
  assert_int_equal(gt_open(&f->g, 0, 0), 0);
  base = hr_gpu_get_ops(f->g);
  wrap = *base;
  wrap.mem_alloc = w_alloc;
  wrap.stream_wait_event = w_wait;
  assert_int_equal(hr_gpu_del(f->g), 0);
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.ops = &wrap;
  assert_int_equal(hr_gpu_open(&f->g, &cfg, NULL, NULL), 0);
  assert_int_equal(hr_gpu_query(f->g, &f->caps), 0);
  assert_int_equal(hr_gpu_stream_new(f->g, &f->P), 0);
  f->devs[0] = HR_DEV_CPU;
  f->devs[1] = f->caps.device_tag;
  f->env = tl_new(TL_EPOLL);
  hr_engine_config ec;
  hr_engine_config_default(&ec);
  ec.session.devices = f->devs;
  ec.session.device_count = 2;
  ec.session.transcode_chunk = CHUNK;
  tl_server_start(f->env, &f->srv, &ec, NULL);
  hr_engine *ce = tl_engine(f->env, &ec);
  tc_open(f->env, ce, f->srv.url, &f->cli);
  return f;
}

static void fx_close(fx *f) {
  if (f->env) {
    hr_engine *ce = f->cli.e;
    if (!f->cli.closed)
      tc_close(&f->cli);
    tl_engine_finish(f->env, ce);
    tl_server_stop(f->env, &f->srv);
    tl_free(f->env);
  }
  hr_gpu_stream_del(f->P);
  assert_int_equal(hr_gpu_del(f->g), 0);
  free(f);
}

/* The application's tensor: device memory a producer writes, its event,
 * and what its release callback saw. */
typedef struct src {
  tu_produced p; /* OLD, then NEW after the gate; the end in p.ev */
  _Atomic int released;
  _Atomic int released_early; /* released before the producer's event */
} src;

static void src_release(void *ctx) {
  src *sv = ctx;
  /* The engine's copies wait for the event: a release before it means a
   * copy could still read the buffer. */
  if (sv->p.ev && hr_gpu_event_query(sv->p.ev) != 0)
    atomic_fetch_add(&sv->released_early, 1);
  atomic_fetch_add(&sv->released, 1);
}

/* Sets the device buffer to OLD, then starts a slow producer writing NEW
 * on P (a gate, then the copy) and records its end in sv->p.ev. */
static void produce(fx *f, src *sv, uint64_t n) {
  tu_produce(f->g, f->P, n, GATE_NS, &sv->p);
}

static void src_free(fx *f, src *sv) {
  tu_produced_free(f->P, &sv->p);
}

/* The tensor handed to the PUT: its descriptor names the device (as a
 * GET into the device or a DLPack import would). */
static hr_tensor *wrap_src(fx *f, src *sv, uint64_t n, int with_event) {
  hr_descriptor d = tu_bytes_desc(n, 0, f->caps.device_tag);
  hr_tensor *t;
  assert_int_equal(hr_tensor_wrap_device(&t, &d, &sv->p.dev,
                                         with_event ? sv->p.ev : NULL,
                                         src_release, sv, NULL),
                   0);
  assert_true(hr_tensor_on_device(t));
  return t;
}

/* Set while hr_session_put() runs: no PUT callback may come then
 * (decision 78). */
static int in_put;

/* A PUT's completion, and what held when it came. */
typedef struct put_res {
  int inside;          /* a callback ran inside hr_session_put() */
  int calls_at_return; /* callbacks when hr_session_put() returned */
  int calls;
  int status;
  int event_done; /* the producer's event had completed */
  int released;   /* the tensor's release had run */
  src *sv;
  char msg[256];
} put_res;

static void on_put(hr_session *s, uint32_t sid, const hr_transfer_record *rec,
                   void *ud) {
  put_res *r = ud;
  (void)s;
  (void)sid;
  r->inside |= in_put;
  r->calls++;
  r->status = rec ? rec->status : HR_ERR_CLOSED;
  if (rec)
    snprintf(r->msg, sizeof r->msg, "%s", rec->message);
  r->event_done = !r->sv->p.ev || hr_gpu_event_query(r->sv->p.ev) == 0;
  r->released = atomic_load(&r->sv->released);
}

static int put_done(void *ud) {
  return ((put_res *)ud)->calls > 0;
}

static int put_start(fx *f, const char *key, hr_tensor *t, put_res *r,
                     uint32_t *sid) {
  in_put = 1;
  int rv = hr_session_put(hr_conn_session(f->cli.c), (const uint8_t *)key,
                          (uint16_t)strlen(key), 0, t, on_put, r, sid);
  in_put = 0;
  r->calls_at_return = r->calls;
  if (rv == 0)
    assert_int_equal(hr_engine_flush(f->cli.e), 0);
  return rv;
}

static void put_wait(fx *f, put_res *r) {
  assert_true(tl_run(f->env, put_done, r, 30000));
  assert_int_equal(r->inside, 0);
  /* Exactly once: nothing more comes. */
  tl_spin(f->env, 20);
  assert_int_equal(r->calls, 1);
}

/* 1 when the server stored `key` with exactly want[0..n). */
static int stored_equals(fx *f, const char *key, const uint8_t *want,
                         uint64_t n) {
  hr_tensor *t = NULL;
  if (hr_store_get(f->srv.store, key, strlen(key), &t))
    return 0;
  const hr_descriptor *d = hr_tensor_descriptor(t);
  /* The PUT declared host memory as its destination (decision 75). */
  assert_int_equal(d->buffers[0].device_tag, HR_DEV_CPU);
  int eq =
      hr_tensor_bytes(t) == n && memcmp(hr_tensor_buffer(t, 0), want, n) == 0;
  hr_tensor_unref(t);
  return eq;
}

static int stored(fx *f, const char *key) {
  hr_tensor *t = NULL;
  int rv = hr_store_get(f->srv.store, key, strlen(key), &t);
  hr_tensor_unref(t);
  return rv == 0;
}

/* The connection still works: a host PUT goes through. */
static void still_works(fx *f) {
  uint64_t shape[1] = {1000};
  hr_tensor *h = tl_dense(HR_ELEM_UINT8, 1, shape, 3);
  tc_res r;
  assert_int_equal(tc_put(&f->cli, "after", HR_PUT_REPLACE, h, &r), 0);
  tc_res_clear(&r);
  hr_tensor_unref(h);
}

/* P2: the copies wait for the producer's event on the device. */
static void put_p2(void **state) {
  (void)state;
  fx *f = fx_open();
  uint64_t n = 5 * CHUNK + 12345; /* several chunks, a ragged last one */
  src sv = {0};
  produce(f, &sv, n);
  hr_tensor *t = wrap_src(f, &sv, n, 1);
  put_res r = {.sv = &sv};
  assert_int_equal(put_start(f, "p2", t, &r, NULL), 0);
  hr_tensor_unref(t);
  /* The producer is still inside its gate. */
  if (strcmp(gt_backend, "sim") == 0)
    assert_int_equal(hr_gpu_event_query(sv.p.ev), HR_ERR_WOULDBLOCK);
  put_wait(f, &r);
  if (r.status)
    printf("PUT: %s: %s\n", hr_strerror(r.status), r.msg);
  assert_int_equal(r.status, 0);
  assert_true(stored_equals(f, "p2", hr_gpu_buf_host_ptr(sv.p.newb), n));
  assert_int_equal(atomic_load(&sv.released), 1);
  assert_int_equal(atomic_load(&sv.released_early), 0);
  src_free(f, &sv);
  fx_close(f);
}

/* P1: a producer that synced before the PUT hands no event. */
static void put_p1(void **state) {
  (void)state;
  fx *f = fx_open();
  uint64_t n = 3 * CHUNK + 1;
  src sv = {0};
  produce(f, &sv, n);
  assert_int_equal(hr_gpu_stream_sync(f->P), 0);
  hr_tensor *t = wrap_src(f, &sv, n, 0);
  put_res r = {.sv = &sv};
  assert_int_equal(put_start(f, "p1", t, &r, NULL), 0);
  hr_tensor_unref(t);
  put_wait(f, &r);
  assert_int_equal(r.status, 0);
  assert_true(stored_equals(f, "p1", hr_gpu_buf_host_ptr(sv.p.newb), n));
  assert_int_equal(atomic_load(&sv.released), 1);
  src_free(f, &sv);
  fx_close(f);
}

/* The wrong producer: its event left out while it still writes.  The
 * copies run at once and the server stores the old bytes, which
 * put_p2's check would catch. */
static void put_stale(void **state) {
  (void)state;
  fx *f = fx_open();
  uint64_t n = 2 * CHUNK;
  src sv = {0};
  produce(f, &sv, n);
  hr_tensor *t = wrap_src(f, &sv, n, 0);
  put_res r = {.sv = &sv};
  assert_int_equal(put_start(f, "stale", t, &r, NULL), 0);
  hr_tensor_unref(t);
  put_wait(f, &r);
  assert_int_equal(r.status, 0);
  assert_false(stored_equals(f, "stale", hr_gpu_buf_host_ptr(sv.p.newb), n));
  assert_true(stored_equals(f, "stale", hr_gpu_buf_host_ptr(sv.p.oldb), n));
  src_free(f, &sv);
  fx_close(f);
}

/* Ends one failing PUT and checks the rules common to every failure. */
static void check_failed(fx *f, src *sv, put_res *r, const char *key,
                         int status) {
  put_wait(f, r);
  if (r->status != status)
    printf("PUT: %s: %s\n", hr_strerror(r->status), r->msg);
  assert_int_equal(r->status, status);
  /* Its callback came after the copies, which came after the event. */
  assert_true(r->event_done);
  assert_false(stored(f, key));
  /* The engine's last reference goes with the last copy. */
  assert_int_equal(atomic_load(&sv->released), 1);
  assert_int_equal(atomic_load(&sv->released_early), 0);
}

static void put_no_pinned(void **state) {
  (void)state;
  fx *f = fx_open();
  uint64_t n = 3 * CHUNK;
  src sv = {0};
  produce(f, &sv, n);
  hr_tensor *t = wrap_src(f, &sv, n, 1);
  put_res r = {.sv = &sv};
  atomic_store(&fail_pinned, 1);
  assert_int_equal(put_start(f, "nopin", t, &r, NULL), 0);
  hr_tensor_unref(t);
  /* The first chunk failed inside hr_session_put(): the callback comes
   * after it returned, at the loop's next turn, not with a timeout (the
   * session's shortest is 10 s). */
  assert_int_equal(r.calls_at_return, 0);
  assert_true(tl_run(f->env, put_done, &r, 5000));
  put_wait(f, &r);
  assert_int_equal(r.status, HR_ERR_NOMEM);
  /* Nothing was enqueued: nothing to wait for. */
  assert_int_equal(atomic_load(&sv.released), 1);
  assert_false(stored(f, "nopin"));
  atomic_store(&fail_pinned, 0);
  still_works(f);
  src_free(f, &sv);
  fx_close(f);
}

static void put_event_fails(void **state) {
  (void)state;
  fx *f = fx_open();
  uint64_t n = 3 * CHUNK;
  src sv = {0};
  produce(f, &sv, n);
  assert_int_equal(hr_gpu_stream_sync(f->P), 0);
  hr_tensor *t = wrap_src(f, &sv, n, 1);
  put_res r = {.sv = &sv};
  atomic_store(&fail_wait, 1);
  assert_int_equal(put_start(f, "noev", t, &r, NULL), 0);
  hr_tensor_unref(t);
  check_failed(f, &sv, &r, "noev", HR_ERR_IO);
  atomic_store(&fail_wait, 0);
  still_works(f);
  src_free(f, &sv);
  fx_close(f);
}

static void put_cancel_staging(void **state) {
  (void)state;
  fx *f = fx_open();
  uint64_t n = 4 * CHUNK;
  src sv = {0};
  produce(f, &sv, n);
  hr_tensor *t = wrap_src(f, &sv, n, 1);
  put_res r = {.sv = &sv};
  uint32_t sid = 0;
  assert_int_equal(put_start(f, "cancel", t, &r, &sid), 0);
  hr_tensor_unref(t);
  assert_int_equal(hr_session_cancel(hr_conn_session(f->cli.c), sid), 0);
  assert_int_equal(hr_engine_flush(f->cli.e), 0);
  /* The server's answer to CANCEL ends it (ERROR CANCELLED). */
  check_failed(f, &sv, &r, "cancel", HR_ERR_REMOTE);
  still_works(f);
  src_free(f, &sv);
  fx_close(f);
}

static int cli_closed(void *ud) {
  return ((tc_conn *)ud)->closed;
}

static void put_conn_lost(void **state) {
  (void)state;
  fx *f = fx_open();
  uint64_t n = 4 * CHUNK;
  src sv = {0};
  produce(f, &sv, n);
  hr_tensor *t = wrap_src(f, &sv, n, 1);
  put_res r = {.sv = &sv};
  assert_int_equal(put_start(f, "lost", t, &r, NULL), 0);
  hr_tensor_unref(t);
  /* The connection is cut while the copies wait for the producer. */
  hr_conn_abort(f->cli.c);
  assert_true(tl_run(f->env, put_done, &r, 30000));
  assert_true(tl_run(f->env, cli_closed, &f->cli, 30000));
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, HR_ERR_CLOSED);
  /* The engine still holds the tensor until its copies are done. */
  hr_engine *ce = f->cli.e;
  assert_int_equal(hr_gpu_event_sync(sv.p.ev), 0);
  for (int i = 0; i < 3000 && atomic_load(&sv.released) == 0; i++)
    tl_spin(f->env, 10);
  assert_int_equal(atomic_load(&sv.released), 1);
  assert_int_equal(atomic_load(&sv.released_early), 0);
  assert_int_equal(r.calls, 1);
  assert_false(stored(f, "lost"));
  tl_engine_finish(f->env, ce);
  tl_server_stop(f->env, &f->srv);
  tl_free(f->env);
  f->env = NULL;
  src_free(f, &sv);
  fx_close(f);
}

/* The blocking client, on a thread of its own (the server runs on the
 * test's loop). */
typedef struct cput {
  const char *url;
  hr_tensor *t;
  int rv;
  uint64_t ms; /* how long hr_client_put() took */
  atomic_int done;
} cput;

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *cput_main(void *arg) {
  cput *c = arg;
  hr_client *cl = NULL;
  hr_client_options o;
  hr_client_options_default(&o); /* its timeout: 30 s */
  c->rv = hr_client_connect(&cl, c->url, &o, NULL, NULL);
  if (c->rv == 0) {
    uint64_t t0 = mono_ms();
    hr_transfer_record rec;
    c->rv = hr_client_put(cl, (const uint8_t *)"blocking", 8, 0, c->t, &rec);
    c->ms = mono_ms() - t0;
    hr_client_close(cl);
  }
  atomic_store(&c->done, 1);
  return NULL;
}

static int cput_done(void *ud) {
  return atomic_load(&((cput *)ud)->done);
}

/* hr_client_put() of a device tensor whose first chunk fails inside
 * hr_session_put(): the error comes back at once (the callback is due at
 * the next turn of the client's loop), not after a timeout. */
static void client_put_fails_at_once(void **state) {
  (void)state;
  fx *f = fx_open();
  uint64_t n = 3 * CHUNK;
  src sv = {0};
  produce(f, &sv, n);
  hr_tensor *t = wrap_src(f, &sv, n, 1);
  atomic_store(&fail_pinned, 1);
  cput c = {.url = f->srv.url, .t = t};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, cput_main, &c), 0);
  assert_true(tl_run(f->env, cput_done, &c, 25000));
  pthread_join(th, NULL);
  atomic_store(&fail_pinned, 0);
  assert_int_equal(c.rv, HR_ERR_NOMEM);
  assert_true(c.ms < 5000);
  assert_false(stored(f, "blocking"));
  hr_tensor_unref(t);
  assert_int_equal(atomic_load(&sv.released), 1);
  src_free(f, &sv);
  fx_close(f);
}

/* A descriptor that names a device over host memory cannot be read. */
static void put_refused(void **state) {
  (void)state;
  fx *f = fx_open();
  hr_descriptor d = tu_bytes_desc(64, 0, f->caps.device_tag);
  static uint8_t bytes[64];
  hr_tensor *t;
  assert_int_equal(
      hr_tensor_wrap(&t, &d, (void *const[]){bytes}, NULL, NULL, NULL), 0);
  put_res r = {0};
  assert_int_equal(put_start(f, "bad", t, &r, NULL), HR_ERR_UNSUPPORTED);
  hr_tensor_unref(t);
  fx_close(f);
}

int main(int argc, char **argv) {
  int rv = gt_main_prologue(argc, argv);
  if (rv != 0)
    return rv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(put_p2),
      cmocka_unit_test(put_p1),
      cmocka_unit_test(put_stale),
      cmocka_unit_test(put_no_pinned),
      cmocka_unit_test(put_event_fails),
      cmocka_unit_test(put_cancel_staging),
      cmocka_unit_test(put_conn_lost),
      cmocka_unit_test(put_refused),
      cmocka_unit_test(client_put_fails_at_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
