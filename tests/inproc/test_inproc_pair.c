/*
 * The in-process server/client pair: a client engine and a server engine
 * (a store provider) connected through a hub, on two threads and on one
 * loop.  GET hands the stored tensor by reference (pointer identity),
 * its release reaches the server's loop thread exactly once after the
 * client drops it; PUT and LIST go through the same provider callbacks;
 * errors are the network's (NOT_FOUND, DEVICE_UNAVAILABLE); a transcode
 * when the client asks for another layout; closing the server or the
 * connection with requests and handles outstanding.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/inproc.h>
#include <hurray/store.h>

#include "common/test_util.h"
#include "tl.h"

/* A stored tensor whose release records the thread that made it. */
typedef struct owned {
  uint8_t *buf;
  int released; /* atomic */
  pthread_t by;
} owned;

static void owned_release(void *ctx) {
  owned *o = ctx;
  o->by = pthread_self();
  __atomic_add_fetch(&o->released, 1, __ATOMIC_SEQ_CST);
}

static hr_tensor *owned_tensor(owned *o, uint64_t rows, uint64_t cols) {
  hr_descriptor d;
  hr_tensor *t;
  memset(o, 0, sizeof *o);
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_UINT8;
  d.rank = 2;
  d.shape[0] = rows;
  d.shape[1] = cols;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  d.buffers[0].size_bytes = rows * cols;
  o->buf = malloc(rows * cols);
  for (uint64_t i = 0; i < rows * cols; i++)
    o->buf[i] = (uint8_t)(i * 7 + 1);
  void *bufs[1] = {o->buf};
  assert_int_equal(hr_tensor_wrap(&t, &d, bufs, owned_release, o, NULL), 0);
  return t;
}

/* ---- a fixture: a server engine and a client engine ------------------- */

typedef struct fx {
  tl_env *senv, *cenv; /* the same env on one loop */
  hr_engine *se, *ce;
  hr_store *store;
  hr_inproc_hub *hub;
  hr_inproc_server *srv;
  hr_inproc_conn *conn;
  owned w;
  hr_tensor *weights;
  int threaded;
  pthread_t sth;
  int stop; /* atomic: the server thread's loop ends */
} fx;

static void fx_start(fx *f, int threaded, int mode) {
  memset(f, 0, sizeof *f);
  f->threaded = threaded;
  f->senv = tl_new(mode);
  f->cenv = threaded ? tl_new(mode) : f->senv;
  f->se = tl_engine(f->senv, NULL);
  f->ce = tl_engine(f->cenv, NULL);
  hr_store_config sc;
  hr_store_config_default(&sc);
  sc.allow_put = 1;
  sc.allow_replace = 1;
  assert_int_equal(hr_store_new(&f->store, &sc, NULL), 0);
  f->weights = owned_tensor(&f->w, 64, 32);
  assert_int_equal(hr_store_put(f->store, "w", 1, f->weights, 0), 0);
  assert_int_equal(hr_inproc_hub_new(&f->hub, NULL), 0);
  hr_provider p;
  hr_store_provider(f->store, &p);
  assert_int_equal(hr_inproc_listen(f->hub, f->se, "model", &p, &f->srv), 0);
  assert_int_equal(
      hr_inproc_listen(f->hub, f->se, "model", &p, &(hr_inproc_server *){0}),
      HR_ERR_BUSY);
  assert_int_equal(hr_inproc_connect(f->hub, f->ce, "nobody", &f->conn),
                   HR_ERR_NOT_FOUND);
  assert_int_equal(hr_inproc_connect(f->hub, f->ce, "model", &f->conn), 0);
}

static int stopped(void *ud) {
  return __atomic_load_n((int *)ud, __ATOMIC_SEQ_CST);
}

static void *server_thread(void *arg) {
  fx *f = arg;
  tl_run(f->senv, stopped, &f->stop, 60000);
  return NULL;
}

static void fx_run_server(fx *f) {
  if (f->threaded)
    assert_int_equal(pthread_create(&f->sth, NULL, server_thread, f), 0);
}

static void fx_stop_server(fx *f) {
  if (!f->threaded)
    return;
  __atomic_store_n(&f->stop, 1, __ATOMIC_SEQ_CST);
  hr_engine_wakeup(f->se);
  pthread_join(f->sth, NULL);
}

/* Runs the client's loop (and, on one loop, the server's) until *flag. */
static void fx_wait(fx *f, int *flag) {
  assert_true(tl_run(f->cenv, stopped, flag, TL_WAIT_MS));
}

/* Runs `env` until *p (read atomically) equals `want`: a release or a
 * cancel travels to its loop as a message, which takes a turn of it. */
typedef struct int_is {
  const int *p;
  int want;
} int_is;

static int int_reached(void *ud) {
  int_is *w = ud;
  return __atomic_load_n(w->p, __ATOMIC_SEQ_CST) == w->want;
}

static void wait_int(tl_env *env, const int *p, int want) {
  int_is w = {p, want};
  assert_true(tl_run(env, int_reached, &w, TL_WAIT_MS));
}

/* Runs `env` until the hub counts `want` live handles. */
typedef struct live_is {
  hr_inproc_hub *hub;
  uint64_t want;
} live_is;

static int live_reached(void *ud) {
  live_is *w = ud;
  hr_handoff_counts c;
  hr_inproc_hub_counts(w->hub, &c);
  return c.live == w->want;
}

static void wait_live(tl_env *env, hr_inproc_hub *hub, uint64_t want) {
  live_is w = {hub, want};
  assert_true(tl_run(env, live_reached, &w, TL_WAIT_MS));
}

static void fx_finish(fx *f) {
  hr_inproc_conn_close(f->conn);
  hr_inproc_server_close(f->srv);
  tl_spin(f->cenv, 20);
  if (f->threaded)
    tl_spin(f->senv, 20);
  tl_engine_finish(f->cenv, f->ce);
  tl_engine_finish(f->senv, f->se);
  hr_store_del(f->store);
  hr_tensor_unref(f->weights);
  assert_int_equal(f->w.released, 1);
  free(f->w.buf);
  hr_handoff_counts c;
  assert_int_equal(hr_inproc_hub_del(f->hub, &c), 0);
  assert_int_equal(c.double_releases, 0);
  assert_int_equal(c.missing_releases, 0);
  assert_int_equal(c.accepted, c.buffer_releases);
  if (f->threaded)
    tl_free(f->cenv);
  tl_free(f->senv);
}

/* ---- completions ------------------------------------------------------- */

typedef struct got {
  int done;
  int status;
  uint32_t wire;
  hr_tensor *t;
  hr_transfer_record rec;
  pthread_t on;
} got;

static void on_get(hr_session *s, uint32_t sid, hr_tensor *t,
                   const hr_transfer_record *rec, void *ud) {
  got *g = ud;
  assert_null(s);
  (void)sid;
  g->status = rec->status;
  g->wire = rec->wire_error;
  g->t = t;
  g->rec = *rec;
  g->on = pthread_self();
  __atomic_store_n(&g->done, 1, __ATOMIC_SEQ_CST);
}

static void get_key(fx *f, const char *key, const hr_get_opts *o, got *g) {
  hr_get_opts opts;
  if (o)
    opts = *o;
  else
    memset(&opts, 0, sizeof opts);
  opts.key = (const uint8_t *)key;
  opts.key_len = (uint16_t)strlen(key);
  memset(g, 0, sizeof *g);
  assert_int_equal(hr_inproc_get(f->conn, &opts, on_get, g, NULL), 0);
  /* Never completed from inside the call. */
  assert_int_equal(g->done, 0);
  fx_wait(f, &g->done);
}

typedef struct put_done {
  int done;
  int status;
  uint32_t wire;
} put_done;

static void on_put(hr_session *s, uint32_t sid, const hr_transfer_record *rec,
                   void *ud) {
  put_done *p = ud;
  (void)s;
  (void)sid;
  p->status = rec->status;
  p->wire = rec->wire_error;
  __atomic_store_n(&p->done, 1, __ATOMIC_SEQ_CST);
}

typedef struct list_done {
  int done;
  int status;
  int count;
  int more;
  char keys[8][16];
} list_done;

static void on_list(hr_session *s, int status, uint32_t wire,
                    const hr_list_response *resp, void *ud) {
  list_done *l = ud;
  (void)s;
  (void)wire;
  l->status = status;
  if (status == 0) {
    size_t pos = 0;
    hr_list_entry e;
    while (hr_list_entry_next(resp->entries_raw, resp->entries_raw_len, &pos,
                              &e) == 1 &&
           l->count < 8) {
      memcpy(l->keys[l->count], e.key, e.key_len < 15 ? e.key_len : 15);
      l->count++;
    }
    l->more = resp->more;
  }
  __atomic_store_n(&l->done, 1, __ATOMIC_SEQ_CST);
}

/* ---- the flows --------------------------------------------------------- */

static void flows(int threaded, int mode) {
  fx f;
  fx_start(&f, threaded, mode);
  fx_run_server(&f);

  /* GET: the stored tensor itself, by reference. */
  got g;
  get_key(&f, "w", NULL, &g);
  assert_int_equal(g.status, 0);
  assert_non_null(g.t);
  assert_ptr_equal(hr_tensor_buffer(g.t, 0), f.w.buf); /* zero copy */
  assert_int_equal(hr_tensor_descriptor(g.t)->shape[0], 64);
  assert_int_equal(g.rec.bytes, 64 * 32);
  assert_int_equal(g.rec.transcoded, 0);
  assert_true(pthread_equal(g.on, pthread_self()));

  /* A second GET of the same tensor shares the same buffers. */
  got g2;
  get_key(&f, "w", NULL, &g2);
  assert_ptr_equal(hr_tensor_buffer(g2.t, 0), f.w.buf);
  hr_handoff_counts c;
  hr_inproc_hub_counts(f.hub, &c);
  assert_int_equal(c.live, 2);

  /* Errors as over a socket. */
  got miss;
  get_key(&f, "nope", NULL, &miss);
  assert_int_equal(miss.status, HR_ERR_REMOTE);
  assert_int_equal(miss.wire, HR_WIRE_NOT_FOUND);
  assert_null(miss.t);
  hr_get_opts o;
  memset(&o, 0, sizeof o);
  o.preferred_device = HR_DEV_CUDA;
  got dev;
  get_key(&f, "w", &o, &dev);
  assert_int_equal(dev.status, HR_ERR_REMOTE);
  assert_int_equal(dev.wire, HR_WIRE_DEVICE_UNAVAILABLE);
  /* REGION and an application destination are refused at once. */
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)"w";
  o.key_len = 1;
  o.flags = HR_REQ_REGION;
  assert_int_equal(hr_inproc_get(f.conn, &o, on_get, &dev, NULL),
                   HR_ERR_UNSUPPORTED);

  /* Another layout: a transcode (a copy), row-major bytes transposed. */
  hr_layout_entry cm = {HR_LAYOUT_COLUMN_MAJOR, 0, NULL};
  memset(&o, 0, sizeof o);
  o.layouts = &cm;
  o.layout_count = 1;
  o.flags = HR_REQ_ALLOW_TRANSCODE;
  got tx;
  get_key(&f, "w", &o, &tx);
  assert_int_equal(tx.status, 0);
  assert_int_equal(hr_tensor_descriptor(tx.t)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  assert_int_equal(tx.rec.transcoded, 1);
  assert_ptr_not_equal(hr_tensor_buffer(tx.t, 0), f.w.buf);
  assert_true(tl_same_elements(f.weights, NULL, tx.t));
  /* Without ALLOW_TRANSCODE: the native layout (the fall-through). */
  o.flags = 0;
  got nat;
  get_key(&f, "w", &o, &nat);
  assert_int_equal(nat.status, 0);
  assert_ptr_equal(hr_tensor_buffer(nat.t, 0), f.w.buf);
  hr_tensor_unref(nat.t);
  hr_tensor_unref(tx.t);

  /* PUT: the provider commits a tensor over the client's buffers. */
  owned pw;
  hr_tensor *pt = owned_tensor(&pw, 4, 4);
  put_done pd = {0};
  assert_int_equal(
      hr_inproc_put(f.conn, (const uint8_t *)"p", 1, 0, pt, on_put, &pd, NULL),
      0);
  fx_wait(&f, &pd.done);
  assert_int_equal(pd.status, 0);
  put_done dup = {0};
  assert_int_equal(
      hr_inproc_put(f.conn, (const uint8_t *)"p", 1, 0, pt, on_put, &dup, NULL),
      0);
  fx_wait(&f, &dup.done);
  assert_int_equal(dup.status, HR_ERR_REMOTE);
  assert_int_equal(dup.wire, HR_WIRE_ALREADY_EXISTS);
  got back;
  get_key(&f, "p", NULL, &back);
  assert_int_equal(back.status, 0);
  assert_ptr_equal(hr_tensor_buffer(back.t, 0), pw.buf);
  hr_tensor_unref(back.t);
  hr_tensor_unref(pt);

  /* LIST through on_list. */
  list_done ld = {0};
  assert_int_equal(hr_inproc_list(f.conn, NULL, 0, NULL, 0, 1, on_list, &ld),
                   0);
  fx_wait(&f, &ld.done);
  assert_int_equal(ld.status, 0);
  assert_int_equal(ld.count, 1);
  assert_string_equal(ld.keys[0], "p");
  assert_int_equal(ld.more, 1);

  /* The client drops its tensors: each release reaches the server once,
   * on the server's loop thread; the stored tensor is untouched. */
  hr_tensor_unref(g.t);
  hr_tensor_unref(g2.t);
  fx_stop_server(&f);
  wait_live(f.senv, f.hub, 1); /* only the PUT, which the store holds */
  hr_inproc_hub_counts(f.hub, &c);
  assert_int_equal(c.live, 1);
  assert_int_equal(c.double_releases, 0);
  assert_int_equal(f.w.released, 0);

  /* The PUT tensor lives in the store; removing it drops the server's
   * reference, whose release goes back to the client's loop. */
  assert_int_equal(hr_store_remove(f.store, "p", 1), 0);
  wait_int(f.cenv, &pw.released, 1);
  assert_int_equal(pw.released, 1);
  assert_true(pthread_equal(pw.by, pthread_self()));
  hr_inproc_hub_counts(f.hub, &c);
  assert_int_equal(c.live, 0);
  free(pw.buf);
  fx_finish(&f);
}

static void test_two_threads(void **state) {
  (void)state;
  flows(1, TL_EPOLL);
}

static void test_one_loop(void **state) {
  (void)state;
  flows(0, TL_LIBEVENT);
}

/* The release runs on the server's loop thread, not the client's. */
static void test_release_on_server_thread(void **state) {
  (void)state;
  fx f;
  fx_start(&f, 1, TL_EPOLL);
  owned o;
  hr_tensor *t = owned_tensor(&o, 8, 8);
  assert_int_equal(hr_store_put(f.store, "t", 1, t, 0), 0);
  hr_tensor_unref(t);
  fx_run_server(&f);
  got g;
  get_key(&f, "t", NULL, &g);
  assert_int_equal(g.status, 0);
  /* The server forgets the key: the client's handle keeps the buffers. */
  fx_stop_server(&f);
  assert_int_equal(hr_store_remove(f.store, "t", 1), 0);
  assert_int_equal(o.released, 0);
  assert_int_equal(g.t ? hr_tensor_buffer(g.t, 0) == o.buf : 0, 1);
  f.stop = 0;
  fx_run_server(&f);
  hr_tensor_unref(g.t);
  wait_int(f.cenv, &o.released, 1);
  assert_int_equal(o.released, 1);
  fx_stop_server(&f);
  assert_false(pthread_equal(o.by, pthread_self()));
  free(o.buf);
  fx_finish(&f);
}

/* A provider that never answers: closing the server cancels the GET. */
typedef struct slow {
  hr_srv_get *held;
  int cancelled;
} slow;

static int holds_get(void *ud) {
  return ((slow *)ud)->held != NULL;
}

/* Runs the server's loop until the slow provider holds a GET (the
 * request reaches it as a message, which takes a turn of the loop). */
static void wait_held(fx *f, slow *sl) {
  assert_true(tl_run(f->senv, holds_get, sl, TL_WAIT_MS));
}

static int slow_get(hr_session *s, hr_srv_get *g, void *ud) {
  slow *sl = ud;
  assert_non_null(s);
  assert_null(hr_session_user_data(s));
  assert_non_null(hr_srv_get_info(g));
  sl->held = g;
  return 0;
}

static void slow_cancel(hr_session *s, hr_srv_get *g, void *ud) {
  slow *sl = ud;
  (void)s;
  assert_ptr_equal(g, sl->held);
  sl->cancelled++;
}

/* Serves the slow provider `sl` as `name` on the server's engine and
 * connects to it from the client's. */
static hr_inproc_conn *slow_open(fx *f, slow *sl, const char *name,
                                 hr_inproc_server **ss) {
  hr_provider p;
  memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.user_data = sl;
  p.on_get = slow_get;
  p.on_get_cancel = slow_cancel;
  hr_inproc_conn *sc;
  assert_int_equal(hr_inproc_listen(f->hub, f->se, name, &p, ss), 0);
  assert_int_equal(hr_inproc_connect(f->hub, f->ce, name, &sc), 0);
  return sc;
}

/* Starts a GET of `key` on `sc` completing into `g` (zeroed first). */
static void slow_get_start(hr_inproc_conn *sc, const char *key, got *g) {
  hr_get_opts o;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)key;
  o.key_len = (uint16_t)strlen(key);
  memset(g, 0, sizeof *g);
  assert_int_equal(hr_inproc_get(sc, &o, on_get, g, NULL), 0);
}

static void test_close_with_outstanding(void **state) {
  (void)state;
  fx f;
  fx_start(&f, 0, TL_EPOLL);
  slow sl = {0};
  hr_inproc_server *ss;
  hr_inproc_conn *sc = slow_open(&f, &sl, "slow", &ss);

  /* A handle outstanding on the store server, then its server closes. */
  got g;
  get_key(&f, "w", NULL, &g);
  assert_int_equal(g.status, 0);
  hr_inproc_server_close(f.srv);
  f.srv = NULL;
  got after;
  get_key(&f, "w", NULL, &after);
  assert_int_equal(after.status, HR_ERR_CLOSED);

  /* A GET the slow provider holds: the server's close cancels it. */
  got held;
  slow_get_start(sc, "x", &held);
  wait_held(&f, &sl);
  assert_int_equal(held.done, 0);
  assert_int_equal(hr_inproc_conn_pending(sc), 1);
  hr_inproc_server_close(ss);
  assert_int_equal(sl.cancelled, 1);
  fx_wait(&f, &held.done);
  assert_int_equal(held.status, HR_ERR_CLOSED);
  hr_inproc_conn_close(sc);

  /* The outstanding buffers are still valid and readable. */
  assert_int_equal(((uint8_t *)hr_tensor_buffer(g.t, 0))[5], f.w.buf[5]);
  hr_handoff_counts c;
  hr_inproc_hub_counts(f.hub, &c);
  assert_int_equal(c.live, 1);
  /* The hub is busy while the handle is out. */
  hr_inproc_conn_close(f.conn);
  f.conn = NULL;
  tl_spin(f.cenv, 20);
  assert_int_equal(hr_inproc_hub_del(f.hub, NULL), HR_ERR_BUSY);
  /* The engines may go: the release then runs on the dropping thread. */
  tl_engine_finish(f.senv, f.se);
  tl_engine_finish(f.cenv, f.ce);
  hr_store_del(f.store);
  hr_tensor_unref(f.weights);
  assert_int_equal(f.w.released, 0);
  hr_tensor_unref(g.t);
  assert_int_equal(f.w.released, 1);
  free(f.w.buf);
  assert_int_equal(hr_inproc_hub_del(f.hub, &c), 0);
  assert_int_equal(c.missing_releases, 0);
  assert_int_equal(c.double_releases, 0);
  tl_free(f.senv);
}

/* Closing the connection completes its pending requests with CLOSED and
 * cancels them on the server. */
static void test_conn_close_pending(void **state) {
  (void)state;
  fx f;
  fx_start(&f, 0, TL_EPOLL);
  slow sl = {0};
  hr_inproc_server *ss;
  hr_inproc_conn *sc = slow_open(&f, &sl, "slow", &ss);
  /* The engine refuses to go while the pair is open on it. */
  assert_int_equal(hr_engine_del(f.se), HR_ERR_BUSY);
  got held;
  slow_get_start(sc, "x", &held);
  wait_held(&f, &sl);
  hr_inproc_conn_close(sc);
  assert_int_equal(held.done, 0); /* not from inside the call */
  fx_wait(&f, &held.done);
  assert_int_equal(held.status, HR_ERR_CLOSED);
  wait_int(f.senv, &sl.cancelled, 1);
  assert_int_equal(sl.cancelled, 1);
  hr_inproc_server_close(ss);
  fx_finish(&f);
}

/* A channel whose consumer lives on an engine's loop: every send wakes
 * the engine, whose on_wakeup drains the channel (no polling). */
typedef struct woke {
  hr_inproc_chan *ch;
  int got;
  int wakeups;
  int closed;
  uint8_t buf[64][8];
} woke;

static void drain(hr_engine *e, void *ud) {
  woke *w = ud;
  hr_inproc_msg *m;
  int rv;
  (void)e;
  w->wakeups++;
  while ((rv = hr_inproc_recv(w->ch, &m)) == 0) {
    assert_ptr_equal(hr_tensor_buffer(hr_inproc_msg_tensor(m), 0),
                     w->buf[w->got]);
    assert_int_equal(hr_inproc_msg_release(m), 0);
    hr_inproc_msg_del(m);
    w->got++;
  }
  if (rv == HR_ERR_CLOSED)
    w->closed = 1;
}

static void *chan_producer(void *arg) {
  woke *w = arg;
  for (int i = 0; i < 64; i++) {
    hr_descriptor d = tu_bytes_desc(8, 0, HR_DEV_CPU);
    hr_tensor *t;
    void *bufs[1] = {w->buf[i]};
    assert_int_equal(hr_tensor_wrap(&t, &d, bufs, NULL, NULL, NULL), 0);
    assert_int_equal(hr_inproc_send_wait(w->ch, t, NULL, -1, NULL), 0);
    hr_tensor_unref(t);
  }
  hr_inproc_chan_close(w->ch);
  return NULL;
}

static int all_in(void *ud) {
  return ((woke *)ud)->closed;
}

static void test_chan_wakes_engine(void **state) {
  (void)state;
  woke w;
  memset(&w, 0, sizeof w);
  tl_env *env = tl_new(TL_EPOLL);
  hr_engine_config ec;
  hr_engine_config_default(&ec);
  ec.on_wakeup = drain;
  ec.user_data = &w;
  hr_engine *e = tl_engine(env, &ec);
  hr_inproc_chan_config cc;
  hr_inproc_chan_config_default(&cc);
  cc.capacity = 4;
  cc.wake_engine = e;
  assert_int_equal(hr_inproc_chan_new(&w.ch, &cc, NULL), 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, chan_producer, &w), 0);
  assert_true(tl_run(env, all_in, &w, TL_WAIT_MS));
  pthread_join(th, NULL);
  assert_int_equal(w.got, 64);
  assert_true(w.wakeups >= 1);
  /* The engine goes first: a wakeup still pending runs drain(), which
   * must find the channel alive.  No sender is left, so nothing wakes the
   * freed engine. */
  tl_engine_finish(env, e);
  hr_handoff_counts c;
  assert_int_equal(hr_inproc_chan_del(w.ch, &c), 0);
  assert_int_equal(c.buffer_releases, 64);
  assert_int_equal(c.missing_releases, 0);
  tl_free(env);
}

/* A composite is handed member by member by reference; the server's
 * reference goes when the client's last member does. */
static void test_composite_by_reference(void **state) {
  (void)state;
  fx f;
  fx_start(&f, 0, TL_EPOLL);
  owned a, b;
  hr_tensor *ta = owned_tensor(&a, 2, 3), *tb = owned_tensor(&b, 5, 3);
  hr_tensor *ab[2] = {ta, tb};
  hr_descriptor h;
  memset(&h, 0, sizeof h);
  h.descriptor_version = 1;
  h.element_type = HR_ELEM_NONE;
  h.layout.tag = HR_LAYOUT_COMPOSITE;
  h.params.member_count = 2;
  h.params.rule = HR_COMPOSITE_TUPLE;
  hr_tensor *comp;
  hr_wire_status st;
  assert_int_equal(hr_tensor_new_composite(&comp, &h, ab, 2, NULL, &st), 0);
  hr_tensor_unref(ta);
  hr_tensor_unref(tb);
  assert_int_equal(hr_store_put(f.store, "c", 1, comp, 0), 0);
  hr_tensor_unref(comp);
  got g;
  get_key(&f, "c", NULL, &g);
  assert_int_equal(g.status, 0);
  assert_int_equal(hr_tensor_member_count(g.t), 2);
  assert_ptr_equal(hr_tensor_buffer(hr_tensor_member(g.t, 0), 0), a.buf);
  assert_ptr_equal(hr_tensor_buffer(hr_tensor_member(g.t, 1), 0), b.buf);
  assert_int_equal(g.rec.bytes, 6 + 15);
  /* Keep one member, drop the composite: the server keeps its reference. */
  hr_tensor *keep = hr_tensor_ref(hr_tensor_member(g.t, 1));
  hr_tensor_unref(g.t);
  assert_int_equal(hr_store_remove(f.store, "c", 1), 0);
  tl_spin(f.senv, 20);
  assert_int_equal(a.released + b.released, 0);
  hr_handoff_counts c;
  hr_inproc_hub_counts(f.hub, &c);
  assert_int_equal(c.live, 1);
  hr_tensor_unref(keep);
  wait_int(f.senv, &a.released, 1);
  wait_int(f.senv, &b.released, 1);
  assert_int_equal(a.released, 1);
  assert_int_equal(b.released, 1);
  free(a.buf);
  free(b.buf);
  fx_finish(&f);
}

/* A provider that answers later, from its own code on the loop thread. */
static void test_answer_later(void **state) {
  (void)state;
  fx f;
  fx_start(&f, 0, TL_LIBEVENT);
  slow sl = {0};
  hr_inproc_server *ss;
  hr_inproc_conn *sc = slow_open(&f, &sl, "later", &ss);
  got g;
  slow_get_start(sc, "k", &g);
  wait_held(&f, &sl);
  const hr_get_info *info = hr_srv_get_info(sl.held);
  assert_non_null(info);
  assert_int_equal(info->key_len, 1);
  assert_int_equal(info->key[0], 'k');
  assert_int_equal(g.done, 0);
  assert_int_equal(hr_get_answer(sl.held, f.weights), 0);
  fx_wait(&f, &g.done);
  assert_int_equal(g.status, 0);
  assert_ptr_equal(hr_tensor_buffer(g.t, 0), f.w.buf);
  hr_tensor_unref(g.t);
  /* And a refusal, later too (the first GET's handle is spent). */
  sl.held = NULL;
  slow_get_start(sc, "k", &g);
  wait_held(&f, &sl);
  assert_int_equal(hr_get_fail(sl.held, HR_WIRE_UNAUTHORIZED, "no"), 0);
  fx_wait(&f, &g.done);
  assert_int_equal(g.status, HR_ERR_REMOTE);
  assert_int_equal(g.wire, HR_WIRE_UNAUTHORIZED);
  assert_string_equal(g.rec.message, "no");
  assert_int_equal(sl.cancelled, 0);
  hr_inproc_conn_close(sc);
  hr_inproc_server_close(ss);
  fx_finish(&f);
}

/* Server and client on one engine. */
static void test_same_engine(void **state) {
  (void)state;
  fx f;
  fx_start(&f, 0, TL_EPOLL);
  hr_inproc_conn *self;
  assert_int_equal(hr_inproc_connect(f.hub, f.se, "model", &self), 0);
  hr_get_opts o;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)"w";
  o.key_len = 1;
  got g;
  memset(&g, 0, sizeof g);
  assert_int_equal(hr_inproc_get(self, &o, on_get, &g, NULL), 0);
  assert_true(tl_run(f.senv, stopped, &g.done, TL_WAIT_MS));
  assert_int_equal(g.status, 0);
  assert_ptr_equal(hr_tensor_buffer(g.t, 0), f.w.buf);
  hr_tensor_unref(g.t);
  hr_inproc_conn_close(self);
  fx_finish(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_threads),
      cmocka_unit_test(test_one_loop),
      cmocka_unit_test(test_release_on_server_thread),
      cmocka_unit_test(test_close_with_outstanding),
      cmocka_unit_test(test_conn_close_pending),
      cmocka_unit_test(test_chan_wakes_engine),
      cmocka_unit_test(test_composite_by_reference),
      cmocka_unit_test(test_answer_later),
      cmocka_unit_test(test_same_engine),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
