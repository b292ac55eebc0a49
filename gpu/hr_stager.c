/*
 * The staging pipeline between device memory and the host: a ring of
 * pinned chunks on one stream, one event per slot.  While the host
 * consumes (or fills) one slot, the copies of the others are in flight, so
 * the copy engine stays busy and the host never waits for more than one
 * chunk's copy.  Built only on the public device interface, so it works
 * unchanged on every backend.
 */
#include <string.h>

#include "hr_gpu_int.h"

struct hr_gpu_stager {
  hr_mem mem;
  hr_gpu *g;
  hr_gpu_stream *s;
  size_t chunk;
  unsigned nslots;
  hr_gpu_buf *slot[64];
  hr_gpu_event *ev[64];
  void *host_mem[64]; /* only when the device has no pinned memory */
};

void hr_gpu_stager_del(hr_gpu_stager *st) {
  if (!st)
    return;
  if (st->s)
    hr_gpu_stream_sync(st->s);
  for (unsigned i = 0; i < st->nslots; i++) {
    hr_gpu_event_del(st->ev[i]);
    hr_gpu_buf_del(st->slot[i]);
    hr__mem_free(&st->mem, st->host_mem[i]);
  }
  hr_gpu_stream_del(st->s);
  hr_mem mem = st->mem;
  hr__mem_free(&mem, st);
}

int hr_gpu_stager_new(hr_gpu_stager **out, hr_gpu *g, size_t chunk,
                      unsigned slots, const hr_mem *mem) {
  if (!out || !g || chunk < 4096 || slots < 2 || slots > 64)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!mem)
    mem = hr_mem_default();
  hr_gpu_caps caps;
  int rv = hr_gpu_query(g, &caps);
  if (rv != 0)
    return rv;
  hr_gpu_stager *st = hr__mem_calloc(mem, 1, sizeof *st);
  if (!st)
    return HR_ERR_NOMEM;
  st->mem = *mem;
  st->g = g;
  st->chunk = chunk;
  st->nslots = slots;
  rv = hr_gpu_stream_new(g, &st->s);
  for (unsigned i = 0; i < slots && rv == 0; i++) {
    if (caps.flags & HR_GPU_CAP_PINNED) {
      rv = hr_gpu_buf_alloc(g, HR_GPU_MEM_PINNED, chunk, &st->slot[i]);
    } else {
      st->host_mem[i] = hr__mem_malloc(mem, chunk);
      rv = st->host_mem[i] ? hr_gpu_buf_wrap_host(g, st->host_mem[i], chunk,
                                                  &st->slot[i])
                           : HR_ERR_NOMEM;
    }
    if (rv == 0)
      rv = hr_gpu_event_new(g, 0, &st->ev[i]);
  }
  if (rv != 0) {
    hr_gpu_stager_del(st);
    return rv;
  }
  *out = st;
  return 0;
}

/* Length of chunk `i` of a `len`-byte range. */
static size_t piece(const hr_gpu_stager *st, uint64_t len, uint64_t i) {
  uint64_t left = len - i * st->chunk;
  return left < st->chunk ? (size_t)left : st->chunk;
}

/* Enqueues the device-to-slot copy of chunk `i` and records its event. */
static int issue_d2h(hr_gpu_stager *st, hr_gpu_buf *src, uint64_t off,
                     uint64_t len, uint64_t i) {
  unsigned k = (unsigned)(i % st->nslots);
  int rv = hr_gpu_copy_async(st->s, st->slot[k], 0, src, off + i * st->chunk,
                             piece(st, len, i));
  return rv ? rv : hr_gpu_event_record(st->ev[k], st->s);
}

int hr_gpu_stager_d2h(hr_gpu_stager *st, hr_gpu_buf *src, uint64_t off,
                      uint64_t len, hr_gpu_stage_sink sink, void *user) {
  if (!st || !src || !sink || off > hr_gpu_buf_size(src) ||
      len > hr_gpu_buf_size(src) - off)
    return HR_ERR_INVALID_ARGUMENT;
  uint64_t n = (len + st->chunk - 1) / st->chunk;
  uint64_t issued = 0;
  int rv = 0;
  while (issued < n && issued < st->nslots && rv == 0)
    rv = issue_d2h(st, src, off, len, issued++);
  for (uint64_t i = 0; i < n && rv == 0; i++) {
    unsigned k = (unsigned)(i % st->nslots);
    rv = hr_gpu_event_sync(st->ev[k]);
    if (rv == 0)
      rv = sink(user, i * st->chunk, hr_gpu_buf_host_ptr(st->slot[k]),
                piece(st, len, i));
    /* The slot is free again: refill it while the next ones land. */
    if (rv == 0 && issued < n)
      rv = issue_d2h(st, src, off, len, issued++);
  }
  if (rv != 0)
    hr_gpu_stream_sync(st->s);
  return rv;
}

int hr_gpu_stager_h2d(hr_gpu_stager *st, hr_gpu_buf *dst, uint64_t off,
                      uint64_t len, hr_gpu_stage_source source, void *user) {
  if (!st || !dst || !source || off > hr_gpu_buf_size(dst) ||
      len > hr_gpu_buf_size(dst) - off)
    return HR_ERR_INVALID_ARGUMENT;
  uint64_t n = (len + st->chunk - 1) / st->chunk;
  int rv = 0;
  for (uint64_t i = 0; i < n && rv == 0; i++) {
    unsigned k = (unsigned)(i % st->nslots);
    size_t m = piece(st, len, i);
    /* Wait for the slot's previous copy before overwriting it. */
    if (i >= st->nslots)
      rv = hr_gpu_event_sync(st->ev[k]);
    if (rv == 0)
      rv = source(user, i * st->chunk, hr_gpu_buf_host_ptr(st->slot[k]), m);
    if (rv == 0)
      rv = hr_gpu_copy_async(st->s, dst, off + i * st->chunk, st->slot[k], 0,
                             m);
    if (rv == 0)
      rv = hr_gpu_event_record(st->ev[k], st->s);
  }
  int rs = hr_gpu_stream_sync(st->s);
  return rv ? rv : rs;
}
