/*
 * fabric/ pure helpers: the RDMA region's placement, the tagged-message
 * cut, piece iteration, and the FABRIC_ADDRESS extension as the HELLO
 * decoder reads it back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/fabric.h>

#include "fabric/hr_fab_int.h"

static hr_descriptor desc_of(unsigned n, const uint64_t *sizes,
                             const uint8_t *align) {
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_UINT8;
  d.rank = 1;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = (uint8_t)n;
  for (unsigned k = 0; k < n; k++) {
    d.buffers[k].size_bytes = sizes[k];
    d.buffers[k].alignment_log2 = align[k];
  }
  return d;
}

static void test_placement(void **state) {
  (void)state;
  uint64_t off[HR_MAX_BUFFERS];
  const char *why;

  /* One buffer: always gap-free, whatever its alignment. */
  uint64_t s1[] = {1000};
  uint8_t a1[] = {21};
  hr_descriptor d = desc_of(1, s1, a1);
  assert_int_equal(hr_fabric_placement(&d, 1000, off, &why), 0);
  assert_int_equal(off[0], 0);

  /* CSR-like: 64 + 4096 + 8192 bytes, aligned to 64, 64, 4096... */
  uint64_t s3[] = {4096, 64, 8192};
  uint8_t a3[] = {6, 6, 6};
  d = desc_of(3, s3, a3);
  assert_int_equal(hr_fabric_placement(&d, 12352, off, &why), 0);
  assert_int_equal(off[1], 4096);
  assert_int_equal(off[2], 4160);

  /* ... but buffer 2 at 4 KiB alignment after 4160 bytes leaves a gap. */
  a3[2] = 12;
  d = desc_of(3, s3, a3);
  assert_int_equal(hr_fabric_placement(&d, 12352, off, &why),
                   HR_ERR_UNSUPPORTED);
  assert_non_null(strstr(why, "gap"));

  /* A total that disagrees with the buffers. */
  a3[2] = 6;
  d = desc_of(3, s3, a3);
  assert_int_equal(hr_fabric_placement(&d, 12351, off, &why),
                   HR_ERR_UNSUPPORTED);

  /* Empty buffers sit anywhere. */
  uint64_t s2[] = {0, 100};
  uint8_t a2[] = {3, 0};
  d = desc_of(2, s2, a2);
  assert_int_equal(hr_fabric_placement(&d, 100, off, &why), 0);
  assert_int_equal(off[1], 0);

  /* A composite head has no region. */
  d.layout.tag = HR_LAYOUT_COMPOSITE;
  assert_int_equal(hr_fabric_placement(&d, 100, off, &why), HR_ERR_UNSUPPORTED);
  assert_int_equal(hr_fabric_placement(NULL, 0, off, &why),
                   HR_ERR_INVALID_ARGUMENT);
}

static void test_tag_piece(void **state) {
  (void)state;
  const uint64_t mib = 1u << 20;
  assert_int_equal(hr_fabric_tag_piece(NULL, 0), 4 * mib);
  assert_int_equal(hr_fabric_tag_piece(NULL, 1), 4 * mib);
  assert_int_equal(hr_fabric_tag_piece(NULL, 1024 * mib), 4 * mib);
  assert_int_equal(hr_fabric_tag_piece(NULL, 16384 * mib), 64 * mib);
  /* Above 1 GiB the piece grows: at most 256 full pieces. */
  uint64_t t = 1024 * mib + 1;
  uint64_t p = hr_fabric_tag_piece(NULL, t);
  assert_true(p > 4 * mib);
  assert_int_equal(p % 4096, 0);
  assert_true(t / p <= 256);
  t = UINT64_MAX;
  p = hr_fabric_tag_piece(NULL, t);
  assert_true(t / p <= 256);
  /* shm: 64 MiB pieces, at most 128 full ones. */
  assert_int_equal(hr_fabric_tag_piece("shm", 1), 64 * mib);
  assert_int_equal(hr_fabric_tag_piece("shm", 8192 * mib), 64 * mib);
  assert_int_equal(hr_fabric_tag_piece("tcp;ofi_rxm", 8192 * mib), 32 * mib);
  p = hr_fabric_tag_piece("shm", UINT64_MAX);
  assert_true(UINT64_MAX / p <= 128);
}

static void test_pieces(void **state) {
  (void)state;
  static uint8_t a[10], b[0 + 1], c[7];
  hr_fabric_region r;
  memset(&r, 0, sizeof r);
  r.nseg = 3;
  r.seg[0] = (hr_fabric_seg){a, 10};
  r.seg[1] = (hr_fabric_seg){b, 0};
  r.seg[2] = (hr_fabric_seg){c, 7};
  r.length = 17;
  /* Pieces of 4: 4 4 2 | 4 3 — never across a segment. */
  assert_int_equal(hr__fab_count_pieces(&r, 4), 5);
  hr__fab_cursor cur = {0, 0, 0};
  void *ptr;
  uint64_t len, off;
  const uint64_t want_len[] = {4, 4, 2, 4, 3};
  const uint64_t want_off[] = {0, 4, 8, 10, 14};
  const void *want_ptr[] = {a, a + 4, a + 8, c, c + 4};
  for (int i = 0; i < 5; i++) {
    assert_true(hr__fab_next_piece(&r, &cur, 4, &ptr, &len, &off));
    assert_ptr_equal(ptr, want_ptr[i]);
    assert_int_equal(len, want_len[i]);
    assert_int_equal(off, want_off[i]);
  }
  assert_false(hr__fab_next_piece(&r, &cur, 4, &ptr, &len, &off));
  assert_false(hr__fab_region_contiguous(&r));
  static uint8_t big[17];
  r.seg[0].ptr = big;
  r.seg[2].ptr = big + 10;
  assert_true(hr__fab_region_contiguous(&r));
  assert_int_equal(hr__fab_count_pieces(&r, 0), 0);
}

static void test_region_build(void **state) {
  (void)state;
  uint64_t s[] = {16, 0, 8};
  uint8_t al[] = {0, 0, 0};
  hr_descriptor d = desc_of(3, s, al);
  d.buffers[0].device_tag = HR_DEV_CUDA;
  d.buffers[0].device_index = 2;
  static uint8_t x[16], z[8];
  void *bufs[3] = {x, NULL, z};
  hr_fabric_region r;
  assert_int_equal(hr__fab_region_build(&d, bufs, &r), 0);
  assert_int_equal(r.length, 24);
  assert_int_equal(r.nseg, 3);
  assert_int_equal(r.device_tag, HR_DEV_CUDA);
  assert_int_equal(r.device_index, 2);
  bufs[2] = NULL;
  assert_int_equal(hr__fab_region_build(&d, bufs, &r), HR_ERR_INVALID_ARGUMENT);
}

static void test_address_in_hello(void **state) {
  (void)state;
  uint8_t val[128], ext[160];
  const uint8_t name[] = {2, 0, 0x9f, 0xf3, 127, 0, 0, 1,
                          0, 0, 0,    0,    0,   0, 0, 0};
  int64_t n = hr_fabric_address_encode("tcp;ofi_rxm", name, sizeof name, val,
                                       sizeof val);
  assert_int_equal(n, 2 + 11 + 2 + 16);
  assert_int_equal(hr_fabric_address_encode("tcp;ofi_rxm", name, sizeof name,
                                            val, (size_t)n - 1),
                   HR_ERR_BUFFER_TOO_SMALL);
  assert_int_equal(hr_fabric_address_encode("", name, 1, val, sizeof val),
                   HR_ERR_INVALID_ARGUMENT);
  int e = hr_ext_put(ext, sizeof ext, HR_EXT_FABRIC_ADDRESS, val, (uint16_t)n);
  assert_true(e > 0);

  /* A CLIENT_HELLO carrying it decodes back to the same two fields. */
  static const uint8_t cpu = HR_DEV_CPU, std_mem = HR_MEM_STANDARD;
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_CLIENT_HELLO;
  m.u.hello.magic = HR_MAGIC;
  m.u.hello.version_major = 1;
  m.u.hello.capability_flags = HR_CAP_RDMA_DATA_PLANE;
  m.u.hello.max_message_size = 1u << 20;
  m.u.hello.layout_count = 1;
  m.u.hello.layouts[0].tag = HR_LAYOUT_ROW_MAJOR;
  m.u.hello.device_count = 1;
  m.u.hello.devices = &cpu;
  m.u.hello.memory_class_count = 1;
  m.u.hello.memory_classes = &std_mem;
  m.u.hello.ext_count = 1;
  m.u.hello.ext_raw = ext;
  m.u.hello.ext_raw_len = (size_t)e;
  uint8_t wire[512];
  int64_t w = hr_wire_encode(&m, wire, sizeof wire);
  assert_true(w > 0);
  hr_msg out;
  hr_wire_status st;
  assert_int_equal(hr_wire_decode(wire, (size_t)w, NULL, &out, &st), 0);
  const hr_hello_exts *x = &out.u.hello.exts;
  assert_true(x->has_fabric_address);
  assert_int_equal(x->fabric_provider_len, 11);
  assert_memory_equal(x->fabric_provider, "tcp;ofi_rxm", 11);
  assert_int_equal(x->fabric_endpoint_len, sizeof name);
  assert_memory_equal(x->fabric_endpoint, name, sizeof name);

  /* hr_rdma_conn_config_init() picks them up from the decoded HELLO. */
  hr_rdma_conn_config cc;
  hr_rdma_conn_config_init(&cc, NULL, NULL, HR_CAP_RDMA_DATA_PLANE,
                           &out.u.hello);
  assert_int_equal(cc.peer_caps, HR_CAP_RDMA_DATA_PLANE);
  assert_ptr_equal(cc.peer_provider, x->fabric_provider);
  assert_int_equal(cc.peer_endpoint_len, sizeof name);
  assert_int_equal(cc.min_bytes, 64u << 10);
}

static void test_text_helpers(void **state) {
  (void)state;
  char s[32];
  hr__fab_why(s, sizeof s, "a%cb\xc3\xa9", 1);
  hr__fab_ascii(s);
  assert_string_equal(s, "a?b??");
  hr__fab_why(s, 4, "%s", "truncated");
  assert_string_equal(s, "tru");
  hr__fab_why(NULL, 0, "%s", "nothing");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_placement),
      cmocka_unit_test(test_tag_piece),
      cmocka_unit_test(test_pieces),
      cmocka_unit_test(test_region_build),
      cmocka_unit_test(test_address_in_hello),
      cmocka_unit_test(test_text_helpers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
