/*
 * AUTH_TOKEN checking: a table of token digests with permissions, and a
 * provider wrapper that enforces it (see <hurray/auth.h>).
 *
 * Tables are immutable once built and reference-counted: a reload builds
 * a new one and swaps the pointer under the lock, while a LIST that is
 * walking the old one keeps it alive until it returns.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <hurray/auth.h>
#include <hurray/wire.h>

#include "hr_internal.h"

#define DIGEST_LEN 32
#define MAX_FILE (16u << 20)

typedef struct prefix {
  uint8_t *p;
  uint16_t len;
} prefix;

typedef struct entry {
  uint8_t digest[DIGEST_LEN];
  unsigned perms;
  prefix *pfx; /* NULL with npfx 0: every key */
  size_t npfx;
} entry;

typedef struct table {
  unsigned refs; /* under hr_auth.lock */
  entry *v;
  size_t n, cap;
} table;

typedef struct wrap {
  hr_auth *a;
  hr_provider inner;
  struct wrap *next;
} wrap;

struct hr_auth {
  hr_mem mem;
  pthread_mutex_t lock;
  table *cur;
  wrap *wraps;
};

/* ---- tables ---------------------------------------------------------- */

static void table_free(const hr_mem *mem, table *t) {
  size_t i, k;

  if (!t)
    return;
  for (i = 0; i < t->n; i++) {
    for (k = 0; k < t->v[i].npfx; k++)
      hr__mem_free(mem, t->v[i].pfx[k].p);
    hr__mem_free(mem, t->v[i].pfx);
  }
  hr__mem_free(mem, t->v);
  hr__mem_free(mem, t);
}

static table *acquire(hr_auth *a) {
  table *t;

  pthread_mutex_lock(&a->lock);
  t = a->cur;
  t->refs++;
  pthread_mutex_unlock(&a->lock);
  return t;
}

static void release(hr_auth *a, table *t) {
  unsigned left;

  pthread_mutex_lock(&a->lock);
  left = --t->refs;
  pthread_mutex_unlock(&a->lock);
  if (left == 0)
    table_free(&a->mem, t);
}

static int digest(const uint8_t *token, size_t len, uint8_t out[DIGEST_LEN]) {
  unsigned n = 0;

  if (!EVP_Digest(token, len, out, &n, EVP_sha256(), NULL) ||
      n != DIGEST_LEN)
    return HR_ERR_INTERNAL;
  return 0;
}

/* The entry whose digest matches, comparing with every entry so that the
 * time taken does not say where, or whether, the token matched. */
static const entry *find(const table *t, const uint8_t d[DIGEST_LEN]) {
  const entry *hit = NULL;
  size_t i;

  for (i = 0; i < t->n; i++) {
    int diff = CRYPTO_memcmp(t->v[i].digest, d, DIGEST_LEN);
    if (diff == 0)
      hit = &t->v[i];
  }
  return hit;
}

static int in_scope(const entry *e, const uint8_t *key, size_t key_len) {
  size_t k;

  if (e->npfx == 0)
    return 1;
  for (k = 0; k < e->npfx; k++)
    if (key_len >= e->pfx[k].len && memcmp(key, e->pfx[k].p, e->pfx[k].len) == 0)
      return 1;
  return 0;
}

static int allowed(const entry *e, unsigned need, const uint8_t *key,
                   size_t key_len) {
  if ((e->perms & need) != need)
    return 0;
  return !key || in_scope(e, key, key_len);
}

/* ---- parsing --------------------------------------------------------- */

static int fail(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *why, size_t why_len, const char *fmt, ...) {
  va_list ap;

  if (why && why_len) {
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
  }
  return HR_ERR_INVALID_ARGUMENT;
}

static int is_blank(char c) { return c == ' ' || c == '\t'; }

/* Splits [p, end) into fields; returns how many (at most max + 1, so that
 * "too many" can be told). */
static size_t split(const char *p, const char *end, const char **f,
                    size_t *flen, size_t max) {
  size_t n = 0;

  while (p < end) {
    while (p < end && is_blank(*p))
      p++;
    if (p == end)
      break;
    const char *s = p;
    while (p < end && !is_blank(*p))
      p++;
    if (n <= max) {
      f[n] = s;
      flen[n] = (size_t)(p - s);
    }
    n++;
    if (n > max)
      break;
  }
  return n;
}

static int add_entry(const hr_mem *mem, table *t, const char **f,
                     const size_t *flen, size_t nf, unsigned line, char *why,
                     size_t why_len) {
  entry e;
  size_t i, k, first_pfx = 1;
  int rv;

  memset(&e, 0, sizeof e);
  if (flen[0] > HR_AUTH_MAX_TOKEN)
    return fail(why, why_len,
                "line %u: the token is longer than %d bytes", line,
                HR_AUTH_MAX_TOKEN);
  rv = digest((const uint8_t *)f[0], flen[0], e.digest);
  if (rv)
    return fail(why, why_len, "line %u: cannot hash the token", line);
  e.perms = HR_AUTH_READ | HR_AUTH_WRITE;
  if (nf > 1) {
    if (flen[1] == 2 && memcmp(f[1], "ro", 2) == 0)
      e.perms = HR_AUTH_READ;
    else if (flen[1] == 2 && memcmp(f[1], "rw", 2) == 0)
      e.perms = HR_AUTH_READ | HR_AUTH_WRITE;
    else
      return fail(why, why_len,
                  "line %u: expected \"ro\" or \"rw\" after the token, got "
                  "\"%.*s\"",
                  line, (int)(flen[1] > 64 ? 64 : flen[1]), f[1]);
    first_pfx = 2;
  }
  if (nf > first_pfx) {
    if (nf - first_pfx > HR_AUTH_MAX_PREFIXES)
      return fail(why, why_len, "line %u: more than %d prefixes", line,
                  HR_AUTH_MAX_PREFIXES);
    for (i = first_pfx; i < nf; i++)
      if (flen[i] > HR_MAX_KEY || !hr_utf8_valid((const uint8_t *)f[i], flen[i]))
        return fail(why, why_len,
                    "line %u: prefix %zu is not 1-%d bytes of UTF-8", line,
                    i - first_pfx + 1, HR_MAX_KEY);
    e.npfx = nf - first_pfx;
    e.pfx = hr__mem_calloc(mem, e.npfx, sizeof *e.pfx);
    if (!e.pfx)
      return HR_ERR_NOMEM;
    for (k = 0; k < e.npfx; k++) {
      size_t len = flen[first_pfx + k];
      e.pfx[k].p = hr__mem_malloc(mem, len);
      if (!e.pfx[k].p) {
        for (i = 0; i < k; i++)
          hr__mem_free(mem, e.pfx[i].p);
        hr__mem_free(mem, e.pfx);
        return HR_ERR_NOMEM;
      }
      memcpy(e.pfx[k].p, f[first_pfx + k], len);
      e.pfx[k].len = (uint16_t)len;
    }
  }
  for (i = 0; i < t->n; i++) {
    if (memcmp(t->v[i].digest, e.digest, DIGEST_LEN) == 0) {
      for (k = 0; k < e.npfx; k++)
        hr__mem_free(mem, e.pfx[k].p);
      hr__mem_free(mem, e.pfx);
      return fail(why, why_len,
                  "line %u: this token is already listed on an earlier line",
                  line);
    }
  }
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 8;
    entry *v = hr__mem_realloc(mem, t->v, cap * sizeof *v);
    if (!v) {
      for (k = 0; k < e.npfx; k++)
        hr__mem_free(mem, e.pfx[k].p);
      hr__mem_free(mem, e.pfx);
      return HR_ERR_NOMEM;
    }
    t->v = v;
    t->cap = cap;
  }
  t->v[t->n++] = e;
  return 0;
}

static int parse(const hr_mem *mem, const char *text, size_t len, table **out,
                 char *why, size_t why_len) {
  const char *p = text, *end = text + len;
  const char *f[HR_AUTH_MAX_PREFIXES + 3];
  size_t flen[HR_AUTH_MAX_PREFIXES + 3];
  unsigned line = 0;
  table *t;
  int rv = 0;

  if (len && memchr(text, '\0', len))
    return fail(why, why_len, "the token file holds a NUL byte");
  t = hr__mem_calloc(mem, 1, sizeof *t);
  if (!t)
    return HR_ERR_NOMEM;
  t->refs = 1;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *le = nl ? nl : end, *s = p;
    size_t nf;

    line++;
    p = nl ? nl + 1 : end;
    if (le > s && le[-1] == '\r')
      le--;
    while (s < le && is_blank(*s))
      s++;
    if (s == le || *s == '#')
      continue;
    nf = split(s, le, f, flen, HR_AUTH_MAX_PREFIXES + 2);
    if (nf > HR_AUTH_MAX_PREFIXES + 2) {
      rv = fail(why, why_len, "line %u: more than %d prefixes", line,
                HR_AUTH_MAX_PREFIXES);
      break;
    }
    rv = add_entry(mem, t, f, flen, nf, line, why, why_len);
    if (rv)
      break;
  }
  if (rv) {
    if (rv == HR_ERR_NOMEM)
      fail(why, why_len, "out of memory reading the token file");
    table_free(mem, t);
    return rv;
  }
  *out = t;
  return 0;
}

/* ---- the table ------------------------------------------------------- */

int hr_auth_new(hr_auth **out, const hr_mem *mem) {
  hr_auth *a;

  if (!out)
    return HR_ERR_INVALID_ARGUMENT;
  if (!mem)
    mem = hr_mem_default();
  a = hr__mem_calloc(mem, 1, sizeof *a);
  if (!a)
    return HR_ERR_NOMEM;
  a->mem = *mem;
  a->cur = hr__mem_calloc(mem, 1, sizeof *a->cur);
  if (!a->cur) {
    hr__mem_free(mem, a);
    return HR_ERR_NOMEM;
  }
  a->cur->refs = 1;
  if (pthread_mutex_init(&a->lock, NULL) != 0) {
    hr__mem_free(mem, a->cur);
    hr__mem_free(mem, a);
    return HR_ERR_NOMEM;
  }
  *out = a;
  return 0;
}

void hr_auth_del(hr_auth *a) {
  wrap *w, *next;

  if (!a)
    return;
  for (w = a->wraps; w; w = next) {
    next = w->next;
    hr__mem_free(&a->mem, w);
  }
  release(a, a->cur);
  pthread_mutex_destroy(&a->lock);
  hr__mem_free(&a->mem, a);
}

int hr_auth_load(hr_auth *a, const char *text, size_t len, char *why,
                 size_t why_len) {
  table *t, *old;
  int rv;

  if (why && why_len)
    why[0] = '\0';
  if (!a || (!text && len))
    return HR_ERR_INVALID_ARGUMENT;
  rv = parse(&a->mem, text ? text : "", len, &t, why, why_len);
  if (rv)
    return rv;
  pthread_mutex_lock(&a->lock);
  old = a->cur;
  a->cur = t;
  pthread_mutex_unlock(&a->lock);
  release(a, old);
  return 0;
}

int hr_auth_load_file(hr_auth *a, const char *path, char *why,
                      size_t why_len) {
  FILE *f;
  char *buf;
  size_t n = 0;
  int rv;

  if (why && why_len)
    why[0] = '\0';
  if (!a || !path)
    return HR_ERR_INVALID_ARGUMENT;
  f = fopen(path, "rb");
  if (!f) {
    fail(why, why_len, "cannot open %s: %s", path, strerror(errno));
    return HR_ERR_IO;
  }
  buf = hr__mem_malloc(&a->mem, MAX_FILE + 1);
  if (!buf) {
    fclose(f);
    fail(why, why_len, "out of memory reading %s", path);
    return HR_ERR_NOMEM;
  }
  n = fread(buf, 1, MAX_FILE + 1, f);
  if (ferror(f)) {
    fail(why, why_len, "cannot read %s: %s", path, strerror(errno));
    rv = HR_ERR_IO;
  } else if (n > MAX_FILE) {
    rv = fail(why, why_len, "%s is larger than %u bytes", path, MAX_FILE);
  } else {
    rv = hr_auth_load(a, buf, n, why, why_len);
  }
  fclose(f);
  hr__mem_free(&a->mem, buf);
  return rv;
}

size_t hr_auth_count(const hr_auth *a) {
  hr_auth *m = (hr_auth *)a; /* the lock is not part of the value */
  size_t n;

  if (!a)
    return 0;
  pthread_mutex_lock(&m->lock);
  n = m->cur->n;
  pthread_mutex_unlock(&m->lock);
  return n;
}

/* hr_auth_check(); *narrow (may be NULL) is set when the token is bounded
 * to prefixes, i.e. may not read every key. */
static int check_token(hr_auth *a, const uint8_t *token, size_t token_len,
                       unsigned need, const uint8_t *key, size_t key_len,
                       int *narrow) {
  uint8_t d[DIGEST_LEN];
  const entry *e;
  table *t;
  int rv;

  if (!a || (!token && token_len))
    return HR_ERR_INVALID_ARGUMENT;
  if (!token || digest(token, token_len, d))
    return HR_ERR_NOT_FOUND;
  t = acquire(a);
  e = find(t, d);
  rv = !e ? HR_ERR_NOT_FOUND : allowed(e, need, key, key_len) ? 0 : HR_ERR_STATE;
  if (e && narrow)
    *narrow = e->npfx != 0;
  release(a, t);
  return rv;
}

int hr_auth_check(hr_auth *a, const uint8_t *token, size_t token_len,
                  unsigned need, const uint8_t *key, size_t key_len) {
  return check_token(a, token, token_len, need, key, key_len, NULL);
}

/* ---- the provider wrapper -------------------------------------------- */

/* The token the session's client presented (lane 0's HELLO, since the
 * provider sees lane 0). */
static int check_session(wrap *w, hr_session *s, unsigned need,
                         const uint8_t *key, size_t key_len) {
  const hr_hello *h = hr_session_peer_hello(s);

  if (!h)
    return HR_ERR_NOT_FOUND;
  return hr_auth_check(w->a, h->exts.auth_token, h->exts.auth_token_len, need,
                       key, key_len);
}

static int w_on_hello(hr_session *s, const hr_hello *peer, uint32_t *wire_error,
                      void *ud) {
  wrap *w = ud;

  if (hr_auth_check(w->a, peer->exts.auth_token, peer->exts.auth_token_len, 0,
                    NULL, 0) != 0) {
    *wire_error = HR_WIRE_UNAUTHORIZED;
    return 0;
  }
  if (w->inner.size >= offsetof(hr_provider, on_hello) +
                           sizeof w->inner.on_hello &&
      w->inner.on_hello)
    return w->inner.on_hello(s, peer, wire_error, w->inner.user_data);
  return 0;
}

/* The landing memory of a PUT that on_put_begin let through: the inner
 * provider's, unchanged (it decides where, not whether). */
static int w_on_put_alloc(hr_session *s, const hr_descriptor *d,
                          unsigned min_alignment_log2, hr_tensor **out,
                          void *ud) {
  wrap *w = ud;

  return w->inner.on_put_alloc(s, d, min_alignment_log2, out,
                               w->inner.user_data);
}

static int w_on_get(hr_session *s, hr_srv_get *g, void *ud) {
  wrap *w = ud;
  const hr_get_info *gi = hr_srv_get_info(g);
  const hr_hello *h = hr_session_peer_hello(s);
  int narrow = 1;

  if (!gi || !h ||
      check_token(w->a, h->exts.auth_token, h->exts.auth_token_len,
                  HR_AUTH_READ, gi->key, gi->key_len, &narrow)) {
    int rv = hr_get_fail(g, HR_WIRE_UNAUTHORIZED,
                         "the token does not allow reading this key");
    return hr_err_is_fatal(rv) ? HR_ERR_CALLBACK_FAILURE : 0;
  }
  /* A token bounded to prefixes must never be handed memory that holds
   * other keys too (a shared arena's segment). */
  if (narrow)
    hr_get_set_narrow(g);
  return w->inner.on_get(s, g, w->inner.user_data);
}

static void w_on_get_cancel(hr_session *s, hr_srv_get *g, void *ud) {
  wrap *w = ud;

  w->inner.on_get_cancel(s, g, w->inner.user_data);
}

static int w_on_put_begin(hr_session *s, const hr_put_info *info,
                          uint32_t *wire_error, void *ud) {
  wrap *w = ud;

  if (check_session(w, s, HR_AUTH_WRITE, info->key, info->key_len)) {
    *wire_error = HR_WIRE_UNAUTHORIZED;
    return 0;
  }
  return w->inner.on_put_begin(s, info, wire_error, w->inner.user_data);
}

static int w_on_put_commit(hr_session *s, const hr_put_info *info,
                           hr_tensor *t, uint32_t *wire_error, void *ud) {
  wrap *w = ud;

  /* Checked again: the table may have been reloaded while the bytes
   * arrived, and a revoked token must not store anything. */
  if (check_session(w, s, HR_AUTH_WRITE, info->key, info->key_len)) {
    *wire_error = HR_WIRE_UNAUTHORIZED;
    return 0;
  }
  return w->inner.on_put_commit(s, info, t, wire_error, w->inner.user_data);
}

static void w_on_put_abort(hr_session *s, const hr_put_info *info, void *ud) {
  wrap *w = ud;

  if (w->inner.on_put_abort)
    w->inner.on_put_abort(s, info, w->inner.user_data);
}

typedef struct list_filter {
  int (*emit)(void *emit_ctx, const hr_list_entry *e);
  void *emit_ctx;
  const entry *e;
} list_filter;

static int filtered_emit(void *ctx, const hr_list_entry *le) {
  list_filter *lf = ctx;

  if (!le || !le->key || !in_scope(lf->e, le->key, le->key_len))
    return 0;
  return lf->emit(lf->emit_ctx, le);
}

/* Whether some key with the request's prefix can be inside one of the
 * entry's prefixes: one of the two prefixes must extend the other. */
static int prefix_meets(const entry *e, const uint8_t *p, size_t n) {
  size_t k;

  if (e->npfx == 0)
    return 1;
  for (k = 0; k < e->npfx; k++) {
    size_t m = n < e->pfx[k].len ? n : e->pfx[k].len;
    if (m == 0 || memcmp(p, e->pfx[k].p, m) == 0)
      return 1;
  }
  return 0;
}

static int w_on_list(hr_session *s, const hr_list_request *req,
                     int (*emit)(void *emit_ctx, const hr_list_entry *e),
                     void *emit_ctx, int *more, void *ud) {
  wrap *w = ud;
  const hr_hello *h = hr_session_peer_hello(s);
  uint8_t d[DIGEST_LEN];
  const entry *e = NULL;
  list_filter lf;
  table *t;
  int rv = 0;

  *more = 0;
  if (!h || !h->exts.auth_token ||
      digest(h->exts.auth_token, h->exts.auth_token_len, d))
    return 0; /* an empty page: nothing is revealed */
  t = acquire(w->a);
  e = find(t, d);
  /* A token revoked since the HELLO, or one that may see nothing under
   * the request's prefix, gets an empty page. */
  if (e && (e->perms & HR_AUTH_READ) &&
      prefix_meets(e, req->prefix, req->prefix_len)) {
    lf.emit = emit;
    lf.emit_ctx = emit_ctx;
    lf.e = e;
    rv = w->inner.on_list(s, req, filtered_emit, &lf, more,
                          w->inner.user_data);
  }
  release(w->a, t);
  return rv;
}

int hr_auth_wrap(hr_auth *a, const hr_provider *inner, hr_provider *out) {
  wrap *w;

  if (!a || !inner || !out || inner->size < offsetof(hr_provider, on_hello))
    return HR_ERR_INVALID_ARGUMENT;
  w = hr__mem_calloc(&a->mem, 1, sizeof *w);
  if (!w)
    return HR_ERR_NOMEM;
  w->a = a;
  memcpy(&w->inner, inner,
         inner->size < sizeof w->inner ? inner->size : sizeof w->inner);
  w->inner.size = sizeof w->inner; /* members past inner->size are 0 */
  pthread_mutex_lock(&a->lock);
  w->next = a->wraps;
  a->wraps = w;
  pthread_mutex_unlock(&a->lock);

  /* From w->inner only: `out` may be `inner`. */
  memset(out, 0, sizeof *out);
  out->size = sizeof *out;
  out->user_data = w;
  out->on_get = w->inner.on_get ? w_on_get : NULL;
  out->on_get_cancel = w->inner.on_get_cancel ? w_on_get_cancel : NULL;
  out->on_put_begin = w->inner.on_put_begin ? w_on_put_begin : NULL;
  out->on_put_commit = w->inner.on_put_commit ? w_on_put_commit : NULL;
  out->on_put_abort = w->inner.on_put_begin ? w_on_put_abort : NULL;
  out->on_list = w->inner.on_list ? w_on_list : NULL;
  out->on_hello = w_on_hello;
  out->on_put_alloc = w->inner.on_put_alloc ? w_on_put_alloc : NULL;
  return 0;
}
