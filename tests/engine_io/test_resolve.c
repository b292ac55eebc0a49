/*
 * hr_engine_connect() with host names: the lookup runs on the worker
 * pool, never on the loop thread.
 *
 * getaddrinfo() is interposed here (this executable's definition wins
 * over libc's, and over a sanitizer's interceptor, which is weak): the
 * name "gate.test" blocks its caller until the test opens the gate, then
 * resolves as 127.0.0.1.  A lookup on the loop thread would hang the
 * test; on the pool, a timer on the same loop keeps firing while the
 * lookup is held.  A name under ".invalid" (RFC 6761: never resolves)
 * fails here with EAI_NONAME, as libc would say after asking the DNS:
 * a machine without a reachable name server (CI) may take longer than
 * the test waits for that answer.  "twofold.test" resolves as two
 * addresses, 127.0.0.1 on a port where nothing listens (dead_a) and then
 * 127.0.0.1 on the port asked for; "alldead.test" as two dead ones
 * (dead_a, dead_b): an address whose connect fails must give way to the
 * next.  Every other name goes to libc
 * ("localhost", from /etc/hosts).  The test counts the full
 * (non-numeric) calls: a numeric address must need none, and the lanes
 * of a group none of their own.
 */
#include <dlfcn.h>
#include <errno.h>
#include <event2/event.h>
#include <netdb.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/engine.h>
#include <hurray/hr_event.h>
#include <hurray/store.h>

#include "tl.h"

/* ---- the interposed getaddrinfo --------------------------------------- */

typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *,
                      struct addrinfo **);

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_open = 1;
static atomic_int full_calls;   /* getaddrinfo() without AI_NUMERICHOST */
static atomic_int gated_calls;  /* of those, for gate.test */
static atomic_int gated_done;   /* gate.test calls that returned */
/* The answers of gate.test handed out, and how many were freed. */
static struct addrinfo *_Atomic gated_res[64];
static atomic_int gated_res_n, gated_freed;
/* The dead ports of twofold.test and alldead.test, and their answers
 * handed out and freed. */
static atomic_int dead_a, dead_b;
static atomic_int multi_given, multi_freed;
static struct addrinfo *_Atomic multi_res[64];

typedef void (*fai_fn)(struct addrinfo *);

/* 127.0.0.1 on port1, then on service2, as one list that libc's
 * freeaddrinfo() frees (it frees entry by entry). */
static int two_addrs(gai_fn real, int port1, const char *service2,
                     const struct addrinfo *hints, struct addrinfo **res) {
  fai_fn real_free = (fai_fn)dlsym(RTLD_NEXT, "freeaddrinfo");
  struct addrinfo *a, *b, *t;
  char p1[16];
  int rv, i;

  snprintf(p1, sizeof p1, "%d", port1);
  rv = real("127.0.0.1", p1, hints, &a);
  if (rv)
    return rv;
  rv = real("127.0.0.1", service2, hints, &b);
  if (rv) {
    real_free(a);
    return rv;
  }
  for (t = a; t->ai_next; t = t->ai_next)
    ;
  t->ai_next = b;
  *res = a;
  i = atomic_fetch_add(&multi_given, 1);
  if (i < 64)
    atomic_store(&multi_res[i], a);
  return 0;
}

int getaddrinfo(const char *node, const char *service,
                const struct addrinfo *hints, struct addrinfo **res) {
  gai_fn real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
  int numeric = hints && (hints->ai_flags & AI_NUMERICHOST);
  int rv;

  if (!numeric)
    atomic_fetch_add(&full_calls, 1);
  if (node && strlen(node) > 8 &&
      strcmp(node + strlen(node) - 8, ".invalid") == 0)
    return EAI_NONAME;
  if (node && (strcmp(node, "twofold.test") == 0 ||
               strcmp(node, "alldead.test") == 0)) {
    char p2[16];
    if (numeric)
      return EAI_NONAME;
    snprintf(p2, sizeof p2, "%d", atomic_load(&dead_b));
    return two_addrs(real, atomic_load(&dead_a),
                     node[0] == 't' ? service : p2, hints, res);
  }
  if (!node || strcmp(node, "gate.test") != 0)
    return real(node, service, hints, res);
  if (numeric)
    return EAI_NONAME;
  atomic_fetch_add(&gated_calls, 1);
  pthread_mutex_lock(&gate_mu);
  while (!gate_open)
    pthread_cond_wait(&gate_cv, &gate_mu);
  pthread_mutex_unlock(&gate_mu);
  rv = real("127.0.0.1", service, hints, res);
  if (rv == 0) {
    int i = atomic_fetch_add(&gated_res_n, 1);
    if (i < 64)
      atomic_store(&gated_res[i], *res);
  }
  atomic_fetch_add(&gated_done, 1);
  return rv;
}

/* Counts the frees of gate.test's answers: whoever holds one last (the
 * loop thread or an abandoned worker) must free it. */
void freeaddrinfo(struct addrinfo *ai) {
  fai_fn real = (fai_fn)dlsym(RTLD_NEXT, "freeaddrinfo");
  int n = atomic_load(&gated_res_n);

  for (int i = 0; i < n && i < 64; i++)
    if (ai && atomic_load(&gated_res[i]) == ai) {
      atomic_store(&gated_res[i], NULL);
      atomic_fetch_add(&gated_freed, 1);
    }
  n = atomic_load(&multi_given);
  for (int i = 0; i < n && i < 64; i++)
    if (ai && atomic_load(&multi_res[i]) == ai) {
      atomic_store(&multi_res[i], NULL);
      atomic_fetch_add(&multi_freed, 1);
    }
  real(ai);
}

static void gate_set(int open) {
  pthread_mutex_lock(&gate_mu);
  gate_open = open;
  pthread_cond_broadcast(&gate_cv);
  pthread_mutex_unlock(&gate_mu);
}

/* ---- a loop with a ticking timer, a server and a client engine -------- */

typedef struct fx {
  struct event_base *base;
  struct event *tick;
  int ticks;
  hr_store *store;
  hr_engine *srv, *cli;
  char url[64]; /* "hurray://gate.test:PORT" and the like */
  int port;
  /* The client connection's first callback. */
  int calls, status;
  char message[256];
  int closed;
} fx;

static void on_tick(evutil_socket_t fd, short what, void *ud) {
  (void)fd;
  (void)what;
  ((fx *)ud)->ticks++;
}

static void conn_cb(hr_conn *c, int status, void *ud) {
  fx *f = ud;
  const char *msg = NULL;

  if (f->calls++ == 0) {
    f->status = status;
    hr_conn_error(c, NULL, NULL, &msg);
    snprintf(f->message, sizeof f->message, "%s", msg ? msg : "");
  }
}

static void on_closed(hr_engine *e, void *ud) {
  (void)e;
  ((fx *)ud)->closed = 1;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Runs the loop until *flag is set or `ms` passed; returns *flag. */
static int run_until(fx *f, const int *flag, int ms) {
  uint64_t end = now_ms() + (uint64_t)ms;

  while (!*flag && now_ms() < end)
    event_base_loop(f->base, EVLOOP_ONCE);
  return *flag;
}

static void spin(fx *f, int ms) {
  int never = 0;
  run_until(f, &never, ms);
}

static void finish(fx *f, hr_engine *e) {
  f->closed = 0;
  assert_int_equal(hr_engine_close(e, on_closed, f), 0);
  assert_true(run_until(f, &f->closed, TL_WAIT_MS));
  assert_int_equal(hr_engine_del(e), 0);
}

static hr_engine *client(fx *f) {
  hr_engine_config cfg;
  hr_engine *e;

  hr_engine_config_default(&cfg);
  cfg.worker_threads = 1;
  assert_int_equal(hr_ev_attach(&e, f->base, &cfg, NULL), 0);
  return e;
}

static int setup(void **state) {
  static fx f;
  struct timeval tv = {0, 5000};
  hr_store_config sc;
  hr_provider prov;
  hr_listener *l;

  memset(&f, 0, sizeof f);
  f.base = event_base_new();
  f.tick = event_new(f.base, -1, EV_PERSIST, on_tick, &f);
  event_add(f.tick, &tv);
  hr_store_config_default(&sc);
  if (hr_store_new(&f.store, &sc, NULL) || hr_ev_attach(&f.srv, f.base, NULL,
                                                        NULL))
    return -1;
  hr_store_provider(f.store, &prov);
  if (hr_engine_listen(f.srv, "127.0.0.1:0", &prov, &l))
    return -1;
  f.port = hr_listener_port(l);
  f.cli = client(&f);
  *state = &f;
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;

  gate_set(1);
  finish(f, f->cli);
  finish(f, f->srv);
  hr_store_del(f->store);
  event_free(f->tick);
  event_base_free(f->base);
  return 0;
}

/* After each test, failed or not: the gate is open and the worker has
 * left every held lookup, so that the next test's lookups do not queue
 * behind one. */
static int open_gate(void **state) {
  (void)state;
  gate_set(1);
  while (atomic_load(&gated_done) < atomic_load(&gated_calls))
    usleep(1000);
  return 0;
}

static hr_conn *connect_to(fx *f, const char *host) {
  hr_conn *c = NULL;

  f->calls = f->status = 0;
  f->message[0] = 0;
  snprintf(f->url, sizeof f->url, "hurray://%s:%d", host, f->port);
  assert_int_equal(hr_engine_connect(f->cli, f->url, NULL, conn_cb, f, &c),
                   0);
  assert_non_null(c);
  return c;
}

/* A name whose lookup is held: the connect returns at once, the loop's
 * timer keeps firing, and the connection is made once the answer is
 * back. */
static void test_lookup_off_the_loop(void **state) {
  fx *f = *state;
  int full = atomic_load(&full_calls), ticks;
  hr_conn *c;

  gate_set(0);
  c = connect_to(f, "gate.test");
  /* The loop turns (its 5 ms timer fires five times) while the lookup is
   * held and the worker has started it; on a loaded machine that may take
   * longer than 25 ms. */
  ticks = f->ticks;
  for (uint64_t end = now_ms() + TL_WAIT_MS;
       (f->ticks - ticks < 5 || atomic_load(&gated_calls) == 0) &&
       now_ms() < end;)
    event_base_loop(f->base, EVLOOP_ONCE);
  assert_true(f->ticks - ticks >= 5);
  assert_int_equal(f->calls, 0);
  assert_int_equal(atomic_load(&gated_calls) > 0, 1);
  gate_set(1);
  assert_true(run_until(f, &f->calls, TL_WAIT_MS));
  assert_int_equal(f->status, 0);
  assert_int_equal(atomic_load(&full_calls), full + 1);
  hr_conn_close(c);
  spin(f, 20);
}

/* The system's resolver: "localhost" connects.  The server listens on
 * "localhost" too.  Where /etc/hosts names ::1 as well (Debian's default)
 * the lookup may give ::1 first: an address that refuses gives way to the
 * next (test_next_address). */
static void test_localhost(void **state) {
  fx *f = *state;
  hr_provider prov;
  hr_listener *l;
  hr_conn *c = NULL;
  int port = f->port;

  hr_store_provider(f->store, &prov);
  assert_int_equal(hr_engine_listen(f->srv, "localhost:0", &prov, &l), 0);
  f->port = hr_listener_port(l);
  c = connect_to(f, "localhost");
  f->port = port;
  assert_int_equal(f->calls, 0); /* never from inside the connect call */
  assert_true(run_until(f, &f->calls, TL_WAIT_MS));
  assert_int_equal(f->status, 0);
  hr_conn_close(c);
  spin(f, 20);
  hr_listener_close(l);
}

/* A name that does not resolve fails through the callback, with the
 * resolver's reason, while the loop runs on. */
static void test_unresolvable(void **state) {
  fx *f = *state;

  connect_to(f, "nonexistent.invalid");
  assert_int_equal(f->calls, 0);
  assert_true(run_until(f, &f->calls, TL_WAIT_MS));
  assert_int_equal(f->status, HR_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(f->message, "cannot resolve nonexistent.invalid"));
  spin(f, 20);
  assert_int_equal(f->calls, 1); /* no second call */
}

/* A numeric address needs no lookup (AI_NUMERICHOST only). */
static void test_numeric_sync(void **state) {
  fx *f = *state;
  int full = atomic_load(&full_calls);
  hr_conn *c = connect_to(f, "127.0.0.1");

  assert_true(run_until(f, &f->calls, TL_WAIT_MS));
  assert_int_equal(f->status, 0);
  assert_int_equal(atomic_load(&full_calls), full);
  hr_conn_close(c);
  spin(f, 20);
}

/* The lanes of a group connect where lane 0 went, without a lookup of
 * their own. */
static void test_group_one_lookup(void **state) {
  fx *f = *state;
  int full = atomic_load(&full_calls);
  hr_conn *c = NULL;

  f->calls = 0;
  snprintf(f->url, sizeof f->url, "hurray://gate.test:%d", f->port);
  assert_int_equal(
      hr_engine_connect_group(f->cli, f->url, 3, NULL, conn_cb, f, &c), 0);
  assert_true(run_until(f, &f->calls, TL_WAIT_MS));
  assert_int_equal(f->status, 0);
  assert_int_equal(hr_conn_lanes(c), 3);
  assert_int_equal(atomic_load(&full_calls), full + 1);
  hr_conn_close(c);
  spin(f, 20);
}

/* Aborted while its lookup is held: the callback reports the abort at
 * once; the answer, when it comes, is freed (ASan's leak check). */
static void test_abort_while_resolving(void **state) {
  fx *f = *state;
  int done;
  hr_conn *c;

  gate_set(0);
  done = atomic_load(&gated_done);
  c = connect_to(f, "gate.test");
  spin(f, 20);
  hr_conn_abort(c);
  assert_true(run_until(f, &f->calls, TL_WAIT_MS));
  assert_int_equal(f->status, HR_ERR_CLOSED);
  gate_set(1);
  while (atomic_load(&gated_done) == done)
    usleep(1000);
  spin(f, 50);
  assert_int_equal(f->calls, 1);
}

/* The session's handshake timeout bounds the lookup too (it runs from
 * the connect call). */
static void test_lookup_timeout(void **state) {
  fx *f = *state;
  hr_settings s;
  hr_conn *c = NULL;
  int done;

  hr_settings_default(&s);
  s.handshake_timeout = 50ull * 1000000u;
  gate_set(0);
  done = atomic_load(&gated_done);
  f->calls = 0;
  snprintf(f->url, sizeof f->url, "hurray://gate.test:%d", f->port);
  assert_int_equal(hr_engine_connect(f->cli, f->url, &s, conn_cb, f, &c), 0);
  assert_true(run_until(f, &f->calls, TL_WAIT_MS));
  assert_int_equal(f->status, HR_ERR_TIMEOUT);
  assert_string_equal(f->message, "handshake timeout");
  gate_set(1);
  while (atomic_load(&gated_done) == done)
    usleep(1000);
  spin(f, 50);
}

/* The engine closed and freed while a lookup is held: the connection
 * reports the close, and hr_engine_del() returns at once, without waiting
 * for the resolver (the gate stays shut until after it returned); the
 * worker frees the answer itself when the resolver lets go (counted by the
 * interposed freeaddrinfo(); ASan's leak check, TSan). */
static void test_free_while_resolving(void **state) {
  fx *f = *state;
  int done, freed;
  uint64_t t0;

  gate_set(0);
  done = atomic_load(&gated_done);
  freed = atomic_load(&gated_freed);
  connect_to(f, "gate.test");
  for (t0 = now_ms(); atomic_load(&gated_calls) == atomic_load(&gated_done) &&
                      now_ms() - t0 < 5000;)
    event_base_loop(f->base, EVLOOP_ONCE);
  assert_true(atomic_load(&gated_calls) > atomic_load(&gated_done));
  f->closed = 0;
  assert_int_equal(hr_engine_del(f->cli), HR_ERR_BUSY);
  assert_int_equal(hr_engine_close(f->cli, on_closed, f), 0);
  assert_true(run_until(f, &f->closed, TL_WAIT_MS));
  assert_int_equal(f->calls, 1);
  assert_int_equal(f->status, HR_ERR_CLOSED);
  t0 = now_ms();
  assert_int_equal(hr_engine_del(f->cli), 0);
  assert_true(now_ms() - t0 < 2000);
  assert_int_equal(atomic_load(&gated_done), done); /* still held */
  f->cli = client(f);
  gate_set(1);
  for (t0 = now_ms(); atomic_load(&gated_freed) == freed &&
                      now_ms() - t0 < 5000;)
    usleep(1000);
  assert_int_equal(atomic_load(&gated_freed), freed + 1);
}

/* A lookup whose answer came back to an engine that was freed before it
 * took it: hr_engine_del() frees it (nobody else will). */
static void test_free_with_answer_back(void **state) {
  fx *f = *state;
  int done, freed;
  uint64_t t0;

  done = atomic_load(&gated_done);
  freed = atomic_load(&gated_freed);
  gate_set(1);
  connect_to(f, "gate.test");
  /* The loop does not run: the answer waits on the completion list. */
  for (t0 = now_ms(); atomic_load(&gated_done) == done &&
                      now_ms() - t0 < 5000;)
    usleep(1000);
  assert_int_equal(atomic_load(&gated_done), done + 1);
  usleep(20000); /* the worker copies the answer back */
  f->closed = 0;
  assert_int_equal(hr_engine_close(f->cli, on_closed, f), 0);
  assert_true(run_until(f, &f->closed, 5000));
  assert_int_equal(hr_engine_del(f->cli), 0);
  assert_int_equal(atomic_load(&gated_freed), freed + 1);
  f->cli = client(f);
}

/* ---- several addresses ----------------------------------------------- */

typedef struct got {
  int done, status;
  uint64_t bytes;
} got;

static void get_cb(hr_session *s, uint32_t stream_id, hr_tensor *t,
                   const hr_transfer_record *rec, void *user_data) {
  got *g = user_data;

  (void)s;
  (void)stream_id;
  g->status = rec->status;
  g->bytes = t ? hr_tensor_bytes(t) : 0;
  g->done = 1;
  if (t)
    hr_tensor_unref(t);
}

/* The first address refuses the connect, which a non-blocking connect
 * reports only later (writability, SO_ERROR): the connection goes on to
 * the second, which answers, and a GET works over it.  The answer is
 * freed once, when the connection is open. */
static void test_next_address(void **state) {
  fx *f = *state;
  uint64_t shape[2] = {4, 8};
  hr_tensor *t = tl_dense(HR_ELEM_UINT8, 2, shape, 7);
  int fa, pa, given = atomic_load(&multi_given);
  int freed = atomic_load(&multi_freed);
  hr_get_opts o;
  got g = {0};
  hr_conn *c;

  fa = tl_raw_dead_port(&pa);
  assert_true(fa >= 0);
  atomic_store(&dead_a, pa);
  assert_int_equal(hr_store_put(f->store, "k2", 2, t, HR_PUT_REPLACE), 0);
  c = connect_to(f, "twofold.test");
  assert_true(run_until(f, &f->calls, TL_WAIT_MS));
  assert_int_equal(f->status, 0);
  assert_int_equal(atomic_load(&multi_given), given + 1);
  assert_int_equal(atomic_load(&multi_freed), freed + 1);
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)"k2";
  o.key_len = 2;
  o.max_shards = 1;
  assert_int_equal(hr_session_get(hr_conn_session(c), &o, get_cb, &g, NULL),
                   0);
  assert_int_equal(hr_engine_flush(f->cli), 0);
  assert_true(run_until(f, &g.done, TL_WAIT_MS));
  assert_int_equal(g.status, 0);
  assert_int_equal(g.bytes, 32);
  hr_conn_close(c);
  spin(f, 20);
  assert_int_equal(atomic_load(&multi_freed), freed + 1);
  hr_tensor_unref(t);
  close(fa);
}

/* Every address refuses: the connection fails with the last one's
 * error, which names that address, and its answer is freed once. */
static void test_all_addresses_dead(void **state) {
  fx *f = *state;
  int fa, fb, pa, pb, freed = atomic_load(&multi_freed);
  char want[64];

  fa = tl_raw_dead_port(&pa);
  fb = tl_raw_dead_port(&pb);
  assert_true(fa >= 0 && fb >= 0);
  atomic_store(&dead_a, pa);
  atomic_store(&dead_b, pb);
  connect_to(f, "alldead.test");
  assert_true(run_until(f, &f->calls, TL_WAIT_MS));
  assert_int_equal(f->status, HR_ERR_IO);
  snprintf(want, sizeof want, "connect to 127.0.0.1:%d: ", pb);
  assert_non_null(strstr(f->message, want));
  assert_non_null(strstr(f->message, strerror(ECONNREFUSED)));
  spin(f, 20);
  assert_int_equal(f->calls, 1);
  assert_int_equal(atomic_load(&multi_freed), freed + 1);
  close(fa);
  close(fb);
}

/* Waits (up to 5 s) until every answer of twofold.test and alldead.test
 * handed out was freed; returns whether they were. */
static int all_freed(void) {
  for (uint64_t end = now_ms() + 5000;
       atomic_load(&multi_freed) != atomic_load(&multi_given) &&
       now_ms() < end;)
    usleep(1000);
  return atomic_load(&multi_freed) == atomic_load(&multi_given);
}

/* The connection goes while it still has addresses to try (closed as
 * soon as its answer is out, and by the engine's close): the answer is
 * freed exactly once, by whichever path (interposed freeaddrinfo();
 * ASan's leak and double-free checks). */
static void test_close_while_connecting(void **state) {
  fx *f = *state;
  int fa, pa, given = atomic_load(&multi_given);
  hr_conn *c;

  fa = tl_raw_dead_port(&pa);
  assert_true(fa >= 0);
  atomic_store(&dead_a, pa);
  atomic_store(&dead_b, pa);
  c = connect_to(f, "twofold.test");
  for (uint64_t end = now_ms() + TL_WAIT_MS;
       atomic_load(&multi_given) == given && now_ms() < end;)
    event_base_loop(f->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
  hr_conn_close(c);
  assert_true(run_until(f, &f->calls, TL_WAIT_MS));
  spin(f, 20);
  assert_true(all_freed());
  given = atomic_load(&multi_given);
  connect_to(f, "alldead.test");
  for (uint64_t end = now_ms() + TL_WAIT_MS;
       atomic_load(&multi_given) == given && now_ms() < end;)
    event_base_loop(f->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
  f->closed = 0;
  assert_int_equal(hr_engine_close(f->cli, on_closed, f), 0);
  assert_true(run_until(f, &f->closed, TL_WAIT_MS));
  assert_int_equal(hr_engine_del(f->cli), 0);
  f->cli = client(f);
  assert_true(all_freed());
  close(fa);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_lookup_off_the_loop, open_gate),
      cmocka_unit_test_teardown(test_localhost, open_gate),
      cmocka_unit_test_teardown(test_unresolvable, open_gate),
      cmocka_unit_test_teardown(test_numeric_sync, open_gate),
      cmocka_unit_test_teardown(test_group_one_lookup, open_gate),
      cmocka_unit_test_teardown(test_abort_while_resolving, open_gate),
      cmocka_unit_test_teardown(test_lookup_timeout, open_gate),
      cmocka_unit_test_teardown(test_free_while_resolving, open_gate),
      cmocka_unit_test_teardown(test_free_with_answer_back, open_gate),
      cmocka_unit_test_teardown(test_next_address, open_gate),
      cmocka_unit_test_teardown(test_all_addresses_dead, open_gate),
      cmocka_unit_test_teardown(test_close_while_connecting, open_gate),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
