/* ERROR and GOAWAY (wire-v1 § 12), PING and PONG (§ 3). */
#include "msg_test.h"

static void error_msg(mb *m, uint32_t stream, uint32_t code, const void *text,
                      uint16_t n) {
  mb_begin(m, HR_MSG_ERROR, stream);
  mb_u32(m, code);
  mb_lstr(m, text, n);
}

static void test_error(void **state) {
  (void)state;
  mb m;
  hr_msg out;
  error_msg(&m, 3, HR_WIRE_NOT_FOUND, "no such key", 11);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.hdr.stream_id, 3);
  assert_int_equal(out.u.error.code, HR_WIRE_NOT_FOUND);
  assert_int_equal(out.u.error.message_len, 11);
  assert_ptr_equal(out.u.error.message, m.b + 18);
  expect_prefixes_malformed(&m, NULL);

  hr_msg b = {.hdr = {HR_MSG_ERROR, 3, 0}};
  b.u.error =
      (hr_error_msg){HR_WIRE_NOT_FOUND, (const uint8_t *)"no such key", 11};
  expect_encodes(&b, &m);

  /* On stream 0, with an empty text; a reserved code (treated as
   * INTERNAL by the reader, accepted by the decoder). */
  error_msg(&m, 0, HR_WIRE_UNSUPPORTED_VERSION, NULL, 0);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.error.message_len, 0);
  error_msg(&m, 2, 0x1234, "future", 6);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.error.code, 0x1234);
  error_msg(&m, 2, UINT32_MAX, NULL, 0);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);

  /* 1024 bytes of text (512 two-byte characters) is the limit. */
  uint8_t text[HR_MAX_TEXT + 2];
  for (size_t i = 0; i < sizeof text; i += 2) {
    text[i] = 0xC3;
    text[i + 1] = 0xA9;
  }
  error_msg(&m, 1, HR_WIRE_INTERNAL, text, HR_MAX_TEXT);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.error.message_len, HR_MAX_TEXT);
  out.u.error.message_len = HR_MAX_TEXT + 1;
  assert_int_equal(hr_wire_encoded_size(&out), HR_ERR_INVALID_ARGUMENT);
  out.u.error.message_len = 1;
  out.u.error.message = NULL;
  assert_int_equal(hr_wire_encoded_size(&out), HR_ERR_INVALID_ARGUMENT);
}

static void test_error_rejections(void **state) {
  (void)state;
  mb m;
  /* NO_ERROR belongs to GOAWAY. */
  error_msg(&m, 1, HR_WIRE_NO_ERROR, "ok", 2);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 12);
  /* Text above 1024 bytes, even when the bytes are there. */
  uint8_t text[HR_MAX_TEXT + 1];
  memset(text, 'm', sizeof text);
  error_msg(&m, 1, HR_WIRE_INTERNAL, text, HR_MAX_TEXT + 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 16);
  /* Bad UTF-8: at the text's first byte. */
  error_msg(&m, 1, HR_WIRE_INTERNAL, "\xFF\xFE", 2);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 18);
  error_msg(&m, 1, HR_WIRE_INTERNAL, "ok\xE2\x82", 4);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 18);
  /* Length past the end; bytes left over. */
  error_msg(&m, 1, HR_WIRE_INTERNAL, "bye", 3);
  m.n--;
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 16);
  error_msg(&m, 1, HR_WIRE_INTERNAL, "bye", 3);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 21);
}

static void goaway(mb *m, uint32_t last, uint32_t code, const void *text,
                   uint16_t n) {
  mb_begin(m, HR_MSG_GOAWAY, 0);
  mb_u32(m, last);
  mb_u32(m, code);
  mb_lstr(m, text, n);
}

static void test_goaway(void **state) {
  (void)state;
  mb m;
  hr_msg out;
  goaway(&m, 17, HR_WIRE_NO_ERROR, "restart", 7);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.goaway.last_stream_id, 17);
  assert_int_equal(out.u.goaway.code, HR_WIRE_NO_ERROR);
  assert_int_equal(out.u.goaway.message_len, 7);
  assert_memory_equal(out.u.goaway.message, "restart", 7);
  expect_prefixes_malformed(&m, NULL);

  hr_msg b = {.hdr = {HR_MSG_GOAWAY, 0, 0}};
  b.u.goaway = (hr_goaway){17, HR_WIRE_NO_ERROR, (const uint8_t *)"restart", 7};
  expect_encodes(&b, &m);
  b.u.goaway.message_len = HR_MAX_TEXT + 1;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);

  goaway(&m, UINT32_MAX, HR_WIRE_RESOURCE_EXHAUSTED, NULL, 0);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.goaway.code, HR_WIRE_RESOURCE_EXHAUSTED);

  /* Rejections: cut inside the message length, text too long, bad
   * UTF-8, bytes left over. */
  mb_begin(&m, HR_MSG_GOAWAY, 0);
  mb_u32(&m, 1);
  mb_u32(&m, 0);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 20);
  uint8_t text[HR_MAX_TEXT + 1];
  memset(text, 'g', sizeof text);
  goaway(&m, 1, 0, text, HR_MAX_TEXT + 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 20);
  goaway(&m, 1, 0, "\xED\xB0\x80", 3);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 22);
  goaway(&m, 1, 0, "x", 1);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 23);
}

static void test_ping_pong(void **state) {
  (void)state;
  static const uint32_t types[] = {HR_MSG_PING, HR_MSG_PONG};
  for (int i = 0; i < 2; i++) {
    mb m;
    hr_msg out;
    mb_begin(&m, types[i], 0);
    mb_u64(&m, 0x0102030405060708ull);
    mb_end(&m);
    expect_roundtrip(&m, NULL, &out);
    assert_true(out.u.ping == 0x0102030405060708ull);
    expect_prefixes_malformed(&m, NULL);
    hr_msg b = {.hdr = {types[i], 0, 0}, .u.ping = 0x0102030405060708ull};
    expect_encodes(&b, &m);

    /* Exactly 8 bytes. */
    mb_begin(&m, types[i], 0);
    mb_fill(&m, 0, 7);
    mb_end(&m);
    expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 12);
    mb_begin(&m, types[i], 0);
    mb_fill(&m, 0, 9);
    mb_end(&m);
    expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 20);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_error),
      cmocka_unit_test(test_error_rejections),
      cmocka_unit_test(test_goaway),
      cmocka_unit_test(test_ping_pong),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
