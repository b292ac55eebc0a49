/*
 * Internal helpers shared by the engine core (engine/core/): tensors and
 * the sans-IO session.  Built on the proto/ internals (allocation through
 * an hr_mem, overflow-checked arithmetic).
 */
#ifndef HR_CORE_H
#define HR_CORE_H

#include <hurray/gpu.h>
#include <hurray/session.h>
#include <hurray/tensor.h>
#include <hurray/wire.h>

#include "hr_internal.h"

/* Buffers of at least this many bytes get transparent huge pages advised
 * and a 2 MiB-aligned base (one huge page). */
#define HR_HUGE_THRESHOLD ((uint64_t)2 << 20)

/* Advises transparent huge pages for the whole pages inside [p, p+len).
 * Advice only: never fails. */
void hr__huge_advise(void *p, size_t len);

/*
 * Places a descriptor's buffers back to back as wire-v1 § 7.1 does, each at
 * max(its alignment, 1 << min_alignment_log2).  Fills offsets[k] (relative
 * to a base aligned to *base_align) and *span (end of the last buffer).
 * Returns 0, or HR_ERR_INVALID_ARGUMENT (alignment above 2^21, too many
 * buffers, size overflow).
 */
int hr__tensor_placement(const hr_descriptor *d, unsigned min_alignment_log2,
                         uint64_t offsets[HR_MAX_BUFFERS], uint64_t *span,
                         uint64_t *base_align);

/*
 * Checks the composite rules of wire-v1 § 7.3 for a head and its members'
 * descriptors (members may themselves be composite heads; `member_depth`
 * is the deepest nesting among them, 0 when none is a composite).
 * Returns 0 or HR_ERR_PROTO with COMPOSITE_INVALID in `st`.
 */
int hr__composite_check(const hr_descriptor *head,
                        const hr_descriptor *const *members, size_t n,
                        unsigned member_depth, hr_wire_status *st);

/* Attaches a release callback to a tensor that has none (used when a
 * received tensor lives in the application's GET buffer).  Called by the
 * owner before the tensor is shared. */
void hr__tensor_set_release(hr_tensor *t, hr_release_fn fn, void *ctx);

/* Someone to tell when a tensor is freed: fn(a, b, t) runs in the last
 * hr_tensor_unref() (on whichever thread drops it), before the buffers go.
 * The caller holds a reference; any thread may add watchers.  A watcher
 * equal in (fn, a, b) to one already there is not added again.  Returns 0
 * (added), 1 (already there) or HR_ERR_NOMEM. */
typedef struct hr__tensor_watcher hr__tensor_watcher;
typedef void (*hr__tensor_freed_fn)(void *a, void *b, hr_tensor *t);
int hr__tensor_watch(hr_tensor *t, hr__tensor_freed_fn fn, void *a, void *b);
/* The release context of a tensor wrapped with release function `fn`
 * (hr_tensor_wrap), else NULL: lets a module recognise its own tensors. */
void *hr__tensor_release_ctx(const hr_tensor *t, hr_release_fn fn);

/* A device tensor of `desc` with no memory yet (no buffer, host or
 * device): what a GET into device memory lands in while its device
 * buffers are being allocated off the loop thread (hr_devrx.c), whose
 * bytes never go through the tensor.  Returns 0, HR_ERR_INVALID_ARGUMENT
 * or HR_ERR_NOMEM. */
int hr__tensor_shell(hr_tensor **out, const hr_descriptor *desc,
                     const hr_mem *mem);

/* Composite nesting depth of a tensor (0 for a plain tensor, 1 for a
 * composite whose members are all plain). */
unsigned hr__tensor_depth(const hr_tensor *t);

#endif /* HR_CORE_H */
