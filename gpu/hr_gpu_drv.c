/*
 * What the driver-API backends (cuda, hip) share: see hr_gpu_drv.h.
 */
#include "hr_gpu_drv.h"

#include <stdint.h>
#include <unistd.h>

const char hr__gpu_drv_imported = 'i';

int hr__gpu_drv_query(void *dev, hr_gpu_caps *caps) {
  const hr__gpu_drv *d = dev;
  caps->flags = HR_GPU_CAP_ASYNC | HR_GPU_CAP_PINNED | HR_GPU_CAP_DEVICE_PTR |
                HR_GPU_CAP_IPC_MEM | HR_GPU_CAP_IPC_EVENT |
                (d->managed ? HR_GPU_CAP_UNIFIED : 0) |
                (d->have_vmm ? HR_GPU_CAP_IPC_FD : 0);
  caps->total_memory = d->total;
  hr__gpu_copy_name(caps->name, sizeof caps->name, d->name);
  return 0;
}

int hr__gpu_drv_obj_new(hr__gpu_drv *d, void *h, int owned, void **out) {
  hr__gpu_drv_obj *o = hr__mem_calloc(&d->mem, 1, sizeof *o);
  if (!o)
    return HR_ERR_NOMEM;
  o->h = h;
  o->owned = owned;
  *out = o;
  return 0;
}

void *hr__gpu_drv_native(void *dev, int what, void *obj) {
  (void)dev;
  (void)what;
  return hr__gpu_drv_obj_h(obj);
}

int hr__gpu_drv_wrap_native(void *dev, int what, void *native, void **out) {
  (void)what;
  return hr__gpu_drv_obj_new(dev, native, 0, out);
}

int hr__gpu_drv_stream_new(void *dev, void **out) {
  hr__gpu_drv *d = dev;
  void *s = NULL;
  int rv = d->ops->make_current(dev);
  if (rv == 0)
    rv = d->ops->stream_create(dev, &s);
  if (rv == 0 && (rv = hr__gpu_drv_obj_new(d, s, 1, out)) != 0)
    d->ops->stream_destroy(dev, s);
  return rv;
}

void hr__gpu_drv_stream_del(void *dev, void *sp) {
  hr__gpu_drv *d = dev;
  hr__gpu_drv_obj *s = sp;
  if (s->owned && d->ops->make_current(dev) == 0) {
    d->ops->stream_sync(dev, s->h);
    d->ops->stream_destroy(dev, s->h);
  }
  hr__mem_free(&d->mem, s);
}

int hr__gpu_drv_stream_sync(void *dev, void *sp) {
  const hr__gpu_drv *d = dev;
  int rv = d->ops->make_current(dev);
  return rv ? rv : d->ops->stream_sync(dev, hr__gpu_drv_obj_h(sp));
}

int hr__gpu_drv_event_new(void *dev, unsigned flags, void **out) {
  hr__gpu_drv *d = dev;
  void *e = NULL;
  int rv = d->ops->make_current(dev);
  if (rv == 0)
    rv = d->ops->event_create(dev, (flags & HR_GPU_EVENT_IPC) != 0, &e);
  if (rv == 0 && (rv = hr__gpu_drv_obj_new(d, e, 1, out)) != 0)
    d->ops->event_destroy(dev, e);
  return rv;
}

void hr__gpu_drv_event_del(void *dev, void *ep) {
  hr__gpu_drv *d = dev;
  hr__gpu_drv_obj *e = ep;
  if (e->owned && d->ops->make_current(dev) == 0)
    d->ops->event_destroy(dev, e->h);
  hr__mem_free(&d->mem, e);
}

int hr__gpu_drv_event_record(void *dev, void *ep, void *sp) {
  const hr__gpu_drv *d = dev;
  int rv = d->ops->make_current(dev);
  return rv ? rv
            : d->ops->event_record(dev, hr__gpu_drv_obj_h(ep),
                                   hr__gpu_drv_obj_h(sp));
}

int hr__gpu_drv_stream_wait_event(void *dev, void *sp, void *ep) {
  const hr__gpu_drv *d = dev;
  int rv = d->ops->make_current(dev);
  return rv ? rv
            : d->ops->stream_wait_event(dev, hr__gpu_drv_obj_h(sp),
                                        hr__gpu_drv_obj_h(ep));
}

int hr__gpu_drv_event_query(void *dev, void *ep) {
  const hr__gpu_drv *d = dev;
  int rv = d->ops->make_current(dev);
  return rv ? rv : d->ops->event_query(dev, hr__gpu_drv_obj_h(ep));
}

int hr__gpu_drv_event_sync(void *dev, void *ep) {
  const hr__gpu_drv *d = dev;
  int rv = d->ops->make_current(dev);
  return rv ? rv : d->ops->event_sync(dev, hr__gpu_drv_obj_h(ep));
}

int hr__gpu_drv_ipc_event_export(void *dev, void *ep, hr_gpu_ipc_handle *h) {
  const hr__gpu_drv *d = dev;
  int rv = d->ops->make_current(dev);
  return rv ? rv : d->ops->ipc_event_get(dev, hr__gpu_drv_obj_h(ep), h);
}

int hr__gpu_drv_ipc_event_import(void *dev, const hr_gpu_ipc_handle *h,
                                 void **out) {
  hr__gpu_drv *d = dev;
  void *e = NULL;
  int rv = d->ops->make_current(dev);
  if (rv == 0)
    rv = d->ops->ipc_event_open(dev, h, &e);
  if (rv == 0 && (rv = hr__gpu_drv_obj_new(d, e, 1, out)) != 0)
    d->ops->event_destroy(dev, e);
  return rv;
}

int hr__gpu_drv_mem_wrap_host(void *dev, void *ptr, uint64_t size,
                              hr_gpu_mem_info *out) {
  (void)dev;
  (void)size;
  out->host_ptr = ptr;
  return 0;
}

void hr__gpu_vmm_free(hr__gpu_drv *d, hr__gpu_vmm *v) {
  const hr__gpu_vmm_ops *o = d->vmm_ops;
  if (v->addr) {
    o->unmap(d, v->addr, v->len);
    o->addr_free(d, v->addr, v->len);
  }
  o->release(d, v->h);
  if (v->fd >= 0)
    close(v->fd);
  hr__mem_free(&d->mem, v);
}

/* Reserves address space for `v->h`, maps it and grants this device
 * read-write access; on failure nothing stays reserved or mapped. */
static int vmm_map(hr__gpu_drv *d, hr__gpu_vmm *v) {
  const hr__gpu_vmm_ops *o = d->vmm_ops;
  int rv = o->reserve(d, v->len, &v->addr);
  if (rv != 0) {
    v->addr = NULL;
    return rv;
  }
  rv = o->map(d, v->addr, v->len, v->h);
  if (rv != 0) {
    o->addr_free(d, v->addr, v->len);
    v->addr = NULL;
    return rv;
  }
  rv = o->set_access(d, v->addr, v->len);
  if (rv != 0) {
    o->unmap(d, v->addr, v->len);
    o->addr_free(d, v->addr, v->len);
    v->addr = NULL;
  }
  return rv;
}

/* `size` rounded up to the allocation granularity, or 0. */
static size_t vmm_len(hr__gpu_drv *d, uint64_t size) {
  size_t gran = 0;
  if (d->vmm_ops->granularity(d, &gran) != 0 || gran == 0 ||
      size > SIZE_MAX - gran)
    return 0;
  return (size_t)((size + gran - 1) / gran * gran);
}

/* A new, unmapped hr__gpu_vmm of `size` rounded up, or NULL. */
static hr__gpu_vmm *vmm_new(hr__gpu_drv *d, uint64_t size) {
  hr__gpu_vmm *v = hr__mem_calloc(&d->mem, 1, sizeof *v);
  if (!v)
    return NULL;
  v->fd = -1;
  v->len = vmm_len(d, size);
  return v;
}

int hr__gpu_vmm_alloc(hr__gpu_drv *d, uint64_t size, hr_gpu_mem_info *out) {
  hr__gpu_vmm *v = vmm_new(d, size);
  if (!v)
    return HR_ERR_NOMEM;
  int rv = v->len ? d->vmm_ops->create(d, v->len, &v->h) : HR_ERR_NOMEM;
  if (rv != 0) {
    hr__mem_free(&d->mem, v);
    return rv == HR_ERR_INVALID_ARGUMENT ? HR_ERR_NOMEM : rv;
  }
  int fd = -1;
  rv = vmm_map(d, v);
  if (rv == 0)
    rv = d->vmm_ops->export_fd(d, v->h, &fd);
  if (rv == 0 && fd < 0)
    rv = HR_ERR_IO;
  if (rv != 0) {
    hr__gpu_vmm_free(d, v);
    return rv == HR_ERR_INVALID_ARGUMENT ? HR_ERR_IO : rv;
  }
  v->fd = fd;
  out->handle = v;
  out->device_ptr = v->addr;
  return 0;
}

int hr__gpu_vmm_import(hr__gpu_drv *d, int fd, uint64_t size,
                       hr_gpu_mem_info *out) {
  hr__gpu_vmm *v = vmm_new(d, size);
  if (!v)
    return HR_ERR_NOMEM;
  int rv = v->len ? d->vmm_ops->import_fd(d, fd, &v->h) : HR_ERR_PROTO;
  if (rv != 0) {
    hr__mem_free(&d->mem, v);
    return rv == HR_ERR_NOMEM ? HR_ERR_NOMEM : HR_ERR_PROTO;
  }
  /* Mapping more than the exported allocation holds fails here. */
  rv = vmm_map(d, v);
  if (rv != 0) {
    hr__gpu_vmm_free(d, v);
    return rv == HR_ERR_NOMEM ? HR_ERR_NOMEM : HR_ERR_PROTO;
  }
  out->handle = v;
  out->device_ptr = v->addr;
  return 0;
}

int hr__gpu_vmm_export_fd(void *dev, const hr_gpu_mem_info *m, int *fd) {
  (void)dev;
  if (!m->handle || m->handle == &hr__gpu_drv_imported)
    return HR_ERR_UNSUPPORTED;
  const hr__gpu_vmm *v = m->handle;
  if (v->fd < 0)
    return HR_ERR_UNSUPPORTED; /* an import is not re-exported */
  *fd = v->fd;
  return 0;
}
