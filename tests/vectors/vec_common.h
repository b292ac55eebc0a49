/*
 * Shared helpers of the test-vector programs: finding the vectors folder,
 * loading its JSON files, hex, a growable text buffer for diagnostics, and
 * the per-file cmocka driver.
 */
#ifndef VEC_COMMON_H
#define VEC_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <hurray/wire.h>

/* A growable NUL-terminated text buffer.  Allocation failures abort: this
 * is test code and a half-written diagnostic is worse than a crash. */
typedef struct vec_buf {
  char *s;
  size_t len;
  size_t cap;
} vec_buf;

void vec_buf_printf(vec_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void vec_buf_vprintf(vec_buf *b, const char *fmt, va_list ap);
void vec_buf_reset(vec_buf *b);
void vec_buf_free(vec_buf *b);

/* Aborts with a message when `p` is NULL (out of memory in a test). */
void *vec_chk(void *p);

/* Decodes a lowercase or uppercase hex string.  Returns 0 and a malloc'd
 * buffer (never NULL, even for "") or -1 on bad input. */
int vec_hex_decode(const char *hex, uint8_t **out, size_t *len);

/* Encodes bytes as lowercase hex into a malloc'd string. */
char *vec_hex_encode(const uint8_t *p, size_t n);

/* One message of a vector's byte string. */
typedef struct vec_span {
  const uint8_t *p;
  size_t len; /* 12 + payload_length */
} vec_span;

/* Splits back-to-back messages by their headers.  Returns the number of
 * whole messages, or -1 when the bytes do not end on a message boundary.
 * *out is malloc'd (free it). */
int vec_split(const uint8_t *p, size_t len, vec_span **out);

/* Field access with type checks; `ok` is cleared on a missing or mistyped
 * field (the vector file is then at fault, which is reported). */
const char *vec_get_str(const cJSON *o, const char *key, int *ok);
uint64_t vec_get_u64(const cJSON *o, const char *key, int *ok);
/* A JSON number or decimal string, as the vectors write integers. */
int vec_json_u64(const cJSON *j, uint64_t *out);

/* A JSON array of at most `max` such integers into out[0..*n). */
int vec_json_u64_array(const cJSON *a, uint64_t *out, unsigned max,
                       unsigned *n);

/* The transport named by a vector ("network" / "local"). */
int vec_transport(const cJSON *v, hr_wire_ctx *ctx);

/*
 * The per-file driver.  Each program passes a function that checks one
 * vector and returns 0 (pass) or -1 (fail) with the reason in `diag`.
 * vec_main() finds the vectors folder (HURRAY_VECTORS_DIR, else
 * HR_VECTORS_DEFAULT from CTest, else the path compiled in), skips with 77
 * when it is missing or holds no *.json (fails instead when CI=true), and
 * runs one cmocka test per file.
 */
typedef int (*vec_check_fn)(const char *file, const cJSON *vector,
                            vec_buf *diag);
int vec_main(const char *program, vec_check_fn check);

#endif /* VEC_COMMON_H */
