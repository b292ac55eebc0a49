/*
 * `hurray serve --auth-token-file` and the limit flags, run as a user
 * would: tokens from a file and from HURRAY_AUTH_TOKEN, read-only and
 * prefix-scoped tokens through get, put and ls, SIGHUP reloading the file
 * (a broken file keeping the old tokens), a malformed file refused at
 * start with its line, and limit flags taking effect (--max-put-bytes,
 * --read-timeout, --max-connections).
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/files.h>

#include "common/cli_harness.h"
#include "engine_io/tl.h"

CH_CLI_DEFINE(HURRAY_BIN);

static const char *tpath(const char *name) {
  return ch_path(&H, name);
}

/* Runs `hurray ARGV...` with `env` (NULL: ours); stdout and stderr land
 * in `out` and `err`.  Returns the exit status. */
static int runv(char *const *env, const char *const *args) {
  return ch_runv(&H, env, args);
}

#define RUN(...) CH_RUN(&H, __VA_ARGS__)

/* Starts `hurray serve --listen 127.0.0.1:0 ARGS...`; returns its pid and
 * sets *port from its first line. */
static pid_t start_server(int *port, const char *const *args) {
  return ch_serve(&H, args, port, NULL);
}

static void stop_server(pid_t pid) {
  assert_int_equal(ch_stop(pid), 0);
}

/* Waits until the server's log holds `what` (the server handles a signal
 * when its loop gets to it, which a loaded machine may delay). */
static void wait_log(const char *what) {
  struct timespec ts = {0, 10 * 1000 * 1000};
  int i;

  for (i = 0; i < TL_WAIT_MS / 10; i++) {
    ch_slurp(tpath("server.log"), err, sizeof err);
    if (strstr(err, what))
      return;
    nanosleep(&ts, NULL);
  }
  fail_msg("the server's log never said \"%s\": %s", what, err);
}

static void save_npy(const char *path, uint64_t n, uint32_t seed) {
  uint64_t shape[1] = {n};
  hr_tensor *t = tl_dense(HR_ELEM_UINT8, 1, shape, seed);
  hr_descriptor d = *hr_tensor_descriptor(t);
  assert_int_equal(hr_npy_save(path, &d, hr_tensor_buffer(t, 0), NULL, 0), 0);
  hr_tensor_unref(t);
}

static int setup(void **state) {
  (void)state;
  if (ch_tmpdir(&H, "hr_pol") || mkdir(tpath("data"), 0755) ||
      mkdir(tpath("data/pub"), 0755))
    return -1;
  save_npy(tpath("data/secret.npy"), 1000, 1);
  save_npy(tpath("data/pub/a.npy"), 2000, 2);
  save_npy(tpath("small.npy"), 100, 3);
  save_npy(tpath("large.npy"), 300000, 4);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return ch_rmdir(&H);
}

static void test_tokens(void **state) {
  char url[64], envtok[64];
  char *env[2] = {envtok, NULL};
  pid_t pid;
  int port;

  (void)state;
  ch_write_file(tpath("tokens"), "# who may do what\n"
                              "admin-token-0001 rw\n"
                              "reader-token-002 ro\n"
                              "public-token-003 ro pub/\n");
  /* The client reads the first token of a file like the server's. */
  ch_write_file(tpath("admin"), "\n# mine\nadmin-token-0001 rw\n");
  ch_write_file(tpath("reader"), "reader-token-002\n");
  ch_write_file(tpath("public"), "public-token-003\n");
  ch_write_file(tpath("wrong"), "wrong-token\n");
  pid = start_server(&port, (const char *const[]){
                                "--allow-put", "--auth-token-file",
                                tpath("tokens"), tpath("data"), NULL});
  snprintf(url, sizeof url, "hurray://127.0.0.1:%d", port);

  /* No token, a wrong one: UNAUTHORIZED, one line. */
  assert_int_equal(RUN("ls", url), 1);
  assert_non_null(strstr(err, "UNAUTHORIZED"));
  assert_int_equal(RUN("get", "--auth-token-file", tpath("wrong"), "-o",
                       tpath("x.npy"), url, "secret"),
                   1);
  assert_non_null(strstr(err, "UNAUTHORIZED"));
  /* Reader: get and ls, no put. */
  assert_int_equal(RUN("get", "--auth-token-file", tpath("reader"), "-o",
                       tpath("x.npy"), url, "secret"),
                   0);
  assert_int_equal(RUN("ls", "--auth-token-file", tpath("reader"), url), 0);
  assert_non_null(strstr(out, "secret"));
  assert_non_null(strstr(out, "pub/a"));
  assert_int_equal(RUN("put", "--auth-token-file", tpath("reader"), url,
                       "new", tpath("small.npy")),
                   1);
  assert_non_null(strstr(err, "UNAUTHORIZED"));
  /* Public: only pub/; LIST hides the rest. */
  assert_int_equal(RUN("ls", "--auth-token-file", tpath("public"), url), 0);
  assert_null(strstr(out, "secret"));
  assert_non_null(strstr(out, "pub/a"));
  assert_int_equal(RUN("get", "--auth-token-file", tpath("public"), "-o",
                       tpath("x.npy"), url, "secret"),
                   1);
  assert_non_null(strstr(err, "UNAUTHORIZED"));
  /* Admin through the environment: put works. */
  snprintf(envtok, sizeof envtok, "HURRAY_AUTH_TOKEN=admin-token-0001");
  assert_int_equal(runv(env, (const char *const[]){"put", url, "new",
                                                   tpath("small.npy"), NULL}),
                   0);

  /* SIGHUP with a broken file: the old tokens stay. */
  ch_write_file(tpath("tokens"), "admin-token-0001 rw\nreader-token-002 rx\n");
  assert_int_equal(kill(pid, SIGHUP), 0);
  wait_log("line 2");
  assert_int_equal(RUN("ls", "--auth-token-file", tpath("reader"), url), 0);
  /* A good file: the reader is gone, the public token may read all. */
  ch_write_file(tpath("tokens"), "public-token-003 ro\n");
  assert_int_equal(kill(pid, SIGHUP), 0);
  wait_log("reloaded 1 token");
  assert_int_equal(RUN("ls", "--auth-token-file", tpath("reader"), url), 1);
  assert_non_null(strstr(err, "UNAUTHORIZED"));
  assert_int_equal(RUN("get", "--auth-token-file", tpath("public"), "-o",
                       tpath("x.npy"), url, "secret"),
                   0);
  stop_server(pid);

  /* A malformed file at start: refused, naming the line. */
  ch_write_file(tpath("bad"), "# ok\ngood-token ro\n\nbad-token maybe\n");
  assert_int_equal(RUN("serve", "--auth-token-file", tpath("bad"),
                       tpath("data")),
                   2);
  assert_non_null(strstr(err, "line 4"));
  assert_int_equal(RUN("serve", "--max-put-bytes", "lots", tpath("data")), 2);
}

static void test_limit_flags(void **state) {
  char url[64];
  pid_t pid;
  int port, fd, fds[3], i;
  uint8_t buf[4096];
  hr_msg m;

  (void)state;
  pid = start_server(
      &port, (const char *const[]){"--allow-put", "--max-put-bytes", "64K",
                                   "--read-timeout", "200ms",
                                   "--max-connections", "2", tpath("data"),
                                   NULL});
  snprintf(url, sizeof url, "hurray://127.0.0.1:%d", port);
  /* --max-put-bytes: 100 bytes pass, 300,000 do not. */
  assert_int_equal(RUN("put", url, "s", tpath("small.npy")), 0);
  assert_int_equal(RUN("put", url, "l", tpath("large.npy")), 1);
  assert_non_null(strstr(err, "RESOURCE_EXHAUSTED"));
  /* --read-timeout: a header cut short is cut off. */
  fd = tl_raw_connect(port);
  assert_true(fd >= 0);
  tl_hello(&m, 0);
  assert_int_equal(tl_raw_send_msg(NULL, fd, &m), 0);
  assert_true(tl_raw_expect(NULL, fd, HR_MSG_SERVER_HELLO, 0, buf, sizeof buf,
                            &m, TL_WAIT_MS));
  hr_wire_put_header(buf, HR_MSG_TENSOR_REQUEST, 1, 40);
  assert_int_equal(tl_raw_send(NULL, fd, buf, 5), 0);
  assert_true(tl_raw_expect(NULL, fd, HR_MSG_ERROR, 0, buf, sizeof buf, &m,
                            TL_WAIT_MS));
  assert_int_equal(m.u.error.code, HR_WIRE_TIMEOUT);
  /* The server closes it: only then is it out of the connection count
   * that the next step needs at zero. */
  assert_true(tl_raw_wait_eof(NULL, fd, TL_WAIT_MS));
  close(fd);
  /* --max-connections 2: the third gets RESOURCE_EXHAUSTED (the server
   * accepts in the order of the connects). */
  for (i = 0; i < 3; i++) {
    fds[i] = tl_raw_connect(port);
    assert_true(fds[i] >= 0);
  }
  assert_true(tl_raw_expect(NULL, fds[2], HR_MSG_ERROR, 0, buf, sizeof buf, &m,
                            TL_WAIT_MS));
  assert_int_equal(m.u.error.code, HR_WIRE_RESOURCE_EXHAUSTED);
  for (i = 0; i < 3; i++)
    close(fds[i]);
  stop_server(pid);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tokens),
      cmocka_unit_test(test_limit_flags),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
