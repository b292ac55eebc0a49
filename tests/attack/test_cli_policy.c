/*
 * `hurray serve --auth-token-file` and the limit flags, run as a user
 * would: tokens from a file and from HURRAY_AUTH_TOKEN, read-only and
 * prefix-scoped tokens through get, put and ls, SIGHUP reloading the file
 * (a broken file keeping the old tokens), a malformed file refused at
 * start with its line, and limit flags taking effect (--max-put-bytes,
 * --read-timeout, --max-connections).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/files.h>

#include "engine_io/tl.h"

extern char **environ;

static char tmp[64];
static char out[1 << 16], err[1 << 16];

static const char *tpath(const char *name) {
  static char p[8][256];
  static int k;
  k = (k + 1) % 8;
  snprintf(p[k], sizeof p[k], "%s/%s", tmp, name);
  return p[k];
}

static void slurp(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
  buf[n] = '\0';
  if (f)
    fclose(f);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Runs `hurray ARGV...` (NULL-terminated) with `env` (NULL: ours);
 * stdout and stderr land in `out` and `err`.  Returns the exit status. */
static int runv(char *const *env, const char *const *args) {
  const char *argv[40];
  posix_spawn_file_actions_t fa;
  pid_t pid;
  int n = 0, st;

  argv[n++] = HURRAY_BIN;
  while (n < 39 && (argv[n] = args[n - 1]))
    n++;
  argv[n] = NULL;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, tpath("stdout"),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, tpath("stderr"),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_int_equal(posix_spawn(&pid, HURRAY_BIN, &fa, NULL,
                               (char *const *)argv, env ? env : environ),
                   0);
  posix_spawn_file_actions_destroy(&fa);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  slurp(tpath("stdout"), out, sizeof out);
  slurp(tpath("stderr"), err, sizeof err);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#define RUN(...)                                                               \
  runv(NULL, (const char *const[]){__VA_ARGS__, NULL})

/* Starts `hurray serve --listen 127.0.0.1:0 ARGS...`; returns its pid and
 * sets *port from its first line. */
static pid_t start_server(int *port, const char *const *args) {
  const char *argv[40] = {HURRAY_BIN, "serve", "--listen", "127.0.0.1:0"};
  posix_spawn_file_actions_t fa;
  int pipefd[2], i, n = 4;
  pid_t pid;
  char line[256];
  size_t len = 0;

  while (n < 39 && (argv[n] = args[n - 4]))
    n++;
  argv[n] = NULL;
  assert_int_equal(pipe(pipefd), 0);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
  posix_spawn_file_actions_addclose(&fa, pipefd[0]);
  posix_spawn_file_actions_addopen(&fa, 2, tpath("server.log"),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_int_equal(
      posix_spawn(&pid, HURRAY_BIN, &fa, NULL, (char *const *)argv, environ),
      0);
  posix_spawn_file_actions_destroy(&fa);
  close(pipefd[1]);
  for (i = 0; i < 255 && len < sizeof line - 1; i++) {
    ssize_t k = read(pipefd[0], line + len, 1);
    if (k <= 0 || line[len] == '\n')
      break;
    len++;
  }
  line[len] = '\0';
  close(pipefd[0]);
  assert_non_null(strstr(line, "listening on 127.0.0.1:"));
  *port = atoi(strrchr(line, ':') + 1);
  assert_true(*port > 0);
  return pid;
}

static void stop_server(pid_t pid) {
  int st;
  kill(pid, SIGTERM);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
}

static void save_npy(const char *path, uint64_t n, uint32_t seed) {
  uint64_t shape[1] = {n};
  hr_tensor *t = tl_dense(HR_ELEM_UINT8, 1, shape, seed);
  hr_descriptor d = *hr_tensor_descriptor(t);
  assert_int_equal(hr_npy_save(path, &d, hr_tensor_buffer(t, 0), NULL, 0), 0);
  hr_tensor_unref(t);
}

static int setup(void **state) {
  char cmd[128];
  (void)state;
  strcpy(tmp, "/tmp/hr_pol_XXXXXX");
  if (!mkdtemp(tmp))
    return -1;
  snprintf(cmd, sizeof cmd, "mkdir -p %s/data/pub", tmp);
  if (system(cmd) != 0)
    return -1;
  signal(SIGPIPE, SIG_IGN);
  save_npy(tpath("data/secret.npy"), 1000, 1);
  save_npy(tpath("data/pub/a.npy"), 2000, 2);
  save_npy(tpath("small.npy"), 100, 3);
  save_npy(tpath("large.npy"), 300000, 4);
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  (void)state;
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_tokens(void **state) {
  char url[64], envtok[64];
  char *env[2] = {envtok, NULL};
  pid_t pid;
  int port;

  (void)state;
  write_file(tpath("tokens"), "# who may do what\n"
                              "admin-token-0001 rw\n"
                              "reader-token-002 ro\n"
                              "public-token-003 ro pub/\n");
  /* The client reads the first token of a file like the server's. */
  write_file(tpath("admin"), "\n# mine\nadmin-token-0001 rw\n");
  write_file(tpath("reader"), "reader-token-002\n");
  write_file(tpath("public"), "public-token-003\n");
  write_file(tpath("wrong"), "wrong-token\n");
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
  write_file(tpath("tokens"), "admin-token-0001 rw\nreader-token-002 rx\n");
  assert_int_equal(kill(pid, SIGHUP), 0);
  usleep(300000);
  slurp(tpath("server.log"), err, sizeof err);
  assert_non_null(strstr(err, "line 2"));
  assert_int_equal(RUN("ls", "--auth-token-file", tpath("reader"), url), 0);
  /* A good file: the reader is gone, the public token may read all. */
  write_file(tpath("tokens"), "public-token-003 ro\n");
  assert_int_equal(kill(pid, SIGHUP), 0);
  usleep(300000);
  slurp(tpath("server.log"), err, sizeof err);
  assert_non_null(strstr(err, "reloaded 1 token"));
  assert_int_equal(RUN("ls", "--auth-token-file", tpath("reader"), url), 1);
  assert_non_null(strstr(err, "UNAUTHORIZED"));
  assert_int_equal(RUN("get", "--auth-token-file", tpath("public"), "-o",
                       tpath("x.npy"), url, "secret"),
                   0);
  stop_server(pid);

  /* A malformed file at start: refused, naming the line. */
  write_file(tpath("bad"), "# ok\ngood-token ro\n\nbad-token maybe\n");
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
                            &m, 5000));
  hr_wire_put_header(buf, HR_MSG_TENSOR_REQUEST, 1, 40);
  assert_int_equal(tl_raw_send(NULL, fd, buf, 5), 0);
  assert_true(
      tl_raw_expect(NULL, fd, HR_MSG_ERROR, 0, buf, sizeof buf, &m, 3000));
  assert_int_equal(m.u.error.code, HR_WIRE_TIMEOUT);
  close(fd);
  /* --max-connections 2: the third gets RESOURCE_EXHAUSTED. */
  for (i = 0; i < 3; i++) {
    fds[i] = tl_raw_connect(port);
    assert_true(fds[i] >= 0);
    usleep(50000);
  }
  assert_true(
      tl_raw_expect(NULL, fds[2], HR_MSG_ERROR, 0, buf, sizeof buf, &m, 3000));
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
