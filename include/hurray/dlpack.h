/*
 * libhurray: DLPack interop.
 *
 * The DLPack 1.1 ABI is declared here from the DLPack specification, with
 * its exact layouts (Debian's libdlpack-dev is 0.6 and predates
 * DLManagedTensorVersioned).  When another dlpack.h was included first
 * (DLPACK_MAJOR_VERSION defined) its declarations are used instead (a 1.x
 * one: 0.x lacks the versioned struct); the static assertions in
 * gpu/hr_dlpack.c check the layouts.
 *
 * libhurray exports a received tensor as a DLManagedTensorVersioned and
 * imports one (or a legacy DLManagedTensor), and maps the consumer-stream
 * semantics of the Python array API's __dlpack__(stream=...) onto the
 * ADR-018 modes:
 *
 *   export (libhurray produces, a DLPack consumer passes `stream`):
 *     stream = a stream handle (CUDA/ROCm: the integer; 1 and 2 are the
 *              legacy and per-thread default streams) -> the ADR-018
 *              consumer rule is applied toward that stream: P2 waits on
 *              the event there, P3 orders it after the declared stream, P1
 *              needs nothing (the DLPack "producer waits on a stream for the
 *              consumer" contract, without blocking the host);
 *     stream = None (HR_DLPACK_STREAM_NONE) or -1 -> the host waits (P1
 *              semantics): libhurray never hands out bytes whose
 *              synchronisation nobody has taken on;
 *     stream = 0 -> rejected, as the array API rejects it for CUDA.
 *   import (libhurray consumes a tensor it obtained with
 *   __dlpack__(stream=S)):
 *     S given -> the producer already ordered S after its writes: the
 *              handoff is SYNC_CONSUMER_STREAM with S as consumer stream;
 *     no stream -> SYNC_PRODUCER_SYNCED.
 *   The DLPack deleter is the buffer release (ADR-009): a DLPack consumer
 *   calls it once its own device work on the tensor has completed
 *   (ADR-018 § 5).
 */
#ifndef HURRAY_DLPACK_H
#define HURRAY_DLPACK_H

#include <stdint.h>

#include <hurray/common.h>
#include <hurray/handoff.h>
#include <hurray/tensor.h>
#include <hurray/wire.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef DLPACK_MAJOR_VERSION
/* The official header's include guard: a <dlpack/dlpack.h> included after
 * this one then declares nothing twice. */
#define DLPACK_DLPACK_H_
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 1

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
  kDLMAIA = 17
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
  kDLFloat8_e3m4 = 7U,
  kDLFloat8_e4m3 = 8U,
  kDLFloat8_e4m3b11fnuz = 9U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e4m3fnuz = 11U,
  kDLFloat8_e5m2 = 12U,
  kDLFloat8_e5m2fnuz = 13U,
  kDLFloat8_e8m0fnu = 14U,
  kDLFloat6_e2m3fn = 15U,
  kDLFloat6_e3m2fn = 16U,
  kDLFloat4_e2m1fn = 17U
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides; /* in elements; NULL: compact row-major (< 1.2) */
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif /* DLPACK_MAJOR_VERSION */

/* Python's None for the `stream` argument of the export. */
#define HR_DLPACK_STREAM_NONE INT64_MIN

/* Element types: Hurray <-> DLPack.  Return 0 or HR_ERR_UNSUPPORTED (no
 * counterpart: e.g. lanes != 1, an unknown code). */
HR_EXTERN int hr_dlpack_dtype(uint8_t elem, DLDataType *out);
HR_EXTERN int hr_dlpack_elem(DLDataType dt, uint8_t *elem);

/* Devices: (device_tag, memory_class, device_index) <-> DLDevice.  CPU
 * buffers are kDLCPU whatever their class; kDLCUDAHost/kDLROCMHost import
 * as CPU PINNED, kDLCUDAManaged as CUDA UNIFIED; the simulated device
 * (HR_GPU_DEV_SIM) is kDLExtDev.  Return 0 or HR_ERR_UNSUPPORTED. */
HR_EXTERN int hr_dlpack_device(uint8_t device_tag, uint8_t memory_class,
                               uint16_t device_index, DLDevice *out);
HR_EXTERN int hr_dlpack_device_tag(DLDevice dev, uint8_t *device_tag,
                                   uint8_t *memory_class,
                                   uint16_t *device_index);

/*
 * Builds a one-buffer descriptor for a DLTensor (ROW_MAJOR when compact
 * in C order or strides are NULL, COLUMN_MAJOR when compact in Fortran
 * order, else STRIDED with the origin and strides that address the same
 * elements).  The buffer's device fields come from dl->device; sync_mode
 * is PRODUCER_SYNCED.  *base receives the address of the buffer's first
 * byte (the lowest addressed element).  Returns 0, HR_ERR_UNSUPPORTED
 * (dtype, device, rank > 32), HR_ERR_INVALID_ARGUMENT (negative shape,
 * overflow).
 */
HR_EXTERN int hr_dlpack_to_descriptor(const DLTensor *dl, hr_descriptor *d,
                                      void **base);

/*
 * Exports a tensor in host memory (every buffer's device_tag CPU; one
 * buffer; ROW_MAJOR, COLUMN_MAJOR or STRIDED).  Takes a reference on `t`,
 * dropped by the deleter.  Returns 0, HR_ERR_UNSUPPORTED (layout, device,
 * composite), HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM.
 */
HR_EXTERN int hr_dlpack_export_tensor(hr_tensor *t, const hr_mem *mem,
                                      DLManagedTensorVersioned **out);

/*
 * Imports a host tensor (kDLCPU, kDLCUDAHost, kDLROCMHost) as an
 * hr_tensor: the memory is not copied and the DLPack deleter is called
 * when the tensor is freed.  Takes ownership of `m` on success only.
 * Returns 0, HR_ERR_UNSUPPORTED (major version other than 1, device,
 * dtype), HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM.
 */
HR_EXTERN int hr_dlpack_import_tensor(DLManagedTensorVersioned *m,
                                      const hr_mem *mem, hr_tensor **out);
/* The same for the legacy (pre-1.0) DLManagedTensor. */
HR_EXTERN int hr_dlpack_import_legacy(DLManagedTensor *m, const hr_mem *mem,
                                      hr_tensor **out);

/*
 * Exports a received device buffer handoff `h` described by `d` (one
 * buffer; dense layout) to a DLPack consumer that passed `stream` to
 * __dlpack__, applying the ADR-018 consumer rule toward that stream on
 * device `g` (see the mapping above).  The resulting tensor's deleter
 * releases the buffer and destroys the handoff, which then belongs to the
 * DLPack tensor.  On failure `h` stays the caller's.
 * Returns 0, HR_ERR_INVALID_ARGUMENT (stream 0, a stream for a CPU buffer),
 * HR_ERR_UNSUPPORTED, HR_ERR_NOMEM, HR_ERR_IO.
 */
HR_EXTERN int hr_dlpack_export_handoff(hr_handoff *h, const hr_descriptor *d,
                                       hr_gpu *g, int64_t stream,
                                       const hr_mem *mem,
                                       DLManagedTensorVersioned **out);

/*
 * Imports a DLPack tensor obtained with __dlpack__(stream=consumer_stream)
 * (NULL: no stream) as an in-process handoff recorded in `l`, whose buffer
 * release calls the DLPack deleter.  Fills `d` (see
 * hr_dlpack_to_descriptor()).  Takes ownership of `m` on success (and on
 * HR_ERR_NOMEM, where the deleter has been called: the producer's memory
 * is handed back as after any refused handoff).
 * Returns 0, HR_ERR_UNSUPPORTED, HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM,
 * HR_ERR_PROTO (with `st`).
 */
HR_EXTERN int hr_dlpack_import_handoff(DLManagedTensorVersioned *m,
                                       hr_handoff_ledger *l,
                                       void *consumer_stream,
                                       hr_descriptor *d, hr_handoff **out,
                                       hr_wire_status *st);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_DLPACK_H */
