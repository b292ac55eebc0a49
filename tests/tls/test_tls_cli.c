/*
 * `hurray` with TLS: serve --tls-cert/--tls-key/--tls-client-ca; get (with
 * --stats showing the negotiated TLS), put and ls over hurrays:// with
 * --tls-ca and a client certificate; and the one-line failures: no client
 * certificate, an untrusted server, a plain URL at the TLS server, --tls-*
 * with a plain URL, a key that does not match its certificate.
 */
#include <cjson/cJSON.h>
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
#include <unistd.h>

#include <cmocka.h>

#include <hurray/files.h>

#include "certs.h"

extern char **environ;

static certs C;
static char url[64];
static pid_t server_pid;
static char out[1 << 16], err[1 << 16];

static const char *tpath(const char *name) {
  static char p[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", C.dir, name);
  return p[k];
}

static void slurp(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
  buf[n] = '\0';
  if (f)
    fclose(f);
}

/* Runs `hurray ARGS...` (NULL-terminated) into `out` and `err`; returns
 * the exit status. */
static int run(const char *arg, ...) {
  const char *argv[32];
  posix_spawn_file_actions_t fa;
  va_list ap;
  pid_t pid;
  int n = 0, st;

  argv[n++] = HURRAY_BIN;
  argv[n++] = arg;
  va_start(ap, arg);
  while (n < 31 && (argv[n] = va_arg(ap, const char *)))
    n++;
  va_end(ap);
  argv[n] = NULL;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, tpath("stdout"),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, tpath("stderr"),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_int_equal(
      posix_spawn(&pid, HURRAY_BIN, &fa, NULL, (char *const *)argv, environ),
      0);
  posix_spawn_file_actions_destroy(&fa);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  slurp(tpath("stdout"), out, sizeof out);
  slurp(tpath("stderr"), err, sizeof err);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* One line on stderr, naming the command. */
static void one_line(const char *s) {
  const char *nl = strchr(s, '\n');
  assert_non_null(nl);
  assert_int_equal(nl[1], '\0');
  assert_int_equal(strncmp(s, "hurray ", 7), 0);
}

/* Starts `hurray serve` with TLS and mutual TLS on examples/data. */
static pid_t start_server(int *port) {
  const char *argv[] = {HURRAY_BIN,  "serve",       "--listen",
                        "127.0.0.1:0", "--allow-put", "--tls-cert",
                        C.server_cert, "--tls-key",   C.server_key,
                        "--tls-client-ca", C.ca,      HR_SOURCE_DIR
                        "/examples/data",
                        NULL};
  posix_spawn_file_actions_t fa;
  int pipefd[2], i;
  pid_t pid;
  char line[256];
  size_t n = 0;

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
  for (i = 0; i < 255 && n < sizeof line - 1; i++) {
    ssize_t k = read(pipefd[0], line + n, 1);
    if (k <= 0 || line[n] == '\n')
      break;
    n++;
  }
  line[n] = '\0';
  close(pipefd[0]);
  assert_non_null(strstr(line, "listening on 127.0.0.1:"));
  *port = atoi(strrchr(line, ':') + 1);
  assert_true(*port > 0);
  return pid;
}

static int setup(void **state) {
  int port;

  (void)state;
  if (certs_make(&C))
    return -1;
  signal(SIGPIPE, SIG_IGN);
  server_pid = start_server(&port);
  snprintf(url, sizeof url, "hurrays://127.0.0.1:%d", port);
  return 0;
}

static int teardown(void **state) {
  int st;
  const char *files[] = {"stdout", "stderr", "server.log", "m.npy",
                         "bad.pem"};
  size_t i;

  (void)state;
  kill(server_pid, SIGTERM);
  waitpid(server_pid, &st, 0);
  for (i = 0; i < sizeof files / sizeof files[0]; i++)
    unlink(tpath(files[i]));
  certs_remove(&C);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void test_get_put_ls(void **state) {
  hr_tensor *ref, *got;
  char why[256];
  cJSON *j, *tls;

  (void)state;
  assert_int_equal(run("get", "--stats", "--tls-ca", C.ca, "--tls-cert",
                       C.client_cert, "--tls-key", C.client_key, "-o",
                       tpath("m.npy"), url, "matrix", NULL),
                   0);
  assert_int_equal(
      hr_npy_load(&ref, HR_SOURCE_DIR "/examples/data/matrix.npy", NULL, why,
                  sizeof why),
      0);
  assert_int_equal(hr_npy_load(&got, tpath("m.npy"), NULL, why, sizeof why),
                   0);
  assert_memory_equal(hr_tensor_buffer(got, 0), hr_tensor_buffer(ref, 0), 96);
  hr_tensor_unref(got);
  /* --stats says what TLS did. */
  j = cJSON_Parse(strchr(err, '{'));
  assert_non_null(j);
  tls = cJSON_GetObjectItem(j, "tls");
  assert_true(cJSON_IsObject(tls));
  assert_string_equal(cJSON_GetObjectItem(tls, "version")->valuestring,
                      "TLSv1.3");
  assert_string_equal(cJSON_GetObjectItem(tls, "cipher")->valuestring,
                      "TLS_AES_128_GCM_SHA256");
  assert_true(cJSON_IsBool(cJSON_GetObjectItem(tls, "ktls_tx")));
  assert_true(cJSON_IsBool(cJSON_GetObjectItem(tls, "ktls_rx")));
  cJSON_Delete(j);

  /* PUT it back under another key, then list it. */
  assert_int_equal(run("put", "--tls-ca", C.ca, "--tls-cert", C.client_cert,
                       "--tls-key", C.client_key, url, "tls/copy",
                       HR_SOURCE_DIR "/examples/data/matrix.npy", NULL),
                   0);
  assert_int_equal(run("ls", "--tls-ca", C.ca, "--tls-cert", C.client_cert,
                       "--tls-key", C.client_key, url, "tls/", NULL),
                   0);
  assert_non_null(strstr(out, "tls/copy\tFLOAT32\t[4,6]\tROW_MAJOR\t96\n"));
  hr_tensor_unref(ref);
}

static void test_failures(void **state) {
  char plain[64];
  FILE *f;

  (void)state;
  /* Mutual TLS: no client certificate. */
  assert_int_equal(run("ls", "--tls-ca", C.ca, url, NULL), 1);
  one_line(err);
  assert_non_null(strstr(err, "certificate"));
  /* A client certificate from another CA. */
  assert_int_equal(run("ls", "--tls-ca", C.ca, "--tls-cert",
                       C.other_client_cert, "--tls-key", C.other_client_key,
                       url, NULL),
                   1);
  one_line(err);
  assert_non_null(strstr(err, "TLS"));
  /* An untrusted server. */
  assert_int_equal(run("get", "--tls-ca", C.other_ca, "--tls-cert",
                       C.client_cert, "--tls-key", C.client_key, url, "matrix",
                       NULL),
                   1);
  one_line(err);
  assert_non_null(strstr(err, "certificate verify failed"));
  /* A plain URL at the TLS server. */
  snprintf(plain, sizeof plain, "hurray://%s", url + strlen("hurrays://"));
  assert_int_equal(run("ls", plain, NULL), 1);
  one_line(err);
  assert_non_null(strstr(err, "hurrays://"));
  /* --tls-* with a plain URL. */
  assert_int_equal(run("ls", "--tls-ca", C.ca, plain, NULL), 1);
  one_line(err);
  /* A CA file that does not load. */
  assert_int_equal(run("ls", "--tls-ca", "/nonexistent.pem", url, NULL), 1);
  one_line(err);
  assert_non_null(strstr(err, "/nonexistent.pem"));
  /* serve: a key that does not match, a certificate that is not PEM. */
  assert_int_equal(run("serve", "--listen", "127.0.0.1:0", "--tls-cert",
                       C.server_cert, "--tls-key", C.client_key, ".", NULL),
                   1);
  one_line(err);
  assert_non_null(strstr(err, "does not match"));
  f = fopen(tpath("bad.pem"), "w");
  assert_non_null(f);
  fputs("not a certificate\n", f);
  fclose(f);
  assert_int_equal(run("serve", "--listen", "127.0.0.1:0", "--tls-cert",
                       tpath("bad.pem"), "--tls-key", C.server_key, ".", NULL),
                   1);
  one_line(err);
  assert_non_null(strstr(err, "bad.pem"));
  /* TLS without its key is a usage error. */
  assert_int_equal(run("serve", "--tls-cert", C.server_cert, ".", NULL), 2);
  assert_non_null(strstr(err, "--tls-key"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_put_ls),
      cmocka_unit_test(test_failures),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
