/*
 * TLS over TCP: GET (small and 64 MiB, byte-exact), PUT and LIST over
 * "hurrays://" on both loops; lanes over TLS; mutual TLS accepted and
 * refused (no client certificate, one from another CA); an untrusted
 * server, a hostname mismatch, the name checked through SNI; a plain
 * client at a TLS server and a TLS client at a plain server failing
 * cleanly and quickly; the blocking client; configuration errors; kernel
 * TLS used where the kernel has it.  Certificates are made at run time
 * (certs.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <hurray/client.h>

#include "certs.h"
#include "tc.h"
#include "tl.h"

#ifndef TCP_ULP
#define TCP_ULP 31
#endif

#define BIG (64ull << 20)

static certs C;

static int group_setup(void **state) {
  (void)state;
  return certs_make(&C);
}

static int group_teardown(void **state) {
  (void)state;
  certs_remove(&C);
  return 0;
}

/* Whether the kernel offers the "tls" upper layer protocol (kTLS). */
static int kernel_has_ktls(void) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  int l, c, s, ok = 0;

  l = tl_raw_listen(&(int){0});
  if (l < 0)
    return 0;
  if (getsockname(l, (struct sockaddr *)&a, &len) == 0) {
    c = tl_raw_connect(ntohs(a.sin_port));
    s = c >= 0 ? accept(l, NULL, NULL) : -1;
    if (c >= 0)
      ok = setsockopt(c, SOL_TCP, TCP_ULP, "tls", sizeof "tls") == 0;
    if (s >= 0)
      close(s);
    if (c >= 0)
      close(c);
  }
  close(l);
  return ok;
}

/* A TLS server (tl_server with tls_server) with the given client CA. */
static void tls_server(tl_env *env, tl_server *ts, hr_tls_config *tc,
                       const char *client_ca) {
  hr_engine_config ec;

  memset(tc, 0, sizeof *tc);
  tc->cert_file = C.server_cert;
  tc->key_file = C.server_key;
  tc->ca_file = client_ca;
  hr_engine_config_default(&ec);
  ec.tls_server = tc;
  ec.session.shard_bytes = 1u << 20; /* parallel answers of 4 shards */
  ec.io_budget = 50000;
  tl_server_start(env, ts, &ec, NULL);
  snprintf(ts->url, sizeof ts->url, "hurrays://127.0.0.1:%d", ts->port);
}

/* A client engine trusting `ca`, presenting cert/key (may be NULL),
 * verifying `name` (NULL: the URL's host). */
static hr_engine *tls_client(tl_env *env, const char *ca, const char *cert,
                             const char *key, const char *name) {
  hr_engine_config ec;
  hr_tls_config tc;

  memset(&tc, 0, sizeof tc);
  tc.ca_file = ca;
  tc.cert_file = cert;
  tc.key_file = key;
  tc.server_name = name;
  hr_engine_config_default(&ec);
  ec.tls_client = &tc; /* read by hr_engine_new only */
  /* Not a multiple of a record: reads stop inside records, and what TLS
   * still holds must be drained past the budget. */
  ec.io_budget = 40000;
  return tl_engine(env, &ec);
}

/* Connects and expects a failure within `ms`; returns the message. */
static const char *expect_fail(tl_env *env, hr_engine *e, const char *url,
                               tc_conn *c, int ms) {
  tc_connect(env, e, url, c, NULL);
  assert_int_equal(tc_wait_up(c, ms), 0);
  assert_true(c->closed);
  assert_int_not_equal(c->status, 0);
  fprintf(stderr, "  %s: %s: %s\n", url, hr_strerror(c->status), c->message);
  return c->message;
}

/* ---- flows ---------------------------------------------------------------- */

static void flows(int mode, int big) {
  tl_env *env = tl_new(mode);
  tl_server ts;
  hr_tls_config stc;
  hr_engine *ce = tls_client(env, C.ca, NULL, NULL, NULL);
  uint64_t sh[2] = {6, 5}, bsh[1] = {BIG / 4};
  hr_tensor *m = tl_dense(HR_ELEM_FLOAT32, 2, sh, 7);
  hr_tensor *b = big ? tl_dense(HR_ELEM_FLOAT32, 1, bsh, 11) : NULL;
  hr_tls_info ti;
  uint64_t rx, tx;
  tc_conn c;
  tc_res r;

  tls_server(env, &ts, &stc, NULL);
  tl_put(&ts, "m", m);
  if (b)
    tl_put(&ts, "big", b);
  tc_open(env, ce, ts.url, &c);

  /* What was negotiated. */
  assert_int_equal(hr_conn_tls_info(c.c, &ti), 0);
  assert_string_equal(ti.version, "TLSv1.3");
  assert_string_equal(ti.cipher, "TLS_AES_128_GCM_SHA256");
  assert_int_equal(ti.peer_cert, 1);
  assert_non_null(strstr(ti.peer_subject, "hurray-test-server"));
  if (kernel_has_ktls())
    assert_int_equal(ti.ktls_tx, 1);
  else
    assert_int_equal(ti.ktls_tx | ti.ktls_rx, 0); /* userspace fallback */

  assert_int_equal(tc_get_key(&c, "m", &r), 0);
  assert_true(tl_same_elements(m, NULL, r.t));
  tc_res_clear(&r);
  if (b) {
    /* Large: many records, partial reads and writes, into place. */
    assert_int_equal(tc_get_key(&c, "big", &r), 0);
    assert_int_equal(r.rec.bytes, BIG);
    assert_memory_equal(hr_tensor_buffer(r.t, 0), hr_tensor_buffer(b, 0), BIG);
    tc_res_clear(&r);
    /* And back up under another key. */
    assert_int_equal(tc_put(&c, "big2", 0, b, &r), 0);
    tc_res_clear(&r);
    assert_int_equal(tc_get_key(&c, "big2", &r), 0);
    assert_memory_equal(hr_tensor_buffer(r.t, 0), hr_tensor_buffer(b, 0), BIG);
    tc_res_clear(&r);
  }
  assert_int_equal(tc_put(&c, "p", 0, m, &r), 0);
  tc_res_clear(&r);
  assert_int_equal(tc_get_key(&c, "p", &r), 0);
  assert_true(tl_same_elements(m, NULL, r.t));
  tc_res_clear(&r);
  assert_int_equal(tc_list(&c, "", "", 10, &r), 0);
  assert_int_equal(r.nentries, b ? 4 : 2);
  tc_res_clear(&r);
  assert_int_equal(tc_ping(&c, &r), 0);
  /* The byte counts are the application's, not the records'. */
  hr_conn_bytes(c.c, &rx, &tx);
  if (b)
    assert_true(rx > 2 * BIG && tx > BIG);
  tc_close(&c);

  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  hr_tensor_unref(m);
  hr_tensor_unref(b);
  tl_free(env);
}

static void test_flows_epoll_big(void **state) {
  (void)state;
  flows(TL_EPOLL, 1);
}

static void test_flows_libevent(void **state) {
  (void)state;
  flows(TL_LIBEVENT, 0);
}

/* ---- lanes ------------------------------------------------------------------ */

static void on_group(hr_conn *hc, int status, void *ud) {
  tc_conn *c = ud;
  const char *msg = NULL;

  if (status == 0 && !c->up) {
    c->up = 1;
    return;
  }
  c->closed = 1;
  c->status = status;
  hr_conn_error(hc, NULL, NULL, &msg);
  snprintf(c->message, sizeof c->message, "%s", msg ? msg : "");
  c->c = NULL;
}

static void test_lanes(void **state) {
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_tls_config stc;
  hr_engine *ce = tls_client(env, C.ca, NULL, NULL, NULL);
  uint64_t sh[2] = {1024, 4096};
  hr_tensor *m = tl_dense(HR_ELEM_FLOAT32, 2, sh, 5); /* 16 MiB */
  hr_get_opts o;
  tc_conn c;
  tc_res r;

  (void)state;
  tls_server(env, &ts, &stc, NULL);
  tl_put(&ts, "m", m);
  memset(&c, 0, sizeof c);
  c.env = env;
  c.e = ce;
  assert_int_equal(
      hr_engine_connect_group(ce, ts.url, 4, NULL, on_group, &c, &c.c), 0);
  assert_int_equal(tc_wait_up(&c, TL_WAIT_MS), 1);
  assert_int_equal(hr_conn_lanes(c.c), 4);
  tc_opts(&o, "m");
  o.flags = HR_REQ_PARALLEL_OK;
  o.max_shards = 4;
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_int_equal(r.rec.shards, 4);
  assert_int_equal(r.rec.lanes, 4);
  assert_true(tl_same_elements(m, NULL, r.t));
  tc_res_clear(&r);
  tc_close(&c);
  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  hr_tensor_unref(m);
  tl_free(env);
}

/* ---- mutual TLS ------------------------------------------------------------ */

/* The server's on_hello sees the client's certificate. */
typedef struct seen {
  int calls;
  int rv;
  hr_tls_info ti;
  hr_provider store;
} seen;

static int seen_hello(hr_session *s, const hr_hello *peer,
                      uint32_t *wire_error, void *ud) {
  seen *sn = ud;

  (void)peer;
  (void)wire_error;
  sn->calls++;
  sn->rv = hr_conn_tls_info(hr_session_user_data(s), &sn->ti);
  return 0;
}

static int seen_get(hr_session *s, hr_srv_get *g, void *ud) {
  seen *sn = ud;
  return sn->store.on_get(s, g, sn->store.user_data);
}

static void seen_get_cancel(hr_session *s, hr_srv_get *g, void *ud) {
  seen *sn = ud;
  if (sn->store.on_get_cancel)
    sn->store.on_get_cancel(s, g, sn->store.user_data);
}

static void test_mtls(void **state) {
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_tls_config stc;
  hr_engine *good = tls_client(env, C.ca, C.client_cert, C.client_key, NULL);
  hr_engine *none = tls_client(env, C.ca, NULL, NULL, NULL);
  hr_engine *other = tls_client(env, C.ca, C.other_client_cert,
                                C.other_client_key, NULL);
  uint64_t sh[1] = {100};
  hr_tensor *m = tl_dense(HR_ELEM_UINT8, 1, sh, 3);
  hr_provider prov;
  hr_listener *l;
  seen sn;
  char url[64];
  const char *msg;
  tc_conn c;
  tc_res r;

  (void)state;
  tls_server(env, &ts, &stc, C.ca);
  tl_put(&ts, "m", m);
  /* A second listener whose provider looks at the certificate. */
  memset(&sn, 0, sizeof sn);
  hr_store_provider(ts.store, &sn.store);
  memset(&prov, 0, sizeof prov);
  prov.size = sizeof prov;
  prov.user_data = &sn;
  prov.on_get = seen_get;
  prov.on_get_cancel = seen_get_cancel;
  prov.on_hello = seen_hello;
  assert_int_equal(hr_engine_listen(ts.e, "127.0.0.1:0", &prov, &l), 0);
  snprintf(url, sizeof url, "hurrays://127.0.0.1:%d", hr_listener_port(l));

  /* The CA's client gets in, and the server knows who it is. */
  tc_open(env, good, url, &c);
  assert_int_equal(tc_get_key(&c, "m", &r), 0);
  assert_true(tl_same_elements(m, NULL, r.t));
  tc_res_clear(&r);
  assert_int_equal(sn.calls, 1);
  assert_int_equal(sn.rv, 0);
  assert_int_equal(sn.ti.peer_cert, 1);
  assert_non_null(strstr(sn.ti.peer_subject, "hurray-test-client"));
  tc_close(&c);

  /* Without a certificate: refused, and the client says why. */
  msg = expect_fail(env, none, ts.url, &c, TL_WAIT_MS);
  assert_non_null(strstr(msg, "TLS"));
  assert_non_null(strstr(msg, "certificate"));
  /* With one from another CA: refused. */
  msg = expect_fail(env, other, ts.url, &c, TL_WAIT_MS);
  assert_non_null(strstr(msg, "TLS"));
  assert_int_equal(sn.calls, 1); /* never reached the session */

  /* The server goes on serving. */
  tc_open(env, good, ts.url, &c);
  assert_int_equal(tc_ping(&c, &r), 0);
  tc_close(&c);

  tl_engine_finish(env, good);
  tl_engine_finish(env, none);
  tl_engine_finish(env, other);
  tl_server_stop(env, &ts);
  hr_tensor_unref(m);
  tl_free(env);
}

/* ---- verification of the server -------------------------------------------- */

static void test_server_verification(void **state) {
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_tls_config stc;
  hr_engine *untrusting = tls_client(env, C.other_ca, NULL, NULL, NULL);
  hr_engine *wrong = tls_client(env, C.ca, NULL, NULL, "wrong.example");
  hr_engine *byname = tls_client(env, C.ca, NULL, NULL, "localhost");
  const char *msg;
  tc_conn c;
  tc_res r;

  (void)state;
  tls_server(env, &ts, &stc, NULL);
  /* A CA that did not issue the server's certificate. */
  msg = expect_fail(env, untrusting, ts.url, &c, TL_WAIT_MS);
  assert_non_null(strstr(msg, "certificate verify failed"));
  assert_int_equal(c.status, HR_ERR_IO);
  /* The right CA, the wrong name. */
  msg = expect_fail(env, wrong, ts.url, &c, TL_WAIT_MS);
  assert_non_null(strstr(msg, "hostname mismatch"));
  assert_non_null(strstr(msg, "wrong.example"));
  /* Checked by DNS name (SAN localhost, sent as SNI). */
  tc_open(env, byname, ts.url, &c);
  assert_int_equal(tc_ping(&c, &r), 0);
  tc_close(&c);

  tl_engine_finish(env, untrusting);
  tl_engine_finish(env, wrong);
  tl_engine_finish(env, byname);
  tl_server_stop(env, &ts);
  tl_free(env);
}

/* ---- TLS against plain ----------------------------------------------------- */

static void test_plain_vs_tls(void **state) {
  tl_env *env = tl_new(TL_EPOLL);
  tl_server tls_srv, plain_srv;
  hr_tls_config stc;
  hr_engine *ce = tls_client(env, C.ca, NULL, NULL, NULL);
  char url[64];
  const char *msg;
  tc_conn c;
  tc_res r;

  (void)state;
  tls_server(env, &tls_srv, &stc, NULL);
  tl_server_start(env, &plain_srv, NULL, NULL);

  /* A plain client at the TLS server. */
  snprintf(url, sizeof url, "hurray://127.0.0.1:%d", tls_srv.port);
  msg = expect_fail(env, ce, url, &c, TL_WAIT_MS);
  assert_non_null(strstr(msg, "TLS"));
  /* A TLS client at the plain server. */
  snprintf(url, sizeof url, "hurrays://127.0.0.1:%d", plain_srv.port);
  msg = expect_fail(env, ce, url, &c, TL_WAIT_MS);
  assert_non_null(strstr(msg, "TLS"));
  /* Both servers go on serving their own kind. */
  tc_open(env, ce, tls_srv.url, &c);
  assert_int_equal(tc_ping(&c, &r), 0);
  tc_close(&c);
  tc_open(env, ce, plain_srv.url, &c);
  assert_int_equal(tc_ping(&c, &r), 0);
  assert_int_equal(hr_conn_tls_info(c.c, &(hr_tls_info){0}),
                   HR_ERR_UNSUPPORTED);
  tc_close(&c);

  tl_engine_finish(env, ce);
  tl_server_stop(env, &tls_srv);
  tl_server_stop(env, &plain_srv);
  tl_free(env);
}

/* A TLS client at a peer that accepts and never answers: the handshake
 * timeout ends it. */
static void test_silent_server_times_out(void **state) {
  tl_env *env = tl_new(TL_EPOLL);
  hr_engine_config ec;
  hr_tls_config tc;
  hr_engine *ce;
  int port, l = tl_raw_listen(&port);
  char url[64];
  tc_conn c;

  (void)state;
  memset(&tc, 0, sizeof tc);
  tc.ca_file = C.ca;
  hr_engine_config_default(&ec);
  ec.tls_client = &tc;
  ec.session.handshake_timeout = 300000000ull; /* 0.3 s */
  ce = tl_engine(env, &ec);
  snprintf(url, sizeof url, "hurrays://127.0.0.1:%d", port);
  expect_fail(env, ce, url, &c, TL_WAIT_MS);
  assert_int_equal(c.status, HR_ERR_TIMEOUT);
  tl_engine_finish(env, ce);
  close(l);
  tl_free(env);
}

/* A TLS 1.2 client is refused: the engine speaks TLS 1.3 only. */
static void test_tls12_refused(void **state) {
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_tls_config stc;
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  SSL *ssl;
  int fd, i, rv = 0, err = 0;

  (void)state;
  tls_server(env, &ts, &stc, NULL);
  assert_non_null(ctx);
  assert_int_equal(SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION), 1);
  fd = tl_raw_connect(ts.port);
  assert_true(fd >= 0);
  assert_int_equal(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
  ssl = SSL_new(ctx);
  assert_non_null(ssl);
  SSL_set_fd(ssl, fd);
  for (i = 0; i < TL_WAIT_MS / 10; i++) {
    rv = SSL_connect(ssl);
    if (rv == 1)
      break;
    err = SSL_get_error(ssl, rv);
    if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE)
      break;
    tl_spin(env, 10);
  }
  assert_int_not_equal(rv, 1);
  assert_int_equal(err, SSL_ERROR_SSL);
  assert_int_equal(ERR_GET_REASON(ERR_peek_error()),
                   SSL_R_TLSV1_ALERT_PROTOCOL_VERSION);
  ERR_clear_error();
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  tl_server_stop(env, &ts);
  tl_free(env);
}

/* ---- contexts the host made ---------------------------------------------- */

/* The host's own SSL_CTXs: the engine takes a reference, so the host may
 * free its own at once; TLS 1.3 is required even when the context allows
 * less, and the client still checks the name. */
static void test_host_ssl_ctx(void **state) {
  tl_env *env = tl_new(TL_EPOLL);
  SSL_CTX *sctx = SSL_CTX_new(TLS_server_method());
  SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
  hr_engine_config ec;
  hr_tls_config stc, ctc;
  hr_engine *ce, *wrong;
  tl_server ts;
  hr_tls_info ti;
  tc_conn c;
  tc_res r;

  (void)state;
  assert_non_null(sctx);
  assert_non_null(cctx);
  assert_int_equal(SSL_CTX_use_certificate_chain_file(sctx, C.server_cert), 1);
  assert_int_equal(
      SSL_CTX_use_PrivateKey_file(sctx, C.server_key, SSL_FILETYPE_PEM), 1);
  assert_int_equal(SSL_CTX_load_verify_locations(cctx, C.ca, NULL), 1);
  SSL_CTX_set_verify(cctx, SSL_VERIFY_PEER, NULL);
  memset(&stc, 0, sizeof stc);
  stc.ssl_ctx = sctx;
  hr_engine_config_default(&ec);
  ec.tls_server = &stc;
  tl_server_start(env, &ts, &ec, NULL);
  snprintf(ts.url, sizeof ts.url, "hurrays://127.0.0.1:%d", ts.port);
  memset(&ctc, 0, sizeof ctc);
  ctc.ssl_ctx = cctx;
  hr_engine_config_default(&ec);
  ec.tls_client = &ctc;
  ce = tl_engine(env, &ec);
  ctc.server_name = "wrong.example";
  wrong = tl_engine(env, &ec);
  SSL_CTX_free(sctx);
  SSL_CTX_free(cctx);

  tc_open(env, ce, ts.url, &c);
  assert_int_equal(hr_conn_tls_info(c.c, &ti), 0);
  assert_string_equal(ti.version, "TLSv1.3");
  assert_int_equal(ti.peer_cert, 1);
  assert_int_equal(tc_ping(&c, &r), 0);
  tc_close(&c);
  assert_non_null(strstr(expect_fail(env, wrong, ts.url, &c, TL_WAIT_MS),
                         "hostname mismatch"));

  tl_engine_finish(env, ce);
  tl_engine_finish(env, wrong);
  tl_server_stop(env, &ts);
  tl_free(env);
}

/* ---- the blocking client --------------------------------------------------- */

typedef struct srv {
  pthread_t th;
  atomic_int stop, port;
  hr_tensor *m;
} srv;

static int stopped(void *ud) {
  return atomic_load(&((srv *)ud)->stop);
}

static void *srv_main(void *arg) {
  srv *s = arg;
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_tls_config stc;

  tls_server(env, &ts, &stc, NULL);
  tl_put(&ts, "m", s->m);
  atomic_store(&s->port, ts.port);
  tl_run(env, stopped, s, 600000);
  tl_server_stop(env, &ts);
  tl_free(env);
  return NULL;
}

static void test_blocking_client(void **state) {
  srv s;
  uint64_t sh[2] = {64, 1024};
  hr_client_options o;
  hr_tls_config tc;
  hr_client *cl;
  hr_client_error err;
  hr_tls_info ti;
  hr_get_opts g;
  hr_tensor *t;
  char url[64];

  (void)state;
  memset(&s, 0, sizeof s);
  s.m = tl_dense(HR_ELEM_FLOAT32, 2, sh, 9);
  assert_int_equal(pthread_create(&s.th, NULL, srv_main, &s), 0);
  while (!atomic_load(&s.port))
    usleep(1000);
  snprintf(url, sizeof url, "hurrays://127.0.0.1:%d", atomic_load(&s.port));

  hr_client_options_default(&o);
  memset(&tc, 0, sizeof tc);
  tc.ca_file = C.ca;
  o.tls = &tc;
  o.timeout_ms = 30000;
  assert_int_equal(hr_client_connect(&cl, url, &o, NULL, &err), 0);
  assert_int_equal(hr_client_tls_info(cl, &ti), 0);
  assert_string_equal(ti.version, "TLSv1.3");
  memset(&g, 0, sizeof g);
  g.key = (const uint8_t *)"m";
  g.key_len = 1;
  g.max_shards = 1;
  assert_int_equal(hr_client_get(cl, &g, &t, NULL), 0);
  assert_true(tl_same_elements(s.m, NULL, t));
  hr_tensor_unref(t);
  hr_client_close(cl);

  /* A CA file that is not there: refused before connecting. */
  tc.ca_file = "/nonexistent/ca.pem";
  assert_int_equal(hr_client_connect(&cl, url, &o, NULL, &err),
                   HR_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "/nonexistent/ca.pem"));
  /* An untrusted server. */
  tc.ca_file = C.other_ca;
  assert_int_equal(hr_client_connect(&cl, url, &o, NULL, &err), HR_ERR_IO);
  assert_non_null(strstr(err.message, "certificate verify failed"));

  atomic_store(&s.stop, 1);
  pthread_join(s.th, NULL);
  hr_tensor_unref(s.m);
}

/* ---- configuration errors --------------------------------------------------- */

static int dummy_watch(void *ld, int fd, int events, void **cookie) {
  (void)ld;
  (void)fd;
  (void)events;
  (void)cookie;
  return 0;
}

static int dummy_timer(void *ld, int64_t ms) {
  (void)ld;
  (void)ms;
  return 0;
}

static void test_config_errors(void **state) {
  hr_tls_config tc;
  hr_engine_config ec;
  hr_loop_ops ops;
  hr_engine *e = NULL;
  char why[512];

  (void)state;
  memset(&tc, 0, sizeof tc);
  /* A server needs a certificate. */
  assert_int_equal(hr_tls_config_check(&tc, 1, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(why, "certificate"));
  /* A client needs nothing. */
  assert_int_equal(hr_tls_config_check(&tc, 0, why, sizeof why), 0);
  /* A certificate without its key. */
  tc.cert_file = C.client_cert;
  assert_int_equal(hr_tls_config_check(&tc, 0, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  /* A file that is not there. */
  tc.cert_file = "/nonexistent/cert.pem";
  tc.key_file = C.server_key;
  assert_int_equal(hr_tls_config_check(&tc, 1, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(why, "/nonexistent/cert.pem"));
  /* A file that is not PEM. */
  tc.cert_file = "/etc/hostname";
  assert_int_equal(hr_tls_config_check(&tc, 1, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(why, "/etc/hostname"));
  /* The key of another certificate. */
  tc.cert_file = C.server_cert;
  tc.key_file = C.client_key;
  assert_int_equal(hr_tls_config_check(&tc, 1, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(why, "does not match"));
  /* A bad client CA file. */
  tc.key_file = C.server_key;
  tc.ca_file = "/nonexistent/ca.pem";
  assert_int_equal(hr_tls_config_check(&tc, 1, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(why, "/nonexistent/ca.pem"));
  tc.ca_file = C.ca;
  assert_int_equal(hr_tls_config_check(&tc, 1, why, sizeof why), 0);
  /* The engine refuses what does not load, and takes what does. */
  tc.key_file = C.client_key;
  hr_engine_config_default(&ec);
  ec.tls_server = &tc;
  memset(&ops, 0, sizeof ops);
  ops.size = sizeof ops;
  ops.watch = dummy_watch;
  ops.timer = dummy_timer;
  assert_int_equal(hr_engine_new(&e, &ops, NULL, &ec, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  tc.key_file = C.server_key;
  assert_int_equal(hr_engine_new(&e, &ops, NULL, &ec, NULL), 0);
  assert_int_equal(hr_engine_del(e), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_errors),
      cmocka_unit_test(test_flows_epoll_big),
      cmocka_unit_test(test_flows_libevent),
      cmocka_unit_test(test_lanes),
      cmocka_unit_test(test_mtls),
      cmocka_unit_test(test_server_verification),
      cmocka_unit_test(test_plain_vs_tls),
      cmocka_unit_test(test_silent_server_times_out),
      cmocka_unit_test(test_host_ssl_ctx),
      cmocka_unit_test(test_tls12_refused),
      cmocka_unit_test(test_blocking_client),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
