/*
 * A slow, index-by-index reference for the transcoding tests, written
 * straight from the layout definitions of wire-v1 § 5 and § 5.1 and
 * sharing no code with transcode/.  Also the random tensor generator.
 */
#ifndef XC_REF_H
#define XC_REF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hurray/transcode.h>

/* xorshift64*: deterministic, seedable. */
typedef struct xc_rng {
  uint64_t s;
} xc_rng;

static inline uint64_t xc_rand(xc_rng *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1DULL;
}
/* Uniform in [0, n); 0 when n is 0. */
static inline uint64_t xc_rn(xc_rng *r, uint64_t n) {
  return n ? xc_rand(r) % n : 0;
}
/* Uniform in [a, b]. */
static inline uint64_t xc_rr(xc_rng *r, uint64_t a, uint64_t b) {
  return a + xc_rn(r, b - a + 1);
}

static inline uint64_t xc_ceil(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

static inline uint64_t xc_prod(const uint64_t *s, unsigned r) {
  uint64_t p = 1;
  for (unsigned k = 0; k < r; k++)
    p *= s[k];
  return p;
}

/* Row-major linear index of `i` in shape `s`. */
static inline uint64_t xc_lin(const uint64_t *s, unsigned r,
                              const uint64_t *i) {
  uint64_t l = 0;
  for (unsigned k = 0; k < r; k++)
    l = l * s[k] + i[k];
  return l;
}

/* Advances a row-major odometer; returns 0 after the last index. */
static inline int xc_next(const uint64_t *s, unsigned r, uint64_t *i) {
  for (unsigned k = r; k-- > 0;) {
    if (++i[k] < s[k])
      return 1;
    i[k] = 0;
  }
  return 0;
}

/*
 * Element offset of logical index `i` in a dense layout over shape `s`
 * (ROW_MAJOR, COLUMN_MAJOR, PERMUTED, TILED, PANEL; STRIDED from its
 * origin and strides).
 */
static inline uint64_t xc_ref_off(uint8_t tag, const hr_layout_params *p,
                                  const uint64_t *s, unsigned r,
                                  const uint64_t *i) {
  uint64_t l = 0;
  switch (tag) {
  case HR_LAYOUT_ROW_MAJOR: return xc_lin(s, r, i);
  case HR_LAYOUT_COLUMN_MAJOR:
    for (unsigned k = r; k-- > 0;)
      l = l * s[k] + i[k];
    return l;
  case HR_LAYOUT_PERMUTED:
    for (unsigned j = 0; j < r; j++)
      l = l * s[p->order[j]] + i[p->order[j]];
    return l;
  case HR_LAYOUT_STRIDED: {
    int64_t o = (int64_t)p->origin;
    for (unsigned k = 0; k < r; k++)
      o += p->strides[k] * (int64_t)i[k];
    return (uint64_t)o;
  }
  case HR_LAYOUT_TILED: {
    /* Tiles row-major over the tile grid, elements row-major inside. */
    uint64_t tl = 0, il = 0, vol = 1;
    for (unsigned k = 0; k < r; k++) {
      uint64_t T = p->tile[k];
      tl = tl * xc_ceil(s[k], T) + i[k] / T;
      il = il * T + i[k] % T;
      vol *= T;
    }
    return tl * vol + il;
  }
  case HR_LAYOUT_PANEL: {
    /* Panels of mr rows in order; inside, column after column, each
     * column's mr elements contiguous. */
    uint64_t mr = p->mr;
    return i[0] / mr * mr * s[1] + i[1] * mr + i[0] % mr;
  }
  default: abort();
  }
}

/* Element count of a dense layout's buffer (padding included). */
static inline uint64_t xc_ref_elems(uint8_t tag, const hr_layout_params *p,
                                    const uint64_t *s, unsigned r) {
  uint64_t n = 1;
  switch (tag) {
  case HR_LAYOUT_TILED:
    for (unsigned k = 0; k < r; k++)
      n *= xc_ceil(s[k], p->tile[k]) * p->tile[k];
    return n;
  case HR_LAYOUT_PANEL: return xc_ceil(s[0], p->mr) * p->mr * s[1];
  default: return xc_prod(s, r);
  }
}

/* Maps an element size to an element type of that size. */
static inline uint8_t xc_elem_for(unsigned e) {
  switch (e) {
  case 1: return HR_ELEM_UINT8;
  case 2: return HR_ELEM_BFLOAT16;
  case 4: return HR_ELEM_FLOAT32;
  case 8: return HR_ELEM_FLOAT64;
  default: return HR_ELEM_COMPLEX128;
  }
}

static inline int xc_nonzero(const uint8_t *p, unsigned e) {
  for (unsigned j = 0; j < e; j++)
    if (p[j])
      return 1;
  return 0;
}

static inline void xc_put_idx(uint8_t *b, uint64_t j, int is64, uint64_t v) {
  unsigned n = is64 ? 8 : 4;
  for (unsigned i = 0; i < n; i++)
    b[j * n + i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t xc_get_idx(const uint8_t *b, uint64_t j, int is64) {
  unsigned n = is64 ? 8 : 4;
  uint64_t v = 0;
  for (unsigned i = n; i-- > 0;)
    v = v << 8 | b[j * n + i];
  return v;
}

#endif /* XC_REF_H */
