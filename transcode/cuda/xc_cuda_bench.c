/*
 * xc_cuda_bench: the CUDA row-major -> column-major transpose
 * (hr_xc_cuda_run) against a device-to-device copy of the same bytes
 * (cuMemcpyAsync, i.e. cudaMemcpy D2D), for 2-, 4- and 8-byte elements.
 * Prints GB/s (bytes of the output per second) and the ratio.
 *
 *   xc_cuda_bench [MiB]      (default 256: a square matrix of that size)
 *
 * Exit status: 0, or 77 when no CUDA device or no kernels.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hurray/gpu.h>
#include <hurray/transcode.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  uint64_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 256;
  if (!hr_xc_cuda_built()) {
    printf("xc_cuda_bench: built without nvcc\n");
    return 77;
  }
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.backend = "cuda";
  hr_gpu *g = NULL;
  hr_gpu_stream *s = NULL;
  hr_gpu_probe_info why;
  memset(&why, 0, sizeof why);
  if (hr_gpu_open(&g, &cfg, NULL, &why) != 0) {
    printf("xc_cuda_bench: no CUDA device (%s)\n", why.reason);
    return 77;
  }
  int rv = hr_gpu_stream_new(g, &s);
  static const uint8_t types[] = {HR_ELEM_FLOAT16, HR_ELEM_FLOAT32,
                                  HR_ELEM_FLOAT64};
  static const unsigned sizes[] = {2, 4, 8};
  for (unsigned ti = 0; rv == 0 && ti < 3; ti++) {
    uint64_t n = (uint64_t)sqrt((double)(mib << 20) / sizes[ti]);
    uint64_t bytes = n * n * sizes[ti];
    hr_gpu_buf *a = NULL, *b = NULL;
    if ((rv = hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, bytes, &a)) != 0 ||
        (rv = hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, bytes, &b)) != 0)
      break;
    hr_descriptor d;
    memset(&d, 0, sizeof d);
    d.descriptor_version = 1;
    d.element_type = types[ti];
    d.rank = 2;
    d.shape[0] = d.shape[1] = n;
    d.layout.tag = HR_LAYOUT_ROW_MAJOR;
    hr_xc_tensor src;
    memset(&src, 0, sizeof src);
    src.desc = &d;
    src.buffers[0] = hr_gpu_buf_device_ptr(a);
    src.sizes[0] = bytes;
    hr_xc_target t;
    memset(&t, 0, sizeof t);
    t.layout = HR_LAYOUT_COLUMN_MAJOR;
    hr_xc_plan *p = NULL;
    if ((rv = hr_xc_plan_new(&p, &src, &t, NULL, NULL, NULL, NULL)) != 0)
      break;
    const int reps = 20;
    double tx = 0, tc = 0;
    for (int pass = 0; pass < 2 && rv == 0; pass++) { /* 0: warm-up */
      double t0 = now_s();
      for (int i = 0; i < reps && rv == 0; i++)
        rv = hr_xc_cuda_run(g, p, hr_gpu_buf_device_ptr(a),
                            hr_gpu_buf_device_ptr(b), s);
      if (rv == 0)
        rv = hr_gpu_stream_sync(s);
      double t1 = now_s();
      for (int i = 0; i < reps && rv == 0; i++)
        rv = hr_gpu_copy_async(s, b, 0, a, 0, bytes);
      if (rv == 0)
        rv = hr_gpu_stream_sync(s);
      tx = t1 - t0;
      tc = now_s() - t1;
    }
    if (rv == 0) {
      double gx = (double)bytes * reps / tx / 1e9;
      double gc = (double)bytes * reps / tc / 1e9;
      printf("%llux%llu x %u B: transpose %.1f GB/s, D2D copy %.1f GB/s, "
             "ratio %.2f\n", (unsigned long long)n, (unsigned long long)n,
             sizes[ti], gx, gc, gx / gc);
    }
    hr_xc_plan_del(p);
    hr_gpu_buf_del(a);
    hr_gpu_buf_del(b);
  }
  if (rv != 0)
    printf("xc_cuda_bench: error %d\n", rv);
  if (s)
    hr_gpu_stream_del(s);
  hr_gpu_del(g);
  return rv == 0 ? 0 : 1;
}
