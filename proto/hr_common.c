/* Library-wide basics: the default allocator, error strings, version. */
#include <stdlib.h>

#include "hr_internal.h"

static void *libc_malloc(size_t n, void *ud) {
  (void)ud;
  return malloc(n); /* lint-ok: the default allocator */
}
static void libc_free(void *p, void *ud) {
  (void)ud;
  free(p); /* lint-ok */
}
static void *libc_calloc(size_t m, size_t n, void *ud) {
  (void)ud;
  return calloc(m, n); /* lint-ok */
}
static void *libc_realloc(void *p, size_t n, void *ud) {
  (void)ud;
  return realloc(p, n); /* lint-ok */
}

static const hr_mem default_mem = {NULL, libc_malloc, libc_free, libc_calloc,
                                   libc_realloc};

const hr_mem *hr_mem_default(void) { return &default_mem; }

void *hr__mem_malloc(const hr_mem *mem, size_t n) {
  return mem->malloc(n ? n : 1, mem->user_data);
}
void *hr__mem_calloc(const hr_mem *mem, size_t m, size_t n) {
  return mem->calloc(m ? m : 1, n ? n : 1, mem->user_data);
}
void *hr__mem_realloc(const hr_mem *mem, void *p, size_t n) {
  return mem->realloc(p, n ? n : 1, mem->user_data);
}
void hr__mem_free(const hr_mem *mem, void *p) {
  if (p)
    mem->free(p, mem->user_data);
}

int hr__wire_fail(hr_wire_status *st, uint32_t code, uint32_t offset,
                  const char *reason) {
  if (st) {
    st->code = code;
    st->offset = offset;
    st->reason = reason;
  }
  return HR_ERR_PROTO;
}

const char *hr_strerror(int rv) {
  switch (rv) {
  case HR_OK: return "success";
  case HR_ERR_INVALID_ARGUMENT: return "invalid argument";
  case HR_ERR_BUFFER_TOO_SMALL: return "buffer too small";
  case HR_ERR_PROTO: return "protocol error";
  case HR_ERR_WOULDBLOCK: return "operation would block";
  case HR_ERR_PAUSE: return "paused";
  case HR_ERR_RESET_STREAM: return "stream reset";
  case HR_ERR_IN_CALLBACK: return "not allowed inside a callback";
  case HR_ERR_BUSY: return "object busy";
  case HR_ERR_CLOSED: return "closed";
  case HR_ERR_IO: return "I/O error";
  case HR_ERR_TIMEOUT: return "timed out";
  case HR_ERR_NOT_FOUND: return "not found";
  case HR_ERR_UNSUPPORTED: return "not supported";
  case HR_ERR_REMOTE: return "the peer reported an error";
  case HR_ERR_LIMIT: return "limit reached";
  case HR_ERR_STATE: return "not allowed in this state";
  case HR_ERR_NOMEM: return "out of memory";
  case HR_ERR_CALLBACK_FAILURE: return "callback failure";
  case HR_ERR_INTERNAL: return "internal error";
  default: return "unknown error";
  }
}

const hr_info *hr_version(int least_version) {
  static const hr_info info = {1, HR_VERSION_NUM, "0.1.0", "hurray/1.0"};
  if (least_version > HR_VERSION_NUM)
    return NULL;
  return &info;
}
