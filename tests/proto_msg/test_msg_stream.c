/*
 * Messages of request, put and list streams: TENSOR_REQUEST (§ 8),
 * TENSOR_DESCRIPTOR and TENSOR_DATA (§ 10), TENSOR_PUT (§ 11),
 * RDMA_REGISTER (§ 13), LIST_REQUEST and LIST_RESPONSE (§ 15).
 */
#include "msg_test.h"

/* ------------------------------------------------------------------------ */
/* TENSOR_REQUEST                                                            */
/* ------------------------------------------------------------------------ */

/* Writes a request whose fields after the key are given. */
static void request(mb *m, const char *key, uint32_t flags, uint8_t device,
                    uint8_t align, uint16_t max_shards) {
  mb_begin(m, HR_MSG_TENSOR_REQUEST, 1);
  mb_str(m, key);
  mb_u32(m, flags);
  mb_u16(m, 0);
  mb_u8(m, device);
  mb_u8(m, align);
  mb_u16(m, max_shards);
}

static void test_request_minimal(void **state) {
  (void)state;
  mb m;
  request(&m, "weights", 0, HR_DEV_CPU, 0, 1);
  mb_end(&m);
  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  const hr_request *r = &out.u.request;
  assert_int_equal(r->key_len, 7);
  assert_memory_equal(r->key, "weights", 7);
  assert_ptr_equal(r->key, m.b + 14); /* no copy */
  assert_int_equal(r->flags, 0);
  assert_int_equal(r->layout_count, 0);
  assert_int_equal(r->preferred_device, HR_DEV_CPU);
  assert_int_equal(r->min_alignment_log2, 0);
  assert_int_equal(r->max_shards, 1);
  assert_int_equal(r->region_rank, 0);
  expect_prefixes_malformed(&m, NULL);

  hr_msg b = {.hdr = {HR_MSG_TENSOR_REQUEST, 1, 0}};
  b.u.request = (hr_request){
      .key = (const uint8_t *)"weights", .key_len = 7, .max_shards = 1};
  expect_encodes(&b, &m);
}

static void test_request_full(void **state) {
  (void)state;
  mb m;
  mb_begin(&m, HR_MSG_TENSOR_REQUEST, 5);
  mb_str(&m, "\xE6\xA8\xA1\xE5\x9E\x8B/w");
  mb_u32(&m, HR_REQ_ALLOW_TRANSCODE | HR_REQ_PARALLEL_OK | HR_REQ_REGION);
  mb_u16(&m, 4);
  mb_u8(&m, HR_LAYOUT_TILED_EXACT);
  mb_lstr(&m, "\x02\x20\0\0\0\x20\0\0\0", 9);
  mb_u8(&m, 0xF9); /* unregistered extension, empty metadata */
  mb_u16(&m, 0);
  mb_u8(&m, 0x30); /* reserved core tag: kept, skipped by the server */
  mb_u8(&m, HR_LAYOUT_COLUMN_MAJOR);
  mb_u8(&m, HR_DEV_CUDA);
  mb_u8(&m, HR_MAX_ALIGNMENT_LOG2);
  mb_u16(&m, 4);
  mb_u8(&m, 2);
  mb_u64(&m, 10);
  mb_u64(&m, 0);
  mb_u64(&m, 5);
  mb_u64(&m, UINT64_MAX); /* 0 + UINT64_MAX does not overflow */
  mb_end(&m);
  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  const hr_request *r = &out.u.request;
  assert_int_equal(r->flags, 7);
  assert_int_equal(r->layout_count, 4);
  assert_int_equal(r->layouts[0].tag, HR_LAYOUT_TILED_EXACT);
  assert_int_equal(r->layouts[0].ext_len, 9);
  assert_int_equal(r->layouts[1].tag, 0xF9);
  assert_int_equal(r->layouts[2].tag, 0x30);
  assert_int_equal(r->layouts[3].tag, HR_LAYOUT_COLUMN_MAJOR);
  assert_int_equal(r->preferred_device, HR_DEV_CUDA);
  assert_int_equal(r->min_alignment_log2, 21);
  assert_int_equal(r->max_shards, 4);
  assert_int_equal(r->region_rank, 2);
  assert_int_equal(r->region_offset[0], 10);
  assert_int_equal(r->region_offset[1], 0);
  assert_int_equal(r->region_shape[0], 5);
  assert_true(r->region_shape[1] == UINT64_MAX);
  expect_prefixes_malformed(&m, NULL);

  /* The region is written only with REGION. */
  out.u.request.flags = HR_REQ_ALLOW_TRANSCODE | HR_REQ_PARALLEL_OK;
  assert_int_equal(hr_wire_encoded_size(&out), (int64_t)m.n - 1 - 32);
  out.u.request.flags |= HR_REQ_REGION;
  out.u.request.region_rank = HR_MAX_RANK + 1;
  assert_int_equal(hr_wire_encoded_size(&out), HR_ERR_INVALID_ARGUMENT);
}

static void test_request_boundaries_accepted(void **state) {
  (void)state;
  mb m;
  hr_msg out;
  /* max_shards is kept as sent without PARALLEL_OK, 0 included. */
  request(&m, "k", 0, 0x09 /* reserved device */, 0, 0);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.request.max_shards, 0);
  assert_int_equal(out.u.request.preferred_device, 0x09);

  /* A 1024-byte key; a rank-0 region; a rank-32 region. */
  char key[HR_MAX_KEY + 1];
  memset(key, 'k', HR_MAX_KEY);
  key[HR_MAX_KEY] = '\0';
  request(&m, key, HR_REQ_REGION, 0, 0, 1);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.request.key_len, HR_MAX_KEY);
  assert_int_equal(out.u.request.region_rank, 0);

  request(&m, "k", HR_REQ_REGION, 0, 0, 1);
  mb_u8(&m, HR_MAX_RANK);
  for (unsigned i = 0; i < 2 * HR_MAX_RANK; i++)
    mb_u64(&m, i);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.request.region_rank, HR_MAX_RANK);
  assert_int_equal(out.u.request.region_shape[31], 63);

  /* 64 preferences. */
  mb_begin(&m, HR_MSG_TENSOR_REQUEST, 1);
  mb_str(&m, "k");
  mb_u32(&m, 0);
  mb_u16(&m, HR_MAX_LAYOUTS);
  mb_fill(&m, HR_LAYOUT_ROW_MAJOR, HR_MAX_LAYOUTS);
  mb_u32(&m, 0x00010000);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.request.layout_count, HR_MAX_LAYOUTS);
}

static void test_request_rejections(void **state) {
  (void)state;
  mb m;
  const uint32_t KEY = 12;
  /* tensor_key: empty, 1025 bytes, bad UTF-8, past the payload. */
  request(&m, "", 0, 0, 0, 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, KEY);
  char key[HR_MAX_KEY + 2];
  memset(key, 'k', HR_MAX_KEY + 1);
  key[HR_MAX_KEY + 1] = '\0';
  request(&m, key, 0, 0, 0, 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, KEY);
  request(&m, "ab\xC3(", 0, 0, 0, 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, KEY + 2);
  request(&m, "\xC0\xAF", 0, 0, 0, 1); /* overlong '/' */
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, KEY + 2);
  mb_begin(&m, HR_MSG_TENSOR_REQUEST, 1);
  mb_u16(&m, 4);
  mb_bytes(&m, "abc", 3);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, KEY);

  /* Reserved request flags. */
  const uint32_t FLAGS = KEY + 3;
  static const uint32_t bad_flags[] = {1u << 3, 1u << 8, 1u << 31};
  for (int i = 0; i < 3; i++) {
    request(&m, "x", bad_flags[i], 0, 0, 1);
    mb_end(&m);
    expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, FLAGS);
  }
  /* Layout list: 65 entries, tag 0x00, tag 0xFF. */
  const uint32_t LIST = FLAGS + 4;
  mb_begin(&m, HR_MSG_TENSOR_REQUEST, 1);
  mb_str(&m, "x");
  mb_u32(&m, 0);
  mb_u16(&m, HR_MAX_LAYOUTS + 1);
  mb_fill(&m, HR_LAYOUT_ROW_MAJOR, HR_MAX_LAYOUTS + 1);
  mb_u32(&m, 0x00010000);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, LIST);
  for (int tag = 0; tag <= 0xFF; tag += 0xFF) {
    mb_begin(&m, HR_MSG_TENSOR_REQUEST, 1);
    mb_str(&m, "x");
    mb_u32(&m, 0);
    mb_u16(&m, 1);
    mb_u8(&m, (uint8_t)tag);
    mb_u32(&m, 0x00010000);
    mb_end(&m);
    expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, LIST + 2);
  }
  /* preferred_device 0xFF, min_alignment_log2 22, PARALLEL_OK with
   * max_shards 0. */
  const uint32_t DEV = LIST + 2;
  request(&m, "x", 0, 0xFF, 0, 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, DEV);
  request(&m, "x", 0, 0, HR_MAX_ALIGNMENT_LOG2 + 1, 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, DEV + 1);
  request(&m, "x", 0, 0, 0xFF, 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, DEV + 1);
  request(&m, "x", HR_REQ_PARALLEL_OK, 0, 0, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, DEV + 2);

  /* REGION: fields missing, rank 33, cut inside the shapes, an end that
   * overflows u64, bytes left over. */
  const uint32_t REGION = DEV + 4;
  request(&m, "x", HR_REQ_REGION, 0, 0, 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, REGION);
  request(&m, "x", HR_REQ_REGION, 0, 0, 1);
  mb_u8(&m, HR_MAX_RANK + 1);
  mb_fill(&m, 0, 16 * (HR_MAX_RANK + 1));
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_INVALID_REGION, REGION);
  request(&m, "x", HR_REQ_REGION, 0, 0, 1);
  mb_u8(&m, 0xFF); /* rank 255 with no arrays: the rank is what is wrong */
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_INVALID_REGION, REGION);
  request(&m, "x", HR_REQ_REGION, 0, 0, 1);
  mb_u8(&m, 2);
  mb_u64(&m, 0);
  mb_u64(&m, 0);
  mb_u64(&m, 1);
  mb_u32(&m, 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, REGION + 1 + 16 + 8);
  request(&m, "x", HR_REQ_REGION, 0, 0, 1);
  mb_u8(&m, 2);
  mb_u64(&m, 0);
  mb_u64(&m, 2);
  mb_u64(&m, 1);
  mb_u64(&m, UINT64_MAX - 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_INVALID_REGION, REGION + 1 + 16 + 8);
  request(&m, "x", HR_REQ_REGION, 0, 0, 1);
  mb_u8(&m, 0);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, REGION + 1);
  /* Without REGION, region bytes are left over. */
  request(&m, "x", 0, 0, 0, 1);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, REGION);
}

static void test_request_encoder_arguments(void **state) {
  (void)state;
  char key[HR_MAX_KEY + 1];
  memset(key, 'k', sizeof key);
  hr_msg b = {.hdr = {HR_MSG_TENSOR_REQUEST, 1, 0}};
  b.u.request = (hr_request){.key = (const uint8_t *)key, .key_len = 0};
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
  b.u.request.key_len = HR_MAX_KEY + 1;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
  b.u.request.key_len = HR_MAX_KEY;
  assert_int_equal(hr_wire_encoded_size(&b), 12 + 2 + HR_MAX_KEY + 10);
  b.u.request.key = NULL;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
  b.u.request.key = (const uint8_t *)key;
  b.u.request.layout_count = HR_MAX_LAYOUTS + 1;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
}

/* ------------------------------------------------------------------------ */
/* TENSOR_DESCRIPTOR and TENSOR_PUT                                          */
/* ------------------------------------------------------------------------ */

/* A FLOAT32 ROW_MAJOR vector of 4 elements in one 16-byte buffer of
 * `device`/`sync`, then its transport fields.  With HAS_SHARD it is the
 * second half of an 8-element parent, the only shard of its answer. */
static void desc_f32x4(mb *m, uint8_t flags, uint8_t device, uint8_t sync) {
  mb_u8(m, 1);
  mb_u8(m, HR_ELEM_FLOAT32);
  mb_u8(m, 1);
  mb_u8(m, flags);
  mb_u8(m, HR_LAYOUT_ROW_MAJOR);
  mb_u64(m, 4);
  mb_u16(m, 0);
  mb_u64(m, 0);
  if (flags & HR_DESC_HAS_SHARD) {
    mb_u64(m, 8);
    mb_u64(m, 4);
  }
  mb_u8(m, 1);
  mb_u64(m, 16);
  mb_u8(m, 6);
  mb_u8(m, device);
  mb_u8(m, HR_MEM_STANDARD);
  mb_u16(m, 0);
  mb_u8(m, sync);
  mb_u16(m, 0);
  /* transport fields */
  mb_u64(m, 16);
  mb_u16(m, 0);
  mb_u16(m, 1);
  mb_u8(m, HR_PLANE_FRAMES);
  mb_fill(m, 0, 3);
}

static void test_descriptor_message(void **state) {
  (void)state;
  mb m;
  mb_begin(&m, HR_MSG_TENSOR_DESCRIPTOR, 3);
  desc_f32x4(&m, 0, HR_DEV_CPU, HR_SYNC_PRODUCER_SYNCED);
  mb_end(&m);
  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  const hr_descriptor *d = &out.u.tensor.desc;
  assert_int_equal(d->descriptor_version, 1);
  assert_int_equal(d->element_type, HR_ELEM_FLOAT32);
  assert_int_equal(d->rank, 1);
  assert_int_equal(d->shape[0], 4);
  assert_int_equal(d->layout.tag, HR_LAYOUT_ROW_MAJOR);
  assert_int_equal(d->buffer_count, 1);
  assert_int_equal(d->buffers[0].size_bytes, 16);
  assert_int_equal(d->buffers[0].alignment_log2, 6);
  assert_int_equal(out.u.tensor.xport.total_data_bytes, 16);
  assert_int_equal(out.u.tensor.xport.total_shards, 1);
  assert_int_equal(out.u.tensor.xport.data_plane, HR_PLANE_FRAMES);
  expect_prefixes_malformed(&m, NULL);

  /* A byte after the transport fields. */
  uint32_t end = mb_off(&m);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, end);
  /* The descriptor comes first in byte order: its faults are reported
   * before the bytes left over after it (composite.json comp_with_buffer
   * depends on this). */
  m.b[12] = 2; /* descriptor_version 2 */
  hr_wire_status st;
  assert_int_equal(decode_exact(m.b, m.n, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  m.n--;
  mb_end(&m);
  assert_int_equal(decode_exact(m.b, m.n, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
}

/* The decoder hands its context to descriptor validation: SYNC_EVENT is a
 * network fault and legal in-process (§ 18 "Transports"). */
static void test_descriptor_transport_context(void **state) {
  (void)state;
  mb m;
  mb_begin(&m, HR_MSG_TENSOR_DESCRIPTOR, 1);
  desc_f32x4(&m, 0, HR_DEV_CUDA, HR_SYNC_EVENT);
  mb_end(&m);
  hr_wire_status st;
  assert_int_equal(decode_exact(m.b, m.n, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_SYNC_MODE);
  assert_int_equal(decode_exact(m.b, m.n, &test_net, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_SYNC_MODE);
  hr_msg out;
  expect_roundtrip(&m, &test_local, &out);
  assert_int_equal(out.u.tensor.desc.buffers[0].sync_mode, HR_SYNC_EVENT);

  /* The same through TENSOR_PUT. */
  mb_begin(&m, HR_MSG_TENSOR_PUT, 1);
  mb_str(&m, "w");
  mb_u32(&m, 0);
  desc_f32x4(&m, 0, HR_DEV_CUDA, HR_SYNC_CONSUMER_STREAM);
  mb_end(&m);
  assert_int_equal(decode_exact(m.b, m.n, NULL, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_SYNC_MODE);
  expect_roundtrip(&m, &test_local, &out);
}

static void test_put_message(void **state) {
  (void)state;
  mb m;
  mb_begin(&m, HR_MSG_TENSOR_PUT, 7);
  mb_str(&m, "new/w");
  mb_u32(&m, HR_PUT_REPLACE);
  desc_f32x4(&m, 0, HR_DEV_CPU, HR_SYNC_PRODUCER_SYNCED);
  mb_end(&m);
  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.put.key_len, 5);
  assert_memory_equal(out.u.put.key, "new/w", 5);
  assert_int_equal(out.u.put.flags, HR_PUT_REPLACE);
  assert_int_equal(out.u.put.desc.shape[0], 4);
  assert_int_equal(out.u.put.xport.total_data_bytes, 16);
  expect_prefixes_malformed(&m, NULL);

  /* Reserved put flags. */
  m.b[12 + 2 + 5] = 2;
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 19);
  m.b[12 + 2 + 5] = 0;
  m.b[12 + 2 + 5 + 3] = 0x80;
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 19);

  /* Keys: empty, bad UTF-8. */
  mb_begin(&m, HR_MSG_TENSOR_PUT, 7);
  mb_str(&m, "");
  mb_u32(&m, 0);
  desc_f32x4(&m, 0, HR_DEV_CPU, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 12);
  mb_begin(&m, HR_MSG_TENSOR_PUT, 7);
  mb_str(&m, "\xFF");
  mb_u32(&m, 0);
  desc_f32x4(&m, 0, HR_DEV_CPU, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 14);

  /* A PUT of a shard is refused (§ 18 "PUT"), at the descriptor's flags;
   * the same descriptor is fine in TENSOR_DESCRIPTOR. */
  mb_begin(&m, HR_MSG_TENSOR_PUT, 7);
  mb_str(&m, "s");
  mb_u32(&m, 0);
  uint32_t desc = mb_off(&m);
  desc_f32x4(&m, HR_DESC_HAS_SHARD, HR_DEV_CPU, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_PUT_REJECTED, desc + 3);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_PUT_REJECTED, desc + 3);
  mb_begin(&m, HR_MSG_TENSOR_DESCRIPTOR, 7);
  desc_f32x4(&m, HR_DESC_HAS_SHARD, HR_DEV_CPU, 0);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.tensor.desc.parent_shape[0], 8);
  assert_int_equal(out.u.tensor.desc.shard_offset[0], 4);

  /* The encoder checks the key like a request's. */
  mb_begin(&m, HR_MSG_TENSOR_PUT, 7);
  mb_str(&m, "k");
  mb_u32(&m, 0);
  desc_f32x4(&m, 0, HR_DEV_CPU, 0);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  uint32_t end = mb_off(&m);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, end);
  m.n--;
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  out.u.put.key_len = 0;
  assert_int_equal(hr_wire_encoded_size(&out), HR_ERR_INVALID_ARGUMENT);
}

/* ------------------------------------------------------------------------ */
/* TENSOR_DATA                                                               */
/* ------------------------------------------------------------------------ */

static void test_data_frame(void **state) {
  (void)state;
  mb m;
  mb_begin(&m, HR_MSG_TENSOR_DATA, 1);
  mb_u8(&m, 2);
  mb_fill(&m, 0, 3);
  mb_u64(&m, 0x0102030405060708ull);
  mb_bytes(&m, "\x00\x00\x80\x3f\x01", 5);
  mb_end(&m);
  hr_msg out;
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.data.buffer_index, 2);
  assert_true(out.u.data.offset == 0x0102030405060708ull);
  assert_int_equal(out.u.data.data_len, 5);
  assert_ptr_equal(out.u.data.data, m.b + 24); /* no copy */

  hr_msg b = {.hdr = {HR_MSG_TENSOR_DATA, 1, 0}};
  b.u.data = (hr_data){2, 0x0102030405060708ull,
                       (const uint8_t *)"\x00\x00\x80\x3f\x01", 5};
  expect_encodes(&b, &m);

  /* The scatter-gather prefix writes the same first 24 bytes. */
  uint8_t prefix[24];
  assert_int_equal(
      hr_wire_encode_data_prefix(prefix, 1, 2, 0x0102030405060708ull, 5), 24);
  assert_memory_equal(prefix, m.b, 24);
  assert_int_equal(hr_wire_encode_data_prefix(prefix, 1, 0, 0, 0),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_wire_encode_data_prefix(prefix, 1, 0, 0, UINT32_MAX),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_wire_encode_data_prefix(prefix, 1, 0, 0, UINT32_MAX - 12),
                   24);

  /* The encoder refuses a frame without data. */
  b.u.data.data_len = 0;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
  b.u.data.data_len = 1;
  b.u.data.data = NULL;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
}

static void test_data_rejections(void **state) {
  (void)state;
  mb m;
  /* Payloads of 0 to 12 bytes: cut in buffer_index, in reserved, in the
   * offset, then no data. */
  for (uint32_t len = 0; len <= 12; len++) {
    mb_begin(&m, HR_MSG_TENSOR_DATA, 1);
    mb_fill(&m, 0, len);
    mb_end(&m);
    uint32_t off = len == 0 ? 12 : len < 4 ? 13 : len < 12 ? 16 : 24;
    expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, off);
  }
  /* Each reserved byte. */
  for (int i = 1; i <= 3; i++) {
    mb_begin(&m, HR_MSG_TENSOR_DATA, 1);
    mb_fill(&m, 0, 12);
    mb_u8(&m, 0xAA);
    mb_end(&m);
    m.b[12 + i] = 1;
    expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, (uint32_t)(12 + i));
  }
}

static void test_data_subheader(void **state) {
  (void)state;
  static const uint8_t sub[12] = {7, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0x80};
  hr_data d;
  hr_wire_status st;
  assert_int_equal(hr_wire_decode_data_subheader(sub, 12 + 4096, &d, &st), 0);
  assert_int_equal(d.buffer_index, 7);
  assert_true(d.offset == 0x8000000000000010ull);
  assert_int_equal(d.data_len, 4096);
  assert_null(d.data);
  assert_int_equal(hr_wire_decode_data_subheader(sub, UINT32_MAX, &d, &st), 0);
  assert_int_equal(d.data_len, UINT32_MAX - 12);
  assert_int_equal(hr_wire_decode_data_subheader(sub, 12, &d, &st),
                   HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_MALFORMED_PAYLOAD);
  assert_int_equal(st.offset, 24);
  /* Short payloads are cut where the sub-header's fields are; the
   * reserved bytes are checked only when the payload holds them. */
  static const uint8_t junk[12] = {0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0};
  assert_int_equal(hr_wire_decode_data_subheader(junk, 1, &d, &st),
                   HR_ERR_PROTO);
  assert_int_equal(st.offset, 13);
  assert_int_equal(hr_wire_decode_data_subheader(junk, 4, &d, &st),
                   HR_ERR_PROTO);
  assert_int_equal(st.offset, 13); /* not 16: the reserved bytes count */
}

/* ------------------------------------------------------------------------ */
/* RDMA_REGISTER                                                             */
/* ------------------------------------------------------------------------ */

static void rdma(mb *m, uint8_t role, const void *raw_key, uint16_t n) {
  mb_begin(m, HR_MSG_RDMA_REGISTER, 1);
  mb_u8(m, role);
  mb_fill(m, 0, 3);
  mb_u64(m, 4096);
  mb_u64(m, 0x7f0000100000ull);
  mb_u64(m, 0xabcd);
  mb_lstr(m, raw_key, n);
}

static void test_rdma_register(void **state) {
  (void)state;
  mb m;
  hr_msg out;
  rdma(&m, HR_RDMA_SOURCE, NULL, 0);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.rdma.role, HR_RDMA_SOURCE);
  assert_int_equal(out.u.rdma.length, 4096);
  assert_true(out.u.rdma.address == 0x7f0000100000ull);
  assert_int_equal(out.u.rdma.key, 0xabcd);
  assert_int_equal(out.u.rdma.raw_key_len, 0);
  expect_prefixes_malformed(&m, NULL);

  rdma(&m, HR_RDMA_DESTINATION, "\x11\x16\x1b", 3);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.rdma.role, HR_RDMA_DESTINATION);
  assert_int_equal(out.u.rdma.raw_key_len, 3);
  assert_memory_equal(out.u.rdma.raw_key, "\x11\x16\x1b", 3);
  expect_prefixes_malformed(&m, NULL);

  hr_msg b = {.hdr = {HR_MSG_RDMA_REGISTER, 1, 0}};
  b.u.rdma = (hr_rdma_register){HR_RDMA_DESTINATION,
                                4096,
                                0x7f0000100000ull,
                                0xabcd,
                                (const uint8_t *)"\x11\x16\x1b",
                                3};
  expect_encodes(&b, &m);
  b.u.rdma.raw_key = NULL;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);

  /* Role 2, each reserved byte, raw_key past the end, bytes left over. */
  rdma(&m, 2, NULL, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 12);
  for (int i = 1; i <= 3; i++) {
    rdma(&m, 0, NULL, 0);
    mb_end(&m);
    m.b[12 + i] = 0x40;
    expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, (uint32_t)(12 + i));
  }
  rdma(&m, 0, "ab", 2);
  m.n--;
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 40);
  rdma(&m, 0, "ab", 2);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 44);
}

/* ------------------------------------------------------------------------ */
/* LIST_REQUEST and LIST_RESPONSE                                            */
/* ------------------------------------------------------------------------ */

static void list_request(mb *m, const void *prefix, uint16_t pn,
                         const void *after, uint16_t an, uint16_t max) {
  mb_begin(m, HR_MSG_LIST_REQUEST, 3);
  mb_lstr(m, prefix, pn);
  mb_lstr(m, after, an);
  mb_u16(m, max);
}

static void test_list_request(void **state) {
  (void)state;
  mb m;
  hr_msg out;
  list_request(&m, "model/", 6, "model/b", 7, 1024);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  const hr_list_request *l = &out.u.list_request;
  assert_int_equal(l->prefix_len, 6);
  assert_memory_equal(l->prefix, "model/", 6);
  assert_int_equal(l->start_after_len, 7);
  assert_memory_equal(l->start_after, "model/b", 7);
  assert_int_equal(l->max_entries, 1024);
  expect_prefixes_malformed(&m, NULL);

  hr_msg b = {.hdr = {HR_MSG_LIST_REQUEST, 3, 0}};
  b.u.list_request = (hr_list_request){(const uint8_t *)"model/", 6,
                                       (const uint8_t *)"model/b", 7, 1024};
  expect_encodes(&b, &m);

  list_request(&m, NULL, 0, NULL, 0, 1);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.list_request.prefix_len, 0);

  /* 1024-byte strings are the limit. */
  char big[HR_MAX_KEY + 1];
  memset(big, 'p', sizeof big);
  list_request(&m, big, HR_MAX_KEY, big, HR_MAX_KEY, 7);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  list_request(&m, big, HR_MAX_KEY + 1, NULL, 0, 7);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 12);
  list_request(&m, NULL, 0, big, HR_MAX_KEY + 1, 7);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 14);
  b.u.list_request.prefix_len = HR_MAX_KEY + 1;
  b.u.list_request.prefix = (const uint8_t *)big;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);

  /* Bad UTF-8 in either string. */
  list_request(&m, "\x80", 1, NULL, 0, 5);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 14);
  list_request(&m, "a", 1, "b\xE2\x82", 3, 5);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 17);

  /* max_entries 0 and 1025; bytes left over. */
  list_request(&m, NULL, 0, NULL, 0, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 16);
  list_request(&m, NULL, 0, NULL, 0, HR_MAX_LIST_ENTRIES + 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 16);
  list_request(&m, NULL, 0, NULL, 0, 1);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 18);
}

/* One LIST_RESPONSE entry written field by field. */
static void entry(mb *m, const char *key, uint8_t elem, uint8_t tag,
                  uint8_t rank, uint64_t total) {
  mb_str(m, key);
  mb_u8(m, elem);
  mb_u8(m, tag);
  mb_u8(m, rank);
  for (unsigned i = 0; i < rank; i++)
    mb_u64(m, 2 + i);
  mb_u64(m, total);
}

static void test_list_response(void **state) {
  (void)state;
  mb m;
  hr_msg out;
  mb_begin(&m, HR_MSG_LIST_RESPONSE, 3);
  mb_u8(&m, 1);
  mb_u16(&m, 4);
  entry(&m, "a", HR_ELEM_NONE, HR_LAYOUT_COMPOSITE, 0, 96);
  entry(&m, "ab", HR_ELEM_UINT4, HR_LAYOUT_ROW_MAJOR, 1, 1);
  entry(&m, "b", HR_ELEM_FLOAT32, HR_LAYOUT_PANEL, 2, 48);
  entry(&m, "\xC3\xA9", HR_ELEM_INT8, 0xF7, HR_MAX_RANK, 1ull << 40);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  const hr_list_response *l = &out.u.list_response;
  assert_int_equal(l->more, 1);
  assert_int_equal(l->entry_count, 4);
  assert_ptr_equal(l->entries_raw, m.b + 15);
  assert_int_equal(l->entries_raw_len, m.n - 15);
  expect_prefixes_malformed(&m, NULL);

  /* Iterate, and rebuild the same bytes with hr_list_entry_put(). */
  uint8_t raw[1024];
  size_t raw_len = 0, pos = 0;
  hr_list_entry e;
  int count = 0;
  while (hr_list_entry_next(l->entries_raw, l->entries_raw_len, &pos, &e)) {
    int n = hr_list_entry_put(raw + raw_len, sizeof raw - raw_len, &e);
    assert_true(n > 0);
    raw_len += (size_t)n;
    count++;
  }
  assert_int_equal(count, 4);
  assert_int_equal(pos, l->entries_raw_len);
  assert_int_equal(raw_len, l->entries_raw_len);
  assert_memory_equal(raw, l->entries_raw, raw_len);
  pos = 0;
  hr_list_entry_next(l->entries_raw, l->entries_raw_len, &pos, &e);
  hr_list_entry_next(l->entries_raw, l->entries_raw_len, &pos, &e);
  assert_int_equal(e.key_len, 2);
  assert_memory_equal(e.key, "ab", 2);
  assert_int_equal(e.element_type, HR_ELEM_UINT4);
  assert_int_equal(e.rank, 1);
  assert_int_equal(e.shape[0], 2);
  assert_int_equal(e.total_data_bytes, 1);

  hr_msg b = {.hdr = {HR_MSG_LIST_RESPONSE, 3, 0}};
  b.u.list_response = (hr_list_response){1, 4, raw, raw_len};
  expect_encodes(&b, &m);
  /* The raw entries must hold exactly entry_count entries. */
  b.u.list_response.entry_count = 3;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);
  b.u.list_response.entry_count = 4;
  b.u.list_response.entries_raw_len--;
  assert_int_equal(hr_wire_encoded_size(&b), HR_ERR_INVALID_ARGUMENT);

  /* Empty response. */
  mb_begin(&m, HR_MSG_LIST_RESPONSE, 3);
  mb_u8(&m, 0);
  mb_u16(&m, 0);
  mb_end(&m);
  expect_roundtrip(&m, NULL, &out);
  assert_int_equal(out.u.list_response.entry_count, 0);
}

static void test_list_entry_put_arguments(void **state) {
  (void)state;
  uint8_t buf[512];
  hr_list_entry e = {(const uint8_t *)"k", 1, HR_ELEM_INT8, 1, 2, {3, 4}, 12};
  assert_int_equal(hr_list_entry_put(buf, sizeof buf, &e), 2 + 1 + 3 + 16 + 8);
  assert_int_equal(hr_list_entry_put(buf, 29, &e), HR_ERR_BUFFER_TOO_SMALL);
  e.rank = HR_MAX_RANK + 1;
  assert_int_equal(hr_list_entry_put(buf, sizeof buf, &e),
                   HR_ERR_INVALID_ARGUMENT);
  e.rank = 0;
  e.key_len = 0;
  assert_int_equal(hr_list_entry_put(buf, sizeof buf, &e),
                   HR_ERR_INVALID_ARGUMENT);
  e.key_len = HR_MAX_KEY + 1;
  assert_int_equal(hr_list_entry_put(buf, sizeof buf, &e),
                   HR_ERR_INVALID_ARGUMENT);
  e.key_len = 1;
  e.key = NULL;
  assert_int_equal(hr_list_entry_put(buf, sizeof buf, &e),
                   HR_ERR_INVALID_ARGUMENT);
  /* The iterator stops at anything that does not fit. */
  size_t pos = 0;
  hr_list_entry x;
  static const uint8_t cut[] = {1, 0, 'k', 1, 1, 1, 0, 0};
  assert_int_equal(hr_list_entry_next(cut, sizeof cut, &pos, &x), 0);
  assert_int_equal(pos, 0);
}

/* Builds a LIST_RESPONSE of entries "a" then one given entry. */
static void response_second(mb *m, const char *key, uint8_t elem, uint8_t tag,
                            uint8_t rank) {
  mb_begin(m, HR_MSG_LIST_RESPONSE, 1);
  mb_u8(m, 0);
  mb_u16(m, 2);
  entry(m, "a", HR_ELEM_INT8, HR_LAYOUT_ROW_MAJOR, 0, 1);
  entry(m, key, elem, tag, rank, 8);
}

static void test_list_response_rejections(void **state) {
  (void)state;
  mb m;
  /* more must be 0 or 1. */
  mb_begin(&m, HR_MSG_LIST_RESPONSE, 1);
  mb_u8(&m, 2);
  mb_u16(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 12);
  /* More than 1024 entries (checked at the count). */
  mb_begin(&m, HR_MSG_LIST_RESPONSE, 1);
  mb_u8(&m, 0);
  mb_u16(&m, HR_MAX_LIST_ENTRIES + 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, 13);

  /* The first entry "a" spans 2 + 1 + 3 + 8 bytes from offset 15. */
  const uint32_t SECOND = 15 + 14;
  /* Keys strictly ascending in byte order: equal, smaller, and a key
   * that is a prefix of the one before. */
  response_second(&m, "a", HR_ELEM_INT8, HR_LAYOUT_ROW_MAJOR, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, SECOND);
  mb_begin(&m, HR_MSG_LIST_RESPONSE, 1);
  mb_u8(&m, 0);
  mb_u16(&m, 2);
  entry(&m, "ab", HR_ELEM_INT8, HR_LAYOUT_ROW_MAJOR, 0, 1);
  entry(&m, "a", HR_ELEM_INT8, HR_LAYOUT_ROW_MAJOR, 0, 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, SECOND + 1);
  /* Byte order, not signed char order: 0xC3 sorts after 'z'. */
  response_second(&m, "\xC3\xA9", HR_ELEM_INT8, HR_LAYOUT_ROW_MAJOR, 0);
  mb_end(&m);
  hr_msg out;
  expect_roundtrip(&m, NULL, &out);

  /* Keys: empty, bad UTF-8. */
  response_second(&m, "", HR_ELEM_INT8, HR_LAYOUT_ROW_MAJOR, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, SECOND);
  response_second(&m, "b\xFF", HR_ELEM_INT8, HR_LAYOUT_ROW_MAJOR, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, SECOND + 2);

  /* Element types outside v1; layouts no tensor can have; rank 33. */
  const uint32_t FIXED = SECOND + 2 + 1;
  static const uint8_t bad_elems[] = {0x14, 0x20, 0xF0, 0xFF};
  for (size_t i = 0; i < sizeof bad_elems; i++) {
    response_second(&m, "b", bad_elems[i], HR_LAYOUT_ROW_MAJOR, 0);
    mb_end(&m);
    expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, FIXED);
  }
  static const uint8_t bad_tags[] = {0x00, 0x0A, 0x0C, 0xEF, 0xF1, 0xF2, 0xFF};
  for (size_t i = 0; i < sizeof bad_tags; i++) {
    response_second(&m, "b", HR_ELEM_INT8, bad_tags[i], 0);
    mb_end(&m);
    expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, FIXED + 1);
  }
  response_second(&m, "b", HR_ELEM_INT8, HR_LAYOUT_ROW_MAJOR, HR_MAX_RANK + 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, FIXED + 2);

  /* Announced entries missing; bytes left over. */
  mb_begin(&m, HR_MSG_LIST_RESPONSE, 1);
  mb_u8(&m, 0);
  mb_u16(&m, 2);
  entry(&m, "a", HR_ELEM_INT8, HR_LAYOUT_ROW_MAJOR, 0, 1);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, SECOND);
  response_second(&m, "b", HR_ELEM_INT8, HR_LAYOUT_ROW_MAJOR, 1);
  uint32_t end = mb_off(&m);
  mb_u8(&m, 0);
  mb_end(&m);
  expect_reject(&m, NULL, HR_WIRE_MALFORMED_PAYLOAD, end);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_request_minimal),
      cmocka_unit_test(test_request_full),
      cmocka_unit_test(test_request_boundaries_accepted),
      cmocka_unit_test(test_request_rejections),
      cmocka_unit_test(test_request_encoder_arguments),
      cmocka_unit_test(test_descriptor_message),
      cmocka_unit_test(test_descriptor_transport_context),
      cmocka_unit_test(test_put_message),
      cmocka_unit_test(test_data_frame),
      cmocka_unit_test(test_data_rejections),
      cmocka_unit_test(test_data_subheader),
      cmocka_unit_test(test_rdma_register),
      cmocka_unit_test(test_list_request),
      cmocka_unit_test(test_list_response),
      cmocka_unit_test(test_list_entry_put_arguments),
      cmocka_unit_test(test_list_response_rejections),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
