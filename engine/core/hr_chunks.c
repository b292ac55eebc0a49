/*
 * Reusable chunk buffers for the sending pipeline.
 *
 * A streamed part (a transcode, a device tensor staged to the host) is
 * produced chunk by chunk into buffers that TENSOR_DATA frames then point
 * into.  Allocating each chunk afresh costs a page fault per page on
 * every chunk (4 MiB: a thousand faults, plus the unmapping), which is
 * most of what a transcoded GET costs beyond the kernel.  So the session
 * keeps a small pool of blocks: a chunk tensor wraps a block and gives it
 * back when its last reference goes (the frames were written and the work
 * item is done).  The pool keeps at most `cap` idle blocks, enough for one
 * stream's window plus what the send budget lets wait in the output
 * queue; more are freed.
 *
 * Blocks are host memory (an hr_tensor_alloc'd tensor, huge pages advised)
 * or pinned memory of a device (hr_gpu_buf PINNED, or host memory wrapped
 * where the device has no pinned memory), keyed by (device, size).
 *
 * Everything here runs on the driving thread: chunk tensors are referenced
 * only by the session's windows, work items (released in their done
 * callback) and output queue.  The pool is reference-counted by the
 * session and by the blocks out, so a block coming back after the
 * session's free (never, today, but cheap to allow) is still safe.
 */
#include <string.h>

#include "hr_session_int.h"

#define HR_CPOOL_STREAMS 4

typedef struct hr_cblock hr_cblock;
typedef struct hr_cpool hr_cpool;

struct hr_cblock {
  hr_cpool *pool;
  hr_cblock *next;
  hr_tensor *host;  /* host memory (library-allocated), or NULL */
  hr_gpu_buf *gbuf; /* pinned (or wrapped host) buffer, or NULL */
  hr_gpu *g;        /* gbuf's device */
  uint8_t *ptr;
  uint64_t size;
};

struct hr_cpool {
  size_t refs; /* the session (until closed) + blocks out */
  int closed;
  hr_mem mem;
  hr_cblock *idle;
  size_t nidle, cap;
  uint64_t chunk; /* transcode_chunk: blocks above it are landing blocks */
  uint64_t allocs, reuses;
  struct {
    hr_gpu *g;
    hr_gpu_stream *st;
  } streams[HR_CPOOL_STREAMS];
};

static void block_free(hr_cpool *p, hr_cblock *b) {
  hr_gpu_buf_del(b->gbuf);
  hr_tensor_unref(b->host);
  hr__mem_free(&p->mem, b);
}

static void pool_unref(hr_cpool *p) {
  if (--p->refs > 0)
    return;
  hr_mem mem = p->mem;
  hr__mem_free(&mem, p);
}

/* Release callback of a chunk tensor: the block goes back to the pool.
 * Of the blocks larger than a chunk (a GET's whole pinned landing block)
 * only the latest is kept, so idle memory stays bounded by cap chunks
 * plus one tensor. */
static void block_return(void *ctx) {
  hr_cblock *b = ctx;
  hr_cpool *p = b->pool;
  if (!p->closed && b->size > p->chunk) {
    for (hr_cblock **pp = &p->idle; *pp; pp = &(*pp)->next)
      if ((*pp)->size > p->chunk) {
        hr_cblock *old = *pp;
        *pp = old->next;
        p->nidle--;
        block_free(p, old);
        break;
      }
  }
  if (!p->closed && p->nidle < p->cap) {
    b->next = p->idle;
    p->idle = b;
    p->nidle++;
  } else {
    block_free(p, b);
  }
  pool_unref(p);
}

static hr_cpool *pool_of(hr_session *s) {
  if (s->cpool)
    return s->cpool;
  hr_cpool *p = hr__mem_calloc(&s->mem, 1, sizeof *p);
  if (!p)
    return NULL;
  p->refs = 1;
  p->mem = s->mem;
  /* One stream's window, the chunks the send budget lets wait in the
   * output queue, and one being written. */
  uint64_t chunk = s->set.transcode_chunk ? s->set.transcode_chunk : 1;
  uint64_t queued = s->set.send_budget / chunk + 1;
  p->chunk = chunk;
  p->cap = (size_t)(s->set.transcode_window + (queued < 16 ? queued : 16) + 1);
  s->cpool = p;
  return p;
}

static int block_new(hr_session *s, hr_cpool *p, hr_gpu *g, uint64_t size,
                     hr_cblock **out) {
  hr_cblock *b = hr__mem_calloc(&s->mem, 1, sizeof *b);
  if (!b)
    return HR_ERR_NOMEM;
  b->pool = p;
  b->g = g;
  b->size = size;
  int rv = 0;
  hr_gpu_caps caps;
  if (g && (rv = hr_gpu_query(g, &caps)) == 0 &&
      (caps.flags & HR_GPU_CAP_PINNED)) {
    rv = hr_gpu_buf_alloc(g, HR_GPU_MEM_PINNED, size, &b->gbuf);
    if (rv == 0)
      b->ptr = hr_gpu_buf_host_ptr(b->gbuf);
  } else if (rv == 0) {
    hr_descriptor d;
    memset(&d, 0, sizeof d);
    d.descriptor_version = 1;
    d.element_type = HR_ELEM_UINT8;
    d.rank = 1;
    d.shape[0] = size;
    d.layout.tag = HR_LAYOUT_ROW_MAJOR;
    d.buffer_count = 1;
    d.buffers[0].size_bytes = size;
    rv = hr_tensor_alloc(&b->host, &d, 6, &s->mem);
    if (rv == 0) {
      b->ptr = hr_tensor_buffer(b->host, 0);
      if (g)
        rv = hr_gpu_buf_wrap_host(g, b->ptr, size, &b->gbuf);
    }
  }
  if (rv == 0 && !b->ptr)
    rv = HR_ERR_NOMEM;
  if (rv) {
    block_free(p, b);
    return rv;
  }
  p->allocs++;
  *out = b;
  return 0;
}

/* An idle block of (g, size), taken out of the pool, or NULL. */
static hr_cblock *idle_take(hr_cpool *p, hr_gpu *g, uint64_t size) {
  for (hr_cblock **pp = &p->idle; *pp; pp = &(*pp)->next)
    if ((*pp)->g == g && (*pp)->size == size) {
      hr_cblock *b = *pp;
      *pp = b->next;
      p->nidle--;
      p->reuses++;
      return b;
    }
  return NULL;
}

/* Wraps block b (out of the pool) in a chunk tensor of len bytes that
 * gives it back when its last reference goes. */
static int block_wrap(hr_session *s, hr_cpool *p, hr_cblock *b, uint64_t len,
                      hr_tensor **out, hr_gpu_buf **gbuf) {
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_UINT8;
  d.rank = 1;
  d.shape[0] = len;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  d.buffers[0].size_bytes = len;
  void *ptr = b->ptr;
  p->refs++;
  int rv = hr_tensor_wrap(out, &d, &ptr, block_return, b, &s->mem);
  if (rv) {
    block_return(b);
    return rv;
  }
  if (gbuf)
    *gbuf = b->gbuf;
  return 0;
}

int hr__chunk_get(hr_session *s, hr_gpu *g, uint64_t size, uint64_t len,
                  hr_tensor **out, hr_gpu_buf **gbuf) {
  hr_cpool *p = pool_of(s);
  if (!p)
    return HR_ERR_NOMEM;
  hr_cblock *b = idle_take(p, g, size);
  int rv;
  if (!b && (rv = block_new(s, p, g, size, &b)) != 0)
    return rv;
  return block_wrap(s, p, b, len, out, gbuf);
}

int hr__chunk_take(hr_session *s, hr_gpu *g, uint64_t size, hr_tensor **out,
                   hr_gpu_buf **gbuf) {
  hr_cpool *p = pool_of(s);
  if (!p)
    return HR_ERR_NOMEM;
  hr_cblock *b = idle_take(p, g, size);
  if (!b)
    return HR_ERR_NOT_FOUND;
  return block_wrap(s, p, b, size, out, gbuf);
}

int hr__chunk_adopt(hr_session *s, hr_gpu *g, hr_gpu_buf *pinned,
                    hr_tensor **out, hr_gpu_buf **gbuf) {
  hr_cpool *p = pool_of(s);
  hr_cblock *b = p ? hr__mem_calloc(&s->mem, 1, sizeof *b) : NULL;
  if (!b) {
    hr_gpu_buf_del(pinned);
    return HR_ERR_NOMEM;
  }
  b->pool = p;
  b->g = g;
  b->gbuf = pinned;
  b->size = hr_gpu_buf_size(pinned);
  b->ptr = hr_gpu_buf_host_ptr(pinned);
  if (!b->ptr) {
    block_free(p, b);
    return HR_ERR_NOMEM;
  }
  p->allocs++;
  return block_wrap(s, p, b, b->size, out, gbuf);
}

int hr__chunk_stream(hr_session *s, hr_gpu *g, hr_gpu_stream **out) {
  hr_cpool *p = pool_of(s);
  if (!p)
    return HR_ERR_NOMEM;
  for (unsigned i = 0; i < HR_CPOOL_STREAMS; i++) {
    if (p->streams[i].g == g) {
      *out = p->streams[i].st;
      return 0;
    }
    if (!p->streams[i].g) {
      int rv = hr_gpu_stream_new(g, &p->streams[i].st);
      if (rv)
        return rv;
      p->streams[i].g = g;
      *out = p->streams[i].st;
      return 0;
    }
  }
  return HR_ERR_LIMIT;
}

int hr__chunk_stream_get(hr_session *s, hr_gpu *g, hr_gpu_stream **out) {
  hr_cpool *p = s->cpool;
  for (unsigned i = 0; p && i < HR_CPOOL_STREAMS; i++)
    if (p->streams[i].g == g) {
      *out = p->streams[i].st;
      return 0;
    }
  return HR_ERR_NOT_FOUND;
}

int hr__gpu_stream_wait(hr_gpu_stream *gs) {
  hr_gpu_event *e = NULL;
  int rv = hr_gpu_event_new(hr_gpu_stream_device(gs), 0, &e);
  if (rv == 0)
    rv = hr_gpu_event_record(e, gs);
  if (rv == 0)
    rv = hr_gpu_event_sync(e);
  hr_gpu_event_del(e);
  return rv;
}

int hr__chunk_stream_adopt(hr_session *s, hr_gpu *g, hr_gpu_stream *gs,
                           hr_gpu_stream **out) {
  hr_cpool *p = pool_of(s);
  for (unsigned i = 0; p && i < HR_CPOOL_STREAMS; i++) {
    if (p->streams[i].g == g) {
      /* Another GET's work item made one first: that one stays. */
      hr_gpu_stream_del(gs);
      *out = p->streams[i].st;
      return 0;
    }
    if (!p->streams[i].g) {
      p->streams[i].g = g;
      p->streams[i].st = gs;
      *out = gs;
      return 0;
    }
  }
  hr_gpu_stream_del(gs);
  return p ? HR_ERR_LIMIT : HR_ERR_NOMEM;
}

void hr__chunk_stats(const hr_session *s, uint64_t *allocs, uint64_t *reuses) {
  *allocs = s->cpool ? s->cpool->allocs : 0;
  *reuses = s->cpool ? s->cpool->reuses : 0;
}

void hr__chunks_close(hr_session *s) {
  hr_cpool *p = s->cpool;
  if (!p)
    return;
  s->cpool = NULL;
  p->closed = 1;
  while (p->idle) {
    hr_cblock *b = p->idle;
    p->idle = b->next;
    block_free(p, b);
  }
  p->nidle = 0;
  /* No work is out (the session is freed only once it is back), so the
   * streams are idle: deleting them does not wait. */
  for (unsigned i = 0; i < HR_CPOOL_STREAMS; i++)
    hr_gpu_stream_del(p->streams[i].st);
  pool_unref(p);
}
