/*
 * Asynchronous I/O in the sans-IO session (hr_session_io_hold and the
 * io_fence callback): the argument checks; a held receive target is
 * fenced before the GET's completion runs (the application may free the
 * destination there); a held pull is fenced when a connection error drops
 * the output, what the fence says was written is consumed, and the rest
 * of the partly written frame still goes out, byte for byte.
 */
#include "engine_core/harness.h"

typedef struct fence_log {
  int tx, rx;          /* fence calls per direction */
  int rx_before_done;  /* the RX fence came before the completion */
  size_t tx_written;   /* what the TX fence reports */
  result *get;         /* the GET whose completion is watched */
} fence_log;

/* The pair's user data is the pair; the log hangs off a static. */
static fence_log *g_log;

static size_t log_fence(hr_session *s, int dir, void *ud) {
  (void)s;
  (void)ud;
  if (dir == HR_IO_TX) {
    g_log->tx++;
    return g_log->tx_written;
  }
  g_log->rx++;
  if (g_log->get && g_log->get->calls == 0)
    g_log->rx_before_done = 1;
  return 0;
}

static void open_pair(pair *p) {
  hr_session_callbacks cb = pair_callbacks(p);
  hr_provider prov = store_provider(&p->st);
  cb.io_fence = log_fence;
  p->seed = 7;
  p->iov_max = 64;
  assert_int_equal(
      hr_session_new(&p->c, HR_ROLE_CLIENT, NULL, &cb, NULL, p, p->now, NULL),
      0);
  assert_int_equal(
      hr_session_new(&p->s, HR_ROLE_SERVER, NULL, &cb, &prov, p, p->now, NULL),
      0);
  assert_int_equal(run(p), 0);
}

static void get_start(pair *p, const char *key, result *r) {
  hr_get_opts o;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)key;
  o.key_len = (uint16_t)strlen(key);
  assert_int_equal(hr_session_get(p->c, &o, on_get_done, r, NULL), 0);
}

static void arguments(void **state) {
  (void)state;
  pair p;
  memset(&p, 0, sizeof p);
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  /* Without io_fence no hold is possible. */
  assert_int_equal(hr_session_io_hold(p.c, HR_IO_TX), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_session_io_hold(NULL, HR_IO_TX),
                   HR_ERR_INVALID_ARGUMENT);
  pair_close(&p);

  fence_log log;
  memset(&log, 0, sizeof log);
  g_log = &log;
  memset(&p, 0, sizeof p);
  open_pair(&p);
  assert_int_equal(hr_session_io_hold(p.c, 3), HR_ERR_INVALID_ARGUMENT);
  /* Nothing pulled, nothing targeted. */
  assert_int_equal(hr_session_io_hold(p.c, HR_IO_TX), HR_ERR_STATE);
  assert_int_equal(hr_session_io_hold(p.c, HR_IO_RX), HR_ERR_STATE);
  /* A PING queued: the pull can be held once, and nothing more is pulled
   * until it is reported. */
  result pr;
  memset(&pr, 0, sizeof pr);
  assert_int_equal(hr_session_ping(p.c, on_ping_done, &pr), 0);
  hr_iov iov[8];
  assert_true(hr_session_pull(p.c, iov, 8, p.now) > 0);
  assert_int_equal(hr_session_io_hold(p.c, HR_IO_TX), 0);
  assert_int_equal(hr_session_io_hold(p.c, HR_IO_TX), HR_ERR_STATE);
  assert_int_equal(hr_session_pull(p.c, iov, 8, p.now), 0);
  hr_session_consumed(p.c, 0, p.now);
  assert_true(hr_session_pull(p.c, iov, 8, p.now) > 0);
  assert_int_equal(log.tx + log.rx, 0);
  /* hr_session_del() makes no fence call. */
  assert_int_equal(hr_session_io_hold(p.c, HR_IO_TX), 0);
  pair_close(&p);
  assert_int_equal(log.tx + log.rx, 0);
  g_log = NULL;
}

/* Feeds the client what the server sends until the client names a
 * receive target of a TENSOR_DATA payload. */
static void until_target(pair *p, void **dst, size_t *len) {
  for (int i = 0; i < 10000; i++) {
    if (hr_session_recv_target(p->c, dst, len))
      return;
    hr_iov iov[1];
    int n = hr_session_pull(p->s, iov, 1, p->now);
    assert_true(n > 0);
    /* One byte at a time near the boundary: the client stops at the
     * payload's first byte. */
    size_t k = iov[0].len;
    if (k > 64)
      k = 64;
    int64_t rv = hr_session_recv(p->c, iov[0].base, k, p->now);
    assert_true(rv >= 0);
    hr_session_consumed(p->s, k, p->now);
  }
  fail_msg("no receive target");
}

static void rx_fence_before_completion(void **state) {
  (void)state;
  fence_log log;
  result r;
  pair p;
  memset(&log, 0, sizeof log);
  memset(&r, 0, sizeof r);
  memset(&p, 0, sizeof p);
  g_log = &log;
  log.get = &r;
  open_pair(&p);
  hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){256, 1024}, 3);
  store_put(&p.st, "t", t);
  get_start(&p, "t", &r);
  assert_true(pump(&p, p.c, p.s) > 0);
  void *dst;
  size_t len;
  until_target(&p, &dst, &len);
  assert_true(len > 0);
  assert_int_equal(hr_session_io_hold(p.c, HR_IO_RX), 0);
  assert_int_equal(hr_session_io_hold(p.c, HR_IO_RX), HR_ERR_STATE);
  /* The connection goes while the read is out: the fence comes first. */
  hr_session_terminate(p.c, p.now);
  assert_int_equal(r.calls, 1);
  assert_int_equal(log.rx, 1);
  assert_true(log.rx_before_done);
  assert_int_not_equal(r.status, 0);
  /* The host still reports what its read got; the session skips it. */
  hr_session_recv_placed(p.c, len / 2, p.now);
  result_clear(&r);
  pair_close(&p);
  hr_tensor_unref(t);
  g_log = NULL;
}

static void tx_fence_keeps_framing(void **state) {
  (void)state;
  fence_log log;
  result r;
  pair p;
  memset(&log, 0, sizeof log);
  memset(&r, 0, sizeof r);
  memset(&p, 0, sizeof p);
  g_log = &log;
  open_pair(&p);
  hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){300000}, 4);
  store_put(&p.st, "t", t);
  get_start(&p, "t", &r);
  assert_true(pump(&p, p.c, p.s) > 0);
  /* The server's answer: descriptor, then a frame of the tensor. */
  hr_iov iov[64];
  int n = hr_session_pull(p.s, iov, 64, p.now);
  assert_true(n > 0);
  /* The frame's data: the iovec pointing into the tensor. */
  size_t before = 0;
  int k = 0;
  while (k < n && iov[k].base != hr_tensor_buffer(t, 0)) {
    before += iov[k].len;
    k++;
  }
  assert_true(k < n);
  assert_int_equal(iov[k].len, 300000);
  assert_int_equal(hr_session_io_hold(p.s, HR_IO_TX), 0);
  /* The client's ERROR arrives while the write is out, 5000 bytes short
   * of the frame's end: the server drops its output but the partly
   * written frame, and asks the fence how far the write got. */
  log.tx_written = before + 300000 - 5000;
  hr_msg m;
  uint8_t buf[256];
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_ERROR;
  m.u.error.code = HR_WIRE_INTERNAL;
  int64_t len = hr_wire_encode(&m, buf, sizeof buf);
  assert_true(len > 0);
  assert_true(hr_session_recv(p.s, buf, (size_t)len, p.now) >= 0);
  assert_int_equal(log.tx, 1);
  /* The rest of the frame, and nothing after it. */
  n = hr_session_pull(p.s, iov, 64, p.now);
  assert_int_equal(n, 1);
  assert_int_equal(iov[0].len, 5000);
  assert_ptr_equal(iov[0].base,
                   (const uint8_t *)hr_tensor_buffer(t, 0) + 300000 - 5000);
  hr_session_consumed(p.s, 5000, p.now);
  assert_int_equal(hr_session_pull(p.s, iov, 64, p.now), 0);
  result_clear(&r);
  pair_close(&p);
  hr_tensor_unref(t);
  g_log = NULL;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(arguments),
      cmocka_unit_test(rx_fence_before_completion),
      cmocka_unit_test(tx_fence_keeps_framing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
