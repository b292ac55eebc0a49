/*
 * An in-memory multi-connection session: a client group of n lanes and the
 * n server sessions they talk to, joined through one registry, plus the
 * toy store of the engine-core harness as the provider.
 *
 * lnet_run() moves bytes over every connection that is not cut, taking
 * the connections in a random order each round, so that the shards of one
 * answer arrive interleaved and out of order.  A cut connection moves
 * nothing (a cable pulled): each side notices only when the test calls
 * hr_session_terminate() on it, as a host would on EOF or an error.
 */
#ifndef HR_TEST_LANES_H
#define HR_TEST_LANES_H

#include "engine_core/harness.h"

typedef struct lnet {
  hr_registry *reg;
  store st;
  hr_group *g;
  hr_session *c[HR_MAX_LANES + 1], *s[HR_MAX_LANES + 1];
  int cut[HR_MAX_LANES + 1];
  int n;   /* connections opened */
  pair io; /* feed/pump options: now, seed, chunked, zero_copy */
  uint64_t rnd;
  int random_fails;
  int errors_c, errors_s;
  uint32_t last_err_c, last_err_s;
  int err_sent_c;
  /* Server records by lane position (shard streams each report). */
  int srv_rec[HR_MAX_LANES + 1];
  int srv_rec_failed;
  hr_settings cs, ss;
  hr_test_failmem fm;
  int use_fm;
} lnet;

static inline int ln_random(void *buf, size_t len, void *ud) {
  lnet *n = ud;
  if (n->random_fails)
    return -1;
  uint8_t *b = buf;
  for (size_t i = 0; i < len; i++)
    b[i] = (uint8_t)t_rand(&n->rnd);
  return 0;
}

static inline int ln_index(lnet *n, hr_session *s, int server) {
  for (int i = 0; i < n->n; i++)
    if ((server ? n->s[i] : n->c[i]) == s)
      return i;
  return -1;
}

static inline void ln_on_error(hr_session *s, uint32_t code, int sent,
                               const char *msg, void *ud) {
  lnet *n = ud;
  (void)msg;
  if (hr_session_role(s) == HR_ROLE_CLIENT) {
    n->errors_c++;
    n->last_err_c = code;
    n->err_sent_c = sent;
  } else {
    n->errors_s++;
    n->last_err_s = code;
  }
}

static inline void ln_on_transfer(hr_session *s, const hr_transfer_record *r,
                                  void *ud) {
  lnet *n = ud;
  if (hr_session_role(s) != HR_ROLE_SERVER)
    return;
  if (r->status) {
    n->srv_rec_failed++;
    return;
  }
  int lane = hr_session_lane(s);
  if (lane >= 0)
    n->srv_rec[lane]++;
}

static inline hr_session_callbacks ln_callbacks(void) {
  hr_session_callbacks cb;
  memset(&cb, 0, sizeof cb);
  cb.size = sizeof cb;
  cb.on_error = ln_on_error;
  cb.on_transfer = ln_on_transfer;
  return cb;
}

static inline const hr_mem *ln_mem(lnet *n) {
  return n->use_fm ? &n->fm.mem : NULL;
}

/* Feeds bytes to *to like the harness's feed(), but stops when a
 * callback deleted the session (the slot is cleared then). */
static inline int64_t ln_feed(lnet *n, hr_session **to, const uint8_t *b,
                              size_t len) {
  pair *p = &n->io;
  size_t pos = 0;
  while (pos < len && *to) {
    if (p->zero_copy) {
      void *dst;
      size_t k;
      if (hr_session_recv_target(*to, &dst, &k)) {
        if (k > len - pos)
          k = len - pos;
        if (p->chunked && k > 1)
          k = 1 + t_rand(&p->seed) % k;
        memcpy(dst, b + pos, k);
        int rv = hr_session_recv_placed(*to, k, p->now);
        if (rv)
          return rv;
        pos += k;
        continue;
      }
    }
    size_t k = len - pos;
    if (p->chunked && k > 1)
      k = 1 + t_rand(&p->seed) % (k < 300 ? k : 300);
    int64_t rv = hr_session_recv(*to, b + pos, k, p->now);
    if (rv < 0)
      return rv;
    pos += k;
  }
  return 0;
}

/* Moves what *from has to send into *to.  Returns bytes moved or < 0. */
static inline int64_t ln_xfer(lnet *n, hr_session **from, hr_session **to) {
  if (!*from || !*to)
    return 0;
  hr_iov iov[64];
  int k = hr_session_pull(*from, iov, n->io.iov_max < 64 ? n->io.iov_max : 64,
                          n->io.now);
  if (k < 0)
    return k;
  size_t total = 0;
  for (int i = 0; i < k; i++)
    total += iov[i].len;
  if (!total)
    return 0;
  uint8_t *buf = malloc(total);
  size_t pos = 0;
  for (int i = 0; i < k; i++) {
    memcpy(buf + pos, iov[i].base, iov[i].len);
    pos += iov[i].len;
  }
  hr_session_consumed(*from, total, n->io.now);
  int64_t rv = ln_feed(n, to, buf, total);
  free(buf);
  return rv < 0 ? rv : (int64_t)total;
}

/* Moves bytes both ways on connection i.  Returns bytes moved or < 0. */
static inline int64_t ln_pump(lnet *n, int i) {
  if (n->cut[i])
    return 0;
  int64_t a = ln_xfer(n, &n->c[i], &n->s[i]);
  if (a < 0)
    return a;
  int64_t b = ln_xfer(n, &n->s[i], &n->c[i]);
  if (b < 0)
    return b;
  return a + b;
}

/* Pumps every connection, in a random order each round, until nothing
 * moves.  Returns 0 or a negative error. */
static inline int lnet_run(lnet *n) {
  for (int rounds = 0; rounds < 1000000; rounds++) {
    int order[HR_MAX_LANES + 1];
    for (int i = 0; i < n->n; i++)
      order[i] = i;
    for (int i = n->n - 1; i > 0; i--) {
      int j = (int)(t_rand(&n->io.seed) % (uint32_t)(i + 1));
      int t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    int64_t moved = 0;
    for (int i = 0; i < n->n; i++) {
      int64_t m = ln_pump(n, order[i]);
      if (m < 0)
        return (int)m;
      moved += m;
    }
    if (moved == 0)
      return 0;
  }
  return -1;
}

/* Runs `rounds` rounds of one pull per direction per connection (partial
 * progress, to cut in the middle of a transfer). */
static inline int lnet_step(lnet *n, int rounds) {
  for (int r = 0; r < rounds; r++)
    for (int i = 0; i < n->n; i++) {
      int64_t m = ln_pump(n, i);
      if (m < 0)
        return (int)m;
    }
  return 0;
}

/* A new server session on connection i. */
static inline int ln_server(lnet *n, int i, int with_registry) {
  hr_session_callbacks cb = ln_callbacks();
  hr_provider prov = store_provider(&n->st);
  int rv = hr_session_new(&n->s[i], HR_ROLE_SERVER, &n->ss, &cb, &prov, n,
                          n->io.now, ln_mem(n));
  if (rv == 0 && with_registry)
    rv = hr_session_set_registry(n->s[i], n->reg);
  return rv;
}

/* Adds lane n->n (client lane + server session) and runs its handshake. */
static inline int lnet_add_lane(lnet *n) {
  int i = n->n;
  int rv = hr_group_add_lane(n->g, n, n->io.now, &n->c[i]);
  if (rv)
    return rv;
  rv = ln_server(n, i, 1);
  if (rv)
    return rv;
  n->n++;
  return lnet_run(n);
}

/* Opens lane 0 and `lanes - 1` more.  Settings NULL: defaults. */
static inline int lnet_open(lnet *n, int lanes, const hr_settings *cs,
                            const hr_settings *ss) {
  if (!n->rnd)
    n->rnd = 99;
  if (!n->io.seed)
    n->io.seed = 4242;
  if (!n->io.iov_max)
    n->io.iov_max = 64;
  if (cs)
    n->cs = *cs;
  else
    hr_settings_default(&n->cs);
  if (ss)
    n->ss = *ss;
  else
    hr_settings_default(&n->ss);
  int rv = hr_registry_new(&n->reg, ln_random, n, ln_mem(n));
  if (rv)
    return rv;
  hr_session_callbacks cb = ln_callbacks();
  rv = hr_session_new(&n->c[0], HR_ROLE_CLIENT, &n->cs, &cb, NULL, n, n->io.now,
                      ln_mem(n));
  if (rv)
    return rv;
  rv = ln_server(n, 0, 1);
  if (rv)
    return rv;
  n->n = 1;
  rv = hr_group_new(&n->g, n->c[0]);
  if (rv)
    return rv;
  rv = lnet_run(n);
  for (int i = 1; rv == 0 && i < lanes; i++)
    rv = lnet_add_lane(n);
  return rv;
}

static inline void lnet_close(lnet *n) {
  for (int i = 0; i < n->n; i++) {
    hr_session_del(n->c[i]);
    hr_session_del(n->s[i]);
    n->c[i] = n->s[i] = NULL;
  }
  hr_group_del(n->g);
  hr_registry_del(n->reg);
  n->g = NULL;
  n->reg = NULL;
  store_clear(&n->st);
}

/* Streams open on every session of both sides. */
static inline size_t lnet_streams(lnet *n) {
  size_t k = 0;
  for (int i = 0; i < n->n; i++)
    k += hr_session_stream_count(n->c[i]) + hr_session_stream_count(n->s[i]);
  return k;
}

#endif /* HR_TEST_LANES_H */
