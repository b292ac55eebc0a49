/* The static names of wire values and the element sizes (hr_names.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <hurray/wire.h>

static void test_msg_type_names(void **state) {
  (void)state;
  static const char *const expected[] = {"INVALID",
                                         "CLIENT_HELLO",
                                         "SERVER_HELLO",
                                         "TENSOR_REQUEST",
                                         "TENSOR_DESCRIPTOR",
                                         "TENSOR_DATA",
                                         "TENSOR_DATA_END",
                                         "TENSOR_PUT",
                                         "TENSOR_PUT_ACK",
                                         "ERROR",
                                         "CANCEL",
                                         "GOAWAY",
                                         "RDMA_REGISTER",
                                         "RDMA_READY",
                                         "PING",
                                         "PONG",
                                         "BUFFER_RELEASE",
                                         "LIST_REQUEST",
                                         "LIST_RESPONSE"};
  for (uint32_t t = 0; t <= HR_MSG_LAST_DEFINED; t++)
    assert_string_equal(hr_msg_type_name(t), expected[t]);
  assert_string_equal(hr_msg_type_name(0x13), "UNKNOWN");
  assert_string_equal(hr_msg_type_name(0xEF), "UNKNOWN");
  assert_string_equal(hr_msg_type_name(0xF0), "PRIVATE");
  assert_string_equal(hr_msg_type_name(0xFE), "PRIVATE");
  assert_string_equal(hr_msg_type_name(0xFF), "UNKNOWN");
  assert_string_equal(hr_msg_type_name(0x100), "UNKNOWN");
  assert_string_equal(hr_msg_type_name(UINT32_MAX), "UNKNOWN");
}

static void test_wire_error_names(void **state) {
  (void)state;
  assert_string_equal(hr_wire_error_name(0), "NO_ERROR");
  assert_string_equal(hr_wire_error_name(5), "MALFORMED_PAYLOAD");
  assert_string_equal(hr_wire_error_name(0x0E), "INVALID_SYNC_MODE");
  assert_string_equal(hr_wire_error_name(0x14), "INVALID_REGION");
  assert_string_equal(hr_wire_error_name(0x16), "INTERNAL");
  /* § 12: reserved codes are treated as INTERNAL. */
  assert_string_equal(hr_wire_error_name(0x17), "INTERNAL");
  assert_string_equal(hr_wire_error_name(UINT32_MAX), "INTERNAL");
  /* Every name parses back to its code. */
  for (uint32_t c = 0; c <= HR_WIRE_ERROR_LAST; c++)
    assert_int_equal(hr_wire_error_from_name(hr_wire_error_name(c)), c);
  assert_int_equal(hr_wire_error_from_name("NOT_FOUND"), HR_WIRE_NOT_FOUND);
  assert_int_equal(hr_wire_error_from_name("not_found"), -1);
  assert_int_equal(hr_wire_error_from_name("NOT_FOUND "), -1);
  assert_int_equal(hr_wire_error_from_name(""), -1);
  assert_int_equal(hr_wire_error_from_name(NULL), -1);
}

static void test_elem_types(void **state) {
  (void)state;
  static const struct {
    uint8_t v;
    const char *name;
    unsigned bits;
  } cases[] = {
      {0x00, "NONE", 0},          {0x01, "BOOL", 8},
      {0x02, "INT8", 8},          {0x03, "UINT8", 8},
      {0x04, "INT16", 16},        {0x05, "UINT16", 16},
      {0x06, "INT32", 32},        {0x07, "UINT32", 32},
      {0x08, "INT64", 64},        {0x09, "UINT64", 64},
      {0x0A, "FLOAT16", 16},      {0x0B, "BFLOAT16", 16},
      {0x0C, "FLOAT32", 32},      {0x0D, "FLOAT64", 64},
      {0x0E, "FLOAT8_E4M3FN", 8}, {0x0F, "FLOAT8_E5M2", 8},
      {0x10, "COMPLEX64", 64},    {0x11, "COMPLEX128", 128},
      {0x12, "INT4", 4},          {0x13, "UINT4", 4},
      {0x14, "UNKNOWN", 0},       {0xEF, "UNKNOWN", 0},
      {0xF0, "EXTENSION", 0},     {0xFE, "EXTENSION", 0},
      {0xFF, "INVALID", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_string_equal(hr_elem_type_name(cases[i].v), cases[i].name);
    assert_int_equal(hr_elem_bits(cases[i].v), cases[i].bits);
  }
}

static void test_layout_names(void **state) {
  (void)state;
  static const struct {
    uint8_t v;
    const char *name;
  } cases[] = {
      {0x00, "INVALID"},     {0x01, "ROW_MAJOR"},      {0x02, "COLUMN_MAJOR"},
      {0x03, "STRIDED"},     {0x04, "PERMUTED"},       {0x05, "TILED"},
      {0x06, "SPARSE_COO"},  {0x07, "SPARSE_CSR"},     {0x08, "SPARSE_CSC"},
      {0x09, "SPARSE_BSR"},  {0x0A, "UNKNOWN"},        {0x0B, "COMPOSITE"},
      {0x0C, "UNKNOWN"},     {0xEF, "UNKNOWN"},        {0xF0, "PANEL"},
      {0xF1, "TILED_EXACT"}, {0xF2, "PERMUTED_EXACT"}, {0xF3, "EXTENSION"},
      {0xFE, "EXTENSION"},   {0xFF, "INVALID"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    assert_string_equal(hr_layout_name(cases[i].v), cases[i].name);
}

static void test_device_memory_sync_names(void **state) {
  (void)state;
  static const char *const devices[] = {"CPU",    "CUDA",   "ROCM",
                                        "METAL",  "VULKAN", "LEVEL_ZERO",
                                        "OPENCL", "WEBGPU", "HEXAGON"};
  for (uint8_t d = 0; d <= HR_DEV_LAST; d++)
    assert_string_equal(hr_device_name(d), devices[d]);
  assert_string_equal(hr_device_name(0x09), "UNKNOWN");
  assert_string_equal(hr_device_name(0xF0), "EXTENSION");
  assert_string_equal(hr_device_name(0xFF), "INVALID");

  assert_string_equal(hr_memory_class_name(0), "STANDARD");
  assert_string_equal(hr_memory_class_name(1), "PINNED");
  assert_string_equal(hr_memory_class_name(2), "UNIFIED");
  assert_string_equal(hr_memory_class_name(3), "UNKNOWN");
  assert_string_equal(hr_memory_class_name(0xF0), "UNKNOWN");
  assert_string_equal(hr_memory_class_name(0xFF), "INVALID");

  assert_string_equal(hr_sync_mode_name(0), "SYNC_PRODUCER_SYNCED");
  assert_string_equal(hr_sync_mode_name(1), "SYNC_EVENT");
  assert_string_equal(hr_sync_mode_name(2), "SYNC_CONSUMER_STREAM");
  assert_string_equal(hr_sync_mode_name(3), "UNKNOWN");
  assert_string_equal(hr_sync_mode_name(0xFE), "UNKNOWN");
  assert_string_equal(hr_sync_mode_name(0xFF), "INVALID");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_msg_type_names),
      cmocka_unit_test(test_wire_error_names),
      cmocka_unit_test(test_elem_types),
      cmocka_unit_test(test_layout_names),
      cmocka_unit_test(test_device_memory_sync_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
