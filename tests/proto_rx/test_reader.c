/*
 * The incremental frame reader: a stream of mixed messages replayed at
 * every split point (one byte at a time, every two-way split, random chunks
 * with a fixed seed), with and without zero-copy placement; header
 * rejections, fatal and not; the allocation bounds; allocation failures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/wire.h>

#include "proto/hr_rx_internal.h"

/* ------------------------------------------------------------------------ */
/* Building byte streams                                                     */
/* ------------------------------------------------------------------------ */

typedef struct bytes {
  uint8_t *p;
  size_t len, cap;
} bytes;

static void b_put(bytes *b, const void *p, size_t n) {
  if (b->len + n > b->cap) {
    b->cap = (b->len + n) * 2;
    b->p = realloc(b->p, b->cap);
  }
  if (n)
    memcpy(b->p + b->len, p, n);
  b->len += n;
}

static void b_u32(bytes *b, uint32_t v) {
  uint8_t o[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16),
                  (uint8_t)(v >> 24)};
  b_put(b, o, 4);
}

static void b_u64(bytes *b, uint64_t v) {
  b_u32(b, (uint32_t)v);
  b_u32(b, (uint32_t)(v >> 32));
}

static void b_header(bytes *b, uint32_t type, uint32_t sid, uint32_t len) {
  b_u32(b, type);
  b_u32(b, sid);
  b_u32(b, len);
}

/* A payload of recognisable bytes. */
static void b_fill(bytes *b, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++) {
    uint8_t c = (uint8_t)(seed + i * 7);
    b_put(b, &c, 1);
  }
}

static void b_data(bytes *b, uint32_t sid, uint8_t bidx, uint64_t off, size_t n,
                   uint8_t seed) {
  b_header(b, HR_MSG_TENSOR_DATA, sid, (uint32_t)(12 + n));
  uint8_t sub[4] = {bidx, 0, 0, 0};
  b_put(b, sub, 4);
  b_u64(b, off);
  b_fill(b, n, seed);
}

/* ------------------------------------------------------------------------ */
/* Collecting what the reader reports                                        */
/* ------------------------------------------------------------------------ */

enum { R_MSG, R_DATA, R_ERR };

typedef struct record {
  int kind;
  uint32_t type, sid;
  bytes body; /* payload, or the frame's data */
  uint8_t bidx;
  uint64_t frame_off;
  uint32_t frame_len;
  uint32_t code; /* R_ERR */
  int fatal;
} record;

#define MAXREC 64

typedef struct collect {
  record r[MAXREC];
  int n;
  int in_frame; /* the last record is a frame still receiving */
} collect;

static void c_free(collect *c) {
  for (int i = 0; i < c->n; i++)
    free(c->r[i].body.p);
  memset(c, 0, sizeof *c);
}

static record *c_new(collect *c, int kind, const hr_msg_header *h) {
  assert_true(c->n < MAXREC);
  record *r = &c->r[c->n++];
  memset(r, 0, sizeof *r);
  r->kind = kind;
  r->type = h->type;
  r->sid = h->stream_id;
  return r;
}

/* Records one event; checks the DATA invariants. */
static void c_event(collect *c, const hr_reader_event *ev) {
  switch (ev->kind) {
  case HR_RD_MESSAGE: {
    assert_false(c->in_frame);
    record *r = c_new(c, R_MSG, &ev->hdr);
    if (ev->hdr.payload_length)
      assert_non_null(ev->payload);
    b_put(&r->body, ev->payload, ev->hdr.payload_length);
    break;
  }
  case HR_RD_DATA: {
    record *r;
    if (ev->first) {
      assert_false(c->in_frame);
      r = c_new(c, R_DATA, &ev->hdr);
      r->bidx = ev->buffer_index;
      r->frame_off = ev->frame_offset;
      r->frame_len = ev->frame_len;
      assert_int_equal(ev->frame_len, ev->hdr.payload_length - 12);
      c->in_frame = 1;
    } else {
      assert_true(c->in_frame);
      r = &c->r[c->n - 1];
      assert_true(ev->len > 0);
    }
    assert_int_equal(ev->offset, r->frame_off + r->body.len);
    assert_int_equal(ev->frame_offset, r->frame_off);
    assert_int_equal(ev->buffer_index, r->bidx);
    assert_true(r->body.len + ev->len <= r->frame_len);
    if (ev->len)
      assert_non_null(ev->data);
    else
      assert_null(ev->data);
    b_put(&r->body, ev->data, ev->len);
    assert_int_equal(ev->last, r->body.len == r->frame_len);
    if (ev->last)
      c->in_frame = 0;
    break;
  }
  case HR_RD_ERROR: {
    assert_false(c->in_frame);
    record *r = c_new(c, R_ERR, &ev->hdr);
    r->code = ev->status.code;
    r->fatal = ev->fatal;
    assert_non_null(ev->status.reason);
    break;
  }
  default: fail_msg("unexpected event kind %d", ev->kind);
  }
}

/*
 * Feeds one chunk completely.  With `zero_copy`, whenever the reader is
 * inside a frame, the bytes are "received into place" by the caller (here:
 * copied from the chunk) and reported with hr_reader_skip_data().
 */
static void feed_chunk(hr_reader *r, collect *c, const uint8_t *p, size_t n,
                       int zero_copy) {
  for (;;) {
    if (zero_copy && c->in_frame) {
      uint8_t bidx;
      uint64_t off;
      uint64_t pending = hr_reader_data_pending(r, &bidx, &off);
      assert_true(pending > 0);
      record *rec = &c->r[c->n - 1];
      assert_int_equal(bidx, rec->bidx);
      assert_int_equal(off, rec->frame_off + rec->body.len);
      size_t take = n < pending ? n : (size_t)pending;
      b_put(&rec->body, p, take);
      assert_int_equal(hr_reader_skip_data(r, take), 0);
      p += take;
      n -= take;
      if (take == pending)
        c->in_frame = 0;
      if (n == 0)
        return;
    }
    hr_reader_event ev;
    int64_t used = hr_reader_feed(r, p, n, &ev);
    assert_true(used >= 0 && (size_t)used <= n);
    p += used;
    n -= (size_t)used;
    if (ev.kind == HR_RD_NONE) {
      assert_int_equal(n, 0);
      return;
    }
    c_event(c, &ev);
    if (ev.kind == HR_RD_ERROR && ev.fatal)
      return;
  }
}

/* ------------------------------------------------------------------------ */
/* The mixed stream                                                          */
/* ------------------------------------------------------------------------ */

/* Builds the stream and the records a correct reader reports for it. */
static void mixed_stream(bytes *s, collect *want) {
  memset(s, 0, sizeof *s);
  memset(want, 0, sizeof *want);
  hr_msg_header h;
  record *r;
#define WANT_MSG(type_, sid_, n_, seed_)                                       \
  do {                                                                         \
    h.type = (type_);                                                          \
    h.stream_id = (sid_);                                                      \
    r = c_new(want, R_MSG, &h);                                                \
    b_fill(&r->body, (n_), (seed_));                                           \
    b_header(s, (type_), (sid_), (uint32_t)(n_));                              \
    b_fill(s, (n_), (seed_));                                                  \
  } while (0)
#define WANT_DATA(sid_, bidx_, off_, n_, seed_)                                \
  do {                                                                         \
    h.type = HR_MSG_TENSOR_DATA;                                               \
    h.stream_id = (sid_);                                                      \
    r = c_new(want, R_DATA, &h);                                               \
    r->bidx = (bidx_);                                                         \
    r->frame_off = (off_);                                                     \
    r->frame_len = (uint32_t)(n_);                                             \
    b_fill(&r->body, (n_), (seed_));                                           \
    b_data(s, (sid_), (bidx_), (off_), (n_), (seed_));                         \
  } while (0)
#define WANT_ERR(type_, sid_, code_, fatal_)                                   \
  do {                                                                         \
    h.type = (type_);                                                          \
    h.stream_id = (sid_);                                                      \
    r = c_new(want, R_ERR, &h);                                                \
    r->code = (code_);                                                         \
    r->fatal = (fatal_);                                                       \
  } while (0)

  WANT_MSG(HR_MSG_CLIENT_HELLO, 0, 40, 1);
  WANT_MSG(HR_MSG_PING, 0, 8, 2);
  WANT_MSG(HR_MSG_TENSOR_DESCRIPTOR, 1, 64, 3);
  WANT_DATA(1, 0, 0, 100, 4);
  WANT_DATA(1, 2, 4096, 1, 5);
  WANT_MSG(HR_MSG_TENSOR_DATA_END, 1, 0, 0);
  WANT_MSG(HR_MSG_ERROR, 3, 10, 6);
  /* A reserved type on a stream: rejected, payload skipped. */
  WANT_ERR(0x13, 5, HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0);
  b_header(s, 0x13, 5, 20);
  b_fill(s, 20, 7);
  /* TENSOR_DATA too short for its sub-header and a byte. */
  WANT_ERR(HR_MSG_TENSOR_DATA, 1, HR_WIRE_MALFORMED_PAYLOAD, 0);
  b_header(s, HR_MSG_TENSOR_DATA, 1, 12);
  b_fill(s, 12, 8);
  /* A non-zero reserved sub-header byte. */
  WANT_ERR(HR_MSG_TENSOR_DATA, 1, HR_WIRE_MALFORMED_PAYLOAD, 0);
  b_header(s, HR_MSG_TENSOR_DATA, 1, 30);
  uint8_t sub[12] = {0, 1, 0, 0};
  b_put(s, sub, 12);
  b_fill(s, 18, 9);
  /* A HELLO on a request stream: misplaced, not fatal. */
  WANT_ERR(HR_MSG_CLIENT_HELLO, 3, HR_WIRE_PROTOCOL_VIOLATION, 0);
  b_header(s, HR_MSG_CLIENT_HELLO, 3, 5);
  b_fill(s, 5, 10);
  WANT_MSG(HR_MSG_LIST_RESPONSE, 9, 3000, 11);
  WANT_DATA(7, 1, 12, 700, 12);
  WANT_MSG(HR_MSG_TENSOR_DATA_END, 7, 0, 0);
#undef WANT_MSG
#undef WANT_DATA
#undef WANT_ERR
}

static void c_compare(const collect *got, const collect *want) {
  assert_int_equal(got->n, want->n);
  assert_false(got->in_frame);
  for (int i = 0; i < want->n; i++) {
    const record *g = &got->r[i], *w = &want->r[i];
    assert_int_equal(g->kind, w->kind);
    assert_int_equal(g->type, w->type);
    assert_int_equal(g->sid, w->sid);
    assert_int_equal(g->code, w->code);
    assert_int_equal(g->fatal, w->fatal);
    assert_int_equal(g->bidx, w->bidx);
    assert_int_equal(g->frame_off, w->frame_off);
    assert_int_equal(g->frame_len, w->frame_len);
    assert_int_equal(g->body.len, w->body.len);
    if (w->body.len)
      assert_memory_equal(g->body.p, w->body.p, w->body.len);
  }
}

/* Replays the stream cut into the chunks given by `cuts` (sorted, ending
 * with s->len). */
static void replay(const bytes *s, const collect *want, const size_t *cuts,
                   int ncuts, int zero_copy) {
  hr_reader *r = NULL;
  assert_int_equal(hr_reader_new(&r, NULL, NULL), 0);
  collect got;
  memset(&got, 0, sizeof got);
  size_t at = 0;
  for (int i = 0; i < ncuts; i++) {
    feed_chunk(r, &got, s->p + at, cuts[i] - at, zero_copy);
    at = cuts[i];
  }
  assert_int_equal(at, s->len);
  assert_int_equal(hr_reader_at_boundary(r), 1);
  c_compare(&got, want);
  c_free(&got);
  hr_reader_del(r);
}

static void split_whole_and_bytewise(void **state) {
  (void)state;
  bytes s;
  collect want;
  mixed_stream(&s, &want);
  size_t whole[1] = {s.len};
  for (int zc = 0; zc < 2; zc++) {
    replay(&s, &want, whole, 1, zc);
    size_t *cuts = malloc(s.len * sizeof *cuts);
    for (size_t i = 0; i < s.len; i++)
      cuts[i] = i + 1;
    replay(&s, &want, cuts, (int)s.len, zc);
    free(cuts);
  }
  c_free(&want);
  free(s.p);
}

static void split_two_way(void **state) {
  (void)state;
  bytes s;
  collect want;
  mixed_stream(&s, &want);
  for (size_t k = 0; k <= s.len; k++) {
    size_t cuts[2] = {k, s.len};
    replay(&s, &want, cuts, 2, (int)(k & 1));
  }
  c_free(&want);
  free(s.p);
}

static void split_random(void **state) {
  (void)state;
  bytes s;
  collect want;
  mixed_stream(&s, &want);
  uint64_t seed = 0x9E3779B97F4A7C15ULL;
  size_t *cuts = malloc((s.len + 1) * sizeof *cuts);
  for (int round = 0; round < 200; round++) {
    int n = 0;
    size_t at = 0;
    while (at < s.len) {
      seed ^= seed << 13;
      seed ^= seed >> 7;
      seed ^= seed << 17;
      size_t step = 1 + (size_t)(seed % (round % 2 ? 40 : 700));
      at = at + step < s.len ? at + step : s.len;
      cuts[n++] = at;
    }
    replay(&s, &want, cuts, n, round % 3 == 0);
  }
  free(cuts);
  c_free(&want);
  free(s.p);
}

/* A message that arrives whole is read in place: no copy. */
static void fast_path_points_into_input(void **state) {
  (void)state;
  bytes s;
  memset(&s, 0, sizeof s);
  b_header(&s, HR_MSG_TENSOR_DESCRIPTOR, 1, 50);
  b_fill(&s, 50, 1);
  b_data(&s, 1, 0, 0, 30, 2);
  hr_reader *r = NULL;
  assert_int_equal(hr_reader_new(&r, NULL, NULL), 0);
  hr_reader_event ev;
  int64_t used = hr_reader_feed(r, s.p, s.len, &ev);
  assert_int_equal(used, 62);
  assert_int_equal(ev.kind, HR_RD_MESSAGE);
  assert_ptr_equal(ev.payload, s.p + 12);
  used = hr_reader_feed(r, s.p + 62, s.len - 62, &ev);
  assert_int_equal(used, 54);
  assert_int_equal(ev.kind, HR_RD_DATA);
  assert_ptr_equal(ev.data, s.p + 62 + 24);
  assert_int_equal(ev.len, 30);
  assert_true(ev.first && ev.last);
  assert_int_equal(hr_reader_at_boundary(r), 1);
  assert_int_equal(hr_reader_feed(r, NULL, 0, &ev), 0);
  assert_int_equal(ev.kind, HR_RD_NONE);
  hr_reader_del(r);
  free(s.p);
}

/* The sub-header completes exactly at the end of the input: a first piece
 * of 0 bytes tells where the frame goes; the rest is placed zero-copy. */
static void empty_first_piece_and_skip(void **state) {
  (void)state;
  bytes s;
  memset(&s, 0, sizeof s);
  b_data(&s, 4, 3, 1000, 500, 9);
  hr_reader *r = NULL;
  assert_int_equal(hr_reader_new(&r, NULL, NULL), 0);
  assert_int_equal(hr_reader_data_pending(r, NULL, NULL), 0);
  assert_int_equal(hr_reader_skip_data(r, 0), 0);
  assert_int_equal(hr_reader_skip_data(r, 1), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_reader_skip_data(NULL, 0), HR_ERR_INVALID_ARGUMENT);
  hr_reader_event ev;
  assert_int_equal(hr_reader_feed(r, s.p, 5, &ev), 5);
  assert_int_equal(ev.kind, HR_RD_NONE);
  assert_int_equal(hr_reader_at_boundary(r), 0);
  assert_string_equal(hr__reader_state_name(r), "HEADER");
  assert_int_equal(hr_reader_feed(r, s.p + 5, 19, &ev), 19);
  assert_int_equal(ev.kind, HR_RD_DATA);
  assert_true(ev.first);
  assert_false(ev.last);
  assert_int_equal(ev.len, 0);
  assert_null(ev.data);
  assert_int_equal(ev.frame_len, 500);
  assert_string_equal(hr__reader_state_name(r), "DATA");
  uint8_t bidx = 0;
  uint64_t off = 0;
  assert_int_equal(hr_reader_data_pending(r, &bidx, &off), 500);
  assert_int_equal(bidx, 3);
  assert_int_equal(off, 1000);
  assert_int_equal(hr_reader_data_pending(r, NULL, NULL), 500);
  assert_int_equal(hr_reader_skip_data(r, 501), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_reader_skip_data(r, 200), 0);
  assert_int_equal(hr_reader_data_pending(r, &bidx, &off), 300);
  assert_int_equal(off, 1200);
  /* The reader takes over again for part of it. */
  assert_int_equal(hr_reader_feed(r, s.p + 224, 100, &ev), 100);
  assert_int_equal(ev.kind, HR_RD_DATA);
  assert_false(ev.first);
  assert_int_equal(ev.offset, 1200);
  assert_int_equal(hr_reader_skip_data(r, 200), 0);
  assert_int_equal(hr_reader_at_boundary(r), 1);
  assert_int_equal(hr_reader_data_pending(r, NULL, NULL), 0);
  hr_reader_del(r);
  free(s.p);
}

/* ------------------------------------------------------------------------ */
/* Header rejections                                                         */
/* ------------------------------------------------------------------------ */

static void too_large_is_fatal(void **state) {
  (void)state;
  hr_reader_settings set;
  memset(&set, 0, sizeof set);
  set.max_payload = 100;
  hr_reader *r = NULL;
  assert_int_equal(hr_reader_new(&r, &set, NULL), 0);
  bytes s;
  memset(&s, 0, sizeof s);
  b_header(&s, HR_MSG_TENSOR_DESCRIPTOR, 1, 100); /* exactly the limit */
  b_fill(&s, 100, 1);
  b_header(&s, HR_MSG_TENSOR_DESCRIPTOR, 1, 101);
  b_fill(&s, 101, 2);
  hr_reader_event ev;
  assert_int_equal(hr_reader_feed(r, s.p, s.len, &ev), 112);
  assert_int_equal(ev.kind, HR_RD_MESSAGE);
  assert_int_equal(hr_reader_feed(r, s.p + 112, s.len - 112, &ev), 12);
  assert_int_equal(ev.kind, HR_RD_ERROR);
  assert_int_equal(ev.status.code, HR_WIRE_MESSAGE_TOO_LARGE);
  assert_int_equal(ev.fatal, 1);
  assert_int_equal(ev.hdr.payload_length, 101);
  assert_string_equal(hr__reader_state_name(r), "FATAL");
  assert_int_equal(hr_reader_at_boundary(r), 0);
  /* Dead: nothing more is consumed, the same error comes back. */
  assert_int_equal(hr_reader_feed(r, s.p + 124, 5, &ev), 0);
  assert_int_equal(ev.kind, HR_RD_ERROR);
  assert_int_equal(ev.status.code, HR_WIRE_MESSAGE_TOO_LARGE);
  assert_int_equal(ev.fatal, 1);
  hr_reader_del(r);
  free(s.p);

  /* A TENSOR_DATA is held to the same limit. */
  assert_int_equal(hr_reader_new(&r, &set, NULL), 0);
  memset(&s, 0, sizeof s);
  b_data(&s, 1, 0, 0, 90, 1);
  assert_int_equal(hr_reader_feed(r, s.p, s.len, &ev), 12);
  assert_int_equal(ev.status.code, HR_WIRE_MESSAGE_TOO_LARGE);
  hr_reader_del(r);
  free(s.p);
}

static void stream0_rejections_are_fatal(void **state) {
  (void)state;
  static const uint32_t types[] = {
      0x13, 0x00, 0xFF, 0x100, HR_MSG_TENSOR_REQUEST, HR_MSG_TENSOR_DATA};
  static const uint32_t codes[] = {
      HR_WIRE_UNKNOWN_MESSAGE_TYPE, HR_WIRE_UNKNOWN_MESSAGE_TYPE,
      HR_WIRE_UNKNOWN_MESSAGE_TYPE, HR_WIRE_UNKNOWN_MESSAGE_TYPE,
      HR_WIRE_PROTOCOL_VIOLATION,   HR_WIRE_PROTOCOL_VIOLATION};
  for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
    hr_reader *r = NULL;
    assert_int_equal(hr_reader_new(&r, NULL, NULL), 0);
    bytes s;
    memset(&s, 0, sizeof s);
    b_header(&s, types[i], 0, 20);
    b_fill(&s, 20, 1);
    hr_reader_event ev;
    assert_int_equal(hr_reader_feed(r, s.p, s.len, &ev), 12);
    assert_int_equal(ev.kind, HR_RD_ERROR);
    assert_int_equal(ev.status.code, codes[i]);
    assert_int_equal(ev.fatal, 1);
    hr_reader_del(r);
    free(s.p);
  }
}

/* The rejection comes with the header, before any payload byte. */
static void rejection_before_payload(void **state) {
  (void)state;
  hr_reader *r = NULL;
  assert_int_equal(hr_reader_new(&r, NULL, NULL), 0);
  bytes s;
  memset(&s, 0, sizeof s);
  b_header(&s, 0x20, 9, 1000);
  hr_reader_event ev;
  assert_int_equal(hr_reader_feed(r, s.p, s.len, &ev), 12);
  assert_int_equal(ev.kind, HR_RD_ERROR);
  assert_int_equal(ev.fatal, 0);
  assert_int_equal(ev.hdr.stream_id, 9);
  assert_string_equal(hr__reader_state_name(r), "SKIP");
  hr_reader_del(r);
  free(s.p);
}

static void private_types(void **state) {
  (void)state;
  bytes s;
  memset(&s, 0, sizeof s);
  b_header(&s, 0xF1, 7, 6);
  b_fill(&s, 6, 1);
  hr_reader_settings set;
  memset(&set, 0, sizeof set);
  set.ctx.private_types = 1u << 1;
  hr_reader *r = NULL;
  assert_int_equal(hr_reader_new(&r, &set, NULL), 0);
  hr_reader_event ev;
  assert_int_equal(hr_reader_feed(r, s.p, s.len, &ev), 18);
  assert_int_equal(ev.kind, HR_RD_MESSAGE);
  assert_int_equal(ev.hdr.type, 0xF1);
  hr_reader_del(r);
  assert_int_equal(hr_reader_new(&r, NULL, NULL), 0);
  assert_int_equal(hr_reader_feed(r, s.p, s.len, &ev), 12);
  assert_int_equal(ev.kind, HR_RD_ERROR);
  assert_int_equal(ev.status.code, HR_WIRE_UNKNOWN_MESSAGE_TYPE);
  assert_int_equal(ev.fatal, 0);
  assert_int_equal(hr_reader_feed(r, s.p + 12, 6, &ev), 6);
  assert_int_equal(ev.kind, HR_RD_NONE);
  assert_int_equal(hr_reader_at_boundary(r), 1);
  hr_reader_del(r);
  free(s.p);
}

static void max_payload_changes(void **state) {
  (void)state;
  hr_reader *r = NULL;
  assert_int_equal(hr_reader_new(&r, NULL, NULL), 0);
  bytes s;
  memset(&s, 0, sizeof s);
  b_header(&s, HR_MSG_TENSOR_DESCRIPTOR, 1, 70000);
  b_fill(&s, 70000, 1);
  hr_reader_event ev;
  /* Before the HELLOs: 65,536. */
  assert_int_equal(hr_reader_feed(r, s.p, s.len, &ev), 12);
  assert_int_equal(ev.status.code, HR_WIRE_MESSAGE_TOO_LARGE);
  hr_reader_del(r);
  assert_int_equal(hr_reader_new(&r, NULL, NULL), 0);
  hr_reader_set_max_payload(r, 1u << 20);
  assert_int_equal(hr_reader_feed(r, s.p, s.len, &ev), (int64_t)s.len);
  assert_int_equal(ev.kind, HR_RD_MESSAGE);
  hr_reader_set_max_payload(r, 0); /* back to the default */
  assert_int_equal(hr_reader_feed(r, s.p, s.len, &ev), 12);
  assert_int_equal(ev.status.code, HR_WIRE_MESSAGE_TOO_LARGE);
  hr_reader_set_max_payload(NULL, 5);
  hr_reader_del(r);
  hr_reader_del(NULL);
  free(s.p);
}

static void bad_arguments(void **state) {
  (void)state;
  hr_reader *r = NULL;
  hr_reader_event ev;
  uint8_t b[1] = {0};
  assert_int_equal(hr_reader_new(NULL, NULL, NULL), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_reader_new(&r, NULL, NULL), 0);
  assert_int_equal(hr_reader_feed(NULL, b, 1, &ev), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_reader_feed(r, b, 1, NULL), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_reader_feed(r, NULL, 1, &ev), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_reader_at_boundary(NULL), 0);
  assert_int_equal(hr_reader_data_pending(NULL, NULL, NULL), 0);
  hr_reader_del(r);
}

/* ------------------------------------------------------------------------ */
/* Allocation                                                                */
/* ------------------------------------------------------------------------ */

typedef struct count_mem {
  size_t live;    /* bytes allocated now */
  size_t largest; /* the largest single request */
  int fail_after; /* allocations left before failing (-1: never) */
} count_mem;

/* Each block carries its size in front so frees can be counted. */
static void *cm_alloc(count_mem *c, void *old, size_t n) {
  if (c->fail_after == 0)
    return NULL;
  if (c->fail_after > 0)
    c->fail_after--;
  size_t oldn = 0;
  if (old) {
    old = (size_t *)old - 1;
    oldn = *(size_t *)old;
  }
  size_t *p = realloc(old, n + sizeof(size_t));
  if (!p)
    return NULL;
  *p = n;
  c->live = c->live - oldn + n;
  if (n > c->largest)
    c->largest = n;
  return p + 1;
}
static void *cm_malloc(size_t n, void *ud) {
  return cm_alloc(ud, NULL, n);
}
static void *cm_calloc(size_t a, size_t b, void *ud) {
  void *p = cm_alloc(ud, NULL, a * b);
  if (p)
    memset(p, 0, a * b);
  return p;
}
static void *cm_realloc(void *p, size_t n, void *ud) {
  return cm_alloc(ud, p, n);
}
static void cm_free(void *p, void *ud) {
  count_mem *c = ud;
  if (!p)
    return;
  size_t *b = (size_t *)p - 1;
  c->live -= *b;
  free(b);
}

/* A header announcing 4 GiB allocates only what arrives. */
static void hostile_length(void **state) {
  (void)state;
  count_mem cm = {0, 0, -1};
  hr_mem mem = {&cm, cm_malloc, cm_free, cm_calloc, cm_realloc};
  hr_reader_settings set;
  memset(&set, 0, sizeof set);
  set.max_payload = UINT32_MAX;
  hr_reader *r = NULL;
  assert_int_equal(hr_reader_new(&r, &set, &mem), 0);
  size_t base = cm.live;
  bytes s;
  memset(&s, 0, sizeof s);
  b_header(&s, HR_MSG_TENSOR_DESCRIPTOR, 1, UINT32_MAX);
  b_fill(&s, 1000, 1);
  hr_reader_event ev;
  assert_int_equal(hr_reader_feed(r, s.p, 12, &ev), 12);
  assert_int_equal(cm.live, base);
  for (size_t i = 12; i < s.len; i++) {
    assert_int_equal(hr_reader_feed(r, s.p + i, 1, &ev), 1);
    assert_int_equal(ev.kind, HR_RD_NONE);
    assert_true(cm.live - base <= 2 * (i - 11) + 256);
  }
  assert_true(cm.largest <= 2048);
  hr_reader_del(r);
  assert_int_equal(cm.live, 0);
  free(s.p);

  /* TENSOR_DATA of 4 GiB: nothing buffered at all. */
  cm = (count_mem){0, 0, -1};
  assert_int_equal(hr_reader_new(&r, &set, &mem), 0);
  base = cm.live;
  memset(&s, 0, sizeof s);
  b_header(&s, HR_MSG_TENSOR_DATA, 1, UINT32_MAX);
  uint8_t sub[12] = {0};
  b_put(&s, sub, 12);
  b_fill(&s, 5000, 1);
  size_t at = 0;
  uint64_t got = 0;
  while (at < s.len) {
    size_t n = s.len - at < 7 ? s.len - at : 7;
    int64_t used = hr_reader_feed(r, s.p + at, n, &ev);
    assert_true(used >= 0);
    at += (size_t)used;
    if (ev.kind == HR_RD_DATA)
      got += ev.len;
  }
  assert_int_equal(got, 5000);
  assert_int_equal(cm.live, base);
  assert_int_equal(hr_reader_data_pending(r, NULL, NULL),
                   (uint64_t)UINT32_MAX - 12 - 5000);
  hr_reader_del(r);
  free(s.p);
}

/* A large control buffer is released after its message. */
static void large_buffer_released(void **state) {
  (void)state;
  count_mem cm = {0, 0, -1};
  hr_mem mem = {&cm, cm_malloc, cm_free, cm_calloc, cm_realloc};
  hr_reader *r = NULL;
  assert_int_equal(hr_reader_new(&r, NULL, &mem), 0);
  hr_reader_set_max_payload(r, 1u << 20);
  size_t base = cm.live;
  bytes s;
  memset(&s, 0, sizeof s);
  b_header(&s, HR_MSG_LIST_RESPONSE, 3, 100000);
  b_fill(&s, 100000, 1);
  hr_reader_event ev;
  assert_int_equal(hr_reader_feed(r, s.p, 50000, &ev), 50000);
  assert_int_equal(hr_reader_feed(r, s.p + 50000, s.len - 50000, &ev),
                   (int64_t)(s.len - 50000));
  assert_int_equal(ev.kind, HR_RD_MESSAGE);
  assert_true(cm.live - base >= 100000);
  assert_true(cm.largest <= 100000); /* capped at the payload length */
  assert_memory_equal(ev.payload, s.p + 12, 100000);
  assert_int_equal(hr_reader_feed(r, NULL, 0, &ev), 0);
  assert_int_equal(cm.live, base);
  /* A small one is kept for the next message. */
  free(s.p);
  memset(&s, 0, sizeof s);
  b_header(&s, HR_MSG_LIST_RESPONSE, 3, 1000);
  b_fill(&s, 1000, 1);
  assert_int_equal(hr_reader_feed(r, s.p, 500, &ev), 500);
  assert_int_equal(hr_reader_feed(r, s.p + 500, s.len - 500, &ev),
                   (int64_t)(s.len - 500));
  assert_int_equal(hr_reader_feed(r, NULL, 0, &ev), 0);
  assert_true(cm.live > base);
  hr_reader_del(r);
  assert_int_equal(cm.live, 0);
  free(s.p);
}

static void nomem(void **state) {
  (void)state;
  count_mem cm = {0, 0, 0};
  hr_mem mem = {&cm, cm_malloc, cm_free, cm_calloc, cm_realloc};
  hr_reader *r = (hr_reader *)1;
  assert_int_equal(hr_reader_new(&r, NULL, &mem), HR_ERR_NOMEM);
  assert_null(r);
  cm.fail_after = 1;
  assert_int_equal(hr_reader_new(&r, NULL, &mem), 0);
  bytes s;
  memset(&s, 0, sizeof s);
  b_header(&s, HR_MSG_TENSOR_DESCRIPTOR, 1, 40);
  b_fill(&s, 40, 1);
  hr_reader_event ev;
  assert_int_equal(hr_reader_feed(r, s.p, 20, &ev), HR_ERR_NOMEM);
  hr_reader_del(r);
  assert_int_equal(cm.live, 0);
  free(s.p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(split_whole_and_bytewise),
      cmocka_unit_test(split_two_way),
      cmocka_unit_test(split_random),
      cmocka_unit_test(fast_path_points_into_input),
      cmocka_unit_test(empty_first_piece_and_skip),
      cmocka_unit_test(too_large_is_fatal),
      cmocka_unit_test(stream0_rejections_are_fatal),
      cmocka_unit_test(rejection_before_payload),
      cmocka_unit_test(private_types),
      cmocka_unit_test(max_payload_changes),
      cmocka_unit_test(bad_arguments),
      cmocka_unit_test(hostile_length),
      cmocka_unit_test(large_buffer_released),
      cmocka_unit_test(nomem),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
