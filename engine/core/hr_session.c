/*
 * hr_session: one Hurray connection as a sans-IO state machine.
 *
 * Input goes through the frame reader (proto/): control messages arrive
 * whole, TENSOR_DATA payloads arrive piece by piece (or are placed by the
 * host after hr_session_recv_target()).  Every message is first classified
 * from its header alone (the order of § 18: size, type, stream placement,
 * then payload): connection-level, opening a stream, belonging to a
 * stream, racing the end of one (dropped), or a violation, on its stream
 * or on the connection.  The per-role table `route` below comes straight
 * from the message table of wire-v1 § 3.
 *
 * Streams live in a table sorted by id (ids only grow, so appends are the
 * common case).  A bounded history remembers which ids were opened, to
 * tell "ended" (late messages tolerated or PROTOCOL_VIOLATION on the
 * stream) from "never opened" (PROTOCOL_VIOLATION on stream 0).
 */
#include <assert.h>
#include <string.h>

#include "hr_session_int.h"

const char *const hr__conn_state_names[HR_CS_COUNT] = {
    "AWAIT_HELLO", "ESTABLISHED", "DRAINING", "CLOSED"};
_Static_assert(sizeof hr__conn_state_names / sizeof *hr__conn_state_names ==
                   HR_CS_COUNT,
               "one name per state");

/* Legal transitions: [from][to]. */
static const unsigned char legal[HR_CS_COUNT][HR_CS_COUNT] = {
    /* AWAIT_HELLO */ {0, 1, 0, 1},
    /* ESTABLISHED */ {0, 0, 1, 1},
    /* DRAINING    */ {0, 0, 0, 1},
    /* CLOSED      */ {0, 0, 0, 0},
};

void hr__session_set_state(hr_session *s, int state) {
  if (s->state == state)
    return;
  if (!legal[s->state][state]) {
    /* Our own bug: never reached from peer input. */
    assert(!"illegal connection state transition");
    return;
  }
  s->state = state;
  if (state == HR_CS_CLOSED)
    s->tx_progress = s->now;
  if (state == HR_CS_ESTABLISHED)
    hr_reader_set_max_payload(s->rd, s->set.max_message_size);
}

/* ---- routing table (wire-v1 § 3) ---------------------------------------- */

enum {
  R_BAD_CONN = 0, /* never legal here: PROTOCOL_VIOLATION on stream 0 */
  R_CONN,         /* connection-level message (stream 0) */
  R_OPEN,         /* opens a new stream (server) */
  R_STREAM,       /* belongs to an open stream */
  R_BAD_STREAM    /* wrong direction: PROTOCOL_VIOLATION on its stream */
};

static const unsigned char route[2][HR_MSG_LAST_DEFINED + 1] = {
    [HR_ROLE_CLIENT] =
        {
            [HR_MSG_CLIENT_HELLO] = R_BAD_CONN,
            [HR_MSG_SERVER_HELLO] = R_BAD_CONN,
            [HR_MSG_TENSOR_REQUEST] = R_BAD_STREAM,
            [HR_MSG_TENSOR_DESCRIPTOR] = R_STREAM,
            [HR_MSG_TENSOR_DATA] = R_STREAM,
            [HR_MSG_TENSOR_DATA_END] = R_STREAM,
            [HR_MSG_TENSOR_PUT] = R_BAD_STREAM,
            [HR_MSG_TENSOR_PUT_ACK] = R_STREAM,
            [HR_MSG_ERROR] = R_STREAM,
            [HR_MSG_CANCEL] = R_BAD_STREAM,
            [HR_MSG_GOAWAY] = R_CONN,
            [HR_MSG_RDMA_REGISTER] = R_STREAM,
            [HR_MSG_RDMA_READY] = R_STREAM,
            [HR_MSG_PING] = R_CONN,
            [HR_MSG_PONG] = R_CONN,
            [HR_MSG_BUFFER_RELEASE] = R_BAD_STREAM,
            [HR_MSG_LIST_REQUEST] = R_BAD_STREAM,
            [HR_MSG_LIST_RESPONSE] = R_STREAM,
        },
    [HR_ROLE_SERVER] =
        {
            [HR_MSG_CLIENT_HELLO] = R_BAD_CONN,
            [HR_MSG_SERVER_HELLO] = R_BAD_CONN,
            [HR_MSG_TENSOR_REQUEST] = R_OPEN,
            [HR_MSG_TENSOR_DESCRIPTOR] = R_STREAM,
            [HR_MSG_TENSOR_DATA] = R_STREAM,
            [HR_MSG_TENSOR_DATA_END] = R_STREAM,
            [HR_MSG_TENSOR_PUT] = R_OPEN,
            [HR_MSG_TENSOR_PUT_ACK] = R_BAD_STREAM,
            [HR_MSG_ERROR] = R_STREAM,
            [HR_MSG_CANCEL] = R_STREAM,
            [HR_MSG_GOAWAY] = R_CONN,
            [HR_MSG_RDMA_REGISTER] = R_STREAM,
            [HR_MSG_RDMA_READY] = R_STREAM,
            [HR_MSG_PING] = R_CONN,
            [HR_MSG_PONG] = R_CONN,
            [HR_MSG_BUFFER_RELEASE] = R_STREAM,
            [HR_MSG_LIST_REQUEST] = R_OPEN,
            [HR_MSG_LIST_RESPONSE] = R_BAD_STREAM,
        },
};

/* What to do with one message, decided from its header. */
enum {
  K_CONN,      /* handle at connection level */
  K_HELLO,     /* the HELLO we wait for */
  K_OPEN,      /* opens stream hdr.stream_id */
  K_STREAM,    /* for stream `st` */
  K_DROP,      /* races the end of a stream: drop silently */
  K_STREAM_PV, /* PROTOCOL_VIOLATION on its stream */
  K_CONN_PV    /* PROTOCOL_VIOLATION on stream 0 */
};

/* ---- small helpers ------------------------------------------------------- */

void hr__set_msg(char *dst, size_t cap, const char *src, size_t len) {
  if (!src)
    len = 0;
  if (len >= cap)
    len = cap - 1;
  while (len && !hr_utf8_valid((const uint8_t *)src, len))
    len--;
  if (len)
    memcpy(dst, src, len);
  dst[len] = 0;
}

int hr__fatal(hr_session *s, int rv) {
  if (hr_err_is_fatal(rv) && !s->fatal)
    s->fatal = rv;
  return rv;
}

void hr__record_init(hr_session *s, hr_transfer_record *rec) {
  memset(rec, 0, sizeof *rec);
  rec->data_plane = HR_PLANE_FRAMES;
  rec->device = HR_DEV_CPU;
  rec->shards = 1;
  rec->lanes = 1;
  rec->started = s->now;
}

void hr__report_request(hr_session *s, int kind, uint32_t sid,
                        const uint8_t *key, uint16_t key_len, uint32_t wire,
                        const char *msg) {
  hr_transfer_record rec;
  if (!s->cbs.on_request)
    return;
  hr__record_init(s, &rec);
  rec.kind = (uint8_t)kind;
  rec.stream_id = sid;
  rec.key = key;
  rec.key_len = key_len;
  rec.transcoded = 0;
  if (wire) {
    rec.status = hr__status_for_wire(wire);
    rec.wire_error = wire;
    rec.wire_error_sent = 1;
    hr__set_msg(rec.message, sizeof rec.message, msg, msg ? strlen(msg) : 0);
  }
  rec.finished = s->now;
  hr__cb_enter(s);
  s->cbs.on_request(s, &rec, s->ud);
  hr__cb_leave(s);
}

void hr__report_transfer(hr_session *s, const hr_transfer_record *rec) {
  if (!s->cbs.on_transfer)
    return;
  hr__cb_enter(s);
  s->cbs.on_transfer(s, rec, s->ud);
  hr__cb_leave(s);
}

void hr_settings_default(hr_settings *st) {
  memset(st, 0, sizeof *st);
  st->version = HR_SETTINGS_VERSION;
  st->max_message_size = 16u << 20;
  st->frame_data_size = 4u << 20;
  st->send_budget = (uint64_t)8 << 20;
  st->max_streams = 256;
  st->handshake_timeout = 10ull * 1000000000ull;
  st->idle_timeout = 300ull * 1000000000ull;
  st->read_timeout = 30ull * 1000000000ull;
  st->keepalive_interval = 30ull * 1000000000ull;
  st->capabilities = HR_CAP_TRANSCODING | HR_CAP_PARALLEL_STREAMS |
                     HR_CAP_TENSOR_PUT | HR_CAP_LIST | HR_CAP_REGION_REQUESTS |
                     HR_CAP_SHM_DATA_PLANE;
  st->max_shards = 64;
  st->transcode_mem_limit = (uint64_t)1 << 30;
  st->transcode_chunk = (uint64_t)4 << 20;
  st->transcode_window = 4;
  st->strict_composites = 1;
  st->peer_name = NULL;
  st->shard_bytes = (uint64_t)16 << 20;
  st->shards_per_lane = 4;
  st->rdma_stage_budget = (uint64_t)4 << 30;
  st->rdma_stage_keep = (uint64_t)1 << 30;
}

/* ---- id history and the discard set -------------------------------------- */

static void range_add(hr_idrange *ring, unsigned cap, unsigned *n,
                      unsigned *head, uint32_t first, uint32_t last) {
  if (*n) {
    hr_idrange *prev = &ring[(*head + *n - 1) % cap];
    if (first >= prev->first && first <= prev->last + 1) {
      if (last > prev->last)
        prev->last = last;
      return;
    }
  }
  if (*n == cap) {
    *head = (*head + 1) % cap;
    (*n)--;
  }
  ring[(*head + *n) % cap] = (hr_idrange){first, last};
  (*n)++;
}

static int range_has(const hr_idrange *ring, unsigned cap, unsigned n,
                     unsigned head, uint32_t id) {
  for (unsigned i = 0; i < n; i++) {
    const hr_idrange *r = &ring[(head + i) % cap];
    if (id >= r->first && id <= r->last)
      return 1;
  }
  return 0;
}

void hr__hist_add(hr_session *s, uint32_t first, uint32_t last) {
  hr_ids *d = s->ids;
  range_add(d->hist, HR_ID_HISTORY, &d->nhist, &d->hist_head, first, last);
  if (last > d->max_seen)
    d->max_seen = last;
}

void hr__discard_add(hr_session *s, uint32_t first, uint32_t last) {
  hr_ids *d = s->ids;
  range_add(d->discard, HR_DISCARD_RANGES, &d->ndiscard, &d->discard_head,
            first, last);
}

static int discarded(const hr_session *s, uint32_t id) {
  const hr_ids *d = s->ids;
  return range_has(d->discard, HR_DISCARD_RANGES, d->ndiscard, d->discard_head,
                   id);
}

/* Was `id` (<= max_seen) ever opened?  Ids older than the history are
 * assumed to have been (the lenient reading once it is forgotten). */
static int was_opened(const hr_session *s, uint32_t id) {
  const hr_ids *d = s->ids;
  if (range_has(d->hist, HR_ID_HISTORY, d->nhist, d->hist_head, id))
    return 1;
  if (d->nhist == HR_ID_HISTORY && id < d->hist[d->hist_head].first)
    return 1;
  return 0;
}

/* ---- stream table -------------------------------------------------------- */

static size_t tab_lower(const hr_session *s, uint32_t id) {
  size_t lo = 0, hi = s->ntab;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (s->tab[mid]->last < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static hr_stream *find_here(const hr_session *s, uint32_t id) {
  size_t i = tab_lower(s, id);
  if (i < s->ntab && s->tab[i]->id <= id && id <= s->tab[i]->last)
    return s->tab[i];
  return NULL;
}

/* Stream ids are per session: with lanes, the stream may live in any
 * lane's table. */
hr_stream *hr__stream_find(const hr_session *s, uint32_t id) {
  hr_stream *st = find_here(s, id);
  const hr_group *g = s->grp;
  if (st || !g)
    return st;
  for (unsigned i = 0; i < g->nlanes && !st; i++)
    if (g->lanes[i] && g->lanes[i] != s)
      st = find_here(g->lanes[i], id);
  if (!st && g->joining && g->joining != s)
    st = find_here(g->joining, id);
  return st;
}

static int tab_insert(hr_session *s, hr_stream *st) {
  if (s->ntab == s->captab) {
    size_t cap = s->captab ? s->captab * 2 : 16;
    hr_stream **nt = hr__mem_realloc(&s->mem, s->tab, cap * sizeof *nt);
    if (!nt)
      return HR_ERR_NOMEM;
    s->tab = nt;
    s->captab = cap;
  }
  size_t i = tab_lower(s, st->id);
  memmove(&s->tab[i + 1], &s->tab[i], (s->ntab - i) * sizeof *s->tab);
  s->tab[i] = st;
  s->ntab++;
  return 0;
}

static void tab_remove(hr_session *s, hr_stream *st) {
  size_t i = tab_lower(s, st->id);
  while (i < s->ntab && s->tab[i] != st)
    i++;
  if (i == s->ntab)
    return;
  memmove(&s->tab[i], &s->tab[i + 1], (s->ntab - i - 1) * sizeof *s->tab);
  s->ntab--;
}

/* Stream activity holds off the idle timer of every lane. */
static void note_activity(hr_session *s) {
  s->last_activity = s->now;
  if (s->grp)
    s->grp->last_activity = s->now;
}

int hr__stream_new(hr_session *s, int kind, uint32_t id, uint32_t last,
                   hr_stream **out) {
  hr_stream *st = s->spare_streams;
  if (st) {
    s->spare_streams = st->zlink;
    s->nspare_streams--;
    memset(st, 0, sizeof *st);
  } else {
    st = hr__mem_calloc(&s->mem, 1, sizeof *st);
    if (!st)
      return HR_ERR_NOMEM;
  }
  st->s = s;
  st->kind = kind;
  st->id = id;
  st->last = last;
  hr__record_init(s, &st->rec);
  st->rec.stream_id = id;
  st->rec.kind = kind == HR_SK_SRV_GET || kind == HR_SK_CLI_GET ? HR_XFER_GET
                 : kind == HR_SK_CLI_LIST                       ? HR_XFER_LIST
                                                                : HR_XFER_PUT;
  int rv = tab_insert(s, st);
  if (rv) {
    hr__mem_free(&s->mem, st);
    return rv;
  }
  if (kind == HR_SK_SRV_PUT)
    s->puts_in++;
  note_activity(s);
  *out = st;
  return 0;
}

static void stream_release(hr_session *s, hr_stream *st) {
  hr__tx_free(s, &st->tx);
  hr__recv_free(s, &st->rv);
  hr__mem_free(&s->mem, st->sg.key);
  hr__mem_free(&s->mem, st->sg.ext_store);
  hr__mem_free(&s->mem, st->pkey);
  hr__mem_free(&s->mem, st->cg.store);
  hr__mem_free(&s->mem, st->cg.ended);
  hr__mem_free(&s->mem, st->list_msg);
  hr__mem_free(&s->mem, st->req);
  st->req = NULL;
  hr_tensor_unref(st->chunk_hold);
  hr__put_tail_unreserve(s, st);
  st->sg.key = NULL;
  st->sg.ext_store = NULL;
  st->pkey = NULL;
  st->cg.store = NULL;
  st->cg.ended = NULL;
  st->list_msg = NULL;
  st->chunk_hold = NULL;
}

static void check_drained(hr_session *s);

/* Calls fn on every session of s's group (s alone without one). */
static void each_lane(hr_session *s, void (*fn)(hr_session *, void *),
                      void *arg) {
  hr_group *g = s->grp;
  if (!g) {
    fn(s, arg);
    return;
  }
  for (unsigned i = 0; i < g->nlanes; i++)
    if (g->lanes[i] && !g->lanes[i]->deleted)
      fn(g->lanes[i], arg);
  if (g->joining && !g->joining->deleted)
    fn(g->joining, arg);
}

static void forget_stream(hr_session *s, void *st) {
  /* A frame of it may be arriving on any lane. */
  if (s->rc.st == st)
    s->rc.st = NULL;
  check_drained(s);
}

void hr__stream_end(hr_session *s, hr_stream *st) {
  if (st->ended)
    return;
  hr__io_fence_rx(s, st);
  /* Whichever lane ended it, it belongs to its owner's table. */
  s = st->s;
  st->ended = 1;
  if (st->counted) {
    st->counted = 0;
    s->nrequests--;
  }
  if (st->kind == HR_SK_SRV_PUT)
    s->puts_in--;
  hr__ready_remove(s, st);
  tab_remove(s, st);
  hr__work_detach_stream(st);
  hr__rdma_stream_end(s, st);
  stream_release(s, st);
  st->zlink = s->zombies;
  s->zombies = st;
  note_activity(s);
  each_lane(s, forget_stream, st);
}

static void free_zombies(hr_session *s) {
  while (s->zombies) {
    hr_stream *st = s->zombies;
    s->zombies = st->zlink;
    if (s->nspare_streams < HR_SPARE_MAX) {
      st->zlink = s->spare_streams;
      s->spare_streams = st;
      s->nspare_streams++;
    } else {
      hr__mem_free(&s->mem, st);
    }
  }
}

static void free_spares(hr_session *s) {
  while (s->spare_streams) {
    hr_stream *st = s->spare_streams;
    s->spare_streams = st->zlink;
    hr__mem_free(&s->mem, st);
  }
  s->nspare_streams = 0;
}

/* DRAINING with nothing left to do: the connection may close.  A lane
 * waits for the whole session: its streams may still get shards on it. */
static void check_drained(hr_session *s) {
  if (s->state == HR_CS_DRAINING && hr__session_streams(s) == 0)
    hr__session_set_state(s, HR_CS_CLOSED);
}

int hr__stream_sent(hr_session *s, hr_stream *st) {
  return s->role == HR_ROLE_SERVER ? hr__srv_stream_sent(s, st)
                                   : hr__cli_stream_sent(s, st);
}

void hr__stream_fail(hr_session *s, hr_stream *st, int status, uint32_t wire,
                     int sent, const char *msg) {
  if (st->ended)
    return;
  if (s->role == HR_ROLE_SERVER)
    hr__srv_stream_fail(s, st, status, wire, sent, msg);
  else
    hr__cli_stream_fail(s, st, status, wire, sent, msg);
}

int hr__status_for_wire(uint32_t code) {
  switch (code) {
  case HR_WIRE_NO_ERROR:
    return 0;
  case HR_WIRE_NOT_FOUND:
    return HR_ERR_NOT_FOUND;
  case HR_WIRE_CANCELLED:
    return HR_ERR_CLOSED;
  case HR_WIRE_TIMEOUT:
    return HR_ERR_TIMEOUT;
  case HR_WIRE_RESOURCE_EXHAUSTED:
    return HR_ERR_LIMIT;
  case HR_WIRE_DEVICE_UNAVAILABLE:
  case HR_WIRE_TRANSCODE_FAILED:
  case HR_WIRE_PUT_REJECTED:
  case HR_WIRE_ALREADY_EXISTS:
  case HR_WIRE_UNAUTHORIZED:
    return HR_ERR_UNSUPPORTED;
  default:
    return HR_ERR_PROTO;
  }
}

/* ---- entry/exit of public calls ------------------------------------------ */

static void session_free(hr_session *s);

static void set_now(hr_session *s, void *now) {
  if (*(hr_tstamp *)now > s->now)
    s->now = *(hr_tstamp *)now;
}

/* With lanes, one lane's input runs code on behalf of another (a shard
 * lands in lane 0's GET): every lane shares the clock and the bracket. */
static void enter(hr_session *s, hr_tstamp now) {
  s->depth++;
  if (s->grp)
    s->grp->depth++;
  if (now != HR_TSTAMP_NEVER)
    each_lane(s, set_now, &now);
}

static void settle_one(hr_session *s) {
  free_zombies(s);
  if (s->del_pending) {
    s->del_pending = 0;
    hr_session_del(s);
  }
}

/* No call runs on any lane: free what lanes ended, run deferred deletes
 * (which may change the lanes, hence the restart). */
static void group_settle(hr_group *g) {
  g->refs++;
  for (int again = 1; again;) {
    again = 0;
    for (unsigned i = 0; i < g->nlanes && !again; i++) {
      hr_session *l = g->lanes[i];
      if (l && !l->deleted) {
        again = l->del_pending;
        settle_one(l);
      }
    }
    if (!again && g->joining && !g->joining->deleted) {
      again = g->joining->del_pending;
      settle_one(g->joining);
    }
  }
  hr__group_unref(g);
}

static void leave(hr_session *s) {
  hr_group *g = s->grp;
  if (s->depth == 1)
    hr__devrx_track_pause(s);
  s->depth--;
  if (g) {
    if (--g->depth == 0)
      group_settle(g);
    return;
  }
  if (s->depth == 0)
    settle_one(s);
}

static int in_callback(const hr_session *s) {
  return s->in_cb || (s->grp && s->grp->in_cb);
}

void hr__api_enter(hr_session *s) { enter(s, HR_TSTAMP_NEVER); }
void hr__api_leave(hr_session *s) { leave(s); }

/* ---- errors -------------------------------------------------------------- */

static void fail_all(hr_session *s, int status, uint32_t wire, int sent,
                     const char *msg) {
  while (s->ntab) {
    hr_stream *st = s->tab[s->ntab - 1];
    hr__stream_fail(s, st, status, wire, sent, msg);
    if (!st->ended)
      hr__stream_end(s, st);
  }
  /* PINGs never answered. */
  while (s->pings) {
    hr_ping *p = s->pings;
    s->pings = p->next;
    if (p->cb) {
      hr__cb_enter(s);
      p->cb(s, HR_ERR_CLOSED, 0, p->ud);
      hr__cb_leave(s);
    }
    hr__ping_free(s, p);
  }
  /* Shards of other lanes' transfers that were to come on this one. */
  hr__group_lane_down(s);
}

/* Keeps only the partly written head item (framing must stay intact). */
static void out_truncate(hr_session *s) {
  /* A held write stops first, so that qoff says where it stopped. */
  hr__io_fence_tx(s);
  if (!s->qhead)
    return;
  if (s->qoff == 0) {
    hr__out_clear(s);
    return;
  }
  hr_oitem *keep = s->qhead, *it = keep->next;
  keep->next = NULL;
  s->qtail = keep;
  hr_oitem *head = s->qhead;
  size_t off = s->qoff;
  s->qhead = it;
  s->qoff = 0;
  hr__out_clear(s);
  s->qhead = s->qtail = head;
  s->qoff = off;
  s->frame_queued = head->is_frame ? head->l1 + head->l2 : 0;
  s->ctrl_queued = head->ctrl ? head->l1 : 0;
}

static int conn_error_status(hr_session *s, uint32_t code, const char *text,
                             int status) {
  if (s->state == HR_CS_CLOSED)
    return 0;
  out_truncate(s);
  int rv = 0;
  /* An ERROR may be sent before the HELLOs too (§ 6, § 18). */
  rv = hr__out_error(s, 0, code, text);
  s->closing_error = code;
  hr__session_set_state(s, HR_CS_CLOSED);
  if (s->cbs.on_error) {
    hr__cb_enter(s);
    s->cbs.on_error(s, code, 1, text, s->ud);
    hr__cb_leave(s);
  }
  fail_all(s, status, code, 1, text);
  return hr__fatal(s, rv);
}

int hr__conn_error(hr_session *s, uint32_t code, const char *text) {
  return conn_error_status(s, code, text, HR_ERR_PROTO);
}

int hr__stream_error(hr_session *s, uint32_t sid, uint32_t code,
                     const char *text) {
  /* An open stream's ERROR goes out on the lane that owns it: the shard's
   * lane on a server, lane 0 on a client (§ 25.2). */
  hr_stream *owner = hr__stream_find(s, sid);
  if (owner)
    s = owner->s;
  int rv = hr__out_error(s, sid, code, text);
  if (rv)
    return hr__fatal(s, rv);
  if (s->ctrl_queued > HR_CTRL_BACKLOG_MAX)
    return conn_error_status(s, HR_WIRE_RESOURCE_EXHAUSTED,
                             "control backlog flood", HR_ERR_LIMIT);
  hr_stream *st = hr__stream_find(s, sid);
  uint32_t first = sid, last = sid;
  if (st) {
    first = st->id;
    last = st->last;
    /* The other shards of a client GET would go on streaming. */
    if (s->role == HR_ROLE_CLIENT && st->kind == HR_SK_CLI_GET &&
        st->last > st->id) {
      rv = hr__cli_cancel_others(st->s, st, sid);
      if (rv)
        return rv;
    }
    hr__stream_fail(st->s, st, HR_ERR_PROTO, code, 1, text);
    if (!st->ended)
      hr__stream_end(st->s, st);
  }
  /* Whatever the peer already sent on it is dropped silently. */
  hr__discard_add(s, first, last);
  return 0;
}

/* ---- HELLO --------------------------------------------------------------- */

static const uint8_t hello_layouts[] = {
    HR_LAYOUT_ROW_MAJOR,     HR_LAYOUT_COLUMN_MAJOR, HR_LAYOUT_STRIDED,
    HR_LAYOUT_PERMUTED,      HR_LAYOUT_TILED,        HR_LAYOUT_SPARSE_COO,
    HR_LAYOUT_SPARSE_CSR,    HR_LAYOUT_SPARSE_CSC,   HR_LAYOUT_SPARSE_BSR,
    HR_LAYOUT_COMPOSITE,     HR_LAYOUT_PANEL,        HR_LAYOUT_TILED_EXACT,
    HR_LAYOUT_PERMUTED_EXACT};

static const uint8_t cpu_only[1] = {HR_DEV_CPU};
static const uint8_t std_memory[1] = {HR_MEM_STANDARD};

static int send_hello(hr_session *s, uint16_t minor) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type =
      s->role == HR_ROLE_CLIENT ? HR_MSG_CLIENT_HELLO : HR_MSG_SERVER_HELLO;
  hr_hello *h = &m.u.hello;
  h->magic = HR_MAGIC;
  h->version_major = HR_VERSION_MAJOR_WIRE;
  h->version_minor = minor;
  h->capability_flags = s->our_caps;
  h->max_message_size = s->set.max_message_size;
  h->layout_count = (uint16_t)sizeof hello_layouts;
  for (unsigned i = 0; i < sizeof hello_layouts; i++)
    h->layouts[i].tag = hello_layouts[i];
  h->devices = s->set.devices ? s->set.devices : cpu_only;
  h->device_count = s->set.devices ? s->set.device_count : 1;
  h->memory_classes = std_memory;
  h->memory_class_count = 1;
  if (hr__shm_dev_advertise(s)) {
    h->memory_classes = hr__shm_dev_classes;
    h->memory_class_count = 2; /* PINNED: exported device memory */
  }
  uint8_t ext[HR_MAX_KEY + 256 + 64 + 4 + HR_TOKEN_MAX + 1024];
  size_t n = 0;
  int w;
  uint16_t count = 0;
  if (s->role == HR_ROLE_CLIENT && s->set.auth_token) {
    w = hr_ext_put(ext + n, sizeof ext - n, HR_EXT_AUTH_TOKEN,
                   s->set.auth_token, s->set.auth_token_len);
    if (w > 0) {
      n += (size_t)w;
      count++;
    }
  }
  const char *name = s->set.peer_name;
  w = hr_ext_put(ext + n, sizeof ext - n, HR_EXT_PEER_NAME, name,
                 (uint16_t)strlen(name));
  if (w > 0) {
    n += (size_t)w;
    count++;
  }
  if (s->role == HR_ROLE_SERVER) {
    uint8_t ms[2] = {(uint8_t)(s->set.max_shards & 0xFF),
                     (uint8_t)(s->set.max_shards >> 8)};
    w = hr_ext_put(ext + n, sizeof ext - n, HR_EXT_MAX_SHARDS, ms, 2);
    if (w > 0) {
      n += (size_t)w;
      count++;
    }
  }
  /* Lanes: the server names the session (every lane's SERVER_HELLO
   * carries the same token); a joining client sends it back. */
  if (s->grp && s->grp->token_len) {
    uint16_t type =
        s->role == HR_ROLE_SERVER ? HR_EXT_SESSION_TOKEN : HR_EXT_SESSION_JOIN;
    w = hr_ext_put(ext + n, sizeof ext - n, type, s->grp->token,
                   s->grp->token_len);
    if (w > 0) {
      n += (size_t)w;
      count++;
    }
  }
  /* Extensions of the data planes (FABRIC_ADDRESS), already encoded. */
  uint16_t xlen = 0, xcount = 0;
  const uint8_t *x = hr__rdma_hello_ext(s, &xlen, &xcount);
  if (x && xlen <= sizeof ext - n) {
    memcpy(ext + n, x, xlen);
    n += xlen;
    count = (uint16_t)(count + xcount);
  }
  h->ext_count = count;
  h->ext_raw = ext;
  h->ext_raw_len = n;
  return hr__out_msg(s, &m, 0);
}

/* Keeps a copy of the peer's HELLO (decoded again from our own bytes so
 * that its pointers stay valid). */
static int keep_peer_hello(hr_session *s, const hr_msg_header *hdr,
                           const uint8_t *payload, hr_wire_status *ws) {
  size_t n = HR_HEADER_SIZE + hdr->payload_length;
  uint8_t *copy = hr__mem_malloc(&s->mem, n);
  if (!copy)
    return HR_ERR_NOMEM;
  hr_wire_put_header(copy, hdr->type, hdr->stream_id, hdr->payload_length);
  /* An empty payload comes as NULL: memcpy() must not see it. */
  if (hdr->payload_length > 0)
    memcpy(copy + HR_HEADER_SIZE, payload, hdr->payload_length);
  hr_msg m;
  int rv = hr_wire_decode_payload(hdr, copy + HR_HEADER_SIZE, &s->wctx, &m, ws);
  if (rv) {
    hr__mem_free(&s->mem, copy);
    return rv;
  }
  hr__mem_free(&s->mem, s->peer_store);
  s->peer_store = copy;
  s->peer = m.u.hello;
  s->have_peer = 1;
  return 0;
}

static int established(hr_session *s) {
  hr__session_set_state(s, HR_CS_ESTABLISHED);
  s->shm_ok = (s->our_caps & HR_CAP_SHM_DATA_PLANE) &&
              (s->peer.capability_flags & HR_CAP_SHM_DATA_PLANE);
  s->peer_max = s->peer.max_message_size;
  int rv = hr__rdma_established(s);
  if (rv)
    return hr__fatal(s, rv);
  if (s->cbs.on_established) {
    hr__cb_enter(s);
    s->cbs.on_established(s, &s->peer, s->ud);
    hr__cb_leave(s);
  }
  if (s->role == HR_ROLE_CLIENT)
    return hr__cli_established(s);
  return 0;
}

static int on_hello(hr_session *s, const hr_msg_header *hdr,
                    const uint8_t *payload) {
  hr_wire_status ws = {0, 0, NULL};
  int rv = keep_peer_hello(s, hdr, payload, &ws);
  if (rv == HR_ERR_PROTO)
    return hr__conn_error(s, ws.code, ws.reason);
  if (rv)
    return hr__fatal(s, rv);
  if (s->role == HR_ROLE_CLIENT) {
    if (s->peer.version_minor > HR_VERSION_MINOR_WIRE)
      return hr__conn_error(s, HR_WIRE_UNSUPPORTED_VERSION,
                            "SERVER_HELLO version_minor above ours");
    const char *why = NULL;
    if (hr__group_on_server_hello(s, &why))
      return hr__conn_error(s, HR_WIRE_PROTOCOL_VIOLATION, why);
    s->peer_max_shards = s->peer.exts.max_shards;
    return established(s);
  }
  for (uint16_t i = 0; i < s->peer.device_count; i++)
    if (s->peer.devices[i] == HR_DEV_CPU)
      s->client_has_cpu = 1;
  if (s->has_prov &&
      s->prov.size >=
          offsetof(hr_provider, on_hello) + sizeof s->prov.on_hello &&
      s->prov.on_hello) {
    uint32_t wire = 0;
    hr__cb_enter(s);
    rv = s->prov.on_hello(s, &s->peer, &wire, s->prov.user_data);
    hr__cb_leave(s);
    if (rv)
      return hr__fatal(s, HR_ERR_CALLBACK_FAILURE);
    if (wire)
      return conn_error_status(s, wire, "connection refused", HR_ERR_REMOTE);
  }
  /* A new session, or a lane joining one (§ 14.5). */
  uint32_t wire = 0;
  const char *why = NULL;
  rv = hr__group_on_client_hello(s, &wire, &why);
  if (rv < 0)
    return hr__fatal(s, rv);
  if (rv)
    return conn_error_status(s, wire, why, HR_ERR_REMOTE);
  /* We answer with the lower of the two minors (§ 6). */
  uint16_t minor = HR_VERSION_MINOR_WIRE;
  if (s->peer.version_minor < minor)
    minor = s->peer.version_minor;
  rv = send_hello(s, minor);
  if (rv)
    return hr__fatal(s, rv);
  return established(s);
}

/* ---- connection-level messages ------------------------------------------- */

static int queue_ctrl(hr_session *s, const hr_msg *m) {
  int rv = hr__out_msg(s, m, 1);
  if (rv)
    return hr__fatal(s, rv);
  if (s->ctrl_queued > HR_CTRL_BACKLOG_MAX)
    return conn_error_status(s, HR_WIRE_RESOURCE_EXHAUSTED,
                             "control backlog flood", HR_ERR_LIMIT);
  return 0;
}

static int on_goaway(hr_session *s, const hr_goaway *g) {
  s->goaway_recv = 1;
  s->goaway_peer_last = g->last_stream_id;
  if (s->cbs.on_goaway) {
    hr__cb_enter(s);
    s->cbs.on_goaway(s, g, s->ud);
    hr__cb_leave(s);
  }
  if (s->state == HR_CS_CLOSED)
    return 0;
  if (s->role == HR_ROLE_CLIENT)
    hr__cli_goaway(s, g->last_stream_id);
  if (s->state == HR_CS_ESTABLISHED)
    hr__session_set_state(s, HR_CS_DRAINING);
  check_drained(s);
  return 0;
}

static int on_conn_msg(hr_session *s, const hr_msg *m) {
  switch (m->hdr.type) {
  case HR_MSG_PING: {
    hr_msg r;
    memset(&r, 0, sizeof r);
    r.hdr.type = HR_MSG_PONG;
    r.u.ping = m->u.ping;
    int rv = queue_ctrl(s, &r);
    if (rv == 0 && s->role == HR_ROLE_SERVER)
      hr__report_request(s, HR_XFER_PING, 0, NULL, 0, 0, NULL);
    return rv;
  }
  case HR_MSG_PONG:
    hr__cli_pong(s, m->u.ping);
    return 0;
  case HR_MSG_GOAWAY:
    return on_goaway(s, &m->u.goaway);
  case HR_MSG_ERROR: {
    char text[HR_MAX_TEXT + 1];
    hr__set_msg(text, sizeof text, (const char *)m->u.error.message,
                m->u.error.message_len);
    uint32_t code = m->u.error.code > HR_WIRE_ERROR_LAST ? HR_WIRE_INTERNAL
                                                         : m->u.error.code;
    s->refused = s->state == HR_CS_AWAIT_HELLO;
    out_truncate(s);
    hr__session_set_state(s, HR_CS_CLOSED);
    if (s->cbs.on_error) {
      hr__cb_enter(s);
      s->cbs.on_error(s, code, 0, text, s->ud);
      hr__cb_leave(s);
    }
    fail_all(s, HR_ERR_REMOTE, code, 0, text);
    return 0;
  }
  default:
    return hr__conn_error(s, HR_WIRE_PROTOCOL_VIOLATION,
                          "message not allowed on stream 0");
  }
}

/* ---- classification ------------------------------------------------------ */

static int is_race(uint32_t type) {
  return type == HR_MSG_CANCEL || type == HR_MSG_BUFFER_RELEASE ||
         type == HR_MSG_ERROR;
}

static int classify(hr_session *s, const hr_msg_header *h, hr_stream **st) {
  uint32_t t = h->type, sid = h->stream_id;
  *st = NULL;
  if (s->state == HR_CS_AWAIT_HELLO) {
    uint32_t want =
        s->role == HR_ROLE_SERVER ? HR_MSG_CLIENT_HELLO : HR_MSG_SERVER_HELLO;
    if (t == want && sid == 0)
      return K_HELLO;
    if (s->role == HR_ROLE_CLIENT && t == HR_MSG_ERROR && sid == 0)
      return K_CONN;
    return K_CONN_PV;
  }
  if (t > HR_MSG_LAST_DEFINED)
    return K_CONN_PV;
  int r = route[s->role][t];
  if (sid == 0)
    return r == R_CONN || t == HR_MSG_ERROR ? K_CONN : K_CONN_PV;
  if (r == R_OPEN)
    return sid > s->ids->max_seen ? K_OPEN : K_CONN_PV;
  if (r == R_CONN || r == R_BAD_CONN)
    return K_CONN_PV;
  hr_stream *found = hr__stream_find(s, sid);
  if (found) {
    *st = found;
    return r == R_BAD_STREAM ? K_STREAM_PV : K_STREAM;
  }
  if (discarded(s, sid))
    return K_DROP;
  if (sid <= s->ids->max_seen && was_opened(s, sid))
    return r == R_STREAM && is_race(t) ? K_DROP : K_STREAM_PV;
  return K_CONN_PV;
}

/* ---- receive ------------------------------------------------------------- */

/* A message for stream `st` arrived on lane `s`.  The stream's owner
 * handles it, whichever lane carried it, so that what it answers goes
 * out on the owner's lane. */
static int stream_msg(hr_session *s, hr_stream *st, const hr_msg *m) {
  hr_session *o = st->s;
  if (s->grp && s->lane >= 0 && s->lane < 64)
    st->lane_mask |= (uint64_t)1 << s->lane;
  int rv = hr__rdma_stream_msg(o, st, m);
  if (rv < 0)
    return hr__fatal(o, rv);
  if (rv)
    return 0;
  return o->role == HR_ROLE_SERVER ? hr__srv_on_stream_msg(o, st, m)
                                   : hr__cli_on_stream_msg(o, st, m);
}

static int on_message(hr_session *s, const hr_msg_header *hdr,
                      const uint8_t *payload) {
  hr_stream *st;
  if (s->npfds) {
    int rv = hr__shm_check_fds(s, s->msg_start);
    if (rv || s->state == HR_CS_CLOSED)
      return rv;
  }
  /* A segment's lease outlives its stream: BUFFER_RELEASE comes after
   * TENSOR_DATA_END by design, and an ERROR there means the client could
   * not map it (both are otherwise dropped as races, § 18). */
  if (s->sleases && hdr->stream_id &&
      ((hdr->type == HR_MSG_BUFFER_RELEASE && hdr->payload_length == 0) ||
       hdr->type == HR_MSG_ERROR))
    hr__shm_lease_drop(s, hdr->stream_id, hdr->type == HR_MSG_ERROR);
  int k = classify(s, hdr, &st);
  hr_wire_status ws = {0, 0, NULL};
  hr_msg m;
  switch (k) {
  case K_CONN_PV:
    return hr__conn_error(s, HR_WIRE_PROTOCOL_VIOLATION,
                          s->state == HR_CS_AWAIT_HELLO
                              ? "message before the HELLO exchange"
                              : "message on a stream it may not use");
  case K_DROP:
    return 0;
  case K_STREAM_PV:
    return hr__stream_error(s, hdr->stream_id, HR_WIRE_PROTOCOL_VIOLATION,
                            "message not allowed on this stream");
  case K_HELLO:
    return on_hello(s, hdr, payload);
  default:
    break;
  }
  int rv = hr_wire_decode_payload(hdr, payload, &s->wctx, &m, &ws);
  if (rv == HR_ERR_PROTO) {
    if (k == K_CONN)
      return hr__conn_error(s, ws.code, ws.reason);
    if (k == K_OPEN)
      hr__hist_add(s, hdr->stream_id, hdr->stream_id);
    return hr__stream_error(s, hdr->stream_id, ws.code, ws.reason);
  }
  if (rv)
    return hr__fatal(s, rv);
  m.hdr = *hdr;
  switch (k) {
  case K_CONN:
    return on_conn_msg(s, &m);
  case K_OPEN:
    return hr__srv_on_open(s, &m, &ws);
  case K_STREAM:
    return stream_msg(s, st, &m);
  default:
    return HR_ERR_INTERNAL;
  }
}

/* Every byte of the frame was placed (or discarded). */
static int frame_complete(hr_session *s) {
  s->rc.active = 0;
  s->rc.st = NULL;
  return 0;
}

/* Copies received frame bytes (at the frame's current position) into
 * place.  Does not advance the frame: the caller does, for placed and
 * discarded bytes alike. */
static int place(hr_session *s, const uint8_t *p, size_t n) {
  hr_stream *st = s->rc.st;
  uint64_t off = s->rc.next;
  if (n && st && !st->ended && st->rv.dev) {
    /* A GET into device memory: its staging ring places the bytes. */
    st->rv.bytes += n;
    int rc = hr__devrx_place(&st->rv, s->rc.buffer_index, off, p, n);
    return rc ? hr__stream_error(s, s->rc.stream_id,
                                 HR_WIRE_RESOURCE_EXHAUSTED,
                                 rc == HR_ERR_UNSUPPORTED
                                     ? "frames beyond the device staging ring"
                                     : "no room in the device staging ring")
              : 0;
  }
  while (n && st && !st->ended) {
    uint64_t run = 0;
    uint8_t *dst =
        hr__recv_where(&st->rv, s->rc.stream_id, s->rc.buffer_index, off, &run);
    if (!dst || run == 0)
      return hr__stream_error(s, s->rc.stream_id, HR_WIRE_INTERNAL,
                              "no destination for frame bytes");
    size_t c = run < n ? (size_t)run : n;
    memcpy(dst, p, c);
    st->rv.bytes += c;
    if (st->rv.dev)
      hr__devrx_landed(&st->rv, s->rc.buffer_index, off, c);
    p += c;
    n -= c;
    off += c;
  }
  return 0;
}

static int on_data(hr_session *s, const hr_reader_event *ev) {
  if (ev->first && s->npfds) {
    int rv = hr__shm_check_fds(s, s->msg_start);
    if (rv || s->state == HR_CS_CLOSED)
      return rv;
  }
  if (ev->first) {
    hr_stream *st;
    s->rc.active = 1;
    s->rc.st = NULL;
    s->rc.stream_id = ev->hdr.stream_id;
    s->rc.buffer_index = ev->buffer_index;
    s->rc.next = ev->frame_offset;
    s->rc.left = ev->frame_len;
    int k = classify(s, &ev->hdr, &st);
    int rv = 0;
    switch (k) {
    case K_CONN_PV:
      return hr__conn_error(s, HR_WIRE_PROTOCOL_VIOLATION,
                            s->state == HR_CS_AWAIT_HELLO
                                ? "message before the HELLO exchange"
                                : "TENSOR_DATA on a stream never opened");
    case K_STREAM_PV:
      rv = hr__stream_error(s, ev->hdr.stream_id, HR_WIRE_PROTOCOL_VIOLATION,
                            "TENSOR_DATA not allowed on this stream");
      break;
    case K_STREAM: {
      hr_msg m;
      memset(&m, 0, sizeof m);
      m.hdr = ev->hdr;
      m.u.data.buffer_index = ev->buffer_index;
      m.u.data.offset = ev->frame_offset;
      m.u.data.data_len = ev->frame_len;
      rv = stream_msg(s, st, &m);
      /* Accepted: the frame's bytes go to the stream's destination (this
       * lane's cursor, whichever lane owns the stream). */
      if (rv == 0 && !st->ended)
        s->rc.st = st;
      break;
    }
    default: /* K_DROP: discard the bytes */
      break;
    }
    if (rv)
      return rv;
  }
  if (!s->rc.active)
    return 0;
  size_t n = ev->len;
  if (n > s->rc.left)
    return hr__conn_error(s, HR_WIRE_INTERNAL, "frame reader overran");
  if (n && s->rc.st) {
    int rv = place(s, ev->data, n);
    if (rv)
      return rv;
  }
  s->rc.next += n;
  s->rc.left -= n;
  if (s->rc.left == 0)
    return frame_complete(s);
  return 0;
}

/* A message the reader rejected from its header (or a TENSOR_DATA
 * sub-header).  An unknown type is answered on its stream whatever the
 * stream (§ 18: type before placement).  Otherwise placement comes first:
 * on a never-opened id it is the never-opened rule (stream 0); on an
 * ended one, PROTOCOL_VIOLATION on it; on an open one, the reader's code
 * on it.  Late bytes of a stream we already refused are dropped. */
static int on_reader_error(hr_session *s, const hr_reader_event *ev) {
  uint32_t sid = ev->hdr.stream_id;
  if (ev->fatal || sid == 0 || s->state == HR_CS_AWAIT_HELLO)
    return hr__conn_error(s, ev->status.code, ev->status.reason);
  if (ev->status.code == HR_WIRE_UNKNOWN_MESSAGE_TYPE ||
      hr__stream_find(s, sid))
    return hr__stream_error(s, sid, ev->status.code, ev->status.reason);
  if (discarded(s, sid))
    return 0;
  if (sid <= s->ids->max_seen && was_opened(s, sid))
    return hr__stream_error(s, sid, HR_WIRE_PROTOCOL_VIOLATION,
                            "message on an ended stream");
  return hr__conn_error(s, HR_WIRE_PROTOCOL_VIOLATION,
                        "message on a stream never opened");
}

int64_t hr_session_recv(hr_session *s, const uint8_t *in, size_t len,
                        hr_tstamp now) {
  if (!s || (!in && len))
    return HR_ERR_INVALID_ARGUMENT;
  if (in_callback(s))
    return HR_ERR_IN_CALLBACK;
  if (s->fatal)
    return s->fatal;
  enter(s, now);
  size_t pos = 0;
  int rv = 0;
  /* The read timeout runs from the first byte of a message header or
   * control payload, so a peer trickling a header a byte at a time is cut
   * off; inside a TENSOR_DATA payload every piece counts as progress. */
  int progress = hr_reader_at_boundary(s->rd);
  if (len) {
    s->last_rx = s->now;
    s->keepalive_out = 0;
  }
  while (pos < len && s->state != HR_CS_CLOSED && !s->fatal) {
    hr_reader_event ev;
    int64_t n = hr_reader_feed(s->rd, in + pos, len - pos, &ev);
    if (n < 0) {
      rv = hr__fatal(s, (int)n);
      break;
    }
    pos += (size_t)n;
    if (ev.kind == HR_RD_NONE)
      break;
    /* Where the message began in the input: SHM descriptors are matched
     * to the message that carried them by it. */
    if (ev.kind == HR_RD_MESSAGE)
      s->msg_start = s->rx_total + pos - HR_HEADER_SIZE - ev.hdr.payload_length;
    else if (ev.kind == HR_RD_DATA && ev.first)
      s->msg_start = s->rx_total + pos - ev.len - 24;
    progress = 1;
    switch (ev.kind) {
    case HR_RD_MESSAGE:
      rv = on_message(s, &ev.hdr, ev.payload);
      break;
    case HR_RD_DATA:
      rv = on_data(s, &ev);
      break;
    case HR_RD_ERROR:
      rv = on_reader_error(s, &ev);
      break;
    default:
      break;
    }
    if (rv < 0 && hr_err_is_fatal(rv))
      break;
    rv = 0;
  }
  s->rx_total += len;
  if (len && progress)
    s->msg_started = s->now;
  if (s->fatal)
    rv = s->fatal;
  leave(s);
  return rv < 0 ? rv : (int64_t)len;
}

int hr_session_recv_target(hr_session *s, void **dst, size_t *len) {
  if (!s || !dst || !len || in_callback(s) || s->fatal ||
      s->state == HR_CS_CLOSED)
    return 0;
  uint8_t bi;
  uint64_t off;
  uint64_t pending = hr_reader_data_pending(s->rd, &bi, &off);
  if (!pending || !s->rc.active || !s->rc.st || s->rc.st->ended)
    return 0;
  uint64_t run = 0;
  uint8_t *p = hr__recv_where(&s->rc.st->rv, s->rc.stream_id, bi, off, &run);
  if (!p || !run)
    return 0;
  uint64_t n = pending < run ? pending : run;
  if (n > s->rc.left)
    n = s->rc.left;
  if (n > SIZE_MAX)
    n = SIZE_MAX;
  *dst = p;
  *len = (size_t)n;
  return 1;
}

int hr_session_recv_placed(hr_session *s, size_t n, hr_tstamp now) {
  if (!s)
    return HR_ERR_INVALID_ARGUMENT;
  if (in_callback(s))
    return HR_ERR_IN_CALLBACK;
  s->rx_held = 0;
  if (s->fatal)
    return s->fatal;
  if (!s->rc.active || n > s->rc.left)
    return HR_ERR_INVALID_ARGUMENT;
  if (hr_reader_skip_data(s->rd, n))
    return HR_ERR_INVALID_ARGUMENT;
  enter(s, now);
  s->rx_total += n;
  if (n) {
    s->last_rx = s->now;
    s->msg_started = s->now;
    s->keepalive_out = 0;
  }
  if (s->rc.st) {
    s->rc.st->rv.bytes += n;
    if (s->rc.st->rv.dev)
      hr__devrx_landed(&s->rc.st->rv, s->rc.buffer_index, s->rc.next, n);
  }
  s->rc.next += n;
  s->rc.left -= n;
  int rv = 0;
  if (s->rc.left == 0)
    rv = frame_complete(s);
  if (s->fatal)
    rv = s->fatal;
  leave(s);
  return rv < 0 && hr_err_is_fatal(rv) ? rv : 0;
}

/* ---- asynchronous I/O ---------------------------------------------------- */

int hr_session_io_hold(hr_session *s, int dir) {
  if (!s || !s->cbs.io_fence || (dir != HR_IO_TX && dir != HR_IO_RX))
    return HR_ERR_INVALID_ARGUMENT;
  if (dir == HR_IO_TX) {
    if (s->tx_held || !s->qhead)
      return HR_ERR_STATE;
    s->tx_held = 1;
  } else {
    if (s->rx_held || !s->rc.active || !s->rc.st)
      return HR_ERR_STATE;
    s->rx_held = 1;
  }
  return 0;
}

void hr__io_fence_tx(hr_session *s) {
  size_t w;

  if (!s->tx_held)
    return;
  s->tx_held = 0;
  w = s->cbs.io_fence(s, HR_IO_TX, s->ud);
  s->consumed += w;
  if (w)
    s->tx_progress = s->now;
  hr__out_consume(s, w);
}

static void fence_rx_lane(hr_session *s, void *st) {
  if (s->rx_held && s->rc.st == st) {
    s->rx_held = 0;
    s->cbs.io_fence(s, HR_IO_RX, s->ud);
  }
}

void hr__io_fence_rx(hr_session *s, hr_stream *st) {
  each_lane(s, fence_rx_lane, st);
}

/* ---- output -------------------------------------------------------------- */

int hr_session_pull(hr_session *s, hr_iov *iov, int max, hr_tstamp now) {
  if (!s || (!iov && max > 0) || max < 0)
    return HR_ERR_INVALID_ARGUMENT;
  if (in_callback(s))
    return HR_ERR_IN_CALLBACK;
  if (s->fatal)
    return s->fatal;
  if (s->tx_held)
    return 0; /* the held iovecs are still being written */
  enter(s, now);
  int rv = s->cleases ? hr__shm_flush_releases(s) : 0;
  if (rv == 0)
    rv = hr__schedule(s);
  if (rv < 0)
    hr__fatal(s, rv);
  int n = s->fatal ? s->fatal : hr__out_iov(s, iov, max);
  leave(s);
  return n;
}

void hr_session_consumed(hr_session *s, size_t n, hr_tstamp now) {
  if (!s)
    return;
  s->tx_held = 0;
  if (now != HR_TSTAMP_NEVER && now > s->now)
    s->now = now;
  s->consumed += n;
  if (n)
    s->tx_progress = s->now;
  hr__out_consume(s, n);
}

int hr_session_want_read(const hr_session *s) {
  return s && !s->fatal && s->state != HR_CS_CLOSED;
}

int hr_session_recv_paused(const hr_session *s) {
  if (!s || s->fatal || s->state == HR_CS_CLOSED)
    return 0;
  if (s->dev_spilling)
    return 1;
  if (!s->rc.active || !s->rc.st || s->rc.st->ended || !s->rc.st->rv.dev)
    return 0;
  uint8_t bi;
  uint64_t off;
  if (!hr_reader_data_pending(s->rd, &bi, &off))
    return 0;
  return hr__devrx_full(&s->rc.st->rv, bi, off);
}

int hr_session_want_write(const hr_session *s) {
  if (!s || s->fatal)
    return 0;
  if (s->qhead)
    return 1;
  if (s->state == HR_CS_CLOSED || s->state == HR_CS_AWAIT_HELLO)
    return 0;
  if (s->cleases && hr__shm_release_due(s))
    return 1;
  if (!s->rhead)
    return 0;
  /* Streams are ready; frames wait only for the budget. */
  return s->frame_queued < s->set.send_budget;
}

/* ---- timers -------------------------------------------------------------- */

static hr_tstamp add_ts(hr_tstamp a, uint64_t b) {
  return a > HR_TSTAMP_NEVER - b ? HR_TSTAMP_NEVER : a + b;
}

static hr_tstamp min_ts(hr_tstamp a, hr_tstamp b) { return a < b ? a : b; }

/* Since when the read timeout runs: from the start of a message we are
 * inside, or, between messages, from the last input while a PUT we
 * receive waits for its next frame (a PUT opened and never finished must
 * not hold its landing buffer forever). */
static hr_tstamp read_since(const hr_session *s) {
  if (!hr_reader_at_boundary(s->rd))
    return s->msg_started;
  if (s->puts_in)
    return s->last_rx;
  return HR_TSTAMP_NEVER;
}

/* Idle counts the whole session: a lane with no stream of its own carries
 * the shards of streams that live on other lanes. */
static hr_tstamp idle_since(const hr_session *s) {
  if (s->grp && s->grp->last_activity > s->last_activity)
    return s->grp->last_activity;
  return s->last_activity;
}

/* CLOSED with output queued: the peer must take some of it within this
 * long, or the rest is dropped (a peer that never reads would otherwise
 * hold the connection for ever, its final ERROR unsent). */
static uint64_t flush_timeout(const hr_session *s) {
  return s->set.read_timeout ? s->set.read_timeout : 10ull * 1000000000ull;
}

hr_tstamp hr_session_get_expiry(const hr_session *s) {
  if (!s || s->fatal)
    return HR_TSTAMP_NEVER;
  /* A PUT ended inside the call that queued it: its callback is due. */
  if (s->put_due)
    return s->now;
  if (s->state == HR_CS_CLOSED)
    return s->qhead ? add_ts(s->tx_progress, flush_timeout(s))
                    : HR_TSTAMP_NEVER;
  hr_tstamp t = HR_TSTAMP_NEVER;
  if (s->state == HR_CS_AWAIT_HELLO && s->set.handshake_timeout)
    t = min_ts(t, add_ts(s->created, s->set.handshake_timeout));
  /* Input paused for a device ring: the peer is not slow, we are. */
  if (s->rx_paused)
    return t;
  if (s->set.read_timeout && read_since(s) != HR_TSTAMP_NEVER)
    t = min_ts(t, add_ts(read_since(s), s->set.read_timeout));
  if (s->state != HR_CS_AWAIT_HELLO && hr__session_streams(s) == 0 &&
      s->set.idle_timeout)
    t = min_ts(t, add_ts(idle_since(s), s->set.idle_timeout));
  if (s->role == HR_ROLE_CLIENT && s->state != HR_CS_AWAIT_HELLO &&
      s->set.keepalive_interval) {
    if (s->keepalive_out)
      t = min_ts(t, add_ts(s->keepalive_sent, s->set.keepalive_interval));
    else
      t = min_ts(t, add_ts(s->last_rx, s->set.keepalive_interval));
  }
  return t;
}

void hr__ping_free(hr_session *s, hr_ping *p) {
  /* A PING still queued (a connection error keeps the partly written head
   * of the queue) must not stamp freed memory when it is pulled. */
  if (p->item)
    p->item->ping = NULL;
  hr__mem_free(&s->mem, p);
}

int hr__ping_send(hr_session *s, hr_ping_cb cb, void *ud, int keepalive) {
  hr_ping *p = hr__mem_calloc(&s->mem, 1, sizeof *p);
  if (!p)
    return HR_ERR_NOMEM;
  p->opaque = ++s->ping_seq;
  p->cb = cb;
  p->ud = ud;
  p->keepalive = keepalive;
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_PING;
  m.u.ping = p->opaque;
  int rv = hr__out_msg(s, &m, 0);
  if (rv) {
    hr__mem_free(&s->mem, p);
    return rv;
  }
  s->qtail->ping = p;
  p->item = s->qtail;
  p->next = s->pings;
  s->pings = p;
  return 0;
}

void hr__cli_pong(hr_session *s, uint64_t opaque) {
  for (hr_ping **pp = &s->pings; *pp; pp = &(*pp)->next) {
    hr_ping *p = *pp;
    /* A PONG for a PING that has not left yet answers nothing we sent. */
    if (p->opaque != opaque || !p->stamped)
      continue;
    *pp = p->next;
    if (p->cb) {
      uint64_t rtt = s->now > p->sent ? s->now - p->sent : 0;
      hr__cb_enter(s);
      p->cb(s, 0, rtt, p->ud);
      hr__cb_leave(s);
    }
    hr__ping_free(s, p);
    return;
  }
  /* An unsolicited PONG is ignored. */
}

int hr_session_handle_expiry(hr_session *s, hr_tstamp now) {
  if (!s)
    return HR_ERR_INVALID_ARGUMENT;
  if (s->fatal)
    return s->fatal;
  enter(s, now);
  int rv = 0;
  now = s->now;
  hr__put_tails_run_due(s);
  if (s->state == HR_CS_CLOSED) {
    /* Only the final flush can be due: a peer that stopped reading loses
     * what is left, and with nothing to read or write the host closes. */
    if (s->qhead && now >= add_ts(s->tx_progress, flush_timeout(s)))
      hr__out_clear(s);
  } else if (s->state == HR_CS_AWAIT_HELLO && s->set.handshake_timeout &&
             now >= add_ts(s->created, s->set.handshake_timeout)) {
    rv = conn_error_status(s, HR_WIRE_TIMEOUT, "handshake timeout",
                           HR_ERR_TIMEOUT);
  } else if (s->rx_paused) {
    /* Input paused for a device ring: neither the read timeout nor the
     * keepalive runs (hr_session_get_expiry() names neither). */
  } else if (s->set.read_timeout && read_since(s) != HR_TSTAMP_NEVER &&
             now >= add_ts(read_since(s), s->set.read_timeout)) {
    rv = conn_error_status(s, HR_WIRE_TIMEOUT,
                           hr_reader_at_boundary(s->rd)
                               ? "read timeout: a PUT stalled between frames"
                               : "read timeout: peer stalled inside a message",
                           HR_ERR_TIMEOUT);
  } else if (s->role == HR_ROLE_CLIENT && s->state != HR_CS_AWAIT_HELLO &&
             s->set.keepalive_interval && s->keepalive_out &&
             now >= add_ts(s->keepalive_sent, s->set.keepalive_interval)) {
    rv = conn_error_status(s, HR_WIRE_TIMEOUT,
                           "keepalive: the peer stopped answering",
                           HR_ERR_TIMEOUT);
  } else {
    /* Idle: no stream open and none opened or ended for idle_timeout
     * (PINGs do not count, or two keepalive peers would never idle). */
    if (s->state != HR_CS_AWAIT_HELLO && hr__session_streams(s) == 0 &&
        s->set.idle_timeout) {
      if (now >= add_ts(idle_since(s), s->set.idle_timeout) &&
          !s->goaway_sent) {
        rv = hr_session_shutdown(s, now);
        hr__session_set_state(s, HR_CS_CLOSED);
      }
    }
    if (rv == 0 && s->state != HR_CS_CLOSED && s->role == HR_ROLE_CLIENT &&
        s->set.keepalive_interval && !s->keepalive_out &&
        now >= add_ts(s->last_rx, s->set.keepalive_interval)) {
      rv = hr__ping_send(s, NULL, NULL, 1);
      if (rv == 0) {
        s->keepalive_out = 1;
        s->keepalive_sent = now;
      }
    }
  }
  if (rv < 0)
    hr__fatal(s, rv);
  if (s->fatal)
    rv = s->fatal;
  leave(s);
  return rv < 0 && hr_err_is_fatal(rv) ? rv : 0;
}

/* ---- lifecycle ----------------------------------------------------------- */

void hr_session_terminate(hr_session *s, hr_tstamp now) {
  if (!s)
    return;
  enter(s, now);
  if (s->state != HR_CS_CLOSED)
    hr__session_set_state(s, HR_CS_CLOSED);
  hr__out_clear(s);
  fail_all(s, HR_ERR_CLOSED, 0, 0, "connection closed");
  hr__put_tails_run_due(s);
  /* The connection's end releases every segment the client held. */
  hr__shm_free(s);
  leave(s);
}

int hr_session_shutdown(hr_session *s, hr_tstamp now) {
  if (!s)
    return HR_ERR_INVALID_ARGUMENT;
  if (s->fatal)
    return s->fatal;
  if (s->goaway_sent || s->state == HR_CS_CLOSED)
    return 0;
  enter(s, now);
  int rv = 0;
  if (s->state == HR_CS_AWAIT_HELLO) {
    /* Nothing but a HELLO may go first: just close. */
    hr__session_set_state(s, HR_CS_CLOSED);
    fail_all(s, HR_ERR_CLOSED, 0, 0, "session shut down");
  } else {
    hr_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = HR_MSG_GOAWAY;
    /* The last request accepted, counted by its first id (§ 18); a
     * client names the last stream it opened. */
    m.u.goaway.last_stream_id = s->goaway_last = s->role == HR_ROLE_SERVER
                                                     ? s->ids->last_open_first
                                                     : s->ids->next_id - 1;
    m.u.goaway.code = HR_WIRE_NO_ERROR;
    rv = hr__out_msg(s, &m, 0);
    if (rv == 0) {
      s->goaway_sent = 1;
      if (s->state == HR_CS_ESTABLISHED)
        hr__session_set_state(s, HR_CS_DRAINING);
      check_drained(s);
    }
  }
  if (rv < 0)
    hr__fatal(s, rv);
  leave(s);
  return rv;
}

void hr_session_work_done(hr_session *s, hr_work *w, hr_tstamp now) {
  if (!s || !w)
    return;
  if (s->deleted) {
    /* The session is gone: the item only frees what it holds. */
    w->done(w);
    if (s->works_inflight == 0)
      session_free(s);
    return;
  }
  enter(s, now);
  w->done(w);
  leave(s);
}

void *hr_session_user_data(const hr_session *s) { return s ? s->ud : NULL; }
int hr_session_role(const hr_session *s) { return s ? s->role : -1; }
const hr_hello *hr_session_peer_hello(const hr_session *s) {
  return s && s->have_peer && s->state != HR_CS_AWAIT_HELLO ? &s->peer : NULL;
}
size_t hr_session_stream_count(const hr_session *s) {
  return s ? hr__session_streams(s) : 0;
}
const char *hr_session_state_name(const hr_session *s) {
  return s ? hr__conn_state_names[s->state] : "NULL";
}

int hr_session_new(hr_session **out, int role, const hr_settings *settings,
                   const hr_session_callbacks *cbs, const hr_provider *provider,
                   void *user_data, hr_tstamp now, const hr_mem *mem) {
  return hr__session_create(out, role, settings, cbs, provider, user_data, now,
                            mem, NULL);
}

int hr__session_create(hr_session **out, int role, const hr_settings *settings,
                       const hr_session_callbacks *cbs,
                       const hr_provider *provider, void *user_data,
                       hr_tstamp now, const hr_mem *mem, hr_group *join) {
  if (!out || (role != HR_ROLE_CLIENT && role != HR_ROLE_SERVER))
    return HR_ERR_INVALID_ARGUMENT;
  hr_settings def;
  hr_settings_default(&def);
  const hr_settings *in = settings ? settings : &def;
  if (in->version != HR_SETTINGS_VERSION ||
      in->max_message_size < HR_MIN_MAX_MESSAGE_SIZE ||
      in->frame_data_size == 0 || in->send_budget == 0 ||
      in->max_streams == 0 || in->max_shards == 0 ||
      (in->device_count && !in->devices) ||
      (in->auth_token_len && !in->auth_token) ||
      (cbs && cbs->size > sizeof(hr_session_callbacks) + 4096) ||
      (role == HR_ROLE_CLIENT && provider))
    return HR_ERR_INVALID_ARGUMENT;
  const hr_mem *m = mem ? mem : hr_mem_default();
  hr_session *s = hr__mem_calloc(m, 1, sizeof *s);
  if (!s)
    return HR_ERR_NOMEM;
  s->mem = *m;
  s->role = role;
  s->set = *in;
  if (!s->set.shard_bytes)
    s->set.shard_bytes = (uint64_t)16 << 20;
  if (!s->set.shards_per_lane)
    s->set.shards_per_lane = 4;
  s->ud = user_data;
  s->now = now;
  s->created = now;
  s->last_rx = now;
  s->last_activity = now;
  s->msg_started = now;
  s->peer_max = HR_PREHELLO_MAX_PAYLOAD;
  s->ids = &s->own_ids;
  s->ids->next_id = 1;
  s->wctx.transport = HR_TRANSPORT_NETWORK;
  if (cbs) {
    size_t n = cbs->size < sizeof s->cbs ? cbs->size : sizeof s->cbs;
    memcpy(&s->cbs, cbs, n);
  }
  if (provider) {
    size_t n =
        provider->size < sizeof s->prov ? provider->size : sizeof s->prov;
    memcpy(&s->prov, provider, n);
    s->prov.size = n;
    s->has_prov = 1;
  }
  /* Settings' pointers are valid only during this call: copy them. */
  const char *name = in->peer_name ? in->peer_name : "libhurray/0.1.0";
  hr__set_msg(s->peer_name_buf, sizeof s->peer_name_buf, name, strlen(name));
  s->set.peer_name = s->peer_name_buf;
  if (in->device_count) {
    s->devices_copy = hr__mem_malloc(&s->mem, in->device_count);
    if (!s->devices_copy)
      goto nomem;
    memcpy(s->devices_copy, in->devices, in->device_count);
    s->set.devices = s->devices_copy;
  } else {
    s->set.devices = NULL;
  }
  if (in->auth_token_len) {
    s->auth_copy = hr__mem_malloc(&s->mem, in->auth_token_len);
    if (!s->auth_copy)
      goto nomem;
    memcpy(s->auth_copy, in->auth_token, in->auth_token_len);
    s->set.auth_token = s->auth_copy;
  } else {
    s->set.auth_token = NULL;
  }
  /* Capabilities: only what this build does, and (server) what the
   * provider supports. */
  uint32_t caps = in->capabilities;
  uint32_t can = HR_CAP_PARALLEL_STREAMS;
#ifdef HR_HAVE_TRANSCODE
  /* Regions other than slabs are cut by the transcode plans. */
  can |= HR_CAP_TRANSCODING | HR_CAP_REGION_REQUESTS;
#endif
  if (role == HR_ROLE_SERVER && s->has_prov) {
    if (s->prov.on_put_begin && s->prov.on_put_commit)
      can |= HR_CAP_TENSOR_PUT;
    if (s->prov.on_list)
      can |= HR_CAP_LIST;
  }
  /* SHM needs a host that moves descriptors (a Unix socket). */
  int shm_host = s->cbs.fd_close &&
                 (role == HR_ROLE_SERVER || s->cbs.shm_map != NULL);
  if (role == HR_ROLE_CLIENT)
    can = 0;
  if (shm_host)
    can |= HR_CAP_SHM_DATA_PLANE;
  s->our_caps = caps & can;
  s->pull_fd = -1;
  /* The RDMA data plane adds what its fabric justifies (either role). */
  int fcaps = hr__rdma_session_init(s, in);
  if (fcaps < 0) {
    session_free(s);
    return fcaps;
  }
  s->our_caps |= (uint32_t)fcaps;
  hr_reader_settings rs;
  memset(&rs, 0, sizeof rs);
  rs.max_payload = HR_PREHELLO_MAX_PAYLOAD;
  rs.ctx = s->wctx;
  int rv = hr_reader_new(&s->rd, &rs, &s->mem);
  if (rv)
    goto nomem;
  if (join) {
    /* A lane joining a session: it shares the session's ids from the
     * start; its position comes with its SERVER_HELLO. */
    s->grp = join;
    s->lane = HR_LANE_NONE;
    s->ids = &join->ids;
    join->refs++;
  }
  if (role == HR_ROLE_CLIENT && send_hello(s, HR_VERSION_MINOR_WIRE))
    goto nomem;
  *out = s;
  return 0;
nomem:
  session_free(s);
  return HR_ERR_NOMEM;
}

static void session_free(hr_session *s) {
  hr__shm_free(s);
  hr__group_leave(s);
  hr__registry_unref(s->reg);
  hr__out_clear(s);
  free_zombies(s);
  free_spares(s);
  hr__out_free_spares(s);
  while (s->pings) {
    hr_ping *p = s->pings;
    s->pings = p->next;
    hr__ping_free(s, p);
  }
  hr_reader_del(s->rd);
  hr__rdma_session_free(s);
  hr__mem_free(&s->mem, s->tab);
  hr__mem_free(&s->mem, s->peer_store);
  hr__mem_free(&s->mem, s->devices_copy);
  hr__mem_free(&s->mem, s->auth_copy);
  hr__chunks_close(s);
  hr_mem mem = s->mem;
  hr__mem_free(&mem, s);
}

void hr_session_del(hr_session *s) {
  if (!s || s->deleted)
    return;
  hr_group *g = s->grp;
  /* Another lane inside a call may hold this session's streams. */
  if (s->depth || in_callback(s) || (g && g->depth)) {
    s->del_pending = 1;
    return;
  }
  /* The host's I/O has stopped (hr_session_io_hold). */
  s->tx_held = s->rx_held = 0;
  if (g) {
    g->refs++;
    g->depth++;
  }
  s->depth++;
  if (s->state != HR_CS_CLOSED)
    s->state = HR_CS_CLOSED;
  fail_all(s, HR_ERR_CLOSED, 0, 0, "session deleted");
  hr__put_tails_flush(s);
  s->depth--;
  s->deleted = 1;
  hr__group_leave(s);
  if (g) {
    /* Streams the failures ended on other lanes can go now. */
    if (--g->depth == 0)
      group_settle(g);
    hr__group_unref(g);
  }
  if (s->works_inflight == 0)
    session_free(s);
  else {
    /* Work still runs elsewhere: keep the memory it reports to. */
    hr__out_clear(s);
    hr__shm_free(s);
    free_zombies(s);
  }
}
