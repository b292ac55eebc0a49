/*
 * The ADR-018 handoff contract: the § 6 capability query, the reader's
 * sync_mode check, the C ABI cross-check of § 4, the ledger that makes the
 * two exactly-once releases of § 5 observable, and the producer and
 * consumer helpers that apply the rules per mode.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <hurray/handoff.h>

#include "hr_gpu_int.h"

#define ALL_MODES                                                              \
  (HR_SYNC_BIT(HR_SYNC_PRODUCER_SYNCED) | HR_SYNC_BIT(HR_SYNC_EVENT) |        \
   HR_SYNC_BIT(HR_SYNC_CONSUMER_STREAM))
#define HANDLE_SYNC_OFFSET 13u
#define ISM HR_WIRE_INVALID_SYNC_MODE

struct hr_handoff_ledger {
  hr_mem mem;
  pthread_mutex_t mu;
  hr_handoff *live; /* doubly linked, guarded by mu */
  atomic_uint_fast64_t accepted, rejected, buffer_releases, event_releases,
      double_releases, missing_releases, live_count;
};

struct hr_handoff {
  hr_handoff_ledger *l;
  hr_handoff *prev, *next; /* in l->live, guarded by l->mu */
  hr_buffer_handle bh;
  hr_handoff_payload p;
  /* The consumer's reference plus one per pending deferred release. */
  atomic_int refs;
  atomic_int buffer_released; /* exactly-once guards */
  atomic_int event_released;
  atomic_int release_pending; /* hr_handoff_release_after() was called */
};

/* Reports a contract violation.  Counting happens in every build; the
 * message only in debug builds, where a developer is there to read it. */
static void report(const hr_handoff *h, const char *what) {
#ifndef NDEBUG
  fprintf(stderr, "hurray: handoff %p (sync_mode %s): %s\n", (const void *)h,
          hr_sync_mode_name(h->bh.sync_mode), what);
#else
  (void)h;
  (void)what;
#endif
}

/* ---- capability query and reader check (§§ 3, 6) ---------------------- */

static int tag_valid(uint8_t tag) {
  return tag <= HR_DEV_LAST || (tag >= 0xF0 && tag != HR_DEV_INVALID);
}

unsigned hr_sync_modes_available(uint8_t device_tag, uint32_t cap_flags,
                                 int transport) {
  if (!tag_valid(device_tag))
    return 0;
  unsigned p1 = HR_SYNC_BIT(HR_SYNC_PRODUCER_SYNCED);
  switch (transport) {
  case HR_HANDOFF_NETWORK:
    return p1;
  case HR_HANDOFF_IN_PROCESS:
    return device_tag == HR_DEV_CPU ? p1 : ALL_MODES;
  case HR_HANDOFF_IPC:
    if (device_tag == HR_DEV_CPU)
      return p1;
    /* A device buffer crosses a process boundary only as exported memory:
     * without it no mode is valid and the producer stages through the
     * host (ADR-018 § 6). */
    if (!(cap_flags & (HR_GPU_CAP_IPC_MEM | HR_GPU_CAP_IPC_FD)))
      return 0;
    return p1 |
           ((cap_flags & HR_GPU_CAP_IPC_EVENT) ? HR_SYNC_BIT(HR_SYNC_EVENT)
                                               : 0) |
           ((cap_flags & HR_GPU_CAP_IPC_STREAM)
                ? HR_SYNC_BIT(HR_SYNC_CONSUMER_STREAM)
                : 0);
  default:
    return 0;
  }
}

unsigned hr_gpu_sync_modes(const hr_gpu *g, int transport) {
  hr_gpu_caps caps;
  if (hr_gpu_query(g, &caps) != 0)
    return 0;
  return hr_sync_modes_available(caps.device_tag, caps.flags, transport);
}

int hr_sync_mode_choose(unsigned mask, int have_consumer_stream) {
  if (have_consumer_stream && (mask & HR_SYNC_BIT(HR_SYNC_CONSUMER_STREAM)))
    return HR_SYNC_CONSUMER_STREAM;
  if (mask & HR_SYNC_BIT(HR_SYNC_EVENT))
    return HR_SYNC_EVENT;
  if (mask & HR_SYNC_BIT(HR_SYNC_PRODUCER_SYNCED))
    return HR_SYNC_PRODUCER_SYNCED;
  return -1;
}

/* The modes a transport allows when the request names none. */
static unsigned default_modes(int transport) {
  return transport == HR_HANDOFF_IN_PROCESS
             ? ALL_MODES
             : HR_SYNC_BIT(HR_SYNC_PRODUCER_SYNCED);
}

static int check_mode(const hr_buffer_handle *b, int transport,
                      unsigned allowed, hr_wire_status *st) {
  if (b->sync_mode > HR_SYNC_CONSUMER_STREAM)
    return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                         "buffer.sync_mode: reserved or invalid value");
  if (transport != HR_HANDOFF_NETWORK && transport != HR_HANDOFF_IN_PROCESS &&
      transport != HR_HANDOFF_IPC)
    return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                         "buffer.sync_mode: unknown transport");
  if (b->sync_mode != HR_SYNC_PRODUCER_SYNCED && b->device_tag == HR_DEV_CPU)
    return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                         "buffer.sync_mode: CPU buffers require "
                         "PRODUCER_SYNCED");
  if (b->sync_mode != HR_SYNC_PRODUCER_SYNCED &&
      transport == HR_HANDOFF_NETWORK)
    return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                         "buffer.sync_mode: only PRODUCER_SYNCED on a "
                         "network transport");
  if (!(allowed & HR_SYNC_BIT(b->sync_mode)))
    return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                         "buffer.sync_mode: not valid on this transport or "
                         "not accepted by the consumer");
  return 0;
}

int hr_sync_mode_check(const hr_buffer_handle *b, int transport,
                       hr_wire_status *st) {
  if (!b)
    return HR_ERR_INVALID_ARGUMENT;
  return check_mode(b, transport, default_modes(transport), st);
}

/* ---- the C ABI cross-check (§ 4) --------------------------------------- */

int hr_handoff_check(const hr_handoff_request *req,
                     const hr_buffer_handle *b, const hr_handoff_payload *p,
                     hr_wire_status *st) {
  if (!req || !b || !p)
    return HR_ERR_INVALID_ARGUMENT;
  unsigned allowed = default_modes(req->transport);
  if (req->accept_modes) {
    unsigned max = req->transport == HR_HANDOFF_NETWORK
                       ? HR_SYNC_BIT(HR_SYNC_PRODUCER_SYNCED)
                       : ALL_MODES;
    allowed = req->accept_modes & max;
  }
  int rv = check_mode(b, req->transport, allowed, st);
  if (rv != 0)
    return rv;
  switch (b->sync_mode) {
  case HR_SYNC_PRODUCER_SYNCED:
    if (p->sync_handle || p->event_release || p->ordered_stream)
      return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                           "handoff: PRODUCER_SYNCED carries no event or "
                           "stream");
    return 0;
  case HR_SYNC_EVENT:
    if (!p->sync_handle || !p->event_release)
      return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                           "handoff: SYNC_EVENT needs sync_handle and "
                           "event_release");
    if (p->sync_handle_device_tag != b->device_tag)
      return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                           "handoff: sync_handle_device_tag differs from the "
                           "buffer's device_tag");
    if (p->ordered_stream)
      return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                           "handoff: SYNC_EVENT carries no stream");
    return 0;
  default: /* HR_SYNC_CONSUMER_STREAM */
    if (!req->consumer_stream)
      return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                           "handoff: SYNC_CONSUMER_STREAM without a consumer "
                           "stream in the request");
    if (req->consumer_stream_device_tag != b->device_tag)
      return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                           "handoff: consumer stream of another device type");
    if (p->ordered_stream != req->consumer_stream)
      return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                           "handoff: SYNC_CONSUMER_STREAM ordered another "
                           "stream than the consumer's");
    if (p->sync_handle || p->event_release)
      return hr__wire_fail(st, ISM, HANDLE_SYNC_OFFSET,
                           "handoff: SYNC_CONSUMER_STREAM carries no event");
    return 0;
  }
}

/* ---- ledger ------------------------------------------------------------ */

int hr_handoff_ledger_new(hr_handoff_ledger **out, const hr_mem *mem) {
  if (!out)
    return HR_ERR_INVALID_ARGUMENT;
  if (!mem)
    mem = hr_mem_default();
  hr_handoff_ledger *l = hr__mem_calloc(mem, 1, sizeof *l);
  if (!l)
    return HR_ERR_NOMEM;
  l->mem = *mem;
  if (pthread_mutex_init(&l->mu, NULL) != 0) {
    hr__mem_free(mem, l);
    return HR_ERR_NOMEM;
  }
  atomic_init(&l->accepted, 0);
  atomic_init(&l->rejected, 0);
  atomic_init(&l->buffer_releases, 0);
  atomic_init(&l->event_releases, 0);
  atomic_init(&l->double_releases, 0);
  atomic_init(&l->missing_releases, 0);
  atomic_init(&l->live_count, 0);
  *out = l;
  return 0;
}

void hr_handoff_ledger_counts(hr_handoff_ledger *l, hr_handoff_counts *c) {
  if (!l || !c)
    return;
  c->accepted = atomic_load(&l->accepted);
  c->rejected = atomic_load(&l->rejected);
  c->buffer_releases = atomic_load(&l->buffer_releases);
  c->event_releases = atomic_load(&l->event_releases);
  c->double_releases = atomic_load(&l->double_releases);
  c->missing_releases = atomic_load(&l->missing_releases);
  c->live = atomic_load(&l->live_count);
}

/* Counts the releases `h` never got. */
static void count_missing(hr_handoff *h) {
  hr_handoff_ledger *l = h->l;
  if (!atomic_load(&h->buffer_released)) {
    atomic_fetch_add(&l->missing_releases, 1);
    report(h, "buffer never released");
  }
  if (h->bh.sync_mode == HR_SYNC_EVENT && !atomic_load(&h->event_released)) {
    atomic_fetch_add(&l->missing_releases, 1);
    report(h, "event never released");
  }
}

/* Unlinks and frees; l->mu held by the caller when `locked`. */
static void destroy(hr_handoff *h, int locked) {
  hr_handoff_ledger *l = h->l;
  count_missing(h);
  if (!locked)
    pthread_mutex_lock(&l->mu);
  if (h->prev)
    h->prev->next = h->next;
  else
    l->live = h->next;
  if (h->next)
    h->next->prev = h->prev;
  if (!locked)
    pthread_mutex_unlock(&l->mu);
  atomic_fetch_sub(&l->live_count, 1);
  hr__mem_free(&l->mem, h);
}

int hr_handoff_ledger_del(hr_handoff_ledger *l, hr_handoff_counts *final) {
  if (!l)
    return 0;
  int rv = 0;
  pthread_mutex_lock(&l->mu);
  while (l->live) {
    rv = HR_ERR_BUSY;
    destroy(l->live, 1);
  }
  pthread_mutex_unlock(&l->mu);
  hr_handoff_ledger_counts(l, final);
  pthread_mutex_destroy(&l->mu);
  hr_mem mem = l->mem;
  hr__mem_free(&mem, l);
  return rv;
}

/* ---- handoffs ---------------------------------------------------------- */

/* Gives the producer its resources back after a refusal. */
static void hand_back(const hr_handoff_payload *p) {
  if (p->event_release)
    p->event_release(p->event_release_ctx);
  if (p->release)
    p->release(p->release_ctx);
}

int hr_handoff_accept(hr_handoff_ledger *l, const hr_handoff_request *req,
                      const hr_buffer_handle *b, const hr_handoff_payload *p,
                      hr_handoff **out, hr_wire_status *st) {
  if (!l || !req || !b || !p || !out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  int rv = hr_handoff_check(req, b, p, st);
  if (rv != 0) {
    atomic_fetch_add(&l->rejected, 1);
    hand_back(p);
    return rv;
  }
  hr_handoff *h = hr__mem_calloc(&l->mem, 1, sizeof *h);
  if (!h) {
    hand_back(p);
    return HR_ERR_NOMEM;
  }
  h->l = l;
  h->bh = *b;
  h->p = *p;
  atomic_init(&h->refs, 1);
  atomic_init(&h->buffer_released, 0);
  atomic_init(&h->event_released, 0);
  atomic_init(&h->release_pending, 0);
  pthread_mutex_lock(&l->mu);
  h->next = l->live;
  if (l->live)
    l->live->prev = h;
  l->live = h;
  pthread_mutex_unlock(&l->mu);
  atomic_fetch_add(&l->live_count, 1);
  atomic_fetch_add(&l->accepted, 1);
  *out = h;
  return 0;
}

int hr_handoff_acquire(hr_handoff_ledger *l, const hr_handoff_request *req,
                       hr_handoff_produce_fn produce, void *user,
                       hr_handoff **out, hr_wire_status *st) {
  if (!l || !req || !produce || !out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  hr_buffer_handle b;
  hr_handoff_payload p;
  memset(&b, 0, sizeof b);
  memset(&p, 0, sizeof p);
  int rv = produce(user, req, &b, &p);
  if (rv != 0)
    return rv;
  return hr_handoff_accept(l, req, &b, &p, out, st);
}

const hr_buffer_handle *hr_handoff_handle(const hr_handoff *h) {
  return h ? &h->bh : NULL;
}
uint8_t hr_handoff_sync_mode(const hr_handoff *h) {
  return h ? h->bh.sync_mode : HR_SYNC_INVALID;
}
void *hr_handoff_ptr(const hr_handoff *h) { return h ? h->p.ptr : NULL; }
void *hr_handoff_sync_handle(const hr_handoff *h) {
  return h ? h->p.sync_handle : NULL;
}
void *hr_handoff_consumer_stream(const hr_handoff *h) {
  return h ? h->p.ordered_stream : NULL;
}

static void unref(hr_handoff *h) {
  if (atomic_fetch_sub(&h->refs, 1) == 1)
    destroy(h, 0);
}

void hr_handoff_del(hr_handoff *h) {
  if (h)
    unref(h);
}

int hr_handoff_release_event(hr_handoff *h) {
  if (!h || h->bh.sync_mode != HR_SYNC_EVENT)
    return HR_ERR_INVALID_ARGUMENT;
  if (atomic_exchange(&h->event_released, 1)) {
    atomic_fetch_add(&h->l->double_releases, 1);
    report(h, "event released twice");
    return HR_ERR_STATE;
  }
  atomic_fetch_add(&h->l->event_releases, 1);
  h->p.event_release(h->p.event_release_ctx);
  return 0;
}

int hr_handoff_release_buffer(hr_handoff *h) {
  if (!h)
    return HR_ERR_INVALID_ARGUMENT;
  if (atomic_exchange(&h->buffer_released, 1)) {
    atomic_fetch_add(&h->l->double_releases, 1);
    report(h, "buffer released twice");
    return HR_ERR_STATE;
  }
  /* The end of the buffer's use implies the consumer's waits were issued
   * long ago; an event still held then is a missing release, which is
   * made now so that the producer is not left holding it forever. */
  if (h->bh.sync_mode == HR_SYNC_EVENT &&
      !atomic_exchange(&h->event_released, 1)) {
    atomic_fetch_add(&h->l->missing_releases, 1);
    report(h, "buffer released before the event");
    h->p.event_release(h->p.event_release_ctx);
  }
  atomic_fetch_add(&h->l->buffer_releases, 1);
  if (h->p.release)
    h->p.release(h->p.release_ctx);
  return 0;
}

/* ---- consumer helpers (§§ 2, 5) ---------------------------------------- */

/* Makes `waiter` wait for everything enqueued so far on `src`. */
static int order_after(hr_gpu *g, hr_gpu_stream *waiter, hr_gpu_stream *src) {
  hr_gpu_event *e;
  int rv = hr_gpu_event_new(g, 0, &e);
  if (rv != 0)
    return rv;
  rv = hr_gpu_event_record(e, src);
  if (rv == 0)
    rv = hr_gpu_stream_wait_event(waiter, e);
  /* The wait captured the recorded point: the event may go now. */
  hr_gpu_event_del(e);
  return rv;
}

static int device_matches(hr_handoff *h, hr_gpu *g) {
  hr_gpu_caps caps;
  if (hr_gpu_query(g, &caps) != 0)
    return HR_ERR_INVALID_ARGUMENT;
  return caps.device_tag == h->bh.device_tag ? 0 : HR_ERR_UNSUPPORTED;
}

int hr_handoff_consume(hr_handoff *h, hr_gpu *g, hr_gpu_stream *const *streams,
                       size_t n) {
  if (!h || (n && !streams))
    return HR_ERR_INVALID_ARGUMENT;
  for (size_t i = 0; i < n; i++)
    if (!streams[i] || hr_gpu_stream_device(streams[i]) != g)
      return HR_ERR_INVALID_ARGUMENT;
  if (h->bh.sync_mode == HR_SYNC_PRODUCER_SYNCED)
    return 0;
  if (!g)
    return HR_ERR_INVALID_ARGUMENT;
  int rv = device_matches(h, g);
  if (rv != 0)
    return rv;
  if (h->bh.sync_mode == HR_SYNC_EVENT) {
    if (atomic_load(&h->event_released))
      return HR_ERR_STATE;
    hr_gpu_event *ev;
    rv = hr_gpu_event_wrap(g, h->p.sync_handle, &ev);
    if (rv != 0)
      return rv;
    if (n == 0)
      rv = hr_gpu_event_sync(ev);
    for (size_t i = 0; i < n && rv == 0; i++)
      rv = hr_gpu_stream_wait_event(streams[i], ev);
    hr_gpu_event_del(ev);
    if (rv != 0)
      return rv;
    return hr_handoff_release_event(h);
  }
  /* SYNC_CONSUMER_STREAM: the ordered stream may use the buffer; every
   * other stream needs an inter-stream wait first (§ 2). */
  hr_gpu_stream *ordered;
  rv = hr_gpu_stream_wrap(g, h->p.ordered_stream, &ordered);
  if (rv != 0)
    return rv;
  if (n == 0)
    rv = hr_gpu_stream_sync(ordered);
  for (size_t i = 0; i < n && rv == 0; i++)
    if (hr_gpu_stream_native(streams[i]) != h->p.ordered_stream)
      rv = order_after(g, streams[i], ordered);
  hr_gpu_stream_del(ordered);
  return rv;
}

static void deferred_release(void *arg) {
  hr_handoff *h = arg;
  hr_handoff_release_buffer(h);
  unref(h);
}

int hr_handoff_release_after(hr_handoff *h, hr_gpu_stream *const *streams,
                             size_t n) {
  if (!h || n == 0 || !streams || !streams[0])
    return HR_ERR_INVALID_ARGUMENT;
  hr_gpu *g = hr_gpu_stream_device(streams[0]);
  for (size_t i = 1; i < n; i++)
    if (!streams[i] || hr_gpu_stream_device(streams[i]) != g)
      return HR_ERR_INVALID_ARGUMENT;
  if (atomic_load(&h->buffer_released) ||
      atomic_exchange(&h->release_pending, 1)) {
    atomic_fetch_add(&h->l->double_releases, 1);
    report(h, "buffer release requested twice");
    return HR_ERR_STATE;
  }
  int rv = 0;
  for (size_t i = 1; i < n && rv == 0; i++)
    rv = order_after(g, streams[0], streams[i]);
  if (rv == 0) {
    atomic_fetch_add(&h->refs, 1);
    rv = hr_gpu_launch_host_fn(streams[0], deferred_release, h);
    if (rv != 0)
      atomic_fetch_sub(&h->refs, 1);
  }
  if (rv != 0)
    atomic_store(&h->release_pending, 0);
  return rv;
}

/* ---- producer helper (§ 1) --------------------------------------------- */

static void event_release_cb(void *ctx) { hr_gpu_event_del(ctx); }

int hr_handoff_prepare(hr_gpu_stream *producer, uint8_t mode,
                       const hr_handoff_request *req, hr_buffer_handle *b,
                       hr_handoff_payload *p) {
  if (!producer || !b || !p)
    return HR_ERR_INVALID_ARGUMENT;
  hr_gpu *g = hr_gpu_stream_device(producer);
  hr_gpu_caps caps;
  int rv = hr_gpu_query(g, &caps);
  if (rv != 0)
    return rv;
  p->sync_handle = NULL;
  p->event_release = NULL;
  p->event_release_ctx = NULL;
  p->ordered_stream = NULL;
  p->sync_handle_device_tag = 0;
  b->device_tag = caps.device_tag;
  switch (mode) {
  case HR_SYNC_PRODUCER_SYNCED:
    rv = hr_gpu_stream_sync(producer);
    break;
  case HR_SYNC_EVENT: {
    hr_gpu_event *e;
    rv = hr_gpu_event_new(g, 0, &e);
    if (rv != 0)
      return rv;
    rv = hr_gpu_event_record(e, producer);
    if (rv != 0) {
      hr_gpu_event_del(e);
      return rv;
    }
    p->sync_handle = hr_gpu_event_native(e);
    p->sync_handle_device_tag = caps.device_tag;
    p->event_release = event_release_cb;
    p->event_release_ctx = e;
    break;
  }
  case HR_SYNC_CONSUMER_STREAM: {
    if (!req || !req->consumer_stream)
      return HR_ERR_INVALID_ARGUMENT;
    hr_gpu_stream *cs;
    rv = hr_gpu_stream_wrap(g, req->consumer_stream, &cs);
    if (rv != 0)
      return rv;
    rv = order_after(g, cs, producer);
    hr_gpu_stream_del(cs);
    if (rv == 0)
      p->ordered_stream = req->consumer_stream;
    break;
  }
  default:
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (rv == 0)
    b->sync_mode = mode;
  return rv;
}
