/*
 * Staged RDMA sources (docs/protocol.md decision 76): a single-part tensor
 * whose bytes the fabric cannot read where they are (a device tensor
 * without GPUDirect, transcoded output) is materialised in one host region
 * first, and only then goes over the RDMA data plane from that region.
 *
 *  - hr__rstage_begin (hr_rdma_glue.c, when the part's descriptor would
 *    go) takes the region's size from the stage budget (an account shared
 *    by the engine's sessions), and a work item allocates the region on
 *    the host's workers: pinned memory of the device for a device tensor
 *    (its copies run at full speed), host memory otherwise.  The
 *    descriptor waits (hr__tx_ready is 0 while hr__rstage_waiting);
 *  - when the region is there, it is filled: a device tensor by one
 *    staging item that waits for the producer's event on the device
 *    (ADR-018 P2) and copies every buffer into the region (completed
 *    through hr_work.start, the loop never waits); dense transcoded
 *    output by the transcode jobs writing their ranges into it, a window
 *    of them at a time; sparse output is the transcode's whole tensor
 *    already, which only has to be complete;
 *  - when it is full, the part becomes a direct part over the region (the
 *    application's tensor is released then: no copy reads it any more)
 *    and is made ready: hr__rdma_tx_prepare sends the descriptor with
 *    data_plane RDMA and registers the region as the SOURCE, or, when the
 *    fabric refuses it, sends frames from it.
 *
 * The region is a tensor (its buffers back to back at their alignment, as
 * § 7.1 places them) whose release frees the memory and gives the bytes
 * back to the budget: the part, the handshake's hold and any item in
 * flight keep it, so it goes when the last of them is done, on whichever
 * thread that is.  A stream that ends while items run leaves them to
 * finish; the last one frees the stage.
 *
 * Regions are reused (decision 79): allocating and faulting in a
 * tensor-sized pinned region, and freeing it again, cost as much as the
 * copy on every transfer.  The memory under a freed region tensor goes
 * back to the engine's account, which keeps a few idle regions (at most
 * `rdma_stage_keep` bytes, still counted in the budget) in lock-free
 * slots, keyed by kind (pinned memory of which device, or host memory)
 * and size class; the next stage of that class takes one instead of
 * allocating, and its registration with the fabric stays cached, since
 * the memory is the same.  Whatever thread drops a region last parks it
 * (one compare-and-swap into an empty slot), so no lock and no thread
 * ownership is involved; a region that finds no room is freed as before.
 * Idle regions go when a stage needs their budget and nothing idle fits
 * (all of them), and when the account goes with the engine.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <hurray/fabric.h>

#include "hr_session_int.h"

#ifdef HR_HAVE_TRANSCODE
#include <hurray/transcode.h>
#endif

/* ---- the budget and the idle regions ------------------------------------ */

/* Idle regions an account keeps at most. */
#define POOL_SLOTS 4

typedef struct sreg sreg;

struct hr_stage_account {
  hr_mem mem;
  _Atomic uint64_t used; /* regions in use and idle */
  _Atomic uint64_t idle; /* of which idle, in `slot` */
  _Atomic unsigned refs;
  _Atomic(sreg *) slot[POOL_SLOTS];
  _Atomic uint64_t made, reused; /* regions allocated / taken from a slot */
};

/* What the region tensor's release frees or parks (any thread). */
struct sreg {
  hr_mem mem;
  hr_stage_account *acct;           /* reference while in use, else NULL */
  uint64_t bytes;                   /* counted in acct: the size class */
  uint64_t keep;                    /* its owner's rdma_stage_keep */
  hr_gpu *g;                        /* pinned memory of this device */
  void *raw;                        /* host allocation, or NULL */
  hr_gpu_buf *pin;                  /* pinned allocation, or NULL */
  hr_gpu_buf *wrap[HR_MAX_BUFFERS]; /* raw's buffers as copy targets */
  /* Fabric registrations that may be cached over the memory: told when
   * the memory itself is freed, not when a region tensor over it goes
   * (hr__rstage_watch). */
  const hr_fabric_ops *wops[2];
  void *wtrk[2];
};

static void sreg_release_memory(sreg *r) {
  for (unsigned k = 0; k < HR_MAX_BUFFERS; k++) {
    hr_gpu_buf_del(r->wrap[k]);
    r->wrap[k] = NULL;
  }
  /* Cached registrations first, while the memory is still there. */
  for (unsigned k = 0; k < 2; k++)
    if (r->wops[k]) {
      void *p = r->pin ? hr_gpu_buf_host_ptr(r->pin) : r->raw;
      if (p)
        r->wops[k]->tracker_invalidate(r->wtrk[k], p, r->bytes);
      r->wops[k]->tracker_unref(r->wtrk[k]);
    }
  hr_gpu_buf_del(r->pin);
  hr__mem_free(&r->mem, r->raw);
  hr_mem mem = r->mem;
  hr__mem_free(&mem, r);
}

static void acct_give(hr_stage_account *a, uint64_t n) {
  atomic_fetch_sub(&a->used, n);
}

/* Frees an idle region taken out of its slot. */
static void pool_evict(hr_stage_account *a, sreg *r) {
  uint64_t n = r->bytes;
  sreg_release_memory(r);
  atomic_fetch_sub(&a->idle, n);
  acct_give(a, n);
}

/* Frees every idle region. */
static void pool_drain(hr_stage_account *a) {
  for (unsigned i = 0; i < POOL_SLOTS; i++) {
    sreg *r = atomic_exchange(&a->slot[i], NULL);
    if (r)
      pool_evict(a, r);
  }
}

/* Parks `r` (acct already NULL, its bytes still counted) in an empty
 * slot when its owner keeps that much: 1 parked, 0 not (any thread). */
static int pool_put(hr_stage_account *a, sreg *r) {
  if (!r->pin && !r->raw)
    return 0; /* its allocation failed */
  uint64_t cur = atomic_load(&a->idle);
  do {
    if (r->bytes > r->keep || cur > r->keep - r->bytes)
      return 0;
  } while (!atomic_compare_exchange_weak(&a->idle, &cur, cur + r->bytes));
  for (unsigned i = 0; i < POOL_SLOTS; i++) {
    sreg *none = NULL;
    /* Publishes the region: whoever takes it sees it whole. */
    if (atomic_compare_exchange_strong(&a->slot[i], &none, r))
      return 1;
  }
  atomic_fetch_sub(&a->idle, r->bytes);
  return 0;
}

/* An idle region of `bytes` bytes of pinned memory of `g` (NULL: host
 * memory), or NULL.  Regions of another kind taken out on the way go
 * back, or are freed when their slot was filled meanwhile. */
static sreg *pool_take(hr_stage_account *a, hr_gpu *g, uint64_t bytes) {
  for (unsigned i = 0; i < POOL_SLOTS; i++) {
    if (!atomic_load(&a->slot[i]))
      continue;
    sreg *r = atomic_exchange(&a->slot[i], NULL);
    if (!r)
      continue;
    if (r->bytes == bytes && r->g == g) {
      atomic_fetch_sub(&a->idle, bytes);
      atomic_fetch_add(&a->reused, 1);
      return r;
    }
    sreg *none = NULL;
    if (!atomic_compare_exchange_strong(&a->slot[i], &none, r))
      pool_evict(a, r);
  }
  return NULL;
}

hr_stage_account *hr__stage_account_new(const hr_mem *mem) {
  const hr_mem *m = mem ? mem : hr_mem_default();
  hr_stage_account *a = hr__mem_calloc(m, 1, sizeof *a);
  if (!a)
    return NULL;
  a->mem = *m;
  atomic_init(&a->used, 0);
  atomic_init(&a->idle, 0);
  atomic_init(&a->refs, 1);
  atomic_init(&a->made, 0);
  atomic_init(&a->reused, 0);
  for (unsigned i = 0; i < POOL_SLOTS; i++)
    atomic_init(&a->slot[i], NULL);
  return a;
}

hr_stage_account *hr__stage_account_ref(hr_stage_account *a) {
  if (a)
    atomic_fetch_add(&a->refs, 1);
  return a;
}

void hr__stage_account_unref(hr_stage_account *a) {
  if (!a || atomic_fetch_sub(&a->refs, 1) != 1)
    return;
  /* Nobody can park a region any more: only holders of a reference do. */
  pool_drain(a);
  hr_mem mem = a->mem;
  hr__mem_free(&mem, a);
}

uint64_t hr__stage_account_used(const hr_stage_account *a) {
  return a ? atomic_load(&((hr_stage_account *)a)->used) : 0;
}

void hr__stage_account_stats(const hr_stage_account *a, hr__stage_stats *st) {
  hr_stage_account *m = (hr_stage_account *)a;
  memset(st, 0, sizeof *st);
  if (!a)
    return;
  st->used = atomic_load(&m->used);
  st->idle = atomic_load(&m->idle);
  st->made = atomic_load(&m->made);
  st->reused = atomic_load(&m->reused);
  for (unsigned i = 0; i < POOL_SLOTS; i++)
    st->idle_regions += atomic_load(&m->slot[i]) != NULL;
}

/* Takes `n` bytes when they fit under `cap`; 1 taken, 0 not. */
static int acct_take(hr_stage_account *a, uint64_t n, uint64_t cap) {
  uint64_t cur = atomic_load(&a->used);
  do {
    if (n > cap || cur > cap - n)
      return 0;
  } while (!atomic_compare_exchange_weak(&a->used, &cur, cur + n));
  return 1;
}

/* The size class of a region of `n` bytes: rounded up to an eighth of
 * the power of two below it (at least 64 KiB), so that tensors of about
 * the same size share regions at most an eighth larger than they need. */
static uint64_t size_class(uint64_t n) {
  uint64_t step = (uint64_t)64 << 10;
  while (step < UINT64_MAX / 16 && step * 16 <= n)
    step <<= 1;
  return n > UINT64_MAX - step ? n : (n + step - 1) / step * step;
}

/* The region tensor's release: the memory goes back to the idle slots
 * when its owner keeps some, else it is freed (any thread). */
static void sreg_free(void *ctx) {
  sreg *r = ctx;
  hr_stage_account *a = r->acct;
  for (unsigned k = 0; k < HR_MAX_BUFFERS; k++) {
    hr_gpu_buf_del(r->wrap[k]);
    r->wrap[k] = NULL;
  }
  r->acct = NULL;
  if (!pool_put(a, r)) {
    uint64_t n = r->bytes;
    sreg_release_memory(r);
    acct_give(a, n);
  }
  hr__stage_account_unref(a);
}

/* ---- the stage ----------------------------------------------------------- */

enum { RS_DEVICE = 1, RS_WINDOW, RS_WHOLE };
enum { JOB_ALLOC = 1, JOB_COPY, JOB_XC };

typedef struct sjob sjob;

struct hr_rstage {
  hr_session *s;
  hr_stream *st;       /* NULL once the stream went */
  int kind;            /* RS_* */
  int ready;           /* filled: the part is direct over the region */
  unsigned works;      /* items in flight */
  unsigned copies;     /* of which staging copies (they read the tensor) */
  struct sjob *copy;   /* that copy */
  hr_descriptor local; /* the region's descriptor (host memory) */
  uint64_t off[HR_MAX_BUFFERS], span, align;
  hr_tensor *region; /* reference, once allocated */
  hr_gpu_buf *dst[HR_MAX_BUFFERS];
  uint64_t dst_off[HR_MAX_BUFFERS];
  hr_gpu *g;
  hr_gpu_stream *gs;
  uint64_t next, done_bytes; /* RS_WINDOW: output submitted / produced */
  uint64_t out_size;         /* RS_WINDOW: of out_size bytes */
};

struct sjob {
  hr_work w;
  hr_rstage *rs;
  int kind; /* JOB_* */
  int rc;
  /* JOB_ALLOC */
  sreg *reg;
  hr_gpu *g;
  int pinned, want_stream, wraps;
  uint64_t size, align;
  unsigned nbuf;
  uint64_t off[HR_MAX_BUFFERS], len[HR_MAX_BUFFERS];
  hr_gpu_stream *gs;
  /* JOB_COPY: every buffer dsrc[k] + doff[k] into dst[k] + dst_off[k],
   * on `gs` after `ready`.  `src_t` keeps the source (and its event)
   * alive, `region` the target. */
  hr_tensor *src_t, *region;
  hr_gpu_buf *src[HR_MAX_BUFFERS], *dst[HR_MAX_BUFFERS];
  uint64_t soff[HR_MAX_BUFFERS], doff[HR_MAX_BUFFERS];
  hr_gpu_event *ready;
  hr_gpu_work gw;
  hr_put_tail *tail;
  /* JOB_XC */
  hr_xjob *xj; /* reference */
  uint8_t *out;
  uint64_t begin;
};

static hr_part *part_of(hr_rstage *rs) {
  return rs->st ? &rs->st->tx.parts[0] : NULL;
}

static void rstage_free(hr_session *s, hr_rstage *rs) {
  hr_tensor_unref(rs->region);
  hr__mem_free(&s->mem, rs);
}

int hr__rstage_waiting(const hr_part *p) {
  const hr_rstage *rs = p->rstage;
  if (!rs || rs->ready)
    return 0;
  return !(rs->kind == RS_WHOLE && p->xmode == HR_XM_DIRECT);
}

int hr__rstage_put_unsent(const hr_stream *st) {
  const hr_tx *tx = &st->tx;
  return st->kind == HR_SK_CLI_PUT && !tx->cur && tx->phase == HR_TXP_DESC &&
         tx->nparts && hr__rstage_waiting(&tx->parts[0]);
}

void hr__rstage_detach(hr_session *s, hr_part *p) {
  hr_rstage *rs = p->rstage;
  if (!rs)
    return;
  p->rstage = NULL;
  rs->st = NULL;
  if (!rs->works)
    rstage_free(s, rs);
}

/* One item in flight less; frees a detached stage with its last one. */
static void work_back(hr_session *s, hr_rstage *rs) {
  s->works_inflight--;
  rs->works--;
  if (!rs->st && !rs->works)
    rstage_free(s, rs);
}

static void submit(hr_session *s, hr_rstage *rs, sjob *x) {
  rs->works++;
  hr__work_submit(s, &x->w);
}

/* Ends the stream on a failure of its stage: the descriptor never went. */
static void stage_fail(hr_session *s, hr_rstage *rs, int rc, uint32_t wire,
                       const char *text) {
  hr_stream *st = rs->st;
  if (!st || st->ended || st->tx.failed)
    return;
  st->tx.failed = 1;
  int rv = hr__tx_stage_error(s, st, rc, wire, text);
  if (rv < 0)
    hr__fatal(s, rv);
}

/* The region is full: the part becomes a direct part over it, and the
 * tensor it was made from goes (ADR-018 § 5: no copy reads it now). */
static void stage_ready(hr_session *s, hr_rstage *rs) {
  hr_stream *st = rs->st;
  hr_part *p = part_of(rs);
  const hr_descriptor *rd = hr_tensor_descriptor(rs->region);
  for (unsigned k = 0; k < HR_MAX_BUFFERS; k++) {
    p->src[k] = k < rd->buffer_count ? hr_tensor_buffer(rs->region, k) : NULL;
    p->len[k] = k < rd->buffer_count ? rd->buffers[k].size_bytes : 0;
    p->dsrc[k] = NULL;
    p->doff[k] = 0;
  }
  /* The descriptor's text lives in the region's copy from now on. */
  p->desc.layout.ext = rd->layout.ext;
  p->desc.params_raw = rd->params_raw;
  p->dready = NULL;
  hr_tensor_unref(p->hold);
  hr_tensor_unref(p->t);
  p->hold = hr_tensor_ref(rs->region);
  p->t = hr_tensor_ref(rs->region);
  hr__xjob_unref(p->xj);
  p->xj = NULL;
  p->xmode = HR_XM_DIRECT;
  rs->ready = 1;
  if (hr__tx_ready(st))
    hr__ready_add(s, st);
}

/* ---- filling: device copies ---------------------------------------------- */

static int copy_enqueue(hr_work *w) {
  sjob *x = (sjob *)w;
  int rv = 0;
  if (x->ready)
    rv = hr_gpu_stream_wait_event(x->gs, x->ready);
  for (unsigned k = 0; k < x->nbuf && rv == 0; k++)
    if (x->len[k])
      rv = hr_gpu_copy_async(x->gs, x->dst[k], x->doff[k], x->src[k],
                             x->soff[k], x->len[k]);
  return rv;
}

/* A failure is only returned: the host runs `run`, which enqueues again
 * and waits. */
static int copy_start(hr_work *w, void (*complete)(hr_work *, void *),
                      void *ctx) {
  sjob *x = (sjob *)w;
  return hr__gpu_work_start(&x->gw, w, x->gs, copy_enqueue, complete, ctx,
                            NULL);
}

static void copy_run(hr_work *w) {
  sjob *x = (sjob *)w;
  x->rc = hr__gpu_work_run(w, x->gs, copy_enqueue);
}

static void copy_done(hr_work *w) {
  sjob *x = (sjob *)w;
  hr_rstage *rs = x->rs;
  hr_session *s = rs->s;
  int rc = x->rc;
  hr_put_tail *tail = x->tail;
  hr_tensor_unref(x->src_t);
  hr_tensor_unref(x->region);
  hr__mem_free(&s->mem, x);
  rs->copies--;
  rs->copy = NULL;
  if (rs->st) {
    if (rc)
      stage_fail(s, rs, rc, HR_WIRE_INTERNAL, "staging from the device failed");
    else
      stage_ready(s, rs);
  }
  work_back(s, rs);
  /* After the tensor's reference went: a parked callback comes last. */
  hr__put_tail_drop(tail);
}

static void fill_device(hr_session *s, hr_rstage *rs) {
  hr_part *p = part_of(rs);
  sjob *x = hr__mem_calloc(&s->mem, 1, sizeof *x);
  if (!x) {
    stage_fail(s, rs, HR_ERR_NOMEM, HR_WIRE_RESOURCE_EXHAUSTED,
               "out of memory");
    return;
  }
  x->w.run = copy_run;
  x->w.start = copy_start;
  x->w.done = copy_done;
  x->kind = JOB_COPY;
  x->rs = rs;
  x->src_t = hr_tensor_ref(p->hold);
  x->region = hr_tensor_ref(rs->region);
  x->ready = p->dready;
  x->gs = rs->gs;
  x->nbuf = p->desc.buffer_count;
  for (unsigned k = 0; k < x->nbuf; k++) {
    x->src[k] = p->dsrc[k];
    x->soff[k] = p->doff[k];
    x->len[k] = p->len[k];
    x->dst[k] = rs->dst[k];
    x->doff[k] = rs->dst_off[k];
  }
  rs->copies++;
  rs->copy = x;
  submit(s, rs, x);
}

unsigned hr__rstage_copies(const hr_part *p) {
  return p->rstage ? p->rstage->copies : 0;
}

void hr__rstage_park(hr_part *p, hr_put_tail *t) {
  if (p->rstage && p->rstage->copy)
    p->rstage->copy->tail = t;
}

/* ---- filling: transcoded output ------------------------------------------ */

#ifdef HR_HAVE_TRANSCODE
static void xc_run(hr_work *w) {
  sjob *x = (sjob *)w;
  x->rc = hr_xc_run(x->xj->plan, x->begin, x->size, x->out);
}

static void fill_window(hr_session *s, hr_rstage *rs);

static void xc_done(hr_work *w) {
  sjob *x = (sjob *)w;
  hr_rstage *rs = x->rs;
  hr_session *s = rs->s;
  int rc = x->rc;
  uint64_t n = x->size;
  hr__xjob_unref(x->xj);
  hr_tensor_unref(x->region);
  hr__mem_free(&s->mem, x);
  if (rs->st && !rs->st->tx.failed) {
    if (rc) {
      stage_fail(s, rs, rc, HR_WIRE_TRANSCODE_FAILED, "transcoding failed");
    } else {
      rs->done_bytes += n;
      if (rs->done_bytes >= rs->out_size)
        stage_ready(s, rs);
      else
        fill_window(s, rs);
    }
  }
  work_back(s, rs);
}

/* Keeps transcode_window jobs of transcode_chunk bytes writing into the
 * region, as the framed window would. */
static void fill_window(hr_session *s, hr_rstage *rs) {
  hr_part *p = part_of(rs);
  uint64_t chunk = s->set.transcode_chunk ? s->set.transcode_chunk : 1;
  uint32_t cap = s->set.transcode_window ? s->set.transcode_window : 1;
  if (p->xj->grain > 1 && chunk > p->xj->grain)
    chunk -= chunk % p->xj->grain;
  uint8_t *out = hr_tensor_buffer(rs->region, 0);
  while (rs->works < cap && rs->next < rs->out_size && rs->st && !rs->ready &&
         !rs->st->tx.failed) {
    uint64_t len = rs->out_size - rs->next;
    if (len > chunk)
      len = chunk;
    sjob *x = hr__mem_calloc(&s->mem, 1, sizeof *x);
    if (!x) {
      stage_fail(s, rs, HR_ERR_NOMEM, HR_WIRE_RESOURCE_EXHAUSTED,
                 "out of memory");
      return;
    }
    x->w.run = xc_run;
    x->w.done = xc_done;
    x->kind = JOB_XC;
    x->rs = rs;
    x->xj = p->xj;
    p->xj->refs++;
    x->region = hr_tensor_ref(rs->region);
    x->begin = rs->next;
    x->size = len;
    x->out = out + rs->next;
    rs->next += len;
    submit(s, rs, x);
  }
}
#else
static void fill_window(hr_session *s, hr_rstage *rs) {
  stage_fail(s, rs, HR_ERR_UNSUPPORTED, HR_WIRE_TRANSCODE_FAILED,
             "transcoding failed");
}
#endif

/* ---- the allocation ------------------------------------------------------ */

/* The base of the region's memory, aligned as its buffers need (the
 * allocation has `align` bytes to spare for it). */
static uint8_t *reg_base(const sreg *r, uint64_t align) {
  uint8_t *p = r->pin ? hr_gpu_buf_host_ptr(r->pin) : r->raw;
  if (!p)
    return NULL;
  uintptr_t a = (uintptr_t)p;
  uintptr_t m = (uintptr_t)(align ? align : 1) - 1;
  return p + (((a + m) & ~m) - a);
}

static void alloc_run(hr_work *w) {
  sjob *x = (sjob *)w;
  sreg *r = x->reg;
  if (x->want_stream)
    x->rc = hr_gpu_stream_new(x->g, &x->gs);
  if (x->rc)
    return;
  /* A region taken from an idle slot has its memory already. */
  if (x->pinned && !r->pin)
    x->rc = hr_gpu_buf_alloc(x->g, HR_GPU_MEM_PINNED, x->size, &r->pin);
  if (!x->pinned && !r->raw) {
    r->raw = hr__mem_malloc(&r->mem, (size_t)x->size);
    if (!r->raw)
      x->rc = HR_ERR_NOMEM;
    else if (x->size >= HR_HUGE_THRESHOLD)
      hr__huge_advise(r->raw, (size_t)x->size);
  }
  uint8_t *base = x->rc == 0 ? reg_base(r, x->align) : NULL;
  if (!base)
    return;
  /* The padding between buffers goes on the wire with them (the region
   * is sent whole, § 13): zeroes, never what an earlier tensor or the
   * allocator left there. */
  for (unsigned k = 1; k < x->nbuf; k++) {
    uint64_t end = x->off[k - 1] + x->len[k - 1];
    if (x->off[k] > end)
      memset(base + end, 0, (size_t)(x->off[k] - end));
  }
  if (x->pinned)
    return;
  for (unsigned k = 0; k < x->nbuf && x->wraps && x->rc == 0; k++)
    if (x->len[k])
      x->rc =
          hr_gpu_buf_wrap_host(x->g, base + x->off[k], x->len[k], &r->wrap[k]);
}

static void alloc_done(hr_work *w) {
  sjob *x = (sjob *)w;
  hr_rstage *rs = x->rs;
  hr_session *s = rs->s;
  sreg *r = x->reg;
  int rc = x->rc;
  hr_gpu_stream *gs = x->gs;
  hr__mem_free(&s->mem, x);
  if (!rs->st) {
    /* The stream went while the memory was allocated. */
    hr_gpu_stream_del(gs);
    sreg_free(r);
    work_back(s, rs);
    return;
  }
  if (rc == 0 && gs) {
    rc = hr__chunk_stream_adopt(s, rs->g, gs, &rs->gs);
    gs = NULL;
  }
  hr_tensor *t = NULL;
  uint8_t *base = rc == 0 ? reg_base(r, rs->align) : NULL;
  if (rc == 0 && !base)
    rc = HR_ERR_INTERNAL;
  if (rc == 0) {
    void *bufs[HR_MAX_BUFFERS] = {0};
    for (unsigned k = 0; k < rs->local.buffer_count; k++)
      bufs[k] = base + rs->off[k];
    rc = hr_tensor_wrap(&t, &rs->local, bufs, sreg_free, r, &s->mem);
  }
  if (rc) {
    hr_gpu_stream_del(gs);
    sreg_free(r);
    stage_fail(s, rs, HR_ERR_NOMEM, HR_WIRE_RESOURCE_EXHAUSTED,
               "no host memory to stage the tensor for RDMA");
    work_back(s, rs);
    return;
  }
  rs->region = t;
  for (unsigned k = 0; k < rs->local.buffer_count; k++) {
    rs->dst[k] = r->pin ? r->pin : r->wrap[k];
    rs->dst_off[k] =
        r->pin ? (uint64_t)(base - (uint8_t *)hr_gpu_buf_host_ptr(r->pin)) +
                     rs->off[k]
               : 0;
  }
  if (rs->kind == RS_DEVICE)
    fill_device(s, rs);
  else
    fill_window(s, rs);
  work_back(s, rs);
}

/* ---- the start ----------------------------------------------------------- */

int hr__rstage_begin(hr_session *s, hr_stream *st, hr_part *p,
                     hr_stage_account *acct, uint64_t cap, char *why,
                     size_t why_cap) {
  int kind = p->xmode == HR_XM_STAGE    ? RS_DEVICE
             : p->xmode == HR_XM_WINDOW ? RS_WINDOW
             : p->xmode == HR_XM_WHOLE  ? RS_WHOLE
                                        : 0;
  if (kind != RS_WHOLE && (!acct || !cap)) {
    snprintf(why, why_cap, "RDMA staging is off (rdma_stage_budget 0)");
    return 0;
  }
  /* The framed window must not have begun (a sparse transcode's one job
   * fills its whole tensor, which is what is sent). */
  if (!kind || p->rstage || st->tx.nparts != 1 ||
      (kind != RS_WHOLE && st->tx.win_count) ||
      (kind == RS_DEVICE && p->dipc)) {
    snprintf(why, why_cap, "its staging had begun");
    return 0;
  }
  hr_descriptor local = p->desc;
  for (unsigned k = 0; k < local.buffer_count; k++) {
    local.buffers[k].device_tag = HR_DEV_CPU;
    local.buffers[k].device_index = 0;
    local.buffers[k].memory_class = HR_MEM_STANDARD;
  }
  uint64_t off[HR_MAX_BUFFERS] = {0}, span = 0, align = 1;
  if (kind != RS_WHOLE &&
      hr__tensor_placement(&local, 0, off, &span, &align) != 0) {
    snprintf(why, why_cap, "its buffers cannot be placed in one region");
    return 0;
  }
  /* The region's base is aligned inside an allocation `align` bytes
   * larger (at most 2 MiB more: § 7.1's largest alignment). */
  uint64_t size = span + align;
  if (kind == RS_WINDOW && local.buffer_count &&
      local.buffers[0].size_bytes != p->xj->out_size) {
    snprintf(why, why_cap, "its output is not one buffer");
    return 0;
  }
  hr_gpu *pg = NULL;
  int pinned = 0;
  if (kind == RS_DEVICE) {
    hr_gpu_caps caps;
    pg = hr_gpu_buf_device(p->dsrc[0]);
    pinned = hr_gpu_query(pg, &caps) == 0 && (caps.flags & HR_GPU_CAP_PINNED);
  }
  sreg *r = NULL;
  if (kind != RS_WHOLE) {
    uint64_t want = size_class(size);
    r = pool_take(acct, pinned ? pg : NULL, want);
    if (!r && !acct_take(acct, want, cap)) {
      /* Idle regions of other classes give their budget back; where the
       * class does not fit, exactly what the tensor needs may. */
      pool_drain(acct);
      if (!acct_take(acct, want, cap) && !acct_take(acct, want = size, cap)) {
        snprintf(why, why_cap,
                 "the RDMA staging budget is spent (%llu of %llu bytes)",
                 (unsigned long long)hr__stage_account_used(acct),
                 (unsigned long long)cap);
        return 0;
      }
    }
    size = want;
  }
  int fresh = kind != RS_WHOLE && !r;
  hr_rstage *rs = hr__mem_calloc(&s->mem, 1, sizeof *rs);
  sjob *x = kind != RS_WHOLE ? hr__mem_calloc(&s->mem, 1, sizeof *x) : NULL;
  if (fresh)
    r = hr__mem_calloc(&s->mem, 1, sizeof *r);
  if (!rs || (kind != RS_WHOLE && (!x || !r))) {
    hr__mem_free(&s->mem, rs);
    hr__mem_free(&s->mem, x);
    if (fresh) {
      hr__mem_free(&s->mem, r);
      acct_give(acct, size);
    } else if (r) {
      /* Back to a slot, or freed (its bytes are counted). */
      r->keep = s->set.rdma_stage_keep;
      r->acct = hr__stage_account_ref(acct);
      sreg_free(r);
    }
    return HR_ERR_NOMEM;
  }
  rs->s = s;
  rs->st = st;
  rs->kind = kind;
  rs->local = local;
  memcpy(rs->off, off, sizeof off);
  rs->span = span;
  rs->align = align;
  rs->out_size = kind == RS_WINDOW ? p->xj->out_size : 0;
  p->rstage = rs;
  if (kind == RS_WHOLE)
    return 1; /* the transcode's own job fills its whole tensor */
  if (fresh) {
    r->mem = s->mem;
    r->bytes = size;
    r->g = pinned ? pg : NULL;
    atomic_fetch_add(&acct->made, 1);
  }
  r->acct = hr__stage_account_ref(acct);
  r->keep = s->set.rdma_stage_keep;
  x->w.run = alloc_run;
  x->w.done = alloc_done;
  x->kind = JOB_ALLOC;
  x->rs = rs;
  x->reg = r;
  x->size = size;
  x->align = align;
  x->nbuf = local.buffer_count;
  for (unsigned k = 0; k < x->nbuf; k++) {
    x->off[k] = off[k];
    x->len[k] = local.buffers[k].size_bytes;
  }
  if (kind == RS_DEVICE) {
    rs->g = pg;
    x->g = pg;
    x->pinned = pinned;
    x->wraps = !pinned;
    x->want_stream = hr__chunk_stream_get(s, rs->g, &rs->gs) != 0;
  }
  submit(s, rs, x);
  return 1;
}

int hr__rstage_watch(hr_tensor *t, const hr_fabric_ops *ops, void *trk) {
  sreg *r = hr__tensor_release_ctx(t, sreg_free);
  if (!r)
    return HR_ERR_UNSUPPORTED;
  /* The region is this stage's alone until its tensor goes: no other
   * thread reads these fields before sreg_free. */
  for (unsigned k = 0; k < 2; k++)
    if (r->wops[k] == ops && r->wtrk[k] == trk)
      return 1;
  for (unsigned k = 0; k < 2; k++)
    if (!r->wops[k]) {
      r->wops[k] = ops;
      r->wtrk[k] = trk;
      return 0;
    }
  return HR_ERR_UNSUPPORTED;
}

int hr__rstage_local(const hr_part *p, hr_descriptor *local, void **bufs) {
  const hr_rstage *rs = p->rstage;
  if (!rs || hr__rstage_waiting(p) || p->xmode != HR_XM_DIRECT)
    return HR_ERR_STATE;
  *local = rs->region ? *hr_tensor_descriptor(rs->region) : rs->local;
  for (unsigned k = 0; k < HR_MAX_BUFFERS; k++)
    bufs[k] = (void *)p->src[k];
  if (!rs->region) {
    /* Sparse output: the transcode's whole tensor, in host memory. */
    local->layout.ext = p->desc.layout.ext;
    local->params_raw = p->desc.params_raw;
  }
  return 0;
}
