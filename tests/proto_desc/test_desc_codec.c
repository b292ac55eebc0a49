/*
 * Descriptor codec: layout entries, descriptor and transport field framing,
 * encode -> decode round trips of every layout, and the check order the
 * wire-v1 vectors imply (framing first, but rank and buffer_count before
 * the arrays they size).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "desc_fixtures.h"

#define BUF_CAP 4096

static const hr_wire_ctx net = {HR_TRANSPORT_NETWORK, 0};
static const hr_wire_ctx local = {HR_TRANSPORT_LOCAL, 0};

/* ---- layout entries ---------------------------------------------------- */

static int entry_decode(const uint8_t *in, size_t len, int where,
                        hr_layout_entry *e, hr_wire_status *st,
                        size_t *used) {
  hr_cursor c;
  hr_cursor_init(&c, in, len, 40);
  int rv = hr__layout_entry_decode(&c, where, e, st);
  *used = c.pos;
  return rv;
}

static void test_layout_entry_plain_and_ext(void **state) {
  (void)state;
  hr_layout_entry e;
  hr_wire_status st;
  size_t used;
  const uint8_t plain[] = {HR_LAYOUT_TILED, 0x99};
  assert_int_equal(entry_decode(plain, sizeof plain, HR_LE_LIST, &e, &st,
                                &used), 0);
  assert_int_equal(e.tag, HR_LAYOUT_TILED);
  assert_int_equal(e.ext_len, 0);
  assert_null(e.ext);
  assert_int_equal(used, 1);
  assert_int_equal(hr__layout_entry_size(&e), 1);

  const uint8_t ext[] = {0xF0, 4, 0, 8, 0, 0, 0, 0x99};
  assert_int_equal(entry_decode(ext, sizeof ext, HR_LE_DESCRIPTOR, &e, &st,
                                &used), 0);
  assert_int_equal(e.tag, 0xF0);
  assert_int_equal(e.ext_len, 4);
  assert_ptr_equal(e.ext, ext + 3);
  assert_int_equal(used, 7);
  assert_int_equal(hr__layout_entry_size(&e), 7);
  uint8_t out[16];
  assert_ptr_equal(hr__layout_entry_encode(out, &e), out + 7);
  assert_memory_equal(out, ext, 7);

  /* An extension entry with empty metadata is three bytes. */
  const uint8_t empty_ext[] = {0xFE, 0, 0};
  assert_int_equal(entry_decode(empty_ext, sizeof empty_ext, HR_LE_LIST, &e,
                                &st, &used), 0);
  assert_int_equal(e.ext_len, 0);
  assert_int_equal(hr__layout_entry_size(&e), 3);
  assert_ptr_equal(hr__layout_entry_encode(out, &e), out + 3);
  assert_memory_equal(out, empty_ext, 3);
}

static void test_layout_entry_list_rejects_0_and_ff(void **state) {
  (void)state;
  hr_layout_entry e;
  hr_wire_status st;
  size_t used;
  const uint8_t bad_tags[] = {0x00, 0xFF};
  for (unsigned i = 0; i < sizeof bad_tags; i++) {
    assert_int_equal(entry_decode(&bad_tags[i], 1, HR_LE_LIST, &e, &st,
                                  &used), HR_ERR_PROTO);
    assert_int_equal(st.code, HR_WIRE_MALFORMED_PAYLOAD);
    assert_int_equal(st.offset, 40);
    /* In a descriptor the tag is left to validation. */
    assert_int_equal(entry_decode(&bad_tags[i], 1, HR_LE_DESCRIPTOR, &e,
                                  &st, &used), 0);
    assert_int_equal(e.tag, bad_tags[i]);
  }
  /* Reserved (unassigned) tags are kept in a list: readers skip them. */
  const uint8_t reserved[] = {0x0A, 0x0C, 0xEF};
  for (unsigned i = 0; i < sizeof reserved; i++)
    assert_int_equal(entry_decode(&reserved[i], 1, HR_LE_LIST, &e, &st,
                                  &used), 0);
}

static void test_layout_entry_truncated(void **state) {
  (void)state;
  hr_layout_entry e;
  hr_wire_status st;
  size_t used;
  /* No tag at all. */
  assert_int_equal(entry_decode((const uint8_t *)"", 0, HR_LE_LIST, &e, &st,
                                &used), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_MALFORMED_PAYLOAD);
  assert_int_equal(st.offset, 40);
  /* Half a length, and a length past the end: reported at the length. */
  const uint8_t half[] = {0xF3, 2};
  const uint8_t past[] = {0xF3, 5, 0, 1, 2, 3, 4};
  assert_int_equal(entry_decode(half, sizeof half, HR_LE_LIST, &e, &st,
                                &used), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_MALFORMED_PAYLOAD);
  assert_int_equal(st.offset, 41);
  assert_int_equal(entry_decode(past, sizeof past, HR_LE_DESCRIPTOR, &e, &st,
                                &used), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_MALFORMED_PAYLOAD);
  assert_int_equal(st.offset, 41);
}

/* ---- round trips -------------------------------------------------------- */

static void roundtrip(const hr_descriptor *d, const hr_transport_fields *x,
                      const hr_wire_ctx *ctx) {
  uint8_t buf[BUF_CAP], again[BUF_CAP];
  hr_descriptor dec;
  hr_transport_fields xdec;
  hr_wire_status st = {0};
  int rv = hr_descriptor_validate(d, x, ctx, 0, &st);
  if (rv != 0)
    fail_msg("valid fixture rejected: %s", st.reason);
  size_t n = fx_encode(d, x, buf, sizeof buf);
  rv = fx_decode_validate(buf, n, 12, ctx, &dec, &xdec, &st);
  if (rv != 0)
    fail_msg("decoded fixture rejected: %s at %u", st.reason, st.offset);
  fx_assert_desc_equal(d, &dec);
  assert_int_equal(x->total_data_bytes, xdec.total_data_bytes);
  assert_int_equal(x->shard_index, xdec.shard_index);
  assert_int_equal(x->total_shards, xdec.total_shards);
  assert_int_equal(x->data_plane, xdec.data_plane);
  /* The decoded form re-encodes to the same bytes. */
  assert_int_equal(fx_encode(&dec, &xdec, again, sizeof again), n);
  assert_memory_equal(buf, again, n);
}

static void test_roundtrip_every_fixture(void **state) {
  (void)state;
  for (int k = 0; k < FX_COUNT; k++) {
    hr_descriptor d;
    hr_transport_fields x;
    fx_build(k, &d, &x);
    print_message("fixture %s\n", fx_names[k]);
    roundtrip(&d, &x, &net);
  }
}

/* Descriptors handed over locally: device buffers, every sync_mode,
 * device_index and byte_offset. */
static void test_roundtrip_local_device(void **state) {
  (void)state;
  const uint8_t modes[] = {HR_SYNC_PRODUCER_SYNCED, HR_SYNC_EVENT,
                           HR_SYNC_CONSUMER_STREAM};
  for (unsigned m = 0; m < sizeof modes; m++) {
    hr_descriptor d;
    hr_transport_fields x;
    fx_build(FX_CSR, &d, &x);
    d.byte_offset = 4096;
    for (unsigned i = 0; i < d.buffer_count; i++) {
      d.buffers[i].device_tag = HR_DEV_CUDA;
      d.buffers[i].memory_class = HR_MEM_UNIFIED;
      d.buffers[i].device_index = 3;
      d.buffers[i].sync_mode = modes[m];
      d.buffers[i].alignment_log2 = (uint8_t)(19 + i);
    }
    roundtrip(&d, &x, &local);
  }
}

/* Large values survive: u64 sizes and offsets, negative strides, the
 * largest rank, 8 buffers and long metadata. */
static void test_roundtrip_extremes(void **state) {
  (void)state;
  hr_descriptor d;
  hr_transport_fields x;

  fx_build(FX_STRIDED, &d, &x);
  d.params.origin = 5;
  d.params.strides[0] = -3;
  d.params.strides[1] = -1;
  d.buffers[0].size_bytes = UINT64_MAX / 2;
  x.total_data_bytes = UINT64_MAX / 2;
  roundtrip(&d, &x, &net);

  fx_build(FX_ROW_MAJOR, &d, &x);
  d.element_type = HR_ELEM_UINT8;
  d.rank = HR_MAX_RANK;
  for (unsigned k = 0; k < HR_MAX_RANK; k++)
    d.shape[k] = k % 2 + 1;
  d.buffers[0].size_bytes = 1u << 16;
  x.total_data_bytes = 1u << 16;
  roundtrip(&d, &x, &net);

  static uint8_t meta[65535];
  static const uint8_t raw[] = {1, 2, 3, 4, 5};
  fx_build(FX_EXTENSION, &d, &x);
  memset(meta, 0x5A, sizeof meta);
  d.layout.ext = meta;
  d.layout.ext_len = sizeof meta;
  d.params_raw = raw;
  d.params_len = sizeof raw;
  d.buffer_count = HR_MAX_BUFFERS;
  x.total_data_bytes = 0;
  for (unsigned i = 0; i < HR_MAX_BUFFERS; i++) {
    d.buffers[i].size_bytes = 1000 + i;
    x.total_data_bytes += 1000 + i;
  }
  int64_t n = hr__desc_encoded_size(&d);
  assert_int_equal(n, 4 + 3 + 65535 + 16 + 2 + 5 + 8 + 1 + 16 * 8);
  static uint8_t big[4 + 3 + 65535 + 16 + 2 + 5 + 8 + 1 + 16 * 8 + 16];
  uint8_t *end = hr__desc_encode(big, &d);
  end = hr__xport_encode(end, &x);
  assert_int_equal(end - big, sizeof big);
  hr_descriptor dec;
  hr_transport_fields xdec;
  hr_wire_status st;
  assert_int_equal(fx_decode_validate(big, sizeof big, 0, &net, &dec, &xdec,
                                      &st), 0);
  fx_assert_desc_equal(&d, &dec);
}

/* Encoding writes `params` for known layouts whatever params_raw says, and
 * zeros for reserved bytes. */
static void test_encode_uses_parsed_params_and_zero_reserved(void **state) {
  (void)state;
  hr_descriptor d;
  hr_transport_fields x;
  uint8_t a[BUF_CAP], b[BUF_CAP];
  fx_build(FX_TILED, &d, &x);
  size_t n = fx_encode(&d, &x, a, sizeof a);
  static const uint8_t junk[] = {9, 9, 9};
  d.params_raw = junk;
  d.params_len = sizeof junk;
  d.buffers[0].reserved[0] = 7;
  d.buffers[0].reserved[1] = 7;
  assert_int_equal(fx_encode(&d, &x, b, sizeof b), n);
  assert_memory_equal(a, b, n);
}

static void test_encoded_size_refuses(void **state) {
  (void)state;
  hr_descriptor d;
  hr_transport_fields x;
  fx_build(FX_ROW_MAJOR, &d, &x);
  d.rank = HR_MAX_RANK + 1;
  assert_int_equal(hr__desc_encoded_size(&d), -1);
  fx_build(FX_EXTENSION, &d, &x);
  d.buffer_count = HR_MAX_BUFFERS + 1;
  assert_int_equal(hr__desc_encoded_size(&d), -1);
  fx_build(FX_EXTENSION, &d, &x);
  d.layout.ext = NULL;
  assert_int_equal(hr__desc_encoded_size(&d), -1);
  fx_build(FX_EXTENSION, &d, &x);
  d.params_raw = NULL;
  assert_int_equal(hr__desc_encoded_size(&d), -1);
  /* A reserved tag's parameters are opaque too. */
  fx_build(FX_ROW_MAJOR, &d, &x);
  d.layout.tag = 0x0C;
  d.params_len = 2;
  assert_int_equal(hr__desc_encoded_size(&d), -1);
  /* Known layouts ignore params_len: the length follows from the layout. */
  fx_build(FX_ROW_MAJOR, &d, &x);
  d.params_len = 2;
  assert_int_equal(hr__desc_encoded_size(&d), 4 + 1 + 16 + 2 + 8 + 1 + 16);
}

/* ---- framing ------------------------------------------------------------ */

static void expect_fail(int rv, const hr_wire_status *st, uint32_t code,
                        uint32_t offset) {
  assert_int_equal(rv, HR_ERR_PROTO);
  if (st->code != code || st->offset != offset)
    fail_msg("got code %u at %u (%s), want %u at %u", st->code, st->offset,
             st->reason, code, offset);
  assert_non_null(st->reason);
}

/* Every strict prefix of a valid descriptor is MALFORMED_PAYLOAD, reported
 * at or before its end; a trailing byte too. */
static void test_every_prefix_is_malformed(void **state) {
  (void)state;
  for (int k = 0; k < FX_COUNT; k++) {
    hr_descriptor d, dec;
    hr_transport_fields x, xdec;
    hr_wire_status st;
    uint8_t buf[BUF_CAP];
    fx_build(k, &d, &x);
    size_t n = fx_encode(&d, &x, buf, sizeof buf - 1);
    for (size_t len = 0; len < n; len++) {
      int rv = fx_decode_validate(buf, len, 12, &net, &dec, &xdec, &st);
      assert_int_equal(rv, HR_ERR_PROTO);
      assert_int_equal(st.code, HR_WIRE_MALFORMED_PAYLOAD);
      assert_true(st.offset <= 12 + len);
    }
    buf[n] = 0;
    expect_fail(fx_decode_validate(buf, n + 1, 12, &net, &dec, &xdec, &st),
                &st, HR_WIRE_MALFORMED_PAYLOAD, (uint32_t)(12 + n));
  }
}

static void test_decode_truncation_offsets(void **state) {
  (void)state;
  hr_descriptor d;
  hr_transport_fields x;
  hr_wire_status st;
  uint8_t buf[BUF_CAP];
  /* FLOAT32 2x3 ROW_MAJOR: header 0-3, tag 4, shape 5-20, params_len
   * 21-22, byte_offset 23-30, buffer_count 31, buffer 32-47, transport
   * 48-63.  A cut is reported at the field it falls in. */
  fx_build(FX_ROW_MAJOR, &d, &x);
  size_t n = fx_encode(&d, &x, buf, sizeof buf);
  assert_int_equal(n, 64);
  static const struct {
    size_t len;
    uint32_t offset;
  } cuts[] = {{0, 0},   {2, 2},   {3, 3},   {4, 4},   {5, 5},   {12, 5},
              {13, 13}, {22, 21}, {23, 23}, {31, 31}, {32, 32}, {40, 40},
              {47, 47}, {48, 48}, {59, 58}, {63, 61}};
  for (unsigned i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    hr_descriptor dec;
    hr_transport_fields xdec;
    expect_fail(fx_decode_validate(buf, cuts[i].len, 0, &net, &dec, &xdec,
                                   &st),
                &st, HR_WIRE_MALFORMED_PAYLOAD, cuts[i].offset);
  }
  /* layout_params longer than what is left: reported at the length. */
  hr_descriptor dec;
  hr_transport_fields xdec;
  buf[21] = 0xF4;
  buf[22] = 0x01;
  expect_fail(fx_decode_validate(buf, n, 0, &net, &dec, &xdec, &st), &st,
              HR_WIRE_MALFORMED_PAYLOAD, 21);
}

/* rank and buffer_count size fixed arrays: they are judged as soon as they
 * are read, before the fields they size. */
static void test_decode_caps_before_arrays(void **state) {
  (void)state;
  hr_descriptor d;
  hr_transport_fields x;
  hr_wire_status st;
  const uint8_t rank33[] = {1, HR_ELEM_UINT8, 33};
  expect_fail(fx_decode_validate(rank33, sizeof rank33, 12, &net, &d, &x,
                                 &st),
              &st, HR_WIRE_INVALID_DESCRIPTOR, 14);
  const uint8_t rank255[] = {1, HR_ELEM_UINT8, 255, 0, 1};
  expect_fail(fx_decode_validate(rank255, sizeof rank255, 0, &net, &d, &x,
                                 &st),
              &st, HR_WIRE_INVALID_DESCRIPTOR, 2);
  /* rank 1, extension layout, empty params, buffer_count 9 and nothing
   * after it. */
  const uint8_t count9[] = {1, HR_ELEM_UINT8, 1, 0, 0xF9, 0, 0,
                            4, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                            0, 0, 0, 0, 0, 0, 0, 0, 9};
  expect_fail(fx_decode_validate(count9, sizeof count9, 0, &net, &d, &x,
                                 &st),
              &st, HR_WIRE_INVALID_DESCRIPTOR, 25);
}

static void test_xport_decode(void **state) {
  (void)state;
  hr_transport_fields x = {.total_data_bytes = 0x0102030405060708ull,
                           .shard_index = 0x0A0B,
                           .total_shards = 0x0C0D,
                           .data_plane = HR_PLANE_SHM};
  uint8_t buf[HR_XPORT_SIZE + 1];
  assert_ptr_equal(hr__xport_encode(buf, &x), buf + HR_XPORT_SIZE);
  const uint8_t want[HR_XPORT_SIZE] = {8, 7, 6,   5,   4,   3, 2, 1,
                                       0x0B, 0x0A, 0x0D, 0x0C, 2, 0, 0, 0};
  assert_memory_equal(buf, want, sizeof want);

  hr_cursor c;
  hr_transport_fields y;
  hr_wire_status st;
  hr_cursor_init(&c, buf, HR_XPORT_SIZE, 100);
  assert_int_equal(hr__xport_decode(&c, &y, &st), 0);
  assert_int_equal(y.total_data_bytes, x.total_data_bytes);
  assert_int_equal(y.shard_index, x.shard_index);
  assert_int_equal(y.total_shards, x.total_shards);
  assert_int_equal(y.data_plane, x.data_plane);

  /* Reported at the field that does not fit. */
  hr_cursor_init(&c, buf, HR_XPORT_SIZE - 1, 100);
  expect_fail(hr__xport_decode(&c, &y, &st), &st, HR_WIRE_MALFORMED_PAYLOAD,
              113);
  hr_cursor_init(&c, buf, 9, 100);
  expect_fail(hr__xport_decode(&c, &y, &st), &st, HR_WIRE_MALFORMED_PAYLOAD,
              108);
  buf[12] = 3;
  hr_cursor_init(&c, buf, HR_XPORT_SIZE, 100);
  expect_fail(hr__xport_decode(&c, &y, &st), &st, HR_WIRE_MALFORMED_PAYLOAD,
              112);
  buf[12] = 0;
  for (unsigned r = 13; r < 16; r++) {
    buf[r] = 0x80;
    hr_cursor_init(&c, buf, HR_XPORT_SIZE, 100);
    expect_fail(hr__xport_decode(&c, &y, &st), &st,
                HR_WIRE_MALFORMED_PAYLOAD, 100 + r);
    buf[r] = 0;
  }
}

/* ---- layout_params length on the wire ------------------------------------ */

/* Re-frames a fixture's encoding with `new_len` bytes of layout_params:
 * the old bytes are kept up to the new length, the rest are `fill`. */
static size_t reframe_params(int kind, uint16_t new_len, uint8_t fill,
                             uint8_t *out, uint32_t *len_at) {
  hr_descriptor d;
  hr_transport_fields x;
  uint8_t enc[BUF_CAP];
  fx_build(kind, &d, &x);
  size_t n = fx_encode(&d, &x, enc, sizeof enc);
  size_t at = 4 + hr__layout_entry_size(&d.layout) + 8u * d.rank;
  size_t old_len = enc[at] | (enc[at + 1] << 8);
  memcpy(out, enc, at);
  out[at] = (uint8_t)new_len;
  out[at + 1] = (uint8_t)(new_len >> 8);
  for (size_t i = 0; i < new_len; i++)
    out[at + 2 + i] = i < old_len ? enc[at + 2 + i] : fill;
  size_t rest = n - (at + 2 + old_len);
  memcpy(out + at + 2 + new_len, enc + at + 2 + old_len, rest);
  *len_at = (uint32_t)at;
  return at + 2 + new_len + rest;
}

static void test_params_length_mismatch(void **state) {
  (void)state;
  static const struct {
    int kind;
    uint16_t len;
    uint8_t fill;
    uint32_t code;
  } cases[] = {
      {FX_ROW_MAJOR, 1, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_COLUMN_MAJOR, 8, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_STRIDED, 16, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_STRIDED, 25, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_PERMUTED, 2, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_TILED, 12, 1, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_COO, 9, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_CSR, 10, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_CSC, 0, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_BSR, 16, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_PANEL, 4, 4, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_TUPLE, 4, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_TUPLE, 6, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_CONCAT, 5, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_GQ, 10, 0, HR_WIRE_INVALID_DESCRIPTOR},
      {FX_GQ, 0, 0, HR_WIRE_INVALID_DESCRIPTOR},
  };
  for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t buf[BUF_CAP];
    uint32_t len_at;
    hr_descriptor d;
    hr_transport_fields x;
    hr_wire_status st;
    size_t n = reframe_params(cases[i].kind, cases[i].len, cases[i].fill, buf,
                              &len_at);
    print_message("%s with %u params bytes\n", fx_names[cases[i].kind],
                  cases[i].len);
    expect_fail(fx_decode_validate(buf, n, 12, &net, &d, &x, &st), &st,
                cases[i].code, 12 + len_at);
  }
  /* Extension parameters are opaque: any length is fine. */
  for (uint16_t len = 0; len < 20; len += 7) {
    uint8_t buf[BUF_CAP];
    uint32_t len_at;
    hr_descriptor d;
    hr_transport_fields x;
    hr_wire_status st;
    size_t n = reframe_params(FX_EXTENSION, len, 0xEE, buf, &len_at);
    assert_int_equal(fx_decode_validate(buf, n, 0, &net, &d, &x, &st), 0);
    assert_int_equal(d.params_len, len);
    assert_ptr_equal(d.params_raw, buf + len_at + 2);
  }
}

/* A composite head with an undefined rule: the length cannot be judged, the
 * rule is a head value (COMPOSITE_INVALID at the rule byte). */
static void test_composite_unknown_rule_on_wire(void **state) {
  (void)state;
  for (uint16_t len = 5; len <= 7; len++) {
    uint8_t buf[BUF_CAP];
    uint32_t len_at;
    hr_descriptor d;
    hr_transport_fields x;
    hr_wire_status st;
    size_t n = reframe_params(FX_TUPLE, len, 0, buf, &len_at);
    buf[len_at + 2 + 4] = 3; /* rule */
    expect_fail(fx_decode_validate(buf, n, 12, &net, &d, &x, &st), &st,
                HR_WIRE_COMPOSITE_INVALID, 12 + len_at + 2 + 4);
    assert_int_equal(d.params.member_count, 2);
    assert_int_equal(d.params.rule, 3);
  }
}

/* ---- mutated inputs ---------------------------------------------------- */

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Random byte changes to every fixture (fixed seed): decoding and
 * validation either reject with a status or accept, and whatever they
 * accept re-encodes to exactly the input and validates as a struct too. */
static void test_mutated_inputs(void **state) {
  (void)state;
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (int k = 0; k < FX_COUNT; k++) {
    hr_descriptor d;
    hr_transport_fields x;
    uint8_t orig[BUF_CAP], buf[BUF_CAP], again[BUF_CAP];
    fx_build(k, &d, &x);
    size_t n = fx_encode(&d, &x, orig, sizeof orig);
    for (int round = 0; round < 3000; round++) {
      memcpy(buf, orig, n);
      unsigned flips = 1 + (unsigned)(xorshift(&seed) % 3);
      for (unsigned f = 0; f < flips; f++)
        buf[xorshift(&seed) % n] ^= (uint8_t)(1u << (xorshift(&seed) % 8));
      size_t len = n - (size_t)(xorshift(&seed) % 4 == 0 ? 1 : 0);
      hr_descriptor dec;
      hr_transport_fields xdec;
      hr_wire_status st = {0};
      int rv = fx_decode_validate(buf, len, 0, &net, &dec, &xdec, &st);
      if (rv != 0) {
        assert_int_equal(rv, HR_ERR_PROTO);
        assert_non_null(st.reason);
        assert_true(st.offset <= len);
        continue;
      }
      assert_int_equal(fx_encode(&dec, &xdec, again, sizeof again), len);
      assert_memory_equal(again, buf, len);
      assert_int_equal(hr_descriptor_validate(&dec, &xdec, &net, 0, &st), 0);
    }
  }
}

/* ---- vectors whose check order matters (wire-v1 vectors, verbatim) ------ */

typedef struct vector_case {
  const char *name;
  int local;
  uint32_t code; /* HR_WIRE_NO_ERROR: valid */
  uint32_t offset;
  const char *hex;
} vector_case;

static const vector_case vectors[] = {
    {"lim_rank_33", 0, HR_WIRE_INVALID_DESCRIPTOR, 14,
     "04000000010000003801000001032100010100000000000000010000000000000001"
     "00000000000000010000000000000001000000000000000100000000000000010000"
     "00000000000100000000000000010000000000000001000000000000000100000000"
     "00000001000000000000000100000000000000010000000000000001000000000000"
     "00010000000000000001000000000000000100000000000000010000000000000001"
     "00000000000000010000000000000001000000000000000100000000000000010000"
     "00000000000100000000000000010000000000000001000000000000000100000000"
     "00000001000000000000000100000000000000010000000000000001000000000000"
     "00010000000000000000000000000000000000010100000000000000060000000000"
     "000001000000000000000000010000000000"},
    {"lim_truncated_in_shape", 0, HR_WIRE_MALFORMED_PAYLOAD, 25,
     "040000000100000010000000010c0200010200000000000000030000"},
    {"lim_layout_params_overrun", 0, HR_WIRE_MALFORMED_PAYLOAD, 25,
     "040000000100000038000000010c0100010200000000000000f40100000000000000"
     "00010800000000000000060000000000000008000000000000000000010000000000"},
    {"lim_trailing_byte", 0, HR_WIRE_MALFORMED_PAYLOAD, 76,
     "040000000100000041000000010c0200010200000000000000030000000000000000"
     "00000000000000000001180000000000000006000000000000001800000000000000"
     "000001000000000000"},
    {"lim_transport_reserved", 0, HR_WIRE_MALFORMED_PAYLOAD, 66,
     "040000000100000038000000010c0100010200000000000000000000000000000000"
     "00010800000000000000060000000000000008000000000000000000010000000100"},
    {"lim_shard_index_eq_total", 0, HR_WIRE_INVALID_DESCRIPTOR, 76,
     "040000000100000048000000010c0101010200000000000000000000000000000000"
     "00040000000000000002000000000000000108000000000000000600000000000000"
     "08000000000000000200020000000000"},
    /* Its buffer_count is 0 while a 16-byte handle follows: decoded as a
     * head with total_shards 0 and 16 trailing bytes, it is rejected by
     * validation before the trailing bytes are looked at. */
    {"comp_with_buffer", 0, HR_WIRE_INVALID_DESCRIPTOR, 43,
     "040000000100000035000000010000000b0500020000000000000000000000000000"
     "00000000000000000000000000000000000000000000000000010000000000"},
    {"buf_reserved_nonzero", 0, HR_WIRE_INVALID_DESCRIPTOR, 50,
     "040000000100000038000000010c0100010400000000000000000000000000000000"
     "00011000000000000000060000000000010010000000000000000000010000000000"},
    {"buf_rocm_offset_local", 1, HR_WIRE_NO_ERROR, 0,
     "040000000100000038000000010c0100010400000000000000000000100000000000"
     "00011000000000000000060200010000000010000000000000000000010000000000"},
    {"buf_cpu_sync_consumer_stream_local", 1, HR_WIRE_INVALID_SYNC_MODE, 49,
     "040000000100000038000000010c0100010400000000000000000000000000000000"
     "00011000000000000000060000000002000010000000000000000000010000000000"},
    {"desc_extension_layout", 0, HR_WIRE_NO_ERROR, 0,
     "040000000100000059000000010c0200f70700100470616e656c0800000000000000"
     "08000000000000000000000000000000000002c80000000000000006000000000000"
     "003800000000000000060000000000000000010000000000000000010000000000"},
    {"prof_desc_panel_f32_padded", 0, HR_WIRE_NO_ERROR, 0,
     "040000000100000046000000010c0200f00400040000000a00000000000000030000"
     "00000000000000000000000000000001900000000000000006000000000000009000"
     "0000000000000000010000000000"},
};

/* Drives one TENSOR_DESCRIPTOR message through the descriptor codec the way
 * the message decoder does: descriptor, transport fields, validation, then
 * the check for leftover bytes. */
static void test_vectors_check_order(void **state) {
  (void)state;
  for (unsigned i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
    const vector_case *v = &vectors[i];
    uint8_t msg[BUF_CAP];
    size_t len = fx_unhex(v->hex, msg, sizeof msg);
    assert_int_equal(hr_load_u32(msg), HR_MSG_TENSOR_DESCRIPTOR);
    assert_int_equal(hr_load_u32(msg + 8), len - HR_HEADER_SIZE);
    hr_descriptor d;
    hr_transport_fields x;
    hr_wire_status st = {0};
    print_message("vector %s\n", v->name);
    int rv = fx_decode_validate(msg + HR_HEADER_SIZE, len - HR_HEADER_SIZE,
                                HR_HEADER_SIZE, v->local ? &local : &net, &d,
                                &x, &st);
    if (v->code == HR_WIRE_NO_ERROR) {
      if (rv != 0)
        fail_msg("%s rejected: %s at %u", v->name, st.reason, st.offset);
      uint8_t again[BUF_CAP];
      assert_int_equal(fx_encode(&d, &x, again, sizeof again),
                       len - HR_HEADER_SIZE);
      assert_memory_equal(again, msg + HR_HEADER_SIZE, len - HR_HEADER_SIZE);
    } else {
      expect_fail(rv, &st, v->code, v->offset);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout_entry_plain_and_ext),
      cmocka_unit_test(test_layout_entry_list_rejects_0_and_ff),
      cmocka_unit_test(test_layout_entry_truncated),
      cmocka_unit_test(test_roundtrip_every_fixture),
      cmocka_unit_test(test_roundtrip_local_device),
      cmocka_unit_test(test_roundtrip_extremes),
      cmocka_unit_test(test_encode_uses_parsed_params_and_zero_reserved),
      cmocka_unit_test(test_encoded_size_refuses),
      cmocka_unit_test(test_every_prefix_is_malformed),
      cmocka_unit_test(test_decode_truncation_offsets),
      cmocka_unit_test(test_decode_caps_before_arrays),
      cmocka_unit_test(test_xport_decode),
      cmocka_unit_test(test_params_length_mismatch),
      cmocka_unit_test(test_composite_unknown_rule_on_wire),
      cmocka_unit_test(test_mutated_inputs),
      cmocka_unit_test(test_vectors_check_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
