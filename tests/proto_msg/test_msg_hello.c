/* CLIENT_HELLO and SERVER_HELLO (wire-v1 § 6, § 18 "Lists"). */
#include "msg_test.h"

/* Offsets of the fixed fields. */
enum { OFF_MAGIC = 12, OFF_MAJOR = 16, OFF_MAX_SIZE = 24, OFF_LAYOUTS = 28 };

/* Writes the fixed fields of a HELLO. */
static void hello_fixed(mb *m, uint32_t type, uint32_t max_size) {
  mb_begin(m, type, 0);
  mb_u32(m, HR_MAGIC);
  mb_u16(m, 1);
  mb_u16(m, 0);
  mb_u32(m, HR_CAP_TENSOR_PUT | HR_CAP_LIST);
  mb_u32(m, max_size);
}

/* Layouts [ROW_MAJOR], devices [CPU], memory classes [STANDARD]. */
static void hello_lists(mb *m) {
  mb_u16(m, 1);
  mb_u8(m, HR_LAYOUT_ROW_MAJOR);
  mb_u16(m, 1);
  mb_u8(m, HR_DEV_CPU);
  mb_u16(m, 1);
  mb_u8(m, HR_MEM_STANDARD);
}

static void ext(mb *m, uint16_t type, const void *data, uint16_t len) {
  mb_u16(m, type);
  mb_u16(m, len);
  mb_bytes(m, data, len);
}

static const uint8_t token16[16] = {1, 2,  3,  4,  5,  6,  7,  8,
                                    9, 10, 11, 12, 13, 14, 15, 16};

static void test_client_hello_minimal(void **state) {
  (void)state;
  mb m;
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, 1u << 20);
  hello_lists(&m);
  mb_u16(&m, 0);
  mb_end(&m);

  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  const hr_hello *h = &out.u.hello;
  assert_int_equal(out.hdr.type, HR_MSG_CLIENT_HELLO);
  assert_int_equal(h->magic, HR_MAGIC);
  assert_int_equal(h->version_major, 1);
  assert_int_equal(h->version_minor, 0);
  assert_int_equal(h->capability_flags, HR_CAP_TENSOR_PUT | HR_CAP_LIST);
  assert_int_equal(h->max_message_size, 1u << 20);
  assert_int_equal(h->layout_count, 1);
  assert_int_equal(h->layouts[0].tag, HR_LAYOUT_ROW_MAJOR);
  assert_int_equal(h->device_count, 1);
  assert_int_equal(h->devices[0], HR_DEV_CPU);
  assert_int_equal(h->memory_class_count, 1);
  assert_int_equal(h->memory_classes[0], HR_MEM_STANDARD);
  assert_int_equal(h->ext_count, 0);
  assert_int_equal(h->ext_raw_len, 0);
  assert_null(h->exts.auth_token);
  assert_null(h->exts.peer_name);
  assert_int_equal(h->exts.has_fabric_address, 0);
  assert_int_equal(h->exts.max_shards, 0);
  expect_prefixes_malformed(&m, NULL);

  /* The same message built as a struct. */
  static const uint8_t cpu = HR_DEV_CPU, std_mem = HR_MEM_STANDARD;
  hr_msg b = {.hdr = {HR_MSG_CLIENT_HELLO, 0, 0}};
  b.u.hello = (hr_hello){.magic = HR_MAGIC,
                         .version_major = 1,
                         .capability_flags = HR_CAP_TENSOR_PUT | HR_CAP_LIST,
                         .max_message_size = 1u << 20,
                         .layout_count = 1,
                         .device_count = 1,
                         .devices = &cpu,
                         .memory_class_count = 1,
                         .memory_classes = &std_mem};
  b.u.hello.layouts[0].tag = HR_LAYOUT_ROW_MAJOR;
  expect_encodes(&b, &m);
}

static void test_client_hello_known_extensions(void **state) {
  (void)state;
  mb m;
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  hello_lists(&m);
  mb_u16(&m, 5);
  ext(&m, HR_EXT_AUTH_TOKEN, "secret", 6);
  ext(&m, HR_EXT_SESSION_JOIN, token16, 16);
  uint32_t fabric_off = mb_off(&m) + 4;
  mb_u16(&m, HR_EXT_FABRIC_ADDRESS);
  mb_u16(&m, 2 + 3 + 2 + 4);
  mb_str(&m, "tcp");
  mb_lstr(&m, "\x01\x02\x03\x04", 4);
  ext(&m, HR_EXT_PEER_NAME, "hurray/0.1 \xC3\xA9", 13);
  ext(&m, 0x7777, "future", 6); /* unknown: ignored */
  mb_end(&m);

  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  const hr_hello_exts *x = &out.u.hello.exts;
  assert_int_equal(out.u.hello.ext_count, 5);
  assert_int_equal(x->auth_token_len, 6);
  assert_memory_equal(x->auth_token, "secret", 6);
  assert_int_equal(x->session_join_len, 16);
  assert_memory_equal(x->session_join, token16, 16);
  assert_int_equal(x->has_fabric_address, 1);
  assert_int_equal(x->fabric_provider_len, 3);
  assert_memory_equal(x->fabric_provider, "tcp", 3);
  assert_ptr_equal(x->fabric_provider, m.b + fabric_off + 2);
  assert_int_equal(x->fabric_endpoint_len, 4);
  assert_memory_equal(x->fabric_endpoint, "\x01\x02\x03\x04", 4);
  assert_int_equal(x->peer_name_len, 13);
  assert_memory_equal(x->peer_name, "hurray/0.1 \xC3\xA9", 13);
  assert_null(x->session_token);
  assert_int_equal(x->max_shards, 0);
  expect_prefixes_malformed(&m, NULL);

  /* The raw list iterates back to the five TLVs, unknown one included. */
  size_t pos = 0;
  hr_ext e;
  static const uint16_t types[] = {1, 2, 4, 5, 0x7777};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(
        hr_ext_next(out.u.hello.ext_raw, out.u.hello.ext_raw_len, &pos, &e), 1);
    assert_int_equal(e.type, types[i]);
  }
  assert_int_equal(e.length, 6);
  assert_memory_equal(e.data, "future", 6);
  assert_int_equal(
      hr_ext_next(out.u.hello.ext_raw, out.u.hello.ext_raw_len, &pos, &e), 0);
}

static void test_server_hello_known_extensions(void **state) {
  (void)state;
  mb m;
  hello_fixed(&m, HR_MSG_SERVER_HELLO, 1u << 24);
  hello_lists(&m);
  mb_u16(&m, 4);
  ext(&m, HR_EXT_SESSION_TOKEN, token16, 16);
  ext(&m, HR_EXT_MAX_SHARDS, "\x04\x00", 2);
  ext(&m, HR_EXT_PEER_NAME, "srv", 3);
  mb_u16(&m, HR_EXT_FABRIC_ADDRESS);
  mb_u16(&m, 2 + 5 + 2);
  mb_str(&m, "verbs");
  mb_u16(&m, 0); /* empty endpoint name */
  mb_end(&m);

  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  const hr_hello_exts *x = &out.u.hello.exts;
  assert_int_equal(x->session_token_len, 16);
  assert_memory_equal(x->session_token, token16, 16);
  assert_int_equal(x->max_shards, 4);
  assert_int_equal(x->peer_name_len, 3);
  assert_int_equal(x->has_fabric_address, 1);
  assert_int_equal(x->fabric_provider_len, 5);
  assert_int_equal(x->fabric_endpoint_len, 0);
  assert_null(x->auth_token);
  assert_null(x->session_join);
  expect_prefixes_malformed(&m, NULL);
}

/* § 18: misdirected extensions are ignored without their content being
 * examined; of a repeated one the first counts and the rest are ignored
 * the same way. */
static void test_hello_misdirected_and_repeated(void **state) {
  (void)state;
  mb m;
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  hello_lists(&m);
  mb_u16(&m, 4);
  ext(&m, HR_EXT_MAX_SHARDS, "\x00\x00\x00", 3); /* server's, malformed */
  ext(&m, HR_EXT_SESSION_TOKEN, "abc", 3);       /* server's, malformed */
  ext(&m, HR_EXT_PEER_NAME, "one", 3);
  ext(&m, HR_EXT_PEER_NAME, "\xFF", 1); /* repeated, bad UTF-8 */
  mb_end(&m);
  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.hello.exts.max_shards, 0);
  assert_null(out.u.hello.exts.session_token);
  assert_int_equal(out.u.hello.exts.peer_name_len, 3);
  assert_memory_equal(out.u.hello.exts.peer_name, "one", 3);

  hello_fixed(&m, HR_MSG_SERVER_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  hello_lists(&m);
  mb_u16(&m, 4);
  ext(&m, HR_EXT_AUTH_TOKEN, "t", 1);
  ext(&m, HR_EXT_SESSION_JOIN, "short", 5); /* client's, malformed */
  ext(&m, HR_EXT_MAX_SHARDS, "\x02\x00", 2);
  ext(&m, HR_EXT_MAX_SHARDS, "\x00", 1); /* repeated, malformed */
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_null(out.u.hello.exts.auth_token);
  assert_null(out.u.hello.exts.session_join);
  assert_int_equal(out.u.hello.exts.max_shards, 2);
}

/* Lists keep every entry as read: extension entries with their metadata,
 * reserved tags and reserved devices/memory classes (readers skip them). */
static void test_hello_lists_keep_everything(void **state) {
  (void)state;
  mb m;
  hello_fixed(&m, HR_MSG_SERVER_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  mb_u16(&m, 5);
  mb_u8(&m, 0xF3);
  mb_lstr(&m, "\x08\x04\x10\x40", 4);
  mb_u8(&m, 0x0C); /* reserved core tag */
  mb_u8(&m, HR_LAYOUT_PANEL);
  mb_u16(&m, 0); /* a profile with empty metadata: "any parameters" */
  mb_u8(&m, 0x0A);
  mb_u8(&m, HR_LAYOUT_COMPOSITE);
  mb_u16(&m, 3);
  mb_u8(&m, HR_DEV_CPU);
  mb_u8(&m, 0x09); /* reserved device */
  mb_u8(&m, 0xF0); /* extension device */
  mb_u16(&m, 2);
  mb_u8(&m, HR_MEM_PINNED);
  mb_u8(&m, 0x03); /* reserved memory class */
  mb_u16(&m, 0);
  mb_end(&m);
  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  const hr_hello *h = &out.u.hello;
  assert_int_equal(h->layout_count, 5);
  assert_int_equal(h->layouts[0].tag, 0xF3);
  assert_int_equal(h->layouts[0].ext_len, 4);
  assert_memory_equal(h->layouts[0].ext, "\x08\x04\x10\x40", 4);
  assert_int_equal(h->layouts[1].tag, 0x0C);
  assert_int_equal(h->layouts[2].tag, HR_LAYOUT_PANEL);
  assert_int_equal(h->layouts[2].ext_len, 0);
  assert_int_equal(h->layouts[3].tag, 0x0A);
  assert_int_equal(h->layouts[4].tag, HR_LAYOUT_COMPOSITE);
  assert_int_equal(h->device_count, 3);
  assert_int_equal(h->devices[2], 0xF0);
  assert_int_equal(h->memory_class_count, 2);
  assert_int_equal(h->memory_classes[1], 0x03);
  expect_prefixes_malformed(&m, NULL);

  /* Unassigned capability bits and any version_minor are accepted. */
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  m.b[18] = 7;    /* version_minor */
  m.b[23] = 0x80; /* capability bit 31 */
  hello_lists(&m);
  mb_u16(&m, 0);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.hello.version_minor, 7);
  assert_int_equal(out.u.hello.capability_flags >> 31, 1);
}

static void test_hello_64_layouts(void **state) {
  (void)state;
  mb m;
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  mb_u16(&m, 64);
  mb_fill(&m, HR_LAYOUT_ROW_MAJOR, 64);
  mb_u16(&m, 0);
  mb_u16(&m, 0);
  mb_u16(&m, 0);
  mb_end(&m);
  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.hello.layout_count, 64);

  /* 65 entries: the limit of § 17, reported at the count. */
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  mb_u16(&m, 65);
  mb_fill(&m, HR_LAYOUT_ROW_MAJOR, 65);
  mb_u16(&m, 0);
  mb_u16(&m, 0);
  mb_u16(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, OFF_LAYOUTS);

  /* The encoder refuses more than 64 too. */
  out.u.hello.layout_count = 65;
  assert_int_equal(hr_wire_encoded_size(&out), HR_ERR_INVALID_ARGUMENT);
}

static void test_hello_version_rejections(void **state) {
  (void)state;
  mb m;
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  hello_lists(&m);
  mb_u16(&m, 0);
  mb_end(&m);

  m.b[OFF_MAGIC] = 'X';
  expect_reject(&m, NULL, HR_WIRE_UNSUPPORTED_VERSION, OFF_MAGIC);
  m.b[OFF_MAGIC] = 'H';
  m.b[OFF_MAJOR] = 2;
  expect_reject(&m, NULL, HR_WIRE_UNSUPPORTED_VERSION, OFF_MAJOR);
  m.b[OFF_MAJOR] = 0;
  expect_reject(&m, NULL, HR_WIRE_UNSUPPORTED_VERSION, OFF_MAJOR);
  m.b[OFF_MAJOR] = 1;
  m.b[OFF_MAJOR + 1] = 1; /* 257 */
  expect_reject(&m, NULL, HR_WIRE_UNSUPPORTED_VERSION, OFF_MAJOR);

  /* A HELLO of another version wins over whatever follows: the rest of
   * its layout is unknown. */
  mb_begin(&m, HR_MSG_SERVER_HELLO, 0);
  mb_u32(&m, HR_MAGIC);
  mb_u16(&m, 2);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_UNSUPPORTED_VERSION, OFF_MAJOR);
  mb_begin(&m, HR_MSG_SERVER_HELLO, 0);
  mb_u32(&m, 0x50545448); /* "HTTP" */
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_UNSUPPORTED_VERSION, OFF_MAGIC);
  /* Too short to tell: the cut is reported. */
  mb_begin(&m, HR_MSG_SERVER_HELLO, 0);
  mb_u16(&m, 0x5252);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, OFF_MAGIC);
}

static void test_hello_field_rejections(void **state) {
  (void)state;
  mb m;
  /* max_message_size below 65,536; exactly 65,536 is fine. */
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE - 1);
  hello_lists(&m);
  mb_u16(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, OFF_MAX_SIZE);

  /* Layout tags 0x00 and 0xFF in a list. */
  static const uint8_t bad_tags[] = {0x00, 0xFF};
  for (int i = 0; i < 2; i++) {
    hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
    mb_u16(&m, 2);
    mb_u8(&m, HR_LAYOUT_ROW_MAJOR);
    mb_u8(&m, bad_tags[i]);
    mb_u16(&m, 0);
    mb_u16(&m, 0);
    mb_u16(&m, 0);
    mb_end(&m);
    expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, OFF_LAYOUTS + 3);
  }
  /* An extension entry whose metadata runs past the payload. */
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  mb_u16(&m, 1);
  mb_u8(&m, 0xF5);
  mb_u16(&m, 0x4000);
  mb_bytes(&m, "ab", 2);
  mb_end(&m);
  {
    hr_wire_status st;
    assert_int_equal(decode_exact(m.b, m.n, NULL, &st), HR_ERR_PROTO);
    assert_int_equal(st.code, HR_WIRE_MALFORMED_PAYLOAD);
  }

  /* Device 0xFF and memory class 0xFF, at their own byte. */
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  mb_u16(&m, 0);
  mb_u16(&m, 3);
  mb_u8(&m, 0);
  mb_u8(&m, 1);
  uint32_t off = mb_off(&m);
  mb_u8(&m, 0xFF);
  mb_u16(&m, 0);
  mb_u16(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, off);

  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  mb_u16(&m, 0);
  mb_u16(&m, 0);
  mb_u16(&m, 2);
  mb_u8(&m, 0);
  off = mb_off(&m);
  mb_u8(&m, 0xFF);
  mb_u16(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, off);

  /* A device list longer than the payload. */
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  mb_u16(&m, 0);
  off = mb_off(&m);
  mb_u16(&m, 4);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, off);

  /* A byte after the extensions. */
  hello_fixed(&m, HR_MSG_CLIENT_HELLO, HR_MIN_MAX_MESSAGE_SIZE);
  hello_lists(&m);
  mb_u16(&m, 0);
  off = mb_off(&m);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, off);
}

/* Builds a HELLO of one extension and expects MALFORMED_PAYLOAD at
 * `err_delta` bytes after the extension's content starts. */
static void reject_ext(uint32_t type, uint16_t ext_type, const void *data,
                       uint16_t len, uint32_t err_delta) {
  mb m;
  hello_fixed(&m, type, HR_MIN_MAX_MESSAGE_SIZE);
  hello_lists(&m);
  mb_u16(&m, 1);
  uint32_t content = mb_off(&m) + 4;
  ext(&m, ext_type, data, len);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, content + err_delta);
}

static void test_hello_extension_rejections(void **state) {
  (void)state;
  const uint32_t C = HR_MSG_CLIENT_HELLO, S = HR_MSG_SERVER_HELLO;
  reject_ext(S, HR_EXT_SESSION_TOKEN, token16, 15, 0);
  reject_ext(S, HR_EXT_SESSION_TOKEN, NULL, 0, 0);
  reject_ext(C, HR_EXT_SESSION_JOIN, token16, 15, 0);
  reject_ext(S, HR_EXT_MAX_SHARDS, "\x04\x00\x00", 3, 0);
  reject_ext(S, HR_EXT_MAX_SHARDS, "\x04", 1, 0);
  reject_ext(S, HR_EXT_MAX_SHARDS, "\x00\x00", 2, 0);
  reject_ext(C, HR_EXT_PEER_NAME, "ok\xFF", 3, 0);
  reject_ext(S, HR_EXT_PEER_NAME, "\xED\xA0\x80", 3, 0);
  /* FABRIC_ADDRESS: provider not UTF-8, provider past the end, endpoint
   * past the end, bytes left over. */
  reject_ext(C, HR_EXT_FABRIC_ADDRESS, "\x01\x00\xC0\x00\x00", 5, 2);
  reject_ext(C, HR_EXT_FABRIC_ADDRESS, "\x05\x00tcp", 5, 0);
  reject_ext(S, HR_EXT_FABRIC_ADDRESS,
             "\x01\x00x\x03\x00"
             "ab",
             7, 3);
  reject_ext(S, HR_EXT_FABRIC_ADDRESS, "\x01\x00x", 3, 3);
  reject_ext(S, HR_EXT_FABRIC_ADDRESS, "\x01\x00x\x00\x00!", 6, 5);

  /* Sizes that parse are accepted (boundaries of the rules above). */
  mb m;
  hr_msg out;
  hello_fixed(&m, S, HR_MIN_MAX_MESSAGE_SIZE);
  hello_lists(&m);
  mb_u16(&m, 2);
  ext(&m, HR_EXT_MAX_SHARDS, "\xFF\xFF", 2);
  ext(&m, HR_EXT_PEER_NAME, NULL, 0);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.hello.exts.max_shards, 0xFFFF);
  assert_non_null(out.u.hello.exts.peer_name);
  assert_int_equal(out.u.hello.exts.peer_name_len, 0);

  /* A TLV whose header or content runs past the payload. */
  hello_fixed(&m, C, HR_MIN_MAX_MESSAGE_SIZE);
  hello_lists(&m);
  mb_u16(&m, 2);
  ext(&m, 0x1234, "x", 1);
  uint32_t off = mb_off(&m);
  mb_u16(&m, 0x1235);
  mb_u16(&m, 5);
  mb_bytes(&m, "abcd", 4);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, off);
  hello_fixed(&m, C, HR_MIN_MAX_MESSAGE_SIZE);
  hello_lists(&m);
  mb_u16(&m, 2); /* announces two, holds one */
  ext(&m, 0x1234, "x", 1);
  off = mb_off(&m);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, off);
}

static void test_hello_encoder(void **state) {
  (void)state;
  uint8_t raw[64];
  int n1 = hr_ext_put(raw, sizeof raw, HR_EXT_PEER_NAME, "me", 2);
  assert_int_equal(n1, 6);
  int n2 = hr_ext_put(raw + n1, sizeof raw - (size_t)n1, HR_EXT_MAX_SHARDS,
                      "\x08\x00", 2);
  assert_int_equal(n2, 6);
  uint8_t scratch[8];
  assert_int_equal(hr_ext_put(scratch, 5, 1, "ab", 2), HR_ERR_BUFFER_TOO_SMALL);
  assert_int_equal(hr_ext_put(scratch, 4, 1, NULL, 0), 4);
  assert_int_equal(hr_ext_put(scratch, 8, 1, NULL, 2), HR_ERR_INVALID_ARGUMENT);

  static const uint8_t devs[2] = {HR_DEV_CPU, HR_DEV_CUDA};
  hr_msg b = {.hdr = {HR_MSG_SERVER_HELLO, 0, 0}};
  b.u.hello = (hr_hello){.magic = HR_MAGIC,
                         .version_major = 1,
                         .version_minor = 0,
                         .max_message_size = 1u << 24,
                         .layout_count = 2,
                         .device_count = 2,
                         .devices = devs,
                         .ext_count = 2,
                         .ext_raw = raw,
                         .ext_raw_len = (size_t)(n1 + n2)};
  b.u.hello.layouts[0].tag = HR_LAYOUT_TILED;
  b.u.hello.layouts[1] =
      (hr_layout_entry){HR_LAYOUT_PANEL, 4, (const uint8_t *)"\x04\0\0\0"};

  mb m;
  hello_fixed(&m, HR_MSG_SERVER_HELLO, 1u << 24);
  m.n -= 8;
  mb_u32(&m, 0); /* capability flags */
  mb_u32(&m, 1u << 24);
  mb_u16(&m, 2);
  mb_u8(&m, HR_LAYOUT_TILED);
  mb_u8(&m, HR_LAYOUT_PANEL);
  mb_lstr(&m, "\x04\0\0\0", 4);
  mb_u16(&m, 2);
  mb_u8(&m, HR_DEV_CPU);
  mb_u8(&m, HR_DEV_CUDA);
  mb_u16(&m, 0);
  mb_u16(&m, 2);
  ext(&m, HR_EXT_PEER_NAME, "me", 2);
  ext(&m, HR_EXT_MAX_SHARDS, "\x08\x00", 2);
  mb_end(&m);
  expect_encodes(&b, &m);
  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.hello.exts.max_shards, 8);

  /* The raw extension list must hold exactly ext_count whole TLVs. */
  b.u.hello.ext_count = 3;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
  b.u.hello.ext_count = 1;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
  b.u.hello.ext_count = 2;
  b.u.hello.ext_raw_len--;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
  b.u.hello.ext_raw_len++;
  /* Missing arrays. */
  b.u.hello.devices = NULL;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
  b.u.hello.devices = devs;
  b.u.hello.layouts[1].ext = NULL;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_client_hello_minimal),
      cmocka_unit_test(test_client_hello_known_extensions),
      cmocka_unit_test(test_server_hello_known_extensions),
      cmocka_unit_test(test_hello_misdirected_and_repeated),
      cmocka_unit_test(test_hello_lists_keep_everything),
      cmocka_unit_test(test_hello_64_layouts),
      cmocka_unit_test(test_hello_version_rejections),
      cmocka_unit_test(test_hello_field_rejections),
      cmocka_unit_test(test_hello_extension_rejections),
      cmocka_unit_test(test_hello_encoder),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
