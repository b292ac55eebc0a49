/*
 * The device interface on one backend: memory kinds, copies in every
 * direction, streams, events, host functions, fd notification, vendor
 * handle wrapping, the staging pipeline, and argument checks.  Also
 * probes every backend the project knows, which must answer cleanly
 * whether or not its driver is installed.
 *
 * Usage: test_gpu_api [backend]   (default "sim"; exit 77 when the
 * backend is unavailable here).
 */
#include <stddef.h>
#include <sys/eventfd.h>
#include <unistd.h>

#ifdef HR_NO_CMOCKA
#include "gt_nocmocka.h"
#else
#include <setjmp.h>
#include <stdarg.h>

#include <cmocka.h>
#endif

#include <hurray/gpu.h>
#include <hurray/wire.h>

#include "gpu_testutil.h"

#define N (1u << 20)

static void test_probe_every_backend(void **state) {
  (void)state;
  static const char *const names[] = {"cpu", "sim", "cuda",
                                      "hip", "ze",  "vulkan"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    hr_gpu_probe_info info;
    int rv = hr_gpu_probe(names[i], &info);
    printf("probe %-6s built=%d rv=%d devices=%u %s\n", names[i],
           hr_gpu_backend_built(names[i]), rv, info.device_count,
           info.reason);
    if (rv == 0) {
      assert_true(info.available);
      assert_true(info.device_count >= 1);
    } else {
      assert_int_equal(rv, HR_ERR_UNSUPPORTED);
      assert_false(info.available);
      assert_true(info.reason[0] != '\0');
    }
  }
  hr_gpu_probe_info info;
  assert_int_equal(hr_gpu_probe("nonesuch", &info), HR_ERR_NOT_FOUND);
  assert_int_equal(hr_gpu_probe(NULL, &info), HR_ERR_INVALID_ARGUMENT);
  assert_true(hr_gpu_backend_count() >= 2);
  assert_string_equal(hr_gpu_backend_name(0), "cpu");
  assert_string_equal(hr_gpu_backend_name(1), "sim");
  assert_null(hr_gpu_backend_name(hr_gpu_backend_count()));
  hr_gpu *g;
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.backend = "sim";
  cfg.ordinal = 7;
  assert_int_equal(hr_gpu_open(&g, &cfg, NULL, &info), HR_ERR_UNSUPPORTED);
  assert_true(info.reason[0] != '\0');
}

/* A host buffer: pinned where the device has it, else wrapped malloc. */
typedef struct hbuf {
  hr_gpu_buf *b;
  void *mem;
} hbuf;

static void hbuf_new(hr_gpu *g, hbuf *h, size_t n) {
  hr_gpu_caps caps;
  hr_gpu_query(g, &caps);
  h->mem = NULL;
  if (caps.flags & HR_GPU_CAP_PINNED) {
    assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_PINNED, n, &h->b), 0);
  } else {
    h->mem = malloc(n);
    assert_int_equal(hr_gpu_buf_wrap_host(g, h->mem, n, &h->b), 0);
  }
  assert_non_null(hr_gpu_buf_host_ptr(h->b));
}

static void hbuf_del(hbuf *h) {
  hr_gpu_buf_del(h->b);
  free(h->mem);
}

static void test_copies(void **state) {
  (void)state;
  hr_gpu *g;
  assert_int_equal(gt_open(&g, 0, 0), 0);
  hr_gpu_caps caps;
  assert_int_equal(hr_gpu_query(g, &caps), 0);
  assert_string_equal(caps.backend, gt_backend);
  hr_gpu_stream *s;
  assert_int_equal(hr_gpu_stream_new(g, &s), 0);
  assert_ptr_equal(hr_gpu_stream_device(s), g);
  hr_gpu_buf *d1, *d2;
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, N, &d1), 0);
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, N, &d2), 0);
  assert_int_equal(hr_gpu_buf_size(d1), N);
  assert_int_equal(hr_gpu_buf_kind(d1), HR_GPU_MEM_DEVICE);
  hbuf src, dst;
  hbuf_new(g, &src, N);
  hbuf_new(g, &dst, N);
  gt_fill(hr_gpu_buf_host_ptr(src.b), N, 7);
  /* Plain pageable memory takes part too. */
  uint8_t *page = malloc(N);
  hr_gpu_buf *pb;
  assert_int_equal(hr_gpu_buf_wrap_host(g, page, N, &pb), 0);
  assert_int_equal(hr_gpu_buf_kind(pb), HR_GPU_MEM_HOST);
  assert_ptr_equal(hr_gpu_buf_host_ptr(pb), page);
  /* H2D, D2D at an offset, D2H, D2H to pageable. */
  assert_int_equal(hr_gpu_copy_async(s, d1, 0, src.b, 0, N), 0);
  assert_int_equal(hr_gpu_copy_async(s, d2, 4096, d1, 0, N - 4096), 0);
  assert_int_equal(hr_gpu_copy_async(s, d2, 0, d1, N - 4096, 4096), 0);
  assert_int_equal(hr_gpu_copy_async(s, dst.b, 0, d2, 0, N), 0);
  assert_int_equal(hr_gpu_copy_async(s, pb, 0, d1, 0, N), 0);
  assert_int_equal(hr_gpu_stream_sync(s), 0);
  const uint8_t *in = hr_gpu_buf_host_ptr(src.b);
  const uint8_t *out = hr_gpu_buf_host_ptr(dst.b);
  assert_memory_equal(out + 4096, in, N - 4096);
  assert_memory_equal(out, in + N - 4096, 4096);
  assert_memory_equal(page, in, N);
  /* Pageable to device, host to host. */
  gt_fill(page, N, 9);
  assert_int_equal(hr_gpu_copy_async(s, d1, 0, pb, 0, N), 0);
  assert_int_equal(hr_gpu_copy_async(s, dst.b, 0, d1, 0, N), 0);
  assert_int_equal(hr_gpu_copy_async(s, src.b, 0, pb, 0, N), 0);
  assert_int_equal(hr_gpu_stream_sync(s), 0);
  assert_memory_equal(out, page, N);
  assert_memory_equal(in, page, N);
  /* Range checks. */
  assert_int_equal(hr_gpu_copy_async(s, d1, 1, d2, 0, N),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_gpu_copy_async(s, d1, 0, d2, UINT64_MAX, 2),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_gpu_copy_async(s, d1, 0, d2, 0, 0), 0);
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, 0, &d1),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_gpu_buf_alloc(g, 9, 16, &d1), HR_ERR_INVALID_ARGUMENT);
  /* Unified memory where the device has it. */
  hr_gpu_buf *u;
  int rv = hr_gpu_buf_alloc(g, HR_GPU_MEM_UNIFIED, 4096, &u);
  if (caps.flags & HR_GPU_CAP_UNIFIED) {
    assert_int_equal(rv, 0);
    hr_gpu_buf_del(u);
  } else {
    assert_int_equal(rv, HR_ERR_UNSUPPORTED);
  }
  /* The device refuses to close while objects live. */
  assert_int_equal(hr_gpu_del(g), HR_ERR_BUSY);
  hr_gpu_buf_del(pb);
  free(page);
  hbuf_del(&src);
  hbuf_del(&dst);
  hr_gpu_buf_del(d1);
  hr_gpu_buf_del(d2);
  hr_gpu_stream_del(s);
  assert_int_equal(hr_gpu_del(g), 0);
}

typedef struct order_log {
  int seq[8];
  int n;
} order_log;

typedef struct step {
  order_log *log;
  int id;
} step;

static void log_step(void *arg) {
  step *st = arg;
  st->log->seq[st->log->n++] = st->id;
}

static void slow_step(void *arg) {
  hr__test_sleep(50000000);
  log_step(arg);
}

static void test_events_and_host_fns(void **state) {
  (void)state;
  hr_gpu *g;
  assert_int_equal(gt_open(&g, 0, 0), 0);
  hr_gpu_caps caps;
  hr_gpu_query(g, &caps);
  hr_gpu_stream *a, *b;
  assert_int_equal(hr_gpu_stream_new(g, &a), 0);
  assert_int_equal(hr_gpu_stream_new(g, &b), 0);
  hr_gpu_event *e;
  assert_int_equal(hr_gpu_event_new(g, 0, &e), 0);
  /* Never recorded: complete, and waiting on it is a no-op. */
  assert_int_equal(hr_gpu_event_query(e), 0);
  assert_int_equal(hr_gpu_event_sync(e), 0);
  assert_int_equal(hr_gpu_stream_wait_event(b, e), 0);
  /* Stream b's step 2 must come after stream a's slow step 1. */
  order_log log = {{0}, 0};
  step s1 = {&log, 1}, s2 = {&log, 2};
  assert_int_equal(hr_gpu_launch_host_fn(a, slow_step, &s1), 0);
  assert_int_equal(hr_gpu_event_record(e, a), 0);
  if (caps.flags & HR_GPU_CAP_ASYNC)
    assert_int_equal(hr_gpu_event_query(e), HR_ERR_WOULDBLOCK);
  assert_int_equal(hr_gpu_stream_wait_event(b, e), 0);
  assert_int_equal(hr_gpu_launch_host_fn(b, log_step, &s2), 0);
  assert_int_equal(hr_gpu_stream_sync(b), 0);
  assert_int_equal(log.n, 2);
  assert_int_equal(log.seq[0], 1);
  assert_int_equal(log.seq[1], 2);
  assert_int_equal(hr_gpu_event_query(e), 0);
  /* Notification through an eventfd. */
  int efd = eventfd(0, EFD_CLOEXEC);
  assert_true(efd >= 0);
  assert_int_equal(hr_gpu_launch_host_fn(a, slow_step, &s1), 0);
  assert_int_equal(hr_gpu_stream_notify_fd(a, efd), 0);
  uint64_t v = 0;
  assert_int_equal(read(efd, &v, sizeof v), (ssize_t)sizeof v);
  assert_int_equal(v, 1);
  assert_int_equal(log.n, 3); /* the slow step ran before the wakeup */
  close(efd);
  assert_int_equal(hr_gpu_stream_notify_fd(a, -1), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_gpu_launch_host_fn(a, NULL, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  /* Vendor handles round-trip through non-owning wrappers. */
  void *na = hr_gpu_stream_native(a);
  assert_non_null(na);
  hr_gpu_stream *wa;
  assert_int_equal(hr_gpu_stream_wrap(g, na, &wa), 0);
  hr_gpu_event *we;
  assert_int_equal(hr_gpu_event_wrap(g, hr_gpu_event_native(e), &we), 0);
  assert_int_equal(hr_gpu_launch_host_fn(wa, slow_step, &s1), 0);
  assert_int_equal(hr_gpu_event_record(we, wa), 0);
  assert_int_equal(hr_gpu_event_sync(e), 0); /* the original saw it */
  assert_int_equal(log.n, 4);
  hr_gpu_event_del(we);
  hr_gpu_stream_del(wa);
  assert_int_equal(hr_gpu_event_query(e), 0);
  /* IPC only where advertised. */
  hr_gpu_event *ie;
  int rv = hr_gpu_event_new(g, HR_GPU_EVENT_IPC, &ie);
  if (caps.flags & HR_GPU_CAP_IPC_EVENT)
    hr_gpu_event_del(ie);
  else
    assert_int_equal(rv, HR_ERR_UNSUPPORTED);
  hr_gpu_ipc_handle ih;
  assert_int_equal(hr_gpu_ipc_event_export(e, &ih), HR_ERR_UNSUPPORTED);
  if (!(caps.flags & HR_GPU_CAP_IPC_MEM))
    assert_int_equal(hr_gpu_ipc_mem_import(g, &ih, 64, &(hr_gpu_buf *){0}),
                     HR_ERR_UNSUPPORTED);
  hr_gpu_event_del(e);
  hr_gpu_stream_del(a);
  hr_gpu_stream_del(b);
  assert_int_equal(hr_gpu_del(g), 0);
}

typedef struct sink_state {
  uint8_t *dst;
  uint64_t next;
  int chunks;
} sink_state;

static int sink(void *user, uint64_t off, const void *data, size_t len) {
  sink_state *s = user;
  assert_int_equal(off, s->next); /* in order */
  memcpy(s->dst + off, data, len);
  s->next += len;
  s->chunks++;
  return 0;
}

static int source(void *user, uint64_t off, void *data, size_t len) {
  const uint8_t *src = user;
  memcpy(data, src + off, len);
  return 0;
}

static int failing_sink(void *user, uint64_t off, const void *data,
                        size_t len) {
  (void)user;
  (void)data;
  (void)len;
  return off > 0 ? -42 : 0;
}

static void test_stager(void **state) {
  (void)state;
  hr_gpu *g;
  assert_int_equal(gt_open(&g, 0, 0), 0);
  const uint64_t len = 3 * 65536 + 123;
  uint8_t *in = malloc(len), *out = calloc(1, len);
  gt_fill(in, len, 3);
  hr_gpu_buf *d;
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, len + 10, &d), 0);
  hr_gpu_stager *st;
  assert_int_equal(hr_gpu_stager_new(&st, g, 1000, 4, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_gpu_stager_new(&st, g, 65536, 3, NULL), 0);
  assert_int_equal(hr_gpu_stager_h2d(st, d, 10, len, source, in), 0);
  sink_state ss = {out, 0, 0};
  assert_int_equal(hr_gpu_stager_d2h(st, d, 10, len, sink, &ss), 0);
  assert_int_equal(ss.next, len);
  assert_int_equal(ss.chunks, 4);
  assert_memory_equal(in, out, len);
  assert_int_equal(hr_gpu_stager_d2h(st, d, 10, len, failing_sink, NULL), -42);
  assert_int_equal(hr_gpu_stager_d2h(st, d, 11, len, sink, &ss),
                   HR_ERR_INVALID_ARGUMENT);
  hr_gpu_stager_del(st);
  hr_gpu_buf_del(d);
  free(in);
  free(out);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* The simulated device's knobs: a per-operation delay and paced copies
 * keep work visibly in flight. */
static void test_sim_delays(void **state) {
  (void)state;
  if (strcmp(gt_backend, "sim") != 0) {
    print_message("sim only\n");
    return;
  }
  hr_gpu *g;
  assert_int_equal(gt_open(&g, 100000000, 1u << 20), 0); /* 100 ms, 1 MB/s */
  hr_gpu_stream *s;
  assert_int_equal(hr_gpu_stream_new(g, &s), 0);
  hr_gpu_buf *a, *b;
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, 65536, &a), 0);
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_PINNED, 65536, &b), 0);
  memset(hr_gpu_buf_host_ptr(b), 0x5a, 65536);
  hr_gpu_event *e;
  assert_int_equal(hr_gpu_event_new(g, 0, &e), 0);
  struct timespec ts0, ts1;
  clock_gettime(CLOCK_MONOTONIC, &ts0);
  assert_int_equal(hr_gpu_copy_async(s, a, 0, b, 0, 65536), 0);
  assert_int_equal(hr_gpu_event_record(e, s), 0);
  assert_int_equal(hr_gpu_event_query(e), HR_ERR_WOULDBLOCK);
  assert_int_equal(hr_gpu_event_sync(e), 0);
  clock_gettime(CLOCK_MONOTONIC, &ts1);
  double ms = (double)(ts1.tv_sec - ts0.tv_sec) * 1e3 +
              (double)(ts1.tv_nsec - ts0.tv_nsec) / 1e6;
  /* 100 ms of delay plus 64 KiB at 1 MiB/s (about 60 ms). */
  assert_true(ms >= 150.0);
  assert_memory_equal(hr_gpu_buf_host_ptr(a), hr_gpu_buf_host_ptr(b), 65536);
  hr_gpu_event_del(e);
  hr_gpu_buf_del(a);
  hr_gpu_buf_del(b);
  hr_gpu_stream_del(s);
  assert_int_equal(hr_gpu_del(g), 0);
}

int main(int argc, char **argv) {
  int rv = gt_main_prologue(argc, argv);
  if (rv != 0)
    return rv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_probe_every_backend),
      cmocka_unit_test(test_copies),
      cmocka_unit_test(test_events_and_host_fns),
      cmocka_unit_test(test_stager),
      cmocka_unit_test(test_sim_delays),
  };
  return cmocka_run_group_tests_name(gt_backend, tests, NULL, NULL);
}
