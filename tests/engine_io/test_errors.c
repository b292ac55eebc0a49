/*
 * Every error of wire-v1 § 12 that a server or a client sends or must
 * handle, provoked over loopback by a raw socket peer that sends crafted
 * bytes: against our server (raw client) and against our client (raw
 * server).  After a stream-level error the connection must go on; after
 * a connection-level one the ERROR must arrive on stream 0 before the
 * close.
 */
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tc.h"
#include "tr.h"

#define BUFSZ (1u << 20)

typedef struct fx {
  tl_env *env;
  tl_server srv;
  uint8_t *buf;
} fx;

static int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  hr_engine_config ec;
  uint64_t shape[2] = {4, 8}, big[1] = {64u << 20};
  hr_tensor *t;

  f->env = tl_new(TL_EPOLL);
  hr_engine_config_default(&ec);
  ec.session.handshake_timeout = 300u * 1000000u;
  ec.max_inflight_bytes = 1u << 20;
  tl_server_start(f->env, &f->srv, &ec, NULL);
  t = tl_dense(HR_ELEM_FLOAT32, 2, shape, 1);
  tl_put(&f->srv, "m", t);
  hr_tensor_unref(t);
  t = tl_dense(HR_ELEM_UINT8, 1, big, 2);
  tl_put(&f->srv, "big", t);
  hr_tensor_unref(t);
  f->buf = malloc(BUFSZ);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;
  tl_server_stop(f->env, &f->srv);
  tl_free(f->env);
  free(f->buf);
  free(f);
  return 0;
}

/* A raw client that completed the HELLO exchange. */
static int raw_client(fx *f) {
  return tr_client(f->env, f->srv.port, NULL, f->buf, BUFSZ);
}

/* Expects ERROR `code` on `stream`. */
static void expect_error(fx *f, int fd, uint32_t stream, uint32_t code) {
  tr_expect_error(f->env, fd, stream, code, f->buf, BUFSZ);
}

/* The connection still works: a PING gets its PONG. */
static void expect_alive(fx *f, int fd) {
  tr_expect_alive(f->env, fd, 0x1234, f->buf, BUFSZ);
}

static void send_request(fx *f, int fd, uint32_t sid, const char *key,
                         uint32_t flags, uint8_t device) {
  tr_send_request(f->env, fd, sid, key, flags, device, 1);
}

/* A TENSOR_PUT of a float32 [4] tensor; `tweak` may spoil it. */
static void put_msg(hr_msg *m, uint32_t sid, const char *key,
                    void (*tweak)(hr_msg *)) {
  tr_put_head(m, sid, key, HR_ELEM_FLOAT32, 4, 16);
  if (tweak)
    tweak(m);
}

/* ------------------------------------------------------------------------ */
/* Errors our server sends                                                   */
/* ------------------------------------------------------------------------ */

static void test_unsupported_version(void **state) {
  fx *f = *state;
  int fd, k;

  for (k = 0; k < 2; k++) {
    hr_msg m;
    fd = tl_raw_connect(f->srv.port);
    tl_hello(&m, 0);
    if (k == 0)
      m.u.hello.magic = 0x12345678;
    else
      m.u.hello.version_major = 2;
    assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
    expect_error(f, fd, 0, HR_WIRE_UNSUPPORTED_VERSION);
    assert_true(tl_raw_wait_eof(f->env, fd, TL_WAIT_MS));
    close(fd);
  }
}

static void test_message_too_large(void **state) {
  fx *f = *state;
  uint8_t h[HR_HEADER_SIZE];
  int fd = tl_raw_connect(f->srv.port);

  /* Before the HELLOs the limit is 65,536 bytes of payload. */
  hr_wire_put_header(h, HR_MSG_CLIENT_HELLO, 0, 65537);
  assert_int_equal(tl_raw_send(f->env, fd, h, sizeof h), 0);
  expect_error(f, fd, 0, HR_WIRE_MESSAGE_TOO_LARGE);
  assert_true(tl_raw_wait_eof(f->env, fd, TL_WAIT_MS));
  close(fd);
  /* After them, the server's max_message_size (16 MiB). */
  fd = raw_client(f);
  hr_wire_put_header(h, HR_MSG_TENSOR_REQUEST, 1, (16u << 20) + 1);
  assert_int_equal(tl_raw_send(f->env, fd, h, sizeof h), 0);
  expect_error(f, fd, 0, HR_WIRE_MESSAGE_TOO_LARGE);
  assert_true(tl_raw_wait_eof(f->env, fd, TL_WAIT_MS));
  close(fd);
}

static void test_protocol_violation(void **state) {
  fx *f = *state;
  int fd = tl_raw_connect(f->srv.port);
  hr_msg m;

  /* A request before the HELLO. */
  send_request(f, fd, 1, "m", 0, HR_DEV_CPU);
  expect_error(f, fd, 0, HR_WIRE_PROTOCOL_VIOLATION);
  assert_true(tl_raw_wait_eof(f->env, fd, TL_WAIT_MS));
  close(fd);
  /* A second CLIENT_HELLO. */
  fd = raw_client(f);
  tl_hello(&m, 0);
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  expect_error(f, fd, 0, HR_WIRE_PROTOCOL_VIOLATION);
  close(fd);
  /* A stream id that does not increase. */
  fd = raw_client(f);
  send_request(f, fd, 5, "m", 0, HR_DEV_CPU);
  assert_true(tl_raw_expect(f->env, fd, HR_MSG_TENSOR_DATA_END, 5, f->buf,
                            BUFSZ, &m, TL_WAIT_MS));
  send_request(f, fd, 3, "m", 0, HR_DEV_CPU);
  expect_error(f, fd, 0, HR_WIRE_PROTOCOL_VIOLATION);
  assert_true(tl_raw_wait_eof(f->env, fd, TL_WAIT_MS));
  close(fd);
}

static void test_unknown_type_and_malformed(void **state) {
  fx *f = *state;
  int fd = raw_client(f);
  uint8_t msg[64];
  int64_t n;
  hr_msg m;

  /* Reserved type on a stream: answered on that stream, the connection
   * goes on. */
  hr_wire_put_header(msg, 0x13, 1, 0);
  assert_int_equal(tl_raw_send(f->env, fd, msg, HR_HEADER_SIZE), 0);
  expect_error(f, fd, 1, HR_WIRE_UNKNOWN_MESSAGE_TYPE);
  expect_alive(f, fd);
  /* A request with a byte left over. */
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_REQUEST;
  m.hdr.stream_id = 3;
  m.u.request.key = (const uint8_t *)"m";
  m.u.request.key_len = 1;
  m.u.request.max_shards = 1;
  n = hr_wire_encode(&m, msg, sizeof msg - 1);
  assert_true(n > 0);
  msg[n] = 0;
  hr_wire_put_header(msg, HR_MSG_TENSOR_REQUEST, 3,
                     (uint32_t)(n + 1 - HR_HEADER_SIZE));
  assert_int_equal(tl_raw_send(f->env, fd, msg, (size_t)n + 1), 0);
  expect_error(f, fd, UINT32_MAX, HR_WIRE_MALFORMED_PAYLOAD);
  close(fd);
}

static void test_stream_errors(void **state) {
  fx *f = *state;
  int fd = raw_client(f);
  hr_msg m;

  send_request(f, fd, 1, "no-such-key", 0, HR_DEV_CPU);
  expect_error(f, fd, 1, HR_WIRE_NOT_FOUND);
  send_request(f, fd, 3, "m", 0, HR_DEV_CUDA);
  expect_error(f, fd, 3, HR_WIRE_DEVICE_UNAVAILABLE);
  /* A region outside the tensor. */
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_REQUEST;
  m.hdr.stream_id = 5;
  m.u.request.key = (const uint8_t *)"m";
  m.u.request.key_len = 1;
  m.u.request.flags = HR_REQ_REGION;
  m.u.request.max_shards = 1;
  m.u.request.region_rank = 2;
  m.u.request.region_offset[0] = 3;
  m.u.request.region_shape[0] = 2;
  m.u.request.region_shape[1] = 8;
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  expect_error(f, fd, 5, HR_WIRE_INVALID_REGION);
  expect_alive(f, fd);
  close(fd);
}

static void test_transcode_failed(void **state) {
  fx *f = *state;
  static const uint32_t rows[2] = {1, 1}, cols[2] = {2, 2};
  static const float vals[2] = {1, 2};
  hr_tensor *t = tl_sparse(HR_LAYOUT_SPARSE_COO, 3, 3, 2, rows, cols, vals, 0);
  int fd;
  hr_msg m;

  /* A repeated coordinate cannot be densified (a transport does no
   * arithmetic). */
  tl_put(&f->srv, "dup", t);
  hr_tensor_unref(t);
  fd = raw_client(f);
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_REQUEST;
  m.hdr.stream_id = 1;
  m.u.request.key = (const uint8_t *)"dup";
  m.u.request.key_len = 3;
  m.u.request.flags = HR_REQ_ALLOW_TRANSCODE;
  m.u.request.layout_count = 1;
  m.u.request.layouts[0].tag = HR_LAYOUT_ROW_MAJOR;
  m.u.request.max_shards = 1;
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  expect_error(f, fd, 1, HR_WIRE_TRANSCODE_FAILED);
  expect_alive(f, fd);
  close(fd);
}

static void spoil_size(hr_msg *m) {
  m->u.put.desc.buffers[0].size_bytes = 15;
}
static void spoil_sync(hr_msg *m) {
  m->u.put.desc.buffers[0].sync_mode = 1;
}
static void make_shard(hr_msg *m) {
  hr_descriptor *d = &m->u.put.desc;
  d->flags = HR_DESC_HAS_SHARD;
  d->parent_shape[0] = 8;
  d->shard_offset[0] = 4;
}
static void make_huge(hr_msg *m) {
  m->u.put.desc.shape[0] = 1u << 20;
  m->u.put.desc.buffers[0].size_bytes = 4u << 20;
  m->u.put.xport.total_data_bytes = 4u << 20;
}

static void test_put_errors(void **state) {
  fx *f = *state;
  int fd = raw_client(f);
  hr_msg m;

  put_msg(&m, 1, "p1", spoil_size);
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  expect_error(f, fd, UINT32_MAX, HR_WIRE_INVALID_DESCRIPTOR);
  close(fd);

  fd = raw_client(f);
  put_msg(&m, 1, "p2", spoil_sync);
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  expect_error(f, fd, UINT32_MAX, HR_WIRE_INVALID_SYNC_MODE);
  close(fd);

  fd = raw_client(f);
  put_msg(&m, 1, "p3", make_shard);
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  expect_error(f, fd, 1, HR_WIRE_PUT_REJECTED);
  put_msg(&m, 3, "m", NULL);
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  expect_error(f, fd, 3, HR_WIRE_ALREADY_EXISTS);
  /* Over the engine's in-flight PUT bytes (1 MiB here). */
  put_msg(&m, 5, "p5", make_huge);
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  expect_error(f, fd, 5, HR_WIRE_RESOURCE_EXHAUSTED);
  expect_alive(f, fd);
  close(fd);
  assert_int_equal(hr_store_count(f->srv.store), 2);
}

static void test_composite_invalid(void **state) {
  fx *f = *state;
  int fd = raw_client(f);
  hr_msg m;
  hr_descriptor *d;

  /* CONCAT along axis 0 of [6]: members of 2 and 2 do not sum to 6. */
  put_msg(&m, 1, "cc", NULL);
  d = &m.u.put.desc;
  d->layout.tag = HR_LAYOUT_COMPOSITE;
  d->buffer_count = 0;
  d->shape[0] = 6;
  d->params.member_count = 2;
  d->params.rule = HR_COMPOSITE_CONCAT;
  d->params.axis = 0;
  m.u.put.xport.total_data_bytes = 0;
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DATA_END;
  m.hdr.stream_id = 1;
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  for (int k = 0; k < 2; k++) {
    float v[2] = {1, 2};
    memset(&m, 0, sizeof m);
    m.hdr.type = HR_MSG_TENSOR_DESCRIPTOR;
    m.hdr.stream_id = 1;
    d = &m.u.tensor.desc;
    d->descriptor_version = 1;
    d->element_type = HR_ELEM_FLOAT32;
    d->rank = 1;
    d->shape[0] = 2;
    d->layout.tag = HR_LAYOUT_ROW_MAJOR;
    d->buffer_count = 1;
    d->buffers[0].size_bytes = 8;
    m.u.tensor.xport.total_data_bytes = 8;
    m.u.tensor.xport.total_shards = 1;
    assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
    memset(&m, 0, sizeof m);
    m.hdr.type = HR_MSG_TENSOR_DATA;
    m.hdr.stream_id = 1;
    m.u.data.data = (const uint8_t *)v;
    m.u.data.data_len = 8;
    assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
    memset(&m, 0, sizeof m);
    m.hdr.type = HR_MSG_TENSOR_DATA_END;
    m.hdr.stream_id = 1;
    assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  }
  expect_error(f, fd, UINT32_MAX, HR_WIRE_COMPOSITE_INVALID);
  close(fd);
  assert_int_equal(hr_store_count(f->srv.store), 2);
}

static void test_cancelled(void **state) {
  fx *f = *state;
  int fd = raw_client(f);
  hr_msg m;

  /* The raw client does not read: the 64 MiB answer cannot finish
   * before the CANCEL is processed. */
  send_request(f, fd, 1, "big", 0, HR_DEV_CPU);
  tl_spin(f->env, 20);
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_CANCEL;
  m.hdr.stream_id = 1;
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
  expect_error(f, fd, 1, HR_WIRE_CANCELLED);
  expect_alive(f, fd);
  close(fd);
}

static void test_timeout(void **state) {
  fx *f = *state;
  int fd = tl_raw_connect(f->srv.port);

  /* No HELLO within the handshake timeout (300 ms here). */
  expect_error(f, fd, 0, HR_WIRE_TIMEOUT);
  assert_true(tl_raw_wait_eof(f->env, fd, TL_WAIT_MS));
  close(fd);
}

/* A clock that each read of the server's connection moves on by a
 * minute: the reads of one batch take "long", as thousands of small
 * messages per read do on a loaded machine. */
typedef struct slow_clock {
  hr_tstamp offset;
  size_t rx;
} slow_clock;

static slow_clock *the_clock; /* for the provider's on_hello */

static hr_tstamp slow_now(void *ud) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (hr_tstamp)ts.tv_sec * 1000000000ull + (hr_tstamp)ts.tv_nsec +
         ((slow_clock *)ud)->offset;
}

static void slow_tap(const void *b, size_t n, void *ud) {
  slow_clock *k = ud;
  (void)b;
  k->rx += n;
  k->offset += 60ull * 1000000000u;
}

static int tap_hello(hr_session *s, const hr_hello *peer, uint32_t *wire_error,
                     void *ud) {
  (void)peer;
  (void)wire_error;
  (void)ud;
  hr_conn_set_tap(hr_session_user_data(s), slow_tap, NULL, the_clock);
  return 0;
}

static int rx_reached(void *ud) {
  void **p = ud;
  return ((slow_clock *)p[0])->rx >= *(size_t *)p[1];
}

/* Regression: the read timeout counted from the time a batch of reads
 * began, so a peer that kept sending was cut as stalled inside a message
 * when processing the batch took longer than the timeout (test_attack's
 * PING flood under load).  Each read now has its own time: with reads a
 * minute apart and a 200 s timeout, a message cut at the end of a
 * 256 KiB batch (five reads) is not yet overdue: it began at most two
 * reads before the batch ended. */
static void test_read_timeout_per_read(void **state) {
  fx *f = *state;
  slow_clock k = {0, 0};
  hr_engine_config ec;
  hr_provider p;
  hr_listener *l;
  hr_engine *se;
  uint8_t one[64], *batch;
  size_t len, total, n = 0, sent = 0;
  int64_t m_len;
  hr_msg m;
  int fd, big = 4 << 20;
  void *w[2];

  hr_engine_config_default(&ec);
  ec.session.read_timeout = 200ull * 1000000000u;
  ec.session.idle_timeout = 0;
  ec.socket_buffer = 1 << 20;
  the_clock = &k;
  se = tl_engine_clock(f->env, &ec, slow_now, &k);
  hr_store_provider(f->srv.store, &p);
  p.on_hello = tap_hello;
  assert_int_equal(hr_engine_listen(se, "127.0.0.1:0", &p, &l), 0);
  fd = tr_client(f->env, hr_listener_port(l), NULL, f->buf, BUFSZ);
  assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big), 0);
  /* 256 KiB of PONGs (ignored: no answer to read) and the first bytes of
   * a PING, all in the server's socket before its loop runs again. */
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_PONG;
  m_len = hr_wire_encode(&m, one, sizeof one);
  assert_true(m_len > 0);
  len = (size_t)m_len;
  total = (256u << 10) / len * len + 5;
  batch = malloc(total);
  assert_non_null(batch);
  while (n + len < total) {
    memcpy(batch + n, one, len);
    n += len;
  }
  m.hdr.type = HR_MSG_PING;
  m.u.ping = 77;
  m_len = hr_wire_encode(&m, one, sizeof one);
  assert_true(m_len > 5);
  memcpy(batch + n, one, 5);
  while (sent < total) {
    ssize_t r = send(fd, batch + sent, total - sent, MSG_DONTWAIT);
    assert_true(r > 0); /* the buffers take it all */
    sent += (size_t)r;
  }
  k.rx = 0;
  w[0] = &k;
  w[1] = &total;
  assert_true(tl_run(f->env, rx_reached, w, TL_WAIT_MS));
  /* Five reads (64 KiB each, then the PING's last byte), each a minute
   * later: more than the timeout since the batch began. */
  assert_true(k.offset >= 4 * 60ull * 1000000000u);
  /* The rest of the PING: the connection is alive and answers it. */
  assert_int_equal(tl_raw_send(f->env, fd, one + 5, (size_t)m_len - 5), 0);
  assert_true(
      tl_raw_expect(f->env, fd, HR_MSG_PONG, 0, f->buf, BUFSZ, &m, TL_WAIT_MS));
  assert_int_equal(m.u.ping, 77);
  close(fd);
  free(batch);
  tl_engine_finish(f->env, se);
}

/* A TCP connect that never completes ends with the session's handshake
 * timeout. */
static void test_connect_timeout(void **state) {
  fx *f = *state;
  hr_engine_config ec;
  hr_engine *e;
  tc_conn c;
  int lfd, port, fill[8], i, n = 0;
  char url[64];

  /* A listener that never accepts, its queue filled: further SYNs are
   * dropped and connects stay in progress. */
  lfd = tl_raw_listen(&port);
  listen(lfd, 0);
  for (i = 0; i < 8; i++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connect(fd, (struct sockaddr *)&sa, sizeof sa);
    fill[n++] = fd;
  }
  tl_spin(f->env, 50);
  hr_engine_config_default(&ec);
  ec.session.handshake_timeout = 300u * 1000000u;
  e = tl_engine(f->env, &ec);
  snprintf(url, sizeof url, "127.0.0.1:%d", port);
  tc_connect(f->env, e, url, &c, NULL);
  assert_false(tc_wait_up(&c, TL_WAIT_MS));
  assert_true(c.closed);
  assert_int_equal(c.status, HR_ERR_TIMEOUT);
  assert_int_equal(hr_engine_del(e), 0);
  for (i = 0; i < n; i++)
    close(fill[i]);
  close(lfd);
}

static void test_resource_exhausted_connection(void **state) {
  fx *f = *state;
  hr_engine_config ec;
  tl_server s2;
  int a, b;

  hr_engine_config_default(&ec);
  ec.max_connections = 1;
  tl_server_start(f->env, &s2, &ec, NULL);
  a = tl_raw_connect(s2.port);
  tl_spin(f->env, 20);
  b = tl_raw_connect(s2.port);
  expect_error(f, b, 0, HR_WIRE_RESOURCE_EXHAUSTED);
  assert_true(tl_raw_wait_eof(f->env, b, TL_WAIT_MS));
  close(b);
  close(a);
  tl_spin(f->env, 20);
  tl_server_stop(f->env, &s2);
}

static int deny_hello(hr_session *s, const hr_hello *peer, uint32_t *wire_error,
                      void *ud) {
  (void)s;
  (void)ud;
  if (!peer->exts.auth_token || peer->exts.auth_token_len != 6 ||
      memcmp(peer->exts.auth_token, "secret", 6) != 0)
    *wire_error = HR_WIRE_UNAUTHORIZED;
  return 0;
}

static int fail_internal(hr_session *s, hr_srv_get *g, void *ud) {
  (void)s;
  (void)ud;
  hr_get_fail(g, HR_WIRE_INTERNAL, "the provider broke");
  return 0;
}

static void test_unauthorized_and_internal(void **state) {
  fx *f = *state;
  hr_engine *e = tl_engine(f->env, NULL);
  hr_engine *ce = tl_engine(f->env, NULL);
  hr_provider p;
  hr_listener *l;
  hr_settings s;
  char url[64];
  tc_conn c;
  tc_res r;

  memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.on_get = fail_internal;
  p.on_hello = deny_hello;
  assert_int_equal(hr_engine_listen(e, "127.0.0.1:0", &p, &l), 0);
  snprintf(url, sizeof url, "127.0.0.1:%d", hr_listener_port(l));
  tc_connect(f->env, ce, url, &c, NULL);
  assert_false(tc_wait_up(&c, TL_WAIT_MS));
  assert_int_equal(c.status, HR_ERR_REMOTE);
  assert_int_equal(c.wire_error, HR_WIRE_UNAUTHORIZED);
  hr_settings_default(&s);
  s.auth_token = (const uint8_t *)"secret";
  s.auth_token_len = 6;
  tc_connect(f->env, ce, url, &c, &s);
  assert_true(tc_wait_up(&c, TL_WAIT_MS));
  assert_int_equal(tc_get_key(&c, "anything", &r), HR_ERR_REMOTE);
  assert_int_equal(r.rec.wire_error, HR_WIRE_INTERNAL);
  assert_int_equal(r.rec.wire_error_sent, 0);
  assert_string_equal(r.rec.message, "the provider broke");
  tc_close(&c);
  tl_engine_finish(f->env, ce);
  tl_engine_finish(f->env, e);
}

/* ------------------------------------------------------------------------ */
/* Errors our client sends or must handle (raw server)                       */
/* ------------------------------------------------------------------------ */

typedef struct rawsrv {
  int lfd, port, fd;
  hr_engine *ce;
  tc_conn c;
} rawsrv;

/* Accepts the client's connection and answers its HELLO with `hello`
 * (NULL: a default SERVER_HELLO). */
static void raw_server_open(fx *f, rawsrv *rs, const hr_msg *hello) {
  hr_msg m;
  struct pollfd p;
  char url[64];

  rs->lfd = tl_raw_listen(&rs->port);
  assert_true(rs->lfd >= 0);
  rs->ce = tl_engine(f->env, NULL);
  snprintf(url, sizeof url, "hurray://127.0.0.1:%d", rs->port);
  tc_connect(f->env, rs->ce, url, &rs->c, NULL);
  p.fd = rs->lfd;
  p.events = POLLIN;
  while (poll(&p, 1, 0) != 1)
    tl_spin(f->env, 1);
  rs->fd = accept(rs->lfd, NULL, NULL);
  assert_true(rs->fd >= 0);
  assert_true(tl_raw_expect(f->env, rs->fd, HR_MSG_CLIENT_HELLO, 0, f->buf,
                            BUFSZ, &m, TL_WAIT_MS));
  if (!hello) {
    tl_hello(&m, 1);
    hello = &m;
  }
  assert_int_equal(tl_raw_send_msg(f->env, rs->fd, hello), 0);
}

static void raw_server_close(fx *f, rawsrv *rs) {
  if (rs->fd >= 0)
    close(rs->fd);
  close(rs->lfd);
  if (!rs->c.closed)
    assert_true(tc_wait_closed(&rs->c, TL_WAIT_MS));
  assert_int_equal(hr_engine_del(rs->ce), 0);
  (void)f;
}

/* Starts a GET of "k" on the raw server's client; reads the request. */
static uint32_t raw_get(fx *f, rawsrv *rs, tc_res *r, uint32_t flags,
                        uint16_t max_shards) {
  hr_get_opts o;
  hr_msg m;

  tc_opts(&o, "k");
  o.flags = flags;
  o.max_shards = max_shards;
  assert_int_equal(tc_get_start(&rs->c, &o, r, NULL), 0);
  assert_true(tl_raw_expect(f->env, rs->fd, HR_MSG_TENSOR_REQUEST, UINT32_MAX,
                            f->buf, BUFSZ, &m, TL_WAIT_MS));
  return m.hdr.stream_id;
}

static void descriptor_msg(hr_msg *m, uint32_t sid, uint64_t n) {
  hr_descriptor *d = &m->u.tensor.desc;

  memset(m, 0, sizeof *m);
  m->hdr.type = HR_MSG_TENSOR_DESCRIPTOR;
  m->hdr.stream_id = sid;
  d->descriptor_version = 1;
  d->element_type = HR_ELEM_UINT8;
  d->rank = 1;
  d->shape[0] = n;
  d->layout.tag = HR_LAYOUT_ROW_MAJOR;
  d->buffer_count = 1;
  d->buffers[0].size_bytes = n;
  m->u.tensor.xport.total_data_bytes = n;
  m->u.tensor.xport.total_shards = 1;
}

static void send_data(fx *f, int fd, uint32_t sid, uint64_t off, uint32_t n) {
  static uint8_t zeros[4096];
  hr_msg m;

  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DATA;
  m.hdr.stream_id = sid;
  m.u.data.offset = off;
  m.u.data.data = zeros;
  m.u.data.data_len = n;
  assert_int_equal(tl_raw_send_msg(f->env, fd, &m), 0);
}

static void test_client_rejects_minor_version(void **state) {
  fx *f = *state;
  rawsrv rs;
  hr_msg m;

  tl_hello(&m, 1);
  m.u.hello.version_minor = 1;
  raw_server_open(f, &rs, &m);
  assert_false(tc_wait_up(&rs.c, TL_WAIT_MS));
  assert_int_equal(rs.c.wire_error, HR_WIRE_UNSUPPORTED_VERSION);
  assert_int_equal(rs.c.wire_sent, 1);
  expect_error(f, rs.fd, 0, HR_WIRE_UNSUPPORTED_VERSION);
  raw_server_close(f, &rs);
}

static void test_client_sync_mode_and_gap(void **state) {
  fx *f = *state;
  rawsrv rs;
  tc_res r;
  uint32_t sid;
  hr_msg m;

  raw_server_open(f, &rs, NULL);
  assert_true(tc_wait_up(&rs.c, TL_WAIT_MS));
  /* sync_mode 1 on a network transport. */
  sid = raw_get(f, &rs, &r, 0, 1);
  descriptor_msg(&m, sid, 16);
  m.u.tensor.desc.buffers[0].sync_mode = HR_SYNC_EVENT;
  assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
  assert_true(tc_wait(&rs.c, &r, TL_WAIT_MS));
  assert_int_not_equal(r.status, 0);
  assert_int_equal(r.rec.wire_error, HR_WIRE_INVALID_SYNC_MODE);
  assert_int_equal(r.rec.wire_error_sent, 1);
  expect_error(f, rs.fd, UINT32_MAX, HR_WIRE_INVALID_SYNC_MODE);
  /* A gap between frames. */
  if (!rs.c.closed) {
    sid = raw_get(f, &rs, &r, 0, 1);
    descriptor_msg(&m, sid, 16);
    assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
    send_data(f, rs.fd, sid, 0, 4);
    send_data(f, rs.fd, sid, 8, 8);
    assert_true(tc_wait(&rs.c, &r, TL_WAIT_MS));
    assert_int_equal(r.rec.wire_error, HR_WIRE_PROTOCOL_VIOLATION);
    expect_error(f, rs.fd, UINT32_MAX, HR_WIRE_PROTOCOL_VIOLATION);
  }
  raw_server_close(f, &rs);
}

static void test_client_shard_inconsistent(void **state) {
  fx *f = *state;
  rawsrv rs;
  tc_res r;
  uint32_t sid;
  int i;
  hr_msg m;

  raw_server_open(f, &rs, NULL);
  assert_true(tc_wait_up(&rs.c, TL_WAIT_MS));
  sid = raw_get(f, &rs, &r, HR_REQ_PARALLEL_OK, 2);
  /* Two shards of [8] that overlap: [0,5) and [4,8). */
  for (i = 0; i < 2; i++) {
    hr_descriptor *d;
    descriptor_msg(&m, sid + (uint32_t)i, i == 0 ? 5 : 4);
    d = &m.u.tensor.desc;
    d->flags = HR_DESC_HAS_SHARD;
    d->parent_shape[0] = 8;
    d->shard_offset[0] = i == 0 ? 0 : 4;
    m.u.tensor.xport.shard_index = (uint16_t)i;
    m.u.tensor.xport.total_shards = 2;
    assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
  }
  assert_true(tc_wait(&rs.c, &r, TL_WAIT_MS));
  assert_int_equal(r.rec.wire_error, HR_WIRE_SHARD_INCONSISTENT);
  assert_int_equal(r.rec.wire_error_sent, 1);
  raw_server_close(f, &rs);
}

static void test_client_torn_composite(void **state) {
  fx *f = *state;
  rawsrv rs;
  tc_res r;
  uint32_t sid;
  hr_msg m;
  hr_descriptor *d;

  raw_server_open(f, &rs, NULL);
  assert_true(tc_wait_up(&rs.c, TL_WAIT_MS));
  sid = raw_get(f, &rs, &r, 0, 1);
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DESCRIPTOR;
  m.hdr.stream_id = sid;
  d = &m.u.tensor.desc;
  d->descriptor_version = 1;
  d->layout.tag = HR_LAYOUT_COMPOSITE;
  d->params.member_count = 2;
  d->params.rule = HR_COMPOSITE_TUPLE;
  m.u.tensor.xport.total_shards = 1;
  assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DATA_END;
  m.hdr.stream_id = sid;
  assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
  descriptor_msg(&m, sid, 4);
  assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
  send_data(f, rs.fd, sid, 0, 4);
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DATA_END;
  m.hdr.stream_id = sid;
  assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
  /* The stream ends with one member of two: an ERROR on the stream. */
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_ERROR;
  m.hdr.stream_id = sid;
  m.u.error.code = HR_WIRE_INTERNAL;
  assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
  assert_true(tc_wait(&rs.c, &r, TL_WAIT_MS));
  assert_int_not_equal(r.status, 0);
  assert_null(r.t);
  raw_server_close(f, &rs);
}

static void test_client_handles_every_error_code(void **state) {
  fx *f = *state;
  rawsrv rs;
  uint32_t code;

  raw_server_open(f, &rs, NULL);
  assert_true(tc_wait_up(&rs.c, TL_WAIT_MS));
  /* Every code the server may answer a request with, and an unassigned
   * one (read as INTERNAL). */
  for (code = HR_WIRE_PROTOCOL_VIOLATION; code <= HR_WIRE_ERROR_LAST + 1;
       code++) {
    tc_res r;
    uint32_t sid = raw_get(f, &rs, &r, 0, 1);
    hr_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = HR_MSG_ERROR;
    m.hdr.stream_id = sid;
    m.u.error.code = code == HR_WIRE_ERROR_LAST + 1 ? 0x999 : code;
    m.u.error.message = (const uint8_t *)"why";
    m.u.error.message_len = 3;
    assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
    assert_true(tc_wait(&rs.c, &r, TL_WAIT_MS));
    assert_int_equal(r.status, HR_ERR_REMOTE);
    assert_null(r.t);
    assert_int_equal(r.rec.wire_error_sent, 0);
    assert_string_equal(
        hr_wire_error_name(r.rec.wire_error),
        code == HR_WIRE_ERROR_LAST + 1 ? "INTERNAL" : hr_wire_error_name(code));
    assert_false(rs.c.closed);
  }
  raw_server_close(f, &rs);
}

static void test_client_goaway_and_conn_error(void **state) {
  fx *f = *state;
  rawsrv rs;
  tc_res r, r2;
  hr_get_opts o;
  uint32_t sid;
  hr_msg m;

  raw_server_open(f, &rs, NULL);
  assert_true(tc_wait_up(&rs.c, TL_WAIT_MS));
  /* A GOAWAY while a request is open: that stream may finish, no new
   * stream may start. */
  sid = raw_get(f, &rs, &r, 0, 1);
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_GOAWAY;
  m.u.goaway.last_stream_id = sid;
  m.u.goaway.code = HR_WIRE_NO_ERROR;
  assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
  tl_spin(f->env, 50);
  assert_false(rs.c.closed);
  tc_opts(&o, "k");
  assert_int_equal(tc_get_start(&rs.c, &o, &r2, NULL), HR_ERR_STATE);
  /* ERROR on stream 0 ends the connection; the open stream fails and the
   * client reports the connection's error. */
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_ERROR;
  m.u.error.code = HR_WIRE_RDMA_SETUP_FAILED;
  assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
  assert_true(tc_wait_closed(&rs.c, TL_WAIT_MS));
  assert_true(r.done);
  assert_int_not_equal(r.status, 0);
  assert_int_equal(rs.c.status, HR_ERR_REMOTE);
  assert_int_equal(rs.c.wire_error, HR_WIRE_RDMA_SETUP_FAILED);
  raw_server_close(f, &rs);
  /* GOAWAY with nothing open: the client closes cleanly. */
  raw_server_open(f, &rs, NULL);
  assert_true(tc_wait_up(&rs.c, TL_WAIT_MS));
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_GOAWAY;
  m.u.goaway.code = HR_WIRE_NO_ERROR;
  m.u.goaway.message = (const uint8_t *)"bye";
  m.u.goaway.message_len = 3;
  assert_int_equal(tl_raw_send_msg(f->env, rs.fd, &m), 0);
  assert_true(tc_wait_closed(&rs.c, TL_WAIT_MS));
  assert_int_equal(rs.c.status, HR_ERR_CLOSED);
  raw_server_close(f, &rs);
}

static void test_client_too_large_and_unknown(void **state) {
  fx *f = *state;
  rawsrv rs;
  uint8_t h[HR_HEADER_SIZE];

  raw_server_open(f, &rs, NULL);
  assert_true(tc_wait_up(&rs.c, TL_WAIT_MS));
  hr_wire_put_header(h, HR_MSG_PONG, 0, (16u << 20) + 1);
  assert_int_equal(tl_raw_send(f->env, rs.fd, h, sizeof h), 0);
  assert_true(tc_wait_closed(&rs.c, TL_WAIT_MS));
  assert_int_equal(rs.c.wire_error, HR_WIRE_MESSAGE_TOO_LARGE);
  assert_int_equal(rs.c.wire_sent, 1);
  expect_error(f, rs.fd, 0, HR_WIRE_MESSAGE_TOO_LARGE);
  raw_server_close(f, &rs);

  raw_server_open(f, &rs, NULL);
  assert_true(tc_wait_up(&rs.c, TL_WAIT_MS));
  hr_wire_put_header(h, 0xEE, 0, 0);
  assert_int_equal(tl_raw_send(f->env, rs.fd, h, sizeof h), 0);
  expect_error(f, rs.fd, 0, HR_WIRE_UNKNOWN_MESSAGE_TYPE);
  raw_server_close(f, &rs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_unsupported_version, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_message_too_large, setup, teardown),
      cmocka_unit_test_setup_teardown(test_protocol_violation, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unknown_type_and_malformed, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_stream_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_put_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_composite_invalid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cancelled, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transcode_failed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
      cmocka_unit_test_setup_teardown(test_read_timeout_per_read, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_connect_timeout, setup, teardown),
      cmocka_unit_test_setup_teardown(test_resource_exhausted_connection, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_unauthorized_and_internal, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_client_rejects_minor_version, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_client_sync_mode_and_gap, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_client_shard_inconsistent, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_client_torn_composite, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_client_handles_every_error_code,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_client_goaway_and_conn_error, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_client_too_large_and_unknown, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
