/*
 * A client and a server session wired together in memory, a toy tensor
 * store as the provider, and tensor factories.
 *
 * pump() pulls everything one session has to send and feeds it to the
 * other, in random chunks (fixed seed) and, when `zero_copy` is set,
 * through hr_session_recv_target()/recv_placed() wherever the session
 * offers a destination, as a host recv()ing straight into place would.
 */
#ifndef HR_TEST_ENGINE_CORE_HARNESS_H
#define HR_TEST_ENGINE_CORE_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/session.h>
#include <hurray/tensor.h>
#include <hurray/wire.h>

#include "engine_core/testutil.h"

/* ---- random -------------------------------------------------------------- */

static inline uint32_t t_rand(uint64_t *st) {
  *st = *st * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(*st >> 33);
}

/* ---- the store (provider) ------------------------------------------------ */

#define STORE_MAX 256

typedef struct store {
  char *keys[STORE_MAX];
  hr_tensor *ts[STORE_MAX];
  int n;
  int defer; /* on_get: keep the handle, answer later */
  hr_srv_get *pending[16];
  int npending;
  int cancels; /* on_get_cancel calls */
  int puts_begun, puts_committed, puts_aborted;
  uint32_t refuse_put; /* on_put_begin answers this wire error */
  uint32_t refuse_commit;
  uint32_t refuse_hello;
  int gets;
} store;

static inline int store_find(store *st, const uint8_t *k, size_t n) {
  for (int i = 0; i < st->n; i++)
    if (strlen(st->keys[i]) == n && !memcmp(st->keys[i], k, n))
      return i;
  return -1;
}

/* Adds (or replaces) key -> t; takes a reference. */
static inline void store_put(store *st, const char *key, hr_tensor *t) {
  int i = store_find(st, (const uint8_t *)key, strlen(key));
  if (i >= 0) {
    hr_tensor_unref(st->ts[i]);
    st->ts[i] = hr_tensor_ref(t);
    return;
  }
  /* Kept sorted for LIST. */
  int pos = st->n;
  while (pos > 0 && strcmp(st->keys[pos - 1], key) > 0) {
    st->keys[pos] = st->keys[pos - 1];
    st->ts[pos] = st->ts[pos - 1];
    pos--;
  }
  st->keys[pos] = strdup(key);
  st->ts[pos] = hr_tensor_ref(t);
  st->n++;
}

static inline void store_clear(store *st) {
  for (int i = 0; i < st->n; i++) {
    free(st->keys[i]);
    hr_tensor_unref(st->ts[i]);
  }
  memset(st, 0, sizeof *st);
}

static inline int st_on_get(hr_session *s, hr_srv_get *g, void *ud) {
  store *st = ud;
  st->gets++;
  if (st->defer) {
    st->pending[st->npending++] = g;
    return 0;
  }
  const hr_get_info *in = hr_srv_get_info(g);
  int i = store_find(st, in->key, in->key_len);
  if (i < 0)
    return hr_get_fail(g, HR_WIRE_NOT_FOUND, "no such tensor") < 0 ? -1 : 0;
  int rv = hr_get_answer(g, st->ts[i]);
  return hr_err_is_fatal(rv) ? HR_ERR_CALLBACK_FAILURE : 0;
}

/* Answers the deferred GETs. */
static inline void store_answer_pending(store *st) {
  for (int j = 0; j < st->npending; j++) {
    hr_srv_get *g = st->pending[j];
    const hr_get_info *in = hr_srv_get_info(g);
    if (!in)
      continue;
    int i = store_find(st, in->key, in->key_len);
    if (i < 0)
      hr_get_fail(g, HR_WIRE_NOT_FOUND, "no such tensor");
    else
      hr_get_answer(g, st->ts[i]);
  }
  st->npending = 0;
}

static inline void st_on_get_cancel(hr_session *s, hr_srv_get *g, void *ud) {
  store *st = ud;
  st->cancels++;
  for (int j = 0; j < st->npending; j++)
    if (st->pending[j] == g)
      st->pending[j] = st->pending[--st->npending];
}

static inline int st_on_put_begin(hr_session *s, const hr_put_info *in,
                                  uint32_t *wire, void *ud) {
  store *st = ud;
  st->puts_begun++;
  if (st->refuse_put) {
    *wire = st->refuse_put;
    return 0;
  }
  if (!(in->flags & HR_PUT_REPLACE) &&
      store_find(st, in->key, in->key_len) >= 0)
    *wire = HR_WIRE_ALREADY_EXISTS;
  return 0;
}

static inline int st_on_put_commit(hr_session *s, const hr_put_info *in,
                                   hr_tensor *t, uint32_t *wire, void *ud) {
  store *st = ud;
  if (st->refuse_commit) {
    *wire = st->refuse_commit;
    return 0;
  }
  char key[HR_MAX_KEY + 1];
  memcpy(key, in->key, in->key_len);
  key[in->key_len] = 0;
  store_put(st, key, t);
  st->puts_committed++;
  return 0;
}

static inline void st_on_put_abort(hr_session *s, const hr_put_info *in,
                                   void *ud) {
  store *st = ud;
  st->puts_aborted++;
}

static inline int st_on_list(hr_session *s, const hr_list_request *req,
                             int (*emit)(void *, const hr_list_entry *),
                             void *ctx, int *more, void *ud) {
  store *st = ud;
  for (int i = 0; i < st->n; i++) {
    const char *k = st->keys[i];
    size_t n = strlen(k);
    if (n < req->prefix_len || memcmp(k, req->prefix, req->prefix_len))
      continue;
    if (req->start_after_len) {
      size_t m = n < req->start_after_len ? n : req->start_after_len;
      int c = memcmp(k, req->start_after, m);
      if (c < 0 || (c == 0 && n <= req->start_after_len))
        continue;
    }
    const hr_descriptor *d = hr_tensor_descriptor(st->ts[i]);
    hr_list_entry e;
    memset(&e, 0, sizeof e);
    e.key = (const uint8_t *)k;
    e.key_len = (uint16_t)n;
    e.element_type = d->element_type;
    e.layout_tag = d->layout.tag;
    e.rank = d->rank;
    memcpy(e.shape, d->shape, sizeof e.shape);
    e.total_data_bytes = hr_tensor_bytes(st->ts[i]);
    if (emit(ctx, &e)) {
      /* Page full: more remain if any later key matches. */
      for (int j = i + 1; j < st->n; j++)
        if (strlen(st->keys[j]) >= req->prefix_len &&
            !memcmp(st->keys[j], req->prefix, req->prefix_len))
          *more = 1;
      return 0;
    }
  }
  return 0;
}

static inline int st_on_hello(hr_session *s, const hr_hello *peer,
                              uint32_t *wire, void *ud) {
  store *st = ud;
  if (st->refuse_hello)
    *wire = st->refuse_hello;
  return 0;
}

static inline hr_provider store_provider(store *st) {
  hr_provider p;
  memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.user_data = st;
  p.on_get = st_on_get;
  p.on_get_cancel = st_on_get_cancel;
  p.on_put_begin = st_on_put_begin;
  p.on_put_commit = st_on_put_commit;
  p.on_put_abort = st_on_put_abort;
  p.on_list = st_on_list;
  p.on_hello = st_on_hello;
  return p;
}

/* ---- results ------------------------------------------------------------- */

typedef struct result {
  int calls;
  int status;
  uint32_t stream_id;
  hr_tensor *t;
  hr_transfer_record rec;
  size_t partial;
  /* LIST */
  int more;
  int entries;
  char last_key[HR_MAX_KEY + 1];
  /* PING */
  uint64_t rtt;
} result;

static inline void on_get_done(hr_session *s, uint32_t sid, hr_tensor *t,
                               const hr_transfer_record *rec, void *ud) {
  result *r = ud;
  r->calls++;
  r->status = rec->status;
  r->stream_id = sid;
  hr_tensor_unref(r->t);
  r->t = t;
  r->rec = *rec;
  r->partial = rec->partial_count;
  r->rec.partial = NULL;
}

static inline void on_put_done(hr_session *s, uint32_t sid,
                               const hr_transfer_record *rec, void *ud) {
  result *r = ud;
  r->calls++;
  r->status = rec->status;
  r->stream_id = sid;
  r->rec = *rec;
}

static inline void on_list_done(hr_session *s, int status, uint32_t wire,
                                const hr_list_response *resp, void *ud) {
  result *r = ud;
  r->calls++;
  r->status = status;
  r->rec.wire_error = wire;
  if (resp) {
    r->more = resp->more;
    r->entries = resp->entry_count;
    size_t pos = 0;
    hr_list_entry e;
    while (hr_list_entry_next(resp->entries_raw, resp->entries_raw_len, &pos,
                              &e)) {
      memcpy(r->last_key, e.key, e.key_len);
      r->last_key[e.key_len] = 0;
    }
  }
}

static inline void on_ping_done(hr_session *s, int status, uint64_t rtt,
                                void *ud) {
  result *r = ud;
  r->calls++;
  r->status = status;
  r->rtt = rtt;
}

static inline void result_clear(result *r) {
  hr_tensor_unref(r->t);
  memset(r, 0, sizeof *r);
}

/* ---- the pair ------------------------------------------------------------ */

typedef struct work_q {
  hr_work *items[4096];
  hr_session *owner[4096];
  int n;
} work_q;

typedef struct pair {
  hr_session *c, *s;
  store st;
  hr_tstamp now;
  uint64_t seed;
  int chunked;   /* feed in random chunks */
  int zero_copy; /* use recv_target/recv_placed */
  int iov_max;   /* iovecs per pull (default 64) */
  work_q wq;     /* deferred work (when async_work) */
  int async_work;
  int errors_c, errors_s; /* on_error calls */
  uint32_t last_err_c, last_err_s;
  int err_sent_c, err_sent_s;
  int established;
  int goaways_c, goaways_s;
  int transfers_s;
  hr_transfer_record last_srv_rec;
  hr_test_failmem fm; /* allocator of both sessions */
  int use_fm;
} pair;

static inline int pair_submit(hr_session *s, hr_work *w, void *ud) {
  pair *p = ud;
  if (p->wq.n >= 4096)
    return -1;
  p->wq.items[p->wq.n] = w;
  p->wq.owner[p->wq.n] = s;
  p->wq.n++;
  return 0;
}

static inline void pair_on_error(hr_session *s, uint32_t code, int sent,
                                 const char *msg, void *ud) {
  pair *p = ud;
  if (s == p->c) {
    p->errors_c++;
    p->last_err_c = code;
    p->err_sent_c = sent;
  } else {
    p->errors_s++;
    p->last_err_s = code;
    p->err_sent_s = sent;
  }
}

static inline void pair_on_established(hr_session *s, const hr_hello *h,
                                       void *ud) {
  pair *p = ud;
  p->established++;
}

static inline void pair_on_goaway(hr_session *s, const hr_goaway *g, void *ud) {
  pair *p = ud;
  if (s == p->c)
    p->goaways_c++;
  else
    p->goaways_s++;
}

static inline void pair_on_transfer(hr_session *s, const hr_transfer_record *r,
                                    void *ud) {
  pair *p = ud;
  if (s == p->s) {
    p->transfers_s++;
    p->last_srv_rec = *r;
  }
}

static inline hr_session_callbacks pair_callbacks(pair *p) {
  hr_session_callbacks cb;
  memset(&cb, 0, sizeof cb);
  cb.size = sizeof cb;
  cb.submit_work = p->async_work ? pair_submit : NULL;
  cb.on_established = pair_on_established;
  cb.on_goaway = pair_on_goaway;
  cb.on_error = pair_on_error;
  cb.on_transfer = pair_on_transfer;
  return cb;
}

/* Creates both sessions (settings may be NULL). */
static inline int pair_open(pair *p, const hr_settings *cs,
                            const hr_settings *ss) {
  hr_session_callbacks cb = pair_callbacks(p);
  hr_provider prov = store_provider(&p->st);
  const hr_mem *mem = p->use_fm ? &p->fm.mem : NULL;
  if (!p->seed)
    p->seed = 12345;
  if (!p->iov_max)
    p->iov_max = 64;
  int rv = hr_session_new(&p->c, HR_ROLE_CLIENT, cs, &cb, NULL, p, p->now, mem);
  if (rv)
    return rv;
  rv = hr_session_new(&p->s, HR_ROLE_SERVER, ss, &cb, &prov, p, p->now, mem);
  if (rv) {
    hr_session_del(p->c);
    p->c = NULL;
    return rv;
  }
  return 0;
}

static inline void pair_close(pair *p) {
  hr_session_del(p->c);
  hr_session_del(p->s);
  p->c = p->s = NULL;
  store_clear(&p->st);
}

/* Feeds `len` bytes to `to`.  Returns 0 or a negative error. */
static inline int64_t feed(pair *p, hr_session *to, const uint8_t *b,
                           size_t len) {
  size_t pos = 0;
  while (pos < len) {
    if (p->zero_copy) {
      void *dst;
      size_t n;
      if (hr_session_recv_target(to, &dst, &n)) {
        if (n > len - pos)
          n = len - pos;
        if (p->chunked && n > 1)
          n = 1 + t_rand(&p->seed) % n;
        memcpy(dst, b + pos, n);
        int rv = hr_session_recv_placed(to, n, p->now);
        if (rv)
          return rv;
        pos += n;
        continue;
      }
    }
    size_t n = len - pos;
    if (p->chunked && n > 1)
      n = 1 + t_rand(&p->seed) % (n < 300 ? n : 300);
    int64_t rv = hr_session_recv(to, b + pos, n, p->now);
    if (rv < 0)
      return rv;
    pos += n;
  }
  return 0;
}

/* Pulls what `from` has to send at `now` (one pull of at most `iov_max`
 * pieces, 256 at the most) into one malloc()ed buffer, *buf, and marks
 * it consumed.  Returns its bytes (0: nothing, *buf NULL), or the pull's
 * negative error. */
static inline int64_t pull_all(hr_session *from, int iov_max, hr_tstamp now,
                               uint8_t **buf) {
  hr_iov iov[256];
  *buf = NULL;
  int n = hr_session_pull(from, iov, iov_max < 256 ? iov_max : 256, now);
  if (n < 0)
    return n;
  size_t total = 0;
  for (int i = 0; i < n; i++)
    total += iov[i].len;
  if (!total)
    return 0;
  *buf = malloc(total);
  assert_non_null(*buf);
  size_t pos = 0;
  for (int i = 0; i < n; i++) {
    memcpy(*buf + pos, iov[i].base, iov[i].len);
    pos += iov[i].len;
  }
  hr_session_consumed(from, total, now);
  return (int64_t)total;
}

/* Moves what `from` has to send into `to`.  Returns bytes moved, or a
 * negative error. */
static inline int64_t pump(pair *p, hr_session *from, hr_session *to) {
  uint8_t *buf;
  int64_t total = pull_all(from, p->iov_max, p->now, &buf);
  if (total <= 0)
    return total;
  int64_t rv = to ? feed(p, to, buf, (size_t)total) : 0;
  free(buf);
  return rv < 0 ? rv : total;
}

/* Picks the descriptors that travel with one pulled message, as a Unix
 * socket would carry them: `fd` is the one the session handed out with
 * it (-1: none).  Fills fds (at most 2) and returns how many; the picker
 * owns what it puts there until pump_fds() passes them on. */
typedef int (*pump_fds_pick)(void *ud, hr_session *from, int fd, int fds[2]);

/* pump() for SHM tests: moves what `from` has to send into `to` in one
 * piece, with the descriptors `pick` chooses.  Returns bytes moved, or a
 * negative error. */
static inline int64_t pump_fds(pair *p, hr_session *from, hr_session *to,
                               pump_fds_pick pick, void *ud) {
  hr_iov iov[64];
  int n = hr_session_pull(from, iov, 64, p->now);
  if (n < 0)
    return n;
  size_t total = 0;
  for (int i = 0; i < n; i++)
    total += iov[i].len;
  if (!total)
    return 0;
  int fd = hr_session_pull_fd(from);
  uint8_t *buf = malloc(total), *q = buf;
  for (int i = 0; i < n; i++) {
    memcpy(q, iov[i].base, iov[i].len);
    q += iov[i].len;
  }
  hr_session_consumed(from, total, p->now);
  int fds[2];
  int nfds = pick(ud, from, fd, fds);
  if (nfds)
    assert_int_equal(hr_session_recv_fds(to, fds, (size_t)nfds, total, p->now),
                     0);
  int64_t rv = hr_session_recv(to, buf, total, p->now);
  free(buf);
  return rv < 0 ? rv : (int64_t)total;
}

/* Runs queued work items (as a pool would), in submission order. */
static inline int run_work(pair *p) {
  int n = p->wq.n;
  for (int i = 0; i < n; i++)
    p->wq.items[i]->run(p->wq.items[i]);
  for (int i = 0; i < n; i++)
    hr_session_work_done(p->wq.owner[i], p->wq.items[i], p->now);
  memmove(p->wq.items, p->wq.items + n,
          (size_t)(p->wq.n - n) * sizeof p->wq.items[0]);
  memmove(p->wq.owner, p->wq.owner + n,
          (size_t)(p->wq.n - n) * sizeof p->wq.owner[0]);
  p->wq.n -= n;
  return n;
}

/* Pumps both ways until nothing moves.  Returns 0 or a negative error. */
static inline int run(pair *p) {
  for (int rounds = 0; rounds < 1000000; rounds++) {
    int64_t a = pump(p, p->c, p->s);
    if (a < 0)
      return (int)a;
    int64_t b = pump(p, p->s, p->c);
    if (b < 0)
      return (int)b;
    int w = run_work(p);
    if (a == 0 && b == 0 && w == 0)
      return 0;
  }
  return -1;
}

/* ---- tensors ------------------------------------------------------------- */

static inline void fill_bytes(hr_tensor *t, uint64_t seed) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  for (unsigned k = 0; k < d->buffer_count; k++) {
    uint8_t *b = hr_tensor_buffer(t, k);
    for (uint64_t i = 0; i < d->buffers[k].size_bytes; i++)
      b[i] = (uint8_t)t_rand(&seed);
  }
}

static inline void desc_init(hr_descriptor *d, uint8_t elem, uint8_t layout,
                             unsigned rank, const uint64_t *shape) {
  memset(d, 0, sizeof *d);
  d->descriptor_version = 1;
  d->element_type = elem;
  d->rank = (uint8_t)rank;
  d->layout.tag = layout;
  for (unsigned k = 0; k < rank; k++)
    d->shape[k] = shape[k];
}

/* A dense tensor with random contents; sizes computed by the codec. */
static inline hr_tensor *dense(uint8_t elem, uint8_t layout, unsigned rank,
                               const uint64_t *shape,
                               const hr_layout_params *params, uint32_t mr,
                               uint64_t seed) {
  hr_descriptor d;
  desc_init(&d, elem, layout, rank, shape);
  static uint8_t mr_ext[4];
  if (params)
    d.params = *params;
  if (layout == HR_LAYOUT_PANEL) {
    mr_ext[0] = (uint8_t)mr;
    mr_ext[1] = (uint8_t)(mr >> 8);
    mr_ext[2] = mr_ext[3] = 0;
    d.layout.ext = mr_ext;
    d.layout.ext_len = 4;
    d.params.mr = mr;
  }
  uint64_t sizes[HR_MAX_BUFFERS];
  hr_wire_status st;
  int n = hr_descriptor_buffer_sizes(&d, sizes, &st);
  if (n < 0)
    return NULL;
  d.buffer_count = (uint8_t)n;
  for (int k = 0; k < n; k++)
    d.buffers[k].size_bytes = sizes[k];
  hr_tensor *t = NULL;
  if (hr_tensor_alloc(&t, &d, 0, NULL))
    return NULL;
  fill_bytes(t, seed);
  return t;
}

static inline hr_tensor *row_major(uint8_t elem, unsigned rank,
                                   const uint64_t *shape, uint64_t seed) {
  return dense(elem, HR_LAYOUT_ROW_MAJOR, rank, shape, NULL, 0, seed);
}

/* Same descriptor essentials and identical bytes. */
static inline int same_tensor(hr_tensor *a, hr_tensor *b) {
  const hr_descriptor *x = hr_tensor_descriptor(a),
                      *y = hr_tensor_descriptor(b);
  if (x->element_type != y->element_type || x->rank != y->rank ||
      x->layout.tag != y->layout.tag || x->buffer_count != y->buffer_count)
    return 0;
  for (unsigned k = 0; k < x->rank; k++)
    if (x->shape[k] != y->shape[k])
      return 0;
  for (unsigned k = 0; k < x->buffer_count; k++) {
    if (x->buffers[k].size_bytes != y->buffers[k].size_bytes)
      return 0;
    if (x->buffers[k].size_bytes &&
        memcmp(hr_tensor_buffer(a, k), hr_tensor_buffer(b, k),
               x->buffers[k].size_bytes))
      return 0;
  }
  if (hr_tensor_member_count(a) != hr_tensor_member_count(b))
    return 0;
  for (size_t i = 0; i < hr_tensor_member_count(a); i++)
    if (!same_tensor(hr_tensor_member(a, i), hr_tensor_member(b, i)))
      return 0;
  return 1;
}

static inline hr_get_opts get_opts(const char *key) {
  hr_get_opts o;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)key;
  o.key_len = (uint16_t)strlen(key);
  return o;
}

#endif /* HR_TEST_ENGINE_CORE_HARNESS_H */
