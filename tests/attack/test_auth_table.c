/*
 * The AUTH_TOKEN table of <hurray/auth.h> on its own: the file format
 * (comments, blank lines, CRLF, modes, prefixes), every malformed line
 * refused with its number and the table left as it was, and the checks.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/auth.h>

static int check(hr_auth *a, const char *tok, unsigned need, const char *key) {
  return hr_auth_check(a, (const uint8_t *)tok, strlen(tok), need,
                       (const uint8_t *)key, key ? strlen(key) : 0);
}

static int load(hr_auth *a, const char *text, char *why, size_t n) {
  return hr_auth_load(a, text, strlen(text), why, n);
}

static void test_format(void **state) {
  hr_auth *a;
  char why[256];

  (void)state;
  assert_int_equal(hr_auth_new(&a, NULL), 0);
  /* Empty: everyone is refused. */
  assert_int_equal(hr_auth_count(a), 0);
  assert_int_equal(check(a, "x", 0, NULL), HR_ERR_NOT_FOUND);
  assert_int_equal(hr_auth_check(a, NULL, 0, 0, NULL, 0), HR_ERR_NOT_FOUND);
  assert_int_equal(load(a,
                        "# comment\r\n"
                        "   \t\n"
                        "  # indented comment\n"
                        "bare\n"
                        "reader ro\r\n"
                        "writer\trw  a/ b/c\n"
                        "scoped ro x/",
                        why, sizeof why),
                   0);
  assert_int_equal(hr_auth_count(a), 4);
  /* A bare token may read and write everything. */
  assert_int_equal(check(a, "bare", HR_AUTH_READ | HR_AUTH_WRITE, "any"), 0);
  assert_int_equal(check(a, "reader", HR_AUTH_READ, "any"), 0);
  assert_int_equal(check(a, "reader", HR_AUTH_WRITE, "any"), HR_ERR_STATE);
  assert_int_equal(check(a, "writer", HR_AUTH_WRITE, "a/1"), 0);
  assert_int_equal(check(a, "writer", HR_AUTH_WRITE, "b/c"), 0);
  assert_int_equal(check(a, "writer", HR_AUTH_READ, "b/"), HR_ERR_STATE);
  assert_int_equal(check(a, "writer", HR_AUTH_READ, "a"), HR_ERR_STATE);
  assert_int_equal(check(a, "writer", 0, NULL), 0);
  assert_int_equal(check(a, "scoped", HR_AUTH_READ, "x/y"), 0);
  /* Near misses of a token. */
  assert_int_equal(check(a, "reade", 0, NULL), HR_ERR_NOT_FOUND);
  assert_int_equal(check(a, "readerr", 0, NULL), HR_ERR_NOT_FOUND);
  assert_int_equal(check(a, "reader\r", 0, NULL), HR_ERR_NOT_FOUND);
  assert_int_equal(check(a, "ro", 0, NULL), HR_ERR_NOT_FOUND);
  hr_auth_del(a);
}

static void test_malformed(void **state) {
  static const struct {
    const char *text;
    const char *want;
  } bad[] = {
      {"ok\nbad maybe\n", "line 2"},
      {"a\n\n# c\na rw\n", "line 4"},
      {"t rw a/ \xff\n", "line 1"},
  };
  hr_auth *a;
  char why[256], text[8192];
  size_t i, n;

  (void)state;
  assert_int_equal(hr_auth_new(&a, NULL), 0);
  assert_int_equal(load(a, "keep rw\n", why, sizeof why), 0);
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(load(a, bad[i].text, why, sizeof why),
                     HR_ERR_INVALID_ARGUMENT);
    if (!strstr(why, bad[i].want))
      fail_msg("case %zu: %s", i, why);
  }
  /* A NUL byte. */
  assert_int_equal(hr_auth_load(a, "a\0b\n", 4, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  /* 65 prefixes. */
  n = (size_t)snprintf(text, sizeof text, "tok ro");
  for (i = 0; i < 65; i++)
    n += (size_t)snprintf(text + n, sizeof text - n, " p%zu/", i);
  assert_int_equal(load(a, text, why, sizeof why), HR_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(why, "prefixes"));
  /* A token over 4096 bytes. */
  memset(text, 'k', 5000);
  text[5000] = '\0';
  assert_int_equal(load(a, text, why, sizeof why), HR_ERR_INVALID_ARGUMENT);
  /* Nothing of it took: the old table is in force. */
  assert_int_equal(hr_auth_count(a), 1);
  assert_int_equal(check(a, "keep", HR_AUTH_WRITE, "z"), 0);
  assert_int_equal(check(a, "ok", 0, NULL), HR_ERR_NOT_FOUND);
  /* Files. */
  assert_int_equal(hr_auth_load_file(a, "/nonexistent/tokens", why,
                                     sizeof why),
                   HR_ERR_IO);
  assert_non_null(strstr(why, "/nonexistent/tokens"));
  {
    char path[] = "/tmp/hr_tok_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "filed ro\n", 9), 9);
    close(fd);
    assert_int_equal(hr_auth_load_file(a, path, why, sizeof why), 0);
    unlink(path);
    assert_int_equal(check(a, "filed", HR_AUTH_READ, "k"), 0);
    assert_int_equal(check(a, "keep", 0, NULL), HR_ERR_NOT_FOUND);
  }
  hr_auth_del(a);
}

/* Reloads racing checks from another thread: every check sees one whole
 * table (the old or the new), never a mix or freed memory. */
typedef struct race {
  hr_auth *a;
  int rounds;
} race;

static void *reloader(void *p) {
  race *r = p;
  int i;
  for (i = 0; i < r->rounds; i++) {
    const char *t = i % 2 ? "alpha rw a/\nbeta ro\n" : "alpha ro b/\nbeta ro\n";
    if (hr_auth_load(r->a, t, strlen(t), NULL, 0) != 0)
      return p;
  }
  return NULL;
}

static void test_reload_race(void **state) {
  race r;
  pthread_t th;
  void *res;
  int i;

  (void)state;
  assert_int_equal(hr_auth_new(&r.a, NULL), 0);
  assert_int_equal(load(r.a, "alpha ro b/\nbeta ro\n", NULL, 0), 0);
  r.rounds = 2000;
  assert_int_equal(pthread_create(&th, NULL, reloader, &r), 0);
  for (i = 0; i < 20000; i++) {
    int w = check(r.a, "alpha", HR_AUTH_WRITE, "a/x");
    int rd = check(r.a, "alpha", HR_AUTH_READ, "b/x");
    assert_true(w == 0 || w == HR_ERR_STATE);
    assert_true(rd == 0 || rd == HR_ERR_STATE);
    assert_int_equal(check(r.a, "beta", HR_AUTH_READ, "z"), 0);
    assert_int_equal(check(r.a, "gamma", 0, NULL), HR_ERR_NOT_FOUND);
  }
  assert_int_equal(pthread_join(th, &res), 0);
  assert_null(res);
  assert_int_equal(hr_auth_count(r.a), 2);
  hr_auth_del(r.a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_format),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_reload_race),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
