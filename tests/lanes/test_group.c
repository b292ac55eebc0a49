/*
 * Sessions over several connections, sans-IO: joins and tokens, parallel
 * GETs spread over lanes, lanes that close mid-transfer, CANCEL across
 * lanes, the shared id space, idle and drain, refusals, and failing
 * allocations.
 */
#include "lanes/lanes.h"

/* Server settings that let small tensors take many shards. */
static hr_settings many_shards(void) {
  hr_settings s;
  hr_settings_default(&s);
  s.shard_bytes = 1024;
  s.shards_per_lane = 64;
  s.frame_data_size = 4096;
  return s;
}

static hr_get_opts par_opts(const char *key, uint16_t k) {
  hr_get_opts o = get_opts(key);
  o.flags = HR_REQ_PARALLEL_OK;
  o.max_shards = k;
  return o;
}

static void join_and_tokens(void **state) {
  (void)state;
  lnet n = {0};
  assert_int_equal(lnet_open(&n, 1, NULL, NULL), 0);
  /* Lane 0's SERVER_HELLO names the session. */
  const hr_hello *h = hr_session_peer_hello(n.c[0]);
  assert_non_null(h);
  assert_non_null(h->exts.session_token);
  assert_int_equal(h->exts.session_token_len, 16);
  uint8_t tok[16];
  memcpy(tok, h->exts.session_token, 16);
  assert_int_equal(hr_registry_count(n.reg), 1);
  assert_int_equal(hr_group_lanes(n.g), 1);
  for (int i = 1; i < 4; i++)
    assert_int_equal(lnet_add_lane(&n), 0);
  assert_int_equal(hr_group_lanes(n.g), 4);
  assert_int_equal(hr_group_open_lanes(n.g), 4);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(hr_session_lane(n.c[i]), i);
    assert_int_equal(hr_session_lane(n.s[i]), i);
    assert_ptr_equal(hr_group_lane(n.g, (unsigned)i), n.c[i]);
    /* Every lane's SERVER_HELLO carries the same token. */
    h = hr_session_peer_hello(n.c[i]);
    assert_int_equal(h->exts.session_token_len, 16);
    assert_memory_equal(h->exts.session_token, tok, 16);
  }
  hr_group *sg = hr_session_group(n.s[0]);
  assert_non_null(sg);
  assert_ptr_equal(hr_session_group(n.s[3]), sg);
  assert_int_equal(hr_group_lanes(sg), 4);
  /* One join at a time. */
  hr_session *x = NULL, *y = NULL;
  assert_int_equal(hr_group_add_lane(n.g, &n, n.io.now, &x), 0);
  assert_int_equal(hr_session_lane(x), -1);
  assert_int_equal(hr_group_add_lane(n.g, &n, n.io.now, &y), HR_ERR_BUSY);
  hr_session_del(x);
  assert_int_equal(hr_group_lanes(n.g), 4);
  assert_int_equal(n.errors_c + n.errors_s, 0);
  lnet_close(&n);
}

/* A server without a registry sends no token: no lanes. */
static void no_registry_no_lanes(void **state) {
  (void)state;
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  assert_int_equal(run(&p), 0);
  assert_null(hr_session_peer_hello(p.c)->exts.session_token);
  hr_group *g = NULL;
  assert_int_equal(hr_group_new(&g, p.c), 0);
  hr_session *l = NULL;
  assert_int_equal(hr_group_add_lane(g, NULL, 0, &l), HR_ERR_UNSUPPORTED);
  assert_int_equal(hr_group_new(&g, p.c), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_group_new(&g, p.s), HR_ERR_INVALID_ARGUMENT);
  hr_group_del(g);
  assert_null(hr_session_group(p.s));
  assert_int_equal(hr_session_lane(p.s), 0);
  pair_close(&p);
  /* A registry whose randomness fails: the session stays single. */
  lnet n = {0};
  n.random_fails = 1;
  assert_int_equal(lnet_open(&n, 1, NULL, NULL), 0);
  assert_null(hr_session_peer_hello(n.c[0])->exts.session_token);
  assert_int_equal(hr_registry_count(n.reg), 0);
  hr_session *x = NULL;
  assert_int_equal(hr_group_add_lane(n.g, &n, 0, &x), HR_ERR_UNSUPPORTED);
  lnet_close(&n);
}

/* Adds a raw client lane that sends `token` in SESSION_JOIN to a new
 * server session on connection n->n; returns its index. */
static int raw_join(lnet *n, const uint8_t *token, size_t len,
                    int with_registry) {
  int i = n->n;
  assert_int_equal(ln_server(n, i, with_registry), 0);
  n->n++;
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_CLIENT_HELLO;
  hr_hello *h = &m.u.hello;
  h->magic = HR_MAGIC;
  h->version_major = 1;
  h->max_message_size = 1 << 20;
  uint8_t ext[300];
  int w =
      hr_ext_put(ext, sizeof ext, HR_EXT_SESSION_JOIN, token, (uint16_t)len);
  assert_true(w > 0);
  h->ext_count = 1;
  h->ext_raw = ext;
  h->ext_raw_len = (size_t)w;
  uint8_t b[512];
  int64_t k = hr_wire_encode(&m, b, sizeof b);
  assert_true(k > 0);
  assert_int_equal(feed(&n->io, n->s[i], b, (size_t)k), 0);
  return i;
}

/* Pulls what the server session of connection i sent and decodes the
 * first message. */
static void first_sent(lnet *n, int i, hr_msg *m, uint8_t *buf, size_t cap) {
  hr_iov iov[16];
  int k = hr_session_pull(n->s[i], iov, 16, n->io.now);
  assert_true(k > 0);
  size_t len = 0;
  for (int j = 0; j < k; j++) {
    assert_true(len + iov[j].len <= cap);
    memcpy(buf + len, iov[j].base, iov[j].len);
    len += iov[j].len;
  }
  hr_session_consumed(n->s[i], len, n->io.now);
  hr_msg_header h;
  assert_true(len >= HR_HEADER_SIZE);
  hr_wire_parse_header(buf, &h);
  assert_true(len >= HR_HEADER_SIZE + h.payload_length);
  hr_wire_status ws;
  assert_int_equal(
      hr_wire_decode(buf, HR_HEADER_SIZE + h.payload_length, NULL, m, &ws), 0);
}

static void join_refusals(void **state) {
  (void)state;
  lnet n = {0};
  assert_int_equal(lnet_open(&n, 2, NULL, NULL), 0);
  uint8_t tok[16];
  memcpy(tok, hr_session_peer_hello(n.c[0])->exts.session_token, 16);
  uint8_t buf[4096];
  hr_msg m;
  /* An unknown token. */
  uint8_t bad[16];
  memcpy(bad, tok, 16);
  bad[7] ^= 1;
  int i = raw_join(&n, bad, 16, 1);
  first_sent(&n, i, &m, buf, sizeof buf);
  assert_int_equal(m.hdr.type, HR_MSG_ERROR);
  assert_int_equal(m.u.error.code, HR_WIRE_UNAUTHORIZED);
  assert_false(hr_session_want_read(n.s[i]));
  /* A longer token with the right prefix is another token. */
  uint8_t longer[20] = {0};
  memcpy(longer, tok, 16);
  i = raw_join(&n, longer, 20, 1);
  first_sent(&n, i, &m, buf, sizeof buf);
  assert_int_equal(m.u.error.code, HR_WIRE_UNAUTHORIZED);
  /* A server session without the registry knows no session. */
  i = raw_join(&n, tok, 16, 0);
  first_sent(&n, i, &m, buf, sizeof buf);
  assert_int_equal(m.u.error.code, HR_WIRE_UNAUTHORIZED);
  /* The right token joins as lane 2. */
  i = raw_join(&n, tok, 16, 1);
  first_sent(&n, i, &m, buf, sizeof buf);
  assert_int_equal(m.hdr.type, HR_MSG_SERVER_HELLO);
  assert_int_equal(hr_session_lane(n.s[i]), 2);
  hr_session_del(n.s[i]);
  n.s[i] = NULL;
  /* A client lane refused by the server takes no position. */
  assert_int_equal(hr_session_set_registry(n.s[0], n.reg), HR_ERR_STATE);
  hr_session *x = NULL;
  assert_int_equal(hr_group_add_lane(n.g, &n, 0, &x), 0);
  int j = n.n++;
  n.c[j] = x;
  assert_int_equal(ln_server(&n, j, 0), 0); /* no registry: refuses */
  assert_int_equal(lnet_run(&n), 0);
  assert_int_equal(n.last_err_c, HR_WIRE_UNAUTHORIZED);
  assert_false(hr_session_want_read(x));
  /* The server numbered the raw join 2; this client knows lanes 0, 1. */
  assert_int_equal(hr_group_lanes(n.g), 2);
  assert_ptr_equal(hr_group_lane(n.g, 2), NULL);
  /* Once lane 0 is gone nobody can join. */
  hr_session_terminate(n.s[0], n.io.now);
  assert_int_equal(hr_registry_count(n.reg), 0);
  i = raw_join(&n, tok, 16, 1);
  first_sent(&n, i, &m, buf, sizeof buf);
  assert_int_equal(m.u.error.code, HR_WIRE_UNAUTHORIZED);
  lnet_close(&n);
}

/* The most lanes: the next join is RESOURCE_EXHAUSTED. */
static void lane_limit(void **state) {
  (void)state;
  lnet n = {0};
  assert_int_equal(lnet_open(&n, HR_MAX_LANES, NULL, NULL), 0);
  assert_int_equal(hr_group_lanes(n.g), HR_MAX_LANES);
  hr_session *x = NULL;
  assert_int_equal(hr_group_add_lane(n.g, &n, 0, &x), HR_ERR_LIMIT);
  uint8_t tok[16];
  memcpy(tok, hr_session_peer_hello(n.c[0])->exts.session_token, 16);
  int i = raw_join(&n, tok, 16, 1);
  uint8_t buf[4096];
  hr_msg m;
  first_sent(&n, i, &m, buf, sizeof buf);
  assert_int_equal(m.hdr.type, HR_MSG_ERROR);
  assert_int_equal(m.u.error.code, HR_WIRE_RESOURCE_EXHAUSTED);
  lnet_close(&n);
}

/* Shard i went out on lane i mod L: count the server's records. */
static void check_spread(lnet *n, uint32_t shards, int lanes) {
  for (int j = 0; j < lanes; j++) {
    int want = 0;
    for (uint32_t i = 0; i < shards; i++)
      want += (int)(i % (uint32_t)lanes) == j;
    if (n->srv_rec[j] != want)
      fail_msg("lane %d sent %d shards, want %d", j, n->srv_rec[j], want);
  }
}

static void parallel_gets(void **state) {
  (void)state;
  static const uint16_t ks[] = {1, 2, 3, 8, 64};
  hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){256, 75}, 7);
  for (int lanes = 1; lanes <= 4; lanes++)
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
      lnet n = {0};
      n.io.seed = (uint64_t)(lanes * 100 + (int)ki + 1);
      n.io.zero_copy = (int)(ki & 1);
      n.io.chunked = lanes == 3;
      hr_settings ss = many_shards();
      assert_int_equal(lnet_open(&n, lanes, NULL, &ss), 0);
      store_put(&n.st, "w", t);
      uint16_t k = ks[ki];
      result r = {0};
      hr_get_opts o = par_opts("w", k);
      /* The destination is the application's buffer, exactly the
       * tensor's size: every shard lands in place. */
      uint64_t bytes = hr_tensor_bytes(t);
      uint8_t *buf = aligned_alloc(64, bytes);
      hr_get_dest dest = {buf, bytes, NULL, NULL};
      o.dest = &dest;
      /* Any lane's session sends it on lane 0. */
      hr_session *via = n.c[lanes - 1];
      assert_int_equal(hr_session_get(via, &o, on_get_done, &r, NULL), 0);
      assert_int_equal(lnet_run(&n), 0);
      assert_int_equal(r.calls, 1);
      if (r.status)
        fail_msg("L=%d K=%u: %s", lanes, k, r.rec.message);
      assert_int_equal(r.rec.shards, k);
      assert_int_equal(r.rec.lanes, k < lanes ? k : lanes);
      assert_true(same_tensor(r.t, t));
      assert_ptr_equal(hr_tensor_buffer(r.t, 0), buf);
      check_spread(&n, k, lanes);
      assert_int_equal(lnet_streams(&n), 0);
      assert_int_equal(n.errors_c + n.errors_s, 0);
      result_clear(&r);
      free(buf);
      lnet_close(&n);
    }
  hr_tensor_unref(t);
}

/* Shards of one GET that arrive lane after lane, the last lane first. */
static void shards_in_any_order(void **state) {
  (void)state;
  lnet n = {0};
  hr_settings ss = many_shards();
  assert_int_equal(lnet_open(&n, 4, NULL, &ss), 0);
  hr_tensor *t = row_major(HR_ELEM_UINT16, 3, (uint64_t[]){40, 9, 31}, 3);
  store_put(&n.st, "t", t);
  result r = {0};
  hr_get_opts o = par_opts("t", 12);
  assert_int_equal(hr_session_get(n.c[0], &o, on_get_done, &r, NULL), 0);
  /* The request reaches the server; every lane's answer is queued. */
  assert_true(pump(&n.io, n.c[0], n.s[0]) > 0);
  for (int i = 3; i >= 0; i--)
    while (pump(&n.io, n.s[i], n.c[i]) > 0)
      ;
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.rec.shards, 12);
  assert_true(same_tensor(r.t, t));
  assert_int_equal(lnet_run(&n), 0);
  assert_int_equal(lnet_streams(&n), 0);
  result_clear(&r);
  hr_tensor_unref(t);
  lnet_close(&n);
}

/* Requests keep flowing on one lane while another lane's shards stream;
 * a REGION with PARALLEL_OK tiles the region over the lanes. */
static void regions_over_lanes(void **state) {
  (void)state;
  lnet n = {0};
  hr_settings ss = many_shards();
  assert_int_equal(lnet_open(&n, 3, NULL, &ss), 0);
  if (!(hr_session_peer_hello(n.c[0])->capability_flags &
        HR_CAP_REGION_REQUESTS)) {
    lnet_close(&n);
    skip();
  }
  hr_tensor *t = row_major(HR_ELEM_INT32, 3, (uint64_t[]){1, 120, 50}, 5);
  store_put(&n.st, "t", t);
  result r = {0};
  hr_get_opts o = par_opts("t", 5);
  o.flags |= HR_REQ_REGION;
  o.region_rank = 3;
  o.region_offset = (uint64_t[]){0, 17, 0};
  o.region_shape = (uint64_t[]){1, 80, 50};
  assert_int_equal(hr_session_get(n.c[1], &o, on_get_done, &r, NULL), 0);
  assert_int_equal(lnet_run(&n), 0);
  assert_int_equal(r.status, 0);
  /* Dim 0 has extent 1: the cut is along dim 1, still one run each. */
  assert_int_equal(r.rec.shards, 5);
  const hr_descriptor *d = hr_tensor_descriptor(r.t);
  assert_true(d->flags & HR_DESC_HAS_SHARD);
  assert_int_equal(d->shard_offset[1], 17);
  assert_int_equal(d->shape[1], 80);
  assert_memory_equal(hr_tensor_buffer(r.t, 0),
                      (uint8_t *)hr_tensor_buffer(t, 0) + 17 * 50 * 4,
                      80 * 50 * 4);
  check_spread(&n, 5, 3);
  result_clear(&r);
  hr_tensor_unref(t);
  lnet_close(&n);
}

/* One lane goes while three GETs run: only the one with shards on it
 * fails, and cleanly; later requests avoid the closed lane. */
static void lane_killed(void **state) {
  (void)state;
  for (int mode = 0; mode < 3; mode++) {
    lnet n = {0};
    n.use_fm = 1;
    hr_test_failmem_init(&n.fm, -1);
    hr_settings ss = many_shards();
    assert_int_equal(lnet_open(&n, 3, NULL, &ss), 0);
    hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){300, 200}, 1);
    store_put(&n.st, "t", t);
    result a = {0}, b = {0}, c = {0};
    hr_get_opts oa = par_opts("t", 6); /* shards on lanes 0, 1, 2 */
    hr_get_opts ob = get_opts("t");    /* lane 0 only */
    hr_get_opts oc = par_opts("t", 2); /* lanes 0 and 1 */
    assert_int_equal(hr_session_get(n.c[0], &oa, on_get_done, &a, NULL), 0);
    assert_int_equal(hr_session_get(n.c[0], &ob, on_get_done, &b, NULL), 0);
    assert_int_equal(hr_session_get(n.c[0], &oc, on_get_done, &c, NULL), 0);
    assert_int_equal(lnet_step(&n, 3), 0);
    assert_int_equal(a.calls + b.calls + c.calls, 0);
    /* Lane 2 is cut.  Mode 0: both ends notice at once; 1: the client
     * first (the server's frames pile up unsent); 2: the server first. */
    n.cut[2] = 1;
    if (mode != 2)
      hr_session_terminate(n.c[2], n.io.now);
    if (mode != 1)
      hr_session_terminate(n.s[2], n.io.now);
    assert_int_equal(lnet_run(&n), 0);
    if (mode == 2) {
      /* The client has not seen it yet: A waits for its lane-2 shards. */
      assert_int_equal(a.calls, 0);
      hr_session_terminate(n.c[2], n.io.now);
      assert_int_equal(lnet_run(&n), 0);
    }
    assert_int_equal(a.calls, 1);
    assert_int_equal(a.status, HR_ERR_CLOSED);
    assert_null(a.t);
    assert_int_equal(b.calls, 1);
    assert_int_equal(b.status, 0);
    assert_true(same_tensor(b.t, t));
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.status, 0);
    assert_int_equal(c.rec.shards, 2);
    assert_true(same_tensor(c.t, t));
    if (mode == 1) {
      hr_session_terminate(n.s[2], n.io.now);
      assert_int_equal(lnet_run(&n), 0);
    }
    /* Nothing left on any lane, and no connection-level error. */
    assert_int_equal(lnet_streams(&n), 0);
    assert_int_equal(n.errors_c + n.errors_s, 0);
    assert_int_equal(hr_group_open_lanes(n.g), 2);
    /* A new parallel GET stays below the closed lane. */
    result d = {0};
    hr_get_opts od = par_opts("t", 16);
    assert_int_equal(hr_session_get(n.c[0], &od, on_get_done, &d, NULL), 0);
    assert_int_equal(lnet_run(&n), 0);
    assert_int_equal(d.status, 0);
    assert_int_equal(d.rec.shards, 2);
    assert_true(same_tensor(d.t, t));
    result_clear(&a);
    result_clear(&b);
    result_clear(&c);
    result_clear(&d);
    hr_tensor_unref(t);
    lnet_close(&n);
    if (n.fm.live != 0)
      fail_msg("mode %d: %ld blocks leaked", mode, n.fm.live);
  }
}

/* Lane 0 goes: every GET fails, the group takes no more requests. */
static void lane0_lost(void **state) {
  (void)state;
  lnet n = {0};
  hr_settings ss = many_shards();
  assert_int_equal(lnet_open(&n, 2, NULL, &ss), 0);
  hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){300, 200}, 1);
  store_put(&n.st, "t", t);
  result a = {0}, b = {0};
  hr_get_opts oa = par_opts("t", 4);
  hr_get_opts ob = get_opts("t");
  assert_int_equal(hr_session_get(n.c[0], &oa, on_get_done, &a, NULL), 0);
  assert_int_equal(hr_session_get(n.c[0], &ob, on_get_done, &b, NULL), 0);
  assert_int_equal(lnet_step(&n, 2), 0);
  n.cut[0] = 1;
  hr_session_terminate(n.c[0], n.io.now);
  hr_session_terminate(n.s[0], n.io.now);
  assert_int_equal(lnet_run(&n), 0);
  assert_int_equal(a.calls, 1);
  assert_int_equal(a.status, HR_ERR_CLOSED);
  assert_int_equal(b.calls, 1);
  assert_int_equal(b.status, HR_ERR_CLOSED);
  result x = {0};
  assert_int_equal(hr_session_get(n.c[1], &ob, on_get_done, &x, NULL),
                   HR_ERR_STATE);
  assert_int_equal(lnet_streams(&n), 0);
  hr_tensor_unref(t);
  lnet_close(&n);
}

/* CANCEL of a parallel GET goes on lane 0 for every shard id; the server
 * stops the shards on every lane. */
static void cancel_over_lanes(void **state) {
  (void)state;
  lnet n = {0};
  hr_settings ss = many_shards();
  assert_int_equal(lnet_open(&n, 3, NULL, &ss), 0);
  hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){300, 200}, 1);
  store_put(&n.st, "t", t);
  result r = {0};
  uint32_t sid = 0;
  hr_get_opts o = par_opts("t", 9);
  assert_int_equal(hr_session_get(n.c[0], &o, on_get_done, &r, &sid), 0);
  assert_int_equal(lnet_step(&n, 2), 0);
  assert_int_equal(r.calls, 0);
  /* Named through another lane and another id of the block. */
  assert_int_equal(hr_session_cancel(n.c[2], sid + 4), 0);
  hr_iov iov[8];
  assert_int_equal(hr_session_pull(n.c[1], iov, 8, 0), 0);
  assert_int_equal(hr_session_pull(n.c[2], iov, 8, 0), 0);
  assert_true(hr_session_pull(n.c[0], iov, 8, 0) > 0);
  assert_int_equal(lnet_run(&n), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.rec.wire_error, HR_WIRE_CANCELLED);
  assert_int_equal(lnet_streams(&n), 0);
  assert_int_equal(n.errors_c + n.errors_s, 0);
  result_clear(&r);
  hr_tensor_unref(t);
  lnet_close(&n);
}

/* Builds one message into b. */
static size_t enc(const hr_msg *m, uint8_t *b, size_t cap) {
  int64_t k = hr_wire_encode(m, b, cap);
  assert_true(k > 0);
  return (size_t)k;
}

/* Stream ids are per session; requests go on lane 0. */
static void ids_per_session(void **state) {
  (void)state;
  lnet n = {0};
  hr_settings ss = many_shards();
  assert_int_equal(lnet_open(&n, 2, NULL, &ss), 0);
  hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){30, 20}, 1);
  store_put(&n.st, "t", t);
  result r = {0};
  uint32_t sid = 0;
  hr_get_opts o = par_opts("t", 4);
  assert_int_equal(hr_session_get(n.c[1], &o, on_get_done, &r, &sid), 0);
  assert_int_equal(sid, 1);
  assert_int_equal(lnet_run(&n), 0);
  assert_int_equal(r.status, 0);
  result_clear(&r);
  /* The next id follows the block, whichever lane asks. */
  o = get_opts("t");
  assert_int_equal(hr_session_get(n.c[0], &o, on_get_done, &r, &sid), 0);
  assert_int_equal(sid, 5);
  assert_int_equal(lnet_run(&n), 0);
  result_clear(&r);
  /* A request on lane 1: PROTOCOL_VIOLATION on its stream, the lane
   * stays. */
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_REQUEST;
  m.hdr.stream_id = 9;
  m.u.request.key = (const uint8_t *)"t";
  m.u.request.key_len = 1;
  uint8_t b[256];
  size_t len = enc(&m, b, sizeof b);
  assert_int_equal(feed(&n.io, n.s[1], b, len), 0);
  hr_msg out;
  uint8_t ob[4096];
  first_sent(&n, 1, &out, ob, sizeof ob);
  assert_int_equal(out.hdr.type, HR_MSG_ERROR);
  assert_int_equal(out.hdr.stream_id, 9);
  assert_int_equal(out.u.error.code, HR_WIRE_PROTOCOL_VIOLATION);
  assert_true(hr_session_want_read(n.s[1]));
  /* Id 9 is used up for the whole session: on lane 0 it is a reuse. */
  assert_int_equal(feed(&n.io, n.s[0], b, len), 0);
  assert_false(hr_session_want_read(n.s[0]));
  assert_int_equal(n.last_err_s, HR_WIRE_PROTOCOL_VIOLATION);
  hr_tensor_unref(t);
  lnet_close(&n);
}

static void on_answer_later(hr_session *s, uint32_t sid, hr_tensor *t,
                            const hr_transfer_record *rec, void *ud) {
  on_get_done(s, sid, t, rec, ud);
}

/* A lane with no stream of its own does not idle out while the session
 * has work; GOAWAY drains every lane together. */
static void idle_and_drain(void **state) {
  (void)state;
  lnet n = {0};
  hr_settings cs, ss = many_shards();
  hr_settings_default(&cs);
  cs.idle_timeout = 1000000000ull;
  cs.keepalive_interval = 0;
  ss.idle_timeout = 1000000000ull;
  assert_int_equal(lnet_open(&n, 3, &cs, &ss), 0);
  hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){300, 200}, 1);
  store_put(&n.st, "t", t);
  n.st.defer = 1;
  result r = {0};
  hr_get_opts o = par_opts("t", 6);
  assert_int_equal(hr_session_get(n.c[0], &o, on_answer_later, &r, NULL), 0);
  assert_int_equal(lnet_run(&n), 0);
  n.io.now += 5000000000ull;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(hr_session_handle_expiry(n.c[i], n.io.now), 0);
    assert_int_equal(hr_session_handle_expiry(n.s[i], n.io.now), 0);
    assert_true(hr_session_want_read(n.c[i]));
    assert_true(hr_session_want_read(n.s[i]));
  }
  /* The server drains: every lane stays until the answer is through. */
  for (int i = 0; i < 3; i++)
    assert_int_equal(hr_session_shutdown(n.s[i], n.io.now), 0);
  store_answer_pending(&n.st);
  assert_int_equal(lnet_run(&n), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.rec.shards, 6);
  assert_true(same_tensor(r.t, t));
  for (int i = 0; i < 3; i++) {
    assert_false(hr_session_want_read(n.s[i]));
    assert_false(hr_session_want_read(n.c[i]));
  }
  result_clear(&r);
  hr_tensor_unref(t);
  lnet_close(&n);
  /* Without work every lane idles out. */
  lnet m = {0};
  assert_int_equal(lnet_open(&m, 2, &cs, &ss), 0);
  m.io.now += 2000000000ull;
  for (int i = 0; i < 2; i++)
    assert_int_equal(hr_session_handle_expiry(m.s[i], m.io.now), 0);
  assert_int_equal(lnet_run(&m), 0);
  for (int i = 0; i < 2; i++)
    assert_false(hr_session_want_read(m.s[i]));
  lnet_close(&m);
}

/* Lanes deleted in every order, inside callbacks too. */
static hr_session **del_slot;
static void del_in_cb(hr_session *s, uint32_t sid, hr_tensor *t,
                      const hr_transfer_record *rec, void *ud) {
  on_get_done(s, sid, t, rec, ud);
  hr_session_del(*del_slot);
  *del_slot = NULL;
}

static void delete_lanes(void **state) {
  (void)state;
  for (int victim = 0; victim < 3; victim++) {
    lnet n = {0};
    n.use_fm = 1;
    hr_test_failmem_init(&n.fm, -1);
    hr_settings ss = many_shards();
    assert_int_equal(lnet_open(&n, 3, NULL, &ss), 0);
    hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){30, 20}, 1);
    store_put(&n.st, "t", t);
    result r = {0};
    hr_get_opts o = par_opts("t", 3);
    del_slot = &n.c[victim];
    assert_int_equal(hr_session_get(n.c[0], &o, del_in_cb, &r, NULL), 0);
    assert_int_equal(lnet_run(&n), 0);
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.status, 0);
    assert_null(n.c[victim]);
    assert_int_equal(hr_group_open_lanes(n.g), 2);
    result_clear(&r);
    hr_tensor_unref(t);
    /* The group's handle may go before or after its lanes. */
    if (victim == 1) {
      hr_group_del(n.g);
      n.g = NULL;
    }
    lnet_close(&n);
    if (n.fm.live != 0)
      fail_msg("victim %d: %ld blocks leaked", victim, n.fm.live);
  }
}

/* Every allocation of a 2-lane parallel GET fails in turn: the GET
 * either completes or fails, nothing leaks. */
static void failing_allocations(void **state) {
  (void)state;
  hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){64, 50}, 1);
  int done_ok = 0;
  long at = 0;
  for (; at < 4000; at++) {
    lnet n = {0};
    n.use_fm = 1;
    hr_test_failmem_init(&n.fm, -1);
    hr_settings ss = many_shards();
    if (lnet_open(&n, 2, NULL, &ss) || hr_group_lanes(n.g) != 2)
      fail_msg("setup");
    store_put(&n.st, "t", t);
    n.fm.fail_at = n.fm.count + at;
    result r = {0};
    hr_get_opts o = par_opts("t", 4);
    int rv = hr_session_get(n.c[0], &o, on_get_done, &r, NULL);
    if (rv == 0)
      lnet_run(&n);
    int failed = n.fm.failed;
    if (rv == 0 && !failed) {
      assert_int_equal(r.calls, 1);
      assert_int_equal(r.status, 0);
      assert_true(same_tensor(r.t, t));
      done_ok = 1;
    }
    result_clear(&r);
    lnet_close(&n);
    if (n.fm.live != 0)
      fail_msg("fail at %ld: %ld blocks leaked", at, n.fm.live);
    if (!failed)
      break;
  }
  assert_true(done_ok);
  /* Every allocation of the transfer was made to fail once. */
  assert_true(at > 40);
  hr_tensor_unref(t);
}

/* hr_region_slice: tensor-parallel slices. */
static void region_slices(void **state) {
  (void)state;
  uint64_t shape[3] = {10, 7, 3}, off[3], ext[3];
  uint64_t sum = 0;
  for (uint32_t r = 0; r < 4; r++) {
    assert_int_equal(hr_region_slice(3, shape, 0, r, 4, off, ext), 0);
    assert_int_equal(off[0], sum);
    assert_int_equal(ext[0], r < 2 ? 3 : 2);
    assert_int_equal(off[1] + off[2], 0);
    assert_int_equal(ext[1], 7);
    assert_int_equal(ext[2], 3);
    sum += ext[0];
  }
  assert_int_equal(sum, 10);
  /* More ranks than rows: some slices are empty. */
  assert_int_equal(hr_region_slice(3, shape, 2, 4, 5, off, ext), 0);
  assert_int_equal(ext[2], 0);
  assert_int_equal(off[2], 3);
  assert_int_equal(hr_region_slice(3, shape, 3, 0, 1, off, ext),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_region_slice(3, shape, 0, 4, 4, off, ext),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_region_slice(0, shape, 0, 0, 1, off, ext),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_region_slice(3, shape, 0, 0, 0, off, ext),
                   HR_ERR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(join_and_tokens),
      cmocka_unit_test(no_registry_no_lanes),
      cmocka_unit_test(join_refusals),
      cmocka_unit_test(lane_limit),
      cmocka_unit_test(parallel_gets),
      cmocka_unit_test(shards_in_any_order),
      cmocka_unit_test(regions_over_lanes),
      cmocka_unit_test(lane_killed),
      cmocka_unit_test(lane0_lost),
      cmocka_unit_test(cancel_over_lanes),
      cmocka_unit_test(ids_per_session),
      cmocka_unit_test(idle_and_drain),
      cmocka_unit_test(delete_lanes),
      cmocka_unit_test(failing_allocations),
      cmocka_unit_test(region_slices),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
