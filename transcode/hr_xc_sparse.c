/*
 * Sparse layouts: indexing a sparse source (validation, then the target
 * offsets of its elements inside the region, sorted), and writing sparse
 * targets from a dense producer in row- or column-major order.
 */
#include <string.h>

#include "hr_xc_internal.h"

static int bad(hr_wire_status *st, const char *why) {
  return hr__wire_fail(st, HR_WIRE_INVALID_DESCRIPTOR, 0, why);
}

/* The source's sparse geometry and buffers. */
typedef struct xc_sparse_src {
  uint8_t tag;
  unsigned rank;
  const uint64_t *shape;
  int is64;
  uint64_t nnz;        /* entries (COO/CSR/CSC) or blocks (BSR) */
  uint64_t br, bc;     /* BSR block shape (1 x 1 otherwise) */
  uint64_t nptr;       /* indptr entries (CSR/CSC/BSR) */
  const uint8_t *ptr;  /* indptr */
  const uint8_t *idx;  /* indices */
  const uint8_t *vals; /* values */
} xc_sparse_src;

/* Checks buffer sizes; fills `s`. */
static int sparse_geometry(xc_sparse_src *s, const hr_xc_tensor *src,
                           unsigned esize, hr_wire_status *st) {
  const hr_descriptor *d = src->desc;
  const hr_layout_params *pr = &d->params;
  uint64_t need[3] = {0, 0, 0}, isz, t;
  memset(s, 0, sizeof *s);
  s->tag = d->layout.tag;
  s->rank = d->rank;
  s->shape = d->shape;
  s->nnz = pr->nnz;
  s->br = s->bc = 1;
  if (pr->index_type == HR_ELEM_INT64)
    s->is64 = 1;
  else if (pr->index_type != HR_ELEM_INT32)
    return bad(st, "transcode: sparse index_type is not INT32 or INT64");
  isz = s->is64 ? 8 : 4;
  if (s->tag == HR_LAYOUT_SPARSE_COO) {
    if (s->rank < 1)
      return bad(st, "transcode: SPARSE_COO needs rank >= 1");
    if (!hr__mul_u64(s->nnz, s->rank * isz, &need[0]) ||
        !hr__mul_u64(s->nnz, esize, &need[1]))
      return bad(st, "transcode: sparse buffer size overflows");
    for (int b = 0; b < 2; b++) {
      if (need[b] > src->sizes[b])
        return bad(st, "transcode: sparse buffer shorter than its counts");
      if (need[b] && !src->buffers[b])
        return HR_ERR_INVALID_ARGUMENT;
    }
    s->idx = src->buffers[0];
    s->vals = src->buffers[1];
    return 0;
  }
  if (s->rank != 2)
    return bad(st, "transcode: CSR/CSC/BSR need rank 2");
  uint64_t outer = s->tag == HR_LAYOUT_SPARSE_CSC ? s->shape[1] : s->shape[0];
  if (s->tag == HR_LAYOUT_SPARSE_BSR) {
    s->br = pr->br;
    s->bc = pr->bc;
    if (!s->br || !s->bc || s->shape[0] % s->br || s->shape[1] % s->bc)
      return bad(st, "transcode: BSR shape is not a multiple of the block");
    outer = s->shape[0] / s->br;
  }
  if (!hr__add_u64(outer, 1, &s->nptr) ||
      !hr__mul_u64(s->nptr, isz, &need[0]) ||
      !hr__mul_u64(s->nnz, isz, &need[1]) || !hr__mul_u64(s->nnz, s->br, &t) ||
      !hr__mul_u64(t, s->bc, &t) || !hr__mul_u64(t, esize, &need[2]))
    return bad(st, "transcode: sparse buffer size overflows");
  for (int b = 0; b < 3; b++) {
    if (need[b] > src->sizes[b])
      return bad(st, "transcode: sparse buffer shorter than its counts");
    if (need[b] && !src->buffers[b])
      return HR_ERR_INVALID_ARGUMENT;
  }
  s->ptr = src->buffers[0];
  s->idx = src->buffers[1];
  s->vals = src->buffers[2];
  return 0;
}

/* Checks indptr: starts at 0, never decreases, ends at nnz. */
static int check_indptr(const xc_sparse_src *s, hr_wire_status *st) {
  int64_t prev = hr__xc_get_idx(s->ptr, 0, s->is64);
  if (prev != 0)
    return bad(st, "transcode: indptr does not start at 0");
  for (uint64_t i = 1; i < s->nptr; i++) {
    int64_t v = hr__xc_get_idx(s->ptr, i, s->is64);
    if (v < prev)
      return bad(st, "transcode: indptr decreases");
    prev = v;
  }
  if ((uint64_t)prev != s->nnz)
    return bad(st, "transcode: indptr does not end at nnz");
  return 0;
}

/* The intersection of [a, a + n) with the region's [o, o + R), as a start
 * and a count. */
static uint64_t clip(uint64_t a, uint64_t n, uint64_t o, uint64_t R,
                     uint64_t *lo) {
  uint64_t b = a + n, hi = o + R;
  *lo = a > o ? a : o;
  if (b < hi)
    hi = b;
  return hi > *lo ? hi - *lo : 0;
}

/*
 * Walks every stored element: validates indices (and the COO order when
 * `sorted`), and for those inside the region either counts them (ent
 * NULL) or records them.  Returns 0 or HR_ERR_PROTO.
 */
static int walk(const xc_sparse_src *s, const xc_core *c, const uint64_t *roff,
                xc_entry *ent, uint64_t *count, int sorted,
                hr_wire_status *st) {
  const uint64_t *S = s->shape, *R = c->rshape;
  uint64_t n = 0, loc[HR_MAX_RANK];
  if (s->tag == HR_LAYOUT_SPARSE_COO) {
    uint64_t prev[HR_MAX_RANK], cur[HR_MAX_RANK];
    for (uint64_t j = 0; j < s->nnz; j++) {
      int in = 1, cmp = 0;
      for (unsigned k = 0; k < s->rank; k++) {
        int64_t v = hr__xc_get_idx(s->idx, j * s->rank + k, s->is64);
        if (v < 0 || (uint64_t)v >= S[k])
          return bad(st, "transcode: sparse index out of range");
        cur[k] = (uint64_t)v;
        if (cmp == 0 && j > 0)
          cmp = cur[k] < prev[k] ? -1 : cur[k] > prev[k];
        if (cur[k] < roff[k] || cur[k] - roff[k] >= R[k])
          in = 0;
        loc[k] = cur[k] - roff[k];
      }
      if (sorted && j > 0 && cmp <= 0)
        return bad(st, "transcode: sorted COO indices not strictly "
                       "increasing");
      memcpy(prev, cur, s->rank * sizeof *cur);
      if (in) {
        if (ent) {
          ent[n].key = hr__xc_core_key(c, loc);
          ent[n].vidx = j;
        }
        n++;
      }
    }
    *count = n;
    return 0;
  }
  int rv = check_indptr(s, st);
  if (rv)
    return rv;
  /* CSR: outer = row, inner = column; CSC the other way round; BSR:
   * block rows and block columns. */
  const unsigned ko = s->tag == HR_LAYOUT_SPARSE_CSC ? 1 : 0, ki = 1 - ko;
  const uint64_t bo = s->tag == HR_LAYOUT_SPARSE_BSR ? s->br : 1;
  const uint64_t bi = s->tag == HR_LAYOUT_SPARSE_BSR ? s->bc : 1;
  const uint64_t inner_n = S[ki] / bi;
  for (uint64_t o = 0; o + 1 < s->nptr; o++) {
    uint64_t j0 = (uint64_t)hr__xc_get_idx(s->ptr, o, s->is64);
    uint64_t j1 = (uint64_t)hr__xc_get_idx(s->ptr, o + 1, s->is64);
    uint64_t olo, ocnt = clip(o * bo, bo, roff[ko], R[ko], &olo);
    for (uint64_t j = j0; j < j1; j++) {
      int64_t v = hr__xc_get_idx(s->idx, j, s->is64);
      if (v < 0 || (uint64_t)v >= inner_n)
        return bad(st, "transcode: sparse index out of range");
      uint64_t ilo, icnt = clip((uint64_t)v * bi, bi, roff[ki], R[ki], &ilo);
      if (!ocnt || !icnt)
        continue;
      if (!ent) {
        n += ocnt * icnt;
        continue;
      }
      for (uint64_t a = olo; a < olo + ocnt; a++) {
        for (uint64_t b = ilo; b < ilo + icnt; b++) {
          loc[ko] = a - roff[ko];
          loc[ki] = b - roff[ki];
          ent[n].key = hr__xc_core_key(c, loc);
          ent[n].vidx = (j * bo + (a - o * bo)) * bi + (b - (uint64_t)v * bi);
          n++;
        }
      }
    }
  }
  *count = n;
  return 0;
}

/* Sorts entries by key (LSD radix, 8 bits a pass, passes over constant
 * digits skipped).  `tmp` has room for n entries.  Returns the array that
 * holds the result (a or tmp). */
static xc_entry *radix_sort(xc_entry *a, xc_entry *tmp, uint64_t n,
                            uint64_t max_key) {
  for (unsigned shift = 0; shift < 64 && (max_key >> shift); shift += 8) {
    uint64_t cnt[256] = {0};
    for (uint64_t i = 0; i < n; i++)
      cnt[(a[i].key >> shift) & 255]++;
    if (cnt[(a[0].key >> shift) & 255] == n)
      continue;
    uint64_t sum = 0;
    for (int b = 0; b < 256; b++) {
      uint64_t t = cnt[b];
      cnt[b] = sum;
      sum += t;
    }
    for (uint64_t i = 0; i < n; i++)
      tmp[cnt[(a[i].key >> shift) & 255]++] = a[i];
    xc_entry *sw = a;
    a = tmp;
    tmp = sw;
  }
  return a;
}

int hr__xc_sparse_index(xc_core *c, const hr_xc_tensor *src,
                        const uint64_t *roff, const hr_mem *mem,
                        uint64_t max_scratch, uint64_t *scratch,
                        hr_wire_status *st) {
  xc_sparse_src s;
  uint64_t n = 0, bytes;
  int sorted =
      src->desc->layout.tag == HR_LAYOUT_SPARSE_COO && src->desc->params.sorted;
  int rv = sparse_geometry(&s, src, c->esize, st);
  if (rv)
    return rv;
  c->vals = s.vals;
  rv = walk(&s, c, roff, NULL, &n, sorted, st);
  if (rv || n == 0)
    return rv;
  /* The index and, while sorting, a second array of the same size. */
  if (!hr__mul_u64(n, 2 * sizeof(xc_entry), &bytes) ||
      (max_scratch && bytes > max_scratch) || bytes > SIZE_MAX)
    return HR_ERR_LIMIT;
  c->ent = hr__mem_malloc(mem, (size_t)(n * sizeof(xc_entry)));
  if (!c->ent)
    return HR_ERR_NOMEM;
  rv = walk(&s, c, roff, c->ent, &c->nent, 0, st);
  if (rv)
    return rv;
  *scratch = n * sizeof(xc_entry);

  int in_order = 1;
  for (uint64_t i = 1; i < n && in_order; i++)
    in_order = c->ent[i - 1].key <= c->ent[i].key;
  if (!in_order) {
    xc_entry *tmp = hr__mem_malloc(mem, (size_t)(n * sizeof(xc_entry)));
    if (!tmp)
      return HR_ERR_NOMEM;
    xc_entry *res = radix_sort(c->ent, tmp, n, c->out_elems - 1);
    hr__mem_free(mem, res == tmp ? c->ent : tmp);
    c->ent = res;
  }
  for (uint64_t i = 1; i < n; i++)
    if (c->ent[i - 1].key == c->ent[i].key)
      return hr__wire_fail(st, HR_WIRE_TRANSCODE_FAILED, 0,
                           "transcode: repeated coordinate in a sparse "
                           "tensor");
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Sparse targets                                                           */
/* ------------------------------------------------------------------------ */

/* Bytes of the stack chunk the dense producer fills while scanning. */
#define XC_CHUNK 16384

static inline int nonzero(const uint8_t *p, unsigned e) {
  uint64_t a = 0, b = 0;
  switch (e) {
  case 1: return p[0] != 0;
  case 2: {
    uint16_t v;
    memcpy(&v, p, 2);
    return v != 0;
  }
  case 4: {
    uint32_t v;
    memcpy(&v, p, 4);
    return v != 0;
  }
  case 8: memcpy(&a, p, 8); return a != 0;
  default:
    memcpy(&a, p, 8);
    memcpy(&b, p + 8, 8);
    return (a | b) != 0;
  }
}

uint64_t hr__xc_count_nonzero(const xc_core *c) {
  _Alignas(64) uint8_t buf[XC_CHUNK];
  const unsigned e = c->esize;
  const uint64_t per = XC_CHUNK / e;
  uint64_t nnz = 0;
  for (uint64_t ea = 0; ea < c->out_elems; ea += per) {
    uint64_t eb = c->out_elems - ea < per ? c->out_elems : ea + per;
    hr__xc_core_run(c, ea, eb, buf);
    for (uint64_t j = 0; j < eb - ea; j++)
      nnz += (uint64_t)nonzero(buf + j * e, e);
  }
  return nnz;
}

void hr__xc_fill_sparse(const xc_core *c, uint8_t layout, int is64,
                        void *const *bufs) {
  _Alignas(64) uint8_t buf[XC_CHUNK];
  const unsigned e = c->esize;
  const uint64_t per = XC_CHUNK / e;
  uint64_t n = 0;
  if (layout == HR_LAYOUT_SPARSE_COO) {
    uint8_t *idx = bufs[0], *vals = bufs[1];
    uint64_t x[HR_MAX_RANK] = {0};
    const unsigned r = c->rank;
    for (uint64_t ea = 0; ea < c->out_elems; ea += per) {
      uint64_t eb = c->out_elems - ea < per ? c->out_elems : ea + per;
      hr__xc_core_run(c, ea, eb, buf);
      for (uint64_t j = 0; j < eb - ea; j++) {
        if (nonzero(buf + j * e, e)) {
          for (unsigned k = 0; k < r; k++)
            hr__xc_put_idx(idx, n * r + k, is64, x[k]);
          memcpy(vals + n * e, buf + j * e, e);
          n++;
        }
        for (unsigned k = r; k-- > 0;) {
          if (++x[k] < c->rshape[k])
            break;
          x[k] = 0;
        }
      }
    }
    return;
  }
  /* CSR scans row-major (outer = rows), CSC column-major (outer =
   * columns): the same compressed walk. */
  uint8_t *ptr = bufs[0], *idx = bufs[1], *vals = bufs[2];
  const unsigned ko = layout == HR_LAYOUT_SPARSE_CSC ? 1 : 0;
  const uint64_t nout = c->rshape[ko], nin = c->rshape[1 - ko];
  uint64_t o = 0, i = 0;
  hr__xc_put_idx(ptr, 0, is64, 0);
  for (uint64_t ea = 0; ea < c->out_elems; ea += per) {
    uint64_t eb = c->out_elems - ea < per ? c->out_elems : ea + per;
    hr__xc_core_run(c, ea, eb, buf);
    for (uint64_t j = 0; j < eb - ea; j++) {
      if (nonzero(buf + j * e, e)) {
        hr__xc_put_idx(idx, n, is64, i);
        memcpy(vals + n * e, buf + j * e, e);
        n++;
      }
      if (++i == nin) {
        i = 0;
        hr__xc_put_idx(ptr, ++o, is64, n);
      }
    }
  }
  /* With no element at all (a zero extent) every pointer is 0. */
  while (o < nout)
    hr__xc_put_idx(ptr, ++o, is64, n);
}
