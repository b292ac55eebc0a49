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


static const uint8_t all_elems[] = {
    HR_ELEM_BOOL,     HR_ELEM_INT8,          HR_ELEM_UINT8,
    HR_ELEM_INT16,    HR_ELEM_UINT16,        HR_ELEM_INT32,
    HR_ELEM_UINT32,   HR_ELEM_INT64,         HR_ELEM_UINT64,
    HR_ELEM_FLOAT16,  HR_ELEM_BFLOAT16,      HR_ELEM_FLOAT32,
    HR_ELEM_FLOAT64,  HR_ELEM_FLOAT8_E4M3FN, HR_ELEM_FLOAT8_E5M2,
    HR_ELEM_COMPLEX64, HR_ELEM_COMPLEX128,   HR_ELEM_INT4,
    HR_ELEM_UINT4};

/* Every element type, ROW_MAJOR, several shapes (scalar, empty, odd). */
static void get_every_element_type(void **state) {
  (void)state;
  static const uint64_t shapes[][3] = {{0}, {7}, {0, 3}, {3, 5, 2}};
  static const unsigned ranks[] = {0, 1, 2, 3};
  for (int mode = 0; mode < 4; mode++) {
    pair p = {0};
    p.chunked = mode & 1;
    p.zero_copy = mode >> 1;
    assert_int_equal(pair_open(&p, NULL, NULL), 0);
    for (size_t e = 0; e < sizeof all_elems; e++)
      for (size_t sh = 0; sh < 4; sh++) {
        hr_tensor *t = row_major(all_elems[e], ranks[sh], shapes[sh],
                                 e * 31 + sh);
        assert_non_null(t);
        result r = {0};
        hr_get_opts o = get_opts("k");
        get_one(&p, t, &o, &r);
        assert_int_equal(r.status, 0);
        assert_true(same_tensor(r.t, t));
        result_clear(&r);
        hr_tensor_unref(t);
      }
    pair_close(&p);
  }
}

/* Every layout, sent natively (the client asks for nothing). */
static void get_every_layout_native(void **state) {
  (void)state;
  hr_layout_params pp;
  hr_tensor *ts[12];
  int n = 0;
  uint64_t s2[2] = {6, 4};
  ts[n++] = dense(HR_ELEM_FLOAT32, HR_LAYOUT_COLUMN_MAJOR, 2, s2, NULL, 0, 1);
  memset(&pp, 0, sizeof pp);
  pp.order[0] = 1;
  pp.order[1] = 0;
  ts[n++] = dense(HR_ELEM_INT16, HR_LAYOUT_PERMUTED, 2, s2, &pp, 0, 2);
  memset(&pp, 0, sizeof pp);
  pp.tile[0] = 4;
  pp.tile[1] = 3;
  ts[n++] = dense(HR_ELEM_FLOAT64, HR_LAYOUT_TILED, 2, s2, &pp, 0, 3);
  ts[n++] = dense(HR_ELEM_FLOAT32, HR_LAYOUT_PANEL, 2, (uint64_t[]){10, 3},
                  NULL, 4, 4);
  memset(&pp, 0, sizeof pp);
  pp.origin = 3;
  pp.strides[0] = 1;
  pp.strides[1] = 8;
  ts[n++] = dense(HR_ELEM_UINT8, HR_LAYOUT_STRIDED, 2, s2, &pp, 0, 5);
  memset(&pp, 0, sizeof pp);
  pp.nnz = 5;
  pp.index_type = HR_ELEM_INT64;
  ts[n++] = dense(HR_ELEM_FLOAT32, HR_LAYOUT_SPARSE_COO, 2, s2, &pp, 0, 6);
  memset(&pp, 0, sizeof pp);
  pp.nnz = 4;
  pp.index_type = HR_ELEM_INT32;
  ts[n++] = dense(HR_ELEM_FLOAT32, HR_LAYOUT_SPARSE_CSR, 2, s2, &pp, 0, 7);
  ts[n++] = dense(HR_ELEM_FLOAT32, HR_LAYOUT_SPARSE_CSC, 2, s2, &pp, 0, 8);
  memset(&pp, 0, sizeof pp);
  pp.nnz = 2;
  pp.br = 2;
  pp.bc = 2;
  pp.index_type = HR_ELEM_INT32;
  ts[n++] = dense(HR_ELEM_FLOAT32, HR_LAYOUT_SPARSE_BSR, 2, s2, &pp, 0, 9);
  for (int mode = 0; mode < 4; mode++) {
    pair p = {0};
    p.chunked = mode & 1;
    p.zero_copy = mode >> 1;
    assert_int_equal(pair_open(&p, NULL, NULL), 0);
    for (int i = 0; i < n; i++) {
      assert_non_null(ts[i]);
      result r = {0};
      hr_get_opts o = get_opts("k");
      get_one(&p, ts[i], &o, &r);
      assert_int_equal(r.status, 0);
      assert_true(same_tensor(r.t, ts[i]));
      assert_int_equal(r.rec.layout, hr_tensor_descriptor(ts[i])->layout.tag);
      result_clear(&r);
    }
    pair_close(&p);
  }
  for (int i = 0; i < n; i++)
    hr_tensor_unref(ts[i]);
}

/* Many frames: small frame size, several buffers, iovec limits. */
static void get_many_frames(void **state) {
  (void)state;
  hr_settings ss;
  hr_settings_default(&ss);
  ss.frame_data_size = 1000;
  for (int mode = 0; mode < 4; mode++) {
    pair p = {0};
    p.chunked = mode & 1;
    p.zero_copy = mode >> 1;
    p.iov_max = mode == 3 ? 1 : 7;
    assert_int_equal(pair_open(&p, NULL, &ss), 0);
    hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){100003}, 77);
    result r = {0};
    hr_get_opts o = get_opts("k");
    get_one(&p, t, &o, &r);
    assert_int_equal(r.status, 0);
    assert_true(same_tensor(r.t, t));
    result_clear(&r);
    hr_layout_params pp;
    memset(&pp, 0, sizeof pp);
    pp.nnz = 3000;
    pp.index_type = HR_ELEM_INT64;
    hr_tensor *sp = dense(HR_ELEM_FLOAT64, HR_LAYOUT_SPARSE_CSR, 2,
                          (uint64_t[]){500, 400}, &pp, 0, 78);
    get_one(&p, sp, &o, &r);
    assert_int_equal(r.status, 0);
    assert_true(same_tensor(r.t, sp));
    result_clear(&r);
    hr_tensor_unref(sp);
    hr_tensor_unref(t);
    pair_close(&p);
  }
}

static void get_not_found(void **state) {
  (void)state;
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  result r = {0};
  hr_get_opts o = get_opts("missing");
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r, NULL), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, HR_ERR_REMOTE);
  assert_int_equal(r.rec.wire_error, HR_WIRE_NOT_FOUND);
  assert_int_equal(r.rec.wire_error_sent, 0);
  assert_string_equal(r.rec.message, "no such tensor");
  assert_null(r.t);
  assert_int_equal(p.last_srv_rec.wire_error, HR_WIRE_NOT_FOUND);
  assert_int_equal(p.last_srv_rec.wire_error_sent, 1);
  pair_close(&p);
}

/* Requests queued before the handshake go once it completes; a deferred
 * answer (after on_get returned) works too. */
static void get_before_handshake_and_deferred(void **state) {
  (void)state;
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  p.st.defer = 1;
  hr_tensor *t = row_major(HR_ELEM_INT32, 1, (uint64_t[]){9}, 3);
  store_put(&p.st, "a", t);
  result r1 = {0}, r2 = {0};
  hr_get_opts o = get_opts("a");
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r1, NULL), 0);
  o = get_opts("b");
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r2, NULL), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(p.st.npending, 2);
  assert_int_equal(r1.calls + r2.calls, 0);
  store_answer_pending(&p.st);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r1.calls, 1);
  assert_int_equal(r1.status, 0);
  assert_true(same_tensor(r1.t, t));
  assert_int_equal(r2.calls, 1);
  assert_int_equal(r2.rec.wire_error, HR_WIRE_NOT_FOUND);
  result_clear(&r1);
  result_clear(&r2);
  hr_tensor_unref(t);
  pair_close(&p);
}

/* The application's buffer: used in place; too small refuses locally. */
static int dest_released;
static void dest_release(void *ctx) { dest_released += *(int *)ctx; }

static void get_into_app_buffer(void **state) {
  (void)state;
  pair p = {0};
  p.zero_copy = 1;
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  hr_tensor *t = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){4, 4}, 11);
  static uint8_t buf[4096] __attribute__((aligned(64)));
  int one = 1;
  hr_get_dest dest = {buf, sizeof buf, dest_release, &one};
  result r = {0};
  hr_get_opts o = get_opts("k");
  o.dest = &dest;
  o.min_alignment_log2 = 6;
  dest_released = 0;
  get_one(&p, t, &o, &r);
  assert_int_equal(r.status, 0);
  assert_true(same_tensor(r.t, t));
  assert_ptr_equal(hr_tensor_buffer(r.t, 0), buf);
  assert_int_equal(dest_released, 0);
  result_clear(&r);
  assert_int_equal(dest_released, 1);
  /* Too small: RESOURCE_EXHAUSTED locally, the server is told. */
  hr_get_dest small = {buf, 63, dest_release, &one};
  o.dest = &small;
  get_one(&p, t, &o, &r);
  assert_int_equal(r.status, HR_ERR_LIMIT);
  assert_int_equal(r.rec.wire_error, HR_WIRE_RESOURCE_EXHAUSTED);
  assert_int_equal(r.rec.wire_error_sent, 1);
  assert_null(r.t);
  assert_int_equal(dest_released, 1);
  result_clear(&r);
  /* The connection is still fine. */
  o.dest = NULL;
  get_one(&p, t, &o, &r);
  assert_int_equal(r.status, 0);
  assert_int_equal((uintptr_t)hr_tensor_buffer(r.t, 0) % 64, 0);
  result_clear(&r);
  hr_tensor_unref(t);
  pair_close(&p);
}

/* PARALLEL_OK: N = min(K, MAX_SHARDS, ceil(bytes / 16 MiB)) shards along
 * the outermost stored dim, reassembled in one buffer. */
static void get_parallel_shards(void **state) {
  (void)state;
  static const uint8_t layouts[] = {HR_LAYOUT_ROW_MAJOR,
                                    HR_LAYOUT_COLUMN_MAJOR};
  for (int li = 0; li < 2; li++)
    for (int k = 1; k <= 4; k++) {
      pair p = {0};
      p.zero_copy = 1;
      assert_int_equal(pair_open(&p, NULL, NULL), 0);
      /* 2100 x 4100 float32 = 34.4 MB: 3 shards at most. */
      uint64_t shape[2] = {2100, 4100};
      if (layouts[li] == HR_LAYOUT_COLUMN_MAJOR) {
        shape[0] = 4100;
        shape[1] = 2100;
      }
      hr_tensor *t = dense(HR_ELEM_FLOAT32, layouts[li], 2, shape, NULL, 0,
                           (uint64_t)k);
      result r = {0};
      hr_get_opts o = get_opts("k");
      o.flags = HR_REQ_PARALLEL_OK;
      o.max_shards = (uint16_t)k;
      get_one(&p, t, &o, &r);
      assert_int_equal(r.status, 0);
      assert_int_equal(r.rec.shards, k < 3 ? k : 3);
      if (k > 1) {
        assert_true(same_tensor(r.t, t));
        assert_false(hr_tensor_descriptor(r.t)->flags & HR_DESC_HAS_SHARD);
      } else {
        /* One shard: the tensor itself, marked as a shard of itself. */
        assert_true(hr_tensor_descriptor(r.t)->flags & HR_DESC_HAS_SHARD);
        assert_int_equal(memcmp(hr_tensor_buffer(r.t, 0),
                                hr_tensor_buffer(t, 0), hr_tensor_bytes(t)),
                         0);
      }
      assert_int_equal(hr_session_stream_count(p.s), 0);
      result_clear(&r);
      hr_tensor_unref(t);
      pair_close(&p);
    }
}

/* A composite: head + members pre-order, nested. */
static void get_composite(void **state) {
  (void)state;
  hr_tensor *a = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){2, 3}, 1);
  hr_tensor *b = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){5, 3}, 2);
  hr_tensor *e = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){0, 3}, 3);
  hr_tensor *m3[3] = {a, b, e};
  hr_descriptor h;
  desc_init(&h, HR_ELEM_FLOAT32, HR_LAYOUT_COMPOSITE, 2, (uint64_t[]){7, 3});
  h.params.member_count = 3;
  h.params.rule = HR_COMPOSITE_CONCAT;
  h.params.axis = 0;
  hr_tensor *cat = NULL;
  assert_int_equal(hr_tensor_new_composite(&cat, &h, m3, 3, NULL, NULL), 0);
  hr_tensor *c = row_major(HR_ELEM_INT8, 1, (uint64_t[]){4}, 4);
  hr_tensor *m2[2] = {cat, c};
  desc_init(&h, HR_ELEM_NONE, HR_LAYOUT_COMPOSITE, 0, NULL);
  h.params.member_count = 2;
  h.params.rule = HR_COMPOSITE_TUPLE;
  hr_tensor *tup = NULL;
  assert_int_equal(hr_tensor_new_composite(&tup, &h, m2, 2, NULL, NULL), 0);
  for (int mode = 0; mode < 4; mode++) {
    pair p = {0};
    p.chunked = mode & 1;
    p.zero_copy = mode >> 1;
    assert_int_equal(pair_open(&p, NULL, NULL), 0);
    result r = {0};
    hr_get_opts o = get_opts("k");
    /* PARALLEL_OK on a composite: answered unsharded. */
    o.flags = HR_REQ_PARALLEL_OK;
    o.max_shards = 4;
    get_one(&p, tup, &o, &r);
    assert_int_equal(r.status, 0);
    assert_true(same_tensor(r.t, tup));
    assert_int_equal(hr_tensor_member_count(r.t), 2);
    assert_int_equal(hr_tensor_member_count(hr_tensor_member(r.t, 0)), 3);
    result_clear(&r);
    /* Into one application buffer. */
    static uint8_t buf[1024];
    hr_get_dest dest = {buf, sizeof buf, NULL, NULL};
    o.dest = &dest;
    get_one(&p, tup, &o, &r);
    assert_int_equal(r.status, 0);
    assert_true(same_tensor(r.t, tup));
    result_clear(&r);
    /* REGION on a composite: INVALID_REGION. */
    o.dest = NULL;
    o.flags = HR_REQ_REGION;
    o.region_rank = 0;
    uint64_t z[1] = {0};
    o.region_offset = z;
    o.region_shape = z;
    get_one(&p, tup, &o, &r);
    assert_int_equal(r.status, HR_ERR_REMOTE);
    assert_int_equal(r.rec.wire_error, HR_WIRE_INVALID_REGION);
    result_clear(&r);
    pair_close(&p);
  }
  hr_tensor_unref(tup);
  hr_tensor_unref(cat);
  hr_tensor_unref(a);
  hr_tensor_unref(b);
  hr_tensor_unref(c);
  hr_tensor_unref(e);
}

/* Device selection (seeds rules 1-5). */
static void get_devices(void **state) {
  (void)state;
  hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){5}, 1);
  /* Rule 3: CUDA not advertised by the server: DEVICE_UNAVAILABLE. */
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  result r = {0};
  hr_get_opts o = get_opts("k");
  o.preferred_device = HR_DEV_CUDA;
  get_one(&p, t, &o, &r);
  assert_int_equal(r.rec.wire_error, HR_WIRE_DEVICE_UNAVAILABLE);
  result_clear(&r);
  pair_close(&p);
  /* Rule 4: advertised but unavailable now, client advertised CPU: CPU. */
  static const uint8_t srv_devs[2] = {HR_DEV_CPU, HR_DEV_CUDA};
  static const uint8_t cli_devs[2] = {HR_DEV_CUDA, HR_DEV_CPU};
  hr_settings ss, cs;
  hr_settings_default(&ss);
  hr_settings_default(&cs);
  ss.devices = srv_devs;
  ss.device_count = 2;
  cs.devices = cli_devs;
  cs.device_count = 2;
  memset(&p, 0, sizeof p);
  assert_int_equal(pair_open(&p, &cs, &ss), 0);
  get_one(&p, t, &o, &r);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.rec.device, HR_DEV_CPU);
  assert_string_not_equal(r.rec.fallback, "");
  assert_string_not_equal(p.last_srv_rec.fallback, "");
  result_clear(&r);
  pair_close(&p);
  /* ... but without CPU in the client's list: DEVICE_UNAVAILABLE. */
  cs.devices = cli_devs;
  cs.device_count = 1;
  memset(&p, 0, sizeof p);
  assert_int_equal(pair_open(&p, &cs, &ss), 0);
  get_one(&p, t, &o, &r);
  assert_int_equal(r.rec.wire_error, HR_WIRE_DEVICE_UNAVAILABLE);
  result_clear(&r);
  pair_close(&p);
  /* Rule 2: CPU preferred, the server does not serve CPU. */
  static const uint8_t cuda_only[1] = {HR_DEV_CUDA};
  ss.devices = cuda_only;
  ss.device_count = 1;
  memset(&p, 0, sizeof p);
  assert_int_equal(pair_open(&p, NULL, &ss), 0);
  o.preferred_device = HR_DEV_CPU;
  get_one(&p, t, &o, &r);
  assert_int_equal(r.rec.wire_error, HR_WIRE_DEVICE_UNAVAILABLE);
  result_clear(&r);
  pair_close(&p);
  hr_tensor_unref(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(handshake),
      cmocka_unit_test(get_small_row_major),
      cmocka_unit_test(get_every_element_type),
      cmocka_unit_test(get_every_layout_native),
      cmocka_unit_test(get_many_frames),
      cmocka_unit_test(get_not_found),
      cmocka_unit_test(get_before_handshake_and_deferred),
      cmocka_unit_test(get_into_app_buffer),
      cmocka_unit_test(get_parallel_shards),
      cmocka_unit_test(get_composite),
      cmocka_unit_test(get_devices),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
