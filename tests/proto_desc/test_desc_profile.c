/*
 * Registered layout profiles (wire-v1 § 5.1): hr_layout_profile_parse() and
 * hr_layout_profile_encode().  The metadata below is taken from the
 * layout_profiles.json vectors where one exists.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/wire.h>

static int parse(uint8_t tag, const uint8_t *meta, uint16_t len,
                 hr_layout_profile *out) {
  hr_layout_entry e = {tag, len, meta};
  return hr_layout_profile_parse(&e, out);
}

static void test_parse_valid(void **state) {
  (void)state;
  hr_layout_profile p;
  /* prof_req_panel */
  const uint8_t panel[] = {0x08, 0, 0, 0};
  assert_int_equal(parse(0xF0, panel, sizeof panel, &p), 0);
  assert_int_equal(p.tag, HR_LAYOUT_PANEL);
  assert_int_equal(p.mr, 8);
  /* prof_req_tiled_exact */
  const uint8_t tiled[] = {0x02, 0x20, 0, 0, 0, 0x20, 0, 0, 0};
  assert_int_equal(parse(0xF1, tiled, sizeof tiled, &p), 0);
  assert_int_equal(p.tag, HR_LAYOUT_TILED_EXACT);
  assert_int_equal(p.rank, 2);
  assert_int_equal(p.tile[0], 32);
  assert_int_equal(p.tile[1], 32);
  /* prof_req_permuted_exact_rank4 */
  const uint8_t perm[] = {0x04, 0, 2, 3, 1};
  assert_int_equal(parse(0xF2, perm, sizeof perm, &p), 0);
  assert_int_equal(p.tag, HR_LAYOUT_PERMUTED_EXACT);
  assert_int_equal(p.rank, 4);
  assert_memory_equal(p.order, ((const uint8_t[]){0, 2, 3, 1}), 4);
  /* Rank 0 profiles parse (a scalar has nothing to tile or permute). */
  const uint8_t rank0[] = {0};
  assert_int_equal(parse(0xF1, rank0, 1, &p), 0);
  assert_int_equal(p.rank, 0);
  assert_int_equal(parse(0xF2, rank0, 1, &p), 0);
  /* The largest rank. */
  uint8_t perm32[33];
  perm32[0] = 32;
  for (unsigned k = 0; k < 32; k++)
    perm32[1 + k] = (uint8_t)(31 - k);
  assert_int_equal(parse(0xF2, perm32, sizeof perm32, &p), 0);
  assert_int_equal(p.order[0], 31);
  uint8_t tiled32[1 + 4 * 32];
  memset(tiled32, 0, sizeof tiled32);
  tiled32[0] = 32;
  for (unsigned k = 0; k < 32; k++)
    tiled32[1 + 4 * k + 3] = 0x80; /* 2^31 */
  assert_int_equal(parse(0xF1, tiled32, sizeof tiled32, &p), 0);
  assert_int_equal(p.tile[31], 1u << 31);
}

static void test_parse_unparseable(void **state) {
  (void)state;
  hr_layout_profile p;
  static const struct {
    const char *name;
    uint8_t tag;
    uint8_t len;
    uint8_t meta[12];
  } cases[] = {
      {"PANEL of 2 bytes", 0xF0, 2, {0x08, 0}},
      {"PANEL empty (a HELLO's family entry)", 0xF0, 0, {0}},
      {"PANEL mr 0", 0xF0, 4, {0, 0, 0, 0}},
      {"PANEL of 5 bytes", 0xF0, 5, {1, 0, 0, 0, 0}},
      {"TILED_EXACT empty", 0xF1, 0, {0}},
      {"TILED_EXACT zero tile", 0xF1, 9, {2, 4, 0, 0, 0, 0, 0, 0, 0}},
      {"TILED_EXACT rank 3 with two tiles", 0xF1, 9,
       {3, 2, 0, 0, 0, 2, 0, 0, 0}},
      {"TILED_EXACT trailing byte", 0xF1, 6, {1, 2, 0, 0, 0, 0}},
      {"TILED_EXACT rank 33", 0xF1, 1, {33}},
      {"PERMUTED_EXACT empty", 0xF2, 0, {0}},
      {"PERMUTED_EXACT repeat", 0xF2, 3, {2, 0, 0}},
      {"PERMUTED_EXACT out of range", 0xF2, 3, {2, 0, 2}},
      {"PERMUTED_EXACT short", 0xF2, 2, {2, 1}},
      {"PERMUTED_EXACT trailing byte", 0xF2, 4, {2, 1, 0, 0}},
      {"PERMUTED_EXACT rank 33", 0xF2, 1, {33}},
  };
  for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    print_message("%s\n", cases[i].name);
    assert_int_equal(parse(cases[i].tag, cases[i].meta, cases[i].len, &p),
                     HR_ERR_INVALID_ARGUMENT);
  }
}

static void test_parse_other_tags_and_arguments(void **state) {
  (void)state;
  hr_layout_profile p;
  const uint8_t meta[] = {4, 0, 0, 0};
  const uint8_t tags[] = {HR_LAYOUT_ROW_MAJOR, HR_LAYOUT_TILED,
                          HR_LAYOUT_PERMUTED, 0xF3, 0xFE, 0xFF, 0x00};
  for (unsigned i = 0; i < sizeof tags; i++)
    assert_int_equal(parse(tags[i], meta, sizeof meta, &p),
                     HR_ERR_UNSUPPORTED);
  hr_layout_entry e = {0xF0, 4, NULL};
  assert_int_equal(hr_layout_profile_parse(&e, &p), HR_ERR_INVALID_ARGUMENT);
  e.ext = meta;
  assert_int_equal(hr_layout_profile_parse(NULL, &p), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_layout_profile_parse(&e, NULL), HR_ERR_INVALID_ARGUMENT);
}

static void roundtrip(const hr_layout_profile *p, const uint8_t *want,
                      int want_len) {
  uint8_t out[160];
  memset(out, 0xEE, sizeof out);
  /* One byte short: nothing is written. */
  assert_int_equal(hr_layout_profile_encode(p, out, (size_t)want_len - 1),
                   HR_ERR_BUFFER_TOO_SMALL);
  for (unsigned i = 0; i < sizeof out; i++)
    assert_int_equal(out[i], 0xEE);
  assert_int_equal(hr_layout_profile_encode(p, out, sizeof out), want_len);
  assert_memory_equal(out, want, (size_t)want_len);
  assert_int_equal(out[want_len], 0xEE);
  hr_layout_profile back;
  hr_layout_entry e = {p->tag, (uint16_t)want_len, out};
  assert_int_equal(hr_layout_profile_parse(&e, &back), 0);
  assert_int_equal(back.tag, p->tag);
  assert_int_equal(back.rank, p->rank);
  assert_int_equal(back.mr, p->mr);
  assert_memory_equal(back.tile, p->tile, p->rank * sizeof(uint32_t));
  assert_memory_equal(back.order, p->order, p->rank);
}

static void test_encode(void **state) {
  (void)state;
  hr_layout_profile p;
  memset(&p, 0, sizeof p);
  p.tag = HR_LAYOUT_PANEL;
  p.mr = 0x01020304;
  roundtrip(&p, (const uint8_t[]){4, 3, 2, 1}, 4);

  memset(&p, 0, sizeof p);
  p.tag = HR_LAYOUT_TILED_EXACT;
  p.rank = 2;
  p.tile[0] = 4;
  p.tile[1] = 0x100;
  roundtrip(&p, (const uint8_t[]){2, 4, 0, 0, 0, 0, 1, 0, 0}, 9);

  memset(&p, 0, sizeof p);
  p.tag = HR_LAYOUT_PERMUTED_EXACT;
  p.rank = 3;
  memcpy(p.order, (const uint8_t[]){2, 0, 1}, 3);
  roundtrip(&p, (const uint8_t[]){3, 2, 0, 1}, 4);

  p.rank = 0;
  roundtrip(&p, (const uint8_t[]){0}, 1);
}

static void test_encode_refuses(void **state) {
  (void)state;
  uint8_t out[160];
  hr_layout_profile p;
  memset(&p, 0, sizeof p);
  p.tag = HR_LAYOUT_PANEL; /* mr 0 */
  assert_int_equal(hr_layout_profile_encode(&p, out, sizeof out),
                   HR_ERR_INVALID_ARGUMENT);
  p.tag = HR_LAYOUT_TILED_EXACT;
  p.rank = 2;
  p.tile[0] = 1; /* tile[1] 0 */
  assert_int_equal(hr_layout_profile_encode(&p, out, sizeof out),
                   HR_ERR_INVALID_ARGUMENT);
  p.rank = 33;
  assert_int_equal(hr_layout_profile_encode(&p, out, sizeof out),
                   HR_ERR_INVALID_ARGUMENT);
  p.tag = HR_LAYOUT_PERMUTED_EXACT;
  assert_int_equal(hr_layout_profile_encode(&p, out, sizeof out),
                   HR_ERR_INVALID_ARGUMENT);
  p.rank = 2; /* order (0, 0) */
  assert_int_equal(hr_layout_profile_encode(&p, out, sizeof out),
                   HR_ERR_INVALID_ARGUMENT);
  p.tag = HR_LAYOUT_TILED;
  assert_int_equal(hr_layout_profile_encode(&p, out, sizeof out),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_layout_profile_encode(NULL, out, sizeof out),
                   HR_ERR_INVALID_ARGUMENT);
  p.tag = HR_LAYOUT_PANEL;
  p.mr = 1;
  assert_int_equal(hr_layout_profile_encode(&p, NULL, 0),
                   HR_ERR_BUFFER_TOO_SMALL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_valid),
      cmocka_unit_test(test_parse_unparseable),
      cmocka_unit_test(test_parse_other_tags_and_arguments),
      cmocka_unit_test(test_encode),
      cmocka_unit_test(test_encode_refuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
