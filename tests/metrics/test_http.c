/*
 * The metrics endpoint end to end: a server engine, a client engine and
 * the evhttp endpoint on one libevent loop over loopback.  The client does
 * GETs (as stored, transcoded, missing), PUTs (accepted, refused), a LIST
 * and a PING; /metrics is then scraped with libevent's HTTP client and
 * the counters and histograms checked against what was done.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include <hurray/hr_event.h>
#include <hurray/metrics.h>
#include <hurray/store.h>

#include "engine_io/tl.h"

typedef struct world {
  struct event_base *base;
  hr_store *store;
  hr_metrics *m;
  hr_engine *srv, *cli;
  hr_ev_metrics *ep;
  hr_conn *conn;
  int up, closed;
  int pending; /* requests outstanding */
  int gets_ok, gets_failed, puts_ok, puts_failed, lists_ok, pings_ok;
  /* The app's own chained on_transfer still runs. */
  int app_transfers;
  char lines[64][2048];
  int nlines;
  /* HTTP */
  int http_done, http_code;
  char body[1 << 16];
  char ctype[128];
} world;

static void log_cb(int level, const char *line, size_t len, void *ud) {
  world *w = ud;
  (void)level;
  if (w->nlines < 64 && len < sizeof w->lines[0])
    memcpy(w->lines[w->nlines++], line, len + 1);
}

static void app_transfer(hr_conn *c, const hr_transfer_record *r, void *ud) {
  (void)c;
  (void)r;
  ((world *)ud)->app_transfers++;
}

static void on_conn(hr_conn *c, int status, void *ud) {
  world *w = ud;
  (void)c;
  if (status == 0)
    w->up = 1;
  else
    w->closed = 1;
}

static void on_get(hr_session *s, uint32_t sid, hr_tensor *t,
                   const hr_transfer_record *rec, void *ud) {
  world *w = ud;
  (void)s;
  (void)sid;
  (void)rec;
  if (t) {
    w->gets_ok++;
    hr_tensor_unref(t);
  } else {
    w->gets_failed++;
  }
  w->pending--;
}

static void on_put(hr_session *s, uint32_t sid, const hr_transfer_record *rec,
                   void *ud) {
  world *w = ud;
  (void)s;
  (void)sid;
  if (rec->status == 0)
    w->puts_ok++;
  else
    w->puts_failed++;
  w->pending--;
}

static void on_list(hr_session *s, int status, uint32_t wire,
                    const hr_list_response *resp, void *ud) {
  world *w = ud;
  (void)s;
  (void)wire;
  (void)resp;
  if (status == 0)
    w->lists_ok++;
  w->pending--;
}

static void on_ping(hr_session *s, int status, uint64_t rtt, void *ud) {
  world *w = ud;
  (void)s;
  (void)rtt;
  if (status == 0)
    w->pings_ok++;
  w->pending--;
}

static int run_until(world *w, int *flag, int want, int ms) {
  struct timeval tv = {0, 10000};
  int i;
  for (i = 0; i < ms / 10 && *flag != want; i++) {
    event_base_loopexit(w->base, &tv);
    event_base_dispatch(w->base);
  }
  return *flag == want;
}

static void on_http(struct evhttp_request *req, void *ud) {
  world *w = ud;
  w->http_done = 1;
  if (!req) {
    w->http_code = -1;
    return;
  }
  w->http_code = evhttp_request_get_response_code(req);
  struct evbuffer *b = evhttp_request_get_input_buffer(req);
  size_t n = evbuffer_get_length(b);
  if (n >= sizeof w->body)
    n = sizeof w->body - 1;
  evbuffer_remove(b, w->body, n);
  w->body[n] = 0;
  const char *ct =
      evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
  snprintf(w->ctype, sizeof w->ctype, "%s", ct ? ct : "");
}

/* GET path on the endpoint; returns the status code. */
static int scrape(world *w, const char *path, enum evhttp_cmd_type cmd) {
  struct evhttp_connection *hc = evhttp_connection_base_new(
      w->base, NULL, "127.0.0.1", (ev_uint16_t)hr_ev_metrics_port(w->ep));
  assert_non_null(hc);
  struct evhttp_request *req = evhttp_request_new(on_http, w);
  assert_non_null(req);
  evhttp_add_header(evhttp_request_get_output_headers(req), "Host",
                    "127.0.0.1");
  w->http_done = 0;
  w->body[0] = 0;
  assert_int_equal(evhttp_make_request(hc, req, cmd, path), 0);
  assert_true(run_until(w, &w->http_done, 1, TL_WAIT_MS));
  evhttp_connection_free(hc);
  return w->http_code;
}

/* The value of the sample line that starts with `series` ("name{...}"). */
static double value_of(const char *body, const char *series) {
  char pat[512];
  snprintf(pat, sizeof pat, "\n%s ", series);
  const char *p = strstr(body, pat);
  if (!p) {
    print_error("series not found: %s\n", series);
    fail();
  }
  return strtod(p + strlen(pat), NULL);
}

static void put_tensor(world *w, const char *key, hr_tensor *t) {
  hr_session *s = hr_conn_session(w->conn);
  assert_int_equal(hr_session_put(s, (const uint8_t *)key,
                                  (uint16_t)strlen(key), 0, t, on_put, w, NULL),
                   0);
  w->pending++;
}

static void get_key(world *w, const char *key, uint8_t layout) {
  hr_session *s = hr_conn_session(w->conn);
  hr_layout_entry le = {layout, 0, NULL};
  hr_get_opts o;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)key;
  o.key_len = (uint16_t)strlen(key);
  o.flags = HR_REQ_ALLOW_TRANSCODE;
  o.layouts = &le;
  o.layout_count = 1;
  assert_int_equal(hr_session_get(s, &o, on_get, w, NULL), 0);
  w->pending++;
}

static void test_scrape(void **state) {
  world *w = calloc(1, sizeof *w);
  hr_store_config sc;
  hr_engine_config ec;
  hr_metrics_config mc;
  hr_provider prov;
  hr_listener *lis;
  char url[64];
  uint64_t shape[2] = {16, 8};
  (void)state;

  w->base = event_base_new();
  assert_non_null(w->base);
  hr_store_config_default(&sc);
  sc.allow_put = 1;
  assert_int_equal(hr_store_new(&w->store, &sc, NULL), 0);
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 2, shape, 1);
  assert_int_equal(hr_store_put(w->store, "w/a", 3, t, 0), 0);
  hr_tensor_unref(t);

  hr_metrics_config_default(&mc);
  mc.log = log_cb;
  mc.log_user_data = w;
  assert_int_equal(hr_metrics_new(&w->m, &mc, NULL), 0);
  hr_engine_config_default(&ec);
  ec.worker_threads = 1;
  ec.on_transfer = app_transfer;
  ec.user_data = w;
  assert_int_equal(hr_metrics_attach(w->m, &ec), 0);
  assert_int_equal(hr_ev_attach(&w->srv, w->base, &ec, NULL), 0);
  hr_store_provider(w->store, &prov);
  assert_int_equal(hr_engine_listen(w->srv, "127.0.0.1:0", &prov, &lis), 0);
  assert_int_equal(
      hr_ev_metrics_listen(&w->ep, w->base, w->m, w->srv, "127.0.0.1:0", NULL),
      0);
  assert_true(hr_ev_metrics_port(w->ep) > 0);

  /* Before any traffic: every family present, counters at 0. */
  assert_int_equal(scrape(w, "/metrics", EVHTTP_REQ_GET), 200);
  assert_string_equal(w->ctype, "text/plain; version=0.0.4; charset=utf-8");
  assert_int_equal(value_of(w->body, "hurray_connections_opened_total"), 0);

  assert_int_equal(hr_ev_attach(&w->cli, w->base, NULL, NULL), 0);
  snprintf(url, sizeof url, "127.0.0.1:%d", hr_listener_port(lis));
  assert_int_equal(hr_engine_connect(w->cli, url, NULL, on_conn, w, &w->conn),
                   0);
  assert_true(run_until(w, &w->up, 1, TL_WAIT_MS));

  /* Traffic: 2 GETs as stored, 1 transcoded, 1 missing; a PUT accepted
   * and one refused (the key exists); a LIST; a PING. */
  uint64_t pshape[1] = {1000};
  hr_tensor *p = tl_dense(HR_ELEM_FLOAT32, 1, pshape, 2);
  get_key(w, "w/a", HR_LAYOUT_ROW_MAJOR);
  get_key(w, "w/a", HR_LAYOUT_ROW_MAJOR);
  get_key(w, "w/a", HR_LAYOUT_COLUMN_MAJOR);
  get_key(w, "w/missing", HR_LAYOUT_ROW_MAJOR);
  put_tensor(w, "up/p", p);
  assert_int_equal(hr_session_list(hr_conn_session(w->conn), NULL, 0, NULL, 0,
                                   100, on_list, w),
                   0);
  w->pending++;
  assert_int_equal(hr_session_ping(hr_conn_session(w->conn), on_ping, w), 0);
  w->pending++;
  assert_int_equal(hr_engine_flush(w->cli), 0);
  assert_true(run_until(w, &w->pending, 0, TL_WAIT_MS));
  put_tensor(w, "w/a", p); /* exists: ALREADY_EXISTS */
  assert_int_equal(hr_engine_flush(w->cli), 0);
  assert_true(run_until(w, &w->pending, 0, TL_WAIT_MS));
  hr_tensor_unref(p);
  assert_int_equal(w->gets_ok, 3);
  assert_int_equal(w->gets_failed, 1);
  assert_int_equal(w->puts_ok, 1);
  assert_int_equal(w->puts_failed, 1);
  assert_int_equal(w->lists_ok, 1);
  assert_int_equal(w->pings_ok, 1);

  /* While the client is connected. */
  assert_int_equal(scrape(w, "/metrics", EVHTTP_REQ_GET), 200);
  const char *b = w->body;
  assert_int_equal(value_of(b, "hurray_requests_total{kind=\"get\","
                               "result=\"ok\"}"),
                   3);
  assert_int_equal(value_of(b, "hurray_requests_total{kind=\"get\","
                               "result=\"NOT_FOUND\"}"),
                   1);
  assert_int_equal(value_of(b, "hurray_requests_total{kind=\"put\","
                               "result=\"ok\"}"),
                   1);
  assert_int_equal(value_of(b, "hurray_requests_total{kind=\"put\","
                               "result=\"ALREADY_EXISTS\"}"),
                   1);
  assert_int_equal(value_of(b, "hurray_requests_total{kind=\"list\","
                               "result=\"ok\"}"),
                   1);
  assert_int_equal(value_of(b, "hurray_requests_total{kind=\"ping\","
                               "result=\"ok\"}"),
                   1);
  /* 3 GETs of 16x8 float32, and a 1000-float PUT. */
  assert_int_equal(value_of(b, "hurray_tensor_bytes_total{direction=\"sent\","
                               "plane=\"frames\"}"),
                   3 * 16 * 8 * 4);
  assert_int_equal(value_of(b, "hurray_tensor_bytes_total{direction="
                               "\"received\",plane=\"frames\"}"),
                   4000);
  assert_int_equal(
      value_of(b, "hurray_transcodes_total{layout=\"COLUMN_MAJOR\"}"), 1);
  assert_int_equal(value_of(b, "hurray_errors_total{code=\"NOT_FOUND\","
                               "direction=\"sent\",scope=\"stream\"}"),
                   1);
  assert_int_equal(value_of(b, "hurray_errors_total{code=\"ALREADY_EXISTS\","
                               "direction=\"sent\",scope=\"stream\"}"),
                   1);
  assert_int_equal(value_of(b, "hurray_connections_opened_total"), 1);
  assert_int_equal(value_of(b, "hurray_connections_closed_total"), 0);
  /* The client engine on the same loop counts too (sampled from the
   * server engine only). */
  assert_int_equal(value_of(b, "hurray_connections_active"), 1);
  assert_int_equal(value_of(b, "hurray_streams_active"), 0);
  /* Histograms: cumulative, +Inf == count, per kind. */
  assert_int_equal(value_of(b, "hurray_request_duration_seconds_count{kind="
                               "\"get\"}"),
                   4);
  assert_int_equal(value_of(b, "hurray_request_duration_seconds_bucket{kind="
                               "\"get\",le=\"+Inf\"}"),
                   4);
  assert_int_equal(value_of(b, "hurray_request_duration_seconds_bucket{kind="
                               "\"get\",le=\"60\"}"),
                   4);
  assert_true(value_of(b, "hurray_request_duration_seconds_sum{kind="
                          "\"get\"}") >= 0);
  assert_int_equal(value_of(b, "hurray_request_duration_seconds_count{kind="
                               "\"put\"}"),
                   2);
  double prev = 0;
  static const char *const les[] = {"0.0005", "0.001", "0.01", "0.1",
                                    "1",      "10",    "+Inf"};
  for (size_t i = 0; i < sizeof les / sizeof les[0]; i++) {
    char s[128];
    snprintf(s, sizeof s,
             "hurray_request_duration_seconds_bucket{kind=\"get\",le=\"%s\"}",
             les[i]);
    double v = value_of(b, s);
    assert_true(v >= prev);
    prev = v;
  }
  /* Chained: the application's on_transfer saw the 5 GET/PUT records. */
  assert_int_equal(w->app_transfers, 6);

  /* Other paths and methods. */
  assert_int_equal(scrape(w, "/", EVHTTP_REQ_GET), 404);
  assert_int_equal(scrape(w, "/metrics/x", EVHTTP_REQ_GET), 404);
  assert_int_equal(scrape(w, "/metrics", EVHTTP_REQ_POST), 405);
  assert_int_equal(scrape(w, "/metrics?x=1", EVHTTP_REQ_HEAD), 200);

  /* The client leaves: closed, and the gauge drops. */
  hr_conn_close(w->conn);
  assert_int_equal(hr_engine_flush(w->cli), 0);
  assert_true(run_until(w, &w->closed, 1, TL_WAIT_MS));
  struct timeval tv = {0, 50000};
  event_base_loopexit(w->base, &tv);
  event_base_dispatch(w->base);
  assert_int_equal(scrape(w, "/metrics", EVHTTP_REQ_GET), 200);
  assert_int_equal(value_of(w->body, "hurray_connections_closed_total"), 1);
  assert_int_equal(value_of(w->body, "hurray_connections_active"), 0);

  /* One log line per request, each with the peer. */
  int requests = 0;
  for (int i = 0; i < w->nlines; i++)
    if (strstr(w->lines[i], "\"event\":\"request\"")) {
      requests++;
      assert_non_null(strstr(w->lines[i], "\"peer\":\"127.0.0.1:"));
    }
  /* 4 GETs, 2 PUTs, the LIST; the PING is at debug. */
  assert_int_equal(requests, 7);

  hr_ev_metrics_close(w->ep);
  assert_int_equal(hr_engine_del(w->cli), 0);
  assert_int_equal(hr_engine_close(w->srv, NULL, NULL), 0);
  tv.tv_usec = 20000;
  event_base_loopexit(w->base, &tv);
  event_base_dispatch(w->base);
  assert_int_equal(hr_engine_del(w->srv), 0);
  hr_metrics_del(w->m);
  hr_store_del(w->store);
  event_base_free(w->base);
  free(w);
}

/* Refusals: a GET over max_streams is refused before it becomes a stream
 * (on_request), a connection over max_connections is rejected (on_conn),
 * and both show in the counters and the logs. */
static void test_refusals(void **state) {
  world *w = calloc(1, sizeof *w);
  hr_store_config sc;
  hr_engine_config ec;
  hr_metrics_config mc;
  hr_provider prov;
  hr_listener *lis;
  hr_conn *c2;
  char url[64];
  uint64_t shape[1] = {1 << 16};
  (void)state;

  w->base = event_base_new();
  hr_store_config_default(&sc);
  assert_int_equal(hr_store_new(&w->store, &sc, NULL), 0);
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 1, shape, 3);
  assert_int_equal(hr_store_put(w->store, "big", 3, t, 0), 0);
  hr_tensor_unref(t);
  hr_metrics_config_default(&mc);
  mc.log = log_cb;
  mc.log_user_data = w;
  assert_int_equal(hr_metrics_new(&w->m, &mc, NULL), 0);
  hr_engine_config_default(&ec);
  ec.max_connections = 1;
  ec.session.max_streams = 1;
  assert_int_equal(hr_metrics_attach(w->m, &ec), 0);
  assert_int_equal(hr_ev_attach(&w->srv, w->base, &ec, NULL), 0);
  hr_store_provider(w->store, &prov);
  assert_int_equal(hr_engine_listen(w->srv, "127.0.0.1:0", &prov, &lis), 0);
  assert_int_equal(
      hr_ev_metrics_listen(&w->ep, w->base, w->m, w->srv, "127.0.0.1:0", NULL),
      0);
  assert_int_equal(hr_ev_attach(&w->cli, w->base, NULL, NULL), 0);
  snprintf(url, sizeof url, "127.0.0.1:%d", hr_listener_port(lis));
  assert_int_equal(hr_engine_connect(w->cli, url, NULL, on_conn, w, &w->conn),
                   0);
  assert_true(run_until(w, &w->up, 1, TL_WAIT_MS));

  /* Two GETs in one write: the second arrives while the first (256 KiB)
   * still holds the only stream. */
  get_key(w, "big", HR_LAYOUT_ROW_MAJOR);
  get_key(w, "big", HR_LAYOUT_ROW_MAJOR);
  assert_int_equal(hr_engine_flush(w->cli), 0);
  assert_true(run_until(w, &w->pending, 0, TL_WAIT_MS));
  assert_int_equal(w->gets_ok, 1);
  assert_int_equal(w->gets_failed, 1);

  /* A second connection is over the cap. */
  w->up = 0;
  w->closed = 0;
  assert_int_equal(hr_engine_connect(w->cli, url, NULL, on_conn, w, &c2), 0);
  assert_true(run_until(w, &w->closed, 1, TL_WAIT_MS));

  assert_int_equal(scrape(w, "/metrics", EVHTTP_REQ_GET), 200);
  const char *b = w->body;
  assert_int_equal(value_of(b, "hurray_requests_total{kind=\"get\","
                               "result=\"RESOURCE_EXHAUSTED\"}"),
                   1);
  assert_int_equal(value_of(b, "hurray_requests_total{kind=\"get\","
                               "result=\"ok\"}"),
                   1);
  assert_int_equal(value_of(b, "hurray_errors_total{code=\"RESOURCE_EXHAUSTED"
                               "\",direction=\"sent\",scope=\"stream\"}"),
                   1);
  assert_int_equal(value_of(b, "hurray_errors_total{code=\"RESOURCE_EXHAUSTED"
                               "\",direction=\"sent\",scope=\"connection\"}"),
                   1);
  assert_int_equal(value_of(b, "hurray_connections_rejected_total"), 1);
  assert_int_equal(value_of(b, "hurray_connections_opened_total"), 1);
  int refused = 0, rejected = 0;
  for (int i = 0; i < w->nlines; i++) {
    if (strstr(w->lines[i], "\"result\":\"RESOURCE_EXHAUSTED\"") &&
        strstr(w->lines[i], "\"key\":\"big\"") &&
        strstr(w->lines[i], "\"level\":\"warn\""))
      refused++;
    if (strstr(w->lines[i], "\"event\":\"conn_reject\""))
      rejected++;
  }
  assert_int_equal(refused, 1);
  assert_int_equal(rejected, 1);

  hr_conn_close(w->conn);
  assert_int_equal(hr_engine_flush(w->cli), 0);
  struct timeval tv = {0, 100000};
  event_base_loopexit(w->base, &tv);
  event_base_dispatch(w->base);
  hr_ev_metrics_close(w->ep);
  assert_int_equal(hr_engine_close(w->cli, NULL, NULL), 0);
  assert_int_equal(hr_engine_close(w->srv, NULL, NULL), 0);
  tv.tv_usec = 50000;
  event_base_loopexit(w->base, &tv);
  event_base_dispatch(w->base);
  assert_int_equal(hr_engine_del(w->cli), 0);
  assert_int_equal(hr_engine_del(w->srv), 0);
  hr_metrics_del(w->m);
  hr_store_del(w->store);
  event_base_free(w->base);
  free(w);
}

/* A parallel GET answered with 4 shards on one connection: one request,
 * four log lines (shard 0..3, each with the key), all the bytes. */
static void test_sharded(void **state) {
  world *w = calloc(1, sizeof *w);
  hr_store_config sc;
  hr_engine_config ec;
  hr_metrics_config mc;
  hr_provider prov;
  hr_listener *lis;
  char url[64];
  uint64_t shape[1] = {1 << 16}; /* 256 KiB of float32 */
  (void)state;

  w->base = event_base_new();
  hr_store_config_default(&sc);
  assert_int_equal(hr_store_new(&w->store, &sc, NULL), 0);
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 1, shape, 4);
  assert_int_equal(hr_store_put(w->store, "par", 3, t, 0), 0);
  hr_tensor_unref(t);
  hr_metrics_config_default(&mc);
  mc.log = log_cb;
  mc.log_user_data = w;
  assert_int_equal(hr_metrics_new(&w->m, &mc, NULL), 0);
  hr_engine_config_default(&ec);
  ec.session.shard_bytes = 64 << 10;
  assert_int_equal(hr_metrics_attach(w->m, &ec), 0);
  assert_int_equal(hr_ev_attach(&w->srv, w->base, &ec, NULL), 0);
  hr_store_provider(w->store, &prov);
  assert_int_equal(hr_engine_listen(w->srv, "127.0.0.1:0", &prov, &lis), 0);
  assert_int_equal(
      hr_ev_metrics_listen(&w->ep, w->base, w->m, w->srv, "127.0.0.1:0", NULL),
      0);
  assert_int_equal(hr_ev_attach(&w->cli, w->base, NULL, NULL), 0);
  snprintf(url, sizeof url, "127.0.0.1:%d", hr_listener_port(lis));
  assert_int_equal(hr_engine_connect(w->cli, url, NULL, on_conn, w, &w->conn),
                   0);
  assert_true(run_until(w, &w->up, 1, TL_WAIT_MS));

  hr_layout_entry le = {HR_LAYOUT_ROW_MAJOR, 0, NULL};
  hr_get_opts o;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)"par";
  o.key_len = 3;
  o.flags = HR_REQ_PARALLEL_OK;
  o.max_shards = 4;
  o.layouts = &le;
  o.layout_count = 1;
  assert_int_equal(
      hr_session_get(hr_conn_session(w->conn), &o, on_get, w, NULL), 0);
  w->pending++;
  assert_int_equal(hr_engine_flush(w->cli), 0);
  assert_true(run_until(w, &w->pending, 0, TL_WAIT_MS));
  assert_int_equal(w->gets_ok, 1);

  assert_int_equal(scrape(w, "/metrics", EVHTTP_REQ_GET), 200);
  assert_int_equal(value_of(w->body, "hurray_requests_total{kind=\"get\","
                                     "result=\"ok\"}"),
                   1);
  assert_int_equal(value_of(w->body, "hurray_request_duration_seconds_count{"
                                     "kind=\"get\"}"),
                   1);
  assert_int_equal(value_of(w->body, "hurray_tensor_bytes_total{direction="
                                     "\"sent\",plane=\"frames\"}"),
                   1 << 18);
  int lines = 0, seen = 0;
  for (int i = 0; i < w->nlines; i++) {
    const char *l = w->lines[i];
    if (!strstr(l, "\"event\":\"request\""))
      continue;
    lines++;
    assert_non_null(strstr(l, "\"key\":\"par\""));
    assert_non_null(strstr(l, "\"shards\":4"));
    const char *sh = strstr(l, "\"shard\":");
    assert_non_null(sh);
    seen |= 1 << atoi(sh + 8);
  }
  assert_int_equal(lines, 4);
  assert_int_equal(seen, 0xf);

  hr_conn_close(w->conn);
  assert_int_equal(hr_engine_flush(w->cli), 0);
  assert_true(run_until(w, &w->closed, 1, TL_WAIT_MS));
  hr_ev_metrics_close(w->ep);
  assert_int_equal(hr_engine_close(w->srv, NULL, NULL), 0);
  struct timeval tv = {0, 50000};
  event_base_loopexit(w->base, &tv);
  event_base_dispatch(w->base);
  assert_int_equal(hr_engine_del(w->cli), 0);
  assert_int_equal(hr_engine_del(w->srv), 0);
  hr_metrics_del(w->m);
  hr_store_del(w->store);
  event_base_free(w->base);
  free(w);
}

/* Bad addresses; port in use. */
static void test_listen_errors(void **state) {
  struct event_base *base = event_base_new();
  hr_metrics *m;
  hr_ev_metrics *a, *b;
  char addr[64];
  (void)state;

  assert_int_equal(hr_metrics_new(&m, NULL, NULL), 0);
  assert_int_equal(hr_ev_metrics_listen(&a, base, m, NULL, "nocolon", NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_ev_metrics_listen(&a, base, m, NULL, "h:99999", NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_ev_metrics_listen(&a, base, m, NULL, "::1:80", NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_ev_metrics_listen(&a, base, m, NULL, ":80", NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_ev_metrics_listen(&a, base, NULL, NULL, "h:1", NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_ev_metrics_listen(&a, base, m, NULL, "127.0.0.1:0", NULL),
                   0);
  snprintf(addr, sizeof addr, "127.0.0.1:%d", hr_ev_metrics_port(a));
  assert_int_equal(hr_ev_metrics_listen(&b, base, m, NULL, addr, NULL),
                   HR_ERR_IO);
  hr_ev_metrics_close(a);
  hr_ev_metrics_close(NULL);
  hr_metrics_del(m);
  event_base_free(base);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scrape),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_sharded),
      cmocka_unit_test(test_listen_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
