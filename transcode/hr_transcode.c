/*
 * Transcoding plans: checking a source and a target once, then producing
 * any range of the target buffer.  The model (fine dims, per-dim source
 * offset functions, the three executors) is described in hr_xc_internal.h.
 */
#include <string.h>

#include "hr_xc_internal.h"

#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE2__))
#define XC_X86 1
#endif

struct hr_xc_plan {
  hr_mem mem;               /* copy of the caller's allocator */
  xc_core core;             /* the dense producer (also behind sparse
                               targets, in row- or column-major order) */
  uint8_t elem_type;        /* the source's element type */
  uint8_t tlayout;          /* target layout tag */
  hr_layout_params tparams; /* target parameters as given (index_type may
                               be 0 until counted) */
  uint8_t panel_meta[4];    /* PANEL ext_metadata: u32 mr, little-endian */
  int sparse_tgt;           /* target is CSR, CSC or COO */
  int counted;              /* hr_xc_plan_count() succeeded */
  uint64_t nnz;             /* sparse target: non-zero count */
  int is64;                 /* sparse target: 64-bit indices */
  uint64_t scratch;         /* bytes held for the sparse source index */
  uint64_t out_bytes;       /* dense target: buffer size */
};

static int fail(hr_wire_status *st, uint32_t code, const char *why) {
  return hr__wire_fail(st, code, 0, why);
}

static inline uint64_t min_u64(uint64_t a, uint64_t b) {
  return a < b ? a : b;
}

/* Element size in bytes (§ 4, hr_elem_bits); 0 for INT4/UINT4 (never
 * transcoded), -1 for NONE or a value v1 cannot size. */
static int elem_size(uint8_t t) {
  unsigned bits = hr_elem_bits(t);
  return bits ? (int)(bits / 8) : -1;
}

static int is_dense_source(uint8_t tag) {
  return tag == HR_LAYOUT_ROW_MAJOR || tag == HR_LAYOUT_COLUMN_MAJOR ||
         tag == HR_LAYOUT_STRIDED || tag == HR_LAYOUT_PERMUTED ||
         tag == HR_LAYOUT_TILED || tag == HR_LAYOUT_PANEL;
}
static int is_sparse(uint8_t tag) {
  return tag == HR_LAYOUT_SPARSE_COO || tag == HR_LAYOUT_SPARSE_CSR ||
         tag == HR_LAYOUT_SPARSE_CSC || tag == HR_LAYOUT_SPARSE_BSR;
}
static int is_dense_target(uint8_t tag) {
  return tag == HR_LAYOUT_ROW_MAJOR || tag == HR_LAYOUT_COLUMN_MAJOR ||
         tag == HR_LAYOUT_PERMUTED || tag == HR_LAYOUT_TILED ||
         tag == HR_LAYOUT_PANEL;
}
static int is_sparse_target(uint8_t tag) {
  return tag == HR_LAYOUT_SPARSE_CSR || tag == HR_LAYOUT_SPARSE_CSC ||
         tag == HR_LAYOUT_SPARSE_COO;
}

int hr_xc_supported(uint8_t elem, uint8_t src_layout, uint8_t dst_layout) {
  if (elem_size(elem) <= 0)
    return 0;
  if (!is_dense_source(src_layout) && !is_sparse(src_layout))
    return 0;
  return is_dense_target(dst_layout) || is_sparse_target(dst_layout);
}

int hr__xc_best_isa(void) {
#ifdef XC_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2"))
    return XC_ISA_AVX2;
  return XC_ISA_SSE2;
#else
  return XC_ISA_PORTABLE;
#endif
}

/* A PANEL's mr: params.mr, or the entry's 4-byte metadata. */
static uint32_t panel_mr(const hr_descriptor *d) {
  if (d->params.mr)
    return d->params.mr;
  if (d->layout.ext && d->layout.ext_len == 4)
    return (uint32_t)d->layout.ext[0] | (uint32_t)d->layout.ext[1] << 8 |
           (uint32_t)d->layout.ext[2] << 16 | (uint32_t)d->layout.ext[3] << 24;
  return 0;
}

static int is_permutation(const uint8_t *order, unsigned rank) {
  uint32_t seen = 0;
  for (unsigned j = 0; j < rank; j++) {
    if (order[j] >= rank || (seen >> order[j]) & 1u)
      return 0;
    seen |= 1u << order[j];
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* The target's fine dims                                                   */
/* ------------------------------------------------------------------------ */

static void add_td(xc_core *c, uint64_t ext, unsigned k, uint64_t mult,
                   uint64_t lim, int couple, uint64_t cmult) {
  xc_fdim *f = &c->td[c->nt++];
  memset(f, 0, sizeof *f);
  f->ext = ext;
  f->k = (uint8_t)k;
  f->mult = mult;
  f->lim = lim;
  f->couple = couple;
  f->cmult = cmult;
}

/* ceil(a / b) without overflow, b >= 1. */
static uint64_t ceil_div(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

/* Builds c->td for a dense target over c->rshape; fills out_elems.
 * Returns 0 or HR_ERR_LIMIT (the target's size overflows). */
static int build_target(xc_core *c, uint8_t tag, const hr_layout_params *tp) {
  const unsigned r = c->rank;
  const uint64_t *R = c->rshape;
  c->nt = 0;
  for (unsigned k = 0; k < r; k++) {
    if (R[k] == 0) {
      c->out_elems = 0;
      return 0;
    }
  }
  switch (tag) {
  case HR_LAYOUT_ROW_MAJOR:
    for (unsigned k = 0; k < r; k++)
      add_td(c, R[k], k, 1, R[k], -1, 0);
    break;
  case HR_LAYOUT_COLUMN_MAJOR:
    for (unsigned k = r; k-- > 0;)
      add_td(c, R[k], k, 1, R[k], -1, 0);
    break;
  case HR_LAYOUT_PERMUTED:
    for (unsigned j = 0; j < r; j++)
      add_td(c, R[tp->order[j]], tp->order[j], 1, R[tp->order[j]], -1, 0);
    break;
  case HR_LAYOUT_TILED: {
    int tdim[HR_MAX_RANK];
    /* Tile-grid dims first, then the intra-tile dims, both row-major.  A
     * tile of 1 leaves the dim whole; a single tile has no grid dim. */
    for (unsigned k = 0; k < r; k++) {
      uint64_t T = tp->tile[k], nt = ceil_div(R[k], T);
      tdim[k] = -1;
      if (T == 1) {
        add_td(c, R[k], k, 1, R[k], -1, 0);
      } else if (nt > 1) {
        tdim[k] = (int)c->nt;
        add_td(c, nt, k, T, nt, -1, 0);
      }
    }
    for (unsigned k = 0; k < r; k++) {
      uint64_t T = tp->tile[k];
      if (T == 1)
        continue;
      if (tdim[k] >= 0 && R[k] % T != 0)
        add_td(c, T, k, 1, R[k], tdim[k], T);
      else
        add_td(c, T, k, 1, min_u64(R[k], T), -1, 0);
    }
    break;
  }
  case HR_LAYOUT_PANEL: {
    uint64_t mr = tp->mr, np = ceil_div(R[0], mr);
    if (mr == 1) {
      add_td(c, R[0], 0, 1, R[0], -1, 0);
      add_td(c, R[1], 1, 1, R[1], -1, 0);
      break;
    }
    int pd = -1;
    if (np > 1) {
      pd = (int)c->nt;
      add_td(c, np, 0, mr, np, -1, 0);
    }
    add_td(c, R[1], 1, 1, R[1], -1, 0);
    if (pd >= 0 && R[0] % mr != 0)
      add_td(c, mr, 0, 1, R[0], pd, mr);
    else
      add_td(c, mr, 0, 1, min_u64(R[0], mr), -1, 0);
    break;
  }
  default: return HR_ERR_INVALID_ARGUMENT;
  }
  uint64_t acc = 1;
  for (unsigned d = c->nt; d-- > 0;) {
    c->td[d].ostride = acc;
    if (!hr__mul_u64(acc, c->td[d].ext, &acc))
      return HR_ERR_LIMIT;
  }
  uint64_t bytes;
  if (!hr__mul_u64(acc, c->esize, &bytes) || bytes > (uint64_t)INT64_MAX)
    return HR_ERR_LIMIT;
  c->out_elems = acc;
  return 0;
}

uint64_t hr__xc_core_key(const xc_core *c, const uint64_t *idx) {
  uint64_t key = 0;
  for (unsigned d = 0; d < c->nt; d++) {
    const xc_fdim *f = &c->td[d];
    key += (idx[f->k] / f->mult) % f->ext * f->ostride;
  }
  return key;
}

/* ------------------------------------------------------------------------ */
/* Dense sources                                                            */
/* ------------------------------------------------------------------------ */

/* u64 -> i64 products and sums with overflow detection. */
static int mul_i64(int64_t a, int64_t b, int64_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}
static int add_i64(int64_t a, int64_t b, int64_t *out) {
  return !__builtin_add_overflow(a, b, out);
}

/*
 * Sets c->sd, c->sbase and c->src for a dense source and checks that the
 * buffer holds every byte the descriptor addresses.  `elems` is the
 * source's element count (its product times esize fits in int64).
 */
static int setup_dense_source(xc_core *c, const hr_xc_tensor *src,
                              const uint64_t *roff, uint64_t elems,
                              hr_wire_status *st) {
  const hr_descriptor *d = src->desc;
  const unsigned r = d->rank;
  const uint64_t *S = d->shape;
  const int64_t e = (int64_t)c->esize;
  uint64_t need = elems * (uint64_t)e;
  int64_t base = 0;
  for (unsigned k = 0; k < r; k++) {
    c->sd[k].off = roff[k];
    c->sd[k].tile = 1;
    c->sd[k].a = 0;
    c->sd[k].b = 0;
  }
  switch (d->layout.tag) {
  case HR_LAYOUT_ROW_MAJOR: {
    int64_t acc = e;
    for (unsigned k = r; k-- > 0;) {
      c->sd[k].a = acc;
      acc *= elems ? (int64_t)S[k] : 0;
    }
    break;
  }
  case HR_LAYOUT_COLUMN_MAJOR: {
    int64_t acc = e;
    for (unsigned k = 0; k < r; k++) {
      c->sd[k].a = acc;
      acc *= elems ? (int64_t)S[k] : 0;
    }
    break;
  }
  case HR_LAYOUT_PERMUTED: {
    if (!is_permutation(d->params.order, r))
      return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                  "transcode: PERMUTED order is not a permutation");
    int64_t acc = e;
    for (unsigned j = r; j-- > 0;) {
      c->sd[d->params.order[j]].a = acc;
      acc *= elems ? (int64_t)S[d->params.order[j]] : 0;
    }
    break;
  }
  case HR_LAYOUT_STRIDED: {
    int64_t lo, hi;
    if (d->params.origin > (uint64_t)INT64_MAX ||
        !mul_i64((int64_t)d->params.origin, e, &base))
      return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                  "transcode: STRIDED origin overflows");
    lo = hi = base;
    for (unsigned k = 0; k < r; k++) {
      int64_t a, span;
      /* An empty tensor addresses nothing: its strides are never used. */
      if (elems == 0)
        continue;
      if (!mul_i64(d->params.strides[k], e, &a))
        return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                    "transcode: STRIDED stride overflows");
      c->sd[k].a = a;
      if (S[k] - 1 > (uint64_t)INT64_MAX ||
          !mul_i64(a, (int64_t)(S[k] - 1), &span) ||
          !add_i64(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi))
        return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                    "transcode: STRIDED span overflows");
    }
    need = 0;
    if (elems) {
      if (lo < 0)
        return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                    "transcode: STRIDED addresses bytes before its buffer");
      if (!add_i64(hi, e, &hi))
        return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                    "transcode: STRIDED span overflows");
      need = (uint64_t)hi;
    }
    break;
  }
  case HR_LAYOUT_TILED: {
    uint64_t nt[HR_MAX_RANK], padded = 1, vol = 1, acc;
    for (unsigned k = 0; k < r; k++) {
      if (d->params.tile[k] == 0)
        return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                    "transcode: TILED tile of 0");
      nt[k] = ceil_div(S[k], d->params.tile[k]);
      if (!hr__mul_u64(padded, nt[k] * d->params.tile[k], &padded) ||
          !hr__mul_u64(padded, (uint64_t)e, &acc) || acc > (uint64_t)INT64_MAX)
        return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                    "transcode: TILED size overflows");
    }
    need = padded * (uint64_t)e;
    if (!padded)
      break;
    for (unsigned k = 0; k < r; k++)
      vol *= d->params.tile[k];
    acc = 1;
    uint64_t in = 1;
    for (unsigned k = r; k-- > 0;) {
      c->sd[k].tile = d->params.tile[k];
      c->sd[k].a = (int64_t)(acc * vol) * e;
      c->sd[k].b = (int64_t)in * e;
      acc *= nt[k];
      in *= d->params.tile[k];
    }
    break;
  }
  case HR_LAYOUT_PANEL: {
    uint64_t mr = panel_mr(d), bytes;
    if (r != 2 || mr == 0)
      return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                  "transcode: PANEL needs rank 2 and mr >= 1");
    uint64_t np = ceil_div(S[0], mr);
    if (!hr__mul_u64(np, mr, &bytes) || !hr__mul_u64(bytes, S[1], &bytes) ||
        !hr__mul_u64(bytes, (uint64_t)e, &bytes) || bytes > (uint64_t)INT64_MAX)
      return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                  "transcode: PANEL size overflows");
    need = bytes;
    if (!need)
      break;
    c->sd[0].tile = mr;
    c->sd[0].a = (int64_t)(mr * S[1]) * e;
    c->sd[0].b = e;
    c->sd[1].a = (int64_t)mr * e;
    break;
  }
  default: return HR_ERR_UNSUPPORTED;
  }
  if (need > src->sizes[0])
    return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                "transcode: buffer shorter than the descriptor addresses");
  if (need && !src->buffers[0])
    return HR_ERR_INVALID_ARGUMENT;
  c->src = src->buffers[0];
  c->sbase = base;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Choosing the executor                                                    */
/* ------------------------------------------------------------------------ */

enum { SK_AFFINE, SK_SPLIT, SK_NONAFFINE };

static int fdim_padded(const xc_fdim *f) {
  return f->couple >= 0 || f->lim < f->ext;
}

/* Builds c->xd from c->td when every source dim is affine over the region
 * (or tile-aligned and split); otherwise selects the generic executor. */
static void choose_executor(xc_core *c) {
  const unsigned r = c->rank;
  int kind[HR_MAX_RANK];
  int64_t stride[HR_MAX_RANK];
  uint64_t base = (uint64_t)c->sbase;
  unsigned ntd[HR_MAX_RANK] = {0};
  int plain[HR_MAX_RANK];

  c->mode = XC_MODE_AFFINE;
  if (c->out_elems == 0)
    return;
  for (unsigned d = 0; d < c->nt; d++)
    ntd[c->td[d].k]++;
  for (unsigned k = 0; k < r; k++) {
    const xc_sdim *s = &c->sd[k];
    uint64_t R = c->rshape[k], o = s->off, t = s->tile;
    plain[k] = 0;
    for (unsigned d = 0; d < c->nt; d++) {
      const xc_fdim *f = &c->td[d];
      if (f->k == k && ntd[k] == 1 && f->mult == 1 && f->ext == R &&
          !fdim_padded(f))
        plain[k] = 1;
    }
    if (t == 1) {
      kind[k] = SK_AFFINE;
      stride[k] = s->a;
      base += o * (uint64_t)s->a;
    } else if (o % t + R <= t) {
      kind[k] = SK_AFFINE;
      stride[k] = s->b;
      base += o / t * (uint64_t)s->a + o % t * (uint64_t)s->b;
    } else if (o % t == 0 && R % t == 0 && plain[k]) {
      kind[k] = SK_SPLIT;
      stride[k] = 0;
      base += o / t * (uint64_t)s->a;
    } else {
      c->mode = XC_MODE_GENERIC;
      return;
    }
  }

  /* Source strides per fine dim; tile-aligned source dims split in two. */
  xc_fdim v[XC_MAX_FD];
  int map[XC_MAX_FD];
  unsigned n = 0;
  for (unsigned d = 0; d < c->nt; d++) {
    const xc_fdim *f = &c->td[d];
    const xc_sdim *s = &c->sd[f->k];
    map[d] = (int)n;
    if (kind[f->k] == SK_SPLIT) {
      uint64_t t = s->tile;
      v[n] = *f;
      v[n].ext = v[n].lim = f->ext / t;
      v[n].mult = t;
      v[n].sstride = s->a;
      n++;
      v[n] = *f;
      v[n].ext = v[n].lim = t;
      v[n].mult = 1;
      v[n].sstride = s->b;
      n++;
    } else {
      v[n] = *f;
      v[n].sstride = (int64_t)(f->mult * (uint64_t)stride[f->k]);
      n++;
    }
  }
  for (unsigned d = 0; d < n; d++)
    if (v[d].couple >= 0)
      v[d].couple = map[v[d].couple];

  /* Drop dims of extent 1: their index is always 0, so a dim coupled to
   * one keeps its plain limit. */
  unsigned m = 0;
  for (unsigned d = 0; d < n; d++) {
    if (v[d].ext == 1) {
      map[d] = -1;
      continue;
    }
    map[d] = (int)m;
    v[m++] = v[d];
  }
  for (unsigned d = 0; d < m; d++)
    if (v[d].couple >= 0)
      v[d].couple = map[v[d].couple];
  n = m;

  /* Merge neighbours that are contiguous in the source too. */
  int refd[XC_MAX_FD] = {0};
  for (unsigned d = 0; d < n; d++)
    if (v[d].couple >= 0)
      refd[v[d].couple] = 1;
  m = 0;
  for (unsigned d = 0; d < n; d++) {
    int64_t span;
    if (m > 0) {
      xc_fdim *w = &c->xd[m - 1];
      int w_free = !fdim_padded(w) && !w->refd;
      int d_free = !fdim_padded(&v[d]) && !refd[d];
      if (w_free && d_free && v[d].ext <= (uint64_t)INT64_MAX &&
          mul_i64((int64_t)v[d].ext, v[d].sstride, &span) &&
          span == w->sstride) {
        w->ext *= v[d].ext;
        w->lim = w->ext;
        w->mult = 1;
        w->sstride = v[d].sstride;
        map[d] = (int)m - 1;
        continue;
      }
    }
    c->xd[m] = v[d];
    c->xd[m].refd = (uint8_t)refd[d];
    map[d] = (int)m;
    m++;
  }
  for (unsigned d = 0; d < m; d++)
    if (c->xd[d].couple >= 0)
      c->xd[d].couple = map[c->xd[d].couple];
  c->nx = m;
  uint64_t acc = 1;
  for (unsigned d = m; d-- > 0;) {
    c->xd[d].ostride = acc;
    acc *= c->xd[d].ext;
  }
  c->xbase = (int64_t)base;
}

/* ------------------------------------------------------------------------ */
/* The affine executor                                                      */
/* ------------------------------------------------------------------------ */

typedef struct xc_ctx {
  const xc_core *c;
  uint8_t *out; /* receives element `ea` */
  uint64_t ea;
  int nt;                /* large run: transposes bypass the cache */
  uint64_t x[XC_MAX_FD]; /* coordinates of the current position */
} xc_ctx;

/* How many values of fine dim d are inside the tensor, given the current
 * coordinate of its coupled grid dim. */
static inline uint64_t valid_count(const xc_fdim *v, const uint64_t *x,
                                   unsigned d) {
  const xc_fdim *f = &v[d];
  uint64_t lim = f->lim;
  if (f->couple >= 0) {
    uint64_t dec = f->cmult * x[f->couple];
    lim = dec < lim ? lim - dec : 0;
  }
  return lim < f->ext ? lim : f->ext;
}

static inline uint64_t abs_i64(int64_t v) {
  return v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
}

/*
 * Copies one box: dims 0..L-1 fixed at the coordinates of `start`, dim L
 * running over `count` values from there, dims L+1.. whole.  The output
 * of a box is contiguous, and inside it the loops may run in any order.
 */
static void box(xc_ctx *t, unsigned L, uint64_t start, uint64_t count) {
  const xc_core *c = t->c;
  const xc_fdim *v = c->xd;
  const unsigned n = c->nx, in = n - 1, e = c->esize;
  uint64_t *x = t->x;
  uint8_t *dst = t->out + (start - t->ea) * e;
  uint64_t soff = (uint64_t)c->xbase;

  for (unsigned d = 0; d <= L; d++) {
    x[d] = start / v[d].ostride % v[d].ext;
    soff += x[d] * (uint64_t)v[d].sstride;
  }
  for (unsigned d = L + 1; d < n; d++)
    x[d] = 0;
  for (unsigned d = 0; d < L; d++) {
    if (x[d] >= valid_count(v, x, d)) {
      memset(dst, 0, (size_t)(count * v[L].ostride * e));
      return;
    }
  }
  if (L == in) {
    uint64_t vi = valid_count(v, x, in), x0 = x[in];
    uint64_t nv = vi > x0 ? min_u64(count, vi - x0) : 0;
    hr__xc_rows(dst, 0, c->src + (int64_t)soff, 0, v[in].sstride, 1, count, 1,
                (int64_t)nv, 0, e);
    return;
  }

  /* The partner dim: the one reading the source most contiguously.  A
   * transpose pays off when it beats the innermost dim; otherwise rows
   * are copied along the innermost dim, looping over the next one. */
  int p = -1, xpose = 0;
  uint64_t best = UINT64_MAX;
  for (unsigned d = L; d < in; d++) {
    if ((int)d == v[in].couple || v[d].refd)
      continue;
    if (abs_i64(v[d].sstride) <= best) {
      best = abs_i64(v[d].sstride);
      p = (int)d;
    }
  }
  if (p >= 0 && best < abs_i64(v[in].sstride))
    xpose = 1;
  else
    p = (int)in - 1;

  unsigned od[XC_MAX_FD], no = 0;
  for (unsigned d = L; d < in; d++)
    if ((int)d != p)
      od[no++] = d;
  const uint64_t xl0 = x[L];
  const uint64_t pbeg = x[p];
  const uint64_t pcnt = (unsigned)p == L ? count : v[p].ext;
  const uint64_t drow = v[p].ostride * e;
  const uint64_t ni = v[in].ext;

  for (;;) {
    uint64_t so = soff, doff = 0;
    int ok = 1;
    for (unsigned i = 0; i < no; i++) {
      unsigned d = od[i];
      uint64_t rel = x[d] - (d == L ? xl0 : 0);
      so += rel * (uint64_t)v[d].sstride;
      doff += rel * v[d].ostride;
      if (x[d] >= valid_count(v, x, d))
        ok = 0;
    }
    uint8_t *dd = dst + doff * e;
    const uint8_t *ss = c->src + (int64_t)so;
    if (!ok) {
      hr__xc_rows(dd, drow, NULL, 0, 0, pcnt, ni, 0, 0, 0, e);
    } else {
      uint64_t vpa = valid_count(v, x, (unsigned)p);
      uint64_t vp = vpa > pbeg ? min_u64(pcnt, vpa - pbeg) : 0;
      if (xpose) {
        hr__xc_xpose(dd, drow, ss, v[p].sstride, v[in].sstride, pcnt, ni, vp,
                     valid_count(v, x, in), e, c->isa, t->nt);
      } else if (v[in].couple == p) {
        uint64_t dec = v[in].cmult * pbeg;
        int64_t vi0 = dec < v[in].lim ? (int64_t)(v[in].lim - dec) : 0;
        hr__xc_rows(dd, drow, ss, v[p].sstride, v[in].sstride, pcnt, ni, vp,
                    vi0, v[in].cmult, e);
      } else {
        hr__xc_rows(dd, drow, ss, v[p].sstride, v[in].sstride, pcnt, ni, vp,
                    (int64_t)valid_count(v, x, in), 0, e);
      }
    }
    /* Next combination of the outer dims, innermost first. */
    unsigned i = no;
    while (i > 0) {
      unsigned d = od[i - 1];
      uint64_t beg = d == L ? xl0 : 0, end = d == L ? xl0 + count : v[d].ext;
      if (++x[d] < end)
        break;
      x[d] = beg;
      i--;
    }
    if (i == 0)
      break;
  }
}

/* Covers the non-empty [lo, hi), which lies inside one block of dim d - 1,
 * with boxes. */
static void cover(xc_ctx *t, unsigned d, uint64_t lo, uint64_t hi) {
  const uint64_t B = t->c->xd[d].ostride;
  uint64_t f = lo % B ? lo - lo % B + B : lo;
  uint64_t l = hi - hi % B;
  if (f > l) {
    cover(t, d + 1, lo, hi);
    return;
  }
  if (lo < f)
    cover(t, d + 1, lo, f);
  if (f < l)
    box(t, d, f, (l - f) / B);
  if (l < hi)
    cover(t, d + 1, l, hi);
}

static void run_affine(const xc_core *c, uint64_t ea, uint64_t eb,
                       uint8_t *dst) {
  if (c->nx == 0) {
    /* A single element (rank 0 or every extent 1). */
    memcpy(dst, c->src + c->xbase, c->esize);
    return;
  }
  xc_ctx t;
  t.c = c;
  t.out = dst;
  t.ea = ea;
  t.nt = (eb - ea) * c->esize >= c->nt_min;
  cover(&t, 0, ea, eb);
  if (t.nt)
    hr__xc_fence();
}

/* ------------------------------------------------------------------------ */
/* The generic executor                                                     */
/* ------------------------------------------------------------------------ */

static inline int64_t sd_off(const xc_sdim *s, uint64_t i) {
  uint64_t g = s->off + i;
  return (int64_t)(g / s->tile * (uint64_t)s->a + g % s->tile * (uint64_t)s->b);
}

/* Copies n elements of logical dim k from local index i0 on (step 1),
 * source tile by source tile. */
static void generic_run(const xc_core *c, const xc_sdim *s, uint64_t rowoff,
                        uint64_t i0, uint64_t n, uint8_t *dst) {
  const unsigned e = c->esize;
  while (n) {
    uint64_t g = s->off + i0, seg = n;
    int64_t step = s->a;
    if (s->tile > 1) {
      seg = min_u64(n, s->tile - g % s->tile);
      step = s->b;
    }
    hr__xc_gather(dst, c->src + (int64_t)(rowoff + (uint64_t)sd_off(s, i0)),
                  step, seg, e);
    dst += seg * e;
    i0 += seg;
    n -= seg;
  }
}

static void run_generic(const xc_core *c, uint64_t ea, uint64_t eb,
                        uint8_t *dst) {
  const unsigned n = c->nt, e = c->esize;
  const xc_fdim *v = c->td;
  uint64_t x[XC_MAX_FD];
  if (n == 0) {
    memcpy(dst, c->src + c->sbase, e);
    return;
  }
  const unsigned in = n - 1;
  const xc_fdim *fi = &v[in];
  for (unsigned d = 0; d < n; d++)
    x[d] = ea / v[d].ostride % v[d].ext;
  uint64_t pos = ea;
  while (pos < eb) {
    uint64_t x0 = x[in], cnt = min_u64(fi->ext - x0, eb - pos);
    uint64_t idx[HR_MAX_RANK] = {0};
    int ok = 1;
    for (unsigned d = 0; d < in; d++) {
      idx[v[d].k] += v[d].mult * x[d];
      if (x[d] >= valid_count(v, x, d))
        ok = 0;
    }
    uint64_t nv = 0;
    if (ok) {
      uint64_t vi = valid_count(v, x, in);
      nv = vi > x0 ? min_u64(cnt, vi - x0) : 0;
    }
    if (nv) {
      uint64_t rowoff = (uint64_t)c->sbase;
      for (unsigned k = 0; k < c->rank; k++)
        if (k != fi->k)
          rowoff += (uint64_t)sd_off(&c->sd[k], idx[k]);
      /* The innermost fine dim always steps its logical dim by 1: grid
       * dims (mult > 1) come before their intra-tile dims. */
      generic_run(c, &c->sd[fi->k], rowoff, idx[fi->k] + x0, nv, dst);
    }
    if (nv < cnt)
      memset(dst + nv * e, 0, (size_t)((cnt - nv) * e));
    dst += cnt * e;
    pos += cnt;
    x[in] += cnt;
    for (unsigned d = in; d > 0 && x[d] == v[d].ext; d--) {
      x[d] = 0;
      x[d - 1]++;
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Sparse sources                                                           */
/* ------------------------------------------------------------------------ */

static void run_sparse_src(const xc_core *c, uint64_t ea, uint64_t eb,
                           uint8_t *dst) {
  const unsigned e = c->esize;
  memset(dst, 0, (size_t)((eb - ea) * e));
  uint64_t lo = 0, hi = c->nent;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (c->ent[mid].key < ea)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (uint64_t j = lo; j < c->nent && c->ent[j].key < eb; j++)
    memcpy(dst + (c->ent[j].key - ea) * e, c->vals + c->ent[j].vidx * e, e);
}

void hr__xc_core_run(const xc_core *c, uint64_t ea, uint64_t eb, uint8_t *dst) {
  if (ea >= eb)
    return;
  switch (c->mode) {
  case XC_MODE_AFFINE: run_affine(c, ea, eb, dst); break;
  case XC_MODE_GENERIC: run_generic(c, ea, eb, dst); break;
  default: run_sparse_src(c, ea, eb, dst); break;
  }
}

/* ------------------------------------------------------------------------ */
/* Public API                                                               */
/* ------------------------------------------------------------------------ */

static int check_target(const hr_xc_target *dst, unsigned rank) {
  const hr_layout_params *tp = &dst->params;
  switch (dst->layout) {
  case HR_LAYOUT_ROW_MAJOR:
  case HR_LAYOUT_COLUMN_MAJOR: return 0;
  case HR_LAYOUT_PERMUTED:
    return is_permutation(tp->order, rank) ? 0 : HR_ERR_INVALID_ARGUMENT;
  case HR_LAYOUT_TILED:
    for (unsigned k = 0; k < rank; k++)
      if (tp->tile[k] == 0)
        return HR_ERR_INVALID_ARGUMENT;
    return 0;
  case HR_LAYOUT_PANEL:
    if (rank != 2)
      return HR_ERR_UNSUPPORTED;
    return tp->mr ? 0 : HR_ERR_INVALID_ARGUMENT;
  case HR_LAYOUT_SPARSE_CSR:
  case HR_LAYOUT_SPARSE_CSC:
  case HR_LAYOUT_SPARSE_COO:
    if (dst->layout == HR_LAYOUT_SPARSE_COO ? rank < 1 : rank != 2)
      return HR_ERR_UNSUPPORTED;
    if (tp->index_type != 0 && tp->index_type != HR_ELEM_INT32 &&
        tp->index_type != HR_ELEM_INT64)
      return HR_ERR_INVALID_ARGUMENT;
    return 0;
  default: return HR_ERR_UNSUPPORTED;
  }
}

/* Checks the source's header fields; returns its element size. */
static int check_source(const hr_descriptor *d, hr_wire_status *st) {
  uint8_t tag = d->layout.tag;
  if (d->rank > HR_MAX_RANK)
    return fail(st, HR_WIRE_INVALID_DESCRIPTOR, "transcode: rank above 32");
  int es = elem_size(d->element_type);
  if (es < 0)
    return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                "transcode: unknown element type");
  if (es == 0)
    return HR_ERR_UNSUPPORTED; /* INT4/UINT4: never transcoded */
  if (tag == HR_LAYOUT_TILED_EXACT || tag == HR_LAYOUT_PERMUTED_EXACT ||
      tag == HR_LAYOUT_INVALID || tag == HR_LAYOUT_INVALID_FF ||
      (tag > HR_LAYOUT_COMPOSITE && tag < HR_LAYOUT_EXT_FIRST) || tag == 0x0A)
    return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                "transcode: invalid layout tag in a descriptor");
  if (!is_dense_source(tag) && !is_sparse(tag))
    return HR_ERR_UNSUPPORTED;
  return es;
}

int hr_xc_plan_new(hr_xc_plan **out, const hr_xc_tensor *src,
                   const hr_xc_target *dst, const hr_xc_region *region,
                   const hr_xc_opts *opts, const hr_mem *mem,
                   hr_wire_status *st) {
  if (!out || !src || !src->desc || !dst)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!mem)
    mem = hr_mem_default();
  const hr_descriptor *d = src->desc;
  int es = check_source(d, st);
  if (es < 0)
    return es;
  const unsigned r = d->rank;
  int rv = check_target(dst, r);
  if (rv)
    return rv;

  uint64_t elems = 1, bytes;
  for (unsigned k = 0; k < r; k++)
    if (!hr__mul_u64(elems, d->shape[k], &elems))
      return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                  "transcode: shape product overflows");
  if (!hr__mul_u64(elems, (uint64_t)es, &bytes) || bytes > (uint64_t)INT64_MAX)
    return fail(st, HR_WIRE_INVALID_DESCRIPTOR,
                "transcode: tensor size overflows");

  uint64_t roff[HR_MAX_RANK] = {0};
  hr_xc_plan *p = hr__mem_calloc(mem, 1, sizeof *p);
  if (!p)
    return HR_ERR_NOMEM;
  p->mem = *mem;
  xc_core *c = &p->core;
  c->esize = (unsigned)es;
  c->rank = r;
  for (unsigned k = 0; k < r; k++) {
    if (region) {
      uint64_t end;
      if (!hr__add_u64(region->offset[k], region->shape[k], &end) ||
          end > d->shape[k]) {
        rv = fail(st, HR_WIRE_INVALID_REGION,
                  "transcode: region outside the tensor");
        goto fail;
      }
      roff[k] = region->offset[k];
      c->rshape[k] = region->shape[k];
    } else {
      c->rshape[k] = d->shape[k];
    }
  }
  p->elem_type = d->element_type;
  p->tlayout = dst->layout;
  p->tparams = dst->params;
  p->sparse_tgt = is_sparse_target(dst->layout);
  if (dst->layout == HR_LAYOUT_PANEL) {
    for (int i = 0; i < 4; i++)
      p->panel_meta[i] = (uint8_t)(dst->params.mr >> (8 * i));
  }

  /* Sparse targets run on a dense producer in the order they scan. */
  uint8_t core_tag = dst->layout;
  if (dst->layout == HR_LAYOUT_SPARSE_CSR ||
      dst->layout == HR_LAYOUT_SPARSE_COO)
    core_tag = HR_LAYOUT_ROW_MAJOR;
  else if (dst->layout == HR_LAYOUT_SPARSE_CSC)
    core_tag = HR_LAYOUT_COLUMN_MAJOR;
  rv = build_target(c, core_tag, &dst->params);
  if (rv)
    goto fail;
  p->out_bytes = c->out_elems * c->esize;

  if (is_sparse(d->layout.tag)) {
    c->mode = XC_MODE_SPARSE;
    rv = hr__xc_sparse_index(c, src, roff, mem, opts ? opts->max_scratch : 0,
                             &p->scratch, st);
  } else {
    rv = setup_dense_source(c, src, roff, elems, st);
    if (!rv)
      choose_executor(c);
  }
  if (rv)
    goto fail;
  c->isa = hr__xc_best_isa();
  c->nt_min = XC_NT_MIN;
  *out = p;
  return 0;
fail:
  hr_xc_plan_del(p);
  return rv;
}

void hr_xc_plan_del(hr_xc_plan *p) {
  if (!p)
    return;
  hr_mem mem = p->mem;
  hr__mem_free(&mem, p->core.ent);
  hr__mem_free(&mem, p);
}

int hr_xc_plan_needs_whole(const hr_xc_plan *p) {
  return p->sparse_tgt;
}

static uint64_t sparse_isz(const hr_xc_plan *p) {
  return p->is64 ? 8 : 4;
}

int hr_xc_plan_buffer_sizes(const hr_xc_plan *p,
                            uint64_t sizes[HR_MAX_BUFFERS]) {
  if (!p->sparse_tgt) {
    sizes[0] = p->out_bytes;
    return 1;
  }
  if (!p->counted)
    return HR_ERR_STATE;
  const xc_core *c = &p->core;
  uint64_t isz = sparse_isz(p);
  switch (p->tlayout) {
  case HR_LAYOUT_SPARSE_COO:
    sizes[0] = p->nnz * c->rank * isz;
    sizes[1] = p->nnz * c->esize;
    return 2;
  case HR_LAYOUT_SPARSE_CSR: sizes[0] = (c->rshape[0] + 1) * isz; break;
  default: sizes[0] = (c->rshape[1] + 1) * isz; break;
  }
  sizes[1] = p->nnz * isz;
  sizes[2] = p->nnz * c->esize;
  return 3;
}

uint64_t hr_xc_plan_out_size(const hr_xc_plan *p) {
  if (!p->sparse_tgt)
    return p->out_bytes;
  uint64_t sizes[HR_MAX_BUFFERS], total = 0;
  int n = hr_xc_plan_buffer_sizes(p, sizes);
  for (int i = 0; i < n; i++)
    total += sizes[i];
  return total;
}

uint64_t hr_xc_plan_grain(const hr_xc_plan *p) {
  const xc_core *c = &p->core;
  uint64_t g = c->esize;
  if (c->mode == XC_MODE_AFFINE && c->nx > 0) {
    g *= c->xd[c->nx - 1].ext;
    if (c->nx > 1)
      g *= min_u64(c->xd[c->nx - 2].ext, 64);
  } else if (c->mode == XC_MODE_GENERIC && c->nt > 0) {
    g *= c->td[c->nt - 1].ext;
  }
  if (p->out_bytes && g > p->out_bytes)
    g = p->out_bytes;
  return g ? g : 1;
}

uint64_t hr_xc_plan_scratch(const hr_xc_plan *p) {
  return p->scratch;
}

int hr_xc_run(const hr_xc_plan *p, uint64_t out_begin, uint64_t out_len,
              void *out) {
  uint64_t end;
  if (!p || p->sparse_tgt)
    return HR_ERR_INVALID_ARGUMENT;
  if (!hr__add_u64(out_begin, out_len, &end) || end > p->out_bytes)
    return HR_ERR_INVALID_ARGUMENT;
  if (out_len == 0)
    return 0;
  if (!out)
    return HR_ERR_INVALID_ARGUMENT;
  const xc_core *c = &p->core;
  const unsigned e = c->esize;
  uint8_t *o = out;
  uint8_t tmp[16];
  uint64_t ea = out_begin / e, head = out_begin % e;
  if (head) {
    /* The range starts inside an element: produce it whole, keep the
     * requested bytes. */
    uint64_t n = min_u64(e - head, out_len);
    hr__xc_core_run(c, ea, ea + 1, tmp);
    memcpy(o, tmp + head, (size_t)n);
    o += n;
    ea++;
    if (n == out_len)
      return 0;
  }
  uint64_t eb = end / e;
  if (ea < eb) {
    hr__xc_core_run(c, ea, eb, o);
    o += (eb - ea) * e;
  }
  if (end % e) {
    hr__xc_core_run(c, eb, eb + 1, tmp);
    memcpy(o, tmp, (size_t)(end % e));
  }
  return 0;
}

int hr_xc_plan_count(hr_xc_plan *p, hr_wire_status *st) {
  (void)st;
  if (!p || !p->sparse_tgt)
    return HR_ERR_INVALID_ARGUMENT;
  if (p->counted)
    return 0;
  const xc_core *c = &p->core;
  uint64_t nnz = hr__xc_count_nonzero(c);
  /* The largest value an index buffer holds: CSR/CSC indptr reaches nnz,
   * indices reach the inner extent minus one; COO holds coordinates. */
  uint64_t maxv = 0;
  switch (p->tlayout) {
  case HR_LAYOUT_SPARSE_CSR: maxv = c->rshape[1] ? c->rshape[1] - 1 : 0; break;
  case HR_LAYOUT_SPARSE_CSC: maxv = c->rshape[0] ? c->rshape[0] - 1 : 0; break;
  default:
    for (unsigned k = 0; k < c->rank; k++)
      if (c->rshape[k] && c->rshape[k] - 1 > maxv)
        maxv = c->rshape[k] - 1;
    break;
  }
  if (p->tlayout != HR_LAYOUT_SPARSE_COO && nnz > maxv)
    maxv = nnz;
  int is64;
  if (p->tparams.index_type == HR_ELEM_INT64)
    is64 = 1;
  else if (p->tparams.index_type == HR_ELEM_INT32)
    is64 = 0;
  else
    is64 = maxv > (uint64_t)INT32_MAX;
  if (!is64 && maxv > (uint64_t)INT32_MAX)
    return HR_ERR_UNSUPPORTED;
  /* Every buffer size must fit in 64 bits. */
  uint64_t chk,
      outer = p->tlayout == HR_LAYOUT_SPARSE_CSC ? c->rshape[1] : c->rshape[0];
  if (!hr__mul_u64(nnz, (uint64_t)c->rank * 8, &chk) ||
      !hr__mul_u64(nnz, c->esize, &chk) ||
      (p->tlayout != HR_LAYOUT_SPARSE_COO &&
       (!hr__add_u64(outer, 1, &chk) || !hr__mul_u64(chk, 8, &chk))))
    return HR_ERR_LIMIT;
  p->nnz = nnz;
  p->is64 = is64;
  p->counted = 1;
  return 0;
}

int hr_xc_run_sparse(const hr_xc_plan *p, void *const *bufs) {
  if (!p || !p->sparse_tgt || !bufs)
    return HR_ERR_INVALID_ARGUMENT;
  if (!p->counted)
    return HR_ERR_STATE;
  uint64_t sizes[HR_MAX_BUFFERS];
  int n = hr_xc_plan_buffer_sizes(p, sizes);
  for (int i = 0; i < n; i++)
    if (sizes[i] && !bufs[i])
      return HR_ERR_INVALID_ARGUMENT;
  hr__xc_fill_sparse(&p->core, p->tlayout, p->is64, bufs);
  return 0;
}

int hr_xc_plan_describe(const hr_xc_plan *p, hr_descriptor *d) {
  const xc_core *c = &p->core;
  uint64_t sizes[HR_MAX_BUFFERS];
  int n = hr_xc_plan_buffer_sizes(p, sizes);
  if (n < 0)
    return n;
  memset(d, 0, sizeof *d);
  d->descriptor_version = 1;
  d->element_type = p->elem_type;
  d->rank = (uint8_t)c->rank;
  d->layout.tag = p->tlayout;
  for (unsigned k = 0; k < c->rank; k++)
    d->shape[k] = c->rshape[k];
  switch (p->tlayout) {
  case HR_LAYOUT_PERMUTED:
    memcpy(d->params.order, p->tparams.order, c->rank);
    break;
  case HR_LAYOUT_TILED:
    memcpy(d->params.tile, p->tparams.tile, c->rank * sizeof(uint32_t));
    break;
  case HR_LAYOUT_PANEL:
    d->layout.ext = p->panel_meta;
    d->layout.ext_len = 4;
    d->params.mr = p->tparams.mr;
    break;
  case HR_LAYOUT_SPARSE_COO:
    d->params.sorted = 1;
    /* fall through */
  case HR_LAYOUT_SPARSE_CSR:
  case HR_LAYOUT_SPARSE_CSC:
    d->params.nnz = p->nnz;
    d->params.index_type = p->is64 ? HR_ELEM_INT64 : HR_ELEM_INT32;
    break;
  default: break;
  }
  d->buffer_count = (uint8_t)n;
  for (int i = 0; i < n; i++)
    d->buffers[i].size_bytes = sizes[i];
  return 0;
}

/* ---- test hooks ---- */

int hr__xc_plan_force_generic(hr_xc_plan *p) {
  if (p->core.mode == XC_MODE_SPARSE)
    return HR_ERR_INVALID_ARGUMENT;
  p->core.mode = XC_MODE_GENERIC;
  return 0;
}

int hr__xc_plan_force_isa(hr_xc_plan *p, int isa) {
  if (isa < XC_ISA_PORTABLE || isa > hr__xc_best_isa())
    return HR_ERR_INVALID_ARGUMENT;
  p->core.isa = isa;
  return 0;
}

void hr__xc_plan_set_nt_min(hr_xc_plan *p, uint64_t bytes) {
  p->core.nt_min = bytes;
}

int hr__xc_plan_mode(const hr_xc_plan *p) {
  return p->core.mode;
}
const xc_core *hr__xc_plan_core(const hr_xc_plan *p) {
  return &p->core;
}
int hr__xc_plan_isa(const hr_xc_plan *p) {
  return p->core.isa;
}
