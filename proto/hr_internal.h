/*
 * Internal helpers shared by the proto/ modules: allocation through an
 * hr_mem, status filling, overflow-checked arithmetic.
 */
#ifndef HR_PROTO_INTERNAL_H
#define HR_PROTO_INTERNAL_H

#include <hurray/common.h>
#include <hurray/wire.h>

/* Allocation through an instance's allocator (mem must be non-NULL: objects
 * store a copy of hr_mem_default() when the caller passed NULL). */
void *hr__mem_malloc(const hr_mem *mem, size_t n);
void *hr__mem_calloc(const hr_mem *mem, size_t nmemb, size_t size);
void *hr__mem_realloc(const hr_mem *mem, void *p, size_t n);
void hr__mem_free(const hr_mem *mem, void *p);

/* Fills `st` (when non-NULL) and returns HR_ERR_PROTO. */
int hr__wire_fail(hr_wire_status *st, uint32_t code, uint32_t offset,
                  const char *reason);

/* Overflow-checked u64 arithmetic: return 0 on overflow, 1 otherwise. */
static inline int hr__mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}
static inline int hr__add_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_add_overflow(a, b, out);
}

#endif /* HR_PROTO_INTERNAL_H */
