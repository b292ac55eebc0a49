/*
 * DLPack interop: descriptors <-> DLTensor, host tensors <-> managed
 * tensors, and device handoffs <-> managed tensors with the
 * __dlpack__(stream=...) semantics mapped onto ADR-018 (see dlpack.h).
 */
#include <stddef.h>
#include <string.h>

#include <hurray/dlpack.h>

#include "hr_gpu_int.h"

/* The layouts of the DLPack specification, on LP64 targets. */
#if UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(DLTensor) == 48, "DLTensor layout");
_Static_assert(offsetof(DLTensor, shape) == 24, "DLTensor.shape");
_Static_assert(offsetof(DLTensor, byte_offset) == 40, "DLTensor.byte_offset");
_Static_assert(sizeof(DLManagedTensor) == 64, "DLManagedTensor layout");
_Static_assert(sizeof(DLManagedTensorVersioned) == 80,
               "DLManagedTensorVersioned layout");
_Static_assert(offsetof(DLManagedTensorVersioned, flags) == 24,
               "DLManagedTensorVersioned.flags");
_Static_assert(offsetof(DLManagedTensorVersioned, dl_tensor) == 32,
               "DLManagedTensorVersioned.dl_tensor");
#endif
_Static_assert(sizeof(DLDataType) == 4, "DLDataType layout");
_Static_assert(sizeof(DLDevice) == 8, "DLDevice layout");

/* ---- element types and devices ----------------------------------------- */

static const struct {
  uint8_t elem, code, bits;
} dtypes[] = {
    {HR_ELEM_BOOL, kDLBool, 8},
    {HR_ELEM_INT8, kDLInt, 8},
    {HR_ELEM_UINT8, kDLUInt, 8},
    {HR_ELEM_INT16, kDLInt, 16},
    {HR_ELEM_UINT16, kDLUInt, 16},
    {HR_ELEM_INT32, kDLInt, 32},
    {HR_ELEM_UINT32, kDLUInt, 32},
    {HR_ELEM_INT64, kDLInt, 64},
    {HR_ELEM_UINT64, kDLUInt, 64},
    {HR_ELEM_FLOAT16, kDLFloat, 16},
    {HR_ELEM_BFLOAT16, kDLBfloat, 16},
    {HR_ELEM_FLOAT32, kDLFloat, 32},
    {HR_ELEM_FLOAT64, kDLFloat, 64},
    {HR_ELEM_FLOAT8_E4M3FN, kDLFloat8_e4m3fn, 8},
    {HR_ELEM_FLOAT8_E5M2, kDLFloat8_e5m2, 8},
    {HR_ELEM_COMPLEX64, kDLComplex, 64},
    {HR_ELEM_COMPLEX128, kDLComplex, 128},
    {HR_ELEM_INT4, kDLInt, 4},
    {HR_ELEM_UINT4, kDLUInt, 4},
};

int hr_dlpack_dtype(uint8_t elem, DLDataType *out) {
  for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
    if (dtypes[i].elem == elem) {
      out->code = dtypes[i].code;
      out->bits = dtypes[i].bits;
      out->lanes = 1;
      return 0;
    }
  return HR_ERR_UNSUPPORTED;
}

int hr_dlpack_elem(DLDataType dt, uint8_t *elem) {
  if (dt.lanes != 1)
    return HR_ERR_UNSUPPORTED;
  for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
    if (dtypes[i].code == dt.code && dtypes[i].bits == dt.bits) {
      *elem = dtypes[i].elem;
      return 0;
    }
  return HR_ERR_UNSUPPORTED;
}

static const struct {
  uint8_t tag;
  int dl;
} devices[] = {
    {HR_DEV_CPU, kDLCPU},           {HR_DEV_CUDA, kDLCUDA},
    {HR_DEV_ROCM, kDLROCM},         {HR_DEV_METAL, kDLMetal},
    {HR_DEV_VULKAN, kDLVulkan},     {HR_DEV_LEVEL_ZERO, kDLOneAPI},
    {HR_DEV_OPENCL, kDLOpenCL},     {HR_DEV_WEBGPU, kDLWebGPU},
    {HR_DEV_HEXAGON, kDLHexagon},   {HR_GPU_DEV_SIM, kDLExtDev},
};

int hr_dlpack_device(uint8_t tag, uint8_t mc, uint16_t index, DLDevice *out) {
  if (mc > HR_MEM_LAST)
    return HR_ERR_UNSUPPORTED;
  for (size_t i = 0; i < sizeof devices / sizeof *devices; i++)
    if (devices[i].tag == tag) {
      out->device_type = (DLDeviceType)devices[i].dl;
      if (tag == HR_DEV_CUDA && mc == HR_MEM_UNIFIED)
        out->device_type = kDLCUDAManaged;
      out->device_id = tag == HR_DEV_CPU ? 0 : index;
      return 0;
    }
  return HR_ERR_UNSUPPORTED;
}

int hr_dlpack_device_tag(DLDevice dev, uint8_t *tag, uint8_t *mc,
                         uint16_t *index) {
  if (dev.device_id < 0 || dev.device_id > UINT16_MAX)
    return HR_ERR_UNSUPPORTED;
  *mc = HR_MEM_STANDARD;
  *index = (uint16_t)dev.device_id;
  switch ((int)dev.device_type) {
  case kDLCUDAHost:
  case kDLROCMHost:
    *tag = HR_DEV_CPU;
    *mc = HR_MEM_PINNED;
    *index = 0;
    return 0;
  case kDLCUDAManaged:
    *tag = HR_DEV_CUDA;
    *mc = HR_MEM_UNIFIED;
    return 0;
  default:
    break;
  }
  for (size_t i = 0; i < sizeof devices / sizeof *devices; i++)
    if (devices[i].dl == (int)dev.device_type) {
      *tag = devices[i].tag;
      if (*tag == HR_DEV_CPU)
        *index = 0;
      return 0;
    }
  return HR_ERR_UNSUPPORTED;
}

/* ---- descriptors -------------------------------------------------------- */

/* a * b + c into *out, refusing overflow of int64. */
static int mul_add(int64_t a, int64_t b, int64_t c, int64_t *out) {
  int64_t m;
  if (__builtin_mul_overflow(a, b, &m) || __builtin_add_overflow(m, c, out))
    return HR_ERR_INVALID_ARGUMENT;
  return 0;
}

int hr_dlpack_to_descriptor(const DLTensor *dl, hr_descriptor *d,
                            void **base) {
  if (!dl || !d || !base || dl->ndim < 0 || (dl->ndim && !dl->shape))
    return HR_ERR_INVALID_ARGUMENT;
  if (dl->ndim > (int32_t)HR_MAX_RANK)
    return HR_ERR_UNSUPPORTED;
  memset(d, 0, sizeof *d);
  d->descriptor_version = 1;
  d->rank = (uint8_t)dl->ndim;
  int rv = hr_dlpack_elem(dl->dtype, &d->element_type);
  if (rv != 0)
    return rv;
  hr_buffer_handle *b = &d->buffers[0];
  rv = hr_dlpack_device_tag(dl->device, &b->device_tag, &b->memory_class,
                            &b->device_index);
  if (rv != 0)
    return rv;
  d->buffer_count = 1;
  b->sync_mode = HR_SYNC_PRODUCER_SYNCED;
  unsigned bits = dl->dtype.bits;
  int64_t n = 1;
  for (int k = 0; k < dl->ndim; k++) {
    if (dl->shape[k] < 0 || mul_add(n, dl->shape[k], 0, &n))
      return HR_ERR_INVALID_ARGUMENT;
    d->shape[k] = (uint64_t)dl->shape[k];
  }
  /* Which compact order, if any, do the strides describe? */
  int rowm = 1, colm = 1;
  if (dl->strides && n > 1) {
    int64_t want = 1;
    for (int k = dl->ndim - 1; k >= 0; k--) {
      if (dl->shape[k] != 1 && dl->strides[k] != want)
        rowm = 0;
      want *= dl->shape[k];
    }
    want = 1;
    for (int k = 0; k < dl->ndim; k++) {
      if (dl->shape[k] != 1 && dl->strides[k] != want)
        colm = 0;
      want *= dl->shape[k];
    }
  }
  char *p = (char *)dl->data + dl->byte_offset;
  d->layout.tag = rowm ? HR_LAYOUT_ROW_MAJOR
                       : colm ? HR_LAYOUT_COLUMN_MAJOR : HR_LAYOUT_STRIDED;
  if (d->layout.tag != HR_LAYOUT_STRIDED) {
    uint64_t sz = bits < 8 ? ((uint64_t)n * bits + 7) / 8
                           : (uint64_t)n * (bits / 8);
    b->size_bytes = sz;
    *base = p;
    return 0;
  }
  if (bits < 8)
    return HR_ERR_UNSUPPORTED; /* sub-byte types are ROW_MAJOR only */
  /* STRIDED: the buffer starts at the lowest addressed element. */
  int64_t low = 0, high = 0;
  for (int k = 0; k < dl->ndim; k++) {
    d->params.strides[k] = dl->strides[k];
    if (n == 0)
      continue;
    int64_t span;
    if (mul_add(dl->shape[k] - 1, dl->strides[k], 0, &span))
      return HR_ERR_INVALID_ARGUMENT;
    if (span < 0 ? mul_add(1, span, low, &low) : mul_add(1, span, high, &high))
      return HR_ERR_INVALID_ARGUMENT;
  }
  int64_t count, bytes;
  if (mul_add(1, high, 1 - low, &count) || mul_add(count, bits / 8, 0, &bytes))
    return HR_ERR_INVALID_ARGUMENT;
  d->params.origin = (uint64_t)-low;
  b->size_bytes = n == 0 ? 0 : (uint64_t)bytes;
  *base = p + low * (int64_t)(bits / 8);
  return 0;
}

/* Fills shape/strides/data of a DLTensor from a one-buffer dense
 * descriptor whose buffer starts at `buf`. */
static int from_descriptor(const hr_descriptor *d, void *buf, DLTensor *dl,
                           int64_t *shape, int64_t *strides) {
  if (d->buffer_count != 1 || d->rank > HR_MAX_RANK)
    return HR_ERR_UNSUPPORTED;
  const hr_buffer_handle *b = &d->buffers[0];
  int rv = hr_dlpack_dtype(d->element_type, &dl->dtype);
  if (rv == 0)
    rv = hr_dlpack_device(b->device_tag, b->memory_class, b->device_index,
                          &dl->device);
  if (rv != 0)
    return rv;
  dl->ndim = d->rank;
  dl->shape = shape;
  dl->strides = strides;
  dl->data = buf;
  dl->byte_offset = 0;
  for (unsigned k = 0; k < d->rank; k++) {
    if (d->shape[k] > INT64_MAX)
      return HR_ERR_UNSUPPORTED;
    shape[k] = (int64_t)d->shape[k];
  }
  int64_t s = 1;
  switch (d->layout.tag) {
  case HR_LAYOUT_ROW_MAJOR:
    for (int k = (int)d->rank - 1; k >= 0; k--) {
      strides[k] = s;
      s *= shape[k] ? shape[k] : 1;
    }
    return 0;
  case HR_LAYOUT_COLUMN_MAJOR:
    if (dl->dtype.bits < 8)
      return HR_ERR_UNSUPPORTED;
    for (unsigned k = 0; k < d->rank; k++) {
      strides[k] = s;
      s *= shape[k] ? shape[k] : 1;
    }
    return 0;
  case HR_LAYOUT_STRIDED:
    if (dl->dtype.bits < 8 || d->params.origin > INT64_MAX / 16)
      return HR_ERR_UNSUPPORTED;
    for (unsigned k = 0; k < d->rank; k++)
      strides[k] = d->params.strides[k];
    dl->byte_offset = d->params.origin * (dl->dtype.bits / 8);
    return 0;
  default:
    return HR_ERR_UNSUPPORTED;
  }
}

/* ---- managed tensors ---------------------------------------------------- */

/* One exported tensor: the DLPack struct first, so that `self` is the
 * allocation. */
typedef struct export_ctx {
  DLManagedTensorVersioned m;
  hr_mem mem;
  hr_tensor *tensor;  /* host export */
  hr_handoff *handoff; /* device export */
  int64_t shape[HR_MAX_RANK];
  int64_t strides[HR_MAX_RANK];
} export_ctx;

static void export_deleter(DLManagedTensorVersioned *self) {
  export_ctx *x = (export_ctx *)self;
  hr_tensor_unref(x->tensor);
  if (x->handoff) {
    hr_handoff_release_buffer(x->handoff);
    hr_handoff_del(x->handoff);
  }
  hr_mem mem = x->mem;
  hr__mem_free(&mem, x);
}

static export_ctx *export_new(const hr_mem *mem) {
  if (!mem)
    mem = hr_mem_default();
  export_ctx *x = hr__mem_calloc(mem, 1, sizeof *x);
  if (!x)
    return NULL;
  x->mem = *mem;
  x->m.version.major = DLPACK_MAJOR_VERSION;
  x->m.version.minor = DLPACK_MINOR_VERSION;
  x->m.manager_ctx = x;
  x->m.deleter = export_deleter;
  return x;
}

int hr_dlpack_export_tensor(hr_tensor *t, const hr_mem *mem,
                            DLManagedTensorVersioned **out) {
  if (!t || !out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  const hr_descriptor *d = hr_tensor_descriptor(t);
  if (hr_tensor_member_count(t) || d->buffer_count != 1 ||
      d->buffers[0].device_tag != HR_DEV_CPU)
    return HR_ERR_UNSUPPORTED;
  export_ctx *x = export_new(mem);
  if (!x)
    return HR_ERR_NOMEM;
  int rv = from_descriptor(d, hr_tensor_buffer(t, 0), &x->m.dl_tensor,
                           x->shape, x->strides);
  if (rv != 0) {
    hr__mem_free(&x->mem, x);
    return rv;
  }
  x->tensor = hr_tensor_ref(t);
  *out = &x->m;
  return 0;
}

/* The release of an imported tensor: the DLPack deleter. */
static void call_versioned_deleter(void *ctx) {
  DLManagedTensorVersioned *m = ctx;
  if (m->deleter)
    m->deleter(m);
}

static void call_legacy_deleter(void *ctx) {
  DLManagedTensor *m = ctx;
  if (m->deleter)
    m->deleter(m);
}

static int import_host(const DLTensor *dl, hr_release_fn release, void *ctx,
                       const hr_mem *mem, hr_tensor **out) {
  hr_descriptor d;
  void *base;
  int rv = hr_dlpack_to_descriptor(dl, &d, &base);
  if (rv != 0)
    return rv;
  if (d.buffers[0].device_tag != HR_DEV_CPU)
    return HR_ERR_UNSUPPORTED;
  return hr_tensor_wrap(out, &d, &base, release, ctx, mem);
}

int hr_dlpack_import_tensor(DLManagedTensorVersioned *m, const hr_mem *mem,
                            hr_tensor **out) {
  if (!m || !out)
    return HR_ERR_INVALID_ARGUMENT;
  if (m->version.major != 1)
    return HR_ERR_UNSUPPORTED;
  return import_host(&m->dl_tensor, call_versioned_deleter, m, mem, out);
}

int hr_dlpack_import_legacy(DLManagedTensor *m, const hr_mem *mem,
                            hr_tensor **out) {
  if (!m || !out)
    return HR_ERR_INVALID_ARGUMENT;
  return import_host(&m->dl_tensor, call_legacy_deleter, m, mem, out);
}

/* ---- device handoffs ----------------------------------------------------- */

int hr_dlpack_export_handoff(hr_handoff *h, const hr_descriptor *d, hr_gpu *g,
                             int64_t stream, const hr_mem *mem,
                             DLManagedTensorVersioned **out) {
  if (!h || !d || !out || stream == 0)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  const hr_buffer_handle *b = hr_handoff_handle(h);
  int has_stream = stream != HR_DLPACK_STREAM_NONE && stream != -1;
  if (has_stream && (b->device_tag == HR_DEV_CPU || !g))
    return HR_ERR_INVALID_ARGUMENT;
  if (d->buffer_count != 1 || d->buffers[0].device_tag != b->device_tag)
    return HR_ERR_INVALID_ARGUMENT;
  export_ctx *x = export_new(mem);
  if (!x)
    return HR_ERR_NOMEM;
  int rv = from_descriptor(d, hr_handoff_ptr(h), &x->m.dl_tensor, x->shape,
                           x->strides);
  if (rv == 0 && b->sync_mode != HR_SYNC_PRODUCER_SYNCED) {
    if (has_stream) {
      /* The DLPack consumer's stream is a vendor handle of g's driver. */
      hr_gpu_stream *cs;
      rv = hr_gpu_stream_wrap(g, (void *)(intptr_t)stream, &cs);
      if (rv == 0) {
        rv = hr_handoff_consume(h, g, &cs, 1);
        hr_gpu_stream_del(cs);
      }
    } else {
      rv = hr_handoff_consume(h, g, NULL, 0);
    }
  }
  if (rv != 0) {
    hr__mem_free(&x->mem, x);
    return rv;
  }
  x->handoff = h;
  *out = &x->m;
  return 0;
}

int hr_dlpack_import_handoff(DLManagedTensorVersioned *m, hr_handoff_ledger *l,
                             void *consumer_stream, hr_descriptor *d,
                             hr_handoff **out, hr_wire_status *st) {
  if (!m || !l || !d || !out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (m->version.major != 1)
    return HR_ERR_UNSUPPORTED;
  void *base;
  int rv = hr_dlpack_to_descriptor(&m->dl_tensor, d, &base);
  if (rv != 0)
    return rv;
  hr_buffer_handle *b = &d->buffers[0];
  hr_handoff_request req;
  memset(&req, 0, sizeof req);
  req.transport = HR_HANDOFF_IN_PROCESS;
  req.consumer_stream = consumer_stream;
  req.consumer_stream_device_tag = b->device_tag;
  hr_handoff_payload p;
  memset(&p, 0, sizeof p);
  p.ptr = base;
  /* The producer ordered the stream it was given (the DLPack contract);
   * without one it must have synchronised on the host. */
  if (consumer_stream && b->device_tag != HR_DEV_CPU) {
    b->sync_mode = HR_SYNC_CONSUMER_STREAM;
    p.ordered_stream = consumer_stream;
  }
  /* No release callback until the check passed: a refusal must leave `m`
   * with the caller. */
  rv = hr_handoff_check(&req, b, &p, st);
  if (rv != 0)
    return rv;
  p.release = call_versioned_deleter;
  p.release_ctx = m;
  return hr_handoff_accept(l, &req, b, &p, out, st);
}
