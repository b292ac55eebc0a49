/*
 * The RDMA handshake (docs/protocol.md § 16), sans-IO.
 *
 * One hr_rdma drives one tensor's handshake on one stream, on either side:
 *
 *   sender (source owner)                 receiver
 *   PREPARED --start: REGISTER(SOURCE)--> AWAIT_SOURCE
 *   AWAIT_READY <--REGISTER(DEST)?------- (registers a destination, or
 *              <--READY---------------    posts the tagged receives)
 *   TRANSFER   ==RMA write / tagged sends==>            AWAIT_END
 *   (own CQ reports the op) --DATA_END--> (DATA_END and own receives)
 *   GET: DONE                             GET: DONE
 *   PUT: AWAIT_ACK <--PUT_ACK/ERROR------ PUT: AWAIT_COMMIT --commit-->
 *
 * Any state can end in FAILED: an ERROR either way, a protocol fault
 * (answered with PROTOCOL_VIOLATION), a fabric failure, or an abort.
 *
 * Messages go out through cbs.send_msg; outcomes come back as events.
 * Fabric work goes through the connection's hr_fabric_ops.  The remote
 * registration of a transfer (the SOURCE key on the sender, the
 * DESTINATION key on the receiver) is revoked as soon as the transfer no
 * longer needs it, so that a finished transfer's key opens nothing.
 *
 * Lifetime: the object may be deleted from its own callbacks (the delete is
 * deferred to the end of the outermost call), and it outlives
 * hr_rdma_del() while the backend still runs an operation on its buffers;
 * the release callback marks the end of that.
 */
#include <string.h>

#include "hr_fab_int.h"

/* ------------------------------------------------------------------------ */
/* The connection                                                            */
/* ------------------------------------------------------------------------ */

#define REASON_MAX 192

struct hr_rdma_conn {
  hr_mem mem;
  const hr_fabric_ops *ops;
  void *ctx;
  uint32_t local_caps;
  uint32_t peer_caps;
  uint64_t min_bytes;
  void *peer;     /* the backend's peer, NULL when not resolved */
  unsigned refs;  /* the owner's, plus one per hr_rdma */
  int owner_gone; /* hr_rdma_conn_del() was called */
  /* "" while usable; else why RDMA cannot run on this connection. */
  char unusable[REASON_MAX];
  /* "" until the source owner fell back to frames on this connection. */
  char fallback[REASON_MAX];
  /* "" until GPUDIRECT_UNAVAILABLE was met (no more destinations). */
  char no_dest[REASON_MAX];
};

void hr_rdma_conn_config_init(hr_rdma_conn_config *c, const hr_fabric_ops *ops,
                              void *ops_ctx, uint32_t local_caps,
                              const hr_hello *peer) {
  memset(c, 0, sizeof *c);
  c->version = HR_RDMA_CONN_CONFIG_VERSION;
  c->ops = ops;
  c->ops_ctx = ops_ctx;
  c->local_caps = local_caps;
  c->min_bytes = 64u << 10;
  if (peer) {
    c->peer_caps = peer->capability_flags;
    if (peer->exts.has_fabric_address) {
      c->peer_provider = peer->exts.fabric_provider;
      c->peer_provider_len = peer->exts.fabric_provider_len;
      c->peer_endpoint = peer->exts.fabric_endpoint;
      c->peer_endpoint_len = peer->exts.fabric_endpoint_len;
    }
  }
}

int hr_rdma_conn_new(hr_rdma_conn **out, const hr_rdma_conn_config *cfg,
                     const hr_mem *mem) {
  if (!out || !cfg || cfg->version < 1 || !cfg->ops ||
      cfg->ops->size < sizeof(hr_fabric_ops))
    return HR_ERR_INVALID_ARGUMENT;
  if (!mem)
    mem = hr_mem_default();
  hr_rdma_conn *c = hr__mem_calloc(mem, 1, sizeof *c);
  if (!c)
    return HR_ERR_NOMEM;
  c->mem = *mem;
  c->ops = cfg->ops;
  c->ctx = cfg->ops_ctx;
  c->local_caps = cfg->local_caps;
  c->peer_caps = cfg->peer_caps;
  c->min_bytes = cfg->min_bytes;
  c->refs = 1;
  if (!(cfg->local_caps & HR_CAP_RDMA_DATA_PLANE)) {
    hr__fab_why(c->unusable, sizeof c->unusable,
                "RDMA_DATA_PLANE is not in our HELLO");
  } else if (!(cfg->peer_caps & HR_CAP_RDMA_DATA_PLANE)) {
    hr__fab_why(c->unusable, sizeof c->unusable,
                "the peer's HELLO lacks RDMA_DATA_PLANE");
  } else if (!cfg->peer_provider || !cfg->peer_endpoint) {
    hr__fab_why(c->unusable, sizeof c->unusable,
                "the peer's HELLO lacks FABRIC_ADDRESS");
  } else {
    char why[REASON_MAX - 40] = "";
    int rv = c->ops->peer_add(c->ctx, cfg->peer_provider,
                              cfg->peer_provider_len, cfg->peer_endpoint,
                              cfg->peer_endpoint_len, cfg->ctl_addr,
                              cfg->ctl_addr_len, &c->peer, why, sizeof why);
    if (rv == HR_ERR_NOMEM) {
      hr__mem_free(mem, c);
      return rv;
    }
    if (rv != 0) {
      c->peer = NULL;
      hr__fab_why(c->unusable, sizeof c->unusable,
                  "the peer's fabric address is unusable: %s", why);
    }
  }
  *out = c;
  return 0;
}

static void conn_unref(hr_rdma_conn *c) {
  if (--c->refs)
    return;
  if (c->peer)
    c->ops->peer_del(c->ctx, c->peer);
  hr__mem_free(&c->mem, c);
}

void hr_rdma_conn_del(hr_rdma_conn *c) {
  if (!c || c->owner_gone)
    return;
  c->owner_gone = 1;
  conn_unref(c);
}

int hr_rdma_conn_usable(const hr_rdma_conn *c, const char **why) {
  const char *dummy;
  if (!why)
    why = &dummy;
  if (!c) {
    *why = "no RDMA state";
    return 0;
  }
  if (c->unusable[0]) {
    *why = c->unusable;
    return 0;
  }
  *why = "";
  return 1;
}

static int both_gpudirect(const hr_rdma_conn *c) {
  return (c->local_caps & HR_CAP_RDMA_GPUDIRECT) &&
         (c->peer_caps & HR_CAP_RDMA_GPUDIRECT);
}

int hr_rdma_conn_gpudirect(const hr_rdma_conn *c, const char **why) {
  const char *dummy;
  if (!why)
    why = &dummy;
  if (!hr_rdma_conn_usable(c, why))
    return 0;
  if (!both_gpudirect(c)) {
    *why = "RDMA_GPUDIRECT is not in both HELLOs";
    return 0;
  }
  if (c->no_dest[0]) {
    *why = c->no_dest;
    return 0;
  }
  *why = "";
  return 1;
}

const char *hr_rdma_conn_fallback(const hr_rdma_conn *c) {
  return c && c->fallback[0] ? c->fallback : NULL;
}

/* Every handle SYNC_PRODUCER_SYNCED (§ 16.6); returns the first other. */
static int first_bad_sync(const hr_descriptor *d) {
  for (unsigned k = 0; k < d->buffer_count && k < HR_MAX_BUFFERS; k++)
    if (d->buffers[k].sync_mode != HR_SYNC_PRODUCER_SYNCED)
      return (int)k;
  return -1;
}

int hr_rdma_conn_can_source(const hr_rdma_conn *c, const hr_descriptor *d,
                            uint64_t total, char *why, size_t why_cap) {
  const char *r;
  uint64_t offs[HR_MAX_BUFFERS];
  if (!c || !d) {
    hr__fab_why(why, why_cap, "no RDMA state");
    return 0;
  }
  if (!hr_rdma_conn_usable(c, &r)) {
    hr__fab_why(why, why_cap, "RDMA unusable: %s", r);
    return 0;
  }
  if (c->fallback[0]) {
    hr__fab_why(why, why_cap, "frames since: %s", c->fallback);
    return 0;
  }
  if (total == 0 || total < c->min_bytes) {
    hr__fab_why(why, why_cap,
                "%llu bytes is below the RDMA threshold of %llu bytes",
                (unsigned long long)total, (unsigned long long)c->min_bytes);
    return 0;
  }
  int k = first_bad_sync(d);
  if (k >= 0) {
    hr__fab_why(why, why_cap,
                "buffer %d is not SYNC_PRODUCER_SYNCED (sync_mode %u)", k,
                d->buffers[k].sync_mode);
    return 0;
  }
  if (hr_fabric_placement(d, total, offs, &r) != 0) {
    hr__fab_why(why, why_cap, "%s", r);
    return 0;
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* The handshake                                                             */
/* ------------------------------------------------------------------------ */

#define TEXT_MAX 256

struct hr_rdma {
  hr_mem mem;
  hr_rdma_conn *conn;
  hr_rdma_callbacks cbs;
  void *user_data;
  int side;
  int dir;
  uint32_t stream;
  uint64_t total;
  hr_fabric_region region;
  int state;
  int started;
  int register_destination; /* receiver: asked for, and allowed */
  /* The remote registration (SOURCE or DESTINATION), until revoked. */
  void *mr;
  hr_fabric_key key;
  /* Sender: the receiver's DESTINATION registration. */
  int have_dest;
  hr_fabric_key dest;
  /* The data operation. */
  hr_fabric_op op;
  int op_active; /* started, `done` not called yet */
  int op_ok;     /* it ended with status 0 */
  int op_ended;
  int end_seen;        /* receiver: TENSOR_DATA_END arrived */
  int used_dest;       /* the bytes went into a destination registration */
  const char *refusal; /* receiver: why RDMA cannot take this tensor
                          (static text), or NULL */
  /* Lifetime. */
  unsigned depth; /* nesting of public calls and completion handlers */
  int deleted;    /* hr_rdma_del() was called */
  int released;
  void (*release)(void *);
  void *release_ctx;
  int fatal; /* a fatal error from send_msg, returned by the call */
  char text[TEXT_MAX];
  char fallback[TEXT_MAX];
};

static const char *const state_names[] = {
    "PREPARED",  "AWAIT_SOURCE", "AWAIT_READY", "TRANSFER", "AWAIT_END",
    "AWAIT_ACK", "AWAIT_COMMIT", "DONE",        "FAILED"};
_Static_assert(sizeof state_names / sizeof *state_names == HR_RDMA_ST_COUNT,
               "one name per state");

const char *hr_rdma_state_name(int state) {
  if (state < 0 || state >= HR_RDMA_ST_COUNT)
    return "UNKNOWN";
  return state_names[state];
}

int hr_rdma_state(const hr_rdma *x) {
  return x ? x->state : -1;
}

static int terminal(const hr_rdma *x) {
  return x->state == HR_RDMA_ST_DONE || x->state == HR_RDMA_ST_FAILED;
}

/* ---- messages out ---- */

static int send_msg(hr_rdma *x, hr_msg *m) {
  if (x->deleted)
    return 0;
  m->hdr.stream_id = x->stream;
  int rv = x->cbs.send_msg(x, m, x->user_data);
  if (rv != 0 && hr_err_is_fatal(rv) && !x->fatal)
    x->fatal = rv;
  return rv;
}

static int send_empty(hr_rdma *x, uint32_t type) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = type;
  return send_msg(x, &m);
}

static int send_register(hr_rdma *x, uint8_t role, const hr_fabric_key *k) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_RDMA_REGISTER;
  m.u.rdma.role = role;
  m.u.rdma.length = x->total;
  m.u.rdma.address = k->address;
  m.u.rdma.key = k->key;
  m.u.rdma.raw_key = k->raw_key_len ? k->raw_key : NULL;
  m.u.rdma.raw_key_len = k->raw_key_len;
  return send_msg(x, &m);
}

static int send_error(hr_rdma *x, uint32_t code, const char *text) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_ERROR;
  m.u.error.code = code;
  m.u.error.message = (const uint8_t *)text;
  m.u.error.message_len = (uint16_t)strlen(text);
  return send_msg(x, &m);
}

/* ---- events ---- */

static void emit(hr_rdma *x, int kind, uint32_t code, int sent, int retry) {
  if (x->deleted)
    return;
  hr_rdma_event ev;
  memset(&ev, 0, sizeof ev);
  ev.kind = kind;
  ev.stream_id = x->stream;
  ev.wire_error = code;
  ev.wire_error_sent = sent;
  ev.message = kind == HR_RDMA_EV_FAILED ? x->text : "";
  ev.fallback = x->fallback;
  ev.retry = retry;
  ev.destination = x->used_dest;
  ev.bytes = kind == HR_RDMA_EV_FAILED ? 0 : x->total;
  x->cbs.on_event(x, &ev, x->user_data);
}

/* ---- resources ---- */

static void revoke(hr_rdma *x) {
  if (x->mr) {
    x->conn->ops->dereg(x->conn->ctx, x->mr);
    x->mr = NULL;
  }
}

static void cancel_op(hr_rdma *x) {
  if (x->op_active)
    x->conn->ops->cancel(x->conn->ctx, &x->op);
}

/* Calls the release callback once nothing references the buffers. */
static void maybe_release(hr_rdma *x) {
  if (x->released || x->op_active || x->mr)
    return;
  if (!terminal(x) && !x->deleted)
    return;
  x->released = 1;
  if (x->release)
    x->release(x->release_ctx);
}

static void destroy(hr_rdma *x) {
  hr_rdma_conn *c = x->conn;
  hr__mem_free(&x->mem, x);
  conn_unref(c);
}

/* Ends a public call or a completion handler: runs a deferred delete. */
static int leave(hr_rdma *x) {
  int rv = x->fatal;
  x->fatal = 0;
  if (--x->depth == 0 && x->deleted) {
    cancel_op(x);
    revoke(x);
    maybe_release(x);
    if (!x->op_active)
      destroy(x);
  }
  return rv;
}

/* ---- endings ---- */

/* Ends the handshake with an ERROR we send: cancels the operation, revokes
 * the key, reports FAILED. */
static void fail_sent(hr_rdma *x, uint32_t code, int retry) {
  cancel_op(x);
  revoke(x);
  x->state = HR_RDMA_ST_FAILED;
  hr__fab_ascii(x->text);
  send_error(x, code, x->text);
  maybe_release(x);
  emit(x, HR_RDMA_EV_FAILED, code, 1, retry);
}

/* A message that breaks the handshake: PROTOCOL_VIOLATION. */
static int violation(hr_rdma *x, const char *what) {
  hr__fab_why(x->text, sizeof x->text, "%s", what);
  fail_sent(x, HR_WIRE_PROTOCOL_VIOLATION, 0);
  return 0;
}

/* The receiver cannot take the transfer over RDMA (§ 16.3). */
static void fail_setup(hr_rdma *x, const char *what) {
  hr__fab_why(x->text, sizeof x->text, "RDMA setup failed: %s", what);
  hr__fab_why(x->fallback, sizeof x->fallback,
              "RDMA setup failed here (%s); the peer sends frames on a "
              "retry",
              what);
  fail_sent(x, HR_WIRE_RDMA_SETUP_FAILED, 1);
}

/* The source owner stops using RDMA on this connection (§ 25.2). */
static void conn_fall_back(hr_rdma *x, const char *what) {
  hr_rdma_conn *c = x->conn;
  if (!c->fallback[0])
    hr__fab_why(c->fallback, sizeof c->fallback, "%s", what);
  hr__fab_why(x->fallback, sizeof x->fallback,
              "%s; frames from now on on this connection", what);
}

/* An ERROR from the peer ends the stream. */
static void on_peer_error(hr_rdma *x, const hr_msg *m) {
  uint32_t code = m->u.error.code;
  size_t n = m->u.error.message_len;
  if (n >= sizeof x->text)
    n = sizeof x->text - 1;
  if (n)
    memcpy(x->text, m->u.error.message, n);
  x->text[n] = 0;
  int retry = 0;
  if (code == HR_WIRE_RDMA_SETUP_FAILED) {
    retry = 1;
    if (x->side == HR_RDMA_SENDER) {
      char what[TEXT_MAX];
      hr__fab_why(what, sizeof what, "RDMA_SETUP_FAILED from the peer: %s",
                  x->text);
      hr__fab_ascii(what);
      conn_fall_back(x, what);
    } else {
      hr__fab_why(x->fallback, sizeof x->fallback,
                  "the peer's RDMA transfer failed; it sends frames on a "
                  "retry");
    }
  } else if (code == HR_WIRE_GPUDIRECT_UNAVAILABLE &&
             x->side == HR_RDMA_RECEIVER) {
    retry = 1;
    hr_rdma_conn *c = x->conn;
    if (!c->no_dest[0]) {
      hr__fab_why(c->no_dest, sizeof c->no_dest,
                  "GPUDIRECT_UNAVAILABLE from the peer: %s", x->text);
      hr__fab_ascii(c->no_dest);
    }
    hr__fab_why(x->fallback, sizeof x->fallback,
                "GPUDIRECT_UNAVAILABLE from the peer; no destination "
                "registration from now on on this connection");
  }
  cancel_op(x);
  revoke(x);
  x->state = HR_RDMA_ST_FAILED;
  maybe_release(x);
  emit(x, HR_RDMA_EV_FAILED, code, 0, retry);
}

/* Receiver: every byte is in place. */
static void data_ready(hr_rdma *x) {
  revoke(x);
  if (x->dir == HR_RDMA_GET) {
    x->state = HR_RDMA_ST_DONE;
    maybe_release(x);
    emit(x, HR_RDMA_EV_COMPLETE, 0, 0, 0);
  } else {
    x->state = HR_RDMA_ST_AWAIT_COMMIT;
    emit(x, HR_RDMA_EV_DATA_READY, 0, 0, 0);
  }
}

/* ---- the data operation's completion ---- */

static void op_done(hr_fabric_op *op, int status, const char *why) {
  hr_rdma *x = op->user_data;
  x->op_active = 0;
  x->op_ended = 1;
  x->op_ok = status == 0;
  x->depth++;
  if (x->deleted || terminal(x)) {
    /* Cancelled by an ending: only the release was waiting for this. */
    maybe_release(x);
  } else if (x->side == HR_RDMA_SENDER) {
    if (status == 0) {
      revoke(x);
      send_empty(x, HR_MSG_TENSOR_DATA_END);
      if (x->dir == HR_RDMA_GET) {
        x->state = HR_RDMA_ST_DONE;
        maybe_release(x);
        emit(x, HR_RDMA_EV_COMPLETE, 0, 0, 0);
      } else {
        x->state = HR_RDMA_ST_AWAIT_ACK;
        maybe_release(x);
      }
    } else {
      char what[TEXT_MAX];
      hr__fab_why(what, sizeof what, "%s failed: %s",
                  x->used_dest ? "the RMA write into the destination"
                               : "the tagged sends",
                  why ? why : hr_strerror(status));
      hr__fab_ascii(what);
      hr__fab_why(x->text, sizeof x->text, "%s", what);
      conn_fall_back(x, what);
      fail_sent(x,
                x->used_dest ? HR_WIRE_GPUDIRECT_UNAVAILABLE
                             : HR_WIRE_RDMA_SETUP_FAILED,
                1);
    }
  } else {
    if (status == 0) {
      if (x->end_seen)
        data_ready(x);
    } else {
      char what[TEXT_MAX];
      hr__fab_why(what, sizeof what, "receiving the tagged messages failed: %s",
                  why ? why : hr_strerror(status));
      fail_setup(x, what);
    }
  }
  leave(x);
}

static int start_op(hr_rdma *x, int kind, char *why, size_t cap) {
  const hr_fabric_ops *ops = x->conn->ops;
  memset(&x->op, 0, sizeof x->op);
  x->op.done = op_done;
  x->op.user_data = x;
  int rv;
  if (kind == 0)
    rv = ops->write(x->conn->ctx, x->conn->peer, &x->region, &x->dest, &x->op,
                    why, cap);
  else if (kind == 1)
    rv = ops->send(x->conn->ctx, x->conn->peer, x->stream, &x->region, &x->op,
                   why, cap);
  else
    rv = ops->recv(x->conn->ctx, x->conn->peer, x->stream, &x->region, &x->op,
                   why, cap);
  if (rv == 0)
    x->op_active = 1;
  return rv;
}

/* ------------------------------------------------------------------------ */
/* Creation                                                                  */
/* ------------------------------------------------------------------------ */

int hr_rdma_new(hr_rdma **out, hr_rdma_conn *c, const hr_rdma_config *cfg,
                const hr_rdma_callbacks *cbs, void *user_data,
                const hr_mem *mem, hr_wire_status *st, char *why,
                size_t why_cap) {
  if (!out || !c || !cfg || !cfg->desc || !cbs ||
      cbs->size < sizeof(hr_rdma_callbacks) || !cbs->send_msg ||
      !cbs->on_event || cfg->stream_id == 0 ||
      (cfg->side != HR_RDMA_SENDER && cfg->side != HR_RDMA_RECEIVER) ||
      (cfg->direction != HR_RDMA_GET && cfg->direction != HR_RDMA_PUT) ||
      cfg->desc->buffer_count > HR_MAX_BUFFERS ||
      (cfg->desc->buffer_count && !cfg->buffers)) {
    hr__fab_why(why, why_cap, "invalid arguments");
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (!mem)
    mem = hr_mem_default();
  const hr_descriptor *d = cfg->desc;
  int bad = first_bad_sync(d);
  if (cfg->side == HR_RDMA_RECEIVER) {
    /* Peer faults the decoder may not have caught (a LOCAL descriptor
     * handed over, or a caller that skipped it). */
    if (bad >= 0) {
      hr__fab_why(why, why_cap, "buffer %d has sync_mode %u", bad,
                  d->buffers[bad].sync_mode);
      return hr__wire_fail(st, HR_WIRE_INVALID_SYNC_MODE, 0,
                           "descriptor.buffers[].sync_mode: only "
                           "SYNC_PRODUCER_SYNCED crosses the RDMA data plane");
    }
    if (!(c->local_caps & HR_CAP_RDMA_DATA_PLANE) ||
        !(c->peer_caps & HR_CAP_RDMA_DATA_PLANE)) {
      hr__fab_why(why, why_cap, "RDMA not negotiated");
      return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                           "data_plane: RDMA without RDMA_DATA_PLANE in "
                           "both HELLOs");
    }
  } else if (bad >= 0) {
    hr__fab_why(why, why_cap,
                "buffer %d is not SYNC_PRODUCER_SYNCED (sync_mode %u)", bad,
                d->buffers[bad].sync_mode);
    return HR_ERR_INVALID_ARGUMENT;
  }

  hr_rdma *x = hr__mem_calloc(mem, 1, sizeof *x);
  if (!x) {
    hr__fab_why(why, why_cap, "out of memory");
    return HR_ERR_NOMEM;
  }
  x->mem = *mem;
  x->conn = c;
  x->cbs = *cbs;
  x->user_data = user_data;
  x->side = cfg->side;
  x->dir = cfg->direction;
  x->stream = cfg->stream_id;
  x->total = cfg->total_data_bytes;
  x->release = cfg->release;
  x->release_ctx = cfg->release_ctx;
  int rv = hr__fab_region_build(d, cfg->buffers, &x->region);
  if (rv != 0) {
    hr__mem_free(mem, x);
    hr__fab_why(why, why_cap, "a NULL buffer of non-zero size");
    return rv;
  }

  if (x->side == HR_RDMA_SENDER) {
    char r[TEXT_MAX];
    if (!hr_rdma_conn_can_source(c, d, x->total, r, sizeof r)) {
      hr__mem_free(mem, x);
      hr__fab_why(why, why_cap, "%s", r);
      return HR_ERR_UNSUPPORTED;
    }
    rv = c->ops->reg(c->ctx, &x->region, HR_FABRIC_REMOTE_READ, &x->key, &x->mr,
                     r, sizeof r);
    if (rv != 0) {
      hr__mem_free(mem, x);
      hr__fab_why(why, why_cap, "registering the source failed: %s", r);
      return rv == HR_ERR_NOMEM ? rv : HR_ERR_UNSUPPORTED;
    }
    x->state = HR_RDMA_ST_PREPARED;
  } else {
    const char *r;
    uint64_t offs[HR_MAX_BUFFERS];
    /* A placement with gaps cannot be received (§ 25.2): refused at
     * hr_rdma_start() with RDMA_SETUP_FAILED, like any setup failure. */
    if (hr_fabric_placement(d, x->total, offs, &r) != 0)
      x->refusal = r;
    x->register_destination =
        cfg->register_destination && hr_rdma_conn_gpudirect(c, &r);
    x->state = HR_RDMA_ST_AWAIT_SOURCE;
  }
  c->refs++;
  *out = x;
  return 0;
}

int hr_rdma_start(hr_rdma *x) {
  if (!x || x->deleted)
    return HR_ERR_INVALID_ARGUMENT;
  if (x->started || terminal(x))
    return HR_ERR_STATE;
  x->started = 1;
  x->depth++;
  if (x->side == HR_RDMA_SENDER) {
    x->state = HR_RDMA_ST_AWAIT_READY;
    send_register(x, HR_RDMA_SOURCE, &x->key);
  } else {
    const char *r;
    if (!hr_rdma_conn_usable(x->conn, &r))
      fail_setup(x, r);
    else if (x->refusal)
      fail_setup(x, x->refusal);
  }
  return leave(x);
}

/* ------------------------------------------------------------------------ */
/* Messages in                                                               */
/* ------------------------------------------------------------------------ */

static void sender_on_msg(hr_rdma *x, const hr_msg *m) {
  uint32_t t = m->hdr.type;
  if (t == HR_MSG_ERROR) {
    on_peer_error(x, m);
    return;
  }
  if (x->state == HR_RDMA_ST_AWAIT_READY) {
    if (t == HR_MSG_RDMA_REGISTER) {
      const hr_rdma_register *r = &m->u.rdma;
      if (r->role != HR_RDMA_DESTINATION) {
        violation(x, "RDMA_REGISTER.role: the receiver registers a "
                     "DESTINATION");
      } else if (x->have_dest) {
        violation(x, "RDMA_REGISTER: a second DESTINATION registration");
      } else if (!both_gpudirect(x->conn)) {
        violation(x, "RDMA_REGISTER: a DESTINATION registration without "
                     "RDMA_GPUDIRECT in both HELLOs");
      } else if (r->length != x->total) {
        violation(x, "RDMA_REGISTER.length: a DESTINATION's length must "
                     "equal total_data_bytes");
      } else {
        x->have_dest = 1;
        x->dest.length = r->length;
        x->dest.address = r->address;
        x->dest.key = r->key;
        /* An over-long raw key is kept truncated to 0 so that the write
         * refuses it (GPUDIRECT_UNAVAILABLE, rule 5). */
        if (r->raw_key_len <= HR_FABRIC_RAW_KEY_MAX) {
          x->dest.raw_key_len = r->raw_key_len;
          if (r->raw_key_len)
            memcpy(x->dest.raw_key, r->raw_key, r->raw_key_len);
        } else {
          x->dest.raw_key_len = UINT16_MAX;
        }
      }
      return;
    }
    if (t == HR_MSG_RDMA_READY) {
      char why[TEXT_MAX - 64] = "";
      int rv;
      if (x->have_dest) {
        x->used_dest = 1;
        rv = x->dest.raw_key_len == UINT16_MAX
                 ? (hr__fab_why(why, sizeof why, "raw key too long"),
                    HR_ERR_UNSUPPORTED)
                 : start_op(x, 0, why, sizeof why);
        if (rv != 0) {
          hr__fab_ascii(why);
          hr__fab_why(x->text, sizeof x->text,
                      "cannot write into the destination registration: %s",
                      why);
          hr__fab_why(x->fallback, sizeof x->fallback,
                      "GPUDIRECT_UNAVAILABLE sent: %s", why);
          fail_sent(x, HR_WIRE_GPUDIRECT_UNAVAILABLE, 1);
          return;
        }
      } else {
        rv = start_op(x, 1, why, sizeof why);
        if (rv != 0) {
          char what[TEXT_MAX];
          hr__fab_ascii(why);
          hr__fab_why(what, sizeof what, "the tagged sends failed: %s", why);
          hr__fab_why(x->text, sizeof x->text, "%s", what);
          conn_fall_back(x, what);
          fail_sent(x, HR_WIRE_RDMA_SETUP_FAILED, 1);
          return;
        }
      }
      x->state = HR_RDMA_ST_TRANSFER;
      return;
    }
    violation(x, t == HR_MSG_TENSOR_DATA_END || t == HR_MSG_TENSOR_PUT_ACK
                     ? "a message of the receiver's direction reached the "
                       "RDMA sender before RDMA_READY"
                     : "a message out of order in the RDMA handshake: "
                       "RDMA_READY expected");
    return;
  }
  if (x->state == HR_RDMA_ST_TRANSFER) {
    violation(x, "a message on the stream during the RDMA transfer");
    return;
  }
  /* AWAIT_ACK (PUT) */
  if (t == HR_MSG_TENSOR_PUT_ACK) {
    x->state = HR_RDMA_ST_DONE;
    maybe_release(x);
    emit(x, HR_RDMA_EV_COMPLETE, 0, 0, 0);
    return;
  }
  violation(x, "TENSOR_PUT_ACK or ERROR expected after TENSOR_DATA_END");
}

static void receiver_on_source(hr_rdma *x, const hr_rdma_register *r) {
  if (r->role != HR_RDMA_SOURCE) {
    violation(x, "RDMA_REGISTER.role: the source owner registers a SOURCE "
                 "first");
    return;
  }
  if (r->length < x->total) {
    violation(x, "RDMA_REGISTER.length: shorter than total_data_bytes");
    return;
  }
  char why[TEXT_MAX - 64] = "";
  if (x->register_destination && x->total > 0) {
    int rv = x->conn->ops->reg(x->conn->ctx, &x->region, HR_FABRIC_REMOTE_WRITE,
                               &x->key, &x->mr, why, sizeof why);
    if (rv == 0) {
      x->used_dest = 1;
      send_register(x, HR_RDMA_DESTINATION, &x->key);
    } else {
      /* § 16.4: the receiver may proceed without GPUDirect. */
      hr__fab_ascii(why);
      hr__fab_why(x->fallback, sizeof x->fallback,
                  "destination registration failed (%s); tagged sends", why);
      x->mr = NULL;
    }
  }
  if (!x->used_dest && x->total > 0) {
    int rv = start_op(x, 2, why, sizeof why);
    if (rv != 0) {
      char what[TEXT_MAX - 32];
      hr__fab_ascii(why);
      hr__fab_why(what, sizeof what, "posting the receives failed: %s", why);
      fail_setup(x, what);
      return;
    }
  }
  x->state = HR_RDMA_ST_AWAIT_END;
  send_empty(x, HR_MSG_RDMA_READY);
}

static void receiver_on_msg(hr_rdma *x, const hr_msg *m) {
  uint32_t t = m->hdr.type;
  if (t == HR_MSG_ERROR) {
    on_peer_error(x, m);
    return;
  }
  switch (x->state) {
  case HR_RDMA_ST_AWAIT_SOURCE:
    if (t == HR_MSG_RDMA_REGISTER) {
      receiver_on_source(x, &m->u.rdma);
    } else if (t == HR_MSG_TENSOR_DATA_END && x->total == 0) {
      /* An empty tensor needs no registration (hr_rx agrees). */
      x->end_seen = 1;
      data_ready(x);
    } else {
      violation(x, t == HR_MSG_TENSOR_DATA_END
                       ? "TENSOR_DATA_END of an RDMA transfer before "
                         "RDMA_REGISTER"
                       : "RDMA_REGISTER (SOURCE) expected");
    }
    return;
  case HR_RDMA_ST_AWAIT_END:
    if (t == HR_MSG_TENSOR_DATA_END) {
      x->end_seen = 1;
      /* With a destination the sender's completion covers the bytes; the
       * tagged path also waits for our own receives (§ 16.6). */
      if (x->used_dest || x->total == 0 || (x->op_ended && x->op_ok))
        data_ready(x);
      return;
    }
    violation(x, t == HR_MSG_RDMA_REGISTER
                     ? "RDMA_REGISTER after RDMA_READY"
                     : "TENSOR_DATA_END or ERROR expected after RDMA_READY");
    return;
  default: /* AWAIT_COMMIT */
    violation(x, "a message on the PUT stream after TENSOR_DATA_END");
    return;
  }
}

int hr_rdma_on_msg(hr_rdma *x, const hr_msg *m) {
  if (!x || !m || x->deleted)
    return HR_ERR_INVALID_ARGUMENT;
  if (terminal(x))
    return HR_ERR_STATE;
  x->depth++;
  if (m->hdr.type == HR_MSG_CANCEL) {
    violation(x, "CANCEL is the session's to handle");
  } else if (!x->started && m->hdr.type != HR_MSG_ERROR) {
    violation(x, "a message before the handshake started");
  } else if (x->side == HR_RDMA_SENDER) {
    sender_on_msg(x, m);
  } else {
    receiver_on_msg(x, m);
  }
  return leave(x);
}

int hr_rdma_commit(hr_rdma *x, uint32_t wire_error, const char *message) {
  if (!x || x->deleted)
    return HR_ERR_INVALID_ARGUMENT;
  if (x->state != HR_RDMA_ST_AWAIT_COMMIT)
    return HR_ERR_STATE;
  x->depth++;
  if (wire_error == 0) {
    x->state = HR_RDMA_ST_DONE;
    send_empty(x, HR_MSG_TENSOR_PUT_ACK);
    maybe_release(x);
    emit(x, HR_RDMA_EV_COMPLETE, 0, 0, 0);
  } else {
    hr__fab_why(x->text, sizeof x->text, "%s", message ? message : "");
    fail_sent(x, wire_error, 0);
  }
  return leave(x);
}

int hr_rdma_abort(hr_rdma *x, uint32_t wire_error, const char *message) {
  if (!x || x->deleted)
    return HR_ERR_INVALID_ARGUMENT;
  if (terminal(x))
    return HR_ERR_STATE;
  x->depth++;
  hr__fab_why(x->text, sizeof x->text, "%s", message ? message : "");
  if (wire_error) {
    fail_sent(x, wire_error, 0);
  } else {
    cancel_op(x);
    revoke(x);
    x->state = HR_RDMA_ST_FAILED;
    maybe_release(x);
    emit(x, HR_RDMA_EV_FAILED, 0, 0, 0);
  }
  return leave(x);
}

void hr_rdma_del(hr_rdma *x) {
  if (!x || x->deleted)
    return;
  x->deleted = 1;
  x->depth++;
  leave(x);
}
