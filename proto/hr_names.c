/*
 * Static names for the values of the wire tables (wire-v1 §§ 3-5, 12, 16,
 * ADR-018 § 3) and the element sizes of § 4.
 *
 * Every table is indexed by value and its length is pinned to the last
 * value of its enum with _Static_assert, so adding an enum value without a
 * name fails the build.
 */
#include <string.h>

#include "hr_internal.h"

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

static const char *const msg_type_names[] = {
    "INVALID",
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
    "LIST_RESPONSE",
};
_Static_assert(COUNT_OF(msg_type_names) == HR_MSG_LAST_DEFINED + 1,
               "one name per message type");

static const char *const wire_error_names[] = {
    "NO_ERROR",
    "PROTOCOL_VIOLATION",
    "UNSUPPORTED_VERSION",
    "MESSAGE_TOO_LARGE",
    "UNKNOWN_MESSAGE_TYPE",
    "MALFORMED_PAYLOAD",
    "NOT_FOUND",
    "DEVICE_UNAVAILABLE",
    "INVALID_DESCRIPTOR",
    "TRANSCODE_FAILED",
    "RESOURCE_EXHAUSTED",
    "RDMA_SETUP_FAILED",
    "GPUDIRECT_UNAVAILABLE",
    "SHARD_INCONSISTENT",
    "INVALID_SYNC_MODE",
    "UNAUTHORIZED",
    "CANCELLED",
    "PUT_REJECTED",
    "ALREADY_EXISTS",
    "COMPOSITE_INVALID",
    "INVALID_REGION",
    "TIMEOUT",
    "INTERNAL",
};
_Static_assert(COUNT_OF(wire_error_names) == HR_WIRE_ERROR_LAST + 1,
               "one name per wire error code");

/* Element names and storage sizes (§ 4), side by side so they cannot
 * drift apart. */
static const struct {
  const char *name;
  uint8_t bits;
} elem_types[] = {
    {"NONE", 0},        {"BOOL", 8},       {"INT8", 8},
    {"UINT8", 8},       {"INT16", 16},     {"UINT16", 16},
    {"INT32", 32},      {"UINT32", 32},    {"INT64", 64},
    {"UINT64", 64},     {"FLOAT16", 16},   {"BFLOAT16", 16},
    {"FLOAT32", 32},    {"FLOAT64", 64},   {"FLOAT8_E4M3FN", 8},
    {"FLOAT8_E5M2", 8}, {"COMPLEX64", 64}, {"COMPLEX128", 128},
    {"INT4", 4},        {"UINT4", 4},
};
_Static_assert(COUNT_OF(elem_types) == HR_ELEM_LAST + 1,
               "one entry per element type");

/* Layout tags 0x00-0x0B; 0x0A is reserved and has no name. */
static const char *const layout_names[] = {
    "INVALID",    "ROW_MAJOR",  "COLUMN_MAJOR", "STRIDED",
    "PERMUTED",   "TILED",      "SPARSE_COO",   "SPARSE_CSR",
    "SPARSE_CSC", "SPARSE_BSR", NULL,           "COMPOSITE",
};
_Static_assert(COUNT_OF(layout_names) == HR_LAYOUT_COMPOSITE + 1,
               "one name per core layout tag");

/* The registered extension profiles of § 5.1, from 0xF0 on. */
static const char *const profile_names[] = {
    "PANEL",
    "TILED_EXACT",
    "PERMUTED_EXACT",
};
_Static_assert(COUNT_OF(profile_names) ==
                   HR_LAYOUT_PERMUTED_EXACT - HR_LAYOUT_EXT_FIRST + 1,
               "one name per registered profile");

static const char *const device_names[] = {
    "CPU",        "CUDA",   "ROCM",   "METAL",   "VULKAN",
    "LEVEL_ZERO", "OPENCL", "WEBGPU", "HEXAGON",
};
_Static_assert(COUNT_OF(device_names) == HR_DEV_LAST + 1,
               "one name per device tag");

static const char *const memory_class_names[] = {
    "STANDARD",
    "PINNED",
    "UNIFIED",
};
_Static_assert(COUNT_OF(memory_class_names) == HR_MEM_LAST + 1,
               "one name per memory class");

static const char *const sync_mode_names[] = {
    "SYNC_PRODUCER_SYNCED",
    "SYNC_EVENT",
    "SYNC_CONSUMER_STREAM",
};
_Static_assert(COUNT_OF(sync_mode_names) == HR_SYNC_CONSUMER_STREAM + 1,
               "one name per sync mode");

/* The ranges the tables of §§ 4, 5 and 16 call "extension" share a name,
 * and so do the values they call "invalid" (0xFF). */
static const char *ext_or_unknown(uint8_t v) {
  if (v == 0xFF)
    return "INVALID";
  if (v >= 0xF0)
    return "EXTENSION";
  return "UNKNOWN";
}

const char *hr_msg_type_name(uint32_t type) {
  if (type <= HR_MSG_LAST_DEFINED)
    return msg_type_names[type];
  if (type >= HR_MSG_PRIVATE_FIRST && type <= HR_MSG_PRIVATE_LAST)
    return "PRIVATE";
  return "UNKNOWN";
}

const char *hr_wire_error_name(uint32_t code) {
  /* § 12: reserved codes are treated as INTERNAL. */
  if (code > HR_WIRE_ERROR_LAST)
    return wire_error_names[HR_WIRE_INTERNAL];
  return wire_error_names[code];
}

int hr_wire_error_from_name(const char *name) {
  if (!name)
    return -1;
  for (size_t i = 0; i < COUNT_OF(wire_error_names); i++)
    if (strcmp(name, wire_error_names[i]) == 0)
      return (int)i;
  return -1;
}

const char *hr_elem_type_name(uint8_t elem) {
  if (elem <= HR_ELEM_LAST)
    return elem_types[elem].name;
  return ext_or_unknown(elem);
}

unsigned hr_elem_bits(uint8_t elem) {
  return elem <= HR_ELEM_LAST ? elem_types[elem].bits : 0;
}

const char *hr_layout_name(uint8_t tag) {
  if (tag <= HR_LAYOUT_COMPOSITE && layout_names[tag])
    return layout_names[tag];
  if (tag >= HR_LAYOUT_PANEL && tag <= HR_LAYOUT_PERMUTED_EXACT)
    return profile_names[tag - HR_LAYOUT_EXT_FIRST];
  return ext_or_unknown(tag);
}

const char *hr_device_name(uint8_t tag) {
  if (tag <= HR_DEV_LAST)
    return device_names[tag];
  return ext_or_unknown(tag);
}

const char *hr_memory_class_name(uint8_t mc) {
  if (mc <= HR_MEM_LAST)
    return memory_class_names[mc];
  /* § 16 defines no extension range for memory classes. */
  return mc == HR_MEM_INVALID ? "INVALID" : "UNKNOWN";
}

const char *hr_sync_mode_name(uint8_t mode) {
  if (mode <= HR_SYNC_CONSUMER_STREAM)
    return sync_mode_names[mode];
  return mode == HR_SYNC_INVALID ? "INVALID" : "UNKNOWN";
}
