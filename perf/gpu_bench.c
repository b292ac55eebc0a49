/*
 * gpu_bench: staging bandwidth of the device layer.
 *
 * Compares, in both directions, a transfer of SIZE bytes between device
 * memory and the host
 *   - as one copy between device memory and pinned memory (on CUDA this is
 *     cuMemcpyAsync on cuMemHostAlloc memory: what cudaMemcpy of pinned
 *     memory does), the reference;
 *   - through the library's staging path (hr_gpu_stager: a ring of pinned
 *     chunks, one event per chunk, the host handed each chunk as soon as it
 *     landed), which is how the engine moves device tensors to and from the
 *     network;
 * and prints the ratio staged / reference per direction.  The target is a
 * ratio of at least 0.85.  A smaller verification run first checks that
 * the staged bytes are right.
 *
 * Usage: gpu_bench [--backend NAME] [--size BYTES[K|M|G]] [--chunk BYTES]
 *                  [--slots N] [--iters N] [--target RATIO]
 * Exit status: 0 when every ratio reaches the target, 1 when one does not,
 * 2 on an error, 77 when the backend is unavailable here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hurray/gpu.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t parse_size(const char *s) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  switch (*end) {
  case 'k': case 'K': v <<= 10; break;
  case 'm': case 'M': v <<= 20; break;
  case 'g': case 'G': v <<= 30; break;
  default: break;
  }
  return v;
}

#define CHECK(call)                                                            \
  do {                                                                         \
    int rv_ = (call);                                                          \
    if (rv_ != 0) {                                                            \
      fprintf(stderr, "gpu_bench: %s failed: %s\n", #call, hr_strerror(rv_));  \
      exit(2);                                                                 \
    }                                                                          \
  } while (0)

/* The engine's sink and source would hand the pinned chunk to a socket or
 * take it from one; the benchmark measures the pipeline itself. */
static int sink_nop(void *user, uint64_t off, const void *data, size_t len) {
  (void)user;
  (void)off;
  (void)data;
  (void)len;
  return 0;
}
static int source_nop(void *user, uint64_t off, void *data, size_t len) {
  (void)user;
  (void)off;
  (void)data;
  (void)len;
  return 0;
}

static int sink_copy(void *user, uint64_t off, const void *data, size_t len) {
  memcpy((char *)user + off, data, len);
  return 0;
}
static int source_copy(void *user, uint64_t off, void *data, size_t len) {
  memcpy(data, (const char *)user + off, len);
  return 0;
}

/* Checks a staged round trip of `n` bytes. */
static int verify(hr_gpu *g, hr_gpu_stager *st, hr_gpu_buf *dev, size_t n) {
  unsigned char *in = malloc(n), *out = malloc(n);
  if (!in || !out) {
    fprintf(stderr, "gpu_bench: out of host memory\n");
    exit(2);
  }
  for (size_t i = 0; i < n; i++)
    in[i] = (unsigned char)(i * 131u + (i >> 12));
  memset(out, 0, n);
  (void)g;
  CHECK(hr_gpu_stager_h2d(st, dev, 0, n, source_copy, in));
  CHECK(hr_gpu_stager_d2h(st, dev, 0, n, sink_copy, out));
  int ok = memcmp(in, out, n) == 0;
  free(in);
  free(out);
  return ok;
}

int main(int argc, char **argv) {
  const char *backend = "cuda";
  uint64_t size = 1ull << 30;
  size_t chunk = 16u << 20;
  unsigned slots = 4, iters = 3;
  double target = 0.85;
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "gpu_bench: %s needs a value\n", a);
      return 2;
    }
    if (!strcmp(a, "--backend"))
      backend = v;
    else if (!strcmp(a, "--size"))
      size = parse_size(v);
    else if (!strcmp(a, "--chunk"))
      chunk = (size_t)parse_size(v);
    else if (!strcmp(a, "--slots"))
      slots = (unsigned)atoi(v);
    else if (!strcmp(a, "--iters"))
      iters = (unsigned)atoi(v);
    else if (!strcmp(a, "--target"))
      target = atof(v);
    else {
      fprintf(stderr, "gpu_bench: unknown option %s\n", a);
      return 2;
    }
  }
  if (size == 0 || chunk < 4096 || iters == 0) {
    fprintf(stderr, "gpu_bench: bad size, chunk or iters\n");
    return 2;
  }
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.backend = backend;
  hr_gpu_probe_info why;
  hr_gpu *g;
  int rv = hr_gpu_open(&g, &cfg, NULL, &why);
  if (rv == HR_ERR_UNSUPPORTED) {
    printf("gpu_bench: backend %s unavailable: %s\n", backend, why.reason);
    return 77;
  }
  CHECK(rv);
  hr_gpu_caps caps;
  CHECK(hr_gpu_query(g, &caps));
  printf("gpu_bench: %s on %s, %.0f MiB, chunk %.0f MiB x %u slots, "
         "best of %u\n",
         backend, caps.name, (double)size / (1 << 20),
         (double)chunk / (1 << 20), slots, iters);
  hr_gpu_buf *dev, *pinned;
  CHECK(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, size, &dev));
  int kind = (caps.flags & HR_GPU_CAP_PINNED) ? HR_GPU_MEM_PINNED
                                              : HR_GPU_MEM_DEVICE;
  CHECK(hr_gpu_buf_alloc(g, kind, size, &pinned));
  hr_gpu_stream *s;
  CHECK(hr_gpu_stream_new(g, &s));
  hr_gpu_stager *st;
  CHECK(hr_gpu_stager_new(&st, g, chunk, slots, NULL));

  size_t vn = size < (64u << 20) ? (size_t)size : (64u << 20);
  if (!verify(g, st, dev, vn)) {
    printf("gpu_bench: FAIL: staged round trip of %zu bytes differs\n", vn);
    return 2;
  }
  printf("gpu_bench: staged round trip of %.0f MiB verified\n",
         (double)vn / (1 << 20));

  double best[4] = {0, 0, 0, 0}; /* ref H2D, ref D2H, staged H2D, D2H */
  for (unsigned it = 0; it < iters; it++) {
    double t0 = now_s();
    CHECK(hr_gpu_copy_async(s, dev, 0, pinned, 0, size));
    CHECK(hr_gpu_stream_sync(s));
    double t1 = now_s();
    CHECK(hr_gpu_copy_async(s, pinned, 0, dev, 0, size));
    CHECK(hr_gpu_stream_sync(s));
    double t2 = now_s();
    CHECK(hr_gpu_stager_h2d(st, dev, 0, size, source_nop, NULL));
    double t3 = now_s();
    CHECK(hr_gpu_stager_d2h(st, dev, 0, size, sink_nop, NULL));
    double t4 = now_s();
    double bw[4] = {(double)size / (t1 - t0), (double)size / (t2 - t1),
                    (double)size / (t3 - t2), (double)size / (t4 - t3)};
    for (int k = 0; k < 4; k++)
      if (bw[k] > best[k])
        best[k] = bw[k];
  }
  const char *dir[2] = {"H2D", "D2H"};
  int pass = 1;
  for (int k = 0; k < 2; k++) {
    double ratio = best[2 + k] / best[k];
    int ok = ratio >= target;
    pass &= ok;
    printf("gpu_bench: %s  pinned copy %7.2f GB/s  staged %7.2f GB/s  "
           "ratio %.3f  (target %.2f: %s)\n",
           dir[k], best[k] / 1e9, best[2 + k] / 1e9, ratio, target,
           ok ? "PASS" : "FAIL");
  }
  hr_gpu_stager_del(st);
  hr_gpu_stream_del(s);
  hr_gpu_buf_del(pinned);
  hr_gpu_buf_del(dev);
  CHECK(hr_gpu_del(g));
  printf("gpu_bench: %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
