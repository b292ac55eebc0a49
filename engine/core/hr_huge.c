/* Transparent huge page advice for large tensor buffers. */
#include <stdint.h>
#include <sys/mman.h>

#include "hr_core.h"

void hr__huge_advise(void *p, size_t len) {
#ifdef MADV_HUGEPAGE
  /* madvise() wants a page-aligned range: advise the whole 4 KiB pages
   * that lie inside [p, p + len).  The call is advice only; a kernel
   * without THP (or in "never" mode) refuses it, and the buffer works the
   * same, so the result is deliberately ignored. */
  const uintptr_t page = 4096;
  uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1);
  uintptr_t hi = ((uintptr_t)p + len) & ~(page - 1);
  if (hi > lo)
    (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
  (void)p;
  (void)len;
#endif
}
