/*
 * Internal helpers shared by the fabric/ modules: region construction,
 * piece iteration, text helpers, and the registration cache.
 *
 * Nothing here includes libfabric: the state machine (hr_rdma_sm.c), the
 * fake fabric (hr_fab_fake.c) and the cache are pure C over an hr_mem.
 */
#ifndef HR_FAB_INT_H
#define HR_FAB_INT_H

#include <hurray/fabric.h>

#include "../proto/hr_internal.h"

/* ---- text ---- */

/* printf into why[0..cap) (cap 0: nothing), always NUL-terminated. */
void hr__fab_why(char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Replaces every byte outside printable ASCII by '?', so that text from a
 * provider can go into an ERROR message (which must be UTF-8). */
void hr__fab_ascii(char *s);

/* ---- regions and pieces ---- */

/*
 * Builds the region of a tensor whose buffers are `buffers` (one segment
 * per descriptor buffer, in order; empty buffers give empty segments).
 * Returns 0, or HR_ERR_INVALID_ARGUMENT (a NULL buffer of non-zero size).
 */
int hr__fab_region_build(const hr_descriptor *d, void *const *buffers,
                         hr_fabric_region *r);

/* 1 when the segments follow one another in memory (one iovec covers the
 * region). */
int hr__fab_region_contiguous(const hr_fabric_region *r);

/* Where the next piece starts. */
typedef struct hr__fab_cursor {
  uint8_t seg;      /* segment index */
  uint64_t seg_off; /* offset inside it */
  uint64_t off;     /* offset inside the region */
} hr__fab_cursor;

/* The next piece of at most `piece` bytes, never crossing a segment and cut
 * at multiples of `piece` from each segment's start.  Returns 1 and fills
 * *ptr, *len, *off (region offset), or 0 at the end. */
int hr__fab_next_piece(const hr_fabric_region *r, hr__fab_cursor *c,
                       uint64_t piece, void **ptr, uint64_t *len,
                       uint64_t *off);

/* How many pieces hr__fab_next_piece() yields. */
uint64_t hr__fab_count_pieces(const hr_fabric_region *r, uint64_t piece);

/* ---- the registration cache ---- */

/* One cached local registration. */
typedef struct hr__mrc_entry hr__mrc_entry;
struct hr__mrc_entry {
  uintptr_t base;     /* first byte registered */
  uint64_t len;       /* bytes registered */
  uint8_t device_tag; /* where the memory lives */
  uint16_t device_index;
  void *handle;        /* the backend's registration */
  void *desc;          /* its local descriptor (fi_mr_desc) */
  uint32_t refs;       /* operations using it now */
  uint8_t stale;       /* invalidated while in use: closed at refs 0 */
  hr__mrc_entry *prev; /* most recently used first */
  hr__mrc_entry *next;
};

/* Registers [ptr, ptr + len) for local access; fills *handle and *desc. */
typedef int (*hr__mrc_reg_fn)(void *ctx, void *ptr, uint64_t len,
                              uint8_t device_tag, uint16_t device_index,
                              void **handle, void **desc, char *why,
                              size_t why_cap);
typedef void (*hr__mrc_dereg_fn)(void *ctx, void *handle);

typedef struct hr__mrc_stats {
  uint64_t hits;
  uint64_t misses;
  uint64_t evictions;
  uint64_t invalidations;
  uint64_t entries; /* open registrations */
  uint64_t unused;  /* of which unused */
  uint64_t unused_bytes;
} hr__mrc_stats;

typedef struct hr__mrc hr__mrc;

/* Creates a cache that keeps at most max_entries unused registrations
 * totalling at most max_bytes.  Returns 0, HR_ERR_INVALID_ARGUMENT,
 * HR_ERR_NOMEM. */
int hr__mrc_new(hr__mrc **out, hr__mrc_reg_fn reg, hr__mrc_dereg_fn dereg,
                void *ctx, uint32_t max_entries, uint64_t max_bytes,
                const hr_mem *mem);

/* Closes every registration (none may be in use) and frees the cache. */
void hr__mrc_del(hr__mrc *c);

/* Finds a registration covering [ptr, ptr + len) on that device, or makes
 * one; it is in use (refs + 1) until hr__mrc_put().  Returns 0, or the
 * reg function's error (why filled), or HR_ERR_NOMEM. */
int hr__mrc_get(hr__mrc *c, void *ptr, uint64_t len, uint8_t device_tag,
                uint16_t device_index, hr__mrc_entry **out, char *why,
                size_t why_cap);

/* Ends one use; unused entries beyond the caps are closed, oldest first. */
void hr__mrc_put(hr__mrc *c, hr__mrc_entry *e);

/* Closes the registrations overlapping [ptr, ptr + len) now, or at their
 * last put when in use; they are never found again. */
void hr__mrc_invalidate(hr__mrc *c, const void *ptr, uint64_t len);

void hr__mrc_get_stats(const hr__mrc *c, hr__mrc_stats *st);

/* 1 while some entry is in use. */
int hr__mrc_busy(const hr__mrc *c);

/* ---- the invalidation tracker (hr_fab_track.c) ---- */

/* Memory freed on any thread, queued for the fabric's thread.  The ops'
 * tracker / tracker_invalidate / tracker_unref of both backends. */
typedef struct hr__fab_track hr__fab_track;

/* A tracker with one reference (the backend's).  0 or HR_ERR_NOMEM. */
int hr__fab_track_new(hr__fab_track **out, const hr_mem *mem);
/* Any thread.  Returns t. */
void *hr__fab_track_ref(hr__fab_track *t);
/* Any thread; the last reference frees it. */
void hr__fab_track_unref(hr__fab_track *t);
/* Any thread: queues [ptr, ptr + len) and calls the wake function.  Out
 * of memory, the next drain invalidates everything. */
void hr__fab_track_push(hr__fab_track *t, const void *ptr, uint64_t len);
/* 1 while something is queued. */
int hr__fab_track_pending(const hr__fab_track *t);
/* The backend's thread: fn for each queued range (NULL, UINT64_MAX after
 * an overflow), queue emptied. */
void hr__fab_track_drain(hr__fab_track *t,
                         void (*fn)(void *ctx, const void *ptr, uint64_t len),
                         void *ctx);
/* Sets (NULL: removes) the wake function; after a removal returns, it is
 * not running nor called again. */
void hr__fab_track_set_wake(hr__fab_track *t, void (*wake)(void *ctx),
                            void *ctx);

#endif /* HR_FAB_INT_H */
