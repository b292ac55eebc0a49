/*
 * The in-memory tensor store: a sorted array of (key, tensor) under a
 * reader-writer lock.
 *
 * A sorted array keeps LIST a binary search plus a walk, and a store of a
 * few thousand keys changes rarely enough that the memmove of an insert
 * does not matter.  Tensor references are dropped outside the lock: the
 * last reference may call an application's release callback (munmap of a
 * served file), which must not run under our lock.
 */
#include <hurray/store.h>

#include <hurray/shm.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "hr_internal.h"

typedef struct entry {
  uint8_t *key;
  uint16_t key_len;
  hr_tensor *t;
  uint64_t bytes;
} entry;

struct hr_store {
  hr_mem mem;
  hr_store_config cfg;
  pthread_rwlock_t lock;
  entry *v;
  size_t n, cap;
  uint64_t bytes;
  hr_shm_arena *arena; /* cfg.shm_arena_bytes, or NULL */
};

/* Below this, a narrow reader's private copy of an arena tensor goes as
 * frames: a fresh memfd and the client's mmap cost more than the copy. */
#define PRIVATE_SEGMENT_MIN ((uint64_t)1 << 20)

static int key_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
  size_t m = an < bn ? an : bn;
  int c = m ? memcmp(a, b, m) : 0;

  if (c)
    return c;
  return an < bn ? -1 : an > bn ? 1 : 0;
}

/* Index of the first entry >= key (lower bound); *found when equal. */
static size_t lower_bound(const hr_store *s, const uint8_t *key, size_t len,
                          int *found) {
  size_t lo = 0, hi = s->n;

  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (key_cmp(s->v[mid].key, s->v[mid].key_len, key, len) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *found = lo < s->n && key_cmp(s->v[lo].key, s->v[lo].key_len, key, len) == 0;
  return lo;
}

static uint64_t tensor_bytes_deep(const hr_tensor *t) {
  size_t i, n = hr_tensor_member_count(t);
  uint64_t sum = hr_tensor_bytes(t);

  for (i = 0; i < n; i++) {
    uint64_t b = tensor_bytes_deep(hr_tensor_member(t, i));
    sum = UINT64_MAX - sum < b ? UINT64_MAX : sum + b;
  }
  return sum;
}

void hr_store_entry_of(const hr_tensor *t, hr_list_entry *out) {
  const hr_descriptor *d = hr_tensor_descriptor(t);

  memset(out, 0, sizeof *out);
  out->element_type = d->element_type;
  out->layout_tag = d->layout.tag;
  out->rank = d->rank;
  memcpy(out->shape, d->shape, sizeof(uint64_t) * d->rank);
  out->total_data_bytes = tensor_bytes_deep(t);
}

void hr_store_config_default(hr_store_config *c) {
  memset(c, 0, sizeof *c);
  c->version = HR_STORE_CONFIG_VERSION;
  c->allow_put = 0;
  c->allow_replace = 1;
  c->max_bytes = 0;
}

int hr_store_new(hr_store **out, const hr_store_config *cfg,
                 const hr_mem *mem) {
  hr_store *s;

  if (!out || (cfg && cfg->version != HR_STORE_CONFIG_VERSION))
    return HR_ERR_INVALID_ARGUMENT;
  if (!mem)
    mem = hr_mem_default();
  s = hr__mem_calloc(mem, 1, sizeof *s);
  if (!s)
    return HR_ERR_NOMEM;
  s->mem = *mem;
  if (cfg)
    s->cfg = *cfg;
  else
    hr_store_config_default(&s->cfg);
  if (s->cfg.shm_arena_bytes) {
    hr_shm_arena_config ac;
    hr_shm_arena_config_default(&ac);
    ac.max_bytes = s->cfg.shm_arena_bytes;
    int rv = hr_shm_arena_new(&s->arena, &ac, mem);
    if (rv) {
      hr__mem_free(mem, s);
      return rv;
    }
  }
  if (pthread_rwlock_init(&s->lock, NULL) != 0) {
    hr_shm_arena_del(s->arena);
    hr__mem_free(mem, s);
    return HR_ERR_NOMEM;
  }
  *out = s;
  return 0;
}

void hr_store_del(hr_store *s) {
  size_t i;

  if (!s)
    return;
  for (i = 0; i < s->n; i++) {
    hr_tensor_unref(s->v[i].t);
    hr__mem_free(&s->mem, s->v[i].key);
  }
  hr__mem_free(&s->mem, s->v);
  /* Tensors still referenced elsewhere keep their segments. */
  hr_shm_arena_del(s->arena);
  pthread_rwlock_destroy(&s->lock);
  hr__mem_free(&s->mem, s);
}

/* Inserts or replaces under the write lock.  Returns 0, HR_ERR_STATE
 * (exists, no replace), HR_ERR_LIMIT (byte cap, when `cap` is set),
 * HR_ERR_NOMEM.  *old receives a replaced tensor to unref outside. */
static int put_locked(hr_store *s, const uint8_t *key, size_t len, hr_tensor *t,
                      int replace, uint64_t cap, hr_tensor **old) {
  int found;
  size_t i = lower_bound(s, key, len, &found);
  uint64_t bytes = tensor_bytes_deep(t);
  uint64_t base = s->bytes - (found ? s->v[i].bytes : 0);

  *old = NULL;
  if (found && !replace)
    return HR_ERR_STATE;
  if (cap && (bytes > cap || base > cap - bytes))
    return HR_ERR_LIMIT;
  if (found) {
    *old = s->v[i].t;
    s->v[i].t = hr_tensor_ref(t);
    s->v[i].bytes = bytes;
    s->bytes = base + bytes;
    return 0;
  }
  if (s->n == s->cap) {
    size_t n = s->cap ? s->cap * 2 : 16;
    entry *v = hr__mem_realloc(&s->mem, s->v, n * sizeof *v);
    if (!v)
      return HR_ERR_NOMEM;
    s->v = v;
    s->cap = n;
  }
  {
    uint8_t *k = hr__mem_malloc(&s->mem, len);
    if (!k)
      return HR_ERR_NOMEM;
    memcpy(k, key, len);
    memmove(&s->v[i + 1], &s->v[i], (s->n - i) * sizeof *s->v);
    s->v[i].key = k;
    s->v[i].key_len = (uint16_t)len;
    s->v[i].t = hr_tensor_ref(t);
    s->v[i].bytes = bytes;
    s->n++;
    s->bytes = base + bytes;
  }
  return 0;
}

/* The tensor to store for `t` (a new reference): its copy in the arena
 * when there is one and `t` is a plain host tensor without a segment of
 * its own (one that has a segment is served without a copy already);
 * else `t`.  A full arena is no error: the tensor stays where it is. */
static hr_tensor *into_arena(hr_store *s, hr_tensor *t) {
  hr_tensor *c;

  if (!s->arena || hr_tensor_member_count(t) ||
      hr_tensor_segment(t, NULL, NULL) ||
      hr_tensor_descriptor(t)->layout.tag == HR_LAYOUT_COMPOSITE ||
      hr_shm_arena_copy(s->arena, &c, t) != 0)
    return hr_tensor_ref(t);
  return c;
}

struct hr_shm_arena *hr_store_arena(hr_store *s) {
  return s ? s->arena : NULL;
}

int hr_store_put(hr_store *s, const void *key, size_t key_len, hr_tensor *t,
                 uint32_t flags) {
  hr_tensor *old, *st;
  int rv;

  if (!s || !key || !t || key_len < 1 || key_len > HR_MAX_KEY)
    return HR_ERR_INVALID_ARGUMENT;
  st = into_arena(s, t);
  pthread_rwlock_wrlock(&s->lock);
  rv = put_locked(s, key, key_len, st, (flags & HR_PUT_REPLACE) != 0, 0, &old);
  pthread_rwlock_unlock(&s->lock);
  hr_tensor_unref(old);
  hr_tensor_unref(st);
  return rv;
}

int hr_store_get(hr_store *s, const void *key, size_t key_len,
                 hr_tensor **out) {
  int found;
  size_t i;

  if (!s || !out || !key)
    return HR_ERR_INVALID_ARGUMENT;
  pthread_rwlock_rdlock(&s->lock);
  i = lower_bound(s, key, key_len, &found);
  *out = found ? hr_tensor_ref(s->v[i].t) : NULL;
  pthread_rwlock_unlock(&s->lock);
  return found ? 0 : HR_ERR_NOT_FOUND;
}

int hr_store_remove(hr_store *s, const void *key, size_t key_len) {
  hr_tensor *old = NULL;
  uint8_t *k = NULL;
  int found;
  size_t i;

  if (!s || !key)
    return HR_ERR_INVALID_ARGUMENT;
  pthread_rwlock_wrlock(&s->lock);
  i = lower_bound(s, key, key_len, &found);
  if (found) {
    old = s->v[i].t;
    k = s->v[i].key;
    s->bytes -= s->v[i].bytes;
    memmove(&s->v[i], &s->v[i + 1], (s->n - i - 1) * sizeof *s->v);
    s->n--;
  }
  pthread_rwlock_unlock(&s->lock);
  hr_tensor_unref(old);
  hr__mem_free(&s->mem, k);
  return found ? 0 : HR_ERR_NOT_FOUND;
}

size_t hr_store_count(const hr_store *s) {
  size_t n;

  pthread_rwlock_rdlock((pthread_rwlock_t *)&s->lock);
  n = s->n;
  pthread_rwlock_unlock((pthread_rwlock_t *)&s->lock);
  return n;
}

void hr_store_set_max_bytes(hr_store *s, uint64_t max_bytes) {
  pthread_rwlock_wrlock(&s->lock);
  s->cfg.max_bytes = max_bytes;
  pthread_rwlock_unlock(&s->lock);
}

uint64_t hr_store_bytes(const hr_store *s) {
  uint64_t b;

  pthread_rwlock_rdlock((pthread_rwlock_t *)&s->lock);
  b = s->bytes;
  pthread_rwlock_unlock((pthread_rwlock_t *)&s->lock);
  return b;
}

/* ------------------------------------------------------------------------ */
/* The provider                                                              */
/* ------------------------------------------------------------------------ */

static void view_release(void *ctx) { hr_tensor_unref(ctx); }

/* What a narrow reader (hr_get_narrow) may be handed for `t`: `t` itself
 * unless it lies in the arena, whose segment would show every tensor in
 * it; then a private copy in a segment of its own (large tensors), or a
 * view with no segment, which goes as frames.  A new reference in *out. */
static int narrow_answer(hr_store *s, hr_tensor *t, hr_tensor **out) {
  size_t n = hr_tensor_member_count(t);
  const hr_descriptor *d = hr_tensor_descriptor(t);
  int rv;

  if (n) {
    hr_tensor *m[64], **mv = n <= 64 ? m : NULL;
    size_t i;
    int any = 0;
    for (i = 0; i < n; i++)
      any |= hr_shm_arena_owns(s->arena, hr_tensor_member(t, i));
    if (!any) {
      *out = hr_tensor_ref(t);
      return 0;
    }
    if (!mv && !(mv = hr__mem_calloc(&s->mem, n, sizeof *mv)))
      return HR_ERR_NOMEM;
    rv = 0;
    for (i = 0; i < n && rv == 0; i++)
      rv = narrow_answer(s, hr_tensor_member(t, i), &mv[i]);
    if (rv == 0)
      rv = hr_tensor_new_composite(out, d, mv, n, &s->mem, NULL);
    else
      n = i - 1;
    for (i = 0; i < n; i++)
      hr_tensor_unref(mv[i]);
    if (mv != m)
      hr__mem_free(&s->mem, mv);
    return rv;
  }
  if (!hr_shm_arena_owns(s->arena, t)) {
    *out = hr_tensor_ref(t);
    return 0;
  }
  if (hr_tensor_bytes(t) >= PRIVATE_SEGMENT_MIN &&
      hr_shm_tensor_copy(out, t, &s->mem) == 0)
    return 0;
  void *bufs[HR_MAX_BUFFERS];
  for (unsigned k = 0; k < d->buffer_count; k++)
    bufs[k] = hr_tensor_buffer(t, k);
  rv = hr_tensor_wrap(out, d, bufs, view_release, t, &s->mem);
  if (rv == 0)
    hr_tensor_ref(t);
  return rv;
}

static int prov_get(hr_session *sess, hr_srv_get *g, void *ud) {
  hr_store *s = ud;
  const hr_get_info *info = hr_srv_get_info(g);
  hr_tensor *t;
  char msg[96];
  int rv;

  (void)sess;
  if (hr_store_get(s, info->key, info->key_len, &t) != 0) {
    snprintf(msg, sizeof msg, "no tensor named \"%.*s\"",
             info->key_len > 64 ? 64 : (int)info->key_len,
             (const char *)info->key);
    hr_get_fail(g, HR_WIRE_NOT_FOUND, msg);
    return 0;
  }
  if (s->arena && hr_get_narrow(g)) {
    hr_tensor *p;
    rv = narrow_answer(s, t, &p);
    hr_tensor_unref(t);
    if (rv) {
      hr_get_fail(g, HR_WIRE_RESOURCE_EXHAUSTED,
                  "no memory for a private copy of the tensor");
      return 0;
    }
    t = p;
  }
  rv = hr_get_answer(g, t);
  hr_tensor_unref(t);
  if (rv)
    hr_get_fail(g, HR_WIRE_INTERNAL, "the stored tensor cannot be sent");
  return 0;
}

static int prov_put_begin(hr_session *sess, const hr_put_info *info,
                          uint32_t *wire_error, void *ud) {
  hr_store *s = ud;
  int found, replace;
  uint64_t cap, bytes = 0;
  unsigned k;

  (void)sess;
  replace = (info->flags & HR_PUT_REPLACE) && s->cfg.allow_replace;
  for (k = 0; k < info->desc->buffer_count && k < HR_MAX_BUFFERS; k++) {
    if (UINT64_MAX - bytes < info->desc->buffers[k].size_bytes) {
      *wire_error = HR_WIRE_RESOURCE_EXHAUSTED;
      return 0;
    }
    bytes += info->desc->buffers[k].size_bytes;
  }
  pthread_rwlock_rdlock(&s->lock);
  cap = s->cfg.max_bytes;
  lower_bound(s, info->key, info->key_len, &found);
  if (found && !replace)
    *wire_error = HR_WIRE_ALREADY_EXISTS;
  else if (cap && (bytes > cap || s->bytes > cap - bytes))
    *wire_error = HR_WIRE_RESOURCE_EXHAUSTED;
  pthread_rwlock_unlock(&s->lock);
  return 0;
}

/* A PUT into a store with an arena lands in the arena, so that the
 * commit stores that very tensor (into_arena() sees it owned) and GETs
 * over SHM serve it without a copy.  A full arena, or a tensor the arena
 * cannot hold, declines: the session allocates as usual and the commit
 * copies into the arena if there is room by then. */
static int prov_put_alloc(hr_session *sess, const hr_descriptor *d,
                          unsigned min_alignment_log2, hr_tensor **out,
                          void *ud) {
  hr_store *s = ud;
  hr_descriptor a;
  unsigned k;

  (void)sess;
  if (!s->arena || d->layout.tag == HR_LAYOUT_COMPOSITE)
    return HR_ERR_NOT_FOUND;
  /* The arena places buffers by their own alignments (§ 7.1): raise them
   * to the minimum asked for. */
  a = *d;
  for (k = 0; k < a.buffer_count && k < HR_MAX_BUFFERS; k++)
    if (a.buffers[k].alignment_log2 < min_alignment_log2)
      a.buffers[k].alignment_log2 = (uint8_t)min_alignment_log2;
  return hr_shm_arena_alloc(s->arena, out, &a) == 0 ? 0 : HR_ERR_NOT_FOUND;
}

static int prov_put_commit(hr_session *sess, const hr_put_info *info,
                           hr_tensor *t, uint32_t *wire_error, void *ud) {
  hr_store *s = ud;
  hr_tensor *old, *st;
  int rv, replace;

  (void)sess;
  replace = (info->flags & HR_PUT_REPLACE) && s->cfg.allow_replace;
  st = into_arena(s, t);
  pthread_rwlock_wrlock(&s->lock);
  rv = put_locked(s, info->key, info->key_len, st, replace, s->cfg.max_bytes,
                  &old);
  pthread_rwlock_unlock(&s->lock);
  hr_tensor_unref(old);
  hr_tensor_unref(st);
  if (rv == HR_ERR_STATE)
    *wire_error = HR_WIRE_ALREADY_EXISTS; /* a racing PUT committed first */
  else if (rv == HR_ERR_LIMIT || rv == HR_ERR_NOMEM)
    *wire_error = HR_WIRE_RESOURCE_EXHAUSTED;
  return 0;
}

static void prov_put_abort(hr_session *sess, const hr_put_info *info,
                           void *ud) {
  /* Nothing was stored before the commit: nothing to undo. */
  (void)sess;
  (void)info;
  (void)ud;
}

static int prov_list(hr_session *sess, const hr_list_request *req,
                     int (*emit)(void *emit_ctx, const hr_list_entry *e),
                     void *emit_ctx, int *more, void *ud) {
  hr_store *s = ud;
  hr_list_entry le;
  size_t i;
  int found;

  (void)sess;
  *more = 0;
  pthread_rwlock_rdlock(&s->lock);
  if (req->start_after_len) {
    i = lower_bound(s, req->start_after, req->start_after_len, &found);
    if (found)
      i++;
  } else {
    i = 0;
  }
  /* Keys with the prefix are contiguous and start at its lower bound. */
  if (req->prefix_len) {
    size_t j = lower_bound(s, req->prefix, req->prefix_len, &found);
    if (j > i)
      i = j;
  }
  for (; i < s->n; i++) {
    entry *en = &s->v[i];
    if (en->key_len < req->prefix_len ||
        memcmp(en->key, req->prefix, req->prefix_len) != 0)
      break;
    hr_store_entry_of(en->t, &le);
    le.key = en->key;
    le.key_len = en->key_len;
    if (emit(emit_ctx, &le) != 0) {
      *more = 1;
      break;
    }
  }
  pthread_rwlock_unlock(&s->lock);
  return 0;
}

void hr_store_provider(hr_store *s, hr_provider *out) {
  memset(out, 0, sizeof *out);
  out->size = sizeof *out;
  out->user_data = s;
  out->on_get = prov_get;
  out->on_list = prov_list;
  if (s->cfg.allow_put) {
    out->on_put_begin = prov_put_begin;
    out->on_put_commit = prov_put_commit;
    out->on_put_abort = prov_put_abort;
    if (s->arena)
      out->on_put_alloc = prov_put_alloc;
  }
}
