/*
 * The 12-byte header (wire-v1 § 2, § 3, § 18 "Check order for a header"),
 * whole-message framing, empty-payload messages, UTF-8 validation and the
 * encoder's argument checks.
 */
#include "msg_test.h"

static void test_header_parse_put(void **state) {
  (void)state;
  static const uint8_t bytes[12] = {0x05, 0,    0,    0,    0x78, 0x56,
                                    0x34, 0x12, 0x10, 0x20, 0x30, 0x40};
  hr_msg_header h;
  hr_wire_parse_header(bytes, &h);
  assert_int_equal(h.type, HR_MSG_TENSOR_DATA);
  assert_int_equal(h.stream_id, 0x12345678u);
  assert_int_equal(h.payload_length, 0x40302010u);
  uint8_t out[12];
  hr_wire_put_header(out, h.type, h.stream_id, h.payload_length);
  assert_memory_equal(out, bytes, 12);
}

static void check_header(uint32_t type, uint32_t stream, uint32_t len,
                         uint32_t max, const hr_wire_ctx *ctx, int want_rv,
                         uint32_t want_code, uint32_t want_offset) {
  hr_msg_header h = {type, stream, len};
  hr_wire_status st = {0, 0, NULL};
  int rv = hr_wire_check_header(&h, max, ctx, &st);
  assert_int_equal(rv, want_rv);
  if (rv) {
    assert_int_equal(st.code, want_code);
    assert_int_equal(st.offset, want_offset);
    assert_non_null(st.reason);
  }
}

static void test_check_header_order(void **state) {
  (void)state;
  const uint32_t big = HR_PREHELLO_MAX_PAYLOAD + 1;
  /* Size first: an unknown type on the wrong stream that is too large is
   * MESSAGE_TOO_LARGE (its payload is never read). */
  check_header(0x13, 0, big, HR_PREHELLO_MAX_PAYLOAD, NULL, HR_ERR_PROTO,
               HR_WIRE_MESSAGE_TOO_LARGE, 8);
  check_header(HR_MSG_PING, 3, big, HR_PREHELLO_MAX_PAYLOAD, NULL, HR_ERR_PROTO,
               HR_WIRE_MESSAGE_TOO_LARGE, 8);
  /* Exactly the limit is allowed (§ 18 "Small points"). */
  check_header(HR_MSG_PING, 0, HR_PREHELLO_MAX_PAYLOAD, HR_PREHELLO_MAX_PAYLOAD,
               NULL, 0, 0, 0);
  /* Type before placement. */
  check_header(0x13, 0, 0, UINT32_MAX, NULL, HR_ERR_PROTO,
               HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0);
  check_header(0x13, 5, 0, UINT32_MAX, NULL, HR_ERR_PROTO,
               HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0);
  /* Placement last. */
  check_header(HR_MSG_PING, 3, 8, UINT32_MAX, NULL, HR_ERR_PROTO,
               HR_WIRE_PROTOCOL_VIOLATION, 4);
}

static void test_check_header_unknown_types(void **state) {
  (void)state;
  static const uint32_t unknown[] = {0x00, 0x13, 0x80,  0xEF,  0xF0,
                                     0xFE, 0xFF, 0x100, 0x101, UINT32_MAX};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    check_header(unknown[i], 1, 0, UINT32_MAX, NULL, HR_ERR_PROTO,
                 HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0);
    check_header(unknown[i], 1, 0, UINT32_MAX, &test_net, HR_ERR_PROTO,
                 HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0);
  }
  /* Private types agreed out of band: 0xF0 and 0xFE, not 0xF1.  They
   * have no placement rule. */
  hr_wire_ctx ctx = {HR_TRANSPORT_NETWORK, (1u << 0) | (1u << 14)};
  check_header(0xF0, 0, 4, UINT32_MAX, &ctx, 0, 0, 0);
  check_header(0xF0, 7, 4, UINT32_MAX, &ctx, 0, 0, 0);
  check_header(0xFE, 7, 4, UINT32_MAX, &ctx, 0, 0, 0);
  check_header(0xF1, 7, 4, UINT32_MAX, &ctx, HR_ERR_PROTO,
               HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0);
  /* An agreement never makes 0xFF or values above it known. */
  ctx.private_types = 0xFFFF;
  check_header(0xFF, 0, 0, UINT32_MAX, &ctx, HR_ERR_PROTO,
               HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0);
  check_header(0x1F0, 0, 0, UINT32_MAX, &ctx, HR_ERR_PROTO,
               HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0);
  check_header(0xEF, 0, 0, UINT32_MAX, &ctx, HR_ERR_PROTO,
               HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0);
}

static void test_check_header_placement(void **state) {
  (void)state;
  /* § 3's stream column: 0 = stream 0 only, 1 = a request/put/list
   * stream only, 2 = any. */
  static const int where[HR_MSG_LAST_DEFINED + 1] = {
      [HR_MSG_CLIENT_HELLO] = 0,   [HR_MSG_SERVER_HELLO] = 0,
      [HR_MSG_TENSOR_REQUEST] = 1, [HR_MSG_TENSOR_DESCRIPTOR] = 1,
      [HR_MSG_TENSOR_DATA] = 1,    [HR_MSG_TENSOR_DATA_END] = 1,
      [HR_MSG_TENSOR_PUT] = 1,     [HR_MSG_TENSOR_PUT_ACK] = 1,
      [HR_MSG_ERROR] = 2,          [HR_MSG_CANCEL] = 1,
      [HR_MSG_GOAWAY] = 0,         [HR_MSG_RDMA_REGISTER] = 1,
      [HR_MSG_RDMA_READY] = 1,     [HR_MSG_PING] = 0,
      [HR_MSG_PONG] = 0,           [HR_MSG_BUFFER_RELEASE] = 1,
      [HR_MSG_LIST_REQUEST] = 1,   [HR_MSG_LIST_RESPONSE] = 1,
  };
  for (uint32_t t = 1; t <= HR_MSG_LAST_DEFINED; t++) {
    int zero_ok = where[t] != 1, stream_ok = where[t] != 0;
    check_header(t, 0, 0, UINT32_MAX, NULL, zero_ok ? 0 : HR_ERR_PROTO,
                 HR_WIRE_PROTOCOL_VIOLATION, 4);
    check_header(t, 1, 0, UINT32_MAX, NULL, stream_ok ? 0 : HR_ERR_PROTO,
                 HR_WIRE_PROTOCOL_VIOLATION, 4);
    check_header(t, UINT32_MAX, 0, UINT32_MAX, NULL,
                 stream_ok ? 0 : HR_ERR_PROTO, HR_WIRE_PROTOCOL_VIOLATION, 4);
  }
}

static void test_decode_framing(void **state) {
  (void)state;
  mb *m = malloc(sizeof *m);
  /* Fewer than 12 bytes: the header itself is cut. */
  static const uint8_t cut[11] = {6, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
  hr_wire_status st = {0, 0, NULL};
  assert_int_equal(decode_exact(cut, 11, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_MALFORMED_PAYLOAD);
  assert_int_equal(st.offset, 11);
  assert_int_equal(decode_exact(cut, 0, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_MALFORMED_PAYLOAD);

  /* payload_length must agree with the bytes given, both ways. */
  mb_begin(m, HR_MSG_PING, 0);
  mb_u64(m, 42);
  mb_end(m);
  m->n--;
  expect_reject(m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 8);
  m->n += 2;
  expect_reject(m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 8);

  /* Header checks come before the payload: an unknown type with a short
   * input is still UNKNOWN_MESSAGE_TYPE. */
  mb_begin(m, 0x13, 1);
  mb_u32(m, 0);
  mb_end(m);
  m->n--;
  expect_reject(m, NULL, HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0);

  /* A NULL status is allowed. */
  assert_int_equal(hr_wire_decode(m->b, m->n, NULL, &(hr_msg){0}, NULL),
                   HR_ERR_PROTO);
  free(m);
}

static void test_private_type_header_only(void **state) {
  (void)state;
  mb m;
  mb_begin(&m, 0xF3, 9);
  mb_u16(&m, 0xBEEF);
  mb_end(&m);
  hr_wire_ctx ctx = {HR_TRANSPORT_NETWORK, 1u << 3};
  hr_msg out;
  hr_wire_status st;
  assert_int_equal(hr_wire_decode(m.b, m.n, &ctx, &out, &st), 0);
  assert_int_equal(out.hdr.type, 0xF3);
  assert_int_equal(out.hdr.stream_id, 9);
  assert_int_equal(out.hdr.payload_length, 2);
  expect_reject(&m, NULL, HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0);
  /* The payload path alone also refuses an unagreed private type. */
  assert_int_equal(hr_wire_decode_payload(&out.hdr, m.b + 12, NULL, &out, &st),
                   HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_UNKNOWN_MESSAGE_TYPE);
  /* The codec cannot encode a payload it does not know. */
  assert_int_equal(hr_wire_encoded_size(&out), HR_ERR_INVALID_ARGUMENT);
  uint8_t buf[64];
  assert_int_equal(hr_wire_encode(&out, buf, sizeof buf),
                   HR_ERR_INVALID_ARGUMENT);
}

static void test_empty_payload_messages(void **state) {
  (void)state;
  static const uint32_t types[] = {HR_MSG_TENSOR_DATA_END,
                                   HR_MSG_TENSOR_PUT_ACK, HR_MSG_CANCEL,
                                   HR_MSG_RDMA_READY, HR_MSG_BUFFER_RELEASE};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    mb m;
    mb_begin(&m, types[i], 3);
    mb_end(&m);
    hr_msg out;
    expect_roundtrip(&m, NULL, &out);
    assert_int_equal(out.hdr.type, types[i]);
    assert_int_equal(out.hdr.stream_id, 3);
    hr_msg built = {.hdr = {types[i], 3, 99}};
    expect_encodes(&built, &m);
    /* Any payload byte is malformed, at the payload's first byte. */
    mb_u8(&m, 0);
    mb_end(&m);
    expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 12);
  }
}

static void test_decode_payload_path(void **state) {
  (void)state;
  /* The frame reader's path: header parsed apart, offsets still counted
   * from the header's first byte. */
  mb m;
  mb_begin(&m, HR_MSG_ERROR, 1);
  mb_u32(&m, 0); /* NO_ERROR: not allowed in ERROR */
  mb_str(&m, "x");
  mb_end(&m);
  hr_msg_header h;
  hr_wire_parse_header(m.b, &h);
  hr_msg out;
  hr_wire_status st;
  assert_int_equal(hr_wire_decode_payload(&h, m.b + 12, NULL, &out, &st),
                   HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_MALFORMED_PAYLOAD);
  assert_int_equal(st.offset, 12);
  m.b[12] = HR_WIRE_NOT_FOUND;
  assert_int_equal(hr_wire_decode_payload(&h, m.b + 12, NULL, &out, &st), 0);
  assert_int_equal(out.hdr.type, HR_MSG_ERROR);
  assert_int_equal(out.u.error.code, HR_WIRE_NOT_FOUND);
  /* An empty-payload message needs no payload pointer. */
  h = (hr_msg_header){HR_MSG_CANCEL, 1, 0};
  assert_int_equal(hr_wire_decode_payload(&h, NULL, NULL, &out, &st), 0);
}

static void test_utf8(void **state) {
  (void)state;
  static const struct {
    const char *s;
    int valid;
  } cases[] = {
      {"", 1},
      {"plain ascii, longer than eight bytes", 1},
      {"\xC3\xA9", 1},                 /* U+00E9 */
      {"\xDF\xBF", 1},                 /* U+07FF */
      {"\xE0\xA0\x80", 1},             /* U+0800 */
      {"\xE6\xA8\xA1\xE5\x9E\x8B", 1}, /* CJK */
      {"\xED\x9F\xBF", 1},             /* U+D7FF */
      {"\xEE\x80\x80", 1},             /* U+E000 */
      {"\xEF\xBF\xBF", 1},             /* U+FFFF */
      {"\xF0\x90\x80\x80", 1},         /* U+10000 */
      {"\xF4\x8F\xBF\xBF", 1},         /* U+10FFFF */
      {"abcdefgh\xC3\xA9ijklmnop", 1}, /* after the ASCII fast path */
      {"\x80", 0},                     /* lone continuation */
      {"\xBF", 0},
      {"\xC0\x80", 0},     /* overlong NUL */
      {"\xC1\xBF", 0},     /* overlong */
      {"\xC3", 0},         /* cut */
      {"\xC3(", 0},        /* bad continuation */
      {"\xE0\x80\x80", 0}, /* overlong */
      {"\xE0\x9F\xBF", 0}, /* overlong */
      {"\xED\xA0\x80", 0}, /* surrogate U+D800 */
      {"\xED\xBF\xBF", 0}, /* surrogate U+DFFF */
      {"\xE6\xA8", 0},     /* cut */
      {"\xE6\xA8(", 0},
      {"\xF0\x80\x80\x80", 0}, /* overlong */
      {"\xF0\x8F\xBF\xBF", 0}, /* overlong */
      {"\xF4\x90\x80\x80", 0}, /* U+110000 */
      {"\xF5\x80\x80\x80", 0},
      {"\xF8\x88\x80\x80\x80", 0},
      {"\xFE", 0},
      {"\xFF", 0},
      {"\xF0\x90\x80", 0}, /* cut */
      {"\xF0\x90\x80(", 0},
      {"abcdefghijklmno\xFF", 0}, /* after the ASCII fast path */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *s = cases[i].s;
    size_t n = strlen(s);
    /* An exact-size copy: the validator must not read past n. */
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, s, n);
    if (hr_utf8_valid(copy, n) != cases[i].valid)
      fail_msg("case %zu", i);
    free(copy);
  }
  assert_int_equal(hr_utf8_valid(NULL, 0), 1);
  /* Embedded NUL is a valid code point. */
  assert_int_equal(hr_utf8_valid((const uint8_t *)"a\0b", 3), 1);
}

static void test_encode_arguments(void **state) {
  (void)state;
  uint8_t buf[64];
  assert_int_equal(hr_wire_encoded_size(NULL), HR_ERR_INVALID_ARGUMENT);
  hr_msg m = {.hdr = {0x13, 1, 0}};
  assert_int_equal(hr_wire_encoded_size(&m), HR_ERR_INVALID_ARGUMENT);
  m.hdr.type = 0;
  assert_int_equal(hr_wire_encode(&m, buf, sizeof buf),
                   HR_ERR_INVALID_ARGUMENT);
  /* The header's payload_length is computed, not taken from hdr. */
  m = (hr_msg){.hdr = {HR_MSG_PING, 0, 12345}, .u.ping = 7};
  assert_int_equal(hr_wire_encode(&m, buf, sizeof buf), 20);
  assert_int_equal(buf[8], 8);
  assert_int_equal(buf[9] | buf[10] | buf[11], 0);
  assert_int_equal(hr_wire_encode(&m, NULL, 0), HR_ERR_BUFFER_TOO_SMALL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_header_parse_put),
      cmocka_unit_test(test_check_header_order),
      cmocka_unit_test(test_check_header_unknown_types),
      cmocka_unit_test(test_check_header_placement),
      cmocka_unit_test(test_decode_framing),
      cmocka_unit_test(test_private_type_header_only),
      cmocka_unit_test(test_empty_payload_messages),
      cmocka_unit_test(test_decode_payload_path),
      cmocka_unit_test(test_utf8),
      cmocka_unit_test(test_encode_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
