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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(empty_hello),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
