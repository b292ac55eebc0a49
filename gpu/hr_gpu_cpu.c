/*
 * The "cpu" backend: host memory, and every operation executed at once on
 * the calling thread.  A stream therefore never has work in flight, an
 * event is complete as soon as it is recorded, and waits are no-ops.  It
 * is the null backend (ngtcp2's null_encrypt) that lets code written
 * against the device interface run on CPU tensors unchanged; its buffers
 * are CPU buffers (device_tag 0x00), always SYNC_PRODUCER_SYNCED.
 */
#include <stdlib.h>
#include <string.h>

#include <hurray/wire.h>

#include "hr_gpu_int.h"

typedef struct cpu_dev {
  hr_mem mem;
} cpu_dev;

/* Streams and events have no state; a distinct non-NULL object each keeps
 * vendor handles unique. */
typedef struct cpu_obj {
  int wrapped;
} cpu_obj;

static int cpu_probe(const hr_gpu_config *cfg, hr_gpu_probe_info *info) {
  info->device_count = 1;
  return cfg->ordinal == 0 ? 0 : hr__gpu_unavailable(info, "cpu: one device");
}

static int cpu_open(void **dev, const hr_gpu_config *cfg, const hr_mem *mem,
                    hr_gpu_probe_info *why) {
  if (cfg->ordinal != 0)
    return hr__gpu_unavailable(why, "cpu: no device %u", cfg->ordinal);
  cpu_dev *d = hr__mem_calloc(mem, 1, sizeof *d);
  if (!d)
    return HR_ERR_NOMEM;
  d->mem = *mem;
  *dev = d;
  return 0;
}

static void cpu_close(void *dev) {
  cpu_dev *d = dev;
  hr_mem mem = d->mem;
  hr__mem_free(&mem, d);
}

static int cpu_query(void *dev, hr_gpu_caps *caps) {
  (void)dev;
  caps->flags = HR_GPU_CAP_PINNED | HR_GPU_CAP_UNIFIED |
                HR_GPU_CAP_DEVICE_PTR | HR_GPU_CAP_HOST_MAPPED;
  hr__gpu_copy_name(caps->name, sizeof caps->name, "host memory");
  return 0;
}

static int cpu_mem_alloc(void *dev, int kind, uint64_t size,
                         hr_gpu_mem_info *out) {
  cpu_dev *d = dev;
  (void)kind;
  if (size > SIZE_MAX)
    return HR_ERR_NOMEM;
  void *p = hr__mem_malloc(&d->mem, (size_t)size);
  if (!p)
    return HR_ERR_NOMEM;
  out->handle = p;
  out->device_ptr = p;
  out->host_ptr = p;
  return 0;
}

static int cpu_mem_wrap_host(void *dev, void *ptr, uint64_t size,
                             hr_gpu_mem_info *out) {
  (void)dev;
  (void)size;
  out->handle = NULL;
  out->device_ptr = ptr;
  out->host_ptr = ptr;
  return 0;
}

static void cpu_mem_free(void *dev, const hr_gpu_mem_info *m) {
  cpu_dev *d = dev;
  if (m->handle)
    hr__mem_free(&d->mem, m->handle);
}

static int new_obj(cpu_dev *d, void **out) {
  cpu_obj *o = hr__mem_calloc(&d->mem, 1, sizeof *o);
  if (!o)
    return HR_ERR_NOMEM;
  *out = o;
  return 0;
}

static int cpu_stream_new(void *dev, void **out) { return new_obj(dev, out); }

static void cpu_obj_del(void *dev, void *o) {
  cpu_dev *d = dev;
  hr__mem_free(&d->mem, o);
}

static int cpu_nop(void *dev, void *obj) {
  (void)dev;
  (void)obj;
  return 0;
}

static int cpu_event_new(void *dev, unsigned flags, void **out) {
  (void)flags;
  return new_obj(dev, out);
}

static int cpu_nop2(void *dev, void *a, void *b) {
  (void)dev;
  (void)a;
  (void)b;
  return 0;
}

static int cpu_copy(void *dev, void *s, const hr_gpu_mem_info *dst,
                    uint64_t dst_off, const hr_gpu_mem_info *src,
                    uint64_t src_off, uint64_t len) {
  (void)dev;
  (void)s;
  memmove((char *)dst->host_ptr + dst_off, (const char *)src->host_ptr + src_off,
          (size_t)len);
  return 0;
}

static int cpu_host_fn(void *dev, void *s, hr_gpu_host_fn fn, void *arg) {
  (void)dev;
  (void)s;
  fn(arg);
  return 0;
}

static int cpu_wrap_native(void *dev, int what, void *native, void **out) {
  (void)what;
  (void)native;
  /* Any cpu stream or event is equivalent to any other: nothing is ever in
   * flight, so a fresh object stands for the foreign one. */
  return new_obj(dev, out);
}

const hr_gpu_ops hr__gpu_cpu_ops = {
    .size = sizeof(hr_gpu_ops),
    .name = "cpu",
    .device_tag = HR_DEV_CPU,
    .probe = cpu_probe,
    .open = cpu_open,
    .close = cpu_close,
    .query = cpu_query,
    .mem_alloc = cpu_mem_alloc,
    .mem_wrap_host = cpu_mem_wrap_host,
    .mem_free = cpu_mem_free,
    .stream_new = cpu_stream_new,
    .stream_del = cpu_obj_del,
    .stream_sync = cpu_nop,
    .event_new = cpu_event_new,
    .event_del = cpu_obj_del,
    .event_record = cpu_nop2,
    .stream_wait_event = cpu_nop2,
    .event_query = cpu_nop,
    .event_sync = cpu_nop,
    .copy = cpu_copy,
    .host_fn = cpu_host_fn,
    .wrap_native = cpu_wrap_native,
};
