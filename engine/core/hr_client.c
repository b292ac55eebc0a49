/*
 * Client streams: GET, PUT, LIST, PING, CANCEL.
 *
 * Requests made before the handshake completes are encoded at once and
 * sent when the SERVER_HELLO arrives, in stream id order.  A GET owns the
 * whole block of ids it reserved; its answer is checked by hr_rx and lands
 * in place (hr_recv.c).  A GET completes exactly once: with the tensor,
 * with the peer's ERROR, with a local error (then we send ERROR on the
 * stream so the server stops), or when the session ends.  Anything that
 * arrives later on its ids is dropped silently.
 *
 * CANCEL sends CANCEL on every id of the block; the GET then completes on
 * the first ERROR (normally CANCELLED) or with its result if that won the
 * race.
 */
#include <string.h>

#include "hr_session_int.h"

static int state_ok(const hr_session *s) {
  return s->role == HR_ROLE_CLIENT && !s->fatal && !s->deleted &&
         (s->state == HR_CS_AWAIT_HELLO || s->state == HR_CS_ESTABLISHED) &&
         !s->goaway_recv && !s->goaway_sent;
}

static int key_ok(const uint8_t *k, size_t n, int allow_empty) {
  if (n > HR_MAX_KEY || (!n && !allow_empty) || (n && !k))
    return 0;
  return hr_utf8_valid(k, n);
}

/* Reserves ids [id, id + count). */
static int take_ids(hr_session *s, uint32_t count, uint32_t *first) {
  hr_ids *d = s->ids;
  uint64_t last = (uint64_t)d->next_id + count - 1;
  if (d->next_id == 0 || last > UINT32_MAX)
    return HR_ERR_LIMIT;
  *first = d->next_id;
  hr__hist_add(s, d->next_id, (uint32_t)last);
  d->next_id = last == UINT32_MAX ? 0 : (uint32_t)last + 1;
  return 0;
}

/* Encodes `m` into st->req; sent now when established, else at the
 * handshake. */
static int request_queue(hr_session *s, hr_stream *st, const hr_msg *m) {
  int64_t n = hr_wire_encoded_size(m);
  if (n < 0)
    return HR_ERR_INVALID_ARGUMENT;
  uint8_t *b = hr__mem_malloc(&s->mem, (size_t)n);
  if (!b)
    return HR_ERR_NOMEM;
  if (hr_wire_encode(m, b, (size_t)n) != n) {
    hr__mem_free(&s->mem, b);
    return HR_ERR_INTERNAL;
  }
  st->req = b;
  st->req_len = (size_t)n;
  if (s->state == HR_CS_ESTABLISHED) {
    if (st->req_len - HR_HEADER_SIZE > s->peer_max)
      return HR_ERR_INVALID_ARGUMENT;
    int rv = hr__out_bytes(s, st->req, st->req_len, 0);
    if (rv)
      return rv;
    st->req = NULL;
  }
  return 0;
}

/* ---- completion ---------------------------------------------------------- */

static void get_complete(hr_session *s, hr_stream *st, hr_tensor *t) {
  if (st->cb_done) {
    hr_tensor_unref(t);
    return;
  }
  /* The application may free the destination in the callback. */
  hr__io_fence_rx(s, st);
  st->cb_done = 1;
  st->rec.finished = s->now;
  st->rec.bytes = st->rv.bytes;
  if (st->lane_mask) {
    unsigned n = 0;
    for (uint64_t m = st->lane_mask; m; m &= m - 1)
      n++;
    st->rec.lanes = n;
  }
  if (!t && !s->set.strict_composites && st->rv.root &&
      st->rv.root->desc.layout.tag == HR_LAYOUT_COMPOSITE && st->rv.ndone) {
    st->rec.partial = st->rv.done_list;
    st->rec.partial_count = st->rv.ndone;
  }
  hr__report_transfer(s, &st->rec);
  if (st->cg.cb) {
    hr__cb_enter(s);
    st->cg.cb(s, st->id, t, &st->rec, st->cg.ud);
    hr__cb_leave(s);
  } else {
    hr_tensor_unref(t);
  }
  st->rec.partial = NULL;
  st->rec.partial_count = 0;
}

void hr__cli_get_deliver(hr_session *s, hr_stream *st, hr_tensor *t) {
  get_complete(s, st, t);
}

static void set_rec_error(hr_stream *st, int status, uint32_t wire, int sent,
                          const char *msg, size_t len) {
  st->rec.status = status;
  st->rec.wire_error = wire;
  st->rec.wire_error_sent = sent;
  hr__set_msg(st->rec.message, sizeof st->rec.message, msg, len);
}

void hr__cli_stream_fail(hr_session *s, hr_stream *st, int status,
                         uint32_t wire, int sent, const char *msg) {
  if (st->cb_done)
    return;
  set_rec_error(st, status, wire, sent, msg, msg ? strlen(msg) : 0);
  switch (st->kind) {
  case HR_SK_CLI_GET:
    get_complete(s, st, NULL);
    break;
  case HR_SK_CLI_PUT:
    st->cb_done = 1;
    st->rec.finished = s->now;
    if (hr__tx_park_put(s, st))
      break; /* when its staging copies landed (hr_devput.c) */
    hr__report_transfer(s, &st->rec);
    if (st->put_cb) {
      hr__cb_enter(s);
      st->put_cb(s, st->id, &st->rec, st->cb_ud);
      hr__cb_leave(s);
    }
    break;
  case HR_SK_CLI_LIST:
    st->cb_done = 1;
    if (st->list_cb) {
      hr__cb_enter(s);
      st->list_cb(s, status, wire, NULL, st->cb_ud);
      hr__cb_leave(s);
    }
    break;
  default:
    break;
  }
}

/* Ends a client stream with the peer's ERROR. */
static int on_peer_error(hr_session *s, hr_stream *st, const hr_msg *m) {
  uint32_t code =
      m->u.error.code > HR_WIRE_ERROR_LAST ? HR_WIRE_INTERNAL : m->u.error.code;
  set_rec_error(st, HR_ERR_REMOTE, code, 0, (const char *)m->u.error.message,
                m->u.error.message_len);
  char text[HR_MAX_TEXT + 1];
  hr__set_msg(text, sizeof text, (const char *)m->u.error.message,
              m->u.error.message_len);
  hr__cli_stream_fail(s, st, HR_ERR_REMOTE, code, 0, text);
  int rv = hr__cli_cancel_others(s, st, m->hdr.stream_id);
  if (rv)
    return rv;
  hr__discard_add(s, st->id, st->last);
  hr__stream_end(s, st);
  return 0;
}

/* CANCEL on the ids of a GET's block other than `except` (0: none): the
 * N shard streams when the answer told N, else the whole block (unused
 * ids are ignored by the server, § 18). */
int hr__cli_cancel_others(hr_session *s, hr_stream *st, uint32_t except) {
  if (st->kind != HR_SK_CLI_GET || st->last == st->id)
    return except == st->id
               ? 0
               : hr__fatal(s, hr__out_empty(s, HR_MSG_CANCEL, st->id));
  uint32_t last = st->last;
  if (st->rv.nshards && st->id + st->rv.nshards - 1 < last)
    last = st->id + st->rv.nshards - 1;
  for (uint32_t id = st->id; id <= last && id >= st->id; id++)
    if (id != except) {
      int rv = hr__out_empty(s, HR_MSG_CANCEL, id);
      if (rv)
        return hr__fatal(s, rv);
    }
  return 0;
}

/* ---- lanes -----------------------------------------------------------------
 */

/* Is shard i of GET `st` still to come? */
static int shard_pending(const hr_stream *st, uint32_t i) {
  return !(st->rv.shards && i < st->rv.nshards && st->rv.shards[i].ended);
}

/* May the server send a shard of GET `st` that is still to come on lane
 * `pos` (i mod L == pos)?  L is at least the lanes joined when it was
 * sent and at most the lanes there are now (joins on other connections may
 * overtake the request), so every L in that range counts.  Shard `pos`
 * itself lands there for any larger L. */
static int get_uses_lane(const hr_stream *st, unsigned pos, unsigned hi) {
  if (st->last == st->id)
    return pos == 0;
  uint32_t n = st->rv.nshards ? st->rv.nshards
               : st->rv.root  ? 1
                              : st->last - st->id + 1;
  unsigned lo = st->cg.lanes_lo > pos ? st->cg.lanes_lo : pos + 1;
  for (uint32_t i = pos; i < n; i++) {
    if (!shard_pending(st, i))
      continue;
    if (i == pos)
      return 1;
    for (unsigned l = lo; l <= hi; l++)
      if ((i - pos) % l == 0)
        return 1;
  }
  return 0;
}

void hr__cli_lane_lost(hr_session *s, unsigned pos) {
  unsigned hi = s->grp->nlanes + (s->grp->joining ? 1u : 0u);
  for (size_t i = s->ntab; i-- > 0;) {
    if (i >= s->ntab)
      continue;
    hr_stream *st = s->tab[i];
    if (st->kind != HR_SK_CLI_GET || st->cb_done || st->req ||
        !get_uses_lane(st, pos, hi))
      continue;
    hr__cli_stream_fail(s, st, HR_ERR_CLOSED, 0, 0,
                        "a lane carrying its shards closed");
    /* The shards on the other lanes would go on streaming. */
    int rv = hr__cli_cancel_others(s, st, 0);
    if (rv)
      return;
    hr__discard_add(s, st->id, st->last);
    hr__stream_end(s, st);
  }
}

/* The first closed lane's position (UINT32_MAX when none): shards at or
 * above it could land on it. */
static uint32_t first_closed_lane(const hr_session *s) {
  unsigned n = hr__lanes_now(s);
  for (unsigned i = 1; i < n; i++)
    if (!hr__lane_at(s, i))
      return i;
  return UINT32_MAX;
}

/* ---- GET ----------------------------------------------------------------- */

static int layout_listed(const hr_layout_entry *l, uint16_t n, uint8_t tag) {
  for (uint16_t i = 0; i < n; i++) {
    uint8_t t = l[i].tag;
    if (t == HR_LAYOUT_TILED_EXACT)
      t = HR_LAYOUT_TILED;
    else if (t == HR_LAYOUT_PERMUTED_EXACT)
      t = HR_LAYOUT_PERMUTED;
    if (t == tag)
      return 1;
  }
  return 0;
}

static int we_advertised(const hr_session *s, uint8_t dev) {
  if (!s->set.devices)
    return dev == HR_DEV_CPU;
  for (uint16_t i = 0; i < s->set.device_count; i++)
    if (s->set.devices[i] == dev)
      return 1;
  return 0;
}

/* Whether this client can land bytes on `dev` now.  This build lands them
 * in host memory only; a device backend would accept its own tags. */
static int can_land(const hr_session *s, uint8_t dev) {
  (void)s;
  return dev == HR_DEV_CPU;
}

static int get_descriptor_checks(hr_session *s, hr_stream *st, uint32_t sid,
                                 const hr_descriptor *d) {
  uint8_t dev = d->buffer_count ? d->buffers[0].device_tag : HR_DEV_CPU;
  /* Rule 6: a device (or memory class) we never advertised breaks the
   * server's rules; one we advertised but cannot take is declined. */
  for (unsigned k = 0; k < d->buffer_count; k++)
    if (!we_advertised(s, d->buffers[k].device_tag) ||
        (d->buffers[k].memory_class != HR_MEM_STANDARD &&
         !(d->buffers[k].memory_class == HR_MEM_PINNED &&
           hr__shm_dev_advertise(s))))
      return hr__stream_error(s, sid, HR_WIRE_PROTOCOL_VIOLATION,
                              "device or memory class never advertised");
  /* A GET into a device lands any placement there (the bytes come in
   * host frames either way). */
  if (!can_land(s, dev) && !st->rv.dev)
    return hr__stream_error(s, sid, HR_WIRE_DEVICE_UNAVAILABLE,
                            "this client receives CPU buffers only");
  if (d->layout.tag != HR_LAYOUT_COMPOSITE &&
      !layout_listed(st->cg.opts.layouts, st->cg.opts.layout_count,
                     d->layout.tag) &&
      !layout_listed(s->peer.layouts, s->peer.layout_count, d->layout.tag))
    return hr__stream_error(s, sid, HR_WIRE_PROTOCOL_VIOLATION,
                            "layout neither preferred nor advertised");
  if (st->rec.bytes == 0 && !st->rv.root && !st->rv.shards) {
    /* The first descriptor decides what the record reports. */
    st->rec.layout = d->layout.tag;
    st->rec.device = dev;
    if (dev != st->cg.opts.preferred_device)
      hr__set_msg(st->rec.fallback, sizeof st->rec.fallback,
                  "delivered on CPU, not on the preferred device", 45);
  }
  return 0;
}

/* Ends a GET that cannot go on for a local reason: tells the server
 * (`code` on the stream, CANCEL on its other shard streams), then fails the
 * request with `rc`. */
static int get_abandon(hr_session *s, hr_stream *st, uint32_t sid, int rc,
                       uint32_t code, const char *why) {
  int rv = hr__out_error(s, sid, code, why);
  if (rv == 0)
    rv = hr__cli_cancel_others(s, st, sid);
  if (rv)
    return hr__fatal(s, rv);
  hr__cli_stream_fail(s, st, rc, code, 1, why);
  hr__discard_add(s, st->id, st->last);
  hr__stream_end(s, st);
  return 0;
}

int hr__cli_get_abandon(hr_session *s, hr_stream *st, int rc, uint32_t code,
                        const char *why) {
  return get_abandon(s, st, st->id, rc, code, why);
}

static int get_local_fail(hr_session *s, hr_stream *st, uint32_t sid, int rc,
                          const hr_wire_status *ws) {
  if (rc == HR_ERR_PROTO)
    return hr__stream_error(s, sid, ws->code, ws->reason);
  if (rc == HR_ERR_LIMIT)
    /* The landing could not be had: say which one. */
    return get_abandon(s, st, sid, rc, HR_WIRE_RESOURCE_EXHAUSTED,
                       st->rv.dev   ? "device memory could not be allocated"
                       : st->rv.app ? "destination too small"
                                    : "no memory for the tensor");
  if (rc == HR_ERR_UNSUPPORTED)
    return get_abandon(s, st, sid, rc, HR_WIRE_INTERNAL,
                       "cannot assemble shards of this layout");
  return hr__fatal(s, rc);
}

static int cli_get_msg(hr_session *s, hr_stream *st, const hr_msg *m) {
  hr_wire_status ws = {0, 0, NULL};
  int rc;
  switch (m->hdr.type) {
  case HR_MSG_TENSOR_DESCRIPTOR:
    rc = get_descriptor_checks(s, st, m->hdr.stream_id, &m->u.tensor.desc);
    if (rc || st->ended) {
      /* Refused before its segment was claimed: close it here, or it
       * would look like a descriptor no message carries. */
      if (m->u.tensor.xport.data_plane == HR_PLANE_SHM)
        hr__shm_drop_fd(s, s->msg_start);
      return rc;
    }
    /* fall through */
  case HR_MSG_TENSOR_DATA:
  case HR_MSG_TENSOR_DATA_END:
    rc = hr__recv_msg(s, st, &st->rv, m, &ws);
    if (rc)
      return get_local_fail(s, st, m->hdr.stream_id, rc, &ws);
    if (st->rv.complete) {
      hr_tensor *t = hr__recv_take(&st->rv);
      if (st->rv.shards)
        st->rec.shards = st->rv.nshards;
      if (st->cg.has_dest && st->cg.dest.release && t) {
        /* The application's buffer is released with the tensor. */
        hr__tensor_set_release(t, st->cg.dest.release, st->cg.dest.release_ctx);
        st->cg.dest.release = NULL;
      }
      /* Imported device memory (hr_shm_dev.c) has no ring: as is. */
      if (st->rv.dev && t)
        return hr__devrx_finish(s, st, t);
      get_complete(s, st, t);
      hr__stream_end(s, st);
    }
    return 0;
  case HR_MSG_ERROR:
    return on_peer_error(s, st, m);
  default:
    return hr__stream_error(s, m->hdr.stream_id, HR_WIRE_PROTOCOL_VIOLATION,
                            "message not allowed on a GET stream");
  }
}

/* The end of hr_session_get/put/list: a request that failed before it was
 * sent vanishes without a callback, its id goes to *stream_id (may be
 * NULL) once it is queued, and a fatal error fails the session.  While
 * s->req_calls counts the call no completion callback runs: a request
 * that ends meanwhile is due at the session's next step (decision 78),
 * or, when the call fails after all, reported by its error alone.
 * Returns rv. */
static int request_end(hr_session *s, hr_stream *st, uint32_t id,
                       uint32_t *stream_id, int rv) {
  if (rv && st) {
    st->cb_done = 1;
    hr__stream_end(s, st);
    hr__put_tails_forget(s, id);
  }
  if (rv == 0 && stream_id)
    *stream_id = id;
  if (hr_err_is_fatal(rv))
    hr__fatal(s, rv);
  s->req_calls--;
  hr__api_leave(s);
  return rv;
}

int hr_session_get(hr_session *s, const hr_get_opts *o, hr_get_cb cb, void *ud,
                   uint32_t *stream_id) {
  if (!s || !o || !key_ok(o->key, o->key_len, 0) ||
      o->layout_count > HR_MAX_LAYOUTS || (o->layout_count && !o->layouts) ||
      (o->flags &
       ~(HR_REQ_ALLOW_TRANSCODE | HR_REQ_PARALLEL_OK | HR_REQ_REGION)) ||
      ((o->flags & HR_REQ_PARALLEL_OK) && o->max_shards == 0) ||
      ((o->flags & HR_REQ_REGION) &&
       (o->region_rank > HR_MAX_RANK ||
        (o->region_rank && (!o->region_offset || !o->region_shape)))) ||
      o->min_alignment_log2 > HR_MAX_ALIGNMENT_LOG2 ||
      o->preferred_device == HR_DEV_INVALID ||
      (o->dest && o->dest->buffer == NULL && o->dest->capacity) ||
      (o->device &&
       (o->dest || (o->flags & HR_REQ_PARALLEL_OK) ||
        (o->device_sync != HR_SYNC_PRODUCER_SYNCED &&
         o->device_sync != HR_SYNC_EVENT))))
    return HR_ERR_INVALID_ARGUMENT;
  for (uint16_t i = 0; i < o->layout_count; i++)
    if (o->layouts[i].tag == HR_LAYOUT_INVALID ||
        o->layouts[i].tag == HR_LAYOUT_INVALID_FF ||
        (o->layouts[i].ext_len && !o->layouts[i].ext))
      return HR_ERR_INVALID_ARGUMENT;
  /* Requests go on lane 0 (§ 14.5), whichever lane was named. */
  s = hr__request_lane(s);
  if (!s || !state_ok(s))
    return HR_ERR_STATE;
  if (s->nrequests >= s->set.max_streams)
    return HR_ERR_LIMIT;
  hr__api_enter(s);
  s->req_calls++;
  uint32_t count = (o->flags & HR_REQ_PARALLEL_OK) ? o->max_shards : 1;
  /* Shards at or above a closed lane's position could be sent on it. */
  uint32_t closed = first_closed_lane(s);
  if (count > closed)
    count = closed;
  uint32_t id = 0;
  hr_stream *st = NULL;
  int rv = take_ids(s, count, &id);
  if (rv)
    goto out;
  rv = hr__stream_new(s, HR_SK_CLI_GET, id, id + count - 1, &st);
  if (rv)
    goto out;
  st->counted = 1;
  s->nrequests++;
  st->cg.cb = cb;
  st->cg.ud = ud;
  st->cg.opts = *o;
  st->cg.opts.max_shards = (uint16_t)count;
  st->cg.lanes_lo = hr__lanes_now(s);
  st->rec.transcoded = -1;
  st->rec.device = o->preferred_device;
  /* Keep the preferences (checked against every descriptor). */
  size_t ext = 0;
  for (uint16_t i = 0; i < o->layout_count; i++)
    ext += o->layouts[i].ext_len;
  size_t need = o->layout_count * sizeof(hr_layout_entry) + ext;
  if (need) {
    st->cg.store = hr__mem_malloc(&s->mem, need);
    if (!st->cg.store) {
      rv = HR_ERR_NOMEM;
      goto out;
    }
    hr_layout_entry *ls = (hr_layout_entry *)st->cg.store;
    uint8_t *e = st->cg.store + o->layout_count * sizeof(hr_layout_entry);
    for (uint16_t i = 0; i < o->layout_count; i++) {
      ls[i] = o->layouts[i];
      if (o->layouts[i].ext_len) {
        memcpy(e, o->layouts[i].ext, o->layouts[i].ext_len);
        ls[i].ext = e;
        e += o->layouts[i].ext_len;
      }
    }
    st->cg.opts.layouts = ls;
  }
  st->cg.opts.key = NULL;
  st->cg.opts.region_offset = st->cg.opts.region_shape = NULL;
  st->cg.opts.dest = NULL;
  if (o->dest) {
    st->cg.has_dest = 1;
    st->cg.dest = *o->dest;
  }
  hr_rx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.direction = HR_RX_S2C;
  cfg.base_stream = id;
  cfg.request_flags = o->flags;
  cfg.max_shards = (uint16_t)count;
  cfg.strict = s->set.strict_composites ? 1 : 0;
  if (o->flags & HR_REQ_REGION) {
    cfg.region_rank = o->region_rank;
    for (unsigned k = 0; k < o->region_rank; k++) {
      cfg.region_offset[k] = o->region_offset[k];
      cfg.region_shape[k] = o->region_shape[k];
    }
  }
  rv = hr__recv_init(s, &st->rv, &cfg);
  if (rv)
    goto out;
  if (o->dest && o->dest->buffer) {
    st->rv.app = o->dest->buffer;
    st->rv.app_cap = o->dest->capacity;
  }
  st->rv.min_align = o->min_alignment_log2;
  if (o->device && (rv = hr__devrx_new(s, &st->rv, o->device,
                                       o->device_sync)) != 0)
    goto out;
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_REQUEST;
  m.hdr.stream_id = id;
  hr_request *r = &m.u.request;
  r->key = o->key;
  r->key_len = o->key_len;
  r->flags = o->flags;
  r->layout_count = o->layout_count;
  for (uint16_t i = 0; i < o->layout_count; i++)
    r->layouts[i] = o->layouts[i];
  r->preferred_device = o->preferred_device;
  r->min_alignment_log2 = o->min_alignment_log2;
  r->max_shards = (uint16_t)count;
  if (o->flags & HR_REQ_REGION) {
    r->region_rank = o->region_rank;
    for (unsigned k = 0; k < o->region_rank; k++) {
      r->region_offset[k] = o->region_offset[k];
      r->region_shape[k] = o->region_shape[k];
    }
  }
  rv = request_queue(s, st, &m);
  /* The RDMA data plane may have to ask again (§ 25.2: one retry). */
  if (rv == 0)
    rv = hr__rdma_get_keep(s, st, o);
out:
  return request_end(s, st, id, stream_id, rv);
}

/* ---- PUT ----------------------------------------------------------------- */

static int put_check(const hr_tensor *t, unsigned depth) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  if (depth > HR_MAX_COMPOSITE_DEPTH)
    return HR_ERR_INVALID_ARGUMENT;
  if (d->layout.tag == HR_LAYOUT_COMPOSITE) {
    size_t n = hr_tensor_member_count(t);
    for (size_t i = 0; i < n; i++) {
      int rv = put_check(hr_tensor_member(t, i), depth + 1);
      if (rv)
        return rv;
    }
    return 0;
  }
  /* Device memory goes through staging (or GPUDirect); a descriptor
   * naming a device over host memory has no device to read from. */
  for (unsigned k = 0; k < d->buffer_count; k++)
    if (d->buffers[k].device_tag != HR_DEV_CPU && !hr_tensor_on_device(t))
      return HR_ERR_UNSUPPORTED;
  return 0;
}

int hr_session_put(hr_session *s, const uint8_t *key, uint16_t key_len,
                   uint32_t flags, hr_tensor *t, hr_put_cb cb, void *ud,
                   uint32_t *stream_id) {
  if (!s || !t || !key_ok(key, key_len, 0) || (flags & ~HR_PUT_REPLACE) ||
      (hr_tensor_descriptor(t)->flags & HR_DESC_HAS_SHARD))
    return HR_ERR_INVALID_ARGUMENT;
  int rv = put_check(t, 0);
  if (rv)
    return rv;
  s = hr__request_lane(s);
  if (!s || !state_ok(s))
    return HR_ERR_STATE;
  if (s->nrequests >= s->set.max_streams)
    return HR_ERR_LIMIT;
  hr__api_enter(s);
  s->req_calls++;
  hr_stream *st = NULL;
  uint32_t id = 0;
  hr_tx tx;
  memset(&tx, 0, sizeof tx);
  rv = hr__tx_add_tensor(s, &tx, t);
  /* Every descriptor must pass the network rules before anything goes. */
  for (size_t i = 0; rv == 0 && i < tx.nparts; i++) {
    hr_wire_status ws;
    /* A PUT's device_tag is its destination (interchange § TENSOR_PUT);
     * the bytes of a device tensor arrive in host memory there, which
     * is what every server accepts (decision 75). */
    if (tx.parts[i].xmode == HR_XM_STAGE)
      for (unsigned k = 0; k < tx.parts[i].desc.buffer_count; k++)
        tx.parts[i].desc.buffers[k].device_tag = HR_DEV_CPU;
    if (hr_descriptor_validate(&tx.parts[i].desc, &tx.parts[i].xp, NULL, 0,
                               &ws))
      rv = HR_ERR_INVALID_ARGUMENT;
  }
  if (rv == 0)
    rv = take_ids(s, 1, &id);
  if (rv == 0)
    rv = hr__stream_new(s, HR_SK_CLI_PUT, id, id, &st);
  if (rv) {
    hr__tx_free(s, &tx);
    goto out;
  }
  st->tx = tx;
  st->counted = 1;
  s->nrequests++;
  st->put_cb = cb;
  st->cb_ud = ud;
  st->pkey = hr__mem_malloc(&s->mem, key_len);
  if (!st->pkey) {
    rv = HR_ERR_NOMEM;
    goto out;
  }
  memcpy(st->pkey, key, key_len);
  /* Staging (or the fabric) may end it before this call returns: the
   * tail its callback then waits in is allocated now (decision 78). */
  int may_park = s->rdma != NULL;
  for (size_t i = 0; i < st->tx.nparts; i++)
    may_park |= st->tx.parts[i].xmode == HR_XM_STAGE;
  if (may_park && (rv = hr__put_tail_reserve(s, st, key_len)) != 0)
    goto out;
  st->tx.put_key = st->pkey;
  st->tx.put_key_len = key_len;
  st->tx.put_flags = flags;
  st->rec.key = st->pkey;
  st->rec.key_len = key_len;
  st->rec.layout = hr_tensor_descriptor(t)->layout.tag;
  for (size_t i = 0; i < st->tx.nparts; i++)
    st->rec.bytes += st->tx.parts[i].xp.total_data_bytes;
  if (s->state == HR_CS_ESTABLISHED) {
    rv = hr__tx_send_head(s, st);
    if (rv)
      goto out;
    hr__ready_add(s, st);
  }
out:
  return request_end(s, st, id, stream_id, rv);
}

int hr__cli_put_acked(hr_session *s, hr_stream *st) {
  if (st->tx.cur < st->tx.nparts)
    return hr__stream_error(s, st->id, HR_WIRE_PROTOCOL_VIOLATION,
                            "PUT_ACK before the PUT was complete");
  st->cb_done = 1;
  st->rec.finished = s->now;
  st->rec.status = 0;
  /* A retry whose first try's registration the fabric still reads waits
   * for it to be released (decision 78). */
  if (hr__rdma_put_holds(s, st) && hr__tx_park_put(s, st)) {
    hr__stream_end(s, st);
    return 0;
  }
  hr__report_transfer(s, &st->rec);
  if (st->put_cb) {
    hr__cb_enter(s);
    st->put_cb(s, st->id, &st->rec, st->cb_ud);
    hr__cb_leave(s);
  }
  hr__stream_end(s, st);
  return 0;
}

static int cli_put_msg(hr_session *s, hr_stream *st, const hr_msg *m) {
  switch (m->hdr.type) {
  case HR_MSG_TENSOR_PUT_ACK:
    return hr__cli_put_acked(s, st);
  case HR_MSG_ERROR:
    return on_peer_error(s, st, m);
  default:
    return hr__stream_error(s, st->id, HR_WIRE_PROTOCOL_VIOLATION,
                            "message not allowed on a PUT stream");
  }
}

/* ---- LIST ---------------------------------------------------------------- */

int hr_session_list(hr_session *s, const uint8_t *prefix, uint16_t prefix_len,
                    const uint8_t *start_after, uint16_t start_after_len,
                    uint16_t max_entries, hr_list_cb cb, void *ud) {
  if (!s || !key_ok(prefix, prefix_len, 1) ||
      !key_ok(start_after, start_after_len, 1) || max_entries < 1 ||
      max_entries > HR_MAX_LIST_ENTRIES)
    return HR_ERR_INVALID_ARGUMENT;
  s = hr__request_lane(s);
  if (!s || !state_ok(s))
    return HR_ERR_STATE;
  if (s->nrequests >= s->set.max_streams)
    return HR_ERR_LIMIT;
  hr__api_enter(s);
  s->req_calls++;
  uint32_t id = 0;
  hr_stream *st = NULL;
  int rv = take_ids(s, 1, &id);
  if (rv == 0)
    rv = hr__stream_new(s, HR_SK_CLI_LIST, id, id, &st);
  if (rv == 0) {
    st->counted = 1;
    s->nrequests++;
    st->list_cb = cb;
    st->cb_ud = ud;
    hr_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = HR_MSG_LIST_REQUEST;
    m.hdr.stream_id = id;
    m.u.list_request.prefix = prefix;
    m.u.list_request.prefix_len = prefix_len;
    m.u.list_request.start_after = start_after;
    m.u.list_request.start_after_len = start_after_len;
    m.u.list_request.max_entries = max_entries;
    rv = request_queue(s, st, &m);
  }
  return request_end(s, st, id, NULL, rv);
}

static int cli_list_msg(hr_session *s, hr_stream *st, const hr_msg *m) {
  switch (m->hdr.type) {
  case HR_MSG_LIST_RESPONSE:
    st->cb_done = 1;
    if (st->list_cb) {
      hr__cb_enter(s);
      st->list_cb(s, 0, 0, &m->u.list_response, st->cb_ud);
      hr__cb_leave(s);
    }
    hr__stream_end(s, st);
    return 0;
  case HR_MSG_ERROR:
    return on_peer_error(s, st, m);
  default:
    return hr__stream_error(s, st->id, HR_WIRE_PROTOCOL_VIOLATION,
                            "message not allowed on a LIST stream");
  }
}

/* ---- PING, CANCEL -------------------------------------------------------- */

int hr_session_ping(hr_session *s, hr_ping_cb cb, void *ud) {
  if (!s)
    return HR_ERR_INVALID_ARGUMENT;
  if (s->fatal || s->deleted ||
      (s->state != HR_CS_ESTABLISHED && s->state != HR_CS_DRAINING))
    return HR_ERR_STATE;
  hr__api_enter(s);
  int rv = hr__ping_send(s, cb, ud, 0);
  if (hr_err_is_fatal(rv))
    hr__fatal(s, rv);
  hr__api_leave(s);
  return rv;
}

int hr_session_cancel(hr_session *s, uint32_t stream_id) {
  if (!s)
    return HR_ERR_INVALID_ARGUMENT;
  hr_stream *st = hr__stream_find(s, stream_id);
  if (!st || st->ended || s->role != HR_ROLE_CLIENT ||
      (st->kind != HR_SK_CLI_GET && st->kind != HR_SK_CLI_PUT))
    return HR_ERR_NOT_FOUND;
  /* The stream's lane (lane 0) sends the CANCELs. */
  s = st->s;
  hr__api_enter(s);
  int rv = 0;
  if (st->req ||
      (st->kind == HR_SK_CLI_PUT && !st->tx.cur &&
       st->tx.phase == HR_TXP_DESC && !st->sent_any) ||
      hr__tx_put_unsent(st)) {
    /* Never left this side: complete at once. */
    hr__cli_stream_fail(s, st, HR_ERR_CLOSED, HR_WIRE_CANCELLED, 1,
                        "cancelled before it was sent");
    hr__stream_end(s, st);
  } else if (!st->cg.cancelling) {
    st->cg.cancelling = 1;
    if (st->rv.dev)
      hr__devrx_cancel(s, &st->rv);
    hr__ready_remove(s, st);
    st->tx.failed = st->kind == HR_SK_CLI_PUT;
    rv = hr__cli_cancel_others(s, st, 0);
  }
  if (hr_err_is_fatal(rv))
    hr__fatal(s, rv);
  hr__api_leave(s);
  return rv;
}

/* ---- dispatch ------------------------------------------------------------ */

int hr__cli_on_stream_msg(hr_session *s, hr_stream *st, const hr_msg *m) {
  int rv;
  switch (st->kind) {
  case HR_SK_CLI_GET:
    rv = cli_get_msg(s, st, m);
    break;
  case HR_SK_CLI_PUT:
    rv = cli_put_msg(s, st, m);
    break;
  case HR_SK_CLI_LIST:
    rv = cli_list_msg(s, st, m);
    break;
  default:
    rv = HR_ERR_INTERNAL;
  }
  return rv;
}

int hr__cli_stream_sent(hr_session *s, hr_stream *st) {
  /* A PUT's last DATA_END is queued: now wait for PUT_ACK. */
  (void)s;
  (void)st;
  return 0;
}

int hr__cli_established(hr_session *s) {
  for (size_t i = 0; i < s->ntab; i++) {
    hr_stream *st = s->tab[i];
    if (st->req) {
      if (st->req_len - HR_HEADER_SIZE > s->peer_max) {
        hr__cli_stream_fail(s, st, HR_ERR_LIMIT, 0, 0,
                            "request larger than the server accepts");
        hr__stream_end(s, st);
        i--;
        continue;
      }
      int rv = hr__out_bytes(s, st->req, st->req_len, 0);
      if (rv)
        return hr__fatal(s, rv);
      st->req = NULL;
    } else if (st->kind == HR_SK_CLI_PUT) {
      int rv = hr__tx_send_head(s, st);
      if (rv)
        return hr__fatal(s, rv);
      hr__ready_add(s, st);
    }
  }
  return 0;
}

void hr__cli_goaway(hr_session *s, uint32_t last) {
  for (size_t i = s->ntab; i-- > 0;) {
    if (i >= s->ntab)
      continue;
    hr_stream *st = s->tab[i];
    if (st->id <= last)
      continue;
    hr__cli_stream_fail(s, st, HR_ERR_CLOSED, 0, 0,
                        "not processed by the server (GOAWAY)");
    hr__discard_add(s, st->id, st->last);
    hr__stream_end(s, st);
  }
}
