/*
 * End to end with each peer on its own thread, as two engines would run:
 * each thread owns its fabric, connection and handshakes and runs its own
 * loop; only the control channel and the fabric connect them.  GET and
 * PUT over both data paths, byte-exact.  Labelled "threaded" for the
 * ThreadSanitizer leg.  Exits 77 when libfabric has no such provider.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pthread.h>

#include "fabric_peer.h"

#ifndef HR_TEST_PROVIDER
#define HR_TEST_PROVIDER "tcp"
#endif

static const uint64_t SIZES[] = {(2u << 20) + 5, 4096, 3};
#define NBUF 3
#define ROUNDS 4

typedef struct shared {
  fpeer a, b;
  hr_descriptor d;
  uint64_t total;
  uint8_t *src[NBUF], *dst[NBUF];
  pthread_barrier_t bar;
  int failures;
} shared;

typedef struct job {
  shared *s;
  fpeer *me;
  int side;
} job;

static int round_dir(int r) {
  return r & 1 ? HR_RDMA_PUT : HR_RDMA_GET;
}
static int round_dest(int r) {
  return r >= 2;
}

static void *peer_main(void *arg) {
  job *j = arg;
  shared *s = j->s;
  for (int r = 0; r < ROUNDS; r++) {
    pthread_barrier_wait(&s->bar);
    hr_rdma_del(j->me->x);
    j->me->x = NULL;
    void *const *bufs =
        (void *const *)(j->side == HR_RDMA_SENDER ? s->src : s->dst);
    fp_begin(j->me, j->side, round_dir(r), (uint32_t)(2 * r + 1), &s->d,
             s->total, bufs, round_dest(r));
    fpeer *one[1] = {j->me};
    fp_run(one, 1, 60);
    /* The last event of each side must be COMPLETE. */
    if (j->me->ev[j->me->nev - 1].kind != HR_RDMA_EV_COMPLETE ||
        j->me->ev[0].destination != round_dest(r))
      __atomic_add_fetch(&s->failures, 1, __ATOMIC_SEQ_CST);
    pthread_barrier_wait(&s->bar);
    /* Main checks the bytes here. */
    pthread_barrier_wait(&s->bar);
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  shared s;
  memset(&s, 0, sizeof s);
  const char *prov = fp_provider_name(HR_TEST_PROVIDER);
  assert_int_equal(fp_open(&s.a, "A", prov, NULL), 0);
  assert_int_equal(fp_open(&s.b, "B", prov, NULL), 0);
  uint32_t caps = HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT;
  fp_connect(&s.a, &s.b, caps, caps);
  fp_desc(&s.d, NBUF, SIZES, NULL);
  for (int k = 0; k < NBUF; k++)
    s.total += SIZES[k];
  fp_buffers(s.src, NBUF, SIZES, 3);
  fp_buffers(s.dst, NBUF, SIZES, 0);
  assert_int_equal(pthread_barrier_init(&s.bar, NULL, 3), 0);
  job ja = {&s, &s.a, HR_RDMA_SENDER}, jb = {&s, &s.b, HR_RDMA_RECEIVER};
  pthread_t ta, tb;
  assert_int_equal(pthread_create(&ta, NULL, peer_main, &ja), 0);
  assert_int_equal(pthread_create(&tb, NULL, peer_main, &jb), 0);
  for (int r = 0; r < ROUNDS; r++) {
    for (int k = 0; k < NBUF; k++)
      memset(s.dst[k], 0, SIZES[k]);
    pthread_barrier_wait(&s.bar); /* go */
    pthread_barrier_wait(&s.bar); /* done */
    for (int k = 0; k < NBUF; k++)
      if (memcmp(s.src[k], s.dst[k], SIZES[k]) != 0)
        fail_msg("round %d: buffer %d differs", r, k);
    pthread_barrier_wait(&s.bar); /* next */
  }
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  assert_int_equal(s.failures, 0);
  pthread_barrier_destroy(&s.bar);
  fp_close(&s.a);
  fp_close(&s.b);
  free(s.src[0]);
  free(s.dst[0]);
}

int main(void) {
  int rv = fp_probe(fp_provider_name(HR_TEST_PROVIDER));
  if (rv)
    return rv;
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_threads)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
