/*
 * What the driver-API backends (cuda, hip) share.  Their APIs mirror each
 * other call for call, so the logic around them is written once here:
 * the capability report, the wrappers of streams, events and host
 * memory, the tag of memory opened from a legacy IPC handle, and
 * shareable memory through the virtual memory management API (cuMem* /
 * hipMem*).  Both reach the driver through small tables of adaptors
 * (hr__gpu_drv_ops, hr__gpu_vmm_ops), one statement each.  Each backend
 * keeps its own dlsym()ed entry points and types.
 *
 * The backend's device object begins with an hr__gpu_drv, so a pointer
 * to it is the `void *dev` of hr_gpu_ops and the helpers below may serve
 * directly as ops entries.
 */
#ifndef HR_GPU_DRV_H
#define HR_GPU_DRV_H

#include "hr_gpu_int.h"

/*
 * The driver's virtual memory management entry points for this device,
 * on the device's context (the caller has made it current).  The
 * fallible ones return 0 or the backend's mapping of the driver's error
 * (HR_ERR_NOMEM for out of memory, HR_ERR_INVALID_ARGUMENT for invalid
 * values and handles).  `h` is the driver's generic allocation handle,
 * `addr` a device address.
 */
typedef struct hr__gpu_vmm_ops {
  /* The minimum granularity of shareable allocations on this device. */
  int (*granularity)(void *dev, size_t *gran);
  /* A physical allocation of `len` bytes, exportable as a POSIX fd. */
  int (*create)(void *dev, size_t len, uint64_t *h);
  void (*release)(void *dev, uint64_t h);
  /* Reserves `len` bytes of device address space. */
  int (*reserve)(void *dev, size_t len, void **addr);
  void (*addr_free)(void *dev, void *addr, size_t len);
  int (*map)(void *dev, void *addr, size_t len, uint64_t h);
  void (*unmap)(void *dev, void *addr, size_t len);
  /* Grants this device read-write access to a mapping. */
  int (*set_access)(void *dev, void *addr, size_t len);
  /* A new POSIX fd for `h`, owned by the caller. */
  int (*export_fd)(void *dev, uint64_t h, int *fd);
  /* The allocation behind another process's fd; `fd` stays the caller's
   * (the driver duplicates what it needs). */
  int (*import_fd)(void *dev, int fd, uint64_t *h);
} hr__gpu_vmm_ops;

/*
 * The driver's stream and event entry points for this device, with the
 * vendor's handles as void pointers (`s` a CUstream / hipStream_t, `e` a
 * CUevent / hipEvent_t).  None but make_current changes the calling
 * thread's context: the wrappers below make it current first.  The
 * fallible ones return 0 or the backend's mapping of the driver's error
 * (HR_ERR_WOULDBLOCK for "not ready", HR_ERR_NOMEM, HR_ERR_UNSUPPORTED,
 * HR_ERR_INVALID_ARGUMENT, otherwise HR_ERR_IO).
 */
typedef struct hr__gpu_drv_ops {
  /* Makes the device current on the calling thread (every entry point of
   * the backend starts here). */
  int (*make_current)(void *dev);
  /* A new non-blocking stream in *s. */
  int (*stream_create)(void *dev, void **s);
  void (*stream_destroy)(void *dev, void *s);
  int (*stream_sync)(void *dev, void *s);
  /* A new event without timing in *e; `ipc`: exportable to other
   * processes. */
  int (*event_create)(void *dev, int ipc, void **e);
  void (*event_destroy)(void *dev, void *e);
  int (*event_record)(void *dev, void *e, void *s);
  int (*stream_wait_event)(void *dev, void *s, void *e);
  /* 0 once complete, HR_ERR_WOULDBLOCK before. */
  int (*event_query)(void *dev, void *e);
  int (*event_sync)(void *dev, void *e);
  /* The legacy IPC handle of an event created with `ipc`, into h->bytes;
   * and an event opened from one, in *e (destroyed like any other). */
  int (*ipc_event_get)(void *dev, void *e, hr_gpu_ipc_handle *h);
  int (*ipc_event_open)(void *dev, const hr_gpu_ipc_handle *h, void **e);
} hr__gpu_drv_ops;

/* The start of a driver-API backend's device object: its allocator and
 * what hr__gpu_drv_query() reports, filled in by the backend's open. */
typedef struct hr__gpu_drv {
  hr_mem mem;
  const hr__gpu_vmm_ops *vmm_ops; /* used only where have_vmm */
  int have_vmm; /* shareable memory as POSIX fds (HR_GPU_CAP_IPC_FD) */
  int managed;  /* managed memory (HR_GPU_CAP_UNIFIED) */
  char name[128];
  size_t total;               /* bytes of device memory */
  const hr__gpu_drv_ops *ops; /* streams and events */
} hr__gpu_drv;

/* hr_gpu_ops.query: asynchronous, pinned memory, device pointers and the
 * legacy IPC of memory and events, plus what the device has. */
int hr__gpu_drv_query(void *dev, hr_gpu_caps *caps);

/* A stream or event: the vendor object, and whether we destroy it. */
typedef struct hr__gpu_drv_obj {
  void *h; /* CUstream / hipStream_t or CUevent / hipEvent_t */
  int owned;
} hr__gpu_drv_obj;

/* The vendor object behind the wrapper `obj`. */
static inline void *hr__gpu_drv_obj_h(const void *obj) {
  return ((const hr__gpu_drv_obj *)obj)->h;
}

/* A new wrapper of `h` in *out.  Returns 0 or HR_ERR_NOMEM. */
int hr__gpu_drv_obj_new(hr__gpu_drv *d, void *h, int owned, void **out);
/* hr_gpu_ops.native and .wrap_native (a wrapped object is not owned). */
void *hr__gpu_drv_native(void *dev, int what, void *obj);
int hr__gpu_drv_wrap_native(void *dev, int what, void *native, void **out);

/*
 * The hr_gpu_ops entries of streams and events, through the device's
 * hr__gpu_drv_ops: each makes the context current, then calls the
 * driver on the wrapped handles.  A stream or event is destroyed only
 * when owned (not wrapped from a native one); a stream is synchronised
 * before.  Waits already enqueued on a destroyed event stay valid: the
 * driver keeps what they need.
 */
int hr__gpu_drv_stream_new(void *dev, void **out);
void hr__gpu_drv_stream_del(void *dev, void *sp);
int hr__gpu_drv_stream_sync(void *dev, void *sp);
int hr__gpu_drv_event_new(void *dev, unsigned flags, void **out);
void hr__gpu_drv_event_del(void *dev, void *ep);
int hr__gpu_drv_event_record(void *dev, void *ep, void *sp);
int hr__gpu_drv_stream_wait_event(void *dev, void *sp, void *ep);
int hr__gpu_drv_event_query(void *dev, void *ep);
int hr__gpu_drv_event_sync(void *dev, void *ep);
int hr__gpu_drv_ipc_event_export(void *dev, void *ep, hr_gpu_ipc_handle *h);
int hr__gpu_drv_ipc_event_import(void *dev, const hr_gpu_ipc_handle *h,
                                 void **out);

/* hr_gpu_ops.mem_wrap_host: under unified addressing the driver takes
 * host pointers as they are, so wrapping records the pointer only. */
int hr__gpu_drv_mem_wrap_host(void *dev, void *ptr, uint64_t size,
                              hr_gpu_mem_info *out);

/* hr_gpu_mem_info.handle of memory opened from a legacy IPC handle
 * (closed, not freed); any other non-NULL handle is an hr__gpu_vmm. */
extern const char hr__gpu_drv_imported;

/* A shareable (or imported) allocation: hr_gpu_mem_info.handle. */
typedef struct hr__gpu_vmm {
  uint64_t h; /* the driver's allocation handle */
  void *addr; /* where it is mapped; NULL before the mapping */
  size_t len; /* mapped length (granularity multiple) */
  int fd;     /* exported POSIX fd; -1 for an import */
} hr__gpu_vmm;

/*
 * hr_gpu_ops.mem_alloc_shareable, on the current context: `size` rounded
 * up to the granularity, created, mapped, made accessible and exported
 * once as an fd that the allocation keeps.  Returns 0, HR_ERR_NOMEM,
 * HR_ERR_IO or another mapped driver error.
 */
int hr__gpu_vmm_alloc(hr__gpu_drv *d, uint64_t size, hr_gpu_mem_info *out);
/*
 * hr_gpu_ops.ipc_mem_import_fd, on the current context: maps `size`
 * bytes (rounded up to the granularity) of the allocation behind `fd`,
 * which stays the caller's.  Mapping more than the exported allocation
 * holds fails.  Returns 0, HR_ERR_NOMEM or HR_ERR_PROTO.
 */
int hr__gpu_vmm_import(hr__gpu_drv *d, int fd, uint64_t size,
                       hr_gpu_mem_info *out);
/* hr_gpu_ops.ipc_mem_export_fd: the fd kept by hr__gpu_vmm_alloc();
 * HR_ERR_UNSUPPORTED for other memory (an import is not re-exported). */
int hr__gpu_vmm_export_fd(void *dev, const hr_gpu_mem_info *m, int *fd);
/* Unmaps and releases `v`, on the current context, and frees it. */
void hr__gpu_vmm_free(hr__gpu_drv *d, hr__gpu_vmm *v);

#endif /* HR_GPU_DRV_H */
