/*
 * Soak: many clients doing random GET, PUT (REPLACE), LIST, PING, CANCEL
 * and disconnects against one server (an engine on libevent, on its own
 * thread, serving an hr_store), for a bounded time.
 *
 *   test_soak [--seconds N] [--clients N] [--max-kib N] [--seed N]
 *   (or HR_SOAK_SECONDS, HR_SOAK_CLIENTS, HR_SOAK_MAX_KIB, HR_SOAK_SEED;
 *   defaults 60 s, 32 clients, 1024 KiB)
 *
 * Checked:
 *  - every GET's bytes are those of a PUT that may be the key's current
 *    value (the oracle below), never a mix, and no GET finds a key missing;
 *  - every request completes with the result its kind allows: blocking
 *    calls carry a deadline (the client's timeout), and a timeout, a
 *    refusal or a closed connection outside a deliberate cancel or
 *    disconnect is a failure;
 *  - LIST pages list exactly the keys, in order, with a size some PUT of
 *    the key had;
 *  - memory stays flat: the server's heap (engine and store, through a
 *    counting allocator) minus the bytes the store holds must not grow
 *    past the warm-up figure by more than a bound, and after the clients
 *    left it must come back to that figure; the process RSS is reported.
 *
 * The oracle.  A global counter orders events.  Each PUT records `start`
 * (taken before it is sent) and, once acknowledged, `end` (taken after the
 * ACK arrived); the server swaps the key's value somewhere inside
 * [start, end].  A PUT that was cancelled or cut may or may not have
 * committed: it stays "uncertain" with no end.  A GET that ran over
 * [gs, ge] may return the value of PUT p when p did not fail, p.start < ge,
 * and no acknowledged PUT q of the key has p.end < q.start and q.end < gs
 * (q was sent after p committed and committed before the GET was sent, so
 * p was certainly replaced).  So the oracle can only fail on a real error:
 * a stale value, bytes no PUT wrote, or a lost key.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include <hurray/client.h>
#include <hurray/engine.h>
#include <hurray/hr_event.h>
#include <hurray/store.h>

#include "engine_io/tl.h"

#define NKEYS 16
#define MAX_CLIENTS 256

/* ---- settings ------------------------------------------------------------ */

typedef struct soak_cfg {
  int seconds, clients;
  uint64_t max_bytes;
  uint64_t seed;
} soak_cfg;

static soak_cfg cfg = {60, 32, 1024 << 10, 1};

/* ---- helpers ------------------------------------------------------------- */

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* The contents of version `vid`: 8-byte words from a counter hash. */
static void fill(uint8_t *b, uint64_t n, uint64_t vid) {
  uint64_t x = vid * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i < n; i++) {
    if (i % 8 == 0) {
      x ^= x >> 31;
      x *= 0xBF58476D1CE4E5B9ull;
      x ^= x >> 29;
    }
    b[i] = (uint8_t)(x >> (8 * (i % 8)));
  }
}

/* A 64-bit checksum of the bytes (length mixed in). */
static uint64_t checksum(const uint8_t *b, uint64_t n) {
  uint64_t h = 0xcbf29ce484222325ull ^ n;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 32;
  }
  for (; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* A uint8 tensor of `n` bytes (rank 1, or rank 2 when n is even). */
static hr_tensor *version_tensor(uint64_t vid, uint64_t n, uint64_t *sum) {
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_UINT8;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  if (n % 2 == 0 && n > 0) {
    d.rank = 2;
    d.shape[0] = 2;
    d.shape[1] = n / 2;
  } else {
    d.rank = 1;
    d.shape[0] = n;
  }
  d.buffer_count = 1;
  d.buffers[0].size_bytes = n;
  hr_tensor *t = NULL;
  if (hr_tensor_alloc(&t, &d, 0, NULL) != 0)
    return NULL;
  uint8_t *b = hr_tensor_buffer(t, 0);
  fill(b, n, vid);
  *sum = checksum(b, n);
  return t;
}

/* ---- the oracle ---------------------------------------------------------- */

enum { P_FLIGHT, P_ACKED, P_FAILED, P_UNCERTAIN };

typedef struct putrec {
  uint64_t sum, size;
  uint64_t start, end; /* end: UINT64_MAX until acknowledged */
  int state;
} putrec;

typedef struct keyhist {
  pthread_mutex_t lock;
  putrec *v;
  size_t n, cap;
} keyhist;

static atomic_uint_fast64_t clock_seq;
static keyhist hist[NKEYS];

static uint64_t tick(void) { return atomic_fetch_add(&clock_seq, 1) + 1; }

static void key_name(int k, char *out) { sprintf(out, "soak/key%02d", k); }

/* Records a PUT about to be sent; returns its index. */
static size_t put_begin(int k, uint64_t sum, uint64_t size) {
  keyhist *h = &hist[k];
  pthread_mutex_lock(&h->lock);
  if (h->n == h->cap) {
    h->cap = h->cap ? 2 * h->cap : 64;
    h->v = realloc(h->v, h->cap * sizeof h->v[0]);
    if (!h->v)
      abort();
  }
  size_t i = h->n++;
  h->v[i].sum = sum;
  h->v[i].size = size;
  h->v[i].state = P_FLIGHT;
  h->v[i].end = UINT64_MAX;
  h->v[i].start = tick();
  pthread_mutex_unlock(&h->lock);
  return i;
}

static void put_end(int k, size_t i, int state) {
  keyhist *h = &hist[k];
  uint64_t t = tick();
  pthread_mutex_lock(&h->lock);
  h->v[i].state = state;
  if (state == P_ACKED)
    h->v[i].end = t;
  pthread_mutex_unlock(&h->lock);
}

/* Is a GET over [gs, ge] allowed to return (sum, size)?  Returns 1, or 0
 * and the reason in `why`. */
static int get_ok(int k, uint64_t gs, uint64_t ge, uint64_t sum,
                  uint64_t size, const char **why) {
  keyhist *h = &hist[k];
  int ok = 0;
  *why = "bytes no PUT of the key wrote (torn or corrupt)";
  pthread_mutex_lock(&h->lock);
  for (size_t i = 0; i < h->n && !ok; i++) {
    const putrec *p = &h->v[i];
    if (p->sum != sum || p->size != size)
      continue;
    if (p->state == P_FAILED) {
      *why = "the value of a PUT that was refused";
      continue;
    }
    if (p->start >= ge) {
      *why = "the value of a PUT sent after the GET completed";
      continue;
    }
    int replaced = 0;
    for (size_t j = 0; j < h->n && !replaced; j++) {
      const putrec *q = &h->v[j];
      replaced = q->state == P_ACKED && p->end != UINT64_MAX &&
                 p->end < q->start && q->end < gs;
    }
    if (replaced) {
      *why = "a stale value (replaced before the GET was sent)";
      continue;
    }
    ok = 1;
  }
  pthread_mutex_unlock(&h->lock);
  return ok;
}

/* Whether some PUT of the key that did not fail had `size` bytes. */
static int size_seen(int k, uint64_t size) {
  keyhist *h = &hist[k];
  int ok = 0;
  pthread_mutex_lock(&h->lock);
  for (size_t i = 0; i < h->n && !ok; i++)
    ok = h->v[i].size == size && h->v[i].state != P_FAILED;
  pthread_mutex_unlock(&h->lock);
  return ok;
}

/* ---- a counting allocator for the server --------------------------------- */

static atomic_int_fast64_t srv_live;

static void *cm_malloc(size_t n, void *ud) {
  (void)ud;
  uint64_t *p = malloc(n + 16);
  if (!p)
    return NULL;
  p[0] = n;
  atomic_fetch_add(&srv_live, (int64_t)n);
  return (uint8_t *)p + 16;
}
static void cm_free(void *q, void *ud) {
  (void)ud;
  if (!q)
    return;
  uint64_t *p = (uint64_t *)((uint8_t *)q - 16);
  atomic_fetch_sub(&srv_live, (int64_t)p[0]);
  free(p);
}
static void *cm_calloc(size_t m, size_t n, void *ud) {
  if (n && m > SIZE_MAX / n - 16)
    return NULL;
  void *p = cm_malloc(m * n, ud);
  if (p)
    memset(p, 0, m * n);
  return p;
}
static void *cm_realloc(void *q, size_t n, void *ud) {
  if (!q)
    return cm_malloc(n, ud);
  uint64_t *p = (uint64_t *)((uint8_t *)q - 16);
  uint64_t old = p[0];
  uint64_t *r = realloc(p, n + 16);
  if (!r)
    return NULL;
  r[0] = n;
  atomic_fetch_add(&srv_live, (int64_t)n - (int64_t)old);
  return (uint8_t *)r + 16;
}
static const hr_mem counting_mem = {NULL, cm_malloc, cm_free, cm_calloc,
                                    cm_realloc};

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  if (!f)
    return 0;
  if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
    resident = 0;
  fclose(f);
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* ---- the server ---------------------------------------------------------- */

typedef struct server {
  pthread_t th;
  struct event_base *base;
  hr_engine *e;
  hr_store *store;
  int port;
  atomic_int stop, ready;
  atomic_int closed;
  atomic_int_fast64_t store_bytes;
} server;

static void on_closed(hr_engine *e, void *ud) {
  (void)e;
  server *s = ud;
  atomic_store(&s->closed, 1);
  event_base_loopbreak(s->base);
}

static void on_tick(evutil_socket_t fd, short what, void *ud) {
  (void)fd;
  (void)what;
  server *s = ud;
  atomic_store(&s->store_bytes, (int64_t)hr_store_bytes(s->store));
  if (atomic_load(&s->stop) == 1) {
    atomic_store(&s->stop, 2);
    if (hr_engine_close(s->e, on_closed, s) != 0)
      abort();
  }
}

static void *server_main(void *arg) {
  server *s = arg;
  s->base = event_base_new();
  if (!s->base)
    abort();
  hr_engine_config ec;
  hr_engine_config_default(&ec);
  ec.worker_threads = 2;
  /* Tensors of a few KiB up: most payloads move on the worker pool
   * (bulk I/O), racing the cancels and cuts. */
  ec.bulk_offload_min = 16 * 1024;
  ec.bulk_offload_lone = 1;
  ec.bulk_offload_jobs = 2; /* on any machine (automatic: none on 2 CPUs) */
  if (hr_ev_attach(&s->e, s->base, &ec, &counting_mem) != 0)
    abort();
  hr_provider prov;
  hr_store_provider(s->store, &prov);
  hr_listener *lis = NULL;
  if (hr_engine_listen(s->e, "127.0.0.1:0", &prov, &lis) != 0)
    abort();
  struct event *t = event_new(s->base, -1, EV_PERSIST, on_tick, s);
  struct timeval tv = {0, 20000};
  event_add(t, &tv);
  s->port = hr_listener_port(lis);
  atomic_store(&s->ready, 1);
  while (!atomic_load(&s->closed))
    event_base_loop(s->base, 0);
  event_free(t);
  if (hr_engine_del(s->e) != 0)
    abort();
  event_base_free(s->base);
  return NULL;
}

/* ---- the clients --------------------------------------------------------- */

typedef struct stats {
  uint64_t gets, puts, lists, pings, cancels, reconnects, raw_cuts;
  uint64_t bytes_in;
  uint64_t failures;
  char first_failure[256];
} stats;

typedef struct client {
  pthread_t th;
  int id;
  int port;
  char url[64];
  uint64_t rng;
  uint64_t deadline_ms;
  uint64_t next_vid;
  hr_client *c;
  stats st;
} client;

static void soak_fail(client *cl, const char *fmt, ...) {
  if (cl->st.failures++ == 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cl->st.first_failure, sizeof cl->st.first_failure, fmt, ap);
    va_end(ap);
    fprintf(stderr, "soak: client %d: %s\n", cl->id, cl->st.first_failure);
  }
}

static int connect_client(client *cl) {
  hr_client_options o;
  hr_client_options_default(&o);
  /* The per-request deadline: nothing may hang longer than this. */
  o.timeout_ms = 60000;
  o.bulk_offload_min = 16 * 1024; /* like the server's */
  o.bulk_offload_lone = 1;        /* one lane: offloaded all the same */
  o.bulk_offload_jobs = 2;        /* whatever the CPUs */
  hr_client_error err;
  int rv = hr_client_connect(&cl->c, cl->url, &o, NULL, &err);
  if (rv != 0) {
    soak_fail(cl, "connect: %s (%s)", hr_strerror(rv), err.message);
    cl->c = NULL;
  }
  return rv;
}

static uint64_t pick_size(client *cl) {
  uint64_t r = rnd(&cl->rng);
  /* Mostly small; one in eight up to max_bytes, so that transfers take
   * long enough for cancels and replacements to race them. */
  if (r % 8 == 0)
    return 1 + (r >> 8) % cfg.max_bytes;
  return 1 + (r >> 8) % 4096;
}

/* Checks a GET's tensor against the oracle. */
static void check_get(client *cl, int k, uint64_t gs, uint64_t ge,
                      hr_tensor *t) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  if (d->layout.tag != HR_LAYOUT_ROW_MAJOR || d->buffer_count != 1 ||
      d->element_type != HR_ELEM_UINT8) {
    soak_fail(cl, "GET key %d: unexpected descriptor", k);
    return;
  }
  uint64_t n = d->buffers[0].size_bytes;
  uint64_t sum = checksum(hr_tensor_buffer(t, 0), n);
  const char *why;
  if (!get_ok(k, gs, ge, sum, n, &why))
    soak_fail(cl, "GET key %d (%llu bytes): %s", k, (unsigned long long)n, why);
  cl->st.bytes_in += n;
}

static void do_get(client *cl) {
  int k = (int)(rnd(&cl->rng) % NKEYS);
  char key[32];
  key_name(k, key);
  hr_get_opts o;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)key;
  o.key_len = (uint16_t)strlen(key);
  hr_tensor *t = NULL;
  hr_transfer_record rec;
  uint64_t gs = tick();
  int rv = hr_client_get(cl->c, &o, &t, &rec);
  uint64_t ge = tick();
  cl->st.gets++;
  if (rv != 0) {
    soak_fail(cl, "GET key %d: %s (wire %u: %s)", k, hr_strerror(rv),
         rec.wire_error, rec.message);
    return;
  }
  check_get(cl, k, gs, ge, t);
  hr_tensor_unref(t);
}

static void do_put(client *cl) {
  int k = (int)(rnd(&cl->rng) % NKEYS);
  char key[32];
  key_name(k, key);
  uint64_t vid = (uint64_t)(cl->id + 1) << 40 | ++cl->next_vid, sum;
  uint64_t n = pick_size(cl);
  hr_tensor *t = version_tensor(vid, n, &sum);
  if (!t) {
    soak_fail(cl, "out of memory");
    return;
  }
  size_t i = put_begin(k, sum, n);
  hr_transfer_record rec;
  int rv = hr_client_put(cl->c, (const uint8_t *)key, (uint16_t)strlen(key),
                         HR_PUT_REPLACE, t, &rec);
  cl->st.puts++;
  if (rv == 0) {
    put_end(k, i, P_ACKED);
  } else {
    /* A PUT that failed may still have committed (the ACK lost with the
     * connection): keep it possible, and count the failure. */
    put_end(k, i, P_UNCERTAIN);
    soak_fail(cl, "PUT key %d: %s (wire %u: %s)", k, hr_strerror(rv),
         rec.wire_error, rec.message);
  }
  hr_tensor_unref(t);
}

typedef struct listck {
  client *cl;
  int n;
  char last[64];
  int bad;
} listck;

static int on_entry(const hr_list_entry *e, void *ud) {
  listck *l = ud;
  char want[32];
  key_name(l->n, want);
  if (l->n >= NKEYS || e->key_len != strlen(want) ||
      memcmp(e->key, want, e->key_len) != 0) {
    l->bad = 1;
    return 1;
  }
  if (!size_seen(l->n, e->total_data_bytes))
    l->bad = 2;
  l->n++;
  return 0;
}

static void do_list(client *cl) {
  listck l;
  memset(&l, 0, sizeof l);
  l.cl = cl;
  int more = -1;
  uint32_t wire = 0;
  int rv = hr_client_list(cl->c, (const uint8_t *)"soak/", 5, NULL, 0, 1024,
                          on_entry, &l, &more, &wire);
  cl->st.lists++;
  if (rv != 0)
    soak_fail(cl, "LIST: %s (wire %u)", hr_strerror(rv), wire);
  else if (l.bad == 1 || l.n != NKEYS || more != 0)
    soak_fail(cl, "LIST: %d entries, more %d, order %s", l.n, more,
         l.bad == 1 ? "wrong" : "right");
  else if (l.bad == 2)
    soak_fail(cl, "LIST: a size no PUT of the key had");
}

static void do_ping(client *cl) {
  uint64_t rtt;
  int rv = hr_client_ping(cl->c, &rtt);
  cl->st.pings++;
  if (rv != 0)
    soak_fail(cl, "PING: %s", hr_strerror(rv));
}

/* A pipelined GET or PUT on the client's session, cancelled after 0-3
 * turns of its loop.  It must complete, with its result or CANCELLED. */
typedef struct pending {
  int done;
  int status;
  uint32_t wire;
  hr_tensor *t;
} pending;

static void pend_get(hr_session *s, uint32_t sid, hr_tensor *t,
                     const hr_transfer_record *rec, void *ud) {
  (void)s;
  (void)sid;
  pending *p = ud;
  p->done++;
  p->status = rec->status;
  p->wire = rec->wire_error;
  p->t = t;
}

static void pend_put(hr_session *s, uint32_t sid,
                     const hr_transfer_record *rec, void *ud) {
  (void)s;
  (void)sid;
  pending *p = ud;
  p->done++;
  p->status = rec->status;
  p->wire = rec->wire_error;
}

static int is_done(void *ud) { return ((pending *)ud)->done != 0; }

static int turns(void *ud) {
  int *left = ud;
  return (*left)-- <= 0;
}

static void do_cancel(client *cl) {
  int k = (int)(rnd(&cl->rng) % NKEYS), is_put = rnd(&cl->rng) % 2;
  char key[32];
  key_name(k, key);
  hr_session *s = hr_client_session(cl->c);
  pending p;
  memset(&p, 0, sizeof p);
  uint32_t sid = 0;
  size_t rec_i = 0;
  hr_tensor *t = NULL;
  uint64_t gs = tick();
  int rv;
  if (is_put) {
    uint64_t vid = (uint64_t)(cl->id + 1) << 40 | ++cl->next_vid, sum;
    t = version_tensor(vid, pick_size(cl), &sum);
    if (!t) {
      soak_fail(cl, "out of memory");
      return;
    }
    rec_i = put_begin(k, sum, hr_tensor_bytes(t));
    rv = hr_session_put(s, (const uint8_t *)key, (uint16_t)strlen(key),
                        HR_PUT_REPLACE, t, pend_put, &p, &sid);
  } else {
    hr_get_opts o;
    memset(&o, 0, sizeof o);
    o.key = (const uint8_t *)key;
    o.key_len = (uint16_t)strlen(key);
    rv = hr_session_get(s, &o, pend_get, &p, &sid);
  }
  if (rv != 0) {
    soak_fail(cl, "queueing a request to cancel: %s", hr_strerror(rv));
    if (is_put)
      put_end(k, rec_i, P_FAILED);
    hr_tensor_unref(t);
    return;
  }
  /* A few turns of the loop (at most 1 ms), so that the cancel finds the
   * request anywhere between queued and answered. */
  int left = (int)(rnd(&cl->rng) % 4);
  hr_client_wait(cl->c, turns, &left, 1);
  if (!p.done) {
    rv = hr_session_cancel(s, sid);
    if (rv != 0 && rv != HR_ERR_NOT_FOUND)
      soak_fail(cl, "CANCEL: %s", hr_strerror(rv));
  }
  rv = hr_client_wait(cl->c, is_done, &p, 60000);
  uint64_t ge = tick();
  cl->st.cancels++;
  if (rv != 0 || p.done != 1) {
    soak_fail(cl, "a cancelled request never completed: %s", hr_strerror(rv));
    if (is_put)
      put_end(k, rec_i, P_UNCERTAIN);
    hr_tensor_unref(t);
    return;
  }
  int cancelled = p.status == HR_ERR_REMOTE && p.wire == HR_WIRE_CANCELLED;
  if (p.status != 0 && !cancelled)
    soak_fail(cl, "a cancelled %s ended with %s (wire %u)",
              is_put ? "PUT" : "GET", hr_strerror(p.status), p.wire);
  if (is_put) {
    put_end(k, rec_i, p.status == 0 ? P_ACKED : P_UNCERTAIN);
  } else if (p.t) {
    check_get(cl, k, gs, ge, p.t);
    hr_tensor_unref(p.t);
  }
  hr_tensor_unref(t);
}

static void do_reconnect(client *cl) {
  /* Half of the time a GET is still in flight when the client closes:
   * the close drains it (GOAWAY, the stream finishes), so it completes,
   * with its tensor or CLOSED, and a tensor must pass the oracle. */
  pending p;
  memset(&p, 0, sizeof p);
  int k = (int)(rnd(&cl->rng) % NKEYS), queued = 0;
  uint64_t gs = tick();
  if (rnd(&cl->rng) % 2) {
    char key[32];
    key_name(k, key);
    hr_get_opts o;
    memset(&o, 0, sizeof o);
    o.key = (const uint8_t *)key;
    o.key_len = (uint16_t)strlen(key);
    queued = hr_session_get(hr_client_session(cl->c), &o, pend_get, &p,
                            NULL) == 0;
  }
  hr_client_close(cl->c);
  cl->c = NULL;
  if (queued) {
    uint64_t ge = tick();
    if (p.done != 1)
      soak_fail(cl, "a GET in flight at close completed %d times", p.done);
    else if (p.t)
      check_get(cl, k, gs, ge, p.t);
    else if (p.status != HR_ERR_CLOSED)
      soak_fail(cl, "a GET in flight at close: %s", hr_strerror(p.status));
    hr_tensor_unref(p.t);
  }
  cl->st.reconnects++;
  connect_client(cl);
}

/* Encodes and sends one message (tl_raw_send_msg() encodes into a static
 * buffer: not for threads).  Returns 0 or -1. */
static int raw_send(int fd, const hr_msg *m) {
  int64_t n = hr_wire_encoded_size(m);
  uint8_t *buf = n > 0 ? malloc((size_t)n) : NULL;
  int rv = -1;
  if (buf && hr_wire_encode(m, buf, (size_t)n) == n)
    rv = tl_raw_send(NULL, fd, buf, (size_t)n);
  free(buf);
  return rv;
}

/* A raw connection cut in the middle: a GET whose answer is never read,
 * or a PUT that stops halfway.  The server must drop it cleanly; nothing
 * of the PUT may ever be stored (it is never recorded, so a GET that sees
 * its bytes fails the oracle). */
static void do_raw_cut(client *cl) {
  int fd = tl_raw_connect(cl->port);
  if (fd < 0) {
    soak_fail(cl, "raw connect failed");
    return;
  }
  hr_msg m;
  tl_hello(&m, 0);
  if (raw_send(fd, &m) != 0)
    goto out;
  int k = (int)(rnd(&cl->rng) % NKEYS);
  char key[32];
  key_name(k, key);
  memset(&m, 0, sizeof m);
  if (rnd(&cl->rng) % 2) {
    m.hdr.type = HR_MSG_TENSOR_REQUEST;
    m.hdr.stream_id = 1;
    m.u.request.key = (const uint8_t *)key;
    m.u.request.key_len = (uint16_t)strlen(key);
    m.u.request.max_shards = 1;
    raw_send(fd, &m);
  } else {
    uint64_t n = 1024 + rnd(&cl->rng) % 65536;
    m.hdr.type = HR_MSG_TENSOR_PUT;
    m.hdr.stream_id = 1;
    m.u.put.key = (const uint8_t *)key;
    m.u.put.key_len = (uint16_t)strlen(key);
    m.u.put.flags = HR_PUT_REPLACE;
    hr_descriptor *d = &m.u.put.desc;
    d->descriptor_version = 1;
    d->element_type = HR_ELEM_UINT8;
    d->rank = 1;
    d->shape[0] = n;
    d->layout.tag = HR_LAYOUT_ROW_MAJOR;
    d->buffer_count = 1;
    d->buffers[0].size_bytes = n;
    m.u.put.xport.total_data_bytes = n;
    m.u.put.xport.total_shards = 1;
    if (raw_send(fd, &m) != 0)
      goto out;
    /* Half of the data, then the cut. */
    uint8_t *half = malloc(n / 2);
    if (!half)
      goto out;
    fill(half, n / 2, rnd(&cl->rng));
    memset(&m, 0, sizeof m);
    m.hdr.type = HR_MSG_TENSOR_DATA;
    m.hdr.stream_id = 1;
    m.u.data.data = half;
    m.u.data.data_len = (uint32_t)(n / 2);
    raw_send(fd, &m);
    free(half);
  }
out:
  close(fd);
  cl->st.raw_cuts++;
}

/* Whether the client is done: its time is up, and client 0 has also run
 * a GET, a PUT and a CANCEL (the test checks that each kind ran, which
 * must not depend on how many turns a loaded machine, or valgrind, gave
 * the clients before the deadline; a minute more at most). */
static int client_done(const client *cl) {
  uint64_t now = now_ms();
  if (now < cl->deadline_ms)
    return 0;
  return cl->id != 0 || (cl->st.gets && cl->st.puts && cl->st.cancels) ||
         now >= cl->deadline_ms + 60000;
}

static void *client_main(void *arg) {
  client *cl = arg;
  if (connect_client(cl) != 0)
    return NULL;
  while (!client_done(cl) && cl->st.failures < 10) {
    if (!cl->c && connect_client(cl) != 0)
      break;
    unsigned r = (unsigned)(rnd(&cl->rng) % 100);
    if (r < 40)
      do_get(cl);
    else if (r < 65)
      do_put(cl);
    else if (r < 73)
      do_list(cl);
    else if (r < 78)
      do_ping(cl);
    else if (r < 92)
      do_cancel(cl);
    else if (r < 97)
      do_reconnect(cl);
    else
      do_raw_cut(cl);
  }
  hr_client_close(cl->c);
  cl->c = NULL;
  return NULL;
}

/* ---- the test ------------------------------------------------------------ */

static void soak(void **state) {
  (void)state;
  server srv;
  memset(&srv, 0, sizeof srv);
  hr_store_config sc;
  hr_store_config_default(&sc);
  sc.allow_put = 1;
  sc.allow_replace = 1;
  assert_int_equal(hr_store_new(&srv.store, &sc, &counting_mem), 0);
  /* Every key starts with a version of its own. */
  for (int k = 0; k < NKEYS; k++) {
    pthread_mutex_init(&hist[k].lock, NULL);
    char key[32];
    key_name(k, key);
    uint64_t sum, n = 100 + (uint64_t)k;
    hr_tensor *t = version_tensor((uint64_t)k + 1, n, &sum);
    assert_non_null(t);
    size_t i = put_begin(k, sum, n);
    assert_int_equal(hr_store_put(srv.store, key, strlen(key), t, 0), 0);
    put_end(k, i, P_ACKED);
    hr_tensor_unref(t);
  }
  assert_int_equal(pthread_create(&srv.th, NULL, server_main, &srv), 0);
  while (!atomic_load(&srv.ready))
    usleep(1000);

  uint64_t t0 = now_ms();
  client *cl = calloc((size_t)cfg.clients, sizeof *cl);
  assert_non_null(cl);
  for (int i = 0; i < cfg.clients; i++) {
    cl[i].id = i;
    cl[i].port = srv.port;
    snprintf(cl[i].url, sizeof cl[i].url, "hurray://127.0.0.1:%d", srv.port);
    cl[i].rng = cfg.seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 7919 + 1;
    cl[i].deadline_ms = t0 + (uint64_t)cfg.seconds * 1000;
    assert_int_equal(pthread_create(&cl[i].th, NULL, client_main, &cl[i]), 0);
  }

  /* Memory: the server's heap beyond what the store holds, sampled every
   * 100 ms; the warm-up figure is the peak of the first quarter. */
  int64_t warm = 0, peak = 0;
  long rss_warm = 0, rss_peak = 0;
  uint64_t warm_end = t0 + (uint64_t)cfg.seconds * 250;
  while (now_ms() < t0 + (uint64_t)cfg.seconds * 1000) {
    usleep(100000);
    int64_t extra = atomic_load(&srv_live) - atomic_load(&srv.store_bytes);
    long rss = rss_kib();
    if (now_ms() < warm_end) {
      warm = extra > warm ? extra : warm;
      rss_warm = rss > rss_warm ? rss : rss_warm;
    } else {
      peak = extra > peak ? extra : peak;
      rss_peak = rss > rss_peak ? rss : rss_peak;
    }
  }
  stats all;
  memset(&all, 0, sizeof all);
  for (int i = 0; i < cfg.clients; i++) {
    pthread_join(cl[i].th, NULL);
    stats *s = &cl[i].st;
    all.gets += s->gets;
    all.puts += s->puts;
    all.lists += s->lists;
    all.pings += s->pings;
    all.cancels += s->cancels;
    all.reconnects += s->reconnects;
    all.raw_cuts += s->raw_cuts;
    all.bytes_in += s->bytes_in;
    all.failures += s->failures;
    if (s->failures && !all.first_failure[0])
      memcpy(all.first_failure, s->first_failure, sizeof all.first_failure);
  }
  /* Every connection gone (raw ones are cut at once; clients closed):
   * the server's heap must come back to its warm-up level. */
  int64_t settled = 0;
  for (int i = 0; i < 600; i++) { /* 30 s at most: valgrind, TSan */
    settled = atomic_load(&srv_live) - atomic_load(&srv.store_bytes);
    if (settled <= warm)
      break;
    usleep(50000);
  }
  printf("soak: %d clients, %d s: %llu GET (%llu MiB), %llu PUT, %llu LIST, "
         "%llu PING, %llu CANCEL, %llu reconnects, %llu raw cuts; "
         "failures %llu\n",
         cfg.clients, cfg.seconds, (unsigned long long)all.gets,
         (unsigned long long)(all.bytes_in >> 20),
         (unsigned long long)all.puts, (unsigned long long)all.lists,
         (unsigned long long)all.pings, (unsigned long long)all.cancels,
         (unsigned long long)all.reconnects, (unsigned long long)all.raw_cuts,
         (unsigned long long)all.failures);
  printf("soak: server heap beyond the store: warm-up peak %lld KiB, later "
         "peak %lld KiB, after the clients left %lld KiB; process RSS "
         "warm-up %ld KiB, later peak %ld KiB\n",
         (long long)(warm >> 10), (long long)(peak >> 10),
         (long long)(settled >> 10), rss_warm, rss_peak);
  if (all.failures)
    fprintf(stderr, "soak: first failure: %s\n", all.first_failure);
  assert_int_equal(all.failures, 0);
  assert_true(all.gets > 0 && all.puts > 0 && all.cancels > 0);
  /* Bounded growth: in-flight transfers hold landing buffers and old
   * versions, at most a few per client, each at most max_bytes. */
  int64_t bound = warm + (int64_t)cfg.clients * 4 * (int64_t)cfg.max_bytes +
                  (16 << 20);
  assert_true(peak <= bound);
  /* Nothing kept once the clients left: what remains is the engine's
   * fixed state, no more than during warm-up (plus 1 MiB of slack for
   * the listener's and pool's lazily made parts). */
  assert_true(settled <= warm + (1 << 20));

  atomic_store(&srv.stop, 1);
  pthread_join(srv.th, NULL);
  hr_store_del(srv.store);
  assert_int_equal(atomic_load(&srv_live), 0);
  for (int k = 0; k < NKEYS; k++) {
    free(hist[k].v);
    pthread_mutex_destroy(&hist[k].lock);
  }
  free(cl);
}

static long arg_or_env(int argc, char **argv, const char *flag,
                       const char *env, long def) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], flag) == 0)
      return strtol(argv[i + 1], NULL, 10);
  const char *v = getenv(env);
  return v && *v ? strtol(v, NULL, 10) : def;
}

int main(int argc, char **argv) {
  cfg.seconds = (int)arg_or_env(argc, argv, "--seconds", "HR_SOAK_SECONDS", 60);
  cfg.clients = (int)arg_or_env(argc, argv, "--clients", "HR_SOAK_CLIENTS", 32);
  cfg.max_bytes =
      (uint64_t)arg_or_env(argc, argv, "--max-kib", "HR_SOAK_MAX_KIB", 1024)
      << 10;
  cfg.seed = (uint64_t)arg_or_env(argc, argv, "--seed", "HR_SOAK_SEED", 1);
  if (cfg.seconds < 1 || cfg.clients < 1 || cfg.clients > MAX_CLIENTS ||
      cfg.max_bytes < 1024) {
    fprintf(stderr, "usage: %s [--seconds N>=1] [--clients 1-%d] "
                    "[--max-kib N>=1] [--seed N]\n",
            argv[0], MAX_CLIENTS);
    return 2;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(soak)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
