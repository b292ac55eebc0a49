/*
 * The "hip" backend: AMD GPUs through the HIP runtime of libamdhip64.so,
 * loaded at run time.  hip_runtime_api.h provides the types only; every
 * entry point is resolved with dlsym(), so the library does not link
 * against ROCm and reports "unavailable" where it is missing.
 *
 * The HIP runtime keeps a current device per thread: every entry point
 * selects the hr_gpu's device first.  Streams are non-blocking, events
 * have timing disabled, host functions are hipLaunchHostFunc(), copies
 * hipMemcpyAsync(hipMemcpyDefault) (unified addressing infers the
 * direction).  Memory and events (HR_GPU_EVENT_IPC) can be exported.
 *
 * Shareable memory (HR_GPU_CAP_IPC_FD), where the runtime has HIP's
 * virtual memory management API and the device accepts it (probed with
 * hipMemGetAllocationGranularity at open): hipMemCreate with
 * hipMemHandleTypePosixFileDescriptor, mapped and made accessible, its
 * POSIX fd exported once (hipMemExportToShareableHandle); an import is
 * hipMemImportFromShareableHandle + hipMemMap + hipMemSetAccess (the logic
 * shared with the cuda backend, in hr_gpu_drv.c).  Written against the
 * ROCm headers of Debian 12; not run here (no AMD device).
 */
#include <dlfcn.h>
#include <string.h>

#include <hip/hip_runtime_api.h>

#include <hurray/wire.h>

#include "hr_gpu_drv.h"

typedef struct hip_fns {
  hipError_t (*Init)(unsigned);
  hipError_t (*GetDeviceCount)(int *);
  hipError_t (*SetDevice)(int);
  hipError_t (*DeviceGet)(hipDevice_t *, int);
  hipError_t (*DeviceGetName)(char *, int, hipDevice_t);
  hipError_t (*DeviceTotalMem)(size_t *, hipDevice_t);
  hipError_t (*DeviceGetAttribute)(int *, hipDeviceAttribute_t, int);
  const char *(*GetErrorString)(hipError_t);
  hipError_t (*Malloc)(void **, size_t);
  hipError_t (*Free)(void *);
  hipError_t (*HostMalloc)(void **, size_t, unsigned);
  hipError_t (*HostFree)(void *);
  hipError_t (*MallocManaged)(void **, size_t, unsigned);
  hipError_t (*MemcpyAsync)(void *, const void *, size_t, hipMemcpyKind,
                            hipStream_t);
  hipError_t (*StreamCreate)(hipStream_t *, unsigned);
  hipError_t (*StreamDestroy)(hipStream_t);
  hipError_t (*StreamSynchronize)(hipStream_t);
  hipError_t (*EventCreate)(hipEvent_t *, unsigned);
  hipError_t (*EventDestroy)(hipEvent_t);
  hipError_t (*EventRecord)(hipEvent_t, hipStream_t);
  hipError_t (*StreamWaitEvent)(hipStream_t, hipEvent_t, unsigned);
  hipError_t (*EventQuery)(hipEvent_t);
  hipError_t (*EventSynchronize)(hipEvent_t);
  hipError_t (*IpcGetMemHandle)(hipIpcMemHandle_t *, void *);
  hipError_t (*IpcOpenMemHandle)(void **, hipIpcMemHandle_t, unsigned);
  hipError_t (*IpcCloseMemHandle)(void *);
  hipError_t (*IpcGetEventHandle)(hipIpcEventHandle_t *, hipEvent_t);
  hipError_t (*IpcOpenEventHandle)(hipEvent_t *, hipIpcEventHandle_t);
} hip_fns;

#define SYM(member, name) HR__GPU_SYM(hip_fns, member, name)
static const hr__gpu_sym fn_syms[] = {
    SYM(Init, "hipInit"),
    SYM(GetDeviceCount, "hipGetDeviceCount"),
    SYM(SetDevice, "hipSetDevice"),
    SYM(DeviceGet, "hipDeviceGet"),
    SYM(DeviceGetName, "hipDeviceGetName"),
    SYM(DeviceTotalMem, "hipDeviceTotalMem"),
    SYM(DeviceGetAttribute, "hipDeviceGetAttribute"),
    SYM(GetErrorString, "hipGetErrorString"),
    SYM(Malloc, "hipMalloc"),
    SYM(Free, "hipFree"),
    SYM(HostMalloc, "hipHostMalloc"),
    SYM(HostFree, "hipHostFree"),
    SYM(MallocManaged, "hipMallocManaged"),
    SYM(MemcpyAsync, "hipMemcpyAsync"),
    SYM(StreamCreate, "hipStreamCreateWithFlags"),
    SYM(StreamDestroy, "hipStreamDestroy"),
    SYM(StreamSynchronize, "hipStreamSynchronize"),
    SYM(EventCreate, "hipEventCreateWithFlags"),
    SYM(EventDestroy, "hipEventDestroy"),
    SYM(EventRecord, "hipEventRecord"),
    SYM(StreamWaitEvent, "hipStreamWaitEvent"),
    SYM(EventQuery, "hipEventQuery"),
    SYM(EventSynchronize, "hipEventSynchronize"),
    SYM(IpcGetMemHandle, "hipIpcGetMemHandle"),
    SYM(IpcOpenMemHandle, "hipIpcOpenMemHandle"),
    SYM(IpcCloseMemHandle, "hipIpcCloseMemHandle"),
    SYM(IpcGetEventHandle, "hipIpcGetEventHandle"),
    SYM(IpcOpenEventHandle, "hipIpcOpenEventHandle"),
};
#undef SYM
#define NSYMS (sizeof fn_syms / sizeof *fn_syms)
_Static_assert(sizeof(hip_fns) == NSYMS * sizeof(hr__gpu_fn),
               "one slot per symbol");
_Static_assert(sizeof(hipIpcMemHandle_t) <= sizeof(hr_gpu_ipc_handle),
               "IPC handle fits");
_Static_assert(sizeof(hipIpcEventHandle_t) <= sizeof(hr_gpu_ipc_handle),
               "IPC handle fits");

static const char *const lib_names[] = {"libamdhip64.so", "libamdhip64.so.6",
                                        "libamdhip64.so.5", NULL};

/* Host functions: hipLaunchHostFunc() where the runtime has it (ROCm 5.3
 * and later), else the older hipStreamAddCallback(), whose callback has
 * the same stream semantics but another signature. */
typedef hipError_t (*launch_host_fn)(hipStream_t, hipHostFn_t, void *);
typedef hipError_t (*add_callback_fn)(hipStream_t, hipStreamCallback_t,
                                      void *, unsigned);

/* The virtual memory management entry points (optional). */
typedef struct hip_vmm_fns {
  hipError_t (*MemCreate)(hipMemGenericAllocationHandle_t *, size_t,
                          const hipMemAllocationProp *, unsigned long long);
  hipError_t (*MemRelease)(hipMemGenericAllocationHandle_t);
  hipError_t (*MemAddressReserve)(void **, size_t, size_t, void *,
                                  unsigned long long);
  hipError_t (*MemAddressFree)(void *, size_t);
  hipError_t (*MemMap)(void *, size_t, size_t, hipMemGenericAllocationHandle_t,
                       unsigned long long);
  hipError_t (*MemUnmap)(void *, size_t);
  hipError_t (*MemSetAccess)(void *, size_t, const hipMemAccessDesc *, size_t);
  hipError_t (*MemGetAllocationGranularity)(size_t *,
                                            const hipMemAllocationProp *,
                                            hipMemAllocationGranularity_flags);
  hipError_t (*MemExportToShareableHandle)(void *,
                                           hipMemGenericAllocationHandle_t,
                                           hipMemAllocationHandleType,
                                           unsigned long long);
  hipError_t (*MemImportFromShareableHandle)(hipMemGenericAllocationHandle_t *,
                                             void *,
                                             hipMemAllocationHandleType);
} hip_vmm_fns;

#define SYM(member, name) HR__GPU_SYM(hip_vmm_fns, member, name)
static const hr__gpu_sym vmm_syms[] = {
    SYM(MemCreate, "hipMemCreate"),
    SYM(MemRelease, "hipMemRelease"),
    SYM(MemAddressReserve, "hipMemAddressReserve"),
    SYM(MemAddressFree, "hipMemAddressFree"),
    SYM(MemMap, "hipMemMap"),
    SYM(MemUnmap, "hipMemUnmap"),
    SYM(MemSetAccess, "hipMemSetAccess"),
    SYM(MemGetAllocationGranularity, "hipMemGetAllocationGranularity"),
    SYM(MemExportToShareableHandle, "hipMemExportToShareableHandle"),
    SYM(MemImportFromShareableHandle, "hipMemImportFromShareableHandle"),
};
#undef SYM
#define NVMM (sizeof vmm_syms / sizeof *vmm_syms)
_Static_assert(sizeof(hip_vmm_fns) == NVMM * sizeof(hr__gpu_fn),
               "one slot per symbol");

typedef struct hip_dev {
  hr__gpu_drv drv; /* first: see hr_gpu_drv.h */
  void *lib;
  hip_fns f;
  hip_vmm_fns vmm;
  launch_host_fn launch_host_func;
  add_callback_fn add_callback;
  int ordinal;
} hip_dev;

static int load(hip_fns *f, void **lib, hr_gpu_probe_info *why) {
  return hr__gpu_load(lib_names, fn_syms, NSYMS, f, lib, why);
}

/* Resolves one of the two host-function entry points. */
static int load_host_fn(hip_dev *d, hr_gpu_probe_info *why) {
  void *p = dlsym(d->lib, "hipLaunchHostFunc");
  if (p) {
    memcpy(&d->launch_host_func, &p, sizeof p);
    return 0;
  }
  p = dlsym(d->lib, "hipStreamAddCallback");
  if (p) {
    memcpy(&d->add_callback, &p, sizeof p);
    return 0;
  }
  return hr__gpu_unavailable(why, "hip: runtime has no host callbacks");
}

static const char *errname(const hip_fns *f, hipError_t r) {
  const char *s = f->GetErrorString ? f->GetErrorString(r) : NULL;
  return s ? s : "unknown HIP error";
}

static int map_err(hipError_t r) {
  switch (r) {
  case hipSuccess: return 0;
  case hipErrorOutOfMemory: return HR_ERR_NOMEM;
  case hipErrorNotReady: return HR_ERR_WOULDBLOCK;
  case hipErrorNotSupported: return HR_ERR_UNSUPPORTED;
  case hipErrorInvalidValue:
  case hipErrorInvalidHandle: return HR_ERR_INVALID_ARGUMENT;
  default: return HR_ERR_IO;
  }
}

/* Selects the device on the calling thread; every entry point starts
 * here. */
static int cur(hip_dev *d) { return map_err(d->f.SetDevice(d->ordinal)); }

static int init_count(hip_fns *f, int *n, hr_gpu_probe_info *why) {
  hipError_t r = f->Init(0);
  if (r == hipSuccess)
    r = f->GetDeviceCount(n);
  if (r != hipSuccess)
    return hr__gpu_unavailable(why, "hip: %s", errname(f, r));
  return 0;
}

static int hip_probe(const hr_gpu_config *cfg, hr_gpu_probe_info *info) {
  (void)cfg;
  hip_fns f;
  void *lib;
  memset(&f, 0, sizeof f);
  int rv = load(&f, &lib, info);
  int n = 0;
  if (rv == 0)
    rv = init_count(&f, &n, info);
  if (rv == 0)
    info->device_count = (unsigned)n;
  /* The runtime is not unloaded once initialised (it keeps threads). */
  if (lib && !f.Init)
    dlclose(lib);
  return rv;
}

static void hip_close(void *dev) {
  hip_dev *d = dev;
  hr_mem mem = d->drv.mem;
  hr__mem_free(&mem, d);
}

/* The allocation properties of shareable memory on this device. */
static void vmm_prop(const hip_dev *d, hipMemAllocationProp *prop) {
  memset(prop, 0, sizeof *prop);
  prop->type = hipMemAllocationTypePinned;
  prop->location.type = hipMemLocationTypeDevice;
  prop->location.id = d->ordinal;
  prop->requestedHandleType = hipMemHandleTypePosixFileDescriptor;
}

/* The allocation handle is a pointer in HIP, kept as a uint64_t. */
static hipMemGenericAllocationHandle_t vmm_handle(uint64_t h) {
  return (hipMemGenericAllocationHandle_t)(uintptr_t)h;
}

/* The adaptors of hr__gpu_vmm_ops (see hr_gpu_drv.h). */
static int vmm_granularity(void *dev, size_t *gran) {
  hip_dev *d = dev;
  hipMemAllocationProp prop;
  vmm_prop(d, &prop);
  return map_err(d->vmm.MemGetAllocationGranularity(
      gran, &prop, hipMemAllocationGranularityMinimum));
}

static int vmm_create(void *dev, size_t len, uint64_t *h) {
  hip_dev *d = dev;
  hipMemAllocationProp prop;
  vmm_prop(d, &prop);
  hipMemGenericAllocationHandle_t ah = NULL;
  int rv = map_err(d->vmm.MemCreate(&ah, len, &prop, 0));
  *h = (uint64_t)(uintptr_t)ah;
  return rv;
}

static void vmm_release(void *dev, uint64_t h) {
  hip_dev *d = dev;
  d->vmm.MemRelease(vmm_handle(h));
}

static int vmm_reserve(void *dev, size_t len, void **addr) {
  hip_dev *d = dev;
  *addr = NULL;
  return map_err(d->vmm.MemAddressReserve(addr, len, 0, NULL, 0));
}

static void vmm_addr_free(void *dev, void *addr, size_t len) {
  hip_dev *d = dev;
  d->vmm.MemAddressFree(addr, len);
}

static int vmm_map(void *dev, void *addr, size_t len, uint64_t h) {
  hip_dev *d = dev;
  return map_err(d->vmm.MemMap(addr, len, 0, vmm_handle(h), 0));
}

static void vmm_unmap(void *dev, void *addr, size_t len) {
  hip_dev *d = dev;
  d->vmm.MemUnmap(addr, len);
}

static int vmm_set_access(void *dev, void *addr, size_t len) {
  hip_dev *d = dev;
  hipMemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location.type = hipMemLocationTypeDevice;
  acc.location.id = d->ordinal;
  acc.flags = hipMemAccessFlagsProtReadWrite;
  return map_err(d->vmm.MemSetAccess(addr, len, &acc, 1));
}

static int vmm_export_fd(void *dev, uint64_t h, int *fd) {
  hip_dev *d = dev;
  return map_err(d->vmm.MemExportToShareableHandle(
      fd, vmm_handle(h), hipMemHandleTypePosixFileDescriptor, 0));
}

static int vmm_import_fd(void *dev, int fd, uint64_t *h) {
  hip_dev *d = dev;
  hipMemGenericAllocationHandle_t ah = NULL;
  int rv = map_err(d->vmm.MemImportFromShareableHandle(
      &ah, (void *)(uintptr_t)fd, hipMemHandleTypePosixFileDescriptor));
  *h = (uint64_t)(uintptr_t)ah;
  return rv;
}

static const hr__gpu_vmm_ops vmm_ops = {
    .granularity = vmm_granularity,
    .create = vmm_create,
    .release = vmm_release,
    .reserve = vmm_reserve,
    .addr_free = vmm_addr_free,
    .map = vmm_map,
    .unmap = vmm_unmap,
    .set_access = vmm_set_access,
    .export_fd = vmm_export_fd,
    .import_fd = vmm_import_fd,
};

/* The adaptors of hr__gpu_drv_ops (see hr_gpu_drv.h). */
#define DRV_DEV hip_dev
#define DRV_STREAM hipStream_t
#define DRV_EVENT hipEvent_t
#define DRV_IPC_EVENT hipIpcEventHandle_t
#define DRV_STREAM_NONBLOCKING hipStreamNonBlocking
#define DRV_EVENT_NO_TIMING hipEventDisableTiming
#define DRV_EVENT_IPC hipEventInterprocess
#include "hr_gpu_drv_adapt.h"

static int hip_open(void **dev, const hr_gpu_config *cfg, const hr_mem *mem,
                    hr_gpu_probe_info *why) {
  hip_dev *d = hr__mem_calloc(mem, 1, sizeof *d);
  if (!d)
    return HR_ERR_NOMEM;
  d->drv.mem = *mem;
  d->drv.vmm_ops = &vmm_ops;
  d->drv.ops = &drv_ops;
  d->ordinal = (int)cfg->ordinal;
  int n = 0;
  int rv = load(&d->f, &d->lib, why);
  if (rv == 0)
    rv = load_host_fn(d, why);
  if (rv == 0)
    rv = init_count(&d->f, &n, why);
  if (rv == 0 && cfg->ordinal >= (unsigned)n)
    rv = hr__gpu_unavailable(why, "hip: no device %u (%d found)", cfg->ordinal,
                             n);
  hipDevice_t hd = 0;
  if (rv == 0 && (rv = cur(d)) == 0 &&
      (rv = map_err(d->f.DeviceGet(&hd, d->ordinal))) == 0) {
    if (d->f.DeviceGetName(d->drv.name, (int)sizeof d->drv.name, hd) !=
        hipSuccess)
      hr__gpu_copy_name(d->drv.name, sizeof d->drv.name, "HIP device");
    d->f.DeviceTotalMem(&d->drv.total, hd);
    d->f.DeviceGetAttribute(&d->drv.managed, hipDeviceAttributeManagedMemory,
                            d->ordinal);
    hr_gpu_probe_info ignored;
    size_t gran = 0;
    d->drv.have_vmm =
        hr__gpu_dlsym_all(d->lib, vmm_syms, NVMM, &d->vmm, &ignored) == 0 &&
        vmm_granularity(d, &gran) == 0 && gran > 0;
  }
  if (rv != 0) {
    if (d->lib && !d->f.Init)
      dlclose(d->lib);
    hip_close(d);
    return rv;
  }
  *dev = d;
  return 0;
}

static int hip_mem_alloc(void *dev, int kind, uint64_t size,
                         hr_gpu_mem_info *out) {
  hip_dev *d = dev;
  int rv = cur(d);
  if (rv != 0)
    return rv;
  if (size > SIZE_MAX)
    return HR_ERR_NOMEM;
  void *p = NULL;
  switch (kind) {
  case HR_GPU_MEM_PINNED:
    rv = map_err(d->f.HostMalloc(&p, (size_t)size,
                                 hipHostMallocPortable | hipHostMallocMapped));
    out->host_ptr = p;
    out->device_ptr = p;
    break;
  case HR_GPU_MEM_UNIFIED:
    rv = map_err(d->f.MallocManaged(&p, (size_t)size, hipMemAttachGlobal));
    out->host_ptr = p;
    out->device_ptr = p;
    break;
  default:
    rv = map_err(d->f.Malloc(&p, (size_t)size));
    out->device_ptr = p;
    break;
  }
  return rv == HR_ERR_INVALID_ARGUMENT ? HR_ERR_NOMEM : rv;
}

static int hip_mem_alloc_shareable(void *dev, uint64_t size,
                                   hr_gpu_mem_info *out) {
  hip_dev *d = dev;
  int rv = cur(d);
  return rv ? rv : hr__gpu_vmm_alloc(&d->drv, size, out);
}

static int hip_ipc_mem_import_fd(void *dev, int fd, uint64_t size,
                                 hr_gpu_mem_info *out) {
  hip_dev *d = dev;
  int rv = cur(d);
  return rv ? rv : hr__gpu_vmm_import(&d->drv, fd, size, out);
}

static void hip_mem_free(void *dev, const hr_gpu_mem_info *m) {
  hip_dev *d = dev;
  if (m->kind == HR_GPU_MEM_HOST || cur(d) != 0)
    return;
  if (m->handle == &hr__gpu_drv_imported)
    d->f.IpcCloseMemHandle(m->device_ptr);
  else if (m->handle)
    hr__gpu_vmm_free(&d->drv, m->handle);
  else if (m->kind == HR_GPU_MEM_PINNED)
    d->f.HostFree(m->host_ptr);
  else
    d->f.Free(m->device_ptr);
}

static char *addr(const hr_gpu_mem_info *m, uint64_t off) {
  char *base = m->device_ptr ? m->device_ptr : m->host_ptr;
  return base + off;
}

static int hip_copy(void *dev, void *sp, const hr_gpu_mem_info *dst,
                    uint64_t dst_off, const hr_gpu_mem_info *src,
                    uint64_t src_off, uint64_t len) {
  hip_dev *d = dev;
  int rv = cur(d);
  if (rv != 0)
    return rv;
  return map_err(d->f.MemcpyAsync(addr(dst, dst_off), addr(src, src_off),
                                  (size_t)len, hipMemcpyDefault,
                                  hr__gpu_drv_obj_h(sp)));
}

/* hipStreamAddCallback's callback: runs the host function and frees its
 * record. */
typedef struct cb_rec {
  hr_mem mem;
  hr_gpu_host_fn fn;
  void *arg;
} cb_rec;

static void run_callback(hipStream_t s, hipError_t status, void *p) {
  (void)s;
  (void)status;
  cb_rec *c = p;
  hr_mem mem = c->mem;
  c->fn(c->arg);
  hr__mem_free(&mem, c);
}

static int hip_host_fn(void *dev, void *sp, hr_gpu_host_fn fn, void *arg) {
  hip_dev *d = dev;
  int rv = cur(d);
  if (rv != 0)
    return rv;
  hipStream_t s = hr__gpu_drv_obj_h(sp);
  if (d->launch_host_func)
    return map_err(d->launch_host_func(s, fn, arg));
  cb_rec *c = hr__mem_malloc(&d->drv.mem, sizeof *c);
  if (!c)
    return HR_ERR_NOMEM;
  c->mem = d->drv.mem;
  c->fn = fn;
  c->arg = arg;
  rv = map_err(d->add_callback(s, run_callback, c, 0));
  if (rv != 0)
    hr__mem_free(&d->drv.mem, c);
  return rv;
}

static int hip_ipc_mem_export(void *dev, const hr_gpu_mem_info *m,
                              hr_gpu_ipc_handle *h) {
  hip_dev *d = dev;
  int rv = cur(d);
  hipIpcMemHandle_t ih;
  if (rv == 0)
    rv = map_err(d->f.IpcGetMemHandle(&ih, m->device_ptr));
  if (rv == 0)
    memcpy(h->bytes, &ih, sizeof ih);
  return rv;
}

static int hip_ipc_mem_import(void *dev, const hr_gpu_ipc_handle *h,
                              uint64_t size, hr_gpu_mem_info *out) {
  hip_dev *d = dev;
  (void)size;
  int rv = cur(d);
  hipIpcMemHandle_t ih;
  memcpy(&ih, h->bytes, sizeof ih);
  void *p = NULL;
  if (rv == 0)
    rv = map_err(d->f.IpcOpenMemHandle(&p, ih, hipIpcMemLazyEnablePeerAccess));
  if (rv == 0) {
    out->device_ptr = p;
    out->handle = (void *)&hr__gpu_drv_imported;
  }
  return rv;
}

const hr_gpu_ops hr__gpu_hip_ops = {
    .size = sizeof(hr_gpu_ops),
    .name = "hip",
    .device_tag = HR_DEV_ROCM,
    .probe = hip_probe,
    .open = hip_open,
    .close = hip_close,
    .query = hr__gpu_drv_query,
    .mem_alloc = hip_mem_alloc,
    .mem_wrap_host = hr__gpu_drv_mem_wrap_host,
    .mem_free = hip_mem_free,
    .stream_new = hr__gpu_drv_stream_new,
    .stream_del = hr__gpu_drv_stream_del,
    .stream_sync = hr__gpu_drv_stream_sync,
    .event_new = hr__gpu_drv_event_new,
    .event_del = hr__gpu_drv_event_del,
    .event_record = hr__gpu_drv_event_record,
    .stream_wait_event = hr__gpu_drv_stream_wait_event,
    .event_query = hr__gpu_drv_event_query,
    .event_sync = hr__gpu_drv_event_sync,
    .copy = hip_copy,
    .host_fn = hip_host_fn,
    .native = hr__gpu_drv_native,
    .wrap_native = hr__gpu_drv_wrap_native,
    .ipc_mem_export = hip_ipc_mem_export,
    .ipc_mem_import = hip_ipc_mem_import,
    .ipc_event_export = hr__gpu_drv_ipc_event_export,
    .ipc_event_import = hr__gpu_drv_ipc_event_import,
    .mem_alloc_shareable = hip_mem_alloc_shareable,
    .ipc_mem_export_fd = hr__gpu_vmm_export_fd,
    .ipc_mem_import_fd = hip_ipc_mem_import_fd,
};
