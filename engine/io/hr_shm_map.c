/*
 * The client's cache of segment mappings (SHM data plane, wire-v1 § 14).
 *
 * Without it every GET over SHM costs an fcntl, an mmap, the page faults
 * of touching the new mapping, an munmap (with its TLB shootdown) and the
 * dup and close of a wake-up descriptor.  A server that serves many
 * tensors from one arena (<hurray/shm.h>) sends the same file again and
 * again, so the client maps each such file once, whole, and hands out
 * pointers into that mapping.
 *
 * Key: (st_dev, st_ino, st_size) of the received fd.  Only files sealed
 * against shrinking are cached (a memfd with F_SEAL_SHRINK): their size
 * can never drop below what we mapped, so a whole-file mapping cannot
 * fault (SIGBUS) whatever the server does later, and the seal can never be
 * taken off, so it is checked once per entry.  A file that grew shows a
 * new size and gets a new entry.  An entry's mapping holds a reference to
 * the file, so its inode cannot be freed and its number cannot be reused
 * by another file while the entry exists: the key cannot name the wrong
 * file.  Files that cannot be sealed (a served .npy) keep the one mapping
 * per GET of hr__shm_map(): a server could truncate them.
 *
 * Bounds: a file larger than the idle byte bound is not cached (the range
 * is mapped per GET, as without a cache); an entry in use (some received tensor still points into it)
 * stays; idle entries are kept, least recently used first out, up to a
 * count and a byte total (hr_engine_config.shm_map_cache,
 * shm_map_cache_bytes).  An idle entry keeps the server's pages of that
 * segment alive (shared memory, not a copy) until it is evicted.
 *
 * Threads: a received tensor may be released on any thread, and after the
 * engine is gone.  The cache is reference-counted (the engine's hold and
 * one per live mapping) and its state is under a mutex; the wake-up
 * eventfd is a dup owned by the cache.  Its memory comes from libc, as
 * hr_shm_io.c's per-GET mappings do: it may be freed after the engine,
 * whose hr_mem context need not live that long.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hr_internal.h"
#include "hr_shm_io.h"

#define PAGE ((uint64_t)4096)
#define BIG_ALIGN ((uint64_t)1 << 21)

typedef struct centry {
  struct centry *next;             /* all entries */
  struct centry *lru_prev, *lru_next; /* idle ones, most recent first */
  dev_t dev;
  ino_t ino;
  uint64_t size;
  uint8_t *addr; /* the file's byte 0 */
  uint8_t *map;  /* the mapping (addr, or below it) */
  size_t map_len;
  uint64_t align; /* addr is aligned to this */
  unsigned uses;  /* live tensors */
} centry;

struct hr__shm_cache {
  pthread_mutex_t mu;
  unsigned refs; /* the engine's + one per live mapping */
  int closed;
  int wake_fd; /* a dup of the engine's eventfd, or -1 */
  unsigned max_idle;
  uint64_t max_idle_bytes;
  centry *all;
  centry *lru_head, *lru_tail;
  unsigned nidle;
  uint64_t idle_bytes;
  hr__shm_cache_stats st;
};

/* One live use of an entry: the hr_shm_mapping's ctx. */
typedef struct cuse {
  hr__shm_cache *c;
  centry *e;
} cuse;

int hr__shm_cache_new(hr__shm_cache **out, int wake_fd, int max_idle,
                      uint64_t max_idle_bytes) {
  hr__shm_cache *c = calloc(1, sizeof *c); /* freed on any thread */
  if (!c)
    return HR_ERR_NOMEM;
  if (pthread_mutex_init(&c->mu, NULL) != 0) {
    free(c);
    return HR_ERR_NOMEM;
  }
  c->refs = 1;
  c->wake_fd = wake_fd >= 0 ? fcntl(wake_fd, F_DUPFD_CLOEXEC, 0) : -1;
  c->max_idle = max_idle < 0 ? 0 : max_idle == 0 ? 16 : (unsigned)max_idle;
  c->max_idle_bytes = max_idle_bytes ? max_idle_bytes : (uint64_t)4 << 30;
  *out = c;
  return 0;
}

static void lru_unlink(hr__shm_cache *c, centry *e) {
  if (e->lru_prev)
    e->lru_prev->lru_next = e->lru_next;
  else
    c->lru_head = e->lru_next;
  if (e->lru_next)
    e->lru_next->lru_prev = e->lru_prev;
  else
    c->lru_tail = e->lru_prev;
  e->lru_prev = e->lru_next = NULL;
  c->nidle--;
  c->idle_bytes -= e->map_len;
}

static void all_unlink(hr__shm_cache *c, centry *e) {
  centry **pp = &c->all;
  while (*pp != e)
    pp = &(*pp)->next;
  *pp = e->next;
}

/* Unlinks idle entries over the bounds (all of them once closed); they
 * are returned as a list (through `next`) to unmap outside the lock. */
static centry *evict_locked(hr__shm_cache *c) {
  centry *gone = NULL;
  while (c->lru_tail &&
         (c->closed || c->nidle > c->max_idle ||
          c->idle_bytes > c->max_idle_bytes)) {
    centry *e = c->lru_tail;
    lru_unlink(c, e);
    all_unlink(c, e);
    e->next = gone;
    gone = e;
    c->st.evictions++;
  }
  return gone;
}

static void unmap_list(centry *e) {
  while (e) {
    centry *n = e->next;
    munmap(e->map, e->map_len);
    free(e);
    e = n;
  }
}

static void cache_unref(hr__shm_cache *c) {
  unsigned left;
  pthread_mutex_lock(&c->mu);
  left = --c->refs;
  pthread_mutex_unlock(&c->mu);
  if (left)
    return;
  /* Only idle entries can be left: every use held a reference. */
  unmap_list(c->all);
  if (c->wake_fd >= 0)
    close(c->wake_fd);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void hr__shm_cache_close(hr__shm_cache *c) {
  centry *gone;
  if (!c)
    return;
  pthread_mutex_lock(&c->mu);
  c->closed = 1;
  gone = evict_locked(c);
  pthread_mutex_unlock(&c->mu);
  unmap_list(gone);
  cache_unref(c);
}

void hr__shm_cache_stats_get(hr__shm_cache *c, hr__shm_cache_stats *out) {
  memset(out, 0, sizeof *out);
  if (!c)
    return;
  pthread_mutex_lock(&c->mu);
  *out = c->st;
  out->idle = c->nidle;
  for (centry *e = c->all; e; e = e->next)
    out->entries++;
  pthread_mutex_unlock(&c->mu);
}

static void use_release(void *ctx) {
  cuse *u = ctx;
  hr__shm_cache *c = u->c;
  centry *e = u->e, *gone;
  pthread_mutex_lock(&c->mu);
  if (--e->uses == 0) {
    /* Most recent first: evicted last. */
    e->lru_next = c->lru_head;
    if (c->lru_head)
      c->lru_head->lru_prev = e;
    else
      c->lru_tail = e;
    c->lru_head = e;
    c->nidle++;
    c->idle_bytes += e->map_len;
  }
  gone = evict_locked(c);
  pthread_mutex_unlock(&c->mu);
  unmap_list(gone);
  if (c->wake_fd >= 0) {
    /* The session owes a BUFFER_RELEASE: run the loop. */
    uint64_t one = 1;
    ssize_t w;
    do {
      w = write(c->wake_fd, &one, sizeof one);
    } while (w < 0 && errno == EINTR);
  }
  free(u);
  cache_unref(c);
}

/* Maps all of `fd` (size bytes) read-only, byte 0 aligned to `align`. */
static int map_whole(int fd, uint64_t size, uint64_t align, centry *e) {
  size_t len = (size_t)((size + PAGE - 1) & ~(PAGE - 1));
  if (align <= PAGE) {
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
      return -1;
    e->map = e->addr = m;
    e->map_len = len;
    e->align = PAGE;
    return 0;
  }
  /* Reserve room to slide into alignment, map over the aligned spot and
   * give back the rest. */
  size_t extra = (size_t)align;
  uint8_t *r = mmap(NULL, len + extra, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED)
    return -1;
  uint8_t *at = (uint8_t *)(((uintptr_t)r + (uintptr_t)align - 1) &
                            ~((uintptr_t)align - 1));
  void *m = mmap(at, len, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
  if (m == MAP_FAILED) {
    munmap(r, len + extra);
    return -1;
  }
  if (at > r)
    munmap(r, (size_t)(at - r));
  if (at + len < r + len + extra)
    munmap(at + len, (size_t)(r + len + extra - (at + len)));
  e->map = e->addr = at;
  e->map_len = len;
  e->align = align;
  return 0;
}

int hr__shm_cache_map(hr__shm_cache *c, int fd, uint64_t offset, uint64_t len,
                      uint64_t align, hr_shm_mapping *out, char *why,
                      size_t why_len) {
  struct stat sb;
  uint64_t end;
  centry *e, *gone = NULL;
  cuse *u;

  if (!align)
    align = 1;
  /* The checks of hr__shm_map(), which also answers every case the
   * cache does not take: a file larger than the idle bound (a server
   * must not make us map more than that for one tensor) among them. */
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size <= 0 ||
      !hr__add_u64(offset, len, &end) || (uint64_t)sb.st_size < end ||
      (uint64_t)sb.st_size > c->max_idle_bytes || align > BIG_ALIGN ||
      offset % align != 0 || len == 0)
    return hr__shm_map(fd, offset, len, align, c->wake_fd, out, why, why_len);
  u = malloc(sizeof *u); /* freed on any thread */
  if (!u) {
    snprintf(why, why_len, "out of memory");
    return -1;
  }
  pthread_mutex_lock(&c->mu);
  for (e = c->all; e; e = e->next)
    if (e->dev == sb.st_dev && e->ino == sb.st_ino &&
        e->size == (uint64_t)sb.st_size && e->align >= align)
      break;
  if (e) {
    if (e->uses++ == 0)
      lru_unlink(c, e);
    c->st.hits++;
    c->refs++;
    pthread_mutex_unlock(&c->mu);
    goto hand_out;
  }
  pthread_mutex_unlock(&c->mu);
  {
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
      /* Not ours to keep mapped (or refused): the per-GET path decides. */
      free(u);
      return hr__shm_map(fd, offset, len, align, c->wake_fd, out, why,
                         why_len);
    }
  }
  e = calloc(1, sizeof *e);
  if (!e) {
    free(u);
    snprintf(why, why_len, "out of memory");
    return -1;
  }
  e->dev = sb.st_dev;
  e->ino = sb.st_ino;
  e->size = (uint64_t)sb.st_size;
  /* Big segments (an arena, a large tensor) 2 MiB-aligned, so that any
   * alignment a later tensor in them asks for is met. */
  if (map_whole(fd, e->size, e->size >= BIG_ALIGN || align > PAGE ? BIG_ALIGN
                                                                  : PAGE,
                e) != 0) {
    snprintf(why, why_len, "mmap: %s", strerror(errno));
    free(e);
    free(u);
    return -1;
  }
  e->uses = 1;
  pthread_mutex_lock(&c->mu);
  e->next = c->all;
  c->all = e;
  c->st.misses++;
  c->refs++;
  /* Entries in use are not bounded, but adding one may push idle ones
   * out. */
  gone = evict_locked(c);
  pthread_mutex_unlock(&c->mu);
  unmap_list(gone);
hand_out:
  u->c = c;
  u->e = e;
  out->base = e->addr + offset;
  out->unmap = use_release;
  out->ctx = u;
  return 0;
}
