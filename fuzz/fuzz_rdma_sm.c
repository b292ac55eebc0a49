/*
 * libFuzzer target: the RDMA handshake (fabric/hr_rdma_sm.c) of one
 * tensor, either side, GET or PUT, on the fake fabric, fed hostile peer
 * messages and hostile fabric traffic in an order the input chooses.
 *
 * The handshake under test ("me") runs on one fake endpoint; the peer is a
 * second endpoint of the same world that the input drives by hand: it
 * registers its own buffers (real keys to name in RDMA_REGISTER), sends
 * tagged pieces of any size and tag, and pokes at the keys "me" sent.
 * Every message given to hr_rdma_on_msg() is built from the input, encoded
 * and decoded again first, so that it is one the session could really
 * hand over.
 *
 * Input layout:
 *   u8 flags  bit 0 side (1 receiver), bit 1 PUT, bit 2 register a
 *             destination, bit 3 our HELLO has RDMA_GPUDIRECT, bit 4 the
 *             peer's has, bit 5 keys carry virtual addresses, bit 6 raw
 *             keys, bit 7 the peer's HELLO lacks RDMA_DATA_PLANE
 *   u8 more   bit 0 delete the handshake from inside its events, bit 1
 *             send_msg fails fatally from the (more >> 4)-th message on,
 *             bit 2 a hostile total_data_bytes (u16 follows), bit 3 the
 *             peer's FABRIC_ADDRESS names no endpoint
 *   u8 n      buffers (n % 5); per buffer u8 size (x 8 bytes), u8
 *             alignment_log2 (% 8), u8 sync_mode (0 unless the high bits
 *             are all set)
 *   commands, each one byte c: op = c >> 5, arg = c & 31
 *     0  a message to the handshake (arg selects, fields follow)
 *     1  fake progress of our endpoint: arg 0 everything, else one
 *     2  fake progress of the peer's endpoint
 *     3  the peer registers its buffer: u8 size, arg & 1 WRITE (else READ)
 *     4  the peer sends tagged pieces (arg & 1: posts receives instead):
 *        u8 size, u8 tag delta, u8 piece
 *     5  poke the last key we sent: u8 offset, u8 length
 *     6  a fault on our endpoint (arg % 9 picks which)
 *     7  arg % 4: start, commit (u8 code), abort (u8 code), delete
 *
 * Checked: no crash, leak or UB; every message the handshake sends
 * encodes, decodes, is on its stream and of its side's direction, and
 * none follows the terminal event; COMPLETE or FAILED is reported at most
 * once, DATA_READY only on a PUT receiver, once, before it; the return
 * codes are the documented ones; after the terminal event the keys we
 * sent open nothing; release runs
 * exactly once, and when everything is torn down none of our remote
 * registrations is left open.
 *
 * With HR_FUZZ_TRACE set, the messages sent and the events are listed on
 * stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hurray/fabric.h>

#include "fabric/hr_fab_fake.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define STREAM 7u
#define PEER_REGS 4
#define PEER_OPS 8
#define PEER_BUF 4096

typedef struct in_t {
  const uint8_t *p;
  size_t n;
} in_t;

static uint8_t take(in_t *in) {
  if (in->n == 0)
    return 0;
  in->n--;
  return *in->p++;
}

static uint64_t take64(in_t *in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | take(in);
  return v;
}

typedef struct peer_op {
  hr_fabric_op op;
  int active;
  hr_fabric_region r;
} peer_op;

typedef struct fx {
  hr__fake_world *w;
  hr__fake_ep *me, *peer;
  hr_rdma_conn *conn;
  hr_rdma *x;
  int side, dir;
  int del_on_event;
  int fail_from; /* send_msg fails fatally from this message on (0: never) */
  int dead;      /* a call returned a fatal error */
  hr_descriptor desc;
  uint64_t total;
  uint8_t *buf[HR_MAX_BUFFERS];
  int released;
  int terminal; /* COMPLETE or FAILED reported */
  int ready;    /* DATA_READY reported */
  int nsent;
  int trace; /* HR_FUZZ_TRACE: messages and events on stderr */
  /* The keys we sent in RDMA_REGISTER. */
  hr_fabric_key keys[2];
  int nkeys;
  /* The peer. */
  void *peer_handle; /* the peer's view of us, NULL if unresolved */
  uint8_t peer_buf[PEER_BUF];
  void *peer_mr[PEER_REGS];
  hr_fabric_key peer_key[PEER_REGS];
  int npeer;
  peer_op ops[PEER_OPS];
} fx;

/* ---- the handshake's callbacks ------------------------------------------ */

static int sent_by_side(int side, uint32_t type, const hr_msg *m) {
  switch (type) {
  case HR_MSG_ERROR: return 1;
  case HR_MSG_RDMA_REGISTER:
    return m->u.rdma.role ==
           (side == HR_RDMA_SENDER ? HR_RDMA_SOURCE : HR_RDMA_DESTINATION);
  case HR_MSG_TENSOR_DATA_END: return side == HR_RDMA_SENDER;
  case HR_MSG_RDMA_READY:
  case HR_MSG_TENSOR_PUT_ACK: return side == HR_RDMA_RECEIVER;
  default: return 0;
  }
}

static int on_send(hr_rdma *x, const hr_msg *m, void *ud) {
  fx *f = ud;
  (void)x;
  if (f->terminal)
    hr_fuzz_fail("the handshake sent a message after its terminal event");
  if (m->hdr.stream_id != STREAM)
    hr_fuzz_fail("the handshake sent on another stream");
  if (!sent_by_side(f->side, m->hdr.type, m))
    hr_fuzz_fail("the handshake sent a message of the other side");
  uint8_t wire[2048];
  int64_t n = hr_wire_encode(m, wire, sizeof wire);
  if (n <= 0)
    hr_fuzz_fail("the handshake sent a message that does not encode");
  hr_msg back;
  hr_wire_status st;
  memset(&st, 0, sizeof st);
  if (hr_wire_decode(wire, (size_t)n, NULL, &back, &st) != 0)
    hr_fuzz_fail("the handshake sent a message that does not decode");
  hr_fuzz_check_roundtrip(&back, wire, (size_t)n);
  if (m->hdr.type == HR_MSG_RDMA_REGISTER && f->nkeys < 2) {
    hr_fabric_key *k = &f->keys[f->nkeys++];
    memset(k, 0, sizeof *k);
    k->length = m->u.rdma.length;
    k->address = m->u.rdma.address;
    k->key = m->u.rdma.key;
    k->raw_key_len = m->u.rdma.raw_key_len;
    if (k->raw_key_len > HR_FABRIC_RAW_KEY_MAX)
      hr_fuzz_fail("the handshake sent an over-long raw key");
    if (k->raw_key_len)
      memcpy(k->raw_key, m->u.rdma.raw_key, k->raw_key_len);
  }
  f->nsent++;
  if (f->trace)
    fprintf(stderr, "fuzz: sent type 0x%02x\n", m->hdr.type);
  if (f->fail_from && f->nsent >= f->fail_from)
    return HR_ERR_NOMEM;
  return 0;
}

static void on_event(hr_rdma *x, const hr_rdma_event *ev, void *ud) {
  fx *f = ud;
  if (ev->stream_id != STREAM)
    hr_fuzz_fail("an event of another stream");
  if (ev->message == NULL || ev->fallback == NULL)
    hr_fuzz_fail("an event's message or fallback is NULL");
  if (f->terminal)
    hr_fuzz_fail("an event after the terminal event");
  if (f->trace)
    fprintf(stderr, "fuzz: event %d (code %u, %s; %s)\n", ev->kind,
            ev->wire_error, ev->message, ev->fallback);
  switch (ev->kind) {
  case HR_RDMA_EV_DATA_READY:
    if (f->side != HR_RDMA_RECEIVER || f->dir != HR_RDMA_PUT || f->ready)
      hr_fuzz_fail("DATA_READY outside a PUT receiver, or twice");
    f->ready = 1;
    break;
  case HR_RDMA_EV_COMPLETE:
    if (f->side == HR_RDMA_RECEIVER && f->dir == HR_RDMA_PUT && !f->ready)
      hr_fuzz_fail("a PUT receiver completed without DATA_READY");
    if (ev->bytes > f->total)
      hr_fuzz_fail("COMPLETE reports more bytes than the tensor has");
    f->terminal = 1;
    break;
  case HR_RDMA_EV_FAILED: f->terminal = 1; break;
  default: hr_fuzz_fail("an event of an unknown kind");
  }
  if (f->del_on_event && f->x == x) {
    hr_rdma_del(x);
    f->x = NULL;
  }
}

static void on_release(void *ctx) {
  fx *f = ctx;
  if (++f->released != 1)
    hr_fuzz_fail("release ran twice");
}

static const hr_rdma_callbacks cbs = {sizeof(hr_rdma_callbacks), on_send,
                                      on_event};

/* A return of hr_rdma_on_msg/start/commit/abort. */
static void check_rv(fx *f, int rv, int state_ok) {
  if (rv == 0)
    return;
  if (rv == HR_ERR_STATE && state_ok)
    return;
  if (rv == HR_ERR_NOMEM && f->fail_from) {
    /* Our send_msg's fatal error, passed up: the owner tears down. */
    f->dead = 1;
    return;
  }
  char msg[96];
  snprintf(msg, sizeof msg, "an undocumented return: %s", hr_strerror(rv));
  hr_fuzz_fail(msg);
}

/* ---- messages to the handshake ------------------------------------------ */

static const uint32_t error_codes[] = {
    HR_WIRE_RDMA_SETUP_FAILED, HR_WIRE_GPUDIRECT_UNAVAILABLE,
    HR_WIRE_CANCELLED,         HR_WIRE_PROTOCOL_VIOLATION,
    HR_WIRE_TIMEOUT,           HR_WIRE_PUT_REJECTED,
    HR_WIRE_INVALID_SYNC_MODE, HR_WIRE_NO_ERROR};

static uint64_t pick_length(fx *f, in_t *in, const hr_fabric_key *k) {
  uint8_t c = take(in);
  switch (c & 7) {
  case 0: return f->total;
  case 1: return f->total - 1;
  case 2: return f->total + 1;
  case 3: return k ? k->length : 0;
  case 4: return take64(in);
  default: return (uint64_t)c << 3;
  }
}

static void deliver(fx *f, in_t *in, unsigned arg) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  uint8_t text[64], raw[HR_FABRIC_RAW_KEY_MAX + 8];
  switch (arg % 8) {
  case 0:
  case 7: {
    /* RDMA_REGISTER: case 7 names one of the peer's real keys. */
    const hr_fabric_key *k = NULL;
    if (arg % 8 == 7 && f->npeer > 0)
      k = &f->peer_key[take(in) % f->npeer];
    m.hdr.type = HR_MSG_RDMA_REGISTER;
    m.u.rdma.role = take(in) & 1;
    m.u.rdma.length = pick_length(f, in, k);
    uint8_t c = take(in);
    m.u.rdma.address = k ? k->address + (int8_t)c : (uint64_t)c << (c & 31);
    m.u.rdma.key = k ? k->key ^ (take(in) & 1) : take(in);
    if (k && k->raw_key_len) {
      memcpy(raw, k->raw_key, k->raw_key_len);
      m.u.rdma.raw_key = raw;
      m.u.rdma.raw_key_len = k->raw_key_len;
      m.u.rdma.key = 0;
    } else {
      unsigned rl = take(in);
      if (rl == 255)
        rl = HR_FABRIC_RAW_KEY_MAX + 1 + take(in) % 8;
      for (unsigned i = 0; i < rl; i++)
        raw[i] = take(in);
      m.u.rdma.raw_key = rl ? raw : NULL;
      m.u.rdma.raw_key_len = (uint16_t)rl;
    }
    break;
  }
  case 1: m.hdr.type = HR_MSG_RDMA_READY; break;
  case 2: m.hdr.type = HR_MSG_TENSOR_DATA_END; break;
  case 3: m.hdr.type = HR_MSG_TENSOR_PUT_ACK; break;
  case 4: {
    m.hdr.type = HR_MSG_ERROR;
    uint8_t c = take(in);
    m.u.error.code = c < 200 ? error_codes[c % 8] : (uint32_t)c << 8;
    unsigned tl = take(in) % sizeof text;
    for (unsigned i = 0; i < tl; i++)
      text[i] = take(in);
    m.u.error.message = text;
    m.u.error.message_len = (uint16_t)tl;
    break;
  }
  case 5: m.hdr.type = HR_MSG_CANCEL; break;
  default: m.hdr.type = HR_MSG_PING; break;
  }
  m.hdr.stream_id = m.hdr.type == HR_MSG_PING ? 0 : STREAM;
  /* What the session hands over was decoded from the wire. */
  uint8_t wire[2048];
  int64_t n = hr_wire_encode(&m, wire, sizeof wire);
  if (n <= 0)
    return;
  hr_msg d;
  hr_wire_status st;
  memset(&st, 0, sizeof st);
  if (hr_wire_decode(wire, (size_t)n, NULL, &d, &st) != 0)
    return;
  if (f->x == NULL || f->dead)
    return;
  check_rv(f, hr_rdma_on_msg(f->x, &d), 1);
}

/* ---- the peer ------------------------------------------------------------ */

static void peer_done(hr_fabric_op *op, int status, const char *why) {
  peer_op *p = op->user_data;
  if (status != 0 && why == NULL)
    hr_fuzz_fail("an operation failed without a reason string");
  p->active = 0;
}

static peer_op *free_op(fx *f) {
  for (int i = 0; i < PEER_OPS; i++)
    if (!f->ops[i].active)
      return &f->ops[i];
  return NULL;
}

static void peer_region(fx *f, hr_fabric_region *r, uint64_t len) {
  memset(r, 0, sizeof *r);
  r->length = len;
  r->device_tag = HR_DEV_CPU;
  r->nseg = 1;
  r->seg[0].ptr = f->peer_buf;
  r->seg[0].len = len;
}

static void peer_register(fx *f, in_t *in, unsigned arg) {
  uint64_t len = (uint64_t)take(in) * 16;
  if (f->npeer == PEER_REGS)
    return;
  hr_fabric_region r;
  peer_region(f, &r, len);
  char why[128];
  int i = f->npeer;
  if (hr__fake_ops()->reg(
          f->peer, &r,
          (arg & 1) ? HR_FABRIC_REMOTE_WRITE : HR_FABRIC_REMOTE_READ,
          &f->peer_key[i], &f->peer_mr[i], why, sizeof why) == 0)
    f->npeer++;
}

/* The peer's tagged sends to us (arg & 1 == 0) or receives from us. */
static void peer_tagged(fx *f, in_t *in, unsigned arg) {
  uint64_t len = (uint64_t)take(in) * 16;
  uint8_t td = take(in);
  uint8_t piece = take(in);
  peer_op *p = free_op(f);
  if (p == NULL || f->peer_handle == NULL)
    return;
  hr__fake_faults_of(f->peer)->send_piece = piece ? (uint64_t)piece * 8 : 0;
  peer_region(f, &p->r, len);
  memset(&p->op, 0, sizeof p->op);
  p->op.done = peer_done;
  p->op.user_data = p;
  char why[128];
  uint64_t tag = STREAM + (td < 200 ? 0 : td);
  const hr_fabric_ops *ops = hr__fake_ops();
  int rv = (arg & 1) ? ops->recv(f->peer, f->peer_handle, tag, &p->r, &p->op,
                                 why, sizeof why)
                     : ops->send(f->peer, f->peer_handle, tag, &p->r, &p->op,
                                 why, sizeof why);
  if (rv == 0)
    p->active = 1;
}

/* A key we sent opens nothing once our handshake is over. */
static void poke(fx *f, in_t *in) {
  uint8_t off = take(in), len = take(in);
  if (f->nkeys == 0)
    return;
  const hr_fabric_key *k = &f->keys[f->nkeys - 1];
  uint8_t src[256];
  memset(src, 0xA5, sizeof src);
  int rv = hr__fake_poke(f->me, k, k->address + off, src, len);
  if (rv == 0 && f->terminal)
    hr_fuzz_fail("a key of a finished handshake still opens its region");
}

static void fault(fx *f, unsigned arg) {
  hr__fake_faults *ft = hr__fake_faults_of(f->me);
  switch (arg % 9) {
  case 0: ft->reg_source = 1; break;
  case 1: ft->reg_dest = 1; break;
  case 2: ft->write_start = 1; break;
  case 3: ft->send_start = 1; break;
  case 4: ft->recv_start = 1; break;
  case 5: ft->write_error = 1; break;
  case 6: ft->send_error = 1; break;
  case 7: ft->recv_error = 1; break;
  default: ft->peer_gone_after = (int64_t)(arg * 8); break;
  }
}

static void call(fx *f, in_t *in, unsigned arg) {
  if (f->x == NULL || f->dead)
    return;
  switch (arg % 4) {
  case 0: check_rv(f, hr_rdma_start(f->x), 1); break;
  case 1: {
    uint8_t c = take(in);
    check_rv(f, hr_rdma_commit(f->x, c < 128 ? 0 : error_codes[c % 8], "no"),
             1);
    break;
  }
  case 2: {
    uint8_t c = take(in);
    check_rv(f, hr_rdma_abort(f->x, c < 64 ? 0 : error_codes[c % 8], "off"), 1);
    break;
  }
  default:
    hr_rdma_del(f->x);
    f->x = NULL;
    break;
  }
}

/* ---- the run ------------------------------------------------------------- */

static void progress_all(fx *f) {
  for (int rounds = 0;; rounds++) {
    if (rounds == 10000)
      hr_fuzz_fail("the fake fabric never settles");
    int moved = hr__fake_progress(f->me) + hr__fake_progress(f->peer);
    if (!moved)
      return;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  in_t in = {data, size};
  fx *f = calloc(1, sizeof *f);
  if (f == NULL)
    return 0;
  uint8_t flags = take(&in), more = take(&in);
  f->side = (flags & 1) ? HR_RDMA_RECEIVER : HR_RDMA_SENDER;
  f->dir = (flags & 2) ? HR_RDMA_PUT : HR_RDMA_GET;
  f->del_on_event = more & 1;
  f->trace = getenv("HR_FUZZ_TRACE") != NULL;
  if (more & 2)
    f->fail_from = 1 + (more >> 4);

  if (hr__fake_world_new(&f->w, NULL) != 0 ||
      hr__fake_ep_new(&f->me, f->w, "me", (flags >> 5) & 1, (flags >> 6) & 1) !=
          0 ||
      hr__fake_ep_new(&f->peer, f->w, "peer", (flags >> 5) & 1,
                      (flags >> 6) & 1) != 0)
    hr_fuzz_fail("the fake fabric could not be set up");

  /* The connection, as after both HELLOs. */
  uint32_t local = HR_CAP_RDMA_DATA_PLANE, remote = HR_CAP_RDMA_DATA_PLANE;
  if (flags & 8)
    local |= HR_CAP_RDMA_GPUDIRECT;
  if (flags & 16)
    remote |= HR_CAP_RDMA_GPUDIRECT;
  if (flags & 128)
    remote &= ~(uint32_t)HR_CAP_RDMA_DATA_PLANE;
  hr_rdma_conn_config cc;
  hr_rdma_conn_config_init(&cc, hr__fake_ops(), f->me, local, NULL);
  cc.peer_caps = remote;
  cc.peer_provider = (const uint8_t *)"fake";
  cc.peer_provider_len = 4;
  cc.peer_endpoint = (const uint8_t *)((more & 8) ? "nobody" : "peer");
  cc.peer_endpoint_len = (uint16_t)strlen((const char *)cc.peer_endpoint);
  cc.min_bytes = 1;
  if (hr_rdma_conn_new(&f->conn, &cc, NULL) != 0)
    hr_fuzz_fail("hr_rdma_conn_new failed");
  char why[256];
  if (hr__fake_ops()->peer_add(f->peer, (const uint8_t *)"fake", 4,
                               (const uint8_t *)"me", 2, NULL, 0,
                               &f->peer_handle, why, sizeof why) != 0)
    f->peer_handle = NULL;

  /* The tensor: n UINT8 buffers. */
  unsigned n = take(&in) % 5;
  hr_descriptor *d = &f->desc;
  d->descriptor_version = 1;
  d->element_type = HR_ELEM_UINT8;
  d->rank = 1;
  d->layout.tag = HR_LAYOUT_ROW_MAJOR;
  d->buffer_count = (uint8_t)n;
  uint64_t sum = 0;
  for (unsigned k = 0; k < n; k++) {
    uint64_t sz = (uint64_t)take(&in) * 8;
    d->buffers[k].size_bytes = sz;
    d->buffers[k].alignment_log2 = take(&in) % 8;
    uint8_t sm = take(&in);
    d->buffers[k].sync_mode = (sm & 0xF0) == 0xF0 ? sm & 3 : 0;
    f->buf[k] = calloc(1, sz ? sz : 1);
    if (f->buf[k] == NULL)
      hr_fuzz_fail("out of memory");
    sum += sz;
  }
  d->shape[0] = sum;
  f->total = sum;
  if (more & 4) {
    uint16_t t = (uint16_t)(take(&in) << 8);
    f->total = t | take(&in);
  }

  hr_rdma_config c;
  memset(&c, 0, sizeof c);
  c.side = f->side;
  c.direction = f->dir;
  c.stream_id = STREAM;
  c.desc = d;
  c.total_data_bytes = f->total;
  c.buffers = (void *const *)f->buf;
  c.register_destination = (flags >> 2) & 1;
  c.release = on_release;
  c.release_ctx = f;
  hr_wire_status st;
  memset(&st, 0, sizeof st);
  int rv = hr_rdma_new(&f->x, f->conn, &c, &cbs, f, NULL, &st, why, sizeof why);
  int made = rv == 0;
  if (rv == HR_ERR_PROTO) {
    if (f->side != HR_RDMA_RECEIVER)
      hr_fuzz_fail("hr_rdma_new: HR_ERR_PROTO on the sender");
    hr_fuzz_check_rejection(rv, &st);
  } else if (rv != 0 && rv != HR_ERR_UNSUPPORTED &&
             rv != HR_ERR_INVALID_ARGUMENT) {
    hr_fuzz_fail("hr_rdma_new: an undocumented return");
  } else if (rv == HR_ERR_UNSUPPORTED && f->side != HR_RDMA_SENDER) {
    hr_fuzz_fail("hr_rdma_new: HR_ERR_UNSUPPORTED on the receiver");
  }

  while (made && in.n > 0) {
    uint8_t cmd = take(&in);
    unsigned op = cmd >> 5, arg = cmd & 31;
    switch (op) {
    case 0: deliver(f, &in, arg); break;
    case 1:
      if (arg == 0)
        hr__fake_progress(f->me);
      else
        hr__fake_progress_one(f->me);
      break;
    case 2: hr__fake_progress(f->peer); break;
    case 3: peer_register(f, &in, arg); break;
    case 4: peer_tagged(f, &in, arg); break;
    case 5: poke(f, &in); break;
    case 6: fault(f, arg); break;
    default: call(f, &in, arg); break;
    }
  }

  /* Teardown, as the session does it: delete, let the fabric finish. */
  hr_rdma_del(f->x);
  f->x = NULL;
  progress_all(f);
  for (int i = 0; i < PEER_OPS; i++)
    if (f->ops[i].active)
      hr__fake_ops()->cancel(f->peer, &f->ops[i].op);
  progress_all(f);
  if (made && f->released != 1)
    hr_fuzz_fail("release did not run exactly once");
  if (!made && f->released != 0)
    hr_fuzz_fail("release ran for a handshake never made");
  hr__fake_stats s;
  hr__fake_get_stats(f->me, &s);
  if (s.live_regs != 0)
    hr_fuzz_fail("a remote registration outlived its handshake");
  for (unsigned i = 0; i < PEER_OPS; i++)
    if (f->ops[i].active)
      hr_fuzz_fail("a cancelled peer operation never ended");
  hr_rdma_conn_del(f->conn);
  for (int i = 0; i < f->npeer; i++)
    hr__fake_ops()->dereg(f->peer, f->peer_mr[i]);
  if (f->peer_handle)
    hr__fake_ops()->peer_del(f->peer, f->peer_handle);
  hr__fake_ep_del(f->me);
  hr__fake_ep_del(f->peer);
  hr__fake_world_del(f->w);
  for (unsigned k = 0; k < HR_MAX_BUFFERS; k++)
    free(f->buf[k]);
  free(f);
  return 0;
}
