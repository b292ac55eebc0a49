/*
 * The "cuda" backend: NVIDIA GPUs through the CUDA driver API of
 * libcuda.so.1, loaded at run time.  cuda.h provides the types only; every
 * entry point is resolved with dlsym() (by its versioned name where cuda.h
 * maps one, e.g. cuMemAlloc -> cuMemAlloc_v2), so the library does not
 * link against the driver and reports "unavailable" where it is missing.
 *
 * The device's primary context is retained while the hr_gpu is open and
 * made current on the calling thread at every entry point (cheap), so any
 * thread may use the device.  Streams are non-blocking CUstreams, events
 * CUevents without timing, host functions cuLaunchHostFunc().  Copies use
 * cuMemcpyAsync() with unified addressing, which infers the direction and
 * handles pageable memory.  Memory and events (created with
 * HR_GPU_EVENT_IPC) can be exported to other processes.
 *
 * Shareable memory (HR_GPU_CAP_IPC_FD) uses the virtual memory management
 * API where the driver and device have it: cuMemCreate with
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, reserved, mapped and made
 * accessible in this context, and exported once as a POSIX fd
 * (cuMemExportToShareableHandle) that the allocation keeps; an import is
 * cuMemImportFromShareableHandle + cuMemMap + cuMemSetAccess, sized to the
 * allocation granularity (a request beyond the exported allocation fails
 * in cuMemMap).  The logic around those calls, and the wrappers of
 * streams and events, are shared with the hip backend (hr_gpu_drv.c).
 * Written against the CUDA 13 headers; not run here (no NVIDIA device).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include <cuda.h>

#include <hurray/wire.h>

#include "hr_gpu_drv.h"

/* The driver entry points (fn_syms names the symbol of each). */
typedef struct cu_fns {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetName)(char *, int, CUdevice);
  CUresult (*DeviceTotalMem)(size_t *, CUdevice);
  CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*PrimaryCtxRelease)(CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*GetErrorString)(CUresult, const char **);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemHostAlloc)(void **, size_t, unsigned);
  CUresult (*MemFreeHost)(void *);
  CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned);
  CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*StreamCreate)(CUstream *, unsigned);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*EventCreate)(CUevent *, unsigned);
  CUresult (*EventDestroy)(CUevent);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*EventQuery)(CUevent);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*LaunchHostFunc)(CUstream, CUhostFn, void *);
  CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
  CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
  CUresult (*IpcCloseMemHandle)(CUdeviceptr);
  CUresult (*IpcGetEventHandle)(CUipcEventHandle *, CUevent);
  CUresult (*IpcOpenEventHandle)(CUevent *, CUipcEventHandle);
  CUresult (*ModuleLoadData)(CUmodule *, const void *);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                           unsigned, unsigned, unsigned, CUstream, void **,
                           void **);
} cu_fns;

#define SYM(member, name) HR__GPU_SYM(cu_fns, member, name)
static const hr__gpu_sym fn_syms[] = {
    SYM(Init, "cuInit"),
    SYM(DeviceGetCount, "cuDeviceGetCount"),
    SYM(DeviceGet, "cuDeviceGet"),
    SYM(DeviceGetName, "cuDeviceGetName"),
    SYM(DeviceTotalMem, "cuDeviceTotalMem_v2"),
    SYM(DeviceGetAttribute, "cuDeviceGetAttribute"),
    SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    SYM(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    SYM(CtxSetCurrent, "cuCtxSetCurrent"),
    SYM(GetErrorString, "cuGetErrorString"),
    SYM(MemAlloc, "cuMemAlloc_v2"),
    SYM(MemFree, "cuMemFree_v2"),
    SYM(MemHostAlloc, "cuMemHostAlloc"),
    SYM(MemFreeHost, "cuMemFreeHost"),
    SYM(MemAllocManaged, "cuMemAllocManaged"),
    SYM(MemcpyAsync, "cuMemcpyAsync"),
    SYM(StreamCreate, "cuStreamCreate"),
    SYM(StreamDestroy, "cuStreamDestroy_v2"),
    SYM(StreamSynchronize, "cuStreamSynchronize"),
    SYM(EventCreate, "cuEventCreate"),
    SYM(EventDestroy, "cuEventDestroy_v2"),
    SYM(EventRecord, "cuEventRecord"),
    SYM(StreamWaitEvent, "cuStreamWaitEvent"),
    SYM(EventQuery, "cuEventQuery"),
    SYM(EventSynchronize, "cuEventSynchronize"),
    SYM(LaunchHostFunc, "cuLaunchHostFunc"),
    SYM(IpcGetMemHandle, "cuIpcGetMemHandle"),
    SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2"),
    SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle"),
    SYM(IpcGetEventHandle, "cuIpcGetEventHandle"),
    SYM(IpcOpenEventHandle, "cuIpcOpenEventHandle"),
    SYM(ModuleLoadData, "cuModuleLoadData"),
    SYM(ModuleUnload, "cuModuleUnload"),
    SYM(ModuleGetFunction, "cuModuleGetFunction"),
    SYM(LaunchKernel, "cuLaunchKernel"),
};
#undef SYM
#define NSYMS (sizeof fn_syms / sizeof *fn_syms)
_Static_assert(sizeof(cu_fns) == NSYMS * sizeof(hr__gpu_fn),
               "one slot per symbol");
_Static_assert(sizeof(CUipcMemHandle) <= sizeof(hr_gpu_ipc_handle),
               "IPC handle fits");
_Static_assert(sizeof(CUipcEventHandle) <= sizeof(hr_gpu_ipc_handle),
               "IPC handle fits");

static const char *const lib_names[] = {"libcuda.so.1", NULL};

#define CU_MAX_MODULES 8

/* The virtual memory management entry points: optional (resolved one by
 * one; any missing turns shareable memory off). */
typedef struct cu_vmm_fns {
  CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t,
                        const CUmemAllocationProp *, unsigned long long);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle);
  CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                unsigned long long);
  CUresult (*MemAddressFree)(CUdeviceptr, size_t);
  CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                     unsigned long long);
  CUresult (*MemUnmap)(CUdeviceptr, size_t);
  CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *,
                           size_t);
  CUresult (*MemGetAllocationGranularity)(size_t *,
                                          const CUmemAllocationProp *,
                                          CUmemAllocationGranularity_flags);
  CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle,
                                         CUmemAllocationHandleType,
                                         unsigned long long);
  CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *,
                                           void *, CUmemAllocationHandleType);
} cu_vmm_fns;

#define SYM(member, name) HR__GPU_SYM(cu_vmm_fns, member, name)
static const hr__gpu_sym vmm_syms[] = {
    SYM(MemCreate, "cuMemCreate"),
    SYM(MemRelease, "cuMemRelease"),
    SYM(MemAddressReserve, "cuMemAddressReserve"),
    SYM(MemAddressFree, "cuMemAddressFree"),
    SYM(MemMap, "cuMemMap"),
    SYM(MemUnmap, "cuMemUnmap"),
    SYM(MemSetAccess, "cuMemSetAccess"),
    SYM(MemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
    SYM(MemExportToShareableHandle, "cuMemExportToShareableHandle"),
    SYM(MemImportFromShareableHandle, "cuMemImportFromShareableHandle"),
};
#undef SYM
#define NVMM (sizeof vmm_syms / sizeof *vmm_syms)
_Static_assert(sizeof(cu_vmm_fns) == NVMM * sizeof(hr__gpu_fn),
               "one slot per symbol");

typedef struct cu_dev {
  hr__gpu_drv drv; /* first: see hr_gpu_drv.h */
  void *lib;
  cu_fns f;
  cu_vmm_fns vmm;
  CUdevice dev;
  CUcontext ctx;
  int have_ctx;
  /* Modules loaded by hr__gpu_cuda_launch(), one per embedded image,
   * unloaded when the device closes. */
  pthread_mutex_t mods_mu;
  struct {
    const void *image;
    CUmodule mod;
  } mods[CU_MAX_MODULES];
  unsigned nmods;
} cu_dev;

static int load(cu_fns *f, void **lib, hr_gpu_probe_info *why) {
  return hr__gpu_load(lib_names, fn_syms, NSYMS, f, lib, why);
}

static const char *errname(const cu_fns *f, CUresult r) {
  const char *s = NULL;
  if (f->GetErrorString && f->GetErrorString(r, &s) == CUDA_SUCCESS && s)
    return s;
  return "unknown CUDA error";
}

static int map_err(CUresult r) {
  switch (r) {
  case CUDA_SUCCESS: return 0;
  case CUDA_ERROR_OUT_OF_MEMORY: return HR_ERR_NOMEM;
  case CUDA_ERROR_NOT_READY: return HR_ERR_WOULDBLOCK;
  case CUDA_ERROR_NOT_SUPPORTED: return HR_ERR_UNSUPPORTED;
  case CUDA_ERROR_INVALID_VALUE:
  case CUDA_ERROR_INVALID_HANDLE: return HR_ERR_INVALID_ARGUMENT;
  default: return HR_ERR_IO;
  }
}

/* Makes the device's context current; every entry point starts here. */
static int cur(cu_dev *d) { return map_err(d->f.CtxSetCurrent(d->ctx)); }

static int init_count(cu_fns *f, int *n, hr_gpu_probe_info *why) {
  CUresult r = f->Init(0);
  if (r == CUDA_SUCCESS)
    r = f->DeviceGetCount(n);
  if (r != CUDA_SUCCESS)
    return hr__gpu_unavailable(why, "cuda: %s", errname(f, r));
  return 0;
}

static int cu_probe(const hr_gpu_config *cfg, hr_gpu_probe_info *info) {
  (void)cfg;
  cu_fns f;
  void *lib;
  memset(&f, 0, sizeof f);
  int rv = load(&f, &lib, info);
  int n = 0;
  if (rv == 0)
    rv = init_count(&f, &n, info);
  if (rv == 0)
    info->device_count = (unsigned)n;
  /* libcuda is not unloaded once initialised: the driver does not
   * support re-initialisation within a process. */
  if (lib && rv != 0)
    dlclose(lib);
  return rv;
}

/* The allocation properties of shareable memory on this device. */
static void vmm_prop(const cu_dev *d, CUmemAllocationProp *prop) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = (int)d->dev;
  prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* The adaptors of hr__gpu_vmm_ops (see hr_gpu_drv.h). */
static int vmm_granularity(void *dev, size_t *gran) {
  cu_dev *d = dev;
  CUmemAllocationProp prop;
  vmm_prop(d, &prop);
  return map_err(d->vmm.MemGetAllocationGranularity(
      gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

static int vmm_create(void *dev, size_t len, uint64_t *h) {
  cu_dev *d = dev;
  CUmemAllocationProp prop;
  vmm_prop(d, &prop);
  CUmemGenericAllocationHandle ah = 0;
  int rv = map_err(d->vmm.MemCreate(&ah, len, &prop, 0));
  *h = ah;
  return rv;
}

static void vmm_release(void *dev, uint64_t h) {
  cu_dev *d = dev;
  d->vmm.MemRelease(h);
}

static int vmm_reserve(void *dev, size_t len, void **addr) {
  cu_dev *d = dev;
  CUdeviceptr p = 0;
  int rv = map_err(d->vmm.MemAddressReserve(&p, len, 0, 0, 0));
  *addr = (void *)(uintptr_t)p;
  return rv;
}

static void vmm_addr_free(void *dev, void *addr, size_t len) {
  cu_dev *d = dev;
  d->vmm.MemAddressFree((CUdeviceptr)(uintptr_t)addr, len);
}

static int vmm_map(void *dev, void *addr, size_t len, uint64_t h) {
  cu_dev *d = dev;
  return map_err(d->vmm.MemMap((CUdeviceptr)(uintptr_t)addr, len, 0, h, 0));
}

static void vmm_unmap(void *dev, void *addr, size_t len) {
  cu_dev *d = dev;
  d->vmm.MemUnmap((CUdeviceptr)(uintptr_t)addr, len);
}

static int vmm_set_access(void *dev, void *addr, size_t len) {
  cu_dev *d = dev;
  CUmemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = (int)d->dev;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return map_err(
      d->vmm.MemSetAccess((CUdeviceptr)(uintptr_t)addr, len, &acc, 1));
}

static int vmm_export_fd(void *dev, uint64_t h, int *fd) {
  cu_dev *d = dev;
  return map_err(d->vmm.MemExportToShareableHandle(
      fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
}

static int vmm_import_fd(void *dev, int fd, uint64_t *h) {
  cu_dev *d = dev;
  CUmemGenericAllocationHandle ah = 0;
  int rv = map_err(d->vmm.MemImportFromShareableHandle(
      &ah, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  *h = ah;
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
#define DRV_DEV cu_dev
#define DRV_STREAM CUstream
#define DRV_EVENT CUevent
#define DRV_IPC_EVENT CUipcEventHandle
#define DRV_STREAM_NONBLOCKING CU_STREAM_NON_BLOCKING
#define DRV_EVENT_NO_TIMING CU_EVENT_DISABLE_TIMING
#define DRV_EVENT_IPC CU_EVENT_INTERPROCESS
#include "hr_gpu_drv_adapt.h"

static void cu_close(void *dev) {
  cu_dev *d = dev;
  if (d->nmods && cur(d) == 0)
    for (unsigned i = 0; i < d->nmods; i++)
      d->f.ModuleUnload(d->mods[i].mod);
  if (d->have_ctx)
    d->f.PrimaryCtxRelease(d->dev);
  pthread_mutex_destroy(&d->mods_mu);
  hr_mem mem = d->drv.mem;
  hr__mem_free(&mem, d);
}

static int cu_open(void **dev, const hr_gpu_config *cfg, const hr_mem *mem,
                   hr_gpu_probe_info *why) {
  cu_dev *d = hr__mem_calloc(mem, 1, sizeof *d);
  if (!d)
    return HR_ERR_NOMEM;
  d->drv.mem = *mem;
  d->drv.vmm_ops = &vmm_ops;
  d->drv.ops = &drv_ops;
  pthread_mutex_init(&d->mods_mu, NULL);
  int n = 0;
  int rv = load(&d->f, &d->lib, why);
  if (rv == 0)
    rv = init_count(&d->f, &n, why);
  if (rv == 0 && cfg->ordinal >= (unsigned)n)
    rv = hr__gpu_unavailable(why, "cuda: no device %u (%d found)",
                             cfg->ordinal, n);
  CUresult r = CUDA_SUCCESS;
  if (rv == 0 && (r = d->f.DeviceGet(&d->dev, (int)cfg->ordinal)) == 0 &&
      (r = d->f.PrimaryCtxRetain(&d->ctx, d->dev)) == 0)
    d->have_ctx = 1;
  if (rv == 0 && r != CUDA_SUCCESS)
    rv = hr__gpu_unavailable(why, "cuda: %s", errname(&d->f, r));
  if (rv == 0) {
    int uva = 0;
    d->f.DeviceGetAttribute(&uva, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
                            d->dev);
    d->f.DeviceGetAttribute(&d->drv.managed,
                            CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, d->dev);
    if (!uva)
      rv = hr__gpu_unavailable(why, "cuda: device without unified "
                               "addressing");
  }
  if (rv == 0) {
    /* Shareable memory: the driver's VMM entry points and the device's
     * support for POSIX fd handles. */
    int vmm = 0, posix = 0;
    d->f.DeviceGetAttribute(
        &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d->dev);
    d->f.DeviceGetAttribute(
        &posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        d->dev);
    hr_gpu_probe_info ignored;
    d->drv.have_vmm = vmm && posix &&
                      hr__gpu_dlsym_all(d->lib, vmm_syms, NVMM, &d->vmm,
                                        &ignored) == 0;
  }
  if (rv == 0) {
    if (d->f.DeviceGetName(d->drv.name, (int)sizeof d->drv.name, d->dev) != 0)
      hr__gpu_copy_name(d->drv.name, sizeof d->drv.name, "CUDA device");
    d->f.DeviceTotalMem(&d->drv.total, d->dev);
    rv = cur(d);
  }
  if (rv != 0) {
    /* A loaded driver stays loaded (see cu_probe). */
    if (d->lib && !d->have_ctx && !d->f.Init)
      dlclose(d->lib);
    cu_close(d);
    return rv;
  }
  *dev = d;
  return 0;
}

static int cu_mem_alloc(void *dev, int kind, uint64_t size,
                        hr_gpu_mem_info *out) {
  cu_dev *d = dev;
  int rv = cur(d);
  if (rv != 0)
    return rv;
  if (size > SIZE_MAX)
    return HR_ERR_NOMEM;
  CUdeviceptr p = 0;
  void *h = NULL;
  switch (kind) {
  case HR_GPU_MEM_PINNED:
    rv = map_err(d->f.MemHostAlloc(&h, (size_t)size,
                                   CU_MEMHOSTALLOC_PORTABLE |
                                       CU_MEMHOSTALLOC_DEVICEMAP));
    /* Under unified addressing the host pointer is the device address. */
    out->host_ptr = h;
    out->device_ptr = h;
    break;
  case HR_GPU_MEM_UNIFIED:
    rv = map_err(d->f.MemAllocManaged(&p, (size_t)size, CU_MEM_ATTACH_GLOBAL));
    out->device_ptr = (void *)(uintptr_t)p;
    out->host_ptr = out->device_ptr;
    break;
  default:
    rv = map_err(d->f.MemAlloc(&p, (size_t)size));
    out->device_ptr = (void *)(uintptr_t)p;
    break;
  }
  return rv == HR_ERR_INVALID_ARGUMENT ? HR_ERR_NOMEM : rv;
}

static void cu_mem_free(void *dev, const hr_gpu_mem_info *m) {
  cu_dev *d = dev;
  if (m->kind == HR_GPU_MEM_HOST || cur(d) != 0)
    return;
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)m->device_ptr;
  if (m->handle == &hr__gpu_drv_imported)
    d->f.IpcCloseMemHandle(p);
  else if (m->handle)
    hr__gpu_vmm_free(&d->drv, m->handle);
  else if (m->kind == HR_GPU_MEM_PINNED)
    d->f.MemFreeHost(m->host_ptr);
  else
    d->f.MemFree(p);
}

static CUdeviceptr addr(const hr_gpu_mem_info *m, uint64_t off) {
  char *base = m->device_ptr ? m->device_ptr : m->host_ptr;
  return (CUdeviceptr)(uintptr_t)(base + off);
}

static int cu_copy(void *dev, void *sp, const hr_gpu_mem_info *dst,
                   uint64_t dst_off, const hr_gpu_mem_info *src,
                   uint64_t src_off, uint64_t len) {
  cu_dev *d = dev;
  int rv = cur(d);
  if (rv != 0)
    return rv;
  return map_err(d->f.MemcpyAsync(addr(dst, dst_off), addr(src, src_off),
                                  (size_t)len, hr__gpu_drv_obj_h(sp)));
}

static int cu_host_fn(void *dev, void *sp, hr_gpu_host_fn fn, void *arg) {
  cu_dev *d = dev;
  int rv = cur(d);
  return rv ? rv : map_err(d->f.LaunchHostFunc(hr__gpu_drv_obj_h(sp), fn, arg));
}

static int cu_ipc_mem_export(void *dev, const hr_gpu_mem_info *m,
                             hr_gpu_ipc_handle *h) {
  cu_dev *d = dev;
  int rv = cur(d);
  CUipcMemHandle ih;
  if (rv == 0)
    rv = map_err(
        d->f.IpcGetMemHandle(&ih, (CUdeviceptr)(uintptr_t)m->device_ptr));
  if (rv == 0)
    memcpy(h->bytes, &ih, sizeof ih);
  return rv;
}

static int cu_ipc_mem_import(void *dev, const hr_gpu_ipc_handle *h,
                             uint64_t size, hr_gpu_mem_info *out) {
  cu_dev *d = dev;
  (void)size;
  int rv = cur(d);
  CUipcMemHandle ih;
  memcpy(&ih, h->bytes, sizeof ih);
  CUdeviceptr p = 0;
  if (rv == 0)
    rv = map_err(d->f.IpcOpenMemHandle(&p, ih,
                                       CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  if (rv == 0) {
    out->device_ptr = (void *)(uintptr_t)p;
    out->handle = (void *)&hr__gpu_drv_imported;
  }
  return rv;
}

static int cu_mem_alloc_shareable(void *dev, uint64_t size,
                                  hr_gpu_mem_info *out) {
  cu_dev *d = dev;
  int rv = cur(d);
  return rv ? rv : hr__gpu_vmm_alloc(&d->drv, size, out);
}

static int cu_ipc_mem_import_fd(void *dev, int fd, uint64_t size,
                                hr_gpu_mem_info *out) {
  cu_dev *d = dev;
  int rv = cur(d);
  return rv ? rv : hr__gpu_vmm_import(&d->drv, fd, size, out);
}

const hr_gpu_ops hr__gpu_cuda_ops = {
    .size = sizeof(hr_gpu_ops),
    .name = "cuda",
    .device_tag = HR_DEV_CUDA,
    .probe = cu_probe,
    .open = cu_open,
    .close = cu_close,
    .query = hr__gpu_drv_query,
    .mem_alloc = cu_mem_alloc,
    .mem_wrap_host = hr__gpu_drv_mem_wrap_host,
    .mem_free = cu_mem_free,
    .stream_new = hr__gpu_drv_stream_new,
    .stream_del = hr__gpu_drv_stream_del,
    .stream_sync = hr__gpu_drv_stream_sync,
    .event_new = hr__gpu_drv_event_new,
    .event_del = hr__gpu_drv_event_del,
    .event_record = hr__gpu_drv_event_record,
    .stream_wait_event = hr__gpu_drv_stream_wait_event,
    .event_query = hr__gpu_drv_event_query,
    .event_sync = hr__gpu_drv_event_sync,
    .copy = cu_copy,
    .host_fn = cu_host_fn,
    .native = hr__gpu_drv_native,
    .wrap_native = hr__gpu_drv_wrap_native,
    .ipc_mem_export = cu_ipc_mem_export,
    .ipc_mem_import = cu_ipc_mem_import,
    .ipc_event_export = hr__gpu_drv_ipc_event_export,
    .ipc_event_import = hr__gpu_drv_ipc_event_import,
    .mem_alloc_shareable = cu_mem_alloc_shareable,
    .ipc_mem_export_fd = hr__gpu_vmm_export_fd,
    .ipc_mem_import_fd = cu_ipc_mem_import_fd,
};

/* Returns the module of `image`, loading it on first use. */
static int get_module(cu_dev *d, const void *image, CUmodule *out) {
  int rv = 0;
  pthread_mutex_lock(&d->mods_mu);
  unsigned i = 0;
  while (i < d->nmods && d->mods[i].image != image)
    i++;
  if (i < d->nmods) {
    *out = d->mods[i].mod;
  } else if (i == CU_MAX_MODULES) {
    rv = HR_ERR_LIMIT;
  } else {
    /* No loadable code for this device (an architecture the image lacks
     * and a driver too old for its PTX) means "not supported here". */
    CUresult r = d->f.ModuleLoadData(out, image);
    if (r == CUDA_SUCCESS) {
      d->mods[i].image = image;
      d->mods[i].mod = *out;
      d->nmods++;
    } else {
      rv = r == CUDA_ERROR_OUT_OF_MEMORY ? HR_ERR_NOMEM : HR_ERR_UNSUPPORTED;
    }
  }
  pthread_mutex_unlock(&d->mods_mu);
  return rv;
}

int hr__gpu_cuda_launch(hr_gpu *g, const void *image, hr_gpu_stream *s,
                        const hr__gpu_cuda_kernel *k) {
  if (!g || !image || !s || !k || !k->name || hr_gpu_stream_device(s) != g)
    return HR_ERR_INVALID_ARGUMENT;
  if (hr_gpu_get_ops(g) != &hr__gpu_cuda_ops)
    return HR_ERR_UNSUPPORTED;
  cu_dev *d = hr__gpu_backend_dev(g);
  CUmodule mod;
  CUfunction fn;
  int rv = cur(d);
  if (rv == 0)
    rv = get_module(d, image, &mod);
  if (rv == 0 && d->f.ModuleGetFunction(&fn, mod, k->name) != CUDA_SUCCESS)
    rv = HR_ERR_UNSUPPORTED;
  if (rv == 0)
    rv = map_err(d->f.LaunchKernel(
        fn, k->grid[0], k->grid[1], k->grid[2], k->block[0], k->block[1],
        k->block[2], k->shmem, (CUstream)hr_gpu_stream_native(s), k->args,
        NULL));
  return rv;
}
