/*
 * The in-process channel: a bounded queue of handoffs (descriptor and
 * buffers by value, ADR-018 § 4 payload) from producers to consumers.
 *
 * Every message is an hr_handoff of the channel's ledger.  Its buffer
 * release drops the reference the channel took on the producer's tensor,
 * so the producer's own release runs when the last reference goes, and
 * the ledger's atomic guard makes the consumer's release exactly-once.
 *
 * The eventfd follows the queue: it is written when the queue becomes
 * non-empty (or the channel closes) and drained when the last message is
 * taken, both under the mutex, so "readable" means "a recv will not find
 * it empty" for a single consumer.
 */
#include <hurray/inproc.h>

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "hr_inproc_int.h"
#include "hr_internal.h"

struct hr_inproc_msg {
  hr_inproc_msg *next, *prev; /* the queue, then the received list */
  hr_inproc_chan *ch;
  hr_tensor *t; /* the channel's reference, dropped by the buffer release */
  hr_handoff *h;
};

struct hr_inproc_chan {
  hr_mem mem;
  hr_inproc_chan_config cfg;
  hr_handoff_ledger *ledger;
  int efd;
  pthread_mutex_t mu;
  pthread_cond_t room;  /* a slot freed, or closed */
  pthread_cond_t ready; /* a message queued, or closed */
  hr_inproc_msg *head, *tail;
  hr_inproc_msg *out; /* received and not deleted yet */
  uint32_t queued;    /* in the queue */
  uint32_t reserved;  /* slots taken by senders still cross-checking */
  int closed;
};

void hr_inproc_chan_config_default(hr_inproc_chan_config *c) {
  if (!c)
    return;
  memset(c, 0, sizeof *c);
  c->size = sizeof *c;
  c->capacity = 64;
  c->request.transport = HR_HANDOFF_IN_PROCESS;
}

static void efd_signal(int fd) {
  uint64_t one = 1;
  ssize_t n;
  do {
    n = write(fd, &one, sizeof one);
  } while (n < 0 && errno == EINTR);
}

static void efd_drain(int fd) {
  uint64_t v;
  ssize_t n;
  do {
    n = read(fd, &v, sizeof v);
  } while (n < 0 && errno == EINTR);
}

int hr_inproc_chan_new(hr_inproc_chan **out, const hr_inproc_chan_config *cfg,
                       const hr_mem *mem) {
  hr_inproc_chan_config c;
  hr_inproc_chan *ch;
  int rv;

  if (!out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  hr_inproc_chan_config_default(&c);
  if (cfg) {
    if (cfg->size < offsetof(hr_inproc_chan_config, wake_engine))
      return HR_ERR_INVALID_ARGUMENT;
    memcpy(&c, cfg, cfg->size < sizeof c ? cfg->size : sizeof c);
    c.size = sizeof c;
  }
  if (c.capacity == 0 || c.capacity > (1u << 20))
    return HR_ERR_INVALID_ARGUMENT;
  c.request.transport = HR_HANDOFF_IN_PROCESS;
  if (!mem)
    mem = hr_mem_default();
  ch = hr__mem_calloc(mem, 1, sizeof *ch);
  if (!ch)
    return HR_ERR_NOMEM;
  ch->mem = *mem;
  ch->cfg = c;
  rv = hr_handoff_ledger_new(&ch->ledger, mem);
  if (rv) {
    hr__mem_free(mem, ch);
    return rv;
  }
  ch->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ch->efd < 0) {
    hr_handoff_ledger_del(ch->ledger, NULL);
    hr__mem_free(mem, ch);
    return HR_ERR_IO;
  }
  {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&ch->mu, NULL);
    pthread_cond_init(&ch->room, &ca);
    pthread_cond_init(&ch->ready, &ca);
    pthread_condattr_destroy(&ca);
  }
  *out = ch;
  return 0;
}

const hr_handoff_request *hr_inproc_chan_request(const hr_inproc_chan *ch) {
  return ch ? &ch->cfg.request : NULL;
}

int hr_inproc_chan_fd(const hr_inproc_chan *ch) {
  return ch ? ch->efd : -1;
}

size_t hr_inproc_chan_pending(hr_inproc_chan *ch) {
  size_t n;
  if (!ch)
    return 0;
  pthread_mutex_lock(&ch->mu);
  n = ch->queued;
  pthread_mutex_unlock(&ch->mu);
  return n;
}

void hr_inproc_chan_counts(hr_inproc_chan *ch, hr_handoff_counts *c) {
  if (ch && c)
    hr_handoff_ledger_counts(ch->ledger, c);
}

/* The buffer release of every message: drops the channel's reference. */
static void msg_buffer_release(void *ctx) {
  hr_tensor_unref(ctx);
}

/* Deadline `timeout_ns` from now on CLOCK_MONOTONIC (the conds use it). */
static void deadline_of(int64_t timeout_ns, struct timespec *ts) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += (time_t)(timeout_ns / 1000000000);
  ts->tv_nsec += (long)(timeout_ns % 1000000000);
  if (ts->tv_nsec >= 1000000000) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000;
  }
}

static int cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu,
                           int64_t timeout_ns, const struct timespec *dl) {
  if (timeout_ns < 0)
    return pthread_cond_wait(cv, mu);
  return pthread_cond_timedwait(cv, mu, dl);
}

/* The handle and payload of `t` (hr_inproc_int.h: the pair describes its
 * answers the same way); the channel carries plain tensors only. */
static int describe(hr_tensor *t, const hr_handoff_payload *sync,
                    hr_buffer_handle *b, hr_handoff_payload *p,
                    hr_wire_status *st) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  int rv;

  if (d->layout.tag == HR_LAYOUT_COMPOSITE || d->buffer_count == 0)
    return HR_ERR_INVALID_ARGUMENT;
  rv = hr__inproc_describe(t, sync, b, p, st);
  if (rv)
    return rv;
  p->release = msg_buffer_release;
  p->release_ctx = t;
  return 0;
}

/* Hands the P2 event of a refused send back to its producer. */
static void give_back_event(const hr_handoff_payload *sync) {
  if (sync && sync->event_release)
    sync->event_release(sync->event_release_ctx);
}

static int send_common(hr_inproc_chan *ch, hr_tensor *t,
                       const hr_handoff_payload *sync, int block,
                       int64_t timeout_ns, hr_wire_status *st) {
  hr_buffer_handle b;
  hr_handoff_payload p;
  hr_inproc_msg *m;
  struct timespec dl;
  int rv;

  if (!ch || !t)
    return HR_ERR_INVALID_ARGUMENT;
  rv = describe(t, sync, &b, &p, st);
  if (rv == HR_ERR_PROTO)
    give_back_event(sync);
  if (rv)
    return rv;
  if (block && timeout_ns >= 0)
    deadline_of(timeout_ns, &dl);
  /* Reserve a slot first, so that a full channel refuses before anything
   * is taken over or called. */
  pthread_mutex_lock(&ch->mu);
  for (;;) {
    if (ch->closed) {
      pthread_mutex_unlock(&ch->mu);
      return HR_ERR_CLOSED;
    }
    if (ch->queued + ch->reserved < ch->cfg.capacity)
      break;
    if (!block) {
      pthread_mutex_unlock(&ch->mu);
      return HR_ERR_WOULDBLOCK;
    }
    if (cond_wait_until(&ch->room, &ch->mu, timeout_ns, &dl) == ETIMEDOUT &&
        ch->queued + ch->reserved >= ch->cfg.capacity && !ch->closed) {
      pthread_mutex_unlock(&ch->mu);
      return HR_ERR_TIMEOUT;
    }
  }
  ch->reserved++;
  pthread_mutex_unlock(&ch->mu);

  m = hr__mem_calloc(&ch->mem, 1, sizeof *m);
  if (!m) {
    give_back_event(sync);
    rv = HR_ERR_NOMEM;
  } else {
    /* The reference the buffer release drops; on a refusal
     * hr_handoff_accept() calls the release (and the event release)
     * itself, which gives both back. */
    hr_tensor_ref(t);
    rv = hr_handoff_accept(ch->ledger, &ch->cfg.request, &b, &p, &m->h, st);
    if (rv) {
      hr__mem_free(&ch->mem, m);
      m = NULL;
    }
  }

  pthread_mutex_lock(&ch->mu);
  ch->reserved--;
  if (m && ch->closed) {
    /* Closed while we cross-checked: the consumer will never see it. */
    pthread_mutex_unlock(&ch->mu);
    if (hr_handoff_sync_mode(m->h) == HR_SYNC_EVENT)
      hr_handoff_release_event(m->h);
    hr_handoff_release_buffer(m->h);
    hr_handoff_del(m->h);
    hr__mem_free(&ch->mem, m);
    return HR_ERR_CLOSED;
  }
  if (m) {
    m->ch = ch;
    m->t = t;
    if (ch->tail)
      ch->tail->next = m;
    else
      ch->head = m;
    ch->tail = m;
    if (ch->queued++ == 0)
      efd_signal(ch->efd);
    pthread_cond_signal(&ch->ready);
    if (ch->cfg.wake_engine)
      hr_engine_wakeup(ch->cfg.wake_engine);
  } else {
    pthread_cond_signal(&ch->room);
  }
  pthread_mutex_unlock(&ch->mu);
  return rv;
}

int hr_inproc_send(hr_inproc_chan *ch, hr_tensor *t,
                   const hr_handoff_payload *sync, hr_wire_status *st) {
  return send_common(ch, t, sync, 0, 0, st);
}

int hr_inproc_send_wait(hr_inproc_chan *ch, hr_tensor *t,
                        const hr_handoff_payload *sync, int64_t timeout_ns,
                        hr_wire_status *st) {
  return send_common(ch, t, sync, 1, timeout_ns, st);
}

void hr_inproc_chan_close(hr_inproc_chan *ch) {
  if (!ch)
    return;
  pthread_mutex_lock(&ch->mu);
  if (!ch->closed) {
    ch->closed = 1;
    if (ch->queued == 0)
      efd_signal(ch->efd);
    pthread_cond_broadcast(&ch->ready);
    pthread_cond_broadcast(&ch->room);
    if (ch->cfg.wake_engine)
      hr_engine_wakeup(ch->cfg.wake_engine);
  }
  pthread_mutex_unlock(&ch->mu);
}

static int recv_common(hr_inproc_chan *ch, hr_inproc_msg **out, int block,
                       int64_t timeout_ns) {
  struct timespec dl;
  hr_inproc_msg *m;

  if (!ch || !out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (block && timeout_ns >= 0)
    deadline_of(timeout_ns, &dl);
  pthread_mutex_lock(&ch->mu);
  while (!ch->head) {
    if (ch->closed) {
      pthread_mutex_unlock(&ch->mu);
      return HR_ERR_CLOSED;
    }
    if (!block) {
      pthread_mutex_unlock(&ch->mu);
      return HR_ERR_WOULDBLOCK;
    }
    if (cond_wait_until(&ch->ready, &ch->mu, timeout_ns, &dl) == ETIMEDOUT &&
        !ch->head && !ch->closed) {
      pthread_mutex_unlock(&ch->mu);
      return HR_ERR_TIMEOUT;
    }
  }
  m = ch->head;
  ch->head = m->next;
  if (!ch->head)
    ch->tail = NULL;
  m->prev = NULL;
  m->next = ch->out;
  if (ch->out)
    ch->out->prev = m;
  ch->out = m;
  /* The last message taken: the fd stops being readable (a closed
   * channel stays readable, so the consumer sees the end). */
  if (--ch->queued == 0 && !ch->closed)
    efd_drain(ch->efd);
  pthread_cond_signal(&ch->room);
  pthread_mutex_unlock(&ch->mu);
  *out = m;
  return 0;
}

int hr_inproc_recv(hr_inproc_chan *ch, hr_inproc_msg **out) {
  return recv_common(ch, out, 0, 0);
}

int hr_inproc_recv_wait(hr_inproc_chan *ch, hr_inproc_msg **out,
                        int64_t timeout_ns) {
  return recv_common(ch, out, 1, timeout_ns);
}

hr_tensor *hr_inproc_msg_tensor(const hr_inproc_msg *m) {
  return m ? m->t : NULL;
}

hr_handoff *hr_inproc_msg_handoff(const hr_inproc_msg *m) {
  return m ? m->h : NULL;
}

int hr_inproc_msg_release(hr_inproc_msg *m) {
  if (!m)
    return HR_ERR_INVALID_ARGUMENT;
  return hr_handoff_release_buffer(m->h);
}

void hr_inproc_msg_del(hr_inproc_msg *m) {
  hr_inproc_chan *ch;

  if (!m)
    return;
  ch = m->ch;
  pthread_mutex_lock(&ch->mu);
  if (m->prev)
    m->prev->next = m->next;
  else
    ch->out = m->next;
  if (m->next)
    m->next->prev = m->prev;
  pthread_mutex_unlock(&ch->mu);
  hr_handoff_del(m->h);
  hr__mem_free(&ch->mem, m);
}

int hr_inproc_chan_del(hr_inproc_chan *ch, hr_handoff_counts *final) {
  hr_inproc_msg *m, *next;
  hr_mem mem;
  int rv;

  if (!ch)
    return 0;
  /* Queued messages were never handed to a consumer: release them here,
   * event first, as a consumer that gave up on them would. */
  for (m = ch->head; m; m = next) {
    next = m->next;
    if (hr_handoff_sync_mode(m->h) == HR_SYNC_EVENT)
      hr_handoff_release_event(m->h);
    hr_handoff_release_buffer(m->h);
    hr_handoff_del(m->h);
    hr__mem_free(&ch->mem, m);
  }
  /* Received ones: the ledger destroys their handoffs (counting the
   * missing releases); only our wrappers are left to free. */
  for (m = ch->out; m; m = next) {
    next = m->next;
    hr__mem_free(&ch->mem, m);
  }
  rv = hr_handoff_ledger_del(ch->ledger, final);
  close(ch->efd);
  pthread_cond_destroy(&ch->room);
  pthread_cond_destroy(&ch->ready);
  pthread_mutex_destroy(&ch->mu);
  mem = ch->mem;
  hr__mem_free(&mem, ch);
  return rv;
}
