/*
 * A minimal stand-in for the part of cmocka the device tests use, so that
 * perf/gpu_check.sh can build and run them on a GPU machine that has a
 * compiler and the CUDA toolkit but no cmocka (compile with
 * -DHR_NO_CMOCKA).  Same names, same meaning: a failed assertion reports
 * file and line and ends the current test; teardown still runs; the group
 * returns the number of failed tests.
 */
#ifndef HR_TEST_GT_NOCMOCKA_H
#define HR_TEST_GT_NOCMOCKA_H

#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef void (*gt_test_fn)(void **state);
typedef int (*gt_fixture_fn)(void **state);

struct CMUnitTest {
  const char *name;
  gt_test_fn test;
  gt_fixture_fn setup, teardown;
};

/* The failure exit of the running test (one test runs at a time). */
static jmp_buf gt_jmp;
static int gt_in_test;

static void gt_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("[  ERROR   ] --- ");
  vprintf(fmt, ap);
  printf("\n[   LINE   ] --- %s:%d: error: Failure!\n", file, line);
  va_end(ap);
  fflush(stdout);
  if (gt_in_test)
    longjmp(gt_jmp, 1);
}

#define print_message(...) printf(__VA_ARGS__)
#define fail_msg(...) gt_fail(__FILE__, __LINE__, __VA_ARGS__)
#define assert_true(c)                                                         \
  do {                                                                         \
    if (!(c))                                                                  \
      gt_fail(__FILE__, __LINE__, "%s", #c);                                   \
  } while (0)
#define assert_false(c) assert_true(!(c))
#define assert_int_equal(a, b)                                                 \
  do {                                                                         \
    intmax_t gt_a = (intmax_t)(a), gt_b = (intmax_t)(b);                       \
    if (gt_a != gt_b)                                                          \
      gt_fail(__FILE__, __LINE__, "%jd != %jd", gt_a, gt_b);                   \
  } while (0)
#define assert_null(p) assert_true((p) == NULL)
#define assert_non_null(p) assert_true((p) != NULL)
#define assert_ptr_equal(a, b)                                                 \
  assert_true((const void *)(a) == (const void *)(b))
#define assert_string_equal(a, b) assert_true(strcmp((a), (b)) == 0)
#define assert_memory_equal(a, b, n) assert_true(memcmp((a), (b), (n)) == 0)

#define cmocka_unit_test(f) {#f, f, NULL, NULL}
#define cmocka_unit_test_setup_teardown(f, s, t) {#f, f, s, t}

static int gt_run(const char *group, const struct CMUnitTest *t, size_t n) {
  int failed = 0;
  printf("[==========] %s: Running %zu test(s).\n", group, n);
  for (size_t i = 0; i < n; i++) {
    void *state = NULL;
    int ok = 1;
    printf("[ RUN      ] %s\n", t[i].name);
    fflush(stdout);
    gt_in_test = 1;
    if (setjmp(gt_jmp) == 0) {
      if (t[i].setup && t[i].setup(&state) != 0)
        ok = 0;
      else
        t[i].test(&state);
    } else {
      ok = 0;
    }
    if (t[i].teardown && state) {
      if (setjmp(gt_jmp) == 0)
        t[i].teardown(&state);
      else
        ok = 0;
    }
    gt_in_test = 0;
    printf("[ %s ] %s\n", ok ? "      OK" : " FAILED ", t[i].name);
    failed += !ok;
  }
  printf("[==========] %s: %zu test(s) run.\n", group, n);
  printf("[  PASSED  ] %zu test(s).\n", n - (size_t)failed);
  if (failed)
    printf("[  FAILED  ] %d test(s).\n", failed);
  return failed;
}

#define cmocka_run_group_tests_name(name, tests, s, t)                         \
  gt_run((name), (tests), sizeof(tests) / sizeof(tests)[0])

#endif /* HR_TEST_GT_NOCMOCKA_H */
