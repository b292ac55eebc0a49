/* Session PUT, LIST, PING, CANCEL, GOAWAY, timeouts, fairness and
 * backpressure. */
#include "engine_core/harness.h"

#define SEC 1000000000ull

static void open_pair(pair *p, const hr_settings *cs, const hr_settings *ss) {
  assert_int_equal(pair_open(p, cs, ss), 0);
  assert_int_equal(run(p), 0);
  assert_int_equal(p->established, 2);
}

static void get_key(pair *p, const char *key, result *r) {
  hr_get_opts o = get_opts(key);
  assert_int_equal(hr_session_get(p->c, &o, on_get_done, r, NULL), 0);
  assert_int_equal(run(p), 0);
  assert_int_equal(r->calls, 1);
}

/* ---- PUT ----------------------------------------------------------------- */

static void put_then_get(void **state) {
  (void)state;
  hr_settings cs;
  hr_settings_default(&cs);
  cs.frame_data_size = 777;
  for (int mode = 0; mode < 4; mode++) {
    pair p = {0};
    p.chunked = mode & 1;
    p.zero_copy = mode >> 1;
    open_pair(&p, &cs, NULL);
    hr_tensor *t = row_major(HR_ELEM_FLOAT64, 2, (uint64_t[]){33, 17}, 5);
    result r = {0};
    uint32_t sid = 0;
    assert_int_equal(hr_session_put(p.c, (const uint8_t *)"w", 1, 0, t,
                                    on_put_done, &r, &sid),
                     0);
    assert_int_equal(run(&p), 0);
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.stream_id, sid);
    assert_int_equal(r.rec.bytes, 33 * 17 * 8);
    assert_int_equal(p.st.puts_committed, 1);
    result g = {0};
    get_key(&p, "w", &g);
    assert_true(same_tensor(g.t, t));
    result_clear(&g);
    /* Without REPLACE an existing key is refused; with it, replaced. */
    memset(&r, 0, sizeof r);
    assert_int_equal(hr_session_put(p.c, (const uint8_t *)"w", 1, 0, t,
                                    on_put_done, &r, NULL),
                     0);
    assert_int_equal(run(&p), 0);
    assert_int_equal(r.status, HR_ERR_REMOTE);
    assert_int_equal(r.rec.wire_error, HR_WIRE_ALREADY_EXISTS);
    hr_tensor *t2 = row_major(HR_ELEM_INT8, 1, (uint64_t[]){3}, 6);
    memset(&r, 0, sizeof r);
    assert_int_equal(hr_session_put(p.c, (const uint8_t *)"w", 1,
                                    HR_PUT_REPLACE, t2, on_put_done, &r, NULL),
                     0);
    assert_int_equal(run(&p), 0);
    assert_int_equal(r.status, 0);
    get_key(&p, "w", &g);
    assert_true(same_tensor(g.t, t2));
    result_clear(&g);
    /* An empty tensor: zero frames. */
    hr_tensor *e = row_major(HR_ELEM_INT8, 2, (uint64_t[]){0, 4}, 6);
    memset(&r, 0, sizeof r);
    assert_int_equal(hr_session_put(p.c, (const uint8_t *)"e", 1, 0, e,
                                    on_put_done, &r, NULL),
                     0);
    assert_int_equal(run(&p), 0);
    assert_int_equal(r.status, 0);
    get_key(&p, "e", &g);
    assert_true(same_tensor(g.t, e));
    result_clear(&g);
    assert_int_equal(p.errors_c + p.errors_s, 0);
    hr_tensor_unref(e);
    hr_tensor_unref(t2);
    hr_tensor_unref(t);
    pair_close(&p);
  }
}

static void put_composite(void **state) {
  (void)state;
  pair p = {0};
  p.chunked = 1;
  open_pair(&p, NULL, NULL);
  hr_tensor *q = row_major(HR_ELEM_INT8, 2, (uint64_t[]){8, 6}, 1);
  hr_tensor *sc = row_major(HR_ELEM_FLOAT16, 2, (uint64_t[]){8, 2}, 2);
  hr_tensor *m[2] = {q, sc};
  hr_descriptor h;
  desc_init(&h, HR_ELEM_FLOAT32, HR_LAYOUT_COMPOSITE, 2, (uint64_t[]){8, 6});
  h.params.member_count = 2;
  h.params.rule = HR_COMPOSITE_GROUP_QUANTIZED;
  h.params.axis = 1;
  h.params.group_size = 4;
  hr_tensor *c = NULL;
  assert_int_equal(hr_tensor_new_composite(&c, &h, m, 2, NULL, NULL), 0);
  result r = {0};
  assert_int_equal(hr_session_put(p.c, (const uint8_t *)"gq", 2, 0, c,
                                  on_put_done, &r, NULL),
                   0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.status, 0);
  result g = {0};
  get_key(&p, "gq", &g);
  assert_true(same_tensor(g.t, c));
  result_clear(&g);
  hr_tensor_unref(c);
  hr_tensor_unref(q);
  hr_tensor_unref(sc);
  pair_close(&p);
}

/* Refused at once: the rest of the stream is dropped silently and the
 * connection goes on. */
static void put_refused_at_once(void **state) {
  (void)state;
  hr_settings cs;
  hr_settings_default(&cs);
  cs.frame_data_size = 100;
  pair p = {0};
  open_pair(&p, &cs, NULL);
  p.st.refuse_put = HR_WIRE_PUT_REJECTED;
  hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){5000}, 5);
  result r = {0};
  assert_int_equal(
      hr_session_put(p.c, (const uint8_t *)"x", 1, 0, t, on_put_done, &r, NULL),
      0);
  /* The client sends everything before the refusal comes back. */
  int64_t sent = 0, n;
  while ((n = pump(&p, p.c, p.s)) > 0)
    sent += n;
  assert_true(sent > 5000);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.rec.wire_error, HR_WIRE_PUT_REJECTED);
  assert_int_equal(p.st.puts_aborted, 0);
  assert_int_equal(p.errors_c + p.errors_s, 0);
  assert_int_equal(hr_session_stream_count(p.s), 0);
  p.st.refuse_put = 0;
  memset(&r, 0, sizeof r);
  assert_int_equal(
      hr_session_put(p.c, (const uint8_t *)"x", 1, 0, t, on_put_done, &r, NULL),
      0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.status, 0);
  /* Refused at commit. */
  p.st.refuse_commit = HR_WIRE_RESOURCE_EXHAUSTED;
  memset(&r, 0, sizeof r);
  assert_int_equal(
      hr_session_put(p.c, (const uint8_t *)"y", 1, 0, t, on_put_done, &r, NULL),
      0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.rec.wire_error, HR_WIRE_RESOURCE_EXHAUSTED);
  hr_tensor_unref(t);
  pair_close(&p);
}

/* Torn PUTs: cancelled mid-way, or the connection ends: on_put_abort,
 * nothing stored. */
static void put_torn(void **state) {
  (void)state;
  hr_settings cs;
  hr_settings_default(&cs);
  cs.frame_data_size = 1000;
  cs.send_budget = 2048;
  pair p = {0};
  open_pair(&p, &cs, NULL);
  hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){50000}, 5);
  result r = {0};
  uint32_t sid;
  assert_int_equal(
      hr_session_put(p.c, (const uint8_t *)"x", 1, 0, t, on_put_done, &r, &sid),
      0);
  for (int i = 0; i < 5; i++)
    assert_true(pump(&p, p.c, p.s) > 0);
  assert_int_equal(hr_session_cancel(p.c, sid), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, HR_ERR_REMOTE);
  assert_int_equal(r.rec.wire_error, HR_WIRE_CANCELLED);
  assert_int_equal(p.st.puts_aborted, 1);
  assert_int_equal(p.st.puts_committed, 0);
  assert_int_equal(p.st.n, 0);
  assert_int_equal(hr_session_stream_count(p.c), 0);
  assert_int_equal(hr_session_stream_count(p.s), 0);
  /* Connection lost mid-PUT. */
  memset(&r, 0, sizeof r);
  assert_int_equal(
      hr_session_put(p.c, (const uint8_t *)"x", 1, 0, t, on_put_done, &r, &sid),
      0);
  for (int i = 0; i < 5; i++)
    assert_true(pump(&p, p.c, p.s) > 0);
  hr_session_terminate(p.s, p.now);
  hr_session_terminate(p.c, p.now);
  assert_int_equal(p.st.puts_aborted, 2);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, HR_ERR_CLOSED);
  assert_false(hr_session_want_read(p.c));
  assert_false(hr_session_want_write(p.c));
  assert_int_equal(p.st.n, 0);
  hr_tensor_unref(t);
  pair_close(&p);
}

/* ---- LIST ---------------------------------------------------------------- */

static void list_pages(void **state) {
  (void)state;
  pair p = {0};
  open_pair(&p, NULL, NULL);
  hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){1}, 1);
  char key[8];
  for (int i = 0; i < 10; i++) {
    snprintf(key, sizeof key, "a%d", i);
    store_put(&p.st, key, t);
  }
  store_put(&p.st, "b0", t);
  char after[16] = "";
  int total = 0, pages = 0;
  for (;;) {
    result r = {0};
    assert_int_equal(
        hr_session_list(p.c, (const uint8_t *)"a", 1, (const uint8_t *)after,
                        (uint16_t)strlen(after), 3, on_list_done, &r),
        0);
    assert_int_equal(run(&p), 0);
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.status, 0);
    assert_true(r.entries <= 3);
    total += r.entries;
    pages++;
    strcpy(after, r.last_key);
    if (!r.more)
      break;
  }
  assert_int_equal(total, 10);
  assert_int_equal(pages, 4);
  assert_string_equal(after, "a9");
  hr_tensor_unref(t);
  pair_close(&p);
}

/* A page never exceeds the peer's max_message_size: cut with more = 1. */
static void list_cut_by_message_size(void **state) {
  (void)state;
  hr_settings cs;
  hr_settings_default(&cs);
  cs.max_message_size = 65536;
  pair p = {0};
  open_pair(&p, &cs, NULL);
  hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){1}, 1);
  char key[1001];
  for (int i = 0; i < 100; i++) {
    memset(key, 'a' + (i / 26) % 26, 1000);
    key[0] = (char)('A' + i / 26);
    key[1] = (char)('a' + i % 26);
    key[1000] = 0;
    store_put(&p.st, key, t);
  }
  result r = {0};
  assert_int_equal(
      hr_session_list(p.c, NULL, 0, NULL, 0, 1024, on_list_done, &r), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, 0);
  assert_true(r.entries > 10 && r.entries < 100);
  assert_int_equal(r.more, 1);
  assert_int_equal(p.errors_c + p.errors_s, 0);
  hr_tensor_unref(t);
  pair_close(&p);
}

/* ---- PING ---------------------------------------------------------------- */

static void ping_rtt(void **state) {
  (void)state;
  pair p = {0};
  p.now = 1000;
  open_pair(&p, NULL, NULL);
  result r = {0};
  assert_int_equal(hr_session_ping(p.c, on_ping_done, &r), 0);
  assert_true(pump(&p, p.c, p.s) > 0);
  p.now += 1234;
  assert_true(pump(&p, p.s, p.c) > 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.rtt, 1234);
  /* The server may ping too. */
  memset(&r, 0, sizeof r);
  assert_int_equal(hr_session_ping(p.s, on_ping_done, &r), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.calls, 1);
  /* An unanswered PING fails when the session goes. */
  memset(&r, 0, sizeof r);
  assert_int_equal(hr_session_ping(p.c, on_ping_done, &r), 0);
  pair_close(&p);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, HR_ERR_CLOSED);
}

/* ---- CANCEL -------------------------------------------------------------- */

static void cancel_pending_and_streaming(void **state) {
  (void)state;
  hr_settings ss;
  hr_settings_default(&ss);
  ss.frame_data_size = 4096;
  ss.send_budget = 8192;
  pair p = {0};
  open_pair(&p, NULL, &ss);
  hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){1 << 20}, 3);
  store_put(&p.st, "big", t);
  /* Not answered yet. */
  p.st.defer = 1;
  result r = {0};
  uint32_t sid;
  hr_get_opts o = get_opts("big");
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r, &sid), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(p.st.npending, 1);
  assert_int_equal(hr_session_cancel(p.c, sid), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(p.st.cancels, 1);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, HR_ERR_REMOTE);
  assert_int_equal(r.rec.wire_error, HR_WIRE_CANCELLED);
  assert_int_equal(hr_session_cancel(p.c, sid), HR_ERR_NOT_FOUND);
  /* Mid-transfer. */
  p.st.defer = 0;
  memset(&r, 0, sizeof r);
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r, &sid), 0);
  assert_true(pump(&p, p.c, p.s) > 0);
  for (int i = 0; i < 4; i++)
    assert_true(pump(&p, p.s, p.c) > 0);
  assert_int_equal(r.calls, 0);
  assert_int_equal(hr_session_cancel(p.c, sid), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.rec.wire_error, HR_WIRE_CANCELLED);
  assert_null(r.t);
  assert_int_equal(hr_session_stream_count(p.s), 0);
  assert_int_equal(hr_session_stream_count(p.c), 0);
  assert_int_equal(p.errors_c + p.errors_s, 0);
  /* A parallel request cancelled while unanswered. */
  hr_tensor *big = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){4200, 2048}, 9);
  store_put(&p.st, "huge", big);
  p.st.defer = 1;
  memset(&r, 0, sizeof r);
  o = get_opts("huge");
  o.flags = HR_REQ_PARALLEL_OK;
  o.max_shards = 8;
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r, &sid), 0);
  assert_int_equal(run(&p), 0);
  /* Any id of the block names the GET. */
  assert_int_equal(hr_session_cancel(p.c, sid + 3), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.rec.wire_error, HR_WIRE_CANCELLED);
  assert_int_equal(p.errors_c + p.errors_s, 0);
  assert_int_equal(hr_session_stream_count(p.s), 0);
  /* ... and mid-transfer. */
  p.st.defer = 0;
  memset(&r, 0, sizeof r);
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r, &sid), 0);
  assert_true(pump(&p, p.c, p.s) > 0);
  for (int i = 0; i < 6; i++)
    assert_true(pump(&p, p.s, p.c) > 0);
  assert_int_equal(hr_session_cancel(p.c, sid), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.rec.wire_error, HR_WIRE_CANCELLED);
  assert_int_equal(p.errors_c + p.errors_s, 0);
  assert_int_equal(hr_session_stream_count(p.s), 0);
  assert_int_equal(hr_session_stream_count(p.c), 0);
  /* Still usable. */
  result g = {0};
  get_key(&p, "big", &g);
  assert_int_equal(g.status, 0);
  result_clear(&g);
  hr_tensor_unref(big);
  hr_tensor_unref(t);
  pair_close(&p);
}

/* ---- GOAWAY -------------------------------------------------------------- */

static void goaway_drain(void **state) {
  (void)state;
  pair p = {0};
  open_pair(&p, NULL, NULL);
  hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){100}, 3);
  store_put(&p.st, "k", t);
  p.st.defer = 1;
  result r1 = {0}, r2 = {0};
  hr_get_opts o = get_opts("k");
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r1, NULL), 0);
  assert_int_equal(run(&p), 0);
  /* A second request races the GOAWAY. */
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r2, NULL), 0);
  assert_int_equal(hr_session_shutdown(p.s, p.now), 0);
  assert_string_equal(hr_session_state_name(p.s), "DRAINING");
  assert_int_equal(run(&p), 0);
  assert_int_equal(p.goaways_c, 1);
  /* Above last_stream_id: not processed. */
  assert_int_equal(r2.calls, 1);
  assert_int_equal(r2.status, HR_ERR_CLOSED);
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r2, NULL),
                   HR_ERR_STATE);
  /* The accepted one finishes normally. */
  store_answer_pending(&p.st);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r1.calls, 1);
  assert_int_equal(r1.status, 0);
  assert_int_equal(p.errors_c + p.errors_s, 0);
  assert_false(hr_session_want_read(p.s));
  assert_false(hr_session_want_write(p.s));
  assert_false(hr_session_want_read(p.c));
  assert_false(hr_session_want_write(p.c));
  result_clear(&r1);
  result_clear(&r2);
  hr_tensor_unref(t);
  pair_close(&p);
}

static void goaway_from_client(void **state) {
  (void)state;
  pair p = {0};
  open_pair(&p, NULL, NULL);
  assert_int_equal(hr_session_shutdown(p.c, p.now), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(p.goaways_s, 1);
  assert_false(hr_session_want_read(p.s));
  assert_false(hr_session_want_read(p.c));
  pair_close(&p);
}

/* ---- timeouts (fake clock) ----------------------------------------------- */

static int64_t take_error(hr_session *s, uint32_t *sid, uint32_t *code) {
  hr_iov iov[16];
  int n = hr_session_pull(s, iov, 16, 0);
  uint8_t buf[4096];
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    memcpy(buf + len, iov[i].base, iov[i].len);
    len += iov[i].len;
  }
  hr_session_consumed(s, len, 0);
  size_t pos = 0;
  while (pos + 12 <= len) {
    hr_msg_header h;
    hr_wire_parse_header(buf + pos, &h);
    if (h.type == HR_MSG_ERROR) {
      hr_msg m;
      assert_int_equal(
          hr_wire_decode(buf + pos, 12 + h.payload_length, NULL, &m, NULL), 0);
      *sid = h.stream_id;
      *code = m.u.error.code;
      return 1;
    }
    pos += 12 + h.payload_length;
  }
  return 0;
}

static void timeouts(void **state) {
  (void)state;
  /* Handshake. */
  hr_session *s;
  assert_int_equal(
      hr_session_new(&s, HR_ROLE_SERVER, NULL, NULL, NULL, NULL, 100, NULL), 0);
  assert_int_equal(hr_session_get_expiry(s), 100 + 10 * SEC);
  assert_int_equal(hr_session_handle_expiry(s, 100 + 10 * SEC - 1), 0);
  assert_true(hr_session_want_read(s));
  assert_int_equal(hr_session_handle_expiry(s, 100 + 10 * SEC), 0);
  assert_false(hr_session_want_read(s));
  uint32_t sid = 9, code = 0;
  assert_int_equal(take_error(s, &sid, &code), 1);
  assert_int_equal(sid, 0);
  assert_int_equal(code, HR_WIRE_TIMEOUT);
  assert_int_equal(hr_session_get_expiry(s), HR_TSTAMP_NEVER);
  hr_session_del(s);

  /* Read timeout: a peer stalled inside a message. */
  pair p = {0};
  p.now = 5;
  open_pair(&p, NULL, NULL);
  uint8_t half[6] = {0x0E, 0, 0, 0, 0, 0};
  assert_int_equal(hr_session_recv(p.s, half, sizeof half, p.now), 6);
  hr_tstamp due = hr_session_get_expiry(p.s);
  assert_int_equal(due, p.now + 30 * SEC);
  assert_int_equal(hr_session_handle_expiry(p.s, due), 0);
  assert_int_equal(take_error(p.s, &sid, &code), 1);
  assert_int_equal(code, HR_WIRE_TIMEOUT);
  assert_int_equal(p.errors_s, 1);
  pair_close(&p);

  /* Idle timeout: GOAWAY and close. */
  memset(&p, 0, sizeof p);
  p.now = 5;
  hr_settings cs;
  hr_settings_default(&cs);
  cs.keepalive_interval = 0;
  open_pair(&p, &cs, NULL);
  assert_int_equal(hr_session_get_expiry(p.s), 5 + 300 * SEC);
  assert_int_equal(hr_session_handle_expiry(p.s, 5 + 300 * SEC), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(p.goaways_c, 1);
  assert_false(hr_session_want_read(p.s));
  assert_false(hr_session_want_read(p.c));
  pair_close(&p);

  /* Keepalive: PING after 30 s of silence; answered, all is well;
   * unanswered for another interval, the connection times out. */
  memset(&p, 0, sizeof p);
  p.now = 5;
  open_pair(&p, NULL, NULL);
  assert_int_equal(hr_session_get_expiry(p.c), 5 + 30 * SEC);
  p.now = 5 + 30 * SEC;
  assert_int_equal(hr_session_handle_expiry(p.c, p.now), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(p.errors_c, 0);
  assert_int_equal(hr_session_get_expiry(p.c), p.now + 30 * SEC);
  /* PINGs are not activity: the server still idles out on time. */
  assert_int_equal(hr_session_get_expiry(p.s), 5 + 300 * SEC);
  p.now += 30 * SEC;
  assert_int_equal(hr_session_handle_expiry(p.c, p.now), 0);
  assert_true(pump(&p, p.c, NULL) > 0); /* the PING is lost */
  p.now += 30 * SEC;
  assert_int_equal(hr_session_handle_expiry(p.c, p.now), 0);
  assert_int_equal(p.errors_c, 1);
  assert_int_equal(p.last_err_c, HR_WIRE_TIMEOUT);
  assert_false(hr_session_want_read(p.c));
  pair_close(&p);
}

/* ---- fairness and backpressure ------------------------------------------- */

/* Parses the byte stream the server sends and records, per stream, how
 * many TENSOR_DATA frames went and when DATA_END came. */
typedef struct watch {
  uint32_t big, small;
  int big_frames_after_small_req;
  int small_done;
  int armed;
} watch;

static int64_t pump_watch(pair *p, watch *w) {
  uint8_t *buf;
  int64_t got = pull_all(p->s, p->iov_max, p->now, &buf);
  if (got <= 0)
    return 0;
  size_t total = (size_t)got;
  for (size_t pos = 0; pos + 12 <= total;) {
    hr_msg_header h;
    hr_wire_parse_header(buf + pos, &h);
    if (w->armed && !w->small_done && h.stream_id == w->big &&
        h.type == HR_MSG_TENSOR_DATA)
      w->big_frames_after_small_req++;
    if (h.stream_id == w->small && h.type == HR_MSG_TENSOR_DATA_END)
      w->small_done = 1;
    pos += 12 + h.payload_length;
  }
  int64_t rv = feed(p, p->c, buf, total);
  free(buf);
  return rv < 0 ? rv : (int64_t)total;
}

static void fairness_small_get_overtakes(void **state) {
  (void)state;
  hr_settings ss;
  hr_settings_default(&ss);
  ss.frame_data_size = 1 << 20;
  pair p = {0};
  open_pair(&p, NULL, &ss);
  hr_tensor *big = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){16 << 20}, 1);
  hr_tensor *small = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){4096}, 2);
  store_put(&p.st, "big", big);
  store_put(&p.st, "small", small);
  result rb = {0}, rs = {0};
  watch w = {0};
  hr_get_opts o = get_opts("big");
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &rb, &w.big), 0);
  assert_true(pump(&p, p.c, p.s) > 0);
  for (int i = 0; i < 3; i++)
    assert_true(pump_watch(&p, &w) > 0);
  o = get_opts("small");
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &rs, &w.small), 0);
  assert_true(pump(&p, p.c, p.s) > 0);
  w.armed = 1;
  while (!w.small_done)
    assert_true(pump_watch(&p, &w) > 0);
  assert_true(w.big_frames_after_small_req <= 1);
  assert_int_equal(rs.calls, 1);
  assert_int_equal(rb.calls, 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(rb.calls, 1);
  assert_true(same_tensor(rb.t, big));
  assert_true(same_tensor(rs.t, small));
  result_clear(&rb);
  result_clear(&rs);
  hr_tensor_unref(big);
  hr_tensor_unref(small);
  pair_close(&p);
}

/* Frames queued but not consumed never exceed send_budget, however often
 * the host pulls; control messages still go. */
static void backpressure_bound(void **state) {
  (void)state;
  hr_settings ss;
  hr_settings_default(&ss);
  ss.frame_data_size = 64 << 10;
  ss.send_budget = 256 << 10;
  pair p = {0};
  open_pair(&p, NULL, &ss);
  hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){1 << 20}, 1);
  store_put(&p.st, "k", t);
  result r[10];
  memset(r, 0, sizeof r);
  for (int i = 0; i < 10; i++) {
    hr_get_opts o = get_opts("k");
    assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r[i], NULL), 0);
  }
  assert_true(pump(&p, p.c, p.s) > 0);
  size_t frames = 0;
  for (int i = 0; i < 50; i++) {
    hr_iov iov[256];
    int n = hr_session_pull(p.s, iov, 256, p.now);
    frames = 0;
    for (int j = 0; j < n; j++)
      frames += iov[j].len;
  }
  /* 10 descriptors (~60 bytes each) + at most the budget of frames. */
  assert_true(frames <= (256 << 10) + 10 * 128);
  assert_true(frames >= (192 << 10));
  assert_false(hr_session_want_write(p.s) && frames < (192 << 10));
  /* A PING still gets its PONG. */
  result pr = {0};
  assert_int_equal(hr_session_ping(p.c, on_ping_done, &pr), 0);
  assert_true(pump(&p, p.c, p.s) > 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(pr.calls, 1);
  for (int i = 0; i < 10; i++) {
    assert_int_equal(r[i].status, 0);
    result_clear(&r[i]);
  }
  hr_tensor_unref(t);
  pair_close(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(put_then_get),
      cmocka_unit_test(put_composite),
      cmocka_unit_test(put_refused_at_once),
      cmocka_unit_test(put_torn),
      cmocka_unit_test(list_pages),
      cmocka_unit_test(list_cut_by_message_size),
      cmocka_unit_test(ping_rtt),
      cmocka_unit_test(cancel_pending_and_streaming),
      cmocka_unit_test(goaway_drain),
      cmocka_unit_test(goaway_from_client),
      cmocka_unit_test(timeouts),
      cmocka_unit_test(fairness_small_get_overtakes),
      cmocka_unit_test(backpressure_bound),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
