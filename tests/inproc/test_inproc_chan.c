/*
 * The in-process channel between threads: descriptors and buffers passed
 * by value (pointer identity), the producer's release called exactly
 * once, double and missing releases counted by the ledger, backpressure
 * (a full channel refuses; the blocking variant waits), the wakeup
 * eventfd, close, and the ADR-018 cross-check for CPU buffers.
 */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <hurray/inproc.h>

#include "common/test_util.h"

#define COUNT 2000

typedef struct rel {
  int calls; /* atomic */
} rel;

static void on_release(void *ctx) {
  rel *r = ctx;
  __atomic_add_fetch(&r->calls, 1, __ATOMIC_SEQ_CST);
}

static hr_tensor *cpu_tensor(void *buf, uint64_t n, rel *r) {
  hr_descriptor d = tu_bytes_desc(n, 0, HR_DEV_CPU);
  hr_tensor *t;
  void *bufs[1] = {buf};
  assert_int_equal(hr_tensor_wrap(&t, &d, bufs, on_release, r, NULL), 0);
  return t;
}

static int readable(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* ---- one producer thread, one consumer thread ------------------------- */

typedef struct pc {
  hr_inproc_chan *ch;
  uint8_t *bufs[COUNT];
  rel rels[COUNT];
  int seen;
  int order_ok;
} pc;

static void *producer(void *arg) {
  pc *x = arg;
  for (int i = 0; i < COUNT; i++) {
    hr_tensor *t = cpu_tensor(x->bufs[i], 16, &x->rels[i]);
    int rv = hr_inproc_send_wait(x->ch, t, NULL, -1, NULL);
    assert_int_equal(rv, 0);
    hr_tensor_unref(t); /* the channel holds its own */
  }
  hr_inproc_chan_close(x->ch);
  return NULL;
}

static void *consumer(void *arg) {
  pc *x = arg;
  int fd = hr_inproc_chan_fd(x->ch);
  x->order_ok = 1;
  for (;;) {
    hr_inproc_msg *m;
    int rv = hr_inproc_recv(x->ch, &m);
    if (rv == HR_ERR_WOULDBLOCK) {
      /* A loop-based consumer sleeps on the fd, never polls. */
      assert_true(readable(fd, 10000));
      continue;
    }
    if (rv == HR_ERR_CLOSED)
      break;
    assert_int_equal(rv, 0);
    hr_tensor *t = hr_inproc_msg_tensor(m);
    /* By value: the producer's very buffer, in order. */
    if (hr_tensor_buffer(t, 0) != x->bufs[x->seen])
      x->order_ok = 0;
    assert_int_equal(hr_tensor_descriptor(t)->shape[0], 16);
    assert_int_equal(hr_handoff_sync_mode(hr_inproc_msg_handoff(m)),
                     HR_SYNC_PRODUCER_SYNCED);
    assert_int_equal(hr_inproc_msg_release(m), 0);
    hr_inproc_msg_del(m);
    x->seen++;
  }
  return NULL;
}

static void test_threads_exactly_once(void **state) {
  (void)state;
  hr_inproc_chan_config cfg;
  hr_inproc_chan_config_default(&cfg);
  cfg.capacity = 8; /* the producer outruns the consumer: backpressure */
  pc *x = calloc(1, sizeof *x);
  assert_non_null(x);
  assert_int_equal(hr_inproc_chan_new(&x->ch, &cfg, NULL), 0);
  for (int i = 0; i < COUNT; i++)
    x->bufs[i] = malloc(16);
  pthread_t a, b;
  assert_int_equal(pthread_create(&b, NULL, consumer, x), 0);
  assert_int_equal(pthread_create(&a, NULL, producer, x), 0);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  assert_int_equal(x->seen, COUNT);
  assert_true(x->order_ok);
  for (int i = 0; i < COUNT; i++) {
    assert_int_equal(x->rels[i].calls, 1);
    free(x->bufs[i]);
  }
  hr_handoff_counts c;
  assert_int_equal(hr_inproc_chan_del(x->ch, &c), 0);
  assert_int_equal(c.accepted, COUNT);
  assert_int_equal(c.buffer_releases, COUNT);
  assert_int_equal(c.double_releases, 0);
  assert_int_equal(c.missing_releases, 0);
  free(x);
}

/* ---- backpressure, fd, double and missing releases --------------------- */

static void test_full_refuses_and_fd(void **state) {
  (void)state;
  hr_inproc_chan_config cfg;
  hr_inproc_chan_config_default(&cfg);
  cfg.capacity = 2;
  hr_inproc_chan *ch;
  assert_int_equal(hr_inproc_chan_new(&ch, &cfg, NULL), 0);
  int fd = hr_inproc_chan_fd(ch);
  uint8_t buf[3][16];
  rel r[3] = {{0}, {0}, {0}};
  hr_tensor *t[3];
  for (int i = 0; i < 3; i++)
    t[i] = cpu_tensor(buf[i], 16, &r[i]);

  assert_false(readable(fd, 0));
  assert_int_equal(hr_inproc_send(ch, t[0], NULL, NULL), 0);
  assert_true(readable(fd, 0));
  assert_int_equal(hr_inproc_send(ch, t[1], NULL, NULL), 0);
  /* Full: refused, nothing taken, nothing called. */
  assert_int_equal(hr_inproc_send(ch, t[2], NULL, NULL), HR_ERR_WOULDBLOCK);
  assert_int_equal(hr_inproc_send_wait(ch, t[2], NULL, 20000000, NULL),
                   HR_ERR_TIMEOUT);
  assert_int_equal(hr_inproc_chan_pending(ch), 2);

  hr_inproc_msg *m0, *m1;
  assert_int_equal(hr_inproc_recv(ch, &m0), 0);
  assert_true(readable(fd, 0)); /* one still waits */
  assert_int_equal(hr_inproc_send(ch, t[2], NULL, NULL), 0);
  assert_int_equal(hr_inproc_recv(ch, &m1), 0);
  assert_ptr_equal(hr_tensor_buffer(hr_inproc_msg_tensor(m1), 0), buf[1]);

  /* The producers drop their references: the channel's keep the buffers
   * (t[1]'s is dropped at the end, see below). */
  hr_tensor_unref(t[0]);
  hr_tensor_unref(t[2]);
  assert_int_equal(r[0].calls, 0);

  /* A double release is refused, counted, and not forwarded. */
  assert_int_equal(hr_inproc_msg_release(m0), 0);
  assert_int_equal(r[0].calls, 1);
  assert_int_equal(hr_inproc_msg_release(m0), HR_ERR_STATE);
  assert_int_equal(r[0].calls, 1);
  hr_inproc_msg_del(m0);

  /* m1 is never released (a missing release), m2 never received. */
  hr_inproc_msg_del(m1);
  assert_int_equal(r[1].calls, 0); /* leaking is the safe side */
  assert_true(readable(fd, 0));

  hr_handoff_counts c;
  hr_inproc_chan_counts(ch, &c);
  assert_int_equal(c.double_releases, 1);
  assert_int_equal(c.missing_releases, 1);
  assert_int_equal(hr_inproc_chan_del(ch, &c), 0);
  /* The queued message was released by the destruction. */
  assert_int_equal(r[2].calls, 1);
  assert_int_equal(c.buffer_releases, 2);
  assert_int_equal(c.missing_releases, 1);
  assert_int_equal(c.double_releases, 1);
  /* m1's missing release left the channel's reference on t[1] (leaked on
   * purpose): drop it by hand so that LeakSanitizer stays quiet. */
  assert_int_equal(r[1].calls, 0);
  hr_tensor_unref(t[1]);
  hr_tensor_unref(t[1]);
  assert_int_equal(r[1].calls, 1);
}

static void test_close_and_busy_del(void **state) {
  (void)state;
  hr_inproc_chan *ch;
  assert_int_equal(hr_inproc_chan_new(&ch, NULL, NULL), 0);
  uint8_t buf[16];
  rel r = {0};
  hr_tensor *t = cpu_tensor(buf, 16, &r);
  assert_int_equal(hr_inproc_send(ch, t, NULL, NULL), 0);
  hr_inproc_chan_close(ch);
  assert_int_equal(hr_inproc_send(ch, t, NULL, NULL), HR_ERR_CLOSED);
  hr_inproc_msg *m;
  /* What was queued still comes, then the end. */
  assert_int_equal(hr_inproc_recv(ch, &m), 0);
  hr_inproc_msg *m2;
  assert_int_equal(hr_inproc_recv(ch, &m2), HR_ERR_CLOSED);
  assert_int_equal(hr_inproc_recv_wait(ch, &m2, -1), HR_ERR_CLOSED);
  assert_true(readable(hr_inproc_chan_fd(ch), 0));
  hr_tensor_unref(t);
  assert_int_equal(hr_inproc_msg_release(m), 0);
  assert_int_equal(r.calls, 1);
  /* Destroyed while the consumer still holds the message (released, not
   * deleted): BUSY, and the message goes with the channel. */
  hr_handoff_counts c;
  assert_int_equal(hr_inproc_chan_del(ch, &c), HR_ERR_BUSY);
  assert_int_equal(c.missing_releases, 0);
  assert_int_equal(c.buffer_releases, 1);
}

/* The blocking receive wakes when a producer sends from another thread. */
typedef struct late {
  hr_inproc_chan *ch;
  hr_tensor *t;
} late;

static void *late_sender(void *arg) {
  late *l = arg;
  struct timespec ts = {0, 30000000};
  nanosleep(&ts, NULL);
  assert_int_equal(hr_inproc_send(l->ch, l->t, NULL, NULL), 0);
  return NULL;
}

static void test_recv_wait(void **state) {
  (void)state;
  late l;
  uint8_t buf[16];
  rel r = {0};
  assert_int_equal(hr_inproc_chan_new(&l.ch, NULL, NULL), 0);
  l.t = cpu_tensor(buf, 16, &r);
  hr_inproc_msg *m;
  assert_int_equal(hr_inproc_recv_wait(l.ch, &m, 1000000), HR_ERR_TIMEOUT);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, late_sender, &l), 0);
  assert_int_equal(hr_inproc_recv_wait(l.ch, &m, 30000000000ll), 0);
  pthread_join(th, NULL);
  hr_tensor_unref(l.t);
  assert_int_equal(r.calls, 0);
  assert_int_equal(hr_inproc_msg_release(m), 0);
  assert_int_equal(r.calls, 1);
  hr_inproc_msg_del(m);
  assert_int_equal(hr_inproc_chan_del(l.ch, NULL), 0);
}

/* ADR-018 § 4 for CPU buffers: only P1; a P2 payload is refused before
 * the consumer sees it, and its event handed back. */
static void on_event_release(void *ctx) {
  (*(int *)ctx)++;
}

static void test_cross_check(void **state) {
  (void)state;
  hr_inproc_chan *ch;
  assert_int_equal(hr_inproc_chan_new(&ch, NULL, NULL), 0);
  uint8_t buf[16];
  rel r = {0};
  hr_tensor *t = cpu_tensor(buf, 16, &r);
  int ev = 0;
  hr_handoff_payload p;
  memset(&p, 0, sizeof p);
  p.sync_handle = &ev;
  p.event_release = on_event_release;
  p.event_release_ctx = &ev;
  hr_wire_status st;
  /* A P1 CPU buffer carrying an event: a payload mismatch. */
  assert_int_equal(hr_inproc_send(ch, t, &p, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_SYNC_MODE);
  assert_int_equal(ev, 1);
  assert_int_equal(hr_inproc_chan_pending(ch), 0);
  hr_inproc_msg *m;
  assert_int_equal(hr_inproc_recv(ch, &m), HR_ERR_WOULDBLOCK);
  /* The producer's tensor is intact: its reference was handed back. */
  assert_int_equal(r.calls, 0);
  hr_tensor_unref(t);
  assert_int_equal(r.calls, 1);
  hr_handoff_counts c;
  assert_int_equal(hr_inproc_chan_del(ch, &c), 0);
  assert_int_equal(c.rejected, 1);
  assert_int_equal(c.accepted, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads_exactly_once),
      cmocka_unit_test(test_full_refuses_and_fd),
      cmocka_unit_test(test_close_and_busy_del),
      cmocka_unit_test(test_recv_wait),
      cmocka_unit_test(test_cross_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
