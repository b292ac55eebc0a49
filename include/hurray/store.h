/*
 * libhurray: an in-memory tensor store.
 *
 * An hr_store maps keys (1-1024 bytes, compared as bytes) to tensors and
 * serves them as an hr_provider (<hurray/session.h>): GET answers from the
 * map, PUT commits into it, LIST walks the keys in ascending byte order.
 *
 * Consistency: a PUT becomes visible only when its last byte arrived and
 * validated (hr_provider.on_put_commit), by swapping one pointer under the
 * store's lock.  A GET takes a reference to the tensor it found, so a GET
 * that races a replacing PUT sends the old tensor or the new one, never a
 * mix of both.
 *
 * Thread safety: every function may be called from any thread; one store
 * may serve several engines.  Tensors must not change once stored.
 */
#ifndef HURRAY_STORE_H
#define HURRAY_STORE_H

#include <hurray/common.h>
#include <hurray/session.h>
#include <hurray/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_store hr_store;

#define HR_STORE_CONFIG_VERSION 1

typedef struct hr_store_config {
  int version;        /* HR_STORE_CONFIG_VERSION */
  int allow_put;      /* serve TENSOR_PUT (0: the provider has no PUT
                         callbacks, so TENSOR_PUT is not advertised) */
  int allow_replace;  /* honour the REPLACE flag (0: an existing key is
                         always ALREADY_EXISTS) */
  uint64_t max_bytes; /* cap on the bytes stored (0: none); a PUT over it
                         is refused with RESOURCE_EXHAUSTED */
  /* ---- appended in 0.2 ---- */
  uint64_t shm_arena_bytes; /* > 0: keep tensors in a shared arena of at
                         most this many bytes (<hurray/shm.h>), so that
                         GETs over the SHM data plane hand out the arena's
                         fd with the tensor's offset: no copy, no fd and
                         (on a libhurray client) no mmap per tensor.  A
                         plain host tensor without a segment of its own
                         (hr_store_put, or a PUT's landing buffer: those
                         of 1 MiB and more over a Unix socket already
                         are segments) is copied in once when it is
                         stored; what does not fit stays where it is.
                         Every client that receives the fd can read the
                         whole arena: a GET marked hr_get_narrow() (a
                         token bounded to prefixes) is answered from a
                         private copy instead (frames below 1 MiB, an own
                         segment above).  0: no arena. */
} hr_store_config;

/* Fills `c` with the defaults: PUT off, replace on, no byte cap. */
HR_EXTERN void hr_store_config_default(hr_store_config *c);

/* Creates an empty store (cfg NULL: defaults; copied).  Returns 0,
 * HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM. */
HR_EXTERN int hr_store_new(hr_store **out, const hr_store_config *cfg,
                           const hr_mem *mem);

/* Drops every tensor and frees the store.  NULL is a no-op.  No provider
 * handed out by hr_store_provider() may be in use any more. */
HR_EXTERN void hr_store_del(hr_store *s);

/*
 * Stores `t` under `key` (a reference is taken; the caller keeps its own).
 * With a shared arena, `t` may be stored as a copy inside it (see
 * hr_store_config.shm_arena_bytes).
 * With HR_PUT_REPLACE in `flags` an existing tensor is replaced
 * atomically; without it an existing key is refused.  The byte cap does
 * not apply here (it is the network's).  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (key length outside 1-1024, NULL tensor),
 * HR_ERR_STATE (the key exists and REPLACE was not given), HR_ERR_NOMEM.
 */
HR_EXTERN int hr_store_put(hr_store *s, const void *key, size_t key_len,
                           hr_tensor *t, uint32_t flags);

/* Finds a tensor: *out receives a new reference (drop it with
 * hr_tensor_unref()), NULL when there is none.  Returns 0,
 * HR_ERR_NOT_FOUND, or HR_ERR_INVALID_ARGUMENT (NULL s, key or out). */
HR_EXTERN int hr_store_get(hr_store *s, const void *key, size_t key_len,
                           hr_tensor **out);

/* Removes a key; GETs already sending its tensor finish with it.
 * Returns 0, HR_ERR_NOT_FOUND, or HR_ERR_INVALID_ARGUMENT (NULL s or
 * key). */
HR_EXTERN int hr_store_remove(hr_store *s, const void *key, size_t key_len);

/* Number of keys, and the tensor bytes they hold (composite members
 * counted). */
HR_EXTERN size_t hr_store_count(const hr_store *s);
HR_EXTERN uint64_t hr_store_bytes(const hr_store *s);

/* Changes the byte cap of hr_store_config.max_bytes (0: none); PUTs
 * already stored stay.  A server that loads files first and then allows
 * PUTs sets it to what it loaded plus what PUTs may add.
 * version-added: 0.1 */
HR_EXTERN void hr_store_set_max_bytes(hr_store *s, uint64_t max_bytes);

/* The store's shared arena (hr_store_config.shm_arena_bytes), borrowed
 * for as long as the store lives; NULL without one. */
HR_EXTERN struct hr_shm_arena *hr_store_arena(hr_store *s);

/* Fills `out` with a provider serving this store (GET, LIST and, with
 * allow_put, PUT).  The store must outlive every session using it. */
HR_EXTERN void hr_store_provider(hr_store *s, hr_provider *out);

/* The LIST entry the store reports for a tensor: a plain tensor's
 * element type, layout, shape and bytes; a composite's head element type,
 * shape, layout COMPOSITE and the bytes of all its members.  `key` is not
 * filled. */
HR_EXTERN void hr_store_entry_of(const hr_tensor *t, hr_list_entry *out);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_STORE_H */
