/* Shared helpers of the engine-core tests: a counting, failing allocator
 * and small descriptor utilities. */
#ifndef HR_TEST_ENGINE_CORE_UTIL_H
#define HR_TEST_ENGINE_CORE_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hurray/common.h>
#include <hurray/wire.h>

/* An hr_mem that fails every allocation from the `fail_at`-th on (0-based;
 * -1: never) and counts live blocks, so tests can check for leaks without
 * a sanitizer too.  Blocks carry a 16-byte header holding their size. */
typedef struct hr_test_failmem {
  hr_mem mem;
  long fail_at; /* index of the first failing allocation, -1: none */
  long count;   /* allocations attempted so far */
  long live;    /* blocks currently allocated */
  int failed;   /* an allocation was refused */
} hr_test_failmem;

static inline int hr_test_failmem_take(hr_test_failmem *f) {
  long i = f->count++;
  if (f->fail_at >= 0 && i >= f->fail_at) {
    f->failed = 1;
    return 0;
  }
  return 1;
}

static inline void *hr_test_fm_malloc(size_t n, void *ud) {
  hr_test_failmem *f = ud;
  if (!hr_test_failmem_take(f))
    return NULL;
  unsigned char *p = malloc(n + 16);
  if (!p)
    return NULL;
  memcpy(p, &n, sizeof n);
  f->live++;
  return p + 16;
}

static inline void hr_test_fm_free(void *p, void *ud) {
  hr_test_failmem *f = ud;
  if (!p)
    return;
  f->live--;
  free((unsigned char *)p - 16);
}

static inline void *hr_test_fm_calloc(size_t m, size_t n, void *ud) {
  if (n && m > SIZE_MAX / n)
    return NULL;
  void *p = hr_test_fm_malloc(m * n, ud);
  if (p)
    memset(p, 0, m * n);
  return p;
}

static inline void *hr_test_fm_realloc(void *p, size_t n, void *ud) {
  hr_test_failmem *f = ud;
  if (!p)
    return hr_test_fm_malloc(n, ud);
  if (!hr_test_failmem_take(f))
    return NULL;
  unsigned char *q = realloc((unsigned char *)p - 16, n + 16);
  if (!q)
    return NULL;
  memcpy(q, &n, sizeof n);
  return q + 16;
}

static inline void hr_test_failmem_init(hr_test_failmem *f, long fail_at) {
  memset(f, 0, sizeof *f);
  f->fail_at = fail_at;
  f->mem.user_data = f;
  f->mem.malloc = hr_test_fm_malloc;
  f->mem.free = hr_test_fm_free;
  f->mem.calloc = hr_test_fm_calloc;
  f->mem.realloc = hr_test_fm_realloc;
}

/* Bytes per element (INT4/UINT4: 1, callers handle the packing). */
static inline unsigned hr_test_elem_bytes(uint8_t elem) {
  switch (elem) {
  case HR_ELEM_INT16:
  case HR_ELEM_UINT16:
  case HR_ELEM_FLOAT16:
  case HR_ELEM_BFLOAT16:
    return 2;
  case HR_ELEM_INT32:
  case HR_ELEM_UINT32:
  case HR_ELEM_FLOAT32:
    return 4;
  case HR_ELEM_INT64:
  case HR_ELEM_UINT64:
  case HR_ELEM_FLOAT64:
  case HR_ELEM_COMPLEX64:
    return 8;
  case HR_ELEM_COMPLEX128:
    return 16;
  default:
    return 1;
  }
}

#endif /* HR_TEST_ENGINE_CORE_UTIL_H */
