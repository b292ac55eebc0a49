/*
 * DLPack interop: type and device maps, host tensors both ways (versioned
 * and legacy structs, C, Fortran and negative-stride views), and device
 * handoffs with the __dlpack__(stream=...) semantics on the simulated
 * device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/dlpack.h>

#include "common/test_util.h"
#include "gpu_testutil.h"

static void test_dtype_map(void **state) {
  (void)state;
  int mapped = 0;
  for (unsigned e = 0; e <= HR_ELEM_LAST; e++) {
    DLDataType dt;
    if (hr_dlpack_dtype((uint8_t)e, &dt) != 0)
      continue;
    mapped++;
    uint8_t back;
    assert_int_equal(hr_dlpack_elem(dt, &back), 0);
    assert_int_equal(back, e);
    assert_int_equal(dt.lanes, 1);
    assert_int_equal(dt.bits, hr_elem_bits((uint8_t)e));
  }
  assert_int_equal(mapped, HR_ELEM_LAST); /* every type but NONE */
  DLDataType v = {kDLFloat, 32, 4};
  uint8_t e;
  assert_int_equal(hr_dlpack_elem(v, &e), HR_ERR_UNSUPPORTED);
  DLDataType op = {kDLOpaqueHandle, 64, 1};
  assert_int_equal(hr_dlpack_elem(op, &e), HR_ERR_UNSUPPORTED);
}

static void test_device_map(void **state) {
  (void)state;
  for (unsigned t = 0; t <= HR_DEV_LAST; t++) {
    DLDevice d;
    assert_int_equal(hr_dlpack_device((uint8_t)t, HR_MEM_STANDARD, 3, &d), 0);
    uint8_t tag, mc;
    uint16_t idx;
    assert_int_equal(hr_dlpack_device_tag(d, &tag, &mc, &idx), 0);
    assert_int_equal(tag, t);
    assert_int_equal(idx, t == HR_DEV_CPU ? 0 : 3);
  }
  DLDevice d;
  assert_int_equal(hr_dlpack_device(HR_DEV_CUDA, HR_MEM_UNIFIED, 0, &d), 0);
  assert_int_equal(d.device_type, kDLCUDAManaged);
  uint8_t tag, mc;
  uint16_t idx;
  DLDevice host = {kDLCUDAHost, 0};
  assert_int_equal(hr_dlpack_device_tag(host, &tag, &mc, &idx), 0);
  assert_int_equal(tag, HR_DEV_CPU);
  assert_int_equal(mc, HR_MEM_PINNED);
  assert_int_equal(hr_dlpack_device(0x09, 0, 0, &d), HR_ERR_UNSUPPORTED);
  DLDevice bad = {kDLCUDA, -1};
  assert_int_equal(hr_dlpack_device_tag(bad, &tag, &mc, &idx),
                   HR_ERR_UNSUPPORTED);
}

static int released;
static void count_release(void *ctx) {
  (void)ctx;
  released++;
}

static void test_export_host_tensor(void **state) {
  (void)state;
  float data[6] = {1, 2, 3, 4, 5, 6};
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_FLOAT32;
  d.rank = 2;
  d.shape[0] = 2;
  d.shape[1] = 3;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  d.buffers[0].size_bytes = sizeof data;
  d.buffers[0].alignment_log2 = 2;
  void *bufs[1] = {data};
  hr_tensor *t;
  released = 0;
  assert_int_equal(hr_tensor_wrap(&t, &d, bufs, count_release, NULL, NULL), 0);
  DLManagedTensorVersioned *m;
  assert_int_equal(hr_dlpack_export_tensor(t, NULL, &m), 0);
  hr_tensor_unref(t); /* the DLPack tensor holds its own reference */
  assert_int_equal(released, 0);
  assert_int_equal(m->version.major, 1);
  assert_int_equal(m->flags, 0);
  assert_ptr_equal(m->dl_tensor.data, data);
  assert_int_equal(m->dl_tensor.device.device_type, kDLCPU);
  assert_int_equal(m->dl_tensor.ndim, 2);
  assert_int_equal(m->dl_tensor.shape[0], 2);
  assert_int_equal(m->dl_tensor.shape[1], 3);
  assert_int_equal(m->dl_tensor.strides[0], 3);
  assert_int_equal(m->dl_tensor.strides[1], 1);
  assert_int_equal(m->dl_tensor.dtype.code, kDLFloat);
  assert_int_equal(m->dl_tensor.dtype.bits, 32);
  /* Import it back: the same bytes, the same descriptor. */
  hr_tensor *t2;
  assert_int_equal(hr_dlpack_import_tensor(m, NULL, &t2), 0);
  const hr_descriptor *d2 = hr_tensor_descriptor(t2);
  assert_int_equal(d2->layout.tag, HR_LAYOUT_ROW_MAJOR);
  assert_int_equal(d2->buffers[0].size_bytes, sizeof data);
  assert_ptr_equal(hr_tensor_buffer(t2, 0), data);
  hr_tensor_unref(t2); /* calls the deleter, which drops the last ref */
  assert_int_equal(released, 1);
}

typedef struct legacy_box {
  DLManagedTensor m;
  int deleted;
} legacy_box;

static void legacy_deleter(DLManagedTensor *self) {
  ((legacy_box *)self)->deleted++;
}

typedef struct versioned_box {
  DLManagedTensorVersioned m;
  int deleted;
} versioned_box;

static void versioned_deleter(DLManagedTensorVersioned *self) {
  ((versioned_box *)self)->deleted++;
}

static void test_import_views(void **state) {
  (void)state;
  double data[12];
  int64_t shape[2] = {3, 4};
  /* Fortran order. */
  int64_t fstr[2] = {1, 3};
  legacy_box lb;
  memset(&lb, 0, sizeof lb);
  lb.m.dl_tensor.data = data;
  lb.m.dl_tensor.device.device_type = kDLCPU;
  lb.m.dl_tensor.ndim = 2;
  lb.m.dl_tensor.dtype.code = kDLFloat;
  lb.m.dl_tensor.dtype.bits = 64;
  lb.m.dl_tensor.dtype.lanes = 1;
  lb.m.dl_tensor.shape = shape;
  lb.m.dl_tensor.strides = fstr;
  lb.m.deleter = legacy_deleter;
  hr_tensor *t;
  assert_int_equal(hr_dlpack_import_legacy(&lb.m, NULL, &t), 0);
  assert_int_equal(hr_tensor_descriptor(t)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  assert_int_equal(hr_tensor_bytes(t), sizeof data);
  hr_tensor_unref(t);
  assert_int_equal(lb.deleted, 1);
  /* A reversed view: row 2 first, negative row stride, every other
   * column.  The buffer starts at the lowest addressed element. */
  int64_t vshape[2] = {3, 2};
  int64_t vstr[2] = {-4, 2};
  versioned_box vb;
  memset(&vb, 0, sizeof vb);
  vb.m.version.major = 1;
  vb.m.deleter = versioned_deleter;
  vb.m.dl_tensor = lb.m.dl_tensor;
  vb.m.dl_tensor.shape = vshape;
  vb.m.dl_tensor.strides = vstr;
  vb.m.dl_tensor.byte_offset = 8 * sizeof(double); /* element (2, 0) */
  assert_int_equal(hr_dlpack_import_tensor(&vb.m, NULL, &t), 0);
  const hr_descriptor *d = hr_tensor_descriptor(t);
  assert_int_equal(d->layout.tag, HR_LAYOUT_STRIDED);
  assert_int_equal(d->params.origin, 8);
  assert_int_equal(d->params.strides[0], -4);
  assert_int_equal(d->params.strides[1], 2);
  assert_ptr_equal(hr_tensor_buffer(t, 0), data);
  assert_int_equal(d->buffers[0].size_bytes, 11 * sizeof(double));
  /* Exporting it again gives the same view. */
  DLManagedTensorVersioned *m;
  assert_int_equal(hr_dlpack_export_tensor(t, NULL, &m), 0);
  assert_ptr_equal((char *)m->dl_tensor.data + m->dl_tensor.byte_offset,
                   &data[8]);
  assert_int_equal(m->dl_tensor.strides[0], -4);
  m->deleter(m);
  hr_tensor_unref(t);
  assert_int_equal(vb.deleted, 1);
  /* A future major version is refused untouched. */
  vb.m.version.major = 2;
  assert_int_equal(hr_dlpack_import_tensor(&vb.m, NULL, &t),
                   HR_ERR_UNSUPPORTED);
  assert_int_equal(vb.deleted, 1);
  /* Device memory is not a host tensor. */
  vb.m.version.major = 1;
  vb.m.dl_tensor.device.device_type = kDLCUDA;
  assert_int_equal(hr_dlpack_import_tensor(&vb.m, NULL, &t),
                   HR_ERR_UNSUPPORTED);
}

/* ---- device handoffs on the simulated device -------------------------- */

#define N 65536u

static void sleep_gate(void *arg) {
  (void)arg;
  hr__test_sleep(100000000);
}

static void test_handoff_export_import(void **state) {
  (void)state;
  hr_gpu *g;
  assert_int_equal(gt_open(&g, 0, 0), 0);
  hr_gpu_stream *P, *C;
  assert_int_equal(hr_gpu_stream_new(g, &P), 0);
  assert_int_equal(hr_gpu_stream_new(g, &C), 0);
  hr_gpu_buf *dev, *src, *out;
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, N, &dev), 0);
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_PINNED, N, &src), 0);
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_PINNED, N, &out), 0);
  gt_fill(hr_gpu_buf_host_ptr(src), N, 5);
  hr_handoff_ledger *l;
  assert_int_equal(hr_handoff_ledger_new(&l, NULL), 0);
  hr_descriptor d = tu_bytes_desc(N, 0, HR_DEV_CPU);
  for (int mode = HR_SYNC_PRODUCER_SYNCED; mode <= HR_SYNC_CONSUMER_STREAM;
       mode++) {
    /* A slow producer, then a handoff in `mode`. */
    assert_int_equal(hr_gpu_launch_host_fn(P, sleep_gate, NULL), 0);
    assert_int_equal(hr_gpu_copy_async(P, dev, 0, src, 0, N), 0);
    hr_handoff_request req;
    memset(&req, 0, sizeof req);
    req.transport = HR_HANDOFF_IN_PROCESS;
    hr_gpu_stream *Q;
    assert_int_equal(hr_gpu_stream_new(g, &Q), 0);
    req.consumer_stream = hr_gpu_stream_native(Q);
    req.consumer_stream_device_tag = HR_GPU_DEV_SIM;
    hr_buffer_handle b = d.buffers[0];
    hr_handoff_payload p;
    memset(&p, 0, sizeof p);
    p.ptr = hr_gpu_buf_device_ptr(dev);
    assert_int_equal(hr_handoff_prepare(P, (uint8_t)mode, &req, &b, &p), 0);
    hr_handoff *h;
    assert_int_equal(hr_handoff_accept(l, &req, &b, &p, &h, NULL), 0);
    d.buffers[0] = b;
    /* The DLPack consumer passes its stream C (stream 0 is refused). */
    DLManagedTensorVersioned *m;
    assert_int_equal(hr_dlpack_export_handoff(h, &d, g, 0, NULL, &m),
                     HR_ERR_INVALID_ARGUMENT);
    int64_t cs = (int64_t)(intptr_t)hr_gpu_stream_native(C);
    assert_int_equal(hr_dlpack_export_handoff(h, &d, g, cs, NULL, &m), 0);
    assert_ptr_equal(m->dl_tensor.data, hr_gpu_buf_device_ptr(dev));
    assert_int_equal(m->dl_tensor.device.device_type, kDLExtDev);
    /* Its work on C sees the producer's bytes. */
    memset(hr_gpu_buf_host_ptr(out), 0, N);
    assert_int_equal(hr_gpu_copy_async(C, out, 0, dev, 0, N), 0);
    assert_int_equal(hr_gpu_stream_sync(C), 0);
    assert_memory_equal(hr_gpu_buf_host_ptr(out), hr_gpu_buf_host_ptr(src),
                        N);
    m->deleter(m); /* the buffer release, after its work completed */
    gt_fill(hr_gpu_buf_host_ptr(src), N, 6 + (unsigned)mode);
    hr_gpu_stream_sync(P);
    hr_gpu_stream_del(Q);
  }
  hr_handoff_counts k;
  hr_handoff_ledger_counts(l, &k);
  assert_int_equal(k.buffer_releases, 3);
  assert_int_equal(k.event_releases, 1);
  assert_int_equal(k.live, 0);
  /* Import: a tensor obtained with __dlpack__(stream=C) is a P3 handoff on
   * C; without a stream it is producer-synced. */
  int64_t shape[1] = {N};
  versioned_box vb;
  memset(&vb, 0, sizeof vb);
  vb.m.version.major = 1;
  vb.m.deleter = versioned_deleter;
  vb.m.dl_tensor.data = hr_gpu_buf_device_ptr(dev);
  vb.m.dl_tensor.device.device_type = kDLExtDev;
  vb.m.dl_tensor.ndim = 1;
  vb.m.dl_tensor.dtype.code = kDLUInt;
  vb.m.dl_tensor.dtype.bits = 8;
  vb.m.dl_tensor.dtype.lanes = 1;
  vb.m.dl_tensor.shape = shape;
  hr_handoff *h;
  hr_descriptor di;
  assert_int_equal(hr_dlpack_import_handoff(&vb.m, l, hr_gpu_stream_native(C),
                                            &di, &h, NULL), 0);
  assert_int_equal(hr_handoff_sync_mode(h), HR_SYNC_CONSUMER_STREAM);
  assert_ptr_equal(hr_handoff_consumer_stream(h), hr_gpu_stream_native(C));
  assert_int_equal(di.buffers[0].size_bytes, N);
  assert_int_equal(hr_handoff_release_buffer(h), 0);
  hr_handoff_del(h);
  assert_int_equal(vb.deleted, 1);
  assert_int_equal(hr_dlpack_import_handoff(&vb.m, l, NULL, &di, &h, NULL), 0);
  assert_int_equal(hr_handoff_sync_mode(h), HR_SYNC_PRODUCER_SYNCED);
  assert_int_equal(hr_handoff_release_buffer(h), 0);
  hr_handoff_del(h);
  assert_int_equal(vb.deleted, 2);
  assert_int_equal(hr_handoff_ledger_del(l, &k), 0);
  assert_int_equal(k.missing_releases, 0);
  assert_int_equal(k.double_releases, 0);
  hr_gpu_buf_del(dev);
  hr_gpu_buf_del(src);
  hr_gpu_buf_del(out);
  hr_gpu_stream_del(P);
  hr_gpu_stream_del(C);
  assert_int_equal(hr_gpu_del(g), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_map),
      cmocka_unit_test(test_device_map),
      cmocka_unit_test(test_export_host_tensor),
      cmocka_unit_test(test_import_views),
      cmocka_unit_test(test_handoff_export_import),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
