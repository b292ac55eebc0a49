/*
 * A client PUT of a device tensor that ends early (cancel, a staging
 * failure, the connection lost) while staging copies from its device
 * buffers are still in flight: the application must not hear "done"
 * while the device may still read the buffer it handed in (ADR-018 § 5,
 * decision 75).  The PUT's callback is parked in a tail that the
 * in-flight copies hold; the last one to land fires it, on the loop
 * thread, after it dropped its reference to the tensor.  A session
 * deleted meanwhile fires its parked callbacks during the delete, as it
 * does every other callback; the tensor's own release still comes after
 * the copies.
 */
#include <string.h>

#include "hr_session_int.h"

struct hr_put_tail {
  hr_session *s;
  struct hr_put_tail *next; /* the session's parked tails */
  hr_put_cb cb;
  void *ud;
  uint32_t id;
  unsigned refs; /* copies still in flight */
  int fired;
  hr_transfer_record rec;
  uint8_t key[]; /* rec.key points here */
};

hr_put_tail *hr__put_tail_new(hr_session *s, hr_stream *st, unsigned refs) {
  hr_put_tail *t = hr__mem_malloc(
      &s->mem, sizeof *t + (st->rec.key_len ? st->rec.key_len : 1));
  if (!t)
    return NULL;
  memset(t, 0, sizeof *t);
  t->s = s;
  t->cb = st->put_cb;
  t->ud = st->cb_ud;
  t->id = st->id;
  t->refs = refs;
  t->rec = st->rec;
  if (st->rec.key_len)
    memcpy(t->key, st->rec.key, st->rec.key_len);
  t->rec.key = t->key;
  /* A PUT record has no partial table; nothing else points into st. */
  t->rec.partial = NULL;
  t->rec.partial_count = 0;
  t->next = s->put_tails;
  s->put_tails = t;
  return t;
}

static void fire(hr_put_tail *t) {
  hr_session *s = t->s;
  t->fired = 1;
  hr__report_transfer(s, &t->rec);
  if (t->cb) {
    hr__cb_enter(s);
    t->cb(s, t->id, &t->rec, t->ud);
    hr__cb_leave(s);
  }
}

static void unlink_tail(hr_put_tail *t) {
  for (hr_put_tail **pp = &t->s->put_tails; *pp; pp = &(*pp)->next)
    if (*pp == t) {
      *pp = t->next;
      return;
    }
}

void hr__put_tail_drop(hr_put_tail *t) {
  if (!t || --t->refs > 0)
    return;
  hr_session *s = t->s;
  unlink_tail(t);
  if (!t->fired && !s->deleted)
    fire(t);
  hr__mem_free(&s->mem, t);
}

void hr__put_tails_flush(hr_session *s) {
  for (hr_put_tail *t = s->put_tails; t; t = t->next)
    if (!t->fired)
      fire(t);
}
