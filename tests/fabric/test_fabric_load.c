/*
 * libfabric is loaded at run time: a process that links libhurray but
 * opens no fabric does not have libfabric mapped; the first hr_fabric_new()
 * loads it; a library that cannot be loaded (or lacks libfabric's
 * functions) makes hr_fabric_new() report "unavailable" cleanly, and a
 * version 1 configuration (which ends before `library`) still works.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/fabric.h>

static int loaded(void) {
  void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h)
    dlclose(h);
  return h != NULL;
}

static void test_missing(void **state) {
  (void)state;
  hr_fabric_config c;
  hr_fabric_config_default(&c);
  c.provider = "shm";
  c.library = "libhurray-test-no-such-fabric.so.1";
  hr_fabric *f = NULL;
  char why[256];
  assert_int_equal(hr_fabric_new(&f, &c, NULL, why, sizeof why),
                   HR_ERR_UNSUPPORTED);
  assert_non_null(strstr(why, "libfabric is not available"));
  assert_non_null(strstr(why, "libhurray-test-no-such-fabric"));
  /* A library without libfabric's functions (libc is always there). */
  c.library = "libc.so.6";
  assert_int_equal(hr_fabric_new(&f, &c, NULL, why, sizeof why),
                   HR_ERR_UNSUPPORTED);
  assert_non_null(strstr(why, "lacks fi_getinfo"));
  /* Nothing was left loaded by the failures. */
  assert_false(loaded());
}

static void test_loads_on_first_use(void **state) {
  (void)state;
  /* Linking libhurray does not map libfabric. */
  assert_false(loaded());
  /* A version 1 configuration: `library` is not read. */
  hr_fabric_config v1;
  hr_fabric_config_default(&v1);
  v1.version = 1;
  v1.library = "not read in version 1";
  v1.provider = "shm";
  hr_fabric *f = NULL;
  char why[256];
  int rv = hr_fabric_new(&f, &v1, NULL, why, sizeof why);
  if (rv == HR_ERR_UNSUPPORTED && strstr(why, "libfabric is not available"))
    skip(); /* no libfabric on this host */
  assert_true(loaded());
  if (rv == 0) {
    assert_string_equal(hr_fabric_provider(f), "shm");
    assert_int_equal(hr_fabric_del(f), 0);
  } else {
    /* libfabric without shm: still a clean refusal. */
    assert_int_equal(rv, HR_ERR_UNSUPPORTED);
  }
  /* The library stays loaded for the process (RTLD_NODELETE). */
  assert_true(loaded());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing),
      cmocka_unit_test(test_loads_on_first_use),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
