/*
 * "inproc:NAME" URLs: engines that share an hr_inproc_hub (their
 * config.inproc_hub) listen and connect by name, with the whole protocol
 * over a private socketpair: GET, PUT and LIST through a store provider,
 * on one loop and with the server on a thread of its own; lanes of a
 * group; SHM for a segment-backed tensor; the errors (no hub, no name,
 * a name taken, a hub server's name, the hub busy); a listener that
 * closes with a connection handed over but not yet taken.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/inproc.h>
#include <hurray/shm.h>
#include <hurray/store.h>

#include "tc.h"
#include "tl.h"

static hr_engine_config hub_cfg(hr_inproc_hub *hub) {
  hr_engine_config c;

  hr_engine_config_default(&c);
  c.inproc_hub = hub;
  return c;
}

/* A store server listening on "inproc:NAME" (and, as tl_server does, on
 * TCP, which nobody uses here). */
static void server_start(tl_env *env, tl_server *ts, hr_inproc_hub *hub,
                         const char *name, hr_listener **l) {
  hr_engine_config c = hub_cfg(hub);
  hr_provider prov;
  char url[300];

  tl_server_start(env, ts, &c, NULL);
  hr_store_provider(ts->store, &prov);
  snprintf(url, sizeof url, "inproc:%s", name);
  assert_int_equal(hr_engine_listen(ts->e, url, &prov, l), 0);
  assert_int_equal(hr_listener_port(*l), -1);
}

static void flows(tl_env *env, hr_engine *ce, hr_tensor *m) {
  tc_conn c;
  tc_res r;

  tc_open(env, ce, "inproc:model", &c);
  assert_int_equal(tc_get_key(&c, "m", &r), 0);
  assert_true(tl_same_elements(m, NULL, r.t));
  tc_res_clear(&r);
  assert_int_equal(tc_put(&c, "p", 0, m, &r), 0);
  tc_res_clear(&r);
  assert_int_equal(tc_get_key(&c, "p", &r), 0);
  assert_true(tl_same_elements(m, NULL, r.t));
  tc_res_clear(&r);
  assert_int_equal(tc_list(&c, "", "", 10, &r), 0);
  assert_int_equal(r.nentries, 2);
  assert_string_equal(r.keys[0], "m");
  assert_string_equal(r.keys[1], "p");
  tc_res_clear(&r);
  tc_close(&c);
}

/* Both engines on one loop (each of its two kinds). */
static void one_loop(int mode) {
  tl_env *env = tl_new(mode);
  hr_inproc_hub *hub;
  hr_engine_config cc;
  hr_engine *ce;
  hr_listener *l;
  tl_server ts;
  uint64_t sh[2] = {16, 9};
  hr_tensor *m = tl_dense(HR_ELEM_FLOAT32, 2, sh, 3);

  assert_int_equal(hr_inproc_hub_new(&hub, NULL), 0);
  server_start(env, &ts, hub, "model", &l);
  tl_put(&ts, "m", m);
  cc = hub_cfg(hub);
  ce = tl_engine(env, &cc);
  flows(env, ce, m);
  /* The hub is busy while the listener holds its name. */
  assert_int_equal(hr_inproc_hub_del(hub, NULL), HR_ERR_BUSY);
  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  assert_int_equal(hr_inproc_hub_del(hub, NULL), 0);
  hr_tensor_unref(m);
  tl_free(env);
}

static void test_one_loop_epoll(void **state) {
  (void)state;
  one_loop(TL_EPOLL);
}

static void test_one_loop_libevent(void **state) {
  (void)state;
  one_loop(TL_LIBEVENT);
}

/* ---- the server on a thread of its own --------------------------------- */

typedef struct srv_thread {
  tl_env *env;
  atomic_int stop;
  pthread_t th;
} srv_thread;

static int stopped(void *ud) {
  return atomic_load(&((srv_thread *)ud)->stop);
}

static void *srv_run(void *arg) {
  srv_thread *st = arg;

  tl_run(st->env, stopped, st, 60000);
  return NULL;
}

/* The server's engine runs on another thread: connects hand the
 * connection over through the hub, and the server's loop takes it. */
static void test_two_threads(void **state) {
  tl_env *senv = tl_new(TL_EPOLL), *cenv = tl_new(TL_LIBEVENT);
  hr_inproc_hub *hub;
  hr_engine_config cc;
  hr_engine *ce;
  hr_listener *l;
  tl_server ts;
  srv_thread st;
  uint64_t sh[1] = {4096};
  hr_tensor *m = tl_dense(HR_ELEM_UINT8, 1, sh, 5);
  tc_conn g[4];

  (void)state;
  assert_int_equal(hr_inproc_hub_new(&hub, NULL), 0);
  server_start(senv, &ts, hub, "model", &l);
  tl_put(&ts, "m", m);
  cc = hub_cfg(hub);
  ce = tl_engine(cenv, &cc);
  memset(&st, 0, sizeof st);
  st.env = senv;
  assert_int_equal(pthread_create(&st.th, NULL, srv_run, &st), 0);
  flows(cenv, ce, m);
  /* Several connections handed over at once. */
  for (int i = 0; i < 4; i++)
    tc_connect(cenv, ce, "inproc:model", &g[i], NULL);
  for (int i = 0; i < 4; i++)
    assert_true(tc_wait_up(&g[i], 5000));
  for (int i = 0; i < 4; i++)
    tc_close(&g[i]);
  atomic_store(&st.stop, 1);
  hr_engine_wakeup(ts.e);
  pthread_join(st.th, NULL);
  tl_engine_finish(cenv, ce);
  tl_server_stop(senv, &ts);
  assert_int_equal(hr_inproc_hub_del(hub, NULL), 0);
  hr_tensor_unref(m);
  tl_free(senv);
  tl_free(cenv);
}

/* ---- lanes and SHM ------------------------------------------------------ */

typedef struct up {
  int calls, status;
} up;

static void up_cb(hr_conn *c, int status, void *ud) {
  up *u = ud;

  (void)c;
  if (u->calls++ == 0)
    u->status = status;
}

static int got_call(void *ud) {
  return ((up *)ud)->calls > 0;
}

/* A group connects its lanes by the same name; a segment-backed tensor
 * travels over SHM (the socketpair is a Unix socket, so descriptors
 * pass). */
static void test_lanes_and_shm(void **state) {
  tl_env *env = tl_new(TL_EPOLL);
  hr_inproc_hub *hub;
  hr_engine_config cc;
  hr_engine *ce;
  hr_listener *l;
  hr_conn *gc = NULL;
  tl_server ts;
  up u = {0, 0};
  uint64_t sh[2] = {64, 64};
  hr_tensor *m = tl_dense(HR_ELEM_FLOAT32, 2, sh, 9), *seg = NULL;
  tc_conn c;
  tc_res r;

  (void)state;
  assert_int_equal(hr_inproc_hub_new(&hub, NULL), 0);
  server_start(env, &ts, hub, "model", &l);
  assert_int_equal(hr_shm_tensor_copy(&seg, m, NULL), 0);
  tl_put(&ts, "s", seg);
  cc = hub_cfg(hub);
  ce = tl_engine(env, &cc);

  assert_int_equal(
      hr_engine_connect_group(ce, "inproc:model", 3, NULL, up_cb, &u, &gc), 0);
  assert_true(tl_run(env, got_call, &u, 5000));
  assert_int_equal(u.status, 0);
  assert_int_equal(hr_conn_lanes(gc), 3);
  hr_conn_close(gc);
  tl_spin(env, 20);

  tc_open(env, ce, "inproc:model", &c);
  assert_int_equal(tc_get_key(&c, "s", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_true(tl_same_elements(m, NULL, r.t));
  tc_res_clear(&r);
  tc_close(&c);

  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  assert_int_equal(hr_inproc_hub_del(hub, NULL), 0);
  hr_tensor_unref(seg);
  hr_tensor_unref(m);
  tl_free(env);
}

/* ---- errors ------------------------------------------------------------- */

static void test_errors(void **state) {
  tl_env *env = tl_new(TL_EPOLL);
  hr_inproc_hub *hub, *other;
  hr_engine_config cc;
  hr_engine *ce, *plain, *oe;
  hr_listener *l, *l2;
  hr_inproc_server *srv = NULL;
  hr_conn *c = NULL;
  hr_provider prov;
  tl_server ts;
  char longname[300];

  (void)state;
  assert_int_equal(hr_inproc_hub_new(&hub, NULL), 0);
  assert_int_equal(hr_inproc_hub_new(&other, NULL), 0);
  server_start(env, &ts, hub, "model", &l);
  hr_store_provider(ts.store, &prov);
  cc = hub_cfg(hub);
  ce = tl_engine(env, &cc);
  plain = tl_engine(env, NULL);
  cc = hub_cfg(other);
  oe = tl_engine(env, &cc);

  /* No hub: the URL is not supported. */
  assert_int_equal(hr_engine_listen(plain, "inproc:x", &prov, &l2),
                   HR_ERR_UNSUPPORTED);
  assert_int_equal(hr_engine_connect(plain, "inproc:model", NULL, up_cb,
                                     NULL, &c),
                   HR_ERR_UNSUPPORTED);
  /* Another hub does not know the name. */
  assert_int_equal(hr_engine_connect(oe, "inproc:model", NULL, up_cb, NULL,
                                     &c),
                   HR_ERR_NOT_FOUND);
  assert_int_equal(hr_engine_connect(ce, "inproc:nobody", NULL, up_cb, NULL,
                                     &c),
                   HR_ERR_NOT_FOUND);
  /* Bad names. */
  memset(longname, 'a', sizeof longname);
  memcpy(longname, "inproc:", 7);
  longname[7 + 256] = '\0';
  assert_int_equal(hr_engine_connect(ce, "inproc:", NULL, up_cb, NULL, &c),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_engine_connect(ce, longname, NULL, up_cb, NULL, &c),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_engine_listen(ce, "inproc:", &prov, &l2),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_engine_listen(ce, longname, &prov, &l2),
                   HR_ERR_INVALID_ARGUMENT);
  /* One namespace per hub: engine listeners and hub servers. */
  assert_int_equal(hr_engine_listen(ce, "inproc:model", &prov, &l2),
                   HR_ERR_BUSY);
  assert_int_equal(hr_inproc_listen(hub, ts.e, "model", &prov, &srv),
                   HR_ERR_BUSY);
  assert_int_equal(hr_inproc_listen(hub, ts.e, "direct", &prov, &srv), 0);
  assert_int_equal(hr_engine_listen(ce, "inproc:direct", &prov, &l2),
                   HR_ERR_BUSY);
  assert_int_equal(hr_engine_connect(ce, "inproc:direct", NULL, up_cb, NULL,
                                     &c),
                   HR_ERR_UNSUPPORTED);
  hr_inproc_server_close(srv);
  tl_spin(env, 10);
  /* The name is free again once its owner closed; and the same engine
   * may listen under a second name, and connect to itself. */
  assert_int_equal(hr_engine_listen(ce, "inproc:direct", &prov, &l2), 0);
  {
    tc_conn self;
    tc_res r;
    tc_open(env, ce, "inproc:direct", &self);
    assert_int_equal(tc_ping(&self, &r), 0);
    tc_close(&self);
  }
  hr_listener_close(l2);
  /* Names are per hub: the other hub's engine may use "model" too. */
  assert_int_equal(hr_engine_listen(oe, "inproc:model", &prov, &l2), 0);
  hr_listener_close(l2);

  tl_engine_finish(env, oe);
  tl_engine_finish(env, plain);
  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  assert_int_equal(hr_inproc_hub_del(hub, NULL), 0);
  assert_int_equal(hr_inproc_hub_del(other, NULL), 0);
  tl_free(env);
}

/* The listener closes before its loop took a connection handed over:
 * the client learns it through its callback (the kernel closes the
 * server's end with the hand-over socket), and nothing leaks. */
static void test_listener_closed_before_accept(void **state) {
  tl_env *env = tl_new(TL_EPOLL);
  hr_inproc_hub *hub;
  hr_engine_config cc;
  hr_engine *ce;
  hr_listener *l;
  hr_conn *c = NULL;
  tl_server ts;
  up u = {0, 0};

  (void)state;
  assert_int_equal(hr_inproc_hub_new(&hub, NULL), 0);
  server_start(env, &ts, hub, "model", &l);
  cc = hub_cfg(hub);
  ce = tl_engine(env, &cc);
  assert_int_equal(hr_engine_connect(ce, "inproc:model", NULL, up_cb, &u, &c),
                   0);
  hr_listener_close(l); /* before the loop ran */
  assert_true(tl_run(env, got_call, &u, 5000));
  assert_true(u.status != 0);
  /* The name went with the listener. */
  assert_int_equal(hr_engine_connect(ce, "inproc:model", NULL, up_cb, &u, &c),
                   HR_ERR_NOT_FOUND);
  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  assert_int_equal(hr_inproc_hub_del(hub, NULL), 0);
  tl_free(env);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_loop_epoll),
      cmocka_unit_test(test_one_loop_libevent),
      cmocka_unit_test(test_two_threads),
      cmocka_unit_test(test_lanes_and_shm),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_listener_closed_before_accept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
