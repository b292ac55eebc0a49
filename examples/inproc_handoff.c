/*
 * inproc_handoff: a tensor handed from a producer thread to a consumer
 * thread without hurray:// (docs/internals/inproc.md).
 *
 * The producer fills tensors and sends them by value (descriptor and
 * buffer pointer) through an hr_inproc_chan; the consumer's loop sleeps
 * in poll() on the channel's eventfd, takes each tensor, reads the
 * producer's very bytes, and releases it exactly once, which runs the
 * producer's release callback (here: the buffer goes back to a pool the
 * producer reuses).  The channel holds 4 tensors: a faster producer waits
 * in hr_inproc_send_wait() (backpressure).
 *
 * Usage: inproc_handoff [COUNT]   (default 16).  Prints one line per
 * tensor and the ledger's counters; exits 0 when every release happened
 * exactly once.
 */
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hurray/inproc.h>

#define SLOTS 6
#define ELEMS 1024

/* The producer's buffers: a slot is free again once its release ran. */
typedef struct pool {
  float data[SLOTS][ELEMS];
  int busy[SLOTS]; /* atomic */
  int releases;    /* atomic */
} pool;

typedef struct slot_ref {
  pool *p;
  int i;
} slot_ref;

static void on_release(void *ctx) {
  slot_ref *r = ctx;
  __atomic_add_fetch(&r->p->releases, 1, __ATOMIC_SEQ_CST);
  __atomic_store_n(&r->p->busy[r->i], 0, __ATOMIC_SEQ_CST);
  free(r);
}

typedef struct app {
  hr_inproc_chan *ch;
  pool pool;
  int count;
} app;

static void *producer(void *arg) {
  app *a = arg;
  for (int n = 0; n < a->count; n++) {
    int i;
    /* A free slot (the consumer's releases free them).  At most 4 are
     * queued and 1 held by the consumer, so one pass finds one. */
    for (i = 0;; i = (i + 1) % SLOTS) {
      int expect = 0;
      if (__atomic_compare_exchange_n(&a->pool.busy[i], &expect, 1, 0,
                                      __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        break;
      if (i == SLOTS - 1)
        sched_yield();
    }
    for (int k = 0; k < ELEMS; k++)
      a->pool.data[i][k] = (float)n + (float)k / ELEMS;

    hr_descriptor d;
    memset(&d, 0, sizeof d);
    d.descriptor_version = 1;
    d.element_type = HR_ELEM_FLOAT32;
    d.rank = 1;
    d.shape[0] = ELEMS;
    d.layout.tag = HR_LAYOUT_ROW_MAJOR;
    d.buffer_count = 1;
    d.buffers[0].size_bytes = sizeof a->pool.data[i];
    d.buffers[0].alignment_log2 = 2;
    slot_ref *r = malloc(sizeof *r);
    if (!r)
      abort();
    r->p = &a->pool;
    r->i = i;
    void *bufs[1] = {a->pool.data[i]};
    hr_tensor *t;
    if (hr_tensor_wrap(&t, &d, bufs, on_release, r, NULL) != 0)
      abort();
    /* CPU buffers are PRODUCER_SYNCED (P1): no sync payload. */
    int rv = hr_inproc_send_wait(a->ch, t, NULL, -1, NULL);
    hr_tensor_unref(t); /* the channel holds its own reference */
    if (rv != 0) {
      fprintf(stderr, "send: %s\n", hr_strerror(rv));
      break;
    }
  }
  hr_inproc_chan_close(a->ch);
  return NULL;
}

int main(int argc, char **argv) {
  app *a = calloc(1, sizeof *a);
  hr_inproc_chan_config cfg;
  pthread_t th;
  int got = 0;

  if (!a)
    return 1;
  a->count = argc > 1 ? atoi(argv[1]) : 16;
  hr_inproc_chan_config_default(&cfg);
  cfg.capacity = 4;
  if (hr_inproc_chan_new(&a->ch, &cfg, NULL) != 0)
    return 1;
  if (pthread_create(&th, NULL, producer, a) != 0)
    return 1;

  /* The consumer's loop: sleeps on the fd, never spins. */
  struct pollfd pfd = {hr_inproc_chan_fd(a->ch), POLLIN, 0};
  for (;;) {
    hr_inproc_msg *m;
    int rv = hr_inproc_recv(a->ch, &m);
    if (rv == HR_ERR_WOULDBLOCK) {
      poll(&pfd, 1, -1);
      continue;
    }
    if (rv != 0)
      break; /* HR_ERR_CLOSED: the producer is done */
    hr_tensor *t = hr_inproc_msg_tensor(m);
    const float *v = hr_tensor_buffer(t, 0);
    printf("tensor %d: %llu floats at %p, v[0]=%g v[%d]=%g\n", got,
           (unsigned long long)hr_tensor_descriptor(t)->shape[0],
           (const void *)v, v[0], ELEMS - 1, v[ELEMS - 1]);
    hr_inproc_msg_release(m); /* exactly once: the producer's slot frees */
    hr_inproc_msg_del(m);
    got++;
  }
  pthread_join(th, NULL);

  hr_handoff_counts c;
  hr_inproc_chan_del(a->ch, &c);
  printf("handoffs %llu, releases %llu, double %llu, missing %llu\n",
         (unsigned long long)c.accepted, (unsigned long long)c.buffer_releases,
         (unsigned long long)c.double_releases,
         (unsigned long long)c.missing_releases);
  int ok = got == a->count && a->pool.releases == a->count &&
           c.double_releases == 0 && c.missing_releases == 0;
  free(a);
  return ok ? 0 : 1;
}
