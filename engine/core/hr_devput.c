/*
 * Parked callbacks of client PUTs (decisions 75 and 78).
 *
 * A client PUT of a device tensor that ends early (cancel, a staging
 * failure, the connection lost) while staging copies from its device
 * buffers are still in flight, or while the fabric may still read them
 * (a GPUDirect source whose operation is not reported finished yet): the
 * application must not hear "done" while the device memory it handed in
 * may still be read (ADR-018 § 5).  The PUT's callback is parked in a
 * tail that the copies and the fabric's hold keep; the last one to let go
 * fires it, on the driving thread, after it dropped its reference to the
 * tensor.
 *
 * A PUT that ends inside the call that queued it (hr_session_put(), or
 * any request call; a staging failure found at once) never calls back
 * from inside that call: its tail becomes due, the session reports an
 * expired deadline (hr_session_get_expiry() returns the session's clock)
 * and hr_session_handle_expiry() or hr_session_terminate() fires it.  So
 * the application has its stream id and its context stored before its
 * callback can run.  The tail such a PUT may need is allocated by
 * hr_session_put() itself (hr__put_tail_reserve), so that no allocation
 * can fail at the moment it is needed.
 *
 * A session deleted meanwhile fires its parked callbacks during the
 * delete, as it does every other callback; the tails still held become
 * orphans (no session), freed by whatever lets go of them last, and the
 * tensor's own release still comes after the copies and the fabric.
 */
#include <string.h>

#include "hr_session_int.h"

struct hr_put_tail {
  hr_session *s;            /* NULL once the session was deleted */
  hr_mem mem;               /* to free an orphan */
  struct hr_put_tail *next; /* the session's parked tails */
  hr_put_cb cb;
  void *ud;
  uint32_t id;
  unsigned refs; /* copies in flight and fabric holds */
  int fired;
  int due; /* let go of inside a request call: fires at the next step */
  size_t key_cap;
  hr_transfer_record rec;
  uint8_t key[]; /* rec.key points here */
};

static hr_put_tail *tail_alloc(hr_session *s, size_t key_len) {
  size_t cap = key_len ? key_len : 1;
  hr_put_tail *t = hr__mem_malloc(&s->mem, sizeof *t + cap);
  if (t) {
    memset(t, 0, sizeof *t);
    t->key_cap = cap;
  }
  return t;
}

int hr__put_tail_reserve(hr_session *s, hr_stream *st, size_t key_len) {
  if (st->put_spare)
    return 0;
  st->put_spare = tail_alloc(s, key_len);
  return st->put_spare ? 0 : HR_ERR_NOMEM;
}

void hr__put_tail_unreserve(hr_session *s, hr_stream *st) {
  hr__mem_free(&s->mem, st->put_spare);
  st->put_spare = NULL;
}

hr_put_tail *hr__put_tail_new(hr_session *s, hr_stream *st, unsigned refs) {
  hr_put_tail *t = st->put_spare;
  if (t && t->key_cap >= st->rec.key_len)
    st->put_spare = NULL;
  else
    t = tail_alloc(s, st->rec.key_len);
  if (!t)
    return NULL;
  t->s = s;
  t->mem = s->mem;
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
  if (refs == 0) {
    t->due = 1;
    s->put_due++;
  }
  return t;
}

void hr__put_tail_hold(hr_put_tail *t) {
  t->refs++;
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
      if (t->due)
        t->s->put_due--;
      return;
    }
}

/* Fires and frees `t`.  The call is bracketed like a public one: a drop
 * may come from the fabric's progress, outside any session call, and the
 * callback may delete the session (deferred to the bracket's end). */
static void finish(hr_put_tail *t) {
  hr_session *s = t->s;
  hr_mem mem = t->mem;
  hr__api_enter(s);
  unlink_tail(t);
  if (!t->fired)
    fire(t);
  hr__mem_free(&mem, t);
  hr__api_leave(s);
}

void hr__put_tail_drop(hr_put_tail *t) {
  if (!t || --t->refs > 0)
    return;
  hr_session *s = t->s;
  if (!s) {
    hr_mem mem = t->mem;
    hr__mem_free(&mem, t); /* an orphan: fired by the delete */
    return;
  }
  if (s->req_calls && !t->fired) {
    t->due = 1;
    s->put_due++;
    return;
  }
  finish(t);
}

void hr__put_tails_forget(hr_session *s, uint32_t id) {
  for (hr_put_tail *t = s->put_tails; t; t = t->next)
    if (t->id == id && !t->fired) {
      /* Nothing to call: the tail still waits for its holders, or for
       * the next step when due, and is then freed silently. */
      t->fired = 1;
      t->cb = NULL;
    }
}

void hr__put_tails_run_due(hr_session *s) {
  while (s->put_due && !s->req_calls && !s->deleted) {
    hr_put_tail *t = s->put_tails;
    while (t && !t->due)
      t = t->next;
    if (!t)
      break;
    finish(t);
  }
}

void hr__put_tails_flush(hr_session *s) {
  /* A callback may queue or end other PUTs: start over after each. */
  for (int again = 1; again;) {
    again = 0;
    for (hr_put_tail *t = s->put_tails; t; t = t->next)
      if (!t->fired) {
        fire(t);
        again = 1;
        break;
      }
  }
  while (s->put_tails) {
    hr_put_tail *t = s->put_tails;
    s->put_tails = t->next;
    t->s = NULL;
    if (t->refs == 0)
      hr__mem_free(&s->mem, t);
  }
  s->put_due = 0;
}

int hr_session_callbacks_parked(const hr_session *s) {
  if (!s)
    return 0;
  for (const hr_put_tail *t = s->put_tails; t; t = t->next)
    if (t->refs && !t->fired)
      return 1;
  return 0;
}
