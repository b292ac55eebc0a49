/*
 * Internal: a bounds-checked little-endian reader over a byte range, and a
 * writer for encoders.  Every read checks the remaining length first, so a
 * decoder built from these never reads past its input.  A failed read sets
 * the cursor's `bad` flag and returns zeros; decoders test the flag (or the
 * return value) and report MALFORMED_PAYLOAD at cur->pos.
 */
#ifndef HR_CURSOR_H
#define HR_CURSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct hr_cursor {
  const uint8_t *p; /* start of the range */
  size_t len;       /* its length */
  size_t pos;       /* next byte to read */
  uint32_t base;    /* byte offset of p[0] in the message, for statuses */
  int bad;          /* a read ran past the end */
} hr_cursor;

static inline void hr_cursor_init(hr_cursor *c, const uint8_t *p, size_t len,
                                  uint32_t base) {
  c->p = p;
  c->len = len;
  c->pos = 0;
  c->base = base;
  c->bad = 0;
}

/* Offset of the next byte, counted from the message's first header byte. */
static inline uint32_t hr_cursor_off(const hr_cursor *c) {
  return c->base + (uint32_t)c->pos;
}

static inline size_t hr_cursor_left(const hr_cursor *c) {
  return c->len - c->pos;
}

/* Returns 1 and advances when n bytes remain, else sets bad and returns 0. */
static inline int hr_cursor_need(hr_cursor *c, size_t n) {
  if (c->bad || hr_cursor_left(c) < n) {
    c->bad = 1;
    return 0;
  }
  return 1;
}

static inline uint8_t hr_get_u8(hr_cursor *c) {
  if (!hr_cursor_need(c, 1))
    return 0;
  return c->p[c->pos++];
}

static inline uint16_t hr_get_u16(hr_cursor *c) {
  if (!hr_cursor_need(c, 2))
    return 0;
  const uint8_t *b = c->p + c->pos;
  c->pos += 2;
  return (uint16_t)(b[0] | (b[1] << 8));
}

static inline uint32_t hr_get_u32(hr_cursor *c) {
  if (!hr_cursor_need(c, 4))
    return 0;
  const uint8_t *b = c->p + c->pos;
  c->pos += 4;
  return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
         ((uint32_t)b[3] << 24);
}

static inline uint64_t hr_get_u64(hr_cursor *c) {
  if (!hr_cursor_need(c, 8))
    return 0;
  const uint8_t *b = c->p + c->pos;
  c->pos += 8;
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | b[i];
  return v;
}

static inline int64_t hr_get_i64(hr_cursor *c) {
  return (int64_t)hr_get_u64(c);
}

/* Returns a pointer to the next n bytes and advances, or NULL (bad set). */
static inline const uint8_t *hr_get_bytes(hr_cursor *c, size_t n) {
  if (!hr_cursor_need(c, n))
    return NULL;
  const uint8_t *b = c->p + c->pos;
  c->pos += n;
  return b;
}

/* Little-endian stores for encoders. */
static inline uint8_t *hr_put_u8(uint8_t *o, uint8_t v) {
  *o = v;
  return o + 1;
}
static inline uint8_t *hr_put_u16(uint8_t *o, uint16_t v) {
  o[0] = (uint8_t)v;
  o[1] = (uint8_t)(v >> 8);
  return o + 2;
}
static inline uint8_t *hr_put_u32(uint8_t *o, uint32_t v) {
  for (int i = 0; i < 4; i++)
    o[i] = (uint8_t)(v >> (8 * i));
  return o + 4;
}
static inline uint8_t *hr_put_u64(uint8_t *o, uint64_t v) {
  for (int i = 0; i < 8; i++)
    o[i] = (uint8_t)(v >> (8 * i));
  return o + 8;
}
static inline uint8_t *hr_put_bytes(uint8_t *o, const void *p, size_t n) {
  if (n)
    memcpy(o, p, n);
  return o + n;
}

/* Loads without a cursor (the caller checked the length). */
static inline uint32_t hr_load_u32(const uint8_t *b) {
  return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
         ((uint32_t)b[3] << 24);
}
static inline uint64_t hr_load_u64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | b[i];
  return v;
}

/* Fills a status (when st is non-NULL) and returns HR_ERR_PROTO. */
#define HR_FAIL(st, code_, off_, reason_)                                      \
  hr__wire_fail((st), (code_), (off_), (reason_))

#endif /* HR_CURSOR_H */
