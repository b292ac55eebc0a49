/*
 * The ADR-018 contract on a real (or simulated) asynchronous device.
 *
 * A slow producer on stream P overwrites a device buffer holding OLD bytes
 * with NEW bytes: a host function on P sleeps first (the "kernel" still
 * running), then the copy lands.  The handoff happens while that work is
 * in flight.  For each mode the consumer that applies the matching rule
 * reads, on its own stream, exactly NEW; a consumer that skips the rule
 * reads something else, which proves the test would catch a broken
 * implementation.
 *
 * Usage: test_gpu_contract [backend]   (default "sim"; exit 77 when the
 * backend is unavailable here).
 */
#include <stddef.h>

#ifdef HR_NO_CMOCKA
#include "gt_nocmocka.h"
#else
#include <setjmp.h>
#include <stdarg.h>

#include <cmocka.h>
#endif

#include <hurray/handoff.h>

#include "gpu_testutil.h"

#define N (256u * 1024u)
#define GATE_NS 250000000ull /* the producer's "kernel" time */

typedef struct fx {
  hr_gpu *g;
  hr_gpu_caps caps;
  hr_gpu_stream *P, *C, *C2;
  hr_gpu_buf *dev, *oldb, *newb, *out;
  uint8_t *hmem[3]; /* host memory behind oldb/newb/out when not pinned */
  hr_handoff_ledger *l;
  hr_gpu_event *probe; /* recorded after the producer's write */
  int releases;        /* buffer release callbacks seen */
} fx;

static void sleep_gate(void *arg) {
  (void)arg;
  hr__test_sleep(GATE_NS);
}

static int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  assert_non_null(f);
  /* On the simulated device copies are also paced, so a racing reader
   * could even see half-written data. */
  assert_int_equal(gt_open(&f->g, 0, 64ull << 20), 0);
  assert_int_equal(hr_gpu_query(f->g, &f->caps), 0);
  assert_int_equal(hr_gpu_stream_new(f->g, &f->P), 0);
  assert_int_equal(hr_gpu_stream_new(f->g, &f->C), 0);
  assert_int_equal(hr_gpu_stream_new(f->g, &f->C2), 0);
  assert_int_equal(hr_gpu_buf_alloc(f->g, HR_GPU_MEM_DEVICE, N, &f->dev), 0);
  hr_gpu_buf **hb[3] = {&f->oldb, &f->newb, &f->out};
  for (int i = 0; i < 3; i++) {
    if (f->caps.flags & HR_GPU_CAP_PINNED) {
      assert_int_equal(hr_gpu_buf_alloc(f->g, HR_GPU_MEM_PINNED, N, hb[i]), 0);
    } else {
      f->hmem[i] = malloc(N);
      assert_int_equal(hr_gpu_buf_wrap_host(f->g, f->hmem[i], N, hb[i]), 0);
    }
  }
  gt_fill(hr_gpu_buf_host_ptr(f->oldb), N, 1);
  gt_fill(hr_gpu_buf_host_ptr(f->newb), N, 2);
  assert_int_equal(hr_handoff_ledger_new(&f->l, NULL), 0);
  assert_int_equal(hr_gpu_event_new(f->g, 0, &f->probe), 0);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;
  hr_gpu_stream_sync(f->P);
  hr_gpu_stream_sync(f->C);
  hr_gpu_stream_sync(f->C2);
  hr_handoff_counts c;
  int busy = hr_handoff_ledger_del(f->l, &c);
  hr_gpu_event_del(f->probe);
  hr_gpu_buf_del(f->dev);
  hr_gpu_buf_del(f->oldb);
  hr_gpu_buf_del(f->newb);
  hr_gpu_buf_del(f->out);
  for (int i = 0; i < 3; i++)
    free(f->hmem[i]);
  hr_gpu_stream_del(f->P);
  hr_gpu_stream_del(f->C);
  hr_gpu_stream_del(f->C2);
  assert_int_equal(hr_gpu_del(f->g), 0);
  free(f);
  /* Every test releases what it was handed, exactly once. */
  assert_int_equal(busy, 0);
  assert_int_equal(c.missing_releases, 0);
  assert_int_equal(c.double_releases, 0);
  return 0;
}

/* Resets the device buffer to OLD, then starts the slow write of NEW. */
static void slow_write(fx *f) {
  assert_int_equal(hr_gpu_copy_async(f->P, f->dev, 0, f->oldb, 0, N), 0);
  assert_int_equal(hr_gpu_stream_sync(f->P), 0);
  assert_int_equal(hr_gpu_launch_host_fn(f->P, sleep_gate, NULL), 0);
  assert_int_equal(hr_gpu_copy_async(f->P, f->dev, 0, f->newb, 0, N), 0);
  assert_int_equal(hr_gpu_event_record(f->probe, f->P), 0);
}

/* Reads the device buffer on `s` into OUT; returns 1 when it held NEW. */
static int read_on(fx *f, hr_gpu_stream *s) {
  memset(hr_gpu_buf_host_ptr(f->out), 0, N);
  assert_int_equal(hr_gpu_copy_async(s, f->out, 0, f->dev, 0, N), 0);
  assert_int_equal(hr_gpu_stream_sync(s), 0);
  return memcmp(hr_gpu_buf_host_ptr(f->out), hr_gpu_buf_host_ptr(f->newb),
                N) == 0;
}

static void on_release(void *ctx) {
  fx *f = ctx;
  __atomic_add_fetch(&f->releases, 1, __ATOMIC_SEQ_CST);
}

/* The producer: declares `mode` and meets it through hr_handoff_prepare(),
 * unless `lie` is set, in which case it declares the mode and does
 * nothing (the bug the consumer-side tests must be able to see). */
typedef struct producer {
  fx *f;
  uint8_t mode;
  int lie;
} producer;

static int produce(void *user, const hr_handoff_request *req,
                   hr_buffer_handle *b, hr_handoff_payload *p) {
  producer *pr = user;
  fx *f = pr->f;
  b->size_bytes = N;
  b->memory_class = HR_MEM_STANDARD;
  p->ptr = hr_gpu_buf_native(f->dev);
  p->release = on_release;
  p->release_ctx = f;
  if (pr->lie) {
    /* The declaration and payload are well-formed (the ABI cannot see
     * the missing work), but nothing was done to meet them. */
    b->device_tag = f->caps.device_tag;
    b->sync_mode = pr->mode;
    if (pr->mode == HR_SYNC_CONSUMER_STREAM)
      p->ordered_stream = req->consumer_stream;
    return 0;
  }
  return hr_handoff_prepare(f->P, pr->mode, req, b, p);
}

static hr_handoff *acquire(fx *f, uint8_t mode, int lie,
                           hr_gpu_stream *consumer) {
  hr_handoff_request req;
  memset(&req, 0, sizeof req);
  req.transport = HR_HANDOFF_IN_PROCESS;
  if (consumer) {
    req.consumer_stream = hr_gpu_stream_native(consumer);
    req.consumer_stream_device_tag = f->caps.device_tag;
  }
  producer pr = {f, mode, lie};
  hr_handoff *h;
  hr_wire_status st;
  assert_int_equal(hr_handoff_acquire(f->l, &req, produce, &pr, &h, &st), 0);
  assert_int_equal(hr_handoff_sync_mode(h), mode);
  return h;
}

/* Ends a handoff the § 5 way: the release waits for the consumer's
 * stream, and happens exactly once. */
static void finish(fx *f, hr_handoff *h, hr_gpu_stream *s) {
  assert_int_equal(hr_handoff_release_after(h, &s, 1), 0);
  hr_handoff_del(h);
  assert_int_equal(hr_gpu_stream_sync(s), 0);
  assert_int_equal(hr_gpu_stream_sync(f->P), 0);
  assert_int_equal(__atomic_load_n(&f->releases, __ATOMIC_SEQ_CST), 1);
}

/* The producer's write must still be running when the consumer acts, or
 * the test proves nothing. */
static void assert_in_flight(fx *f) {
  assert_int_equal(hr_gpu_event_query(f->probe), HR_ERR_WOULDBLOCK);
}

static void test_p1_correct(void **state) {
  fx *f = *state;
  slow_write(f);
  hr_handoff *h = acquire(f, HR_SYNC_PRODUCER_SYNCED, 0, NULL);
  /* P1: the producer waited, so its work is done at handoff. */
  assert_int_equal(hr_gpu_event_query(f->probe), 0);
  assert_int_equal(hr_handoff_consume(h, f->g, &f->C, 1), 0);
  assert_true(read_on(f, f->C));
  finish(f, h, f->C);
}

static void test_p1_producer_skips_sync(void **state) {
  fx *f = *state;
  slow_write(f);
  hr_handoff *h = acquire(f, HR_SYNC_PRODUCER_SYNCED, 1, NULL);
  assert_in_flight(f);
  assert_false(read_on(f, f->C)); /* stale: the bug is visible */
  finish(f, h, f->C);
}

static void test_p2_correct(void **state) {
  fx *f = *state;
  for (int i = 0; i < 2; i++) {
    slow_write(f);
    hr_handoff *h = acquire(f, HR_SYNC_EVENT, 0, NULL);
    assert_non_null(hr_handoff_sync_handle(h));
    assert_in_flight(f);
    hr_gpu_stream *both[2] = {f->C, f->C2};
    assert_int_equal(hr_handoff_consume(h, f->g, both, 2), 0);
    assert_true(read_on(f, f->C));
    assert_true(read_on(f, f->C2));
    f->releases = 0;
    finish(f, h, f->C);
  }
  hr_handoff_counts c;
  hr_handoff_ledger_counts(f->l, &c);
  assert_int_equal(c.event_releases, 2);
  assert_int_equal(c.buffer_releases, 2);
}

static void test_p2_consumer_skips_wait(void **state) {
  fx *f = *state;
  slow_write(f);
  hr_handoff *h = acquire(f, HR_SYNC_EVENT, 0, NULL);
  assert_in_flight(f);
  assert_false(read_on(f, f->C)); /* no stream wait: stale bytes */
  assert_int_equal(hr_handoff_release_event(h), 0);
  finish(f, h, f->C);
}

static void test_p3_correct(void **state) {
  fx *f = *state;
  slow_write(f);
  hr_handoff *h = acquire(f, HR_SYNC_CONSUMER_STREAM, 0, f->C);
  assert_ptr_equal(hr_handoff_consumer_stream(h), hr_gpu_stream_native(f->C));
  assert_in_flight(f);
  /* The declared stream may use the buffer at once... */
  assert_true(read_on(f, f->C));
  finish(f, h, f->C);
}

static void test_p3_other_stream_correct(void **state) {
  fx *f = *state;
  slow_write(f);
  hr_handoff *h = acquire(f, HR_SYNC_CONSUMER_STREAM, 0, f->C);
  assert_in_flight(f);
  /* ...another stream only after an inter-stream wait. */
  hr_gpu_stream *both[2] = {f->C, f->C2};
  assert_int_equal(hr_handoff_consume(h, f->g, both, 2), 0);
  assert_true(read_on(f, f->C2));
  hr_gpu_stream *rel[2] = {f->C2, f->C};
  assert_int_equal(hr_handoff_release_after(h, rel, 2), 0);
  hr_handoff_del(h);
  assert_int_equal(hr_gpu_stream_sync(f->C2), 0);
  assert_int_equal(f->releases, 1);
}

static void test_p3_other_stream_skips_wait(void **state) {
  fx *f = *state;
  slow_write(f);
  hr_handoff *h = acquire(f, HR_SYNC_CONSUMER_STREAM, 0, f->C);
  assert_in_flight(f);
  assert_false(read_on(f, f->C2)); /* not the ordered stream, no wait */
  finish(f, h, f->C);
}

static void test_p3_producer_skips_wait(void **state) {
  fx *f = *state;
  slow_write(f);
  hr_handoff *h = acquire(f, HR_SYNC_CONSUMER_STREAM, 1, f->C);
  assert_in_flight(f);
  assert_false(read_on(f, f->C));
  finish(f, h, f->C);
}

/* § 5: the buffer release waits for the consumer's device work. */
static void test_release_waits_for_consumer(void **state) {
  fx *f = *state;
  slow_write(f);
  hr_handoff *h = acquire(f, HR_SYNC_EVENT, 0, NULL);
  assert_int_equal(hr_handoff_consume(h, f->g, &f->C, 1), 0);
  assert_int_equal(hr_gpu_copy_async(f->C, f->out, 0, f->dev, 0, N), 0);
  assert_int_equal(hr_handoff_release_after(h, &f->C, 1), 0);
  hr_handoff_del(h); /* the pending release keeps it alive */
  /* The consumer's copy waits for the producer's 250 ms gate, so the
   * release cannot have run yet. */
  assert_int_equal(__atomic_load_n(&f->releases, __ATOMIC_SEQ_CST), 0);
  assert_int_equal(hr_gpu_stream_sync(f->C), 0);
  assert_int_equal(f->releases, 1);
  assert_memory_equal(hr_gpu_buf_host_ptr(f->out),
                      hr_gpu_buf_host_ptr(f->newb), N);
}

int main(int argc, char **argv) {
  int rv = gt_main_prologue(argc, argv);
  if (rv != 0)
    return rv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_p1_correct, setup, teardown),
      cmocka_unit_test_setup_teardown(test_p1_producer_skips_sync, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_p2_correct, setup, teardown),
      cmocka_unit_test_setup_teardown(test_p2_consumer_skips_wait, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_p3_correct, setup, teardown),
      cmocka_unit_test_setup_teardown(test_p3_other_stream_correct, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_p3_other_stream_skips_wait, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_p3_producer_skips_wait, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_release_waits_for_consumer, setup,
                                      teardown),
  };
  return cmocka_run_group_tests_name(gt_backend, tests, NULL, NULL);
}
