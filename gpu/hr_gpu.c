/*
 * The device interface: backend registry, argument checks, live-object
 * accounting and the helpers the backends share.  Every public call is
 * validated here so that a backend only ever sees well-formed requests.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "hr_gpu_int.h"

struct hr_gpu {
  hr_mem mem;
  const hr_gpu_ops *ops;
  void *dev;
  hr_gpu_caps caps;
  /* Buffers, streams and events alive; hr_gpu_del() refuses while > 0. */
  atomic_long live;
};

struct hr_gpu_buf {
  hr_gpu *g;
  hr_gpu_mem_info m;
};

struct hr_gpu_stream {
  hr_gpu *g;
  void *h;
};

struct hr_gpu_event {
  hr_gpu *g;
  void *h;
  unsigned flags;
};

/* Every backend built in, cpu and sim first. */
static const hr_gpu_ops *const backends[] = {
    &hr__gpu_cpu_ops,
    &hr__gpu_sim_ops,
#ifdef HR_GPU_HAVE_CUDA
    &hr__gpu_cuda_ops,
#endif
#ifdef HR_GPU_HAVE_HIP
    &hr__gpu_hip_ops,
#endif
#ifdef HR_GPU_HAVE_ZE
    &hr__gpu_ze_ops,
#endif
#ifdef HR_GPU_HAVE_VULKAN
    &hr__gpu_vk_ops,
#endif
};
#define NBACKENDS (sizeof backends / sizeof *backends)

/* Names every backend of the project may have, built here or not, so that
 * a known but absent one reads "not built" rather than "unknown". */
static const char *const known_names[] = {"cpu", "sim",  "cuda",
                                          "hip", "ze",   "vulkan"};

/* A member is usable when the table is large enough to contain it and it
 * is set. */
#define HAS_OP(ops, f)                                                         \
  ((ops)->size >= offsetof(hr_gpu_ops, f) + sizeof((ops)->f) && (ops)->f)

/* ---- shared helpers ---------------------------------------------------- */

int hr__gpu_unavailable(hr_gpu_probe_info *info, const char *fmt, ...) {
  if (info) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(info->reason, sizeof info->reason, fmt, ap);
    va_end(ap);
    info->available = 0;
    info->device_count = 0;
  }
  return HR_ERR_UNSUPPORTED;
}

void *hr__gpu_dlopen(const char *const *names, hr_gpu_probe_info *why) {
  char first[160] = "";
  for (size_t i = 0; names[i]; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h)
      return h;
    if (i == 0) {
      const char *e = dlerror();
      hr__gpu_copy_name(first, sizeof first, e ? e : names[0]);
    }
  }
  hr__gpu_unavailable(why, "%s", first);
  return NULL;
}

int hr__gpu_dlsym_all(void *lib, const hr__gpu_sym *syms, size_t n,
                      void *table, hr_gpu_probe_info *why) {
  for (size_t i = 0; i < n; i++) {
    void *p = dlsym(lib, syms[i].name);
    if (!p)
      return hr__gpu_unavailable(why, "driver lacks %s", syms[i].name);
    /* The member's bytes take the pointer's: POSIX guarantees that the
     * result of dlsym() converts to a function pointer so. */
    memcpy((unsigned char *)table + syms[i].off, &p, sizeof p);
  }
  return 0;
}

int hr__gpu_load(const char *const *libs, const hr__gpu_sym *syms, size_t n,
                 void *table, void **lib, hr_gpu_probe_info *why) {
  *lib = hr__gpu_dlopen(libs, why);
  if (!*lib)
    return HR_ERR_UNSUPPORTED;
  return hr__gpu_dlsym_all(*lib, syms, n, table, why);
}

uint64_t hr__gpu_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void hr__gpu_sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000u),
                        (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The whole 4 KiB pages inside [p, p + len) (madvise() wants them);
 * 0 when there are none, or the range is under 64 KiB. */
static int whole_pages(void *p, uint64_t len, uintptr_t *lo, uintptr_t *hi) {
  const uintptr_t page = 4096;
  if (!p || len < ((uint64_t)64 << 10) || len > SIZE_MAX)
    return 0;
  *lo = ((uintptr_t)p + page - 1) & ~(page - 1);
  *hi = ((uintptr_t)p + (size_t)len) & ~(page - 1);
  return *hi > *lo;
}

/* Both calls below are advice: a kernel that refuses them (no THP, older
 * than 5.14) leaves the memory working as before, so results are
 * ignored. */
void hr__gpu_advise_huge(void *p, uint64_t len) {
  uintptr_t lo, hi;
  if (!whole_pages(p, len, &lo, &hi))
    return;
#ifdef MADV_HUGEPAGE
  if (len >= ((uint64_t)2 << 20))
    (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#endif
}

void hr__gpu_populate(void *p, uint64_t len) {
  uintptr_t lo, hi;
  if (!whole_pages(p, len, &lo, &hi))
    return;
#ifdef MADV_POPULATE_WRITE
  (void)madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
#endif
}

void hr__gpu_host_backed(void *p, uint64_t len) {
  hr__gpu_advise_huge(p, len);
  hr__gpu_populate(p, len);
}

void hr__gpu_copy_name(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap)
    n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* ---- backends ---------------------------------------------------------- */

void hr_gpu_config_default(hr_gpu_config *cfg) {
  if (!cfg)
    return;
  memset(cfg, 0, sizeof *cfg);
  cfg->backend = "sim";
}

size_t hr_gpu_backend_count(void) { return NBACKENDS; }

const char *hr_gpu_backend_name(size_t i) {
  return i < NBACKENDS ? backends[i]->name : NULL;
}

static const hr_gpu_ops *find_backend(const char *name) {
  for (size_t i = 0; i < NBACKENDS; i++)
    if (strcmp(backends[i]->name, name) == 0)
      return backends[i];
  return NULL;
}

static int is_known(const char *name) {
  for (size_t i = 0; i < sizeof known_names / sizeof *known_names; i++)
    if (strcmp(known_names[i], name) == 0)
      return 1;
  return 0;
}

int hr_gpu_backend_built(const char *name) {
  return name && find_backend(name) != NULL;
}

/* Resolves the ops of a configuration: explicit ops, else by name. */
static int resolve(const hr_gpu_config *cfg, const hr_gpu_ops **ops,
                   hr_gpu_probe_info *info) {
  if (cfg->ops) {
    const hr_gpu_ops *o = cfg->ops;
    if (o->size < offsetof(hr_gpu_ops, host_fn) + sizeof o->host_fn ||
        !o->name || !o->probe || !o->open || !o->close || !o->query ||
        !o->mem_alloc || !o->mem_wrap_host || !o->mem_free ||
        !o->stream_new || !o->stream_del || !o->stream_sync ||
        !o->event_new || !o->event_del || !o->event_record ||
        !o->stream_wait_event || !o->event_query || !o->event_sync ||
        !o->copy || !o->host_fn)
      return HR_ERR_INVALID_ARGUMENT;
    *ops = o;
    return 0;
  }
  if (!cfg->backend)
    return HR_ERR_INVALID_ARGUMENT;
  *ops = find_backend(cfg->backend);
  if (*ops)
    return 0;
  if (is_known(cfg->backend))
    return hr__gpu_unavailable(info, "%s: not built (headers not found at "
                               "build time)", cfg->backend);
  hr__gpu_unavailable(info, "%s: no such backend", cfg->backend);
  return HR_ERR_NOT_FOUND;
}

int hr_gpu_probe(const char *backend, hr_gpu_probe_info *info) {
  hr_gpu_probe_info scratch;
  if (!info)
    info = &scratch;
  memset(info, 0, sizeof *info);
  if (!backend)
    return HR_ERR_INVALID_ARGUMENT;
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.backend = backend;
  const hr_gpu_ops *ops;
  int rv = resolve(&cfg, &ops, info);
  if (rv != 0)
    return rv;
  rv = ops->probe(&cfg, info);
  if (rv == 0 && info->device_count == 0)
    rv = hr__gpu_unavailable(info, "%s: no device", backend);
  if (rv == 0) {
    info->available = 1;
    info->reason[0] = '\0';
  }
  return rv;
}

/* ---- devices ----------------------------------------------------------- */

int hr_gpu_open(hr_gpu **out, const hr_gpu_config *cfg_in, const hr_mem *mem,
                hr_gpu_probe_info *why) {
  hr_gpu_probe_info scratch;
  if (!why)
    why = &scratch;
  memset(why, 0, sizeof *why);
  if (!out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  if (cfg_in)
    cfg = *cfg_in;
  if (!mem)
    mem = hr_mem_default();
  const hr_gpu_ops *ops;
  int rv = resolve(&cfg, &ops, why);
  if (rv != 0)
    return rv;
  hr_gpu *g = hr__mem_calloc(mem, 1, sizeof *g);
  if (!g)
    return HR_ERR_NOMEM;
  g->mem = *mem;
  g->ops = ops;
  atomic_init(&g->live, 0);
  rv = ops->open(&g->dev, &cfg, &g->mem, why);
  if (rv != 0)
    goto fail;
  memset(&g->caps, 0, sizeof g->caps);
  rv = ops->query(g->dev, &g->caps);
  if (rv != 0) {
    ops->close(g->dev);
    goto fail;
  }
  g->caps.backend = ops->name;
  g->caps.device_tag = ops->device_tag;
  g->caps.device_index = (uint16_t)cfg.ordinal;
  why->available = 1;
  why->reason[0] = '\0';
  *out = g;
  return 0;
fail:
  hr__mem_free(mem, g);
  return rv;
}

int hr_gpu_del(hr_gpu *g) {
  if (!g)
    return 0;
  if (atomic_load(&g->live) != 0)
    return HR_ERR_BUSY;
  g->ops->close(g->dev);
  hr_mem mem = g->mem;
  hr__mem_free(&mem, g);
  return 0;
}

int hr_gpu_query(const hr_gpu *g, hr_gpu_caps *caps) {
  if (!g || !caps)
    return HR_ERR_INVALID_ARGUMENT;
  *caps = g->caps;
  return 0;
}

const hr_gpu_ops *hr_gpu_get_ops(const hr_gpu *g) { return g ? g->ops : NULL; }

void *hr__gpu_backend_dev(const hr_gpu *g) { return g->dev; }

/* ---- memory ------------------------------------------------------------ */

static int new_buf(hr_gpu *g, hr_gpu_buf **out, hr_gpu_buf **b) {
  if (!g || !out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  *b = hr__mem_calloc(&g->mem, 1, sizeof **b);
  if (!*b)
    return HR_ERR_NOMEM;
  (*b)->g = g;
  return 0;
}

static int finish_buf(hr_gpu *g, hr_gpu_buf *b, int rv, hr_gpu_buf **out) {
  if (rv != 0) {
    hr__mem_free(&g->mem, b);
    return rv;
  }
  atomic_fetch_add(&g->live, 1);
  *out = b;
  return 0;
}

int hr_gpu_buf_alloc(hr_gpu *g, int kind, uint64_t size, hr_gpu_buf **out) {
  if (size == 0 || kind < HR_GPU_MEM_DEVICE || kind > HR_GPU_MEM_UNIFIED)
    return HR_ERR_INVALID_ARGUMENT;
  hr_gpu_buf *b;
  int rv = new_buf(g, out, &b);
  if (rv != 0)
    return rv;
  if ((kind == HR_GPU_MEM_PINNED && !(g->caps.flags & HR_GPU_CAP_PINNED)) ||
      (kind == HR_GPU_MEM_UNIFIED && !(g->caps.flags & HR_GPU_CAP_UNIFIED)))
    rv = HR_ERR_UNSUPPORTED;
  else
    rv = g->ops->mem_alloc(g->dev, kind, size, &b->m);
  b->m.size = size;
  b->m.kind = kind;
  return finish_buf(g, b, rv, out);
}

int hr_gpu_buf_wrap_host(hr_gpu *g, void *ptr, uint64_t size,
                         hr_gpu_buf **out) {
  if (!ptr || size == 0)
    return HR_ERR_INVALID_ARGUMENT;
  hr_gpu_buf *b;
  int rv = new_buf(g, out, &b);
  if (rv != 0)
    return rv;
  rv = g->ops->mem_wrap_host(g->dev, ptr, size, &b->m);
  b->m.size = size;
  b->m.kind = HR_GPU_MEM_HOST;
  if (!b->m.host_ptr)
    b->m.host_ptr = ptr;
  return finish_buf(g, b, rv, out);
}

void hr_gpu_buf_del(hr_gpu_buf *b) {
  if (!b)
    return;
  hr_gpu *g = b->g;
  g->ops->mem_free(g->dev, &b->m);
  hr__mem_free(&g->mem, b);
  atomic_fetch_sub(&g->live, 1);
}

void *hr_gpu_buf_device_ptr(const hr_gpu_buf *b) {
  return b ? b->m.device_ptr : NULL;
}
void *hr_gpu_buf_host_ptr(const hr_gpu_buf *b) {
  return b ? b->m.host_ptr : NULL;
}
uint64_t hr_gpu_buf_size(const hr_gpu_buf *b) { return b ? b->m.size : 0; }
hr_gpu *hr_gpu_buf_device(const hr_gpu_buf *b) { return b ? b->g : NULL; }
hr_gpu *hr_gpu_event_device(const hr_gpu_event *e) { return e ? e->g : NULL; }
int hr_gpu_buf_kind(const hr_gpu_buf *b) {
  return b ? b->m.kind : HR_ERR_INVALID_ARGUMENT;
}
void *hr_gpu_buf_native(const hr_gpu_buf *b) {
  if (!b)
    return NULL;
  return b->m.native ? b->m.native : b->m.device_ptr;
}

/* ---- streams ----------------------------------------------------------- */

static int stream_alloc(hr_gpu *g, hr_gpu_stream **out, hr_gpu_stream **s) {
  if (!g || !out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  *s = hr__mem_calloc(&g->mem, 1, sizeof **s);
  if (!*s)
    return HR_ERR_NOMEM;
  (*s)->g = g;
  return 0;
}

static int stream_finish(hr_gpu *g, hr_gpu_stream *s, int rv,
                         hr_gpu_stream **out) {
  if (rv != 0) {
    hr__mem_free(&g->mem, s);
    return rv;
  }
  atomic_fetch_add(&g->live, 1);
  *out = s;
  return 0;
}

int hr_gpu_stream_new(hr_gpu *g, hr_gpu_stream **out) {
  hr_gpu_stream *s;
  int rv = stream_alloc(g, out, &s);
  if (rv != 0)
    return rv;
  return stream_finish(g, s, g->ops->stream_new(g->dev, &s->h), out);
}

int hr_gpu_stream_wrap(hr_gpu *g, void *native, hr_gpu_stream **out) {
  if (!native)
    return HR_ERR_INVALID_ARGUMENT;
  hr_gpu_stream *s;
  int rv = stream_alloc(g, out, &s);
  if (rv != 0)
    return rv;
  rv = HAS_OP(g->ops, wrap_native)
           ? g->ops->wrap_native(g->dev, HR_GPU_OBJ_STREAM, native, &s->h)
           : HR_ERR_UNSUPPORTED;
  return stream_finish(g, s, rv, out);
}

void hr_gpu_stream_del(hr_gpu_stream *s) {
  if (!s)
    return;
  hr_gpu *g = s->g;
  g->ops->stream_del(g->dev, s->h);
  hr__mem_free(&g->mem, s);
  atomic_fetch_sub(&g->live, 1);
}

hr_gpu *hr_gpu_stream_device(const hr_gpu_stream *s) {
  return s ? s->g : NULL;
}

int hr_gpu_stream_sync(hr_gpu_stream *s) {
  if (!s)
    return HR_ERR_INVALID_ARGUMENT;
  return s->g->ops->stream_sync(s->g->dev, s->h);
}

/* A range [off, off+len) inside a buffer of `size` bytes, overflow-safe. */
static int in_range(uint64_t off, uint64_t len, uint64_t size) {
  return off <= size && len <= size - off;
}

int hr_gpu_copy_async(hr_gpu_stream *s, hr_gpu_buf *dst, uint64_t dst_off,
                      hr_gpu_buf *src, uint64_t src_off, uint64_t len) {
  if (!s || !dst || !src || dst->g != s->g || src->g != s->g ||
      !in_range(dst_off, len, dst->m.size) ||
      !in_range(src_off, len, src->m.size))
    return HR_ERR_INVALID_ARGUMENT;
  if (len == 0)
    return 0;
  return s->g->ops->copy(s->g->dev, s->h, &dst->m, dst_off, &src->m, src_off,
                         len);
}

int hr_gpu_launch_host_fn(hr_gpu_stream *s, hr_gpu_host_fn fn, void *arg) {
  if (!s || !fn)
    return HR_ERR_INVALID_ARGUMENT;
  return s->g->ops->host_fn(s->g->dev, s->h, fn, arg);
}

/* The fd travels inside the pointer argument: no allocation to free. */
static void notify_fd(void *arg) {
  int fd = (int)(intptr_t)arg;
  uint64_t one = 1;
  /* An eventfd saturates rather than fails short of 2^64-2; a full pipe
   * already has a wakeup pending, so a failed write loses nothing. */
  ssize_t n = write(fd, &one, sizeof one);
  (void)n;
}

int hr_gpu_stream_notify_fd(hr_gpu_stream *s, int fd) {
  if (fd < 0)
    return HR_ERR_INVALID_ARGUMENT;
  return hr_gpu_launch_host_fn(s, notify_fd, (void *)(intptr_t)fd);
}

/* ---- events ------------------------------------------------------------ */

static int event_finish(hr_gpu *g, hr_gpu_event *e, int rv,
                        hr_gpu_event **out) {
  if (rv != 0) {
    hr__mem_free(&g->mem, e);
    return rv;
  }
  atomic_fetch_add(&g->live, 1);
  *out = e;
  return 0;
}

int hr_gpu_event_new(hr_gpu *g, unsigned flags, hr_gpu_event **out) {
  if (!g || !out || (flags & ~HR_GPU_EVENT_IPC))
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if ((flags & HR_GPU_EVENT_IPC) && !(g->caps.flags & HR_GPU_CAP_IPC_EVENT))
    return HR_ERR_UNSUPPORTED;
  hr_gpu_event *e = hr__mem_calloc(&g->mem, 1, sizeof *e);
  if (!e)
    return HR_ERR_NOMEM;
  e->g = g;
  e->flags = flags;
  return event_finish(g, e, g->ops->event_new(g->dev, flags, &e->h), out);
}

int hr_gpu_event_wrap(hr_gpu *g, void *native, hr_gpu_event **out) {
  if (!g || !out || !native)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  hr_gpu_event *e = hr__mem_calloc(&g->mem, 1, sizeof *e);
  if (!e)
    return HR_ERR_NOMEM;
  e->g = g;
  int rv = HAS_OP(g->ops, wrap_native)
               ? g->ops->wrap_native(g->dev, HR_GPU_OBJ_EVENT, native, &e->h)
               : HR_ERR_UNSUPPORTED;
  return event_finish(g, e, rv, out);
}

void hr_gpu_event_del(hr_gpu_event *e) {
  if (!e)
    return;
  hr_gpu *g = e->g;
  g->ops->event_del(g->dev, e->h);
  hr__mem_free(&g->mem, e);
  atomic_fetch_sub(&g->live, 1);
}

int hr_gpu_event_record(hr_gpu_event *e, hr_gpu_stream *s) {
  if (!e || !s || e->g != s->g)
    return HR_ERR_INVALID_ARGUMENT;
  return e->g->ops->event_record(e->g->dev, e->h, s->h);
}

int hr_gpu_stream_wait_event(hr_gpu_stream *s, hr_gpu_event *e) {
  if (!e || !s || e->g != s->g)
    return HR_ERR_INVALID_ARGUMENT;
  return s->g->ops->stream_wait_event(s->g->dev, s->h, e->h);
}

int hr_gpu_event_query(hr_gpu_event *e) {
  if (!e)
    return HR_ERR_INVALID_ARGUMENT;
  return e->g->ops->event_query(e->g->dev, e->h);
}

int hr_gpu_event_sync(hr_gpu_event *e) {
  if (!e)
    return HR_ERR_INVALID_ARGUMENT;
  return e->g->ops->event_sync(e->g->dev, e->h);
}

/* ---- vendor handles ---------------------------------------------------- */

void *hr_gpu_stream_native(const hr_gpu_stream *s) {
  if (!s)
    return NULL;
  const hr_gpu_ops *o = s->g->ops;
  return HAS_OP(o, native) ? o->native(s->g->dev, HR_GPU_OBJ_STREAM, s->h)
                           : s->h;
}

void *hr_gpu_event_native(const hr_gpu_event *e) {
  if (!e)
    return NULL;
  const hr_gpu_ops *o = e->g->ops;
  return HAS_OP(o, native) ? o->native(e->g->dev, HR_GPU_OBJ_EVENT, e->h)
                           : e->h;
}

/* ---- IPC --------------------------------------------------------------- */

int hr_gpu_ipc_mem_export(hr_gpu_buf *b, hr_gpu_ipc_handle *h) {
  if (!b || !h)
    return HR_ERR_INVALID_ARGUMENT;
  hr_gpu *g = b->g;
  if (b->m.kind != HR_GPU_MEM_DEVICE || !(g->caps.flags & HR_GPU_CAP_IPC_MEM) ||
      !HAS_OP(g->ops, ipc_mem_export))
    return HR_ERR_UNSUPPORTED;
  memset(h, 0, sizeof *h);
  return g->ops->ipc_mem_export(g->dev, &b->m, h);
}

int hr_gpu_ipc_mem_import(hr_gpu *g, const hr_gpu_ipc_handle *h, uint64_t size,
                          hr_gpu_buf **out) {
  if (!h || size == 0)
    return HR_ERR_INVALID_ARGUMENT;
  hr_gpu_buf *b;
  int rv = new_buf(g, out, &b);
  if (rv != 0)
    return rv;
  if (!(g->caps.flags & HR_GPU_CAP_IPC_MEM) ||
      !HAS_OP(g->ops, ipc_mem_import))
    rv = HR_ERR_UNSUPPORTED;
  else
    rv = g->ops->ipc_mem_import(g->dev, h, size, &b->m);
  b->m.size = size;
  b->m.kind = HR_GPU_MEM_DEVICE;
  return finish_buf(g, b, rv, out);
}

int hr_gpu_ipc_event_export(hr_gpu_event *e, hr_gpu_ipc_handle *h) {
  if (!e || !h)
    return HR_ERR_INVALID_ARGUMENT;
  hr_gpu *g = e->g;
  if (!(e->flags & HR_GPU_EVENT_IPC) || !HAS_OP(g->ops, ipc_event_export))
    return HR_ERR_UNSUPPORTED;
  memset(h, 0, sizeof *h);
  return g->ops->ipc_event_export(g->dev, e->h, h);
}

int hr_gpu_ipc_event_import(hr_gpu *g, const hr_gpu_ipc_handle *h,
                            hr_gpu_event **out) {
  if (!g || !h || !out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!(g->caps.flags & HR_GPU_CAP_IPC_EVENT) ||
      !HAS_OP(g->ops, ipc_event_import))
    return HR_ERR_UNSUPPORTED;
  hr_gpu_event *e = hr__mem_calloc(&g->mem, 1, sizeof *e);
  if (!e)
    return HR_ERR_NOMEM;
  e->g = g;
  e->flags = HR_GPU_EVENT_IPC;
  return event_finish(g, e, g->ops->ipc_event_import(g->dev, h, &e->h), out);
}

/* ---- IPC through a file descriptor ------------------------------------ */

static int has_ipc_fd(const hr_gpu *g) {
  return (g->caps.flags & HR_GPU_CAP_IPC_FD) &&
         HAS_OP(g->ops, mem_alloc_shareable) &&
         HAS_OP(g->ops, ipc_mem_export_fd) && HAS_OP(g->ops, ipc_mem_import_fd);
}

int hr_gpu_buf_alloc_shareable(hr_gpu *g, uint64_t size, hr_gpu_buf **out) {
  if (size == 0)
    return HR_ERR_INVALID_ARGUMENT;
  hr_gpu_buf *b;
  int rv = new_buf(g, out, &b);
  if (rv != 0)
    return rv;
  rv = has_ipc_fd(g) ? g->ops->mem_alloc_shareable(g->dev, size, &b->m)
                     : HR_ERR_UNSUPPORTED;
  b->m.size = size;
  b->m.kind = HR_GPU_MEM_DEVICE;
  return finish_buf(g, b, rv, out);
}

int hr_gpu_ipc_mem_export_fd(hr_gpu_buf *b, int *fd) {
  if (!b || !fd)
    return HR_ERR_INVALID_ARGUMENT;
  *fd = -1;
  hr_gpu *g = b->g;
  if (b->m.kind != HR_GPU_MEM_DEVICE || !has_ipc_fd(g))
    return HR_ERR_UNSUPPORTED;
  int rv = g->ops->ipc_mem_export_fd(g->dev, &b->m, fd);
  if (rv == 0 && *fd < 0)
    rv = HR_ERR_UNSUPPORTED;
  return rv;
}

int hr_gpu_ipc_mem_import_fd(hr_gpu *g, int fd, uint64_t size,
                             hr_gpu_buf **out) {
  if (fd < 0 || size == 0)
    return HR_ERR_INVALID_ARGUMENT;
  hr_gpu_buf *b;
  int rv = new_buf(g, out, &b);
  if (rv != 0)
    return rv;
  rv = has_ipc_fd(g) ? g->ops->ipc_mem_import_fd(g->dev, fd, size, &b->m)
                     : HR_ERR_UNSUPPORTED;
  b->m.size = size;
  b->m.kind = HR_GPU_MEM_DEVICE;
  return finish_buf(g, b, rv, out);
}
