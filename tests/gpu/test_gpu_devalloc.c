/*
 * A GET into device memory allocates that memory off the loop thread
 * (issue 6 of the devalloc round; hr_devrx.c, decision 73).
 *
 *  - A slow allocation (the simulated device's sim_alloc_delay_ns, or a
 *    wrapper's sleep on other backends) runs on a worker: another
 *    connection of the same loop gets its PING and GET answered while it
 *    is pending, the device GET's input waits (its record counts the
 *    pause) and the read timeout and keepalive, both far shorter than
 *    the allocation, do not cut the connection (decision 56).
 *  - Out of device memory (sim_max_device_alloc, or the wrapper) fails
 *    that GET only, with HR_ERR_LIMIT and RESOURCE_EXHAUSTED sent; the
 *    connection goes on.
 *  - A cancel, an aborted connection and an engine torn down while the
 *    allocation runs: what it allocated is freed exactly once (a wrapper
 *    around the backend's ops counts allocations and frees).
 *  - Over the SHM plane (the whole transfer arrives before the memory).
 *
 * Usage: test_gpu_devalloc [backend]  (default "sim"; 77 when unavailable).
 */
#include <pthread.h>
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

#define MiB (1ull << 20)

static int is_sim(void) {
  return strcmp(gt_backend, "sim") == 0;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A wrapper around the backend's ops: counts device allocations and
 * frees, notes whether one ran on the test's (the loop's) thread, and on
 * backends other than sim adds the delay and the failure itself. */
static const hr_gpu_ops *w_base;
static hr_gpu_ops w_ops;
static pthread_t w_loop_thread;
static _Atomic int w_on_loop; /* device allocations (streams) on the loop */
static _Atomic uint64_t w_allocs, w_frees; /* device memory */
static _Atomic uint64_t w_delay_ns, w_max;

static int w_alloc(void *dev, int kind, uint64_t size, hr_gpu_mem_info *out) {
  if (kind == HR_GPU_MEM_DEVICE && pthread_equal(pthread_self(), w_loop_thread))
    atomic_store(&w_on_loop, 1);
  if (!is_sim()) {
    if (atomic_load(&w_delay_ns))
      hr__test_sleep(atomic_load(&w_delay_ns));
    if (kind == HR_GPU_MEM_DEVICE && atomic_load(&w_max) &&
        size > atomic_load(&w_max))
      return HR_ERR_NOMEM;
  }
  int rv = w_base->mem_alloc(dev, kind, size, out);
  if (rv == 0 && kind == HR_GPU_MEM_DEVICE)
    atomic_fetch_add(&w_allocs, 1);
  return rv;
}

/* The session's staging stream is created by the allocation's work item
 * too; the test's own stream (fx_open) is made before w_watch_streams. */
static _Atomic int w_watch_streams;
static int w_stream_new(void *dev, void **out) {
  if (atomic_load(&w_watch_streams) &&
      pthread_equal(pthread_self(), w_loop_thread))
    atomic_store(&w_on_loop, 1);
  return w_base->stream_new(dev, out);
}

static void w_free(void *dev, const hr_gpu_mem_info *m) {
  if (m->kind == HR_GPU_MEM_DEVICE)
    atomic_fetch_add(&w_frees, 1);
  w_base->mem_free(dev, m);
}

typedef struct fx {
  tl_env *env;
  tl_server srv;
  hr_engine *ce;
  tc_conn a, b; /* two connections of one client engine, one loop */
  hr_gpu *g;
  hr_gpu_caps caps;
  hr_gpu_stream *C;
  uint8_t devs[2];
} fx;

/* Opens the device through the wrapper, every device or pinned
 * allocation taking `delay_ns` and device ones above `max` failing, and
 * a server and client engine on one loop; the client's read timeout and
 * keepalive are `timeout_ns` (0: defaults). */
static fx *fx_open(uint64_t delay_ns, uint64_t max, uint64_t timeout_ns) {
  fx *f = calloc(1, sizeof *f);
  assert_non_null(f);
  assert_int_equal(gt_open(&f->g, 0, 0), 0);
  w_base = hr_gpu_get_ops(f->g);
  w_ops = *w_base;
  w_ops.mem_alloc = w_alloc;
  w_ops.mem_free = w_free;
  w_ops.stream_new = w_stream_new;
  atomic_store(&w_watch_streams, 0);
  assert_int_equal(hr_gpu_del(f->g), 0);
  w_loop_thread = pthread_self();
  atomic_store(&w_on_loop, 0);
  atomic_store(&w_allocs, 0);
  atomic_store(&w_frees, 0);
  atomic_store(&w_delay_ns, delay_ns);
  atomic_store(&w_max, max);
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.ops = &w_ops;
  cfg.sim_alloc_delay_ns = delay_ns;
  cfg.sim_max_device_alloc = max;
  assert_int_equal(hr_gpu_open(&f->g, &cfg, NULL, NULL), 0);
  assert_int_equal(hr_gpu_query(f->g, &f->caps), 0);
  assert_int_equal(hr_gpu_stream_new(f->g, &f->C), 0);
  atomic_store(&w_watch_streams, 1);
  f->devs[0] = HR_DEV_CPU;
  f->devs[1] = f->caps.device_tag;
  f->env = tl_new(TL_EPOLL);
  hr_engine_config ec;
  hr_engine_config_default(&ec);
  ec.session.devices = f->devs;
  ec.session.device_count = 2;
  tl_server_start(f->env, &f->srv, &ec, NULL);
  if (timeout_ns) {
    ec.session.read_timeout = timeout_ns;
    ec.session.keepalive_interval = timeout_ns;
  }
  f->ce = tl_engine(f->env, &ec);
  tc_open(f->env, f->ce, f->srv.url, &f->a);
  tc_open(f->env, f->ce, f->srv.url, &f->b);
  return f;
}

static void fx_close_net(fx *f) {
  if (!f->env)
    return;
  if (!f->a.closed)
    tc_close(&f->a);
  if (!f->b.closed)
    tc_close(&f->b);
  tl_engine_finish(f->env, f->ce);
  tl_server_stop(f->env, &f->srv);
  tl_free(f->env);
  f->env = NULL;
}

static void fx_close(fx *f) {
  fx_close_net(f);
  hr_gpu_stream_del(f->C);
  assert_int_equal(hr_gpu_del(f->g), 0);
  /* Every device buffer the engine allocated was freed, once. */
  assert_int_equal(atomic_load(&w_allocs), atomic_load(&w_frees));
  free(f);
}

/* A host tensor of n bytes (pattern `seed`) on the server as `key`. */
static hr_tensor *serve(fx *f, const char *key, uint64_t n, unsigned seed) {
  uint64_t shape[1] = {n};
  hr_tensor *src = tl_dense(HR_ELEM_UINT8, 1, shape, seed);
  tl_put(&f->srv, key, src);
  return src;
}

static void device_opts(fx *f, hr_get_opts *o, const char *key) {
  tc_opts(o, key);
  o->device = f->g;
  o->device_sync = HR_SYNC_PRODUCER_SYNCED;
}

/* Whether device tensor t's buffer 0 equals want[0..n). */
static int device_equals(fx *f, hr_tensor *t, const uint8_t *want, uint64_t n) {
  hr_gpu_buf *out = NULL;
  assert_int_equal(hr_gpu_buf_alloc(f->g, HR_GPU_MEM_PINNED, n, &out), 0);
  memset(hr_gpu_buf_host_ptr(out), 0, n);
  assert_int_equal(
      hr_gpu_copy_async(f->C, out, 0, hr_tensor_gpu_buf(t, 0), 0, n), 0);
  assert_int_equal(hr_gpu_stream_sync(f->C), 0);
  int eq = memcmp(hr_gpu_buf_host_ptr(out), want, n) == 0;
  hr_gpu_buf_del(out);
  return eq;
}

/* Live device buffers (allocated, not yet freed). */
static uint64_t live(void) {
  return atomic_load(&w_allocs) - atomic_load(&w_frees);
}

typedef struct live_wait {
  uint64_t want, allocs;
} live_wait;

static int live_is(void *ud) {
  live_wait *lw = ud;
  return atomic_load(&w_allocs) >= lw->allocs && live() == lw->want;
}

/* Runs the loop until at least `allocs` device buffers were allocated so
 * far and `want` are live. */
static void wait_live(fx *f, uint64_t allocs, uint64_t want) {
  live_wait lw = {want, allocs};
  tl_run(f->env, live_is, &lw, 10000);
  assert_true(atomic_load(&w_allocs) >= allocs);
  assert_int_equal(live(), want);
}

/* The allocation takes 0.7 s on a worker (twice: the device memory, then
 * the ring's pinned piece); meanwhile the loop serves the other
 * connection, and the device GET's connection outlives a read timeout
 * and keepalive of 0.25 s because its input was paused. */
static void alloc_off_loop(void **state) {
  (void)state;
  const uint64_t delay = 700000000ull, n = 3 * MiB + 77;
  fx *f = fx_open(delay, 0, 250000000ull);
  hr_tensor *src = serve(f, "big", n, 5);
  hr_tensor *small = serve(f, "small", 4096, 6);
  hr_get_opts o;
  device_opts(f, &o, "big");
  tc_res g, p, h;
  uint64_t t0 = now_ns();
  assert_int_equal(tc_get_start(&f->a, &o, &g, NULL), 0);
  tl_spin(f->env, 100); /* the descriptor arrives, the allocation starts */
  assert_false(g.done);
  /* The same loop answers the other connection at once. */
  assert_int_equal(tc_ping(&f->b, &p), 0);
  assert_true(p.rtt < delay / 3);
  assert_int_equal(tc_get_key(&f->b, "small", &h), 0);
  assert_true(tl_same_elements(small, NULL, h.t));
  tc_res_clear(&h);
  assert_true(now_ns() - t0 < delay);
  assert_false(g.done);
  assert_true(tc_wait(&f->a, &g, 20000));
  if (g.status)
    printf("GET: %s, wire 0x%x: %s\n", hr_strerror(g.status), g.rec.wire_error,
           g.rec.message);
  assert_int_equal(g.status, 0);
  assert_true(now_ns() - t0 >= delay);
  assert_true(hr_tensor_on_device(g.t));
  assert_true(device_equals(f, g.t, hr_tensor_buffer(src, 0), n));
  /* Its input waited for the memory (time that counts against neither
   * timeout), and the allocation never ran on the loop's thread. */
  assert_true(g.rec.recv_pauses >= 1);
  assert_true(g.rec.recv_paused_ns > delay / 2);
  assert_false(atomic_load(&w_on_loop));
  tc_res_clear(&g);
  assert_false(f->a.closed);
  assert_int_equal(tc_ping(&f->a, &p), 0);
  hr_tensor_unref(src);
  hr_tensor_unref(small);
  fx_close(f);
}

/* Out of device memory: that GET fails (HR_ERR_LIMIT, RESOURCE_EXHAUSTED
 * sent to the server), the connection serves the next ones. */
static void alloc_fails(void **state) {
  (void)state;
  fx *f = fx_open(100000000ull, 1 * MiB, 0);
  hr_tensor *big = serve(f, "big", 2 * MiB, 7);
  hr_tensor *fits = serve(f, "fits", MiB / 2 + 3, 8);
  uint64_t base = live();
  hr_get_opts o;
  device_opts(f, &o, "big");
  tc_res r;
  assert_int_equal(tc_get(&f->a, &o, &r), HR_ERR_LIMIT);
  assert_int_equal(r.rec.wire_error, HR_WIRE_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(r.rec.message, "device memory"));
  assert_null(r.t);
  tc_res_clear(&r);
  assert_int_equal(live(), base);
  /* The same connection goes on: a device GET that fits, a host GET. */
  device_opts(f, &o, "fits");
  assert_int_equal(tc_get(&f->a, &o, &r), 0);
  assert_true(device_equals(f, r.t, hr_tensor_buffer(fits, 0), MiB / 2 + 3));
  tc_res_clear(&r);
  assert_int_equal(tc_get_key(&f->a, "big", &r), 0);
  assert_true(tl_same_elements(big, NULL, r.t));
  tc_res_clear(&r);
  assert_false(f->a.closed);
  hr_tensor_unref(big);
  hr_tensor_unref(fits);
  fx_close(f);
}

/* A cancel while the allocation runs: the GET ends at once; the memory,
 * when it comes, is freed (once), and the connection goes on. */
static void cancel_during_alloc(void **state) {
  (void)state;
  const uint64_t delay = 700000000ull, n = 2 * MiB;
  fx *f = fx_open(delay, 0, 0);
  hr_tensor *src = serve(f, "k", n, 9);
  uint64_t base = live(), allocs0 = atomic_load(&w_allocs);
  hr_get_opts o;
  device_opts(f, &o, "k");
  tc_res r;
  uint32_t sid;
  uint64_t t0 = now_ns();
  assert_int_equal(tc_get_start(&f->a, &o, &r, &sid), 0);
  tl_spin(f->env, 100);
  assert_false(r.done);
  assert_int_equal(hr_session_cancel(hr_conn_session(f->a.c), sid), 0);
  assert_int_equal(hr_engine_flush(f->ce), 0);
  assert_true(tc_wait(&f->a, &r, 5000));
  /* Ended without waiting for the memory (the stream's input was
   * dropped, not paused), which is still being allocated. */
  assert_true(now_ns() - t0 < delay);
  assert_int_equal(live(), base);
  assert_int_not_equal(r.status, 0);
  assert_null(r.t);
  tc_res_clear(&r);
  /* The allocation comes back and frees its buffer. */
  wait_live(f, allocs0 + 1, base);
  tc_res p;
  assert_int_equal(tc_ping(&f->a, &p), 0);
  assert_int_equal(tc_get(&f->a, &o, &r), 0);
  assert_true(device_equals(f, r.t, hr_tensor_buffer(src, 0), n));
  tc_res_clear(&r);
  hr_tensor_unref(src);
  fx_close(f);
}

/* The connection aborted, then the engine torn down, while allocations
 * run: each is freed when it comes back (the engine waits for its work). */
static void close_during_alloc(void **state) {
  (void)state;
  const uint64_t delay = 300000000ull, n = MiB;
  fx *f = fx_open(delay, 0, 0);
  hr_tensor *src = serve(f, "k", n, 10);
  uint64_t base = live(), allocs0 = atomic_load(&w_allocs);
  hr_get_opts o;
  device_opts(f, &o, "k");
  tc_res r, r2;
  assert_int_equal(tc_get_start(&f->a, &o, &r, NULL), 0);
  tl_spin(f->env, 100);
  assert_false(r.done);
  hr_conn_abort(f->a.c);
  assert_true(tc_wait(&f->a, &r, 5000));
  assert_int_not_equal(r.status, 0);
  tc_res_clear(&r);
  wait_live(f, allocs0 + 1, base);
  /* Teardown with an allocation out. */
  assert_int_equal(tc_get_start(&f->b, &o, &r2, NULL), 0);
  tl_spin(f->env, 100);
  assert_false(r2.done);
  fx_close_net(f);
  tc_res_clear(&r2);
  assert_true(atomic_load(&w_allocs) >= allocs0 + 2);
  assert_int_equal(live(), base);
  hr_tensor_unref(src);
  fx_close(f);
}

/* The SHM plane: the whole transfer (the mapped segment) is there before
 * the memory; the pieces go to the device once it is. */
static void shm_waits_for_alloc(void **state) {
  (void)state;
  const uint64_t n = 5 * MiB + 1;
  fx *f = fx_open(200000000ull, 0, 0);
  char dir[64] = "/tmp/hr_devalloc_XXXXXX", path[128], url[160];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/s.sock", dir);
  snprintf(url, sizeof url, "unix:%s", path);
  hr_provider prov;
  hr_store_provider(f->srv.store, &prov);
  assert_int_equal(hr_engine_listen(f->srv.e, url, &prov, NULL), 0);
  uint64_t shape[1] = {n};
  hr_tensor *src = tl_dense(HR_ELEM_UINT8, 1, shape, 11), *seg;
  assert_int_equal(hr_shm_tensor_copy(&seg, src, NULL), 0);
  tl_put(&f->srv, "shm", seg);
  hr_tensor_unref(seg);
  tc_conn c;
  tc_open(f->env, f->ce, url, &c);
  hr_get_opts o;
  device_opts(f, &o, "shm");
  tc_res r;
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_true(device_equals(f, r.t, hr_tensor_buffer(src, 0), n));
  assert_false(atomic_load(&w_on_loop));
  tc_res_clear(&r);
  tc_close(&c);
  hr_tensor_unref(src);
  fx_close(f);
  unlink(path);
  assert_int_equal(rmdir(dir), 0);
}

/* The simulated device's own knobs, on the calling thread. */
static void sim_alloc_knobs(void **state) {
  (void)state;
  if (!is_sim())
    skip();
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.sim_alloc_delay_ns = 50000000ull;
  cfg.sim_max_device_alloc = 4096;
  hr_gpu *g;
  assert_int_equal(hr_gpu_open(&g, &cfg, NULL, NULL), 0);
  hr_gpu_buf *b = NULL;
  uint64_t t0 = now_ns();
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, 4096, &b), 0);
  assert_true(now_ns() - t0 >= cfg.sim_alloc_delay_ns);
  hr_gpu_buf_del(b);
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, 4097, &b),
                   HR_ERR_NOMEM);
  /* The limit is on device memory; pinned memory is host memory. */
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_PINNED, 8192, &b), 0);
  hr_gpu_buf_del(b);
  assert_int_equal(hr_gpu_del(g), 0);
}

int main(int argc, char **argv) {
  int rv = gt_main_prologue(argc, argv);
  if (rv != 0)
    return rv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sim_alloc_knobs),
      cmocka_unit_test(alloc_off_loop),
      cmocka_unit_test(alloc_fails),
      cmocka_unit_test(cancel_during_alloc),
      cmocka_unit_test(close_during_alloc),
      cmocka_unit_test(shm_waits_for_alloc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
