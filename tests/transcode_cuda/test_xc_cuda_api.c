/*
 * hr_xc_cuda_run() without a CUDA device: argument checks, and
 * HR_ERR_UNSUPPORTED on devices of other backends or for plans the
 * kernels do not cover.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/gpu.h>
#include <hurray/transcode.h>

static hr_xc_plan *plan_2d(uint8_t tgt, uint8_t src_layout, uint8_t *buf) {
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_FLOAT32;
  d.rank = 2;
  d.shape[0] = 3;
  d.shape[1] = 5;
  d.layout.tag = src_layout;
  d.params.tile[0] = d.params.tile[1] = 2;
  hr_xc_tensor s;
  memset(&s, 0, sizeof s);
  s.desc = &d;
  s.buffers[0] = buf;
  s.sizes[0] = 4 * 4 * 6;
  hr_xc_target t;
  memset(&t, 0, sizeof t);
  t.layout = tgt;
  t.params.index_type = HR_ELEM_INT32;
  hr_xc_plan *p = NULL;
  assert_int_equal(hr_xc_plan_new(&p, &s, &t, NULL, NULL, NULL, NULL), 0);
  return p;
}

static void test_cpu_device(void **state) {
  (void)state;
  static uint8_t src[96], dst[96];
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.backend = "cpu";
  hr_gpu *g = NULL, *g2 = NULL;
  assert_int_equal(hr_gpu_open(&g, &cfg, NULL, NULL), 0);
  assert_int_equal(hr_gpu_open(&g2, &cfg, NULL, NULL), 0);
  hr_gpu_stream *s = NULL, *s2 = NULL;
  assert_int_equal(hr_gpu_stream_new(g, &s), 0);
  assert_int_equal(hr_gpu_stream_new(g2, &s2), 0);
  hr_xc_plan *p = plan_2d(HR_LAYOUT_COLUMN_MAJOR, HR_LAYOUT_ROW_MAJOR, src);

  assert_int_equal(hr_xc_cuda_run(NULL, p, src, dst, s),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_cuda_run(g, NULL, src, dst, s),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_cuda_run(g, p, src, dst, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_cuda_run(g, p, src, dst, s2),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_cuda_run(g, p, NULL, dst, s),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_cuda_run(g, p, src, NULL, s),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_cuda_run(g, p, src + 1, dst, s),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_xc_cuda_run(g, p, src, dst + 2, s),
                   HR_ERR_INVALID_ARGUMENT);
  /* Well-formed, but the cpu backend is no CUDA device. */
  assert_int_equal(hr_xc_cuda_run(g, p, src, dst, s), HR_ERR_UNSUPPORTED);
  hr_xc_plan_del(p);

  /* Sparse targets are never produced on the device. */
  p = plan_2d(HR_LAYOUT_SPARSE_CSR, HR_LAYOUT_ROW_MAJOR, src);
  assert_int_equal(hr_xc_cuda_run(g, p, src, dst, s), HR_ERR_UNSUPPORTED);
  hr_xc_plan_del(p);

  hr_gpu_stream_del(s);
  hr_gpu_stream_del(s2);
  assert_int_equal(hr_gpu_del(g), 0);
  assert_int_equal(hr_gpu_del(g2), 0);
}

/* The build embedded the kernels exactly when CMake found nvcc. */
static void test_built_flag(void **state) {
  (void)state;
  assert_int_equal(hr_xc_cuda_built(), HR_EXPECT_XC_CUDA);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_device),
      cmocka_unit_test(test_built_flag),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
