/*
 * `hurray serve --metrics-listen 127.0.0.1:0 --log-level ...` run as a
 * user would: the bound port is printed, /metrics answers over a plain
 * socket after `hurray get` and `hurray ls`, and every stderr line is a
 * JSON object (parsed with cJSON) with the fields docs/internals/
 * operations.md promises.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "common/test_util.h"
#include "common/cli_harness.h"

static ch_cli H = {.bin = HURRAY_BIN};

static const char *tpath(const char *name) {
  return ch_path(&H, name);
}

/* Runs `hurray ARGS...` (NULL-terminated, stdout to /dev/null); returns
 * the exit status, stderr in `err`. */
#define RUN(err, cap, ...)                                                     \
  (H.err = (err), H.err_cap = (cap), CH_RUN(&H, __VA_ARGS__))

/* Reads the "metrics on 127.0.0.1:PORT" line from fd; returns PORT. */
static int metrics_port(int fd) {
  char line[256];

  ch_read_line(fd, line, sizeof line);
  assert_int_equal(strncmp(line, "metrics on 127.0.0.1:", 21), 0);
  return atoi(strrchr(line, ':') + 1);
}

/* Starts the server with --log-level `level`; sets the two ports. */
static pid_t start(const char *level, int *port, int *mport, int *out_fd) {
  pid_t pid = ch_serve(
      &H,
      (const char *const[]){"--metrics-listen", "127.0.0.1:0", "--log-level",
                            level, HR_SOURCE_DIR "/examples/data", NULL},
      port, out_fd);

  *mport = metrics_port(*out_fd);
  assert_true(*port > 0 && *mport > 0 && *port != *mport);
  return pid;
}

/* GET `path` over a plain socket (HTTP/1.0); the whole answer in buf. */
static void http_get(int port, const char *path, char *buf, size_t cap) {
  struct sockaddr_in a;
  char req[256];
  size_t n = 0;
  int fd = socket(AF_INET, SOCK_STREAM, 0);

  assert_true(fd >= 0);
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  int len = snprintf(req, sizeof req,
                     "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
  assert_int_equal(write(fd, req, (size_t)len), len);
  for (;;) {
    ssize_t k = read(fd, buf + n, cap - 1 - n);
    if (k <= 0)
      break;
    n += (size_t)k;
  }
  buf[n] = 0;
  close(fd);
}

/* Every line of the server's stderr is a JSON object with ts, level,
 * event; returns how many lines had `event` (and `kind`, when given). */
static int count_lines(const char *log, const char *event, const char *kind,
                       const char *result) {
  char line[8192];
  const char *p = log;
  int n = 0;

  while (*p) {
    const char *nl = strchr(p, '\n');
    assert_non_null(nl); /* every line is complete */
    size_t len = (size_t)(nl - p);
    assert_true(len < sizeof line);
    memcpy(line, p, len);
    line[len] = 0;
    cJSON *j = cJSON_Parse(line);
    if (!j)
      print_error("not JSON: %s\n", line);
    assert_non_null(j);
    cJSON *ts = cJSON_GetObjectItem(j, "ts");
    cJSON *lv = cJSON_GetObjectItem(j, "level");
    cJSON *ev = cJSON_GetObjectItem(j, "event");
    assert_true(cJSON_IsString(ts) && cJSON_IsString(lv) && cJSON_IsString(ev));
    if (!strcmp(ev->valuestring, event)) {
      cJSON *k = cJSON_GetObjectItem(j, "kind");
      cJSON *r = cJSON_GetObjectItem(j, "result");
      if (!strcmp(event, "request")) {
        /* The documented fields of a request line. */
        assert_true(cJSON_IsString(cJSON_GetObjectItem(j, "peer")));
        assert_true(cJSON_IsNumber(cJSON_GetObjectItem(j, "duration_ms")));
        assert_true(cJSON_IsString(r));
        if (!strcmp(k->valuestring, "get")) {
          assert_true(cJSON_IsString(cJSON_GetObjectItem(j, "key")));
          assert_true(cJSON_IsString(cJSON_GetObjectItem(j, "layout")));
          assert_true(cJSON_IsBool(cJSON_GetObjectItem(j, "transcoded")));
          assert_true(cJSON_IsString(cJSON_GetObjectItem(j, "plane")));
          assert_true(cJSON_IsNumber(cJSON_GetObjectItem(j, "bytes")));
        }
      }
      if ((!kind || (cJSON_IsString(k) && !strcmp(k->valuestring, kind))) &&
          (!result || (cJSON_IsString(r) && !strcmp(r->valuestring, result))))
        n++;
    }
    cJSON_Delete(j);
    p = nl + 1;
  }
  return n;
}

static void test_serve_metrics(void **state) {
  static char body[1 << 16], log[1 << 16], err[4096];
  char url[64];
  int port, mport, fd;
  (void)state;

  pid_t pid = start("debug", &port, &mport, &fd);
  snprintf(url, sizeof url, "hurray://127.0.0.1:%d", port);
  assert_int_equal(
      RUN(err, sizeof err, "get", "-o", tpath("m.npy"), url, "matrix", NULL),
      0);
  assert_int_equal(RUN(err, sizeof err, "get", "--layout", "column-major",
                       "--allow-transcode", "-o", tpath("m2.npy"), url,
                       "matrix", NULL),
                   0);
  assert_int_equal(
      RUN(err, sizeof err, "get", "-o", tpath("x.npy"), url, "nope", NULL), 1);
  assert_int_equal(RUN(err, sizeof err, "ls", url, NULL), 0);

  http_get(mport, "/metrics", body, sizeof body);
  assert_int_equal(strncmp(body, "HTTP/1.0 200", 12) == 0 ||
                       strncmp(body, "HTTP/1.1 200", 12) == 0,
                   1);
  assert_non_null(
      strstr(body, "Content-Type: text/plain; version=0.0.4; charset=utf-8"));
  assert_int_equal(
      tu_value(body, "hurray_requests_total{kind=\"get\",result=\"ok\"}"), 2);
  assert_int_equal(tu_value(body, "hurray_requests_total{kind=\"get\","
                                  "result=\"NOT_FOUND\"}"),
                   1);
  assert_int_equal(
      tu_value(body, "hurray_requests_total{kind=\"list\",result=\"ok\"}"), 1);
  /* matrix is 4x6 float32, sent twice. */
  assert_int_equal(tu_value(body, "hurray_tensor_bytes_total{direction="
                                  "\"sent\",plane=\"frames\"}"),
                   2 * 96);
  assert_int_equal(
      tu_value(body, "hurray_transcodes_total{layout=\"COLUMN_MAJOR\"}"), 1);
  assert_int_equal(tu_value(body, "hurray_connections_opened_total"), 4);
  assert_int_equal(tu_value(body, "hurray_request_duration_seconds_count{"
                                  "kind=\"get\"}"),
                   3);
  http_get(mport, "/", body, sizeof body);
  assert_non_null(strstr(body, " 404 "));

  assert_int_equal(ch_stop(pid), 0);
  close(fd);
  ch_slurp(tpath("server.log"), log, sizeof log);
  assert_int_equal(count_lines(log, "request", "get", "ok"), 2);
  assert_int_equal(count_lines(log, "request", "get", "NOT_FOUND"), 1);
  assert_int_equal(count_lines(log, "request", "list", "ok"), 1);
  assert_int_equal(count_lines(log, "conn_open", NULL, NULL), 4);
  assert_int_equal(count_lines(log, "start", NULL, NULL), 1);
  assert_int_equal(count_lines(log, "drain", NULL, NULL), 1);
}

/* warn: the requests that went well, the connections and the notices at
 * info are not written; the failed GET is. */
static void test_log_level_warn(void **state) {
  static char log[1 << 16], err[4096];
  char url[64];
  int port, mport, fd;
  (void)state;

  pid_t pid = start("warn", &port, &mport, &fd);
  snprintf(url, sizeof url, "hurray://127.0.0.1:%d", port);
  assert_int_equal(
      RUN(err, sizeof err, "get", "-o", tpath("m.npy"), url, "matrix", NULL),
      0);
  assert_int_equal(
      RUN(err, sizeof err, "get", "-o", tpath("x.npy"), url, "nope", NULL), 1);
  assert_int_equal(ch_stop(pid), 0);
  close(fd);
  ch_slurp(tpath("server.log"), log, sizeof log);
  assert_int_equal(count_lines(log, "request", NULL, NULL), 1);
  assert_int_equal(count_lines(log, "request", "get", "NOT_FOUND"), 1);
  assert_int_equal(count_lines(log, "conn_open", NULL, NULL), 0);
  assert_int_equal(count_lines(log, "start", NULL, NULL), 0);
}

static void test_bad_flags(void **state) {
  static char err[4096];
  (void)state;

  assert_int_equal(RUN(err, sizeof err, "serve", "--log-level", "loud",
                       HR_SOURCE_DIR "/examples/data", NULL),
                   2);
  assert_non_null(strstr(err, "--log-level takes error, warn, info or debug"));
  assert_int_equal(RUN(err, sizeof err, "serve", "--listen", "127.0.0.1:0",
                       "--metrics-listen", "nowhere",
                       HR_SOURCE_DIR "/examples/data", NULL),
                   1);
  assert_non_null(strstr(err, "hurray serve: cannot serve metrics on nowhere"));
}

#ifdef EX_DIR
/* examples/tensor_server with a metrics address: the embedding path of
 * <hurray/metrics.h> outside the CLI. */
static void test_example_metrics(void **state) {
  const char *argv[] = {EX_DIR "/tensor_server", "127.0.0.1:0", "127.0.0.1:0",
                        NULL};
  static char body[1 << 16], log[1 << 16], err[4096];
  char url[64];
  int fd, port, mport;
  pid_t pid;
  (void)state;

  pid = ch_spawn_piped(argv, tpath("example.log"), &fd);
  port = ch_listen_port(fd);
  mport = metrics_port(fd);
  snprintf(url, sizeof url, "hurray://127.0.0.1:%d", port);
  assert_int_equal(
      RUN(err, sizeof err, "get", "-o", tpath("e.npy"), url, "eye/4", NULL), 0);
  http_get(mport, "/metrics", body, sizeof body);
  assert_int_equal(
      tu_value(body, "hurray_requests_total{kind=\"get\",result=\"ok\"}"), 1);
  assert_int_equal(tu_value(body, "hurray_tensor_bytes_total{direction="
                                  "\"sent\",plane=\"frames\"}"),
                   64);
  assert_int_equal(ch_stop(pid), 0);
  close(fd);
  ch_slurp(tpath("example.log"), log, sizeof log);
  assert_int_equal(count_lines(log, "request", "get", "ok"), 1);
}
#endif

static int setup(void **state) {
  (void)state;
  return ch_tmpdir(&H, "hr_mcli");
}

static int teardown(void **state) {
  (void)state;
  return ch_rmdir(&H);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_serve_metrics),
      cmocka_unit_test(test_log_level_warn),
      cmocka_unit_test(test_bad_flags),
#ifdef EX_DIR
      cmocka_unit_test(test_example_metrics),
#endif
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
