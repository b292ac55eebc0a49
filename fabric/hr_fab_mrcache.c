/*
 * The registration cache: local registrations kept by address range, so
 * that memory sent or received many times is registered once.
 *
 * Entries live on one list, most recently used first.  A lookup is a scan
 * of that list: the cache holds at most a few hundred entries and is
 * consulted once per segment of a transfer, not per piece.  Only entries
 * nobody uses count against the caps; they are closed oldest first.
 *
 * The cache cannot see the application free or reuse memory, so the owner
 * must report releases (hr__mrc_invalidate()); an entry invalidated while
 * an operation still uses it is closed when that use ends.
 */
#include <string.h>

#include "hr_fab_int.h"

struct hr__mrc {
  hr_mem mem;
  hr__mrc_reg_fn reg;
  hr__mrc_dereg_fn dereg;
  void *ctx;
  uint32_t max_entries;
  uint64_t max_bytes;
  hr__mrc_entry *head; /* most recently used */
  hr__mrc_entry *tail; /* least recently used */
  hr__mrc_stats st;
};

static void unlink_entry(hr__mrc *c, hr__mrc_entry *e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    c->head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    c->tail = e->prev;
  e->prev = e->next = NULL;
}

static void push_front(hr__mrc *c, hr__mrc_entry *e) {
  e->prev = NULL;
  e->next = c->head;
  if (c->head)
    c->head->prev = e;
  else
    c->tail = e;
  c->head = e;
}

/* Closes an entry nobody uses. */
static void close_entry(hr__mrc *c, hr__mrc_entry *e) {
  unlink_entry(c, e);
  c->st.entries--;
  c->st.unused--;
  c->st.unused_bytes -= e->len;
  c->dereg(c->ctx, e->handle);
  hr__mem_free(&c->mem, e);
}

/* Closes unused entries, oldest first, until the caps hold. */
static void trim(hr__mrc *c) {
  hr__mrc_entry *e = c->tail;
  while (e &&
         (c->st.unused > c->max_entries || c->st.unused_bytes > c->max_bytes)) {
    hr__mrc_entry *prev = e->prev;
    if (e->refs == 0) {
      close_entry(c, e);
      c->st.evictions++;
    }
    e = prev;
  }
}

int hr__mrc_new(hr__mrc **out, hr__mrc_reg_fn reg, hr__mrc_dereg_fn dereg,
                void *ctx, uint32_t max_entries, uint64_t max_bytes,
                const hr_mem *mem) {
  if (!out || !reg || !dereg)
    return HR_ERR_INVALID_ARGUMENT;
  if (!mem)
    mem = hr_mem_default();
  hr__mrc *c = hr__mem_calloc(mem, 1, sizeof *c);
  if (!c)
    return HR_ERR_NOMEM;
  c->mem = *mem;
  c->reg = reg;
  c->dereg = dereg;
  c->ctx = ctx;
  c->max_entries = max_entries;
  c->max_bytes = max_bytes;
  *out = c;
  return 0;
}

void hr__mrc_del(hr__mrc *c) {
  if (!c)
    return;
  while (c->head) {
    hr__mrc_entry *e = c->head;
    unlink_entry(c, e);
    c->dereg(c->ctx, e->handle);
    hr__mem_free(&c->mem, e);
  }
  hr__mem_free(&c->mem, c);
}

int hr__mrc_get(hr__mrc *c, void *ptr, uint64_t len, uint8_t device_tag,
                uint16_t device_index, hr__mrc_entry **out, char *why,
                size_t why_cap) {
  uintptr_t p = (uintptr_t)ptr;
  for (hr__mrc_entry *e = c->head; e; e = e->next) {
    if (e->stale || e->device_tag != device_tag ||
        e->device_index != device_index)
      continue;
    if (p < e->base || p - e->base > e->len || len > e->len - (p - e->base))
      continue;
    if (e->refs++ == 0) {
      c->st.unused--;
      c->st.unused_bytes -= e->len;
    }
    unlink_entry(c, e);
    push_front(c, e);
    c->st.hits++;
    *out = e;
    return 0;
  }
  hr__mrc_entry *e = hr__mem_calloc(&c->mem, 1, sizeof *e);
  if (!e) {
    hr__fab_why(why, why_cap, "out of memory");
    return HR_ERR_NOMEM;
  }
  int rv = c->reg(c->ctx, ptr, len, device_tag, device_index, &e->handle,
                  &e->desc, why, why_cap);
  if (rv != 0) {
    hr__mem_free(&c->mem, e);
    return rv;
  }
  e->base = p;
  e->len = len;
  e->device_tag = device_tag;
  e->device_index = device_index;
  e->refs = 1;
  push_front(c, e);
  c->st.misses++;
  c->st.entries++;
  *out = e;
  return 0;
}

void hr__mrc_put(hr__mrc *c, hr__mrc_entry *e) {
  if (!e || e->refs == 0)
    return;
  if (--e->refs)
    return;
  c->st.unused++;
  c->st.unused_bytes += e->len;
  if (e->stale) {
    close_entry(c, e);
    c->st.invalidations++;
    return;
  }
  trim(c);
}

void hr__mrc_invalidate(hr__mrc *c, const void *ptr, uint64_t len) {
  uintptr_t lo = (uintptr_t)ptr;
  uintptr_t hi = len > UINTPTR_MAX - lo ? UINTPTR_MAX : lo + (uintptr_t)len;
  hr__mrc_entry *e = c->head;
  while (e) {
    hr__mrc_entry *next = e->next;
    uintptr_t elo = e->base, ehi = e->base + (uintptr_t)e->len;
    /* Empty ranges overlap nothing; an entry is closed when the ranges
     * share at least one byte. */
    if (!e->stale && len > 0 && elo < hi && lo < ehi) {
      if (e->refs == 0) {
        close_entry(c, e);
        c->st.invalidations++;
      } else {
        e->stale = 1;
      }
    }
    e = next;
  }
}

void hr__mrc_get_stats(const hr__mrc *c, hr__mrc_stats *st) {
  *st = c->st;
}

int hr__mrc_busy(const hr__mrc *c) {
  return c->st.entries > c->st.unused;
}
