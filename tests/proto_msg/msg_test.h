/*
 * Helpers of the message codec tests: a builder that writes messages byte
 * by byte (so the tests state the wire format independently of the codec),
 * and assertions that report the caller's line.
 */
#ifndef HR_TEST_MSG_TEST_H
#define HR_TEST_MSG_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/wire.h>

/* A message under construction, large enough for the longest message
 * the tests build. */
typedef struct mb {
  uint8_t b[80000];
  size_t n;
} mb;

static inline void mb_u8(mb *m, uint8_t v) {
  m->b[m->n++] = v;
}
static inline void mb_u16(mb *m, uint16_t v) {
  mb_u8(m, (uint8_t)v);
  mb_u8(m, (uint8_t)(v >> 8));
}
static inline void mb_u32(mb *m, uint32_t v) {
  mb_u16(m, (uint16_t)v);
  mb_u16(m, (uint16_t)(v >> 16));
}
static inline void mb_u64(mb *m, uint64_t v) {
  mb_u32(m, (uint32_t)v);
  mb_u32(m, (uint32_t)(v >> 32));
}
static inline void mb_bytes(mb *m, const void *p, size_t n) {
  if (n)
    memcpy(m->b + m->n, p, n);
  m->n += n;
}
static inline void mb_fill(mb *m, uint8_t v, size_t n) {
  memset(m->b + m->n, v, n);
  m->n += n;
}
/* A str or bytes field: u16 length, then the bytes. */
static inline void mb_lstr(mb *m, const void *p, size_t n) {
  mb_u16(m, (uint16_t)n);
  mb_bytes(m, p, n);
}
static inline void mb_str(mb *m, const char *s) {
  mb_lstr(m, s, strlen(s));
}

/* Starts a message: a header whose payload_length mb_end() fills in. */
static inline void mb_begin(mb *m, uint32_t type, uint32_t stream) {
  m->n = 0;
  mb_u32(m, type);
  mb_u32(m, stream);
  mb_u32(m, 0);
}
static inline void mb_end(mb *m) {
  uint32_t pl = (uint32_t)(m->n - HR_HEADER_SIZE);
  for (int i = 0; i < 4; i++)
    m->b[8 + i] = (uint8_t)(pl >> (8 * i));
}
/* Offset of the next field, for expected error offsets. */
static inline uint32_t mb_off(const mb *m) {
  return (uint32_t)m->n;
}

static const hr_wire_ctx test_net = {HR_TRANSPORT_NETWORK, 0};
static const hr_wire_ctx test_local = {HR_TRANSPORT_LOCAL, 0};

/* Decodes a copy of the message held in a heap block of exactly its size,
 * so AddressSanitizer catches any read past the end. */
static inline int decode_exact(const uint8_t *p, size_t n,
                               const hr_wire_ctx *ctx, hr_wire_status *st) {
  uint8_t *copy = malloc(n ? n : 1);
  memcpy(copy, p, n);
  hr_msg *out = malloc(sizeof *out);
  int rv = hr_wire_decode(copy, n, ctx, out, st);
  free(out);
  free(copy);
  return rv;
}

static inline void reject_at(const mb *m, const hr_wire_ctx *ctx, uint32_t code,
                             uint32_t offset, const char *file, int line) {
  hr_wire_status st = {0, 0, NULL};
  int rv = decode_exact(m->b, m->n, ctx, &st);
  if (rv == HR_ERR_PROTO && (st.code != code || st.offset != offset))
    print_message("rejected with %s at %u: %s\n", hr_wire_error_name(st.code),
                  st.offset, st.reason);
  _assert_int_equal(rv, HR_ERR_PROTO, file, line);
  _assert_int_equal(st.code, code, file, line);
  _assert_int_equal(st.offset, offset, file, line);
  _assert_true(st.reason != NULL && st.reason[0] != '\0', "reason", file, line);
}
/* The message must be rejected with wire error `code` at `offset`. */
#define expect_reject(m, ctx, code, offset)                                    \
  reject_at((m), (ctx), (code), (offset), __FILE__, __LINE__)

static inline void roundtrip_at(const mb *m, const hr_wire_ctx *ctx,
                                hr_msg *out, const char *file, int line) {
  hr_wire_status st = {0, 0, NULL};
  int rv = hr_wire_decode(m->b, m->n, ctx, out, &st);
  if (rv)
    print_message("rejected with %s at %u: %s\n", hr_wire_error_name(st.code),
                  st.offset, st.reason);
  _assert_int_equal(rv, 0, file, line);
  _assert_int_equal(hr_wire_encoded_size(out), m->n, file, line);
  uint8_t *enc = malloc(m->n);
  _assert_int_equal(hr_wire_encode(out, enc, m->n), m->n, file, line);
  _assert_memory_equal(enc, m->b, m->n, file, line);
  free(enc);
}
/* The message must decode into *out and re-encode to the same bytes. */
#define expect_roundtrip(m, ctx, out)                                          \
  roundtrip_at((m), (ctx), (out), __FILE__, __LINE__)

static inline void encodes_at(const hr_msg *msg, const mb *m, const char *file,
                              int line) {
  _assert_int_equal(hr_wire_encoded_size(msg), m->n, file, line);
  uint8_t *enc = malloc(m->n);
  _assert_int_equal(hr_wire_encode(msg, enc, m->n), m->n, file, line);
  _assert_memory_equal(enc, m->b, m->n, file, line);
  /* One byte short: nothing is written. */
  memset(enc, 0xA5, m->n);
  _assert_int_equal(hr_wire_encode(msg, enc, m->n - 1),
                    (uintmax_t)(intmax_t)HR_ERR_BUFFER_TOO_SMALL, file, line);
  for (size_t i = 0; i < m->n; i++)
    _assert_int_equal(enc[i], 0xA5, file, line);
  free(enc);
}
/* A message built as a struct must encode to exactly the builder's bytes. */
#define expect_encodes(msg, m) encodes_at((msg), (m), __FILE__, __LINE__)

/* Every strict prefix of the payload of a valid message whose size its
 * fields determine (everything but TENSOR_DATA) must be MALFORMED_PAYLOAD:
 * no field may be read past the end of its input. */
static inline void prefixes_at(const mb *m, const hr_wire_ctx *ctx,
                               const char *file, int line) {
  mb *t = malloc(sizeof *t);
  for (size_t n = HR_HEADER_SIZE; n < m->n; n++) {
    memcpy(t->b, m->b, n);
    t->n = n;
    mb_end(t);
    hr_wire_status st = {0, 0, NULL};
    int rv = decode_exact(t->b, t->n, ctx, &st);
    _assert_int_equal(rv, HR_ERR_PROTO, file, line);
    _assert_int_equal(st.code, HR_WIRE_MALFORMED_PAYLOAD, file, line);
    _assert_true(st.offset <= n, "offset inside the input", file, line);
  }
  free(t);
}
#define expect_prefixes_malformed(m, ctx)                                      \
  prefixes_at((m), (ctx), __FILE__, __LINE__)

#endif /* HR_TEST_MSG_TEST_H */
