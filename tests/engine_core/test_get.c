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
    HR_ELEM_BOOL,      HR_ELEM_INT8,          HR_ELEM_UINT8,
    HR_ELEM_INT16,     HR_ELEM_UINT16,        HR_ELEM_INT32,
    HR_ELEM_UINT32,    HR_ELEM_INT64,         HR_ELEM_UINT64,
    HR_ELEM_FLOAT16,   HR_ELEM_BFLOAT16,      HR_ELEM_FLOAT32,
    HR_ELEM_FLOAT64,   HR_ELEM_FLOAT8_E4M3FN, HR_ELEM_FLOAT8_E5M2,
    HR_ELEM_COMPLEX64, HR_ELEM_COMPLEX128,    HR_ELEM_INT4,
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
        hr_tensor *t =
            row_major(all_elems[e], ranks[sh], shapes[sh], e * 31 + sh);
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
      hr_tensor *t =
          dense(HR_ELEM_FLOAT32, layouts[li], 2, shape, NULL, 0, (uint64_t)k);
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

/* Element (i, j) of a rank-2 tensor of 4-byte elements in any dense or
 * STRIDED layout (enough for these tests). */
static uint32_t elem2(hr_tensor *t, uint64_t i, uint64_t j) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  const uint8_t *b = hr_tensor_buffer(t, 0);
  uint64_t idx;
  switch (d->layout.tag) {
  case HR_LAYOUT_ROW_MAJOR:
    idx = i * d->shape[1] + j;
    break;
  case HR_LAYOUT_COLUMN_MAJOR:
    idx = j * d->shape[0] + i;
    break;
  case HR_LAYOUT_STRIDED:
    idx = (uint64_t)((int64_t)d->params.origin +
                     (int64_t)i * d->params.strides[0] +
                     (int64_t)j * d->params.strides[1]);
    break;
  default:
    fail_msg("layout %u", d->layout.tag);
    return 0;
  }
  uint32_t v;
  memcpy(&v, b + idx * 4, 4);
  return v;
}

static void check_region(hr_tensor *got, hr_tensor *src, const uint64_t *off,
                         const uint64_t *shape) {
  const hr_descriptor *d = hr_tensor_descriptor(got);
  assert_int_equal(d->shape[0], shape[0]);
  assert_int_equal(d->shape[1], shape[1]);
  assert_true(d->flags & HR_DESC_HAS_SHARD);
  assert_int_equal(d->shard_offset[0], off[0]);
  assert_int_equal(d->shard_offset[1], off[1]);
  for (uint64_t i = 0; i < shape[0]; i++)
    for (uint64_t j = 0; j < shape[1]; j++)
      assert_int_equal(elem2(got, i, j), elem2(src, off[0] + i, off[1] + j));
}

static void get_regions(void **state) {
  (void)state;
  pair p = {0};
  p.chunked = 1;
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  assert_int_equal(run(&p), 0);
  uint32_t caps = hr_session_peer_hello(p.c)->capability_flags;
  int xc = (caps & HR_CAP_TRANSCODING) != 0;
  if (!(caps & HR_CAP_REGION_REQUESTS)) {
    /* Without the transcode kernels regions are not served at all. */
    hr_tensor *t = row_major(HR_ELEM_UINT32, 2, (uint64_t[]){10, 4}, 1);
    result r = {0};
    hr_get_opts o = get_opts("k");
    o.flags = HR_REQ_REGION;
    o.region_rank = 2;
    o.region_offset = (uint64_t[]){2, 0};
    o.region_shape = (uint64_t[]){5, 4};
    get_one(&p, t, &o, &r);
    assert_int_equal(r.rec.wire_error, HR_WIRE_INVALID_REGION);
    result_clear(&r);
    hr_tensor_unref(t);
    pair_close(&p);
    skip();
  }
  hr_tensor *rm = row_major(HR_ELEM_UINT32, 2, (uint64_t[]){10, 4}, 1);
  hr_layout_params pp;
  memset(&pp, 0, sizeof pp);
  pp.origin = 45;
  pp.strides[0] = -5;
  pp.strides[1] = 1;
  hr_tensor *sd = dense(HR_ELEM_UINT32, HR_LAYOUT_STRIDED, 2,
                        (uint64_t[]){10, 4}, &pp, 0, 2);
  struct {
    hr_tensor *t;
    uint64_t off[2], shape[2];
    int needs_xc;
  } cases[] = {
      {rm, {2, 0}, {5, 4}, 0},  /* a slab: sent without a copy */
      {rm, {0, 0}, {10, 4}, 0}, /* the whole tensor as a region */
      {rm, {3, 1}, {4, 2}, 1},  /* needs the transcode plan's region */
      {rm, {9, 3}, {0, 1}, 0},  /* empty: a slab of no rows? cols cut */
      {sd, {1, 1}, {6, 3}, 0},  /* STRIDED: same bytes, shifted origin */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    result r = {0};
    hr_get_opts o = get_opts("k");
    o.flags = HR_REQ_REGION;
    o.region_rank = 2;
    o.region_offset = cases[i].off;
    o.region_shape = cases[i].shape;
    get_one(&p, cases[i].t, &o, &r);
    int empty = cases[i].shape[0] == 0;
    if (cases[i].needs_xc && !xc) {
      assert_int_equal(r.rec.wire_error, HR_WIRE_INVALID_REGION);
    } else if (!empty || xc || r.status == 0) {
      if (r.status)
        fail_msg("case %zu: %s", i, r.rec.message);
      check_region(r.t, cases[i].t, cases[i].off, cases[i].shape);
    }
    result_clear(&r);
  }
  /* Outside the tensor, and a rank that differs. */
  result r = {0};
  hr_get_opts o = get_opts("k");
  o.flags = HR_REQ_REGION;
  o.region_rank = 2;
  o.region_offset = (uint64_t[]){8, 0};
  o.region_shape = (uint64_t[]){3, 4};
  get_one(&p, rm, &o, &r);
  assert_int_equal(r.rec.wire_error, HR_WIRE_INVALID_REGION);
  result_clear(&r);
  o.region_rank = 1;
  get_one(&p, rm, &o, &r);
  assert_int_equal(r.rec.wire_error, HR_WIRE_INVALID_REGION);
  result_clear(&r);
  /* REGION + PARALLEL_OK on a big tensor: shards tile the region. */
  hr_tensor *big = row_major(HR_ELEM_UINT32, 2, (uint64_t[]){3000, 4096}, 3);
  o.region_rank = 2;
  o.region_offset = (uint64_t[]){100, 0};
  o.region_shape = (uint64_t[]){2500, 4096};
  o.flags = HR_REQ_REGION | HR_REQ_PARALLEL_OK;
  o.max_shards = 8;
  p.chunked = 0;
  p.zero_copy = 1;
  get_one(&p, big, &o, &r);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.rec.shards, 3);
  assert_int_equal(memcmp(hr_tensor_buffer(r.t, 0),
                          (uint8_t *)hr_tensor_buffer(big, 0) + 100 * 4096 * 4,
                          2500 * 4096 * 4),
                   0);
  const hr_descriptor *d = hr_tensor_descriptor(r.t);
  assert_true(d->flags & HR_DESC_HAS_SHARD);
  assert_int_equal(d->parent_shape[0], 3000);
  assert_int_equal(d->shard_offset[0], 100);
  result_clear(&r);
  hr_tensor_unref(big);
  hr_tensor_unref(rm);
  hr_tensor_unref(sd);
  pair_close(&p);
}

/* Shards cut the way another server might: along an inner dim, or
 * non-contiguous in the parent; the client places them run by run. */
typedef struct fake {
  uint8_t b[8192];
  size_t n;
} fake;

static void fake_msg(fake *f, const hr_msg *m) {
  int64_t n = hr_wire_encode(m, f->b + f->n, sizeof f->b - f->n);
  assert_true(n > 0);
  f->n += (size_t)n;
}

static void fake_shard(fake *f, uint32_t sid, uint8_t layout, uint16_t index,
                       uint16_t total, const uint64_t *parent,
                       const uint64_t *off, const uint64_t *shape,
                       const uint8_t *src_parent) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DESCRIPTOR;
  m.hdr.stream_id = sid;
  hr_descriptor *d = &m.u.tensor.desc;
  d->descriptor_version = 1;
  d->element_type = HR_ELEM_UINT8;
  d->rank = 2;
  d->flags = HR_DESC_HAS_SHARD;
  d->layout.tag = layout;
  uint64_t bytes = shape[0] * shape[1];
  for (int k = 0; k < 2; k++) {
    d->shape[k] = shape[k];
    d->parent_shape[k] = parent[k];
    d->shard_offset[k] = off[k];
  }
  d->buffer_count = 1;
  d->buffers[0].size_bytes = bytes;
  m.u.tensor.xport.total_data_bytes = bytes;
  m.u.tensor.xport.shard_index = index;
  m.u.tensor.xport.total_shards = total;
  fake_msg(f, &m);
  /* The shard's bytes in its own layout, from the parent's row-major
   * elements; two frames. */
  uint8_t data[256];
  for (uint64_t i = 0; i < shape[0]; i++)
    for (uint64_t j = 0; j < shape[1]; j++) {
      uint8_t v = src_parent[(off[0] + i) * parent[1] + off[1] + j];
      if (layout == HR_LAYOUT_ROW_MAJOR)
        data[i * shape[1] + j] = v;
      else
        data[j * shape[0] + i] = v;
    }
  uint32_t half = (uint32_t)bytes / 2;
  assert_int_equal(hr_wire_encode_data_prefix(f->b + f->n, sid, 0, 0, half),
                   24);
  f->n += 24;
  memcpy(f->b + f->n, data, half);
  f->n += half;
  assert_int_equal(hr_wire_encode_data_prefix(f->b + f->n, sid, 0, half,
                                              (uint32_t)bytes - half),
                   24);
  f->n += 24;
  memcpy(f->b + f->n, data + half, bytes - half);
  f->n += bytes - half;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DATA_END;
  m.hdr.stream_id = sid;
  fake_msg(f, &m);
}

static void get_foreign_shards(void **state) {
  (void)state;
  uint8_t parent[4 * 6];
  for (int i = 0; i < 24; i++)
    parent[i] = (uint8_t)(i * 7 + 1);
  static const struct {
    uint8_t layout;
    uint64_t off0[2], shape0[2], off1[2], shape1[2];
  } cases[] = {
      {HR_LAYOUT_ROW_MAJOR, {0, 0}, {4, 3}, {0, 3}, {4, 3}},
      {HR_LAYOUT_COLUMN_MAJOR, {0, 0}, {1, 6}, {1, 0}, {3, 6}},
      {HR_LAYOUT_COLUMN_MAJOR, {0, 0}, {4, 2}, {0, 2}, {4, 4}},
  };
  for (int zc = 0; zc < 2; zc++)
    for (size_t ci = 0; ci < 3; ci++) {
      pair p = {0};
      p.zero_copy = zc;
      p.chunked = 1;
      assert_int_equal(pair_open(&p, NULL, NULL), 0);
      /* Only the client: the server session is bypassed. */
      hr_session_del(p.s);
      p.s = NULL;
      fake f = {{0}, 0};
      hr_msg m;
      memset(&m, 0, sizeof m);
      m.hdr.type = HR_MSG_SERVER_HELLO;
      hr_hello *h = &m.u.hello;
      h->magic = HR_MAGIC;
      h->version_major = 1;
      h->max_message_size = 1 << 20;
      h->layout_count = 2;
      h->layouts[0].tag = HR_LAYOUT_ROW_MAJOR;
      h->layouts[1].tag = HR_LAYOUT_COLUMN_MAJOR;
      fake_msg(&f, &m);
      assert_true(pump(&p, p.c, NULL) > 0);
      result r = {0};
      hr_get_opts o = get_opts("x");
      o.flags = HR_REQ_PARALLEL_OK;
      o.max_shards = 2;
      assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r, NULL), 0);
      const uint64_t par[2] = {4, 6};
      /* Shard 1 first: order across streams is free. */
      fake_shard(&f, 2, cases[ci].layout, 1, 2, par, cases[ci].off1,
                 cases[ci].shape1, parent);
      fake_shard(&f, 1, cases[ci].layout, 0, 2, par, cases[ci].off0,
                 cases[ci].shape0, parent);
      assert_int_equal(feed(&p, p.c, f.b, f.n), 0);
      assert_int_equal(r.calls, 1);
      if (r.status)
        fail_msg("case %zu: %s", ci, r.rec.message);
      const hr_descriptor *d = hr_tensor_descriptor(r.t);
      assert_int_equal(d->layout.tag, cases[ci].layout);
      assert_int_equal(d->shape[0], 4);
      assert_int_equal(d->shape[1], 6);
      const uint8_t *b = hr_tensor_buffer(r.t, 0);
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) {
          uint8_t v = cases[ci].layout == HR_LAYOUT_ROW_MAJOR ? b[i * 6 + j]
                                                              : b[j * 4 + i];
          assert_int_equal(v, parent[i * 6 + j]);
        }
      result_clear(&r);
      pair_close(&p);
    }
}

/* A composite torn by the server's ERROR: strict clients report only the
 * error; permissive ones also hand out the members that arrived, never
 * as a composite. */
static void get_torn_composite(void **state) {
  (void)state;
  for (int strict = 0; strict < 2; strict++) {
    hr_settings cs;
    hr_settings_default(&cs);
    cs.strict_composites = strict;
    pair p = {0};
    assert_int_equal(pair_open(&p, &cs, NULL), 0);
    hr_session_del(p.s);
    p.s = NULL;
    fake f = {{0}, 0};
    hr_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = HR_MSG_SERVER_HELLO;
    m.u.hello.magic = HR_MAGIC;
    m.u.hello.version_major = 1;
    m.u.hello.max_message_size = 1 << 20;
    m.u.hello.layout_count = 2;
    m.u.hello.layouts[0].tag = HR_LAYOUT_ROW_MAJOR;
    m.u.hello.layouts[1].tag = HR_LAYOUT_COMPOSITE;
    fake_msg(&f, &m);
    assert_true(pump(&p, p.c, NULL) > 0);
    result r = {0};
    hr_get_opts o = get_opts("x");
    assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r, NULL), 0);
    /* Head: TUPLE of 2, then member 0 whole, member 1 cut by ERROR. */
    memset(&m, 0, sizeof m);
    m.hdr.type = HR_MSG_TENSOR_DESCRIPTOR;
    m.hdr.stream_id = 1;
    m.u.tensor.desc.descriptor_version = 1;
    m.u.tensor.desc.element_type = HR_ELEM_NONE;
    m.u.tensor.desc.layout.tag = HR_LAYOUT_COMPOSITE;
    m.u.tensor.desc.params.member_count = 2;
    m.u.tensor.desc.params.rule = HR_COMPOSITE_TUPLE;
    m.u.tensor.xport.total_shards = 1;
    fake_msg(&f, &m);
    hr_msg e;
    memset(&e, 0, sizeof e);
    e.hdr.type = HR_MSG_TENSOR_DATA_END;
    e.hdr.stream_id = 1;
    fake_msg(&f, &e);
    for (int i = 0; i < 2; i++) {
      memset(&m, 0, sizeof m);
      m.hdr.type = HR_MSG_TENSOR_DESCRIPTOR;
      m.hdr.stream_id = 1;
      hr_descriptor *d = &m.u.tensor.desc;
      d->descriptor_version = 1;
      d->element_type = HR_ELEM_UINT8;
      d->rank = 1;
      d->shape[0] = 4;
      d->layout.tag = HR_LAYOUT_ROW_MAJOR;
      d->buffer_count = 1;
      d->buffers[0].size_bytes = 4;
      m.u.tensor.xport.total_data_bytes = 4;
      m.u.tensor.xport.total_shards = 1;
      fake_msg(&f, &m);
      assert_int_equal(hr_wire_encode_data_prefix(f.b + f.n, 1, 0, 0, 2), 24);
      f.n += 24;
      f.b[f.n++] = (uint8_t)(10 + i);
      f.b[f.n++] = (uint8_t)(20 + i);
      if (i == 0) {
        assert_int_equal(hr_wire_encode_data_prefix(f.b + f.n, 1, 0, 2, 2), 24);
        f.n += 24;
        f.b[f.n++] = 30;
        f.b[f.n++] = 40;
        fake_msg(&f, &e);
      }
    }
    memset(&m, 0, sizeof m);
    m.hdr.type = HR_MSG_ERROR;
    m.hdr.stream_id = 1;
    m.u.error.code = HR_WIRE_INTERNAL;
    fake_msg(&f, &m);
    assert_int_equal(feed(&p, p.c, f.b, f.n), 0);
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.status, HR_ERR_REMOTE);
    assert_null(r.t);
    assert_int_equal(r.partial, strict ? 0 : 1);
    result_clear(&r);
    pair_close(&p);
  }
}

/* max_streams: the server refuses a stream above it. */
static void get_max_streams(void **state) {
  (void)state;
  hr_settings ss;
  hr_settings_default(&ss);
  ss.max_streams = 2;
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, &ss), 0);
  p.st.defer = 1;
  result r[3];
  memset(r, 0, sizeof r);
  for (int i = 0; i < 3; i++) {
    hr_get_opts o = get_opts("k");
    assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r[i], NULL), 0);
  }
  assert_int_equal(run(&p), 0);
  assert_int_equal(r[2].calls, 1);
  assert_int_equal(r[2].rec.wire_error, HR_WIRE_RESOURCE_EXHAUSTED);
  assert_int_equal(r[0].calls + r[1].calls, 0);
  assert_int_equal(p.st.npending, 2);
  pair_close(&p);
  assert_int_equal(r[0].calls, 1);
  assert_int_equal(r[0].status, HR_ERR_CLOSED);
}

/* The provider refuses the client at HELLO time. */
static void hello_refused(void **state) {
  (void)state;
  pair p = {0};
  p.st.refuse_hello = HR_WIRE_UNAUTHORIZED;
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  result r = {0};
  hr_get_opts o = get_opts("k");
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r, NULL), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(p.errors_c, 1);
  assert_int_equal(p.last_err_c, HR_WIRE_UNAUTHORIZED);
  assert_int_equal(p.err_sent_c, 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, HR_ERR_REMOTE);
  assert_int_equal(r.rec.wire_error, HR_WIRE_UNAUTHORIZED);
  assert_false(hr_session_want_read(p.c));
  assert_false(hr_session_want_read(p.s));
  pair_close(&p);
}

/* hr_session_del from inside a completion is deferred. */
static pair *del_pair;
static int del_calls;
static void del_in_cb(hr_session *s, uint32_t sid, hr_tensor *t,
                      const hr_transfer_record *rec, void *ud) {
  del_calls++;
  hr_tensor_unref(t);
  hr_session_del(s);
  /* Still alive until the outermost call returns. */
  assert_int_equal(hr_session_role(s), HR_ROLE_CLIENT);
  assert_int_equal(hr_session_recv(s, NULL, 0, 0), HR_ERR_IN_CALLBACK);
}

static void del_from_callback(void **state) {
  (void)state;
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  hr_tensor *t = row_major(HR_ELEM_UINT8, 1, (uint64_t[]){10}, 1);
  store_put(&p.st, "k", t);
  del_pair = &p;
  del_calls = 0;
  assert_int_equal(run(&p), 0);
  hr_get_opts o = get_opts("k");
  assert_int_equal(hr_session_get(p.c, &o, del_in_cb, NULL, NULL), 0);
  assert_int_equal(hr_session_get(p.c, &o, del_in_cb, NULL, NULL), 0);
  /* Both requests reach the server, which answers both. */
  assert_true(pump(&p, p.c, p.s) > 0);
  /* Deliver both answers in one call: the first completion deletes the
   * session, which stays alive until that call returns; the second GET
   * still completes, once. */
  hr_iov iov[64];
  int n = hr_session_pull(p.s, iov, 64, 0);
  size_t tot = 0;
  uint8_t buf[4096];
  for (int i = 0; i < n; i++) {
    memcpy(buf + tot, iov[i].base, iov[i].len);
    tot += iov[i].len;
  }
  assert_int_equal(hr_session_recv(p.c, buf, tot, 0), (int64_t)tot);
  assert_int_equal(del_calls, 2);
  p.c = NULL;
  hr_tensor_unref(t);
  pair_close(&p);
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
      cmocka_unit_test(get_regions),
      cmocka_unit_test(get_foreign_shards),
      cmocka_unit_test(get_torn_composite),
      cmocka_unit_test(get_max_streams),
      cmocka_unit_test(hello_refused),
      cmocka_unit_test(del_from_callback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
