/*
 * libhurray: the device layer (gpu/).
 *
 * One device interface, several backends chosen at run time:
 *
 *   "cpu"     host memory; every operation runs at once on the caller's
 *             thread; events are signalled as soon as they are recorded.
 *   "sim"     a simulated asynchronous device, always built: streams are
 *             worker threads executing queued operations with a
 *             configurable delay, events are completion points, and a
 *             stream that waits on an event really waits.  It makes the
 *             ADR-018 contract testable on a machine without a GPU.
 *   "cuda"    NVIDIA, through the driver API of libcuda.so.1.
 *   "hip"     AMD ROCm, through libamdhip64.so.
 *   "ze"      oneAPI Level Zero, through libze_loader.so.1.
 *   "vulkan"  any Vulkan 1.2 device, through libvulkan.so.1 (buffers,
 *             vkCmdCopyBuffer, timeline semaphores as events).
 *
 * A vendor backend is compiled in when its headers were found at build
 * time and resolves the driver's symbols with dlopen()/dlsym() when a
 * device is opened, so the library has no link-time dependency on any
 * driver: one build runs on machines with or without each driver, and
 * hr_gpu_probe()/hr_gpu_open() report "unavailable" (HR_ERR_UNSUPPORTED
 * with a reason) where the driver or a device is missing.
 *
 * Model (the CUDA one, which every backend provides):
 *  - an hr_gpu is one opened device (backend + ordinal);
 *  - memory is an hr_gpu_buf: device memory, pinned (page-locked, host
 *    and device accessible) host memory, unified (managed) memory, or
 *    ordinary host memory wrapped so that it can take part in copies;
 *  - a stream executes the operations enqueued on it in order, and
 *    asynchronously with respect to the host and to other streams;
 *  - an event records a completion point of a stream: a stream can wait
 *    for it (device-side ordering, the host is not blocked), the host can
 *    query it or wait for it;
 *  - a host function enqueued on a stream runs on some thread once all
 *    earlier work of the stream is complete, and later work of the stream
 *    waits for it to return.  It is what an engine uses to learn, without
 *    polling, that a staging copy landed: hr_gpu_stream_notify_fd() writes
 *    an eventfd from one (see "Engine integration" below).
 *
 * Thread safety: an hr_gpu and its objects may be used from several
 * threads at once, except that one stream must not be enqueued on from two
 * threads at the same time (the order of its operations would be
 * undefined) and an object must not be deleted while another thread uses
 * it.  Host functions must not call into the hr_gpu whose stream runs
 * them (CUDA forbids driver calls there; the rule is kept for all
 * backends).
 *
 * Errors.  Every fallible call returns HR_ERR_INVALID_ARGUMENT for a NULL
 * object or out pointer.  Where a call lists HR_ERR_IO for a failure of
 * the driver, the vendor backends report the driver's out-of-memory,
 * not-supported and invalid-value/handle errors as HR_ERR_NOMEM,
 * HR_ERR_UNSUPPORTED and HR_ERR_INVALID_ARGUMENT instead.  Objects made by
 * a _new() call are the caller's until their _del(); on failure *out is
 * not written.
 *
 * Engine integration.  To send a device buffer over a network transport,
 * the engine copies it into pinned host memory with hr_gpu_copy_async()
 * (or the chunked hr_gpu_stager below), then asks to be woken when the copy
 * has landed: hr_gpu_stream_notify_fd(stream, efd) enqueues a host
 * function that adds 1 to the eventfd `efd`, which the engine's loop
 * watches like any other fd; or hr_gpu_launch_host_fn() with its own
 * callback.  Received bytes go the other way (pinned slot -> device).  The
 * pinned memory is then producer-synced (ADR-018 P1) for the network.
 */
#ifndef HURRAY_GPU_H
#define HURRAY_GPU_H

#include <hurray/common.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_gpu hr_gpu;
typedef struct hr_gpu_buf hr_gpu_buf;
typedef struct hr_gpu_stream hr_gpu_stream;
typedef struct hr_gpu_event hr_gpu_event;

/* The device_tag the simulated device writes in buffer handles: the first
 * value of the wire's extension range (0xF0-0xFE, agreed out of band), so
 * that no real driver takes a simulated buffer for its own. */
#define HR_GPU_DEV_SIM 0xF0

/* Kinds of memory (hr_gpu_buf_alloc); the first three map value for value
 * onto the wire's memory_class (STANDARD, PINNED, UNIFIED). */
enum hr_gpu_mem_kind {
  HR_GPU_MEM_DEVICE = 0,  /* ordinary device memory */
  HR_GPU_MEM_PINNED = 1,  /* page-locked host memory the device can reach */
  HR_GPU_MEM_UNIFIED = 2, /* managed memory, migrated on demand */
  HR_GPU_MEM_HOST = 3     /* pageable host memory (hr_gpu_buf_wrap_host) */
};

/* Capability flags (hr_gpu_caps.flags). */
#define HR_GPU_CAP_ASYNC (1u << 0)     /* streams run asynchronously */
#define HR_GPU_CAP_PINNED (1u << 1)    /* HR_GPU_MEM_PINNED allocations */
#define HR_GPU_CAP_UNIFIED (1u << 2)   /* HR_GPU_MEM_UNIFIED allocations */
#define HR_GPU_CAP_IPC_MEM (1u << 3)   /* memory can be exported to another
                                          process */
#define HR_GPU_CAP_IPC_EVENT (1u << 4) /* events can be exported (ADR-018
                                          P2 over IPC) */
#define HR_GPU_CAP_IPC_STREAM (1u << 5) /* streams can be exported (P3 over
                                           IPC); no backend has it yet */
#define HR_GPU_CAP_DEVICE_PTR (1u << 6) /* buffers have a device address
                                           (hr_gpu_buf_device_ptr) */
#define HR_GPU_CAP_HOST_MAPPED (1u << 7) /* device memory is mapped into the
                                            host (hr_gpu_buf_host_ptr) */
#define HR_GPU_CAP_IPC_FD (1u << 8) /* shareable DEVICE memory is exported
                                       and imported as a file descriptor
                                       (hr_gpu_buf_alloc_shareable) */

/* What an opened device is and can do. */
typedef struct hr_gpu_caps {
  const char *backend;   /* "cuda", ... (static) */
  uint8_t device_tag;    /* HR_DEV_* to write in buffer handles */
  uint16_t device_index; /* the ordinal opened */
  uint32_t flags;        /* HR_GPU_CAP_* */
  uint64_t total_memory; /* bytes of device memory; 0 when unknown */
  char name[128];        /* the device's name, NUL-terminated */
} hr_gpu_caps;

/* Why a backend is (un)available. */
typedef struct hr_gpu_probe_info {
  int available;         /* 1 when at least one device can be opened */
  unsigned device_count; /* devices found (0 when unavailable) */
  char reason[192];      /* when unavailable: why ("libcuda.so.1: cannot
                            open shared object file", "no device"); else
                            empty.  NUL-terminated. */
} hr_gpu_probe_info;

/* An IPC handle: opaque bytes another process passes to ..._import().
 * 64 bytes is what CUDA and HIP use for memory and events. */
typedef struct hr_gpu_ipc_handle {
  uint8_t bytes[64];
} hr_gpu_ipc_handle;

typedef struct hr_gpu_ops hr_gpu_ops;

/* Opening settings.  Fill with hr_gpu_config_default() first: fields are
 * only ever appended. */
typedef struct hr_gpu_config {
  const char *backend; /* "sim", "cpu", "cuda", "hip", "ze", "vulkan" */
  unsigned ordinal;    /* which device of the backend (0-based) */
  /* A backend outside the library (e.g. a binding's Metal device): when
   * non-NULL it is used instead of `backend`.  Not copied: must outlive
   * the hr_gpu. */
  const hr_gpu_ops *ops;
  /* Simulated device only.  Each queued operation waits `sim_op_delay_ns`
   * before it starts; a copy then writes its bytes in 4 KiB pieces paced
   * at `sim_bytes_per_sec` (0: as fast as memcpy), so a reader that does
   * not wait can see half-written data. */
  uint64_t sim_op_delay_ns;
  uint64_t sim_bytes_per_sec;
} hr_gpu_config;

/* Fills `cfg` with the defaults (backend "sim", ordinal 0, no delays). */
HR_EXTERN void hr_gpu_config_default(hr_gpu_config *cfg);

/* ---- backends ---------------------------------------------------------- */

/* Number of backends compiled into this build, and their names (static
 * strings, in the order: cpu, sim, then the vendor ones that were built).
 * hr_gpu_backend_name() returns NULL past the end. */
HR_EXTERN size_t hr_gpu_backend_count(void);
HR_EXTERN const char *hr_gpu_backend_name(size_t i);

/* Returns 1 when the named backend is compiled into this build. */
HR_EXTERN int hr_gpu_backend_built(const char *name);

/*
 * Probes a backend without opening a device: loads its driver, counts the
 * devices, unloads it.  Fills `info` (may be NULL) in every case.
 * Returns 0 (available), HR_ERR_UNSUPPORTED (not built, driver missing,
 * no device: info->reason says which), HR_ERR_NOT_FOUND (no backend of
 * that name), HR_ERR_INVALID_ARGUMENT (NULL name).  Thread-safe.
 */
HR_EXTERN int hr_gpu_probe(const char *backend, hr_gpu_probe_info *info);

/* ---- devices ----------------------------------------------------------- */

/*
 * Opens device cfg->ordinal of cfg->backend (or of cfg->ops).  `cfg` is
 * copied; NULL means the defaults.  `why` (may be NULL) receives the
 * reason when the device is unavailable.
 * Returns 0, HR_ERR_UNSUPPORTED (not built / no driver / no such device),
 * HR_ERR_NOT_FOUND (unknown backend name), HR_ERR_INVALID_ARGUMENT,
 * HR_ERR_NOMEM, HR_ERR_IO (the driver failed).
 */
HR_EXTERN int hr_gpu_open(hr_gpu **out, const hr_gpu_config *cfg,
                          const hr_mem *mem, hr_gpu_probe_info *why);

/* Closes the device.  Returns HR_ERR_BUSY (and closes nothing) while
 * buffers, streams or events of it are alive.  NULL: 0. */
HR_EXTERN int hr_gpu_del(hr_gpu *g);

/* Fills `caps`.  Returns 0 or HR_ERR_INVALID_ARGUMENT. */
HR_EXTERN int hr_gpu_query(const hr_gpu *g, hr_gpu_caps *caps);

/* The backend's ops table (for hr_gpu_ops users such as bindings). */
HR_EXTERN const hr_gpu_ops *hr_gpu_get_ops(const hr_gpu *g);

/* ---- memory ------------------------------------------------------------ */

/*
 * Allocates `size` (>= 1) bytes of `kind` (DEVICE, PINNED or UNIFIED).
 * Contents are unspecified.  Returns 0, HR_ERR_INVALID_ARGUMENT,
 * HR_ERR_UNSUPPORTED (the device has no such memory), HR_ERR_NOMEM (host
 * or device memory exhausted), HR_ERR_IO.
 */
HR_EXTERN int hr_gpu_buf_alloc(hr_gpu *g, int kind, uint64_t size,
                               hr_gpu_buf **out);

/*
 * Wraps `size` bytes of ordinary host memory at `ptr` (not copied, not
 * freed) as an HR_GPU_MEM_HOST buffer so that it can be a copy's source or
 * destination.  Backends that cannot reach pageable memory stage such
 * copies through pinned memory: the source of a host-to-device copy is
 * then read before hr_gpu_copy_async() returns (as CUDA does with pageable
 * memory), and a device-to-host copy lands when the stream reaches it.
 * Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM.
 */
HR_EXTERN int hr_gpu_buf_wrap_host(hr_gpu *g, void *ptr, uint64_t size,
                                   hr_gpu_buf **out);

/* Frees a buffer (a wrapped one only forgets the wrap).  No device work
 * may still use it.  NULL is a no-op. */
HR_EXTERN void hr_gpu_buf_del(hr_gpu_buf *b);

/* The buffer's device address (a CUdeviceptr, a HIP or Level Zero
 * pointer...), or NULL where the backend has none (Vulkan, wrapped host
 * memory). */
HR_EXTERN void *hr_gpu_buf_device_ptr(const hr_gpu_buf *b);
/* A host pointer to the bytes (pinned, unified, wrapped memory, and
 * device memory on HOST_MAPPED devices), or NULL.  Reading it while device
 * work writes the buffer is a race, exactly as on real hardware. */
HR_EXTERN void *hr_gpu_buf_host_ptr(const hr_gpu_buf *b);
HR_EXTERN uint64_t hr_gpu_buf_size(const hr_gpu_buf *b);
/* The device a buffer / an event belongs to (NULL for NULL). */
HR_EXTERN hr_gpu *hr_gpu_buf_device(const hr_gpu_buf *b);
HR_EXTERN hr_gpu *hr_gpu_event_device(const hr_gpu_event *e);
/* The buffer's enum hr_gpu_mem_kind; HR_ERR_INVALID_ARGUMENT for NULL. */
HR_EXTERN int hr_gpu_buf_kind(const hr_gpu_buf *b);
/* The vendor object: the device pointer, or the VkBuffer (as a pointer-
 * sized integer) on Vulkan. */
HR_EXTERN void *hr_gpu_buf_native(const hr_gpu_buf *b);

/* ---- streams ----------------------------------------------------------- */

/* Creates a stream (non-blocking with respect to any legacy default
 * stream).  Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM, HR_ERR_IO. */
HR_EXTERN int hr_gpu_stream_new(hr_gpu *g, hr_gpu_stream **out);
/* The device a stream belongs to (NULL for NULL). */
HR_EXTERN hr_gpu *hr_gpu_stream_device(const hr_gpu_stream *s);
/* Waits for the stream's work, then destroys it.  NULL is a no-op. */
HR_EXTERN void hr_gpu_stream_del(hr_gpu_stream *s);
/* Host-side wait until every operation enqueued so far has completed
 * (ADR-018 P1).  Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_IO. */
HR_EXTERN int hr_gpu_stream_sync(hr_gpu_stream *s);

/*
 * Enqueues a copy of `len` bytes from src[src_off..] to dst[dst_off..]
 * (any pair of kinds: host to device, device to host, device to device,
 * host to host).  Ranges are checked against the buffers' sizes.  Returns
 * 0, HR_ERR_INVALID_ARGUMENT (out of range, buffers of another device),
 * HR_ERR_NOMEM, HR_ERR_IO.  len 0 enqueues nothing.
 */
HR_EXTERN int hr_gpu_copy_async(hr_gpu_stream *s, hr_gpu_buf *dst,
                                uint64_t dst_off, hr_gpu_buf *src,
                                uint64_t src_off, uint64_t len);

/* A host function run in stream order (see the model above). */
typedef void (*hr_gpu_host_fn)(void *arg);

/* Enqueues `fn(arg)`.  Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM,
 * HR_ERR_IO. */
HR_EXTERN int hr_gpu_launch_host_fn(hr_gpu_stream *s, hr_gpu_host_fn fn,
                                    void *arg);

/* Enqueues a host function that adds 1 to the eventfd (or writes 8 bytes
 * to the pipe) `fd` once all earlier work of the stream has completed.
 * The fd must stay open until then.  Returns as hr_gpu_launch_host_fn(). */
HR_EXTERN int hr_gpu_stream_notify_fd(hr_gpu_stream *s, int fd);

/* ---- events ------------------------------------------------------------ */

#define HR_GPU_EVENT_IPC (1u << 0) /* exportable (needs HR_GPU_CAP_IPC_EVENT) */

/* Creates an event (never recorded: complete).  Returns 0,
 * HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM, HR_ERR_UNSUPPORTED (IPC flag
 * without IPC events), HR_ERR_IO. */
HR_EXTERN int hr_gpu_event_new(hr_gpu *g, unsigned flags,
                               hr_gpu_event **out);
/* Destroys an event.  Waits already enqueued on it stay valid (they wait
 * for the completion point recorded when they were enqueued).  NULL is a
 * no-op. */
HR_EXTERN void hr_gpu_event_del(hr_gpu_event *e);
/* Captures the current end of `s`'s work in `e` (replacing any earlier
 * recording).  Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_IO. */
HR_EXTERN int hr_gpu_event_record(hr_gpu_event *e, hr_gpu_stream *s);
/* Makes later work of `s` wait, on the device, for the completion point
 * last recorded in `e` (none: no wait).  The host is not blocked.
 * Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_IO. */
HR_EXTERN int hr_gpu_stream_wait_event(hr_gpu_stream *s, hr_gpu_event *e);
/* Returns 0 when the recorded point is complete, HR_ERR_WOULDBLOCK when it
 * is not yet, HR_ERR_INVALID_ARGUMENT, HR_ERR_IO. */
HR_EXTERN int hr_gpu_event_query(hr_gpu_event *e);
/* Host-side wait for the recorded point.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT, HR_ERR_IO. */
HR_EXTERN int hr_gpu_event_sync(hr_gpu_event *e);

/* ---- vendor handles ---------------------------------------------------- */

/* The vendor handle of a stream or event: CUstream / CUevent,
 * hipStream_t / hipEvent_t, ze_command_list_handle_t / ze_event_handle_t.
 * Vulkan, sim and cpu have no single vendor object for these: their
 * handle is the backend's own stream/event object, meaningful only to the
 * same backend in the same process.  This is what travels as ADR-018's
 * sync_handle and consumer_stream. */
HR_EXTERN void *hr_gpu_stream_native(const hr_gpu_stream *s);
HR_EXTERN void *hr_gpu_event_native(const hr_gpu_event *e);

/* Wraps a vendor handle of this device's backend (one obtained from
 * ..._native() here or from another library using the same driver) in a
 * non-owning object: deleting the wrapper does not destroy the vendor
 * object.  Returns 0, HR_ERR_INVALID_ARGUMENT (NULL), HR_ERR_UNSUPPORTED,
 * HR_ERR_NOMEM. */
HR_EXTERN int hr_gpu_stream_wrap(hr_gpu *g, void *native,
                                 hr_gpu_stream **out);
HR_EXTERN int hr_gpu_event_wrap(hr_gpu *g, void *native, hr_gpu_event **out);

/* ---- IPC --------------------------------------------------------------- */

/* Exports a DEVICE buffer / an event created with HR_GPU_EVENT_IPC for
 * another process.  Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_UNSUPPORTED
 * (no IPC on this device or kind), HR_ERR_IO. */
HR_EXTERN int hr_gpu_ipc_mem_export(hr_gpu_buf *b, hr_gpu_ipc_handle *h);
HR_EXTERN int hr_gpu_ipc_event_export(hr_gpu_event *e, hr_gpu_ipc_handle *h);
/* Opens another process's export.  `size` is the exported buffer's size,
 * passed out of band.  Deleting the result closes the mapping.  Returns 0,
 * HR_ERR_UNSUPPORTED, HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM, HR_ERR_IO. */
HR_EXTERN int hr_gpu_ipc_mem_import(hr_gpu *g, const hr_gpu_ipc_handle *h,
                                    uint64_t size, hr_gpu_buf **out);
HR_EXTERN int hr_gpu_ipc_event_import(hr_gpu *g, const hr_gpu_ipc_handle *h,
                                      hr_gpu_event **out);

/* ---- IPC through a file descriptor --------------------------------------
 *
 * The form of IPC that fits a Unix socket: the memory travels as one file
 * descriptor (SCM_RIGHTS), which is what the SHM data plane of wire-v1
 * § 14 carries.  Only memory allocated shareable can be exported:
 *   cuda    cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
 *           mapped with cuMemMap; cuMemExportToShareableHandle;
 *   hip     hipMemCreate / hipMemExportToShareableHandle, likewise;
 *   vulkan  VK_KHR_external_memory_fd (opaque fd), where the device has it;
 *   sim     a sealed memfd; the importer maps it read-only.
 * Level Zero and cpu have no such memory (HR_ERR_UNSUPPORTED).  The
 * capability is HR_GPU_CAP_IPC_FD; hr_gpu_sync_modes(g, HR_HANDOFF_IPC)
 * (<hurray/handoff.h>) reports what a consumer may rely on.
 *
 * Trust: an imported descriptor is checked where the kernel lets us (a
 * regular file must hold `size` bytes and be sealed against shrinking),
 * but a driver's opaque handle cannot be inspected: import only from a
 * peer you trust to be running the same driver (on a Unix socket, check
 * its credentials).
 */

/*
 * Allocates `size` (>= 1) bytes of DEVICE memory that can be exported as
 * a file descriptor.  The size may be rounded up to the driver's
 * granularity (hr_gpu_buf_size() reports the size asked for).  Returns 0,
 * HR_ERR_INVALID_ARGUMENT, HR_ERR_UNSUPPORTED (no HR_GPU_CAP_IPC_FD),
 * HR_ERR_NOMEM, HR_ERR_IO.
 */
HR_EXTERN int hr_gpu_buf_alloc_shareable(hr_gpu *g, uint64_t size,
                                         hr_gpu_buf **out);

/*
 * The file descriptor that stands for a shareable buffer.  It belongs to
 * the buffer (closed by hr_gpu_buf_del): pass it to sendmsg() or dup() it;
 * never close it.  A receiver imports it with hr_gpu_ipc_mem_import_fd().
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL), HR_ERR_UNSUPPORTED (not a
 * shareable allocation, e.g. ordinary or imported memory).  Thread-safe.
 */
HR_EXTERN int hr_gpu_ipc_mem_export_fd(hr_gpu_buf *b, int *fd);

/*
 * Opens another process's export: the first `size` bytes of the memory
 * behind `fd` become a DEVICE buffer of `g` (the same backend, the same
 * physical device).  `fd` is not taken: the caller still closes it (the
 * import holds its own reference).  Deleting the buffer unmaps it; the
 * memory itself lives until every process has let go of it.  On the
 * simulated device the import is read-only: it may be a copy's source,
 * never its destination.  Returns 0, HR_ERR_INVALID_ARGUMENT (fd < 0,
 * size 0), HR_ERR_UNSUPPORTED (no HR_GPU_CAP_IPC_FD), HR_ERR_PROTO (the
 * descriptor is not acceptable: not shareable memory of this device,
 * smaller than `size`, not sealed), HR_ERR_NOMEM, HR_ERR_IO.
 */
HR_EXTERN int hr_gpu_ipc_mem_import_fd(hr_gpu *g, int fd, uint64_t size,
                                       hr_gpu_buf **out);

/* ---- staging ----------------------------------------------------------- */

/*
 * A staging pipeline between device memory and the host: a ring of
 * `slots` pinned chunks of `chunk` bytes each, one stream, one event per
 * slot.  Device-to-host: hr_gpu_stager_d2h() enqueues as many chunk copies
 * as there are free slots, and hands each chunk to `sink` as soon as its
 * copy has landed (in order), refilling the slot with the next chunk while
 * the sink runs; the sink is where an engine sends the bytes (they are in
 * pinned memory, producer-synced).  Host-to-device: hr_gpu_stager_h2d()
 * asks `source` to fill each slot, then copies it to the device, several
 * slots in flight.
 *
 * Both calls block until the whole range is done (the engine's
 * non-blocking integration builds on the same pieces: async copies, one
 * event per slot, hr_gpu_stream_notify_fd()).
 */
typedef struct hr_gpu_stager hr_gpu_stager;

/* Receives `len` bytes of the device range starting at `offset` (relative
 * to the start of the staged range).  `data` is valid during the call.
 * Returning non-zero stops the transfer with that value. */
typedef int (*hr_gpu_stage_sink)(void *user, uint64_t offset,
                                 const void *data, size_t len);
/* Fills data[0..len) with the bytes at `offset` of the range.  Returning
 * non-zero stops the transfer with that value. */
typedef int (*hr_gpu_stage_source)(void *user, uint64_t offset, void *data,
                                   size_t len);

/* Creates a stager: chunk >= 4096, 2 <= slots <= 64.  Needs PINNED memory
 * (falls back to wrapped host memory where the device has none).
 * Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM, HR_ERR_IO. */
HR_EXTERN int hr_gpu_stager_new(hr_gpu_stager **out, hr_gpu *g,
                                size_t chunk, unsigned slots,
                                const hr_mem *mem);
/* Frees it (waits for its stream first).  NULL is a no-op. */
HR_EXTERN void hr_gpu_stager_del(hr_gpu_stager *st);
/* Device (src[off..off+len)) to host through the sink.  Returns 0, the
 * sink's non-zero value, HR_ERR_INVALID_ARGUMENT, HR_ERR_IO. */
HR_EXTERN int hr_gpu_stager_d2h(hr_gpu_stager *st, hr_gpu_buf *src,
                                uint64_t off, uint64_t len,
                                hr_gpu_stage_sink sink, void *user);
/* Host (through the source) to device (dst[off..off+len)).  Returns 0 (the
 * bytes have landed), the source's non-zero value,
 * HR_ERR_INVALID_ARGUMENT, HR_ERR_IO.  Both calls run `sink` / `source` on
 * the calling thread; they must not use the stager. */
HR_EXTERN int hr_gpu_stager_h2d(hr_gpu_stager *st, hr_gpu_buf *dst,
                                uint64_t off, uint64_t len,
                                hr_gpu_stage_source source, void *user);

/* ---- the backend ops table -------------------------------------------- */

/* What a backend reports about one allocation. */
typedef struct hr_gpu_mem_info {
  void *handle;     /* the backend's own object, passed back to it */
  void *device_ptr; /* device address, or NULL */
  void *host_ptr;   /* host mapping, or NULL */
  void *native;     /* vendor object (hr_gpu_buf_native) */
  uint64_t size;
  int kind; /* enum hr_gpu_mem_kind */
} hr_gpu_mem_info;

/* Selectors for ops->native() and ops->wrap_native(). */
#define HR_GPU_OBJ_STREAM 1
#define HR_GPU_OBJ_EVENT 2

/*
 * A backend, libfabric-fi_ops style: `size` is sizeof(hr_gpu_ops) as the
 * backend was compiled, so that members appended later are known to be
 * absent from an older table.  Every object is the backend's `void *`;
 * the library wraps them, checks arguments and counts live objects before
 * a backend sees a call.  Optional members may be NULL (the call then
 * returns HR_ERR_UNSUPPORTED).  Every int-returning member returns 0 or a
 * negative HR_ERR_*; `dev` is what open() produced.
 */
struct hr_gpu_ops {
  size_t size;
  const char *name;   /* "cuda" */
  uint8_t device_tag; /* HR_DEV_* */
  /* Required. */
  int (*probe)(const hr_gpu_config *cfg, hr_gpu_probe_info *info);
  int (*open)(void **dev, const hr_gpu_config *cfg, const hr_mem *mem,
              hr_gpu_probe_info *why);
  void (*close)(void *dev);
  int (*query)(void *dev, hr_gpu_caps *caps);
  int (*mem_alloc)(void *dev, int kind, uint64_t size, hr_gpu_mem_info *out);
  int (*mem_wrap_host)(void *dev, void *ptr, uint64_t size,
                       hr_gpu_mem_info *out);
  void (*mem_free)(void *dev, const hr_gpu_mem_info *m);
  int (*stream_new)(void *dev, void **out);
  void (*stream_del)(void *dev, void *s);
  int (*stream_sync)(void *dev, void *s);
  int (*event_new)(void *dev, unsigned flags, void **out);
  void (*event_del)(void *dev, void *e);
  int (*event_record)(void *dev, void *e, void *s);
  int (*stream_wait_event)(void *dev, void *s, void *e);
  int (*event_query)(void *dev, void *e);
  int (*event_sync)(void *dev, void *e);
  int (*copy)(void *dev, void *s, const hr_gpu_mem_info *dst,
              uint64_t dst_off, const hr_gpu_mem_info *src, uint64_t src_off,
              uint64_t len);
  int (*host_fn)(void *dev, void *s, hr_gpu_host_fn fn, void *arg);
  /* Optional. */
  void *(*native)(void *dev, int what, void *obj);
  int (*wrap_native)(void *dev, int what, void *native, void **out);
  int (*ipc_mem_export)(void *dev, const hr_gpu_mem_info *m,
                        hr_gpu_ipc_handle *h);
  int (*ipc_mem_import)(void *dev, const hr_gpu_ipc_handle *h, uint64_t size,
                        hr_gpu_mem_info *out);
  int (*ipc_event_export)(void *dev, void *e, hr_gpu_ipc_handle *h);
  int (*ipc_event_import)(void *dev, const hr_gpu_ipc_handle *h, void **out);
  /* Optional, appended: IPC through a file descriptor.  The exported fd
   * belongs to the allocation (mem_free closes it); import never takes
   * the caller's fd and fills `out` like mem_alloc, and mem_free undoes
   * it. */
  int (*mem_alloc_shareable)(void *dev, uint64_t size, hr_gpu_mem_info *out);
  int (*ipc_mem_export_fd)(void *dev, const hr_gpu_mem_info *m, int *fd);
  int (*ipc_mem_import_fd)(void *dev, int fd, uint64_t size,
                           hr_gpu_mem_info *out);
};

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_GPU_H */
