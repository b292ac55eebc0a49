/*
 * The invalidation tracker: memory released on any thread (a tensor freed
 * by its last hr_tensor_unref(), wherever that runs) is queued here and
 * its registrations are closed on the fabric's own thread, before the
 * fabric registers anything again.  The tracker is reference-counted so
 * that a tensor outliving its engine and fabric can still report into it
 * harmlessly.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "hr_fab_int.h"

typedef struct range {
  struct range *next;
  const void *ptr;
  uint64_t len;
} range;

struct hr__fab_track {
  hr_mem mem;
  atomic_uint refs;
  atomic_int pending; /* ranges (or an overflow) are queued */
  pthread_mutex_t mu; /* guards the fields below */
  range *head;
  int overflow; /* a range could not be queued: everything goes */
  void (*wake)(void *ctx);
  void *wake_ctx;
};

int hr__fab_track_new(hr__fab_track **out, const hr_mem *mem) {
  hr__fab_track *t = hr__mem_calloc(mem, 1, sizeof *t);
  if (!t)
    return HR_ERR_NOMEM;
  if (pthread_mutex_init(&t->mu, NULL) != 0) {
    hr__mem_free(mem, t);
    return HR_ERR_NOMEM;
  }
  t->mem = *mem;
  atomic_init(&t->refs, 1);
  atomic_init(&t->pending, 0);
  *out = t;
  return 0;
}

void *hr__fab_track_ref(hr__fab_track *t) {
  if (t)
    atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
  return t;
}

void hr__fab_track_unref(hr__fab_track *t) {
  if (!t || atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) != 1)
    return;
  while (t->head) {
    range *r = t->head;
    t->head = r->next;
    hr__mem_free(&t->mem, r);
  }
  pthread_mutex_destroy(&t->mu);
  hr_mem mem = t->mem;
  hr__mem_free(&mem, t);
}

void hr__fab_track_push(hr__fab_track *t, const void *ptr, uint64_t len) {
  if (!t || len == 0)
    return;
  range *r = hr__mem_calloc(&t->mem, 1, sizeof *r);
  pthread_mutex_lock(&t->mu);
  if (r) {
    r->ptr = ptr;
    r->len = len;
    r->next = t->head;
    t->head = r;
  } else {
    t->overflow = 1; /* safe, if costly: every registration goes */
  }
  atomic_store_explicit(&t->pending, 1, memory_order_release);
  /* Under the lock: hr__fab_track_set_wake(NULL) waits for this call. */
  if (t->wake)
    t->wake(t->wake_ctx);
  pthread_mutex_unlock(&t->mu);
}

int hr__fab_track_pending(const hr__fab_track *t) {
  return t && atomic_load_explicit(&((hr__fab_track *)t)->pending,
                                   memory_order_acquire);
}

void hr__fab_track_drain(hr__fab_track *t,
                         void (*fn)(void *ctx, const void *ptr, uint64_t len),
                         void *ctx) {
  if (!hr__fab_track_pending(t))
    return;
  pthread_mutex_lock(&t->mu);
  range *head = t->head;
  int overflow = t->overflow;
  t->head = NULL;
  t->overflow = 0;
  atomic_store_explicit(&t->pending, 0, memory_order_release);
  pthread_mutex_unlock(&t->mu);
  if (overflow)
    fn(ctx, NULL, UINT64_MAX);
  while (head) {
    range *r = head;
    head = r->next;
    if (!overflow)
      fn(ctx, r->ptr, r->len);
    hr__mem_free(&t->mem, r);
  }
}

void hr__fab_track_set_wake(hr__fab_track *t, void (*wake)(void *ctx),
                            void *ctx) {
  if (!t)
    return;
  pthread_mutex_lock(&t->mu);
  t->wake = wake;
  t->wake_ctx = ctx;
  pthread_mutex_unlock(&t->mu);
}
