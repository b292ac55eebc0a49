/*
 * Internals of the device layer (gpu/): the built-in backends' ops tables
 * and helpers they share.  Backends see only `void *` objects; the public
 * wrappers in hr_gpu.c check arguments and count live objects first.
 */
#ifndef HR_GPU_INT_H
#define HR_GPU_INT_H

#include <stdarg.h>
#include <stddef.h>

#include <hurray/gpu.h>

#include "hr_internal.h"

/* The built-in backends.  cpu and sim are always built; the vendor ones
 * exist when their headers were found (HR_GPU_HAVE_* from CMake). */
extern const hr_gpu_ops hr__gpu_cpu_ops;
extern const hr_gpu_ops hr__gpu_sim_ops;
#ifdef HR_GPU_HAVE_CUDA
extern const hr_gpu_ops hr__gpu_cuda_ops;
#endif
#ifdef HR_GPU_HAVE_HIP
extern const hr_gpu_ops hr__gpu_hip_ops;
#endif
#ifdef HR_GPU_HAVE_ZE
extern const hr_gpu_ops hr__gpu_ze_ops;
#endif
#ifdef HR_GPU_HAVE_VULKAN
extern const hr_gpu_ops hr__gpu_vk_ops;
#endif

/* Writes a printf-style reason into info->reason (info may be NULL) and
 * marks it unavailable.  Returns HR_ERR_UNSUPPORTED for tail calls. */
int hr__gpu_unavailable(hr_gpu_probe_info *info, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/*
 * dlopen()s the first loadable of the NULL-terminated `names` (RTLD_NOW |
 * RTLD_LOCAL).  Returns the handle, or NULL with the loader's message for
 * the first name in `why`.
 */
void *hr__gpu_dlopen(const char *const *names, hr_gpu_probe_info *why);

/* A generic function pointer: the size of a table's every member. */
typedef void (*hr__gpu_fn)(void);
_Static_assert(sizeof(hr__gpu_fn) == sizeof(void *),
               "dlsym() results fit a function pointer");

/* One entry point of a driver: its name, and the offset of the member of
 * a table (a struct of the driver's function pointers) it goes to. */
typedef struct hr__gpu_sym {
  const char *name;
  size_t off;
} hr__gpu_sym;
#define HR__GPU_SYM(type, member, name) {name, offsetof(type, member)}

/*
 * Resolves the `n` symbols of `syms` into the members of `table` they
 * name (each a function pointer).  dlsym()'s void * is copied into the
 * member byte for byte, the conversion POSIX guarantees for dlsym(): C11
 * defines neither a cast from an object to a function pointer nor a
 * write through a pointer to another function type.  Returns 0, or
 * HR_ERR_UNSUPPORTED naming the first missing symbol in `why` (the
 * members before it are set).
 */
int hr__gpu_dlsym_all(void *lib, const hr__gpu_sym *syms, size_t n,
                      void *table, hr_gpu_probe_info *why);
/* hr__gpu_dlopen(`libs`) into *lib, then hr__gpu_dlsym_all() from it.
 * Returns 0; HR_ERR_UNSUPPORTED with *lib NULL (no library); or
 * hr__gpu_dlsym_all()'s error with the library still open in *lib (the
 * caller decides whether it may be closed). */
int hr__gpu_load(const char *const *libs, const hr__gpu_sym *syms, size_t n,
                 void *table, void **lib, hr_gpu_probe_info *why);

/* Monotonic clock in nanoseconds (the device layer may read clocks). */
uint64_t hr__gpu_now_ns(void);
/* Sleeps `ns` nanoseconds (restarting after signals). */
void hr__gpu_sleep_ns(uint64_t ns);

/*
 * Makes [p, p + len) behave like device memory, which is resident once
 * allocated, for backends whose "device memory" is ordinary host memory
 * (sim, a CPU Vulkan device such as lavapipe): populates it at once
 * (MADV_POPULATE_WRITE) in huge pages where it is 2 MiB or more
 * (MADV_HUGEPAGE).  Otherwise each new buffer is faulted in 4 KiB at a
 * time by its first copy, on the device's thread, which cost more than the
 * copy itself and made a GET into device memory run at ~0.1 GB/s
 * (issue 6).  Advice only; buffers under 64 KiB are left alone.
 */
void hr__gpu_host_backed(void *p, uint64_t len);
/* Its two halves: huge pages advised (at allocation), and the pages made
 * resident (MADV_POPULATE_WRITE, in one call rather than a fault per
 * page).  The sim backend advises at allocation and populates device
 * memory on its stream's thread, before the copy that first writes it:
 * a new buffer's population then overlaps the caller's work (a GET into
 * device memory receives while it happens) instead of holding the thread
 * that allocates (the engine's loop, for 25 ms or more per 256 MiB). */
void hr__gpu_advise_huge(void *p, uint64_t len);
void hr__gpu_populate(void *p, uint64_t len);

/* Copies a NUL-terminated name into a fixed buffer, truncating. */
void hr__gpu_copy_name(char *dst, size_t cap, const char *src);

/* The backend's device object behind `g` (its ops->open() result). */
void *hr__gpu_backend_dev(const hr_gpu *g);

/* Memory in a sealed memfd (hr_gpu_ipc.c), for backends whose device
 * memory is host memory.  `fd` is the read-only descriptor to export (-1
 * for an import). */
typedef struct hr__gpu_memfd {
  void *addr;
  size_t len;
  int fd;
} hr__gpu_memfd;
/* A new memfd of `size` bytes (rounded up to pages), sealed against
 * resizing, mapped read-write; *out->fd is its read-only reopening.
 * Returns 0, HR_ERR_NOMEM, HR_ERR_IO. */
int hr__gpu_memfd_new(uint64_t size, hr__gpu_memfd *out);
/* Maps the first `size` bytes of another process's memfd read-only after
 * checking it (a regular file, that large, sealed against shrinking).
 * `fd` is not taken.  Returns 0, HR_ERR_PROTO (not acceptable),
 * HR_ERR_NOMEM. */
int hr__gpu_memfd_import(int fd, uint64_t size, hr__gpu_memfd *out);
/* Unmaps and closes what new/import made. */
void hr__gpu_memfd_free(hr__gpu_memfd *m);

#ifdef HR_GPU_HAVE_CUDA
/*
 * Kernel launch on the cuda backend, for layers that embed device code
 * (transcode/cuda/).  `image` is a fatbin or PTX image with static storage:
 * it is loaded once per device (cuModuleLoadData) and kept until the device
 * closes.  The launch is asynchronous on `s`, a stream of `g`.  Returns 0,
 * HR_ERR_UNSUPPORTED (g is not a cuda device, the image has no code for it,
 * or it lacks the kernel), HR_ERR_INVALID_ARGUMENT, HR_ERR_LIMIT (too many
 * images) or the mapped launch error.
 */
typedef struct hr__gpu_cuda_kernel {
  const char *name;  /* extern "C" kernel name */
  unsigned grid[3];  /* blocks */
  unsigned block[3]; /* threads per block */
  unsigned shmem;    /* dynamic shared memory in bytes */
  void **args;       /* kernel parameters, cuLaunchKernel style */
} hr__gpu_cuda_kernel;
int hr__gpu_cuda_launch(hr_gpu *g, const void *image, hr_gpu_stream *s,
                        const hr__gpu_cuda_kernel *k);
#endif

#endif /* HR_GPU_INT_H */
