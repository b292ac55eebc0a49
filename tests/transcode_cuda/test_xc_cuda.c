/*
 * The CUDA transcode kernels against the CPU kernels: random shapes,
 * source layouts (ROW_MAJOR, COLUMN_MAJOR, PERMUTED, STRIDED with gaps,
 * broadcasts and negative strides), regions, targets (ROW_MAJOR,
 * COLUMN_MAJOR, PERMUTED, TILED, PANEL) and element sizes; plus large
 * transposes.  The device output must equal hr_xc_run()'s byte for byte,
 * padding included (the device buffer is pre-filled with 0xCD so unwritten
 * bytes show).  Exits 77 when no CUDA device can be opened.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/gpu.h>
#include <hurray/transcode.h>

typedef struct env {
  hr_gpu *g;
  hr_gpu_stream *s;
} env;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(uint64_t n) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return n ? rng_state % n : 0;
}

static const uint8_t elems[] = {HR_ELEM_UINT8, HR_ELEM_FLOAT16,
                                HR_ELEM_FLOAT32, HR_ELEM_FLOAT64,
                                HR_ELEM_COMPLEX128};
static const unsigned esizes[] = {1, 2, 4, 8, 16};

/* Runs one case on the device and on the CPU and compares. */
static void check_case(env *e, const hr_descriptor *d, uint64_t src_bytes,
                       const hr_xc_target *t, const hr_xc_region *reg) {
  uint8_t *host = malloc(src_bytes ? src_bytes : 1);
  assert_non_null(host);
  for (uint64_t i = 0; i < src_bytes; i++)
    host[i] = (uint8_t)rnd(256);
  hr_gpu_buf *dsrc = NULL, *ddst = NULL, *hsrc = NULL, *hdst = NULL;
  assert_int_equal(hr_gpu_buf_alloc(e->g, HR_GPU_MEM_DEVICE,
                                    src_bytes ? src_bytes : 1, &dsrc), 0);
  hr_xc_tensor s;
  memset(&s, 0, sizeof s);
  s.desc = d;
  s.buffers[0] = host;
  s.sizes[0] = src_bytes;
  hr_xc_plan *p = NULL;
  assert_int_equal(hr_xc_plan_new(&p, &s, t, reg, NULL, NULL, NULL), 0);
  uint64_t out = hr_xc_plan_out_size(p);
  uint8_t *want = malloc(out ? out : 1), *got = malloc(out ? out : 1);
  assert_non_null(want);
  assert_non_null(got);
  assert_int_equal(hr_xc_run(p, 0, out, want), 0);
  memset(got, 0xCD, out ? out : 1);
  assert_int_equal(hr_gpu_buf_alloc(e->g, HR_GPU_MEM_DEVICE, out ? out : 1,
                                    &ddst), 0);
  assert_int_equal(hr_gpu_buf_wrap_host(e->g, host, src_bytes ? src_bytes : 1,
                                        &hsrc), 0);
  assert_int_equal(hr_gpu_buf_wrap_host(e->g, got, out ? out : 1, &hdst), 0);
  assert_int_equal(hr_gpu_copy_async(e->s, dsrc, 0, hsrc, 0, src_bytes), 0);
  assert_int_equal(hr_gpu_copy_async(e->s, ddst, 0, hdst, 0, out), 0);
  assert_int_equal(hr_xc_cuda_run(e->g, p, hr_gpu_buf_device_ptr(dsrc),
                                  hr_gpu_buf_device_ptr(ddst), e->s), 0);
  memset(got, 0, out ? out : 1);
  assert_int_equal(hr_gpu_copy_async(e->s, hdst, 0, ddst, 0, out), 0);
  assert_int_equal(hr_gpu_stream_sync(e->s), 0);
  if (out && memcmp(want, got, out) != 0) {
    uint64_t i = 0;
    while (want[i] == got[i])
      i++;
    fail_msg("layout %u -> %u, rank %u, esize elem %u: first difference at "
             "byte %llu of %llu", d->layout.tag, t->layout, d->rank,
             d->element_type, (unsigned long long)i, (unsigned long long)out);
  }
  hr_xc_plan_del(p);
  hr_gpu_buf_del(hsrc);
  hr_gpu_buf_del(hdst);
  hr_gpu_buf_del(dsrc);
  hr_gpu_buf_del(ddst);
  free(host);
  free(want);
  free(got);
}

static void random_perm(uint8_t *o, unsigned r) {
  for (unsigned k = 0; k < r; k++)
    o[k] = (uint8_t)k;
  for (unsigned k = r; k > 1; k--) {
    unsigned j = (unsigned)rnd(k);
    uint8_t x = o[k - 1];
    o[k - 1] = o[j];
    o[j] = x;
  }
}

static void test_random(void **state) {
  env *e = *state;
  for (int it = 0; it < 600; it++) {
    unsigned ei = (unsigned)rnd(5), es = esizes[ei];
    uint8_t tl = (uint8_t[]){HR_LAYOUT_ROW_MAJOR, HR_LAYOUT_COLUMN_MAJOR,
                             HR_LAYOUT_PERMUTED, HR_LAYOUT_TILED,
                             HR_LAYOUT_PANEL}[rnd(5)];
    unsigned r = tl == HR_LAYOUT_PANEL ? 2 : (unsigned)rnd(6);
    hr_descriptor d;
    memset(&d, 0, sizeof d);
    d.descriptor_version = 1;
    d.element_type = elems[ei];
    d.rank = (uint8_t)r;
    uint64_t n = 1;
    for (unsigned k = 0; k < r; k++) {
      d.shape[k] = 1 + rnd(r <= 2 ? 90 : r == 3 ? 20 : 9);
      n *= d.shape[k];
    }
    uint64_t bytes = n * es;
    d.layout.tag = (uint8_t[]){HR_LAYOUT_ROW_MAJOR, HR_LAYOUT_COLUMN_MAJOR,
                               HR_LAYOUT_PERMUTED, HR_LAYOUT_STRIDED}[rnd(4)];
    if (d.layout.tag == HR_LAYOUT_PERMUTED)
      random_perm(d.params.order, r);
    if (d.layout.tag == HR_LAYOUT_STRIDED) {
      /* Row-major strides with gaps, a broadcast dim or a reversed dim. */
      int64_t acc = 1 + (int64_t)rnd(2), lo = 0, hi = 0;
      for (unsigned k = r; k-- > 0;) {
        int64_t st = acc;
        unsigned pick = (unsigned)rnd(5);
        if (pick == 0)
          st = 0;
        else if (pick == 1)
          st = -acc;
        d.params.strides[k] = st;
        int64_t span = st * (int64_t)(d.shape[k] - 1);
        if (span < 0)
          lo += span;
        else
          hi += span;
        acc *= (int64_t)d.shape[k] + (int64_t)rnd(2);
      }
      d.params.origin = (uint64_t)-lo;
      bytes = (uint64_t)(hi - lo + 1) * es;
    }
    hr_xc_region reg, *rp = NULL;
    if (rnd(3) == 0) {
      for (unsigned k = 0; k < r; k++) {
        reg.offset[k] = rnd(d.shape[k]);
        reg.shape[k] = 1 + rnd(d.shape[k] - reg.offset[k]);
      }
      rp = &reg;
    }
    hr_xc_target t;
    memset(&t, 0, sizeof t);
    t.layout = tl;
    if (tl == HR_LAYOUT_PERMUTED)
      random_perm(t.params.order, r);
    for (unsigned k = 0; k < r; k++)
      t.params.tile[k] = 1 + (uint32_t)rnd(9);
    t.params.mr = 1 + (uint32_t)rnd(12);
    check_case(e, &d, bytes, &t, rp);
  }
}

/* Row-major to column-major or permuted at sizes that take many tiles
 * and every edge case of the 32x32 transpose. */
static void test_large_transposes(void **state) {
  env *e = *state;
  static const uint64_t shapes[][3] = {
      {1000, 777, 0}, {4096, 33, 0}, {33, 4096, 0}, {31, 65, 7},
      {3, 300, 200},  {257, 5, 129}};
  for (unsigned i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (unsigned ei = 0; ei < 5; ei++) {
      hr_descriptor d;
      memset(&d, 0, sizeof d);
      d.descriptor_version = 1;
      d.element_type = elems[ei];
      d.rank = shapes[i][2] ? 3 : 2;
      uint64_t n = 1;
      for (unsigned k = 0; k < d.rank; k++) {
        d.shape[k] = shapes[i][k];
        n *= d.shape[k];
      }
      d.layout.tag = HR_LAYOUT_ROW_MAJOR;
      hr_xc_target t;
      memset(&t, 0, sizeof t);
      t.layout = HR_LAYOUT_COLUMN_MAJOR;
      check_case(e, &d, n * esizes[ei], &t, NULL);
      if (d.rank == 3) {
        t.layout = HR_LAYOUT_PERMUTED;
        t.params.order[0] = 1;
        t.params.order[1] = 2;
        t.params.order[2] = 0;
        check_case(e, &d, n * esizes[ei], &t, NULL);
      }
    }
}

static int setup(void **state) {
  static env e;
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.backend = "cuda";
  if (hr_gpu_open(&e.g, &cfg, NULL, NULL) != 0 ||
      hr_gpu_stream_new(e.g, &e.s) != 0)
    return -1;
  *state = &e;
  return 0;
}

static int teardown(void **state) {
  env *e = *state;
  hr_gpu_stream_del(e->s);
  return hr_gpu_del(e->g);
}

int main(void) {
  hr_gpu_probe_info info;
  memset(&info, 0, sizeof info);
  if (!hr_xc_cuda_built()) {
    printf("skipped: the library was built without nvcc\n");
    return 77;
  }
  if (hr_gpu_probe("cuda", &info) != 0 || info.device_count == 0) {
    printf("skipped: no CUDA device (%s)\n", info.reason);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random),
      cmocka_unit_test(test_large_transposes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
