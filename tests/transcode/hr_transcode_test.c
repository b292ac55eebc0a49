/*
 * Property tests of the transcoding kernels: every kernel against the
 * index-by-index reference of xc_ref.h over thousands of random tensors
 * (shapes with dims 0 and 1, ranks 0 to 32, every element size, random
 * strides including zero and negative, orders, tiles, panels, sparse
 * sources, regions), each produced whole and in random chunkings, through
 * the fast executor, the generic one and every instruction set the
 * machine has.  Then the error paths, allocation failures and concurrent
 * runs.
 *
 * HR_XC_SEED=<n> in the environment replays another random sequence;
 * HR_XC_CASES=<percent> scales the number of random cases.
 */
/* cmocka needs these three first, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
/* clang-format on */

#include <pthread.h>
#include <stdio.h>

#include "hr_xc_internal.h"
#include "xc_ref.h"

static uint64_t g_seed = 0x9E3779B97F4A7C15ULL;

/* What the random cases covered, printed at the end: cases per source and
 * target layout, executor modes, bytes compared. */
static struct {
  unsigned src[256], tgt[256], mode[3], region;
  uint64_t bytes;
} g_stats;
static unsigned g_scale = 100; /* percent of the default case counts */

/* ------------------------------------------------------------------------ */
/* A test case                                                              */
/* ------------------------------------------------------------------------ */

typedef struct tcase {
  hr_descriptor d;
  unsigned e;
  uint8_t *buf[3];
  uint64_t size[3];
  uint8_t *truth; /* the logical tensor, row-major over d.shape */
  int has_region;
  hr_xc_region reg;
  hr_xc_target tgt;
  uint64_t id;
} tcase;

static void *xmalloc(uint64_t n) {
  void *p = malloc(n ? (size_t)n : 1);
  if (!p)
    fail_msg("allocation of %llu bytes failed", (unsigned long long)n);
  return p;
}

static void tcase_free(tcase *t) {
  for (int i = 0; i < 3; i++)
    free(t->buf[i]);
  free(t->truth);
  memset(t, 0, sizeof *t);
}

static void fill_elem(xc_rng *r, uint8_t *p, unsigned e, unsigned zero_pct) {
  if (xc_rn(r, 100) < zero_pct) {
    memset(p, 0, e);
    return;
  }
  for (unsigned j = 0; j < e; j++)
    p[j] = (uint8_t)xc_rand(r);
  p[xc_rn(r, e)] |= 1; /* never all-zero: keeps sparse counts exact */
}

static unsigned pick_esize(xc_rng *r) {
  static const unsigned es[5] = {1, 2, 4, 8, 16};
  return es[xc_rn(r, 5)];
}

static void random_perm(xc_rng *r, uint8_t *o, unsigned n) {
  for (unsigned i = 0; i < n; i++)
    o[i] = (uint8_t)i;
  for (unsigned i = n; i > 1; i--) {
    unsigned j = (unsigned)xc_rn(r, i);
    uint8_t t = o[i - 1];
    o[i - 1] = o[j];
    o[j] = t;
  }
}

/* Keeps a TILED buffer within a few times its tensor's size (large
 * tiles over many dims multiply the padding): tiles go back to 1 one by
 * one. */
static void cap_tiles(xc_rng *r, uint32_t *tile, const uint64_t *s,
                      unsigned rank) {
  uint64_t n = xc_prod(s, rank), cap = 4 * n + 4096;
  if (n == 0)
    return; /* a zero extent: the buffer is empty whatever the tiles */
  for (;;) {
    uint64_t padded = 1;
    for (unsigned k = 0; k < rank && padded <= cap; k++)
      padded *= xc_ceil(s[k], tile[k]) * tile[k];
    if (padded <= cap)
      return;
    unsigned k = (unsigned)xc_rn(r, rank);
    tile[k] = 1;
  }
}

/* A random shape: small general, big 2-D, mid rank or high rank. */
static void gen_shape(xc_rng *r, unsigned *rank, uint64_t *s,
                      uint64_t max_elems) {
  for (;;) {
    unsigned cls = (unsigned)xc_rn(r, 100), rk;
    if (cls < 45) {
      static const unsigned w[] = {0, 1, 1, 2, 2, 2, 3, 3, 4, 5, 6};
      rk = w[xc_rn(r, sizeof w / sizeof *w)];
      for (unsigned k = 0; k < rk; k++)
        s[k] = xc_rn(r, 40) == 0 ? 0 : xc_rr(r, 1, 7);
    } else if (cls < 70) {
      rk = 2;
      for (unsigned k = 0; k < rk; k++)
        s[k] = xc_rn(r, 4) == 0 ? xc_rr(r, 1, 9) : xc_rr(r, 8, 140);
    } else if (cls < 92) {
      rk = (unsigned)xc_rr(r, 3, 4);
      for (unsigned k = 0; k < rk; k++)
        s[k] = xc_rr(r, 1, 24);
    } else {
      rk = (unsigned)xc_rr(r, 7, HR_MAX_RANK);
      for (unsigned k = 0; k < rk; k++)
        s[k] = xc_rn(r, 4) == 0 ? xc_rr(r, 2, 3) : 1;
    }
    if (xc_prod(s, rk) <= max_elems) {
      *rank = rk;
      return;
    }
  }
}

/* Fills t->truth from a dense source through the reference offsets. */
static void truth_from_dense(tcase *t) {
  const hr_descriptor *d = &t->d;
  uint64_t n = xc_prod(d->shape, d->rank), i[HR_MAX_RANK] = {0};
  t->truth = xmalloc(n * t->e);
  if (!n)
    return;
  do {
    uint64_t o = xc_ref_off(d->layout.tag, &d->params, d->shape, d->rank, i);
    memcpy(t->truth + xc_lin(d->shape, d->rank, i) * t->e, t->buf[0] + o * t->e,
           t->e);
  } while (xc_next(d->shape, d->rank, i));
}

static void gen_dense_src(xc_rng *r, tcase *t) {
  hr_descriptor *d = &t->d;
  unsigned rank;
  gen_shape(r, &rank, d->shape, 60000);
  d->descriptor_version = 1;
  d->rank = (uint8_t)rank;
  t->e = pick_esize(r);
  d->element_type = xc_elem_for(t->e);
  static const uint8_t tags[] = {HR_LAYOUT_ROW_MAJOR, HR_LAYOUT_COLUMN_MAJOR,
                                 HR_LAYOUT_STRIDED,   HR_LAYOUT_STRIDED,
                                 HR_LAYOUT_PERMUTED,  HR_LAYOUT_TILED,
                                 HR_LAYOUT_PANEL};
  uint8_t tag;
  do
    tag = tags[xc_rn(r, sizeof tags)];
  while (tag == HR_LAYOUT_PANEL && rank != 2);
  d->layout.tag = tag;
  d->buffer_count = 1;
  uint64_t n = xc_prod(d->shape, rank), nb = 0;
  switch (tag) {
  case HR_LAYOUT_PERMUTED: random_perm(r, d->params.order, rank); break;
  case HR_LAYOUT_TILED:
    for (unsigned k = 0; k < rank; k++)
      d->params.tile[k] = (uint32_t)xc_rr(r, 1, d->shape[k] + 2);
    cap_tiles(r, d->params.tile, d->shape, rank);
    break;
  case HR_LAYOUT_PANEL:
    d->params.mr = (uint32_t)xc_rr(r, 1, d->shape[0] + 3);
    break;
  case HR_LAYOUT_STRIDED: {
    /* A permuted dense stride set, with gaps, zeros and negatives, or
     * small random strides (overlapping reads are legal). */
    uint8_t o[HR_MAX_RANK];
    random_perm(r, o, rank);
    int64_t acc = 1, lo = 0, hi = 0, gaps = 1;
    int wild = xc_rn(r, 5) == 0;
    for (unsigned j = rank; j-- > 0;) {
      unsigned k = o[j];
      /* Gaps between rows, at most 8x the dense size in all. */
      int64_t gap = gaps < 8 && xc_rn(r, 3) == 0 ? 2 : 1;
      gaps *= gap;
      int64_t st = wild ? (int64_t)xc_rn(r, 41) - 20 : acc * gap;
      if (!wild)
        acc = st * (int64_t)(d->shape[k] ? d->shape[k] : 1);
      if (xc_rn(r, 10) == 0)
        st = 0;
      if (xc_rn(r, 3) == 0)
        st = -st;
      d->params.strides[k] = st;
      if (d->shape[k] > 1) {
        int64_t span = st * (int64_t)(d->shape[k] - 1);
        if (span < 0)
          lo += span;
        else
          hi += span;
      }
    }
    d->params.origin = (uint64_t)(-lo) + xc_rn(r, 3);
    nb = n ? d->params.origin + (uint64_t)hi + 1 + xc_rn(r, 3) : xc_rn(r, 3);
    break;
  }
  default: break;
  }
  if (tag != HR_LAYOUT_STRIDED)
    nb = xc_ref_elems(tag, &d->params, d->shape, rank);
  static const unsigned zp[] = {0, 0, 30, 70, 95, 100};
  unsigned zero_pct = zp[xc_rn(r, 6)];
  t->size[0] = nb * t->e;
  t->buf[0] = xmalloc(t->size[0]);
  for (uint64_t j = 0; j < nb; j++)
    fill_elem(r, t->buf[0] + j * t->e, t->e, zero_pct);
  d->buffers[0].size_bytes = t->size[0];
  truth_from_dense(t);
}

/* A random sparse source: the truth first, then its encoding. */
static void gen_sparse_src(xc_rng *r, tcase *t) {
  hr_descriptor *d = &t->d;
  static const uint8_t tags[] = {HR_LAYOUT_SPARSE_COO, HR_LAYOUT_SPARSE_CSR,
                                 HR_LAYOUT_SPARSE_CSC, HR_LAYOUT_SPARSE_BSR};
  uint8_t tag = tags[xc_rn(r, 4)];
  unsigned rank = tag == HR_LAYOUT_SPARSE_COO ? (unsigned)xc_rr(r, 1, 4) : 2;
  uint64_t br = 1, bc = 1;
  if (tag == HR_LAYOUT_SPARSE_BSR) {
    br = xc_rr(r, 1, 4);
    bc = xc_rr(r, 1, 4);
  }
  d->descriptor_version = 1;
  d->rank = (uint8_t)rank;
  d->layout.tag = tag;
  t->e = pick_esize(r);
  d->element_type = xc_elem_for(t->e);
  for (unsigned k = 0; k < rank; k++) {
    uint64_t maxd = rank <= 2 ? 40 : 9;
    d->shape[k] = xc_rn(r, 30) == 0 ? 0 : xc_rr(r, 1, maxd);
  }
  if (tag == HR_LAYOUT_SPARSE_BSR) {
    d->shape[0] = d->shape[0] / br * br;
    d->shape[1] = d->shape[1] / bc * bc;
    d->params.br = (uint32_t)br;
    d->params.bc = (uint32_t)bc;
  }
  const unsigned e = t->e;
  const uint64_t *S = d->shape;
  uint64_t n = xc_prod(S, rank);
  static const unsigned zp[] = {50, 80, 95, 100, 0};
  unsigned zero_pct = zp[xc_rn(r, 5)];
  t->truth = xmalloc(n * e);
  for (uint64_t j = 0; j < n; j++)
    fill_elem(r, t->truth + j * e, e, zero_pct);
  int is64 = (int)xc_rn(r, 2);
  unsigned isz = is64 ? 8 : 4;
  d->params.index_type = is64 ? HR_ELEM_INT64 : HR_ELEM_INT32;

  if (tag == HR_LAYOUT_SPARSE_COO) {
    /* Non-zeros plus, sometimes, stored zeros, in row-major order or
     * shuffled. */
    uint64_t *list = xmalloc(n * sizeof *list), nnz = 0;
    int extra = xc_rn(r, 4) == 0;
    for (uint64_t j = 0; j < n; j++)
      if (xc_nonzero(t->truth + j * e, e) || (extra && xc_rn(r, 8) == 0))
        list[nnz++] = j;
    int sorted = xc_rn(r, 2) == 0;
    d->params.sorted = (uint8_t)sorted;
    if (!sorted && xc_rn(r, 4) != 0)
      for (uint64_t j = nnz; j > 1; j--) {
        uint64_t q = xc_rn(r, j), tmp = list[j - 1];
        list[j - 1] = list[q];
        list[q] = tmp;
      }
    d->params.nnz = nnz;
    t->size[0] = nnz * rank * isz;
    t->size[1] = nnz * e;
    t->buf[0] = xmalloc(t->size[0]);
    t->buf[1] = xmalloc(t->size[1]);
    for (uint64_t j = 0; j < nnz; j++) {
      uint64_t l = list[j];
      for (unsigned k = rank; k-- > 0;) {
        xc_put_idx(t->buf[0], j * rank + k, is64, l % S[k]);
        l /= S[k];
      }
      memcpy(t->buf[1] + j * e, t->truth + list[j] * e, e);
    }
    free(list);
    d->buffer_count = 2;
  } else {
    /* CSR/CSC: compressed over rows/columns; BSR over block rows.  Inner
     * indices sometimes shuffled inside their row (legal). */
    int csc = tag == HR_LAYOUT_SPARSE_CSC;
    uint64_t nout = csc ? S[1] : S[0] / br, nin = csc ? S[0] : S[1] / bc;
    uint64_t blk = br * bc;
    uint64_t *ptr = xmalloc((nout + 1) * sizeof *ptr);
    uint64_t *ind = xmalloc((nout * nin + 1) * sizeof *ind), nnz = 0;
    int extra = xc_rn(r, 4) == 0, shuffle = xc_rn(r, 3) == 0;
    for (uint64_t o = 0; o < nout; o++) {
      ptr[o] = nnz;
      for (uint64_t i = 0; i < nin; i++) {
        int any = 0;
        for (uint64_t a = 0; a < br; a++)
          for (uint64_t b = 0; b < bc; b++) {
            uint64_t row = csc ? i : o * br + a, col = csc ? o : i * bc + b;
            any |= xc_nonzero(t->truth + (row * S[1] + col) * e, e);
          }
        if (any || (extra && xc_rn(r, 6) == 0))
          ind[nnz++] = i;
      }
      if (shuffle)
        for (uint64_t j = nnz - ptr[o]; j > 1; j--) {
          uint64_t q = ptr[o] + xc_rn(r, j), tmp = ind[ptr[o] + j - 1];
          ind[ptr[o] + j - 1] = ind[q];
          ind[q] = tmp;
        }
    }
    ptr[nout] = nnz;
    d->params.nnz = nnz;
    t->size[0] = (nout + 1) * isz;
    t->size[1] = nnz * isz;
    t->size[2] = nnz * blk * e;
    for (int b = 0; b < 3; b++)
      t->buf[b] = xmalloc(t->size[b]);
    for (uint64_t o = 0; o <= nout; o++)
      xc_put_idx(t->buf[0], o, is64, ptr[o]);
    for (uint64_t o = 0; o < nout; o++)
      for (uint64_t j = ptr[o]; j < ptr[o + 1]; j++) {
        xc_put_idx(t->buf[1], j, is64, ind[j]);
        for (uint64_t a = 0; a < br; a++)
          for (uint64_t b = 0; b < bc; b++) {
            uint64_t row = csc ? ind[j] : o * br + a;
            uint64_t col = csc ? o : ind[j] * bc + b;
            memcpy(t->buf[2] + ((j * br + a) * bc + b) * e,
                   t->truth + (row * S[1] + col) * e, e);
          }
      }
    free(ptr);
    free(ind);
    d->buffer_count = 3;
  }
  for (int b = 0; b < d->buffer_count; b++)
    d->buffers[b].size_bytes = t->size[b];
}

static void gen_region_target(xc_rng *r, tcase *t, int allow_sparse) {
  const hr_descriptor *d = &t->d;
  const unsigned rank = d->rank;
  uint64_t R[HR_MAX_RANK];
  t->has_region = xc_rn(r, 2) == 0;
  for (unsigned k = 0; k < rank; k++) {
    if (t->has_region) {
      uint64_t o = xc_rn(r, d->shape[k] + 1);
      uint64_t s = xc_rn(r, 3) ? xc_rr(r, d->shape[k] > o, d->shape[k] - o)
                               : d->shape[k] - o;
      t->reg.offset[k] = o;
      t->reg.shape[k] = s;
    }
    R[k] = t->has_region ? t->reg.shape[k] : d->shape[k];
  }
  for (;;) {
    static const uint8_t tags[] = {HR_LAYOUT_ROW_MAJOR,  HR_LAYOUT_COLUMN_MAJOR,
                                   HR_LAYOUT_PERMUTED,   HR_LAYOUT_PERMUTED,
                                   HR_LAYOUT_TILED,      HR_LAYOUT_TILED,
                                   HR_LAYOUT_PANEL,      HR_LAYOUT_SPARSE_CSR,
                                   HR_LAYOUT_SPARSE_CSC, HR_LAYOUT_SPARSE_COO};
    uint8_t tag = tags[xc_rn(r, sizeof tags)];
    if (tag == HR_LAYOUT_PANEL && rank != 2)
      continue;
    if (tag >= HR_LAYOUT_SPARSE_COO &&
        (!allow_sparse || (tag == HR_LAYOUT_SPARSE_COO ? rank < 1 : rank != 2)))
      continue;
    memset(&t->tgt, 0, sizeof t->tgt);
    t->tgt.layout = tag;
    hr_layout_params *p = &t->tgt.params;
    switch (tag) {
    case HR_LAYOUT_PERMUTED: random_perm(r, p->order, rank); break;
    case HR_LAYOUT_TILED:
      for (unsigned k = 0; k < rank; k++)
        p->tile[k] = (uint32_t)(xc_rn(r, 6) == 0 ? 1 : xc_rr(r, 1, R[k] + 3));
      cap_tiles(r, p->tile, R, rank);
      break;
    case HR_LAYOUT_PANEL:
      p->mr = (uint32_t)(xc_rn(r, 3) == 0 ? 8 : xc_rr(r, 1, R[0] + 3));
      break;
    case HR_LAYOUT_SPARSE_CSR:
    case HR_LAYOUT_SPARSE_CSC:
    case HR_LAYOUT_SPARSE_COO: {
      static const uint8_t it[] = {0, HR_ELEM_INT32, HR_ELEM_INT64};
      p->index_type = it[xc_rn(r, 3)];
      break;
    }
    default: break;
    }
    return;
  }
}

/* Layout names for the summary (proto's hr_layout_name() lives in another
 * layer's module). */
static const char *hr_layout_name_local(int tag) {
  switch (tag) {
  case HR_LAYOUT_ROW_MAJOR: return "ROW";
  case HR_LAYOUT_COLUMN_MAJOR: return "COL";
  case HR_LAYOUT_STRIDED: return "STRIDED";
  case HR_LAYOUT_PERMUTED: return "PERMUTED";
  case HR_LAYOUT_TILED: return "TILED";
  case HR_LAYOUT_SPARSE_COO: return "COO";
  case HR_LAYOUT_SPARSE_CSR: return "CSR";
  case HR_LAYOUT_SPARSE_CSC: return "CSC";
  case HR_LAYOUT_SPARSE_BSR: return "BSR";
  case HR_LAYOUT_PANEL: return "PANEL";
  default: return "?";
  }
}

static hr_xc_tensor tensor_of(const tcase *t) {
  hr_xc_tensor x;
  memset(&x, 0, sizeof x);
  x.desc = &t->d;
  for (int b = 0; b < 3; b++) {
    x.buffers[b] = t->buf[b];
    x.sizes[b] = t->size[b];
  }
  return x;
}

/* ------------------------------------------------------------------------ */
/* Checking one case                                                        */
/* ------------------------------------------------------------------------ */

static void region_of(const tcase *t, uint64_t *roff, uint64_t *R) {
  for (unsigned k = 0; k < t->d.rank; k++) {
    roff[k] = t->has_region ? t->reg.offset[k] : 0;
    R[k] = t->has_region ? t->reg.shape[k] : t->d.shape[k];
  }
}

/* The expected dense target bytes. */
static uint8_t *expect_dense(const tcase *t, uint64_t *nbytes) {
  const unsigned r = t->d.rank, e = t->e;
  uint64_t roff[HR_MAX_RANK], R[HR_MAX_RANK], i[HR_MAX_RANK] = {0};
  uint64_t g[HR_MAX_RANK];
  region_of(t, roff, R);
  uint64_t n = xc_ref_elems(t->tgt.layout, &t->tgt.params, R, r);
  uint8_t *x = xmalloc(n * e);
  memset(x, 0, n * e);
  *nbytes = n * e;
  if (xc_prod(R, r) == 0)
    return x;
  do {
    for (unsigned k = 0; k < r; k++)
      g[k] = roff[k] + i[k];
    uint64_t o = xc_ref_off(t->tgt.layout, &t->tgt.params, R, r, i);
    memcpy(x + o * e, t->truth + xc_lin(t->d.shape, r, g) * e, e);
  } while (xc_next(R, r, i));
  return x;
}

static void fail_case(const tcase *t, const char *what) {
  fail_msg("case %llu (seed %llu): %s; src layout %u rank %u esize %u, "
           "target %u, region %d",
           (unsigned long long)t->id, (unsigned long long)g_seed, what,
           t->d.layout.tag, t->d.rank, t->e, t->tgt.layout, t->has_region);
}

/* Runs the plan whole and in a random chunking; compares both. */
static void check_dense_plan(xc_rng *r, const tcase *t, const hr_xc_plan *p,
                             const uint8_t *exp, uint64_t n) {
  /* 64-byte aligned, so that non-temporal stores can be taken. */
  uint8_t *out = aligned_alloc(64, (n + 64) / 64 * 64);
  assert_non_null(out);
  memset(out, 0xA5, n + 1);
  assert_int_equal(hr_xc_run(p, 0, n, out), 0);
  if (memcmp(out, exp, n) != 0)
    fail_case(t, "whole output differs");
  assert_int_equal(out[n], 0xA5);

  /* Random cut points (element-unaligned included, empty chunks too),
   * chunks produced in a random order. */
  unsigned nc = (unsigned)xc_rr(r, 1, 9);
  uint64_t cuts[12];
  cuts[0] = 0;
  cuts[nc] = n;
  for (unsigned i = 1; i < nc; i++)
    cuts[i] =
        xc_rn(r, 3) == 0 ? xc_rn(r, n + 1) / t->e * t->e : xc_rn(r, n + 1);
  for (unsigned i = 1; i < nc; i++)
    for (unsigned j = i; j > 1 && cuts[j - 1] > cuts[j]; j--) {
      uint64_t tmp = cuts[j];
      cuts[j] = cuts[j - 1];
      cuts[j - 1] = tmp;
    }
  uint8_t ord[12];
  random_perm(r, ord, nc);
  memset(out, 0x5A, n + 1);
  for (unsigned i = 0; i < nc; i++) {
    uint64_t b = cuts[ord[i]], l = cuts[ord[i] + 1] - b;
    assert_int_equal(hr_xc_run(p, b, l, out + b), 0);
  }
  if (memcmp(out, exp, n) != 0)
    fail_case(t, "chunked output differs");
  assert_int_equal(out[n], 0x5A);
  free(out);
}

static void check_dense_target(xc_rng *r, const tcase *t) {
  hr_xc_tensor src = tensor_of(t);
  hr_wire_status st;
  hr_xc_plan *p = NULL;
  uint64_t n;
  uint8_t *exp = expect_dense(t, &n);
  int rv = hr_xc_plan_new(&p, &src, &t->tgt, t->has_region ? &t->reg : NULL,
                          NULL, NULL, &st);
  if (rv)
    fail_case(t, st.reason ? st.reason : hr_strerror(rv));
  assert_int_equal(hr_xc_plan_needs_whole(p), 0);
  if (hr_xc_plan_out_size(p) != n)
    fail_case(t, "out_size differs");
  uint64_t sizes[HR_MAX_BUFFERS];
  assert_int_equal(hr_xc_plan_buffer_sizes(p, sizes), 1);
  assert_true(sizes[0] == n);
  assert_true(hr_xc_plan_grain(p) >= 1);
  hr_descriptor od;
  assert_int_equal(hr_xc_plan_describe(p, &od), 0);
  assert_int_equal(od.layout.tag, t->tgt.layout);
  assert_int_equal(od.rank, t->d.rank);
  assert_int_equal(od.buffer_count, 1);
  assert_true(od.buffers[0].size_bytes == n);
  if (t->tgt.layout == HR_LAYOUT_PANEL) {
    assert_int_equal(od.layout.ext_len, 4);
    assert_int_equal(od.params.mr, t->tgt.params.mr);
  }
  /* The run must not accept a range past the end. */
  assert_int_equal(hr_xc_run(p, n, 1, exp), HR_ERR_INVALID_ARGUMENT);
  check_dense_plan(r, t, p, exp, n);
  g_stats.mode[hr__xc_plan_mode(p)]++;
  g_stats.bytes += n;

  /* Non-temporal stores for any size, other instruction sets and, for
   * dense sources, the generic walker. */
  hr__xc_plan_set_nt_min(p, 0);
  check_dense_plan(r, t, p, exp, n);
  int best = hr__xc_best_isa();
  if (best > XC_ISA_PORTABLE) {
    assert_int_equal(hr__xc_plan_force_isa(p, (int)xc_rn(r, (uint64_t)best)),
                     0);
    check_dense_plan(r, t, p, exp, n);
  }
  if (hr__xc_plan_mode(p) == XC_MODE_AFFINE && xc_rn(r, 2) == 0) {
    assert_int_equal(hr__xc_plan_force_generic(p), 0);
    check_dense_plan(r, t, p, exp, n);
  }
  hr_xc_plan_del(p);
  free(exp);
}

static void check_sparse_target(xc_rng *r, const tcase *t) {
  const unsigned rank = t->d.rank, e = t->e;
  uint64_t roff[HR_MAX_RANK], R[HR_MAX_RANK], i[HR_MAX_RANK] = {0};
  region_of(t, roff, R);
  const uint8_t tag = t->tgt.layout;
  const int csc = tag == HR_LAYOUT_SPARSE_CSC;
  int is64 = t->tgt.params.index_type == HR_ELEM_INT64;
  const unsigned isz = is64 ? 8 : 4;

  /* Expected buffers: scan the region row-major (CSC: column-major). */
  uint64_t n = xc_prod(R, rank), nnz = 0;
  uint64_t nout = tag == HR_LAYOUT_SPARSE_COO ? 0 : (csc ? R[1] : R[0]);
  uint8_t *xi = xmalloc(n * rank * isz), *xv = xmalloc(n * e);
  uint8_t *xp = xmalloc((nout + 1) * isz);
  xc_put_idx(xp, 0, is64, 0);
  for (uint64_t l = 0; l < n; l++) {
    uint64_t g[HR_MAX_RANK];
    if (csc) {
      i[0] = l % R[0];
      i[1] = l / R[0];
    } else {
      uint64_t q = l;
      for (unsigned k = rank; k-- > 0;) {
        i[k] = q % R[k];
        q /= R[k];
      }
    }
    for (unsigned k = 0; k < rank; k++)
      g[k] = roff[k] + i[k];
    const uint8_t *v = t->truth + xc_lin(t->d.shape, rank, g) * e;
    if (xc_nonzero(v, e)) {
      if (tag == HR_LAYOUT_SPARSE_COO)
        for (unsigned k = 0; k < rank; k++)
          xc_put_idx(xi, nnz * rank + k, is64, i[k]);
      else
        xc_put_idx(xi, nnz, is64, csc ? i[0] : i[1]);
      memcpy(xv + nnz * e, v, e);
      nnz++;
    }
    if (tag != HR_LAYOUT_SPARSE_COO) {
      uint64_t inner = csc ? R[0] : R[1];
      if ((l + 1) % inner == 0)
        xc_put_idx(xp, (l + 1) / inner, is64, nnz);
    }
  }
  if (tag != HR_LAYOUT_SPARSE_COO && n == 0)
    for (uint64_t o = 1; o <= nout; o++)
      xc_put_idx(xp, o, is64, 0);

  hr_xc_tensor src = tensor_of(t);
  hr_wire_status st;
  hr_xc_plan *p = NULL;
  uint64_t sizes[HR_MAX_BUFFERS];
  int rv = hr_xc_plan_new(&p, &src, &t->tgt, t->has_region ? &t->reg : NULL,
                          NULL, NULL, &st);
  if (rv)
    fail_case(t, st.reason ? st.reason : hr_strerror(rv));
  assert_int_equal(hr_xc_plan_needs_whole(p), 1);
  assert_int_equal(hr_xc_run(p, 0, 0, xv), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_plan_buffer_sizes(p, sizes), HR_ERR_STATE);
  assert_true(hr_xc_plan_out_size(p) == 0);
  if (xc_rn(r, 2) == 0 && hr__xc_plan_mode(p) == XC_MODE_AFFINE)
    assert_int_equal(hr__xc_plan_force_generic(p), 0);
  assert_int_equal(hr_xc_plan_count(p, &st), 0);
  assert_int_equal(hr_xc_plan_count(p, &st), 0);
  int nb = hr_xc_plan_buffer_sizes(p, sizes);
  assert_int_equal(nb, tag == HR_LAYOUT_SPARSE_COO ? 2 : 3);
  hr_descriptor od;
  assert_int_equal(hr_xc_plan_describe(p, &od), 0);
  if (od.params.nnz != nnz)
    fail_case(t, "nnz differs");
  /* Every index of these tests fits 32 bits: the plan's own choice is
   * INT32. */
  assert_int_equal(od.params.index_type, is64 ? HR_ELEM_INT64 : HR_ELEM_INT32);
  if (tag == HR_LAYOUT_SPARSE_COO)
    assert_int_equal(od.params.sorted, 1);
  void *bufs[3];
  for (int b = 0; b < nb; b++)
    bufs[b] = xmalloc(sizes[b]);
  assert_int_equal(hr_xc_run_sparse(p, bufs), 0);
  g_stats.mode[hr__xc_plan_mode(p)]++;
  g_stats.bytes += sizes[0] + sizes[1] + (nb > 2 ? sizes[2] : 0);
  if (tag == HR_LAYOUT_SPARSE_COO) {
    assert_true(sizes[0] == nnz * rank * isz && sizes[1] == nnz * e);
    if (memcmp(bufs[0], xi, sizes[0]) || memcmp(bufs[1], xv, sizes[1]))
      fail_case(t, "COO output differs");
  } else {
    assert_true(sizes[0] == (nout + 1) * isz && sizes[1] == nnz * isz &&
                sizes[2] == nnz * e);
    if (memcmp(bufs[0], xp, sizes[0]) || memcmp(bufs[1], xi, sizes[1]) ||
        memcmp(bufs[2], xv, sizes[2]))
      fail_case(t, "CSR/CSC output differs");
  }
  for (int b = 0; b < nb; b++)
    free(bufs[b]);
  hr_xc_plan_del(p);
  free(xi);
  free(xv);
  free(xp);
}

static void check_case(xc_rng *r, tcase *t) {
  g_stats.src[t->d.layout.tag]++;
  g_stats.tgt[t->tgt.layout]++;
  g_stats.region += (unsigned)t->has_region;
  if (t->tgt.layout >= HR_LAYOUT_SPARSE_COO &&
      t->tgt.layout <= HR_LAYOUT_SPARSE_CSC)
    check_sparse_target(r, t);
  else
    check_dense_target(r, t);
}

static unsigned scaled(unsigned n) {
  unsigned v = (unsigned)((uint64_t)n * g_scale / 100);
  return v ? v : 1;
}

/* ------------------------------------------------------------------------ */
/* The random properties                                                    */
/* ------------------------------------------------------------------------ */

static void test_random_dense_sources(void **state) {
  (void)state;
  xc_rng r = {g_seed};
  unsigned n = scaled(4000);
  for (unsigned c = 0; c < n; c++) {
    tcase t;
    memset(&t, 0, sizeof t);
    t.id = c;
    gen_dense_src(&r, &t);
    gen_region_target(&r, &t, 1);
    check_case(&r, &t);
    tcase_free(&t);
  }
}

static void test_random_sparse_sources(void **state) {
  (void)state;
  xc_rng r = {g_seed ^ 0x5555};
  unsigned n = scaled(1500);
  for (unsigned c = 0; c < n; c++) {
    tcase t;
    memset(&t, 0, sizeof t);
    t.id = c;
    gen_sparse_src(&r, &t);
    gen_region_target(&r, &t, 1);
    check_case(&r, &t);
    tcase_free(&t);
  }
}

/* The benchmark's shapes, scaled down, for every element size, every
 * instruction set and a few chunk sizes. */
static void test_bench_shapes(void **state) {
  (void)state;
  xc_rng r = {g_seed ^ 0xBE7C};
  static const unsigned es[5] = {1, 2, 4, 8, 16};
  for (unsigned ei = 0; ei < 10; ei++) {
    /* The second round uses line-aligned rows (non-temporal stores). */
    const uint64_t dim0 = ei < 5 ? 133 : 128, dim1 = ei < 5 ? 170 : 192;
    for (unsigned kind = 0; kind < 4; kind++) {
      tcase t;
      memset(&t, 0, sizeof t);
      t.id = kind;
      t.e = es[ei % 5];
      hr_descriptor *d = &t.d;
      d->descriptor_version = 1;
      d->element_type = xc_elem_for(t.e);
      d->layout.tag = HR_LAYOUT_ROW_MAJOR;
      d->buffer_count = 1;
      if (kind == 1) {
        d->rank = 4;
        d->shape[0] = ei < 5 ? 5 : 3;
        d->shape[1] = ei < 5 ? 19 : 64;
        d->shape[2] = ei < 5 ? 6 : 8;
        d->shape[3] = ei < 5 ? 37 : 64;
        t.tgt.layout = HR_LAYOUT_PERMUTED;
        memcpy(t.tgt.params.order, (uint8_t[]){0, 2, 3, 1}, 4);
      } else {
        d->rank = 2;
        d->shape[0] = dim0;
        d->shape[1] = dim1;
        if (kind == 0) {
          t.tgt.layout = HR_LAYOUT_COLUMN_MAJOR;
        } else if (kind == 2) {
          t.tgt.layout = HR_LAYOUT_TILED;
          t.tgt.params.tile[0] = t.tgt.params.tile[1] = 32;
        } else {
          t.tgt.layout = HR_LAYOUT_PANEL;
          t.tgt.params.mr = 8;
        }
      }
      uint64_t n = xc_prod(d->shape, d->rank);
      t.size[0] = n * t.e;
      t.buf[0] = xmalloc(t.size[0]);
      for (uint64_t j = 0; j < n; j++)
        fill_elem(&r, t.buf[0] + j * t.e, t.e, 10);
      truth_from_dense(&t);
      uint64_t nb;
      uint8_t *exp = expect_dense(&t, &nb);
      hr_xc_tensor src = tensor_of(&t);
      hr_xc_plan *p;
      assert_int_equal(hr_xc_plan_new(&p, &src, &t.tgt, NULL, NULL, NULL, NULL),
                       0);
      assert_int_equal(hr__xc_plan_mode(p), XC_MODE_AFFINE);
      for (int isa = XC_ISA_PORTABLE; isa <= hr__xc_best_isa(); isa++) {
        assert_int_equal(hr__xc_plan_force_isa(p, isa), 0);
        for (int rep = 0; rep < 4; rep++) {
          hr__xc_plan_set_nt_min(p, rep & 1 ? 0 : XC_NT_MIN);
          check_dense_plan(&r, &t, p, exp, nb);
        }
      }
      hr_xc_plan_del(p);
      free(exp);
      tcase_free(&t);
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

/* A 4 x 5 FLOAT32 CSR with three entries, built by hand. */
typedef struct small_csr {
  hr_descriptor d;
  uint8_t ptr[5 * 4], ind[3 * 4], val[3 * 4];
} small_csr;

static void small_csr_init(small_csr *s) {
  memset(s, 0, sizeof *s);
  s->d.descriptor_version = 1;
  s->d.element_type = HR_ELEM_FLOAT32;
  s->d.rank = 2;
  s->d.shape[0] = 4;
  s->d.shape[1] = 5;
  s->d.layout.tag = HR_LAYOUT_SPARSE_CSR;
  s->d.params.nnz = 3;
  s->d.params.index_type = HR_ELEM_INT32;
  s->d.buffer_count = 3;
  static const uint32_t ptr[5] = {0, 1, 1, 3, 3}, ind[3] = {4, 0, 2};
  for (int i = 0; i < 5; i++)
    xc_put_idx(s->ptr, (uint64_t)i, 0, ptr[i]);
  for (int i = 0; i < 3; i++) {
    xc_put_idx(s->ind, (uint64_t)i, 0, ind[i]);
    xc_put_idx(s->val, (uint64_t)i, 0, 0x3F800000u + (uint32_t)i);
  }
}

static hr_xc_tensor small_csr_tensor(small_csr *s) {
  hr_xc_tensor x;
  memset(&x, 0, sizeof x);
  x.desc = &s->d;
  x.buffers[0] = s->ptr;
  x.buffers[1] = s->ind;
  x.buffers[2] = s->val;
  x.sizes[0] = sizeof s->ptr;
  x.sizes[1] = sizeof s->ind;
  x.sizes[2] = sizeof s->val;
  return x;
}

static int plan_err(const hr_xc_tensor *src, const hr_xc_target *tgt,
                    const hr_xc_region *reg, hr_wire_status *st) {
  hr_xc_plan *p = NULL;
  st->code = 0;
  st->reason = NULL;
  int rv = hr_xc_plan_new(&p, src, tgt, reg, NULL, NULL, st);
  if (rv == 0)
    hr_xc_plan_del(p);
  else
    assert_null(p);
  return rv;
}

static void test_sparse_errors(void **state) {
  (void)state;
  small_csr s;
  hr_xc_tensor x;
  hr_wire_status st;
  hr_xc_target row = {.layout = HR_LAYOUT_ROW_MAJOR};

  small_csr_init(&s);
  x = small_csr_tensor(&s);
  assert_int_equal(plan_err(&x, &row, NULL, &st), 0);

  /* Repeated coordinate: row 2 holds column 0 twice. */
  xc_put_idx(s.ind, 2, 0, 0);
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_TRANSCODE_FAILED);
  assert_non_null(st.reason);
  /* ... but outside the requested region it is not densified. */
  hr_xc_region reg = {.offset = {0, 0}, .shape = {2, 5}};
  assert_int_equal(plan_err(&x, &row, &reg, &st), 0);

  /* Column index out of range, negative index. */
  small_csr_init(&s);
  xc_put_idx(s.ind, 1, 0, 5);
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  xc_put_idx(s.ind, 1, 0, 0xFFFFFFFFu);
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);

  /* Bad indptr: not starting at 0, decreasing, not ending at nnz. */
  static const uint32_t bad_ptrs[3][5] = {
      {1, 1, 1, 3, 3}, {0, 2, 1, 3, 3}, {0, 1, 1, 3, 2}};
  for (int b = 0; b < 3; b++) {
    small_csr_init(&s);
    for (int i = 0; i < 5; i++)
      xc_put_idx(s.ptr, (uint64_t)i, 0, bad_ptrs[b][i]);
    assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
    assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  }

  /* Buffers shorter than the counts. */
  small_csr_init(&s);
  x.sizes[2] = 8;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  x = small_csr_tensor(&s);
  s.d.params.index_type = HR_ELEM_INT16;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);

  /* COO: sorted but not strictly increasing; duplicates when unsorted. */
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_UINT16;
  d.rank = 2;
  d.shape[0] = 3;
  d.shape[1] = 3;
  d.layout.tag = HR_LAYOUT_SPARSE_COO;
  d.params.nnz = 3;
  d.params.index_type = HR_ELEM_INT64;
  d.params.sorted = 1;
  uint8_t ci[3 * 2 * 8], cv[3 * 2] = {1, 2, 3, 4, 5, 6};
  static const uint64_t co[3][2] = {{0, 1}, {2, 0}, {1, 2}};
  for (int j = 0; j < 3; j++)
    for (int k = 0; k < 2; k++)
      xc_put_idx(ci, (uint64_t)(j * 2 + k), 1, co[j][k]);
  hr_xc_tensor cx = {
      .desc = &d, .buffers = {ci, cv}, .sizes = {sizeof ci, sizeof cv}};
  assert_int_equal(plan_err(&cx, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  d.params.sorted = 0;
  assert_int_equal(plan_err(&cx, &row, NULL, &st), 0);
  xc_put_idx(ci, 4, 1, 0); /* entry 2 = (0, 2) */
  xc_put_idx(ci, 5, 1, 1); /* entry 2 = (0, 1): a repeat of entry 0 */
  assert_int_equal(plan_err(&cx, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_TRANSCODE_FAILED);
  d.params.sorted = 1;
  assert_int_equal(plan_err(&cx, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  xc_put_idx(ci, 0, 1, 3); /* out of range */
  d.params.sorted = 0;
  assert_int_equal(plan_err(&cx, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);

  /* BSR: shape not a multiple of the block. */
  small_csr_init(&s);
  x = small_csr_tensor(&s);
  s.d.layout.tag = HR_LAYOUT_SPARSE_BSR;
  s.d.params.br = 3;
  s.d.params.bc = 1;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
}

static void test_dense_errors(void **state) {
  (void)state;
  hr_descriptor d;
  uint8_t buf[64] = {0};
  hr_wire_status st;
  hr_xc_tensor x = {.desc = &d, .buffers = {buf}, .sizes = {sizeof buf}};
  hr_xc_target row = {.layout = HR_LAYOUT_ROW_MAJOR};
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_FLOAT32;
  d.rank = 2;
  d.shape[0] = 4;
  d.shape[1] = 4;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  assert_int_equal(plan_err(&x, &row, NULL, &st), 0);

  /* INT4/UINT4 are never transcoded. */
  d.element_type = HR_ELEM_INT4;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_UNSUPPORTED);
  d.element_type = HR_ELEM_UINT4;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_UNSUPPORTED);
  assert_int_equal(hr_xc_supported(HR_ELEM_INT4, HR_LAYOUT_ROW_MAJOR,
                                   HR_LAYOUT_COLUMN_MAJOR),
                   0);
  assert_int_equal(
      hr_xc_supported(HR_ELEM_FLOAT32, HR_LAYOUT_STRIDED, HR_LAYOUT_PANEL), 1);
  assert_int_equal(
      hr_xc_supported(HR_ELEM_FLOAT32, HR_LAYOUT_ROW_MAJOR, HR_LAYOUT_STRIDED),
      0);
  d.element_type = 0x14;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  d.element_type = HR_ELEM_FLOAT32;

  /* Targets this module does not produce, bad target parameters. */
  hr_xc_target t = {.layout = HR_LAYOUT_STRIDED};
  assert_int_equal(plan_err(&x, &t, NULL, &st), HR_ERR_UNSUPPORTED);
  t.layout = HR_LAYOUT_SPARSE_BSR;
  assert_int_equal(plan_err(&x, &t, NULL, &st), HR_ERR_UNSUPPORTED);
  t.layout = HR_LAYOUT_TILED;
  t.params.tile[0] = 2;
  assert_int_equal(plan_err(&x, &t, NULL, &st), HR_ERR_INVALID_ARGUMENT);
  t.layout = HR_LAYOUT_PERMUTED;
  t.params.order[0] = 1;
  t.params.order[1] = 1;
  assert_int_equal(plan_err(&x, &t, NULL, &st), HR_ERR_INVALID_ARGUMENT);
  t.layout = HR_LAYOUT_PANEL;
  t.params.mr = 0;
  assert_int_equal(plan_err(&x, &t, NULL, &st), HR_ERR_INVALID_ARGUMENT);
  t.layout = HR_LAYOUT_SPARSE_CSR;
  t.params.index_type = HR_ELEM_INT8;
  assert_int_equal(plan_err(&x, &t, NULL, &st), HR_ERR_INVALID_ARGUMENT);
  d.rank = 3;
  d.shape[2] = 1;
  t.params.mr = 4;
  t.layout = HR_LAYOUT_PANEL;
  assert_int_equal(plan_err(&x, &t, NULL, &st), HR_ERR_UNSUPPORTED);
  t.layout = HR_LAYOUT_SPARSE_CSC;
  t.params.index_type = 0;
  assert_int_equal(plan_err(&x, &t, NULL, &st), HR_ERR_UNSUPPORTED);
  d.rank = 0;
  t.layout = HR_LAYOUT_SPARSE_COO;
  assert_int_equal(plan_err(&x, &t, NULL, &st), HR_ERR_UNSUPPORTED);
  d.rank = 2;

  /* Composite heads and unregistered extension layouts: unsupported;
   * TILED_EXACT as a descriptor layout: invalid. */
  d.layout.tag = HR_LAYOUT_COMPOSITE;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_UNSUPPORTED);
  d.layout.tag = 0xF5;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_UNSUPPORTED);
  d.layout.tag = HR_LAYOUT_TILED_EXACT;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  d.layout.tag = 0x0C;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;

  /* Region outside the tensor, or overflowing. */
  hr_xc_region reg = {.offset = {1, 0}, .shape = {4, 4}};
  assert_int_equal(plan_err(&x, &row, &reg, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_REGION);
  reg.offset[0] = UINT64_MAX;
  reg.shape[0] = 2;
  assert_int_equal(plan_err(&x, &row, &reg, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_REGION);

  /* Buffer too short for the layout. */
  x.sizes[0] = 63;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  x.sizes[0] = 64;
  d.layout.tag = HR_LAYOUT_TILED;
  d.params.tile[0] = 3;
  d.params.tile[1] = 4;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  d.params.tile[0] = 0;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  d.layout.tag = HR_LAYOUT_PERMUTED;
  d.params.order[0] = 0;
  d.params.order[1] = 0;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  d.layout.tag = HR_LAYOUT_PANEL;
  d.params.mr = 0;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);

  /* STRIDED: lowest or highest addressed element outside the buffer. */
  d.layout.tag = HR_LAYOUT_STRIDED;
  d.params.origin = 0;
  d.params.strides[0] = 4;
  d.params.strides[1] = 1;
  assert_int_equal(plan_err(&x, &row, NULL, &st), 0);
  d.params.strides[0] = 5; /* highest at 19 * 4 bytes */
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  d.params.strides[0] = -4;
  d.params.origin = 11;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  d.params.origin = 12;
  assert_int_equal(plan_err(&x, &row, NULL, &st), 0);
  d.params.strides[0] = INT64_MAX;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  /* An empty STRIDED tensor addresses nothing. */
  d.shape[1] = 0;
  assert_int_equal(plan_err(&x, &row, NULL, &st), 0);
  d.shape[1] = 4;

  /* Shape product overflow. */
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.shape[0] = 1ull << 62;
  assert_int_equal(plan_err(&x, &row, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  d.shape[0] = 4;

  /* Argument checks. */
  hr_xc_plan *p;
  assert_int_equal(hr_xc_plan_new(NULL, &x, &row, NULL, NULL, NULL, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_plan_new(&p, NULL, &row, NULL, NULL, NULL, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_plan_new(&p, &x, NULL, NULL, NULL, NULL, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  x.buffers[0] = NULL;
  assert_int_equal(hr_xc_plan_new(&p, &x, &row, NULL, NULL, NULL, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  x.buffers[0] = buf;
  assert_int_equal(hr_xc_plan_new(&p, &x, &row, NULL, NULL, NULL, NULL), 0);
  assert_int_equal(hr_xc_run(p, 0, 1, NULL), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_run(p, UINT64_MAX, 2, buf), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_run(p, 60, 5, buf), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_run(p, 64, 0, NULL), 0);
  assert_int_equal(hr_xc_plan_count(p, NULL), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_run_sparse(p, (void *[]){buf}),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr__xc_plan_force_isa(p, 7), HR_ERR_INVALID_ARGUMENT);
  hr_xc_plan_del(p);
  hr_xc_plan_del(NULL);
}

/* A huge broadcast tensor: zero strides over 2^61 x 3 one-byte elements in
 * a 1-byte buffer.  Any range of any target can be produced without
 * materialising anything; targets that overflow are refused. */
static void test_huge_logical(void **state) {
  (void)state;
  hr_descriptor d;
  uint8_t one = 0x7E, out[40];
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_UINT8;
  d.rank = 2;
  d.shape[0] = 1ull << 61;
  d.shape[1] = 3;
  d.layout.tag = HR_LAYOUT_STRIDED;
  hr_xc_tensor x = {.desc = &d, .buffers = {&one}, .sizes = {1}};
  hr_xc_target t = {.layout = HR_LAYOUT_COLUMN_MAJOR};
  hr_xc_plan *p;
  assert_int_equal(hr_xc_plan_new(&p, &x, &t, NULL, NULL, NULL, NULL), 0);
  assert_true(hr_xc_plan_out_size(p) == 3ull << 61);
  assert_int_equal(hr_xc_run(p, (3ull << 60) - 7, sizeof out, out), 0);
  for (size_t i = 0; i < sizeof out; i++)
    assert_int_equal(out[i], 0x7E);
  hr_xc_plan_del(p);
  t.layout = HR_LAYOUT_TILED;
  t.params.tile[0] = 1;
  t.params.tile[1] = UINT32_MAX;
  assert_int_equal(hr_xc_plan_new(&p, &x, &t, NULL, NULL, NULL, NULL),
                   HR_ERR_LIMIT);
  /* A PANEL of a region near the end, padded on its own. */
  hr_xc_region reg = {.offset = {(1ull << 61) - 3, 1}, .shape = {3, 2}};
  t.layout = HR_LAYOUT_PANEL;
  t.params.mr = 4;
  assert_int_equal(hr_xc_plan_new(&p, &x, &t, &reg, NULL, NULL, NULL), 0);
  assert_true(hr_xc_plan_out_size(p) == 8);
  assert_int_equal(hr_xc_run(p, 0, 8, out), 0);
  assert_memory_equal(
      out, ((uint8_t[]){0x7E, 0x7E, 0x7E, 0, 0x7E, 0x7E, 0x7E, 0}), 8);
  hr_xc_plan_del(p);
}

/* API paths the random cases do not take. */
static void test_api_edges(void **state) {
  (void)state;
  assert_int_equal(hr_xc_supported(HR_ELEM_FLOAT32, HR_LAYOUT_COMPOSITE,
                                   HR_LAYOUT_ROW_MAJOR),
                   0);
  assert_int_equal(hr_xc_supported(HR_ELEM_FLOAT32, HR_LAYOUT_SPARSE_BSR,
                                   HR_LAYOUT_SPARSE_COO),
                   1);

  /* A PANEL source whose mr comes from the entry's metadata only: 3 x 2
   * INT8 in panels of 2 rows, the last padded. */
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_INT8;
  d.rank = 2;
  d.shape[0] = 3;
  d.shape[1] = 2;
  d.layout.tag = HR_LAYOUT_PANEL;
  uint8_t meta[4] = {2, 0, 0, 0};
  d.layout.ext = meta;
  d.layout.ext_len = 4;
  uint8_t panel[8] = {1, 3, 2, 4, 5, 9, 6, 9}, out[6];
  hr_xc_tensor x = {.desc = &d, .buffers = {panel}, .sizes = {8}};
  hr_xc_target row = {.layout = HR_LAYOUT_ROW_MAJOR};
  hr_xc_plan *p;
  assert_int_equal(hr_xc_plan_new(&p, &x, &row, NULL, NULL, NULL, NULL), 0);
  assert_true(hr_xc_plan_grain(p) <= 6);
  assert_int_equal(hr_xc_run(p, 0, 6, out), 0);
  assert_memory_equal(out, ((uint8_t[]){1, 2, 3, 4, 5, 6}), 6);
  hr_xc_plan_del(p);

  /* Sparse targets: the two-pass protocol and its misuse. */
  small_csr s;
  small_csr_init(&s);
  hr_xc_tensor cx = small_csr_tensor(&s);
  hr_xc_target coo = {.layout = HR_LAYOUT_SPARSE_COO};
  hr_descriptor od;
  uint64_t sizes[HR_MAX_BUFFERS];
  assert_int_equal(hr_xc_plan_new(&p, &cx, &coo, NULL, NULL, NULL, NULL), 0);
  assert_int_equal(hr__xc_plan_force_generic(p), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_plan_describe(p, &od), HR_ERR_STATE);
  uint8_t ib[3 * 2 * 4], vb[3 * 4];
  assert_int_equal(hr_xc_run_sparse(p, (void *[]){ib, vb}), HR_ERR_STATE);
  assert_int_equal(hr_xc_plan_count(p, NULL), 0);
  assert_int_equal(hr_xc_plan_buffer_sizes(p, sizes), 2);
  assert_true(sizes[0] == sizeof ib && sizes[1] == sizeof vb);
  assert_true(hr_xc_plan_out_size(p) == sizeof ib + sizeof vb);
  assert_int_equal(hr_xc_run_sparse(p, (void *[]){ib, NULL}),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_run_sparse(p, (void *[]){ib, vb}), 0);
  static const uint8_t want_ib[] = {0, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0,
                                    0, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0};
  assert_memory_equal(ib, want_ib, sizeof ib);
  assert_memory_equal(vb, s.val, sizeof vb);
  assert_int_equal(hr_xc_plan_describe(p, &od), 0);
  assert_int_equal(od.layout.tag, HR_LAYOUT_SPARSE_COO);
  assert_true(od.params.nnz == 3);
  assert_int_equal(od.params.index_type, HR_ELEM_INT32);
  assert_int_equal(od.params.sorted, 1);
  assert_int_equal(od.buffer_count, 2);
  hr_xc_plan_del(p);
}

/* The scratch cap of sparse sources. */
static void test_scratch_limit(void **state) {
  (void)state;
  small_csr s;
  small_csr_init(&s);
  hr_xc_tensor x = small_csr_tensor(&s);
  hr_xc_target row = {.layout = HR_LAYOUT_ROW_MAJOR};
  hr_xc_opts o = {.max_scratch = 3 * 2 * sizeof(xc_entry) - 1};
  hr_xc_plan *p;
  assert_int_equal(hr_xc_plan_new(&p, &x, &row, NULL, &o, NULL, NULL),
                   HR_ERR_LIMIT);
  o.max_scratch++;
  assert_int_equal(hr_xc_plan_new(&p, &x, &row, NULL, &o, NULL, NULL), 0);
  assert_true(hr_xc_plan_scratch(p) == 3 * sizeof(xc_entry));
  uint8_t out[80], exp[80] = {0};
  memcpy(exp + 4 * 4, s.val, 4);      /* (0, 4) */
  memcpy(exp + 10 * 4, s.val + 4, 4); /* (2, 0) */
  memcpy(exp + 12 * 4, s.val + 8, 4); /* (2, 2) */
  assert_int_equal(hr_xc_run(p, 0, sizeof out, out), 0);
  assert_memory_equal(out, exp, sizeof out);
  hr_xc_plan_del(p);
}

/* A counting allocator that fails from the n-th call on. */
typedef struct failmem {
  int left;
  int live;
} failmem;
static void *fm_malloc(size_t n, void *ud) {
  failmem *f = ud;
  if (f->left-- <= 0)
    return NULL;
  f->live++;
  return malloc(n);
}
static void fm_free(void *p, void *ud) {
  failmem *f = ud;
  if (p)
    f->live--;
  free(p);
}
static void *fm_calloc(size_t m, size_t n, void *ud) {
  failmem *f = ud;
  if (f->left-- <= 0)
    return NULL;
  f->live++;
  return calloc(m, n);
}
static void *fm_realloc(void *p, size_t n, void *ud) {
  failmem *f = ud;
  if (f->left-- <= 0)
    return NULL;
  if (!p)
    f->live++;
  return realloc(p, n);
}

static void test_failmalloc(void **state) {
  (void)state;
  /* A reversed CSC, so that the index needs sorting: every allocation of
   * the plan is exercised. */
  small_csr s;
  small_csr_init(&s);
  s.d.layout.tag = HR_LAYOUT_SPARSE_CSC;
  s.d.shape[0] = 5;
  s.d.shape[1] = 4;
  hr_xc_tensor x = small_csr_tensor(&s);
  hr_xc_target row = {.layout = HR_LAYOUT_ROW_MAJOR};
  int ok = 0;
  for (int n = 0; n < 10 && !ok; n++) {
    failmem f = {n, 0};
    hr_mem m = {&f, fm_malloc, fm_free, fm_calloc, fm_realloc};
    hr_xc_plan *p = NULL;
    int rv = hr_xc_plan_new(&p, &x, &row, NULL, NULL, &m, NULL);
    if (rv == 0) {
      ok = 1;
      assert_true(n >= 3);
      hr_xc_plan_del(p);
    } else {
      assert_int_equal(rv, HR_ERR_NOMEM);
      assert_null(p);
    }
    assert_int_equal(f.live, 0);
  }
  assert_true(ok);
}

/* Distinct ranges from two threads at once. */
typedef struct xc_job {
  const hr_xc_plan *p;
  uint64_t b, n;
  uint8_t *out;
  int rv;
} xc_job;

static void *job_run(void *a) {
  xc_job *j = a;
  /* Small chunks, many calls: interleaves with the other thread. */
  for (uint64_t o = 0; o < j->n; o += 4093) {
    uint64_t l = j->n - o < 4093 ? j->n - o : 4093;
    int rv = hr_xc_run(j->p, j->b + o, l, j->out + j->b + o);
    if (rv)
      j->rv = rv;
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  xc_rng r = {g_seed ^ 0x7777};
  tcase t;
  memset(&t, 0, sizeof t);
  t.e = 4;
  hr_descriptor *d = &t.d;
  d->descriptor_version = 1;
  d->element_type = HR_ELEM_FLOAT32;
  d->rank = 2;
  d->shape[0] = 300;
  d->shape[1] = 257;
  d->layout.tag = HR_LAYOUT_ROW_MAJOR;
  t.size[0] = 300 * 257 * 4;
  t.buf[0] = xmalloc(t.size[0]);
  for (uint64_t j = 0; j < 300 * 257; j++)
    fill_elem(&r, t.buf[0] + j * 4, 4, 0);
  truth_from_dense(&t);
  t.tgt.layout = HR_LAYOUT_COLUMN_MAJOR;
  uint64_t n;
  uint8_t *exp = expect_dense(&t, &n);
  hr_xc_tensor src = tensor_of(&t);
  hr_xc_plan *p;
  assert_int_equal(hr_xc_plan_new(&p, &src, &t.tgt, NULL, NULL, NULL, NULL), 0);
  uint8_t *out = xmalloc(n);
  uint64_t half = n / 2 + 3; /* not element-aligned */
  xc_job j[2] = {{p, 0, half, out, 0}, {p, half, n - half, out, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, job_run, &j[i]), 0);
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_join(th[i], NULL), 0);
  assert_int_equal(j[0].rv, 0);
  assert_int_equal(j[1].rv, 0);
  assert_memory_equal(out, exp, n);
  free(out);
  free(exp);
  hr_xc_plan_del(p);
  tcase_free(&t);
}

int main(void) {
  const char *s = getenv("HR_XC_SEED");
  if (s && *s)
    g_seed = strtoull(s, NULL, 0) | 1;
  s = getenv("HR_XC_CASES");
  if (s && *s)
    g_scale = (unsigned)strtoul(s, NULL, 0);
  printf("# seed %llu\n", (unsigned long long)g_seed);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dense_errors),
      cmocka_unit_test(test_sparse_errors),
      cmocka_unit_test(test_huge_logical),
      cmocka_unit_test(test_scratch_limit),
      cmocka_unit_test(test_api_edges),
      cmocka_unit_test(test_failmalloc),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_bench_shapes),
      cmocka_unit_test(test_random_dense_sources),
      cmocka_unit_test(test_random_sparse_sources),
  };
  int rv = cmocka_run_group_tests(tests, NULL, NULL);
  printf("# sources:");
  for (int i = 0; i < 256; i++)
    if (g_stats.src[i])
      printf(" %s %u", hr_layout_name_local(i), g_stats.src[i]);
  printf("\n# targets:");
  for (int i = 0; i < 256; i++)
    if (g_stats.tgt[i])
      printf(" %s %u", hr_layout_name_local(i), g_stats.tgt[i]);
  printf("\n# executors: affine %u, generic %u, sparse %u; %u regions; "
         "%llu output bytes compared\n",
         g_stats.mode[0], g_stats.mode[1], g_stats.mode[2], g_stats.region,
         (unsigned long long)g_stats.bytes);
  return rv;
}
