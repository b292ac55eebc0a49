/*
 * .npy and .safetensors: parsing every dtype, C and Fortran order,
 * big-endian conversion, the extended types, the writer's round trip,
 * zero-copy mapping, and rejection of malformed files.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/files.h>

static char tmpdir[64];

static int setup(void **state) {
  (void)state;
  strcpy(tmpdir, "/tmp/hr_files_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[128];
  (void)state;
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *path_of(const char *name) {
  static char p[256];
  snprintf(p, sizeof p, "%s/%s", tmpdir, name);
  return p;
}

static void write_file(const char *path, const void *a, size_t an,
                       const void *b, size_t bn) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(a, 1, an, f), an);
  if (bn)
    assert_int_equal(fwrite(b, 1, bn, f), bn);
  assert_int_equal(fclose(f), 0);
}

/* Builds a v1.0 .npy header around `dict` (padded to 64 bytes). */
static size_t npy_header(char *out, const char *dict) {
  size_t n = strlen(dict), total = 10 + n + 1, pad = (64 - total % 64) % 64;
  size_t hlen = n + pad + 1;
  memcpy(out, "\x93NUMPY\x01\x00", 8);
  out[8] = (char)(hlen & 0xff);
  out[9] = (char)(hlen >> 8);
  memcpy(out + 10, dict, n);
  memset(out + 10 + n, ' ', pad);
  out[10 + n + pad] = '\n';
  return total + pad;
}

static hr_tensor *load_dict(const char *dict, const void *data, size_t n,
                            int expect) {
  char hdr[512], why[256];
  size_t h = npy_header(hdr, dict);
  hr_tensor *t = NULL;
  int rv;

  write_file(path_of("t.npy"), hdr, h, data, n);
  why[0] = '\0';
  rv = hr_npy_load(&t, path_of("t.npy"), NULL, why, sizeof why);
  assert_int_equal(rv, expect);
  if (rv)
    assert_true(why[0] != '\0');
  return t;
}

static void test_npy_dtypes(void **state) {
  static const struct {
    const char *descr;
    uint8_t elem;
    size_t size;
  } cases[] = {
      {"|b1", HR_ELEM_BOOL, 1},
      {"|i1", HR_ELEM_INT8, 1},
      {"|u1", HR_ELEM_UINT8, 1},
      {"<i2", HR_ELEM_INT16, 2},
      {"<u2", HR_ELEM_UINT16, 2},
      {"<i4", HR_ELEM_INT32, 4},
      {"<u4", HR_ELEM_UINT32, 4},
      {"<i8", HR_ELEM_INT64, 8},
      {"<u8", HR_ELEM_UINT64, 8},
      {"<f2", HR_ELEM_FLOAT16, 2},
      {"<f4", HR_ELEM_FLOAT32, 4},
      {"<f8", HR_ELEM_FLOAT64, 8},
      {"<c8", HR_ELEM_COMPLEX64, 8},
      {"<c16", HR_ELEM_COMPLEX128, 16},
      {"=f4", HR_ELEM_FLOAT32, 4},
      {"<V2", HR_ELEM_BFLOAT16, 2},
      {"bfloat16", HR_ELEM_BFLOAT16, 2},
      {"float8_e4m3fn", HR_ELEM_FLOAT8_E4M3FN, 1},
      {"float8_e5m2", HR_ELEM_FLOAT8_E5M2, 1},
  };
  uint8_t data[6 * 16];
  size_t i, k;

  (void)state;
  for (k = 0; k < sizeof data; k++)
    data[k] = (uint8_t)(k * 7 + 1);
  for (i = 0; i < sizeof cases / sizeof *cases; i++) {
    char dict[128];
    const hr_descriptor *d;
    hr_tensor *t;
    snprintf(dict, sizeof dict,
             "{'descr': '%s', 'fortran_order': False, 'shape': (2, 3), }",
             cases[i].descr);
    t = load_dict(dict, data, 6 * cases[i].size, 0);
    d = hr_tensor_descriptor(t);
    assert_int_equal(d->element_type, cases[i].elem);
    assert_int_equal(d->layout.tag, HR_LAYOUT_ROW_MAJOR);
    assert_int_equal(d->rank, 2);
    assert_int_equal(d->shape[0], 2);
    assert_int_equal(d->shape[1], 3);
    assert_int_equal(d->buffer_count, 1);
    assert_int_equal(d->buffers[0].size_bytes, 6 * cases[i].size);
    assert_int_equal(d->buffers[0].device_tag, HR_DEV_CPU);
    assert_int_equal(d->buffers[0].sync_mode, HR_SYNC_PRODUCER_SYNCED);
    assert_memory_equal(hr_tensor_buffer(t, 0), data, 6 * cases[i].size);
    hr_tensor_unref(t);
  }
}

static void test_npy_structured_ext(void **state) {
  uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  hr_tensor *t;

  (void)state;
  t = load_dict("{'descr': [('bfloat16', '<u2')], 'fortran_order': False, "
                "'shape': (4,), }",
                data, 8, 0);
  assert_int_equal(hr_tensor_descriptor(t)->element_type, HR_ELEM_BFLOAT16);
  hr_tensor_unref(t);
  t = load_dict("{'descr': [('float8_e5m2', '|u1')], 'fortran_order': False, "
                "'shape': (8,), }",
                data, 8, 0);
  assert_int_equal(hr_tensor_descriptor(t)->element_type, HR_ELEM_FLOAT8_E5M2);
  hr_tensor_unref(t);
  /* Two fields are not a tensor; a mismatched width is refused. */
  load_dict("{'descr': [('a', '<u2'), ('b', '<u2')], 'fortran_order': "
            "False, 'shape': (2,), }",
            data, 8, HR_ERR_UNSUPPORTED);
  load_dict("{'descr': [('bfloat16', '<u4')], 'fortran_order': False, "
            "'shape': (2,), }",
            data, 8, HR_ERR_UNSUPPORTED);
}

static void test_npy_fortran_and_scalar(void **state) {
  float v[6] = {1, 2, 3, 4, 5, 6};
  hr_tensor *t;
  const hr_descriptor *d;

  (void)state;
  t = load_dict("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", v,
                sizeof v, 0);
  d = hr_tensor_descriptor(t);
  assert_int_equal(d->layout.tag, HR_LAYOUT_COLUMN_MAJOR);
  hr_tensor_unref(t);
  /* Fortran order of rank 1 is the same bytes: ROW_MAJOR. */
  t = load_dict("{'descr': '<f4', 'fortran_order': True, 'shape': (6,), }", v,
                sizeof v, 0);
  assert_int_equal(hr_tensor_descriptor(t)->layout.tag, HR_LAYOUT_ROW_MAJOR);
  hr_tensor_unref(t);
  t = load_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", v, 4,
                0);
  d = hr_tensor_descriptor(t);
  assert_int_equal(d->rank, 0);
  assert_int_equal(d->buffers[0].size_bytes, 4);
  hr_tensor_unref(t);
  /* Empty tensor: one buffer of 0 bytes. */
  t = load_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }",
                NULL, 0, 0);
  d = hr_tensor_descriptor(t);
  assert_int_equal(d->buffers[0].size_bytes, 0);
  hr_tensor_unref(t);
  /* Python 2 longs and double quotes. */
  t = load_dict("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": "
                "(2L, 3L)}",
                v, sizeof v, 0);
  assert_int_equal(hr_tensor_descriptor(t)->shape[1], 3);
  hr_tensor_unref(t);
}

static void test_npy_big_endian(void **state) {
  uint8_t be[8] = {0x00, 0x00, 0x00, 0x01, 0x01, 0x02, 0x03, 0x04};
  uint8_t c[16] = {0x3f, 0x80, 0, 0, 0x40, 0,    0, 0,
                   0x40, 0x40, 0, 0, 0x40, 0x80, 0, 0};
  hr_tensor *t;
  const uint32_t *u;
  const float *f;

  (void)state;
  t = load_dict("{'descr': '>u4', 'fortran_order': False, 'shape': (2,), }", be,
                8, 0);
  u = hr_tensor_buffer(t, 0);
  assert_int_equal(u[0], 1);
  assert_int_equal(u[1], 0x01020304);
  hr_tensor_unref(t);
  /* Complex: each part swapped on its own. */
  t = load_dict("{'descr': '>c8', 'fortran_order': False, 'shape': (2,), }", c,
                16, 0);
  f = hr_tensor_buffer(t, 0);
  assert_true(f[0] == 1.0f && f[1] == 2.0f && f[2] == 3.0f && f[3] == 4.0f);
  hr_tensor_unref(t);
}

static void test_npy_rejects(void **state) {
  uint8_t d[64] = {0};
  char why[256];
  hr_npy_info info;
  hr_tensor *t;

  (void)state;
  load_dict("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", d, 16,
            HR_ERR_UNSUPPORTED);
  load_dict("{'descr': '<U4', 'fortran_order': False, 'shape': (2,), }", d, 32,
            HR_ERR_UNSUPPORTED);
  load_dict("{'descr': '|V1', 'fortran_order': False, 'shape': (2,), }", d, 2,
            HR_ERR_UNSUPPORTED);
  /* An empty dtype kind (the parser once read past its NUL). */
  load_dict("{'descr': '<', 'fortran_order': False, 'shape': (2,), }", d, 2,
            HR_ERR_UNSUPPORTED);
  load_dict("{'descr': '', 'fortran_order': False, 'shape': (2,), }", d, 2,
            HR_ERR_UNSUPPORTED);
  load_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (20,), }", d, 16,
            HR_ERR_INVALID_ARGUMENT); /* truncated data */
  load_dict("{'descr': '<f4', 'shape': (2,), }", d, 8,
            HR_ERR_INVALID_ARGUMENT); /* no fortran_order */
  load_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), "
            "'extra': 1}",
            d, 8, HR_ERR_INVALID_ARGUMENT);
  load_dict("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", d, 8,
            HR_ERR_INVALID_ARGUMENT);
  load_dict("{'descr': '<f4', 'fortran_order': False, 'shape': "
            "(4294967296, 4294967296, 4294967296), }",
            d, 8, HR_ERR_INVALID_ARGUMENT); /* size overflow */
  load_dict("{'descr': '<f4', 'fortran_order': False, 'shape': "
            "(1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
            "1,1), }",
            d, 8, HR_ERR_INVALID_ARGUMENT); /* rank 33 */
  load_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", d, 8,
            HR_ERR_INVALID_ARGUMENT); /* unterminated */
  /* Bad magic, truncated header, unknown version. */
  assert_int_equal(hr_npy_parse("NUMPY\x01\x00\x10\x00", 10, UINT64_MAX, &info,
                                why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_npy_parse("\x93NUMPY\x01\x00\xff\x00{", 11, UINT64_MAX,
                                &info, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_npy_parse("\x93NUMPY\x09\x00\x01\x00{", 11, UINT64_MAX,
                                &info, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(
      hr_npy_load(&t, path_of("missing.npy"), NULL, why, sizeof why),
      HR_ERR_IO);
  assert_non_null(strstr(why, "missing.npy"));
}

static void test_npy_v2_header(void **state) {
  char buf[256];
  const char *dict =
      "{'descr': '<i2', 'fortran_order': False, 'shape': (3,), }";
  size_t n = strlen(dict), hl = 128 - 12;
  int16_t v[3] = {-1, 2, -3};
  hr_tensor *t;

  (void)state;
  memcpy(buf, "\x93NUMPY\x02\x00", 8);
  buf[8] = (char)hl;
  buf[9] = buf[10] = buf[11] = 0;
  memcpy(buf + 12, dict, n);
  memset(buf + 12 + n, ' ', hl - n - 1);
  buf[12 + hl - 1] = '\n';
  write_file(path_of("v2.npy"), buf, 12 + hl, v, sizeof v);
  assert_int_equal(hr_npy_load(&t, path_of("v2.npy"), NULL, NULL, 0), 0);
  assert_memory_equal(hr_tensor_buffer(t, 0), v, sizeof v);
  hr_tensor_unref(t);
}

static void test_npy_save_roundtrip(void **state) {
  static const uint8_t elems[] = {
      HR_ELEM_BOOL,      HR_ELEM_INT8,          HR_ELEM_UINT8,
      HR_ELEM_INT16,     HR_ELEM_UINT16,        HR_ELEM_INT32,
      HR_ELEM_UINT32,    HR_ELEM_INT64,         HR_ELEM_UINT64,
      HR_ELEM_FLOAT16,   HR_ELEM_BFLOAT16,      HR_ELEM_FLOAT32,
      HR_ELEM_FLOAT64,   HR_ELEM_FLOAT8_E4M3FN, HR_ELEM_FLOAT8_E5M2,
      HR_ELEM_COMPLEX64, HR_ELEM_COMPLEX128};
  uint8_t data[12 * 16];
  size_t i, k;

  (void)state;
  for (k = 0; k < sizeof data; k++)
    data[k] = (uint8_t)(k ^ 0x5a);
  for (i = 0; i < sizeof elems; i++) {
    int layout;
    for (layout = HR_LAYOUT_ROW_MAJOR; layout <= HR_LAYOUT_COLUMN_MAJOR;
         layout++) {
      hr_descriptor d;
      hr_tensor *t;
      const hr_descriptor *e;
      size_t bytes = 12 * (hr_elem_bits(elems[i]) / 8);
      memset(&d, 0, sizeof d);
      d.descriptor_version = 1;
      d.element_type = elems[i];
      d.rank = 2;
      d.shape[0] = 3;
      d.shape[1] = 4;
      d.layout.tag = (uint8_t)layout;
      d.buffer_count = 1;
      d.buffers[0].size_bytes = bytes;
      assert_int_equal(hr_npy_save(path_of("rt.npy"), &d, data, NULL, 0), 0);
      assert_int_equal(hr_npy_load(&t, path_of("rt.npy"), NULL, NULL, 0), 0);
      e = hr_tensor_descriptor(t);
      assert_int_equal(e->element_type, elems[i]);
      assert_int_equal(e->layout.tag, layout);
      assert_int_equal(e->shape[0], 3);
      assert_int_equal(e->shape[1], 4);
      assert_int_equal(e->buffers[0].size_bytes, bytes);
      assert_memory_equal(hr_tensor_buffer(t, 0), data, bytes);
      /* The data starts 64-byte aligned in the file. */
      {
        char hdr[256];
        FILE *f = fopen(path_of("rt.npy"), "rb");
        hr_npy_info info;
        size_t got = fread(hdr, 1, sizeof hdr, f);
        fclose(f);
        assert_true(got >= 64);
        assert_int_equal(hr_npy_parse(hdr, got, UINT64_MAX, &info, NULL, 0), 0);
        assert_int_equal(info.data_offset % 64, 0);
      }
      hr_tensor_unref(t);
    }
  }
}

static void test_npy_save_int4_widens(void **state) {
  hr_descriptor d;
  uint8_t packed[3] = {0x21, 0xf8, 0x07}; /* 1, 2, -8, -1, 7 */
  hr_tensor *t;
  const int8_t *v;

  (void)state;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_INT4;
  d.rank = 1;
  d.shape[0] = 5;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  d.buffers[0].size_bytes = 3;
  assert_int_equal(hr_npy_save(path_of("i4.npy"), &d, packed, NULL, 0), 0);
  assert_int_equal(hr_npy_load(&t, path_of("i4.npy"), NULL, NULL, 0), 0);
  assert_int_equal(hr_tensor_descriptor(t)->element_type, HR_ELEM_INT8);
  v = hr_tensor_buffer(t, 0);
  assert_int_equal(v[0], 1);
  assert_int_equal(v[1], 2);
  assert_int_equal(v[2], -8);
  assert_int_equal(v[3], -1);
  assert_int_equal(v[4], 7);
  hr_tensor_unref(t);
  /* Other layouts have no .npy form. */
  d.element_type = HR_ELEM_FLOAT32;
  d.layout.tag = HR_LAYOUT_TILED;
  assert_int_equal(hr_npy_save(path_of("x.npy"), &d, packed, NULL, 0),
                   HR_ERR_UNSUPPORTED);
}

/* ------------------------------------------------------------------------ */

static void write_st(const char *name, const char *json, const void *data,
                     size_t n) {
  uint8_t len[8];
  size_t jl = strlen(json), k;
  FILE *f = fopen(path_of(name), "wb");
  assert_non_null(f);
  for (k = 0; k < 8; k++)
    len[k] = (uint8_t)((uint64_t)jl >> (8 * k));
  assert_int_equal(fwrite(len, 1, 8, f), 8);
  assert_int_equal(fwrite(json, 1, jl, f), jl);
  if (n)
    assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static void test_safetensors(void **state) {
  uint8_t data[64];
  hr_safetensors *f;
  hr_tensor *t;
  const hr_descriptor *d;
  size_t k;

  (void)state;
  for (k = 0; k < sizeof data; k++)
    data[k] = (uint8_t)k;
  write_st("a.safetensors",
           "{\"__metadata__\": {\"format\": \"pt\"}, "
           "\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], "
           "\"data_offsets\": [0, 24]}, "
           "\"b\": {\"dtype\": \"BF16\", \"shape\": [4], "
           "\"data_offsets\": [24, 32]}, "
           "\"e\": {\"dtype\": \"F8_E4M3\", \"shape\": [2, 2], "
           "\"data_offsets\": [32, 36]}, "
           "\"m\": {\"dtype\": \"BOOL\", \"shape\": [], "
           "\"data_offsets\": [36, 37]}, "
           "\"z\": {\"dtype\": \"I64\", \"shape\": [0], "
           "\"data_offsets\": [37, 37]}}",
           data, 37);
  assert_int_equal(
      hr_safetensors_open(&f, path_of("a.safetensors"), NULL, NULL, 0), 0);
  assert_int_equal(hr_safetensors_count(f), 5);
  /* Sorted by name. */
  assert_string_equal(hr_safetensors_name(f, 0), "b");
  assert_string_equal(hr_safetensors_name(f, 1), "e");
  assert_string_equal(hr_safetensors_name(f, 2), "m");
  assert_string_equal(hr_safetensors_name(f, 3), "w");
  assert_string_equal(hr_safetensors_name(f, 4), "z");
  assert_null(hr_safetensors_name(f, 5));
  assert_int_equal(hr_safetensors_tensor(f, 3, &t), 0);
  d = hr_tensor_descriptor(t);
  assert_int_equal(d->element_type, HR_ELEM_FLOAT32);
  assert_int_equal(d->layout.tag, HR_LAYOUT_ROW_MAJOR);
  assert_int_equal(d->shape[1], 3);
  assert_memory_equal(hr_tensor_buffer(t, 0), data, 24);
  /* The tensor outlives the file object (the mapping is shared). */
  hr_safetensors_close(f);
  assert_memory_equal(hr_tensor_buffer(t, 0), data, 24);
  hr_tensor_unref(t);

  assert_int_equal(
      hr_safetensors_open(&f, path_of("a.safetensors"), NULL, NULL, 0), 0);
  assert_int_equal(hr_safetensors_tensor(f, 0, &t), 0);
  assert_int_equal(hr_tensor_descriptor(t)->element_type, HR_ELEM_BFLOAT16);
  assert_memory_equal(hr_tensor_buffer(t, 0), data + 24, 8);
  hr_tensor_unref(t);
  assert_int_equal(hr_safetensors_tensor(f, 1, &t), 0);
  assert_int_equal(hr_tensor_descriptor(t)->element_type,
                   HR_ELEM_FLOAT8_E4M3FN);
  hr_tensor_unref(t);
  assert_int_equal(hr_safetensors_tensor(f, 2, &t), 0);
  assert_int_equal(hr_tensor_descriptor(t)->rank, 0);
  hr_tensor_unref(t);
  assert_int_equal(hr_safetensors_tensor(f, 4, &t), 0);
  assert_int_equal(hr_tensor_bytes(t), 0);
  hr_tensor_unref(t);
  assert_int_equal(hr_safetensors_tensor(f, 9, &t), HR_ERR_NOT_FOUND);
  hr_safetensors_close(f);
}

static void expect_st_error(const char *json, size_t n, int rv) {
  uint8_t data[64] = {0};
  char why[256] = "";
  hr_safetensors *f = NULL;

  write_st("bad.safetensors", json, data, n);
  assert_int_equal(hr_safetensors_open(&f, path_of("bad.safetensors"), NULL,
                                       why, sizeof why),
                   rv);
  assert_null(f);
  assert_true(why[0] != '\0');
}

static void test_safetensors_rejects(void **state) {
  (void)state;
  expect_st_error("[1, 2]", 0, HR_ERR_INVALID_ARGUMENT);
  expect_st_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], "
                  "\"data_offsets\": [0, 12]}}",
                  12, HR_ERR_INVALID_ARGUMENT); /* size mismatch */
  expect_st_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], "
                  "\"data_offsets\": [0, 8]}}",
                  4, HR_ERR_INVALID_ARGUMENT); /* past the end */
  expect_st_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], "
                  "\"data_offsets\": [0, 8]}}",
                  8, HR_ERR_INVALID_ARGUMENT);
  expect_st_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2.5], "
                  "\"data_offsets\": [0, 8]}}",
                  8, HR_ERR_INVALID_ARGUMENT);
  expect_st_error("{\"a\": {\"dtype\": \"STR\", \"shape\": [2], "
                  "\"data_offsets\": [0, 8]}}",
                  8, HR_ERR_UNSUPPORTED);
  expect_st_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], "
                  "\"data_offsets\": [0, 8]}, \"b\": {\"dtype\": \"F32\", "
                  "\"shape\": [2], \"data_offsets\": [4, 12]}}",
                  12, HR_ERR_INVALID_ARGUMENT); /* overlap */
  /* An overlap with an empty tensor sorted between the two (found by
   * fuzz_files: only neighbours were compared). */
  expect_st_error("{\"a\": {\"dtype\": \"U8\", \"shape\": [40], "
                  "\"data_offsets\": [0, 40]}, \"b\": {\"dtype\": \"U8\", "
                  "\"shape\": [0], \"data_offsets\": [10, 10]}, \"c\": "
                  "{\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": "
                  "[20, 28]}}",
                  40, HR_ERR_INVALID_ARGUMENT);
  expect_st_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8,
                  HR_ERR_INVALID_ARGUMENT);
  expect_st_error("{not json", 0, HR_ERR_INVALID_ARGUMENT);
  {
    /* A header length past the end of the file. */
    uint8_t len[8] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
    hr_safetensors *f = NULL;
    write_file(path_of("short.safetensors"), len, 8, "{}", 2);
    assert_int_equal(
        hr_safetensors_open(&f, path_of("short.safetensors"), NULL, NULL, 0),
        HR_ERR_INVALID_ARGUMENT);
  }
  assert_int_equal(hr_safetensors_dtype_parse("BF16"), HR_ELEM_BFLOAT16);
  assert_string_equal(hr_safetensors_dtype_name(HR_ELEM_FLOAT8_E5M2),
                      "F8_E5M2");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_npy_dtypes),
      cmocka_unit_test(test_npy_structured_ext),
      cmocka_unit_test(test_npy_fortran_and_scalar),
      cmocka_unit_test(test_npy_big_endian),
      cmocka_unit_test(test_npy_rejects),
      cmocka_unit_test(test_npy_v2_header),
      cmocka_unit_test(test_npy_save_roundtrip),
      cmocka_unit_test(test_npy_save_int4_widens),
      cmocka_unit_test(test_safetensors),
      cmocka_unit_test(test_safetensors_rejects),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
