/*
 * The inner kernels of the affine executor: strided row copies and the
 * cache-blocked 2-D transpose, specialised per element size.
 *
 * Every element move is a memcpy of a constant size, which compilers turn
 * into one load and one store without alignment assumptions.  On x86 the
 * transpose has SIMD micro-kernels (SSE2, always present on x86-64, and
 * AVX2 behind a run-time check made once per plan); other machines use
 * the portable blocked loops.
 */
#include <string.h>

#include "hr_xc_internal.h"

#if defined(__x86_64__)
#define XC_X86 1
#include <immintrin.h>
#endif

/* The edge of a cache block of the plain blocked transpose, in elements. */
#define XC_BLOCK 64

/* How many source rows a strip of macro-tiles sweeps before the next
 * strip starts (see XC_XPOSE_MACRO). */
#define XC_SWEEP 256

/* The macro driver prefetches each source row XC_PFD bytes ahead, into L2
 * only: the strip that uses them comes XC_SWEEP rows later, and the rows
 * alias in L1.  Row copies prefetch the next stretch of their row the same
 * way.  (Measured on Zen 5: L2 prefetches made the large transposes 1.5x
 * faster than L1 ones.) */
#define XC_PFD 128
#define XC_PF_L2 2

static inline uint64_t min_u64(uint64_t a, uint64_t b) {
  return a < b ? a : b;
}

/* A contiguous copy. */
static inline void copy_bytes(uint8_t *d, const uint8_t *s, uint64_t n) {
  memcpy(d, s, (size_t)n);
}

#define XC_GATHER_CASE(N)                                                      \
  case N:                                                                      \
    for (uint64_t j = 0; j < n; j++)                                           \
      memcpy(dst + j * N, src + (int64_t)j * si, N);                           \
    break

void hr__xc_gather(uint8_t *dst, const uint8_t *src, int64_t si, uint64_t n,
                   unsigned esize) {
  if (si == (int64_t)esize) {
    copy_bytes(dst, src, n * esize);
    return;
  }
  switch (esize) {
    XC_GATHER_CASE(1);
    XC_GATHER_CASE(2);
    XC_GATHER_CASE(4);
    XC_GATHER_CASE(8);
  default: /* 16 */
    for (uint64_t j = 0; j < n; j++)
      memcpy(dst + j * 16, src + (int64_t)j * si, 16);
    break;
  }
}

void hr__xc_rows(uint8_t *dst, uint64_t drow, const uint8_t *src, int64_t sp,
                 int64_t si, uint64_t np, uint64_t ni, uint64_t vp, int64_t vi0,
                 uint64_t vstep, unsigned esize) {
  for (uint64_t r = 0; r < np; r++) {
    uint8_t *d = dst + r * drow;
    uint64_t v = 0;
    if (r < vp && vi0 > 0) {
      uint64_t dec = r * vstep;
      if (dec < (uint64_t)vi0)
        v = min_u64((uint64_t)vi0 - dec, ni);
    }
    if (v) {
      const uint8_t *s = src + (int64_t)r * sp;
      if (si == (int64_t)esize) {
        /* The next stretch of this source row is often what the next
         * call reads (tiles side by side): ask for it early.  (Regular
         * stores beat non-temporal ones here: the output is sequential
         * and the hardware handles it.) */
        __builtin_prefetch((const void *)((uintptr_t)s + v * esize), 0,
                           XC_PF_L2);
        copy_bytes(d, s, v * esize);
      } else {
        hr__xc_gather(d, s, si, v, esize);
      }
    }
    if (v < ni)
      memset(d + v * esize, 0, (size_t)((ni - v) * esize));
  }
}

/* ------------------------------------------------------------------------ */
/* Portable blocked transpose                                               */
/* ------------------------------------------------------------------------ */

#define XC_XPOSE_PORTABLE(NAME, N)                                             \
  static void NAME(uint8_t *dst, uint64_t drow, const uint8_t *src,            \
                   int64_t sp, int64_t si, uint64_t vp, uint64_t vi) {         \
    for (uint64_t r0 = 0; r0 < vp; r0 += XC_BLOCK) {                           \
      uint64_t r1 = min_u64(r0 + XC_BLOCK, vp);                                \
      for (uint64_t c0 = 0; c0 < vi; c0 += XC_BLOCK) {                         \
        uint64_t c1 = min_u64(c0 + XC_BLOCK, vi);                              \
        for (uint64_t r = r0; r < r1; r++) {                                   \
          uint8_t *d = dst + r * drow;                                         \
          const uint8_t *s = src + (int64_t)r * sp;                            \
          for (uint64_t c = c0; c < c1; c++)                                   \
            memcpy(d + c * N, s + (int64_t)c * si, N);                         \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  }

XC_XPOSE_PORTABLE(xpose_p1, 1)
XC_XPOSE_PORTABLE(xpose_p2, 2)
XC_XPOSE_PORTABLE(xpose_p4, 4)
XC_XPOSE_PORTABLE(xpose_p8, 8)
XC_XPOSE_PORTABLE(xpose_p16, 16)

/* ------------------------------------------------------------------------ */
/* SIMD micro-kernels (x86)                                                 */
/* ------------------------------------------------------------------------ */

#ifdef XC_X86

/* Stores, regular or non-temporal (the line goes to memory without being
 * read first; the destination must then be aligned to the store size). */
static inline void st64(uint8_t *p, __m128i v, int nt) {
  if (nt)
    _mm_stream_si64((long long *)(void *)p, _mm_cvtsi128_si64(v));
  else
    _mm_storel_epi64((__m128i *)(void *)p, v);
}
static inline void st128(uint8_t *p, __m128i v, int nt) {
  if (nt)
    _mm_stream_si128((__m128i *)(void *)p, v);
  else
    _mm_storeu_si128((__m128i *)(void *)p, v);
}

/*
 * Each micro-kernel transposes an M x M tile whose source is contiguous
 * along the destination's rows: input vector c holds elements (0..M-1, c)
 * read at s + c * si; output row r, written at d + r * drow, holds
 * elements (r, 0..M-1).
 */

/* 1-byte elements, 8 x 8, SSE2. */
static inline void micro_b8_sse2(uint8_t *d, uint64_t drow, const uint8_t *s,
                                 int64_t si, int nt) {
  __m128i a0 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)s),
                                 _mm_loadl_epi64((const __m128i *)(s + si)));
  __m128i a1 =
      _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(s + 2 * si)),
                        _mm_loadl_epi64((const __m128i *)(s + 3 * si)));
  __m128i a2 =
      _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(s + 4 * si)),
                        _mm_loadl_epi64((const __m128i *)(s + 5 * si)));
  __m128i a3 =
      _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(s + 6 * si)),
                        _mm_loadl_epi64((const __m128i *)(s + 7 * si)));
  __m128i b0 = _mm_unpacklo_epi16(a0, a1);
  __m128i b1 = _mm_unpackhi_epi16(a0, a1);
  __m128i b2 = _mm_unpacklo_epi16(a2, a3);
  __m128i b3 = _mm_unpackhi_epi16(a2, a3);
  __m128i c0 = _mm_unpacklo_epi32(b0, b2);
  __m128i c1 = _mm_unpackhi_epi32(b0, b2);
  __m128i c2 = _mm_unpacklo_epi32(b1, b3);
  __m128i c3 = _mm_unpackhi_epi32(b1, b3);
  st64(d, c0, nt);
  st64((d + drow), _mm_unpackhi_epi64(c0, c0), nt);
  st64((d + 2 * drow), c1, nt);
  st64((d + 3 * drow), _mm_unpackhi_epi64(c1, c1), nt);
  st64((d + 4 * drow), c2, nt);
  st64((d + 5 * drow), _mm_unpackhi_epi64(c2, c2), nt);
  st64((d + 6 * drow), c3, nt);
  st64((d + 7 * drow), _mm_unpackhi_epi64(c3, c3), nt);
}

/* 2-byte elements, 8 x 8, SSE2. */
static inline void micro_w8_sse2(uint8_t *d, uint64_t drow, const uint8_t *s,
                                 int64_t si, int nt) {
#define LD(i) _mm_loadu_si128((const __m128i *)(s + (i)*si))
  __m128i A0 = LD(0), A1 = LD(1), A2 = LD(2), A3 = LD(3);
  __m128i A4 = LD(4), A5 = LD(5), A6 = LD(6), A7 = LD(7);
#undef LD
  __m128i a0 = _mm_unpacklo_epi16(A0, A1), a1 = _mm_unpackhi_epi16(A0, A1);
  __m128i a2 = _mm_unpacklo_epi16(A2, A3), a3 = _mm_unpackhi_epi16(A2, A3);
  __m128i a4 = _mm_unpacklo_epi16(A4, A5), a5 = _mm_unpackhi_epi16(A4, A5);
  __m128i a6 = _mm_unpacklo_epi16(A6, A7), a7 = _mm_unpackhi_epi16(A6, A7);
  __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
  __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
  __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
  __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
#define ST(i, v) st128(d + (i)*drow, v, nt)
  ST(0, _mm_unpacklo_epi64(b0, b4));
  ST(1, _mm_unpackhi_epi64(b0, b4));
  ST(2, _mm_unpacklo_epi64(b1, b5));
  ST(3, _mm_unpackhi_epi64(b1, b5));
  ST(4, _mm_unpacklo_epi64(b2, b6));
  ST(5, _mm_unpackhi_epi64(b2, b6));
  ST(6, _mm_unpacklo_epi64(b3, b7));
  ST(7, _mm_unpackhi_epi64(b3, b7));
#undef ST
}

/* 4-byte elements, 4 x 4, SSE2. */
static inline void micro_d4_sse2(uint8_t *d, uint64_t drow, const uint8_t *s,
                                 int64_t si, int nt) {
  __m128 r0 = _mm_castsi128_ps(_mm_loadu_si128((const __m128i *)s));
  __m128 r1 = _mm_castsi128_ps(_mm_loadu_si128((const __m128i *)(s + si)));
  __m128 r2 = _mm_castsi128_ps(_mm_loadu_si128((const __m128i *)(s + 2 * si)));
  __m128 r3 = _mm_castsi128_ps(_mm_loadu_si128((const __m128i *)(s + 3 * si)));
  __m128 t0 = _mm_unpacklo_ps(r0, r1), t1 = _mm_unpacklo_ps(r2, r3);
  __m128 t2 = _mm_unpackhi_ps(r0, r1), t3 = _mm_unpackhi_ps(r2, r3);
  st128(d, _mm_castps_si128(_mm_movelh_ps(t0, t1)), nt);
  st128(d + drow, _mm_castps_si128(_mm_movehl_ps(t1, t0)), nt);
  st128(d + 2 * drow, _mm_castps_si128(_mm_movelh_ps(t2, t3)), nt);
  st128(d + 3 * drow, _mm_castps_si128(_mm_movehl_ps(t3, t2)), nt);
}

/* 8-byte elements, 2 x 2, SSE2. */
static inline void micro_q2_sse2(uint8_t *d, uint64_t drow, const uint8_t *s,
                                 int64_t si, int nt) {
  __m128i a = _mm_loadu_si128((const __m128i *)s);
  __m128i b = _mm_loadu_si128((const __m128i *)(s + si));
  st128(d, _mm_unpacklo_epi64(a, b), nt);
  st128(d + drow, _mm_unpackhi_epi64(a, b), nt);
}

#define XC_AVX2 __attribute__((target("avx2")))

XC_AVX2 static inline void st256(uint8_t *p, __m256i v, int nt) {
  if (nt)
    _mm256_stream_si256((__m256i *)(void *)p, v);
  else
    _mm256_storeu_si256((__m256i *)(void *)p, v);
}

/* 4-byte elements, 8 x 8, AVX2. */
XC_AVX2 static inline void micro_d8_avx2(uint8_t *d, uint64_t drow,
                                         const uint8_t *s, int64_t si, int nt) {
#define LD(i)                                                                  \
  _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(s + (i)*si)))
  __m256 r0 = LD(0), r1 = LD(1), r2 = LD(2), r3 = LD(3);
  __m256 r4 = LD(4), r5 = LD(5), r6 = LD(6), r7 = LD(7);
#undef LD
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
#define ST(i, v) st256(d + (i)*drow, _mm256_castps_si256(v), nt)
  ST(0, _mm256_permute2f128_ps(u0, u4, 0x20));
  ST(1, _mm256_permute2f128_ps(u1, u5, 0x20));
  ST(2, _mm256_permute2f128_ps(u2, u6, 0x20));
  ST(3, _mm256_permute2f128_ps(u3, u7, 0x20));
  ST(4, _mm256_permute2f128_ps(u0, u4, 0x31));
  ST(5, _mm256_permute2f128_ps(u1, u5, 0x31));
  ST(6, _mm256_permute2f128_ps(u2, u6, 0x31));
  ST(7, _mm256_permute2f128_ps(u3, u7, 0x31));
#undef ST
}

/* 8-byte elements, 4 x 4, AVX2. */
XC_AVX2 static inline void micro_q4_avx2(uint8_t *d, uint64_t drow,
                                         const uint8_t *s, int64_t si, int nt) {
#define LD(i)                                                                  \
  _mm256_castsi256_pd(_mm256_loadu_si256((const __m256i *)(s + (i)*si)))
  __m256d r0 = LD(0), r1 = LD(1), r2 = LD(2), r3 = LD(3);
#undef LD
  __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);
  __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
#define ST(i, v) st256(d + (i)*drow, _mm256_castpd_si256(v), nt)
  ST(0, _mm256_permute2f128_pd(t0, t2, 0x20));
  ST(1, _mm256_permute2f128_pd(t1, t3, 0x20));
  ST(2, _mm256_permute2f128_pd(t0, t2, 0x31));
  ST(3, _mm256_permute2f128_pd(t1, t3, 0x31));
#undef ST
}

/* 2-byte elements, 8 rows x 16 columns, AVX2: the SSE2 8 x 8 network
 * on two lanes at once (lane 0 takes inputs 0..7, lane 1 inputs 8..15),
 * so that each output row is one 32-byte store. */
XC_AVX2 static inline void micro_w816_avx2(uint8_t *d, uint64_t drow,
                                           const uint8_t *s, int64_t si,
                                           int nt) {
#define LD(i)                                                                  \
  _mm256_inserti128_si256(                                                     \
      _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(s + (i)*si))),  \
      _mm_loadu_si128((const __m128i *)(s + ((i) + 8) * si)), 1)
  __m256i A0 = LD(0), A1 = LD(1), A2 = LD(2), A3 = LD(3);
  __m256i A4 = LD(4), A5 = LD(5), A6 = LD(6), A7 = LD(7);
#undef LD
  __m256i a0 = _mm256_unpacklo_epi16(A0, A1);
  __m256i a1 = _mm256_unpackhi_epi16(A0, A1);
  __m256i a2 = _mm256_unpacklo_epi16(A2, A3);
  __m256i a3 = _mm256_unpackhi_epi16(A2, A3);
  __m256i a4 = _mm256_unpacklo_epi16(A4, A5);
  __m256i a5 = _mm256_unpackhi_epi16(A4, A5);
  __m256i a6 = _mm256_unpacklo_epi16(A6, A7);
  __m256i a7 = _mm256_unpackhi_epi16(A6, A7);
  __m256i b0 = _mm256_unpacklo_epi32(a0, a2);
  __m256i b1 = _mm256_unpackhi_epi32(a0, a2);
  __m256i b2 = _mm256_unpacklo_epi32(a1, a3);
  __m256i b3 = _mm256_unpackhi_epi32(a1, a3);
  __m256i b4 = _mm256_unpacklo_epi32(a4, a6);
  __m256i b5 = _mm256_unpackhi_epi32(a4, a6);
  __m256i b6 = _mm256_unpacklo_epi32(a5, a7);
  __m256i b7 = _mm256_unpackhi_epi32(a5, a7);
  st256(d, _mm256_unpacklo_epi64(b0, b4), nt);
  st256(d + drow, _mm256_unpackhi_epi64(b0, b4), nt);
  st256(d + 2 * drow, _mm256_unpacklo_epi64(b1, b5), nt);
  st256(d + 3 * drow, _mm256_unpackhi_epi64(b1, b5), nt);
  st256(d + 4 * drow, _mm256_unpacklo_epi64(b2, b6), nt);
  st256(d + 5 * drow, _mm256_unpackhi_epi64(b2, b6), nt);
  st256(d + 6 * drow, _mm256_unpacklo_epi64(b3, b7), nt);
  st256(d + 7 * drow, _mm256_unpackhi_epi64(b3, b7), nt);
}

/*
 * The SIMD drivers.  The source must be contiguous along the destination
 * rows (sp == N).
 *
 * XC_XPOSE_SIMD: M x M micro-tiles inside cache blocks of XC_BLOCK x
 * XC_BLOCK, scalar edges.  Used for narrow planes (a PANEL's mr rows) and
 * for the strips the macro driver leaves.
 *
 * XC_XPOSE_MACRO: for large planes.  A macro-tile is Q x Q elements with
 * Q * N = 64 bytes: Q whole source lines are first copied into a small
 * contiguous buffer (power-of-two row strides map every row of a block to
 * the same cache sets, which defeats plain blocking; the buffer does not
 * alias), and each row is prefetched ahead for the following strips;
 * the micro-kernels then write Q whole destination lines, with
 * non-temporal stores when `nt` (the caller checked 64-byte alignment).
 * Strips of Q destination rows sweep XC_SWEEP source rows, then the next
 * strip takes the following lines of the same rows.  The right and bottom
 * strips go to EDGE.
 */
#define XC_XPOSE_SIMD(NAME, N, M, MICRO, ATTR)                                 \
  ATTR static void NAME(uint8_t *dst, uint64_t drow, const uint8_t *src,       \
                        int64_t si, uint64_t vp, uint64_t vi, int nt) {        \
    for (uint64_t r0 = 0; r0 < vp; r0 += XC_BLOCK) {                           \
      uint64_t r1 = min_u64(r0 + XC_BLOCK, vp);                                \
      for (uint64_t c0 = 0; c0 < vi; c0 += XC_BLOCK) {                         \
        uint64_t c1 = min_u64(c0 + XC_BLOCK, vi);                              \
        uint64_t r = r0;                                                       \
        for (; r + M <= r1; r += M) {                                          \
          uint64_t c = c0;                                                     \
          for (; c + M <= c1; c += M)                                          \
            MICRO(dst + r * drow + c * N, drow, src + (int64_t)c * si + r * N, \
                  si, nt);                                                     \
          for (; c < c1; c++)                                                  \
            for (uint64_t q = r; q < r + M; q++)                               \
              memcpy(dst + q * drow + c * N, src + (int64_t)c * si + q * N,    \
                     N);                                                       \
        }                                                                      \
        for (; r < r1; r++)                                                    \
          for (uint64_t c = c0; c < c1; c++)                                   \
            memcpy(dst + r * drow + c * N, src + (int64_t)c * si + r * N, N);  \
      }                                                                        \
    }                                                                          \
  }

#define XC_XPOSE_MACRO(NAME, N, MR, MC, MICRO, ATTR, EDGE)                     \
  ATTR static void NAME(uint8_t *dst, uint64_t drow, const uint8_t *src,       \
                        int64_t si, uint64_t vp, uint64_t vi, int nt) {        \
    enum { Q = 64 / N };                                                       \
    _Alignas(64) uint8_t in[Q * 64];                                           \
    _Alignas(64) uint8_t out[Q * 64];                                          \
    const uint64_t vpq = vp - vp % Q, viq = vi - vi % Q;                       \
    for (uint64_t c0 = 0; c0 < viq; c0 += XC_SWEEP) {                          \
      uint64_t c1 = min_u64(c0 + XC_SWEEP, viq);                               \
      for (uint64_t r = 0; r < vpq; r += Q) {                                  \
        for (uint64_t c = c0; c < c1; c += Q) {                                \
          const uint8_t *s = src + (int64_t)c * si + r * N;                    \
          uint8_t *d = dst + r * drow + c * N;                                 \
          for (int j = 0; j < Q; j++) {                                        \
            memcpy(in + 64 * j, s + (int64_t)j * si, 64);                      \
            __builtin_prefetch(                                                \
                (const void *)((uintptr_t)(s + (int64_t)j * si) + XC_PFD), 0,  \
                XC_PF_L2);                                                     \
          }                                                                    \
          if (nt) {                                                            \
            for (int rr = 0; rr < Q; rr += MR)                                 \
              for (int cc = 0; cc < Q; cc += MC)                               \
                MICRO(d + rr * drow + cc * N, drow, in + 64 * cc + rr * N, 64, \
                      1);                                                      \
          } else {                                                             \
            /* Through the cache: whole lines at once, so that no line is      \
             * evicted half written (the rows alias in L1 too). */             \
            for (int rr = 0; rr < Q; rr += MR)                                 \
              for (int cc = 0; cc < Q; cc += MC)                               \
                MICRO(out + 64 * rr + cc * N, 64, in + 64 * cc + rr * N, 64,   \
                      0);                                                      \
            for (int j = 0; j < Q; j++)                                        \
              memcpy(d + j * drow, out + 64 * j, 64);                          \
          }                                                                    \
        }                                                                      \
      }                                                                        \
    }                                                                          \
    if (viq < vi && vpq)                                                       \
      EDGE(dst + viq * N, drow, src + (int64_t)viq * si, si, vpq, vi - viq,    \
           nt);                                                                \
    if (vpq < vp)                                                              \
      EDGE(dst + vpq * drow, drow, src + vpq * N, si, vp - vpq, vi, nt);       \
  }

#define XC_NOATTR
XC_XPOSE_SIMD(xpose_b8_sse2, 1, 8, micro_b8_sse2, XC_NOATTR)
XC_XPOSE_SIMD(xpose_w8_sse2, 2, 8, micro_w8_sse2, XC_NOATTR)
XC_XPOSE_SIMD(xpose_d4_sse2, 4, 4, micro_d4_sse2, XC_NOATTR)
XC_XPOSE_SIMD(xpose_q2_sse2, 8, 2, micro_q2_sse2, XC_NOATTR)
XC_XPOSE_SIMD(xpose_d8_avx2, 4, 8, micro_d8_avx2, XC_AVX2)
XC_XPOSE_SIMD(xpose_q4_avx2, 8, 4, micro_q4_avx2, XC_AVX2)
XC_XPOSE_MACRO(xpose_b_sse2, 1, 8, 8, micro_b8_sse2, XC_NOATTR, xpose_b8_sse2)
XC_XPOSE_MACRO(xpose_w_sse2, 2, 8, 8, micro_w8_sse2, XC_NOATTR, xpose_w8_sse2)
XC_XPOSE_MACRO(xpose_d_sse2, 4, 4, 4, micro_d4_sse2, XC_NOATTR, xpose_d4_sse2)
XC_XPOSE_MACRO(xpose_q_sse2, 8, 2, 2, micro_q2_sse2, XC_NOATTR, xpose_q2_sse2)
XC_XPOSE_MACRO(xpose_w_avx2, 2, 8, 16, micro_w816_avx2, XC_AVX2, xpose_w8_sse2)
XC_XPOSE_MACRO(xpose_d_avx2, 4, 8, 8, micro_d8_avx2, XC_AVX2, xpose_d8_avx2)
XC_XPOSE_MACRO(xpose_q_avx2, 8, 4, 4, micro_q4_avx2, XC_AVX2, xpose_q4_avx2)

#endif /* XC_X86 */

/* Transposes the valid vp x vi block. */
static void xpose_valid(uint8_t *dst, uint64_t drow, const uint8_t *src,
                        int64_t sp, int64_t si, uint64_t vp, uint64_t vi,
                        unsigned esize, int isa, int nt_ok) {
#ifdef XC_X86
  if (isa >= XC_ISA_SSE2 && sp == (int64_t)esize) {
    const int avx2 = isa >= XC_ISA_AVX2;
    /* Non-temporal stores need destinations aligned to the stores of the
     * micro-kernel (M elements); 64-byte rows keep whole lines. */
    const uint64_t w = esize == 1 ? 8 : avx2 ? 32 : 16;
    nt_ok = nt_ok && ((uintptr_t)dst | drow) % w == 0;
    switch (esize) {
    case 1: xpose_b_sse2(dst, drow, src, si, vp, vi, nt_ok); return;
    case 2:
      (avx2 ? xpose_w_avx2 : xpose_w_sse2)(dst, drow, src, si, vp, vi, nt_ok);
      return;
    case 4:
      (avx2 ? xpose_d_avx2 : xpose_d_sse2)(dst, drow, src, si, vp, vi, nt_ok);
      return;
    case 8:
      (avx2 ? xpose_q_avx2 : xpose_q_sse2)(dst, drow, src, si, vp, vi, nt_ok);
      return;
    default: break;
    }
  }
#else
  (void)isa;
  (void)nt_ok;
#endif
  switch (esize) {
  case 1: xpose_p1(dst, drow, src, sp, si, vp, vi); break;
  case 2: xpose_p2(dst, drow, src, sp, si, vp, vi); break;
  case 4: xpose_p4(dst, drow, src, sp, si, vp, vi); break;
  case 8: xpose_p8(dst, drow, src, sp, si, vp, vi); break;
  default: xpose_p16(dst, drow, src, sp, si, vp, vi); break;
  }
}

void hr__xc_fence(void) {
#ifdef XC_X86
  _mm_sfence();
#endif
}

void hr__xc_xpose(uint8_t *dst, uint64_t drow, const uint8_t *src, int64_t sp,
                  int64_t si, uint64_t np, uint64_t ni, uint64_t vp,
                  uint64_t vi, unsigned esize, int isa, int nt) {
  vp = min_u64(vp, np);
  vi = min_u64(vi, ni);
  if (vp && vi)
    xpose_valid(dst, drow, src, sp, si, vp, vi, esize, isa, nt);
  if (vi < ni)
    for (uint64_t r = 0; r < vp; r++)
      memset(dst + r * drow + vi * esize, 0, (size_t)((ni - vi) * esize));
  for (uint64_t r = vp; r < np; r++)
    memset(dst + r * drow, 0, (size_t)(ni * esize));
}
