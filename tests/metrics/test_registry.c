/*
 * The metrics registry on its own: the exact exposition text after a
 * known sequence of events, label escaping, configuration checks, the
 * engine-callback chaining, and the JSON log lines (parsed with cJSON).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include <hurray/metrics.h>
#include <hurray/wire.h>

size_t hr__metrics_escape_label(char *dst, size_t cap, const char *src,
                                size_t len);

/* ---- helpers ---- */

typedef struct text {
  char buf[1 << 16];
  size_t len;
  int calls;
  int fail_at; /* 0: never */
} text;

static int collect(const char *s, size_t n, void *ud) {
  text *t = ud;
  t->calls++;
  if (t->fail_at && t->calls >= t->fail_at)
    return -1;
  assert_true(t->len + n < sizeof t->buf);
  memcpy(t->buf + t->len, s, n);
  t->len += n;
  t->buf[t->len] = 0;
  return 0;
}

static const char *render(const hr_metrics *m, text *t) {
  memset(t, 0, sizeof *t);
  assert_int_equal(hr_metrics_render(m, collect, t), 0);
  return t->buf;
}

typedef struct logs {
  char lines[32][4096];
  int level[32];
  int n;
} logs;

static void log_cb(int level, const char *line, size_t len, void *ud) {
  logs *l = ud;
  assert_int_equal(strlen(line), len); /* terminated, no embedded NUL */
  assert_null(strchr(line, '\n'));
  assert_true(l->n < 32);
  assert_true(len < sizeof l->lines[0]);
  memcpy(l->lines[l->n], line, len + 1);
  l->level[l->n] = level;
  l->n++;
}

static hr_transfer_record rec_of(int kind, uint64_t bytes, uint64_t dur_ns) {
  hr_transfer_record r;
  memset(&r, 0, sizeof r);
  r.kind = (uint8_t)kind;
  r.data_plane = HR_PLANE_FRAMES;
  r.layout = HR_LAYOUT_ROW_MAJOR;
  r.device = HR_DEV_CPU;
  r.shards = r.lanes = 1;
  r.bytes = bytes;
  r.started = 1000000000ull;
  r.finished = r.started + dur_ns;
  return r;
}

/* ---- the exposition text ---- */

/* Compares texts, showing where they part (cmocka cuts long strings). */
static void assert_text(const char *got, const char *want) {
  size_t i = 0;
  while (got[i] && got[i] == want[i])
    i++;
  if (got[i] == want[i])
    return;
  size_t from = i > 80 ? i - 80 : 0;
  print_error(
      "texts differ at byte %zu:\n--- got:\n%.160s\n--- want:\n%.160s\n", i,
      got + from, want + from);
  fail();
}

static const double two_buckets[] = {0.001, 0.5};

static void test_exact_text(void **state) {
  hr_metrics_config c;
  hr_metrics *m;
  hr_transfer_record r;
  text t;
  (void)state;

  hr_metrics_config_default(&c);
  c.latency_buckets = two_buckets;
  c.latency_bucket_count = 2;
  assert_int_equal(hr_metrics_new(&m, &c, NULL), 0);

  /* A GET sent as stored in 0.25 ms, a transcoded GET in 2 s. */
  r = rec_of(HR_XFER_GET, 100, 250000);
  hr_metrics_record(m, "1.2.3.4:5", &r);
  r = rec_of(HR_XFER_GET, 1000, 2000000000ull);
  r.transcoded = 1;
  r.layout = HR_LAYOUT_COLUMN_MAJOR;
  hr_metrics_record(m, "1.2.3.4:5", &r);
  /* A GET refused with NOT_FOUND after 1 ms (on the bound: le is <=). */
  r = rec_of(HR_XFER_GET, 0, 1000000);
  r.status = HR_ERR_REMOTE;
  r.wire_error = HR_WIRE_NOT_FOUND;
  r.wire_error_sent = 1;
  hr_metrics_record(m, "1.2.3.4:5", &r);
  /* A PUT received over SHM. */
  r = rec_of(HR_XFER_PUT, 64, 100000000);
  r.data_plane = HR_PLANE_SHM;
  hr_metrics_record(m, NULL, &r);
  /* A PUT torn by the connection's end: no wire code. */
  r = rec_of(HR_XFER_PUT, 0, 0);
  r.status = HR_ERR_CLOSED;
  hr_metrics_record(m, NULL, &r);
  /* A LIST and a PING; a record of no known kind is ignored. */
  r = rec_of(HR_XFER_LIST, 0, 0);
  hr_metrics_record(m, NULL, &r);
  r = rec_of(HR_XFER_PING, 0, 0);
  hr_metrics_record(m, NULL, &r);
  r = rec_of(0, 5, 5);
  hr_metrics_record(m, NULL, &r);
  r = rec_of(9, 5, 5);
  hr_metrics_record(m, NULL, &r);
  /* A reserved wire code received counts as INTERNAL. */
  r = rec_of(HR_XFER_GET, 0, 0);
  r.status = HR_ERR_REMOTE;
  r.wire_error = 0x7777;
  hr_metrics_record(m, NULL, &r);
  /* Connections: two opened, one closed by our PROTOCOL_VIOLATION, one
   * rejected; an unknown event is ignored. */
  hr_metrics_conn(m, "p", HR_CONN_OPENED, 0, 0);
  hr_metrics_conn(m, "p", HR_CONN_OPENED, 0, 0);
  hr_metrics_conn(m, "p", HR_CONN_CLOSED, HR_WIRE_PROTOCOL_VIOLATION, 1);
  hr_metrics_conn(m, "p", HR_CONN_REJECTED, 0, 0);
  hr_metrics_conn(m, "p", 42, 0, 0);
  hr_metrics_set_active(m, 1, 3);

  static const char expected[] =
      "# HELP hurray_requests_total Requests finished, by kind (get, put, "
      "list, ping) and result (ok, a wire error name, closed, failed).\n"
      "# TYPE hurray_requests_total counter\n"
      "hurray_requests_total{kind=\"get\",result=\"ok\"} 2\n"
      "hurray_requests_total{kind=\"get\",result=\"NOT_FOUND\"} 1\n"
      "hurray_requests_total{kind=\"get\",result=\"INTERNAL\"} 1\n"
      "hurray_requests_total{kind=\"put\",result=\"ok\"} 1\n"
      "hurray_requests_total{kind=\"put\",result=\"closed\"} 1\n"
      "hurray_requests_total{kind=\"list\",result=\"ok\"} 1\n"
      "hurray_requests_total{kind=\"ping\",result=\"ok\"} 1\n"
      "# HELP hurray_tensor_bytes_total Tensor bytes moved by finished GETs "
      "and PUTs, by direction and data plane.\n"
      "# TYPE hurray_tensor_bytes_total counter\n"
      "hurray_tensor_bytes_total{direction=\"sent\",plane=\"frames\"} 1100\n"
      "hurray_tensor_bytes_total{direction=\"received\",plane=\"frames\"} 0\n"
      "hurray_tensor_bytes_total{direction=\"received\",plane=\"shm\"} 64\n"
      "# HELP hurray_transcodes_total GETs answered in a layout other than "
      "the stored one, by the layout sent.\n"
      "# TYPE hurray_transcodes_total counter\n"
      "hurray_transcodes_total{layout=\"COLUMN_MAJOR\"} 1\n"
      "# HELP hurray_errors_total Wire ERRORs, by code, direction (sent, "
      "received) and scope (stream, connection).\n"
      "# TYPE hurray_errors_total counter\n"
      "hurray_errors_total{code=\"PROTOCOL_VIOLATION\",direction=\"sent\","
      "scope=\"connection\"} 1\n"
      "hurray_errors_total{code=\"NOT_FOUND\",direction=\"sent\","
      "scope=\"stream\"} 1\n"
      "hurray_errors_total{code=\"RESOURCE_EXHAUSTED\",direction=\"sent\","
      "scope=\"connection\"} 1\n"
      "hurray_errors_total{code=\"INTERNAL\",direction=\"received\","
      "scope=\"stream\"} 1\n"
      "# HELP hurray_connections_opened_total Connections opened "
      "(accepted, or connected).\n"
      "# TYPE hurray_connections_opened_total counter\n"
      "hurray_connections_opened_total 2\n"
      "# HELP hurray_connections_closed_total Connections closed.\n"
      "# TYPE hurray_connections_closed_total counter\n"
      "hurray_connections_closed_total 1\n"
      "# HELP hurray_connections_rejected_total Connections refused over "
      "max_connections.\n"
      "# TYPE hurray_connections_rejected_total counter\n"
      "hurray_connections_rejected_total 1\n"
      "# HELP hurray_connections_active Connections open now.\n"
      "# TYPE hurray_connections_active gauge\n"
      "hurray_connections_active 1\n"
      "# HELP hurray_streams_active Streams open now across the "
      "connections.\n"
      "# TYPE hurray_streams_active gauge\n"
      "hurray_streams_active 3\n"
      "# HELP hurray_request_duration_seconds Time from a request's arrival "
      "to its last byte or its answer, by kind.\n"
      "# TYPE hurray_request_duration_seconds histogram\n"
      "hurray_request_duration_seconds_bucket{kind=\"get\",le=\"0.001\"} 3\n"
      "hurray_request_duration_seconds_bucket{kind=\"get\",le=\"0.5\"} 3\n"
      "hurray_request_duration_seconds_bucket{kind=\"get\",le=\"+Inf\"} 4\n"
      /* 0.00025 + 2 + 0.001 + 0 in IEEE doubles, in the shortest form
       * that reads back as the same double. */
      "hurray_request_duration_seconds_sum{kind=\"get\"} 2.0012499999999998\n"
      "hurray_request_duration_seconds_count{kind=\"get\"} 4\n"
      "hurray_request_duration_seconds_bucket{kind=\"put\",le=\"0.001\"} 1\n"
      "hurray_request_duration_seconds_bucket{kind=\"put\",le=\"0.5\"} 2\n"
      "hurray_request_duration_seconds_bucket{kind=\"put\",le=\"+Inf\"} 2\n"
      "hurray_request_duration_seconds_sum{kind=\"put\"} 0.1\n"
      "hurray_request_duration_seconds_count{kind=\"put\"} 2\n"
      "hurray_request_duration_seconds_bucket{kind=\"list\",le=\"0.001\"} 1\n"
      "hurray_request_duration_seconds_bucket{kind=\"list\",le=\"0.5\"} 1\n"
      "hurray_request_duration_seconds_bucket{kind=\"list\",le=\"+Inf\"} 1\n"
      "hurray_request_duration_seconds_sum{kind=\"list\"} 0\n"
      "hurray_request_duration_seconds_count{kind=\"list\"} 1\n"
      "hurray_request_duration_seconds_bucket{kind=\"ping\",le=\"0.001\"} 1\n"
      "hurray_request_duration_seconds_bucket{kind=\"ping\",le=\"0.5\"} 1\n"
      "hurray_request_duration_seconds_bucket{kind=\"ping\",le=\"+Inf\"} 1\n"
      "hurray_request_duration_seconds_sum{kind=\"ping\"} 0\n"
      "hurray_request_duration_seconds_count{kind=\"ping\"} 1\n";
  assert_text(render(m, &t), expected);
  hr_metrics_del(m);
}

/* A fresh registry: every unlabelled series and the histograms at 0. */
static void test_empty_registry(void **state) {
  hr_metrics *m;
  text t;
  (void)state;

  assert_int_equal(hr_metrics_new(&m, NULL, NULL), 0);
  render(m, &t);
  assert_null(strstr(t.buf, "hurray_requests_total{"));
  assert_non_null(strstr(t.buf, "\nhurray_connections_opened_total 0\n"));
  /* The 16 default buckets and +Inf for each of four kinds. */
  size_t n = 0;
  for (const char *p = t.buf; (p = strstr(p, "_bucket{")); p++)
    n++;
  assert_int_equal(n, 4 * 17);
  assert_non_null(strstr(t.buf,
                         "hurray_request_duration_seconds_bucket{kind=\"ping\","
                         "le=\"0.0005\"} 0\n"));
  assert_non_null(strstr(
      t.buf, "hurray_request_duration_seconds_bucket{kind=\"get\",le=\"60\"} "
             "0\n"));
  /* Every line ends in \n; HELP precedes TYPE for each family. */
  assert_int_equal(t.buf[t.len - 1], '\n');
  hr_metrics_del(m);
}

/* ---- labels ---- */

static void test_escape_label(void **state) {
  char out[64];
  (void)state;

  assert_int_equal(hr__metrics_escape_label(out, sizeof out, "plain", 5), 5);
  assert_string_equal(out, "plain");
  assert_int_equal(hr__metrics_escape_label(out, sizeof out, "a\\b\"c\nd", 7),
                   10);
  assert_string_equal(out, "a\\\\b\\\"c\\nd");
  /* UTF-8 and tabs pass as they are. */
  assert_int_equal(hr__metrics_escape_label(out, sizeof out, "\xc3\xa9\t", 3),
                   3);
  assert_string_equal(out, "\xc3\xa9\t");
  /* Too small: refused, never cut in the middle of an escape. */
  assert_int_equal(hr__metrics_escape_label(out, 4, "\"\"", 2), (size_t)-1);
  assert_int_equal(hr__metrics_escape_label(out, 5, "\"\"", 2), 4);
  assert_int_equal(hr__metrics_escape_label(out, 1, "", 0), 0);
}

static void test_const_label(void **state) {
  hr_metrics_config c;
  hr_metrics *m;
  text t;
  (void)state;

  hr_metrics_config_default(&c);
  c.const_label_name = "instance";
  c.const_label_value = "gpu\"7\"\\a\nb";
  assert_int_equal(hr_metrics_new(&m, &c, NULL), 0);
  hr_metrics_conn(m, NULL, HR_CONN_OPENED, 0, 0);
  render(m, &t);
  assert_non_null(strstr(t.buf, "\nhurray_connections_opened_total{"
                                "instance=\"gpu\\\"7\\\"\\\\a\\nb\"} 1\n"));
  assert_non_null(
      strstr(t.buf, "\nhurray_tensor_bytes_total{instance=\"gpu\\\"7\\\"\\\\a"
                    "\\nb\",direction=\"sent\",plane=\"frames\"} 0\n"));
  hr_metrics_del(m);
}

static void test_config_checks(void **state) {
  hr_metrics_config c;
  hr_metrics *m = (hr_metrics *)&c;
  static const double bad_order[] = {0.5, 0.1};
  static const double bad_zero[] = {0, 1};
  double too_many[HR_METRICS_MAX_BUCKETS + 1];
  char big[2048];
  (void)state;

  assert_int_equal(hr_metrics_new(NULL, NULL, NULL), HR_ERR_INVALID_ARGUMENT);
  hr_metrics_config_default(&c);
  c.latency_buckets = bad_order;
  c.latency_bucket_count = 2;
  assert_int_equal(hr_metrics_new(&m, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  assert_null(m);
  c.latency_buckets = bad_zero;
  assert_int_equal(hr_metrics_new(&m, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  for (int i = 0; i <= HR_METRICS_MAX_BUCKETS; i++)
    too_many[i] = i + 1;
  c.latency_buckets = too_many;
  c.latency_bucket_count = HR_METRICS_MAX_BUCKETS + 1;
  assert_int_equal(hr_metrics_new(&m, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  c.latency_bucket_count = HR_METRICS_MAX_BUCKETS;
  assert_int_equal(hr_metrics_new(&m, &c, NULL), 0);
  hr_metrics_del(m);

  hr_metrics_config_default(&c);
  c.const_label_name = "9lives";
  c.const_label_value = "x";
  assert_int_equal(hr_metrics_new(&m, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  c.const_label_name = "__reserved";
  assert_int_equal(hr_metrics_new(&m, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  c.const_label_name = "ok_name";
  c.const_label_value = "\xff";
  assert_int_equal(hr_metrics_new(&m, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  c.const_label_value = NULL;
  assert_int_equal(hr_metrics_new(&m, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  memset(big, '"', sizeof big - 1);
  big[sizeof big - 1] = 0;
  c.const_label_value = big;
  assert_int_equal(hr_metrics_new(&m, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  big[511] = 0; /* 511 quotes double to 1022 bytes: fits */
  assert_int_equal(hr_metrics_new(&m, &c, NULL), 0);
  hr_metrics_del(m);

  /* A caller built against an older, shorter config. */
  hr_metrics_config_default(&c);
  c.size = offsetof(hr_metrics_config, log_level) + sizeof(int);
  assert_int_equal(hr_metrics_new(&m, &c, NULL), 0);
  hr_metrics_del(m);
  c.size = 3;
  assert_int_equal(hr_metrics_new(&m, &c, NULL), HR_ERR_INVALID_ARGUMENT);

  hr_metrics_config_default(&c);
  c.log_level = 4;
  assert_int_equal(hr_metrics_new(&m, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  c.log_level = HR_LOG_ERROR;
  assert_int_equal(hr_metrics_new(&m, &c, NULL), 0);
  assert_int_equal(hr_metrics_set_log_level(m, -1), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_metrics_set_log_level(m, HR_LOG_DEBUG), 0);
  hr_metrics_del(m);
  hr_metrics_del(NULL);

  int lv = -1;
  assert_int_equal(hr_log_level_parse("warn", &lv), 0);
  assert_int_equal(lv, HR_LOG_WARN);
  assert_int_equal(hr_log_level_parse("debug", &lv), 0);
  assert_int_equal(lv, HR_LOG_DEBUG);
  assert_int_equal(hr_log_level_parse("verbose", &lv), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_log_level_parse(NULL, &lv), HR_ERR_INVALID_ARGUMENT);
}

/* A writer that fails stops the rendering. */
static void test_render_write_failure(void **state) {
  hr_metrics *m;
  text t;
  (void)state;

  assert_int_equal(hr_metrics_new(&m, NULL, NULL), 0);
  memset(&t, 0, sizeof t);
  t.fail_at = 1;
  assert_int_equal(hr_metrics_render(m, collect, &t), HR_ERR_CALLBACK_FAILURE);
  assert_int_equal(t.calls, 1);
  assert_int_equal(hr_metrics_render(m, NULL, &t), HR_ERR_INVALID_ARGUMENT);
  hr_metrics_del(m);
}

/* ---- logs ---- */

static cJSON *parse(const char *line) {
  cJSON *j = cJSON_Parse(line);
  assert_non_null(j);
  assert_true(cJSON_IsObject(j));
  cJSON *ts = cJSON_GetObjectItem(j, "ts");
  assert_true(cJSON_IsString(ts));
  /* 2026-11-29T16:34:35.121Z */
  assert_int_equal(strlen(ts->valuestring), 24);
  assert_int_equal(ts->valuestring[10], 'T');
  assert_int_equal(ts->valuestring[23], 'Z');
  return j;
}

static const char *jstr(cJSON *j, const char *name) {
  cJSON *v = cJSON_GetObjectItem(j, name);
  assert_true(cJSON_IsString(v));
  return v->valuestring;
}

static double jnum(cJSON *j, const char *name) {
  cJSON *v = cJSON_GetObjectItem(j, name);
  assert_true(cJSON_IsNumber(v));
  return v->valuedouble;
}

static void test_log_lines(void **state) {
  hr_metrics_config c;
  hr_metrics *m;
  hr_transfer_record r;
  logs l;
  cJSON *j;
  static const uint8_t key[] = "dir/\"q\"\\w\n";
  static const uint8_t bad_key[] = {'a', 0xff, 0x00, 'b'};
  (void)state;

  memset(&l, 0, sizeof l);
  hr_metrics_config_default(&c);
  c.log = log_cb;
  c.log_user_data = &l;
  assert_int_equal(hr_metrics_new(&m, &c, NULL), 0);

  r = rec_of(HR_XFER_GET, 4096, 1500000);
  r.key = key;
  r.key_len = sizeof key - 1;
  r.stream_id = 7;
  r.transcoded = 1;
  r.layout = HR_LAYOUT_TILED;
  hr_metrics_record(m, "[::1]:80", &r);
  assert_int_equal(l.n, 1);
  assert_int_equal(l.level[0], HR_LOG_INFO);
  j = parse(l.lines[0]);
  assert_string_equal(jstr(j, "level"), "info");
  assert_string_equal(jstr(j, "event"), "request");
  assert_string_equal(jstr(j, "peer"), "[::1]:80");
  assert_string_equal(jstr(j, "kind"), "get");
  assert_string_equal(jstr(j, "key"), "dir/\"q\"\\w\n");
  assert_int_equal((int)jnum(j, "stream"), 7);
  assert_string_equal(jstr(j, "layout"), "TILED");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "transcoded")));
  assert_string_equal(jstr(j, "plane"), "frames");
  assert_int_equal((int)jnum(j, "bytes"), 4096);
  assert_true(jnum(j, "duration_ms") > 1.4999 &&
              jnum(j, "duration_ms") < 1.5001);
  assert_string_equal(jstr(j, "result"), "ok");
  assert_null(cJSON_GetObjectItem(j, "error"));
  cJSON_Delete(j);

  /* A failed PUT with a key that is not UTF-8: warn, key_hex, error. */
  r = rec_of(HR_XFER_PUT, 0, 0);
  r.key = bad_key;
  r.key_len = sizeof bad_key;
  r.status = HR_ERR_REMOTE;
  r.wire_error = HR_WIRE_ALREADY_EXISTS;
  r.wire_error_sent = 1;
  snprintf(r.message, sizeof r.message, "key \"x\" exists");
  hr_metrics_record(m, "1.1.1.1:1", &r);
  assert_int_equal(l.n, 2);
  assert_int_equal(l.level[1], HR_LOG_WARN);
  j = parse(l.lines[1]);
  assert_string_equal(jstr(j, "level"), "warn");
  assert_null(cJSON_GetObjectItem(j, "key"));
  assert_string_equal(jstr(j, "key_hex"), "61ff0062");
  assert_string_equal(jstr(j, "result"), "ALREADY_EXISTS");
  assert_string_equal(jstr(j, "error"), "ALREADY_EXISTS");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "error_sent")));
  assert_string_equal(jstr(j, "message"), "key \"x\" exists");
  cJSON_Delete(j);

  /* PINGs and connection events are debug: not written at info. */
  r = rec_of(HR_XFER_PING, 0, 0);
  hr_metrics_record(m, "p", &r);
  hr_metrics_conn(m, "p", HR_CONN_OPENED, 0, 0);
  assert_int_equal(l.n, 2);
  /* A close with an error is a warning. */
  hr_metrics_conn(m, "p", HR_CONN_CLOSED, HR_WIRE_TIMEOUT, 0);
  assert_int_equal(l.n, 3);
  j = parse(l.lines[2]);
  assert_string_equal(jstr(j, "event"), "conn_close");
  assert_string_equal(jstr(j, "error"), "TIMEOUT");
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(j, "error_sent")));
  cJSON_Delete(j);

  assert_int_equal(hr_metrics_set_log_level(m, HR_LOG_DEBUG), 0);
  hr_metrics_record(m, "p", &r);
  hr_metrics_conn(m, "p", HR_CONN_OPENED, 0, 0);
  assert_int_equal(l.n, 5);
  assert_int_equal(l.level[3], HR_LOG_DEBUG);
  j = parse(l.lines[3]);
  assert_string_equal(jstr(j, "kind"), "ping");
  assert_null(cJSON_GetObjectItem(j, "bytes"));
  cJSON_Delete(j);
  j = parse(l.lines[4]);
  assert_string_equal(jstr(j, "event"), "conn_open");
  cJSON_Delete(j);

  /* Free-form lines: the text is escaped; control bytes too. */
  hr_metrics_log(m, HR_LOG_ERROR, "boom", "a \"%s\"\t%d\x01", "b", 3);
  assert_int_equal(l.n, 6);
  j = parse(l.lines[5]);
  assert_string_equal(jstr(j, "event"), "boom");
  assert_string_equal(jstr(j, "msg"), "a \"b\"\t3\x01");
  cJSON_Delete(j);
  /* Filtered by level. */
  assert_int_equal(hr_metrics_set_log_level(m, HR_LOG_ERROR), 0);
  hr_metrics_log(m, HR_LOG_WARN, "x", "hidden");
  assert_int_equal(l.n, 6);
  /* 4 KiB of control bytes escape to 24 KiB: over the line buffer, so a
   * short valid line says so instead. */
  static char ctl[4096];
  memset(ctl, 1, sizeof ctl - 1);
  hr_metrics_log(m, HR_LOG_ERROR, "big", "%s", ctl);
  assert_int_equal(l.n, 7);
  j = parse(l.lines[6]);
  assert_string_equal(jstr(j, "event"), "log_line_too_long");
  cJSON_Delete(j);
  /* Bytes that are not UTF-8 (a file name in Latin-1, a cut sequence)
   * become '?'; an event name that is not UTF-8 becomes "log". */
  hr_metrics_log(m, HR_LOG_ERROR, "\xff", "file %s",
                 "a\xe9"
                 "b\xc3\xa9\xe2\x82");
  assert_int_equal(l.n, 8);
  j = parse(l.lines[7]);
  assert_string_equal(jstr(j, "event"), "log");
  assert_string_equal(jstr(j, "msg"), "file a?b\xc3\xa9??");
  cJSON_Delete(j);
  hr_metrics_del(m);
}

/* ---- engine glue ---- */

typedef struct chain {
  int transfers, requests, conns, wakeups;
} chain;

static void ch_transfer(hr_conn *c, const hr_transfer_record *r, void *ud) {
  (void)c;
  (void)r;
  ((chain *)ud)->transfers++;
}
static void ch_conn(hr_conn *c, int ev, void *ud) {
  (void)c;
  (void)ev;
  ((chain *)ud)->conns++;
}
static void ch_wakeup(hr_engine *e, void *ud) {
  (void)e;
  ((chain *)ud)->wakeups++;
}

static void test_attach_chains(void **state) {
  hr_engine_config ec;
  hr_metrics *m;
  hr_transfer_record r;
  chain ch = {0};
  text t;
  (void)state;

  assert_int_equal(hr_metrics_new(&m, NULL, NULL), 0);
  hr_engine_config_default(&ec);
  ec.on_transfer = ch_transfer;
  ec.on_conn = ch_conn;
  ec.on_wakeup = ch_wakeup;
  ec.user_data = &ch;
  assert_int_equal(hr_metrics_attach(m, &ec), 0);
  assert_ptr_equal(ec.user_data, m);
  assert_int_equal(hr_metrics_attach(m, &ec), HR_ERR_STATE);
  assert_int_equal(hr_metrics_attach(NULL, &ec), HR_ERR_INVALID_ARGUMENT);
  /* What the engine would call: the registry counts, then the
   * application's callbacks run with their own user_data. */
  r = rec_of(HR_XFER_GET, 10, 0);
  ec.on_transfer(NULL, &r, ec.user_data);
  r = rec_of(HR_XFER_LIST, 0, 0);
  ec.on_request(NULL, &r, ec.user_data); /* none chained: fine */
  ec.on_conn(NULL, HR_CONN_OPENED, ec.user_data);
  ec.on_wakeup(NULL, ec.user_data);
  assert_int_equal(ch.transfers, 1);
  assert_int_equal(ch.conns, 1);
  assert_int_equal(ch.wakeups, 1);
  render(m, &t);
  assert_non_null(strstr(t.buf, "{kind=\"get\",result=\"ok\"} 1\n"));
  assert_non_null(strstr(t.buf, "{kind=\"list\",result=\"ok\"} 1\n"));
  assert_non_null(strstr(t.buf, "\nhurray_connections_opened_total 1\n"));
  hr_metrics_del(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_text),
      cmocka_unit_test(test_empty_registry),
      cmocka_unit_test(test_escape_label),
      cmocka_unit_test(test_const_label),
      cmocka_unit_test(test_config_checks),
      cmocka_unit_test(test_render_write_failure),
      cmocka_unit_test(test_log_lines),
      cmocka_unit_test(test_attach_chains),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
