/*
 * libhurray: layout transcoding kernels (transcode/).
 *
 * Pure functions, buffers in and buffers out: no I/O, no clock, no thread,
 * no engine state.  Allocation goes only through the hr_mem given to
 * hr_xc_plan_new().
 *
 * The unit of work is a *plan*: one source tensor in memory (a descriptor
 * plus pointers to its buffers), one target layout and an optional region
 * of the source (an offset+shape box of its logical index space).  The plan
 * checks everything once, then produces the target's bytes.
 *
 * Dense targets (ROW_MAJOR, COLUMN_MAJOR, PERMUTED, TILED, PANEL) have one
 * buffer, and any byte range of it can be produced on its own:
 *
 *     hr_xc_plan_new(&p, &src, &dst, region, NULL, mem, &st);
 *     size = hr_xc_plan_out_size(p);
 *     for each chunk [b, b + n) of [0, size), in any order, on any thread:
 *       hr_xc_run(p, b, n, out_chunk);
 *     hr_xc_plan_del(p);
 *
 * so an engine can cut the output into frames, keep a bounded window of
 * them in memory and let a worker pool fill them in parallel.
 *
 * Sparse targets (SPARSE_CSR, SPARSE_CSC, SPARSE_COO) cannot be produced by
 * range: the number of non-zeros decides every buffer's size.  For them
 * hr_xc_plan_needs_whole() returns 1 and the two-pass API is used:
 *
 *     hr_xc_plan_count(p, &st);                  // pass 1: count non-zeros
 *     n = hr_xc_plan_buffer_sizes(p, sizes);     // now known
 *     hr_xc_run_sparse(p, bufs);                 // pass 2: fill all buffers
 *
 * Supported sources: ROW_MAJOR, COLUMN_MAJOR, STRIDED (any strides,
 * including zero and negative), PERMUTED, TILED, PANEL, SPARSE_COO,
 * SPARSE_CSR, SPARSE_CSC and SPARSE_BSR.  Every source can be transcoded to
 * every supported target.  Element sizes 1, 2, 4, 8 and 16 bytes; INT4 and
 * UINT4 are never transcoded (§ 18).  Ranks 0 to 32; empty tensors give an
 * output of 0 bytes (sparse: indptr only).
 *
 * Element preservation: the logical tensor is unchanged; padding (TILED
 * edge tiles, the last PANEL panel) is written as zero bytes.  For sparse
 * targets an element is "zero" only when all of its bytes are zero, so that
 * -0.0 and NaN payloads survive a round trip.
 *
 * Thread safety: a plan is immutable after hr_xc_plan_new() (and after
 * hr_xc_plan_count() for sparse targets): hr_xc_run() may be called from
 * several threads at once on the same plan, on the same or different
 * ranges.  hr_xc_plan_count() must not run concurrently with anything else
 * on the same plan.
 */
#ifndef HURRAY_TRANSCODE_H
#define HURRAY_TRANSCODE_H

#include <hurray/common.h>
#include <hurray/wire.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A tensor in memory.  `desc` describes it as on the wire: element_type,
 * rank, shape, layout (tag; for PANEL params.mr, or else the entry's 4-byte
 * ext_metadata), params (origin and strides, order, tile, nnz, index_type,
 * sorted, br/bc).  Only those fields are read; flags, parent_shape,
 * shard_offset, byte_offset and the buffer handles are ignored, so the
 * region below is counted in the tensor's own index space (a shard's shape,
 * not its parent's).
 *
 * buffers[k] holds sizes[k] readable bytes (k < the layout's buffer count:
 * 1 for dense layouts; COO: indices then values; CSR/CSC/BSR: indptr,
 * indices, values).  The descriptor is read during hr_xc_plan_new() only;
 * the buffers are borrowed and must stay valid and unchanged until the
 * plan is deleted.  A buffer of size 0 may be NULL.
 */
typedef struct hr_xc_tensor {
  const hr_descriptor *desc;
  const void *buffers[HR_MAX_BUFFERS];
  uint64_t sizes[HR_MAX_BUFFERS];
} hr_xc_tensor;

/*
 * The layout to produce.  `layout` is one of HR_LAYOUT_ROW_MAJOR,
 * _COLUMN_MAJOR, _PERMUTED (params.order: a permutation of 0..rank-1,
 * order[0] the outermost stored dim), _TILED (params.tile[k] >= 1), _PANEL
 * (params.mr >= 1, rank 2), _SPARSE_CSR or _SPARSE_CSC (rank 2) and
 * _SPARSE_COO (rank >= 1).  For the sparse targets params.index_type is
 * HR_ELEM_INT32, HR_ELEM_INT64, or 0 to let the plan choose (INT32 when
 * every index and indptr value fits, else INT64).  Other params fields are
 * ignored.  The target's shape is the region's shape (the whole source
 * when there is no region): a TILED or PANEL region is padded on its own.
 */
typedef struct hr_xc_target {
  uint8_t layout;
  hr_layout_params params;
} hr_xc_target;

/* A box of the source's logical index space: offset[k] + shape[k] <=
 * source shape[k] for k < rank. */
typedef struct hr_xc_region {
  uint64_t offset[HR_MAX_RANK];
  uint64_t shape[HR_MAX_RANK];
} hr_xc_region;

/* Options of hr_xc_plan_new(); NULL means all defaults (zero). */
typedef struct hr_xc_opts {
  /* The most bytes of scratch memory the plan may hold (0: no limit).
   * Only sparse sources need scratch (16 bytes per stored element inside
   * the region, twice while sorting): a plan that would need more fails
   * with HR_ERR_LIMIT before allocating, so a server can fall through to
   * its next preference (the transcoding memory limit). */
  uint64_t max_scratch;
} hr_xc_opts;

typedef struct hr_xc_plan hr_xc_plan;

/*
 * Creates a plan transcoding `src` (restricted to `region`, NULL for the
 * whole tensor) into the layout `dst`.  Everything is checked here, once:
 * descriptor values, buffer sizes (a STRIDED tensor's lowest and highest
 * addressed byte), sparse data (indptr, index ranges, COO `sorted`,
 * repeated coordinates), the region and the target parameters.  For
 * sparse sources the plan indexes the stored elements inside the region
 * (scratch memory, see hr_xc_opts).  `src`, `dst`, `region` and `opts` are
 * read during the call only; src->buffers are borrowed for the plan's
 * life.  `mem` NULL means the C library's allocator.
 *
 * Returns 0 and sets *out, or:
 *  - HR_ERR_PROTO with `st` (may be NULL) filled: INVALID_DESCRIPTOR for a
 *    fault of the source (parameters, a buffer shorter than the descriptor
 *    needs, a STRIDED span outside its buffer, a bad indptr, an
 *    out-of-range sparse index, an unsorted `sorted` COO),
 *    TRANSCODE_FAILED for a repeated coordinate inside the region of a
 *    sparse source densified, INVALID_REGION for a region outside the
 *    tensor;
 *  - HR_ERR_UNSUPPORTED: INT4/UINT4, a source or target layout this module
 *    does not transcode (composites, STRIDED or BSR as a target,
 *    unregistered extension layouts), or a target whose rank rule fails
 *    (PANEL/CSR/CSC need rank 2, COO rank >= 1);
 *  - HR_ERR_INVALID_ARGUMENT: NULL pointers, bad target parameters (order
 *    not a permutation, a tile or mr of 0, an index_type other than 0,
 *    INT32, INT64);
 *  - HR_ERR_LIMIT: the scratch memory would exceed opts->max_scratch, or
 *    the target buffer's size would overflow 64 bits;
 *  - HR_ERR_NOMEM.
 * May be called from any thread.  version-added: 0.1
 */
HR_EXTERN int hr_xc_plan_new(hr_xc_plan **out, const hr_xc_tensor *src,
                             const hr_xc_target *dst,
                             const hr_xc_region *region, const hr_xc_opts *opts,
                             const hr_mem *mem, hr_wire_status *st);

/* Frees the plan and its scratch; NULL is a no-op. */
HR_EXTERN void hr_xc_plan_del(hr_xc_plan *p);

/* Returns 1 when the target cannot be produced by range (sparse targets:
 * use hr_xc_plan_count() and hr_xc_run_sparse()), 0 otherwise. */
HR_EXTERN int hr_xc_plan_needs_whole(const hr_xc_plan *p);

/*
 * Dense targets: the exact size in bytes of the target buffer (padding
 * included).  Sparse targets: the total of all buffers once
 * hr_xc_plan_count() succeeded, 0 before.
 */
HR_EXTERN uint64_t hr_xc_plan_out_size(const hr_xc_plan *p);

/*
 * A hint for cutting the output into ranges: a byte count (>= 1) such that
 * ranges starting and ending on its multiples run at full speed (whole
 * blocks of the inner kernel).  Any range is correct; this one is fast.
 */
HR_EXTERN uint64_t hr_xc_plan_grain(const hr_xc_plan *p);

/* Bytes of scratch memory the plan holds (sparse sources: the index). */
HR_EXTERN uint64_t hr_xc_plan_scratch(const hr_xc_plan *p);

/*
 * Produces bytes [out_begin, out_begin + out_len) of the dense target
 * buffer into out[0..out_len): out[0] receives the target's byte
 * `out_begin`.  Ranges need not be element-aligned.  Pure: no allocation,
 * no side effect on the plan; callable concurrently on any ranges.
 * Returns 0, or HR_ERR_INVALID_ARGUMENT when the range passes
 * hr_xc_plan_out_size(), `out` is NULL with out_len > 0, or the target is
 * sparse.
 */
HR_EXTERN int hr_xc_run(const hr_xc_plan *p, uint64_t out_begin,
                        uint64_t out_len, void *out);

/*
 * Sparse targets, pass 1: counts the non-zero elements of the region (a
 * full read of the source, through a 16 KiB stack buffer; no allocation).
 * Afterwards hr_xc_plan_buffer_sizes(), hr_xc_plan_out_size() and
 * hr_xc_plan_describe() report the final sizes, and the index type is
 * fixed (INT32 when the target asked for 0 and every value fits).
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL plan, dense target),
 * HR_ERR_UNSUPPORTED when the target's index_type is INT32 and an index
 * or indptr value does not fit it, or HR_ERR_LIMIT when a buffer size
 * would overflow 64 bits.  `st` is reserved for faults found while
 * scanning (none at present: hr_xc_plan_new() checked the source); it
 * may be NULL.  Idempotent.
 */
HR_EXTERN int hr_xc_plan_count(hr_xc_plan *p, hr_wire_status *st);

/*
 * Fills sizes[0..n) with the exact size of each target buffer and returns
 * n (1 for dense targets; COO 2; CSR/CSC 3), or HR_ERR_STATE for a sparse
 * target before hr_xc_plan_count().
 */
HR_EXTERN int hr_xc_plan_buffer_sizes(const hr_xc_plan *p,
                                      uint64_t sizes[HR_MAX_BUFFERS]);

/*
 * Sparse targets, pass 2: writes every target buffer; bufs[k] must hold
 * the size hr_xc_plan_buffer_sizes() gave (a buffer of size 0 may be
 * NULL).  COO is written in lexicographic order without duplicates
 * (sorted = 1); CSR rows and CSC columns have increasing indices.  No
 * allocation.  Returns 0, HR_ERR_INVALID_ARGUMENT (dense target, NULL
 * buffer) or HR_ERR_STATE (before hr_xc_plan_count()).  May run
 * concurrently with other hr_xc_run_sparse() calls on the same plan.
 */
HR_EXTERN int hr_xc_run_sparse(const hr_xc_plan *p, void *const *bufs);

/*
 * Fills the fields of an outgoing descriptor that the transcoding decides:
 * descriptor_version 1, element_type, rank, shape (the region's), layout
 * (for PANEL the entry's ext points to 4 bytes of metadata inside the plan,
 * valid for the plan's life), params (with the chosen index_type, nnz and
 * sorted for sparse targets), buffer_count and each buffer's size_bytes.
 * Every other field is set to zero for the caller to fill (flags,
 * parent_shape, shard_offset, byte_offset, the rest of the buffer handles).
 * Returns 0 or HR_ERR_STATE (a sparse target before hr_xc_plan_count()).
 */
HR_EXTERN int hr_xc_plan_describe(const hr_xc_plan *p, hr_descriptor *d);

/*
 * Returns 1 when the module can transcode a tensor of element type
 * `elem` stored as `src_layout` into `dst_layout` (ignoring rank rules and
 * parameters), else 0.  Lets a server decide quickly which preferences it
 * can satisfy; hr_xc_plan_new() has the final word.
 */
HR_EXTERN int hr_xc_supported(uint8_t elem, uint8_t src_layout,
                              uint8_t dst_layout);

/* ---- on a CUDA device (transcode/cuda/) -------------------------------- */

typedef struct hr_gpu hr_gpu;
typedef struct hr_gpu_stream hr_gpu_stream;

/*
 * Produces the whole dense target of `plan` on a CUDA device:
 * `src_dev` is the device address of the source buffer (it replaces the
 * plan's buffers[0], which is never read: build the plan with the
 * source's descriptor, its size and any non-NULL pointer, e.g. the device
 * address), `dst_dev` receives hr_xc_plan_out_size() bytes (padding
 * zeroed).  Asynchronous: the kernel is enqueued on `stream` (a stream of
 * `g`) and the call returns; wait on the stream or an event recorded after
 * it before reading dst_dev or changing src_dev.  The plan may be deleted
 * once the call returned.  Both addresses must be aligned to the element
 * size (8 bytes for 16-byte elements), as device allocations are.
 *
 * Supported: sources whose elements sit at affine offsets (ROW_MAJOR,
 * COLUMN_MAJOR, PERMUTED, STRIDED) and the targets ROW_MAJOR,
 * COLUMN_MAJOR, PERMUTED, TILED and PANEL, with the plan's region.
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL g, plan or stream, a NULL or
 * misaligned address with a non-empty output, a stream of another
 * device), HR_ERR_UNSUPPORTED (the library was built without the
 * kernels, `g` is not a cuda device or the embedded code has none for it,
 * a sparse source or target, a TILED or PANEL source), HR_ERR_NOMEM or
 * HR_ERR_IO (launch failures), HR_ERR_LIMIT (the device already holds
 * its maximum of loaded code modules).  May be called from any thread.
 * version-added: 0.1
 */
HR_EXTERN int hr_xc_cuda_run(hr_gpu *g, const hr_xc_plan *plan,
                             const void *src_dev, void *dst_dev,
                             hr_gpu_stream *stream);

/* Returns 1 when the library embeds the CUDA transcode kernels (it was
 * built where nvcc was found), else 0.  version-added: 0.1 */
HR_EXTERN int hr_xc_cuda_built(void);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_TRANSCODE_H */
