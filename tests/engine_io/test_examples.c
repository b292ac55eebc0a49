/*
 * Smoke test of examples/: the custom tensor server starts, both clients
 * (epoll loop, libevent loop) fetch from it and from `hurray serve`, and
 * the server drains and exits 0 on SIGTERM.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cli_harness.h"

static char out[1 << 14];

/* Spawns argv with stdout into a pipe; returns the pid and *rd. */
static pid_t spawn(const char *const *argv, int *rd) {
  return ch_spawn_piped(argv, NULL, rd);
}

/* Runs to completion; the exit status, stdout in `out`. */
static int run(const char *const *argv) {
  int rd, st;
  size_t n = 0;
  ssize_t k;
  pid_t pid = spawn(argv, &rd);

  while ((k = read(rd, out + n, sizeof out - 1 - n)) > 0)
    n += (size_t)k;
  out[n] = '\0';
  close(rd);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Starts a server that prints "listening on HOST:PORT" first. */
static pid_t start(const char *const *argv, char *url, size_t cap) {
  char line[256];
  int rd;
  pid_t pid = spawn(argv, &rd);

  ch_read_line(rd, line, sizeof line);
  close(rd);
  assert_non_null(strstr(line, "listening on "));
  snprintf(url, cap, "hurray://%s", line + strlen("listening on "));
  return pid;
}

static void stop(pid_t pid) {
  assert_int_equal(ch_stop(pid), 0);
}

static void test_examples(void **state) {
  char url[300], url2[300];
  const char *srv[] = {EX_DIR "/tensor_server", NULL};
  const char *hs[] = {HURRAY_BIN,
                      "serve",
                      "--listen",
                      "127.0.0.1:0",
                      HR_SOURCE_DIR "/examples/data",
                      NULL};
  pid_t a, b;

  (void)state;
  a = start(srv, url, sizeof url);
  {
    const char *c1[] = {EX_DIR "/epoll_client", url, "arange/10", NULL};
    assert_int_equal(run(c1), 0);
    assert_non_null(strstr(out, "arange/10: FLOAT32 [10] ROW_MAJOR, 40 bytes"));
  }
  {
    const char *c2[] = {EX_DIR "/libevent_client", url, "eye/4", "matrix/3/4",
                        NULL};
    assert_int_equal(run(c2), 0);
    assert_non_null(strstr(out, "FLOAT32, 2-d, 64 bytes, ROW_MAJOR"));
    assert_non_null(strstr(out, "FLOAT32, 2-d, 48 bytes, ROW_MAJOR"));
  }
  {
    /* A key the server cannot compute: the client reports it. */
    const char *c3[] = {EX_DIR "/epoll_client", url, "zeros/3", NULL};
    assert_int_equal(run(c3), 1);
  }
  stop(a);
  b = start(hs, url2, sizeof url2);
  {
    const char *c4[] = {EX_DIR "/epoll_client", url2, "matrix", NULL};
    assert_int_equal(run(c4), 0);
    assert_non_null(strstr(out, "matrix: FLOAT32 [4, 6] ROW_MAJOR, 96 bytes"));
  }
  stop(b);
  {
    /* In-process: producer thread to consumer thread, no socket. */
    const char *c5[] = {EX_DIR "/inproc_handoff", "40", NULL};
    assert_int_equal(run(c5), 0);
    assert_non_null(strstr(out, "tensor 39: 1024 floats"));
    assert_non_null(
        strstr(out, "handoffs 40, releases 40, double 0, missing 0"));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_examples)};
  signal(SIGPIPE, SIG_IGN);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
