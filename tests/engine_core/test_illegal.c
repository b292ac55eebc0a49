/* Every illegal message in every state, table-driven: the right ERROR on
 * the right stream (or silence for the races of § 18), and whether the
 * connection closes.  Plus a failing allocator over a whole exchange. */
#include "engine_core/harness.h"

/* ---- raw messages -------------------------------------------------------- */

typedef struct raw {
  uint8_t b[70000];
  size_t n;
} raw;

static void put_msg(raw *r, const hr_msg *m) {
  int64_t n = hr_wire_encode(m, r->b + r->n, sizeof r->b - r->n);
  assert_true(n > 0);
  r->n += (size_t)n;
}

static void put_hdr(raw *r, uint32_t type, uint32_t sid, uint32_t len) {
  hr_wire_put_header(r->b + r->n, type, sid, len);
  r->n += 12;
  memset(r->b + r->n, 0, len < 64 ? len : 64);
  r->n += len < 64 ? len : 0;
}

static void hello(raw *r, int server, uint32_t magic, uint16_t major,
                  uint16_t minor, const uint8_t *layouts, uint16_t nl) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = server ? HR_MSG_SERVER_HELLO : HR_MSG_CLIENT_HELLO;
  hr_hello *h = &m.u.hello;
  h->magic = magic;
  h->version_major = major;
  h->version_minor = minor;
  h->max_message_size = 1 << 20;
  static const uint8_t cpu[1] = {0};
  h->devices = cpu;
  h->device_count = 1;
  h->memory_classes = cpu;
  h->memory_class_count = 1;
  for (uint16_t i = 0; i < nl; i++)
    h->layouts[i].tag = layouts[i];
  h->layout_count = nl;
  if (server) {
    /* MAX_SHARDS 8 */
    static uint8_t ext[6];
    int n = hr_ext_put(ext, sizeof ext, HR_EXT_MAX_SHARDS,
                       (const uint8_t[]){8, 0}, 2);
    h->ext_raw = ext;
    h->ext_raw_len = (size_t)n;
    h->ext_count = 1;
  }
  put_msg(r, &m);
}

static void empty(raw *r, uint32_t type, uint32_t sid) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = type;
  m.hdr.stream_id = sid;
  put_msg(r, &m);
}

static void request(raw *r, uint32_t sid, const char *key, uint32_t flags,
                    uint16_t k) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_REQUEST;
  m.hdr.stream_id = sid;
  m.u.request.key = (const uint8_t *)key;
  m.u.request.key_len = (uint16_t)strlen(key);
  m.u.request.flags = flags;
  m.u.request.max_shards = k;
  put_msg(r, &m);
}

static void error_msg(raw *r, uint32_t sid, uint32_t code) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_ERROR;
  m.hdr.stream_id = sid;
  m.u.error.code = code;
  put_msg(r, &m);
}

static void ping(raw *r, uint32_t type, uint32_t sid) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = type;
  m.hdr.stream_id = sid;
  m.u.ping = 42;
  if (sid == 0) {
    put_msg(r, &m);
    return;
  }
  /* The encoder refuses PING off stream 0: write it by hand. */
  hr_wire_put_header(r->b + r->n, type, sid, 8);
  memset(r->b + r->n + 12, 0, 8);
  r->n += 20;
}

static void desc_msg(raw *r, uint32_t type, uint32_t sid, uint8_t layout,
                     uint8_t device, uint64_t bytes) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = type;
  m.hdr.stream_id = sid;
  hr_descriptor *d =
      type == HR_MSG_TENSOR_PUT ? &m.u.put.desc : &m.u.tensor.desc;
  hr_transport_fields *x =
      type == HR_MSG_TENSOR_PUT ? &m.u.put.xport : &m.u.tensor.xport;
  if (type == HR_MSG_TENSOR_PUT) {
    m.u.put.key = (const uint8_t *)"p";
    m.u.put.key_len = 1;
  }
  d->descriptor_version = 1;
  d->element_type = HR_ELEM_UINT8;
  d->rank = 1;
  d->shape[0] = bytes;
  d->layout.tag = layout;
  d->buffer_count = 1;
  d->buffers[0].size_bytes = bytes;
  d->buffers[0].device_tag = device;
  x->total_data_bytes = bytes;
  x->total_shards = 1;
  put_msg(r, &m);
}

static void data_msg(raw *r, uint32_t sid, uint64_t off, uint32_t len) {
  assert_int_equal(hr_wire_encode_data_prefix(r->b + r->n, sid, 0, off, len),
                   24);
  r->n += 24;
  memset(r->b + r->n, 0xAB, len);
  r->n += len;
}

/* ---- output -------------------------------------------------------------- */

typedef struct outs {
  int n;
  uint32_t type[256], sid[256], code[256];
} outs;

static void drain(hr_session *s, outs *o) {
  memset(o, 0, sizeof *o);
  for (;;) {
    uint8_t *buf;
    int64_t got = pull_all(s, 64, 0, &buf);
    assert_true(got >= 0);
    if (got == 0)
      return;
    size_t total = (size_t)got;
    for (size_t pos = 0; pos + 12 <= total && o->n < 256;) {
      hr_msg_header h;
      hr_wire_parse_header(buf + pos, &h);
      o->type[o->n] = h.type;
      o->sid[o->n] = h.stream_id;
      if (h.type == HR_MSG_ERROR) {
        hr_msg m;
        assert_int_equal(
            hr_wire_decode(buf + pos, 12 + h.payload_length, NULL, &m, NULL),
            0);
        o->code[o->n] = m.u.error.code;
      }
      o->n++;
      pos += 12 + h.payload_length;
    }
    free(buf);
  }
}

static int find_error(const outs *o, uint32_t *sid, uint32_t *code) {
  for (int i = 0; i < o->n; i++)
    if (o->type[i] == HR_MSG_ERROR) {
      *sid = o->sid[i];
      *code = o->code[i];
      return 1;
    }
  return 0;
}

/* Feeds a table row's bytes (`build`) to `s` one byte at a time (header
 * checks happen before payloads), then checks what `s` answered: an
 * ERROR `want_code` on stream `want_sid` (none when `want_code` is 0),
 * and whether it stopped reading (`closed`). */
static void feed_row(hr_session *s, const char *name, void (*build)(raw *r),
                     uint32_t want_sid, uint32_t want_code, int closed) {
  static raw r;
  outs o;
  r.n = 0;
  build(&r);
  for (size_t k = 0; k < r.n && hr_session_want_read(s); k++)
    assert_true(hr_session_recv(s, r.b + k, 1, 0) >= 0);
  drain(s, &o);
  uint32_t sid = 99, code = 0;
  int got = find_error(&o, &sid, &code);
  if (!want_code) {
    if (got)
      fail_msg("%s: unexpected ERROR %u on %u", name, code, sid);
  } else {
    if (!got)
      fail_msg("%s: no ERROR", name);
    if (sid != want_sid || code != want_code)
      fail_msg("%s: ERROR %s on %u, want %s on %u", name,
               hr_wire_error_name(code), sid, hr_wire_error_name(want_code),
               want_sid);
  }
  if (!!closed != !hr_session_want_read(s))
    fail_msg("%s: closed %d, want %d", name, !hr_session_want_read(s), closed);
}

/* ---- server table -------------------------------------------------------- */

enum { S_FRESH, S_EST, S_OPEN, S_ENDED, S_PUT };

typedef struct srow {
  const char *name;
  int state;
  void (*build)(raw *r);
  uint32_t sid;  /* expected ERROR stream */
  uint32_t code; /* expected code; 0: no ERROR at all */
  int closed;    /* the connection closes */
} srow;

static void b_request1(raw *r) {
  request(r, 1, "k", 0, 1);
}
static void b_ping(raw *r) {
  ping(r, HR_MSG_PING, 0);
}
static void b_server_hello(raw *r) {
  hello(r, 1, HR_MAGIC, 1, 0, NULL, 0);
}
static void b_bad_magic(raw *r) {
  hello(r, 0, 0x12345678, 1, 0, NULL, 0);
}
static void b_major2(raw *r) {
  hello(r, 0, HR_MAGIC, 2, 0, NULL, 0);
}
static void b_big_hello(raw *r) {
  hr_wire_put_header(r->b, HR_MSG_CLIENT_HELLO, 0, 65537);
  r->n = 12;
}
static void b_client_hello(raw *r) {
  hello(r, 0, HR_MAGIC, 1, 0, NULL, 0);
}
static void b_request_reuse(raw *r) {
  request(r, 1, "k", 0, 1);
}
static void b_request_lower(raw *r) {
  request(r, 9, "k", 0, 1);
  request(r, 5, "k", 0, 1);
}
static void b_data_never(raw *r) {
  data_msg(r, 9, 0, 4);
}
static void b_cancel_never(raw *r) {
  empty(r, HR_MSG_CANCEL, 9);
}
static void b_cancel_ended(raw *r) {
  empty(r, HR_MSG_CANCEL, 1);
}
static void b_error_ended(raw *r) {
  error_msg(r, 1, HR_WIRE_INTERNAL);
}
static void b_release_ended(raw *r) {
  empty(r, HR_MSG_BUFFER_RELEASE, 1);
}
static void b_end_ended(raw *r) {
  empty(r, HR_MSG_TENSOR_DATA_END, 1);
}
static void b_ack_open(raw *r) {
  empty(r, HR_MSG_TENSOR_PUT_ACK, 1);
}
static void b_ack_never(raw *r) {
  empty(r, HR_MSG_TENSOR_PUT_ACK, 9);
}
static void b_list_resp_never(raw *r) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_LIST_RESPONSE;
  m.hdr.stream_id = 9;
  put_msg(r, &m);
}
static void b_unknown_s3(raw *r) {
  put_hdr(r, 0x13, 3, 4);
}
static void b_unknown_s0(raw *r) {
  put_hdr(r, 0x13, 0, 4);
}
static void b_private_s3(raw *r) {
  put_hdr(r, 0xF0, 3, 0);
}
static void b_ping_s3(raw *r) {
  ping(r, HR_MSG_PING, 3);
}
static void b_ping_s1(raw *r) {
  ping(r, HR_MSG_PING, 1);
}
static void b_short_data(raw *r) {
  put_hdr(r, HR_MSG_TENSOR_DATA, 5, 12);
}
static void b_rdma_open(raw *r) {
  empty(r, HR_MSG_RDMA_READY, 1);
}
static void b_desc_on_get(raw *r) {
  desc_msg(r, HR_MSG_TENSOR_DESCRIPTOR, 1, HR_LAYOUT_ROW_MAJOR, 0, 4);
}
static void b_malformed_req(raw *r) {
  put_hdr(r, HR_MSG_TENSOR_REQUEST, 7, 3);
}
static void b_too_large(raw *r) {
  hr_wire_put_header(r->b, HR_MSG_TENSOR_REQUEST, 7, (16u << 20) + 1);
  r->n = 12;
}
static void b_error_s0(raw *r) {
  error_msg(r, 0, HR_WIRE_INTERNAL);
}
static void b_goaway_s3(raw *r) {
  hr_wire_put_header(r->b, HR_MSG_GOAWAY, 3, 10);
  memset(r->b + 12, 0, 10);
  r->n = 22;
}
static void b_cancel_s0(raw *r) {
  hr_wire_put_header(r->b, HR_MSG_CANCEL, 0, 0);
  r->n = 12;
}
static void b_put_shard(raw *r) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_PUT;
  m.hdr.stream_id = 7;
  m.u.put.key = (const uint8_t *)"p";
  m.u.put.key_len = 1;
  hr_descriptor *d = &m.u.put.desc;
  d->descriptor_version = 1;
  d->element_type = HR_ELEM_UINT8;
  d->rank = 1;
  d->flags = HR_DESC_HAS_SHARD;
  d->shape[0] = 2;
  d->parent_shape[0] = 4;
  d->layout.tag = HR_LAYOUT_ROW_MAJOR;
  d->buffer_count = 1;
  d->buffers[0].size_bytes = 2;
  m.u.put.xport.total_data_bytes = 2;
  m.u.put.xport.total_shards = 1;
  put_msg(r, &m);
  data_msg(r, 7, 0, 2);
  empty(r, HR_MSG_TENSOR_DATA_END, 7);
}
static void b_put_cuda(raw *r) {
  desc_msg(r, HR_MSG_TENSOR_PUT, 7, HR_LAYOUT_ROW_MAJOR, HR_DEV_CUDA, 4);
  data_msg(r, 7, 0, 4);
  empty(r, HR_MSG_TENSOR_DATA_END, 7);
}
static void b_put_gap(raw *r) {
  data_msg(r, 5, 0, 2);
  data_msg(r, 5, 3, 1);
}
static void b_put_early_end(raw *r) {
  data_msg(r, 5, 0, 2);
  empty(r, HR_MSG_TENSOR_DATA_END, 5);
}
static void b_put_desc_plain(raw *r) {
  desc_msg(r, HR_MSG_TENSOR_DESCRIPTOR, 5, HR_LAYOUT_ROW_MAJOR, 0, 4);
}
static void b_region_rank(raw *r) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_REQUEST;
  m.hdr.stream_id = 7;
  m.u.request.key = (const uint8_t *)"k";
  m.u.request.key_len = 1;
  m.u.request.flags = HR_REQ_REGION;
  m.u.request.max_shards = 1;
  m.u.request.region_rank = 2;
  put_msg(r, &m);
}
static void b_region_outside(raw *r) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_REQUEST;
  m.hdr.stream_id = 7;
  m.u.request.key = (const uint8_t *)"k";
  m.u.request.key_len = 1;
  m.u.request.flags = HR_REQ_REGION;
  m.u.request.max_shards = 1;
  m.u.request.region_rank = 1;
  m.u.request.region_offset[0] = 10;
  m.u.request.region_shape[0] = 7;
  put_msg(r, &m);
}
static void b_block_past_end(raw *r) {
  request(r, UINT32_MAX - 2, "k", HR_REQ_PARALLEL_OK, 8);
}
static void b_cancel_in_block(raw *r) {
  request(r, 20, "k", HR_REQ_PARALLEL_OK, 4);
  empty(r, HR_MSG_CANCEL, 22); /* reserved, unused (N = 1): ignored */
  empty(r, HR_MSG_CANCEL, 25); /* never opened: connection error */
}

static const srow srows[] = {
    {"before HELLO: request", S_FRESH, b_request1, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"before HELLO: ping", S_FRESH, b_ping, 0, HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"before HELLO: SERVER_HELLO", S_FRESH, b_server_hello, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"bad magic", S_FRESH, b_bad_magic, 0, HR_WIRE_UNSUPPORTED_VERSION, 1},
    {"major 2", S_FRESH, b_major2, 0, HR_WIRE_UNSUPPORTED_VERSION, 1},
    {"HELLO above 65536", S_FRESH, b_big_hello, 0, HR_WIRE_MESSAGE_TOO_LARGE,
     1},
    {"second CLIENT_HELLO", S_EST, b_client_hello, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"SERVER_HELLO from a client", S_EST, b_server_hello, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"request on an open id", S_OPEN, b_request_reuse, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"request on a lower id", S_EST, b_request_lower, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"DATA on a never-opened id", S_EST, b_data_never, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"CANCEL on a never-opened id", S_EST, b_cancel_never, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"CANCEL after the answer ended", S_ENDED, b_cancel_ended, 0, 0, 0},
    {"ERROR on an ended stream", S_ENDED, b_error_ended, 0, 0, 0},
    {"BUFFER_RELEASE after the end", S_ENDED, b_release_ended, 0, 0, 0},
    {"DATA_END on an ended stream", S_ENDED, b_end_ended, 1,
     HR_WIRE_PROTOCOL_VIOLATION, 0},
    {"PUT_ACK from a client (open)", S_OPEN, b_ack_open, 1,
     HR_WIRE_PROTOCOL_VIOLATION, 0},
    {"PUT_ACK on a never-opened id", S_EST, b_ack_never, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"LIST_RESPONSE from a client", S_EST, b_list_resp_never, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"unknown type on stream 3", S_EST, b_unknown_s3, 3,
     HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0},
    {"unknown type on stream 0", S_EST, b_unknown_s0, 0,
     HR_WIRE_UNKNOWN_MESSAGE_TYPE, 1},
    {"unagreed private type", S_EST, b_private_s3, 3,
     HR_WIRE_UNKNOWN_MESSAGE_TYPE, 0},
    {"PING on a never-opened stream", S_EST, b_ping_s3, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"PING on an open stream", S_OPEN, b_ping_s1, 1, HR_WIRE_PROTOCOL_VIOLATION,
     0},
    {"PING on an ended stream", S_ENDED, b_ping_s1, 1,
     HR_WIRE_PROTOCOL_VIOLATION, 0},
    {"RDMA_READY not negotiated", S_OPEN, b_rdma_open, 1,
     HR_WIRE_PROTOCOL_VIOLATION, 0},
    {"DESCRIPTOR on a GET stream", S_OPEN, b_desc_on_get, 1,
     HR_WIRE_PROTOCOL_VIOLATION, 0},
    {"malformed request", S_EST, b_malformed_req, 7, HR_WIRE_MALFORMED_PAYLOAD,
     0},
    {"payload above max_message_size", S_EST, b_too_large, 0,
     HR_WIRE_MESSAGE_TOO_LARGE, 1},
    {"ERROR on stream 0", S_EST, b_error_s0, 0, 0, 1},
    {"GOAWAY on a never-opened stream", S_EST, b_goaway_s3, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"short TENSOR_DATA on an open PUT", S_PUT, b_short_data, 5,
     HR_WIRE_MALFORMED_PAYLOAD, 0},
    {"short TENSOR_DATA never opened", S_EST, b_short_data, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"CANCEL on stream 0", S_EST, b_cancel_s0, 0, HR_WIRE_PROTOCOL_VIOLATION,
     1},
    {"PUT of a shard", S_EST, b_put_shard, 7, HR_WIRE_PUT_REJECTED, 0},
    {"PUT on CUDA", S_EST, b_put_cuda, 7, HR_WIRE_DEVICE_UNAVAILABLE, 0},
    {"PUT frames with a gap", S_PUT, b_put_gap, 5, HR_WIRE_PROTOCOL_VIOLATION,
     0},
    {"PUT ends early", S_PUT, b_put_early_end, 5, HR_WIRE_PROTOCOL_VIOLATION,
     0},
    {"DESCRIPTOR in a plain PUT", S_PUT, b_put_desc_plain, 5,
     HR_WIRE_PROTOCOL_VIOLATION, 0},
    {"region rank differs", S_EST, b_region_rank, 7, HR_WIRE_INVALID_REGION, 0},
    {"region outside", S_EST, b_region_outside, 7, HR_WIRE_INVALID_REGION, 0},
    {"parallel block past 2^32", S_EST, b_block_past_end, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
    {"CANCEL in a block, then outside", S_EST, b_cancel_in_block, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1},
};

static void server_table(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof srows / sizeof *srows; i++) {
    const srow *row = &srows[i];
    store st;
    memset(&st, 0, sizeof st);
    hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){16}, 1);
    store_put(&st, "k", t);
    hr_provider prov = store_provider(&st);
    hr_session *s;
    assert_int_equal(
        hr_session_new(&s, HR_ROLE_SERVER, NULL, NULL, &prov, NULL, 0, NULL),
        0);
    static raw r;
    outs o;
    if (row->state != S_FRESH) {
      r.n = 0;
      b_client_hello(&r);
      if (row->state == S_OPEN || row->state == S_ENDED) {
        st.defer = row->state == S_OPEN;
        request(&r, 1, "k", 0, 1);
      }
      if (row->state == S_PUT)
        desc_msg(&r, HR_MSG_TENSOR_PUT, 5, HR_LAYOUT_ROW_MAJOR, 0, 4);
      assert_int_equal(hr_session_recv(s, r.b, r.n, 0), (int64_t)r.n);
      drain(s, &o);
      uint32_t sid, code;
      assert_false(find_error(&o, &sid, &code));
    }
    feed_row(s, row->name, row->build, row->sid, row->code, row->closed);
    hr_session_del(s);
    hr_tensor_unref(t);
    store_clear(&st);
  }
}

/* ---- client table -------------------------------------------------------- */

enum { C_FRESH, C_EST, C_GET };

typedef struct crow {
  const char *name;
  int state;
  void (*build)(raw *r);
  uint32_t sid;
  uint32_t code;
  int closed;
  int get_status; /* the open GET's completion (C_GET), 1: still open */
} crow;

static const uint8_t only_rm[1] = {HR_LAYOUT_ROW_MAJOR};
static void c_desc_s1(raw *r) {
  desc_msg(r, HR_MSG_TENSOR_DESCRIPTOR, 1, HR_LAYOUT_ROW_MAJOR, 0, 4);
}
static void c_minor1(raw *r) {
  hello(r, 1, HR_MAGIC, 1, 1, only_rm, 1);
}
static void c_request_never(raw *r) {
  request(r, 9, "k", 0, 1);
}
static void c_request_open(raw *r) {
  empty(r, HR_MSG_CANCEL, 1);
}
static void c_data_first(raw *r) {
  data_msg(r, 1, 0, 4);
}
static void c_ack_get(raw *r) {
  empty(r, HR_MSG_TENSOR_PUT_ACK, 1);
}
static void c_colmajor(raw *r) {
  desc_msg(r, HR_MSG_TENSOR_DESCRIPTOR, 1, HR_LAYOUT_COLUMN_MAJOR, 0, 4);
}
static void c_cuda(raw *r) {
  desc_msg(r, HR_MSG_TENSOR_DESCRIPTOR, 1, HR_LAYOUT_ROW_MAJOR, HR_DEV_CUDA, 4);
}
static void c_overrun(raw *r) {
  desc_msg(r, HR_MSG_TENSOR_DESCRIPTOR, 1, HR_LAYOUT_ROW_MAJOR, 0, 4);
  data_msg(r, 1, 2, 4);
}
static void c_error(raw *r) {
  error_msg(r, 1, HR_WIRE_NOT_FOUND);
}
static void c_good(raw *r) {
  desc_msg(r, HR_MSG_TENSOR_DESCRIPTOR, 1, HR_LAYOUT_ROW_MAJOR, 0, 4);
  data_msg(r, 1, 0, 4);
  empty(r, HR_MSG_TENSOR_DATA_END, 1);
  /* Late: an ERROR after the end is dropped; a descriptor is not. */
  error_msg(r, 1, HR_WIRE_CANCELLED);
}
static void c_good_then_desc(raw *r) {
  c_good(r);
  desc_msg(r, HR_MSG_TENSOR_DESCRIPTOR, 1, HR_LAYOUT_ROW_MAJOR, 0, 4);
}
static void c_second_shello(raw *r) {
  hello(r, 1, HR_MAGIC, 1, 0, NULL, 0);
}
static void c_list_resp_get(raw *r) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_LIST_RESPONSE;
  m.hdr.stream_id = 1;
  put_msg(r, &m);
}

static const crow crows[] = {
    {"before HELLO: descriptor", C_FRESH, c_desc_s1, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1, 0},
    {"SERVER_HELLO minor above ours", C_FRESH, c_minor1, 0,
     HR_WIRE_UNSUPPORTED_VERSION, 1, 0},
    {"second SERVER_HELLO", C_EST, c_second_shello, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1, 0},
    {"TENSOR_REQUEST from a server", C_EST, c_request_never, 0,
     HR_WIRE_PROTOCOL_VIOLATION, 1, 0},
    {"CANCEL from a server", C_GET, c_request_open, 1,
     HR_WIRE_PROTOCOL_VIOLATION, 0, HR_ERR_PROTO},
    {"DATA before the descriptor", C_GET, c_data_first, 1,
     HR_WIRE_PROTOCOL_VIOLATION, 0, HR_ERR_PROTO},
    {"PUT_ACK on a GET", C_GET, c_ack_get, 1, HR_WIRE_PROTOCOL_VIOLATION, 0,
     HR_ERR_PROTO},
    {"LIST_RESPONSE on a GET", C_GET, c_list_resp_get, 1,
     HR_WIRE_PROTOCOL_VIOLATION, 0, HR_ERR_PROTO},
    {"layout neither asked nor advertised", C_GET, c_colmajor, 1,
     HR_WIRE_PROTOCOL_VIOLATION, 0, HR_ERR_PROTO},
    {"CUDA buffer never advertised (rule 6)", C_GET, c_cuda, 1,
     HR_WIRE_PROTOCOL_VIOLATION, 0, HR_ERR_PROTO},
    {"frame past the buffer", C_GET, c_overrun, 1, HR_WIRE_PROTOCOL_VIOLATION,
     0, HR_ERR_PROTO},
    {"peer ERROR", C_GET, c_error, 0, 0, 0, HR_ERR_REMOTE},
    {"complete, late ERROR dropped", C_GET, c_good, 0, 0, 0, 0},
    {"complete, late descriptor", C_GET, c_good_then_desc, 1,
     HR_WIRE_PROTOCOL_VIOLATION, 0, 0},
};

static void client_table(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof crows / sizeof *crows; i++) {
    const crow *row = &crows[i];
    hr_session *c;
    assert_int_equal(
        hr_session_new(&c, HR_ROLE_CLIENT, NULL, NULL, NULL, NULL, 0, NULL), 0);
    outs o;
    drain(c, &o); /* CLIENT_HELLO */
    assert_int_equal(o.n, 1);
    static raw r;
    result res = {0};
    if (row->state != C_FRESH) {
      r.n = 0;
      hello(&r, 1, HR_MAGIC, 1, 0, only_rm, 1);
      assert_int_equal(hr_session_recv(c, r.b, r.n, 0), (int64_t)r.n);
      if (row->state == C_GET) {
        hr_get_opts go = get_opts("k");
        uint32_t sid;
        assert_int_equal(hr_session_get(c, &go, on_get_done, &res, &sid), 0);
        assert_int_equal(sid, 1);
      }
      drain(c, &o);
    }
    feed_row(c, row->name, row->build, row->sid, row->code, row->closed);
    if (row->state == C_GET) {
      if (res.calls != 1 || res.status != row->get_status)
        fail_msg("%s: GET calls %d status %d, want 1 / %d", row->name,
                 res.calls, res.status, row->get_status);
    }
    hr_session_del(c);
    assert_true(res.calls <= 1);
    result_clear(&res);
  }
}

/* ---- flood --------------------------------------------------------------- */

static void ping_flood(void **state) {
  (void)state;
  hr_session *s;
  assert_int_equal(
      hr_session_new(&s, HR_ROLE_SERVER, NULL, NULL, NULL, NULL, 0, NULL), 0);
  static raw r;
  r.n = 0;
  b_client_hello(&r);
  assert_int_equal(hr_session_recv(s, r.b, r.n, 0), (int64_t)r.n);
  /* PINGs, never reading the PONGs: the server gives up. */
  r.n = 0;
  for (int i = 0; i < 3000; i++)
    ping(&r, HR_MSG_PING, 0);
  for (int round = 0; round < 20 && hr_session_want_read(s); round++)
    assert_true(hr_session_recv(s, r.b, r.n, 0) >= 0);
  assert_false(hr_session_want_read(s));
  outs o;
  drain(s, &o);
  uint32_t sid, code;
  assert_true(find_error(&o, &sid, &code));
  assert_int_equal(code, HR_WIRE_RESOURCE_EXHAUSTED);
  hr_session_del(s);
}

/* ---- failing allocator --------------------------------------------------- */

/* A whole exchange (handshake, GETs plain, sharded-size-free and
 * composite, a PUT and a LIST) with the Nth allocation failing, for every
 * N: each run ends cleanly and frees everything. */
static void failmalloc(void **state) {
  (void)state;
  hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){20, 30}, 1);
  hr_tensor *m2[2] = {t, t};
  hr_descriptor h;
  desc_init(&h, HR_ELEM_NONE, HR_LAYOUT_COMPOSITE, 0, NULL);
  h.params.member_count = 2;
  h.params.rule = HR_COMPOSITE_TUPLE;
  hr_tensor *c = NULL;
  assert_int_equal(hr_tensor_new_composite(&c, &h, m2, 2, NULL, NULL), 0);
  int clean = 0;
  for (long n = 0; n < 100000 && !clean; n++) {
    pair p;
    memset(&p, 0, sizeof p);
    p.use_fm = 1;
    p.chunked = 1;
    hr_test_failmem_init(&p.fm, n);
    store_put(&p.st, "t", t);
    store_put(&p.st, "c", c);
    result r1 = {0}, r2 = {0}, r3 = {0}, r4 = {0}, r5 = {0};
    int g1 = -1, g2 = -1, g3 = -1, g4 = -1, g5 = -1;
    int rv = pair_open(&p, NULL, NULL);
    if (rv == 0) {
      hr_get_opts o = get_opts("t");
      g1 = hr_session_get(p.c, &o, on_get_done, &r1, NULL);
      o = get_opts("c");
      g2 = hr_session_get(p.c, &o, on_get_done, &r2, NULL);
      g3 = hr_session_put(p.c, (const uint8_t *)"u", 1, 0, t, on_put_done, &r3,
                          NULL);
      g4 = hr_session_list(p.c, NULL, 0, NULL, 0, 10, on_list_done, &r4);
      /* Transcoded when the kernels are linked (plans, chunks, work). */
      o = get_opts("t");
      hr_layout_entry cm = {HR_LAYOUT_COLUMN_MAJOR, 0, NULL};
      o.layouts = &cm;
      o.layout_count = 1;
      o.flags = HR_REQ_ALLOW_TRANSCODE;
      g5 = hr_session_get(p.c, &o, on_get_done, &r5, NULL);
      rv = run(&p);
      assert_true(rv == 0 || rv == HR_ERR_NOMEM);
      assert_true(g1 == 0 || g1 == HR_ERR_NOMEM || g1 == HR_ERR_STATE);
      assert_true(g2 == 0 || g2 == HR_ERR_NOMEM || g2 == HR_ERR_STATE);
      assert_true(g3 == 0 || g3 == HR_ERR_NOMEM || g3 == HR_ERR_STATE);
      assert_true(g4 == 0 || g4 == HR_ERR_NOMEM || g4 == HR_ERR_STATE);
      assert_true(g5 == 0 || g5 == HR_ERR_NOMEM || g5 == HR_ERR_STATE);
      if (!p.fm.failed) {
        if (r1.status)
          print_message("r1: %d %s %s\n", r1.status,
                        hr_wire_error_name(r1.rec.wire_error), r1.rec.message);
        assert_int_equal(rv, 0);
        assert_int_equal(r1.status, 0);
        assert_true(same_tensor(r1.t, t));
        assert_true(same_tensor(r2.t, c));
        assert_int_equal(r3.status, 0);
        assert_int_equal(r4.entries, 2); /* the PUT is not ACKed yet */
        assert_int_equal(r5.status, 0);
        assert_int_equal(r5.t != NULL, 1);
        clean = 1;
      }
    } else {
      assert_int_equal(rv, HR_ERR_NOMEM);
    }
    hr_session_del(p.c);
    hr_session_del(p.s);
    /* Every completion issued ran exactly once; none for a refused call. */
    assert_int_equal(r1.calls, g1 == 0);
    assert_int_equal(r2.calls, g2 == 0);
    assert_int_equal(r3.calls, g3 == 0);
    assert_int_equal(r4.calls, g4 == 0);
    assert_int_equal(r5.calls, g5 == 0);
    result_clear(&r1);
    result_clear(&r2);
    result_clear(&r3);
    result_clear(&r4);
    result_clear(&r5);
    store_clear(&p.st);
    if (p.fm.live != 0)
      fail_msg("fail at %ld: %ld blocks leaked", n, p.fm.live);
  }
  assert_true(clean);
  hr_tensor_unref(c);
  hr_tensor_unref(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(server_table),
      cmocka_unit_test(client_table),
      cmocka_unit_test(ping_flood),
      cmocka_unit_test(failmalloc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
