/* hr_tensor: wrap/alloc/composite, references, release exactly once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include <hurray/tensor.h>

#include "engine_core/testutil.h"

static void desc_rm(hr_descriptor *d, uint8_t elem, unsigned rank,
                    const uint64_t *shape) {
  memset(d, 0, sizeof *d);
  d->descriptor_version = 1;
  d->element_type = elem;
  d->rank = (uint8_t)rank;
  d->layout.tag = HR_LAYOUT_ROW_MAJOR;
  uint64_t n = 1;
  for (unsigned k = 0; k < rank; k++) {
    d->shape[k] = shape[k];
    n *= shape[k];
  }
  d->buffer_count = 1;
  d->buffers[0].size_bytes = n * hr_test_elem_bytes(elem);
}

static int released;
static void on_release(void *ctx) {
  released++;
  *(int *)ctx += 1;
}

static void test_wrap_release_once(void **state) {
  (void)state;
  uint64_t shape[2] = {3, 4};
  hr_descriptor d;
  desc_rm(&d, HR_ELEM_FLOAT32, 2, shape);
  float data[12];
  void *bufs[1] = {data};
  int count = 0;
  hr_tensor *t = NULL;
  assert_int_equal(hr_tensor_wrap(&t, &d, bufs, on_release, &count, NULL), 0);
  assert_ptr_equal(hr_tensor_buffer(t, 0), data);
  assert_null(hr_tensor_buffer(t, 1));
  assert_int_equal(hr_tensor_bytes(t), 48);
  assert_int_equal(hr_tensor_descriptor(t)->shape[1], 4);
  assert_ptr_equal(hr_tensor_ref(t), t);
  hr_tensor_unref(t);
  assert_int_equal(count, 0);
  hr_tensor_unref(t);
  assert_int_equal(count, 1);
  hr_tensor_unref(NULL);
  assert_null(hr_tensor_ref(NULL));
}

static void test_wrap_invalid(void **state) {
  (void)state;
  uint64_t shape[1] = {4};
  hr_descriptor d;
  desc_rm(&d, HR_ELEM_UINT8, 1, shape);
  void *bufs[1] = {NULL};
  int count = 0;
  hr_tensor *t = NULL;
  assert_int_equal(hr_tensor_wrap(&t, &d, bufs, on_release, &count, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_tensor_wrap(NULL, &d, bufs, NULL, NULL, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  d.layout.tag = HR_LAYOUT_COMPOSITE;
  d.buffer_count = 0;
  assert_int_equal(hr_tensor_wrap(&t, &d, NULL, on_release, &count, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(count, 0);
  /* A zero-size buffer may be NULL. */
  desc_rm(&d, HR_ELEM_UINT8, 1, (uint64_t[]){0});
  assert_int_equal(hr_tensor_wrap(&t, &d, bufs, on_release, &count, NULL), 0);
  hr_tensor_unref(t);
  assert_int_equal(count, 1);
}

static void test_wrap_deep_copies(void **state) {
  (void)state;
  hr_descriptor d;
  desc_rm(&d, HR_ELEM_FLOAT32, 2, (uint64_t[]){4, 4});
  uint8_t ext[4] = {4, 0, 0, 0};
  uint8_t params[3] = {1, 2, 3};
  d.layout.tag = HR_LAYOUT_PANEL;
  d.layout.ext = ext;
  d.layout.ext_len = 4;
  d.params_raw = params;
  d.params_len = 3;
  float data[16];
  void *bufs[1] = {data};
  hr_tensor *t = NULL;
  assert_int_equal(hr_tensor_wrap(&t, &d, bufs, NULL, NULL, NULL), 0);
  memset(ext, 0xEE, sizeof ext);
  memset(params, 0xEE, sizeof params);
  const hr_descriptor *c = hr_tensor_descriptor(t);
  assert_ptr_not_equal(c->layout.ext, ext);
  assert_int_equal(c->layout.ext[0], 4);
  assert_int_equal(c->params_raw[2], 3);
  hr_tensor_unref(t);
}

static void test_alloc_alignment(void **state) {
  (void)state;
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_FLOAT32;
  d.rank = 2;
  d.shape[0] = 4;
  d.shape[1] = 4;
  d.layout.tag = HR_LAYOUT_SPARSE_CSR;
  d.buffer_count = 3;
  d.buffers[0].size_bytes = 20;
  d.buffers[0].alignment_log2 = 3;
  d.buffers[1].size_bytes = 12;
  d.buffers[1].alignment_log2 = 12;
  d.buffers[2].size_bytes = 12;
  d.buffers[2].alignment_log2 = 2;
  for (unsigned minal = 0; minal <= 21; minal += 7) {
    hr_tensor *t = NULL;
    assert_int_equal(hr_tensor_alloc(&t, &d, minal, NULL), 0);
    uintptr_t b0 = (uintptr_t)hr_tensor_buffer(t, 0);
    uintptr_t b1 = (uintptr_t)hr_tensor_buffer(t, 1);
    uintptr_t b2 = (uintptr_t)hr_tensor_buffer(t, 2);
    uintptr_t m = (uintptr_t)1 << minal;
    assert_int_equal(b0 % 8, 0);
    assert_int_equal(b0 % m, 0);
    assert_int_equal(b1 % 4096, 0);
    assert_int_equal(b1 % m, 0);
    assert_int_equal(b2 % m, 0);
    /* § 7.1: buffer k starts at the first aligned position after k-1. */
    uintptr_t a1 = m > 4096 ? m : 4096;
    assert_int_equal(b1, (b0 + 20 + a1 - 1) & ~(a1 - 1));
    uintptr_t a2 = m > 4 ? m : 4;
    assert_int_equal(b2, (b1 + 12 + a2 - 1) & ~(a2 - 1));
    memset((void *)b0, 1, 20);
    memset((void *)b2, 1, 12);
    assert_int_equal(hr_tensor_bytes(t), 44);
    hr_tensor_unref(t);
  }
  assert_int_equal(hr_tensor_alloc(NULL, &d, 0, NULL), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_tensor_alloc((hr_tensor *[1]){0}, &d, 22, NULL),
                   HR_ERR_INVALID_ARGUMENT);
}

static void test_alloc_huge(void **state) {
  (void)state;
  hr_descriptor d;
  desc_rm(&d, HR_ELEM_UINT8, 1, (uint64_t[]){(3u << 20) + 5});
  hr_tensor *t = NULL;
  assert_int_equal(hr_tensor_alloc(&t, &d, 0, NULL), 0);
  uintptr_t b = (uintptr_t)hr_tensor_buffer(t, 0);
  assert_int_equal(b % (2u << 20), 0);
  memset((void *)b, 7, (3u << 20) + 5);
  hr_tensor_unref(t);
}

static void test_alloc_failing(void **state) {
  (void)state;
  hr_descriptor d;
  desc_rm(&d, HR_ELEM_UINT8, 1, (uint64_t[]){64});
  uint8_t ext[4] = {4, 0, 0, 0};
  d.layout.ext = ext;
  d.layout.ext_len = 4;
  for (int n = 0; n < 4; n++) {
    hr_test_failmem fm;
    hr_test_failmem_init(&fm, n);
    hr_tensor *t = NULL;
    int rv = hr_tensor_alloc(&t, &d, 6, &fm.mem);
    if (rv == 0)
      hr_tensor_unref(t);
    else
      assert_int_equal(rv, HR_ERR_NOMEM);
    assert_int_equal(fm.live, 0);
  }
}

static hr_tensor *plain(uint8_t elem, unsigned rank, const uint64_t *shape) {
  hr_descriptor d;
  desc_rm(&d, elem, rank, shape);
  hr_tensor *t = NULL;
  assert_int_equal(hr_tensor_alloc(&t, &d, 0, NULL), 0);
  return t;
}

static void head_desc(hr_descriptor *h, uint8_t rule, uint8_t elem,
                      unsigned rank, const uint64_t *shape, uint32_t count) {
  memset(h, 0, sizeof *h);
  h->descriptor_version = 1;
  h->element_type = elem;
  h->rank = (uint8_t)rank;
  for (unsigned k = 0; k < rank; k++)
    h->shape[k] = shape[k];
  h->layout.tag = HR_LAYOUT_COMPOSITE;
  h->params.member_count = count;
  h->params.rule = rule;
}

static void test_composite(void **state) {
  (void)state;
  hr_wire_status st;
  hr_tensor *a = plain(HR_ELEM_FLOAT32, 2, (uint64_t[]){2, 3});
  hr_tensor *b = plain(HR_ELEM_FLOAT32, 2, (uint64_t[]){5, 3});
  hr_tensor *ab[2] = {a, b};
  hr_descriptor h;
  hr_tensor *c = NULL;

  head_desc(&h, HR_COMPOSITE_TUPLE, HR_ELEM_NONE, 0, NULL, 2);
  assert_int_equal(hr_tensor_new_composite(&c, &h, ab, 2, NULL, &st), 0);
  assert_int_equal(hr_tensor_member_count(c), 2);
  assert_ptr_equal(hr_tensor_member(c, 1), b);
  assert_null(hr_tensor_member(c, 2));
  assert_int_equal(hr_tensor_bytes(c), 0);

  /* Nest it: depth 2. */
  hr_tensor *cc = NULL;
  hr_descriptor h2;
  head_desc(&h2, HR_COMPOSITE_TUPLE, HR_ELEM_NONE, 0, NULL, 1);
  assert_int_equal(hr_tensor_new_composite(&cc, &h2, &c, 1, NULL, &st), 0);
  hr_tensor_unref(c);

  /* Depth 9 is refused. */
  hr_tensor *cur = cc;
  for (int depth = 2; depth < 8; depth++) {
    hr_tensor *next = NULL;
    assert_int_equal(hr_tensor_new_composite(&next, &h2, &cur, 1, NULL, &st),
                     0);
    hr_tensor_unref(cur);
    cur = next;
  }
  hr_tensor *deep = NULL;
  assert_int_equal(hr_tensor_new_composite(&deep, &h2, &cur, 1, NULL, &st),
                   HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_COMPOSITE_INVALID);
  hr_tensor_unref(cur);

  /* TUPLE head with a rank. */
  head_desc(&h, HR_COMPOSITE_TUPLE, HR_ELEM_FLOAT32, 1, (uint64_t[]){1}, 2);
  assert_int_equal(hr_tensor_new_composite(&c, &h, ab, 2, NULL, &st),
                   HR_ERR_PROTO);
  /* Count mismatch. */
  head_desc(&h, HR_COMPOSITE_TUPLE, HR_ELEM_NONE, 0, NULL, 3);
  assert_int_equal(hr_tensor_new_composite(&c, &h, ab, 2, NULL, &st),
                   HR_ERR_PROTO);

  /* CONCAT along axis 0: 2 + 5 = 7. */
  head_desc(&h, HR_COMPOSITE_CONCAT, HR_ELEM_FLOAT32, 2, (uint64_t[]){7, 3}, 2);
  h.params.axis = 0;
  assert_int_equal(hr_tensor_new_composite(&c, &h, ab, 2, NULL, &st), 0);
  hr_tensor_unref(c);
  h.shape[0] = 8;
  assert_int_equal(hr_tensor_new_composite(&c, &h, ab, 2, NULL, &st),
                   HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_COMPOSITE_INVALID);
  h.shape[0] = 7;
  h.params.axis = 1;
  assert_int_equal(hr_tensor_new_composite(&c, &h, ab, 2, NULL, &st),
                   HR_ERR_PROTO);

  /* GROUP_QUANTIZED: [8, 6] int8, groups of 4 along axis 1 -> scales [8,2].*/
  hr_tensor *q = plain(HR_ELEM_INT8, 2, (uint64_t[]){8, 6});
  hr_tensor *s = plain(HR_ELEM_FLOAT16, 2, (uint64_t[]){8, 2});
  hr_tensor *z = plain(HR_ELEM_INT8, 2, (uint64_t[]){8, 2});
  hr_tensor *qsz[3] = {q, s, z};
  head_desc(&h, HR_COMPOSITE_GROUP_QUANTIZED, HR_ELEM_FLOAT32, 2,
            (uint64_t[]){8, 6}, 3);
  h.params.axis = 1;
  h.params.group_size = 4;
  h.params.has_zero_point = 1;
  assert_int_equal(hr_tensor_new_composite(&c, &h, qsz, 3, NULL, &st), 0);
  hr_tensor_unref(c);
  h.params.has_zero_point = 0;
  h.params.member_count = 2;
  assert_int_equal(hr_tensor_new_composite(&c, &h, qsz, 2, NULL, &st), 0);
  hr_tensor_unref(c);
  h.params.group_size = 2;
  assert_int_equal(hr_tensor_new_composite(&c, &h, qsz, 2, NULL, &st),
                   HR_ERR_PROTO);
  hr_tensor *sq[2] = {s, q};
  h.params.group_size = 4;
  assert_int_equal(hr_tensor_new_composite(&c, &h, sq, 2, NULL, &st),
                   HR_ERR_PROTO);

  /* Invalid arguments. */
  assert_int_equal(hr_tensor_new_composite(&c, NULL, ab, 2, NULL, &st),
                   HR_ERR_INVALID_ARGUMENT);
  hr_descriptor notc;
  desc_rm(&notc, HR_ELEM_UINT8, 1, (uint64_t[]){1});
  assert_int_equal(hr_tensor_new_composite(&c, &notc, ab, 2, NULL, &st),
                   HR_ERR_INVALID_ARGUMENT);

  hr_tensor_unref(q);
  hr_tensor_unref(s);
  hr_tensor_unref(z);
  hr_tensor_unref(a);
  hr_tensor_unref(b);
}

/* References dropped on many threads: the release runs exactly once. */
static hr_tensor *shared_t;
static void *drop_refs(void *arg) {
  (void)arg;
  for (int i = 0; i < 10000; i++) {
    hr_tensor_ref(shared_t);
    hr_tensor_unref(shared_t);
  }
  hr_tensor_unref(shared_t);
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  hr_descriptor d;
  desc_rm(&d, HR_ELEM_UINT8, 1, (uint64_t[]){8});
  uint8_t data[8];
  void *bufs[1] = {data};
  int count = 0;
  assert_int_equal(
      hr_tensor_wrap(&shared_t, &d, bufs, on_release, &count, NULL), 0);
  pthread_t th[4];
  for (int i = 0; i < 4; i++)
    hr_tensor_ref(shared_t);
  for (int i = 0; i < 4; i++)
    pthread_create(&th[i], NULL, drop_refs, NULL);
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  assert_int_equal(count, 0);
  hr_tensor_unref(shared_t);
  assert_int_equal(count, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wrap_release_once),
      cmocka_unit_test(test_wrap_invalid),
      cmocka_unit_test(test_wrap_deep_copies),
      cmocka_unit_test(test_alloc_alignment),
      cmocka_unit_test(test_alloc_huge),
      cmocka_unit_test(test_alloc_failing),
      cmocka_unit_test(test_composite),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
