/*
 * Receiving a GET into device memory (hr_get_opts.device).
 *
 * Frames land, zero-copy as usual, in pinned host memory of the device
 * (one block from the session's chunk pool, the size of the tensor, so a
 * repeated GET of the same size reuses it without pinning again).  The
 * tensor's buffers are cut into transcode_chunk pieces; the moment every
 * byte of a piece has landed its host-to-device copy is enqueued on the
 * session's stream of the device, so the copy of piece k overlaps the
 * receive of piece k+1 and only the last piece's copy is left when the
 * last frame arrives.  Then, as the application asked:
 *
 *  - P1 (HR_SYNC_PRODUCER_SYNCED): the GET completes once the device has
 *    finished the copies.  The loop does not wait for that: a work item
 *    whose completion the device signals (hr_work.start) completes it.
 *  - P2 (HR_SYNC_EVENT): the GET completes at once with a device tensor
 *    whose event (hr_tensor_gpu_event) marks the end of the copies; the
 *    application waits on it on its own stream (ADR-018 § 2).
 *
 * In both cases the pinned block stays held by a work item until the
 * device has read it.  Restrictions: one plain tensor (no composite), not
 * parallel, no application destination (checked by hr_session_get).
 */
#include <string.h>

#include "hr_session_int.h"

struct hr_devrx {
  hr_gpu *g;
  hr_gpu_stream *gs;
  uint8_t sync;     /* HR_SYNC_PRODUCER_SYNCED or HR_SYNC_EVENT */
  uint8_t tag;      /* the device's device_tag */
  hr_tensor *block; /* pinned landing block (pool chunk tensor) */
  hr_gpu_buf *pinned;
  uint64_t boff[HR_MAX_BUFFERS]; /* buffer k's offset in the block */
  hr_gpu_buf *dev[HR_MAX_BUFFERS];
  unsigned nbuf;
  uint64_t chunk;
  uint64_t *filled; /* bytes landed per piece, all buffers in a row */
  uint64_t first[HR_MAX_BUFFERS + 1]; /* buffer k's first piece */
  uint64_t size[HR_MAX_BUFFERS];
  int err;            /* a copy could not be enqueued */
  int copies;         /* copies enqueued */
  struct dwork *wait; /* P1: the completion pending */
};

/* What a device tensor handed to the application owns. */
typedef struct devout {
  hr_mem mem;
  hr_gpu_buf *dev[HR_MAX_BUFFERS];
  unsigned nbuf;
  hr_gpu_event *ev;
} devout;

/* Waits for the copies into the device memory (the event's point: at
 * once when the application honoured it, as it must before the release),
 * then frees it. */
static void devout_release(void *ctx) {
  devout *o = ctx;
  if (o->ev)
    hr_gpu_event_sync(o->ev);
  hr_gpu_event_del(o->ev);
  for (unsigned k = 0; k < o->nbuf; k++)
    hr_gpu_buf_del(o->dev[k]);
  hr_mem mem = o->mem;
  hr__mem_free(&mem, o);
}

void hr__devrx_free(hr_session *s, hr_devrx *d) {
  if (!d)
    return;
  /* A GET abandoned while copies are in flight (the drain holds the
   * block otherwise): they read the block and write the device buffers,
   * so they must end before either goes.  A wait on the stream, on this
   * failure path only. */
  if (d->block && d->copies)
    hr_gpu_stream_sync(d->gs);
  for (unsigned k = 0; k < d->nbuf; k++)
    hr_gpu_buf_del(d->dev[k]);
  hr_tensor_unref(d->block);
  hr__mem_free(&s->mem, d->filled);
  hr__mem_free(&s->mem, d);
}

int hr__devrx_new(hr_session *s, hr_recv *rv, hr_gpu *g, uint8_t sync) {
  hr_gpu_caps caps;
  int rc = hr_gpu_query(g, &caps);
  if (rc)
    return rc;
  hr_devrx *d = hr__mem_calloc(&s->mem, 1, sizeof *d);
  if (!d)
    return HR_ERR_NOMEM;
  d->g = g;
  d->sync = sync;
  d->tag = caps.device_tag;
  d->chunk = s->set.transcode_chunk ? s->set.transcode_chunk : (4u << 20);
  rv->dev = d;
  return 0;
}

int hr__devrx_dest(hr_session *s, hr_recv *rv, const hr_descriptor *desc,
                   hr_tensor **out) {
  hr_devrx *d = rv->dev;
  if (desc->layout.tag == HR_LAYOUT_COMPOSITE || d->block)
    return HR_ERR_UNSUPPORTED;
  uint64_t off[HR_MAX_BUFFERS], span, align;
  if (hr__tensor_placement(desc, rv->min_align, off, &span, &align) ||
      align > 4096)
    return HR_ERR_LIMIT;
  int rc = hr__chunk_stream(s, d->g, &d->gs);
  if (rc)
    return HR_ERR_LIMIT;
  /* Pinned memory is page-aligned. */
  if (hr__chunk_get(s, d->g, span ? span : 1, span, &d->block, &d->pinned))
    return HR_ERR_LIMIT;
  uint8_t *base = hr_tensor_buffer(d->block, 0);
  void *bufs[HR_MAX_BUFFERS];
  uint64_t pieces = 0;
  d->nbuf = desc->buffer_count;
  for (unsigned k = 0; k < desc->buffer_count; k++) {
    bufs[k] = base + off[k];
    d->boff[k] = off[k];
    d->size[k] = desc->buffers[k].size_bytes;
    d->first[k] = pieces;
    pieces += (d->size[k] + d->chunk - 1) / d->chunk;
    rc = hr_gpu_buf_alloc(d->g, HR_GPU_MEM_DEVICE, d->size[k] ? d->size[k] : 1,
                          &d->dev[k]);
    if (rc)
      return HR_ERR_LIMIT;
  }
  d->first[desc->buffer_count] = pieces;
  d->filled = hr__mem_calloc(&s->mem, pieces ? pieces : 1, sizeof *d->filled);
  if (!d->filled)
    return HR_ERR_NOMEM;
  rc = hr_tensor_wrap(out, desc, bufs, NULL, NULL, &s->mem);
  return rc == HR_ERR_NOMEM ? rc : (rc ? HR_ERR_LIMIT : 0);
}

void hr__devrx_landed(hr_recv *rv, unsigned bi, uint64_t off, uint64_t n) {
  hr_devrx *d = rv->dev;
  if (!d || !d->block || bi >= d->nbuf || n == 0 || off > d->size[bi] ||
      n > d->size[bi] - off)
    return;
  uint64_t end = off + n;
  for (uint64_t j = off / d->chunk; j * d->chunk < end; j++) {
    uint64_t lo = j * d->chunk, hi = lo + d->chunk;
    if (hi > d->size[bi])
      hi = d->size[bi];
    uint64_t a = off > lo ? off : lo, b = end < hi ? end : hi;
    uint64_t *f = &d->filled[d->first[bi] + j];
    /* The frame checker refuses overlapping frames; stay exact anyway. */
    if (*f + (b - a) > hi - lo)
      continue;
    *f += b - a;
    if (*f == hi - lo && !d->err) {
      int rc = hr_gpu_copy_async(d->gs, d->dev[bi], lo, d->pinned,
                                 d->boff[bi] + lo, hi - lo);
      if (rc)
        d->err = rc;
      else
        d->copies = 1;
    }
  }
}

/* ---- the drain: the end of the copies, signalled by the device ---------- */

typedef struct dwork {
  hr_work w;
  hr_session *s;
  hr_stream *st;    /* P1: the GET to complete (NULL once it is gone) */
  hr_tensor *block; /* held until the device has read it */
  hr_tensor *out;   /* P1: the tensor to deliver */
  hr_gpu_stream *gs;
  void (*complete)(hr_work *w, void *ctx);
  void *complete_ctx;
  int rc;
} dwork;

static void drain_landed(void *arg) {
  dwork *x = arg;
  x->complete(&x->w, x->complete_ctx);
}

static int drain_start(hr_work *w, void (*complete)(hr_work *, void *),
                       void *ctx) {
  dwork *x = (dwork *)w;
  x->complete = complete;
  x->complete_ctx = ctx;
  return hr_gpu_launch_host_fn(x->gs, drain_landed, x);
}

static void drain_run(hr_work *w) {
  dwork *x = (dwork *)w;
  hr_gpu_event *e = NULL;
  int rc = hr_gpu_event_new(hr_gpu_stream_device(x->gs), 0, &e);
  if (rc == 0)
    rc = hr_gpu_event_record(e, x->gs);
  if (rc == 0)
    rc = hr_gpu_event_sync(e);
  hr_gpu_event_del(e);
  x->rc = rc;
}

static void drain_done(hr_work *w) {
  dwork *x = (dwork *)w;
  hr_session *s = x->s;
  s->works_inflight--;
  if (x->st) {
    hr_stream *st = x->st;
    st->rv.dev->wait = NULL;
    if (x->rc) {
      hr_tensor_unref(x->out);
      hr__cli_stream_fail(s, st, HR_ERR_IO, 0, 0,
                          "copying to the device failed");
    } else {
      hr__cli_get_deliver(s, st, x->out);
    }
    hr__stream_end(s, st);
  } else {
    hr_tensor_unref(x->out);
  }
  hr_tensor_unref(x->block);
  hr__mem_free(&s->mem, x);
}

static int drain_submit(hr_session *s, hr_devrx *d, hr_stream *st,
                        hr_tensor *out) {
  dwork *x = hr__mem_calloc(&s->mem, 1, sizeof *x);
  if (!x)
    return HR_ERR_NOMEM;
  x->w.run = drain_run;
  x->w.done = drain_done;
  x->w.start = drain_start;
  x->s = s;
  x->st = st;
  x->out = out;
  x->gs = d->gs;
  x->block = d->block;
  d->block = NULL;
  if (st)
    d->wait = x;
  s->works_inflight++;
  if (s->cbs.submit_work) {
    hr__cb_enter(s);
    int rv = s->cbs.submit_work(s, &x->w, s->ud);
    hr__cb_leave(s);
    if (rv == 0)
      return 0;
  }
  x->w.run(&x->w);
  drain_done(&x->w);
  return 0;
}

void hr__devrx_detach(hr_recv *rv) {
  if (rv->dev && rv->dev->wait) {
    rv->dev->wait->st = NULL;
    rv->dev->wait = NULL;
  }
}

/* Every byte has landed: copies the pieces whose landing was not seen
 * piece by piece (a data plane that writes the landing memory directly,
 * such as RDMA, bypasses hr__devrx_landed). */
static void copy_rest(hr_devrx *d) {
  for (unsigned k = 0; k < d->nbuf && !d->err; k++)
    for (uint64_t j = 0; j * d->chunk < d->size[k] && !d->err; j++) {
      uint64_t lo = j * d->chunk, hi = lo + d->chunk;
      if (hi > d->size[k])
        hi = d->size[k];
      uint64_t *f = &d->filled[d->first[k] + j];
      if (*f == hi - lo)
        continue;
      *f = hi - lo;
      int rc = hr_gpu_copy_async(d->gs, d->dev[k], lo, d->pinned,
                                 d->boff[k] + lo, hi - lo);
      if (rc)
        d->err = rc;
      else
        d->copies = 1;
    }
}

int hr__devrx_finish(hr_session *s, hr_stream *st, hr_tensor *landed) {
  hr_devrx *d = st->rv.dev;
  copy_rest(d);
  const hr_descriptor *ld = hr_tensor_descriptor(landed);
  hr_descriptor desc = *ld;
  for (unsigned k = 0; k < desc.buffer_count; k++) {
    desc.buffers[k].device_tag = d->tag;
    desc.buffers[k].sync_mode = d->sync;
  }
  devout *o = hr__mem_calloc(&s->mem, 1, sizeof *o);
  hr_gpu_event *ev = NULL;
  int rc = o ? 0 : HR_ERR_NOMEM;
  if (rc == 0 && d->err)
    rc = d->err;
  if (rc == 0 && d->sync == HR_SYNC_EVENT) {
    rc = hr_gpu_event_new(d->g, 0, &ev);
    if (rc == 0)
      rc = hr_gpu_event_record(ev, d->gs);
  }
  hr_tensor *out = NULL;
  if (rc == 0)
    rc = hr_tensor_wrap_device(&out, &desc, d->dev, ev, devout_release, o,
                               &s->mem);
  hr_tensor_unref(landed);
  if (rc) {
    hr_gpu_event_del(ev);
    hr__mem_free(&s->mem, o);
    /* The block goes once the device is done with it. */
    int rv = drain_submit(s, d, NULL, NULL);
    hr__cli_stream_fail(s, st, rc == HR_ERR_NOMEM ? HR_ERR_NOMEM : HR_ERR_IO, 0,
                        0, "copying to the device failed");
    hr__stream_end(s, st);
    return rv;
  }
  /* The device buffers are the tensor's now. */
  o->mem = s->mem;
  o->nbuf = d->nbuf;
  o->ev = ev;
  for (unsigned k = 0; k < d->nbuf; k++) {
    o->dev[k] = d->dev[k];
    d->dev[k] = NULL;
  }
  if (d->sync == HR_SYNC_EVENT) {
    /* The drain takes the block first: ending the stream frees `d`. */
    int rv = drain_submit(s, d, NULL, NULL);
    hr__cli_get_deliver(s, st, out);
    hr__stream_end(s, st);
    return rv;
  }
  return drain_submit(s, d, st, out);
}
