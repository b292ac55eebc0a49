/*
 * The "ze" backend: oneAPI Level Zero GPUs through libze_loader.so.1,
 * loaded at run time (ze_api.h provides the types only).
 *
 * A stream is an immediate command list.  Level Zero does not promise
 * that the commands of a list execute in order, so every operation is
 * followed by a barrier.  An event is a host-visible ze_event in a pool of
 * its own (so that it can be exported for IPC); recording appends a reset
 * and a signal, waiting appends a wait.  Level Zero has no host callbacks:
 * a host function is emulated by a helper thread per stream (the list
 * signals an event, the helper waits for it on the host, runs the
 * function, then signals a gate event the list waits on).
 *
 * Events a command list may still wait on (or signal) cannot be destroyed
 * at once: a deleted event goes to a graveyard, stamped with an epoch, and
 * is destroyed once every stream has completed a synchronisation that
 * began after it was buried (then no appended command can refer to it),
 * or when the device closes.
 *
 * Re-recording an event while another stream waits on its previous
 * recording resets it under that waiter; the library's own helpers always
 * record fresh events, and applications should do the same on this
 * backend.
 *
 * Shareable memory (HR_GPU_CAP_IPC_FD) is Level Zero's external memory as
 * a Linux dma-buf, where the device exports and imports it
 * (zeDeviceGetExternalMemoryProperties): a device allocation made with
 * ze_external_memory_export_desc_t, its fd taken once through
 * zeMemGetAllocProperties + ze_external_memory_export_fd_t; an import is
 * zeMemAllocDevice with ze_external_memory_import_fd_t.  Written against
 * the Debian 12 headers; not run here (no Level Zero device).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include <level_zero/ze_api.h>

#include <hurray/wire.h>

#include "hr_gpu_int.h"

typedef struct ze_fns {
  ze_result_t (*Init)(ze_init_flags_t);
  ze_result_t (*DriverGet)(uint32_t *, ze_driver_handle_t *);
  ze_result_t (*DeviceGet)(ze_driver_handle_t, uint32_t *,
                           ze_device_handle_t *);
  ze_result_t (*DeviceGetProperties)(ze_device_handle_t,
                                     ze_device_properties_t *);
  ze_result_t (*DeviceGetCommandQueueGroupProperties)(
      ze_device_handle_t, uint32_t *, ze_command_queue_group_properties_t *);
  ze_result_t (*DeviceGetMemoryProperties)(ze_device_handle_t, uint32_t *,
                                           ze_device_memory_properties_t *);
  ze_result_t (*ContextCreate)(ze_driver_handle_t, const ze_context_desc_t *,
                               ze_context_handle_t *);
  ze_result_t (*ContextDestroy)(ze_context_handle_t);
  ze_result_t (*MemAllocDevice)(ze_context_handle_t,
                                const ze_device_mem_alloc_desc_t *, size_t,
                                size_t, ze_device_handle_t, void **);
  ze_result_t (*MemAllocHost)(ze_context_handle_t,
                              const ze_host_mem_alloc_desc_t *, size_t,
                              size_t, void **);
  ze_result_t (*MemAllocShared)(ze_context_handle_t,
                                const ze_device_mem_alloc_desc_t *,
                                const ze_host_mem_alloc_desc_t *, size_t,
                                size_t, ze_device_handle_t, void **);
  ze_result_t (*MemFree)(ze_context_handle_t, void *);
  ze_result_t (*CommandListCreateImmediate)(ze_context_handle_t,
                                            ze_device_handle_t,
                                            const ze_command_queue_desc_t *,
                                            ze_command_list_handle_t *);
  ze_result_t (*CommandListDestroy)(ze_command_list_handle_t);
  ze_result_t (*AppendBarrier)(ze_command_list_handle_t, ze_event_handle_t,
                               uint32_t, ze_event_handle_t *);
  ze_result_t (*AppendMemoryCopy)(ze_command_list_handle_t, void *,
                                  const void *, size_t, ze_event_handle_t,
                                  uint32_t, ze_event_handle_t *);
  ze_result_t (*AppendSignalEvent)(ze_command_list_handle_t,
                                   ze_event_handle_t);
  ze_result_t (*AppendWaitOnEvents)(ze_command_list_handle_t, uint32_t,
                                    ze_event_handle_t *);
  ze_result_t (*AppendEventReset)(ze_command_list_handle_t,
                                  ze_event_handle_t);
  ze_result_t (*EventPoolCreate)(ze_context_handle_t,
                                 const ze_event_pool_desc_t *, uint32_t,
                                 ze_device_handle_t *,
                                 ze_event_pool_handle_t *);
  ze_result_t (*EventPoolDestroy)(ze_event_pool_handle_t);
  ze_result_t (*EventCreate)(ze_event_pool_handle_t, const ze_event_desc_t *,
                             ze_event_handle_t *);
  ze_result_t (*EventDestroy)(ze_event_handle_t);
  ze_result_t (*EventHostSignal)(ze_event_handle_t);
  ze_result_t (*EventHostSynchronize)(ze_event_handle_t, uint64_t);
  ze_result_t (*EventQueryStatus)(ze_event_handle_t);
  ze_result_t (*EventHostReset)(ze_event_handle_t);
  ze_result_t (*MemGetIpcHandle)(ze_context_handle_t, const void *,
                                 ze_ipc_mem_handle_t *);
  ze_result_t (*MemOpenIpcHandle)(ze_context_handle_t, ze_device_handle_t,
                                  ze_ipc_mem_handle_t, ze_ipc_memory_flags_t,
                                  void **);
  ze_result_t (*MemCloseIpcHandle)(ze_context_handle_t, const void *);
  ze_result_t (*EventPoolGetIpcHandle)(ze_event_pool_handle_t,
                                       ze_ipc_event_pool_handle_t *);
  ze_result_t (*EventPoolOpenIpcHandle)(ze_context_handle_t,
                                        ze_ipc_event_pool_handle_t,
                                        ze_event_pool_handle_t *);
  ze_result_t (*EventPoolCloseIpcHandle)(ze_event_pool_handle_t);
} ze_fns;

#define SYM(member, name) HR__GPU_SYM(ze_fns, member, name)
static const hr__gpu_sym fn_syms[] = {
    SYM(Init, "zeInit"),
    SYM(DriverGet, "zeDriverGet"),
    SYM(DeviceGet, "zeDeviceGet"),
    SYM(DeviceGetProperties, "zeDeviceGetProperties"),
    SYM(DeviceGetCommandQueueGroupProperties,
        "zeDeviceGetCommandQueueGroupProperties"),
    SYM(DeviceGetMemoryProperties, "zeDeviceGetMemoryProperties"),
    SYM(ContextCreate, "zeContextCreate"),
    SYM(ContextDestroy, "zeContextDestroy"),
    SYM(MemAllocDevice, "zeMemAllocDevice"),
    SYM(MemAllocHost, "zeMemAllocHost"),
    SYM(MemAllocShared, "zeMemAllocShared"),
    SYM(MemFree, "zeMemFree"),
    SYM(CommandListCreateImmediate, "zeCommandListCreateImmediate"),
    SYM(CommandListDestroy, "zeCommandListDestroy"),
    SYM(AppendBarrier, "zeCommandListAppendBarrier"),
    SYM(AppendMemoryCopy, "zeCommandListAppendMemoryCopy"),
    SYM(AppendSignalEvent, "zeCommandListAppendSignalEvent"),
    SYM(AppendWaitOnEvents, "zeCommandListAppendWaitOnEvents"),
    SYM(AppendEventReset, "zeCommandListAppendEventReset"),
    SYM(EventPoolCreate, "zeEventPoolCreate"),
    SYM(EventPoolDestroy, "zeEventPoolDestroy"),
    SYM(EventCreate, "zeEventCreate"),
    SYM(EventDestroy, "zeEventDestroy"),
    SYM(EventHostSignal, "zeEventHostSignal"),
    SYM(EventHostSynchronize, "zeEventHostSynchronize"),
    SYM(EventQueryStatus, "zeEventQueryStatus"),
    SYM(EventHostReset, "zeEventHostReset"),
    SYM(MemGetIpcHandle, "zeMemGetIpcHandle"),
    SYM(MemOpenIpcHandle, "zeMemOpenIpcHandle"),
    SYM(MemCloseIpcHandle, "zeMemCloseIpcHandle"),
    SYM(EventPoolGetIpcHandle, "zeEventPoolGetIpcHandle"),
    SYM(EventPoolOpenIpcHandle, "zeEventPoolOpenIpcHandle"),
    SYM(EventPoolCloseIpcHandle, "zeEventPoolCloseIpcHandle"),
};
#undef SYM
#define NSYMS (sizeof fn_syms / sizeof *fn_syms)
_Static_assert(sizeof(ze_fns) == NSYMS * sizeof(hr__gpu_fn),
               "one slot per symbol");
_Static_assert(sizeof(ze_ipc_mem_handle_t) <= sizeof(hr_gpu_ipc_handle),
               "IPC handle fits");
_Static_assert(sizeof(ze_ipc_event_pool_handle_t) <= sizeof(hr_gpu_ipc_handle),
               "IPC handle fits");

static const char *const lib_names[] = {"libze_loader.so.1", "libze_loader.so",
                                        NULL};

/* A ze_event in a pool of its own. */
typedef struct ze_evt {
  ze_event_pool_handle_t pool;
  ze_event_handle_t ev;
  struct ze_evt *target; /* wrappers */
  int recorded;
  int imported; /* the pool was opened from another process */
  int foreign;  /* a wrapped vendor event: never destroyed by us */
  uint64_t epoch;        /* when buried */
  struct ze_evt *next;   /* graveyard link */
} ze_evt;

typedef struct ze_dev ze_dev;

/* A pending host function. */
typedef struct ze_hostop {
  struct ze_hostop *next;
  ze_evt *reached; /* signalled by the list when the function may run */
  ze_evt *gate;    /* signalled by the helper when it returned */
  hr_gpu_host_fn fn;
  void *arg;
} ze_hostop;

typedef struct ze_stream {
  ze_dev *d;
  struct ze_stream *target;         /* wrappers */
  struct ze_stream *prev, *next;    /* in d->streams */
  ze_command_list_handle_t cl;
  ze_evt *sync_ev;
  pthread_mutex_t lk; /* appends to cl (an immediate list is not
                         thread-safe) */
  pthread_t helper;
  int have_helper;
  ze_hostop *head, *tail; /* under d->mu */
  int stop;
  uint64_t synced_epoch; /* under d->mu: see the graveyard */
} ze_stream;

/* External memory entry points (optional: resolved one by one). */
typedef struct ze_ext_fns {
  ze_result_t (*DeviceGetExternalMemoryProperties)(
      ze_device_handle_t, ze_device_external_memory_properties_t *);
  ze_result_t (*MemGetAllocProperties)(ze_context_handle_t, const void *,
                                       ze_memory_allocation_properties_t *,
                                       ze_device_handle_t *);
} ze_ext_fns;

#define SYM(member, name) HR__GPU_SYM(ze_ext_fns, member, name)
static const hr__gpu_sym ext_syms[] = {
    SYM(DeviceGetExternalMemoryProperties,
        "zeDeviceGetExternalMemoryProperties"),
    SYM(MemGetAllocProperties, "zeMemGetAllocProperties"),
};
#undef SYM
_Static_assert(sizeof(ze_ext_fns) == 2 * sizeof(hr__gpu_fn),
               "one slot per symbol");

/* A shareable (or imported) allocation: hr_gpu_mem_info.handle. */
typedef struct ze_shr {
  void *p;
  int fd; /* exported dma-buf; -1 for an import */
} ze_shr;

struct ze_dev {
  hr_mem mem;
  void *lib;
  ze_fns f;
  ze_ext_fns ext;
  int have_dmabuf; /* HR_GPU_CAP_IPC_FD */
  ze_driver_handle_t drv;
  ze_device_handle_t dev;
  ze_context_handle_t ctx;
  uint32_t group; /* compute queue group ordinal */
  char name[ZE_MAX_DEVICE_NAME];
  uint64_t total;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ze_stream *streams; /* owned streams, under mu */
  ze_evt *graveyard;  /* under mu */
  uint64_t epoch;     /* under mu: burials so far */
};

static const char imported_tag = 'i';

static int load(ze_fns *f, void **lib, hr_gpu_probe_info *why) {
  return hr__gpu_load(lib_names, fn_syms, NSYMS, f, lib, why);
}

static int map_err(ze_result_t r) {
  switch (r) {
  case ZE_RESULT_SUCCESS: return 0;
  case ZE_RESULT_NOT_READY: return HR_ERR_WOULDBLOCK;
  case ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY:
  case ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY: return HR_ERR_NOMEM;
  case ZE_RESULT_ERROR_UNSUPPORTED_FEATURE: return HR_ERR_UNSUPPORTED;
  default: return HR_ERR_IO;
  }
}

/* Lists GPU devices over every driver: the ordinal-th one (when `pick`)
 * and the total count. */
static int find_devices(ze_fns *f, unsigned ordinal, ze_driver_handle_t *drv,
                        ze_device_handle_t *dev, unsigned *count,
                        hr_gpu_probe_info *why) {
  ze_result_t r = f->Init(ZE_INIT_FLAG_GPU_ONLY);
  if (r != ZE_RESULT_SUCCESS)
    return hr__gpu_unavailable(why, "ze: zeInit: 0x%x", (unsigned)r);
  uint32_t nd = 0;
  if (f->DriverGet(&nd, NULL) != ZE_RESULT_SUCCESS || nd == 0)
    return hr__gpu_unavailable(why, "ze: no driver");
  ze_driver_handle_t drivers[8];
  if (nd > 8)
    nd = 8;
  f->DriverGet(&nd, drivers);
  *count = 0;
  for (uint32_t i = 0; i < nd; i++) {
    uint32_t n = 0;
    if (f->DeviceGet(drivers[i], &n, NULL) != ZE_RESULT_SUCCESS)
      continue;
    ze_device_handle_t devs[16];
    if (n > 16)
      n = 16;
    f->DeviceGet(drivers[i], &n, devs);
    for (uint32_t k = 0; k < n; k++) {
      ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
      if (f->DeviceGetProperties(devs[k], &p) != ZE_RESULT_SUCCESS ||
          p.type != ZE_DEVICE_TYPE_GPU)
        continue;
      if (*count == ordinal && drv) {
        *drv = drivers[i];
        *dev = devs[k];
      }
      ++*count;
    }
  }
  return 0;
}

static int ze_probe(const hr_gpu_config *cfg, hr_gpu_probe_info *info) {
  (void)cfg;
  ze_fns f;
  void *lib;
  memset(&f, 0, sizeof f);
  int rv = load(&f, &lib, info);
  unsigned n = 0;
  if (rv == 0)
    rv = find_devices(&f, 0, NULL, NULL, &n, info);
  if (rv == 0)
    info->device_count = n;
  if (lib)
    dlclose(lib);
  return rv;
}

/* ---- events ------------------------------------------------------------ */

static int evt_create(ze_dev *d, int ipc, ze_evt **out) {
  ze_evt *e = hr__mem_calloc(&d->mem, 1, sizeof *e);
  if (!e)
    return HR_ERR_NOMEM;
  ze_event_pool_desc_t pd = {
      .stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
      .flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE |
               (ipc ? ZE_EVENT_POOL_FLAG_IPC : 0),
      .count = 1};
  ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC,
                        .index = 0,
                        .signal = ZE_EVENT_SCOPE_FLAG_HOST,
                        .wait = ZE_EVENT_SCOPE_FLAG_HOST};
  int rv = map_err(d->f.EventPoolCreate(d->ctx, &pd, 1, &d->dev, &e->pool));
  if (rv == 0 && (rv = map_err(d->f.EventCreate(e->pool, &ed, &e->ev))) != 0)
    d->f.EventPoolDestroy(e->pool);
  if (rv != 0) {
    hr__mem_free(&d->mem, e);
    return rv;
  }
  *out = e;
  return 0;
}

static void evt_destroy(ze_dev *d, ze_evt *e) {
  d->f.EventDestroy(e->ev);
  if (e->imported)
    d->f.EventPoolCloseIpcHandle(e->pool);
  else
    d->f.EventPoolDestroy(e->pool);
  hr__mem_free(&d->mem, e);
}

/* Takes the graves every stream has synchronised past out of the
 * graveyard; d->mu held.  The caller destroys them without the lock. */
static ze_evt *reap_locked(ze_dev *d) {
  uint64_t safe = UINT64_MAX;
  for (ze_stream *s = d->streams; s; s = s->next)
    if (s->synced_epoch < safe)
      safe = s->synced_epoch;
  ze_evt *dead = NULL, **pp = &d->graveyard;
  while (*pp) {
    ze_evt *e = *pp;
    if (e->epoch <= safe) {
      *pp = e->next;
      e->next = dead;
      dead = e;
    } else {
      pp = &e->next;
    }
  }
  return dead;
}

static void destroy_all(ze_dev *d, ze_evt *dead) {
  while (dead) {
    ze_evt *n = dead->next;
    evt_destroy(d, dead);
    dead = n;
  }
}

/* Puts an event aside until no command list can refer to it any more. */
static void bury(ze_dev *d, ze_evt *e) {
  pthread_mutex_lock(&d->mu);
  e->epoch = ++d->epoch;
  e->next = d->graveyard;
  d->graveyard = e;
  ze_evt *dead = reap_locked(d);
  pthread_mutex_unlock(&d->mu);
  destroy_all(d, dead);
}

/* ---- device ------------------------------------------------------------ */

static void ze_close(void *dev) {
  ze_dev *d = dev;
  destroy_all(d, d->graveyard);
  if (d->ctx)
    d->f.ContextDestroy(d->ctx);
  if (d->lib)
    dlclose(d->lib);
  pthread_cond_destroy(&d->cv);
  pthread_mutex_destroy(&d->mu);
  hr_mem mem = d->mem;
  hr__mem_free(&mem, d);
}

static int ze_open(void **dev, const hr_gpu_config *cfg, const hr_mem *mem,
                   hr_gpu_probe_info *why) {
  ze_dev *d = hr__mem_calloc(mem, 1, sizeof *d);
  if (!d)
    return HR_ERR_NOMEM;
  d->mem = *mem;
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  unsigned n = 0;
  int rv = load(&d->f, &d->lib, why);
  if (rv == 0)
    rv = find_devices(&d->f, cfg->ordinal, &d->drv, &d->dev, &n, why);
  if (rv == 0 && cfg->ordinal >= n)
    rv = hr__gpu_unavailable(why, "ze: no device %u (%u found)", cfg->ordinal,
                             n);
  if (rv == 0) {
    ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
    rv = map_err(d->f.ContextCreate(d->drv, &cd, &d->ctx));
  }
  if (rv == 0) {
    ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    d->f.DeviceGetProperties(d->dev, &p);
    hr__gpu_copy_name(d->name, sizeof d->name, p.name);
    uint32_t ng = 0;
    d->f.DeviceGetCommandQueueGroupProperties(d->dev, &ng, NULL);
    ze_command_queue_group_properties_t gp[16];
    if (ng > 16)
      ng = 16;
    for (uint32_t i = 0; i < ng; i++)
      gp[i] = (ze_command_queue_group_properties_t){
          .stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES};
    d->f.DeviceGetCommandQueueGroupProperties(d->dev, &ng, gp);
    rv = hr__gpu_unavailable(why, "ze: no compute queue group");
    for (uint32_t i = 0; i < ng; i++)
      if (gp[i].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE) {
        d->group = i;
        rv = 0;
        break;
      }
    uint32_t nm = 0;
    d->f.DeviceGetMemoryProperties(d->dev, &nm, NULL);
    ze_device_memory_properties_t mp[8];
    if (nm > 8)
      nm = 8;
    for (uint32_t i = 0; i < nm; i++)
      mp[i] = (ze_device_memory_properties_t){
          .stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES};
    d->f.DeviceGetMemoryProperties(d->dev, &nm, mp);
    for (uint32_t i = 0; i < nm; i++)
      d->total += mp[i].totalSize;
    hr_gpu_probe_info ignored;
    ze_device_external_memory_properties_t ep = {
        .stype = ZE_STRUCTURE_TYPE_DEVICE_EXTERNAL_MEMORY_PROPERTIES};
    d->have_dmabuf =
        hr__gpu_dlsym_all(d->lib, ext_syms, 2, &d->ext, &ignored) == 0 &&
        d->ext.DeviceGetExternalMemoryProperties(d->dev, &ep) ==
            ZE_RESULT_SUCCESS &&
        (ep.memoryAllocationExportTypes &
         ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF) &&
        (ep.memoryAllocationImportTypes &
         ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF);
  }
  if (rv != 0) {
    ze_close(d);
    return rv;
  }
  *dev = d;
  return 0;
}

static int ze_query(void *dev, hr_gpu_caps *caps) {
  ze_dev *d = dev;
  caps->flags = HR_GPU_CAP_ASYNC | HR_GPU_CAP_PINNED | HR_GPU_CAP_UNIFIED |
                HR_GPU_CAP_DEVICE_PTR | HR_GPU_CAP_IPC_MEM |
                HR_GPU_CAP_IPC_EVENT |
                (d->have_dmabuf ? HR_GPU_CAP_IPC_FD : 0);
  caps->total_memory = d->total;
  hr__gpu_copy_name(caps->name, sizeof caps->name, d->name);
  return 0;
}

/* ---- memory ------------------------------------------------------------ */

static int ze_mem_alloc(void *dev, int kind, uint64_t size,
                        hr_gpu_mem_info *out) {
  ze_dev *d = dev;
  if (size > SIZE_MAX)
    return HR_ERR_NOMEM;
  ze_device_mem_alloc_desc_t dd = {
      .stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  ze_host_mem_alloc_desc_t hd = {.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC};
  void *p = NULL;
  int rv;
  switch (kind) {
  case HR_GPU_MEM_PINNED:
    rv = map_err(d->f.MemAllocHost(d->ctx, &hd, (size_t)size, 64, &p));
    out->host_ptr = p;
    break;
  case HR_GPU_MEM_UNIFIED:
    rv = map_err(
        d->f.MemAllocShared(d->ctx, &dd, &hd, (size_t)size, 64, d->dev, &p));
    out->host_ptr = p;
    break;
  default:
    rv = map_err(d->f.MemAllocDevice(d->ctx, &dd, (size_t)size, 64, d->dev,
                                     &p));
    break;
  }
  out->device_ptr = p;
  return rv == HR_ERR_IO ? HR_ERR_NOMEM : rv;
}

/* Pageable memory is staged through host USM, which every device reaches
 * (not every driver reaches system memory). */
static int ze_mem_wrap_host(void *dev, void *ptr, uint64_t size,
                            hr_gpu_mem_info *out) {
  (void)dev;
  (void)size;
  out->host_ptr = ptr;
  return 0;
}

static int ze_mem_alloc_shareable(void *dev, uint64_t size,
                                  hr_gpu_mem_info *out) {
  ze_dev *d = dev;
  if (size > SIZE_MAX)
    return HR_ERR_NOMEM;
  ze_shr *sh = hr__mem_calloc(&d->mem, 1, sizeof *sh);
  if (!sh)
    return HR_ERR_NOMEM;
  ze_external_memory_export_desc_t ed = {
      .stype = ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_DESC,
      .flags = ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF};
  ze_device_mem_alloc_desc_t dd = {
      .stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, .pNext = &ed};
  int rv = map_err(
      d->f.MemAllocDevice(d->ctx, &dd, (size_t)size, 64, d->dev, &sh->p));
  if (rv != 0) {
    hr__mem_free(&d->mem, sh);
    return rv == HR_ERR_IO ? HR_ERR_NOMEM : rv;
  }
  ze_external_memory_export_fd_t xf = {
      .stype = ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_FD,
      .flags = ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF,
      .fd = -1};
  ze_memory_allocation_properties_t mp = {
      .stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES, .pNext = &xf};
  if (d->ext.MemGetAllocProperties(d->ctx, sh->p, &mp, NULL) !=
          ZE_RESULT_SUCCESS ||
      xf.fd < 0) {
    d->f.MemFree(d->ctx, sh->p);
    hr__mem_free(&d->mem, sh);
    return HR_ERR_IO;
  }
  sh->fd = xf.fd;
  out->handle = sh;
  out->device_ptr = sh->p;
  return 0;
}

static int ze_ipc_mem_export_fd(void *dev, const hr_gpu_mem_info *m,
                                int *fd) {
  (void)dev;
  if (!m->handle || m->handle == &imported_tag)
    return HR_ERR_UNSUPPORTED;
  const ze_shr *sh = m->handle;
  if (sh->fd < 0)
    return HR_ERR_UNSUPPORTED;
  *fd = sh->fd;
  return 0;
}

static int ze_ipc_mem_import_fd(void *dev, int fd, uint64_t size,
                                hr_gpu_mem_info *out) {
  ze_dev *d = dev;
  if (size > SIZE_MAX)
    return HR_ERR_NOMEM;
  /* A dma-buf reports its size through lseek(); anything that cannot, or
   * is smaller than asked, is not what the server says it is. */
  off_t end = lseek(fd, 0, SEEK_END);
  if (end < 0 || (uint64_t)end < size)
    return HR_ERR_PROTO;
  lseek(fd, 0, SEEK_SET);
  ze_shr *sh = hr__mem_calloc(&d->mem, 1, sizeof *sh);
  if (!sh)
    return HR_ERR_NOMEM;
  sh->fd = -1;
  ze_external_memory_import_fd_t imp = {
      .stype = ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_IMPORT_FD,
      .flags = ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF,
      .fd = fd};
  ze_device_mem_alloc_desc_t dd = {
      .stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, .pNext = &imp};
  ze_result_t r =
      d->f.MemAllocDevice(d->ctx, &dd, (size_t)size, 64, d->dev, &sh->p);
  if (r != ZE_RESULT_SUCCESS) {
    hr__mem_free(&d->mem, sh);
    return map_err(r) == HR_ERR_NOMEM ? HR_ERR_NOMEM : HR_ERR_PROTO;
  }
  out->handle = sh;
  out->device_ptr = sh->p;
  return 0;
}

static void ze_mem_free(void *dev, const hr_gpu_mem_info *m) {
  ze_dev *d = dev;
  if (m->kind == HR_GPU_MEM_HOST)
    return;
  if (m->handle && m->handle != &imported_tag) {
    ze_shr *sh = m->handle;
    d->f.MemFree(d->ctx, sh->p);
    if (sh->fd >= 0)
      close(sh->fd);
    hr__mem_free(&d->mem, sh);
  } else if (m->handle == &imported_tag)
    d->f.MemCloseIpcHandle(d->ctx, m->device_ptr);
  else
    d->f.MemFree(d->ctx, m->device_ptr);
}

/* ---- streams ----------------------------------------------------------- */

static ze_stream *real_stream(void *p) {
  ze_stream *s = p;
  return s->target ? s->target : s;
}

static ze_evt *real_event(void *p) {
  ze_evt *e = p;
  return e->target ? e->target : e;
}

/* Appends an operation's tail barrier; s->lk held.  The barrier is what
 * makes the list execute in order. */
static int barrier(ze_dev *d, ze_stream *s) {
  return map_err(d->f.AppendBarrier(s->cl, NULL, 0, NULL));
}

static int stream_sync_real(ze_dev *d, ze_stream *s) {
  pthread_mutex_lock(&d->mu);
  uint64_t begun = d->epoch;
  pthread_mutex_unlock(&d->mu);
  pthread_mutex_lock(&s->lk);
  int rv = map_err(d->f.AppendEventReset(s->cl, s->sync_ev->ev));
  if (rv == 0)
    rv = map_err(d->f.AppendSignalEvent(s->cl, s->sync_ev->ev));
  pthread_mutex_unlock(&s->lk);
  if (rv == 0)
    rv = map_err(d->f.EventHostSynchronize(s->sync_ev->ev, UINT64_MAX));
  if (rv != 0)
    return rv;
  pthread_mutex_lock(&d->mu);
  if (s->synced_epoch < begun)
    s->synced_epoch = begun;
  ze_evt *dead = reap_locked(d);
  pthread_mutex_unlock(&d->mu);
  destroy_all(d, dead);
  return 0;
}

static void *helper_main(void *arg) {
  ze_stream *s = arg;
  ze_dev *d = s->d;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while (!s->head && !s->stop)
      pthread_cond_wait(&d->cv, &d->mu);
    if (!s->head)
      break;
    ze_hostop *op = s->head;
    s->head = op->next;
    if (!s->head)
      s->tail = NULL;
    pthread_mutex_unlock(&d->mu);
    d->f.EventHostSynchronize(op->reached->ev, UINT64_MAX);
    op->fn(op->arg);
    d->f.EventHostSignal(op->gate->ev);
    bury(d, op->reached);
    bury(d, op->gate);
    hr__mem_free(&d->mem, op);
    pthread_mutex_lock(&d->mu);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

static int ze_stream_new(void *dev, void **out) {
  ze_dev *d = dev;
  ze_stream *s = hr__mem_calloc(&d->mem, 1, sizeof *s);
  if (!s)
    return HR_ERR_NOMEM;
  s->d = d;
  pthread_mutex_init(&s->lk, NULL);
  ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                .ordinal = d->group,
                                .index = 0,
                                .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS,
                                .priority =
                                    ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
  int rv = map_err(
      d->f.CommandListCreateImmediate(d->ctx, d->dev, &qd, &s->cl));
  if (rv == 0)
    rv = evt_create(d, 0, &s->sync_ev);
  if (rv == 0 && pthread_create(&s->helper, NULL, helper_main, s) != 0)
    rv = HR_ERR_IO;
  if (rv != 0) {
    if (s->sync_ev)
      evt_destroy(d, s->sync_ev);
    if (s->cl)
      d->f.CommandListDestroy(s->cl);
    pthread_mutex_destroy(&s->lk);
    hr__mem_free(&d->mem, s);
    return rv;
  }
  s->have_helper = 1;
  pthread_mutex_lock(&d->mu);
  s->synced_epoch = d->epoch;
  s->next = d->streams;
  if (d->streams)
    d->streams->prev = s;
  d->streams = s;
  pthread_mutex_unlock(&d->mu);
  *out = s;
  return 0;
}

static void ze_stream_del(void *dev, void *sp) {
  ze_dev *d = dev;
  ze_stream *s = sp;
  if (!s->target) {
    stream_sync_real(d, s);
    pthread_mutex_lock(&d->mu);
    s->stop = 1;
    pthread_cond_broadcast(&d->cv);
    if (s->prev)
      s->prev->next = s->next;
    else
      d->streams = s->next;
    if (s->next)
      s->next->prev = s->prev;
    pthread_mutex_unlock(&d->mu);
    pthread_join(s->helper, NULL);
    d->f.CommandListDestroy(s->cl);
    evt_destroy(d, s->sync_ev);
    pthread_mutex_destroy(&s->lk);
  }
  hr__mem_free(&d->mem, s);
}

static int ze_stream_sync(void *dev, void *sp) {
  return stream_sync_real(dev, real_stream(sp));
}

static int ze_event_new(void *dev, unsigned flags, void **out) {
  ze_evt *e;
  int rv = evt_create(dev, (flags & HR_GPU_EVENT_IPC) != 0, &e);
  if (rv == 0)
    *out = e;
  return rv;
}

static void ze_event_del(void *dev, void *ep) {
  ze_dev *d = dev;
  ze_evt *e = ep;
  if (e->target || e->foreign)
    hr__mem_free(&d->mem, e);
  else
    bury(d, e);
}

static int ze_event_record(void *dev, void *ep, void *sp) {
  ze_dev *d = dev;
  ze_evt *e = real_event(ep);
  ze_stream *s = real_stream(sp);
  pthread_mutex_lock(&s->lk);
  int rv = map_err(d->f.AppendEventReset(s->cl, e->ev));
  if (rv == 0)
    rv = map_err(d->f.AppendSignalEvent(s->cl, e->ev));
  pthread_mutex_unlock(&s->lk);
  if (rv == 0)
    __atomic_store_n(&e->recorded, 1, __ATOMIC_RELEASE);
  return rv;
}

static int ze_stream_wait_event(void *dev, void *sp, void *ep) {
  ze_dev *d = dev;
  ze_evt *e = real_event(ep);
  ze_stream *s = real_stream(sp);
  /* A never-recorded event is complete: waiting on it would hang. */
  if (!__atomic_load_n(&e->recorded, __ATOMIC_ACQUIRE))
    return 0;
  pthread_mutex_lock(&s->lk);
  int rv = map_err(d->f.AppendWaitOnEvents(s->cl, 1, &e->ev));
  pthread_mutex_unlock(&s->lk);
  return rv;
}

static int ze_event_query(void *dev, void *ep) {
  ze_dev *d = dev;
  ze_evt *e = real_event(ep);
  if (!__atomic_load_n(&e->recorded, __ATOMIC_ACQUIRE))
    return 0;
  return map_err(d->f.EventQueryStatus(e->ev));
}

static int ze_event_sync(void *dev, void *ep) {
  ze_dev *d = dev;
  ze_evt *e = real_event(ep);
  if (!__atomic_load_n(&e->recorded, __ATOMIC_ACQUIRE))
    return 0;
  return map_err(d->f.EventHostSynchronize(e->ev, UINT64_MAX));
}

static int enqueue_host(ze_dev *d, ze_stream *s, hr_gpu_host_fn fn,
                        void *arg);

/* Finishes a device-to-pageable copy on the host, then frees the USM. */
typedef struct d2h_tail {
  ze_dev *d;
  void *usm;
  void *dst;
  size_t len;
} d2h_tail;

static void finish_d2h(void *arg) {
  d2h_tail *t = arg;
  ze_dev *d = t->d;
  memcpy(t->dst, t->usm, t->len);
  d->f.MemFree(d->ctx, t->usm);
  hr__mem_free(&d->mem, t);
}

/* Frees staging USM once the copy that read it has completed. */
static void free_usm(void *arg) {
  d2h_tail *t = arg;
  t->d->f.MemFree(t->d->ctx, t->usm);
  hr__mem_free(&t->d->mem, t);
}

static int ze_copy(void *dev, void *sp, const hr_gpu_mem_info *dst,
                   uint64_t dst_off, const hr_gpu_mem_info *src,
                   uint64_t src_off, uint64_t len) {
  ze_dev *d = dev;
  ze_stream *s = real_stream(sp);
  int dst_pg = dst->kind == HR_GPU_MEM_HOST;
  int src_pg = src->kind == HR_GPU_MEM_HOST;
  char *dp = (char *)(dst_pg ? dst->host_ptr : dst->device_ptr) + dst_off;
  const char *sp_ = (const char *)(src_pg ? src->host_ptr : src->device_ptr) +
                    src_off;
  d2h_tail *t = NULL;
  if (dst_pg || src_pg) {
    t = hr__mem_calloc(&d->mem, 1, sizeof *t);
    ze_host_mem_alloc_desc_t hd = {
        .stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC};
    if (!t || d->f.MemAllocHost(d->ctx, &hd, (size_t)len, 64, &t->usm) !=
                  ZE_RESULT_SUCCESS) {
      hr__mem_free(&d->mem, t);
      return HR_ERR_NOMEM;
    }
    t->d = d;
    t->len = (size_t)len;
    if (src_pg) { /* read the pageable source now, as CUDA does */
      memcpy(t->usm, sp_, (size_t)len);
      sp_ = t->usm;
    }
    if (dst_pg) {
      t->dst = dp;
      dp = t->usm;
    }
  }
  pthread_mutex_lock(&s->lk);
  int rv = map_err(
      d->f.AppendMemoryCopy(s->cl, dp, sp_, (size_t)len, NULL, 0, NULL));
  if (rv == 0)
    rv = barrier(d, s);
  pthread_mutex_unlock(&s->lk);
  if (t && rv == 0)
    rv = enqueue_host(d, s, t->dst ? finish_d2h : free_usm, t);
  else if (t) {
    d->f.MemFree(d->ctx, t->usm);
    hr__mem_free(&d->mem, t);
  }
  return rv;
}

static int enqueue_host(ze_dev *d, ze_stream *s, hr_gpu_host_fn fn,
                        void *arg) {
  ze_hostop *op = hr__mem_calloc(&d->mem, 1, sizeof *op);
  if (!op)
    return HR_ERR_NOMEM;
  int rv = evt_create(d, 0, &op->reached);
  if (rv == 0 && (rv = evt_create(d, 0, &op->gate)) != 0)
    evt_destroy(d, op->reached);
  if (rv != 0) {
    hr__mem_free(&d->mem, op);
    return rv;
  }
  op->fn = fn;
  op->arg = arg;
  pthread_mutex_lock(&s->lk);
  rv = map_err(d->f.AppendSignalEvent(s->cl, op->reached->ev));
  if (rv == 0)
    rv = map_err(d->f.AppendWaitOnEvents(s->cl, 1, &op->gate->ev));
  pthread_mutex_unlock(&s->lk);
  if (rv != 0) {
    /* Nothing waits on the gate: run the function on the host after the
     * stream's earlier work rather than lose it. */
    stream_sync_real(d, s);
    fn(arg);
    bury(d, op->reached);
    bury(d, op->gate);
    hr__mem_free(&d->mem, op);
    return rv;
  }
  pthread_mutex_lock(&d->mu);
  op->next = NULL;
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  return 0;
}

static int ze_host_fn(void *dev, void *sp, hr_gpu_host_fn fn, void *arg) {
  return enqueue_host(dev, real_stream(sp), fn, arg);
}

static void *ze_native(void *dev, int what, void *obj) {
  (void)dev;
  if (what == HR_GPU_OBJ_STREAM)
    return real_stream(obj)->cl;
  return real_event(obj)->ev;
}

/* Wrapping a vendor handle needs the library's object around it: a
 * stream is found among the device's streams by its command list; a
 * foreign event gets a wrapper that waits on it as recorded. */
static int ze_wrap_native(void *dev, int what, void *native, void **out) {
  ze_dev *d = dev;
  if (what == HR_GPU_OBJ_STREAM) {
    ze_stream *found = NULL;
    pthread_mutex_lock(&d->mu);
    for (ze_stream *s = d->streams; s; s = s->next)
      if ((void *)s->cl == native)
        found = s;
    pthread_mutex_unlock(&d->mu);
    if (!found)
      return HR_ERR_UNSUPPORTED;
    ze_stream *w = hr__mem_calloc(&d->mem, 1, sizeof *w);
    if (!w)
      return HR_ERR_NOMEM;
    w->d = d;
    w->target = found;
    *out = w;
    return 0;
  }
  ze_evt *w = hr__mem_calloc(&d->mem, 1, sizeof *w);
  if (!w)
    return HR_ERR_NOMEM;
  /* The vendor event is taken as recorded: it is handed over after its
   * signal was appended (ADR-018 § 4). */
  w->ev = native;
  w->recorded = 1;
  w->foreign = 1;
  *out = w;
  return 0;
}

static int ze_ipc_mem_export(void *dev, const hr_gpu_mem_info *m,
                             hr_gpu_ipc_handle *h) {
  ze_dev *d = dev;
  ze_ipc_mem_handle_t ih;
  int rv = map_err(d->f.MemGetIpcHandle(d->ctx, m->device_ptr, &ih));
  if (rv == 0)
    memcpy(h->bytes, &ih, sizeof ih);
  return rv;
}

static int ze_ipc_mem_import(void *dev, const hr_gpu_ipc_handle *h,
                             uint64_t size, hr_gpu_mem_info *out) {
  ze_dev *d = dev;
  (void)size;
  ze_ipc_mem_handle_t ih;
  memcpy(&ih, h->bytes, sizeof ih);
  void *p = NULL;
  int rv = map_err(d->f.MemOpenIpcHandle(d->ctx, d->dev, ih, 0, &p));
  if (rv == 0) {
    out->device_ptr = p;
    out->handle = (void *)&imported_tag;
  }
  return rv;
}

static int ze_ipc_event_export(void *dev, void *ep, hr_gpu_ipc_handle *h) {
  ze_dev *d = dev;
  ze_ipc_event_pool_handle_t ih;
  int rv = map_err(d->f.EventPoolGetIpcHandle(real_event(ep)->pool, &ih));
  if (rv == 0)
    memcpy(h->bytes, &ih, sizeof ih);
  return rv;
}

static int ze_ipc_event_import(void *dev, const hr_gpu_ipc_handle *h,
                               void **out) {
  ze_dev *d = dev;
  ze_ipc_event_pool_handle_t ih;
  memcpy(&ih, h->bytes, sizeof ih);
  ze_evt *e = hr__mem_calloc(&d->mem, 1, sizeof *e);
  if (!e)
    return HR_ERR_NOMEM;
  ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC,
                        .index = 0,
                        .signal = ZE_EVENT_SCOPE_FLAG_HOST,
                        .wait = ZE_EVENT_SCOPE_FLAG_HOST};
  int rv = map_err(d->f.EventPoolOpenIpcHandle(d->ctx, ih, &e->pool));
  if (rv == 0 && (rv = map_err(d->f.EventCreate(e->pool, &ed, &e->ev))) != 0)
    d->f.EventPoolCloseIpcHandle(e->pool);
  if (rv != 0) {
    hr__mem_free(&d->mem, e);
    return rv;
  }
  e->imported = 1;
  e->recorded = 1; /* the exporter records before it hands it over */
  *out = e;
  return 0;
}

const hr_gpu_ops hr__gpu_ze_ops = {
    .size = sizeof(hr_gpu_ops),
    .name = "ze",
    .device_tag = HR_DEV_LEVEL_ZERO,
    .probe = ze_probe,
    .open = ze_open,
    .close = ze_close,
    .query = ze_query,
    .mem_alloc = ze_mem_alloc,
    .mem_wrap_host = ze_mem_wrap_host,
    .mem_free = ze_mem_free,
    .mem_alloc_shareable = ze_mem_alloc_shareable,
    .ipc_mem_export_fd = ze_ipc_mem_export_fd,
    .ipc_mem_import_fd = ze_ipc_mem_import_fd,
    .stream_new = ze_stream_new,
    .stream_del = ze_stream_del,
    .stream_sync = ze_stream_sync,
    .event_new = ze_event_new,
    .event_del = ze_event_del,
    .event_record = ze_event_record,
    .stream_wait_event = ze_stream_wait_event,
    .event_query = ze_event_query,
    .event_sync = ze_event_sync,
    .copy = ze_copy,
    .host_fn = ze_host_fn,
    .native = ze_native,
    .wrap_native = ze_wrap_native,
    .ipc_mem_export = ze_ipc_mem_export,
    .ipc_mem_import = ze_ipc_mem_import,
    .ipc_event_export = ze_ipc_event_export,
    .ipc_event_import = ze_ipc_event_import,
};
