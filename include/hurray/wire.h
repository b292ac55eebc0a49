/*
 * libhurray: the Hurray wire v1 codec (proto/).
 *
 * A pure codec without I/O, clock or allocation (except the frame reader and
 * the checkers, which allocate through the hr_mem they are given):
 *
 *  - constants for every table of the wire format (docs/protocol.md);
 *  - one struct per message, gathered in the tagged union hr_msg;
 *  - hr_wire_decode(): one whole message (12-byte header + payload) into an
 *    hr_msg whose variable parts point into the input (no copy);
 *  - hr_wire_encoded_size() / hr_wire_encode(): the exact size, then the
 *    bytes, into a caller's buffer;
 *  - hr_reader: an incremental frame reader fed arbitrary chunks;
 *  - hr_rx: the rules that span messages (ordering, frame contiguity and
 *    total, composite binding and close-time checks, shard coverage).
 *
 * Every decoding failure is reported as HR_ERR_PROTO plus an hr_wire_status
 * naming the spec's error code, the field and the byte offset (counted from
 * the first byte of the 12-byte header).
 *
 * Thread safety: all functions are reentrant; an hr_reader or hr_rx must not
 * be used from two threads at once.
 */
#ifndef HURRAY_WIRE_H
#define HURRAY_WIRE_H

#include <hurray/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Constants (wire-v1 §§ 2-17)                                               */
/* ------------------------------------------------------------------------ */

#define HR_HEADER_SIZE 12u
#define HR_MAGIC 0x59525248u /* "HRRY" */
#define HR_VERSION_MAJOR_WIRE 1u
#define HR_VERSION_MINOR_WIRE 0u
#define HR_PREHELLO_MAX_PAYLOAD 65536u /* payload limit before both HELLOs */
#define HR_MIN_MAX_MESSAGE_SIZE 65536u

#define HR_MAX_RANK 32u
#define HR_MAX_KEY 1024u
#define HR_MAX_LAYOUTS 64u
#define HR_MAX_BUFFERS 8u
#define HR_MAX_COMPOSITE_DEPTH 8u
#define HR_MAX_COMPOSITE_MEMBERS 65535u
#define HR_MAX_TEXT 1024u
#define HR_MAX_ALIGNMENT_LOG2 21u
#define HR_MAX_LIST_ENTRIES 1024u
#define HR_BUFFER_HANDLE_SIZE 16u
#define HR_DATA_SUBHEADER_SIZE 12u /* TENSOR_DATA: index, reserved, offset */
#define HR_SESSION_TOKEN_MIN 16u

/* Message types (§ 3). */
enum hr_msg_type {
  HR_MSG_INVALID = 0x00,
  HR_MSG_CLIENT_HELLO = 0x01,
  HR_MSG_SERVER_HELLO = 0x02,
  HR_MSG_TENSOR_REQUEST = 0x03,
  HR_MSG_TENSOR_DESCRIPTOR = 0x04,
  HR_MSG_TENSOR_DATA = 0x05,
  HR_MSG_TENSOR_DATA_END = 0x06,
  HR_MSG_TENSOR_PUT = 0x07,
  HR_MSG_TENSOR_PUT_ACK = 0x08,
  HR_MSG_ERROR = 0x09,
  HR_MSG_CANCEL = 0x0A,
  HR_MSG_GOAWAY = 0x0B,
  HR_MSG_RDMA_REGISTER = 0x0C,
  HR_MSG_RDMA_READY = 0x0D,
  HR_MSG_PING = 0x0E,
  HR_MSG_PONG = 0x0F,
  HR_MSG_BUFFER_RELEASE = 0x10,
  HR_MSG_LIST_REQUEST = 0x11,
  HR_MSG_LIST_RESPONSE = 0x12,
  HR_MSG_LAST_DEFINED = 0x12,
  HR_MSG_PRIVATE_FIRST = 0xF0,
  HR_MSG_PRIVATE_LAST = 0xFE
};

/* Wire error codes (§ 12), value for value. */
enum hr_wire_error {
  HR_WIRE_NO_ERROR = 0x0000,
  HR_WIRE_PROTOCOL_VIOLATION = 0x0001,
  HR_WIRE_UNSUPPORTED_VERSION = 0x0002,
  HR_WIRE_MESSAGE_TOO_LARGE = 0x0003,
  HR_WIRE_UNKNOWN_MESSAGE_TYPE = 0x0004,
  HR_WIRE_MALFORMED_PAYLOAD = 0x0005,
  HR_WIRE_NOT_FOUND = 0x0006,
  HR_WIRE_DEVICE_UNAVAILABLE = 0x0007,
  HR_WIRE_INVALID_DESCRIPTOR = 0x0008,
  HR_WIRE_TRANSCODE_FAILED = 0x0009,
  HR_WIRE_RESOURCE_EXHAUSTED = 0x000A,
  HR_WIRE_RDMA_SETUP_FAILED = 0x000B,
  HR_WIRE_GPUDIRECT_UNAVAILABLE = 0x000C,
  HR_WIRE_SHARD_INCONSISTENT = 0x000D,
  HR_WIRE_INVALID_SYNC_MODE = 0x000E,
  HR_WIRE_UNAUTHORIZED = 0x000F,
  HR_WIRE_CANCELLED = 0x0010,
  HR_WIRE_PUT_REJECTED = 0x0011,
  HR_WIRE_ALREADY_EXISTS = 0x0012,
  HR_WIRE_COMPOSITE_INVALID = 0x0013,
  HR_WIRE_INVALID_REGION = 0x0014,
  HR_WIRE_TIMEOUT = 0x0015,
  HR_WIRE_INTERNAL = 0x0016,
  HR_WIRE_ERROR_LAST = 0x0016
};

/* Element types (§ 4). */
enum hr_elem_type {
  HR_ELEM_NONE = 0x00,
  HR_ELEM_BOOL = 0x01,
  HR_ELEM_INT8 = 0x02,
  HR_ELEM_UINT8 = 0x03,
  HR_ELEM_INT16 = 0x04,
  HR_ELEM_UINT16 = 0x05,
  HR_ELEM_INT32 = 0x06,
  HR_ELEM_UINT32 = 0x07,
  HR_ELEM_INT64 = 0x08,
  HR_ELEM_UINT64 = 0x09,
  HR_ELEM_FLOAT16 = 0x0A,
  HR_ELEM_BFLOAT16 = 0x0B,
  HR_ELEM_FLOAT32 = 0x0C,
  HR_ELEM_FLOAT64 = 0x0D,
  HR_ELEM_FLOAT8_E4M3FN = 0x0E,
  HR_ELEM_FLOAT8_E5M2 = 0x0F,
  HR_ELEM_COMPLEX64 = 0x10,
  HR_ELEM_COMPLEX128 = 0x11,
  HR_ELEM_INT4 = 0x12,
  HR_ELEM_UINT4 = 0x13,
  HR_ELEM_LAST = 0x13
};

/* Layout tags (§ 5) and the registered extension profiles (§ 5.1). */
enum hr_layout_tag {
  HR_LAYOUT_INVALID = 0x00,
  HR_LAYOUT_ROW_MAJOR = 0x01,
  HR_LAYOUT_COLUMN_MAJOR = 0x02,
  HR_LAYOUT_STRIDED = 0x03,
  HR_LAYOUT_PERMUTED = 0x04,
  HR_LAYOUT_TILED = 0x05,
  HR_LAYOUT_SPARSE_COO = 0x06,
  HR_LAYOUT_SPARSE_CSR = 0x07,
  HR_LAYOUT_SPARSE_CSC = 0x08,
  HR_LAYOUT_SPARSE_BSR = 0x09,
  HR_LAYOUT_COMPOSITE = 0x0B,
  HR_LAYOUT_EXT_FIRST = 0xF0,
  HR_LAYOUT_PANEL = 0xF0,          /* profile: u32 mr */
  HR_LAYOUT_TILED_EXACT = 0xF1,    /* profile: u8 rank, u32 tile[rank] */
  HR_LAYOUT_PERMUTED_EXACT = 0xF2, /* profile: u8 rank, u8 order[rank] */
  HR_LAYOUT_EXT_LAST = 0xFE,
  HR_LAYOUT_INVALID_FF = 0xFF
};

/* Composite rules (§ 7.3). */
enum hr_composite_rule {
  HR_COMPOSITE_TUPLE = 0x00,
  HR_COMPOSITE_CONCAT = 0x01,
  HR_COMPOSITE_GROUP_QUANTIZED = 0x02
};

/* Capability flags (§ 6). */
enum hr_capability {
  HR_CAP_TRANSCODING = 1u << 0,
  HR_CAP_PARALLEL_STREAMS = 1u << 1,
  HR_CAP_RDMA_DATA_PLANE = 1u << 2,
  HR_CAP_RDMA_GPUDIRECT = 1u << 3,
  HR_CAP_TENSOR_PUT = 1u << 4,
  HR_CAP_LIST = 1u << 5,
  HR_CAP_SHM_DATA_PLANE = 1u << 6,
  HR_CAP_REGION_REQUESTS = 1u << 7
};

/* HELLO extension types (§ 6). */
enum hr_ext_type {
  HR_EXT_AUTH_TOKEN = 0x0001,
  HR_EXT_SESSION_JOIN = 0x0002,
  HR_EXT_SESSION_TOKEN = 0x0003,
  HR_EXT_FABRIC_ADDRESS = 0x0004,
  HR_EXT_PEER_NAME = 0x0005,
  HR_EXT_MAX_SHARDS = 0x0006
};

/* Request and put flags (§§ 8, 11); descriptor flags (§ 7). */
#define HR_REQ_ALLOW_TRANSCODE (1u << 0)
#define HR_REQ_PARALLEL_OK (1u << 1)
#define HR_REQ_REGION (1u << 2)
#define HR_PUT_REPLACE (1u << 0)
#define HR_DESC_HAS_SHARD (1u << 0)

/* Device tags and memory classes (§ 16). */
enum hr_device_tag {
  HR_DEV_CPU = 0x00,
  HR_DEV_CUDA = 0x01,
  HR_DEV_ROCM = 0x02,
  HR_DEV_METAL = 0x03,
  HR_DEV_VULKAN = 0x04,
  HR_DEV_LEVEL_ZERO = 0x05,
  HR_DEV_OPENCL = 0x06,
  HR_DEV_WEBGPU = 0x07,
  HR_DEV_HEXAGON = 0x08,
  HR_DEV_LAST = 0x08,
  HR_DEV_INVALID = 0xFF
};
enum hr_memory_class {
  HR_MEM_STANDARD = 0x00,
  HR_MEM_PINNED = 0x01,
  HR_MEM_UNIFIED = 0x02,
  HR_MEM_LAST = 0x02,
  HR_MEM_INVALID = 0xFF
};

/* sync_mode (ADR-018 § 3), buffer handle offset 13. */
enum hr_sync_mode {
  HR_SYNC_PRODUCER_SYNCED = 0x00,
  HR_SYNC_EVENT = 0x01,
  HR_SYNC_CONSUMER_STREAM = 0x02,
  HR_SYNC_INVALID = 0xFF
};

/* data_plane (§ 10); RDMA_REGISTER role (§ 13). */
enum hr_data_plane {
  HR_PLANE_FRAMES = 0,
  HR_PLANE_RDMA = 1,
  HR_PLANE_SHM = 2
};
enum hr_rdma_role { HR_RDMA_SOURCE = 0, HR_RDMA_DESTINATION = 1 };

/* ------------------------------------------------------------------------ */
/* Status of a decode or a check                                             */
/* ------------------------------------------------------------------------ */

/*
 * Why peer input was rejected.  `code` is an enum hr_wire_error value (what
 * the peer should be told), `offset` the byte offset of the offending field
 * from the start of the message's 12-byte header (for multi-message checks:
 * of the message that broke the rule), and `reason` a static string naming
 * the field and the rule ("descriptor.buffers[0].sync_mode: SYNC_EVENT on a
 * network transport").  `reason` is never NULL after a failure and points to
 * static storage.
 */
typedef struct hr_wire_status {
  uint32_t code;
  uint32_t offset;
  const char *reason;
} hr_wire_status;

/* Static names: "TENSOR_REQUEST", "MALFORMED_PAYLOAD", "FLOAT32",
 * "ROW_MAJOR", "CUDA", "PINNED", "SYNC_EVENT"...  Unknown values give
 * "UNKNOWN" (errors: codes above 0x16 give "INTERNAL", as the spec says to
 * treat them).  Never NULL. */
HR_EXTERN const char *hr_msg_type_name(uint32_t type);
HR_EXTERN const char *hr_wire_error_name(uint32_t code);
HR_EXTERN const char *hr_elem_type_name(uint8_t elem);
HR_EXTERN const char *hr_layout_name(uint8_t tag);
HR_EXTERN const char *hr_device_name(uint8_t tag);
HR_EXTERN const char *hr_memory_class_name(uint8_t mc);
HR_EXTERN const char *hr_sync_mode_name(uint8_t mode);

/* Parses an error name ("NOT_FOUND") back to its code; -1 when unknown. */
HR_EXTERN int hr_wire_error_from_name(const char *name);

/* Element storage size in bits (4 for INT4/UINT4, 0 for NONE and for values
 * v1 cannot size). */
HR_EXTERN unsigned hr_elem_bits(uint8_t elem);

/* ------------------------------------------------------------------------ */
/* Message structures                                                        */
/* ------------------------------------------------------------------------ */

typedef struct hr_msg_header {
  uint32_t type;
  uint32_t stream_id;
  uint32_t payload_length;
} hr_msg_header;

/* A layout entry (§ 5).  `ext`/`ext_len` are used only for tags 0xF0-0xFE;
 * when decoded they point into the input. */
typedef struct hr_layout_entry {
  uint8_t tag;
  uint16_t ext_len;
  const uint8_t *ext;
} hr_layout_entry;

/* A parsed registered profile (§ 5.1). */
typedef struct hr_layout_profile {
  uint8_t tag;  /* HR_LAYOUT_PANEL, _TILED_EXACT or _PERMUTED_EXACT */
  uint8_t rank; /* TILED_EXACT / PERMUTED_EXACT */
  uint32_t mr;  /* PANEL */
  uint32_t tile[HR_MAX_RANK];
  uint8_t order[HR_MAX_RANK];
} hr_layout_profile;

/*
 * Parses the metadata of a registered profile entry.  Returns 0 and fills
 * `out` when `e` is 0xF0/0xF1/0xF2 and its metadata parses exactly (PANEL:
 * one u32 mr >= 1; TILED_EXACT: u8 rank then rank u32 tiles, each >= 1;
 * PERMUTED_EXACT: u8 rank then a permutation of 0..rank-1).  Returns
 * HR_ERR_UNSUPPORTED for other tags and HR_ERR_INVALID_ARGUMENT when the
 * metadata does not parse (the preference is then not satisfiable).
 */
HR_EXTERN int hr_layout_profile_parse(const hr_layout_entry *e,
                                      hr_layout_profile *out);

/* Writes the metadata of a profile; returns its length or
 * HR_ERR_BUFFER_TOO_SMALL / HR_ERR_INVALID_ARGUMENT. */
HR_EXTERN int hr_layout_profile_encode(const hr_layout_profile *p,
                                       uint8_t *out, size_t cap);

/* A buffer handle (§ 7.2). */
typedef struct hr_buffer_handle {
  uint64_t size_bytes;
  uint8_t alignment_log2;
  uint8_t device_tag;
  uint8_t memory_class;
  uint16_t device_index;
  uint8_t sync_mode;
  /* Offsets 14-15: decoded as read so that hr_descriptor_validate() can
   * reject non-zero values (INVALID_DESCRIPTOR); encoders write zeros. */
  uint8_t reserved[2];
} hr_buffer_handle;

/* The per-layout parameters (§ 5, § 7.3), parsed. */
typedef struct hr_layout_params {
  /* STRIDED */
  uint64_t origin;
  int64_t strides[HR_MAX_RANK];
  /* PERMUTED */
  uint8_t order[HR_MAX_RANK];
  /* TILED */
  uint32_t tile[HR_MAX_RANK];
  /* SPARSE_COO / CSR / CSC (nnz) and BSR (nnz = nnz_blocks) */
  uint64_t nnz;
  uint8_t index_type; /* HR_ELEM_INT32 or HR_ELEM_INT64 */
  uint8_t sorted;     /* COO */
  uint32_t br, bc;    /* BSR block shape */
  /* COMPOSITE head */
  uint32_t member_count;
  uint8_t rule;
  uint8_t axis;           /* CONCAT, GROUP_QUANTIZED */
  uint32_t group_size;    /* GROUP_QUANTIZED */
  uint8_t has_zero_point; /* GROUP_QUANTIZED */
  /* PANEL (0xF0): from the layout entry's ext_metadata, not layout_params */
  uint32_t mr;
} hr_layout_params;

/*
 * A tensor descriptor (§ 7).
 *
 * Decoding fills every field; `params_raw`/`params_len` then point at the
 * layout_params bytes inside the input.  Encoding writes `params` for every
 * known layout, and `params_raw` verbatim for unregistered extension layouts
 * (0xF3-0xFE: opaque parameters).
 */
typedef struct hr_descriptor {
  uint8_t descriptor_version; /* 1 */
  uint8_t element_type;
  uint8_t rank;
  uint8_t flags; /* HR_DESC_HAS_SHARD */
  hr_layout_entry layout;
  uint64_t shape[HR_MAX_RANK];
  hr_layout_params params;
  const uint8_t *params_raw;
  uint16_t params_len;
  uint64_t byte_offset;
  uint64_t parent_shape[HR_MAX_RANK]; /* HAS_SHARD only */
  uint64_t shard_offset[HR_MAX_RANK]; /* HAS_SHARD only */
  uint8_t buffer_count;
  hr_buffer_handle buffers[HR_MAX_BUFFERS];
} hr_descriptor;

/* The transport fields that follow a descriptor (§ 10). */
typedef struct hr_transport_fields {
  uint64_t total_data_bytes;
  uint16_t shard_index;
  uint16_t total_shards;
  uint8_t data_plane;
} hr_transport_fields;

/* Parsed known HELLO extensions (filled by the decoder; ignored by the
 * encoder, which writes `ext_raw`).  Pointers go into the input.  Only
 * extensions sent in their own direction are parsed (§ 18: misdirected ones
 * are ignored); of a repeated one the first counts. */
typedef struct hr_hello_exts {
  const uint8_t *auth_token; /* client; NULL when absent */
  uint16_t auth_token_len;
  const uint8_t *session_join; /* client */
  uint16_t session_join_len;
  const uint8_t *session_token; /* server; >= 16 bytes */
  uint16_t session_token_len;
  const uint8_t *fabric_provider; /* either; UTF-8 */
  uint16_t fabric_provider_len;
  const uint8_t *fabric_endpoint; /* either; fi_getname bytes */
  uint16_t fabric_endpoint_len;
  int has_fabric_address;
  const uint8_t *peer_name; /* either; UTF-8 */
  uint16_t peer_name_len;
  uint16_t max_shards; /* server; 0 when absent */
} hr_hello_exts;

/* One extension TLV. */
typedef struct hr_ext {
  uint16_t type;
  uint16_t length;
  const uint8_t *data;
} hr_ext;

/*
 * CLIENT_HELLO and SERVER_HELLO (§ 6).
 *
 * `devices` and `memory_classes` are byte arrays of their counts (pointing
 * into the input when decoded).  The extension list is kept raw:
 * `ext_raw` holds the `ext_count` TLVs back to back (without the u16 count);
 * iterate them with hr_ext_next() and build them with hr_ext_put().
 */
typedef struct hr_hello {
  uint32_t magic;
  uint16_t version_major;
  uint16_t version_minor;
  uint32_t capability_flags;
  uint32_t max_message_size;
  uint16_t layout_count;
  hr_layout_entry layouts[HR_MAX_LAYOUTS];
  uint16_t device_count;
  const uint8_t *devices;
  uint16_t memory_class_count;
  const uint8_t *memory_classes;
  uint16_t ext_count;
  const uint8_t *ext_raw;
  size_t ext_raw_len;
  hr_hello_exts exts; /* decode only */
} hr_hello;

/* Iterates raw extension TLVs: start with *pos = 0; returns 1 and fills
 * `out` while entries remain, 0 at the end.  Assumes `raw` was validated by
 * the decoder (or built by hr_ext_put()). */
HR_EXTERN int hr_ext_next(const uint8_t *raw, size_t raw_len, size_t *pos,
                          hr_ext *out);

/* Appends one extension TLV at out[0..]; returns the bytes written (4 +
 * len), HR_ERR_BUFFER_TOO_SMALL (cap < 4 + len; nothing written) or
 * HR_ERR_INVALID_ARGUMENT (NULL data with len > 0). */
HR_EXTERN int hr_ext_put(uint8_t *out, size_t cap, uint16_t type,
                         const void *data, uint16_t len);

/* TENSOR_REQUEST (§ 8). */
typedef struct hr_request {
  const uint8_t *key; /* UTF-8, 1-1024 bytes, not NUL-terminated */
  uint16_t key_len;
  uint32_t flags; /* HR_REQ_* */
  uint16_t layout_count;
  hr_layout_entry layouts[HR_MAX_LAYOUTS];
  uint8_t preferred_device;
  uint8_t min_alignment_log2;
  uint16_t max_shards;
  uint8_t region_rank; /* REGION only */
  uint64_t region_offset[HR_MAX_RANK];
  uint64_t region_shape[HR_MAX_RANK];
} hr_request;

/* TENSOR_DESCRIPTOR (§ 10). */
typedef struct hr_tensor_descriptor_msg {
  hr_descriptor desc;
  hr_transport_fields xport;
} hr_tensor_descriptor_msg;

/* TENSOR_DATA (§ 10).  `data` points into the input when decoded. */
typedef struct hr_data {
  uint8_t buffer_index;
  uint64_t offset; /* byte_offset_in_buffer */
  const uint8_t *data;
  uint32_t data_len; /* >= 1 */
} hr_data;

/* TENSOR_PUT (§ 11). */
typedef struct hr_put {
  const uint8_t *key;
  uint16_t key_len;
  uint32_t flags; /* HR_PUT_REPLACE */
  hr_descriptor desc;
  hr_transport_fields xport;
} hr_put;

/* ERROR (§ 12). */
typedef struct hr_error_msg {
  uint32_t code;
  const uint8_t *message; /* UTF-8, <= 1024 bytes */
  uint16_t message_len;
} hr_error_msg;

/* GOAWAY (§ 12). */
typedef struct hr_goaway {
  uint32_t last_stream_id;
  uint32_t code;
  const uint8_t *message;
  uint16_t message_len;
} hr_goaway;

/* RDMA_REGISTER (§ 13). */
typedef struct hr_rdma_register {
  uint8_t role; /* HR_RDMA_SOURCE / HR_RDMA_DESTINATION */
  uint64_t length;
  uint64_t address;
  uint64_t key;
  const uint8_t *raw_key;
  uint16_t raw_key_len;
} hr_rdma_register;

/* LIST_REQUEST (§ 15). */
typedef struct hr_list_request {
  const uint8_t *prefix;
  uint16_t prefix_len;
  const uint8_t *start_after;
  uint16_t start_after_len;
  uint16_t max_entries; /* 1-1024 */
} hr_list_request;

/* One LIST_RESPONSE entry. */
typedef struct hr_list_entry {
  const uint8_t *key;
  uint16_t key_len;
  uint8_t element_type;
  uint8_t layout_tag;
  uint8_t rank;
  uint64_t shape[HR_MAX_RANK];
  uint64_t total_data_bytes;
} hr_list_entry;

/* LIST_RESPONSE (§ 15): entries kept raw like HELLO extensions. */
typedef struct hr_list_response {
  uint8_t more;
  uint16_t entry_count;
  const uint8_t *entries_raw; /* the entries, without the u16 count */
  size_t entries_raw_len;
} hr_list_response;

/* Iterates raw LIST_RESPONSE entries (validated ones): start with *pos = 0;
 * returns 1 per entry, 0 at the end. */
HR_EXTERN int hr_list_entry_next(const uint8_t *raw, size_t raw_len,
                                 size_t *pos, hr_list_entry *out);

/* Appends one encoded entry; returns its size or HR_ERR_BUFFER_TOO_SMALL /
 * HR_ERR_INVALID_ARGUMENT (rank > 32, key length out of 1-1024). */
HR_EXTERN int hr_list_entry_put(uint8_t *out, size_t cap,
                                const hr_list_entry *e);

/* Any message. */
typedef struct hr_msg {
  hr_msg_header hdr;
  union {
    hr_hello hello;                     /* CLIENT_HELLO, SERVER_HELLO */
    hr_request request;                 /* TENSOR_REQUEST */
    hr_tensor_descriptor_msg tensor;    /* TENSOR_DESCRIPTOR */
    hr_data data;                       /* TENSOR_DATA */
    hr_put put;                         /* TENSOR_PUT */
    hr_error_msg error;                 /* ERROR */
    hr_goaway goaway;                   /* GOAWAY */
    hr_rdma_register rdma;              /* RDMA_REGISTER */
    uint64_t ping;                      /* PING, PONG: the opaque value */
    hr_list_request list_request;       /* LIST_REQUEST */
    hr_list_response list_response;     /* LIST_RESPONSE */
  } u; /* empty-payload messages use none */
} hr_msg;

/* ------------------------------------------------------------------------ */
/* Decoding                                                                  */
/* ------------------------------------------------------------------------ */

/* Where a descriptor travels: every framed socket (TCP, TLS, Unix socket)
 * is a network transport (§ 18); LOCAL is a descriptor handed over
 * in-process or through the C ABI. */
enum hr_transport_kind { HR_TRANSPORT_NETWORK = 0, HR_TRANSPORT_LOCAL = 1 };

/* Decoding context. */
typedef struct hr_wire_ctx {
  int transport; /* enum hr_transport_kind */
  /* Bitmap of implementation-private message types (0xF0-0xFE) agreed out
   * of band: bit (type - 0xF0).  0 = none (the default). */
  uint16_t private_types;
} hr_wire_ctx;

/*
 * Checks a header alone, in the order of § 18: size limit against
 * `max_payload` (MESSAGE_TOO_LARGE), message type (UNKNOWN_MESSAGE_TYPE),
 * then stream placement (PROTOCOL_VIOLATION: HELLOs, GOAWAY, PING, PONG on
 * stream 0 only; stream-bound messages on a non-zero stream; ERROR on
 * any).  Returns 0 or HR_ERR_PROTO with `st` filled.  A private type is
 * known only when `ctx` agrees it (ctx may be NULL: none agreed).
 */
HR_EXTERN int hr_wire_check_header(const hr_msg_header *h, uint32_t max_payload,
                                   const hr_wire_ctx *ctx, hr_wire_status *st);

/* Parses the 12 header bytes (no checks). */
HR_EXTERN void hr_wire_parse_header(const uint8_t in[HR_HEADER_SIZE],
                                    hr_msg_header *out);

/*
 * Decodes one whole message: `in` holds the 12-byte header and exactly
 * payload_length payload bytes (`len` must equal 12 + payload_length, else
 * MALFORMED_PAYLOAD).  Runs hr_wire_check_header() with no size limit, then
 * every single-message rule of wire-v1, descriptors included
 * (hr_descriptor_validate()).  `out`'s pointers point into `in`, which must
 * outlive their use.  No allocation.  `ctx` may be NULL (network transport).
 *
 * Returns 0, or HR_ERR_PROTO with `st` filled (st may be NULL).  On failure
 * `out` is partially filled and must not be used.  Private types agreed in
 * ctx decode with their header only (payload left to the caller).
 */
HR_EXTERN int hr_wire_decode(const uint8_t *in, size_t len,
                             const hr_wire_ctx *ctx, hr_msg *out,
                             hr_wire_status *st);

/*
 * Decodes the payload of a message whose header was already parsed (the
 * frame reader's path): `payload` holds hdr->payload_length bytes.  Offsets
 * in `st` still count from the header's first byte.  Does not re-check the
 * header.
 */
HR_EXTERN int hr_wire_decode_payload(const hr_msg_header *hdr,
                                     const uint8_t *payload,
                                     const hr_wire_ctx *ctx, hr_msg *out,
                                     hr_wire_status *st);

/*
 * Decodes the 12-byte TENSOR_DATA sub-header (buffer_index, reserved,
 * byte_offset_in_buffer) at the start of a TENSOR_DATA payload of
 * `payload_length` bytes; fills buffer_index and offset of `out` and sets
 * data_len = payload_length - 12 (data left NULL).  MALFORMED_PAYLOAD when
 * the payload is shorter than 13 bytes or a reserved byte is non-zero.
 */
HR_EXTERN int hr_wire_decode_data_subheader(const uint8_t sub[12],
                                            uint32_t payload_length,
                                            hr_data *out, hr_wire_status *st);

/*
 * Validates a descriptor against every rule of §§ 4, 5, 5.1, 7 and 17 (and,
 * with `xport` non-NULL, the transport fields that must agree with it,
 * § 10).  Used by the decoder and by senders before they encode an
 * application-supplied descriptor.  `base_offset` is added to offsets in
 * `st` (the byte position of the descriptor in its message).
 * Returns 0, HR_ERR_PROTO (INVALID_DESCRIPTOR, INVALID_SYNC_MODE,
 * COMPOSITE_INVALID or MALFORMED_PAYLOAD as § 18 assigns), or
 * HR_ERR_INVALID_ARGUMENT for a NULL `d`.
 */
HR_EXTERN int hr_descriptor_validate(const hr_descriptor *d,
                                     const hr_transport_fields *xport,
                                     const hr_wire_ctx *ctx,
                                     uint32_t base_offset, hr_wire_status *st);

/*
 * Computes the exact byte size each buffer of a dense or sparse descriptor
 * must have (§ 18 "Buffer sizes are exact"; for STRIDED the addressed span,
 * a minimum).  Fills sizes[0..n) with n = the layout's buffer count and
 * returns n, or HR_ERR_PROTO with `st` on overflow or bad parameters.
 * For composites returns 0.  Extension layouts other than PANEL:
 * HR_ERR_UNSUPPORTED.  NULL d or sizes: HR_ERR_INVALID_ARGUMENT.
 */
HR_EXTERN int hr_descriptor_buffer_sizes(const hr_descriptor *d,
                                         uint64_t sizes[HR_MAX_BUFFERS],
                                         hr_wire_status *st);

/* Number of elements (product of shape; 1 for rank 0).  Returns 0 and sets
 * *out, or HR_ERR_INVALID_ARGUMENT on u64 overflow. */
HR_EXTERN int hr_shape_elements(const uint64_t *shape, unsigned rank,
                                uint64_t *out);

/* ------------------------------------------------------------------------ */
/* Encoding                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * Returns the exact encoded size (header included) of `m`, or a negative
 * HR_ERR_INVALID_ARGUMENT when `m` cannot be encoded (a count or length
 * above its cap of § 17, a key outside 1-1024 bytes, a TENSOR_DATA without
 * data, a NULL pointer with a non-zero length, raw extension or LIST entry
 * bytes that do not hold exactly their count, a payload above 2^32-1, a
 * type other than 0x01-0x12: private payloads are the caller's, written
 * after hr_wire_put_header()).  Encoders do not re-validate what the
 * caller built beyond what keeps the output self-consistent: use
 * hr_descriptor_validate() on application data first.
 * The header's payload_length is computed; m->hdr.payload_length is ignored.
 */
HR_EXTERN int64_t hr_wire_encoded_size(const hr_msg *m);

/* Encodes `m` into out[0..cap); returns the bytes written, or
 * HR_ERR_BUFFER_TOO_SMALL (nothing written) / HR_ERR_INVALID_ARGUMENT. */
HR_EXTERN int64_t hr_wire_encode(const hr_msg *m, uint8_t *out, size_t cap);

/* Writes the 12-byte header plus the 12-byte TENSOR_DATA sub-header of a
 * frame carrying `data_len` (>= 1) bytes: the frame's data then follows from
 * the application's buffer (scatter-gather, no copy).  Returns 24, or
 * HR_ERR_INVALID_ARGUMENT (nothing written) when data_len is 0 or above
 * 2^32-13 (the payload would not fit its u32 length). */
HR_EXTERN int hr_wire_encode_data_prefix(uint8_t out[24], uint32_t stream_id,
                                         uint8_t buffer_index, uint64_t offset,
                                         uint32_t data_len);

/* Writes a 12-byte header. */
HR_EXTERN void hr_wire_put_header(uint8_t out[HR_HEADER_SIZE], uint32_t type,
                                  uint32_t stream_id, uint32_t payload_length);

/* Returns 1 when `s[0..n)` is valid UTF-8 (no overlongs, no surrogates,
 * nothing above U+10FFFF), else 0. */
HR_EXTERN int hr_utf8_valid(const uint8_t *s, size_t n);

/* ------------------------------------------------------------------------ */
/* Incremental frame reader                                                  */
/* ------------------------------------------------------------------------ */

/*
 * hr_reader cuts a byte stream into messages.  Bytes arrive in chunks of any
 * size (one byte at a time works); the reader keeps only a 12-byte header
 * buffer, a 12-byte TENSOR_DATA sub-header buffer and a control-payload
 * buffer that grows through the reader's hr_mem as payload bytes arrive
 * (never ahead of them: a header announcing 4 GiB allocates nothing).
 * TENSOR_DATA payloads are never buffered: their bytes are handed on as
 * HR_RD_DATA pieces pointing into the caller's input, or placed by the
 * caller itself (hr_reader_data_pending() / hr_reader_skip_data()).
 *
 * The reader checks headers only (hr_wire_check_header(), plus the minimum
 * TENSOR_DATA length and its sub-header); control payloads are decoded by
 * the caller with hr_wire_decode_payload().  No I/O, no clock.
 */
typedef struct hr_reader hr_reader;

/* What hr_reader_feed() produced. */
enum hr_reader_event_kind {
  HR_RD_NONE = 0, /* all input consumed, nothing complete yet */
  HR_RD_MESSAGE,  /* a whole non-TENSOR_DATA message: hdr + payload */
  HR_RD_DATA,     /* a piece of a TENSOR_DATA payload */
  HR_RD_ERROR     /* a header-level rejection; see `status` */
};

typedef struct hr_reader_event {
  /* enum hr_reader_event_kind. */
  int kind;
  /* The header of the message the event belongs to (every kind but
   * HR_RD_NONE). */
  hr_msg_header hdr;
  /* HR_RD_MESSAGE: the payload, hdr.payload_length contiguous bytes (NULL
   * when the length is 0).  It points into the caller's input when the
   * whole message arrived in one call, else into the reader's own buffer;
   * either way it is valid until the next call into the reader (and, when
   * it points into the input, as long as the input). */
  const uint8_t *payload;
  /* HR_RD_DATA: the sub-header's buffer_index. */
  uint8_t buffer_index;
  /* HR_RD_DATA: the buffer offset of data[0]
   * (= frame_offset + bytes of this frame delivered before). */
  uint64_t offset;
  /* HR_RD_DATA: this piece's bytes, pointing into the caller's input (NULL
   * when len is 0). */
  const uint8_t *data;
  size_t len;
  /* HR_RD_DATA: the whole frame as sent: its byte_offset_in_buffer and its
   * data length (payload_length - 12, >= 1). */
  uint64_t frame_offset;
  uint32_t frame_len;
  /* HR_RD_DATA: 1 on the frame's first piece (the sub-header just
   * completed; such a piece may carry 0 bytes when the input ended right
   * after the sub-header), 1 in `last` on the piece that completes the
   * frame.  A frame whose remaining bytes the caller placed itself with
   * hr_reader_skip_data() has no `last` piece. */
  int first;
  int last;
  /* HR_RD_ERROR: what was wrong (code, offset from the header's first
   * byte, static reason). */
  hr_wire_status status;
  /* HR_RD_ERROR: 1 when the connection must close: MESSAGE_TOO_LARGE, any
   * rejection of a message on stream 0.  Then the reader is dead: every
   * later hr_reader_feed() consumes nothing and reports the same error.
   * 0: only that message is rejected (unknown type, misplaced message or a
   * TENSOR_DATA too short or with a bad sub-header, on a non-zero stream);
   * the reader skips the rest of its payload without buffering it and goes
   * on with the next message.  The caller answers on hdr.stream_id. */
  int fatal;
} hr_reader_event;

typedef struct hr_reader_settings {
  /* Largest payload accepted, in bytes (the limit counts payload bytes,
   * not the header).  0 means the default, HR_PREHELLO_MAX_PAYLOAD
   * (65,536), the limit before both HELLOs. */
  uint32_t max_payload;
  /* Decoding context: the agreed private types matter here (an unagreed
   * one is UNKNOWN_MESSAGE_TYPE). */
  hr_wire_ctx ctx;
} hr_reader_settings;

/*
 * Creates a reader in `*out`.  `s` is copied (NULL: defaults); `mem` is
 * copied (NULL: hr_mem_default()).  Nothing is allocated for payloads yet.
 * Returns 0, HR_ERR_INVALID_ARGUMENT (out NULL) or HR_ERR_NOMEM.
 */
HR_EXTERN int hr_reader_new(hr_reader **out, const hr_reader_settings *s,
                            const hr_mem *mem);
/* Frees the reader and its buffer; NULL is a no-op.  Payload pointers of
 * earlier events that pointed into the reader's buffer become invalid. */
HR_EXTERN void hr_reader_del(hr_reader *r);

/* Changes the payload limit (e.g. to our advertised max_message_size after
 * the HELLOs; 0: back to 65,536).  It applies from the next header: a
 * message whose header was already accepted keeps the limit it passed. */
HR_EXTERN void hr_reader_set_max_payload(hr_reader *r, uint32_t max_payload);

/*
 * Consumes input and stops at the first event.  Returns the number of
 * bytes consumed (0..len) and fills `ev`; ev->kind is HR_RD_NONE when all
 * `len` bytes were consumed without completing anything.  Call again with
 * the rest of the input (in + returned count) until it returns HR_RD_NONE;
 * the input is borrowed for the call, and the event's pointers into it stay
 * valid as long as the caller keeps it.
 *
 * Check order of a header (wire-v1 § 18): a payload_length above
 * max_payload is MESSAGE_TOO_LARGE at once, fatal, nothing of the payload
 * read; then the type (UNKNOWN_MESSAGE_TYPE), then the stream placement
 * (PROTOCOL_VIOLATION), both reported as soon as the header is complete,
 * before the payload arrives.  A TENSOR_DATA whose payload_length is below
 * 13 is MALFORMED_PAYLOAD (offset 8); one whose sub-header does not decode
 * is rejected with hr_wire_decode_data_subheader()'s status.
 *
 * Control payloads are buffered (bounded by max_payload; the buffer grows
 * as bytes arrive, at most to twice what arrived, and is released after a
 * message above 64 KiB).  TENSOR_DATA payloads are never buffered.
 *
 * Returns a negative HR_ERR_INVALID_ARGUMENT (r or ev NULL, or in NULL
 * with len > 0) or HR_ERR_NOMEM (the control buffer could not grow: fatal,
 * only hr_reader_del() is legal afterwards).
 */
HR_EXTERN int64_t hr_reader_feed(hr_reader *r, const uint8_t *in, size_t len,
                                 hr_reader_event *ev);

/*
 * Zero-copy receive.  While the reader is inside a TENSOR_DATA frame whose
 * sub-header is complete (after an HR_RD_DATA event that was not `last`),
 * returns the number of data bytes still expected and fills *buffer_index
 * and *offset (the buffer offset of the next byte; either pointer may be
 * NULL); otherwise returns 0.  The caller may then place up to that many
 * bytes itself (e.g. recv() straight into the destination) and report them
 * with hr_reader_skip_data().
 */
HR_EXTERN uint64_t hr_reader_data_pending(const hr_reader *r,
                                          uint8_t *buffer_index,
                                          uint64_t *offset);
/* Tells the reader that `n` (<= pending) data bytes of the current frame
 * were placed by the caller.  Returns 0, or HR_ERR_INVALID_ARGUMENT when n
 * exceeds hr_reader_data_pending() (nothing changes). */
HR_EXTERN int hr_reader_skip_data(hr_reader *r, uint64_t n);

/* Returns 1 when the reader stands exactly between two messages (no byte
 * of a next header read), else 0 (also after a fatal error). */
HR_EXTERN int hr_reader_at_boundary(const hr_reader *r);

/* ------------------------------------------------------------------------ */
/* Multi-message checkers: the receiving side of one request or PUT         */
/* ------------------------------------------------------------------------ */

/*
 * hr_rx checks the rules that span messages on the streams of one transfer,
 * as its receiver sees them: the answer to one TENSOR_REQUEST (S2C, on the
 * client) or one TENSOR_PUT (C2S, on the server).  The engine decodes each
 * message (hr_wire_decode*(), which checks every single-message rule) and
 * hands it to hr_rx_on_message(); hr_rx does no I/O and keeps no pointer
 * to a message after the call.
 *
 * Rules checked (wire-v1 §§ 9-12, 18 and the seeds):
 *  - per tensor: DESCRIPTOR (or TENSOR_PUT) → DATA* → DATA_END; frames in
 *    ascending order through buffer 0, then 1...: no gap, no overlap, none
 *    past its buffer or spanning two, none on a size-0 buffer or on a
 *    tensor of 0 bytes, buffer_index < buffer_count, total ==
 *    total_data_bytes (PROTOCOL_VIOLATION);
 *  - data_plane RDMA: one RDMA_REGISTER (role SOURCE, length >=
 *    total_data_bytes) then DATA_END, no frames; SHM: DATA_END, no frames;
 *  - composites: head + DATA_END, then member_count members pre-order, depth
 *    <= 8, head values and close-time checks per rule, members never
 *    shards (COMPOSITE_INVALID);
 *  - shards (S2C, PARALLEL_OK or REGION): HAS_SHARD on every answer
 *    (PROTOCOL_VIOLATION when missing, or when present on a plain
 *    request's answer); shard i on stream base+i; N <= max_shards (and <=
 *    the server's MAX_SHARDS when known); shards agree on parent_shape,
 *    element type, layout tag and total_shards and tile the requested box
 *    exactly (SHARD_INCONSISTENT);
 *  - C2S: TENSOR_PUT first; members of a composite PUT as
 *    TENSOR_DESCRIPTOR, never after a non-composite PUT
 *    (PROTOCOL_VIOLATION); a PUT with HAS_SHARD is PUT_REJECTED;
 *  - ERROR ends its stream (and the transfer: it can no longer complete).
 *
 * After the receiver sent CANCEL it discards what arrives on the stream
 * until the answering ERROR (§ 12); it need not feed those messages here.
 */
typedef struct hr_rx hr_rx;

#define HR_RX_S2C 0
#define HR_RX_C2S 1

/* What is being received. */
typedef struct hr_rx_config {
  /* HR_RX_S2C (the answer to a TENSOR_REQUEST, on the client) or
   * HR_RX_C2S (a PUT, as the server receives it). */
  int direction;
  /* The request's (or PUT's) stream id.  C2S only: 0 means "the stream of
   * the first message", which must then be the TENSOR_PUT. */
  uint32_t base_stream;
  /* S2C: the request as sent: its flags (HR_REQ_*), max_shards (K, read
   * only with PARALLEL_OK) and, with REGION, the region. */
  uint32_t request_flags;
  uint16_t max_shards;
  uint8_t region_rank;
  uint64_t region_offset[HR_MAX_RANK];
  uint64_t region_shape[HR_MAX_RANK];
  /* S2C: the server's MAX_SHARDS extension (0: not advertised).  When set,
   * more shards than min(K, server_max_shards) is SHARD_INCONSISTENT. */
  uint16_t server_max_shards;
  /* Torn composites at hr_rx_finish(): 1 strict (COMPOSITE_INVALID), 0
   * permissive (hr_rx_finish() succeeds, hr_rx_torn() returns 1: the
   * members that ended are independent tensors, never a composite). */
  int strict;
} hr_rx_config;

/*
 * What a message meant.  hr_rx_event.kind is a bit set: exactly one
 * primary bit (TENSOR_BEGIN, DATA, TENSOR_END or STREAM_ENDED), or 0
 * (HR_RXE_NONE: a message that changes nothing, e.g. an ERROR racing the
 * end of its stream, or an RDMA_REGISTER), plus any of the secondary bits
 * COMPOSITE_CLOSE, SHARDS_VALID and DONE.
 */
enum hr_rx_event_kind {
  HR_RXE_NONE = 0,
  /* Primary: a descriptor (or TENSOR_PUT): a tensor, shard or member
   * starts; `desc`/`xport` describe it. */
  HR_RXE_TENSOR_BEGIN = 1 << 0,
  /* Primary: a frame that fits; place it (buffer_index, offset, len). */
  HR_RXE_DATA = 1 << 1,
  /* Primary: DATA_END: that tensor/shard/member (or composite head) is
   * complete. */
  HR_RXE_TENSOR_END = 1 << 2,
  /* Secondary, with TENSOR_END: `composites_closed` composites closed and
   * passed their close-time checks (innermost first). */
  HR_RXE_COMPOSITE_CLOSE = 1 << 3,
  /* Secondary, with TENSOR_BEGIN: this was the last of the N shard
   * descriptors, and the N shards agree and tile the requested box. */
  HR_RXE_SHARDS_VALID = 1 << 4,
  /* Secondary: this message completed the whole transfer. */
  HR_RXE_DONE = 1 << 5,
  /* Primary: the peer ended stream `stream_id` with ERROR (code in
   * `error_code`).  The transfer can no longer complete; the other
   * streams' messages are still checked. */
  HR_RXE_STREAM_ENDED = 1 << 6
};

typedef struct hr_rx_event {
  /* Bit set of enum hr_rx_event_kind (see there). */
  int kind;
  /* The message's stream. */
  uint32_t stream_id;
  /* Sharded answers: this stream's shard index and the shard count N (0 and
   * 1 otherwise). */
  uint16_t shard_index;
  uint16_t total_shards;
  /* The composite nesting depth of the tensor the message belongs to: 0
   * for a tensor outside any composite, 1 for a top-level composite head,
   * 2 for its members (and for a nested head), and so on. */
  unsigned depth;
  /* Its position among the members of the innermost enclosing composite
   * (0 when depth <= 1). */
  uint32_t member_index;
  /* TENSOR_BEGIN: the descriptor and transport fields, pointing into the
   * message passed in (valid as long as it); NULL otherwise. */
  const hr_descriptor *desc;
  const hr_transport_fields *xport;
  /* DATA: the frame's buffer, offset and data length (copied from the
   * message), and the bytes of the tensor received so far, this frame
   * included. */
  uint8_t buffer_index;
  uint64_t offset;
  uint32_t len;
  uint64_t received;
  /* COMPOSITE_CLOSE: how many composites this DATA_END closed. */
  unsigned composites_closed;
  /* STREAM_ENDED: the peer's error code (as sent). */
  uint32_t error_code;
  /* 1 when the DONE bit is set. */
  int done;
} hr_rx_event;

/*
 * Creates a checker in `*out`; `cfg` and `mem` are copied (mem NULL:
 * hr_mem_default()).  Returns 0, HR_ERR_NOMEM, or HR_ERR_INVALID_ARGUMENT
 * (out or cfg NULL, an unknown direction, base_stream 0 for S2C, REGION
 * with region_rank > 32, PARALLEL_OK with max_shards 0).
 */
HR_EXTERN int hr_rx_new(hr_rx **out, const hr_rx_config *cfg,
                        const hr_mem *mem);
/* Frees the checker; NULL is a no-op. */
HR_EXTERN void hr_rx_del(hr_rx *rx);

/*
 * Feeds one decoded message that arrived on one of the transfer's streams.
 * For TENSOR_DATA only the frame's geometry is used (buffer_index, offset,
 * data_len), so a streaming receiver may pass a message whose data is not
 * in memory.  `m` is borrowed for the call (ev->desc/xport point into it).
 *
 * Returns 0 and fills `ev`, or:
 *  - HR_ERR_PROTO with `st` filled (st may be NULL): the code to send on
 *    the stream (PROTOCOL_VIOLATION, SHARD_INCONSISTENT, COMPOSITE_INVALID,
 *    INVALID_DESCRIPTOR, PUT_REJECTED); `st->offset` is the offending
 *    field's offset in that message where known, else 0.  After it the
 *    checker is finished and every later call returns HR_ERR_STATE;
 *  - HR_ERR_STATE: the checker already failed;
 *  - HR_ERR_INVALID_ARGUMENT: rx, m or ev NULL;
 *  - HR_ERR_NOMEM (fatal: only hr_rx_del() is legal afterwards).
 *
 * Any message type other than TENSOR_DESCRIPTOR, TENSOR_DATA,
 * TENSOR_DATA_END, TENSOR_PUT (C2S), RDMA_REGISTER and ERROR is
 * PROTOCOL_VIOLATION (RDMA_READY and CANCEL travel the other way; a
 * C2S receiver handles CANCEL itself).  A message on a stream outside the
 * transfer is PROTOCOL_VIOLATION (SHARD_INCONSISTENT for a shard
 * descriptor outside the reserved block), and so is one on a reserved
 * stream the answer turned out not to use (any stream but the first of an
 * unsharded answer; streams base + N and above of N shards, where a
 * descriptor is SHARD_INCONSISTENT).  A second ERROR on an ended
 * stream, or an ERROR after the stream completed, is HR_RXE_NONE; any
 * other message on a completed or ended stream is PROTOCOL_VIOLATION.
 */
HR_EXTERN int hr_rx_on_message(hr_rx *rx, const hr_msg *m, hr_rx_event *ev,
                               hr_wire_status *st);

/*
 * The byte stream ended (or the caller gives up on the transfer).  Returns
 * 0 when the transfer is complete (or, permissive, torn only inside a
 * composite: see hr_rx_torn()); HR_ERR_REMOTE when the peer ended a
 * stream with ERROR (st->code is its code); else HR_ERR_PROTO with `st`: a
 * torn composite (strict) is COMPOSITE_INVALID, anything else unfinished
 * (a tensor without DATA_END, missing shards) PROTOCOL_VIOLATION.  Also
 * HR_ERR_STATE after an earlier failure, HR_ERR_INVALID_ARGUMENT for a
 * NULL rx.  May be called more than once.
 */
HR_EXTERN int hr_rx_finish(hr_rx *rx, hr_wire_status *st);

/* Returns 1 when every stream of the transfer is complete, else 0. */
HR_EXTERN int hr_rx_done(const hr_rx *rx);

/* Returns 1 after a permissive hr_rx_finish() accepted a torn composite:
 * the members whose TENSOR_END was reported are independent tensors (a
 * member cut inside its data is dropped) and the composite must not be
 * presented as complete.  Else 0. */
HR_EXTERN int hr_rx_torn(const hr_rx *rx);

/*
 * Stateless checker pieces, reused by hr_rx and usable alone.
 */

/*
 * Shard boxes: checks that the `n` boxes (offsets[i][0..rank),
 * shapes[i][0..rank)) lie inside the box box_offset + box_shape and tile it
 * exactly, without overlap or gap.  A box with a zero extent is accepted
 * only when the requested box itself is empty.  Nothing is kept; scratch
 * memory comes from `mem` (NULL: hr_mem_default()).
 *
 * Cost: O(n·rank) plus, when the boxes are cut along r axes (those where
 * some box does not span the whole box), O(M log M · r) for M = (n+1)·2^r
 * corners while M stays below 2^21 (r is 1 or 2 for usual shardings);
 * beyond, a sweep over pairs along the most-cut axis, O(n log n + n·k·rank)
 * with k the boxes sharing a slab (O(n²·rank) at worst).
 *
 * Returns 0; HR_ERR_PROTO with SHARD_INCONSISTENT in `st` (n == 0, a box
 * outside, empty, overlapping, a gap, or a requested box whose volume
 * overflows u64 on the fallback path); HR_ERR_INVALID_ARGUMENT (rank > 32,
 * NULL arrays with n > 0); HR_ERR_NOMEM.
 */
HR_EXTERN int hr_shards_check_tiling(unsigned rank, const uint64_t *box_offset,
                                     const uint64_t *box_shape, size_t n,
                                     const uint64_t *const *offsets,
                                     const uint64_t *const *shapes,
                                     const hr_mem *mem, hr_wire_status *st);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_WIRE_H */
