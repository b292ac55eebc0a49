/*
 * `hurray` with TLS: serve --tls-cert/--tls-key/--tls-client-ca; get (with
 * --stats showing the negotiated TLS), put and ls over hurrays:// with
 * --tls-ca and a client certificate; and the one-line failures: no client
 * certificate, an untrusted server, a plain URL at the TLS server, --tls-*
 * with a plain URL, a key that does not match its certificate.
 */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/files.h>

#include "certs.h"
#include "common/cli_harness.h"

static certs C;
static char url[64];
static pid_t server_pid;
CH_CLI_DEFINE(HURRAY_BIN);

static const char *tpath(const char *name) {
  return ch_path(&H, name);
}

/* Runs `hurray ARGS...` into `out` and `err`; returns the exit status. */
#define RUN(...) CH_RUN(&H, __VA_ARGS__)

static int setup(void **state) {
  int port;

  (void)state;
  if (certs_make(&C))
    return -1;
  snprintf(H.dir, sizeof H.dir, "%s", C.dir);
  signal(SIGPIPE, SIG_IGN);
  /* `hurray serve` with TLS and mutual TLS on examples/data. */
  server_pid = ch_serve(
      &H,
      (const char *const[]){"--allow-put", "--tls-cert", C.server_cert,
                            "--tls-key", C.server_key, "--tls-client-ca", C.ca,
                            HR_SOURCE_DIR "/examples/data", NULL},
      &port, NULL);
  snprintf(url, sizeof url, "hurrays://127.0.0.1:%d", port);
  return 0;
}

static int teardown(void **state) {
  const char *files[] = {"stdout", "stderr", "server.log", "m.npy",
                         "bad.pem"};
  size_t i;
  int st;

  (void)state;
  st = ch_stop(server_pid);
  for (i = 0; i < sizeof files / sizeof files[0]; i++)
    unlink(tpath(files[i]));
  certs_remove(&C);
  return st == 0 ? 0 : -1;
}

static void test_get_put_ls(void **state) {
  hr_tensor *ref, *got;
  char why[256];
  cJSON *j, *tls;

  (void)state;
  assert_int_equal(RUN("get", "--stats", "--tls-ca", C.ca, "--tls-cert",
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
  assert_int_equal(RUN("put", "--tls-ca", C.ca, "--tls-cert", C.client_cert,
                       "--tls-key", C.client_key, url, "tls/copy",
                       HR_SOURCE_DIR "/examples/data/matrix.npy", NULL),
                   0);
  assert_int_equal(RUN("ls", "--tls-ca", C.ca, "--tls-cert", C.client_cert,
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
  assert_int_equal(RUN("ls", "--tls-ca", C.ca, url, NULL), 1);
  ch_one_line(err);
  assert_non_null(strstr(err, "certificate"));
  /* A client certificate from another CA. */
  assert_int_equal(RUN("ls", "--tls-ca", C.ca, "--tls-cert",
                       C.other_client_cert, "--tls-key", C.other_client_key,
                       url, NULL),
                   1);
  ch_one_line(err);
  assert_non_null(strstr(err, "TLS"));
  /* An untrusted server. */
  assert_int_equal(RUN("get", "--tls-ca", C.other_ca, "--tls-cert",
                       C.client_cert, "--tls-key", C.client_key, url, "matrix",
                       NULL),
                   1);
  ch_one_line(err);
  assert_non_null(strstr(err, "certificate verify failed"));
  /* A plain URL at the TLS server. */
  snprintf(plain, sizeof plain, "hurray://%s", url + strlen("hurrays://"));
  assert_int_equal(RUN("ls", plain, NULL), 1);
  ch_one_line(err);
  assert_non_null(strstr(err, "hurrays://"));
  /* --tls-* with a plain URL. */
  assert_int_equal(RUN("ls", "--tls-ca", C.ca, plain, NULL), 1);
  ch_one_line(err);
  /* A CA file that does not load. */
  assert_int_equal(RUN("ls", "--tls-ca", "/nonexistent.pem", url, NULL), 1);
  ch_one_line(err);
  assert_non_null(strstr(err, "/nonexistent.pem"));
  /* serve: a key that does not match, a certificate that is not PEM. */
  assert_int_equal(RUN("serve", "--listen", "127.0.0.1:0", "--tls-cert",
                       C.server_cert, "--tls-key", C.client_key, ".", NULL),
                   1);
  ch_one_line(err);
  assert_non_null(strstr(err, "does not match"));
  f = fopen(tpath("bad.pem"), "w");
  assert_non_null(f);
  fputs("not a certificate\n", f);
  fclose(f);
  assert_int_equal(RUN("serve", "--listen", "127.0.0.1:0", "--tls-cert",
                       tpath("bad.pem"), "--tls-key", C.server_key, ".", NULL),
                   1);
  ch_one_line(err);
  assert_non_null(strstr(err, "bad.pem"));
  /* TLS without its key is a usage error. */
  assert_int_equal(RUN("serve", "--tls-cert", C.server_cert, ".", NULL), 2);
  assert_non_null(strstr(err, "--tls-key"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_put_ls),
      cmocka_unit_test(test_failures),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
