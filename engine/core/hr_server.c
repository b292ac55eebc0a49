/*
 * Server streams: GET (TENSOR_REQUEST), PUT (TENSOR_PUT), LIST.
 *
 * GET: the provider's on_get receives an hr_srv_get handle and answers
 * with hr_get_answer() / hr_get_fail(), at once or later.  The answer is
 * planned by hr_select.c into one send sequence per shard; shard i runs on
 * stream id + i as an independent stream (CANCEL acts per stream, § 18).
 * While a parallel request is unanswered it holds its whole reserved
 * block, and a CANCEL on any id of it cancels the request.
 *
 * PUT: checked (shards refused, devices), offered to on_put_begin, then
 * received straight into a landing tensor; on_put_commit runs only after
 * the last TENSOR_DATA_END passed every check.  A refusal at TENSOR_PUT
 * time discards the rest of the stream silently (§ 18); a PUT torn by
 * CANCEL, ERROR or the connection's end calls on_put_abort.
 *
 * LIST: answered at once from on_list, cut to max_entries and to the
 * peer's max_message_size (more = 1 when cut).
 */
#include <stddef.h>
#include <string.h>

#include "hr_session_int.h"

/* A control backlog above this refuses LIST answers (they may be large). */
#define LIST_ENTRY_MAX (2u + HR_MAX_KEY + 3u + 8u * HR_MAX_RANK + 8u)

static void rec_finish(hr_session *s, hr_stream *st, int status, uint32_t wire,
                       int sent, const char *msg) {
  st->rec.status = status;
  st->rec.wire_error = wire;
  st->rec.wire_error_sent = sent;
  hr__set_msg(st->rec.message, sizeof st->rec.message, msg,
              msg ? strlen(msg) : 0);
  st->rec.finished = s->now;
  if (!st->has_rec) {
    st->has_rec = 1;
    hr__report_transfer(s, &st->rec);
  }
}

/* Refuses a request before it became a stream: reported through
 * on_request (kind and key from the message), then the ERROR. */
static int refuse_open(hr_session *s, const hr_msg *m, uint32_t code,
                       const char *text) {
  const uint8_t *key = NULL;
  uint16_t key_len = 0;
  int kind = HR_XFER_LIST;
  if (m->hdr.type == HR_MSG_TENSOR_REQUEST) {
    kind = HR_XFER_GET;
    key = m->u.request.key;
    key_len = m->u.request.key_len;
  } else if (m->hdr.type == HR_MSG_TENSOR_PUT) {
    kind = HR_XFER_PUT;
    key = m->u.put.key;
    key_len = m->u.put.key_len;
  } else if (m->hdr.type == HR_MSG_LIST_REQUEST) {
    key = m->u.list_request.prefix;
    key_len = m->u.list_request.prefix_len;
  }
  hr__report_request(s, kind, m->hdr.stream_id, key, key_len, code, text);
  return hr__stream_error(s, m->hdr.stream_id, code, text);
}

/* ---- GET ----------------------------------------------------------------- */

const hr_get_info *hr_srv_get_info(const hr_srv_get *g) {
  if (g && g->local)
    return g->local->info(g);
  return g && g->st && !g->st->ended ? &g->st->sg.info : NULL;
}

void hr_get_set_narrow(hr_srv_get *g) {
  if (g)
    g->narrow = 1;
}

int hr_get_narrow(const hr_srv_get *g) { return g ? g->narrow : 0; }

static int copy_request(hr_session *s, hr_stream *st, const hr_request *r) {
  st->sg.key = hr__mem_malloc(&s->mem, r->key_len);
  if (!st->sg.key)
    return HR_ERR_NOMEM;
  memcpy(st->sg.key, r->key, r->key_len);
  size_t ext = 0;
  for (uint16_t i = 0; i < r->layout_count; i++)
    ext += r->layouts[i].ext ? r->layouts[i].ext_len : 0;
  st->sg.req = *r;
  st->sg.req.key = st->sg.key;
  if (ext) {
    st->sg.ext_store = hr__mem_malloc(&s->mem, ext);
    if (!st->sg.ext_store)
      return HR_ERR_NOMEM;
    size_t pos = 0;
    for (uint16_t i = 0; i < r->layout_count; i++) {
      if (!r->layouts[i].ext || !r->layouts[i].ext_len) {
        st->sg.req.layouts[i].ext = NULL;
        continue;
      }
      memcpy(st->sg.ext_store + pos, r->layouts[i].ext, r->layouts[i].ext_len);
      st->sg.req.layouts[i].ext = st->sg.ext_store + pos;
      pos += r->layouts[i].ext_len;
    }
  }
  st->sg.info.key = st->sg.key;
  st->sg.info.key_len = r->key_len;
  st->sg.info.request = &st->sg.req;
  st->sg.info.stream_id = st->id;
  return 0;
}

static int srv_get_open(hr_session *s, const hr_msg *m, uint32_t last) {
  const hr_request *r = &m->u.request;
  if ((r->flags & HR_REQ_REGION) && !(s->our_caps & HR_CAP_REGION_REQUESTS))
    return refuse_open(s, m, HR_WIRE_INVALID_REGION,
                       "REGION requests are not served here");
  hr_stream *st;
  int rv = hr__stream_new(s, HR_SK_SRV_GET, m->hdr.stream_id, last, &st);
  if (rv)
    return hr__fatal(s, rv);
  st->counted = 1;
  s->nrequests++;
  st->gh.st = st;
  st->gh.narrow = 0;
  st->sg.block_last = last;
  /* L counts the lanes when the request arrives (§ 14.5). */
  st->sg.lanes = hr__lanes_now(s);
  rv = copy_request(s, st, r);
  if (rv) {
    hr__stream_end(s, st);
    return hr__fatal(s, rv);
  }
  st->rec.key = st->sg.key;
  st->rec.key_len = r->key_len;
  if (!s->has_prov || !s->prov.on_get)
    return hr__stream_error(s, st->id, HR_WIRE_NOT_FOUND,
                            "this server serves no tensors");
  st->sg.in_on_get = 1;
  hr__cb_enter(s);
  rv = s->prov.on_get(s, &st->gh, s->prov.user_data);
  hr__cb_leave(s);
  st->sg.in_on_get = 0;
  if (rv)
    return hr__fatal(s, HR_ERR_CALLBACK_FAILURE);
  return 0;
}

/* Answers a GET with an ERROR that is a refusal, not a violation. */
static int get_refuse(hr_session *s, hr_stream *st, uint32_t wire,
                      const char *message) {
  int rv = hr__out_error(s, st->id, wire, message);
  if (rv)
    return hr__fatal(s, rv);
  hr__discard_add(s, st->id, st->last);
  rec_finish(s, st, hr__status_for_wire(wire), wire, 1, message);
  hr__stream_end(s, st);
  return 0;
}

int hr_get_answer(hr_srv_get *g, hr_tensor *t) {
  if (!g || !t)
    return HR_ERR_INVALID_ARGUMENT;
  if (g->local)
    return g->local->answer(g, t);
  hr_stream *st = g->st;
  if (!st || st->ended || st->sg.answered)
    return HR_ERR_STATE;
  hr_session *s = st->s;
  if (s->fatal || s->state == HR_CS_CLOSED)
    return HR_ERR_STATE;
  hr__api_enter(s);
  st->sg.answered = 1;
  hr_answer_plan plan;
  uint32_t wire = 0;
  char msg[256] = "";
  int rv = hr__select_answer(s, &st->sg.req, t, st->sg.lanes, &plan, &wire, msg,
                             sizeof msg);
  if (rv < 0) {
    hr__answer_plan_free(s, &plan);
    hr__fatal(s, rv);
    goto out;
  }
  if (rv == 1) {
    st->rec.layout = plan.layout;
    hr__answer_plan_free(s, &plan);
    rv = get_refuse(s, st, wire, msg);
    goto out;
  }
  st->rec.layout = plan.layout;
  st->rec.transcoded = plan.transcoded;
  st->rec.device = plan.device;
  memcpy(st->rec.fallback, plan.fallback, sizeof st->rec.fallback);
  if (plan.nshards <= 1 && s->shm_ok) {
    hr__shm_plan(s, &plan.txs[0], st->rec.fallback, sizeof st->rec.fallback);
    for (size_t i = 0; i < plan.txs[0].nparts; i++)
      if (plan.txs[0].parts[i].shm)
        st->rec.data_plane = HR_PLANE_SHM;
  } else if (s->shm_ok && !st->rec.fallback[0]) {
    hr__set_msg(st->rec.fallback, sizeof st->rec.fallback,
                "shm: a sharded answer goes as frames", 36);
  }
  uint32_t n = plan.nshards ? plan.nshards : 1;
  unsigned lanes = st->sg.lanes;
  st->rec.shards = n;
  st->rec.lanes = n < lanes ? n : lanes;
  /* Shard 0 stays on the base stream; the others open id+1..id+N-1, each
   * on lane i mod L, and the rest of the reserved block is released. */
  st->last = st->id;
  st->tx = plan.txs[0];
  memset(&plan.txs[0], 0, sizeof plan.txs[0]);
  st->nshards = n;
  for (uint32_t i = 1; i < n && rv == 0; i++) {
    hr_session *lane = hr__lane_at(s, i % lanes);
    if (!lane) {
      /* Its lane closed: that shard cannot be sent, the client fails the
       * transfer when it sees the lane go. */
      hr_transfer_record rec = st->rec;
      rec.stream_id = st->id + i;
      rec.shard_index = i;
      rec.status = HR_ERR_CLOSED;
      hr__set_msg(rec.message, sizeof rec.message, "its lane closed", 15);
      rec.finished = s->now;
      hr__report_transfer(s, &rec);
      continue;
    }
    hr_stream *sh;
    rv = hr__stream_new(lane, HR_SK_SRV_GET, st->id + i, st->id + i, &sh);
    if (rv) {
      hr__fatal(s, rv);
      break;
    }
    sh->base = st;
    sh->gh.st = NULL;
    sh->sg.answered = 1;
    sh->shard_index = i;
    sh->nshards = n;
    sh->rec = st->rec;
    sh->rec.stream_id = sh->id;
    sh->rec.shard_index = i;
    /* The shard may outlive the base: it keeps its own key for its record. */
    sh->sg.key = hr__mem_malloc(&lane->mem, st->rec.key_len ? st->rec.key_len
                                                             : 1);
    if (sh->sg.key && st->rec.key_len)
      memcpy(sh->sg.key, st->rec.key, st->rec.key_len);
    sh->rec.key = sh->sg.key;
    sh->tx = plan.txs[i];
    memset(&plan.txs[i], 0, sizeof plan.txs[i]);
    hr__ready_add(lane, sh);
  }
  hr__answer_plan_free(s, &plan);
  if (rv == 0) {
    hr__ready_add(s, st);
    /* Zero-byte transcodes need no work; others start their window. */
    rv = hr__tx_pump(s, st);
    if (rv)
      hr__fatal(s, rv);
  }
out:;
  int ret = s->fatal ? s->fatal : 0;
  hr__api_leave(s);
  return ret;
}

int hr_get_fail(hr_srv_get *g, uint32_t wire_error, const char *message) {
  if (!g || wire_error == HR_WIRE_NO_ERROR || wire_error > HR_WIRE_ERROR_LAST)
    return HR_ERR_INVALID_ARGUMENT;
  if (g->local)
    return g->local->fail(g, wire_error, message);
  hr_stream *st = g->st;
  if (!st || st->ended || st->sg.answered)
    return HR_ERR_STATE;
  hr_session *s = st->s;
  if (s->fatal || s->state == HR_CS_CLOSED)
    return HR_ERR_STATE;
  hr__api_enter(s);
  st->sg.answered = 1;
  get_refuse(s, st, wire_error, message);
  int ret = s->fatal ? s->fatal : 0;
  hr__api_leave(s);
  return ret;
}

/* The client cancelled (CANCEL) or errored (ERROR) a GET stream. */
static int srv_get_stop(hr_session *s, hr_stream *st, int cancel,
                        const hr_msg *m) {
  if (!st->sg.answered && s->prov.on_get_cancel) {
    st->sg.answered = 1;
    hr__cb_enter(s);
    s->prov.on_get_cancel(s, &st->gh, s->prov.user_data);
    hr__cb_leave(s);
  }
  st->sg.answered = 1;
  uint32_t sid = st->id;
  if (cancel) {
    int rv = hr__out_error(s, sid, HR_WIRE_CANCELLED, "cancelled");
    if (rv)
      return hr__fatal(s, rv);
    rec_finish(s, st, HR_ERR_CLOSED, HR_WIRE_CANCELLED, 1, "cancelled");
  } else {
    char text[HR_MAX_TEXT + 1];
    hr__set_msg(text, sizeof text, (const char *)m->u.error.message,
                m->u.error.message_len);
    rec_finish(s, st, HR_ERR_REMOTE, m->u.error.code, 0, text);
  }
  hr__discard_add(s, st->id, st->last);
  hr__stream_end(s, st);
  return 0;
}

/* ---- PUT ----------------------------------------------------------------- */

const hr_put_info *hr_srv_put_info(const hr_srv_put *p) {
  return p && p->st && !p->st->ended ? &p->st->pinfo : NULL;
}

static int all_cpu(const hr_descriptor *d) {
  for (unsigned k = 0; k < d->buffer_count; k++)
    if (d->buffers[k].device_tag != HR_DEV_CPU)
      return 0;
  return 1;
}

/* Refuses a PUT at TENSOR_PUT time: ERROR, and the rest of the stream
 * (frames, DATA_END) is dropped silently. */
static int put_refuse(hr_session *s, const hr_msg *m, uint32_t code,
                      const char *text) {
  return refuse_open(s, m, code, text);
}

static void put_abort(hr_session *s, hr_stream *st) {
  /* The provider frees the landing tensor. */
  hr__io_fence_rx(s, st);
  if (st->put_accepted && s->prov.on_put_abort) {
    st->put_accepted = 0;
    hr__cb_enter(s);
    s->prov.on_put_abort(s, &st->pinfo, s->prov.user_data);
    hr__cb_leave(s);
  }
  st->put_accepted = 0;
}

int hr__put_alloc(hr_session *s, const hr_descriptor *d, unsigned min_align,
                  hr_tensor **out) {
  const hr_descriptor *got;
  hr_tensor *t = NULL;
  int rv;

  if (!s->has_prov ||
      s->prov.size < offsetof(hr_provider, on_put_alloc) +
                         sizeof s->prov.on_put_alloc ||
      !s->prov.on_put_alloc)
    return HR_ERR_NOT_FOUND;
  hr__cb_enter(s);
  rv = s->prov.on_put_alloc(s, d, min_align, &t, s->prov.user_data);
  hr__cb_leave(s);
  if (rv == HR_ERR_NOT_FOUND && !t)
    return HR_ERR_NOT_FOUND;
  if (rv || !t) {
    hr_tensor_unref(t);
    return HR_ERR_LIMIT;
  }
  /* The bytes are written by the buffer sizes of `d`: the provider's
   * tensor must hold them, in host memory. */
  got = hr_tensor_descriptor(t);
  rv = hr_tensor_on_device(t) || got->buffer_count != d->buffer_count ||
       got->layout.tag == HR_LAYOUT_COMPOSITE;
  for (unsigned k = 0; !rv && k < d->buffer_count && k < HR_MAX_BUFFERS; k++)
    rv = got->buffers[k].size_bytes < d->buffers[k].size_bytes ||
         (d->buffers[k].size_bytes && !hr_tensor_buffer(t, k));
  if (rv) {
    hr_tensor_unref(t);
    return HR_ERR_LIMIT;
  }
  *out = t;
  return 0;
}

static int srv_put_open(hr_session *s, const hr_msg *m) {
  const hr_put *p = &m->u.put;
  uint32_t sid = m->hdr.stream_id;
  if (!(s->our_caps & HR_CAP_TENSOR_PUT))
    return put_refuse(s, m, HR_WIRE_PUT_REJECTED, "PUT is not accepted");
  if (p->desc.flags & HR_DESC_HAS_SHARD)
    return put_refuse(s, m, HR_WIRE_PUT_REJECTED, "a shard cannot be PUT");
  if (!all_cpu(&p->desc))
    return put_refuse(s, m, HR_WIRE_DEVICE_UNAVAILABLE,
                      "only CPU tensors are accepted");
  hr_stream *st;
  int rv = hr__stream_new(s, HR_SK_SRV_PUT, sid, sid, &st);
  if (rv)
    return hr__fatal(s, rv);
  st->counted = 1;
  s->nrequests++;
  st->ph.st = st;
  st->pkey = hr__mem_malloc(&s->mem, p->key_len);
  if (!st->pkey) {
    hr__stream_end(s, st);
    return hr__fatal(s, HR_ERR_NOMEM);
  }
  memcpy(st->pkey, p->key, p->key_len);
  st->pinfo.key = st->pkey;
  st->pinfo.key_len = p->key_len;
  st->rec.key = st->pkey;
  st->rec.key_len = p->key_len;
  st->pinfo.flags = p->flags;
  st->pinfo.stream_id = sid;
  /* The head's descriptor stays valid for the stream's life inside the
   * recv tree; until then it points at the message (valid in the
   * callback). */
  st->pinfo.desc = &p->desc;
  st->rec.layout = p->desc.layout.tag;
  st->rec.device = HR_DEV_CPU;
  uint32_t wire = 0;
  hr__cb_enter(s);
  rv = s->prov.on_put_begin(s, &st->pinfo, &wire, s->prov.user_data);
  hr__cb_leave(s);
  if (rv) {
    hr__stream_end(s, st);
    return hr__fatal(s, HR_ERR_CALLBACK_FAILURE);
  }
  if (wire) {
    if (wire > HR_WIRE_ERROR_LAST)
      wire = HR_WIRE_INTERNAL;
    rec_finish(s, st, hr__status_for_wire(wire), wire, 1, "PUT refused");
    hr__stream_end(s, st);
    /* Reported by rec_finish already: no on_request for it. */
    return hr__stream_error(s, sid, wire, "PUT refused");
  }
  st->put_accepted = 1;
  hr_rx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.direction = HR_RX_C2S;
  cfg.base_stream = sid;
  cfg.strict = 1;
  rv = hr__recv_init(s, &st->rv, &cfg);
  if (rv)
    return hr__fatal(s, rv);
  hr_wire_status ws = {0, 0, NULL};
  rv = hr__recv_msg(s, st, &st->rv, m, &ws);
  if (rv == HR_ERR_PROTO)
    return hr__stream_error(s, sid, ws.code, ws.reason);
  if (rv == HR_ERR_LIMIT)
    return hr__stream_error(s, sid, HR_WIRE_RESOURCE_EXHAUSTED,
                            "no memory for the tensor");
  if (rv)
    return hr__fatal(s, rv);
  if (st->rv.root)
    st->pinfo.desc = &st->rv.root->desc;
  return 0;
}

static int put_commit(hr_session *s, hr_stream *st) {
  hr_tensor *t = hr__recv_take(&st->rv);
  uint32_t wire = 0;
  st->rec.bytes = st->rv.bytes;
  hr__cb_enter(s);
  int rv = s->prov.on_put_commit(s, &st->pinfo, t, &wire, s->prov.user_data);
  hr__cb_leave(s);
  hr_tensor_unref(t);
  st->put_accepted = 0;
  if (rv)
    return hr__fatal(s, HR_ERR_CALLBACK_FAILURE);
  if (wire > HR_WIRE_ERROR_LAST)
    wire = HR_WIRE_INTERNAL;
  /* Over RDMA the handshake sends the answer. */
  int by_rdma = hr__rdma_put_answer(s, st, wire, "PUT refused at commit");
  if (by_rdma < 0)
    return hr__fatal(s, by_rdma);
  if (wire) {
    rv = by_rdma ? 0 : hr__out_error(s, st->id, wire, "PUT refused at commit");
    rec_finish(s, st, hr__status_for_wire(wire), wire, 1,
               "PUT refused at commit");
  } else {
    rv = by_rdma ? 0 : hr__out_empty(s, HR_MSG_TENSOR_PUT_ACK, st->id);
    rec_finish(s, st, 0, 0, 0, NULL);
  }
  hr__stream_end(s, st);
  return rv ? hr__fatal(s, rv) : 0;
}

static int srv_put_msg(hr_session *s, hr_stream *st, const hr_msg *m) {
  switch (m->hdr.type) {
  case HR_MSG_TENSOR_DESCRIPTOR:
    if (!all_cpu(&m->u.tensor.desc))
      return hr__stream_error(s, st->id, HR_WIRE_DEVICE_UNAVAILABLE,
                              "only CPU tensors are accepted");
    /* fall through */
  case HR_MSG_TENSOR_DATA:
  case HR_MSG_TENSOR_DATA_END: {
    hr_wire_status ws = {0, 0, NULL};
    int rv = hr__recv_msg(s, st, &st->rv, m, &ws);
    if (rv == HR_ERR_PROTO)
      return hr__stream_error(s, st->id, ws.code, ws.reason);
    if (rv == HR_ERR_LIMIT)
      return hr__stream_error(s, st->id, HR_WIRE_RESOURCE_EXHAUSTED,
                              "no memory for the tensor");
    if (rv)
      return hr__fatal(s, rv);
    if (st->rv.complete)
      return put_commit(s, st);
    return 0;
  }
  case HR_MSG_CANCEL: {
    put_abort(s, st);
    int rv = hr__out_error(s, st->id, HR_WIRE_CANCELLED, "cancelled");
    rec_finish(s, st, HR_ERR_CLOSED, HR_WIRE_CANCELLED, 1, "cancelled");
    hr__discard_add(s, st->id, st->id);
    hr__stream_end(s, st);
    return rv ? hr__fatal(s, rv) : 0;
  }
  case HR_MSG_ERROR: {
    put_abort(s, st);
    char text[HR_MAX_TEXT + 1];
    hr__set_msg(text, sizeof text, (const char *)m->u.error.message,
                m->u.error.message_len);
    rec_finish(s, st, HR_ERR_REMOTE, m->u.error.code, 0, text);
    hr__discard_add(s, st->id, st->id);
    hr__stream_end(s, st);
    return 0;
  }
  default:
    /* RDMA_* (not negotiated), BUFFER_RELEASE (GET streams only). */
    return hr__stream_error(s, st->id, HR_WIRE_PROTOCOL_VIOLATION,
                            "message not allowed on a PUT stream");
  }
}

/* ---- LIST ---------------------------------------------------------------- */

typedef struct list_ctx {
  const hr_list_request *req;
  uint8_t *buf;
  size_t len, cap;
  uint16_t count;
  int cut;     /* an entry did not fit */
  int bad;     /* the provider broke the rules */
  size_t prev; /* offset of the previous entry's key in buf */
  uint16_t prev_len;
} list_ctx;

static int key_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
  size_t n = an < bn ? an : bn;
  int c = n ? memcmp(a, b, n) : 0;
  if (c)
    return c;
  return an < bn ? -1 : an > bn;
}

static int list_emit(void *ctx, const hr_list_entry *e) {
  list_ctx *c = ctx;
  if (c->bad || c->cut || c->count >= c->req->max_entries)
    return 1;
  if (!e || !e->key || e->key_len < 1 || e->key_len > HR_MAX_KEY ||
      e->rank > HR_MAX_RANK || e->key_len < c->req->prefix_len ||
      (c->req->prefix_len &&
       memcmp(e->key, c->req->prefix, c->req->prefix_len)) ||
      (c->req->start_after_len &&
       key_cmp(e->key, e->key_len, c->req->start_after,
               c->req->start_after_len) <= 0) ||
      (c->count &&
       key_cmp(e->key, e->key_len, c->buf + c->prev, c->prev_len) <= 0)) {
    c->bad = 1;
    return 1;
  }
  int w = hr_list_entry_put(c->buf + c->len, c->cap - c->len, e);
  if (w == HR_ERR_BUFFER_TOO_SMALL) {
    c->cut = 1;
    return 1;
  }
  if (w < 0) {
    c->bad = 1;
    return 1;
  }
  c->prev = c->len + 2;
  c->prev_len = e->key_len;
  c->len += (size_t)w;
  c->count++;
  return c->count >= c->req->max_entries;
}

static int srv_list_open(hr_session *s, const hr_msg *m) {
  uint32_t sid = m->hdr.stream_id;
  if (!(s->our_caps & HR_CAP_LIST))
    return refuse_open(s, m, HR_WIRE_PROTOCOL_VIOLATION,
                       "LIST is not served here");
  if (s->ctrl_queued > HR_CTRL_BACKLOG_MAX / 2)
    return refuse_open(s, m, HR_WIRE_RESOURCE_EXHAUSTED,
                       "output backlog: retry later");
  const hr_list_request *r = &m->u.list_request;
  list_ctx c;
  memset(&c, 0, sizeof c);
  c.req = r;
  /* The response must fit the peer's limit: 12-byte header aside, the
   * payload is u8 more + u16 count + entries. */
  uint64_t cap = (uint64_t)r->max_entries * LIST_ENTRY_MAX;
  if (cap > (uint64_t)s->peer_max - 3)
    cap = (uint64_t)s->peer_max - 3;
  c.cap = (size_t)cap;
  c.buf = hr__mem_malloc(&s->mem, c.cap);
  if (!c.buf)
    return hr__fatal(s, HR_ERR_NOMEM);
  int more = 0;
  hr__cb_enter(s);
  int rv = s->prov.on_list(s, r, list_emit, &c, &more, s->prov.user_data);
  hr__cb_leave(s);
  if (rv || c.bad) {
    hr__mem_free(&s->mem, c.buf);
    return refuse_open(s, m, HR_WIRE_INTERNAL, "the listing failed");
  }
  hr_msg out;
  memset(&out, 0, sizeof out);
  out.hdr.type = HR_MSG_LIST_RESPONSE;
  out.hdr.stream_id = sid;
  out.u.list_response.more = (uint8_t)(more || c.cut);
  out.u.list_response.entry_count = c.count;
  out.u.list_response.entries_raw = c.buf;
  out.u.list_response.entries_raw_len = c.len;
  rv = hr__out_msg(s, &out, 1);
  hr__mem_free(&s->mem, c.buf);
  if (rv)
    return hr__fatal(s, rv);
  hr__report_request(s, HR_XFER_LIST, sid, r->prefix, r->prefix_len, 0, NULL);
  return 0;
}

/* ---- dispatch ------------------------------------------------------------ */

int hr__srv_on_open(hr_session *s, const hr_msg *m, hr_wire_status *ws) {
  (void)ws;
  uint32_t sid = m->hdr.stream_id, last = sid;
  if (s->grp && s->lane != 0) {
    /* Requests go on lane 0 (§ 14.5): the id is used up all the same. */
    hr__hist_add(s, sid, sid);
    if (m->hdr.type == HR_MSG_TENSOR_PUT)
      hr__discard_add(s, sid, sid);
    return refuse_open(s, m, HR_WIRE_PROTOCOL_VIOLATION,
                       "requests go on lane 0 of the session");
  }
  if (m->hdr.type == HR_MSG_TENSOR_REQUEST &&
      (m->u.request.flags & HR_REQ_PARALLEL_OK)) {
    uint64_t end = (uint64_t)sid + m->u.request.max_shards - 1;
    if (end > UINT32_MAX)
      return hr__conn_error(s, HR_WIRE_PROTOCOL_VIOLATION,
                            "parallel block past the last stream id");
    last = (uint32_t)end;
  }
  hr__hist_add(s, sid, last);
  s->ids->last_open_first = sid;
  if (s->goaway_sent && sid > s->goaway_last) {
    if (m->hdr.type == HR_MSG_TENSOR_PUT)
      hr__discard_add(s, sid, sid);
    return refuse_open(s, m, HR_WIRE_RESOURCE_EXHAUSTED,
                       "shutting down (GOAWAY): not processed");
  }
  if (s->state != HR_CS_ESTABLISHED && s->state != HR_CS_DRAINING)
    return 0;
  if (m->hdr.type != HR_MSG_LIST_REQUEST && s->nrequests >= s->set.max_streams)
    return refuse_open(s, m, HR_WIRE_RESOURCE_EXHAUSTED,
                       "too many concurrent streams");
  switch (m->hdr.type) {
  case HR_MSG_TENSOR_REQUEST:
    return srv_get_open(s, m, last);
  case HR_MSG_TENSOR_PUT:
    return srv_put_open(s, m);
  case HR_MSG_LIST_REQUEST:
    return srv_list_open(s, m);
  default:
    return HR_ERR_INTERNAL;
  }
}

int hr__srv_on_stream_msg(hr_session *s, hr_stream *st, const hr_msg *m) {
  if (st->kind == HR_SK_SRV_PUT)
    return srv_put_msg(s, st, m);
  switch (m->hdr.type) {
  case HR_MSG_CANCEL:
    return srv_get_stop(s, st, 1, m);
  case HR_MSG_ERROR:
    return srv_get_stop(s, st, 0, m);
  case HR_MSG_BUFFER_RELEASE:
    /* Only meaningful for the SHM plane; frames need no release. */
    return 0;
  default:
    return hr__stream_error(s, st->id, HR_WIRE_PROTOCOL_VIOLATION,
                            "message not allowed on a GET stream");
  }
}

int hr__srv_stream_sent(hr_session *s, hr_stream *st) {
  if (st->kind != HR_SK_SRV_GET)
    return 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < st->tx.nparts; i++)
    bytes += st->tx.parts[i].xp.total_data_bytes;
  st->rec.bytes = bytes;
  rec_finish(s, st, 0, 0, 0, NULL);
  hr__stream_end(s, st);
  return 0;
}

void hr__srv_stream_fail(hr_session *s, hr_stream *st, int status,
                         uint32_t wire, int sent, const char *msg) {
  if (st->kind == HR_SK_SRV_PUT) {
    put_abort(s, st);
  } else if (!st->sg.answered) {
    st->sg.answered = 1;
    if (s->prov.on_get_cancel) {
      hr__cb_enter(s);
      s->prov.on_get_cancel(s, &st->gh, s->prov.user_data);
      hr__cb_leave(s);
    }
  }
  rec_finish(s, st, status, wire, sent, msg);
}
