/*
 * The "sim" backend: a simulated asynchronous device, always built.
 *
 * Device memory is host memory, but only worker threads touch it while
 * work is queued: each stream is one thread executing its queue of
 * operations in order, each copy or host function after a configurable
 * delay, copies optionally paced in 4 KiB pieces; allocations may be made
 * slow, and large device allocations fail (out of device memory), for
 * the tests of the engine's allocation off its loop.  An event record is a
 * completion point ("point") that the stream's thread marks done when it
 * reaches it; a stream waiting on an event blocks its thread until that
 * point is done, so stream-wait-event really orders work.  A consumer
 * that skips the wait can therefore really read stale or half-written
 * bytes, which is what the ADR-018 tests need to show.
 *
 * Copies move bytes with relaxed atomic accesses: a deliberately racy
 * reader (the tests' "wrong consumer") is then a benign race that
 * ThreadSanitizer does not report, while everything the contract orders is
 * ordered through the device mutex.
 *
 * The queue, its thread, points and events are the worker-thread
 * backends' shared ones (hr_gpu_opq.c): one mutex and one condition
 * variable per device guard every queue, point and counter, the
 * simulation favouring obvious correctness over throughput.
 */
#include <string.h>

#include <hurray/wire.h>

#include "hr_gpu_opq.h"

/* A copy (HR__GPU_OP_COPY); the other kinds need only the base. */
typedef struct sim_op {
  hr__gpu_qop base;
  char *dst;
  const char *src;
  uint64_t len;
} sim_op;

typedef struct sim_dev {
  hr__gpu_opq q; /* first: the queue's callbacks cast it back */
  uint64_t op_delay_ns;
  uint64_t bytes_per_sec;
  uint64_t alloc_delay_ns;
  uint64_t max_device_alloc;
} sim_dev;

#define SIM_PIECE 4096u

/* ---- the stream's thread ------------------------------------------------ */

/* Copies with relaxed atomics, in words where both sides allow it. */
static void atomic_copy(char *dst, const char *src, size_t n) {
  size_t i = 0;
  if ((((uintptr_t)dst ^ (uintptr_t)src) & 7u) == 0) {
    for (; i < n && ((uintptr_t)(dst + i) & 7u); i++)
      __atomic_store_n(dst + i, __atomic_load_n(src + i, __ATOMIC_RELAXED),
                       __ATOMIC_RELAXED);
    for (; i + 8 <= n; i += 8)
      __atomic_store_n((uint64_t *)(void *)(dst + i),
                       __atomic_load_n((const uint64_t *)(const void *)(src + i),
                                       __ATOMIC_RELAXED),
                       __ATOMIC_RELAXED);
  }
  for (; i < n; i++)
    __atomic_store_n(dst + i, __atomic_load_n(src + i, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
}

/* Executes a copy, paced when the device is configured so.  Overlapping
 * ranges are copied through forward order only when dst < src, as
 * memmove would; the simulation does not need more. */
static void exec_copy(sim_dev *d, sim_op *op) {
  uint64_t done = 0;
  /* Device memory is populated here, by the device, before its first
   * write (sim_mem_alloc); any other destination is resident already,
   * and resident pages cost a page-table walk. */
  hr__gpu_populate(op->dst, op->len);
  while (done < op->len) {
    uint64_t n = op->len - done;
    if (d->bytes_per_sec && n > SIM_PIECE)
      n = SIM_PIECE;
    atomic_copy(op->dst + done, op->src + done, (size_t)n);
    done += n;
    if (d->bytes_per_sec && done < op->len)
      hr__gpu_sleep_ns(n * 1000000000u / d->bytes_per_sec);
  }
}

/* What the stream's thread does with an op; q.mu held on entry and
 * exit. */
static void exec_op(hr__gpu_qstream *s, hr__gpu_qop *op) {
  sim_dev *d = (sim_dev *)(void *)s->q;
  if (op->kind == HR__GPU_OP_WAIT) {
    hr__gpu_opq_point_wait_locked(&d->q, op->point);
  } else if (op->kind == HR__GPU_OP_COPY || op->kind == HR__GPU_OP_HOST_FN) {
    pthread_mutex_unlock(&d->q.mu);
    if (d->op_delay_ns)
      hr__gpu_sleep_ns(d->op_delay_ns);
    if (op->kind == HR__GPU_OP_COPY)
      exec_copy(d, (sim_op *)(void *)op);
    else
      op->fn(op->arg);
    pthread_mutex_lock(&d->q.mu);
  } else {
    op->point->reached = 1;
  }
}

static const hr__gpu_opq_cbs sim_cbs = {
    .stream_size = sizeof(hr__gpu_qstream),
    .op_size = sizeof(sim_op),
    .point_size = sizeof(hr__gpu_qpoint),
    .exec = exec_op,
};

/* ---- ops --------------------------------------------------------------- */

static int sim_probe(const hr_gpu_config *cfg, hr_gpu_probe_info *info) {
  (void)cfg;
  info->device_count = 1;
  return 0;
}

static int sim_open(void **dev, const hr_gpu_config *cfg, const hr_mem *mem,
                    hr_gpu_probe_info *why) {
  if (cfg->ordinal != 0)
    return hr__gpu_unavailable(why, "sim: no device %u", cfg->ordinal);
  sim_dev *d = hr__mem_calloc(mem, 1, sizeof *d);
  if (!d)
    return HR_ERR_NOMEM;
  d->op_delay_ns = cfg->sim_op_delay_ns;
  d->bytes_per_sec = cfg->sim_bytes_per_sec;
  d->alloc_delay_ns = cfg->sim_alloc_delay_ns;
  d->max_device_alloc = cfg->sim_max_device_alloc;
  if (hr__gpu_opq_init(&d->q, mem, &sim_cbs) != 0) {
    hr__mem_free(mem, d);
    return HR_ERR_IO;
  }
  *dev = d;
  return 0;
}

static void sim_close(void *dev) {
  sim_dev *d = dev;
  hr__gpu_opq_fini(&d->q);
  hr_mem mem = d->q.mem;
  hr__mem_free(&mem, d);
}

static int sim_query(void *dev, hr_gpu_caps *caps) {
  (void)dev;
  caps->flags = HR_GPU_CAP_ASYNC | HR_GPU_CAP_PINNED | HR_GPU_CAP_UNIFIED |
                HR_GPU_CAP_DEVICE_PTR | HR_GPU_CAP_HOST_MAPPED |
                HR_GPU_CAP_IPC_FD;
  hr__gpu_copy_name(caps->name, sizeof caps->name, "simulated device");
  return 0;
}

static int sim_mem_alloc(void *dev, int kind, uint64_t size,
                         hr_gpu_mem_info *out) {
  sim_dev *d = dev;
  if (size > SIZE_MAX)
    return HR_ERR_NOMEM;
  /* A slow driver, on whichever thread allocates. */
  if (d->alloc_delay_ns)
    hr__gpu_sleep_ns(d->alloc_delay_ns);
  if (kind == HR_GPU_MEM_DEVICE && d->max_device_alloc &&
      size > d->max_device_alloc)
    return HR_ERR_NOMEM;
  /* Zeroed so that a never-written buffer reads deterministically. */
  void *p = hr__mem_calloc(&d->q.mem, 1, (size_t)size);
  if (!p)
    return HR_ERR_NOMEM;
  /* Pinned memory is written by the host (a socket's recv()): resident
   * now.  Device memory is written by the device's copies: populated on
   * the stream's thread as they reach it (exec_copy). */
  if (kind == HR_GPU_MEM_DEVICE)
    hr__gpu_advise_huge(p, size);
  else
    hr__gpu_host_backed(p, size);
  out->handle = p;
  out->device_ptr = p;
  out->host_ptr = p;
  return 0;
}

static int sim_mem_wrap_host(void *dev, void *ptr, uint64_t size,
                             hr_gpu_mem_info *out) {
  (void)dev;
  (void)size;
  out->handle = NULL;
  out->host_ptr = ptr;
  return 0;
}

static void sim_mem_free(void *dev, const hr_gpu_mem_info *m) {
  sim_dev *d = dev;
  if (m->handle && m->handle != m->device_ptr) {
    /* Shareable or imported: a memfd (the handle is its record). */
    hr__gpu_memfd_free(m->handle);
    hr__mem_free(&d->q.mem, m->handle);
  } else if (m->handle) {
    hr__mem_free(&d->q.mem, m->handle);
  }
}

/* Shareable device memory is a memfd: exporting it hands out its
 * read-only descriptor, importing it maps that read-only (so an importer
 * cannot write the producer's bytes, as a real driver's read-only access
 * would refuse).  Copies reach it through the mapping like any sim
 * memory. */
static int sim_mem_alloc_shareable(void *dev, uint64_t size,
                                   hr_gpu_mem_info *out) {
  sim_dev *d = dev;
  hr__gpu_memfd *m = hr__mem_calloc(&d->q.mem, 1, sizeof *m);
  if (!m)
    return HR_ERR_NOMEM;
  int rv = hr__gpu_memfd_new(size, m);
  if (rv) {
    hr__mem_free(&d->q.mem, m);
    return rv;
  }
  out->handle = m;
  out->device_ptr = m->addr;
  out->host_ptr = m->addr;
  return 0;
}

static int sim_ipc_mem_export_fd(void *dev, const hr_gpu_mem_info *m,
                                 int *fd) {
  (void)dev;
  if (!m->handle || m->handle == m->device_ptr)
    return HR_ERR_UNSUPPORTED; /* ordinary memory */
  const hr__gpu_memfd *mf = m->handle;
  if (mf->fd < 0)
    return HR_ERR_UNSUPPORTED; /* an import is not re-exported */
  *fd = mf->fd;
  return 0;
}

static int sim_ipc_mem_import_fd(void *dev, int fd, uint64_t size,
                                 hr_gpu_mem_info *out) {
  sim_dev *d = dev;
  hr__gpu_memfd *m = hr__mem_calloc(&d->q.mem, 1, sizeof *m);
  if (!m)
    return HR_ERR_NOMEM;
  int rv = hr__gpu_memfd_import(fd, size, m);
  if (rv) {
    hr__mem_free(&d->q.mem, m);
    return rv;
  }
  out->handle = m;
  out->device_ptr = m->addr;
  out->host_ptr = m->addr;
  return 0;
}

static int sim_stream_new(void *dev, void **out) {
  sim_dev *d = dev;
  hr__gpu_qstream *s = hr__mem_calloc(&d->q.mem, 1, sizeof *s);
  if (!s)
    return HR_ERR_NOMEM;
  if (hr__gpu_opq_stream_start(&d->q, s) != 0) {
    hr__mem_free(&d->q.mem, s);
    return HR_ERR_IO;
  }
  *out = s;
  return 0;
}

static int sim_stream_sync(void *dev, void *sp) {
  sim_dev *d = dev;
  pthread_mutex_lock(&d->q.mu);
  hr__gpu_opq_stream_idle_locked(hr__gpu_opq_stream_real(sp));
  pthread_mutex_unlock(&d->q.mu);
  return 0;
}

static void sim_stream_del(void *dev, void *sp) {
  sim_dev *d = dev;
  hr__gpu_qstream *s = sp;
  if (!s->target)
    hr__gpu_opq_stream_stop(s);
  hr__mem_free(&d->q.mem, s);
}

static int sim_event_query(void *dev, void *ep) {
  sim_dev *d = dev;
  hr__gpu_qevent *e = hr__gpu_opq_event_real(ep);
  pthread_mutex_lock(&d->q.mu);
  int done = !e->last || e->last->reached;
  pthread_mutex_unlock(&d->q.mu);
  return done ? 0 : HR_ERR_WOULDBLOCK;
}

/* A reached point is complete: the thread executes in order, and a
 * record marks only what it already did. */
static int sim_event_sync(void *dev, void *ep) {
  sim_dev *d = dev;
  hr__gpu_qpoint *p = hr__gpu_opq_event_reach(&d->q, ep);
  if (p) {
    pthread_mutex_lock(&d->q.mu);
    hr__gpu_opq_point_unref_locked(&d->q, p);
    pthread_mutex_unlock(&d->q.mu);
  }
  return 0;
}

static char *mem_addr(const hr_gpu_mem_info *m, uint64_t off) {
  char *base = m->device_ptr ? m->device_ptr : m->host_ptr;
  return base + off;
}

static int sim_copy(void *dev, void *sp, const hr_gpu_mem_info *dst,
                    uint64_t dst_off, const hr_gpu_mem_info *src,
                    uint64_t src_off, uint64_t len) {
  sim_dev *d = dev;
  sim_op *op = (sim_op *)(void *)hr__gpu_opq_op_new(&d->q, HR__GPU_OP_COPY);
  if (!op)
    return HR_ERR_NOMEM;
  op->dst = mem_addr(dst, dst_off);
  op->src = mem_addr(src, src_off);
  op->len = len;
  hr__gpu_opq_push(&d->q, sp, &op->base);
  return 0;
}

const hr_gpu_ops hr__gpu_sim_ops = {
    .size = sizeof(hr_gpu_ops),
    .name = "sim",
    /* Its buffers are device buffers (not CPU ones), so every sync_mode
     * applies to them; the tag comes from the extension range so that no
     * real driver ever mistakes them for its own. */
    .device_tag = HR_GPU_DEV_SIM,
    .probe = sim_probe,
    .open = sim_open,
    .close = sim_close,
    .query = sim_query,
    .mem_alloc = sim_mem_alloc,
    .mem_wrap_host = sim_mem_wrap_host,
    .mem_free = sim_mem_free,
    .stream_new = sim_stream_new,
    .stream_del = sim_stream_del,
    .stream_sync = sim_stream_sync,
    .event_new = hr__gpu_opq_event_new,
    .event_del = hr__gpu_opq_event_del,
    .event_record = hr__gpu_opq_event_record,
    .stream_wait_event = hr__gpu_opq_stream_wait_event,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .copy = sim_copy,
    .host_fn = hr__gpu_opq_host_fn,
    .native = hr__gpu_opq_native,
    .wrap_native = hr__gpu_opq_wrap_native,
    .mem_alloc_shareable = sim_mem_alloc_shareable,
    .ipc_mem_export_fd = sim_ipc_mem_export_fd,
    .ipc_mem_import_fd = sim_ipc_mem_import_fd,
};
