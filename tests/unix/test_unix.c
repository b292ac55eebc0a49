/*
 * The Unix domain socket transport: GET (plain, transcoded, region), PUT
 * and LIST over "unix:PATH" through the engine (both loops) and through
 * the blocking client; the peer credentials and an on_hello hook that
 * refuses by uid; the stale socket file rules of hr_engine_listen().
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/client.h>

#include "sock_dir.h"
#include "tc.h"
#include "tl.h"

static int setup(void **state) {
  return sock_dir_setup(state, "hr_unix");
}

static int teardown(void **state) {
  return sock_dir_teardown(state);
}

static int exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

/* ---- an on_hello hook that authorises by the peer's uid ---------------- */

typedef struct auth {
  uint32_t deny_uid;
  int calls;
  int cred_rv;
  hr_peer_cred cred;
} auth;

static int auth_hello(hr_session *s, const hr_hello *peer,
                      uint32_t *wire_error, void *ud) {
  auth *a = ud;
  hr_conn *c = hr_session_user_data(s);

  (void)peer;
  a->calls++;
  a->cred_rv = hr_conn_peer_cred(c, &a->cred);
  if (a->cred_rv != 0 || a->cred.uid == a->deny_uid)
    *wire_error = HR_WIRE_UNAUTHORIZED;
  return 0;
}

/* ---- the engine, on both loops ----------------------------------------- */

static void engine_flows(fixture *f, int mode) {
  tl_env *env = tl_new(mode);
  tl_server ts;
  hr_provider prov;
  hr_listener *ul;
  hr_engine *ce = tl_engine(env, NULL);
  tc_conn c, tcp;
  tc_res r;
  hr_get_opts o;
  hr_layout_entry col = {HR_LAYOUT_COLUMN_MAJOR, 0, NULL};
  uint64_t sh[2] = {6, 5}, off[2] = {1, 2}, box[2] = {3, 2};
  hr_tensor *m = tl_dense(HR_ELEM_FLOAT32, 2, sh, 7);
  hr_peer_cred pc;

  tl_server_start(env, &ts, NULL, NULL);
  tl_put(&ts, "m", m);
  hr_store_provider(ts.store, &prov);
  assert_int_equal(hr_engine_listen(ts.e, f->url, &prov, &ul), 0);
  assert_int_equal(hr_listener_port(ul), -1);
  assert_true(exists(f->path));
  tc_open(env, ce, f->url, &c);

  /* Plain. */
  assert_int_equal(tc_get_key(&c, "m", &r), 0);
  assert_true(tl_same_elements(m, NULL, r.t));
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag, HR_LAYOUT_ROW_MAJOR);
  tc_res_clear(&r);
  /* Transcoded to column-major. */
  tc_opts(&o, "m");
  o.flags = HR_REQ_ALLOW_TRANSCODE;
  o.layouts = &col;
  o.layout_count = 1;
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag, HR_LAYOUT_COLUMN_MAJOR);
  assert_true(tl_same_elements(m, NULL, r.t));
  tc_res_clear(&r);
  /* A region. */
  tc_opts(&o, "m");
  o.flags = HR_REQ_REGION;
  o.region_rank = 2;
  o.region_offset = off;
  o.region_shape = box;
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_true(tl_same_elements(m, off, r.t));
  tc_res_clear(&r);
  /* PUT, then GET it back and LIST both keys. */
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

  /* The client sees the server's credentials (this very process). */
  assert_int_equal(hr_conn_peer_cred(c.c, &pc), 0);
  assert_int_equal(pc.pid, (int32_t)getpid());
  assert_int_equal(pc.uid, (uint32_t)getuid());
  assert_int_equal(pc.gid, (uint32_t)getgid());
  /* TCP has none. */
  tc_open(env, ce, ts.url, &tcp);
  assert_int_equal(hr_conn_peer_cred(tcp.c, &pc), HR_ERR_UNSUPPORTED);
  tc_close(&tcp);
  tc_close(&c);

  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  /* The listener removed its socket file. */
  assert_false(exists(f->path));
  hr_tensor_unref(m);
  tl_free(env);
}

static void test_engine_epoll(void **state) {
  engine_flows(*state, TL_EPOLL);
}

static void test_engine_libevent(void **state) {
  engine_flows(*state, TL_LIBEVENT);
}

/* The server's hook sees the client's credentials, and refuses by uid. */
static void test_peer_cred_auth(void **state) {
  fixture *f = *state;
  tl_env *env = tl_new(TL_EPOLL);
  hr_engine *se = tl_engine(env, NULL), *ce = tl_engine(env, NULL);
  hr_provider prov;
  auth a;
  tc_conn c;
  tc_res r;

  memset(&a, 0, sizeof a);
  memset(&prov, 0, sizeof prov);
  prov.size = sizeof prov;
  prov.user_data = &a;
  prov.on_hello = auth_hello;
  assert_int_equal(hr_engine_listen(se, f->url, &prov, NULL), 0);

  /* Another uid is denied: this one gets in. */
  a.deny_uid = (uint32_t)getuid() + 1;
  tc_open(env, ce, f->url, &c);
  assert_int_equal(a.calls, 1);
  assert_int_equal(a.cred_rv, 0);
  assert_int_equal(a.cred.pid, (int32_t)getpid());
  assert_int_equal(a.cred.uid, (uint32_t)getuid());
  assert_int_equal(a.cred.gid, (uint32_t)getgid());
  assert_int_equal(tc_ping(&c, &r), 0);
  tc_close(&c);

  /* Our uid is denied: UNAUTHORIZED before the session is up. */
  a.deny_uid = (uint32_t)getuid();
  tc_connect(env, ce, f->url, &c, NULL);
  assert_int_equal(tc_wait_up(&c, TL_WAIT_MS), 0);
  assert_int_equal(c.status, HR_ERR_REMOTE);
  assert_int_equal(c.wire_error, HR_WIRE_UNAUTHORIZED);
  assert_int_equal(a.calls, 2);

  tl_engine_finish(env, ce);
  tl_engine_finish(env, se);
  assert_false(exists(f->path));
  tl_free(env);
}

/* ---- the blocking client against a server thread ------------------------ */

typedef struct srv {
  fixture *f;
  pthread_t th;
  atomic_int stop, up;
  hr_tensor *m;
} srv;

static int stopped(void *ud) {
  return atomic_load(&((srv *)ud)->stop);
}

static void *srv_main(void *arg) {
  srv *s = arg;
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_provider prov;

  tl_server_start(env, &ts, NULL, NULL);
  tl_put(&ts, "m", s->m);
  hr_store_provider(ts.store, &prov);
  if (hr_engine_listen(ts.e, s->f->url, &prov, NULL) == 0)
    atomic_store(&s->up, 1);
  else
    atomic_store(&s->up, -1);
  tl_run(env, stopped, s, 600000);
  tl_server_stop(env, &ts);
  tl_free(env);
  return NULL;
}

static int count_entry(const hr_list_entry *e, void *ud) {
  (void)e;
  (*(int *)ud)++;
  return 0;
}

static void test_blocking_client(void **state) {
  srv s;
  uint64_t sh[2] = {8, 4}, off[2] = {2, 1}, box[2] = {4, 3};
  hr_layout_entry col = {HR_LAYOUT_COLUMN_MAJOR, 0, NULL};
  hr_client *c;
  hr_client_error err;
  hr_get_opts o;
  hr_tensor *t;
  hr_transfer_record rec;
  int n = 0, more = -1;

  memset(&s, 0, sizeof s);
  s.f = *state;
  s.m = tl_dense(HR_ELEM_INT16, 2, sh, 3);
  assert_int_equal(pthread_create(&s.th, NULL, srv_main, &s), 0);
  while (!atomic_load(&s.up))
    usleep(1000);
  assert_int_equal(atomic_load(&s.up), 1);

  assert_int_equal(hr_client_connect(&c, s.f->url, NULL, NULL, &err), 0);
  tc_opts(&o, "m");
  assert_int_equal(hr_client_get(c, &o, &t, &rec), 0);
  assert_true(tl_same_elements(s.m, NULL, t));
  hr_tensor_unref(t);
  o.flags = HR_REQ_ALLOW_TRANSCODE;
  o.layouts = &col;
  o.layout_count = 1;
  assert_int_equal(hr_client_get(c, &o, &t, &rec), 0);
  assert_int_equal(hr_tensor_descriptor(t)->layout.tag, HR_LAYOUT_COLUMN_MAJOR);
  assert_true(tl_same_elements(s.m, NULL, t));
  hr_tensor_unref(t);
  tc_opts(&o, "m");
  o.flags = HR_REQ_REGION;
  o.region_rank = 2;
  o.region_offset = off;
  o.region_shape = box;
  assert_int_equal(hr_client_get(c, &o, &t, &rec), 0);
  assert_true(tl_same_elements(s.m, off, t));
  hr_tensor_unref(t);
  assert_int_equal(hr_client_put(c, (const uint8_t *)"q", 1, 0, s.m, &rec), 0);
  assert_int_equal(
      hr_client_list(c, NULL, 0, NULL, 0, 10, count_entry, &n, &more, NULL),
      0);
  assert_int_equal(n, 2);
  assert_int_equal(more, 0);
  hr_client_close(c);

  /* A path nobody serves: refused, not a bad URL. */
  assert_int_equal(hr_client_connect(&c, "unix:/nonexistent/hr.sock", NULL,
                                     NULL, &err),
                   HR_ERR_IO);
  assert_int_equal(
      hr_client_connect(&c, "unix:", NULL, NULL, &err), HR_ERR_INVALID_ARGUMENT);

  atomic_store(&s.stop, 1);
  pthread_join(s.th, NULL);
  hr_tensor_unref(s.m);
}

/* ---- the socket file ---------------------------------------------------- */

/* Binds a Unix socket at `path`; listens when asked.  Returns the fd. */
static int raw_bind(const char *path, int do_listen) {
  struct sockaddr_un sun;
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);

  assert_true(fd >= 0);
  memset(&sun, 0, sizeof sun);
  sun.sun_family = AF_UNIX;
  snprintf(sun.sun_path, sizeof sun.sun_path, "%s", path);
  assert_int_equal(bind(fd, (struct sockaddr *)&sun, sizeof sun), 0);
  if (do_listen)
    assert_int_equal(listen(fd, 4), 0);
  return fd;
}

static void test_socket_file(void **state) {
  fixture *f = *state;
  tl_env *env = tl_new(TL_EPOLL);
  hr_engine *e = tl_engine(env, NULL);
  hr_provider prov;
  hr_listener *l;
  char long_url[200];
  FILE *fp;
  int fd;

  memset(&prov, 0, sizeof prov);
  prov.size = sizeof prov;

  /* A stale file (its server died without removing it) is replaced. */
  fd = raw_bind(f->path, 1);
  close(fd);
  assert_true(exists(f->path));
  assert_int_equal(hr_engine_listen(e, f->url, &prov, &l), 0);
  hr_listener_close(l);
  assert_false(exists(f->path));

  /* A live server keeps its path. */
  fd = raw_bind(f->path, 1);
  assert_int_equal(hr_engine_listen(e, f->url, &prov, &l), HR_ERR_IO);
  assert_true(exists(f->path));
  close(fd);
  unlink(f->path);

  /* A file that is not a socket is never removed. */
  fp = fopen(f->path, "w");
  assert_non_null(fp);
  fclose(fp);
  assert_int_equal(hr_engine_listen(e, f->url, &prov, &l), HR_ERR_IO);
  assert_true(exists(f->path));
  unlink(f->path);

  /* Paths that do not fit sun_path, and the empty path. */
  memset(long_url, 'a', sizeof long_url - 1);
  long_url[sizeof long_url - 1] = '\0';
  memcpy(long_url, "unix:/", 6);
  assert_int_equal(hr_engine_listen(e, long_url, &prov, &l),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_engine_listen(e, "unix:", &prov, &l),
                   HR_ERR_INVALID_ARGUMENT);

  tl_engine_finish(env, e);
  tl_free(env);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_engine_epoll, setup, teardown),
      cmocka_unit_test_setup_teardown(test_engine_libevent, setup, teardown),
      cmocka_unit_test_setup_teardown(test_peer_cred_auth, setup, teardown),
      cmocka_unit_test_setup_teardown(test_blocking_client, setup, teardown),
      cmocka_unit_test_setup_teardown(test_socket_file, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
