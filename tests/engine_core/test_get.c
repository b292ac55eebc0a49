/* Session GETs end to end: every layout and element type, chunked and
 * zero-copy receive, shards, regions, composites, destinations. */
#include "engine_core/harness.h"

static void handshake(void **state) {
  (void)state;
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  assert_string_equal(hr_session_state_name(p.c), "AWAIT_HELLO");
  assert_null(hr_session_peer_hello(p.c));
  assert_int_equal(run(&p), 0);
  assert_int_equal(p.established, 2);
  assert_string_equal(hr_session_state_name(p.c), "ESTABLISHED");
  assert_string_equal(hr_session_state_name(p.s), "ESTABLISHED");
  const hr_hello *h = hr_session_peer_hello(p.c);
  assert_non_null(h);
  assert_int_equal(h->exts.max_shards, 64);
  assert_non_null(h->exts.peer_name);
  /* The store has LIST and PUT: both advertised. */
  assert_true(h->capability_flags & HR_CAP_LIST);
  assert_true(h->capability_flags & HR_CAP_TENSOR_PUT);
  assert_true(hr_session_want_read(p.c));
  assert_false(hr_session_want_write(p.c));
  pair_close(&p);
}

/* One GET of `t` with options `o`; returns the result. */
static void get_one(pair *p, hr_tensor *t, hr_get_opts *o, result *r) {
  store_put(&p->st, "k", t);
  o->key = (const uint8_t *)"k";
  o->key_len = 1;
  uint32_t sid = 0;
  assert_int_equal(hr_session_get(p->c, o, on_get_done, r, &sid), 0);
  assert_int_equal(run(p), 0);
  assert_int_equal(r->calls, 1);
  assert_int_equal(r->stream_id, sid);
}

static void get_small_row_major(void **state) {
  (void)state;
  for (int mode = 0; mode < 4; mode++) {
    pair p = {0};
    p.chunked = mode & 1;
    p.zero_copy = (mode >> 1) & 1;
    assert_int_equal(pair_open(&p, NULL, NULL), 0);
    hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){3, 5}, 7);
    result r = {0};
    hr_get_opts o = get_opts("k");
    get_one(&p, t, &o, &r);
    assert_int_equal(r.status, 0);
    assert_non_null(r.t);
    assert_true(same_tensor(r.t, t));
    assert_int_equal(r.rec.layout, HR_LAYOUT_ROW_MAJOR);
    assert_int_equal(r.rec.bytes, 60);
    assert_int_equal(r.rec.transcoded, -1);
    assert_int_equal(p.last_srv_rec.transcoded, 0);
    assert_int_equal(p.last_srv_rec.bytes, 60);
    assert_int_equal(hr_session_stream_count(p.c), 0);
    assert_int_equal(hr_session_stream_count(p.s), 0);
    result_clear(&r);
    hr_tensor_unref(t);
    pair_close(&p);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(handshake),
      cmocka_unit_test(get_small_row_major),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
