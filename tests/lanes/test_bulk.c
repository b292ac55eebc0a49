/*
 * Bulk I/O on the worker pool (hr_engine_config.bulk_offload_min), end to
 * end over loopback TCP: byte-exact parallel GETs over 1 to 8 lanes and a
 * PUT with the pool's threads writing and reading the tensor bytes; the
 * same with offloading off (the loop moves every byte, no thread starts);
 * a cancel and a cut connection (either side) while jobs are out, into an
 * application buffer that is freed as soon as its GET completes (ASan
 * sees a worker that would still write there), and the connection or the
 * server serving byte-exact afterwards; a peer that stops reading does
 * not keep the server's only worker from serving another.
 */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/engine.h>
#include <hurray/hr_event.h>
#include <hurray/session.h>
#include <hurray/store.h>

#include "engine_io/tl.h"
#include "lanes/lanes_conn.h"

#define SMALL_MIN (64u * 1024u)

/* Threads of this process (/proc/self/status). */
static int threads_now(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int n = -1;

  if (!f)
    return -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1)
      break;
  fclose(f);
  return n;
}

static hr_engine_config cfg_with(uint64_t bulk_min) {
  hr_engine_config c;
  hr_engine_config_default(&c);
  c.bulk_offload_min = bulk_min;
  c.bulk_offload_lone = 1; /* the 1-lane cases go through the pool too */
  /* Every lane offloaded whatever the CPUs (automatic: none on 2 CPUs
   * with both ends here). */
  c.bulk_offload_jobs = 8;
  c.worker_threads = 8;
  /* Shards of a MB or more: every lane gets some of a test tensor. */
  c.session.shard_bytes = 1u << 20;
  return c;
}

/* ---- GETs ---------------------------------------------------------------- */

typedef struct got {
  int done;
  hr_tensor *t;
  hr_transfer_record rec;
  void *buf; /* the application's buffer, freed when the GET failed */
} got;

static void on_got(hr_session *s, uint32_t sid, hr_tensor *t,
                   const hr_transfer_record *rec, void *ud) {
  got *g = ud;
  (void)s;
  (void)sid;
  g->done = 1;
  g->t = t;
  g->rec = *rec;
  if (!t && g->buf) {
    /* The GET is over: the buffer is the application's again.  A worker
     * still reading into it would be a use after free. */
    free(g->buf);
    g->buf = NULL;
  }
}

static int got_done(void *ud) {
  return ((got *)ud)->done;
}

/* Starts a GET of `key` with up to `k` shards (0: one), into a buffer of
 * `cap` bytes when cap is non-zero. */
static uint32_t get_start(hr_engine *e, cconn *cc, const char *key, uint16_t k,
                          uint64_t cap, got *g) {
  hr_get_opts o;
  hr_get_dest d;
  uint32_t sid = 0;

  memset(&o, 0, sizeof o);
  memset(g, 0, sizeof *g);
  o.key = (const uint8_t *)key;
  o.key_len = (uint16_t)strlen(key);
  if (k) {
    o.flags |= HR_REQ_PARALLEL_OK;
    o.max_shards = k;
  }
  if (cap) {
    g->buf = aligned_alloc(4096, (cap + 4095) / 4096 * 4096);
    assert_non_null(g->buf);
    memset(&d, 0, sizeof d);
    d.buffer = g->buf;
    d.capacity = cap;
    o.dest = &d;
  }
  assert_int_equal(hr_session_get(hr_conn_session(cc->c), &o, on_got, g, &sid),
                   0);
  assert_int_equal(hr_engine_flush(e), 0);
  return sid;
}

/* Checks a finished GET against `t` and releases it. */
static void got_check(got *g, hr_tensor *t) {
  if (g->rec.status)
    fail_msg("GET failed: %s", g->rec.message);
  assert_int_equal(hr_tensor_bytes(g->t), hr_tensor_bytes(t));
  assert_memory_equal(hr_tensor_buffer(g->t, 0), hr_tensor_buffer(t, 0),
                      hr_tensor_bytes(t));
  hr_tensor_unref(g->t);
  free(g->buf);
  g->buf = NULL;
}

/* A GET of `key` as get_start() starts it, run on `env` until it is over
 * and checked byte-exact against `t`; returns the lanes it used. */
static unsigned get_exact(tl_env *env, hr_engine *e, cconn *cc, const char *key,
                          uint16_t k, uint64_t cap, hr_tensor *t) {
  got g;
  get_start(e, cc, key, k, cap, &g);
  assert_true(tl_run(env, got_done, &g, 20000));
  unsigned lanes = g.rec.lanes;
  got_check(&g, t);
  return lanes;
}

static uint64_t conn_rx(cconn *cc) {
  hr_group *grp = hr_session_group(hr_conn_session(cc->c));
  uint64_t sum = 0, rx;
  for (unsigned i = 0; i < hr_conn_lanes(cc->c); i++) {
    hr_session *s = grp ? hr_group_lane(grp, i) : hr_conn_session(cc->c);
    if (!s)
      continue;
    hr_conn_bytes(hr_session_user_data(s), &rx, NULL);
    sum += rx;
  }
  return sum;
}

typedef struct partway {
  cconn *cc;
  got *g;
  uint64_t bytes;
} partway;

/* `bytes` arrived, or the GET is already over. */
static int got_partway(void *ud) {
  partway *p = ud;
  return p->g->done || conn_rx(p->cc) >= p->bytes;
}

/* ---- PUT ----------------------------------------------------------------- */

typedef struct put_done {
  int done;
  hr_transfer_record rec;
} put_done;

static void on_put(hr_session *s, uint32_t sid, const hr_transfer_record *rec,
                   void *ud) {
  put_done *p = ud;
  (void)s;
  (void)sid;
  p->done = 1;
  p->rec = *rec;
}

static int put_finished(void *ud) {
  return ((put_done *)ud)->done;
}

/* ---- byte-exact with and without offloading ------------------------------ */

static void transfers(uint64_t bulk_min) {
  tl_env *env = tl_new(TL_EPOLL);
  tl_server srv;
  hr_engine_config scfg = cfg_with(bulk_min);
  int before = threads_now();

  tl_server_start(env, &srv, &scfg, NULL);
  /* 12 MB: shards of 1.5 MB or more, several frames each. */
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 2, (uint64_t[]){3072, 1024}, 21);
  tl_put(&srv, "w", t);
  hr_engine_config ccfg = cfg_with(bulk_min);
  hr_engine *ce = tl_engine(env, &ccfg);
  for (unsigned lanes = 1; lanes <= 8; lanes++) {
    cconn cc;
    cconn_open(env, ce, srv.url, lanes, &cc);
    assert_int_equal(get_exact(env, ce, &cc, "w", (uint16_t)lanes, 0, t),
                     lanes);
    /* Into the application's buffer, two at once on the same lanes. */
    got a, b;
    get_start(ce, &cc, "w", (uint16_t)lanes, hr_tensor_bytes(t), &a);
    get_start(ce, &cc, "w", (uint16_t)(lanes * 2), hr_tensor_bytes(t), &b);
    assert_true(tl_run(env, got_done, &a, 20000));
    assert_true(tl_run(env, got_done, &b, 20000));
    got_check(&a, t);
    got_check(&b, t);
    cconn_close(env, &cc);
  }
  /* A PUT: the client's workers write, the server's read. */
  {
    cconn cc;
    cconn_open(env, ce, srv.url, 1, &cc);
    hr_tensor *u = tl_dense(HR_ELEM_UINT8, 1, (uint64_t[]){9u << 20}, 22);
    put_done pd = {0};
    assert_int_equal(hr_session_put(hr_conn_session(cc.c),
                                    (const uint8_t *)"u", 1, 0, u, on_put, &pd,
                                    NULL),
                     0);
    assert_int_equal(hr_engine_flush(ce), 0);
    assert_true(tl_run(env, put_finished, &pd, 20000));
    if (pd.rec.status)
      fail_msg("PUT failed: %s", pd.rec.message);
    get_exact(env, ce, &cc, "u", 0, 0, u);
    hr_tensor_unref(u);
    cconn_close(env, &cc);
  }
  /* Offloading starts the pools' threads; without it no thread moves a
   * byte (the old path: nothing but the loop). */
  if (before > 0) {
    if (bulk_min == UINT64_MAX)
      assert_int_equal(threads_now(), before);
    else
      assert_true(threads_now() > before);
  }
  tl_engine_finish(env, ce);
  hr_tensor_unref(t);
  tl_server_stop(env, &srv);
  tl_free(env);
}

static void offloaded(void **state) {
  (void)state;
  transfers(SMALL_MIN);
}

static void on_the_loop(void **state) {
  (void)state;
  transfers(UINT64_MAX);
}

/* By default an engine's only connection moves its bytes on the loop (no
 * thread starts); a second lane turns offloading on. */
static void lone_on_the_loop(void **state) {
  (void)state;
  tl_env *env = tl_new(TL_EPOLL);
  tl_server srv;
  hr_engine_config scfg = cfg_with(SMALL_MIN);
  scfg.bulk_offload_lone = 0;
  int before = threads_now();

  tl_server_start(env, &srv, &scfg, NULL);
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 2, (uint64_t[]){3072, 1024}, 25);
  tl_put(&srv, "w", t);
  hr_engine_config ccfg = cfg_with(SMALL_MIN);
  ccfg.bulk_offload_lone = 0;
  hr_engine *ce = tl_engine(env, &ccfg);
  for (unsigned lanes = 1; lanes <= 2; lanes++) {
    cconn cc;
    cconn_open(env, ce, srv.url, lanes, &cc);
    get_exact(env, ce, &cc, "w", (uint16_t)lanes, 0, t);
    if (before > 0 && lanes == 1)
      assert_int_equal(threads_now(), before);
    if (before > 0 && lanes == 2)
      assert_true(threads_now() > before);
    cconn_close(env, &cc);
  }
  tl_engine_finish(env, ce);
  hr_tensor_unref(t);
  tl_server_stop(env, &srv);
  tl_free(env);
}

/* bulk_offload_jobs automatic: with one CPU (this process pinned to one)
 * no job is ever out, so a 2-lane GET starts no thread and is
 * byte-exact all the same; a client allowed one job offloads again
 * against that server.  A negative setting is refused. */
static void sized_to_cpus(void **state) {
  (void)state;
  cpu_set_t all, one;

  assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
  CPU_ZERO(&one);
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &all)) {
      CPU_SET(i, &one);
      break;
    }
  assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
  tl_env *env = tl_new(TL_EPOLL);
  tl_server srv;
  hr_engine_config scfg = cfg_with(SMALL_MIN);
  scfg.bulk_offload_jobs = 0;
  int before = threads_now();

  tl_server_start(env, &srv, &scfg, NULL);
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 2, (uint64_t[]){3072, 1024}, 26);
  tl_put(&srv, "w", t);
  for (int jobs = 0; jobs <= 1; jobs++) {
    hr_engine_config ccfg = cfg_with(SMALL_MIN);
    ccfg.bulk_offload_jobs = jobs;
    hr_engine *ce = tl_engine(env, &ccfg);
    cconn cc;
    cconn_open(env, ce, srv.url, 2, &cc);
    assert_int_equal(get_exact(env, ce, &cc, "w", 2, 0, t), 2);
    if (before > 0 && jobs == 0)
      assert_int_equal(threads_now(), before);
    if (before > 0 && jobs == 1)
      assert_true(threads_now() > before);
    cconn_close(env, &cc);
    tl_engine_finish(env, ce);
  }
  hr_tensor_unref(t);
  tl_server_stop(env, &srv);
  tl_free(env);
  assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);

  struct event_base *base = event_base_new();
  hr_engine *e = NULL;
  hr_engine_config bad = cfg_with(SMALL_MIN);
  bad.bulk_offload_jobs = -1;
  assert_non_null(base);
  assert_int_equal(hr_ev_attach(&e, base, &bad, NULL), HR_ERR_INVALID_ARGUMENT);
  event_base_free(base);
}

/* ---- a cancel, and cut connections, while jobs are out ------------------- */

/* The server's connections, as on_conn reports them. */
typedef struct srv_conns {
  hr_conn *c[16];
  int n;
} srv_conns;

static void srv_on_conn(hr_conn *c, int event, void *ud) {
  srv_conns *sc = ud;
  if (event == HR_CONN_OPENED && sc->n < 16)
    sc->c[sc->n++] = c;
  if (event == HR_CONN_CLOSED)
    for (int i = 0; i < sc->n; i++)
      if (sc->c[i] == c)
        sc->c[i] = NULL;
}

enum { CANCEL, CUT_CLIENT, CUT_SERVER };

static void interrupted(int how, unsigned lanes) {
  tl_env *env = tl_new(TL_EPOLL);
  tl_server srv;
  srv_conns sc;
  hr_engine_config scfg = cfg_with(SMALL_MIN);

  memset(&sc, 0, sizeof sc);
  scfg.on_conn = srv_on_conn;
  scfg.user_data = &sc;
  tl_server_start(env, &srv, &scfg, NULL);
  /* 48 MB: the interruption lands mid-transfer. */
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 2, (uint64_t[]){3072, 4096}, 23);
  tl_put(&srv, "w", t);
  hr_engine_config ccfg = cfg_with(SMALL_MIN);
  hr_engine *ce = tl_engine(env, &ccfg);
  cconn cc;
  cconn_open(env, ce, srv.url, lanes, &cc);
  got g;
  uint32_t sid =
      get_start(ce, &cc, "w", (uint16_t)lanes, hr_tensor_bytes(t), &g);
  partway pw = {&cc, &g, 8u << 20};
  assert_true(tl_run(env, got_partway, &pw, 20000));
  if (!g.done) {
    if (how == CANCEL) {
      assert_int_equal(hr_session_cancel(hr_conn_session(cc.c), sid), 0);
      assert_int_equal(hr_engine_flush(ce), 0);
    } else if (how == CUT_CLIENT) {
      hr_conn_abort(cc.c);
    } else {
      /* The last lane's server side (lane 0 with one lane). */
      for (int i = sc.n - 1; i >= 0; i--)
        if (sc.c[i]) {
          hr_conn_abort(sc.c[i]);
          break;
        }
    }
  }
  assert_true(tl_run(env, got_done, &g, 20000));
  if (g.rec.status == 0) {
    got_check(&g, t); /* it finished before the interruption took */
  } else {
    assert_null(g.t);
    assert_null(g.buf); /* freed in the completion */
  }
  if (how == CANCEL) {
    /* The lanes are intact: the next GET is byte-exact. */
    get_exact(env, ce, &cc, "w", (uint16_t)lanes, hr_tensor_bytes(t), t);
    hr_conn_close(cc.c);
  } else if (how == CUT_SERVER && lanes == 1) {
    /* Lane 0 went: the connection closed. */
    assert_true(tl_run(env, cconn_closed, &cc, TL_WAIT_MS));
  } else if (how == CUT_SERVER) {
    hr_conn_close(cc.c);
  }
  assert_true(tl_run(env, cconn_closed, &cc, TL_WAIT_MS));
  /* The server goes on: a new connection gets the tensor. */
  cconn_open(env, ce, srv.url, lanes, &cc);
  get_exact(env, ce, &cc, "w", (uint16_t)lanes, 0, t);
  cconn_close(env, &cc);
  tl_engine_finish(env, ce);
  hr_tensor_unref(t);
  tl_server_stop(env, &srv);
  tl_free(env);
}

static void cancel_while_out(void **state) {
  (void)state;
  interrupted(CANCEL, 1);
  interrupted(CANCEL, 4);
}

static void client_cut_while_out(void **state) {
  (void)state;
  interrupted(CUT_CLIENT, 1);
  interrupted(CUT_CLIENT, 4);
}

static void server_cut_while_out(void **state) {
  (void)state;
  interrupted(CUT_SERVER, 1);
  interrupted(CUT_SERVER, 4);
}

/* ---- a peer that stops reading ------------------------------------------ */

typedef struct two {
  tl_env *a, *b;
} two;

/* Runs both loops in turn until done(ud) or timeout_ms. */
static int pump(two *w, int (*done)(void *), void *ud, int timeout_ms) {
  for (int t = 0; t < timeout_ms; t += 2) {
    if (tl_run(w->a, done, ud, 1) || tl_run(w->b, done, ud, 1))
      return 1;
  }
  return done(ud);
}

static void stalled_peer(void **state) {
  (void)state;
  /* The server and client B on one loop, client A on another that stops
   * running: A's socket fills, the job writing to it gives up, the
   * server's only worker serves B meanwhile, and A gets every byte once
   * it reads again. */
  two w = {tl_new(TL_EPOLL), tl_new(TL_EPOLL)};
  tl_server srv;
  hr_engine_config scfg = cfg_with(SMALL_MIN);
  scfg.worker_threads = 1;
  scfg.socket_buffer = 128 * 1024;
  tl_server_start(w.a, &srv, &scfg, NULL);
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 2, (uint64_t[]){3072, 1024}, 24);
  tl_put(&srv, "w", t);
  hr_engine_config ccfg = cfg_with(SMALL_MIN);
  ccfg.socket_buffer = 128 * 1024;
  hr_engine *ea = tl_engine(w.b, &ccfg);
  hr_engine *eb = tl_engine(w.a, &ccfg);
  cconn ca, cb;
  memset(&ca, 0, sizeof ca);
  assert_int_equal(
      hr_engine_connect_group(ea, srv.url, 1, NULL, cconn_on_conn, &ca, &ca.c), 0);
  assert_true(pump(&w, cconn_settled, &ca, TL_WAIT_MS));
  assert_true(ca.up);
  cconn_open(w.a, eb, srv.url, 1, &cb);
  got ga;
  get_start(ea, &ca, "w", 0, 0, &ga);
  partway pw = {&ca, &ga, 1u << 20};
  assert_true(pump(&w, got_partway, &pw, TL_WAIT_MS));
  assert_false(ga.done);
  /* A stops reading: alone, the job writing to it gives up after 200 ms
   * and the loop takes A's bytes back. */
  tl_spin(w.a, 400);
  assert_false(ga.done);
  /* B's GET must not wait for A (a job that would wait yields). */
  get_exact(w.a, eb, &cb, "w", 0, 0, t);
  /* A reads again and gets every byte. */
  assert_true(pump(&w, got_done, &ga, 20000));
  got_check(&ga, t);
  hr_conn_close(ca.c);
  assert_true(pump(&w, cconn_closed, &ca, TL_WAIT_MS));
  cconn_close(w.a, &cb);
  tl_engine_finish(w.b, ea);
  tl_engine_finish(w.a, eb);
  hr_tensor_unref(t);
  tl_server_stop(w.a, &srv);
  tl_free(w.a);
  tl_free(w.b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(offloaded),
      cmocka_unit_test(on_the_loop),
      cmocka_unit_test(lone_on_the_loop),
      cmocka_unit_test(sized_to_cpus),
      cmocka_unit_test(cancel_while_out),
      cmocka_unit_test(client_cut_while_out),
      cmocka_unit_test(server_cut_while_out),
      cmocka_unit_test(stalled_peer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
