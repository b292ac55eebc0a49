/*
 * libhurray: tensors in memory.
 *
 * An hr_tensor is a reference-counted, immutable pairing of a descriptor
 * (<hurray/wire.h>) with the host memory of its buffers.  The memory is
 * either the application's (with a release callback called exactly once
 * when the last reference goes) or allocated by the library with the
 * requested alignment.  A composite tensor holds its member tensors.
 *
 * Thread safety: references may be taken and dropped from any thread
 * (atomic counts); the contents are immutable once the tensor is handed to
 * the engine, except for tensors the engine is filling (a GET destination
 * or a PUT landing buffer), which belong to the engine until the transfer
 * completes.
 */
#ifndef HURRAY_TENSOR_H
#define HURRAY_TENSOR_H

#include <hurray/common.h>
#include <hurray/wire.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_tensor hr_tensor;

/* Called exactly once, from the thread that dropped the last reference,
 * when the library no longer reads or writes the application's buffers. */
typedef void (*hr_release_fn)(void *release_ctx);

/*
 * Wraps application buffers.  `desc` is copied (pointers inside it, such as
 * ext metadata or params_raw, are deep-copied too).  `buffers` holds
 * desc->buffer_count pointers, each to at least buffers[k].size_bytes bytes.
 * `release` (may be NULL) is called exactly once with `release_ctx` when the
 * tensor is destroyed.  On failure nothing is taken over and `release` is
 * not called.
 *
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL out/desc, a NULL buffer of
 * non-zero size, a composite descriptor: use hr_tensor_new_composite()),
 * HR_ERR_NOMEM.
 */
HR_EXTERN int hr_tensor_wrap(hr_tensor **out, const hr_descriptor *desc,
                             void *const *buffers, hr_release_fn release,
                             void *release_ctx, const hr_mem *mem);

/*
 * Allocates a tensor whose buffers the library owns, each aligned to
 * max(1 << desc->buffers[k].alignment_log2, 1 << min_alignment_log2),
 * placed back to back in one allocation as § 7.1 places them.  Large
 * buffers are mapped with transparent huge pages advised.  Contents are
 * unspecified (not zeroed).  Returns 0, HR_ERR_INVALID_ARGUMENT,
 * HR_ERR_NOMEM.
 */
HR_EXTERN int hr_tensor_alloc(hr_tensor **out, const hr_descriptor *desc,
                              unsigned min_alignment_log2, const hr_mem *mem);

/*
 * Builds a composite: `head` (layout COMPOSITE) plus `n` member tensors
 * (references are taken; the caller keeps its own).  The composite rules
 * of wire-v1 § 7.3 are checked.  Returns 0, HR_ERR_INVALID_ARGUMENT,
 * HR_ERR_PROTO (with `st`, COMPOSITE_INVALID), HR_ERR_NOMEM.
 */
HR_EXTERN int hr_tensor_new_composite(hr_tensor **out,
                                      const hr_descriptor *head,
                                      hr_tensor *const *members, size_t n,
                                      const hr_mem *mem, hr_wire_status *st);

/* ---- device tensors ---------------------------------------------------- */

typedef struct hr_gpu_buf hr_gpu_buf;     /* <hurray/gpu.h> */
typedef struct hr_gpu_event hr_gpu_event; /* <hurray/gpu.h> */

/*
 * Wraps device memory: buffer k's bytes are hr_gpu_buf `bufs[k]` from
 * offset 0 (at least desc->buffers[k].size_bytes long), all on one device.
 * `ready` (may be NULL) is the producer's event (ADR-018 P2): the bytes are
 * final once the point recorded in it completes; NULL means they are final
 * now (P1).  The engine never waits for it on the host: it orders its
 * staging copies after it on the device (stream-wait-event).
 *
 * Ownership: the buffers and the event stay the caller's; the tensor
 * borrows them until `release(release_ctx)` runs (exactly once, when the
 * last reference goes, possibly on the engine's loop thread), after which
 * the library no longer touches them and no copy it enqueued is still
 * pending.  Their device (hr_gpu) must outlive every engine or session the
 * tensor was handed to.  The descriptor's device_tag is the caller's to
 * set (normally the device's, hr_gpu_caps.device_tag); over a network the
 * engine stages the bytes through pinned host memory and sends them
 * producer-synced.  hr_tensor_buffer() returns the host mapping of each
 * buffer where the device has one (pinned, unified), else NULL.
 *
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL arguments, no buffer, a buffer
 * too small, buffers or event of different devices, a composite), HR_ERR_NOMEM.
 */
HR_EXTERN int hr_tensor_wrap_device(hr_tensor **out, const hr_descriptor *desc,
                                    hr_gpu_buf *const *bufs,
                                    hr_gpu_event *ready, hr_release_fn release,
                                    void *release_ctx, const hr_mem *mem);
/* 1 for a tensor made by hr_tensor_wrap_device(), else 0.  NULL-safe. */
HR_EXTERN int hr_tensor_on_device(const hr_tensor *t);
/* Buffer k's device memory / the producer's event (borrowed), or NULL. */
HR_EXTERN hr_gpu_buf *hr_tensor_gpu_buf(const hr_tensor *t, unsigned k);
HR_EXTERN hr_gpu_event *hr_tensor_gpu_event(const hr_tensor *t);

/* Takes a reference; returns `t`.  NULL-safe. */
HR_EXTERN hr_tensor *hr_tensor_ref(hr_tensor *t);
/* Drops a reference; the last one frees the tensor (and calls the release
 * callback of wrapped buffers).  NULL-safe. */
HR_EXTERN void hr_tensor_unref(hr_tensor *t);

/* The descriptor (valid as long as the reference is held). */
HR_EXTERN const hr_descriptor *hr_tensor_descriptor(const hr_tensor *t);
/* Buffer k's memory, or NULL when k >= buffer_count. */
HR_EXTERN void *hr_tensor_buffer(const hr_tensor *t, unsigned k);
/* Total bytes of all buffers (0 for a composite head). */
HR_EXTERN uint64_t hr_tensor_bytes(const hr_tensor *t);
/* Composite members: count (0 for a plain tensor) and member i (borrowed). */
HR_EXTERN size_t hr_tensor_member_count(const hr_tensor *t);
HR_EXTERN hr_tensor *hr_tensor_member(const hr_tensor *t, size_t i);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_TENSOR_H */
