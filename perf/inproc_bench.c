/*
 * inproc_bench: in-process interchange, each figure beside a baseline
 * measured in the same run.
 *
 *  1. Channel: tensors (64 bytes, wrapped anew each time) handed from a
 *     producer thread to a consumer thread, release included; baseline:
 *     the same number of 8-byte pointers through a pipe(2) between the
 *     same two threads (the cheapest way to pass a handle through the
 *     kernel).
 *  2. The in-process pair: GET round trips between a client engine (main
 *     thread) and a server engine (its own thread), each on its own
 *     libevent loop, for a 4 KiB and a 1 GiB tensor; baseline for the
 *     small one: a pipe ping-pong between the threads; for the large one:
 *     memcpy() of 1 GiB (what any copying transport pays at least).
 *
 * Usage: inproc_bench [MESSAGES] [GETS]   (defaults 200000, 2000).
 */
#include <event2/event.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hurray/hr_event.h>
#include <hurray/inproc.h>
#include <hurray/store.h>

#include "bench_common.h"

static hr_tensor *bytes_tensor(uint64_t n, void *buf) {
  hr_descriptor d;
  hr_tensor *t;
  bc_bytes_desc(&d, n, 0);
  if (buf) {
    void *bufs[1] = {buf};
    if (hr_tensor_wrap(&t, &d, bufs, NULL, NULL, NULL) != 0)
      abort();
  } else if (hr_tensor_alloc(&t, &d, 12, NULL) != 0) {
    abort();
  }
  return t;
}

/* ---- 1. channel vs pipe -------------------------------------------------- */

typedef struct chan_run {
  hr_inproc_chan *ch;
  int fds[2];
  long n;
  uint8_t buf[64];
} chan_run;

static void *chan_producer(void *arg) {
  chan_run *r = arg;
  for (long i = 0; i < r->n; i++) {
    hr_tensor *t = bytes_tensor(64, r->buf);
    if (hr_inproc_send_wait(r->ch, t, NULL, -1, NULL) != 0)
      abort();
    hr_tensor_unref(t);
  }
  hr_inproc_chan_close(r->ch);
  return NULL;
}

static void *pipe_producer(void *arg) {
  chan_run *r = arg;
  for (long i = 0; i < r->n; i++) {
    void *p = r->buf;
    if (write(r->fds[1], &p, sizeof p) != sizeof p)
      abort();
  }
  close(r->fds[1]);
  return NULL;
}

static void bench_channel(long n) {
  chan_run r;
  pthread_t th;
  hr_inproc_chan_config cfg;
  hr_inproc_msg *m;
  long got = 0;
  double t0, chan_s, pipe_s;

  memset(&r, 0, sizeof r);
  r.n = n;
  hr_inproc_chan_config_default(&cfg);
  cfg.capacity = 256;
  if (hr_inproc_chan_new(&r.ch, &cfg, NULL) != 0)
    abort();
  t0 = bc_now_s();
  pthread_create(&th, NULL, chan_producer, &r);
  while (hr_inproc_recv_wait(r.ch, &m, -1) == 0) {
    hr_inproc_msg_release(m);
    hr_inproc_msg_del(m);
    got++;
  }
  pthread_join(th, NULL);
  chan_s = bc_now_s() - t0;
  hr_inproc_chan_del(r.ch, NULL);
  if (got != n)
    abort();

  if (pipe(r.fds) != 0)
    abort();
  t0 = bc_now_s();
  pthread_create(&th, NULL, pipe_producer, &r);
  void *p;
  got = 0;
  while (read(r.fds[0], &p, sizeof p) == sizeof p)
    got++;
  pthread_join(th, NULL);
  pipe_s = bc_now_s() - t0;
  close(r.fds[0]);
  if (got != n)
    abort();
  printf("channel, %ld tensors thread to thread: %.0f ns each (%.2f M/s) | "
         "pipe of pointers: %.0f ns each | ratio %.2f\n",
         n, chan_s / (double)n * 1e9, (double)n / chan_s * 1e-6,
         pipe_s / (double)n * 1e9, chan_s / pipe_s);
}

/* ---- 2. the pair vs pipe ping-pong and memcpy -----------------------------
 */

typedef struct pair {
  struct event_base *sb, *cb;
  hr_engine *se, *ce;
  hr_store *store;
  hr_inproc_hub *hub;
  hr_inproc_server *srv;
  hr_inproc_conn *conn;
  int stop; /* atomic */
  int done;
  hr_tensor *got;
} pair;

static void *server_loop(void *arg) {
  pair *p = arg;
  while (!__atomic_load_n(&p->stop, __ATOMIC_SEQ_CST))
    event_base_loop(p->sb, EVLOOP_ONCE);
  return NULL;
}

static void on_get(hr_session *s, uint32_t sid, hr_tensor *t,
                   const hr_transfer_record *rec, void *ud) {
  pair *p = ud;
  (void)s;
  (void)sid;
  if (rec->status != 0) {
    fprintf(stderr, "GET: %s\n", hr_strerror(rec->status));
    abort();
  }
  p->got = t;
  p->done = 1;
}

/* Seconds per GET of `key`, averaged over n round trips (the tensor is
 * dropped at once, so its release goes back each time). */
static double get_rtt(pair *p, const char *key, long n) {
  hr_get_opts o;
  double t0 = bc_now_s();
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)key;
  o.key_len = (uint16_t)strlen(key);
  for (long i = 0; i < n; i++) {
    p->done = 0;
    if (hr_inproc_get(p->conn, &o, on_get, p, NULL) != 0)
      abort();
    while (!p->done)
      event_base_loop(p->cb, EVLOOP_ONCE);
    hr_tensor_unref(p->got);
  }
  return (bc_now_s() - t0) / (double)n;
}

typedef struct pp {
  int a[2], b[2];
  long n;
} pp;

static void *ponger(void *arg) {
  pp *x = arg;
  char c;
  for (long i = 0; i < x->n; i++) {
    if (read(x->a[0], &c, 1) != 1 || write(x->b[1], &c, 1) != 1)
      abort();
  }
  return NULL;
}

static double pipe_rtt(long n) {
  pp x;
  pthread_t th;
  char c = 1;
  double t0;
  if (pipe(x.a) || pipe(x.b))
    abort();
  x.n = n;
  pthread_create(&th, NULL, ponger, &x);
  t0 = bc_now_s();
  for (long i = 0; i < n; i++)
    if (write(x.a[1], &c, 1) != 1 || read(x.b[0], &c, 1) != 1)
      abort();
  double s = (bc_now_s() - t0) / (double)n;
  pthread_join(th, NULL);
  close(x.a[0]);
  close(x.a[1]);
  close(x.b[0]);
  close(x.b[1]);
  return s;
}

static void bench_pair(long n) {
  pair p;
  pthread_t th;
  hr_provider prov;
  hr_tensor *small, *big;
  const uint64_t gib = 1ull << 30;

  memset(&p, 0, sizeof p);
  p.sb = event_base_new();
  p.cb = event_base_new();
  if (hr_ev_attach(&p.se, p.sb, NULL, NULL) ||
      hr_ev_attach(&p.ce, p.cb, NULL, NULL) ||
      hr_store_new(&p.store, NULL, NULL) || hr_inproc_hub_new(&p.hub, NULL))
    abort();
  small = bytes_tensor(4096, NULL);
  big = bytes_tensor(gib, NULL);
  memset(hr_tensor_buffer(big, 0), 7, gib);
  hr_store_put(p.store, "small", 5, small, 0);
  hr_store_put(p.store, "big", 3, big, 0);
  hr_store_provider(p.store, &prov);
  if (hr_inproc_listen(p.hub, p.se, "bench", &prov, &p.srv) ||
      hr_inproc_connect(p.hub, p.ce, "bench", &p.conn))
    abort();
  pthread_create(&th, NULL, server_loop, &p);

  get_rtt(&p, "small", 100); /* warm up */
  double small_s = get_rtt(&p, "small", n);
  double pipe_s = pipe_rtt(n);
  double big_s = get_rtt(&p, "big", 20);
  uint8_t *dst = malloc(gib);
  if (!dst)
    abort();
  memset(dst, 0, gib);
  double t0 = bc_now_s();
  memcpy(dst, hr_tensor_buffer(big, 0), gib);
  double copy_s = bc_now_s() - t0;
  if (dst[gib - 1] != 7)
    abort();
  free(dst);

  printf("pair GET 4 KiB, 2 threads: %.1f us per round trip | pipe "
         "ping-pong: %.1f us | ratio %.2f\n",
         small_s * 1e6, pipe_s * 1e6, small_s / pipe_s);
  printf("pair GET 1 GiB (by reference): %.1f us | memcpy of 1 GiB: %.1f ms "
         "(%.2f GB/s) | %.0fx faster than one copy\n",
         big_s * 1e6, copy_s * 1e3, (double)gib / copy_s * 1e-9,
         copy_s / big_s);

  __atomic_store_n(&p.stop, 1, __ATOMIC_SEQ_CST);
  hr_engine_wakeup(p.se);
  pthread_join(th, NULL);
  hr_inproc_conn_close(p.conn);
  hr_inproc_server_close(p.srv);
  for (int i = 0; i < 4; i++) {
    event_base_loop(p.cb, EVLOOP_NONBLOCK);
    event_base_loop(p.sb, EVLOOP_NONBLOCK);
  }
  if (hr_engine_del(p.ce) || hr_engine_del(p.se))
    abort();
  hr_store_del(p.store);
  hr_tensor_unref(small);
  hr_tensor_unref(big);
  if (hr_inproc_hub_del(p.hub, NULL) != 0)
    abort();
  event_base_free(p.sb);
  event_base_free(p.cb);
}

int main(int argc, char **argv) {
  long msgs = argc > 1 ? atol(argv[1]) : 200000;
  long gets = argc > 2 ? atol(argv[2]) : 2000;
  bench_channel(msgs);
  bench_pair(gets);
  return 0;
}
