/*
 * Internal interface of the transcoding layer.
 *
 * The model.  A dense target buffer is enumerated by nested loops over its
 * "fine dims" (outermost first).  Each fine dim d has an extent, an output
 * stride (the buffer is dense over the fine dims, so the stride is the
 * product of the inner extents) and maps to one logical dim k with a
 * multiplier: the region-local logical index is i_k = sum of mult_d * x_d
 * over the fine dims of k.  ROW_MAJOR, COLUMN_MAJOR and PERMUTED have one
 * fine dim per logical dim; TILED splits a dim into a tile-grid dim (mult =
 * tile) and an intra-tile dim (mult 1); PANEL splits the rows into panels
 * and panel rows, with the column dim between them.  Padding is the set of
 * positions whose intra dim x_j reaches lim - cmult * x_t (its "coupled"
 * grid dim t), and is written as zero.
 *
 * A dense source gives each logical dim k a byte-offset function
 * f_k(i) = ((off + i) / tile) * a + ((off + i) % tile) * b, with `off` the
 * region offset: tile 1 makes it affine (STRIDED, ROW/COLUMN_MAJOR,
 * PERMUTED), tile > 1 describes TILED and PANEL sources.  When every f_k is
 * affine over the region, the fine dims get byte strides and the fast
 * "affine" executor runs: the output range is cut into boxes, and each box
 * is copied by a cache-blocked 2-D kernel (a transpose when a non-innermost
 * dim reads the source more contiguously than the innermost one, rows of
 * copies otherwise).  Otherwise the "generic" executor walks output rows
 * and evaluates f_k per row.  Sparse sources are indexed once (sorted
 * target offsets) and scattered into zeroed ranges.
 */
#ifndef HR_XC_INTERNAL_H
#define HR_XC_INTERNAL_H

#include <hurray/transcode.h>

#include "hr_internal.h"

/* At most two fine dims per logical dim: a TILED/PANEL target splits a
 * dim in two, and a tile-aligned TILED/PANEL source splits only a dim the
 * target left whole. */
#define XC_MAX_FD (2 * HR_MAX_RANK)

/* How the dense output is produced. */
enum xc_mode {
  XC_MODE_AFFINE = 0,  /* boxes + blocked kernels over byte strides */
  XC_MODE_GENERIC = 1, /* row by row, f_k evaluated per row */
  XC_MODE_SPARSE = 2   /* zero fill + scatter of indexed entries */
};

/* Instruction sets for the inner kernels, chosen at plan creation. */
enum xc_isa { XC_ISA_PORTABLE = 0, XC_ISA_SSE2 = 1, XC_ISA_AVX2 = 2 };

/* One fine dim of the target (see the model above). */
typedef struct xc_fdim {
  uint64_t ext;     /* extent */
  uint64_t ostride; /* output stride in elements */
  int64_t sstride;  /* source byte stride (affine executor only) */
  uint64_t mult;    /* contribution to the logical index per step */
  uint64_t lim;     /* x is valid while x < lim - cmult * x[couple] */
  uint64_t cmult;   /* multiplier of the coupled grid dim */
  int couple;       /* index of the coupled grid dim, or -1 */
  uint8_t k;        /* logical dim */
  uint8_t refd;     /* another dim is coupled to this one (xd only) */
} xc_fdim;

/* The byte-offset function of one logical dim of a dense source. */
typedef struct xc_sdim {
  uint64_t off;  /* region offset along the dim */
  uint64_t tile; /* >= 1; 1 makes f affine with stride a */
  int64_t a;     /* bytes per tile step (per element when tile is 1) */
  int64_t b;     /* bytes per element inside a tile */
} xc_sdim;

/* An indexed sparse element: its target element offset and its position
 * in the values buffer. */
typedef struct xc_entry {
  uint64_t key;
  uint64_t vidx;
} xc_entry;

/* Everything needed to produce a dense output range. */
typedef struct xc_core {
  unsigned esize;               /* element size in bytes: 1..16 */
  unsigned rank;                /* logical rank */
  uint64_t rshape[HR_MAX_RANK]; /* region (= target) shape */
  uint64_t out_elems;           /* target buffer size in elements */
  int mode;                     /* enum xc_mode */
  int isa;                      /* enum xc_isa */
  uint64_t nt_min;              /* runs of at least this many bytes
                                   bypass the cache (XC_NT_MIN) */
  const uint8_t *src;           /* dense source buffer */
  int64_t sbase;                /* byte offset of logical index 0..0 */
  xc_sdim sd[HR_MAX_RANK];      /* per logical dim (dense sources) */
  unsigned nt;                  /* canonical fine dims */
  xc_fdim td[XC_MAX_FD];
  unsigned nx; /* affine executor dims */
  xc_fdim xd[XC_MAX_FD];
  int64_t xbase;       /* source byte offset of xd's origin */
  const uint8_t *vals; /* sparse source: values buffer */
  xc_entry *ent;       /* sparse source: sorted by key */
  uint64_t nent;
} xc_core;

/* ---- hr_transcode.c ---- */

/* Produces output elements [ea, eb) into dst (pure, no allocation). */
void hr__xc_core_run(const xc_core *c, uint64_t ea, uint64_t eb, uint8_t *dst);

/* Target element offset of a region-local logical index (canonical fine
 * dims); used to index sparse sources. */
uint64_t hr__xc_core_key(const xc_core *c, const uint64_t *idx);

/* Runs producing at least this many bytes write transposes with
 * non-temporal stores, as memcpy does for large copies; smaller outputs
 * stay in the cache, where an engine sending them right away wants them. */
#define XC_NT_MIN (8u << 20)

/* Test hooks: force the generic executor (dense sources only), or a
 * lower instruction set.  Return 0 or HR_ERR_INVALID_ARGUMENT. */
int hr__xc_plan_force_generic(hr_xc_plan *p);
int hr__xc_plan_force_isa(hr_xc_plan *p, int isa);
void hr__xc_plan_set_nt_min(hr_xc_plan *p, uint64_t bytes);
/* The executor a plan uses (enum xc_mode) and its instruction set. */
int hr__xc_plan_mode(const hr_xc_plan *p);
int hr__xc_plan_isa(const hr_xc_plan *p);
/* The best instruction set of this machine. */
int hr__xc_best_isa(void);

/* ---- hr_xc_kernels.c ---- */

/*
 * Row copies: for row r < np, dst row r (at dst + r * drow) gets
 * vi(r) = clamp(vi0 - r * vstep, 0, ni) elements read from src + r * sp
 * with stride si, then zeros up to ni elements; rows r >= vp are all zero.
 */
void hr__xc_rows(uint8_t *dst, uint64_t drow, const uint8_t *src, int64_t sp,
                 int64_t si, uint64_t np, uint64_t ni, uint64_t vp, int64_t vi0,
                 uint64_t vstep, unsigned esize);

/* Orders non-temporal stores before what follows (x86 sfence). */
void hr__xc_fence(void);

/*
 * Blocked transpose: dst[r * drow + c * esize] = src[r * sp + c * si] for
 * r < vp, c < vi; the rest of the np x ni destination block is zeroed.
 * Uses SIMD micro-kernels when sp == esize and `isa` allows, with
 * non-temporal stores when `nt` and the destination is aligned to the
 * micro-kernel's stores (the caller fences).
 */
void hr__xc_xpose(uint8_t *dst, uint64_t drow, const uint8_t *src, int64_t sp,
                  int64_t si, uint64_t np, uint64_t ni, uint64_t vp,
                  uint64_t vi, unsigned esize, int isa, int nt);

/* Copies n elements with source stride si (bytes) into contiguous dst. */
void hr__xc_gather(uint8_t *dst, const uint8_t *src, int64_t si, uint64_t n,
                   unsigned esize);

/* ---- hr_xc_sparse.c ---- */

/*
 * Validates a sparse source and indexes its elements inside the region
 * into c->ent (allocated through mem; the caller frees it).  `scratch`
 * receives the bytes held.  Returns 0, HR_ERR_PROTO (INVALID_DESCRIPTOR,
 * TRANSCODE_FAILED), HR_ERR_LIMIT or HR_ERR_NOMEM.
 */
int hr__xc_sparse_index(xc_core *c, const hr_xc_tensor *src,
                        const uint64_t *roff, const hr_mem *mem,
                        uint64_t max_scratch, uint64_t *scratch,
                        hr_wire_status *st);

/* Counts the non-zero elements of a core whose output is the region in
 * row-major (CSR, COO) or column-major (CSC) order. */
uint64_t hr__xc_count_nonzero(const xc_core *c);

/*
 * Writes a sparse target from such a core into bufs (sized from the count
 * of hr__xc_count_nonzero()).  `layout` is CSR, CSC or COO; `is64` the
 * index width.
 */
void hr__xc_fill_sparse(const xc_core *c, uint8_t layout, int is64,
                        void *const *bufs);

/* Little-endian index access. */
static inline int64_t hr__xc_get_idx(const uint8_t *b, uint64_t j, int is64) {
  uint64_t v = 0;
  if (is64) {
    const uint8_t *p = b + j * 8;
    for (int i = 7; i >= 0; i--)
      v = (v << 8) | p[i];
    return (int64_t)v;
  }
  const uint8_t *p = b + j * 4;
  for (int i = 3; i >= 0; i--)
    v = (v << 8) | p[i];
  return (int64_t)(int32_t)(uint32_t)v;
}
static inline void hr__xc_put_idx(uint8_t *b, uint64_t j, int is64,
                                  uint64_t v) {
  unsigned n = is64 ? 8 : 4;
  uint8_t *p = b + j * n;
  for (unsigned i = 0; i < n; i++, v >>= 8)
    p[i] = (uint8_t)v;
}

#endif /* HR_XC_INTERNAL_H */
