/*
 * Concurrency: 200 clients x 20 mixed requests (GET of tensors from 1 KiB
 * to 512 KiB in several layouts and types, PUT then GET-back of a tensor
 * of their own, LIST, PING, GET of a missing key) against one server.
 * The server runs on its own thread and loop; the clients are spread over
 * 4 threads, each with its own engine and loop, 50 connections each.
 * Every byte received is checked against the reference tensors.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tc.h"

#define CLIENTS 200
#define THREADS 4
#define REQUESTS 20
#define NTENSORS 24

static hr_tensor *refs[NTENSORS];
static char ref_keys[NTENSORS][32];
static atomic_int server_stop;
static atomic_int failures;
static int server_port;
static pthread_mutex_t ready_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready_cond = PTHREAD_COND_INITIALIZER;

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, __VA_ARGS__);                                              \
    fputc('\n', stderr);                                                       \
    atomic_fetch_add(&failures, 1);                                            \
  } while (0)

static int stop_flag(void *ud) {
  (void)ud;
  return atomic_load(&server_stop);
}

static void *server_main(void *arg) {
  tl_env *env = tl_new(TL_EPOLL);
  tl_server s;
  int i;

  (void)arg;
  tl_server_start(env, &s, NULL, NULL);
  for (i = 0; i < NTENSORS; i++)
    tl_put(&s, ref_keys[i], refs[i]);
  pthread_mutex_lock(&ready_lock);
  server_port = s.port;
  pthread_cond_broadcast(&ready_cond);
  pthread_mutex_unlock(&ready_lock);
  tl_run(env, stop_flag, NULL, 600000);
  tl_server_stop(env, &s);
  tl_free(env);
  return NULL;
}

/* ---- one client: a little state machine driven by completions -------- */

enum { OP_GET, OP_PUT, OP_CHECK_PUT, OP_LIST, OP_PING, OP_MISSING };

typedef struct client {
  struct worker *w;
  int id;
  uint64_t rng;
  tc_conn c;
  int done_reqs;
  int op;
  int want; /* the tensor index a GET asked for */
  hr_tensor *mine;
  char my_key[32];
  int finished;
} client;

typedef struct worker {
  int index;
  tl_env *env;
  hr_engine *e;
  client cl[CLIENTS / THREADS];
  int finished;
} worker;

static uint64_t next_rand(client *c) {
  c->rng ^= c->rng << 13;
  c->rng ^= c->rng >> 7;
  c->rng ^= c->rng << 17;
  return c->rng;
}

static void step(client *c);

static void finish_request(client *c) {
  c->done_reqs++;
  if (c->done_reqs == REQUESTS) {
    c->finished = 1;
    c->w->finished++;
    hr_conn_close(c->c.c);
    return;
  }
  step(c);
}

static int same_bytes(hr_tensor *a, hr_tensor *b) {
  size_t i;

  if (hr_tensor_member_count(a) != hr_tensor_member_count(b))
    return 0;
  if (hr_tensor_member_count(a)) {
    for (i = 0; i < hr_tensor_member_count(a); i++)
      if (!same_bytes(hr_tensor_member(a, i), hr_tensor_member(b, i)))
        return 0;
    return 1;
  }
  return hr_tensor_bytes(a) == hr_tensor_bytes(b) &&
         memcmp(hr_tensor_buffer(a, 0), hr_tensor_buffer(b, 0),
                hr_tensor_bytes(a)) == 0 &&
         hr_tensor_descriptor(a)->layout.tag ==
             hr_tensor_descriptor(b)->layout.tag;
}

static void on_get(hr_session *s, uint32_t sid, hr_tensor *t,
                   const hr_transfer_record *rec, void *ud) {
  client *c = ud;

  (void)s;
  (void)sid;
  if (c->op == OP_MISSING) {
    if (t || rec->wire_error != HR_WIRE_NOT_FOUND)
      FAIL("client %d: missing key answered %s", c->id,
           hr_wire_error_name(rec->wire_error));
  } else if (!t) {
    FAIL("client %d: GET failed: %s %s", c->id,
         hr_wire_error_name(rec->wire_error), rec->message);
  } else if (!same_bytes(c->op == OP_CHECK_PUT ? c->mine : refs[c->want], t)) {
    FAIL("client %d: GET %d returned other bytes", c->id, c->want);
  }
  hr_tensor_unref(t);
  finish_request(c);
}

static void on_put(hr_session *s, uint32_t sid, const hr_transfer_record *rec,
                   void *ud) {
  client *c = ud;

  (void)s;
  (void)sid;
  if (rec->status)
    FAIL("client %d: PUT failed: %s", c->id,
         hr_wire_error_name(rec->wire_error));
  finish_request(c);
}

static void on_list(hr_session *s, int status, uint32_t wire_error,
                    const hr_list_response *resp, void *ud) {
  client *c = ud;
  hr_list_entry e;
  size_t pos = 0, n = 0;
  char prev[64] = "";

  (void)s;
  if (status) {
    FAIL("client %d: LIST failed: %s", c->id, hr_wire_error_name(wire_error));
  } else {
    while (hr_list_entry_next(resp->entries_raw, resp->entries_raw_len, &pos,
                              &e)) {
      char k[64];
      snprintf(k, sizeof k, "%.*s", (int)e.key_len, (const char *)e.key);
      if (strncmp(k, "ref/", 4) != 0 || strcmp(k, prev) <= 0)
        FAIL("client %d: LIST order or prefix broken at %s", c->id, k);
      snprintf(prev, sizeof prev, "%s", k);
      n++;
    }
    if (n != NTENSORS)
      FAIL("client %d: LIST gave %zu entries", c->id, n);
  }
  finish_request(c);
}

static void on_ping(hr_session *s, int status, uint64_t rtt, void *ud) {
  client *c = ud;

  (void)s;
  (void)rtt;
  if (status)
    FAIL("client %d: PING failed", c->id);
  finish_request(c);
}

static void step(client *c) {
  hr_session *s = hr_conn_session(c->c.c);
  hr_get_opts o;
  uint64_t r = next_rand(c) % 100;
  int rv;

  if (c->op == OP_PUT) {
    c->op = OP_CHECK_PUT; /* read back what we stored */
    tc_opts(&o, c->my_key);
    rv = hr_session_get(s, &o, on_get, c, NULL);
  } else if (r < 55) {
    c->op = OP_GET;
    c->want = (int)(next_rand(c) % NTENSORS);
    tc_opts(&o, ref_keys[c->want]);
    rv = hr_session_get(s, &o, on_get, c, NULL);
  } else if (r < 70) {
    c->op = OP_PUT;
    snprintf(c->my_key, sizeof c->my_key, "cl/%d", c->id);
    rv = hr_session_put(s, (const uint8_t *)c->my_key,
                        (uint16_t)strlen(c->my_key), HR_PUT_REPLACE, c->mine,
                        on_put, c, NULL);
  } else if (r < 80) {
    c->op = OP_LIST;
    rv = hr_session_list(s, (const uint8_t *)"ref/", 4, NULL, 0, 100, on_list,
                         c);
  } else if (r < 95) {
    c->op = OP_PING;
    rv = hr_session_ping(s, on_ping, c);
  } else {
    c->op = OP_MISSING;
    tc_opts(&o, "missing/key");
    rv = hr_session_get(s, &o, on_get, c, NULL);
  }
  if (rv)
    FAIL("client %d: request refused locally: %s", c->id, hr_strerror(rv));
}

static int all_up(void *ud) {
  worker *w = ud;
  int i;
  for (i = 0; i < CLIENTS / THREADS; i++)
    if (!w->cl[i].c.up && !w->cl[i].c.closed)
      return 0;
  return 1;
}

static int all_closed(void *ud) {
  worker *w = ud;
  int i;
  for (i = 0; i < CLIENTS / THREADS; i++)
    if (!w->cl[i].c.closed)
      return 0;
  return 1;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  char url[64];
  int i;

  w->env = tl_new(TL_EPOLL);
  w->e = tl_engine(w->env, NULL);
  snprintf(url, sizeof url, "127.0.0.1:%d", server_port);
  for (i = 0; i < CLIENTS / THREADS; i++) {
    client *c = &w->cl[i];
    uint64_t shape[1] = {1000 + 37 * (uint64_t)i};
    c->w = w;
    c->id = w->index * (CLIENTS / THREADS) + i;
    c->rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)(c->id + 1);
    c->mine = tl_dense(HR_ELEM_UINT16, 1, shape, (uint32_t)c->id + 1000);
    tc_connect(w->env, w->e, url, &c->c, NULL);
  }
  if (!tl_run(w->env, all_up, w, 60000))
    FAIL("worker %d: connections did not come up", w->index);
  for (i = 0; i < CLIENTS / THREADS; i++) {
    if (w->cl[i].c.closed)
      FAIL("client %d: connect failed: %s", w->cl[i].id, w->cl[i].c.message);
    else
      step(&w->cl[i]);
  }
  hr_engine_flush(w->e);
  if (!tl_run(w->env, all_closed, w, 120000))
    FAIL("worker %d: clients did not finish (%d done)", w->index, w->finished);
  tl_engine_finish(w->env, w->e);
  tl_free(w->env);
  for (i = 0; i < CLIENTS / THREADS; i++) {
    if (w->cl[i].done_reqs != REQUESTS)
      FAIL("client %d: %d requests done", w->cl[i].id, w->cl[i].done_reqs);
    hr_tensor_unref(w->cl[i].mine);
  }
  return NULL;
}

static void test_200_clients(void **state) {
  static const uint8_t elems[] = {HR_ELEM_UINT8, HR_ELEM_FLOAT32, HR_ELEM_INT64,
                                  HR_ELEM_BFLOAT16};
  static const uint8_t layouts[] = {HR_LAYOUT_ROW_MAJOR, HR_LAYOUT_COLUMN_MAJOR,
                                    HR_LAYOUT_TILED};
  static worker workers[THREADS];
  pthread_t srv, th[THREADS];
  int i;

  (void)state;
  for (i = 0; i < NTENSORS; i++) {
    uint8_t e = elems[i % 4];
    uint64_t bytes = 1024u << (i % 10); /* 1 KiB .. 512 KiB */
    uint64_t cols = 64, rows = bytes / (hr_elem_bits(e) / 8) / cols;
    uint64_t shape[2] = {rows, cols};
    refs[i] = tl_tensor(e, layouts[i % 3], 2, shape, NULL, (uint32_t)i);
    snprintf(ref_keys[i], sizeof ref_keys[i], "ref/%02d", i);
  }
  pthread_mutex_lock(&ready_lock);
  assert_int_equal(pthread_create(&srv, NULL, server_main, NULL), 0);
  while (!server_port)
    pthread_cond_wait(&ready_cond, &ready_lock);
  pthread_mutex_unlock(&ready_lock);
  for (i = 0; i < THREADS; i++) {
    workers[i].index = i;
    assert_int_equal(pthread_create(&th[i], NULL, worker_main, &workers[i]), 0);
  }
  for (i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  atomic_store(&server_stop, 1);
  pthread_join(srv, NULL);
  for (i = 0; i < NTENSORS; i++)
    hr_tensor_unref(refs[i]);
  assert_int_equal(atomic_load(&failures), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_200_clients),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
