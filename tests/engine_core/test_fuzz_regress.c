/* Regressions found by the whole-session fuzzers (fuzz/fuzz_server_session,
 * fuzz/fuzz_client_session): each case is the smallest conversation that
 * reproduced a finding, checked for the answer the protocol demands.  The
 * memory errors and undefined behaviour themselves are caught when this
 * runs under ASan/UBSan (scripts/test.sh, stage 2). */
#include "engine_core/harness.h"

/* Pulls and consumes everything; returns the first message's type and,
 * for an ERROR, its code and stream. */
static int first_msg(hr_session *s, uint8_t *type, uint32_t *sid,
                     uint32_t *code) {
  hr_iov iov[16];
  int n = hr_session_pull(s, iov, 16, 0);
  assert_true(n >= 0);
  uint8_t buf[4096];
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    assert_true(total + iov[i].len <= sizeof buf);
    memcpy(buf + total, iov[i].base, iov[i].len);
    total += iov[i].len;
  }
  hr_session_consumed(s, total, 0);
  if (total < HR_HEADER_SIZE)
    return 0;
  hr_msg_header h;
  hr_wire_parse_header(buf, &h);
  *type = h.type;
  *sid = h.stream_id;
  *code = 0;
  if (h.type == HR_MSG_ERROR) {
    hr_msg m;
    assert_int_equal(
        hr_wire_decode(buf, HR_HEADER_SIZE + h.payload_length, NULL, &m, NULL),
        0);
    *code = m.u.error.code;
  }
  return 1;
}

/* A HELLO whose header declares an empty payload: the session used to
 * memcpy() from the reader's NULL payload pointer while keeping the
 * peer's HELLO (UB).  It must answer ERROR on stream 0 and close. */
static void empty_hello(void **state) {
  (void)state;
  for (int server = 0; server <= 1; server++) {
    store st;
    memset(&st, 0, sizeof st);
    hr_provider prov = store_provider(&st);
    hr_session *s = NULL;
    assert_int_equal(hr_session_new(&s, server ? HR_ROLE_SERVER
                                               : HR_ROLE_CLIENT,
                                    NULL, NULL, server ? &prov : NULL, NULL,
                                    0, NULL),
                     0);
    uint8_t type;
    uint32_t sid, code;
    if (!server) /* the CLIENT_HELLO first */
      assert_int_equal(first_msg(s, &type, &sid, &code), 1);
    uint8_t hdr[HR_HEADER_SIZE];
    hr_wire_put_header(hdr, server ? HR_MSG_CLIENT_HELLO
                                   : HR_MSG_SERVER_HELLO, 0, 0);
    assert_int_equal(hr_session_recv(s, hdr, sizeof hdr, 0), sizeof hdr);
    assert_int_equal(first_msg(s, &type, &sid, &code), 1);
    assert_int_equal(type, HR_MSG_ERROR);
    assert_int_equal(sid, 0);
    assert_int_not_equal(code, HR_WIRE_NO_ERROR);
    assert_int_equal(hr_session_want_read(s), 0);
    hr_session_del(s);
    store_clear(&st);
  }
}

/* A GET of an 8 x 8 tensor asking for PANEL with mr = 2^32 - 1 (75 bytes
 * on the wire) used to be answered with the padded panel: 137 GB of
 * zeros streamed.  Padding beyond the tensor's own bytes (or 64 KiB) now
 * makes the preference unsatisfiable, so the next one (here: none, the
 * stored layout) is sent; an ordinary mr still transcodes. */
static void panel_padding(void **state) {
  (void)state;
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  assert_int_equal(run(&p), 0);
  const hr_hello *h = hr_session_peer_hello(p.c);
  if (!h || !(h->capability_flags & HR_CAP_TRANSCODING)) {
    pair_close(&p);
    skip();
  }
  hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){8, 8}, 3);
  store_put(&p.st, "w", t);
  static const uint32_t mrs[2] = {0xFFFFFFFFu, 4};
  for (int i = 0; i < 2; i++) {
    uint8_t ext[4] = {(uint8_t)mrs[i], (uint8_t)(mrs[i] >> 8),
                      (uint8_t)(mrs[i] >> 16), (uint8_t)(mrs[i] >> 24)};
    hr_layout_entry pref = {HR_LAYOUT_PANEL, 4, ext};
    hr_get_opts o = get_opts("w");
    o.flags = HR_REQ_ALLOW_TRANSCODE;
    o.layouts = &pref;
    o.layout_count = 1;
    result r = {0};
    assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r, NULL), 0);
    assert_int_equal(run(&p), 0);
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.status, 0);
    const hr_descriptor *d = hr_tensor_descriptor(r.t);
    if (i == 0) {
      assert_int_equal(d->layout.tag, HR_LAYOUT_ROW_MAJOR);
      assert_true(same_tensor(r.t, t));
    } else {
      assert_int_equal(d->layout.tag, HR_LAYOUT_PANEL);
      assert_int_equal(d->buffers[0].size_bytes, 8 * 8 * 4);
    }
    result_clear(&r);
  }
  hr_tensor_unref(t);
  pair_close(&p);
}

/* A PING partly written when a connection error struck: fail_all() freed
 * the PING record, but the partly written head of the output queue (kept
 * so that framing stays intact) still pointed at it, and the next pull
 * stamped freed memory.  The PING must complete once, with CLOSED, and
 * its remaining bytes still go out. */
static void ping_then_conn_error(void **state) {
  (void)state;
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  assert_int_equal(run(&p), 0);
  result r = {0};
  assert_int_equal(hr_session_ping(p.c, on_ping_done, &r), 0);
  hr_iov iov[8];
  int n = hr_session_pull(p.c, iov, 8, p.now);
  assert_true(n >= 1);
  hr_session_consumed(p.c, 1, p.now); /* one byte of the PING written */
  uint8_t bad[HR_HEADER_SIZE];
  hr_wire_put_header(bad, 0x13, 0, 0); /* unknown type: connection error */
  assert_int_equal(hr_session_recv(p.c, bad, sizeof bad, p.now),
                   (int64_t)sizeof bad);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, HR_ERR_CLOSED);
  size_t total = 0;
  while ((n = hr_session_pull(p.c, iov, 8, p.now)) > 0) {
    size_t k = 0;
    for (int i = 0; i < n; i++)
      k += iov[i].len;
    hr_session_consumed(p.c, k, p.now);
    total += k;
  }
  /* The rest of the PING (19 bytes) and the ERROR. */
  assert_true(total > HR_HEADER_SIZE + 8 - 1);
  assert_int_equal(r.calls, 1);
  pair_close(&p);
}

/* A PONG that arrives before our PING left (its opaque is guessable)
 * answers nothing we sent: it is ignored, and the PING completes with the
 * real PONG.  It used to complete the PING and free it while the queued
 * message still pointed at it. */
static void pong_before_ping(void **state) {
  (void)state;
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  assert_int_equal(run(&p), 0);
  result r = {0};
  assert_int_equal(hr_session_ping(p.c, on_ping_done, &r), 0);
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_PONG;
  m.u.ping = 1; /* the first PING's opaque */
  uint8_t buf[64];
  int64_t len = hr_wire_encode(&m, buf, sizeof buf);
  assert_true(len > 0);
  assert_int_equal(hr_session_recv(p.c, buf, (size_t)len, p.now), len);
  assert_int_equal(r.calls, 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, 0);
  pair_close(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(empty_hello),
      cmocka_unit_test(panel_padding),
      cmocka_unit_test(ping_then_conn_error),
      cmocka_unit_test(pong_before_ping),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
