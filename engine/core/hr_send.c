/*
 * The sending side of a stream: a sequence of parts (tensors, shards,
 * composite heads and members, pre-order), each sent as TENSOR_DESCRIPTOR
 * (or TENSOR_PUT), TENSOR_DATA frames and TENSOR_DATA_END.
 *
 * Frames point into memory that an hr_tensor owns: the source tensor for
 * direct parts, or a chunk of transcoded output.  Transcoded dense parts
 * are produced chunk by chunk through hr_work items, at most
 * transcode_window chunks per stream at a time, and sent in order as they
 * complete; so a transcoded GET holds window x chunk bytes (plus what the
 * send budget lets wait in the output queue), whatever the tensor's size.
 */
#include <string.h>

#include "hr_session_int.h"

/* Messages one turn may queue before it yields (composites of many empty
 * members would otherwise fill the queue in one turn). */
#define HR_TURN_MAX_MSGS 64

/* One chunk's producer: a transcode job run on a worker, or a device-to-
 * host staging copy (HR_XM_STAGE) enqueued on the session's stream of the
 * device and completed by the device itself (hr_work.start). */
struct hr_xwork {
  hr_work w;
  hr_session *s;
  hr_stream *st;   /* NULL once the stream is gone */
  hr_chunk *chunk; /* its slot in the stream's window (when attached) */
  hr_xjob *xj;     /* reference (transcodes) */
  hr_tensor *mem;  /* reference to the output memory */
  uint8_t *out;
  uint64_t begin, len;
  int whole; /* sparse: fill every buffer of xj->whole */
  int rc;
  /* Staging copies: src + [soff, soff + len) into dst (pinned), on `gs`
   * after `ready`.  `src_t` keeps the source (and its event) alive. */
  hr_tensor *src_t;
  hr_gpu_buf *src, *dst;
  uint64_t soff;
  hr_gpu_stream *gs;
  hr_gpu_event *ready;
  hr_gpu_work gw;
  hr_put_tail *tail; /* a device PUT's parked callback (hr_devput.c) */
};

uint32_t hr__frame_cap(const hr_session *s) {
  uint64_t cap = s->set.frame_data_size;
  uint64_t peer = s->peer_max > HR_DATA_SUBHEADER_SIZE
                      ? s->peer_max - HR_DATA_SUBHEADER_SIZE
                      : 1;
  if (cap > peer)
    cap = peer;
  if (cap > s->set.send_budget && s->set.send_budget > 24)
    cap = s->set.send_budget - 24;
  if (cap == 0)
    cap = 1;
  return (uint32_t)cap;
}

void hr__net_desc(const hr_descriptor *in, hr_descriptor *out) {
  *out = *in;
  out->byte_offset = 0;
  for (unsigned k = 0; k < HR_MAX_BUFFERS; k++) {
    memset(&out->buffers[k], 0, sizeof out->buffers[k]);
    if (k >= in->buffer_count)
      continue;
    out->buffers[k].size_bytes = in->buffers[k].size_bytes;
    out->buffers[k].alignment_log2 = in->buffers[k].alignment_log2;
    out->buffers[k].device_tag = in->buffers[k].device_tag;
    out->buffers[k].memory_class = in->buffers[k].memory_class;
    /* A network transport carries device_index 0 and producer-synced
     * buffers (§ 7.2, § 18 "Transports"). */
  }
}

void hr__xport_for(const hr_descriptor *d, hr_transport_fields *xp) {
  memset(xp, 0, sizeof *xp);
  uint64_t total = 0;
  for (unsigned k = 0; k < d->buffer_count; k++)
    total += d->buffers[k].size_bytes;
  xp->total_data_bytes = total;
  xp->shard_index = 0;
  xp->total_shards = 1;
  xp->data_plane = HR_PLANE_FRAMES;
}

static hr_part *part_push(hr_session *s, hr_tx *tx) {
  hr_part *np =
      hr__mem_realloc(&s->mem, tx->parts, (tx->nparts + 1) * sizeof *np);
  if (!np)
    return NULL;
  tx->parts = np;
  hr_part *p = &np[tx->nparts++];
  memset(p, 0, sizeof *p);
  return p;
}

int hr__tx_add_tensor(hr_session *s, hr_tx *tx, hr_tensor *t) {
  hr_part *p = part_push(s, tx);
  if (!p)
    return HR_ERR_NOMEM;
  const hr_descriptor *d = hr_tensor_descriptor(t);
  p->t = hr_tensor_ref(t);
  hr__net_desc(d, &p->desc);
  p->desc.flags &= (uint8_t)~HR_DESC_HAS_SHARD;
  hr__xport_for(&p->desc, &p->xp);
  if (d->layout.tag == HR_LAYOUT_COMPOSITE) {
    p->xp.total_data_bytes = 0;
    size_t n = hr_tensor_member_count(t);
    for (size_t i = 0; i < n; i++) {
      int rv = hr__tx_add_tensor(s, tx, hr_tensor_member(t, i));
      if (rv)
        return rv;
    }
    return 0;
  }
  if (hr_tensor_on_device(t)) {
    hr__part_device(p, t, 1, 0, 0);
    return 0;
  }
  for (unsigned k = 0; k < d->buffer_count; k++) {
    p->src[k] = hr_tensor_buffer(t, k);
    p->len[k] = d->buffers[k].size_bytes;
  }
  p->hold = hr_tensor_ref(t);
  return 0;
}

void hr__part_device(hr_part *p, hr_tensor *t, int whole, uint64_t start,
                     uint64_t len) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  unsigned n = whole ? d->buffer_count : 1;
  for (unsigned k = 0; k < n; k++) {
    p->dsrc[k] = hr_tensor_gpu_buf(t, k);
    p->doff[k] = whole ? 0 : start;
    p->len[k] = whole ? d->buffers[k].size_bytes : len;
    p->src[k] = NULL;
  }
  p->dready = hr_tensor_gpu_event(t);
  p->hold = hr_tensor_ref(t);
  p->xmode = HR_XM_STAGE;
}

void hr__xjob_unref(hr_xjob *xj) {
  if (!xj || --xj->refs > 0)
    return;
#ifdef HR_HAVE_TRANSCODE
  hr_xc_plan_del(xj->plan);
#endif
  hr_tensor_unref(xj->src);
  hr_tensor_unref(xj->whole);
  hr_mem mem = xj->mem;
  hr__mem_free(&mem, xj);
}

/* Drops the window's chunks; in-flight work is detached (it finishes on
 * its own and frees what it holds). */
static void window_clear(hr_tx *tx) {
  for (uint32_t i = 0; i < tx->win_count; i++) {
    hr_chunk *c = &tx->win[(tx->win_head + i) % tx->win_cap];
    if (c->work) {
      c->work->st = NULL;
      c->work->chunk = NULL;
    }
    hr_tensor_unref(c->mem);
    memset(c, 0, sizeof *c);
  }
  tx->win_head = tx->win_count = 0;
  tx->next_chunk = 0;
  tx->next_buf = 0;
}

void hr__tx_free(hr_session *s, hr_tx *tx) {
  if (tx->win)
    window_clear(tx);
  hr__mem_free(&s->mem, tx->win);
  for (size_t i = 0; i < tx->nparts; i++) {
    hr__rstage_detach(s, &tx->parts[i]);
    hr_tensor_unref(tx->parts[i].t);
    hr_tensor_unref(tx->parts[i].hold);
    hr__xjob_unref(tx->parts[i].xj);
  }
  hr__mem_free(&s->mem, tx->parts);
  memset(tx, 0, sizeof *tx);
}

void hr__work_detach_stream(hr_stream *st) {
  if (st->tx.win)
    window_clear(&st->tx);
  hr__devrx_detach(&st->rv);
}

/* ---- work items ---------------------------------------------------------- */

static void xwork_run(hr_work *w) {
  hr_xwork *x = (hr_xwork *)w;
#ifdef HR_HAVE_TRANSCODE
  if (x->whole) {
    void *bufs[HR_MAX_BUFFERS] = {0};
    const hr_descriptor *d = hr_tensor_descriptor(x->xj->whole);
    for (unsigned k = 0; k < d->buffer_count; k++)
      bufs[k] = hr_tensor_buffer(x->xj->whole, k);
    x->rc = hr_xc_run_sparse(x->xj->plan, bufs);
  } else {
    x->rc = hr_xc_run(x->xj->plan, x->begin, x->len, x->out);
  }
#else
  x->rc = HR_ERR_UNSUPPORTED;
#endif
}

static void xwork_done(hr_work *w) {
  hr_xwork *x = (hr_xwork *)w;
  hr_session *s = x->s;
  s->works_inflight--;
  if (x->st && x->chunk) {
    x->chunk->work = NULL;
    x->chunk->done = 1;
    x->chunk->rc = x->rc;
    int rv = hr__stream_chunk_done(s, x->st);
    if (rv < 0)
      hr__fatal(s, rv);
  }
  hr_tensor_unref(x->mem);
  hr_tensor_unref(x->src_t);
  hr__xjob_unref(x->xj);
  /* After the tensor's reference went: its callback comes last. */
  hr_put_tail *tail = x->tail;
  hr__mem_free(&s->mem, x);
  hr__put_tail_drop(tail);
}

int hr__tx_park_put(hr_session *s, hr_stream *st) {
  /* The PUT's own session (lane 0), whichever lane ended it. */
  s = st->s;
  hr_tx *tx = &st->tx;
  unsigned n = 0;
  for (uint32_t i = 0; tx->win && i < tx->win_count; i++) {
    hr_chunk *c = &tx->win[(tx->win_head + i) % tx->win_cap];
    n += c->work && c->work->src_t;
  }
  if (tx->nparts)
    n += hr__rstage_copies(&tx->parts[0]);
  unsigned holds = hr__rdma_put_holds(s, st);
  if (!n && !holds && !s->req_calls)
    return 0;
  hr_put_tail *t = hr__put_tail_new(s, st, n + holds);
  if (!t)
    return 0; /* no memory: the callback goes now, the tensor still waits */
  if (tx->nparts)
    hr__rstage_park(&tx->parts[0], t);
  for (uint32_t i = 0; tx->win && i < tx->win_count; i++) {
    hr_chunk *c = &tx->win[(tx->win_head + i) % tx->win_cap];
    if (c->work && c->work->src_t)
      c->work->tail = t;
  }
  if (holds)
    hr__rdma_put_park(s, st, t);
  return 1;
}

int hr__tx_put_unsent(const hr_stream *st) {
  const hr_tx *tx = &st->tx;
  return (st->kind == HR_SK_CLI_PUT && !tx->cur && tx->phase == HR_TXP_DESC &&
          tx->nparts && tx->parts[0].dipc == HR_DIPC_WAIT) ||
         hr__rstage_put_unsent(st);
}

/* A staging failure ends this stream only.  A client PUT hears the local
 * cause (out of memory, or the device's error) rather than a protocol
 * error; the server is told with ERROR on the stream, which aborts it. */
static int stage_error(hr_session *s, hr_stream *st, int rc, uint32_t wire,
                       const char *text) {
  if (st->kind != HR_SK_CLI_PUT)
    return hr__stream_error(s, st->id, wire, text);
  /* A GPUDirect source fails while it waits for the producer, before its
   * TENSOR_PUT went: the server never saw the stream, so it ends here. */
  int unsent = hr__tx_put_unsent(st);
  hr__cli_stream_fail(s, st, rc == HR_ERR_NOMEM ? HR_ERR_NOMEM : HR_ERR_IO,
                      unsent ? 0 : wire, !unsent, text);
  if (!unsent)
    return hr__stream_error(s, st->id, wire, text);
  hr__stream_end(s, st);
  return 0;
}

int hr__tx_stage_error(hr_session *s, hr_stream *st, int rc, uint32_t wire,
                       const char *text) {
  return stage_error(s, st, rc, wire, text);
}

/* ---- staging copies ------------------------------------------------------ */

/* Enqueues the chunk's copy: after the producer's event (ADR-018 P2: the
 * device orders it, the host never waits), device to pinned memory. */
static int stage_enqueue(hr_work *w) {
  hr_xwork *x = (hr_xwork *)w;
  int rv = 0;
  if (x->ready)
    rv = hr_gpu_stream_wait_event(x->gs, x->ready);
  if (rv == 0 && x->len)
    rv = hr_gpu_copy_async(x->gs, x->dst, 0, x->src, x->soff, x->len);
  return rv;
}

/* The copy is enqueued even when the host function could not be: `run`
 * then waits for it, which is what the host does on a non-zero return.
 * The failure is kept in rc as well. */
static int stage_start(hr_work *w, void (*complete)(hr_work *, void *),
                       void *ctx) {
  hr_xwork *x = (hr_xwork *)w;
  return hr__gpu_work_start(&x->gw, w, x->gs, stage_enqueue, complete, ctx,
                            &x->rc);
}

/* For hosts without `start` (and inline runs): the same copy, then a wait
 * for it on this thread through an event (never a device-wide sync). */
static void stage_run(hr_work *w) {
  hr_xwork *x = (hr_xwork *)w;
  x->rc = hr__gpu_work_run(w, x->gs, stage_enqueue);
}

static int submit(hr_session *s, hr_stream *st, hr_chunk *c, int whole,
                  hr_gpu_buf *dst, hr_gpu_stream *gs) {
  hr_part *p = &st->tx.parts[st->tx.cur];
  hr_xwork *x = hr__mem_calloc(&s->mem, 1, sizeof *x);
  if (!x)
    return HR_ERR_NOMEM;
  x->w.done = xwork_done;
  x->s = s;
  x->st = st;
  x->chunk = c;
  x->mem = hr_tensor_ref(c->mem);
  x->begin = c->begin;
  x->len = c->len;
  if (p->xmode == HR_XM_STAGE) {
    x->w.run = stage_run;
    x->w.start = stage_start;
    x->src_t = hr_tensor_ref(p->hold);
    x->src = p->dsrc[c->buf];
    x->soff = p->doff[c->buf] + c->begin;
    x->dst = dst;
    x->gs = gs;
    x->ready = p->dready;
  } else {
    x->w.run = xwork_run;
    x->xj = p->xj;
    p->xj->refs++;
    x->out = c->mem && !whole ? hr_tensor_buffer(c->mem, 0) : NULL;
    x->whole = whole;
  }
  c->work = x;
  hr__work_submit(s, &x->w);
  return 0;
}

/* Fills the window of a device part: chunks walk buffer after buffer. */
static int pump_stage(hr_session *s, hr_stream *st, hr_part *p,
                      uint64_t chunk) {
  hr_tx *tx = &st->tx;
  hr_gpu *g = hr_gpu_buf_device(p->dsrc[0]);
  hr_gpu_stream *gs;
  int rv = hr__chunk_stream(s, g, &gs);
  if (rv) {
    tx->failed = 1;
    return stage_error(s, st, rv, HR_WIRE_RESOURCE_EXHAUSTED,
                       "no device stream for staging");
  }
  while (tx->win_count < tx->win_cap && !tx->failed) {
    while (tx->next_buf < p->desc.buffer_count &&
           tx->next_chunk >= p->len[tx->next_buf]) {
      tx->next_buf++;
      tx->next_chunk = 0;
    }
    if (tx->next_buf >= p->desc.buffer_count)
      break;
    uint64_t len = p->len[tx->next_buf] - tx->next_chunk;
    if (len > chunk)
      len = chunk;
    hr_chunk *c = &tx->win[(tx->win_head + tx->win_count) % tx->win_cap];
    memset(c, 0, sizeof *c);
    c->buf = tx->next_buf;
    c->begin = tx->next_chunk;
    c->len = len;
    hr_gpu_buf *dst = NULL;
    rv = hr__chunk_get(s, g, chunk, len, &c->mem, &dst);
    if (rv) {
      tx->failed = 1;
      return stage_error(s, st, rv, HR_WIRE_RESOURCE_EXHAUSTED,
                         "no pinned memory for a staging chunk");
    }
    tx->win_count++;
    tx->next_chunk += len;
    rv = submit(s, st, c, 0, dst, gs);
    if (rv)
      return rv;
    if (st->ended)
      return 0;
  }
  return 0;
}

/* Exported device memory (hr_shm_dev.c) and a GPUDirect source
 * (hr_rdma_glue.c) are producer-synced before their descriptor goes: one
 * zero-byte staging item waits, on the device, for the producer's event
 * and completes through the device's host function, so the loop never
 * waits. */
static int pump_dipc(hr_session *s, hr_stream *st, hr_part *p) {
  hr_tx *tx = &st->tx;
  if (p->dipc != HR_DIPC_WAIT || tx->win_count)
    return 0;
  hr_gpu_stream *gs;
  int rv = hr__chunk_stream(s, hr_gpu_buf_device(p->dsrc[0]), &gs);
  if (rv) {
    tx->failed = 1;
    return stage_error(s, st, rv, HR_WIRE_RESOURCE_EXHAUSTED,
                       "no device stream to wait for the producer");
  }
  hr_chunk *c = &tx->win[tx->win_head];
  memset(c, 0, sizeof *c);
  tx->win_count = 1;
  return submit(s, st, c, 0, NULL, gs);
}

int hr__tx_pump(hr_session *s, hr_stream *st) {
  hr_tx *tx = &st->tx;
  if (tx->cur >= tx->nparts || tx->failed)
    return 0;
  hr_part *p = &tx->parts[tx->cur];
  /* The current part's window fills from the answer on, before its
   * descriptor goes, so the first chunk is ready sooner. */
  if (p->xmode == HR_XM_DIRECT || tx->phase == HR_TXP_END)
    return 0;
  if (p->rstage && p->xmode != HR_XM_WHOLE)
    return 0; /* staged for RDMA: its own items fill it (hr_rdma_stage.c) */
  if (p->xmode == HR_XM_WINDOW && tx->phase == HR_TXP_DESC &&
      hr__rdma_tx_device_first(s, st, p))
    return 0; /* the output may be staged for RDMA instead of chunked */
  if (!tx->win) {
    tx->win_cap = s->set.transcode_window ? s->set.transcode_window : 1;
    tx->win = hr__mem_calloc(&s->mem, tx->win_cap, sizeof *tx->win);
    if (!tx->win)
      return HR_ERR_NOMEM;
  }
  if (p->xmode == HR_XM_WHOLE) {
    if (tx->win_count)
      return 0;
    hr_chunk *c = &tx->win[tx->win_head];
    memset(c, 0, sizeof *c);
    c->mem = hr_tensor_ref(p->xj->whole);
    tx->win_count = 1;
    return submit(s, st, c, 1, NULL, NULL);
  }
  uint64_t chunk = s->set.transcode_chunk ? s->set.transcode_chunk : 1;
  if (p->xmode == HR_XM_STAGE && p->dipc)
    return pump_dipc(s, st, p);
  if (p->xmode == HR_XM_STAGE && tx->phase == HR_TXP_DESC &&
      hr__rdma_tx_device_first(s, st, p))
    return 0; /* the data plane may read the device itself */
  if (p->xmode == HR_XM_STAGE)
    return pump_stage(s, st, p, chunk);
  if (p->xj->grain > 1 && chunk > p->xj->grain)
    chunk -= chunk % p->xj->grain;
  while (tx->win_count < tx->win_cap && tx->next_chunk < p->xj->out_size &&
         !tx->failed) {
    uint64_t len = p->xj->out_size - tx->next_chunk;
    if (len > chunk)
      len = chunk;
    hr_chunk *c = &tx->win[(tx->win_head + tx->win_count) % tx->win_cap];
    memset(c, 0, sizeof *c);
    c->begin = tx->next_chunk;
    c->len = len;
    int rv = hr__chunk_get(s, NULL, chunk, len, &c->mem, NULL);
    if (rv) {
      /* Memory pressure refuses this transfer, not the connection. */
      tx->failed = 1;
      return hr__stream_error(s, st->id, HR_WIRE_RESOURCE_EXHAUSTED,
                              "no memory for a transcoding chunk");
    }
    tx->win_count++;
    tx->next_chunk += len;
    rv = submit(s, st, c, 0, NULL, NULL);
    if (rv)
      return rv;
    /* An inline run may have ended the stream. */
    if (st->ended)
      return 0;
  }
  return 0;
}

int hr__stream_chunk_done(hr_session *s, hr_stream *st) {
  hr_tx *tx = &st->tx;
  if (st->ended || !tx->win)
    return 0;
  for (uint32_t i = 0; i < tx->win_count; i++) {
    hr_chunk *c = &tx->win[(tx->win_head + i) % tx->win_cap];
    if (c->done && c->rc) {
      tx->failed = 1;
      if (tx->parts[tx->cur].xmode == HR_XM_STAGE)
        return stage_error(s, st, c->rc, HR_WIRE_INTERNAL,
                           "staging from the device failed");
      return hr__stream_error(s, st->id, HR_WIRE_TRANSCODE_FAILED,
                              "transcoding failed");
    }
  }
  hr_part *p = &tx->parts[tx->cur];
  if (p->dipc == HR_DIPC_WAIT && tx->win_count &&
      tx->win[tx->win_head].done) {
    /* The producer's event completed: the descriptor may go. */
    p->dipc = HR_DIPC_SYNCED;
    window_clear(tx);
  }
  if (p->xmode == HR_XM_WHOLE && tx->win_count && tx->win[tx->win_head].done) {
    /* The sparse output exists as a whole now: send it directly. */
    hr_tensor *w = p->xj->whole;
    const hr_descriptor *d = hr_tensor_descriptor(w);
    for (unsigned k = 0; k < d->buffer_count; k++) {
      p->src[k] = hr_tensor_buffer(w, k);
      p->len[k] = d->buffers[k].size_bytes;
    }
    p->hold = hr_tensor_ref(w);
    p->xmode = HR_XM_DIRECT;
    hr_tensor_unref(tx->win[tx->win_head].mem);
    memset(&tx->win[tx->win_head], 0, sizeof tx->win[0]);
    tx->win_count = 0;
  }
  if (hr__tx_ready(st))
    hr__ready_add(s, st);
  return 0;
}

/* ---- turns --------------------------------------------------------------- */

static uint64_t part_buf_len(const hr_part *p, unsigned k) {
  if (p->xmode == HR_XM_WINDOW)
    return k == 0 ? p->xj->out_size : 0;
  if (p->xmode == HR_XM_WHOLE)
    return p->desc.buffers[k].size_bytes;
  return p->len[k];
}

int hr__tx_ready(const hr_stream *st) {
  const hr_tx *tx = &st->tx;
  if (tx->failed || tx->cur >= tx->nparts)
    return tx->cur >= tx->nparts && !tx->failed;
  if (tx->phase == HR_TXP_RDMA)
    return 0; /* the data plane moves it; its events go on */
  if (tx->phase == HR_TXP_DESC && tx->parts[tx->cur].dipc == HR_DIPC_WAIT)
    return 0; /* the producer's event first (pump_dipc) */
  if (tx->phase == HR_TXP_DESC && hr__rstage_waiting(&tx->parts[tx->cur]))
    return 0; /* its host copy first (hr_rdma_stage.c) */
  if (tx->phase != HR_TXP_DATA)
    return 1;
  const hr_part *p = &tx->parts[tx->cur];
  if (p->xmode == HR_XM_DIRECT || p->shm)
    return 1; /* an SHM part has no frames: DATA_END is next */
  if (p->xmode == HR_XM_WHOLE)
    return 0;
  if (tx->off >= part_buf_len(p, tx->buf))
    return 1;
  return tx->win_count && tx->win[tx->win_head].done;
}

/* Queues the part's descriptor.  Returns 1 when the RDMA data plane
 * carries the part (its handshake started), 0 for frames,
 * HR_RDMA_TX_WAIT when nothing went (a GPUDirect source waits for its
 * producer's event: pump it), or fatal. */
static int send_desc(hr_session *s, hr_stream *st, hr_part *p) {
  int rdma = hr__rdma_tx_prepare(s, st, p);
  if (rdma < 0 || rdma == HR_RDMA_TX_WAIT)
    return rdma;
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.stream_id = st->id;
  if (st->tx.cur == 0 && st->tx.put_key) {
    m.hdr.type = HR_MSG_TENSOR_PUT;
    m.u.put.key = st->tx.put_key;
    m.u.put.key_len = st->tx.put_key_len;
    m.u.put.flags = st->tx.put_flags;
    m.u.put.desc = p->desc;
    m.u.put.xport = p->xp;
  } else {
    m.hdr.type = HR_MSG_TENSOR_DESCRIPTOR;
    m.u.tensor.desc = p->desc;
    m.u.tensor.xport = p->xp;
  }
  if (p->shm) {
    /* The segment goes with the descriptor; the tensor stays until the
     * client releases it (hr_shm.c). */
    int rv = hr__shm_lease_add(s, st->id, p->t);
    return rv ? rv : hr__out_msg_fd(s, &m, p->shm_fd);
  }
  int rv = hr__out_msg(s, &m, 0);
  if (rv == 0 && rdma)
    rv = hr__rdma_tx_start(s, st);
  return rv ? rv : rdma;
}

int hr__tx_send_head(hr_session *s, hr_stream *st) {
  hr_tx *tx = &st->tx;
  if (tx->cur >= tx->nparts || tx->phase != HR_TXP_DESC)
    return 0;
  if (tx->parts[tx->cur].dipc == HR_DIPC_WAIT)
    return hr__tx_pump(s, st);
  int rv = send_desc(s, st, &tx->parts[tx->cur]);
  if (rv < 0)
    return rv;
  if (rv == HR_RDMA_TX_WAIT)
    return hr__tx_pump(s, st);
  if (rv == 1) {
    tx->phase = HR_TXP_RDMA;
    return 0;
  }
  tx->phase = HR_TXP_DATA;
  tx->buf = 0;
  tx->off = 0;
  return hr__tx_pump(s, st);
}

int hr__tx_turn(hr_session *s, hr_stream *st, int *more, int *budget_hit) {
  hr_tx *tx = &st->tx;
  int framed = 0, msgs = 0, rv;
  *more = 0;
  *budget_hit = 0;
  for (;;) {
    if (tx->failed)
      return 0;
    if (tx->cur >= tx->nparts)
      return 1;
    hr_part *p = &tx->parts[tx->cur];
    if (msgs >= HR_TURN_MAX_MSGS) {
      *more = 1;
      return 0;
    }
    switch (tx->phase) {
    case HR_TXP_DESC:
      if (p->dipc == HR_DIPC_WAIT)
        return hr__tx_pump(s, st); /* sent when the device says so */
      if ((rv = send_desc(s, st, p)) < 0)
        return rv;
      if (rv == HR_RDMA_TX_WAIT)
        return hr__tx_pump(s, st);
      msgs++;
      if (rv == 1) {
        tx->phase = HR_TXP_RDMA;
        return 0;
      }
      tx->phase = HR_TXP_DATA;
      tx->buf = 0;
      tx->off = 0;
      if ((rv = hr__tx_pump(s, st)) != 0)
        return rv;
      if (st->ended)
        return 0;
      break;
    case HR_TXP_DATA: {
      if (p->shm) {
        /* The bytes are in the segment: no frames (§ 14). */
        tx->phase = HR_TXP_END;
        break;
      }
      while (tx->buf < p->desc.buffer_count &&
             tx->off >= part_buf_len(p, tx->buf)) {
        tx->buf++;
        tx->off = 0;
      }
      if (tx->buf >= p->desc.buffer_count || p->desc.buffer_count == 0) {
        tx->phase = HR_TXP_END;
        break;
      }
      if (framed) {
        *more = 1;
        return 0;
      }
      uint64_t left = part_buf_len(p, tx->buf) - tx->off;
      const uint8_t *src;
      hr_tensor *hold;
      hr_chunk *c = NULL;
      if (p->xmode == HR_XM_DIRECT) {
        src = p->src[tx->buf] + tx->off;
        hold = p->hold;
      } else if ((p->xmode == HR_XM_WINDOW || p->xmode == HR_XM_STAGE) &&
                 tx->win_count && tx->win[tx->win_head].done) {
        c = &tx->win[tx->win_head];
        if (c->buf != tx->buf)
          return HR_ERR_INTERNAL;
        src =
            (const uint8_t *)hr_tensor_buffer(c->mem, 0) + (tx->off - c->begin);
        hold = c->mem;
        if (left > c->begin + c->len - tx->off)
          left = c->begin + c->len - tx->off;
      } else {
        return 0; /* waiting for a chunk */
      }
      uint32_t len = hr__frame_cap(s);
      if (left < len)
        len = (uint32_t)left;
      if (s->frame_queued && s->frame_queued + 24 + len > s->set.send_budget) {
        *budget_hit = 1;
        return 0;
      }
      rv = hr__out_frame(s, st->id, (uint8_t)tx->buf, tx->off, src, len, hold);
      if (rv)
        return rv;
      msgs++;
      tx->off += len;
      framed = 1;
      if (c && tx->off >= c->begin + c->len) {
        /* Chunk sent (the frames hold its memory): free the slot and let
         * the next chunk in. */
        hr_tensor_unref(c->mem);
        memset(c, 0, sizeof *c);
        tx->win_head = (tx->win_head + 1) % tx->win_cap;
        tx->win_count--;
        if ((rv = hr__tx_pump(s, st)) != 0)
          return rv;
        if (st->ended)
          return 0;
      }
      break;
    }
    case HR_TXP_END:
      if ((rv = hr__out_empty(s, HR_MSG_TENSOR_DATA_END, st->id)) != 0)
        return rv;
      msgs++;
      tx->cur++;
      tx->phase = HR_TXP_DESC;
      if (tx->win)
        window_clear(tx);
      if (tx->cur >= tx->nparts)
        return 1;
      if (framed) {
        *more = 1;
        return 0;
      }
      break;
    case HR_TXP_RDMA:
      return 0;
    default:
      return HR_ERR_INTERNAL;
    }
  }
}
