/*
 * The invalidation tracker (fabric/hr_fab_track.c) under threads: ranges
 * pushed from several threads while the owner drains are all delivered
 * once, each push wakes the owner until the wake is removed, a range that
 * cannot be queued turns into "everything", and a tensor watched on one
 * thread and freed on another reports its buffer.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/tensor.h>

#include "common/test_util.h"
#include "engine/core/hr_core.h"
#include "fabric/hr_fab_int.h"

#define THREADS 4
#define PER_THREAD 2000

typedef struct seen {
  uint64_t n;
  uint64_t sum; /* of the ranges' addresses */
  int everything;
} seen;

static void on_range(void *ctx, const void *ptr, uint64_t len) {
  seen *s = ctx;
  if (ptr == NULL && len == UINT64_MAX) {
    s->everything++;
    return;
  }
  assert_int_equal(len, 4096);
  s->n++;
  s->sum += (uint64_t)(uintptr_t)ptr;
}

static void on_wake(void *ctx) {
  atomic_fetch_add((atomic_int *)ctx, 1);
}

typedef struct pusher {
  hr__fab_track *t;
  unsigned id;
} pusher;

static void *push_many(void *arg) {
  pusher *p = arg;
  hr__fab_track *t = hr__fab_track_ref(p->t);
  for (unsigned i = 1; i <= PER_THREAD; i++)
    hr__fab_track_push(t, (void *)(uintptr_t)((p->id * PER_THREAD + i) << 12),
                       4096);
  hr__fab_track_unref(t);
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  hr__fab_track *t;
  atomic_int wakes;
  atomic_init(&wakes, 0);
  assert_int_equal(hr__fab_track_new(&t, hr_mem_default()), 0);
  hr__fab_track_set_wake(t, on_wake, &wakes);
  pthread_t th[THREADS];
  pusher ps[THREADS];
  for (unsigned k = 0; k < THREADS; k++) {
    ps[k].t = t;
    ps[k].id = k;
    assert_int_equal(pthread_create(&th[k], NULL, push_many, &ps[k]), 0);
  }
  seen s = {0, 0, 0};
  /* Drain while they push. */
  while (s.n < THREADS * PER_THREAD)
    hr__fab_track_drain(t, on_range, &s);
  for (unsigned k = 0; k < THREADS; k++)
    pthread_join(th[k], NULL);
  hr__fab_track_drain(t, on_range, &s);
  assert_int_equal(s.n, THREADS * PER_THREAD);
  uint64_t want = 0;
  for (uint64_t i = 1; i <= THREADS * PER_THREAD; i++)
    want += i << 12;
  assert_int_equal(s.sum, want);
  assert_int_equal(s.everything, 0);
  assert_int_equal(atomic_load(&wakes), THREADS * PER_THREAD);
  assert_false(hr__fab_track_pending(t));
  /* No wake any more once removed; pushes still queue. */
  hr__fab_track_set_wake(t, NULL, NULL);
  hr__fab_track_push(t, (void *)(uintptr_t)4096, 4096);
  assert_int_equal(atomic_load(&wakes), THREADS * PER_THREAD);
  assert_true(hr__fab_track_pending(t));
  /* The last reference frees what is still queued. */
  hr__fab_track_unref(t);
}

/* An allocator that fails once armed. */
static atomic_int refuse;
static void *f_malloc(size_t n, void *ud) {
  (void)ud;
  return atomic_load(&refuse) ? NULL : malloc(n);
}
static void f_free(void *p, void *ud) {
  (void)ud;
  free(p);
}
static void *f_calloc(size_t m, size_t n, void *ud) {
  (void)ud;
  return atomic_load(&refuse) ? NULL : calloc(m, n);
}
static void *f_realloc(void *p, size_t n, void *ud) {
  (void)ud;
  return realloc(p, n);
}

static void test_overflow(void **state) {
  (void)state;
  hr_mem m = {NULL, f_malloc, f_free, f_calloc, f_realloc};
  hr__fab_track *t;
  assert_int_equal(hr__fab_track_new(&t, &m), 0);
  hr__fab_track_push(t, (void *)(uintptr_t)8192, 4096);
  atomic_store(&refuse, 1);
  hr__fab_track_push(t, (void *)(uintptr_t)16384, 4096);
  atomic_store(&refuse, 0);
  seen s = {0, 0, 0};
  hr__fab_track_drain(t, on_range, &s);
  /* One range could not be queued: everything goes, once. */
  assert_int_equal(s.everything, 1);
  assert_int_equal(s.n, 0);
  hr__fab_track_drain(t, on_range, &s);
  assert_int_equal(s.everything, 1);
  hr__fab_track_unref(t);
}

static void tensor_freed(void *a, void *b, hr_tensor *tn) {
  (void)b;
  hr__fab_track_push(a, hr_tensor_buffer(tn, 0),
                     hr_tensor_descriptor(tn)->buffers[0].size_bytes);
}

static void *drop(void *arg) {
  hr_tensor_unref(arg);
  return NULL;
}

typedef struct one {
  const void *ptr;
  uint64_t len;
  int n;
} one;

static void on_one(void *ctx, const void *ptr, uint64_t len) {
  one *o = ctx;
  o->ptr = ptr;
  o->len = len;
  o->n++;
}

static void test_tensor_freed_elsewhere(void **state) {
  (void)state;
  hr__fab_track *t;
  assert_int_equal(hr__fab_track_new(&t, hr_mem_default()), 0);
  hr_descriptor d = tu_bytes_desc(4096, 0, HR_DEV_CPU);
  hr_tensor *tn;
  assert_int_equal(hr_tensor_alloc(&tn, &d, 12, NULL), 0);
  const void *buf = hr_tensor_buffer(tn, 0);
  assert_int_equal(hr__tensor_watch(tn, tensor_freed, t, NULL), 0);
  /* The same watcher again is not added twice. */
  assert_int_equal(hr__tensor_watch(tn, tensor_freed, t, NULL), 1);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, drop, tn), 0);
  pthread_join(th, NULL);
  one o = {NULL, 0, 0};
  hr__fab_track_drain(t, on_one, &o);
  assert_int_equal(o.n, 1);
  assert_ptr_equal(o.ptr, buf);
  assert_int_equal(o.len, 4096);
  hr__fab_track_unref(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_overflow),
      cmocka_unit_test(test_tensor_freed_elsewhere),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
