/* Transcoded GETs: layout selection (seeds § Server Layout Selection,
 * wire-v1 § 5.1), streamed chunks through hr_work with a bounded window,
 * sparse targets and the memory limit, transcoded shards and regions.
 * Built only when the transcode kernels are part of the library. */
#include <hurray/transcode.h>

#include "engine_core/harness.h"

/* The logical tensor of `t` as row-major bytes (via the kernels). */
static uint8_t *logical(hr_tensor *t, uint64_t *size) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  if (d->layout.tag == HR_LAYOUT_ROW_MAJOR) {
    *size = d->buffers[0].size_bytes;
    uint8_t *b = malloc(*size + 1);
    memcpy(b, hr_tensor_buffer(t, 0), *size);
    return b;
  }
  hr_xc_tensor src;
  memset(&src, 0, sizeof src);
  src.desc = d;
  for (unsigned k = 0; k < d->buffer_count; k++) {
    src.buffers[k] = hr_tensor_buffer(t, k);
    src.sizes[k] = d->buffers[k].size_bytes;
  }
  hr_xc_target tg;
  memset(&tg, 0, sizeof tg);
  tg.layout = HR_LAYOUT_ROW_MAJOR;
  hr_xc_plan *p = NULL;
  hr_wire_status st;
  if (hr_xc_plan_new(&p, &src, &tg, NULL, NULL, NULL, &st))
    fail_msg("plan: %s", st.reason);
  *size = hr_xc_plan_out_size(p);
  uint8_t *b = malloc(*size + 1);
  assert_int_equal(hr_xc_run(p, 0, *size, b), 0);
  hr_xc_plan_del(p);
  return b;
}

static void same_logical(hr_tensor *a, hr_tensor *b) {
  uint64_t na, nb;
  uint8_t *x = logical(a, &na), *y = logical(b, &nb);
  assert_int_equal(na, nb);
  assert_int_equal(memcmp(x, y, na), 0);
  free(x);
  free(y);
}

static int has_xc(pair *p) {
  const hr_hello *h = hr_session_peer_hello(p->c);
  return h && (h->capability_flags & HR_CAP_TRANSCODING);
}

static void get_with(pair *p, hr_tensor *t, const hr_layout_entry *prefs,
                     uint16_t n, uint32_t flags, result *r) {
  store_put(&p->st, "k", t);
  hr_get_opts o = get_opts("k");
  o.layouts = prefs;
  o.layout_count = n;
  o.flags = flags;
  o.max_shards = 8;
  assert_int_equal(hr_session_get(p->c, &o, on_get_done, r, NULL), 0);
  assert_int_equal(run(p), 0);
  assert_int_equal(r->calls, 1);
}

static hr_layout_entry tag(uint8_t t) {
  hr_layout_entry e = {t, 0, NULL};
  return e;
}

/* A CSR matrix with valid data: row i has a value at column (i*3)%cols
 * when i is even. */
static hr_tensor *csr(uint64_t rows, uint64_t cols) {
  uint64_t nnz = (rows + 1) / 2;
  hr_layout_params pp;
  memset(&pp, 0, sizeof pp);
  pp.nnz = nnz;
  pp.index_type = HR_ELEM_INT32;
  hr_tensor *t = dense(HR_ELEM_FLOAT32, HR_LAYOUT_SPARSE_CSR, 2,
                       (uint64_t[]){rows, cols}, &pp, 0, 1);
  int32_t *indptr = hr_tensor_buffer(t, 0);
  int32_t *idx = hr_tensor_buffer(t, 1);
  float *val = hr_tensor_buffer(t, 2);
  int32_t k = 0;
  for (uint64_t i = 0; i < rows; i++) {
    indptr[i] = k;
    if (i % 2 == 0) {
      idx[k] = (int32_t)((i * 3) % cols);
      val[k] = (float)i + 0.5f;
      k++;
    }
  }
  indptr[rows] = k;
  return t;
}

static void selection(void **state) {
  (void)state;
  pair p = {0};
  p.chunked = 1;
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  assert_int_equal(run(&p), 0);
  if (!has_xc(&p)) {
    pair_close(&p);
    skip();
  }
  hr_tensor *rm = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){37, 53}, 5);
  hr_tensor *cm = dense(HR_ELEM_FLOAT32, HR_LAYOUT_COLUMN_MAJOR, 2,
                        (uint64_t[]){37, 53}, NULL, 0, 6);
  result r = {0};
  /* Transcoded to the first preference. */
  hr_layout_entry l1[2] = {tag(HR_LAYOUT_COLUMN_MAJOR),
                           tag(HR_LAYOUT_ROW_MAJOR)};
  get_with(&p, rm, l1, 2, HR_REQ_ALLOW_TRANSCODE, &r);
  assert_int_equal(r.status, 0);
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  same_logical(r.t, rm);
  assert_int_equal(p.last_srv_rec.transcoded, 1);
  result_clear(&r);
  /* Without ALLOW_TRANSCODE: the stored layout listed second wins. */
  get_with(&p, rm, l1, 2, 0, &r);
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag, HR_LAYOUT_ROW_MAJOR);
  assert_int_equal(p.last_srv_rec.transcoded, 0);
  result_clear(&r);
  /* Nothing satisfiable: native. */
  get_with(&p, rm, l1, 1, 0, &r);
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag, HR_LAYOUT_ROW_MAJOR);
  result_clear(&r);
  /* STRIDED only matches a STRIDED tensor; then the next one. */
  hr_layout_entry l2[2] = {tag(HR_LAYOUT_STRIDED), tag(HR_LAYOUT_TILED)};
  get_with(&p, rm, l2, 2, HR_REQ_ALLOW_TRANSCODE, &r);
  const hr_descriptor *d = hr_tensor_descriptor(r.t);
  assert_int_equal(d->layout.tag, HR_LAYOUT_TILED);
  assert_true(d->params.tile[0] >= 1 && d->params.tile[1] >= 1);
  same_logical(r.t, rm);
  result_clear(&r);
  /* Plain PERMUTED from column-major: the same bytes, order [1, 0]. */
  hr_layout_entry l3[1] = {tag(HR_LAYOUT_PERMUTED)};
  get_with(&p, cm, l3, 1, HR_REQ_ALLOW_TRANSCODE, &r);
  d = hr_tensor_descriptor(r.t);
  assert_int_equal(d->layout.tag, HR_LAYOUT_PERMUTED);
  assert_int_equal(d->params.order[0], 1);
  assert_int_equal(memcmp(hr_tensor_buffer(r.t, 0), hr_tensor_buffer(cm, 0),
                          hr_tensor_bytes(cm)),
                   0);
  same_logical(r.t, cm);
  result_clear(&r);
  /* Registered profiles: exact tiles, exact order, panels. */
  uint8_t te[9], pe[3], pm[4];
  hr_layout_profile pr;
  memset(&pr, 0, sizeof pr);
  pr.tag = HR_LAYOUT_TILED_EXACT;
  pr.rank = 2;
  pr.tile[0] = 8;
  pr.tile[1] = 16;
  assert_int_equal(hr_layout_profile_encode(&pr, te, sizeof te), 9);
  pr.tag = HR_LAYOUT_PERMUTED_EXACT;
  pr.order[0] = 1;
  pr.order[1] = 0;
  assert_int_equal(hr_layout_profile_encode(&pr, pe, sizeof pe), 3);
  pr.tag = HR_LAYOUT_PANEL;
  pr.mr = 4;
  assert_int_equal(hr_layout_profile_encode(&pr, pm, sizeof pm), 4);
  hr_layout_entry tex = {HR_LAYOUT_TILED_EXACT, 9, te};
  hr_layout_entry pex = {HR_LAYOUT_PERMUTED_EXACT, 3, pe};
  hr_layout_entry pmx = {HR_LAYOUT_PANEL, 4, pm};
  get_with(&p, rm, &tex, 1, HR_REQ_ALLOW_TRANSCODE, &r);
  d = hr_tensor_descriptor(r.t);
  assert_int_equal(d->layout.tag, HR_LAYOUT_TILED);
  assert_int_equal(d->params.tile[0], 8);
  assert_int_equal(d->params.tile[1], 16);
  same_logical(r.t, rm);
  result_clear(&r);
  get_with(&p, rm, &pex, 1, HR_REQ_ALLOW_TRANSCODE, &r);
  d = hr_tensor_descriptor(r.t);
  assert_int_equal(d->layout.tag, HR_LAYOUT_PERMUTED);
  assert_int_equal(d->params.order[0], 1);
  same_logical(r.t, rm);
  result_clear(&r);
  get_with(&p, rm, &pmx, 1, HR_REQ_ALLOW_TRANSCODE, &r);
  d = hr_tensor_descriptor(r.t);
  assert_int_equal(d->layout.tag, HR_LAYOUT_PANEL);
  same_logical(r.t, rm);
  result_clear(&r);
  /* A profile whose metadata does not parse, or of another rank, is
   * skipped. */
  uint8_t bad[2] = {3, 0};
  hr_layout_entry l4[3] = {{HR_LAYOUT_TILED_EXACT, 2, bad},
                           {HR_LAYOUT_PERMUTED_EXACT, 0, NULL},
                           tag(HR_LAYOUT_COLUMN_MAJOR)};
  get_with(&p, rm, l4, 3, HR_REQ_ALLOW_TRANSCODE, &r);
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  result_clear(&r);
  hr_tensor *r3 = row_major(HR_ELEM_FLOAT32, 3, (uint64_t[]){2, 3, 4}, 1);
  hr_layout_entry l5[2] = {tex, tag(HR_LAYOUT_COLUMN_MAJOR)};
  get_with(&p, r3, l5, 2, HR_REQ_ALLOW_TRANSCODE, &r);
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  result_clear(&r);
  hr_tensor_unref(r3);
  /* INT4 is never transcoded. */
  hr_tensor *i4 = row_major(HR_ELEM_INT4, 2, (uint64_t[]){5, 3}, 1);
  get_with(&p, i4, l1, 1, HR_REQ_ALLOW_TRANSCODE, &r);
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag, HR_LAYOUT_ROW_MAJOR);
  result_clear(&r);
  hr_tensor_unref(i4);
  assert_int_equal(p.errors_c + p.errors_s, 0);
  hr_tensor_unref(rm);
  hr_tensor_unref(cm);
  pair_close(&p);
}

static void sparse_targets(void **state) {
  (void)state;
  for (int limit = 0; limit < 2; limit++) {
    hr_settings ss;
    hr_settings_default(&ss);
    if (limit)
      ss.transcode_mem_limit = 64;
    pair p = {0};
    p.async_work = 1;
    assert_int_equal(pair_open(&p, NULL, &ss), 0);
    assert_int_equal(run(&p), 0);
    if (!has_xc(&p)) {
      pair_close(&p);
      skip();
    }
    hr_tensor *sp = csr(40, 30);
    result r = {0};
    /* Sparse to dense: streamed by range; the source's index is
     * materialised memory too, so a tiny limit falls through to the
     * stored layout. */
    hr_layout_entry l1[1] = {tag(HR_LAYOUT_ROW_MAJOR)};
    get_with(&p, sp, l1, 1, HR_REQ_ALLOW_TRANSCODE, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag,
                     limit ? HR_LAYOUT_SPARSE_CSR : HR_LAYOUT_ROW_MAJOR);
    same_logical(r.t, sp);
    result_clear(&r);
    hr_tensor *densed = NULL;
    {
      uint64_t n;
      uint8_t *b = logical(sp, &n);
      densed = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){40, 30}, 1);
      memcpy(hr_tensor_buffer(densed, 0), b, n);
      free(b);
    }
    /* Dense to sparse: the whole output exists at once, so the memory
     * limit applies (falls through to the next preference). */
    hr_layout_entry l2[2] = {tag(HR_LAYOUT_SPARSE_CSC),
                             tag(HR_LAYOUT_COLUMN_MAJOR)};
    get_with(&p, densed, l2, 2, HR_REQ_ALLOW_TRANSCODE, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag,
                     limit ? HR_LAYOUT_COLUMN_MAJOR : HR_LAYOUT_SPARSE_CSC);
    same_logical(r.t, sp);
    result_clear(&r);
    hr_tensor_unref(densed);
    hr_tensor_unref(sp);
    pair_close(&p);
  }
}

/* A repeated coordinate cannot be densified: TRANSCODE_FAILED. */
static void repeated_coordinate(void **state) {
  (void)state;
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  assert_int_equal(run(&p), 0);
  if (!has_xc(&p)) {
    pair_close(&p);
    skip();
  }
  hr_layout_params pp;
  memset(&pp, 0, sizeof pp);
  pp.nnz = 2;
  pp.index_type = HR_ELEM_INT64;
  hr_tensor *coo = dense(HR_ELEM_FLOAT32, HR_LAYOUT_SPARSE_COO, 2,
                         (uint64_t[]){4, 4}, &pp, 0, 1);
  int64_t *idx = hr_tensor_buffer(coo, 0);
  idx[0] = 1;
  idx[1] = 2;
  idx[2] = 1;
  idx[3] = 2;
  result r = {0};
  hr_layout_entry l1[1] = {tag(HR_LAYOUT_ROW_MAJOR)};
  get_with(&p, coo, l1, 1, HR_REQ_ALLOW_TRANSCODE, &r);
  assert_int_equal(r.status, HR_ERR_REMOTE);
  assert_int_equal(r.rec.wire_error, HR_WIRE_TRANSCODE_FAILED);
  result_clear(&r);
  hr_tensor_unref(coo);
  pair_close(&p);
}

/* engine/core/hr_chunks.c (internal, reachable from the static library). */
void hr__chunk_stats(const hr_session *s, uint64_t *allocs, uint64_t *reuses);

/* Chunks go through hr_work, at most transcode_window per stream in
 * flight, and frames leave in order as they complete. */
static int max_queued;
static void track(pair *p) {
  if (p->wq.n > max_queued)
    max_queued = p->wq.n;
}

static void streamed_window(void **state) {
  (void)state;
  hr_settings ss;
  hr_settings_default(&ss);
  ss.transcode_chunk = 64 << 10;
  ss.transcode_window = 3;
  ss.frame_data_size = 16 << 10;
  pair p = {0};
  p.async_work = 1;
  p.zero_copy = 1;
  assert_int_equal(pair_open(&p, NULL, &ss), 0);
  assert_int_equal(run(&p), 0);
  if (!has_xc(&p)) {
    pair_close(&p);
    skip();
  }
  hr_tensor *rm = row_major(HR_ELEM_FLOAT64, 2, (uint64_t[]){300, 700}, 9);
  store_put(&p.st, "k", rm);
  result r1 = {0}, r2 = {0};
  hr_layout_entry l1[1] = {tag(HR_LAYOUT_COLUMN_MAJOR)};
  hr_get_opts o = get_opts("k");
  o.layouts = l1;
  o.layout_count = 1;
  o.flags = HR_REQ_ALLOW_TRANSCODE;
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r1, NULL), 0);
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r2, NULL), 0);
  max_queued = 0;
  for (int i = 0; i < 100000 && (r1.calls == 0 || r2.calls == 0); i++) {
    assert_true(pump(&p, p.c, p.s) >= 0);
    track(&p);
    assert_true(pump(&p, p.s, p.c) >= 0);
    track(&p);
    /* Complete only part of the work each turn, out of order. */
    if (p.wq.n) {
      int k = p.wq.n - 1;
      hr_work *w = p.wq.items[k];
      hr_session *s = p.wq.owner[k];
      p.wq.n--;
      w->run(w);
      hr_session_work_done(s, w, p.now);
    }
  }
  assert_int_equal(r1.status, 0);
  assert_int_equal(r2.status, 0);
  same_logical(r1.t, rm);
  same_logical(r2.t, rm);
  assert_true(max_queued >= 2);
  assert_true(max_queued <= 2 * 3);
  /* Chunk buffers are recycled (hr_chunks.c): 2 x 26 chunks went through
   * far fewer blocks. */
  uint64_t allocs, reuses;
  hr__chunk_stats(p.s, &allocs, &reuses);
  print_message("chunk blocks: %llu allocated, %llu reused\n",
                (unsigned long long)allocs, (unsigned long long)reuses);
  assert_true(allocs + reuses >= 52);
  assert_true(allocs <= 20);
  result_clear(&r1);
  result_clear(&r2);
  hr_tensor_unref(rm);
  pair_close(&p);
}

/* The server goes away while work is in flight: the work still reports,
 * and everything is freed. */
static void delete_with_work_in_flight(void **state) {
  (void)state;
  hr_settings ss;
  hr_settings_default(&ss);
  ss.transcode_chunk = 4096;
  pair p = {0};
  p.async_work = 1;
  assert_int_equal(pair_open(&p, NULL, &ss), 0);
  assert_int_equal(run(&p), 0);
  if (!has_xc(&p)) {
    pair_close(&p);
    skip();
  }
  hr_tensor *rm = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){100, 100}, 9);
  store_put(&p.st, "k", rm);
  result r = {0};
  hr_layout_entry l1[1] = {tag(HR_LAYOUT_COLUMN_MAJOR)};
  hr_get_opts o = get_opts("k");
  o.layouts = l1;
  o.layout_count = 1;
  o.flags = HR_REQ_ALLOW_TRANSCODE;
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r, NULL), 0);
  /* The answer starts its window at once. */
  assert_true(pump(&p, p.c, p.s) > 0);
  assert_true(p.wq.n > 0);
  hr_session_del(p.s);
  p.s = NULL;
  /* The pool finishes and reports to the deleted session. */
  assert_true(run_work(&p) > 0);
  hr_session_terminate(p.c, p.now);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, HR_ERR_CLOSED);
  hr_tensor_unref(rm);
  pair_close(&p);
}

/* Transcoded shards: each shard is its own plan over its box. */
static void transcoded_shards_and_region(void **state) {
  (void)state;
  pair p = {0};
  p.zero_copy = 1;
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  assert_int_equal(run(&p), 0);
  if (!has_xc(&p)) {
    pair_close(&p);
    skip();
  }
  hr_tensor *rm = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){2100, 4100}, 3);
  result r = {0};
  hr_layout_entry l1[1] = {tag(HR_LAYOUT_COLUMN_MAJOR)};
  get_with(&p, rm, l1, 1, HR_REQ_ALLOW_TRANSCODE | HR_REQ_PARALLEL_OK, &r);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.rec.shards, 3);
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  same_logical(r.t, rm);
  result_clear(&r);
  /* A region transcoded to TILED_EXACT. */
  uint8_t te[9];
  hr_layout_profile pr;
  memset(&pr, 0, sizeof pr);
  pr.tag = HR_LAYOUT_TILED_EXACT;
  pr.rank = 2;
  pr.tile[0] = 7;
  pr.tile[1] = 5;
  assert_int_equal(hr_layout_profile_encode(&pr, te, sizeof te), 9);
  hr_layout_entry tex = {HR_LAYOUT_TILED_EXACT, 9, te};
  store_put(&p.st, "k", rm);
  hr_get_opts o = get_opts("k");
  o.layouts = &tex;
  o.layout_count = 1;
  o.flags = HR_REQ_ALLOW_TRANSCODE | HR_REQ_REGION;
  o.region_rank = 2;
  o.region_offset = (uint64_t[]){10, 20};
  o.region_shape = (uint64_t[]){30, 40};
  assert_int_equal(hr_session_get(p.c, &o, on_get_done, &r, NULL), 0);
  assert_int_equal(run(&p), 0);
  assert_int_equal(r.status, 0);
  const hr_descriptor *d = hr_tensor_descriptor(r.t);
  assert_int_equal(d->layout.tag, HR_LAYOUT_TILED);
  assert_int_equal(d->shape[0], 30);
  uint64_t n;
  uint8_t *got = logical(r.t, &n);
  assert_int_equal(n, 30 * 40 * 4);
  const float *src = hr_tensor_buffer(rm, 0);
  for (int i = 0; i < 30; i++)
    assert_int_equal(
        memcmp(got + i * 40 * 4, src + (10 + i) * 4100 + 20, 40 * 4), 0);
  free(got);
  result_clear(&r);
  hr_tensor_unref(rm);
  pair_close(&p);
}

/* Composite members are each transcoded per the preferences. */
static void composite_members(void **state) {
  (void)state;
  pair p = {0};
  assert_int_equal(pair_open(&p, NULL, NULL), 0);
  assert_int_equal(run(&p), 0);
  if (!has_xc(&p)) {
    pair_close(&p);
    skip();
  }
  hr_tensor *a = row_major(HR_ELEM_FLOAT32, 2, (uint64_t[]){3, 4}, 1);
  hr_tensor *b = row_major(HR_ELEM_INT8, 1, (uint64_t[]){4}, 2);
  hr_tensor *m[2] = {a, b};
  hr_descriptor h;
  desc_init(&h, HR_ELEM_NONE, HR_LAYOUT_COMPOSITE, 0, NULL);
  h.params.member_count = 2;
  h.params.rule = HR_COMPOSITE_TUPLE;
  hr_tensor *c = NULL;
  assert_int_equal(hr_tensor_new_composite(&c, &h, m, 2, NULL, NULL), 0);
  result r = {0};
  hr_layout_entry l1[1] = {tag(HR_LAYOUT_COLUMN_MAJOR)};
  get_with(&p, c, l1, 1, HR_REQ_ALLOW_TRANSCODE, &r);
  assert_int_equal(r.status, 0);
  hr_tensor *ra = hr_tensor_member(r.t, 0);
  assert_int_equal(hr_tensor_descriptor(ra)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  same_logical(ra, a);
  result_clear(&r);
  hr_tensor_unref(c);
  hr_tensor_unref(a);
  hr_tensor_unref(b);
  pair_close(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(selection),
      cmocka_unit_test(sparse_targets),
      cmocka_unit_test(repeated_coordinate),
      cmocka_unit_test(streamed_window),
      cmocka_unit_test(delete_with_work_in_flight),
      cmocka_unit_test(transcoded_shards_and_region),
      cmocka_unit_test(composite_members),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
