/*
 * ADR-018 payloads through the in-process channel, on the simulated
 * device: a producer thread overwrites a device buffer holding OLD bytes
 * with NEW bytes slowly (a host function sleeps on its stream first, the
 * "kernel"), and sends the buffer while that work is in flight, in P1, P2
 * or P3.  The consumer thread applies the mode's rule and reads NEW on
 * its own stream; a consumer that skips the rule reads stale bytes, which
 * proves the test can fail.  A payload that does not match its sync_mode
 * is refused before the consumer can see it.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <hurray/inproc.h>

#include "common/test_util.h"
#include "gpu_testutil.h"

#define N (256u * 1024u)
#define GATE_NS 250000000ull

typedef struct fx {
  hr_gpu *g;
  hr_gpu_caps caps;
  hr_gpu_stream *P, *C;
  hr_gpu_buf *dev, *oldb, *newb, *out;
  hr_gpu_event *probe;
  hr_inproc_chan *ch;
  int released; /* atomic: the producer's buffer releases */
  /* what the producer thread is told */
  uint8_t mode;
  int send_rv;
} fx;

static void sleep_gate(void *arg) {
  (void)arg;
  hr__test_sleep(GATE_NS);
}

static void on_release(void *ctx) {
  fx *f = ctx;
  __atomic_add_fetch(&f->released, 1, __ATOMIC_SEQ_CST);
}

static fx *fx_new(int p3) {
  fx *f = calloc(1, sizeof *f);
  assert_non_null(f);
  assert_int_equal(gt_open(&f->g, 0, 64ull << 20), 0);
  assert_int_equal(hr_gpu_query(f->g, &f->caps), 0);
  assert_int_equal(hr_gpu_stream_new(f->g, &f->P), 0);
  assert_int_equal(hr_gpu_stream_new(f->g, &f->C), 0);
  assert_int_equal(hr_gpu_buf_alloc(f->g, HR_GPU_MEM_DEVICE, N, &f->dev), 0);
  assert_int_equal(hr_gpu_buf_alloc(f->g, HR_GPU_MEM_PINNED, N, &f->oldb), 0);
  assert_int_equal(hr_gpu_buf_alloc(f->g, HR_GPU_MEM_PINNED, N, &f->newb), 0);
  assert_int_equal(hr_gpu_buf_alloc(f->g, HR_GPU_MEM_PINNED, N, &f->out), 0);
  gt_fill(hr_gpu_buf_host_ptr(f->oldb), N, 1);
  gt_fill(hr_gpu_buf_host_ptr(f->newb), N, 2);
  assert_int_equal(hr_gpu_event_new(f->g, 0, &f->probe), 0);
  hr_inproc_chan_config cfg;
  hr_inproc_chan_config_default(&cfg);
  cfg.capacity = 4;
  if (p3) {
    /* P3: the consumer names its stream when it makes the channel. */
    cfg.request.consumer_stream = hr_gpu_stream_native(f->C);
    cfg.request.consumer_stream_device_tag = f->caps.device_tag;
  }
  assert_int_equal(hr_inproc_chan_new(&f->ch, &cfg, NULL), 0);
  return f;
}

static void fx_del(fx *f) {
  hr_gpu_stream_sync(f->P);
  hr_gpu_stream_sync(f->C);
  hr_handoff_counts c;
  assert_int_equal(hr_inproc_chan_del(f->ch, &c), 0);
  assert_int_equal(c.missing_releases, 0);
  assert_int_equal(c.double_releases, 0);
  hr_gpu_event_del(f->probe);
  hr_gpu_buf_del(f->dev);
  hr_gpu_buf_del(f->oldb);
  hr_gpu_buf_del(f->newb);
  hr_gpu_buf_del(f->out);
  hr_gpu_stream_del(f->P);
  hr_gpu_stream_del(f->C);
  assert_int_equal(hr_gpu_del(f->g), 0);
  free(f);
}

/* The device tensor: one buffer, the device's tag, `mode` declared. */
static hr_tensor *dev_tensor(fx *f, const hr_buffer_handle *b) {
  hr_descriptor d = tu_bytes_desc(N, 0, HR_DEV_CPU);
  hr_tensor *t;
  d.buffers[0] = *b;
  d.buffers[0].size_bytes = N;
  void *bufs[1] = {hr_gpu_buf_native(f->dev)};
  assert_int_equal(hr_tensor_wrap(&t, &d, bufs, on_release, f, NULL), 0);
  return t;
}

/* The producer thread: starts the slow write, meets `mode` for the
 * channel's request (ADR-018 § 1) and sends while the write runs. */
static void *producer(void *arg) {
  fx *f = arg;
  assert_int_equal(hr_gpu_copy_async(f->P, f->dev, 0, f->oldb, 0, N), 0);
  assert_int_equal(hr_gpu_stream_sync(f->P), 0);
  assert_int_equal(hr_gpu_launch_host_fn(f->P, sleep_gate, NULL), 0);
  assert_int_equal(hr_gpu_copy_async(f->P, f->dev, 0, f->newb, 0, N), 0);
  assert_int_equal(hr_gpu_event_record(f->probe, f->P), 0);
  hr_buffer_handle b;
  hr_handoff_payload p;
  memset(&b, 0, sizeof b);
  memset(&p, 0, sizeof p);
  assert_int_equal(
      hr_handoff_prepare(f->P, f->mode, hr_inproc_chan_request(f->ch), &b, &p),
      0);
  hr_tensor *t = dev_tensor(f, &b);
  f->send_rv = hr_inproc_send(f->ch, t, &p, NULL);
  hr_tensor_unref(t);
  return NULL;
}

static hr_inproc_msg *handoff(fx *f, uint8_t mode) {
  pthread_t th;
  f->mode = mode;
  assert_int_equal(pthread_create(&th, NULL, producer, f), 0);
  hr_inproc_msg *m;
  assert_int_equal(hr_inproc_recv_wait(f->ch, &m, 10000000000ll), 0);
  pthread_join(th, NULL);
  assert_int_equal(f->send_rv, 0);
  /* By value: the producer's device buffer itself. */
  assert_ptr_equal(hr_tensor_buffer(hr_inproc_msg_tensor(m), 0),
                   hr_gpu_buf_native(f->dev));
  assert_int_equal(hr_handoff_sync_mode(hr_inproc_msg_handoff(m)), mode);
  return m;
}

/* Reads the device buffer on the consumer's stream: 1 when it held NEW. */
static int read_on_c(fx *f) {
  memset(hr_gpu_buf_host_ptr(f->out), 0, N);
  assert_int_equal(hr_gpu_copy_async(f->C, f->out, 0, f->dev, 0, N), 0);
  assert_int_equal(hr_gpu_stream_sync(f->C), 0);
  return memcmp(hr_gpu_buf_host_ptr(f->out), hr_gpu_buf_host_ptr(f->newb), N) ==
         0;
}

/* The consumer's end (§ 5): the release waits for its stream. */
static void finish(fx *f, hr_inproc_msg *m) {
  assert_int_equal(hr_handoff_release_after(hr_inproc_msg_handoff(m), &f->C, 1),
                   0);
  hr_inproc_msg_del(m);
  assert_int_equal(hr_gpu_stream_sync(f->C), 0);
  assert_int_equal(__atomic_load_n(&f->released, __ATOMIC_SEQ_CST), 1);
}

static void test_p1(void **state) {
  (void)state;
  fx *f = fx_new(0);
  hr_inproc_msg *m = handoff(f, HR_SYNC_PRODUCER_SYNCED);
  /* The producer waited: its work is done at handoff. */
  assert_int_equal(hr_gpu_event_query(f->probe), 0);
  assert_int_equal(hr_handoff_consume(hr_inproc_msg_handoff(m), f->g, &f->C, 1),
                   0);
  assert_true(read_on_c(f));
  finish(f, m);
  fx_del(f);
}

static void test_p2(void **state) {
  (void)state;
  fx *f = fx_new(0);
  hr_inproc_msg *m = handoff(f, HR_SYNC_EVENT);
  hr_handoff *h = hr_inproc_msg_handoff(m);
  assert_non_null(hr_handoff_sync_handle(h));
  assert_int_equal(hr_gpu_event_query(f->probe), HR_ERR_WOULDBLOCK);
  /* The stream waits on the event, then the event is released (once),
   * then (later) the buffer. */
  assert_int_equal(hr_handoff_consume(h, f->g, &f->C, 1), 0);
  assert_true(read_on_c(f));
  assert_int_equal(hr_handoff_release_event(h), HR_ERR_STATE);
  finish(f, m);
  hr_handoff_counts c;
  hr_inproc_chan_counts(f->ch, &c);
  assert_int_equal(c.event_releases, 1);
  assert_int_equal(c.buffer_releases, 1);
  assert_int_equal(c.double_releases, 1); /* the second event release */
  /* fx_del checks double_releases == 0 for the clean runs: reset by
   * making a fresh fixture count only this one. */
  hr_gpu_stream_sync(f->P);
  hr_gpu_stream_sync(f->C);
  assert_int_equal(hr_inproc_chan_del(f->ch, &c), 0);
  assert_int_equal(c.double_releases, 1);
  assert_int_equal(c.missing_releases, 0);
  assert_int_equal(hr_inproc_chan_new(&f->ch, NULL, NULL), 0);
  fx_del(f);
}

static void test_p2_consumer_skips_wait(void **state) {
  (void)state;
  fx *f = fx_new(0);
  hr_inproc_msg *m = handoff(f, HR_SYNC_EVENT);
  assert_int_equal(hr_gpu_event_query(f->probe), HR_ERR_WOULDBLOCK);
  assert_false(read_on_c(f)); /* no stream wait: stale bytes */
  assert_int_equal(hr_handoff_release_event(hr_inproc_msg_handoff(m)), 0);
  finish(f, m);
  fx_del(f);
}

static void test_p3(void **state) {
  (void)state;
  fx *f = fx_new(1);
  hr_inproc_msg *m = handoff(f, HR_SYNC_CONSUMER_STREAM);
  assert_ptr_equal(hr_handoff_consumer_stream(hr_inproc_msg_handoff(m)),
                   hr_gpu_stream_native(f->C));
  assert_int_equal(hr_gpu_event_query(f->probe), HR_ERR_WOULDBLOCK);
  /* The declared stream may use the buffer at once. */
  assert_true(read_on_c(f));
  finish(f, m);
  fx_del(f);
}

static void test_p3_without_request_stream(void **state) {
  (void)state;
  /* A P3 producer on a channel whose consumer named no stream cannot
   * even prepare; a producer that claims P3 anyway is refused. */
  fx *f = fx_new(0);
  hr_buffer_handle b;
  hr_handoff_payload p;
  memset(&b, 0, sizeof b);
  memset(&p, 0, sizeof p);
  assert_int_equal(hr_handoff_prepare(f->P, HR_SYNC_CONSUMER_STREAM,
                                      hr_inproc_chan_request(f->ch), &b, &p),
                   HR_ERR_INVALID_ARGUMENT);
  b.device_tag = f->caps.device_tag;
  b.sync_mode = HR_SYNC_CONSUMER_STREAM;
  p.ordered_stream = hr_gpu_stream_native(f->C);
  hr_tensor *t = dev_tensor(f, &b);
  hr_wire_status st;
  assert_int_equal(hr_inproc_send(f->ch, t, &p, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_SYNC_MODE);
  hr_inproc_msg *m;
  assert_int_equal(hr_inproc_recv(f->ch, &m), HR_ERR_WOULDBLOCK);
  hr_tensor_unref(t);
  assert_int_equal(f->released, 1);
  fx_del(f);
}

/* P2 declared without an event: refused, the consumer sees nothing. */
static void test_p2_mismatch_refused(void **state) {
  (void)state;
  fx *f = fx_new(0);
  hr_buffer_handle b;
  memset(&b, 0, sizeof b);
  b.device_tag = f->caps.device_tag;
  b.sync_mode = HR_SYNC_EVENT;
  hr_tensor *t = dev_tensor(f, &b);
  hr_wire_status st;
  assert_int_equal(hr_inproc_send(f->ch, t, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_SYNC_MODE);
  /* A reserved mode too. */
  hr_tensor_unref(t);
  b.sync_mode = 0x07;
  t = dev_tensor(f, &b);
  assert_int_equal(hr_inproc_send(f->ch, t, NULL, &st), HR_ERR_PROTO);
  hr_tensor_unref(t);
  assert_int_equal(hr_inproc_chan_pending(f->ch), 0);
  hr_handoff_counts c;
  hr_inproc_chan_counts(f->ch, &c);
  assert_int_equal(c.rejected, 2);
  assert_int_equal(f->released, 2);
  fx_del(f);
}

int main(int argc, char **argv) {
  int rv = gt_main_prologue(argc, argv);
  if (rv != 0)
    return rv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_p1),
      cmocka_unit_test(test_p2),
      cmocka_unit_test(test_p2_consumer_skips_wait),
      cmocka_unit_test(test_p3),
      cmocka_unit_test(test_p3_without_request_stream),
      cmocka_unit_test(test_p2_mismatch_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
