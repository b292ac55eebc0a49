/*
 * Host glue of the CUDA transcode kernels: reduces a plan to one kernel
 * launch.  The plan's dense producer (xc_core) already describes a dense
 * source as an affine map, logical index -> byte offset (sd[k].a per dim,
 * sbase plus the region offsets); the target's descriptor comes from
 * hr_xc_plan_describe().  From these the glue fills one xcu_args block:
 *
 *  - ROW_MAJOR, COLUMN_MAJOR, PERMUTED targets: the output's dims in
 *    storage order with their source strides, dims of extent 1 dropped and
 *    neighbours that the source stores contiguously merged.  When the
 *    innermost output dim is not the source's contiguous one but another
 *    dim is, the tiled shared-memory transpose runs; otherwise the strided
 *    gather.
 *  - TILED, PANEL targets: the logical dims with their strides and tiles.
 *
 * The kernels come from the fatbin embedded at build time and are
 * launched through the cuda backend (gpu/), which loads the module once
 * per device.
 */
#include <string.h>

#include <hurray/gpu.h>
#include <hurray/transcode.h>

#include "hr_gpu_int.h"
#include "hr_xc_cuda_args.h"
#include "hr_xc_internal.h"

#ifdef HR_XC_HAVE_CUDA
extern const unsigned char hr__xc_cuda_image[];
extern const size_t hr__xc_cuda_image_size;
#endif

int hr_xc_cuda_built(void) {
#ifdef HR_XC_HAVE_CUDA
  return 1;
#else
  return 0;
#endif
}

#ifdef HR_XC_HAVE_CUDA

/* Grid dimensions are capped; the kernels loop over the rest. */
#define GRID_CAP 65535u

static unsigned cap_grid(uint64_t n) {
  return n == 0 ? 1u : n > GRID_CAP ? GRID_CAP : (unsigned)n;
}

static uint64_t ceil_div(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

/* Drops extent-1 dims and merges dim d into d + 1 where the source steps
 * over d exactly as over the whole of d + 1 (so the pair is one dim). */
static void coalesce(xcu_args *a) {
  unsigned n = 0;
  for (unsigned d = 0; d < a->nd; d++) {
    if (a->ext[d] == 1)
      continue;
    a->ext[n] = a->ext[d];
    a->sstride[n] = a->sstride[d];
    n++;
  }
  unsigned m = 0;
  for (unsigned d = 0; d < n; d++) {
    int64_t span;
    if (m > 0 && a->ext[d] <= (uint64_t)INT64_MAX &&
        !__builtin_mul_overflow(a->sstride[d], (int64_t)a->ext[d], &span) &&
        a->sstride[m - 1] == span) {
      a->ext[m - 1] *= a->ext[d];
      a->sstride[m - 1] = a->sstride[d];
      continue;
    }
    a->ext[m] = a->ext[d];
    a->sstride[m] = a->sstride[d];
    m++;
  }
  if (m == 0) { /* a single element */
    a->ext[0] = 1;
    a->sstride[0] = 0;
    m = 1;
  }
  a->nd = m;
}

/* Fills `a` and the launch shape for the plan; returns 0 or
 * HR_ERR_UNSUPPORTED. */
static int prepare(const hr_xc_plan *p, xcu_args *a, hr__gpu_cuda_kernel *k,
                   const char **kind) {
  const xc_core *c = hr__xc_plan_core(p);
  hr_descriptor t;
  if (c->mode == XC_MODE_SPARSE || hr_xc_plan_needs_whole(p) ||
      hr_xc_plan_describe(p, &t) != 0)
    return HR_ERR_UNSUPPORTED;
  const int64_t e = (int64_t)c->esize;
  const unsigned r = c->rank;
  int64_t base = c->sbase;
  int64_t stride[HR_MAX_RANK];
  memset(a, 0, sizeof *a);
  for (unsigned d = 0; d < r; d++) {
    /* Offsets stay inside the checked source buffer, so no overflow. */
    if (c->sd[d].tile != 1)
      return HR_ERR_UNSUPPORTED;
    stride[d] = c->sd[d].a / e;
    base += (int64_t)c->sd[d].off * c->sd[d].a;
  }
  a->base = base / e;
  a->n = c->out_elems;
  memset(k, 0, sizeof *k);
  k->block[0] = k->block[1] = k->block[2] = 1;
  k->grid[0] = k->grid[1] = k->grid[2] = 1;
  switch (t.layout.tag) {
  case HR_LAYOUT_ROW_MAJOR:
  case HR_LAYOUT_COLUMN_MAJOR:
  case HR_LAYOUT_PERMUTED: {
    for (unsigned j = 0; j < r; j++) {
      unsigned d = t.layout.tag == HR_LAYOUT_ROW_MAJOR      ? j
                   : t.layout.tag == HR_LAYOUT_COLUMN_MAJOR ? r - 1 - j
                                                            : t.params.order[j];
      a->ext[j] = c->rshape[d];
      a->sstride[j] = stride[d];
    }
    a->nd = r;
    coalesce(a);
    const unsigned q = a->nd - 1;
    unsigned pd = q;
    if (a->sstride[q] != 1 && a->ext[q] >= 8)
      for (unsigned d = q; d-- > 0;)
        if (a->sstride[d] == 1 && a->ext[d] >= 8) {
          pd = d;
          break;
        }
    if (pd != q) {
      a->pdim = pd;
      *kind = "xpose";
      k->block[0] = XCU_TILE;
      k->block[1] = XCU_TILE_ROWS;
      k->grid[0] = cap_grid(ceil_div(a->ext[q], XCU_TILE));
      k->grid[1] = cap_grid(ceil_div(a->ext[pd], XCU_TILE));
      k->grid[2] = cap_grid(a->n / (a->ext[q] * a->ext[pd]));
    } else {
      const uint64_t inner = a->ext[q], rows = a->n / inner;
      *kind = "gather";
      k->block[0] = inner >= XCU_BLOCK ? XCU_BLOCK
                                       : (unsigned)ceil_div(inner, 32) * 32;
      k->grid[0] = cap_grid(ceil_div(inner, k->block[0]));
      k->grid[1] = cap_grid(rows);
      k->grid[2] = cap_grid(ceil_div(rows, k->grid[1]));
    }
    return 0;
  }
  case HR_LAYOUT_TILED:
  case HR_LAYOUT_PANEL:
    *kind = t.layout.tag == HR_LAYOUT_TILED ? "tiled" : "panel";
    for (unsigned d = 0; d < r; d++) {
      a->ext[d] = c->rshape[d];
      a->sstride[d] = stride[d];
      a->tile[d] = t.layout.tag == HR_LAYOUT_TILED ? t.params.tile[d] : 1;
    }
    if (t.layout.tag == HR_LAYOUT_PANEL)
      a->tile[0] = t.params.mr;
    a->nd = r;
    if (r == 0) { /* a scalar: one tile of one element */
      a->ext[0] = a->tile[0] = 1;
      a->nd = 1;
    }
    k->block[0] = XCU_BLOCK;
    k->grid[0] = cap_grid(ceil_div(a->n, XCU_BLOCK));
    return 0;
  default: return HR_ERR_UNSUPPORTED;
  }
}

#endif /* HR_XC_HAVE_CUDA */

int hr_xc_cuda_run(hr_gpu *g, const hr_xc_plan *plan, const void *src_dev,
                   void *dst_dev, hr_gpu_stream *stream) {
  if (!g || !plan || !stream || hr_gpu_stream_device(stream) != g)
    return HR_ERR_INVALID_ARGUMENT;
  const uint64_t out = hr_xc_plan_out_size(plan);
  if (hr_xc_plan_needs_whole(plan))
    return HR_ERR_UNSUPPORTED;
  const unsigned esize = hr__xc_plan_core(plan)->esize;
  const uintptr_t align = esize > 8 ? 8 : esize;
  if (out > 0 && (!src_dev || !dst_dev || (uintptr_t)src_dev % align ||
                  (uintptr_t)dst_dev % align))
    return HR_ERR_INVALID_ARGUMENT;
#ifdef HR_XC_HAVE_CUDA
  if (hr_gpu_get_ops(g) != &hr__gpu_cuda_ops)
    return HR_ERR_UNSUPPORTED;
  xcu_args a;
  hr__gpu_cuda_kernel k;
  const char *kind = NULL;
  int rv = prepare(plan, &a, &k, &kind);
  if (rv != 0 || out == 0)
    return rv;
  static const char *const sfx[] = {"e1", "e2", "e4", "e8", "e16"};
  unsigned si = esize == 1 ? 0 : esize == 2 ? 1 : esize == 4 ? 2
                : esize == 8 ? 3 : 4;
  char name[32];
  memcpy(name, "hr_xc_", 6);
  size_t kl = strlen(kind), sl = strlen(sfx[si]);
  memcpy(name + 6, kind, kl);
  name[6 + kl] = '_';
  memcpy(name + 7 + kl, sfx[si], sl + 1);
  void *args[] = {&a, &src_dev, &dst_dev};
  k.name = name;
  k.args = args;
  return hr__gpu_cuda_launch(g, hr__xc_cuda_image, stream, &k);
#else
  return HR_ERR_UNSUPPORTED;
#endif
}
