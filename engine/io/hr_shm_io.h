/*
 * The SHM data plane's system calls (hr_shm_io.c), for the engine.
 */
#ifndef HR_SHM_IO_H
#define HR_SHM_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <hurray/session.h>

/* Most descriptors one recvmsg takes (more is a flood the session
 * refuses). */
#define HR_SHM_MAX_FDS 8

/* A new sealed memfd of `size` bytes mapped read-write at *addr (`align`
 * aligned, *map_len bytes), and its read-only reopening in *ro_fd (the
 * writable fd is closed).  Returns 0, HR_ERR_IO, HR_ERR_NOMEM. */
int hr__shm_segment_new(uint64_t size, uint64_t align, void **addr, int *ro_fd,
                        size_t *map_len);

/* hr__shm_segment_new() with the memfd's name (shown in /proc/PID/maps
 * as "memfd:NAME"). */
int hr__shm_segment_named(const char *name, uint64_t size, uint64_t align,
                          void **addr, int *ro_fd, size_t *map_len);

/* The client's shm_map: checks `fd` (regular file, size, seals) and maps
 * [offset, offset+len) read-only, the first byte aligned to `align`.
 * `wake_fd` (an eventfd, or -1) is written when the mapping goes.
 * Returns 0, or -1 with a reason in why. */
int hr__shm_map(int fd, uint64_t offset, uint64_t len, uint64_t align,
                int wake_fd, hr_shm_mapping *out, char *why, size_t why_len);

/* The client's mapping cache (hr_shm_map.c): whole-file mappings of
 * sealed segments, shared by the GETs that receive the same file. */
typedef struct hr__shm_cache hr__shm_cache;

typedef struct hr__shm_cache_stats {
  uint64_t hits, misses, evictions;
  unsigned entries, idle;
} hr__shm_cache_stats;

/* A cache that writes (a dup of) `wake_fd` when a mapping is released,
 * keeping at most `max_idle` idle entries (0: 16, < 0: none) of at most
 * `max_idle_bytes` (0: 4 GiB) together.  Returns 0, HR_ERR_NOMEM. */
int hr__shm_cache_new(hr__shm_cache **out, int wake_fd, int max_idle,
                      uint64_t max_idle_bytes);
/* The engine lets go: idle entries are unmapped now, entries in use when
 * their last tensor goes. */
void hr__shm_cache_close(hr__shm_cache *c);
/* hr__shm_map() through the cache: a sealed file is mapped whole once
 * and shared; anything else goes to hr__shm_map().  Same returns. */
int hr__shm_cache_map(hr__shm_cache *c, int fd, uint64_t offset, uint64_t len,
                      uint64_t align, hr_shm_mapping *out, char *why,
                      size_t why_len);
/* Counters and sizes now (tests, metrics). */
void hr__shm_cache_stats_get(hr__shm_cache *c, hr__shm_cache_stats *out);

/* recv() that also takes SCM_RIGHTS descriptors (MSG_CMSG_CLOEXEC):
 * up to HR_SHM_MAX_FDS land in fds[*nfds].  Returns recvmsg's result. */
ssize_t hr__shm_recv(int sock, void *buf, size_t len, int *fds, size_t *nfds);

/* sendmsg() of `mh` with descriptor `fd` attached (none when fd < 0). */
ssize_t hr__shm_sendmsg(int sock, struct msghdr *mh, int fd, int flags);

/* The client's shm_wake (hr_shm_wake.c): a token whose unmap writes a
 * duplicate of `wake_fd` once.  Returns 0 or -1. */
int hr__shm_wake_token(int wake_fd, hr_shm_mapping *out);

#endif /* HR_SHM_IO_H */
