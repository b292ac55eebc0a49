/*
 * Shared arenas (<hurray/shm.h>): tensors sub-allocated from a few sealed
 * memfds, so that serving one over the SHM data plane hands out the
 * segment's fd with the tensor's byte_offset.
 *
 * Each segment keeps its free space as a sorted array of extents (first
 * fit, coalesced on free): an arena holds at most a few thousand tensors
 * and changes when a PUT commits, so a linear walk under one mutex is
 * cheaper than anything cleverer.  Segments are made on demand up to the
 * cap; one that becomes empty is given back unless it is the last.
 *
 * Free space is always zero: a region is zeroed before it returns to the
 * free list (whole pages by MADV_REMOVE, which punches them out of the
 * memfd, the partial pages at its ends by memset), so a client that maps
 * the whole segment sees live tensors and zeros, never a dead tensor's
 * bytes, and the kernel gets the memory of large freed tensors back.
 *
 * Lifetime: the arena counts the owner's hold and one per live region;
 * the last one frees every segment.  A region's release may run on any
 * thread (a client's BUFFER_RELEASE on the engine thread, the store's
 * replace on the application's).
 */
#include <hurray/shm.h>

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../core/hr_core.h"
#include "../io/hr_shm_io.h"
#include "hr_internal.h"

#define PAGE ((uint64_t)4096)
#define SEG_ALIGN ((uint64_t)1 << 21)
#define DEFAULT_SEGMENT ((uint64_t)64 << 20)

typedef struct ext {
  uint64_t off, len;
} ext;

typedef struct aseg {
  struct aseg *next;
  uint8_t *addr; /* our writable mapping */
  size_t len;
  int fd; /* read-only: what clients get */
  ext *free;
  size_t nfree, capfree;
  uint32_t live;
} aseg;

struct hr_shm_arena {
  hr_mem mem;
  hr_shm_arena_config cfg;
  pthread_mutex_t mu;
  aseg *segs;
  uint32_t nsegs;
  uint64_t seg_total; /* bytes in segments */
  uint64_t used;
  uint32_t live;
  unsigned refs; /* the owner's + one per live region */
  int closed;
};

/* The release context of one allocated tensor. */
typedef struct region {
  hr_shm_arena *a;
  aseg *g;
  uint64_t off, len;
} region;

static uint64_t round_up(uint64_t v, uint64_t a) {
  return (v + a - 1) & ~(a - 1);
}

void hr_shm_arena_config_default(hr_shm_arena_config *c) {
  if (!c)
    return;
  memset(c, 0, sizeof *c);
  c->size = sizeof *c;
  c->granule_log2 = 6;
}

int hr_shm_arena_new(hr_shm_arena **out, const hr_shm_arena_config *cfg,
                     const hr_mem *mem) {
  hr_shm_arena_config c;
  hr_shm_arena *a;

  if (!out || !cfg || cfg->size < sizeof c)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  c = *cfg;
  c.size = sizeof c;
  if (c.granule_log2 == 0)
    c.granule_log2 = 6;
  if (c.max_bytes == 0 || c.granule_log2 < 6 ||
      c.granule_log2 > HR_MAX_ALIGNMENT_LOG2 || c.max_bytes > SIZE_MAX / 2)
    return HR_ERR_INVALID_ARGUMENT;
  if (c.segment_bytes == 0)
    c.segment_bytes =
        c.max_bytes < DEFAULT_SEGMENT ? c.max_bytes : DEFAULT_SEGMENT;
  if (c.segment_bytes > c.max_bytes)
    c.segment_bytes = c.max_bytes;
  c.segment_bytes = round_up(c.segment_bytes, PAGE);
  if (!mem)
    mem = hr_mem_default();
  a = hr__mem_calloc(mem, 1, sizeof *a);
  if (!a)
    return HR_ERR_NOMEM;
  a->mem = *mem;
  a->cfg = c;
  a->refs = 1;
  if (pthread_mutex_init(&a->mu, NULL) != 0) {
    hr__mem_free(mem, a);
    return HR_ERR_NOMEM;
  }
  *out = a;
  return 0;
}

static void seg_free(hr_shm_arena *a, aseg *g) {
  munmap(g->addr, g->len);
  close(g->fd);
  hr__mem_free(&a->mem, g->free);
  hr__mem_free(&a->mem, g);
}

/* Drops one hold; the last frees everything.  Called without the lock. */
static void arena_unref(hr_shm_arena *a) {
  unsigned left;
  pthread_mutex_lock(&a->mu);
  left = --a->refs;
  pthread_mutex_unlock(&a->mu);
  if (left)
    return;
  while (a->segs) {
    aseg *g = a->segs;
    a->segs = g->next;
    seg_free(a, g);
  }
  pthread_mutex_destroy(&a->mu);
  hr_mem mem = a->mem;
  hr__mem_free(&mem, a);
}

void hr_shm_arena_del(hr_shm_arena *a) {
  if (!a)
    return;
  pthread_mutex_lock(&a->mu);
  a->closed = 1;
  pthread_mutex_unlock(&a->mu);
  arena_unref(a);
}

/* Inserts [off, off+len) into g's free list, merging with neighbours.
 * Returns 0 or HR_ERR_NOMEM (the list could not grow: the space is lost
 * to this segment until it empties, never handed out twice). */
static int free_insert(hr_shm_arena *a, aseg *g, uint64_t off, uint64_t len) {
  size_t i = 0;
  while (i < g->nfree && g->free[i].off < off)
    i++;
  int left = i > 0 && g->free[i - 1].off + g->free[i - 1].len == off;
  int right = i < g->nfree && off + len == g->free[i].off;
  if (left && right) {
    g->free[i - 1].len += len + g->free[i].len;
    memmove(&g->free[i], &g->free[i + 1], (g->nfree - i - 1) * sizeof *g->free);
    g->nfree--;
    return 0;
  }
  if (left) {
    g->free[i - 1].len += len;
    return 0;
  }
  if (right) {
    g->free[i].off = off;
    g->free[i].len += len;
    return 0;
  }
  if (g->nfree == g->capfree) {
    size_t n = g->capfree ? g->capfree * 2 : 8;
    ext *v = hr__mem_realloc(&a->mem, g->free, n * sizeof *v);
    if (!v)
      return HR_ERR_NOMEM;
    g->free = v;
    g->capfree = n;
  }
  memmove(&g->free[i + 1], &g->free[i], (g->nfree - i) * sizeof *g->free);
  g->free[i].off = off;
  g->free[i].len = len;
  g->nfree++;
  return 0;
}

/* First fit of `len` bytes at a multiple of `align` in g; *off on success.
 * The extent's cut-off head stays free. */
static int seg_take(hr_shm_arena *a, aseg *g, uint64_t len, uint64_t align,
                    uint64_t *off) {
  for (size_t i = 0; i < g->nfree; i++) {
    ext e = g->free[i];
    uint64_t at = round_up(e.off, align);
    if (at < e.off || at - e.off > e.len || e.len - (at - e.off) < len)
      continue;
    uint64_t head = at - e.off, tail = e.len - head - len;
    if (head && tail) {
      /* Split in three: keep the head here, add the tail after it. */
      g->free[i].len = head;
      if (free_insert(a, g, at + len, tail) != 0) {
        g->free[i].len = e.len;
        return HR_ERR_NOMEM;
      }
    } else if (head) {
      g->free[i].len = head;
    } else if (tail) {
      g->free[i].off = at + len;
      g->free[i].len = tail;
    } else {
      memmove(&g->free[i], &g->free[i + 1],
              (g->nfree - i - 1) * sizeof *g->free);
      g->nfree--;
    }
    *off = at;
    return 0;
  }
  return HR_ERR_LIMIT;
}

/* A new segment of `len` bytes (page multiple), all free.  Under the
 * lock: memfd creation is rare (the arena grows by whole segments). */
static int seg_new(hr_shm_arena *a, uint64_t len, aseg **out) {
  aseg *g = hr__mem_calloc(&a->mem, 1, sizeof *g);
  void *addr;
  size_t maplen;
  int fd, rv;

  if (!g)
    return HR_ERR_NOMEM;
  rv = hr__shm_segment_named("hurray-arena", len, SEG_ALIGN, &addr, &fd,
                             &maplen);
  if (rv) {
    hr__mem_free(&a->mem, g);
    return rv;
  }
  g->addr = addr;
  g->len = maplen;
  g->fd = fd;
  if (free_insert(a, g, 0, maplen) != 0) {
    seg_free(a, g);
    return HR_ERR_NOMEM;
  }
  /* Append: the first segments are tried first, so the arena stays
   * compact and later ones empty out. */
  aseg **pp = &a->segs;
  while (*pp)
    pp = &(*pp)->next;
  *pp = g;
  a->nsegs++;
  a->seg_total += maplen;
  *out = g;
  return 0;
}

/* Zeroes a region before it is free again (see the file comment). */
static void zero_region(aseg *g, uint64_t off, uint64_t len) {
  uint64_t end = off + len;
  uint64_t p0 = round_up(off, PAGE), p1 = end & ~(PAGE - 1);
  if (p1 > p0 && p1 - p0 >= 4 * PAGE &&
      madvise(g->addr + p0, (size_t)(p1 - p0), MADV_REMOVE) == 0) {
    memset(g->addr + off, 0, (size_t)(p0 - off));
    memset(g->addr + p1, 0, (size_t)(end - p1));
    return;
  }
  memset(g->addr + off, 0, (size_t)len);
}

static void region_release(void *ctx) {
  region *r = ctx;
  hr_shm_arena *a = r->a;
  aseg *g = r->g, *drop = NULL;

  /* Nobody can be handed these bytes before they are back in the list. */
  zero_region(g, r->off, r->len);
  pthread_mutex_lock(&a->mu);
  (void)free_insert(a, g, r->off, r->len);
  g->live--;
  a->live--;
  a->used -= r->len;
  /* An empty segment goes back to the kernel unless it is the only one
   * (the next small tensor would make it again). */
  if (g->live == 0 && a->nsegs > 1 && g->nfree == 1 &&
      g->free[0].len == g->len) {
    aseg **pp = &a->segs;
    while (*pp != g)
      pp = &(*pp)->next;
    *pp = g->next;
    a->nsegs--;
    a->seg_total -= g->len;
    drop = g;
  }
  pthread_mutex_unlock(&a->mu);
  if (drop)
    seg_free(a, drop);
  hr__mem_free(&a->mem, r);
  arena_unref(a);
}

int hr_shm_arena_alloc(hr_shm_arena *a, hr_tensor **out,
                       const hr_descriptor *desc) {
  uint64_t off[HR_MAX_BUFFERS], pos, align, len, at = 0;
  void *bufs[HR_MAX_BUFFERS];
  aseg *g;
  region *r;
  int rv;

  if (!a || !out || !desc || desc->layout.tag == HR_LAYOUT_COMPOSITE ||
      desc->buffer_count > HR_MAX_BUFFERS)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  /* § 7.1 placement from the region's start. */
  if (hr__tensor_placement(desc, 0, off, &pos, &align))
    return HR_ERR_INVALID_ARGUMENT;
  if (align < (uint64_t)1 << a->cfg.granule_log2)
    align = (uint64_t)1 << a->cfg.granule_log2;
  if (pos > a->cfg.max_bytes)
    return HR_ERR_LIMIT;
  /* Regions are whole granules, so every start stays granule-aligned. */
  len = round_up(pos ? pos : 1, (uint64_t)1 << a->cfg.granule_log2);
  r = hr__mem_calloc(&a->mem, 1, sizeof *r);
  if (!r)
    return HR_ERR_NOMEM;
  pthread_mutex_lock(&a->mu);
  rv = a->closed ? HR_ERR_STATE : HR_ERR_LIMIT;
  for (g = a->segs; g && !a->closed; g = g->next) {
    rv = seg_take(a, g, len, align, &at);
    if (rv != HR_ERR_LIMIT)
      break;
  }
  if (rv == HR_ERR_LIMIT) {
    /* Grow by a segment: the usual size, or one for this tensor alone. */
    uint64_t want = round_up(len, PAGE); /* offset 0 suits any alignment */
    if (want < a->cfg.segment_bytes)
      want = a->cfg.segment_bytes;
    if (a->seg_total <= a->cfg.max_bytes &&
        want <= a->cfg.max_bytes - a->seg_total) {
      rv = seg_new(a, want, &g);
      if (rv == 0)
        rv = seg_take(a, g, len, align, &at);
    }
  }
  if (rv == 0) {
    g->live++;
    a->live++;
    a->used += len;
    a->refs++;
  }
  pthread_mutex_unlock(&a->mu);
  if (rv) {
    hr__mem_free(&a->mem, r);
    return rv;
  }
  r->a = a;
  r->g = g;
  r->off = at;
  r->len = len;
  for (unsigned k = 0; k < desc->buffer_count; k++)
    bufs[k] = g->addr + at + off[k];
  rv = hr_tensor_wrap(out, desc, bufs, region_release, r, &a->mem);
  if (rv) {
    region_release(r);
    return rv;
  }
  rv = hr_tensor_set_segment(*out, g->fd, at);
  if (rv) {
    hr_tensor_unref(*out);
    *out = NULL;
  }
  return rv;
}

int hr_shm_arena_copy(hr_shm_arena *a, hr_tensor **out, const hr_tensor *t) {
  const hr_descriptor *d;
  int rv;

  if (!a || !out || !t || hr_tensor_member_count(t))
    return HR_ERR_INVALID_ARGUMENT;
  d = hr_tensor_descriptor(t);
  for (unsigned k = 0; k < d->buffer_count; k++)
    if (d->buffers[k].device_tag != HR_DEV_CPU)
      return HR_ERR_INVALID_ARGUMENT;
  rv = hr_shm_arena_alloc(a, out, d);
  if (rv)
    return rv;
  for (unsigned k = 0; k < d->buffer_count; k++)
    if (d->buffers[k].size_bytes)
      memcpy(hr_tensor_buffer(*out, k), hr_tensor_buffer(t, k),
             (size_t)d->buffers[k].size_bytes);
  return 0;
}

int hr_shm_arena_owns(hr_shm_arena *a, const hr_tensor *t) {
  int fd, own = 0;

  if (!a || !t || !hr_tensor_segment(t, &fd, NULL))
    return 0;
  pthread_mutex_lock(&a->mu);
  for (aseg *g = a->segs; g && !own; g = g->next)
    own = g->fd == fd;
  pthread_mutex_unlock(&a->mu);
  return own;
}

void hr_shm_arena_stats_get(hr_shm_arena *a, hr_shm_arena_stats *out) {
  if (!out)
    return;
  memset(out, 0, sizeof *out);
  if (!a)
    return;
  pthread_mutex_lock(&a->mu);
  out->used_bytes = a->used;
  out->segment_bytes = a->seg_total;
  out->segments = a->nsegs;
  out->live = a->live;
  pthread_mutex_unlock(&a->mu);
}
