/*
 * libhurray: common definitions shared by every layer.
 *
 * Library error codes, the per-instance allocator, export macros and the
 * version query.  This header depends on nothing but the C standard library.
 */
#ifndef HURRAY_COMMON_H
#define HURRAY_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(HR_BUILDING_LIBRARY) && defined(__GNUC__)
#define HR_EXTERN __attribute__((visibility("default")))
#else
#define HR_EXTERN
#endif

#define HR_VERSION_MAJOR 0
#define HR_VERSION_MINOR 1
#define HR_VERSION_PATCH 0
#define HR_VERSION_NUM                                                         \
  ((HR_VERSION_MAJOR << 16) | (HR_VERSION_MINOR << 8) | HR_VERSION_PATCH)

/*
 * Library error codes.  Every fallible function returns `int`: 0 on success
 * or one of these negative values.  Codes at or below HR_ERR_FATAL leave the
 * object they were returned from unusable: only its `_del()` is legal after
 * them (see hr_err_is_fatal()).
 *
 * Library errors are not wire errors: the spec's error codes (what a peer is
 * told, enum hr_wire_error in <hurray/wire.h>) travel beside them in an
 * hr_wire_status where a function can fail because of peer input.
 */
enum hr_error {
  HR_OK = 0,
  /* An argument is out of its documented range. */
  HR_ERR_INVALID_ARGUMENT = -1,
  /* The output buffer is too small; nothing was written. */
  HR_ERR_BUFFER_TOO_SMALL = -2,
  /* Peer input broke a protocol rule; the hr_wire_status names the spec's
   * error code, the field and the byte offset. */
  HR_ERR_PROTO = -3,
  /* A sink cannot take more now; retry when told it can. */
  HR_ERR_WOULDBLOCK = -4,
  /* Returned by a callback to make the current recv return early. */
  HR_ERR_PAUSE = -5,
  /* Returned by a callback to end only the current stream. */
  HR_ERR_RESET_STREAM = -6,
  /* The call is not allowed from inside a callback of the same object. */
  HR_ERR_IN_CALLBACK = -7,
  /* The object still has live children (sessions, streams). */
  HR_ERR_BUSY = -8,
  /* The connection or stream is closed or closing. */
  HR_ERR_CLOSED = -9,
  /* A system call failed; the detail is in the object's last error text. */
  HR_ERR_IO = -10,
  /* A deadline passed. */
  HR_ERR_TIMEOUT = -11,
  /* A key, stream or object does not exist. */
  HR_ERR_NOT_FOUND = -12,
  /* The operation or backend is not available in this build or on this
   * machine. */
  HR_ERR_UNSUPPORTED = -13,
  /* The peer answered with an ERROR; its code is in the transfer record. */
  HR_ERR_REMOTE = -14,
  /* A resource cap was reached. */
  HR_ERR_LIMIT = -15,
  /* A state in which the call makes no sense (e.g. get before connect). */
  HR_ERR_STATE = -16,

  /* ---- fatal errors: only _del() is legal afterwards ---- */
  HR_ERR_FATAL = -900,
  HR_ERR_NOMEM = -901,
  HR_ERR_CALLBACK_FAILURE = -902,
  HR_ERR_INTERNAL = -903
};

/* Returns nonzero when `rv` is a fatal error (HR_ERR_NOMEM and below). */
static inline int hr_err_is_fatal(int rv) { return rv <= HR_ERR_FATAL; }

/*
 * Returns a static, human-readable name for a library error code
 * ("HR_ERR_NOMEM: out of memory").  Never NULL; unknown codes give
 * "unknown error".  Thread-safe.
 */
HR_EXTERN const char *hr_strerror(int rv);

/*
 * A per-instance allocator.  Every object of the library allocates through
 * the hr_mem it was created with; there is no global allocator hook.  A NULL
 * `const hr_mem *` anywhere in the API means the C library's malloc family.
 * The functions must behave like their libc namesakes (free(NULL) is a
 * no-op, realloc(NULL, n) allocates).  The struct is copied when an object
 * is created.
 */
typedef struct hr_mem {
  void *user_data;
  void *(*malloc)(size_t size, void *user_data);
  void (*free)(void *ptr, void *user_data);
  void *(*calloc)(size_t nmemb, size_t size, void *user_data);
  void *(*realloc)(void *ptr, size_t size, void *user_data);
} hr_mem;

/* Returns the libc allocator wrapped as an hr_mem.  Never NULL. */
HR_EXTERN const hr_mem *hr_mem_default(void);

/* Version information (nghttp2-style: `age` grows when fields are added). */
typedef struct hr_info {
  int age;             /* 1 */
  int version_num;     /* HR_VERSION_NUM of the library actually linked */
  const char *version; /* "0.1.0" */
  const char *proto;   /* "hurray/1.0": the wire version implemented */
} hr_info;

/*
 * Returns the library's version information, or NULL when the linked
 * library is older than `least_version` (an HR_VERSION_NUM value; pass 0 to
 * accept any).  Thread-safe.
 */
HR_EXTERN const hr_info *hr_version(int least_version);

/* Monotonic time in nanoseconds.  The protocol core never reads a clock:
 * callers pass the current time in. */
typedef uint64_t hr_tstamp;
#define HR_TSTAMP_NEVER UINT64_MAX

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_COMMON_H */
