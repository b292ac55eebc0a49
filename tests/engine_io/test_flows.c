/*
 * Every message flow over loopback TCP, through both loops (the epoll
 * test loop on hr_loop_ops, and libevent through hr_ev): GET of each
 * element type and layout, transcoded GETs, REGION, PARALLEL_OK,
 * composites, PUT/REPLACE/refusals, LIST paging, PING, CANCEL, GOAWAY and
 * graceful shutdown, the connection cap, hr_engine_del's BUSY.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tc.h"

typedef struct fx {
  int mode;
  tl_env *env;
  tl_server srv;
  hr_engine *ce; /* the clients' engine */
  tc_conn c;
} fx;

static int setup_mode(void **state, int mode) {
  fx *f = calloc(1, sizeof *f);
  if (!f)
    return -1;
  f->mode = mode;
  f->env = tl_new(mode);
  tl_server_start(f->env, &f->srv, NULL, NULL);
  f->ce = tl_engine(f->env, NULL);
  tc_open(f->env, f->ce, f->srv.url, &f->c);
  *state = f;
  return 0;
}

static int setup_epoll(void **state) {
  return setup_mode(state, TL_EPOLL);
}
static int setup_ev(void **state) {
  return setup_mode(state, TL_LIBEVENT);
}

static int teardown(void **state) {
  fx *f = *state;
  tc_close(&f->c);
  tl_engine_finish(f->env, f->ce);
  tl_server_stop(f->env, &f->srv);
  tl_free(f->env);
  free(f);
  return 0;
}

/* ------------------------------------------------------------------------ */

static void test_get_every_element_type(void **state) {
  fx *f = *state;
  uint8_t e;
  uint64_t shape[2] = {3, 5};

  for (e = HR_ELEM_BOOL; e <= HR_ELEM_LAST; e++) {
    char key[32];
    hr_tensor *t = tl_dense(e, 2, shape, e);
    tc_res r;
    snprintf(key, sizeof key, "elem/%s", hr_elem_type_name(e));
    tl_put(&f->srv, key, t);
    assert_int_equal(tc_get_key(&f->c, key, &r), 0);
    assert_non_null(r.t);
    assert_int_equal(hr_tensor_descriptor(r.t)->element_type, e);
    assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag,
                     HR_LAYOUT_ROW_MAJOR);
    assert_int_equal(hr_tensor_bytes(r.t), hr_tensor_bytes(t));
    assert_memory_equal(hr_tensor_buffer(r.t, 0), hr_tensor_buffer(t, 0),
                        hr_tensor_bytes(t));
    assert_int_equal(r.rec.bytes, hr_tensor_bytes(t));
    assert_int_equal(r.rec.layout, HR_LAYOUT_ROW_MAJOR);
    assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
    assert_true(r.rec.finished >= r.rec.started);
    tc_res_clear(&r);
    hr_tensor_unref(t);
  }
}

static void test_get_native_layouts(void **state) {
  fx *f = *state;
  static const uint8_t layouts[] = {HR_LAYOUT_ROW_MAJOR, HR_LAYOUT_COLUMN_MAJOR,
                                    HR_LAYOUT_STRIDED, HR_LAYOUT_PERMUTED,
                                    HR_LAYOUT_TILED};
  uint64_t shape[3] = {3, 4, 5};
  uint32_t order[3] = {1, 2, 0}, tiles[3] = {2, 3, 2};
  size_t i;

  for (i = 0; i < sizeof layouts; i++) {
    char key[32];
    const uint32_t *param = layouts[i] == HR_LAYOUT_PERMUTED ? order
                            : layouts[i] == HR_LAYOUT_TILED  ? tiles
                                                             : NULL;
    hr_tensor *t = tl_tensor(HR_ELEM_FLOAT32, layouts[i], 3, shape, param,
                             (uint32_t)i + 100);
    tc_res r;
    snprintf(key, sizeof key, "native/%u", layouts[i]);
    tl_put(&f->srv, key, t);
    assert_int_equal(tc_get_key(&f->c, key, &r), 0);
    /* No preference: the stored layout, its bytes untouched. */
    assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag, layouts[i]);
    assert_int_equal(hr_tensor_bytes(r.t), hr_tensor_bytes(t));
    assert_true(tl_same_elements(t, NULL, r.t));
    tc_res_clear(&r);
    hr_tensor_unref(t);
  }
}

static void test_get_sparse(void **state) {
  fx *f = *state;
  static const uint32_t rows[4] = {0, 1, 3, 4}, cols[4] = {2, 0, 5, 1};
  static const float vals[4] = {1.5f, -2.0f, 3.25f, 7.0f};
  static const uint8_t layouts[2] = {HR_LAYOUT_SPARSE_COO,
                                     HR_LAYOUT_SPARSE_CSR};
  hr_layout_entry le = {HR_LAYOUT_ROW_MAJOR, 0, NULL};
  int k;

  for (k = 0; k < 2; k++) {
    hr_tensor *t = tl_sparse(layouts[k], 5, 6, 4, rows, cols, vals, 1);
    const hr_descriptor *d;
    hr_get_opts o;
    tc_res r;
    unsigned b;
    size_t i;
    tl_put(&f->srv, "sp", t);
    /* Native: every buffer as stored. */
    assert_int_equal(tc_get_key(&f->c, "sp", &r), 0);
    d = hr_tensor_descriptor(r.t);
    assert_int_equal(d->layout.tag, layouts[k]);
    assert_int_equal(d->params.nnz, 4);
    for (b = 0; b < d->buffer_count; b++)
      assert_memory_equal(hr_tensor_buffer(r.t, b), hr_tensor_buffer(t, b),
                          d->buffers[b].size_bytes);
    tc_res_clear(&r);
    /* Densified by the server. */
    tc_opts(&o, "sp");
    o.layouts = &le;
    o.layout_count = 1;
    o.flags = HR_REQ_ALLOW_TRANSCODE;
    assert_int_equal(tc_get(&f->c, &o, &r), 0);
    d = hr_tensor_descriptor(r.t);
    assert_int_equal(d->layout.tag, HR_LAYOUT_ROW_MAJOR);
    {
      const float *v = hr_tensor_buffer(r.t, 0);
      float dense[30] = {0};
      for (i = 0; i < 4; i++)
        dense[rows[i] * 6 + cols[i]] = vals[i];
      assert_memory_equal(v, dense, sizeof dense);
    }
    tc_res_clear(&r);
    hr_tensor_unref(t);
  }
}

typedef struct want {
  const char *name;
  uint8_t tag;
  uint8_t ext[16];
  uint16_t ext_len;
  uint8_t expect; /* the descriptor's layout */
} want;

static void test_get_transcoded(void **state) {
  fx *f = *state;
  want w[] = {
      {"column-major", HR_LAYOUT_COLUMN_MAJOR, {0}, 0, HR_LAYOUT_COLUMN_MAJOR},
      {"permuted", HR_LAYOUT_PERMUTED, {0}, 0, HR_LAYOUT_PERMUTED},
      {"tiled", HR_LAYOUT_TILED, {0}, 0, HR_LAYOUT_TILED},
      {"permuted:1,0",
       HR_LAYOUT_PERMUTED_EXACT,
       {2, 1, 0},
       3,
       HR_LAYOUT_PERMUTED},
      {"tiled:8,16",
       HR_LAYOUT_TILED_EXACT,
       {2, 8, 0, 0, 0, 16, 0, 0, 0},
       9,
       HR_LAYOUT_TILED},
      {"panel:4", HR_LAYOUT_PANEL, {4, 0, 0, 0}, 4, HR_LAYOUT_PANEL},
  };
  uint64_t shape[2] = {37, 53};
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 2, shape, 7);
  size_t i;

  tl_put(&f->srv, "tc/m", t);
  for (i = 0; i < sizeof w / sizeof *w; i++) {
    hr_layout_entry le;
    hr_get_opts o;
    tc_res r;
    memset(&le, 0, sizeof le);
    le.tag = w[i].tag;
    le.ext = w[i].ext_len ? w[i].ext : NULL;
    le.ext_len = w[i].ext_len;
    tc_opts(&o, "tc/m");
    o.layouts = &le;
    o.layout_count = 1;
    o.flags = HR_REQ_ALLOW_TRANSCODE;
    assert_int_equal(tc_get(&f->c, &o, &r), 0);
    assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag, w[i].expect);
    if (w[i].tag == HR_LAYOUT_TILED_EXACT) {
      assert_int_equal(hr_tensor_descriptor(r.t)->params.tile[0], 8);
      assert_int_equal(hr_tensor_descriptor(r.t)->params.tile[1], 16);
    }
    if (w[i].tag == HR_LAYOUT_PERMUTED_EXACT)
      assert_int_equal(hr_tensor_descriptor(r.t)->params.order[0], 1);
    assert_true(tl_same_elements(t, NULL, r.t));
    tc_res_clear(&r);
    /* Without ALLOW_TRANSCODE the stored layout comes back. */
    o.flags = 0;
    assert_int_equal(tc_get(&f->c, &o, &r), 0);
    assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag,
                     HR_LAYOUT_ROW_MAJOR);
    tc_res_clear(&r);
  }
  hr_tensor_unref(t);
}

static void test_get_large_transcoded(void **state) {
  fx *f = *state;
  uint64_t shape[2] = {1024, 771};
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 2, shape, 9);
  hr_layout_entry le = {HR_LAYOUT_COLUMN_MAJOR, 0, NULL};
  hr_get_opts o;
  tc_res r;

  tl_put(&f->srv, "big/m", t);
  tc_opts(&o, "big/m");
  o.layouts = &le;
  o.layout_count = 1;
  o.flags = HR_REQ_ALLOW_TRANSCODE;
  assert_int_equal(tc_get(&f->c, &o, &r), 0);
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  assert_true(tl_same_elements(t, NULL, r.t));
  tc_res_clear(&r);
  /* Plain, several frames straight into place. */
  assert_int_equal(tc_get_key(&f->c, "big/m", &r), 0);
  assert_memory_equal(hr_tensor_buffer(r.t, 0), hr_tensor_buffer(t, 0),
                      hr_tensor_bytes(t));
  tc_res_clear(&r);
  hr_tensor_unref(t);
}

static void test_get_region(void **state) {
  fx *f = *state;
  uint64_t shape[2] = {20, 30}, off[2] = {3, 5}, box[2] = {10, 12};
  uint64_t bad_off[2] = {15, 0}, bad_box[2] = {6, 30};
  hr_tensor *t = tl_dense(HR_ELEM_INT16, 2, shape, 11);
  hr_layout_entry le = {HR_LAYOUT_COLUMN_MAJOR, 0, NULL};
  const hr_descriptor *d;
  hr_get_opts o;
  tc_res r;

  tl_put(&f->srv, "rg/m", t);
  tc_opts(&o, "rg/m");
  o.flags = HR_REQ_REGION;
  o.region_rank = 2;
  o.region_offset = off;
  o.region_shape = box;
  assert_int_equal(tc_get(&f->c, &o, &r), 0);
  d = hr_tensor_descriptor(r.t);
  assert_true(d->flags & HR_DESC_HAS_SHARD);
  assert_int_equal(d->shape[0], 10);
  assert_int_equal(d->shape[1], 12);
  assert_int_equal(d->parent_shape[0], 20);
  assert_int_equal(d->shard_offset[1], 5);
  assert_true(tl_same_elements(t, off, r.t));
  tc_res_clear(&r);
  /* A region, transcoded. */
  o.flags |= HR_REQ_ALLOW_TRANSCODE;
  o.layouts = &le;
  o.layout_count = 1;
  assert_int_equal(tc_get(&f->c, &o, &r), 0);
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  assert_true(tl_same_elements(t, off, r.t));
  tc_res_clear(&r);
  /* Outside the tensor. */
  o.region_offset = bad_off;
  o.region_shape = bad_box;
  assert_int_equal(tc_get(&f->c, &o, &r), HR_ERR_REMOTE);
  assert_int_equal(r.rec.wire_error, HR_WIRE_INVALID_REGION);
  assert_null(r.t);
  hr_tensor_unref(t);
}

static void test_get_parallel(void **state) {
  fx *f = *state;
  uint64_t shape[2] = {256, 1000};
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 2, shape, 13);
  hr_get_opts o;
  tc_res r;

  tl_put(&f->srv, "par/m", t);
  tc_opts(&o, "par/m");
  o.flags = HR_REQ_PARALLEL_OK;
  o.max_shards = 4;
  assert_int_equal(tc_get(&f->c, &o, &r), 0);
  assert_true(r.rec.shards >= 1 && r.rec.shards <= 4);
  assert_true(tl_same_elements(t, NULL, r.t));
  tc_res_clear(&r);
  hr_tensor_unref(t);
}

static hr_tensor *make_composite(uint32_t seed) {
  uint64_t s1[1] = {4}, s2[2] = {2, 3};
  hr_tensor *m[2], *c;
  hr_descriptor head;
  hr_wire_status st;

  m[0] = tl_dense(HR_ELEM_INT32, 1, s1, seed);
  m[1] = tl_dense(HR_ELEM_FLOAT32, 2, s2, seed + 1);
  memset(&head, 0, sizeof head);
  head.descriptor_version = 1;
  head.element_type = HR_ELEM_NONE;
  head.layout.tag = HR_LAYOUT_COMPOSITE;
  head.params.member_count = 2;
  head.params.rule = HR_COMPOSITE_TUPLE;
  assert_int_equal(hr_tensor_new_composite(&c, &head, m, 2, NULL, &st), 0);
  hr_tensor_unref(m[0]);
  hr_tensor_unref(m[1]);
  return c;
}

static void same_composite(hr_tensor *a, hr_tensor *b) {
  size_t i;

  assert_int_equal(hr_tensor_descriptor(b)->layout.tag, HR_LAYOUT_COMPOSITE);
  assert_int_equal(hr_tensor_member_count(a), hr_tensor_member_count(b));
  for (i = 0; i < hr_tensor_member_count(a); i++)
    assert_true(
        tl_same_elements(hr_tensor_member(a, i), NULL, hr_tensor_member(b, i)));
}

static void test_get_composite(void **state) {
  fx *f = *state;
  hr_tensor *c = make_composite(21);
  tc_res r;

  tl_put(&f->srv, "comp/t", c);
  assert_int_equal(tc_get_key(&f->c, "comp/t", &r), 0);
  same_composite(c, r.t);
  tc_res_clear(&r);
  hr_tensor_unref(c);
}

static void test_put_replace_refuse(void **state) {
  fx *f = *state;
  uint64_t shape[2] = {64, 1000};
  hr_tensor *a = tl_dense(HR_ELEM_FLOAT32, 2, shape, 31);
  hr_tensor *b = tl_dense(HR_ELEM_FLOAT32, 2, shape, 32);
  hr_tensor *c = make_composite(33);
  tc_res r;

  assert_int_equal(tc_put(&f->c, "put/a", 0, a, &r), 0);
  assert_int_equal(r.rec.bytes, hr_tensor_bytes(a));
  assert_int_equal(tc_get_key(&f->c, "put/a", &r), 0);
  assert_true(tl_same_elements(a, NULL, r.t));
  tc_res_clear(&r);
  /* Exists: refused without REPLACE, replaced with it. */
  assert_int_equal(tc_put(&f->c, "put/a", 0, b, &r), HR_ERR_REMOTE);
  assert_int_equal(r.rec.wire_error, HR_WIRE_ALREADY_EXISTS);
  assert_int_equal(tc_get_key(&f->c, "put/a", &r), 0);
  assert_true(tl_same_elements(a, NULL, r.t));
  tc_res_clear(&r);
  assert_int_equal(tc_put(&f->c, "put/a", HR_PUT_REPLACE, b, &r), 0);
  assert_int_equal(tc_get_key(&f->c, "put/a", &r), 0);
  assert_true(tl_same_elements(b, NULL, r.t));
  tc_res_clear(&r);
  /* A composite PUT. */
  assert_int_equal(tc_put(&f->c, "put/c", 0, c, &r), 0);
  assert_int_equal(tc_get_key(&f->c, "put/c", &r), 0);
  same_composite(c, r.t);
  tc_res_clear(&r);
  hr_tensor_unref(a);
  hr_tensor_unref(b);
  hr_tensor_unref(c);
}

static void test_put_refused_by_config(void **state) {
  fx *f = *state;
  hr_store_config sc;
  hr_engine_config ec;
  tl_server s2;
  tc_conn c2;
  uint64_t shape[1] = {1000};
  hr_tensor *t = tl_dense(HR_ELEM_UINT8, 1, shape, 5);
  tc_res r;
  int rv;

  /* A server without PUT. */
  hr_store_config_default(&sc);
  sc.allow_put = 0;
  tl_server_start(f->env, &s2, NULL, &sc);
  tc_open(f->env, f->ce, s2.url, &c2);
  assert_false(hr_session_peer_hello(hr_conn_session(c2.c))->capability_flags &
               HR_CAP_TENSOR_PUT);
  rv = tc_put(&c2, "x", 0, t, &r);
  assert_int_not_equal(rv, 0);
  assert_int_equal(hr_store_count(s2.store), 0);
  tc_close(&c2);
  tl_server_stop(f->env, &s2);
  /* A server whose in-flight PUT bytes are capped below the tensor. */
  hr_engine_config_default(&ec);
  ec.max_inflight_bytes = 100;
  tl_server_start(f->env, &s2, &ec, NULL);
  tc_open(f->env, f->ce, s2.url, &c2);
  assert_int_equal(tc_put(&c2, "x", 0, t, &r), HR_ERR_REMOTE);
  assert_int_equal(r.rec.wire_error, HR_WIRE_RESOURCE_EXHAUSTED);
  assert_int_equal(hr_store_count(s2.store), 0);
  tc_close(&c2);
  tl_server_stop(f->env, &s2);
  hr_tensor_unref(t);
}

static void test_list_paging(void **state) {
  fx *f = *state;
  uint64_t shape[2] = {2, 3};
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT64, 2, shape, 1);
  hr_tensor *c = make_composite(3);
  char last[64] = "";
  int i, seen = 0;
  tc_res r;

  for (i = 0; i < 23; i++) {
    char key[32];
    snprintf(key, sizeof key, "ls/%02d", i);
    tl_put(&f->srv, key, t);
  }
  tl_put(&f->srv, "lsx", t);
  tl_put(&f->srv, "ls/comp", c);
  do {
    size_t k;
    assert_int_equal(tc_list(&f->c, "ls/", last, 5, &r), 0);
    assert_true(r.nentries <= 5);
    for (k = 0; k < r.nentries; k++) {
      assert_true(strcmp(r.keys[k], last) > 0); /* strictly ascending */
      assert_int_equal(strncmp(r.keys[k], "ls/", 3), 0);
      if (strcmp(r.keys[k], "ls/comp") == 0) {
        assert_int_equal(r.entries[k].layout_tag, HR_LAYOUT_COMPOSITE);
        assert_int_equal(r.entries[k].total_data_bytes, 4 * 4 + 6 * 4);
      } else {
        assert_int_equal(r.entries[k].element_type, HR_ELEM_FLOAT64);
        assert_int_equal(r.entries[k].rank, 2);
        assert_int_equal(r.entries[k].shape[1], 3);
        assert_int_equal(r.entries[k].total_data_bytes, 48);
      }
      strcpy(last, r.keys[k]);
      seen++;
    }
  } while (r.more);
  assert_int_equal(seen, 24);
  hr_tensor_unref(t);
  hr_tensor_unref(c);
}

static void test_ping_and_not_found(void **state) {
  fx *f = *state;
  tc_res r;

  assert_int_equal(tc_ping(&f->c, &r), 0);
  assert_true(r.rtt > 0);
  assert_int_equal(tc_get_key(&f->c, "no/such/key", &r), HR_ERR_REMOTE);
  assert_int_equal(r.rec.wire_error, HR_WIRE_NOT_FOUND);
  assert_null(r.t);
  /* The connection goes on. */
  assert_int_equal(tc_ping(&f->c, &r), 0);
}

static void test_cancel(void **state) {
  fx *f = *state;
  uint64_t shape[1] = {48u << 20};
  hr_tensor *t = tl_dense(HR_ELEM_UINT8, 1, shape, 41);
  hr_get_opts o;
  uint32_t sid;
  tc_res r;

  tl_put(&f->srv, "cx/big", t);
  tc_opts(&o, "cx/big");
  assert_int_equal(tc_get_start(&f->c, &o, &r, &sid), 0);
  tl_spin(f->env, 2);
  assert_int_equal(hr_session_cancel(hr_conn_session(f->c.c), sid), 0);
  assert_int_equal(hr_engine_flush(f->ce), 0);
  assert_true(tc_wait(&f->c, &r, 30000));
  if (r.status == 0) {
    /* The answer raced the CANCEL: it must then be whole. */
    assert_true(tl_same_elements(t, NULL, r.t));
  } else {
    assert_null(r.t);
  }
  tc_res_clear(&r);
  /* The connection survives a cancel. */
  assert_int_equal(tc_ping(&f->c, &r), 0);
  hr_tensor_unref(t);
}

typedef struct closed_cb {
  int closed;
} closed_cb;

static void on_closed(hr_engine *e, void *ud) {
  (void)e;
  ((closed_cb *)ud)->closed = 1;
}

static int both(void *ud) {
  void **p = ud;
  return ((closed_cb *)p[0])->closed && ((tc_res *)p[1])->done;
}

/* The server has a stream open (or the answer already came). */
static int started(void *ud) {
  void **p = ud;
  return hr_engine_stream_count(p[0]) > 0 || ((tc_res *)p[1])->done;
}

static void test_graceful_shutdown(void **state) {
  fx *f = *state;
  uint64_t shape[1] = {24u << 20};
  hr_tensor *t = tl_dense(HR_ELEM_UINT8, 1, shape, 51);
  hr_engine *se = f->srv.e;
  closed_cb cl = {0};
  hr_get_opts o;
  tc_res r, r2;
  tc_conn c2;
  void *p[2];

  tl_put(&f->srv, "gs/big", t);
  tc_opts(&o, "gs/big");
  assert_int_equal(tc_get_start(&f->c, &o, &r, NULL), 0);
  /* The request must have reached the server before the close, or it
   * is not an active GET that the drain lets finish. */
  p[0] = se;
  p[1] = &r;
  assert_true(tl_run(f->env, started, p, TL_WAIT_MS));
  /* Drain: the active GET finishes, the server goes away. */
  assert_int_equal(hr_engine_close(se, on_closed, &cl), 0);
  assert_int_equal(hr_engine_close(se, on_closed, &cl), HR_ERR_STATE);
  assert_int_equal(hr_engine_del(se), HR_ERR_BUSY);
  p[0] = &cl;
  p[1] = &r;
  assert_true(tl_run(f->env, both, p, 30000));
  assert_int_equal(r.status, 0);
  assert_true(tl_same_elements(t, NULL, r.t));
  tc_res_clear(&r);
  assert_true(tc_wait_closed(&f->c, 10000));
  assert_int_equal(f->c.status, HR_ERR_CLOSED);
  /* New requests on the old connection fail; new connections too. */
  tc_connect(f->env, f->ce, f->srv.url, &c2, NULL);
  assert_false(tc_wait_up(&c2, 10000));
  assert_int_not_equal(c2.status, 0);
  (void)r2;
  assert_int_equal(hr_engine_del(se), 0);
  hr_store_del(f->srv.store);
  /* Restart a server for the teardown. */
  tl_server_start(f->env, &f->srv, NULL, NULL);
  tc_open(f->env, f->ce, f->srv.url, &f->c);
  hr_tensor_unref(t);
}

static void test_connection_cap(void **state) {
  fx *f = *state;
  hr_engine_config ec;
  tl_server s2;
  tc_conn a, b, c;

  hr_engine_config_default(&ec);
  ec.max_connections = 2;
  tl_server_start(f->env, &s2, &ec, NULL);
  tc_open(f->env, f->ce, s2.url, &a);
  tc_open(f->env, f->ce, s2.url, &b);
  tc_connect(f->env, f->ce, s2.url, &c, NULL);
  assert_false(tc_wait_up(&c, 10000));
  assert_int_equal(c.status, HR_ERR_REMOTE);
  assert_int_equal(c.wire_error, HR_WIRE_RESOURCE_EXHAUSTED);
  assert_int_equal(c.wire_sent, 0);
  /* One leaves: the next one gets in. */
  tc_close(&a);
  /* The server must have seen a's close before c fits under the cap. */
  assert_true(tl_wait_conns(f->env, s2.e, 1));
  tc_open(f->env, f->ce, s2.url, &c);
  assert_int_equal(hr_engine_conn_count(s2.e), 2);
  tc_close(&b);
  tc_close(&c);
  tl_server_stop(f->env, &s2);
}

static void test_del_busy_and_abort(void **state) {
  fx *f = *state;
  hr_engine *e2 = tl_engine(f->env, NULL);
  tc_conn c2;
  tc_res r;
  hr_get_opts o;

  tc_open(f->env, e2, f->srv.url, &c2);
  assert_int_equal(hr_engine_del(e2), HR_ERR_BUSY);
  /* A pending request completes with HR_ERR_CLOSED when cut. */
  tc_opts(&o, "nothing-here");
  assert_int_equal(tc_get_start(&c2, &o, &r, NULL), 0);
  hr_conn_abort(c2.c);
  assert_true(tc_wait_closed(&c2, 10000));
  assert_true(r.done);
  assert_int_not_equal(r.status, 0);
  assert_int_equal(hr_engine_del(e2), 0);
}

#define FLOW_TESTS(setup)                                                      \
  cmocka_unit_test_setup_teardown(test_get_every_element_type, setup,          \
                                  teardown),                                   \
      cmocka_unit_test_setup_teardown(test_get_native_layouts, setup,          \
                                      teardown),                               \
      cmocka_unit_test_setup_teardown(test_get_transcoded, setup, teardown),   \
      cmocka_unit_test_setup_teardown(test_get_sparse, setup, teardown),       \
      cmocka_unit_test_setup_teardown(test_get_large_transcoded, setup,        \
                                      teardown),                               \
      cmocka_unit_test_setup_teardown(test_get_region, setup, teardown),       \
      cmocka_unit_test_setup_teardown(test_get_parallel, setup, teardown),     \
      cmocka_unit_test_setup_teardown(test_get_composite, setup, teardown),    \
      cmocka_unit_test_setup_teardown(test_put_replace_refuse, setup,          \
                                      teardown),                               \
      cmocka_unit_test_setup_teardown(test_put_refused_by_config, setup,       \
                                      teardown),                               \
      cmocka_unit_test_setup_teardown(test_list_paging, setup, teardown),      \
      cmocka_unit_test_setup_teardown(test_ping_and_not_found, setup,          \
                                      teardown),                               \
      cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),           \
      cmocka_unit_test_setup_teardown(test_graceful_shutdown, setup,           \
                                      teardown),                               \
      cmocka_unit_test_setup_teardown(test_connection_cap, setup, teardown),   \
      cmocka_unit_test_setup_teardown(test_del_busy_and_abort, setup,          \
                                      teardown)

int main(void) {
  const struct CMUnitTest epoll_tests[] = {FLOW_TESTS(setup_epoll)};
  const struct CMUnitTest ev_tests[] = {FLOW_TESTS(setup_ev)};
  int fails = 0;

  fails += cmocka_run_group_tests_name("epoll loop", epoll_tests, NULL, NULL);
  fails += cmocka_run_group_tests_name("libevent loop", ev_tests, NULL, NULL);
  return fails ? 1 : 0;
}
