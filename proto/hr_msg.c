/*
 * The message codec (wire-v1 §§ 1-3, 6, 8, 10-13, 15, 17, 18): the 12-byte
 * header, every message payload, and the rules a single message can break.
 *
 * Decoders read through an hr_cursor whose base is the header size, so
 * hr_cursor_off() is already the offset from the header's first byte that
 * statuses report.  A failed cursor read does not advance and makes every
 * later read fail, so after a run of reads the cursor still points at the
 * first field that did not fit: decoders check `bad` once per run and
 * report MALFORMED_PAYLOAD there.  Value checks come right after the field
 * they concern, so the first fault in byte order is the one reported.
 *
 * Decoders never allocate and never copy: variable-length parts point into
 * the input.  Everything a re-encoder needs is kept (raw extension TLVs,
 * every layout entry as read, max_shards without PARALLEL_OK), so decoding
 * a valid message and encoding the result reproduces its bytes exactly.
 *
 * Descriptors and the transport fields are the business of
 * hr_descriptor.c, reached through hr_desc_codec.h.
 */
#include <assert.h>
#include <string.h>

#include "hr_desc_codec.h"

/* ------------------------------------------------------------------------ */
/* Status helpers                                                            */
/* ------------------------------------------------------------------------ */

#define MALFORMED(st, off, reason)                                             \
  HR_FAIL((st), HR_WIRE_MALFORMED_PAYLOAD, (off), (reason))

/* Returns MALFORMED_PAYLOAD at the field the cursor could not read.
 * `field` must be a string literal. */
#define NEED(c, st, field)                                                     \
  do {                                                                         \
    if ((c)->bad)                                                              \
      return MALFORMED((st), hr_cursor_off(c),                                 \
                       field ": the payload ends inside it");                  \
  } while (0)

/* Every payload is consumed exactly (§ 1). */
static int expect_end(const hr_cursor *c, hr_wire_status *st,
                      const char *reason) {
  if (hr_cursor_left(c))
    return MALFORMED(st, hr_cursor_off(c), reason);
  return 0;
}

/* The context of a NULL `ctx`: a network transport, no private types. */
static const hr_wire_ctx default_ctx = {HR_TRANSPORT_NETWORK, 0};

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                     */
/* ------------------------------------------------------------------------ */

int hr_utf8_valid(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    /* Keys and texts are mostly ASCII: skip 8 such bytes at a time. */
    if (n - i >= 8) {
      uint64_t w;
      memcpy(&w, s + i, 8);
      if (!(w & 0x8080808080808080ull)) {
        i += 8;
        continue;
      }
    }
    uint8_t b = s[i];
    if (b < 0x80) {
      i++;
      continue;
    }
    /* Lead bytes C0/C1 only start overlong forms, F5 and above only code
     * points past U+10FFFF; continuation bytes cannot lead. */
    size_t extra;
    uint8_t lo = 0x80, hi = 0xBF; /* range of the first continuation byte */
    if (b >= 0xC2 && b <= 0xDF) {
      extra = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      extra = 2;
      if (b == 0xE0)
        lo = 0xA0; /* overlong */
      else if (b == 0xED)
        hi = 0x9F; /* surrogates D800-DFFF */
    } else if (b >= 0xF0 && b <= 0xF4) {
      extra = 3;
      if (b == 0xF0)
        lo = 0x90; /* overlong */
      else if (b == 0xF4)
        hi = 0x8F; /* above U+10FFFF */
    } else {
      return 0;
    }
    if (n - i <= extra)
      return 0;
    if (s[i + 1] < lo || s[i + 1] > hi)
      return 0;
    for (size_t k = 2; k <= extra; k++)
      if ((s[i + k] & 0xC0) != 0x80)
        return 0;
    i += extra + 1;
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Header                                                                    */
/* ------------------------------------------------------------------------ */

void hr_wire_parse_header(const uint8_t in[HR_HEADER_SIZE],
                          hr_msg_header *out) {
  out->type = hr_load_u32(in);
  out->stream_id = hr_load_u32(in + 4);
  out->payload_length = hr_load_u32(in + 8);
}

void hr_wire_put_header(uint8_t out[HR_HEADER_SIZE], uint32_t type,
                        uint32_t stream_id, uint32_t payload_length) {
  uint8_t *o = hr_put_u32(out, type);
  o = hr_put_u32(o, stream_id);
  hr_put_u32(o, payload_length);
}

/* Which streams a message type may use (§ 3, § 18 "Stream ids"). */
enum { ON_ZERO = 1, ON_STREAM = 2, ON_ANY = ON_ZERO | ON_STREAM };

static const uint8_t placement[HR_MSG_LAST_DEFINED + 1] = {
    [HR_MSG_CLIENT_HELLO] = ON_ZERO,
    [HR_MSG_SERVER_HELLO] = ON_ZERO,
    [HR_MSG_TENSOR_REQUEST] = ON_STREAM,
    [HR_MSG_TENSOR_DESCRIPTOR] = ON_STREAM,
    [HR_MSG_TENSOR_DATA] = ON_STREAM,
    [HR_MSG_TENSOR_DATA_END] = ON_STREAM,
    [HR_MSG_TENSOR_PUT] = ON_STREAM,
    [HR_MSG_TENSOR_PUT_ACK] = ON_STREAM,
    [HR_MSG_ERROR] = ON_ANY,
    [HR_MSG_CANCEL] = ON_STREAM,
    [HR_MSG_GOAWAY] = ON_ZERO,
    [HR_MSG_RDMA_REGISTER] = ON_STREAM,
    [HR_MSG_RDMA_READY] = ON_STREAM,
    [HR_MSG_PING] = ON_ZERO,
    [HR_MSG_PONG] = ON_ZERO,
    [HR_MSG_BUFFER_RELEASE] = ON_STREAM,
    [HR_MSG_LIST_REQUEST] = ON_STREAM,
    [HR_MSG_LIST_RESPONSE] = ON_STREAM,
};

static int is_private_agreed(uint32_t type, const hr_wire_ctx *ctx) {
  return type >= HR_MSG_PRIVATE_FIRST && type <= HR_MSG_PRIVATE_LAST &&
         ((ctx->private_types >> (type - HR_MSG_PRIVATE_FIRST)) & 1u);
}

int hr_wire_check_header(const hr_msg_header *h, uint32_t max_payload,
                         const hr_wire_ctx *ctx, hr_wire_status *st) {
  if (!ctx)
    ctx = &default_ctx;
  if (h->payload_length > max_payload)
    return HR_FAIL(st, HR_WIRE_MESSAGE_TOO_LARGE, 8,
                   "header.payload_length: above the receiver's maximum");
  if (h->type == HR_MSG_INVALID || h->type > HR_MSG_LAST_DEFINED) {
    /* An agreed private type has no placement rule of the spec's. */
    if (is_private_agreed(h->type, ctx))
      return 0;
    return HR_FAIL(st, HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0,
                   "header.message_type: unknown or not agreed");
  }
  unsigned where = h->stream_id ? ON_STREAM : ON_ZERO;
  if (!(placement[h->type] & where))
    return HR_FAIL(st, HR_WIRE_PROTOCOL_VIOLATION, 4,
                   h->stream_id ? "header.stream_id: this type travels on "
                                  "stream 0 only"
                                : "header.stream_id: this type never "
                                  "travels on stream 0");
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Shared field decoders                                                     */
/* ------------------------------------------------------------------------ */

/* A `str` field (§ 1) with its length bounds and the reasons it can be
 * rejected for. */
typedef struct str_rule {
  uint16_t min, max;
  const char *bad_len;
  const char *truncated;
  const char *bad_utf8;
} str_rule;

#define STR_RULE(field, min_, max_, len_text)                                  \
  {                                                                            \
    .min = (min_), .max = (max_), .bad_len = field ": length " len_text,       \
    .truncated = field ": the payload ends inside it",                         \
    .bad_utf8 = field ": invalid UTF-8"                                        \
  }

static const str_rule request_key_rule =
    STR_RULE("request.tensor_key", 1, HR_MAX_KEY, "outside 1-1024");
static const str_rule put_key_rule =
    STR_RULE("put.tensor_key", 1, HR_MAX_KEY, "outside 1-1024");
static const str_rule error_text_rule =
    STR_RULE("error.message", 0, HR_MAX_TEXT, "above 1024");
static const str_rule goaway_text_rule =
    STR_RULE("goaway.message", 0, HR_MAX_TEXT, "above 1024");
static const str_rule prefix_rule =
    STR_RULE("list_request.prefix", 0, HR_MAX_KEY, "above 1024");
static const str_rule start_after_rule =
    STR_RULE("list_request.start_after", 0, HR_MAX_KEY, "above 1024");
static const str_rule entry_key_rule =
    STR_RULE("list_response.entries.key", 1, HR_MAX_KEY, "outside 1-1024");
/* The provider name has no length limit of its own: its extension's
 * length bounds it. */
static const str_rule provider_rule = STR_RULE(
    "hello.extensions.FABRIC_ADDRESS.provider", 0, UINT16_MAX, "unbounded");

static int get_str(hr_cursor *c, const str_rule *r, const uint8_t **s,
                   uint16_t *n, hr_wire_status *st) {
  uint32_t off = hr_cursor_off(c);
  uint16_t len = hr_get_u16(c);
  if (c->bad)
    return MALFORMED(st, off, r->truncated);
  if (len < r->min || len > r->max)
    return MALFORMED(st, off, r->bad_len);
  const uint8_t *p = hr_get_bytes(c, len);
  if (!p)
    return MALFORMED(st, off, r->truncated);
  if (!hr_utf8_valid(p, len))
    return MALFORMED(st, off + 2, r->bad_utf8);
  *s = p;
  *n = len;
  return 0;
}

/* A list<layout entry> of a HELLO or a request (§ 5: at most 64). */
static int get_layout_list(hr_cursor *c, uint16_t *count, hr_layout_entry *out,
                           hr_wire_status *st, const char *truncated,
                           const char *too_many) {
  uint32_t off = hr_cursor_off(c);
  uint16_t n = hr_get_u16(c);
  if (c->bad)
    return MALFORMED(st, off, truncated);
  if (n > HR_MAX_LAYOUTS)
    return MALFORMED(st, off, too_many);
  for (uint16_t i = 0; i < n; i++) {
    int rv = hr__layout_entry_decode(c, HR_LE_LIST, &out[i], st);
    if (rv)
      return rv;
  }
  *count = n;
  return 0;
}

/* A list<u8> of device tags or memory classes: reserved values are kept
 * (the reader skips them), 0xFF is MALFORMED_PAYLOAD (§ 18). */
static int get_tag_list(hr_cursor *c, uint16_t *count, const uint8_t **tags,
                        hr_wire_status *st, const char *truncated,
                        const char *invalid) {
  uint32_t off = hr_cursor_off(c);
  uint16_t n = hr_get_u16(c);
  const uint8_t *p = hr_get_bytes(c, n);
  if (c->bad)
    return MALFORMED(st, off, truncated);
  const uint8_t *ff = n ? memchr(p, 0xFF, n) : NULL;
  if (ff)
    return MALFORMED(st, off + 2 + (uint32_t)(ff - p), invalid);
  *count = n;
  *tags = p;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* CLIENT_HELLO, SERVER_HELLO (§ 6)                                          */
/* ------------------------------------------------------------------------ */

/* Which HELLO may carry each known extension: bit 0 CLIENT_HELLO, bit 1
 * SERVER_HELLO.  Indexed by extension type. */
#define BY_CLIENT 1u
#define BY_SERVER 2u
static const uint8_t ext_senders[HR_EXT_MAX_SHARDS + 1] = {
    [HR_EXT_AUTH_TOKEN] = BY_CLIENT,
    [HR_EXT_SESSION_JOIN] = BY_CLIENT,
    [HR_EXT_SESSION_TOKEN] = BY_SERVER,
    [HR_EXT_FABRIC_ADDRESS] = BY_CLIENT | BY_SERVER,
    [HR_EXT_PEER_NAME] = BY_CLIENT | BY_SERVER,
    [HR_EXT_MAX_SHARDS] = BY_SERVER,
};

/* Parses the content of a known extension sent in its own direction, the
 * first of its type.  `off` is the offset of the content's first byte. */
static int parse_known_ext(uint16_t type, const uint8_t *data, uint16_t len,
                           uint32_t off, hr_hello_exts *x, hr_wire_status *st) {
  switch (type) {
  case HR_EXT_AUTH_TOKEN:
    /* Opaque; only the server's check gives it meaning. */
    x->auth_token = data;
    x->auth_token_len = len;
    return 0;
  case HR_EXT_SESSION_JOIN:
    /* The content is a SESSION_TOKEN, so the same minimum applies: a
     * shorter one cannot name any session. */
    if (len < HR_SESSION_TOKEN_MIN)
      return MALFORMED(st, off,
                       "hello.extensions.SESSION_JOIN: token "
                       "shorter than 16 bytes");
    x->session_join = data;
    x->session_join_len = len;
    return 0;
  case HR_EXT_SESSION_TOKEN:
    if (len < HR_SESSION_TOKEN_MIN)
      return MALFORMED(st, off,
                       "hello.extensions.SESSION_TOKEN: shorter than 16 bytes");
    x->session_token = data;
    x->session_token_len = len;
    return 0;
  case HR_EXT_FABRIC_ADDRESS: {
    hr_cursor c;
    hr_cursor_init(&c, data, len, off);
    int rv = get_str(&c, &provider_rule, &x->fabric_provider,
                     &x->fabric_provider_len, st);
    if (rv)
      return rv;
    uint32_t ep_off = hr_cursor_off(&c);
    uint16_t ep_len = hr_get_u16(&c);
    const uint8_t *ep = hr_get_bytes(&c, ep_len);
    if (c.bad)
      return MALFORMED(st, ep_off,
                       "hello.extensions.FABRIC_ADDRESS."
                       "endpoint_name: runs past the extension");
    rv = expect_end(&c, st,
                    "hello.extensions.FABRIC_ADDRESS: bytes left "
                    "over after endpoint_name");
    if (rv)
      return rv;
    x->fabric_endpoint = ep;
    x->fabric_endpoint_len = ep_len;
    x->has_fabric_address = 1;
    return 0;
  }
  case HR_EXT_PEER_NAME:
    if (!hr_utf8_valid(data, len))
      return MALFORMED(st, off, "hello.extensions.PEER_NAME: invalid UTF-8");
    x->peer_name = data;
    x->peer_name_len = len;
    return 0;
  default:
    /* The caller passes known types only: this is MAX_SHARDS. */
    assert(type == HR_EXT_MAX_SHARDS);
    if (len != 2)
      return MALFORMED(st, off, "hello.extensions.MAX_SHARDS: not one u16");
    x->max_shards = (uint16_t)(data[0] | (data[1] << 8));
    if (x->max_shards == 0)
      return MALFORMED(st, off, "hello.extensions.MAX_SHARDS: zero");
    return 0;
  }
}

static int get_hello_exts(hr_cursor *c, uint32_t msg_type, hr_hello *h,
                          hr_wire_status *st) {
  unsigned me = msg_type == HR_MSG_CLIENT_HELLO ? BY_CLIENT : BY_SERVER;
  unsigned seen = 0; /* bit per known extension type already parsed */
  uint32_t off = hr_cursor_off(c);
  uint16_t n = hr_get_u16(c);
  if (c->bad)
    return MALFORMED(st, off,
                     "hello.extensions: the payload ends inside the count");
  size_t start = c->pos;
  memset(&h->exts, 0, sizeof h->exts);
  for (uint16_t i = 0; i < n; i++) {
    off = hr_cursor_off(c);
    uint16_t type = hr_get_u16(c);
    uint16_t len = hr_get_u16(c);
    const uint8_t *data = hr_get_bytes(c, len);
    if (c->bad)
      return MALFORMED(st, off,
                       "hello.extensions: an extension runs past the payload");
    /* Unknown types, misdirected ones and repeats are ignored unread
     * (§ 6, § 18 "Lists"). */
    if (type > HR_EXT_MAX_SHARDS || !(ext_senders[type] & me) ||
        (seen & (1u << type)))
      continue;
    seen |= 1u << type;
    int rv = parse_known_ext(type, data, len, off + 4, &h->exts, st);
    if (rv)
      return rv;
  }
  h->ext_count = n;
  h->ext_raw = c->p + start;
  h->ext_raw_len = c->pos - start;
  return 0;
}

static int decode_hello(hr_cursor *c, uint32_t msg_type, hr_hello *h,
                        hr_wire_status *st) {
  /* Magic and version come first: a peer of another protocol or major
   * version is told UNSUPPORTED_VERSION, whatever the rest looks like. */
  h->magic = hr_get_u32(c);
  NEED(c, st, "hello.magic");
  if (h->magic != HR_MAGIC)
    return HR_FAIL(st, HR_WIRE_UNSUPPORTED_VERSION, HR_HEADER_SIZE,
                   "hello.magic: not \"HRRY\"");
  h->version_major = hr_get_u16(c);
  NEED(c, st, "hello.version_major");
  if (h->version_major != HR_VERSION_MAJOR_WIRE)
    return HR_FAIL(st, HR_WIRE_UNSUPPORTED_VERSION, HR_HEADER_SIZE + 4,
                   "hello.version_major: not 1");
  h->version_minor = hr_get_u16(c);
  h->capability_flags = hr_get_u32(c); /* unassigned bits are ignored */
  h->max_message_size = hr_get_u32(c);
  NEED(c, st, "hello: fixed fields");
  if (h->max_message_size < HR_MIN_MAX_MESSAGE_SIZE)
    return MALFORMED(st, HR_HEADER_SIZE + 12,
                     "hello.max_message_size: below 65536");
  int rv = get_layout_list(c, &h->layout_count, h->layouts, st,
                           "hello.supported_layouts: the payload ends "
                           "inside the count",
                           "hello.supported_layouts: more than 64 entries");
  if (rv)
    return rv;
  rv = get_tag_list(c, &h->device_count, &h->devices, st,
                    "hello.supported_devices: runs past the payload",
                    "hello.supported_devices: device tag 0xFF");
  if (rv)
    return rv;
  rv = get_tag_list(c, &h->memory_class_count, &h->memory_classes, st,
                    "hello.supported_memory_classes: runs past the payload",
                    "hello.supported_memory_classes: memory class 0xFF");
  if (rv)
    return rv;
  rv = get_hello_exts(c, msg_type, h, st);
  if (rv)
    return rv;
  return expect_end(c, st, "hello: bytes left over after the extensions");
}

/* ------------------------------------------------------------------------ */
/* TENSOR_REQUEST (§ 8)                                                      */
/* ------------------------------------------------------------------------ */

#define REQ_FLAGS_KNOWN                                                        \
  (HR_REQ_ALLOW_TRANSCODE | HR_REQ_PARALLEL_OK | HR_REQ_REGION)

static int decode_request(hr_cursor *c, hr_request *r, hr_wire_status *st) {
  int rv = get_str(c, &request_key_rule, &r->key, &r->key_len, st);
  if (rv)
    return rv;
  uint32_t off = hr_cursor_off(c);
  r->flags = hr_get_u32(c);
  NEED(c, st, "request.request_flags");
  if (r->flags & ~(uint32_t)REQ_FLAGS_KNOWN)
    return MALFORMED(st, off, "request.request_flags: reserved bit set");
  rv = get_layout_list(c, &r->layout_count, r->layouts, st,
                       "request.preferred_layouts: the payload ends inside "
                       "the count",
                       "request.preferred_layouts: more than 64 entries");
  if (rv)
    return rv;
  off = hr_cursor_off(c);
  r->preferred_device = hr_get_u8(c);
  NEED(c, st, "request.preferred_device");
  if (r->preferred_device == HR_DEV_INVALID)
    return MALFORMED(st, off, "request.preferred_device: 0xFF");
  r->min_alignment_log2 = hr_get_u8(c);
  NEED(c, st, "request.min_alignment_log2");
  if (r->min_alignment_log2 > HR_MAX_ALIGNMENT_LOG2)
    return MALFORMED(st, off + 1, "request.min_alignment_log2: above 21");
  /* max_shards is kept as sent even without PARALLEL_OK (it is only read
   * with it) so that the message re-encodes to the same bytes. */
  r->max_shards = hr_get_u16(c);
  NEED(c, st, "request.max_shards");
  if ((r->flags & HR_REQ_PARALLEL_OK) && r->max_shards == 0)
    return MALFORMED(st, off + 2, "request.max_shards: 0 with PARALLEL_OK");
  r->region_rank = 0;
  if (r->flags & HR_REQ_REGION) {
    off = hr_cursor_off(c);
    uint8_t n = hr_get_u8(c);
    NEED(c, st, "request.region_rank");
    if (n > HR_MAX_RANK)
      return HR_FAIL(st, HR_WIRE_INVALID_REGION, off,
                     "request.region_rank: above 32");
    for (unsigned i = 0; i < n; i++)
      r->region_offset[i] = hr_get_u64(c);
    NEED(c, st, "request.region_offset");
    uint32_t shape_off = hr_cursor_off(c);
    for (unsigned i = 0; i < n; i++)
      r->region_shape[i] = hr_get_u64(c);
    NEED(c, st, "request.region_shape");
    /* A region whose end overflows u64 lies outside every tensor, and
     * that is visible without the tensor (§ 18 "Which error code"). */
    for (unsigned i = 0; i < n; i++) {
      uint64_t end;
      if (!hr__add_u64(r->region_offset[i], r->region_shape[i], &end))
        return HR_FAIL(st, HR_WIRE_INVALID_REGION, shape_off + 8 * i,
                       "request.region_shape: offset + shape overflows u64");
    }
    r->region_rank = n;
  }
  return expect_end(c, st, "request: bytes left over after the last field");
}

/* ------------------------------------------------------------------------ */
/* TENSOR_DESCRIPTOR (§ 10), TENSOR_PUT (§ 11)                               */
/* ------------------------------------------------------------------------ */

/* The descriptor and transport fields that end both messages, read and
 * then validated together (validation needs both).  They precede anything
 * left over in the payload, so their faults are reported first, like any
 * other field's. */
static int get_desc_xport(hr_cursor *c, const hr_wire_ctx *ctx,
                          hr_descriptor *d, hr_transport_fields *x,
                          hr_wire_status *st) {
  uint32_t base = hr_cursor_off(c);
  int rv = hr__desc_decode(c, d, st);
  if (rv)
    return rv;
  rv = hr__xport_decode(c, x, st);
  if (rv)
    return rv;
  return hr_descriptor_validate(d, x, ctx, base, st);
}

static int decode_tensor(hr_cursor *c, const hr_wire_ctx *ctx,
                         hr_tensor_descriptor_msg *t, hr_wire_status *st) {
  int rv = get_desc_xport(c, ctx, &t->desc, &t->xport, st);
  if (rv)
    return rv;
  return expect_end(c, st,
                    "descriptor message: bytes left over after the "
                    "transport fields");
}

static int decode_put(hr_cursor *c, const hr_wire_ctx *ctx, hr_put *p,
                      hr_wire_status *st) {
  int rv = get_str(c, &put_key_rule, &p->key, &p->key_len, st);
  if (rv)
    return rv;
  uint32_t off = hr_cursor_off(c);
  p->flags = hr_get_u32(c);
  NEED(c, st, "put.put_flags");
  if (p->flags & ~(uint32_t)HR_PUT_REPLACE)
    return MALFORMED(st, off, "put.put_flags: reserved bit set");
  uint32_t desc_off = hr_cursor_off(c);
  rv = get_desc_xport(c, ctx, &p->desc, &p->xport, st);
  if (rv)
    return rv;
  /* § 18 "PUT": shards are never stored.  Checked after validation so
   * that a broken descriptor is reported as such. */
  if (p->desc.flags & HR_DESC_HAS_SHARD)
    return HR_FAIL(st, HR_WIRE_PUT_REJECTED, desc_off + 3,
                   "put.descriptor.flags: a PUT of a shard (HAS_SHARD)");
  return expect_end(c, st, "put: bytes left over after the transport fields");
}

/* ------------------------------------------------------------------------ */
/* TENSOR_DATA (§ 10)                                                        */
/* ------------------------------------------------------------------------ */

int hr_wire_decode_data_subheader(const uint8_t sub[12],
                                  uint32_t payload_length, hr_data *out,
                                  hr_wire_status *st) {
  /* Only the bytes the payload holds are read: a short payload's
   * sub-header is not all there. */
  if (payload_length < 4)
    return MALFORMED(st, HR_HEADER_SIZE + (payload_length ? 1u : 0u),
                     payload_length
                         ? "data.reserved: the payload ends inside it"
                         : "data.buffer_index: the payload ends inside it");
  for (unsigned i = 1; i < 4; i++)
    if (sub[i])
      return MALFORMED(st, HR_HEADER_SIZE + i, "data.reserved: not zero");
  if (payload_length < HR_DATA_SUBHEADER_SIZE)
    return MALFORMED(st, HR_HEADER_SIZE + 4,
                     "data.byte_offset_in_buffer: the payload ends inside it");
  if (payload_length == HR_DATA_SUBHEADER_SIZE)
    return MALFORMED(st, HR_HEADER_SIZE + HR_DATA_SUBHEADER_SIZE,
                     "data.data: empty (at least 1 byte)");
  out->buffer_index = sub[0];
  out->offset = hr_load_u64(sub + 4);
  out->data = NULL;
  out->data_len = payload_length - HR_DATA_SUBHEADER_SIZE;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* ERROR, GOAWAY (§ 12); RDMA_REGISTER (§ 13); PING, PONG                    */
/* ------------------------------------------------------------------------ */

static int decode_error(hr_cursor *c, hr_error_msg *e, hr_wire_status *st) {
  e->code = hr_get_u32(c);
  NEED(c, st, "error.error_code");
  if (e->code == HR_WIRE_NO_ERROR)
    return MALFORMED(st, HR_HEADER_SIZE,
                     "error.error_code: NO_ERROR (GOAWAY only)");
  int rv = get_str(c, &error_text_rule, &e->message, &e->message_len, st);
  if (rv)
    return rv;
  return expect_end(c, st, "error: bytes left over after the message");
}

static int decode_goaway(hr_cursor *c, hr_goaway *g, hr_wire_status *st) {
  g->last_stream_id = hr_get_u32(c);
  g->code = hr_get_u32(c); /* any code, NO_ERROR included */
  NEED(c, st, "goaway: fixed fields");
  int rv = get_str(c, &goaway_text_rule, &g->message, &g->message_len, st);
  if (rv)
    return rv;
  return expect_end(c, st, "goaway: bytes left over after the message");
}

static int decode_rdma(hr_cursor *c, hr_rdma_register *r, hr_wire_status *st) {
  r->role = hr_get_u8(c);
  NEED(c, st, "rdma_register.role");
  if (r->role > HR_RDMA_DESTINATION)
    return MALFORMED(st, HR_HEADER_SIZE, "rdma_register.role: not 0 or 1");
  const uint8_t *rsv = hr_get_bytes(c, 3);
  NEED(c, st, "rdma_register.reserved");
  for (unsigned i = 0; i < 3; i++)
    if (rsv[i])
      return MALFORMED(st, HR_HEADER_SIZE + 1 + i,
                       "rdma_register.reserved: not zero");
  r->length = hr_get_u64(c);
  r->address = hr_get_u64(c);
  r->key = hr_get_u64(c);
  NEED(c, st, "rdma_register: fixed fields");
  uint32_t off = hr_cursor_off(c);
  r->raw_key_len = hr_get_u16(c);
  r->raw_key = hr_get_bytes(c, r->raw_key_len);
  if (c->bad)
    return MALFORMED(st, off, "rdma_register.raw_key: runs past the payload");
  return expect_end(c, st, "rdma_register: bytes left over after raw_key");
}

static int decode_ping(hr_cursor *c, uint64_t *v, hr_wire_status *st) {
  *v = hr_get_u64(c);
  NEED(c, st, "ping.opaque");
  return expect_end(c, st, "ping: more than 8 bytes");
}

/* ------------------------------------------------------------------------ */
/* LIST_REQUEST, LIST_RESPONSE (§ 15)                                        */
/* ------------------------------------------------------------------------ */

static int decode_list_request(hr_cursor *c, hr_list_request *l,
                               hr_wire_status *st) {
  int rv = get_str(c, &prefix_rule, &l->prefix, &l->prefix_len, st);
  if (rv)
    return rv;
  rv = get_str(c, &start_after_rule, &l->start_after, &l->start_after_len, st);
  if (rv)
    return rv;
  uint32_t off = hr_cursor_off(c);
  l->max_entries = hr_get_u16(c);
  NEED(c, st, "list_request.max_entries");
  if (l->max_entries == 0 || l->max_entries > HR_MAX_LIST_ENTRIES)
    return MALFORMED(st, off, "list_request.max_entries: outside 1-1024");
  return expect_end(c, st, "list_request: bytes left over after max_entries");
}

/* The layouts a stored tensor can have: those a v1 descriptor may carry
 * (§ 5; 0xF1/0xF2 are preferences only). */
static int is_descriptor_layout(uint8_t tag) {
  return (tag >= HR_LAYOUT_ROW_MAJOR && tag <= HR_LAYOUT_SPARSE_BSR) ||
         tag == HR_LAYOUT_COMPOSITE || tag == HR_LAYOUT_PANEL ||
         (tag > HR_LAYOUT_PERMUTED_EXACT && tag <= HR_LAYOUT_EXT_LAST);
}

/* Returns <0, 0 or >0 as byte strings a and b compare (a proper prefix
 * sorts first). */
static int key_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
  int r = memcmp(a, b, an < bn ? an : bn);
  if (r)
    return r;
  return an < bn ? -1 : an > bn;
}

static int decode_list_response(hr_cursor *c, hr_list_response *l,
                                hr_wire_status *st) {
  l->more = hr_get_u8(c);
  NEED(c, st, "list_response.more");
  if (l->more > 1)
    return MALFORMED(st, HR_HEADER_SIZE, "list_response.more: not 0 or 1");
  uint32_t off = hr_cursor_off(c);
  uint16_t n = hr_get_u16(c);
  NEED(c, st, "list_response.entries: count");
  if (n > HR_MAX_LIST_ENTRIES)
    return MALFORMED(st, off, "list_response.entries: more than 1024");
  size_t start = c->pos;
  const uint8_t *prev = NULL;
  uint16_t prev_len = 0;
  for (uint16_t i = 0; i < n; i++) {
    const uint8_t *key;
    uint16_t key_len;
    uint32_t key_off = hr_cursor_off(c);
    int rv = get_str(c, &entry_key_rule, &key, &key_len, st);
    if (rv)
      return rv;
    if (prev && key_cmp(prev, prev_len, key, key_len) >= 0)
      return MALFORMED(st, key_off,
                       "list_response.entries.key: not strictly ascending");
    prev = key;
    prev_len = key_len;
    off = hr_cursor_off(c);
    uint8_t elem = hr_get_u8(c);
    uint8_t tag = hr_get_u8(c);
    uint8_t rank = hr_get_u8(c);
    NEED(c, st, "list_response.entries: fixed fields");
    if (elem > HR_ELEM_LAST)
      return MALFORMED(st, off,
                       "list_response.entries.element_type: not "
                       "a v1 element type");
    if (!is_descriptor_layout(tag))
      return MALFORMED(st, off + 1,
                       "list_response.entries.layout_tag: not "
                       "a layout a tensor can have");
    if (rank > HR_MAX_RANK)
      return MALFORMED(st, off + 2, "list_response.entries.rank: above 32");
    hr_get_bytes(c, 8u * rank + 8u); /* shape, total_data_bytes */
    NEED(c, st, "list_response.entries: shape and total_data_bytes");
  }
  l->entry_count = n;
  l->entries_raw = c->p + start;
  l->entries_raw_len = c->pos - start;
  return expect_end(c, st, "list_response: bytes left over after the entries");
}

/* ------------------------------------------------------------------------ */
/* Whole messages                                                            */
/* ------------------------------------------------------------------------ */

int hr_wire_decode_payload(const hr_msg_header *hdr, const uint8_t *payload,
                           const hr_wire_ctx *ctx, hr_msg *out,
                           hr_wire_status *st) {
  if (!ctx)
    ctx = &default_ctx;
  if (&out->hdr != hdr)
    out->hdr = *hdr;
  uint32_t n = hdr->payload_length;
  hr_cursor c;
  hr_cursor_init(&c, payload, n, HR_HEADER_SIZE);
  switch (hdr->type) {
  case HR_MSG_CLIENT_HELLO:
  case HR_MSG_SERVER_HELLO:
    return decode_hello(&c, hdr->type, &out->u.hello, st);
  case HR_MSG_TENSOR_REQUEST: return decode_request(&c, &out->u.request, st);
  case HR_MSG_TENSOR_DESCRIPTOR:
    return decode_tensor(&c, ctx, &out->u.tensor, st);
  case HR_MSG_TENSOR_DATA: {
    int rv = hr_wire_decode_data_subheader(payload, n, &out->u.data, st);
    if (rv)
      return rv;
    out->u.data.data = payload + HR_DATA_SUBHEADER_SIZE;
    return 0;
  }
  case HR_MSG_TENSOR_PUT: return decode_put(&c, ctx, &out->u.put, st);
  case HR_MSG_ERROR: return decode_error(&c, &out->u.error, st);
  case HR_MSG_GOAWAY: return decode_goaway(&c, &out->u.goaway, st);
  case HR_MSG_RDMA_REGISTER: return decode_rdma(&c, &out->u.rdma, st);
  case HR_MSG_PING:
  case HR_MSG_PONG: return decode_ping(&c, &out->u.ping, st);
  case HR_MSG_LIST_REQUEST:
    return decode_list_request(&c, &out->u.list_request, st);
  case HR_MSG_LIST_RESPONSE:
    return decode_list_response(&c, &out->u.list_response, st);
  case HR_MSG_TENSOR_DATA_END:
  case HR_MSG_TENSOR_PUT_ACK:
  case HR_MSG_CANCEL:
  case HR_MSG_RDMA_READY:
  case HR_MSG_BUFFER_RELEASE:
    if (n)
      return MALFORMED(st, HR_HEADER_SIZE,
                       "payload: this message type has an empty payload");
    return 0;
  default:
    /* An agreed private type's payload is the caller's business. */
    if (is_private_agreed(hdr->type, ctx))
      return 0;
    return HR_FAIL(st, HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0,
                   "header.message_type: unknown or not agreed");
  }
}

int hr_wire_decode(const uint8_t *in, size_t len, const hr_wire_ctx *ctx,
                   hr_msg *out, hr_wire_status *st) {
  if (len < HR_HEADER_SIZE)
    return MALFORMED(st, (uint32_t)len, "header: fewer than 12 bytes");
  hr_wire_parse_header(in, &out->hdr);
  int rv = hr_wire_check_header(&out->hdr, UINT32_MAX, ctx, st);
  if (rv)
    return rv;
  if ((uint64_t)len != (uint64_t)HR_HEADER_SIZE + out->hdr.payload_length)
    return MALFORMED(st, 8,
                     "header.payload_length: disagrees with the "
                     "message's size");
  return hr_wire_decode_payload(&out->hdr, in + HR_HEADER_SIZE, ctx, out, st);
}

/* ------------------------------------------------------------------------ */
/* Iterators and builders of raw lists                                       */
/* ------------------------------------------------------------------------ */

int hr_ext_next(const uint8_t *raw, size_t raw_len, size_t *pos, hr_ext *out) {
  size_t p = *pos;
  /* Bounds are checked anyway, so a list that was never validated cannot
   * make the iterator read past its end. */
  if (p > raw_len || raw_len - p < 4)
    return 0;
  uint16_t len = (uint16_t)(raw[p + 2] | (raw[p + 3] << 8));
  if (raw_len - p - 4 < len)
    return 0;
  out->type = (uint16_t)(raw[p] | (raw[p + 1] << 8));
  out->length = len;
  out->data = raw + p + 4;
  *pos = p + 4 + len;
  return 1;
}

int hr_ext_put(uint8_t *out, size_t cap, uint16_t type, const void *data,
               uint16_t len) {
  if (cap < 4u + len)
    return HR_ERR_BUFFER_TOO_SMALL;
  if (len && !data)
    return HR_ERR_INVALID_ARGUMENT;
  uint8_t *o = hr_put_u16(out, type);
  o = hr_put_u16(o, len);
  hr_put_bytes(o, data, len);
  return 4 + len;
}

/* Size of the raw list entry at raw[pos..raw_len), or 0 when it does not
 * fit (or breaks a cap the encoder enforces). */
static size_t list_entry_span(const uint8_t *raw, size_t raw_len, size_t pos) {
  if (pos > raw_len || raw_len - pos < 2)
    return 0;
  size_t key_len = (size_t)(raw[pos] | (raw[pos + 1] << 8));
  size_t fixed = 2 + key_len + 3;
  if (key_len == 0 || key_len > HR_MAX_KEY || raw_len - pos < fixed)
    return 0;
  size_t rank = raw[pos + fixed - 1];
  size_t span = fixed + 8 * rank + 8;
  if (rank > HR_MAX_RANK || raw_len - pos < span)
    return 0;
  return span;
}

int hr_list_entry_next(const uint8_t *raw, size_t raw_len, size_t *pos,
                       hr_list_entry *out) {
  size_t span = list_entry_span(raw, raw_len, *pos);
  if (!span)
    return 0;
  const uint8_t *p = raw + *pos;
  out->key_len = (uint16_t)(p[0] | (p[1] << 8));
  out->key = p + 2;
  p += 2 + out->key_len;
  out->element_type = p[0];
  out->layout_tag = p[1];
  out->rank = p[2];
  p += 3;
  for (unsigned i = 0; i < out->rank; i++, p += 8)
    out->shape[i] = hr_load_u64(p);
  out->total_data_bytes = hr_load_u64(p);
  *pos += span;
  return 1;
}

int hr_list_entry_put(uint8_t *out, size_t cap, const hr_list_entry *e) {
  if (e->key_len == 0 || e->key_len > HR_MAX_KEY || !e->key ||
      e->rank > HR_MAX_RANK)
    return HR_ERR_INVALID_ARGUMENT;
  size_t n = 2u + e->key_len + 3u + 8u * e->rank + 8u;
  if (cap < n)
    return HR_ERR_BUFFER_TOO_SMALL;
  uint8_t *o = hr_put_u16(out, e->key_len);
  o = hr_put_bytes(o, e->key, e->key_len);
  o = hr_put_u8(o, e->element_type);
  o = hr_put_u8(o, e->layout_tag);
  o = hr_put_u8(o, e->rank);
  for (unsigned i = 0; i < e->rank; i++)
    o = hr_put_u64(o, e->shape[i]);
  hr_put_u64(o, e->total_data_bytes);
  return (int)n;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                  */
/* ------------------------------------------------------------------------ */

/* Payload size of a layout list, or -1 when it cannot be encoded. */
static int64_t layout_list_size(uint16_t n, const hr_layout_entry *e) {
  if (n > HR_MAX_LAYOUTS)
    return -1;
  int64_t size = 2;
  for (uint16_t i = 0; i < n; i++) {
    if (e[i].tag >= HR_LAYOUT_EXT_FIRST && e[i].tag <= HR_LAYOUT_EXT_LAST &&
        e[i].ext_len && !e[i].ext)
      return -1;
    size += (int64_t)hr__layout_entry_size(&e[i]);
  }
  return size;
}

static uint8_t *put_layout_list(uint8_t *o, uint16_t n,
                                const hr_layout_entry *e) {
  o = hr_put_u16(o, n);
  for (uint16_t i = 0; i < n; i++)
    o = hr__layout_entry_encode(o, &e[i]);
  return o;
}

/* Checks that a raw extension list holds exactly `count` whole TLVs, so
 * the count written before it agrees with it. */
static int ext_raw_consistent(const uint8_t *raw, size_t len, uint16_t count) {
  if (len && !raw)
    return 0;
  size_t pos = 0;
  hr_ext x;
  for (uint16_t i = 0; i < count; i++)
    if (!hr_ext_next(raw, len, &pos, &x))
      return 0;
  return pos == len;
}

static int entries_raw_consistent(const uint8_t *raw, size_t len,
                                  uint16_t count) {
  if (len && !raw)
    return 0;
  size_t pos = 0;
  for (uint16_t i = 0; i < count; i++) {
    size_t span = list_entry_span(raw, len, pos);
    if (!span)
      return 0;
    pos += span;
  }
  return pos == len;
}

/* A str field of [min, max] bytes: its encoded size, or -1. */
static int64_t str_size(const uint8_t *s, uint16_t n, uint16_t min,
                        uint16_t max) {
  if (n < min || n > max || (n && !s))
    return -1;
  return 2 + (int64_t)n;
}

static uint8_t *put_str(uint8_t *o, const uint8_t *s, uint16_t n) {
  o = hr_put_u16(o, n);
  return hr_put_bytes(o, s, n);
}

/* Adds b to *a unless either is negative (an encoding error). */
static void add_size(int64_t *a, int64_t b) {
  *a = (*a < 0 || b < 0) ? -1 : *a + b;
}

/* Exact payload size of `m`, or -1 when `m` cannot be encoded. */
static int64_t payload_size(const hr_msg *m) {
  int64_t n;
  switch (m->hdr.type) {
  case HR_MSG_CLIENT_HELLO:
  case HR_MSG_SERVER_HELLO: {
    const hr_hello *h = &m->u.hello;
    if ((h->device_count && !h->devices) ||
        (h->memory_class_count && !h->memory_classes) ||
        !ext_raw_consistent(h->ext_raw, h->ext_raw_len, h->ext_count))
      return -1;
    n = 16 + 2 + (int64_t)h->device_count + 2 + h->memory_class_count + 2 +
        (int64_t)h->ext_raw_len;
    add_size(&n, layout_list_size(h->layout_count, h->layouts));
    return n;
  }
  case HR_MSG_TENSOR_REQUEST: {
    const hr_request *r = &m->u.request;
    n = str_size(r->key, r->key_len, 1, HR_MAX_KEY);
    add_size(&n, 4 + 1 + 1 + 2);
    add_size(&n, layout_list_size(r->layout_count, r->layouts));
    if (r->flags & HR_REQ_REGION)
      add_size(&n, r->region_rank > HR_MAX_RANK ? -1 : 1 + 16 * r->region_rank);
    return n;
  }
  case HR_MSG_TENSOR_DESCRIPTOR:
    n = hr__desc_encoded_size(&m->u.tensor.desc);
    add_size(&n, HR_XPORT_SIZE);
    return n;
  case HR_MSG_TENSOR_DATA:
    if (m->u.data.data_len == 0 || !m->u.data.data)
      return -1;
    return HR_DATA_SUBHEADER_SIZE + (int64_t)m->u.data.data_len;
  case HR_MSG_TENSOR_PUT:
    n = str_size(m->u.put.key, m->u.put.key_len, 1, HR_MAX_KEY);
    add_size(&n, 4);
    add_size(&n, hr__desc_encoded_size(&m->u.put.desc));
    add_size(&n, HR_XPORT_SIZE);
    return n;
  case HR_MSG_ERROR:
    n = str_size(m->u.error.message, m->u.error.message_len, 0, HR_MAX_TEXT);
    add_size(&n, 4);
    return n;
  case HR_MSG_GOAWAY:
    n = str_size(m->u.goaway.message, m->u.goaway.message_len, 0, HR_MAX_TEXT);
    add_size(&n, 8);
    return n;
  case HR_MSG_RDMA_REGISTER:
    if (m->u.rdma.raw_key_len && !m->u.rdma.raw_key)
      return -1;
    return 1 + 3 + 24 + 2 + (int64_t)m->u.rdma.raw_key_len;
  case HR_MSG_PING:
  case HR_MSG_PONG: return 8;
  case HR_MSG_LIST_REQUEST: {
    const hr_list_request *l = &m->u.list_request;
    n = str_size(l->prefix, l->prefix_len, 0, HR_MAX_KEY);
    add_size(&n, str_size(l->start_after, l->start_after_len, 0, HR_MAX_KEY));
    add_size(&n, 2);
    return n;
  }
  case HR_MSG_LIST_RESPONSE: {
    const hr_list_response *l = &m->u.list_response;
    if (l->entry_count > HR_MAX_LIST_ENTRIES ||
        !entries_raw_consistent(l->entries_raw, l->entries_raw_len,
                                l->entry_count))
      return -1;
    return 1 + 2 + (int64_t)l->entries_raw_len;
  }
  case HR_MSG_TENSOR_DATA_END:
  case HR_MSG_TENSOR_PUT_ACK:
  case HR_MSG_CANCEL:
  case HR_MSG_RDMA_READY:
  case HR_MSG_BUFFER_RELEASE: return 0;
  default:
    /* Private types carry payloads this codec does not know: their
     * senders write the header with hr_wire_put_header(). */
    return -1;
  }
}

int64_t hr_wire_encoded_size(const hr_msg *m) {
  if (!m)
    return HR_ERR_INVALID_ARGUMENT;
  int64_t n = payload_size(m);
  if (n < 0 || n > (int64_t)UINT32_MAX)
    return HR_ERR_INVALID_ARGUMENT;
  return HR_HEADER_SIZE + n;
}

static uint8_t *put_hello(uint8_t *o, const hr_hello *h) {
  o = hr_put_u32(o, h->magic);
  o = hr_put_u16(o, h->version_major);
  o = hr_put_u16(o, h->version_minor);
  o = hr_put_u32(o, h->capability_flags);
  o = hr_put_u32(o, h->max_message_size);
  o = put_layout_list(o, h->layout_count, h->layouts);
  o = hr_put_u16(o, h->device_count);
  o = hr_put_bytes(o, h->devices, h->device_count);
  o = hr_put_u16(o, h->memory_class_count);
  o = hr_put_bytes(o, h->memory_classes, h->memory_class_count);
  o = hr_put_u16(o, h->ext_count);
  return hr_put_bytes(o, h->ext_raw, h->ext_raw_len);
}

static uint8_t *put_request(uint8_t *o, const hr_request *r) {
  o = put_str(o, r->key, r->key_len);
  o = hr_put_u32(o, r->flags);
  o = put_layout_list(o, r->layout_count, r->layouts);
  o = hr_put_u8(o, r->preferred_device);
  o = hr_put_u8(o, r->min_alignment_log2);
  o = hr_put_u16(o, r->max_shards);
  if (r->flags & HR_REQ_REGION) {
    o = hr_put_u8(o, r->region_rank);
    for (unsigned i = 0; i < r->region_rank; i++)
      o = hr_put_u64(o, r->region_offset[i]);
    for (unsigned i = 0; i < r->region_rank; i++)
      o = hr_put_u64(o, r->region_shape[i]);
  }
  return o;
}

static uint8_t *put_rdma(uint8_t *o, const hr_rdma_register *r) {
  o = hr_put_u8(o, r->role);
  o = hr_put_u8(o, 0);
  o = hr_put_u16(o, 0);
  o = hr_put_u64(o, r->length);
  o = hr_put_u64(o, r->address);
  o = hr_put_u64(o, r->key);
  o = hr_put_u16(o, r->raw_key_len);
  return hr_put_bytes(o, r->raw_key, r->raw_key_len);
}

int64_t hr_wire_encode(const hr_msg *m, uint8_t *out, size_t cap) {
  int64_t size = hr_wire_encoded_size(m);
  if (size < 0)
    return size;
  if (!out || cap < (uint64_t)size)
    return HR_ERR_BUFFER_TOO_SMALL;
  hr_wire_put_header(out, m->hdr.type, m->hdr.stream_id,
                     (uint32_t)(size - HR_HEADER_SIZE));
  uint8_t *o = out + HR_HEADER_SIZE;
  switch (m->hdr.type) {
  case HR_MSG_CLIENT_HELLO:
  case HR_MSG_SERVER_HELLO: o = put_hello(o, &m->u.hello); break;
  case HR_MSG_TENSOR_REQUEST: o = put_request(o, &m->u.request); break;
  case HR_MSG_TENSOR_DESCRIPTOR:
    o = hr__desc_encode(o, &m->u.tensor.desc);
    o = hr__xport_encode(o, &m->u.tensor.xport);
    break;
  case HR_MSG_TENSOR_DATA:
    o = hr_put_u8(o, m->u.data.buffer_index);
    o = hr_put_u8(o, 0);
    o = hr_put_u16(o, 0);
    o = hr_put_u64(o, m->u.data.offset);
    o = hr_put_bytes(o, m->u.data.data, m->u.data.data_len);
    break;
  case HR_MSG_TENSOR_PUT:
    o = put_str(o, m->u.put.key, m->u.put.key_len);
    o = hr_put_u32(o, m->u.put.flags);
    o = hr__desc_encode(o, &m->u.put.desc);
    o = hr__xport_encode(o, &m->u.put.xport);
    break;
  case HR_MSG_ERROR:
    o = hr_put_u32(o, m->u.error.code);
    o = put_str(o, m->u.error.message, m->u.error.message_len);
    break;
  case HR_MSG_GOAWAY:
    o = hr_put_u32(o, m->u.goaway.last_stream_id);
    o = hr_put_u32(o, m->u.goaway.code);
    o = put_str(o, m->u.goaway.message, m->u.goaway.message_len);
    break;
  case HR_MSG_RDMA_REGISTER: o = put_rdma(o, &m->u.rdma); break;
  case HR_MSG_PING:
  case HR_MSG_PONG: o = hr_put_u64(o, m->u.ping); break;
  case HR_MSG_LIST_REQUEST:
    o = put_str(o, m->u.list_request.prefix, m->u.list_request.prefix_len);
    o = put_str(o, m->u.list_request.start_after,
                m->u.list_request.start_after_len);
    o = hr_put_u16(o, m->u.list_request.max_entries);
    break;
  case HR_MSG_LIST_RESPONSE:
    o = hr_put_u8(o, m->u.list_response.more);
    o = hr_put_u16(o, m->u.list_response.entry_count);
    o = hr_put_bytes(o, m->u.list_response.entries_raw,
                     m->u.list_response.entries_raw_len);
    break;
  default:
    /* Empty payloads: the header is the whole message. */
    break;
  }
  assert(o - out == size);
  (void)o;
  return size;
}

int hr_wire_encode_data_prefix(uint8_t out[24], uint32_t stream_id,
                               uint8_t buffer_index, uint64_t offset,
                               uint32_t data_len) {
  /* A frame carries at least one byte, and its payload must fit a u32. */
  if (data_len == 0 || data_len > UINT32_MAX - HR_DATA_SUBHEADER_SIZE)
    return HR_ERR_INVALID_ARGUMENT;
  hr_wire_put_header(out, HR_MSG_TENSOR_DATA, stream_id,
                     data_len + HR_DATA_SUBHEADER_SIZE);
  uint8_t *o = hr_put_u8(out + HR_HEADER_SIZE, buffer_index);
  o = hr_put_u8(o, 0);
  o = hr_put_u16(o, 0);
  hr_put_u64(o, offset);
  return HR_HEADER_SIZE + HR_DATA_SUBHEADER_SIZE;
}
