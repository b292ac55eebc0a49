/*
 * libhurray: tensors in shared memory, for the SHM data plane (wire-v1
 * § 14).
 *
 * A server on a Unix domain socket answers a GET whose client advertised
 * SHM_DATA_PLANE by handing over the file descriptor of the segment that
 * holds the tensor (SCM_RIGHTS) instead of sending its bytes: the client
 * maps it read-only and sends BUFFER_RELEASE when the application drops
 * the tensor.  That works for tensors that know their segment
 * (hr_tensor_set_segment() in <hurray/tensor.h>): the ones made here,
 * files loaded by <hurray/files.h>, and tensors of 1 MiB or more PUT to
 * an engine's server over a Unix socket (their landing buffers are
 * segments), and tensors in a shared arena (below).  Other tensors go as
 * frames.
 *
 * Thread safety: hr_shm_tensor_* keep no shared state; tensors as in
 * <hurray/tensor.h>; arenas as said below.
 */
#ifndef HURRAY_SHM_H
#define HURRAY_SHM_H

#include <hurray/common.h>
#include <hurray/tensor.h>
#include <hurray/wire.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Allocates a tensor whose buffers live in a new memfd (MFD_CLOEXEC |
 * MFD_ALLOW_SEALING, sealed with F_SEAL_SHRINK | F_SEAL_GROW |
 * F_SEAL_SEAL), buffer 0 at offset 0 and the others placed as wire-v1
 * § 7.1 says; the tensor's segment is a read-only reopening of it, so no
 * peer can map the bytes writable.  Fill the buffers before the tensor is
 * served; they must not change afterwards.  Contents start zeroed.
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL, a composite, an alignment
 * above 2^21, size overflow), HR_ERR_NOMEM, HR_ERR_IO (memfd_create,
 * sealing, or /proc not mounted).
 */
HR_EXTERN int hr_shm_tensor_alloc(hr_tensor **out, const hr_descriptor *desc,
                                  const hr_mem *mem);

/* Copies a plain tensor into a new segment (hr_shm_tensor_alloc): one copy,
 * once, for a tensor that will be served over SHM often.  Returns as
 * hr_shm_tensor_alloc(); HR_ERR_INVALID_ARGUMENT for a composite. */
HR_EXTERN int hr_shm_tensor_copy(hr_tensor **out, const hr_tensor *t,
                                 const hr_mem *mem);


/*
 * Shared arenas.  An arena is one or a few sealed memfds (segments) from
 * which tensors are sub-allocated: serving such a tensor over SHM hands
 * out the segment's fd with the tensor's byte_offset, so a store of many
 * small tensors needs neither an fd nor a client mmap per tensor (the
 * client caches the mapping of a segment it has seen).
 *
 * Exposure (read this before using one).  Whoever receives a segment's fd
 * can map the whole segment, so a client served one tensor from an arena
 * can read every tensor that lies in that segment, now and later.  Put
 * into one arena only tensors that every client allowed to GET any of
 * them may read; a provider must not hand an arena tensor's segment to a
 * client whose permissions are narrower (hr_get_narrow() in
 * <hurray/session.h>; hr_store does this).  Freed space is zeroed before
 * it is reused (whole pages are given back to the kernel), so a segment
 * shows only live tensors and zeros.
 *
 * Placement: every tensor starts at a multiple of 1 << granule_log2
 * (default 6: 64 bytes, the smallest alignment wire-v1 § 7.1 placement
 * needs for a cache line; 12 puts every tensor on its own pages) and of
 * its largest buffer alignment; its buffers follow as § 7.1 places them.
 * Segments are mapped 2 MiB-aligned, so an offset's alignment is the
 * address's.
 *
 * Lifetime: a tensor allocated from an arena keeps its segment; its
 * region becomes free when the tensor's last reference goes (for a served
 * tensor: after every client's BUFFER_RELEASE or connection end, since the
 * server's lease holds a reference).  hr_shm_arena_del() drops the
 * owner's hold; the segments go with the last tensor.
 *
 * Thread safety: every function may be called from any thread; tensors
 * may be released on any thread.
 */
typedef struct hr_shm_arena hr_shm_arena;

/* Defined where the arena API exists (version-added: 0.2). */
#define HURRAY_SHM_ARENA 1

typedef struct hr_shm_arena_config {
  size_t size;            /* sizeof(hr_shm_arena_config) */
  uint64_t max_bytes;     /* cap on all segments together (> 0) */
  uint64_t segment_bytes; /* size of a segment (0: min(max_bytes, 64
                             MiB)); a larger tensor gets a segment of its
                             own size, within max_bytes */
  unsigned granule_log2;  /* placement granule, 6-21 (0: 6) */
} hr_shm_arena_config;

typedef struct hr_shm_arena_stats {
  uint64_t used_bytes;     /* in live regions (rounded to the granule) */
  uint64_t segment_bytes;  /* in segments (the memfds' sizes) */
  uint32_t segments;       /* memfds */
  uint32_t live;           /* tensors not yet released */
} hr_shm_arena_stats;

/* Fills `c` with the defaults (max_bytes 0: set it). */
HR_EXTERN void hr_shm_arena_config_default(hr_shm_arena_config *c);

/* Creates an arena (no segment yet: the first allocation makes one).
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL, max_bytes 0, granule out of
 * range), HR_ERR_NOMEM. */
HR_EXTERN int hr_shm_arena_new(hr_shm_arena **out,
                               const hr_shm_arena_config *cfg,
                               const hr_mem *mem);

/* Drops the owner's hold: no allocation may follow; segments are freed
 * when their last tensor goes.  NULL is a no-op. */
HR_EXTERN void hr_shm_arena_del(hr_shm_arena *a);

/*
 * Allocates a tensor for `desc` inside the arena (contents zeroed); its
 * segment (hr_tensor_segment) is a read-only fd of the arena's memfd and
 * its byte_offset where buffer 0 lies.  Fill the buffers before the
 * tensor is served.  Returns 0, HR_ERR_INVALID_ARGUMENT (NULL, a
 * composite, an alignment above 2^21, size overflow), HR_ERR_LIMIT (it
 * does not fit within max_bytes), HR_ERR_NOMEM, HR_ERR_IO (memfd).
 */
HR_EXTERN int hr_shm_arena_alloc(hr_shm_arena *a, hr_tensor **out,
                                 const hr_descriptor *desc);

/* Copies a plain host tensor into the arena (hr_shm_arena_alloc, then
 * one copy); `t` stays the caller's.  Returns as hr_shm_arena_alloc(),
 * and HR_ERR_INVALID_ARGUMENT for a composite or a buffer that is not
 * host memory. */
HR_EXTERN int hr_shm_arena_copy(hr_shm_arena *a, hr_tensor **out,
                                const hr_tensor *t);

/* 1 when `t` lies in one of the arena's segments, else 0. */
HR_EXTERN int hr_shm_arena_owns(hr_shm_arena *a, const hr_tensor *t);

/* Usage now. */
HR_EXTERN void hr_shm_arena_stats_get(hr_shm_arena *a,
                                      hr_shm_arena_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_SHM_H */
