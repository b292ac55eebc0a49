/*
 * The blocking client (<hurray/client.h>): every call against a server
 * running on another thread, the error reports (refused, bad URL, over
 * the connection cap, NOT_FOUND, ALREADY_EXISTS), timeouts against a
 * silent raw server, the taps and the progress callback, and pipelining
 * through hr_client_session() + hr_client_wait().
 */
#include <poll.h>
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
#include <unistd.h>

#include <cmocka.h>

#include <hurray/client.h>

#include "tl.h"

typedef struct srv {
  pthread_t th;
  atomic_int stop;
  int port;
  char url[64];
  hr_engine_config ecfg;
  hr_tensor *m, *big;
  pthread_mutex_t lock;
  pthread_cond_t cond;
} srv;

static int stopped(void *ud) {
  return atomic_load(&((srv *)ud)->stop);
}

static void *srv_main(void *arg) {
  srv *s = arg;
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;

  tl_server_start(env, &ts, &s->ecfg, NULL);
  tl_put(&ts, "m", s->m);
  tl_put(&ts, "big", s->big);
  pthread_mutex_lock(&s->lock);
  s->port = ts.port;
  snprintf(s->url, sizeof s->url, "%s", ts.url);
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
  tl_run(env, stopped, s, 600000);
  tl_server_stop(env, &ts);
  tl_free(env);
  return NULL;
}

static srv *srv_start2(uint32_t max_conns, uint32_t io_budget) {
  srv *s = calloc(1, sizeof *s);
  uint64_t sh[2] = {16, 16}, big[1] = {32u << 20};

  hr_engine_config_default(&s->ecfg);
  if (max_conns)
    s->ecfg.max_connections = max_conns;
  if (io_budget)
    s->ecfg.io_budget = io_budget;
  s->m = tl_dense(HR_ELEM_FLOAT32, 2, sh, 1);
  s->big = tl_dense(HR_ELEM_UINT8, 1, big, 2);
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  pthread_mutex_lock(&s->lock);
  pthread_create(&s->th, NULL, srv_main, s);
  while (!s->port)
    pthread_cond_wait(&s->cond, &s->lock);
  pthread_mutex_unlock(&s->lock);
  return s;
}

static srv *srv_start(uint32_t max_conns) {
  return srv_start2(max_conns, 0);
}

static void srv_stop(srv *s) {
  atomic_store(&s->stop, 1);
  pthread_join(s->th, NULL);
  hr_tensor_unref(s->m);
  hr_tensor_unref(s->big);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  free(s);
}

static int setup(void **state) {
  *state = srv_start(0);
  return 0;
}

static int teardown(void **state) {
  srv_stop(*state);
  return 0;
}

static void get_opts(hr_get_opts *o, const char *key) {
  memset(o, 0, sizeof *o);
  o->key = (const uint8_t *)key;
  o->key_len = (uint16_t)strlen(key);
  o->max_shards = 1;
}

typedef struct collect {
  int n;
  char last[64];
} collect;

static int on_entry(const hr_list_entry *e, void *ud) {
  collect *c = ud;
  snprintf(c->last, sizeof c->last, "%.*s", (int)e->key_len,
           (const char *)e->key);
  c->n++;
  return 0;
}

static void test_calls(void **state) {
  srv *s = *state;
  hr_client *c;
  hr_client_error err;
  hr_get_opts o;
  hr_tensor *t;
  hr_transfer_record rec;
  collect col = {0, ""};
  uint64_t rtt = 0;
  int more = -1;

  assert_int_equal(hr_client_connect(&c, s->url, NULL, NULL, &err), 0);
  assert_int_equal(err.status, 0);
  assert_non_null(hr_client_server_hello(c));
  assert_non_null(hr_client_session(c));
  get_opts(&o, "m");
  assert_int_equal(hr_client_get(c, &o, &t, &rec), 0);
  assert_memory_equal(hr_tensor_buffer(t, 0), hr_tensor_buffer(s->m, 0),
                      hr_tensor_bytes(s->m));
  assert_int_equal(rec.bytes, hr_tensor_bytes(s->m));
  hr_tensor_unref(t);
  /* NOT_FOUND: the code and the server's text. */
  get_opts(&o, "nope");
  assert_int_equal(hr_client_get(c, &o, &t, &rec), HR_ERR_REMOTE);
  assert_null(t);
  assert_int_equal(rec.wire_error, HR_WIRE_NOT_FOUND);
  assert_int_equal(hr_client_last_error(c)->wire_error, HR_WIRE_NOT_FOUND);
  assert_non_null(strstr(hr_client_last_error(c)->message, "nope"));
  /* PUT, then the same key again. */
  assert_int_equal(hr_client_put(c, (const uint8_t *)"p", 1, 0, s->m, &rec), 0);
  assert_int_equal(hr_client_put(c, (const uint8_t *)"p", 1, 0, s->m, &rec),
                   HR_ERR_REMOTE);
  assert_int_equal(rec.wire_error, HR_WIRE_ALREADY_EXISTS);
  assert_int_equal(
      hr_client_put(c, (const uint8_t *)"p", 1, HR_PUT_REPLACE, s->m, NULL), 0);
  assert_int_equal(hr_client_last_error(c)->status, 0);
  /* LIST in pages of one. */
  assert_int_equal(
      hr_client_list(c, NULL, 0, NULL, 0, 1, on_entry, &col, &more, NULL), 0);
  assert_int_equal(col.n, 1);
  assert_string_equal(col.last, "big");
  assert_int_equal(more, 1);
  assert_int_equal(hr_client_list(c, NULL, 0, (const uint8_t *)"big", 3, 10,
                                  on_entry, &col, &more, NULL),
                   0);
  assert_int_equal(col.n, 3);
  assert_int_equal(more, 0);
  assert_int_equal(hr_client_ping(c, &rtt), 0);
  assert_true(rtt > 0);
  hr_client_close(c);
}

static void test_connect_errors(void **state) {
  srv *s = *state, *capped;
  hr_client *c = NULL, *c1;
  hr_client_error err;
  int fd, port;

  (void)s;
  assert_int_equal(hr_client_connect(&c, "http://x:1", NULL, NULL, &err),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(err.status, HR_ERR_INVALID_ARGUMENT);
  assert_null(c);
  /* Nobody listens there. */
  fd = tl_raw_dead_port(&port);
  assert_true(fd >= 0);
  {
    char url[64];
    snprintf(url, sizeof url, "127.0.0.1:%d", port);
    assert_int_equal(hr_client_connect(&c, url, NULL, NULL, &err), HR_ERR_IO);
    assert_non_null(strstr(err.message, "refused"));
  }
  close(fd);
  /* Over the server's connection cap. */
  capped = srv_start(1);
  assert_int_equal(hr_client_connect(&c1, capped->url, NULL, NULL, &err), 0);
  assert_int_equal(hr_client_connect(&c, capped->url, NULL, NULL, &err),
                   HR_ERR_REMOTE);
  assert_int_equal(err.wire_error, HR_WIRE_RESOURCE_EXHAUSTED);
  assert_int_equal(err.wire_error_sent, 0);
  hr_client_close(c1);
  srv_stop(capped);
}

static void test_connect_timeout(void **state) {
  hr_client_options o;
  hr_client_error err;
  hr_client *c = NULL;
  int lfd, port, fd;
  char url[64];

  (void)state;
  /* The listen backlog completes the TCP handshake, nobody answers the
   * HELLO. */
  lfd = tl_raw_listen(&port);
  snprintf(url, sizeof url, "127.0.0.1:%d", port);
  hr_client_options_default(&o);
  o.timeout_ms = 200;
  assert_int_equal(hr_client_connect(&c, url, &o, NULL, &err), HR_ERR_TIMEOUT);
  assert_null(c);
  assert_int_equal(err.status, HR_ERR_TIMEOUT);
  fd = accept(lfd, NULL, NULL);
  close(fd);
  close(lfd);
}

/* A raw server on its own thread: answers the HELLO, then reads and
 * ignores everything (requests time out).  One connection at a time,
 * each until the client closes it. */
typedef struct mute {
  int lfd, port;
  atomic_int stop;
  pthread_t th;
} mute;

static void *mute_main(void *arg) {
  mute *m = arg;
  uint8_t buf[70000];
  hr_msg h;

  while (!atomic_load(&m->stop)) {
    struct pollfd lp = {m->lfd, POLLIN, 0};
    int fd;
    if (poll(&lp, 1, 10) != 1 || (fd = accept(m->lfd, NULL, NULL)) < 0)
      continue;
    if (tl_raw_read_msg(NULL, fd, buf, sizeof buf, TL_WAIT_MS) > 0) {
      tl_hello(&h, 1);
      tl_raw_send_msg(NULL, fd, &h);
    }
    while (!atomic_load(&m->stop)) {
      struct pollfd p = {fd, POLLIN, 0};
      if (poll(&p, 1, 10) == 1 && recv(fd, buf, sizeof buf, 0) <= 0)
        break;
    }
    close(fd);
  }
  return NULL;
}

static void test_request_timeout(void **state) {
  hr_client_options o;
  hr_client_error err;
  hr_client *c;
  hr_get_opts g;
  hr_tensor *t = NULL;
  mute m;
  char url[64];
  int tries;

  (void)state;
  memset(&m, 0, sizeof m);
  m.lfd = tl_raw_listen(&m.port);
  pthread_create(&m.th, NULL, mute_main, &m);
  snprintf(url, sizeof url, "127.0.0.1:%d", m.port);
  hr_client_options_default(&o);
  o.timeout_ms = 300;
  /* The timeout bounds the connect too, in which the mute thread must
   * answer the HELLO: a loaded machine may not run it in time.  That is
   * not what this test is about, so a connect that timed out is tried
   * again (the request's timeout below must hold every time). */
  for (tries = 0;; tries++) {
    int rv = hr_client_connect(&c, url, &o, NULL, &err);
    if (rv == 0)
      break;
    assert_int_equal(rv, HR_ERR_TIMEOUT);
    assert_true(tries < 20);
  }
  get_opts(&g, "k");
  assert_int_equal(hr_client_get(c, &g, &t, NULL), HR_ERR_TIMEOUT);
  assert_null(t);
  assert_int_equal(hr_client_last_error(c)->status, HR_ERR_TIMEOUT);
  /* The cancel was not answered either: the connection was cut. */
  assert_int_equal(hr_client_ping(c, NULL), HR_ERR_CLOSED);
  hr_client_close(c);
  atomic_store(&m.stop, 1);
  pthread_join(m.th, NULL);
  close(m.lfd);
}

typedef struct taps {
  size_t rx, tx;
  int progress;
  uint8_t first[12];
} taps;

static void on_rx(const void *b, size_t n, void *ud) {
  taps *t = ud;
  if (t->rx < 12)
    memcpy(t->first + t->rx, b, n < 12 - t->rx ? n : 12 - t->rx);
  t->rx += n;
}
static void on_tx(const void *b, size_t n, void *ud) {
  (void)b;
  ((taps *)ud)->tx += n;
}
static void on_progress(uint64_t rx, uint64_t tx, void *ud) {
  (void)rx;
  (void)tx;
  ((taps *)ud)->progress++;
}

static void test_taps_progress(void **state) {
  srv *s = *state;
  hr_client_options o;
  hr_client *c;
  hr_get_opts g;
  hr_tensor *t;
  hr_msg_header h;
  taps tp;

  memset(&tp, 0, sizeof tp);
  hr_client_options_default(&o);
  o.on_rx = on_rx;
  o.on_tx = on_tx;
  o.on_progress = on_progress;
  o.progress_interval_ms = 1;
  o.user_data = &tp;
  assert_int_equal(hr_client_connect(&c, s->url, &o, NULL, NULL), 0);
  get_opts(&g, "big");
  assert_int_equal(hr_client_get(c, &g, &t, NULL), 0);
  assert_memory_equal(hr_tensor_buffer(t, 0), hr_tensor_buffer(s->big, 0),
                      hr_tensor_bytes(s->big));
  hr_tensor_unref(t);
  hr_wire_parse_header(tp.first, &h);
  assert_int_equal(h.type, HR_MSG_SERVER_HELLO);
  assert_true(tp.rx > (32u << 20));
  assert_true(tp.tx > 12);
  assert_true(tp.progress > 0);
  hr_client_close(c);
}

typedef struct many {
  int done, ok;
  hr_tensor *ref;
} many;

static void many_cb(hr_session *s, uint32_t sid, hr_tensor *t,
                    const hr_transfer_record *rec, void *ud) {
  many *m = ud;
  (void)s;
  (void)sid;
  (void)rec;
  m->done++;
  if (t && hr_tensor_bytes(t) == hr_tensor_bytes(m->ref) &&
      !memcmp(hr_tensor_buffer(t, 0), hr_tensor_buffer(m->ref, 0),
              hr_tensor_bytes(t)))
    m->ok++;
  hr_tensor_unref(t);
}

static int ten_done(void *ud) {
  return ((many *)ud)->done == 10;
}

static void test_pipelining(void **state) {
  srv *s = *state;
  hr_client *c;
  hr_get_opts g;
  many m = {0, 0, s->m};
  int i;

  assert_int_equal(hr_client_connect(&c, s->url, NULL, NULL, NULL), 0);
  get_opts(&g, "m");
  for (i = 0; i < 10; i++)
    assert_int_equal(
        hr_session_get(hr_client_session(c), &g, many_cb, &m, NULL), 0);
  assert_int_equal(hr_client_wait(c, ten_done, &m, TL_WAIT_MS), 0);
  assert_int_equal(m.ok, 10);
  hr_client_close(c);
}

/* Regression: a server connection whose byte budget ran out while its
 * socket still took data (a fast reader on another thread) was never
 * called again. */
static void test_small_io_budget(void **state) {
  srv *s = srv_start2(0, 65536);
  hr_client_options o;
  hr_client *c;
  hr_get_opts g;
  hr_tensor *t;
  int i;

  (void)state;
  hr_client_options_default(&o);
  o.timeout_ms = 30000;
  assert_int_equal(hr_client_connect(&c, s->url, &o, NULL, NULL), 0);
  get_opts(&g, "big");
  for (i = 0; i < 3; i++) {
    assert_int_equal(hr_client_get(c, &g, &t, NULL), 0);
    assert_memory_equal(hr_tensor_buffer(t, 0), hr_tensor_buffer(s->big, 0),
                        hr_tensor_bytes(s->big));
    hr_tensor_unref(t);
  }
  hr_client_close(c);
  srv_stop(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_calls),
      cmocka_unit_test(test_connect_errors),
      cmocka_unit_test(test_connect_timeout),
      cmocka_unit_test(test_request_timeout),
      cmocka_unit_test(test_taps_progress),
      cmocka_unit_test(test_pipelining),
      cmocka_unit_test(test_small_io_budget),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
