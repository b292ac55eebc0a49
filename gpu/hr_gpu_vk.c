/*
 * The "vulkan" backend: any Vulkan 1.2 device with timeline semaphores,
 * through libvulkan.so.1 loaded at run time (vulkan.h provides the types;
 * every entry point comes from vkGetInstanceProcAddr/vkGetDeviceProcAddr).
 *
 * Vulkan has queues, not streams, and a device may have a single queue
 * (Mesa's lavapipe has one).  A stream here is therefore a worker thread
 * that turns its operations into queue submissions, in order:
 *
 *  - every submission of a stream signals the stream's own timeline
 *    semaphore with the next value and waits for the previous one, so the
 *    stream's work executes in order and its memory effects are visible
 *    to what follows (semaphore waits are memory dependencies);
 *  - an event is a completion point (timeline semaphore, value): recording
 *    it captures the stream's last signalled value when the worker reaches
 *    the record;
 *  - waiting on an event adds (semaphore, value) to the waits of the
 *    stream's next submission: a device-side wait.  The worker first waits
 *    until the point has been captured, so the signal it waits for has
 *    always been submitted already: no wait-before-signal, which a single
 *    queue could not resolve;
 *  - host functions run on the worker once the stream's previous
 *    submissions (and pending waits) have completed.
 *
 * Copies are vkCmdCopyBuffer between VkBuffers.  Pinned memory is a
 * host-visible, host-coherent buffer kept mapped; device memory prefers a
 * DEVICE_LOCAL type and is mapped when that type is host-visible too (as
 * on integrated GPUs and lavapipe).  Wrapped pageable memory is staged
 * through a temporary host-visible buffer: a host-to-device copy reads its
 * source at enqueue time, a device-to-host copy is completed by the worker.
 *
 * IPC through a file descriptor (HR_GPU_CAP_IPC_FD): where the device has
 * VK_KHR_external_memory_fd and exports and imports opaque fds for
 * buffers, shareable memory is allocated exportable and its fd taken once
 * with vkGetMemoryFdKHR; an import allocates a buffer of the same size on
 * a duplicate of the received fd (Vulkan owns what it imports).  Mesa's
 * lavapipe has it (its opaque fd is a memfd), so this runs in CI.
 *
 * The queues of operations, their threads, the event points and the
 * stream counters are the worker-thread backends' shared ones
 * (hr_gpu_opq.c), guarded by one mutex and condition variable per device;
 * a second mutex serialises vkQueueSubmit (a VkQueue is externally
 * synchronised).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <hurray/wire.h>

#include "hr_gpu_opq.h"

/* ---- entry points ------------------------------------------------------ */

#define VK_GLOBAL_FNS(X) X(vkCreateInstance) X(vkEnumerateInstanceVersion)

#define VK_INSTANCE_FNS(X)                                                     \
  X(vkDestroyInstance)                                                         \
  X(vkEnumeratePhysicalDevices)                                                \
  X(vkGetPhysicalDeviceProperties)                                             \
  X(vkGetPhysicalDeviceFeatures2)                                              \
  X(vkGetPhysicalDeviceQueueFamilyProperties)                                  \
  X(vkGetPhysicalDeviceMemoryProperties)                                       \
  X(vkCreateDevice)                                                            \
  X(vkGetDeviceProcAddr)                                                       \
  X(vkEnumerateDeviceExtensionProperties)                                      \
  X(vkGetPhysicalDeviceExternalBufferProperties)

#define VK_DEVICE_FNS(X)                                                       \
  X(vkDestroyDevice)                                                           \
  X(vkGetDeviceQueue)                                                          \
  X(vkDeviceWaitIdle)                                                          \
  X(vkCreateBuffer)                                                            \
  X(vkDestroyBuffer)                                                           \
  X(vkGetBufferMemoryRequirements)                                             \
  X(vkAllocateMemory)                                                          \
  X(vkFreeMemory)                                                              \
  X(vkBindBufferMemory)                                                        \
  X(vkMapMemory)                                                               \
  X(vkUnmapMemory)                                                             \
  X(vkCreateCommandPool)                                                       \
  X(vkDestroyCommandPool)                                                      \
  X(vkAllocateCommandBuffers)                                                  \
  X(vkFreeCommandBuffers)                                                      \
  X(vkBeginCommandBuffer)                                                      \
  X(vkEndCommandBuffer)                                                        \
  X(vkCmdCopyBuffer)                                                           \
  X(vkQueueSubmit)                                                             \
  X(vkCreateSemaphore)                                                         \
  X(vkDestroySemaphore)                                                        \
  X(vkWaitSemaphores)                                                          \
  X(vkGetSemaphoreCounterValue)

#define DECL(name) PFN_##name name;
typedef struct vk_fns {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
  VK_GLOBAL_FNS(DECL)
  VK_INSTANCE_FNS(DECL)
  VK_DEVICE_FNS(DECL)
  PFN_vkGetMemoryFdKHR vkGetMemoryFdKHR; /* with external memory fds */
} vk_fns;
#undef DECL

/* ---- objects ----------------------------------------------------------- */

typedef struct vk_dev vk_dev;

/* One allocation (hr_gpu_mem_info.handle). */
typedef struct vk_mem {
  VkBuffer buf;         /* VK_NULL_HANDLE for wrapped host memory */
  VkDeviceMemory mem;
  void *map;            /* host mapping, or NULL */
  int has_fd;           /* shareable: `fd` is its exported opaque fd */
  int fd;
  int lazy;             /* CPU device memory: populated by the stream's
                           worker before each copy into it (exec_copy) */
} vk_mem;

/* A stream's timeline semaphore, shared with the event points recorded
 * on it and the waits that refer to it, so that it outlives them all
 * (a deleted stream's events stay valid, as in CUDA). */
typedef struct vk_tl {
  VkSemaphore sem;
  int refs; /* under d->q.mu */
} vk_tl;

/* A completion point: one recording of an event.  Once the record was
 * reached (base.reached), tl and value are known. */
typedef struct vk_point {
  hr__gpu_qpoint base;
  vk_tl *tl; /* a reference, once reached */
  uint64_t value;
} vk_point;

typedef struct vk_op {
  hr__gpu_qop base;
  VkBuffer dst, src;        /* COPY: device-side buffers */
  uint64_t dst_off, src_off, len;
  vk_mem *staging;          /* COPY: freed once the copy completed */
  void *host_dst;           /* COPY into wrapped memory: final memcpy */
  char *populate;           /* COPY into lazy memory: its range, made
                               resident by the worker first */
  char *hh_dst;             /* COPY host to host */
  const char *hh_src;
} vk_op;

/* Work submitted and not yet known complete. */
typedef struct vk_inflight {
  struct vk_inflight *next;
  uint64_t value;
  VkCommandBuffer cmd;
  vk_mem *staging;
} vk_inflight;

#define MAX_WAITS 16

typedef struct vk_stream {
  hr__gpu_qstream base; /* the queue, its thread; wrappers: their target */
  /* Worker-only state (no lock). */
  VkCommandPool pool;
  vk_tl *tl;
  uint64_t submitted; /* last value a submission will signal; under d->q.mu */
  vk_tl *wait_tl[MAX_WAITS]; /* references */
  uint64_t wait_val[MAX_WAITS];
  unsigned nwaits;
  vk_inflight *inflight;
  int failed; /* a submission failed: later syncs report HR_ERR_IO */
} vk_stream;

struct vk_dev {
  hr__gpu_opq q; /* first: the queue's callbacks cast it back */
  void *lib;
  vk_fns f;
  VkInstance inst;
  VkPhysicalDevice phys;
  VkDevice dev;
  VkQueue queue;
  uint32_t family;
  uint32_t type_device, type_host, type_unified; /* UINT32_MAX: none */
  int device_mapped; /* type_device is host-visible and coherent */
  int cpu_device;    /* a CPU implementation (lavapipe): memory is host's */
  int ipc_fd;        /* opaque-fd export and import of buffers */
  int ipc_dedicated; /* ... which need a dedicated allocation */
  char name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE];
  uint64_t total_memory;
  pthread_mutex_t qmu;
};

static const hr__gpu_opq_cbs vk_cbs;

static vk_dev *dev_of(vk_stream *s) { return (vk_dev *)(void *)s->base.q; }

static const char *const lib_names[] = {"libvulkan.so.1", "libvulkan.so",
                                        NULL};

/* ---- loading and device choice ---------------------------------------- */

static int load(vk_fns *f, void **lib, hr_gpu_probe_info *why) {
  static const hr__gpu_sym get[] = {
      HR__GPU_SYM(vk_fns, vkGetInstanceProcAddr, "vkGetInstanceProcAddr")};
  int rv = hr__gpu_load(lib_names, get, 1, f, lib, why);
  if (rv != 0)
    return rv;
#define GET(name)                                                              \
  f->name = (PFN_##name)f->vkGetInstanceProcAddr(VK_NULL_HANDLE, #name);     \
  if (!f->name)                                                                \
    return hr__gpu_unavailable(why, "vulkan: loader lacks " #name);
  VK_GLOBAL_FNS(GET)
#undef GET
  return 0;
}

static int make_instance(vk_fns *f, VkInstance *inst, hr_gpu_probe_info *why) {
  uint32_t ver = 0;
  if (f->vkEnumerateInstanceVersion(&ver) != VK_SUCCESS ||
      ver < VK_API_VERSION_1_2)
    return hr__gpu_unavailable(why, "vulkan: instance below 1.2");
  VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                           .pApplicationName = "libhurray",
                           .apiVersion = VK_API_VERSION_1_2};
  VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                             .pApplicationInfo = &app};
  VkResult r = f->vkCreateInstance(&ci, NULL, inst);
  if (r != VK_SUCCESS)
    return hr__gpu_unavailable(why, "vulkan: vkCreateInstance: %d", (int)r);
#define GET(name)                                                              \
  f->name = (PFN_##name)f->vkGetInstanceProcAddr(*inst, #name);              \
  if (!f->name)                                                                \
    return hr__gpu_unavailable(why, "vulkan: instance lacks " #name);
  VK_INSTANCE_FNS(GET)
#undef GET
  return 0;
}

/* A usable device: Vulkan 1.2, timeline semaphores, a transfer-capable
 * queue family (graphics and compute families are transfer-capable). */
static int usable(vk_fns *f, VkPhysicalDevice pd, uint32_t *family) {
  VkPhysicalDeviceProperties props;
  f->vkGetPhysicalDeviceProperties(pd, &props);
  if (props.apiVersion < VK_API_VERSION_1_2)
    return 0;
  VkPhysicalDeviceTimelineSemaphoreFeatures tf = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES};
  VkPhysicalDeviceFeatures2 f2 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &tf};
  f->vkGetPhysicalDeviceFeatures2(pd, &f2);
  if (!tf.timelineSemaphore)
    return 0;
  uint32_t n = 0;
  f->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
  VkQueueFamilyProperties qf[32];
  if (n > 32)
    n = 32;
  f->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, qf);
  /* Prefer a compute family (the "compute-capable queues"), then
   * anything that can transfer. */
  const VkQueueFlags want[] = {VK_QUEUE_COMPUTE_BIT,
                               VK_QUEUE_GRAPHICS_BIT | VK_QUEUE_TRANSFER_BIT};
  for (int w = 0; w < 2; w++)
    for (uint32_t i = 0; i < n; i++)
      if (qf[i].queueCount && (qf[i].queueFlags & want[w])) {
        *family = i;
        return 1;
      }
  return 0;
}

/* Lists the usable physical devices (at most `cap`). */
static uint32_t list_devices(vk_fns *f, VkInstance inst, VkPhysicalDevice *out,
                             uint32_t *families, uint32_t cap) {
  uint32_t n = 0;
  if (f->vkEnumeratePhysicalDevices(inst, &n, NULL) != VK_SUCCESS || !n)
    return 0;
  VkPhysicalDevice all[16];
  if (n > 16)
    n = 16;
  if (f->vkEnumeratePhysicalDevices(inst, &n, all) < 0)
    return 0;
  uint32_t k = 0;
  for (uint32_t i = 0; i < n && k < cap; i++) {
    uint32_t fam;
    if (usable(f, all[i], &fam)) {
      out[k] = all[i];
      families[k++] = fam;
    }
  }
  return k;
}

static int vk_probe(const hr_gpu_config *cfg, hr_gpu_probe_info *info) {
  (void)cfg;
  vk_fns f;
  void *lib;
  memset(&f, 0, sizeof f);
  int rv = load(&f, &lib, info);
  if (rv == 0) {
    VkInstance inst = VK_NULL_HANDLE;
    rv = make_instance(&f, &inst, info);
    if (rv == 0) {
      VkPhysicalDevice pd[16];
      uint32_t fam[16];
      info->device_count = list_devices(&f, inst, pd, fam, 16);
    }
    if (inst && f.vkDestroyInstance)
      f.vkDestroyInstance(inst, NULL);
  }
  if (lib)
    dlclose(lib);
  return rv;
}

/* Memory type with all of `want`, preferring those that also have
 * `prefer`; UINT32_MAX when none. */
static uint32_t find_type(const VkPhysicalDeviceMemoryProperties *mp,
                          uint32_t bits, VkMemoryPropertyFlags want,
                          VkMemoryPropertyFlags prefer) {
  uint32_t fallback = UINT32_MAX;
  for (uint32_t i = 0; i < mp->memoryTypeCount; i++) {
    VkMemoryPropertyFlags fl = mp->memoryTypes[i].propertyFlags;
    if (!(bits & (1u << i)) || (fl & want) != want)
      continue;
    if ((fl & prefer) == prefer)
      return i;
    if (fallback == UINT32_MAX)
      fallback = i;
  }
  return fallback;
}

#define HOST_FLAGS                                                             \
  (VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)

static void vk_close(void *dev);

#define BUF_USAGE                                                              \
  (VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |       \
   VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)
#define OPAQUE_FD VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT

/* Whether buffers can be exported and imported as opaque fds: the device
 * extension, and both features for our buffers' usage.  Sets d->ipc_fd. */
static int probe_ipc_fd(vk_dev *d) {
  uint32_t n = 0;
  if (d->f.vkEnumerateDeviceExtensionProperties(d->phys, NULL, &n, NULL) !=
          VK_SUCCESS ||
      n == 0 || n > 1024)
    return 0;
  VkExtensionProperties *ext = hr__mem_calloc(&d->q.mem, n, sizeof *ext);
  if (!ext)
    return 0;
  int have = 0;
  if (d->f.vkEnumerateDeviceExtensionProperties(d->phys, NULL, &n, ext) >= 0)
    for (uint32_t i = 0; i < n && !have; i++)
      have = strcmp(ext[i].extensionName,
                    VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME) == 0;
  hr__mem_free(&d->q.mem, ext);
  if (!have)
    return 0;
  VkPhysicalDeviceExternalBufferInfo bi = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_BUFFER_INFO,
      .usage = BUF_USAGE,
      .handleType = OPAQUE_FD};
  VkExternalBufferProperties bp = {
      .sType = VK_STRUCTURE_TYPE_EXTERNAL_BUFFER_PROPERTIES};
  d->f.vkGetPhysicalDeviceExternalBufferProperties(d->phys, &bi, &bp);
  VkExternalMemoryFeatureFlags ft =
      bp.externalMemoryProperties.externalMemoryFeatures;
  if (!(ft & VK_EXTERNAL_MEMORY_FEATURE_EXPORTABLE_BIT) ||
      !(ft & VK_EXTERNAL_MEMORY_FEATURE_IMPORTABLE_BIT))
    return 0;
  d->ipc_dedicated =
      (ft & VK_EXTERNAL_MEMORY_FEATURE_DEDICATED_ONLY_BIT) != 0;
  d->ipc_fd = 1;
  return 1;
}

static int vk_open(void **dev, const hr_gpu_config *cfg, const hr_mem *mem,
                   hr_gpu_probe_info *why) {
  vk_dev *d = hr__mem_calloc(mem, 1, sizeof *d);
  if (!d)
    return HR_ERR_NOMEM;
  if (hr__gpu_opq_init(&d->q, mem, &vk_cbs) != 0) {
    hr__mem_free(mem, d);
    return HR_ERR_IO;
  }
  pthread_mutex_init(&d->qmu, NULL);
  int rv = load(&d->f, &d->lib, why);
  if (rv == 0)
    rv = make_instance(&d->f, &d->inst, why);
  if (rv != 0)
    goto fail;
  VkPhysicalDevice pd[16];
  uint32_t fam[16];
  uint32_t n = list_devices(&d->f, d->inst, pd, fam, 16);
  if (cfg->ordinal >= n) {
    rv = hr__gpu_unavailable(why, "vulkan: no usable device %u (%u found)",
                             cfg->ordinal, n);
    goto fail;
  }
  d->phys = pd[cfg->ordinal];
  d->family = fam[cfg->ordinal];
  float prio = 1.0f;
  VkDeviceQueueCreateInfo qci = {
      .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
      .queueFamilyIndex = d->family,
      .queueCount = 1,
      .pQueuePriorities = &prio};
  VkPhysicalDeviceVulkan12Features f12 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
      .timelineSemaphore = VK_TRUE};
  VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                            .pNext = &f12,
                            .queueCreateInfoCount = 1,
                            .pQueueCreateInfos = &qci};
  const char *ext_fd = VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME;
  if (probe_ipc_fd(d)) {
    dci.enabledExtensionCount = 1;
    dci.ppEnabledExtensionNames = &ext_fd;
  }
  VkResult r = d->f.vkCreateDevice(d->phys, &dci, NULL, &d->dev);
  if (r != VK_SUCCESS) {
    rv = hr__gpu_unavailable(why, "vulkan: vkCreateDevice: %d", (int)r);
    goto fail;
  }
#define GET(name)                                                              \
  d->f.name = (PFN_##name)d->f.vkGetDeviceProcAddr(d->dev, #name);           \
  if (!d->f.name) {                                                            \
    rv = hr__gpu_unavailable(why, "vulkan: device lacks " #name);             \
    goto fail;                                                                 \
  }
  VK_DEVICE_FNS(GET)
#undef GET
  if (d->ipc_fd) {
    d->f.vkGetMemoryFdKHR =
        (PFN_vkGetMemoryFdKHR)d->f.vkGetDeviceProcAddr(d->dev,
                                                       "vkGetMemoryFdKHR");
    if (!d->f.vkGetMemoryFdKHR)
      d->ipc_fd = 0;
  }
  d->f.vkGetDeviceQueue(d->dev, d->family, 0, &d->queue);
  VkPhysicalDeviceProperties props;
  d->f.vkGetPhysicalDeviceProperties(d->phys, &props);
  hr__gpu_copy_name(d->name, sizeof d->name, props.deviceName);
  d->cpu_device = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  VkPhysicalDeviceMemoryProperties mp;
  d->f.vkGetPhysicalDeviceMemoryProperties(d->phys, &mp);
  d->type_device = find_type(&mp, ~0u, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
  d->type_host = find_type(&mp, ~0u, HOST_FLAGS,
                           VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  d->type_unified =
      find_type(&mp, ~0u, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | HOST_FLAGS, 0);
  if (d->type_device == UINT32_MAX)
    d->type_device = d->type_host;
  if (d->type_device == UINT32_MAX || d->type_host == UINT32_MAX) {
    rv = hr__gpu_unavailable(why, "vulkan: no usable memory types");
    goto fail;
  }
  d->device_mapped =
      (mp.memoryTypes[d->type_device].propertyFlags & HOST_FLAGS) ==
      HOST_FLAGS;
  for (uint32_t i = 0; i < mp.memoryHeapCount; i++)
    if (mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      d->total_memory += mp.memoryHeaps[i].size;
  *dev = d;
  return 0;
fail:
  vk_close(d);
  return rv;
}

static void vk_close(void *dev) {
  vk_dev *d = dev;
  if (d->dev) {
    d->f.vkDeviceWaitIdle(d->dev);
    d->f.vkDestroyDevice(d->dev, NULL);
  }
  if (d->inst)
    d->f.vkDestroyInstance(d->inst, NULL);
  if (d->lib)
    dlclose(d->lib);
  pthread_mutex_destroy(&d->qmu);
  hr__gpu_opq_fini(&d->q);
  hr_mem mem = d->q.mem;
  hr__mem_free(&mem, d);
}

static int vk_query(void *dev, hr_gpu_caps *caps) {
  vk_dev *d = dev;
  caps->flags = HR_GPU_CAP_ASYNC | HR_GPU_CAP_PINNED |
                (d->type_unified != UINT32_MAX ? HR_GPU_CAP_UNIFIED : 0) |
                (d->device_mapped ? HR_GPU_CAP_HOST_MAPPED : 0) |
                (d->ipc_fd ? HR_GPU_CAP_IPC_FD : 0);
  caps->total_memory = d->total_memory;
  hr__gpu_copy_name(caps->name, sizeof caps->name, d->name);
  return 0;
}

/* ---- memory ------------------------------------------------------------ */

static void mem_destroy(vk_dev *d, vk_mem *m) {
  if (!m)
    return;
  if (m->map)
    d->f.vkUnmapMemory(d->dev, m->mem);
  if (m->buf)
    d->f.vkDestroyBuffer(d->dev, m->buf, NULL);
  if (m->mem)
    d->f.vkFreeMemory(d->dev, m->mem, NULL);
  if (m->has_fd)
    close(m->fd);
  hr__mem_free(&d->q.mem, m);
}

/* External memory of an allocation: none, exportable as an opaque fd,
 * or imported from one. */
enum { EXT_NONE = 0, EXT_EXPORT, EXT_IMPORT };

/* A buffer of `size` bytes in memory type `type`, mapped when `map`;
 * `ext` as above (`import_fd` for EXT_IMPORT: not taken).  `lazy`: on a
 * CPU device, populated by the copies into it, not here. */
static int mem_create_ext(vk_dev *d, uint32_t type, int map, int lazy,
                          uint64_t size, int ext, int import_fd,
                          vk_mem **out) {
  vk_mem *m = hr__mem_calloc(&d->q.mem, 1, sizeof *m);
  if (!m)
    return HR_ERR_NOMEM;
  VkExternalMemoryBufferCreateInfo ebci = {
      .sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
      .handleTypes = OPAQUE_FD};
  VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                            .pNext = ext ? &ebci : NULL,
                            .size = size,
                            .usage = BUF_USAGE,
                            .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
  int rv = HR_ERR_NOMEM;
  if (d->f.vkCreateBuffer(d->dev, &bci, NULL, &m->buf) != VK_SUCCESS)
    goto fail;
  VkMemoryRequirements req;
  d->f.vkGetBufferMemoryRequirements(d->dev, m->buf, &req);
  if (!(req.memoryTypeBits & (1u << type))) {
    rv = HR_ERR_UNSUPPORTED;
    goto fail;
  }
  VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                              .allocationSize = req.size,
                              .memoryTypeIndex = type};
  VkMemoryDedicatedAllocateInfo ded = {
      .sType = VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO,
      .buffer = m->buf};
  VkExportMemoryAllocateInfo exp = {
      .sType = VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO,
      .pNext = d->ipc_dedicated ? &ded : NULL,
      .handleTypes = OPAQUE_FD};
  VkImportMemoryFdInfoKHR imp = {
      .sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR,
      .pNext = d->ipc_dedicated ? &ded : NULL,
      .handleType = OPAQUE_FD,
      .fd = -1};
  if (ext == EXT_EXPORT)
    mai.pNext = &exp;
  if (ext == EXT_IMPORT) {
    /* The driver's opaque handle cannot be inspected; where it is a
     * plain file (lavapipe's memfd) it must at least hold the
     * allocation, or touching the memory would fault. */
    struct stat sb;
    if (fstat(import_fd, &sb) != 0 ||
        (S_ISREG(sb.st_mode) &&
         (sb.st_size < 0 || (uint64_t)sb.st_size < req.size)) ||
        S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode) || S_ISDIR(sb.st_mode)) {
      rv = HR_ERR_PROTO;
      goto fail;
    }
    imp.fd = fcntl(import_fd, F_DUPFD_CLOEXEC, 0);
    if (imp.fd < 0)
      goto fail;
    mai.pNext = &imp;
  }
  VkResult ar = d->f.vkAllocateMemory(d->dev, &mai, NULL, &m->mem);
  if (ar != VK_SUCCESS) {
    /* A failed import leaves the descriptor ours to close. */
    if (imp.fd >= 0)
      close(imp.fd);
    if (ext == EXT_IMPORT && ar == VK_ERROR_INVALID_EXTERNAL_HANDLE)
      rv = HR_ERR_PROTO;
    goto fail;
  }
  if (ext == EXT_EXPORT) {
    VkMemoryGetFdInfoKHR gi = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR,
        .memory = m->mem,
        .handleType = OPAQUE_FD};
    int fd = -1;
    if (d->f.vkGetMemoryFdKHR(d->dev, &gi, &fd) != VK_SUCCESS || fd < 0) {
      rv = HR_ERR_IO;
      goto fail;
    }
    m->fd = fd;
    m->has_fd = 1;
  }
  rv = HR_ERR_IO;
  if (d->f.vkBindBufferMemory(d->dev, m->buf, m->mem, 0) != VK_SUCCESS)
    goto fail;
  if (map && d->f.vkMapMemory(d->dev, m->mem, 0, VK_WHOLE_SIZE, 0, &m->map) !=
                 VK_SUCCESS)
    goto fail;
  /* A CPU device's memory is host memory: huge pages, and resident
   * before the device touches it (now, or for device memory that only
   * copies write, on the stream's worker before each copy: mem_alloc). */
  if (d->cpu_device && m->map)
    hr__gpu_advise_huge(m->map, size);
  if (d->cpu_device && m->map && !lazy)
    hr__gpu_populate(m->map, size);
  m->lazy = d->cpu_device && m->map && lazy;
  *out = m;
  return 0;
fail:
  mem_destroy(d, m);
  return rv;
}

static int mem_create(vk_dev *d, uint32_t type, int map, uint64_t size,
                      vk_mem **out) {
  return mem_create_ext(d, type, map, 0, size, EXT_NONE, -1, out);
}

static int vk_mem_alloc_shareable(void *dev, uint64_t size,
                                  hr_gpu_mem_info *out) {
  vk_dev *d = dev;
  vk_mem *m;
  int rv = mem_create_ext(d, d->type_device, d->device_mapped, 0, size,
                          EXT_EXPORT, -1, &m);
  if (rv != 0)
    return rv;
  out->handle = m;
  out->host_ptr = m->map;
  out->native = (void *)(uintptr_t)m->buf;
  return 0;
}

static int vk_ipc_mem_export_fd(void *dev, const hr_gpu_mem_info *m,
                                int *fd) {
  (void)dev;
  const vk_mem *vm = m->handle;
  if (!vm || !vm->has_fd)
    return HR_ERR_UNSUPPORTED;
  *fd = vm->fd;
  return 0;
}

static int vk_ipc_mem_import_fd(void *dev, int fd, uint64_t size,
                                hr_gpu_mem_info *out) {
  vk_dev *d = dev;
  vk_mem *m;
  int rv = mem_create_ext(d, d->type_device, d->device_mapped, 0, size,
                          EXT_IMPORT, fd, &m);
  if (rv != 0)
    return rv;
  out->handle = m;
  out->host_ptr = m->map;
  out->native = (void *)(uintptr_t)m->buf;
  return 0;
}

static int vk_mem_alloc(void *dev, int kind, uint64_t size,
                        hr_gpu_mem_info *out) {
  vk_dev *d = dev;
  uint32_t type = kind == HR_GPU_MEM_PINNED    ? d->type_host
                  : kind == HR_GPU_MEM_UNIFIED ? d->type_unified
                                               : d->type_device;
  int map = kind != HR_GPU_MEM_DEVICE || d->device_mapped;
  vk_mem *m;
  int rv = mem_create_ext(d, type, map, kind == HR_GPU_MEM_DEVICE, size,
                          EXT_NONE, -1, &m);
  if (rv != 0)
    return rv;
  out->handle = m;
  out->host_ptr = m->map;
  out->native = (void *)(uintptr_t)m->buf;
  return 0;
}

static int vk_mem_wrap_host(void *dev, void *ptr, uint64_t size,
                            hr_gpu_mem_info *out) {
  (void)dev;
  (void)size;
  out->handle = NULL; /* staged per copy */
  out->host_ptr = ptr;
  return 0;
}

static void vk_mem_free(void *dev, const hr_gpu_mem_info *m) {
  mem_destroy(dev, m->handle);
}

/* ---- the stream worker --------------------------------------------------- */

/* Drops a timeline reference; d->q.mu held.  The last one destroys the
 * semaphore once no submitted batch can still wait for it. */
static void tl_unref(vk_dev *d, vk_tl *t) {
  if (!t || --t->refs > 0)
    return;
  pthread_mutex_lock(&d->qmu);
  d->f.vkDeviceWaitIdle(d->dev);
  pthread_mutex_unlock(&d->qmu);
  d->f.vkDestroySemaphore(d->dev, t->sem, NULL);
  hr__mem_free(&d->q.mem, t);
}

/* A point goes: its timeline reference with it; d->q.mu held. */
static void point_fini(hr__gpu_opq *q, hr__gpu_qpoint *p) {
  tl_unref((vk_dev *)(void *)q, ((vk_point *)(void *)p)->tl);
}

/* Frees what completed submissions held.  Worker only. */
static void reap(vk_stream *s, int all) {
  vk_dev *d = dev_of(s);
  uint64_t done = UINT64_MAX;
  if (!all && d->f.vkGetSemaphoreCounterValue(d->dev, s->tl->sem, &done) !=
                  VK_SUCCESS)
    return;
  vk_inflight **pp = &s->inflight;
  while (*pp) {
    vk_inflight *x = *pp;
    if (x->value <= done) {
      *pp = x->next;
      if (x->cmd)
        d->f.vkFreeCommandBuffers(d->dev, s->pool, 1, &x->cmd);
      mem_destroy(d, x->staging);
      hr__mem_free(&d->q.mem, x);
    } else {
      pp = &x->next;
    }
  }
}

/* Host-waits for a timeline value. */
static int wait_value(vk_dev *d, VkSemaphore sem, uint64_t v) {
  if (v == 0)
    return 0;
  VkSemaphoreWaitInfo wi = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
                            .semaphoreCount = 1,
                            .pSemaphores = &sem,
                            .pValues = &v};
  return d->f.vkWaitSemaphores(d->dev, &wi, UINT64_MAX) == VK_SUCCESS
             ? 0
             : HR_ERR_IO;
}

/* Forgets the pending waits (submitted or drained); worker only. */
static void drop_waits(vk_stream *s) {
  vk_dev *d = dev_of(s);
  pthread_mutex_lock(&d->q.mu);
  for (unsigned i = 0; i < s->nwaits; i++)
    tl_unref(d, s->wait_tl[i]);
  pthread_mutex_unlock(&d->q.mu);
  s->nwaits = 0;
}

/*
 * Submits `cmd` (may be VK_NULL_HANDLE: a batch of waits and the signal
 * only) after the stream's previous submission and its pending waits,
 * signalling the next value.  Worker only; takes d->q.mu to publish the
 * value.  `staging` is freed once the submission completed.
 */
static int submit(vk_stream *s, VkCommandBuffer cmd, vk_mem *staging) {
  vk_dev *d = dev_of(s);
  VkSemaphore sems[MAX_WAITS + 1];
  uint64_t vals[MAX_WAITS + 1];
  VkPipelineStageFlags stages[MAX_WAITS + 1];
  uint32_t n = 0;
  pthread_mutex_lock(&d->q.mu);
  uint64_t prev = s->submitted;
  pthread_mutex_unlock(&d->q.mu);
  if (prev) {
    sems[n] = s->tl->sem;
    vals[n++] = prev;
  }
  for (unsigned i = 0; i < s->nwaits; i++) {
    sems[n] = s->wait_tl[i]->sem;
    vals[n++] = s->wait_val[i];
  }
  for (uint32_t i = 0; i < n; i++)
    stages[i] = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
  uint64_t next = prev + 1;
  VkTimelineSemaphoreSubmitInfo ts = {
      .sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
      .waitSemaphoreValueCount = n,
      .pWaitSemaphoreValues = vals,
      .signalSemaphoreValueCount = 1,
      .pSignalSemaphoreValues = &next};
  VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                     .pNext = &ts,
                     .waitSemaphoreCount = n,
                     .pWaitSemaphores = sems,
                     .pWaitDstStageMask = stages,
                     .commandBufferCount = cmd ? 1 : 0,
                     .pCommandBuffers = cmd ? &cmd : NULL,
                     .signalSemaphoreCount = 1,
                     .pSignalSemaphores = &s->tl->sem};
  vk_inflight *x = hr__mem_calloc(&d->q.mem, 1, sizeof *x);
  if (!x)
    return HR_ERR_NOMEM;
  pthread_mutex_lock(&d->qmu);
  VkResult r = d->f.vkQueueSubmit(d->queue, 1, &si, VK_NULL_HANDLE);
  pthread_mutex_unlock(&d->qmu);
  if (r != VK_SUCCESS) {
    hr__mem_free(&d->q.mem, x);
    return HR_ERR_IO;
  }
  drop_waits(s);
  x->value = next;
  x->cmd = cmd;
  x->staging = staging;
  x->next = s->inflight;
  s->inflight = x;
  pthread_mutex_lock(&d->q.mu);
  s->submitted = next;
  pthread_mutex_unlock(&d->q.mu);
  reap(s, 0);
  return 0;
}

/* Host-waits for everything the stream submitted and every pending wait:
 * what a host function or a host-side copy needs before it runs. */
static int drain(vk_stream *s) {
  vk_dev *d = dev_of(s);
  int rv = 0;
  for (unsigned i = 0; i < s->nwaits && rv == 0; i++)
    rv = wait_value(d, s->wait_tl[i]->sem, s->wait_val[i]);
  drop_waits(s);
  pthread_mutex_lock(&d->q.mu);
  uint64_t v = s->submitted;
  pthread_mutex_unlock(&d->q.mu);
  return rv ? rv : wait_value(d, s->tl->sem, v);
}

static int exec_copy(vk_stream *s, vk_op *op) {
  vk_dev *d = dev_of(s);
  if (op->hh_dst) { /* host to host: in stream order, on the host */
    int rv = drain(s);
    if (rv == 0)
      memmove(op->hh_dst, op->hh_src, (size_t)op->len);
    return rv;
  }
  if (op->populate)
    hr__gpu_populate(op->populate, op->len);
  VkCommandBufferAllocateInfo ai = {
      .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
      .commandPool = s->pool,
      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
      .commandBufferCount = 1};
  VkCommandBuffer cmd;
  if (d->f.vkAllocateCommandBuffers(d->dev, &ai, &cmd) != VK_SUCCESS)
    return HR_ERR_NOMEM;
  VkCommandBufferBeginInfo bi = {
      .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
      .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
  VkBufferCopy region = {op->src_off, op->dst_off, op->len};
  if (d->f.vkBeginCommandBuffer(cmd, &bi) != VK_SUCCESS)
    goto io;
  d->f.vkCmdCopyBuffer(cmd, op->src, op->dst, 1, &region);
  if (d->f.vkEndCommandBuffer(cmd) != VK_SUCCESS)
    goto io;
  /* A copy into wrapped host memory completes here, on the worker: the
   * staging buffer stays ours until the memcpy is done. */
  vk_mem *st = op->host_dst ? NULL : op->staging;
  int rv = submit(s, cmd, st);
  if (rv != 0)
    goto fail;
  if (op->host_dst) {
    rv = drain(s);
    if (rv == 0)
      memcpy(op->host_dst, op->staging->map, (size_t)op->len);
    mem_destroy(d, op->staging);
  }
  op->staging = NULL;
  return rv;
io:
  rv = HR_ERR_IO;
fail:
  d->f.vkFreeCommandBuffers(d->dev, s->pool, 1, &cmd);
  return rv;
}

/* Processes one op; d->q.mu is held on entry and exit. */
static void exec_op(hr__gpu_qstream *qs, hr__gpu_qop *qop) {
  vk_stream *s = (vk_stream *)(void *)qs;
  vk_op *op = (vk_op *)(void *)qop;
  vk_point *pt = (vk_point *)(void *)qop->point;
  vk_dev *d = dev_of(s);
  int rv = 0;
  switch (qop->kind) {
  case HR__GPU_OP_WAIT:
    /* Wait until the producer's worker has reached the record: its
     * signal has been submitted, so a device-side wait is safe. */
    hr__gpu_opq_point_wait_locked(&d->q, &pt->base);
    if (pt->value && pt->tl != s->tl) {
      vk_tl *t = pt->tl;
      uint64_t v = pt->value;
      t->refs++;
      pthread_mutex_unlock(&d->q.mu);
      if (s->nwaits == MAX_WAITS)
        rv = submit(s, VK_NULL_HANDLE, NULL);
      if (s->nwaits < MAX_WAITS) {
        s->wait_tl[s->nwaits] = t;
        s->wait_val[s->nwaits++] = v;
        t = NULL;
      }
      pthread_mutex_lock(&d->q.mu);
      tl_unref(d, t); /* only when the flush failed */
    }
    break;
  case HR__GPU_OP_RECORD:
    pthread_mutex_unlock(&d->q.mu);
    /* Pending waits belong to the recorded point: flush them into an
     * empty batch so that the captured value covers them. */
    if (s->nwaits)
      rv = submit(s, VK_NULL_HANDLE, NULL);
    pthread_mutex_lock(&d->q.mu);
    pt->tl = s->tl;
    s->tl->refs++;
    pt->value = s->submitted;
    pt->base.reached = 1;
    break;
  case HR__GPU_OP_COPY:
    pthread_mutex_unlock(&d->q.mu);
    rv = exec_copy(s, op);
    pthread_mutex_lock(&d->q.mu);
    break;
  default: /* HR__GPU_OP_HOST_FN */
    pthread_mutex_unlock(&d->q.mu);
    rv = drain(s);
    /* A failed drain still runs the function: a caller may depend on
     * it (a release, a wakeup); the failure is reported by the next
     * sync. */
    qop->fn(qop->arg);
    pthread_mutex_lock(&d->q.mu);
    break;
  }
  if (rv != 0)
    s->failed = 1;
}

/* A copy's staging buffer, unless exec_copy handed it on; d->q.mu held. */
static void op_fini(hr__gpu_qstream *qs, hr__gpu_qop *qop) {
  vk_dev *d = dev_of((vk_stream *)(void *)qs);
  vk_op *op = (vk_op *)(void *)qop;
  if (op->staging) {
    pthread_mutex_unlock(&d->q.mu);
    mem_destroy(d, op->staging);
    pthread_mutex_lock(&d->q.mu);
  }
}

static const hr__gpu_opq_cbs vk_cbs = {
    .stream_size = sizeof(vk_stream),
    .op_size = sizeof(vk_op),
    .point_size = sizeof(vk_point),
    .exec = exec_op,
    .op_fini = op_fini,
    .point_fini = point_fini,
};

/* ---- stream ops ---------------------------------------------------------- */

static int vk_stream_new(void *dev, void **out) {
  vk_dev *d = dev;
  vk_stream *s = hr__mem_calloc(&d->q.mem, 1, sizeof *s);
  if (!s)
    return HR_ERR_NOMEM;
  VkCommandPoolCreateInfo pci = {
      .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
      .flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT |
               VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
      .queueFamilyIndex = d->family};
  VkSemaphoreTypeCreateInfo tci = {
      .sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
      .semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE,
      .initialValue = 0};
  VkSemaphoreCreateInfo sci = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO,
                               .pNext = &tci};
  if (d->f.vkCreateCommandPool(d->dev, &pci, NULL, &s->pool) != VK_SUCCESS)
    goto fail;
  s->tl = hr__mem_calloc(&d->q.mem, 1, sizeof *s->tl);
  if (!s->tl)
    goto fail;
  s->tl->refs = 1;
  if (d->f.vkCreateSemaphore(d->dev, &sci, NULL, &s->tl->sem) != VK_SUCCESS)
    goto fail;
  if (hr__gpu_opq_stream_start(&d->q, &s->base) != 0)
    goto fail;
  *out = s;
  return 0;
fail:
  if (s->tl && s->tl->sem)
    d->f.vkDestroySemaphore(d->dev, s->tl->sem, NULL);
  hr__mem_free(&d->q.mem, s->tl);
  if (s->pool)
    d->f.vkDestroyCommandPool(d->dev, s->pool, NULL);
  hr__mem_free(&d->q.mem, s);
  return HR_ERR_IO;
}

static int vk_stream_sync(void *dev, void *sp) {
  vk_dev *d = dev;
  vk_stream *s = (vk_stream *)(void *)hr__gpu_opq_stream_real(sp);
  pthread_mutex_lock(&d->q.mu);
  hr__gpu_opq_stream_idle_locked(&s->base);
  uint64_t v = s->submitted;
  int failed = s->failed;
  pthread_mutex_unlock(&d->q.mu);
  int rv = wait_value(d, s->tl->sem, v);
  return failed ? HR_ERR_IO : rv;
}

static void vk_stream_del(void *dev, void *sp) {
  vk_dev *d = dev;
  vk_stream *s = sp;
  if (!s->base.target) {
    vk_stream_sync(d, s);
    hr__gpu_opq_stream_stop(&s->base);
    reap(s, 1);
    d->f.vkDestroyCommandPool(d->dev, s->pool, NULL);
    pthread_mutex_lock(&d->q.mu);
    tl_unref(d, s->tl); /* events recorded here may keep it */
    pthread_mutex_unlock(&d->q.mu);
  }
  hr__mem_free(&d->q.mem, s);
}

static int vk_event_query(void *dev, void *ep) {
  vk_dev *d = dev;
  hr__gpu_qevent *e = hr__gpu_opq_event_real(ep);
  pthread_mutex_lock(&d->q.mu);
  vk_point *p = (vk_point *)(void *)e->last;
  int rv = 0;
  if (p && !p->base.reached) {
    rv = HR_ERR_WOULDBLOCK;
  } else if (p && p->value) {
    /* Under the lock: the point keeps its timeline alive. */
    uint64_t now;
    if (d->f.vkGetSemaphoreCounterValue(d->dev, p->tl->sem, &now) !=
        VK_SUCCESS)
      rv = HR_ERR_IO;
    else if (now < p->value)
      rv = HR_ERR_WOULDBLOCK;
  }
  pthread_mutex_unlock(&d->q.mu);
  return rv;
}

static int vk_event_sync(void *dev, void *ep) {
  vk_dev *d = dev;
  vk_point *p = (vk_point *)(void *)hr__gpu_opq_event_reach(&d->q, ep);
  if (!p)
    return 0;
  /* Our reference keeps the point, hence its timeline, alive. */
  int rv = wait_value(d, p->value ? p->tl->sem : VK_NULL_HANDLE, p->value);
  pthread_mutex_lock(&d->q.mu);
  hr__gpu_opq_point_unref_locked(&d->q, &p->base);
  pthread_mutex_unlock(&d->q.mu);
  return rv;
}

static int vk_copy(void *dev, void *sp, const hr_gpu_mem_info *dst,
                   uint64_t dst_off, const hr_gpu_mem_info *src,
                   uint64_t src_off, uint64_t len) {
  vk_dev *d = dev;
  vk_op *op = (vk_op *)(void *)hr__gpu_opq_op_new(&d->q, HR__GPU_OP_COPY);
  if (!op)
    return HR_ERR_NOMEM;
  vk_mem *dm = dst->handle, *sm = src->handle;
  op->len = len;
  if (dm && dm->lazy)
    op->populate = (char *)dm->map + dst_off;
  if (!dm && !sm) {
    op->hh_dst = (char *)dst->host_ptr + dst_off;
    op->hh_src = (const char *)src->host_ptr + src_off;
    hr__gpu_opq_push(&d->q, sp, &op->base);
    return 0;
  }
  op->dst_off = dst_off;
  op->src_off = src_off;
  if (!sm || !dm) {
    int rv = mem_create(d, d->type_host, 1, len, &op->staging);
    if (rv != 0) {
      hr__mem_free(&d->q.mem, op);
      return rv;
    }
  }
  if (!sm) {
    /* Pageable source: read now, as CUDA does for pageable memory. */
    memcpy(op->staging->map, (const char *)src->host_ptr + src_off,
           (size_t)len);
    op->src = op->staging->buf;
    op->src_off = 0;
  } else {
    op->src = sm->buf;
  }
  if (!dm) {
    op->dst = op->staging->buf;
    op->dst_off = 0;
    op->host_dst = (char *)dst->host_ptr + dst_off;
  } else {
    op->dst = dm->buf;
  }
  hr__gpu_opq_push(&d->q, sp, &op->base);
  return 0;
}

const hr_gpu_ops hr__gpu_vk_ops = {
    .size = sizeof(hr_gpu_ops),
    .name = "vulkan",
    .device_tag = HR_DEV_VULKAN,
    .probe = vk_probe,
    .open = vk_open,
    .close = vk_close,
    .query = vk_query,
    .mem_alloc = vk_mem_alloc,
    .mem_wrap_host = vk_mem_wrap_host,
    .mem_free = vk_mem_free,
    .stream_new = vk_stream_new,
    .stream_del = vk_stream_del,
    .stream_sync = vk_stream_sync,
    .event_new = hr__gpu_opq_event_new,
    .event_del = hr__gpu_opq_event_del,
    .event_record = hr__gpu_opq_event_record,
    .stream_wait_event = hr__gpu_opq_stream_wait_event,
    .event_query = vk_event_query,
    .event_sync = vk_event_sync,
    .copy = vk_copy,
    .host_fn = hr__gpu_opq_host_fn,
    .native = hr__gpu_opq_native,
    .wrap_native = hr__gpu_opq_wrap_native,
    .mem_alloc_shareable = vk_mem_alloc_shareable,
    .ipc_mem_export_fd = vk_ipc_mem_export_fd,
    .ipc_mem_import_fd = vk_ipc_mem_import_fd,
};
