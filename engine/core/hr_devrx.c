/*
 * Receiving a GET into device memory (hr_get_opts.device).
 *
 * The bytes go through a bounded ring of pinned staging pieces of the
 * device (settings.device_piece bytes each, settings.device_pieces of
 * them; blocks of the session's chunk pool, so a later GET reuses them
 * without pinning again), never through a tensor-sized landing block:
 *
 *  - when the descriptor arrives, the device buffers and the pinned
 *    pieces the pool lacks (and, the first time, the session's stream of
 *    the device) are allocated by a work item on the host's workers (a
 *    driver's allocation of a large tensor takes milliseconds, which
 *    would stall the loop); the frames wait for it as for a full ring
 *    (hr__devrx_full), over RDMA the receive's setup waits for it
 *    (hr__rdma_rx_resume), and its completion (alloc_done) hands the
 *    buffers over, or fails this GET only (out of device memory).  A GET
 *    that ends meanwhile leaves them to the item, which frees them;
 *  - a piece of the tensor (a device_piece-sized slice of one buffer) is
 *    given a free slot when its first byte arrives; frames land there,
 *    zero-copy as usual (hr__recv_where points the socket's recv() at the
 *    slot);
 *  - the moment every byte of the piece has landed, its host-to-device
 *    copy is enqueued on the session's stream of the device, and a work
 *    item (hr_work.start: a host function on that stream, which writes
 *    the engine's completion eventfd) reports when the copy is done; the
 *    slot is free again then.  The loop thread never waits on the device;
 *  - when every slot is taken, the session stops taking input
 *    (hr_session_recv_paused()) until a copy completes: backpressure on
 *    the socket.  Bytes of a full ring that arrive anyway (the engine's
 *    64 KiB staging read may hold the start of a frame) are kept aside
 *    (the spill) and placed when a slot frees;
 *  - over the SHM data plane the bytes arrive as a mapped segment: the
 *    pieces are filled from the mapping (a memcpy into the pinned slot,
 *    as a socket would) as slots free, and copied the same way.
 *
 * Then, as the application asked:
 *  - P1 (HR_SYNC_PRODUCER_SYNCED): the GET completes when the last
 *    piece's copy is done (the completion of its work item);
 *  - P2 (HR_SYNC_EVENT): the GET completes once every copy is enqueued,
 *    with a device tensor whose event (hr_tensor_gpu_event) marks the end
 *    of the copies; the application waits on it on its own stream
 *    (ADR-018 § 2).
 *
 * Frames may arrive in any order within the ring's reach; a peer that
 * sends a piece beyond it while the earlier pieces wait for bytes (no copy
 * in flight to free a slot) fails the GET.  Restrictions: one plain
 * tensor (no composite), not parallel, no application destination
 * (checked by hr_session_get).
 */
#include <stddef.h>
#include <string.h>

#include "hr_session_int.h"

#define DEVRX_SLOTS_MAX 16u
#define DEVRX_PIECE_DEFAULT ((uint64_t)8 << 20)
#define DEVRX_SLOTS_DEFAULT 4u
/* Bytes a host that reads past hr_session_recv_paused() may push into the
 * spill before the GET fails (the engine spills at most one 64 KiB read). */
#define DEVRX_SPILL_MAX ((uint64_t)4 << 20)

#define AT_NONE (-1)   /* no byte landed yet, no slot */
#define AT_COPIED (-2) /* copy enqueued, slot released to its work */

typedef struct pwork pwork;
typedef struct ajob ajob;

typedef struct dslot {
  hr_tensor *blk;  /* pool chunk (pinned), NULL until first used */
  hr_gpu_buf *pin; /* its device handle */
  uint8_t *ptr;
  int used; /* holds a piece: filling, or its copy in flight */
} dslot;

typedef struct spill {
  struct spill *next;
  unsigned bi;
  uint64_t off, n;
  uint8_t data[]; /* n bytes */
} spill;

struct hr_devrx {
  hr_session *s;
  hr_recv *rv;
  hr_gpu *g;
  hr_gpu_stream *gs;
  uint8_t sync; /* HR_SYNC_PRODUCER_SYNCED or HR_SYNC_EVENT */
  uint8_t tag;  /* the device's device_tag */
  int have_dest;
  unsigned nbuf;
  hr_gpu_buf *dev[HR_MAX_BUFFERS];
  uint64_t size[HR_MAX_BUFFERS];
  uint64_t first[HR_MAX_BUFFERS + 1]; /* buffer k's first piece */
  uint64_t piece;                     /* bytes per piece */
  unsigned nslots;
  dslot slot[DEVRX_SLOTS_MAX];
  uint64_t npieces;
  uint64_t *filled; /* bytes landed per piece */
  int8_t *at;       /* per piece: slot index, AT_NONE or AT_COPIED */
  uint64_t enqueued, completed; /* piece copies */
  pwork *works;                 /* in flight, newest first */
  spill *spill_head, *spill_tail;
  uint64_t spilled; /* bytes in the spill */
  hr_tensor *src;   /* SHM: the mapped segment the pieces come from */
  hr_tensor *host;  /* RDMA without GPUDirect: the host landing tensor,
                       the pieces' source once the transfer completed */
  /* RDMA with GPUDirect: the data plane writes the device buffers, which
   * this tensor owns from then on (dev[] only borrows them), so that they
   * outlive the GET while the fabric may still write. */
  hr_tensor *direct;
  uint64_t src_next;
  int finished;       /* every byte arrived (hr__devrx_finish ran) */
  hr_descriptor desc; /* the tensor's, kept by finish */
  int err;            /* a copy or a slot could not be had */
  int busy, again;    /* progress() re-entrancy guard */
  int plane_rdma;     /* the descriptor's data plane is RDMA */
  ajob *alloc;        /* the device memory's allocation, in flight */
  int dropping;       /* cancelled before the memory came: input dropped */
  /* What the transfer record reports (session clock). */
  uint32_t pauses0;     /* the session's rx_pauses when the GET began */
  uint64_t paused0;     /* ... and its rx_paused_ns */
  hr_tstamp busy_since; /* the copy stream went from idle to busy */
  uint64_t busy_ns;     /* time with a copy in flight */
  hr_tstamp landed_at;  /* every byte arrived (finish) */
};

/* A piece's copy in flight: holds its slot's block until the device has
 * read it; the GET learns of the end through done(). */
struct pwork {
  hr_work w;
  hr_session *s;
  hr_devrx *d; /* NULL once the GET is gone */
  pwork *next, *prev;
  unsigned slot;
  hr_tensor *blk;
  hr_gpu_stream *gs;
  /* The device buffers of a GET that went while copies were in flight:
   * the newest work frees them (the stream runs in order, so its copy is
   * the last one to write them). */
  hr_gpu_buf *own[HR_MAX_BUFFERS];
  unsigned nown;
  hr_gpu_work gw;
  int rc;
};

/* The allocation of a GET's device memory, and of the pinned pieces the
 * session's pool lacks, run on a worker: cudaMalloc and friends of a
 * large tensor take milliseconds to tens of milliseconds, which on the
 * loop thread would stall every connection of the loop.  The worker
 * touches only this item and the device (whose objects are thread-safe);
 * the GET takes the buffers when the item is back on the driving thread
 * (alloc_done), or, when the GET went meanwhile, the item frees them. */
struct ajob {
  hr_work w;
  hr_session *s;
  hr_devrx *d; /* NULL once the GET is gone */
  hr_gpu *g;
  unsigned nbuf, npin;
  uint64_t size[HR_MAX_BUFFERS];
  uint64_t piece;
  hr_gpu_buf *dev[HR_MAX_BUFFERS];
  hr_gpu_buf *pin[DEVRX_SLOTS_MAX];
  /* The session's first GET into this device also creates its staging
   * stream here (a driver call of the same cost class). */
  int want_stream;
  hr_gpu_stream *gs;
  int rc;
};

/* What a device tensor handed to the application owns. */
typedef struct devout {
  hr_mem mem;
  hr_gpu_buf *dev[HR_MAX_BUFFERS];
  unsigned nbuf;
  hr_gpu_event *ev;
  hr_tensor *keep; /* GPUDirect: the owner of the device buffers */
} devout;

static void progress(hr_devrx *d, int from_work);

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
  hr_tensor_unref(o->keep);
  hr_mem mem = o->mem;
  hr__mem_free(&mem, o);
}

static hr_stream *stream_of(hr_devrx *d) {
  return (hr_stream *)(void *)((char *)d->rv - offsetof(hr_stream, rv));
}

/* The buffer and the byte range [lo, hi) of piece `g`. */
static unsigned piece_range(const hr_devrx *d, uint64_t g, uint64_t *lo,
                            uint64_t *hi) {
  unsigned k = 0;
  while (k + 1 < d->nbuf && g >= d->first[k + 1])
    k++;
  *lo = (g - d->first[k]) * d->piece;
  *hi = *lo + d->piece < d->size[k] ? *lo + d->piece : d->size[k];
  return k;
}

/* ---- the piece copies' work items --------------------------------------- */

/* The copy was enqueued at submission (enqueue()): only its end is
 * enqueued here, and a failure is just returned (the host runs `run`). */
static int piece_start(hr_work *w, void (*complete)(hr_work *, void *),
                       void *ctx) {
  pwork *x = (pwork *)w;
  return hr__gpu_work_start(&x->gw, w, x->gs, NULL, complete, ctx, NULL);
}

/* For a host without `start` (a worker thread, or inline): the same end,
 * waited for. */
static void piece_run(hr_work *w) {
  pwork *x = (pwork *)w;
  x->rc = hr__gpu_work_run(w, x->gs, NULL);
}

static void unlink_work(hr_devrx *d, pwork *x) {
  if (x->prev)
    x->prev->next = x->next;
  else
    d->works = x->next;
  if (x->next)
    x->next->prev = x->prev;
  x->next = x->prev = NULL;
}

static void piece_done(hr_work *w) {
  pwork *x = (pwork *)w;
  hr_session *s = x->s;
  s->works_inflight--;
  hr_devrx *d = x->d;
  if (d) {
    unlink_work(d, x);
    d->slot[x->slot].used = 0;
    d->completed++;
    if (!d->works && s->now > d->busy_since)
      d->busy_ns += s->now - d->busy_since;
    if (x->rc && !d->err)
      d->err = x->rc;
  }
  for (unsigned k = 0; k < x->nown; k++)
    hr_gpu_buf_del(x->own[k]);
  hr_tensor_unref(x->blk);
  hr__mem_free(&s->mem, x);
  if (d)
    progress(d, 1);
}

/* Enqueues piece g's copy (its every byte landed in its slot) and the
 * work that reports its end. */
static void enqueue(hr_devrx *d, uint64_t g) {
  hr_session *s = d->s;
  unsigned k = (unsigned)d->at[g];
  dslot *sl = &d->slot[k];
  uint64_t lo, hi;
  unsigned bi = piece_range(d, g, &lo, &hi);
  d->at[g] = AT_COPIED;
  d->enqueued++;
  pwork *x = d->err ? NULL : hr__mem_calloc(&s->mem, 1, sizeof *x);
  int rc = x ? hr_gpu_copy_async(d->gs, d->dev[bi], lo, sl->pin, 0, hi - lo)
             : HR_ERR_NOMEM;
  if (rc) {
    hr__mem_free(&s->mem, x);
    if (!d->err)
      d->err = rc;
    /* Nothing in flight reads the slot. */
    sl->used = 0;
    d->completed++;
    return;
  }
  x->w.run = piece_run;
  x->w.done = piece_done;
  x->w.start = piece_start;
  x->s = s;
  x->d = d;
  x->slot = k;
  x->blk = hr_tensor_ref(sl->blk);
  x->gs = d->gs;
  if (!d->works)
    d->busy_since = s->now;
  x->next = d->works;
  if (d->works)
    d->works->prev = x;
  d->works = x;
  /* Inline: piece_done's progress() finds us busy and defers. */
  hr__work_submit(s, &x->w);
}

/* Whether something in flight will free a slot (or give the ring its
 * memory): a piece's copy or the allocation. */
static int pending(const hr_devrx *d) { return d->works || d->alloc; }

/* The slot of piece g, given one if it has none and one is free (-1:
 * none now, or the piece is already copied). */
static int slot_for(hr_devrx *d, uint64_t g) {
  if (d->at[g] >= 0)
    return d->at[g];
  if (d->at[g] == AT_COPIED || d->err || d->alloc || d->dropping)
    return -1;
  for (unsigned k = 0; k < d->nslots; k++) {
    dslot *sl = &d->slot[k];
    if (sl->used)
      continue;
    if (!sl->blk) {
      if (hr__chunk_get(d->s, d->g, d->piece, d->piece, &sl->blk, &sl->pin)) {
        d->err = HR_ERR_NOMEM;
        return -1;
      }
      sl->ptr = hr_tensor_buffer(sl->blk, 0);
    }
    sl->used = 1;
    d->at[g] = (int8_t)k;
    return (int)k;
  }
  return -1;
}

static int free_slot(const hr_devrx *d) {
  for (unsigned k = 0; k < d->nslots; k++)
    if (!d->slot[k].used)
      return 1;
  return 0;
}

/* Counts n bytes landed at [off, off + n) of buffer bi (all in one piece
 * or several) and enqueues the copies of the pieces now complete. */
static void count_landed(hr_devrx *d, unsigned bi, uint64_t off, uint64_t n) {
  uint64_t end = off + n;
  for (uint64_t j = off / d->piece; j * d->piece < end; j++) {
    uint64_t lo = j * d->piece, hi = lo + d->piece;
    if (hi > d->size[bi])
      hi = d->size[bi];
    uint64_t a = off > lo ? off : lo, b = end < hi ? end : hi;
    uint64_t g = d->first[bi] + j;
    /* The frame checker refuses overlapping frames; stay exact anyway. */
    if (d->at[g] < 0 || d->filled[g] + (b - a) > hi - lo)
      continue;
    d->filled[g] += b - a;
    if (d->filled[g] == hi - lo)
      enqueue(d, g);
  }
}

/* Places what it can of n bytes at (bi, off); returns the bytes placed. */
static uint64_t place_some(hr_devrx *d, unsigned bi, uint64_t off,
                           const uint8_t *p, uint64_t n) {
  uint64_t done = 0;
  while (done < n) {
    uint64_t run = 0;
    uint8_t *dst = hr__devrx_where(d->rv, bi, off + done, &run);
    if (!dst || !run)
      break;
    uint64_t c = run < n - done ? run : n - done;
    memcpy(dst, p + done, (size_t)c);
    count_landed(d, bi, off + done, c);
    done += c;
  }
  return done;
}

/* Places spilled bytes whose piece has a slot now. */
static void replay_spill(hr_devrx *d) {
  while (d->spill_head && !d->err) {
    spill *sp = d->spill_head;
    uint64_t c = place_some(d, sp->bi, sp->off, sp->data, sp->n);
    if (c < sp->n) {
      if (c) {
        /* Keep the rest (rarely: a spill entry that spans pieces). */
        memmove(sp->data, sp->data + c, (size_t)(sp->n - c));
        sp->off += c;
        sp->n -= c;
        d->spilled -= c;
      }
      return;
    }
    d->spill_head = sp->next;
    if (!d->spill_head) {
      d->spill_tail = NULL;
      d->s->dev_spilling--;
    }
    d->spilled -= sp->n;
    hr__mem_free(&d->s->mem, sp);
  }
}

/* SHM: fills free slots from the mapping, in order. */
static void fill_from_src(hr_devrx *d) {
  while (d->src && d->src_next < d->npieces && !d->err) {
    uint64_t g = d->src_next, lo, hi;
    unsigned bi = piece_range(d, g, &lo, &hi);
    int k = slot_for(d, g);
    if (k < 0)
      return;
    memcpy(d->slot[k].ptr, (const uint8_t *)hr_tensor_buffer(d->src, bi) + lo,
           (size_t)(hi - lo));
    d->filled[g] = hi - lo;
    d->src_next++;
    enqueue(d, g);
  }
  if (d->src && d->src_next == d->npieces) {
    /* Every byte is in pinned memory: the segment goes back now. */
    hr_tensor_unref(d->src);
    d->src = NULL;
  }
}

static void deliver(hr_devrx *d);

/* Moves the GET forward after anything happened: spilled bytes, SHM
 * pieces, the delivery.  From a work's completion (from_work) it also
 * fails a GET that cannot go on.  May end the stream (and free `d`): the
 * caller touches `d` no more. */
static void progress(hr_devrx *d, int from_work) {
  if (d->busy) {
    d->again = 1;
    return;
  }
  d->busy = 1;
  do {
    d->again = 0;
    replay_spill(d);
    fill_from_src(d);
  } while (d->again);
  d->busy = 0;
  if (d->alloc || d->dropping)
    return; /* nothing can go on before the memory is there */
  if (!d->finished) {
    /* Frames still come: a failure or a spill nothing will ever place
     * (its piece is beyond the ring and no copy is left to free a slot)
     * ends the GET with an ERROR to the server. */
    if (from_work && (d->err || (d->spill_head && !pending(d)))) {
      hr_stream *st = stream_of(d);
      int rv =
          hr__stream_error(d->s, st->id, HR_WIRE_RESOURCE_EXHAUSTED,
                           d->err ? "copying to the device failed"
                                  : "frames beyond the device staging ring");
      if (rv < 0)
        hr__fatal(d->s, rv);
    }
    return;
  }
  if (d->spill_head && !pending(d) && !d->err)
    d->err = HR_ERR_UNSUPPORTED;
  if (d->err ||
      (d->sync == HR_SYNC_EVENT ? d->enqueued : d->completed) == d->npieces)
    deliver(d);
}

/* ---- the session's entry points ----------------------------------------- */

void hr__devrx_free(hr_session *s, hr_devrx *d) {
  if (!d)
    return;
  hr__devrx_detach(d->rv);
  if (d->spill_head)
    s->dev_spilling--;
  while (d->spill_head) {
    spill *sp = d->spill_head;
    d->spill_head = sp->next;
    hr__mem_free(&s->mem, sp);
  }
  for (unsigned k = 0; k < d->nbuf; k++)
    if (!d->direct)
      hr_gpu_buf_del(d->dev[k]);
  hr_tensor_unref(d->direct);
  for (unsigned k = 0; k < d->nslots; k++)
    hr_tensor_unref(d->slot[k].blk);
  hr_tensor_unref(d->src);
  hr_tensor_unref(d->host);
  hr__mem_free(&s->mem, d->filled);
  hr__mem_free(&s->mem, d->at);
  hr__mem_free(&s->mem, d);
}

void hr__devrx_detach(hr_recv *rv) {
  hr_devrx *d = rv ? rv->dev : NULL;
  if (d && d->alloc) {
    /* The allocation frees what it got when it comes back. */
    d->alloc->d = NULL;
    d->alloc = NULL;
  }
  if (!d || !d->works)
    return;
  /* Copies still write the device buffers: the newest work frees the
   * ones nobody took (a GET that failed or was cancelled). */
  pwork *last = d->works;
  for (unsigned k = 0; k < d->nbuf; k++)
    if (d->dev[k]) {
      last->own[last->nown++] = d->dev[k];
      d->dev[k] = NULL;
    }
  for (pwork *x = d->works, *next; x; x = next) {
    next = x->next;
    x->d = NULL;
    x->next = x->prev = NULL;
  }
  d->works = NULL;
}

int hr__devrx_new(hr_session *s, hr_recv *rv, hr_gpu *g, uint8_t sync) {
  hr_gpu_caps caps;
  int rc = hr_gpu_query(g, &caps);
  if (rc)
    return rc;
  hr_devrx *d = hr__mem_calloc(&s->mem, 1, sizeof *d);
  if (!d)
    return HR_ERR_NOMEM;
  d->s = s;
  d->rv = rv;
  d->g = g;
  d->sync = sync;
  d->tag = caps.device_tag;
  d->piece = s->set.device_piece ? s->set.device_piece : DEVRX_PIECE_DEFAULT;
  d->nslots = s->set.device_pieces ? s->set.device_pieces : DEVRX_SLOTS_DEFAULT;
  if (d->nslots > DEVRX_SLOTS_MAX)
    d->nslots = DEVRX_SLOTS_MAX;
  if (d->nslots < 2)
    d->nslots = 2;
  if (d->piece < 4096)
    d->piece = 4096;
  d->pauses0 = s->rx_pauses;
  d->paused0 = s->rx_paused_ns;
  rv->dev = d;
  return 0;
}

/* Moves a clock that stood still while input was paused forward by the
 * time paused `d` (never past now). */
static hr_tstamp shift(hr_tstamp t, uint64_t d, hr_tstamp now) {
  if (t == HR_TSTAMP_NEVER || t >= now)
    return t;
  return now - t > d ? t + d : now;
}

void hr__devrx_track_pause(hr_session *s) {
  if (!s->rx_paused && !s->dev_spilling &&
      !(s->rc.active && s->rc.st && s->rc.st->rv.dev))
    return;
  int paused = hr_session_recv_paused(s) != 0;
  if (paused == s->rx_paused)
    return;
  hr_tstamp now = s->now;
  if (paused) {
    s->rx_paused = 1;
    s->rx_paused_at = now;
    s->rx_pauses++;
    return;
  }
  /* Resumed: the time paused counts against neither the read timeout
   * (a TENSOR_DATA payload's progress) nor the keepalive (input seen):
   * the peer may have been waiting on us all along. */
  s->rx_paused = 0;
  uint64_t d = now > s->rx_paused_at ? now - s->rx_paused_at : 0;
  s->rx_paused_ns += d;
  s->msg_started = shift(s->msg_started, d, now);
  s->last_rx = shift(s->last_rx, d, now);
  if (s->keepalive_out)
    s->keepalive_sent = shift(s->keepalive_sent, d, now);
}

/* Fills the stream's transfer record with the ring's figures. */
static void record_stats(hr_devrx *d) {
  hr_session *s = d->s;
  hr_transfer_record *rec = &stream_of(d)->rec;
  rec->recv_pauses = s->rx_pauses - d->pauses0;
  rec->recv_paused_ns = s->rx_paused_ns - d->paused0;
  rec->device_pieces = d->direct ? 0 : (uint32_t)d->enqueued;
  rec->device_busy_ns = d->busy_ns;
  if (d->works && s->now > d->busy_since)
    rec->device_busy_ns += s->now - d->busy_since;
  rec->device_tail_ns =
      d->landed_at && s->now > d->landed_at ? s->now - d->landed_at : 0;
}

/* ---- the allocation ------------------------------------------------------ */

static void alloc_run(hr_work *w) {
  ajob *x = (ajob *)w;
  if (x->want_stream)
    x->rc = hr_gpu_stream_new(x->g, &x->gs);
  for (unsigned k = 0; k < x->nbuf && x->rc == 0; k++)
    x->rc = hr_gpu_buf_alloc(x->g, HR_GPU_MEM_DEVICE,
                             x->size[k] ? x->size[k] : 1, &x->dev[k]);
  for (unsigned i = 0; i < x->npin && x->rc == 0; i++)
    x->rc = hr_gpu_buf_alloc(x->g, HR_GPU_MEM_PINNED, x->piece, &x->pin[i]);
}

/* Frees what the item still holds. */
static void alloc_drop(ajob *x) {
  for (unsigned k = 0; k < x->nbuf; k++) {
    hr_gpu_buf_del(x->dev[k]);
    x->dev[k] = NULL;
  }
  for (unsigned i = 0; i < x->npin; i++) {
    hr_gpu_buf_del(x->pin[i]);
    x->pin[i] = NULL;
  }
  hr_gpu_stream_del(x->gs); /* idle: nothing ran on it */
  x->gs = NULL;
}

/* The GET takes the item's buffers: the device memory, and the pinned
 * pieces into the slots that have none (as blocks of the session's
 * pool).  0, or the allocation's error (nothing taken). */
static int alloc_take(hr_devrx *d, ajob *x) {
  int rc = x->rc;
  if (rc == 0 && x->gs) {
    rc = hr__chunk_stream_adopt(d->s, d->g, x->gs, &d->gs);
    x->gs = NULL;
  }
  if (rc == 0) {
    for (unsigned k = 0; k < x->nbuf; k++) {
      d->dev[k] = x->dev[k];
      x->dev[k] = NULL;
    }
    unsigned i = 0;
    for (unsigned k = 0; k < d->nslots && i < x->npin; k++) {
      dslot *sl = &d->slot[k];
      if (sl->blk)
        continue;
      hr_gpu_buf *b = x->pin[i];
      x->pin[i++] = NULL;
      int rv = hr__chunk_adopt(d->s, d->g, b, &sl->blk, &sl->pin);
      if (rv) {
        sl->blk = NULL;
        rc = rv;
        break;
      }
      sl->ptr = hr_tensor_buffer(sl->blk, 0);
    }
  }
  alloc_drop(x);
  return rc;
}

static void alloc_done(hr_work *w) {
  ajob *x = (ajob *)w;
  hr_session *s = x->s;
  s->works_inflight--;
  hr_devrx *d = x->d;
  int rc = 0;
  if (d) {
    d->alloc = NULL;
    rc = alloc_take(d, x);
  } else {
    alloc_drop(x); /* the GET went while the allocation ran */
  }
  hr__mem_free(&s->mem, x);
  if (!d)
    return;
  if (rc == 0 && d->plane_rdma) {
    /* The RDMA receive waited for the memory (its registration needs
     * it): set it up now.  It may end the stream, and `d` with it. */
    int rv = hr__rdma_rx_resume(s, stream_of(d));
    if (rv < 0)
      hr__fatal(s, rv);
    return;
  }
  if (rc == 0) {
    progress(d, 1);
    return;
  }
  /* This GET only: the connection and its other streams go on. */
  hr_stream *st = stream_of(d);
  const char *why = rc == HR_ERR_NOMEM ? "out of device memory"
                                       : "device memory could not be allocated";
  if (!d->finished) {
    hr__cli_get_abandon(s, st, HR_ERR_LIMIT, HR_WIRE_RESOURCE_EXHAUSTED, why);
    return;
  }
  /* Every byte arrived already: the server is done with the stream. */
  record_stats(d);
  hr__cli_stream_fail(s, st, HR_ERR_LIMIT, 0, 0, why);
  hr__stream_end(s, st);
}

/* Allocates the GET's device memory and the pinned pieces its pool lacks:
 * on the host's workers when it has them (the stream's input waits,
 * hr__devrx_full; over RDMA the receive's setup waits, hr_rdma_glue.c),
 * else here.  0, HR_ERR_LIMIT (the allocation failed here) or
 * HR_ERR_NOMEM (no memory for the work item). */
static int alloc_begin(hr_session *s, hr_devrx *d) {
  ajob *x = hr__mem_calloc(&s->mem, 1, sizeof *x);
  if (!x)
    return HR_ERR_NOMEM;
  x->w.run = alloc_run;
  x->w.done = alloc_done;
  x->s = s;
  x->g = d->g;
  x->nbuf = d->nbuf;
  for (unsigned k = 0; k < d->nbuf; k++)
    x->size[k] = d->size[k];
  x->piece = d->piece;
  x->want_stream = d->gs == NULL;
  /* Idle blocks of the pool (a previous GET's) take the first slots;
   * the job allocates the rest a GET of this size can use at once. */
  uint64_t need = d->npieces < d->nslots ? d->npieces : d->nslots;
  hr_gpu_caps caps;
  int pinned = hr_gpu_query(d->g, &caps) == 0 &&
               (caps.flags & HR_GPU_CAP_PINNED);
  for (unsigned k = 0; k < need; k++) {
    dslot *sl = &d->slot[k];
    if (hr__chunk_take(s, d->g, d->piece, &sl->blk, &sl->pin) == 0)
      sl->ptr = hr_tensor_buffer(sl->blk, 0);
    else if (pinned)
      x->npin++;
  }
  if (s->cbs.submit_work) {
    s->works_inflight++;
    d->alloc = x;
    x->d = d;
    hr__cb_enter(s);
    int rv = s->cbs.submit_work(s, &x->w, s->ud);
    hr__cb_leave(s);
    if (rv == 0)
      return 0;
    s->works_inflight--;
    d->alloc = NULL;
    x->d = NULL;
  }
  x->w.run(&x->w);
  int rc = alloc_take(d, x);
  hr__mem_free(&s->mem, x);
  /* Out of device memory refuses this transfer, as on a worker. */
  return rc ? HR_ERR_LIMIT : 0;
}

void hr__devrx_cancel(hr_session *s, hr_recv *rv) {
  hr_devrx *d = rv->dev;
  if (!d || !d->alloc)
    return;
  /* The input waits for the memory, and with it the answer to the
   * CANCEL: drop this stream's bytes instead (the allocation frees what
   * it got when it comes back), so that the answer is read at once. */
  d->alloc->d = NULL;
  d->alloc = NULL;
  d->dropping = 1;
  if (d->spill_head)
    s->dev_spilling--;
  while (d->spill_head) {
    spill *sp = d->spill_head;
    d->spill_head = sp->next;
    hr__mem_free(&s->mem, sp);
  }
  d->spill_tail = NULL;
  d->spilled = 0;
}

int hr__devrx_allocating(const hr_recv *rv) {
  return rv && rv->dev && rv->dev->alloc;
}

void hr__devrx_plane(hr_recv *rv, uint8_t data_plane) {
  if (rv->dev)
    rv->dev->plane_rdma = data_plane == HR_PLANE_RDMA;
}

int hr__devrx_dest(hr_session *s, hr_recv *rv, const hr_descriptor *desc,
                   hr_tensor **out) {
  hr_devrx *d = rv->dev;
  if (desc->layout.tag == HR_LAYOUT_COMPOSITE || d->have_dest)
    return HR_ERR_UNSUPPORTED;
  d->have_dest = 1;
  /* The session's staging stream of the device, when it has one; else
   * the allocation's work item creates it. */
  d->gs = NULL;
  (void)hr__chunk_stream_get(s, d->g, &d->gs);
  uint64_t pieces = 0;
  d->nbuf = desc->buffer_count;
  for (unsigned k = 0; k < desc->buffer_count; k++) {
    d->size[k] = desc->buffers[k].size_bytes;
    d->first[k] = pieces;
    pieces += (d->size[k] + d->piece - 1) / d->piece;
  }
  d->first[desc->buffer_count] = pieces;
  d->npieces = pieces;
  d->filled = hr__mem_calloc(&s->mem, pieces ? pieces : 1, sizeof *d->filled);
  d->at = hr__mem_malloc(&s->mem, pieces ? pieces : 1);
  if (!d->filled || !d->at)
    return HR_ERR_NOMEM;
  memset(d->at, AT_NONE, pieces ? pieces : 1);
  /* The node's tensor stands for the device buffers, which it does not
   * hold (they may not exist yet); the bytes land in the ring
   * (hr__recv_where asks hr__devrx_where). */
  int rc = hr__tensor_shell(out, desc, &s->mem);
  if (rc == 0)
    rc = alloc_begin(s, d);
  if (rc)
    return rc == HR_ERR_NOMEM ? rc : HR_ERR_LIMIT;
  if (rv->shm_next) {
    /* SHM: the bytes are in the mapped segment already. */
    d->src = rv->shm_next;
    rv->shm_next = NULL;
    rv->bytes += hr_tensor_bytes(d->src);
  }
  return 0;
}

hr_tensor *hr__devrx_rdma_host(hr_session *s, hr_recv *rv,
                               const hr_descriptor *desc) {
  hr_devrx *d = rv->dev;
  if (!d || !d->have_dest || d->src || d->host || d->npieces == 0)
    return NULL;
  /* Host memory, whatever the peer's buffers live in (§ 16.4 rule 3: the
   * landing memory is what a destination registration describes). */
  hr_descriptor hd = *desc;
  for (unsigned k = 0; k < hd.buffer_count; k++) {
    hd.buffers[k].device_tag = HR_DEV_CPU;
    hd.buffers[k].device_index = 0;
  }
  if (hr_tensor_alloc(&d->host, &hd, rv->min_align, &s->mem))
    return NULL;
  return d->host;
}

int hr__devrx_device_region(hr_recv *rv, const hr_descriptor *desc,
                            hr_descriptor *local, void **ptrs) {
  hr_devrx *d = rv->dev;
  hr_gpu_caps caps;
  if (!d || !d->have_dest || d->src || d->host || d->direct ||
      desc->buffer_count != d->nbuf || hr_gpu_query(d->g, &caps))
    return HR_ERR_UNSUPPORTED;
  *local = *desc;
  for (unsigned k = 0; k < d->nbuf; k++) {
    local->buffers[k].device_tag = d->tag;
    local->buffers[k].device_index = caps.device_index;
    ptrs[k] = hr_gpu_buf_device_ptr(d->dev[k]);
    if (d->size[k] && !ptrs[k])
      return HR_ERR_UNSUPPORTED;
  }
  return 0;
}

hr_tensor *hr__devrx_rdma_device(hr_session *s, hr_recv *rv,
                                 const hr_descriptor *local) {
  hr_devrx *d = rv->dev;
  devout *o = hr__mem_calloc(&s->mem, 1, sizeof *o);
  if (!o)
    return NULL;
  o->mem = s->mem;
  o->nbuf = d->nbuf;
  for (unsigned k = 0; k < d->nbuf; k++)
    o->dev[k] = d->dev[k];
  hr_tensor *t = NULL;
  if (hr_tensor_wrap_device(&t, local, d->dev, NULL, devout_release, o,
                            &s->mem)) {
    hr__mem_free(&s->mem, o);
    return NULL;
  }
  d->direct = t;
  return hr_tensor_ref(t);
}

uint8_t *hr__devrx_where(hr_recv *rv, unsigned bi, uint64_t off,
                         uint64_t *run) {
  hr_devrx *d = rv->dev;
  if (!d || !d->have_dest || d->src || d->host || d->direct || bi >= d->nbuf || off >= d->size[bi])
    return NULL;
  uint64_t j = off / d->piece, g = d->first[bi] + j;
  int k = slot_for(d, g);
  if (k < 0)
    return NULL;
  uint64_t lo = j * d->piece, hi = lo + d->piece;
  if (hi > d->size[bi])
    hi = d->size[bi];
  *run = hi - off;
  return d->slot[k].ptr + (off - lo);
}

int hr__devrx_full(const hr_recv *rv, unsigned bi, uint64_t off) {
  const hr_devrx *d = rv->dev;
  if (!d || !d->have_dest || bi >= d->nbuf || off >= d->size[bi] || d->err)
    return 0;
  /* The ring's memory is being allocated: nothing can land yet. */
  if (d->alloc)
    return 1;
  if (d->dropping)
    return 0;
  uint64_t g = d->first[bi] + off / d->piece;
  /* Only copies in flight free a slot: without one, reading on is what
   * finds a peer that outran the ring (hr__devrx_place fails it). */
  return d->at[g] == AT_NONE && !free_slot(d) && d->works;
}

int hr__devrx_place(hr_recv *rv, unsigned bi, uint64_t off, const uint8_t *p,
                    uint64_t n) {
  hr_devrx *d = rv->dev;
  if (!d || !d->have_dest || d->src || bi >= d->nbuf || off > d->size[bi] ||
      n > d->size[bi] - off)
    return HR_ERR_INVALID_ARGUMENT;
  if (d->dropping)
    return 0; /* cancelled: the bytes go nowhere */
  d->busy = 1;
  /* Behind spilled bytes, only more spill: order is kept per buffer. */
  uint64_t c = d->spill_head ? 0 : place_some(d, bi, off, p, n);
  d->busy = 0;
  int rc = 0;
  if (c < n && !d->err) {
    uint64_t g = d->first[bi] + (off + c) / d->piece;
    if (d->at[g] == AT_COPIED)
      rc = HR_ERR_INVALID_ARGUMENT; /* bytes for a piece already copied */
    else if (!pending(d))
      rc = HR_ERR_UNSUPPORTED; /* beyond the ring, and nothing frees it */
    else if (d->spilled + (n - c) > DEVRX_SPILL_MAX)
      rc = HR_ERR_LIMIT;
    else {
      spill *sp = hr__mem_malloc(&d->s->mem, sizeof *sp + (size_t)(n - c));
      if (!sp)
        return HR_ERR_NOMEM;
      sp->next = NULL;
      sp->bi = bi;
      sp->off = off + c;
      sp->n = n - c;
      memcpy(sp->data, p + c, (size_t)(n - c));
      if (d->spill_tail)
        d->spill_tail->next = sp;
      else {
        d->spill_head = sp;
        d->s->dev_spilling++;
      }
      d->spill_tail = sp;
      d->spilled += sp->n;
    }
  }
  if (d->err && !rc)
    rc = d->err;
  if (!rc && d->again) {
    d->again = 0;
    progress(d, 0); /* not finished yet: cannot end the stream */
  }
  if (!rc && d->spill_head && !pending(d))
    rc = HR_ERR_UNSUPPORTED;
  return rc;
}

void hr__devrx_landed(hr_recv *rv, unsigned bi, uint64_t off, uint64_t n) {
  hr_devrx *d = rv->dev;
  if (!d || !d->have_dest || d->src || bi >= d->nbuf || n == 0 ||
      off > d->size[bi] || n > d->size[bi] - off)
    return;
  d->busy = 1;
  count_landed(d, bi, off, n);
  d->busy = 0;
  if (d->again) {
    d->again = 0;
    progress(d, 0);
  }
}

/* Ends the GET: delivers the device tensor, or fails it.  Ends the
 * stream (which frees `d`). */
static void deliver(hr_devrx *d) {
  hr_session *s = d->s;
  hr_stream *st = stream_of(d);
  hr_descriptor desc = d->desc;
  for (unsigned k = 0; k < desc.buffer_count; k++) {
    desc.buffers[k].device_tag = d->tag;
    desc.buffers[k].sync_mode = d->sync;
  }
  devout *o = NULL;
  hr_gpu_event *ev = NULL;
  int rc = d->err;
  record_stats(d);
  if (rc == 0 && !(o = hr__mem_calloc(&s->mem, 1, sizeof *o)))
    rc = HR_ERR_NOMEM;
  if (rc == 0 && d->sync == HR_SYNC_EVENT) {
    rc = hr_gpu_event_new(d->g, 0, &ev);
    if (rc == 0)
      rc = hr_gpu_event_record(ev, d->gs);
  }
  hr_tensor *out = NULL;
  if (rc == 0)
    rc = hr_tensor_wrap_device(&out, &desc, d->dev, ev, devout_release, o,
                               &s->mem);
  if (rc) {
    hr_gpu_event_del(ev);
    hr__mem_free(&s->mem, o);
    hr__cli_stream_fail(s, st, rc == HR_ERR_NOMEM ? HR_ERR_NOMEM : HR_ERR_IO, 0,
                        0, "copying to the device failed");
    hr__stream_end(s, st);
    return;
  }
  /* The device buffers are the tensor's now (GPUDirect: through the
   * tensor that owns them). */
  o->mem = s->mem;
  o->nbuf = d->direct ? 0 : d->nbuf;
  o->ev = ev;
  o->keep = d->direct;
  d->direct = NULL;
  for (unsigned k = 0; k < d->nbuf; k++) {
    o->dev[k] = o->nbuf ? d->dev[k] : NULL;
    d->dev[k] = NULL;
  }
  hr__cli_get_deliver(s, st, out);
  hr__stream_end(s, st);
}

int hr__devrx_finish(hr_session *s, hr_stream *st, hr_tensor *landed) {
  hr_devrx *d = st->rv.dev;
  d->desc = *hr_tensor_descriptor(landed);
  d->landed_at = s->now;
  hr_tensor_unref(landed);
  if (d->dropping) {
    /* The answer raced the CANCEL, but its bytes were dropped. */
    record_stats(d);
    hr__cli_stream_fail(s, st, HR_ERR_CLOSED, HR_WIRE_CANCELLED, 1,
                        "cancelled while its device memory was allocated");
    hr__stream_end(s, st);
    return 0;
  }
  if (d->host) {
    /* The RDMA transfer into host memory completed: its pieces go to the
     * device through the ring like a mapped segment's. */
    d->src = d->host;
    d->host = NULL;
  }
  if (d->direct) {
    /* GPUDirect: the data plane's completion (TENSOR_DATA_END after the
     * writes, or every tagged receive) says the bytes are in the device
     * memory; no copy is needed.  P2's event is recorded at the delivery,
     * after that point. */
    d->enqueued = d->completed = d->npieces;
    d->finished = 1;
    progress(d, 0);
    return 0;
  }
  /* A data plane that writes the landing memory itself (RDMA, for a
   * tensor of one piece) bypasses hr__devrx_landed: copy what it filled. */
  d->busy = 1;
  /* Spilled bytes still land as slots free: the pieces are complete then. */
  for (uint64_t g = 0; g < d->npieces && !d->err && !d->spill_head; g++) {
    if (d->at[g] >= 0)
      enqueue(d, g);
    else if (d->at[g] == AT_NONE && !d->src)
      d->err = HR_ERR_INTERNAL; /* complete, yet a piece never landed */
  }
  d->busy = 0;
  d->finished = 1;
  progress(d, 0);
  return 0;
}
