/*
 * Lanes end to end over loopback TCP: engines on both sides (epoll and
 * libevent loops), parallel GETs of 1, 2, 3, 8 and 64 shards over 1 to 4
 * connections, a lane cut mid-transfer on either side, regions at every
 * corner and edge of rank 1 to 5 tensors (sharded over two lanes), joins
 * refused, and the blocking client's lanes and tensor-parallel slices.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/client.h>
#include <hurray/engine.h>
#include <hurray/session.h>
#include <hurray/store.h>

#include "engine_io/tl.h"
#include "lanes/lanes_conn.h"
#include "lanes/lanes_get.h"

/* Server settings that let tensors of a few MB take many shards. */
static hr_engine_config server_cfg(void) {
  hr_engine_config c;
  hr_engine_config_default(&c);
  c.session.shard_bytes = 16 * 1024;
  c.session.shards_per_lane = 64;
  return c;
}

static int got_done(void *ud) {
  return ((got *)ud)->done;
}

typedef struct many {
  got *g;
  int n;
} many;

static int all_done(void *ud) {
  many *m = ud;
  for (int i = 0; i < m->n; i++)
    if (!m->g[i].done)
      return 0;
  return 1;
}

static void get_start(hr_engine *e, cconn *cc, const char *key, uint16_t k,
                      const uint64_t *off, const uint64_t *shape, unsigned rank,
                      got *g) {
  assert_int_equal(lanes_get_start(e, cc->c, key, k, off, shape, rank, g), 0);
}


/* ---- parallel GETs ------------------------------------------------------- */

static void parallel_gets(void **state) {
  (void)state;
  static const uint16_t ks[] = {1, 2, 3, 8, 64};
  for (int mode = TL_EPOLL; mode <= TL_LIBEVENT; mode++) {
    tl_env *env = tl_new(mode);
    tl_server srv;
    hr_engine_config scfg = server_cfg();
    tl_server_start(env, &srv, &scfg, NULL);
    hr_tensor *t =
        tl_dense(HR_ELEM_FLOAT32, 2, (uint64_t[]){640, 1000}, 11); /* 2.5 MB */
    tl_put(&srv, "w", t);
    hr_engine *ce = tl_engine(env, NULL);
    for (unsigned lanes = 1; lanes <= 4; lanes++) {
      /* libevent: one pass is enough to show both loops carry lanes. */
      if (mode == TL_LIBEVENT && lanes != 3)
        continue;
      cconn cc;
      cconn_open(env, ce, srv.url, lanes, &cc);
      for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
        got g;
        get_start(ce, &cc, "w", ks[ki], NULL, NULL, 0, &g);
        assert_true(tl_run(env, got_done, &g, 20000));
        if (g.rec.status)
          fail_msg("L=%u K=%u: %s", lanes, ks[ki], g.rec.message);
        assert_int_equal(g.rec.shards, ks[ki]);
        assert_int_equal(g.rec.lanes, ks[ki] < lanes ? ks[ki] : lanes);
        assert_int_equal(hr_tensor_bytes(g.t), hr_tensor_bytes(t));
        assert_memory_equal(hr_tensor_buffer(g.t, 0), hr_tensor_buffer(t, 0),
                            hr_tensor_bytes(t));
        hr_tensor_unref(g.t);
      }
      /* Several at once, interleaved on the lanes. */
      got gs[5];
      for (int i = 0; i < 5; i++)
        get_start(ce, &cc, "w", ks[i], NULL, NULL, 0, &gs[i]);
      many m = {gs, 5};
      assert_true(tl_run(env, all_done, &m, 20000));
      for (int i = 0; i < 5; i++) {
        assert_int_equal(gs[i].rec.status, 0);
        assert_memory_equal(hr_tensor_buffer(gs[i].t, 0),
                            hr_tensor_buffer(t, 0), hr_tensor_bytes(t));
        hr_tensor_unref(gs[i].t);
      }
      cconn_close(env, &cc);
    }
    tl_engine_finish(env, ce);
    hr_tensor_unref(t);
    tl_server_stop(env, &srv);
    tl_free(env);
  }
}

/* ---- a lane cut mid-transfer --------------------------------------------- */

/* The server session a GET arrived on (the store's on_get, wrapped). */
static hr_session *srv_lane0;
static int (*store_on_get)(hr_session *, hr_srv_get *, void *);

static int spy_on_get(hr_session *s, hr_srv_get *g, void *ud) {
  srv_lane0 = s;
  return store_on_get(s, g, ud);
}

static uint64_t lane_rx(cconn *cc, unsigned i) {
  hr_session *s = hr_group_lane(hr_session_group(hr_conn_session(cc->c)), i);
  uint64_t rx = 0;
  if (s)
    hr_conn_bytes(hr_session_user_data(s), &rx, NULL);
  return rx;
}

typedef struct cut_wait {
  cconn *cc;
  got *a;
} cut_wait;

/* Lane 2 carried some of A's shards, and A is not done. */
static int lane2_busy(void *ud) {
  cut_wait *w = ud;
  return w->a->done || lane_rx(w->cc, 2) > (1u << 20);
}

static void lane_cut(void **state) {
  (void)state;
  for (int side = 0; side < 2; side++) {
    tl_env *env = tl_new(TL_EPOLL);
    hr_store_config sc;
    hr_store_config_default(&sc);
    hr_store *store;
    assert_int_equal(hr_store_new(&store, &sc, NULL), 0);
    hr_provider prov;
    hr_store_provider(store, &prov);
    store_on_get = prov.on_get;
    prov.on_get = spy_on_get;
    hr_engine_config scfg = server_cfg();
    /* Small turns: the transfer takes many loop passes. */
    scfg.io_budget = 256 * 1024;
    scfg.session.send_budget = 1 << 20;
    scfg.socket_buffer = 128 * 1024;
    hr_engine *se = tl_engine(env, &scfg);
    hr_listener *lis;
    assert_int_equal(hr_engine_listen(se, "127.0.0.1:0", &prov, &lis), 0);
    char url[64];
    snprintf(url, sizeof url, "hurray://127.0.0.1:%d", hr_listener_port(lis));
    hr_tensor *t =
        tl_dense(HR_ELEM_FLOAT32, 2, (uint64_t[]){3072, 2048}, 5); /* 24 MB */
    assert_int_equal(hr_store_put(store, "t", 1, t, HR_PUT_REPLACE), 0);
    hr_engine_config ccfg;
    hr_engine_config_default(&ccfg);
    ccfg.io_budget = 256 * 1024;
    ccfg.socket_buffer = 128 * 1024;
    hr_engine *ce = tl_engine(env, &ccfg);
    cconn cc;
    cconn_open(env, ce, url, 3, &cc);
    got a, b, c;
    get_start(ce, &cc, "t", 6, NULL, NULL, 0, &a); /* shards on 0, 1, 2 */
    get_start(ce, &cc, "t", 0, NULL, NULL, 0, &b); /* lane 0 */
    get_start(ce, &cc, "t", 2, NULL, NULL, 0, &c); /* lanes 0 and 1 */
    cut_wait w = {&cc, &a};
    assert_true(tl_run(env, lane2_busy, &w, 20000));
    assert_false(a.done);
    /* Cut lane 2: side 0 from the client, side 1 from the server. */
    if (side == 0) {
      hr_session *l2 =
          hr_group_lane(hr_session_group(hr_conn_session(cc.c)), 2);
      hr_conn_abort(hr_session_user_data(l2));
    } else {
      hr_session *l2 = hr_group_lane(hr_session_group(srv_lane0), 2);
      assert_non_null(l2);
      hr_conn_abort(hr_session_user_data(l2));
    }
    got *gs3[3] = {&a, &b, &c};
    for (int i = 0; i < 3; i++)
      assert_true(tl_run(env, got_done, gs3[i], 20000));
    assert_int_equal(a.rec.status, HR_ERR_CLOSED);
    assert_null(a.t);
    assert_int_equal(b.rec.status, 0);
    assert_int_equal(c.rec.status, 0);
    assert_int_equal(c.rec.shards, 2);
    assert_memory_equal(hr_tensor_buffer(b.t, 0), hr_tensor_buffer(t, 0),
                        hr_tensor_bytes(t));
    assert_memory_equal(hr_tensor_buffer(c.t, 0), hr_tensor_buffer(t, 0),
                        hr_tensor_bytes(t));
    hr_tensor_unref(b.t);
    hr_tensor_unref(c.t);
    /* The session goes on with two lanes; parallel GETs avoid lane 2. */
    tl_spin(env, 50);
    assert_false(cc.closed);
    assert_int_equal(hr_conn_lanes(cc.c), 2);
    got d;
    get_start(ce, &cc, "t", 16, NULL, NULL, 0, &d);
    assert_true(tl_run(env, got_done, &d, 20000));
    assert_int_equal(d.rec.status, 0);
    assert_int_equal(d.rec.shards, 2);
    assert_memory_equal(hr_tensor_buffer(d.t, 0), hr_tensor_buffer(t, 0),
                        hr_tensor_bytes(t));
    hr_tensor_unref(d.t);
    cconn_close(env, &cc);
    /* Nothing is left on the server: every connection goes. */
    tl_engine_finish(env, ce);
    tl_engine_finish(env, se);
    hr_store_del(store);
    hr_tensor_unref(t);
    tl_free(env);
  }
}

/* ---- regions at every corner and edge ------------------------------------ */

static void regions_corners_edges(void **state) {
  (void)state;
  tl_env *env = tl_new(TL_EPOLL);
  tl_server srv;
  hr_engine_config scfg = server_cfg();
  scfg.session.shard_bytes = 64;
  tl_server_start(env, &srv, &scfg, NULL);
  static const uint64_t dims[5] = {5, 4, 3, 4, 3};
  static const uint8_t elems[5] = {HR_ELEM_UINT8, HR_ELEM_INT16,
                                   HR_ELEM_FLOAT32, HR_ELEM_FLOAT64,
                                   HR_ELEM_INT32};
  hr_tensor *ts[5];
  for (unsigned r = 1; r <= 5; r++) {
    char key[8];
    snprintf(key, sizeof key, "r%u", r);
    ts[r - 1] = tl_dense(elems[r - 1], r, dims, r);
    tl_put(&srv, key, ts[r - 1]);
  }
  hr_engine *ce = tl_engine(env, NULL);
  cconn cc;
  cconn_open(env, ce, srv.url, 2, &cc);
  if (!(hr_session_peer_hello(hr_conn_session(cc.c))->capability_flags &
        HR_CAP_REGION_REQUESTS)) {
    cconn_close(env, &cc);
    tl_engine_finish(env, ce);
    for (int i = 0; i < 5; i++)
      hr_tensor_unref(ts[i]);
    tl_server_stop(env, &srv);
    tl_free(env);
    skip();
  }
  int total = 0;
  for (unsigned r = 1; r <= 5; r++) {
    /* Per dim: the first index, the last, or the whole extent. */
    unsigned combos = 1;
    for (unsigned k = 0; k < r; k++)
      combos *= 3;
    got *g = calloc(combos, sizeof *g);
    uint64_t(*off)[5] = calloc(combos, sizeof *off);
    uint64_t(*shp)[5] = calloc(combos, sizeof *shp);
    char key[8];
    snprintf(key, sizeof key, "r%u", r);
    for (unsigned c = 0; c < combos; c++) {
      unsigned x = c;
      for (unsigned k = 0; k < r; k++, x /= 3) {
        unsigned pick = x % 3;
        off[c][k] = pick == 1 ? dims[k] - 1 : 0;
        shp[c][k] = pick == 2 ? dims[k] : 1;
      }
      /* Half of them as parallel requests over the two lanes. */
      get_start(ce, &cc, key, (c & 1) ? 4 : 0, off[c], shp[c], r, &g[c]);
    }
    many m = {g, (int)combos};
    assert_true(tl_run(env, all_done, &m, 60000));
    for (unsigned c = 0; c < combos; c++) {
      if (g[c].rec.status)
        fail_msg("rank %u region %u: %s", r, c, g[c].rec.message);
      const hr_descriptor *d = hr_tensor_descriptor(g[c].t);
      assert_true(d->flags & HR_DESC_HAS_SHARD);
      for (unsigned k = 0; k < r; k++) {
        assert_int_equal(d->shape[k], shp[c][k]);
        assert_int_equal(d->shard_offset[k], off[c][k]);
        assert_int_equal(d->parent_shape[k], dims[k]);
      }
      assert_true(tl_same_elements(ts[r - 1], off[c], g[c].t));
      hr_tensor_unref(g[c].t);
      total++;
    }
    free(g);
    free(off);
    free(shp);
  }
  assert_int_equal(total, 3 + 9 + 27 + 81 + 243);
  cconn_close(env, &cc);
  tl_engine_finish(env, ce);
  for (int i = 0; i < 5; i++)
    hr_tensor_unref(ts[i]);
  tl_server_stop(env, &srv);
  tl_free(env);
}

/* ---- joins on the wire --------------------------------------------------- */

static void joins_on_the_wire(void **state) {
  (void)state;
  tl_env *env = tl_new(TL_EPOLL);
  tl_server srv;
  tl_server_start(env, &srv, NULL, NULL);
  uint8_t buf[4096];
  hr_msg m, hello;
  /* A first connection gets a 16-byte token. */
  int fd0 = tl_raw_connect(srv.port);
  assert_true(fd0 >= 0);
  tl_hello(&hello, 0);
  assert_int_equal(tl_raw_send_msg(env, fd0, &hello), 0);
  assert_int_equal(tl_raw_expect(env, fd0, HR_MSG_SERVER_HELLO, 0, buf,
                                 sizeof buf, &m, TL_WAIT_MS),
                   1);
  assert_int_equal(m.u.hello.exts.session_token_len, 16);
  uint8_t tok[16];
  memcpy(tok, m.u.hello.exts.session_token, 16);
  /* An unknown token: ERROR UNAUTHORIZED on stream 0, closed. */
  uint8_t bad[16];
  memcpy(bad, tok, 16);
  bad[0] ^= 0x80;
  for (int i = 0; i < 2; i++) {
    int fd = tl_raw_connect(srv.port);
    assert_true(fd >= 0);
    uint8_t ext[32];
    int w = hr_ext_put(ext, sizeof ext, HR_EXT_SESSION_JOIN, i ? tok : bad, 16);
    tl_hello(&hello, 0);
    hello.u.hello.ext_count = 1;
    hello.u.hello.ext_raw = ext;
    hello.u.hello.ext_raw_len = (size_t)w;
    assert_int_equal(tl_raw_send_msg(env, fd, &hello), 0);
    if (i == 0) {
      assert_int_equal(tl_raw_expect(env, fd, HR_MSG_ERROR, 0, buf, sizeof buf,
                                     &m, TL_WAIT_MS),
                       1);
      assert_int_equal(m.u.error.code, HR_WIRE_UNAUTHORIZED);
      assert_int_equal(tl_raw_wait_eof(env, fd, TL_WAIT_MS), 1);
    } else {
      /* The right token: this connection is lane 1 of the session, and
       * its SERVER_HELLO names the same session. */
      assert_int_equal(tl_raw_expect(env, fd, HR_MSG_SERVER_HELLO, 0, buf,
                                     sizeof buf, &m, TL_WAIT_MS),
                       1);
      assert_int_equal(m.u.hello.exts.session_token_len, 16);
      assert_memory_equal(m.u.hello.exts.session_token, tok, 16);
    }
    close(fd);
  }
  /* Lane 0 gone, the token is gone (once the server has seen both
   * closes). */
  close(fd0);
  assert_true(tl_wait_conns(env, srv.e, 0));
  int fd = tl_raw_connect(srv.port);
  uint8_t ext[32];
  int w = hr_ext_put(ext, sizeof ext, HR_EXT_SESSION_JOIN, tok, 16);
  tl_hello(&hello, 0);
  hello.u.hello.ext_count = 1;
  hello.u.hello.ext_raw = ext;
  hello.u.hello.ext_raw_len = (size_t)w;
  assert_int_equal(tl_raw_send_msg(env, fd, &hello), 0);
  assert_int_equal(
      tl_raw_expect(env, fd, HR_MSG_ERROR, 0, buf, sizeof buf, &m, TL_WAIT_MS),
      1);
  assert_int_equal(m.u.error.code, HR_WIRE_UNAUTHORIZED);
  close(fd);
  tl_server_stop(env, &srv);
  tl_free(env);
}

/* ---- the blocking client ------------------------------------------------- */

typedef struct srv_thread_arg {
  tl_env *env;
  _Atomic int stop;
} srv_thread_arg;

static int stop_flag(void *ud) {
  return ((srv_thread_arg *)ud)->stop;
}

static void *srv_thread(void *p) {
  srv_thread_arg *a = p;
  tl_run(a->env, stop_flag, a, 120000);
  return NULL;
}

static void blocking_client(void **state) {
  (void)state;
  tl_env *env = tl_new(TL_EPOLL);
  tl_server srv;
  hr_engine_config scfg = server_cfg();
  tl_server_start(env, &srv, &scfg, NULL);
  hr_tensor *t = tl_dense(HR_ELEM_INT32, 3, (uint64_t[]){7, 130, 90}, 9);
  tl_put(&srv, "m", t);
  srv_thread_arg a = {env, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, srv_thread, &a), 0);
  hr_client_options o;
  hr_client_options_default(&o);
  o.lanes = 3;
  hr_client *cl = NULL;
  hr_client_error err;
  assert_int_equal(hr_client_connect(&cl, srv.url, &o, NULL, &err), 0);
  assert_int_equal(hr_client_lanes(cl), 3);
  hr_get_opts go;
  memset(&go, 0, sizeof go);
  go.key = (const uint8_t *)"m";
  go.key_len = 1;
  go.flags = HR_REQ_PARALLEL_OK;
  go.max_shards = 7;
  hr_tensor *out = NULL;
  hr_transfer_record rec;
  assert_int_equal(hr_client_get(cl, &go, &out, &rec), 0);
  assert_int_equal(rec.shards, 7);
  assert_int_equal(rec.lanes, 3);
  assert_true(tl_same_elements(t, NULL, out));
  hr_tensor_unref(out);
  /* Tensor-parallel slices: every rank of 4 along each dim, with and
   * without shards; together they cover the tensor. */
  const hr_descriptor *td = hr_tensor_descriptor(t);
  for (unsigned dim = 0; dim < 3; dim++) {
    uint64_t covered = 0;
    for (uint32_t r = 0; r < 4; r++) {
      hr_get_opts so;
      memset(&so, 0, sizeof so);
      if (r & 1) {
        so.flags = HR_REQ_PARALLEL_OK;
        so.max_shards = 3;
      }
      assert_int_equal(hr_client_get_slice(cl, (const uint8_t *)"m", 1, dim, r,
                                           4, &so, &out, &rec),
                       0);
      const hr_descriptor *d = hr_tensor_descriptor(out);
      assert_true(d->flags & HR_DESC_HAS_SHARD);
      assert_int_equal(d->shard_offset[dim], covered);
      covered += d->shape[dim];
      assert_true(tl_same_elements(t, d->shard_offset, out));
      hr_tensor_unref(out);
    }
    assert_int_equal(covered, td->shape[dim]);
  }
  assert_int_equal(hr_client_get_slice(cl, (const uint8_t *)"nope", 4, 0, 0, 2,
                                       NULL, &out, NULL),
                   HR_ERR_NOT_FOUND);
  assert_int_equal(hr_client_get_slice(cl, (const uint8_t *)"m", 1, 3, 0, 2,
                                       NULL, &out, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  hr_client_close(cl);
  a.stop = 1;
  pthread_join(th, NULL);
  hr_tensor_unref(t);
  tl_server_stop(env, &srv);
  tl_free(env);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(parallel_gets),
      cmocka_unit_test(lane_cut),
      cmocka_unit_test(regions_corners_edges),
      cmocka_unit_test(joins_on_the_wire),
      cmocka_unit_test(blocking_client),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
