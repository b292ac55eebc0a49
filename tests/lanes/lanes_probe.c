/*
 * lanes_probe: both ends of the two-host lanes test (netns.sh).
 *
 *   lanes_probe serve HOST:PORT   serves the test tensors until SIGTERM or
 *                                 SIGINT; prints "ready PORT" once
 *                                 listening (port 0 picks one)
 *   lanes_probe expect DIR        writes the .npy files the CLI's fetches
 *                                 must equal, byte for byte
 *   lanes_probe check URL         the API checks across the network
 *
 * The tensors are filled from their element index, so both ends build
 * them alike.  GET of "!cut2" answers with "big" and cuts lane 2 of the
 * asking session on the server once that lane sent 1 MiB of it: a lane
 * dying mid-transfer from the server's side.  `check` runs parallel GETs over 1
 * to 4 lanes, regions at the corners and edges of a rank-3 tensor, and a lane
 * cut from each side, with GETs beside it that must not notice.  Exits 0, or 1
 * with the first failure on stderr.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include <hurray/engine.h>
#include <hurray/files.h>
#include <hurray/hr_event.h>
#include <hurray/session.h>
#include <hurray/store.h>

#include "lanes_get.h"

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "lanes_probe: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

#define CHECK(x)                                                               \
  do {                                                                         \
    if (!(x))                                                                  \
      die("%s:%d: %s", __FILE__, __LINE__, #x);                                \
  } while (0)

/* ---- the test tensors ---------------------------------------------------- */

typedef struct spec {
  const char *key;
  uint8_t elem;
  unsigned rank;
  uint64_t shape[3];
} spec;

static const spec specs[] = {
    {"w", HR_ELEM_FLOAT32, 2, {512, 1024, 0}},    /* 2 MB */
    {"big", HR_ELEM_FLOAT32, 2, {2048, 1024, 0}}, /* 8 MB */
    {"r3", HR_ELEM_INT16, 3, {6, 5, 4}},
};

static uint8_t fill_byte(uint64_t i) {
  uint64_t x = (i + 7) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 31;
  return (uint8_t)x;
}

/* The box (off, shp) of spec `sp` as a row-major tensor. */
static hr_tensor *make(const spec *sp, const uint64_t *off,
                       const uint64_t *shp) {
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = sp->elem;
  d.rank = (uint8_t)sp->rank;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  unsigned esz = hr_elem_bits(sp->elem) / 8;
  uint64_t n = 1;
  for (unsigned k = 0; k < sp->rank; k++) {
    d.shape[k] = shp ? shp[k] : sp->shape[k];
    n *= d.shape[k];
  }
  d.buffers[0].size_bytes = n * esz;
  d.buffers[0].alignment_log2 = 6;
  hr_tensor *t;
  CHECK(hr_tensor_alloc(&t, &d, 6, NULL) == 0);
  uint8_t *b = hr_tensor_buffer(t, 0);
  uint64_t idx[3] = {0, 0, 0};
  for (uint64_t e = 0; e < n; e++) {
    uint64_t g = 0;
    for (unsigned k = 0; k < sp->rank; k++)
      g = g * sp->shape[k] + idx[k] + (off ? off[k] : 0);
    for (unsigned x = 0; x < esz; x++)
      b[e * esz + x] = fill_byte(g * esz + x);
    for (unsigned k = sp->rank; k-- > 0;) {
      if (++idx[k] < d.shape[k])
        break;
      idx[k] = 0;
    }
  }
  return t;
}

static const spec *find(const char *key) {
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
    if (!strcmp(specs[i].key, key))
      return &specs[i];
  return NULL;
}

/* ---- serve --------------------------------------------------------------- */

static struct event_base *base;
static hr_store *store;
static int (*store_on_get)(hr_session *, hr_srv_get *, void *);
static uint64_t cut_sent;

/* Counts what lane 2 sends; past 1 MiB the lane is cut. */
static void cut_tap(const void *bytes, size_t len, void *ud) {
  (void)bytes;
  cut_sent += len;
  if (cut_sent >= (1u << 20) && cut_sent - len < (1u << 20))
    hr_conn_abort(ud);
}

static int probe_on_get(hr_session *s, hr_srv_get *g, void *ud) {
  const hr_get_info *in = hr_srv_get_info(g);
  if (in->key_len == 5 && !memcmp(in->key, "!cut2", 5)) {
    hr_group *grp = hr_session_group(s);
    hr_session *l2 = grp ? hr_group_lane(grp, 2) : NULL;
    if (l2) {
      cut_sent = 0;
      hr_conn_set_tap(hr_session_user_data(l2), NULL, cut_tap,
                      hr_session_user_data(l2));
    }
    hr_tensor *t = make(find("big"), NULL, NULL);
    int rv = hr_get_answer(g, t);
    hr_tensor_unref(t);
    return hr_err_is_fatal(rv) ? HR_ERR_CALLBACK_FAILURE : 0;
  }
  return store_on_get(s, g, ud);
}

static void on_signal(evutil_socket_t fd, short what, void *ud) {
  (void)fd;
  (void)what;
  event_base_loopexit(ud, NULL);
}

static int serve(const char *addr) {
  base = event_base_new();
  CHECK(base);
  hr_store_config sc;
  hr_store_config_default(&sc);
  CHECK(hr_store_new(&store, &sc, NULL) == 0);
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
    hr_tensor *t = make(&specs[i], NULL, NULL);
    CHECK(hr_store_put(store, specs[i].key, strlen(specs[i].key), t,
                       HR_PUT_REPLACE) == 0);
    hr_tensor_unref(t);
  }
  hr_provider prov;
  hr_store_provider(store, &prov);
  store_on_get = prov.on_get;
  prov.on_get = probe_on_get;
  hr_engine_config cfg;
  hr_engine_config_default(&cfg);
  /* Tensors of a few MB take several shards; small socket buffers keep a
   * transfer in flight over many loop turns. */
  cfg.session.shard_bytes = 256 * 1024;
  cfg.session.shards_per_lane = 16;
  cfg.io_budget = 256 * 1024;
  cfg.socket_buffer = 128 * 1024;
  hr_engine *e;
  CHECK(hr_ev_attach(&e, base, &cfg, NULL) == 0);
  hr_listener *l;
  CHECK(hr_engine_listen(e, addr, &prov, &l) == 0);
  struct event *sigs[2] = {evsignal_new(base, SIGTERM, on_signal, base),
                           evsignal_new(base, SIGINT, on_signal, base)};
  event_add(sigs[0], NULL);
  event_add(sigs[1], NULL);
  printf("ready %d\n", hr_listener_port(l));
  fflush(stdout);
  event_base_dispatch(base);
  event_free(sigs[0]);
  event_free(sigs[1]);
  hr_listener_close(l);
  for (hr_engine_close(e, NULL, NULL); hr_engine_del(e) == HR_ERR_BUSY;)
    event_base_loop(base, EVLOOP_ONCE);
  hr_store_del(store);
  event_base_free(base);
  return 0;
}

/* ---- expect -------------------------------------------------------------- */

static void save(const char *dir, const char *name, hr_tensor *t) {
  char path[4096], why[256];
  snprintf(path, sizeof path, "%s/%s.npy", dir, name);
  if (hr_npy_save(path, hr_tensor_descriptor(t), hr_tensor_buffer(t, 0), why,
                  sizeof why))
    die("%s", why);
  hr_tensor_unref(t);
}

static int expect(const char *dir) {
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
    save(dir, specs[i].key, make(&specs[i], NULL, NULL));
  /* big: the region 100,0:900,1024 and slice 1 of 3 along dim 1. */
  save(dir, "big_region",
       make(find("big"), (uint64_t[]){100, 0}, (uint64_t[]){900, 1024}));
  save(dir, "big_slice",
       make(find("big"), (uint64_t[]){0, 342}, (uint64_t[]){2048, 341}));
  return 0;
}

/* ---- check --------------------------------------------------------------- */

typedef struct cconn {
  hr_conn *c;
  int up, closed;
} cconn;

static void on_conn(hr_conn *c, int status, void *ud) {
  cconn *cc = ud;
  (void)c;
  if (status == 0 && !cc->up)
    cc->up = 1;
  else
    cc->closed = 1;
}

/* Runs the loop until *flag (up to 60 s). */
static void run_until(const int *flag) {
  struct timeval tick = {0, 20000};
  for (int i = 0; i < 3000 && !*flag; i++) {
    event_base_loopexit(base, &tick);
    event_base_loop(base, EVLOOP_ONCE);
  }
  CHECK(*flag);
}

static void get(hr_engine *e, cconn *cc, const char *key, uint16_t k,
                const uint64_t *off, const uint64_t *shp, unsigned rank,
                got *g) {
  CHECK(lanes_get_start(e, cc->c, key, k, off, shp, rank, g) == 0);
}

static void same(got *g, const spec *sp, const uint64_t *off,
                 const uint64_t *shp) {
  if (g->rec.status)
    die("GET %s: %s (%s)", sp->key, hr_strerror(g->rec.status), g->rec.message);
  hr_tensor *want = make(sp, off, shp);
  CHECK(hr_tensor_bytes(g->t) == hr_tensor_bytes(want));
  CHECK(!memcmp(hr_tensor_buffer(g->t, 0), hr_tensor_buffer(want, 0),
                hr_tensor_bytes(want)));
  hr_tensor_unref(want);
  hr_tensor_unref(g->t);
  g->t = NULL;
}

static void open_lanes(hr_engine *e, const char *url, unsigned lanes,
                       cconn *cc) {
  memset(cc, 0, sizeof *cc);
  CHECK(hr_engine_connect_group(e, url, lanes, NULL, on_conn, cc, &cc->c) == 0);
  run_until(&cc->up);
  CHECK(hr_conn_lanes(cc->c) == lanes);
}

static void close_lanes(cconn *cc) {
  hr_conn_close(cc->c);
  run_until(&cc->closed);
}

static uint64_t lane_rx(cconn *cc, unsigned i) {
  hr_session *s = hr_group_lane(hr_session_group(hr_conn_session(cc->c)), i);
  uint64_t rx = 0;
  if (s)
    hr_conn_bytes(hr_session_user_data(s), &rx, NULL);
  return rx;
}

static int check(const char *url) {
  base = event_base_new();
  CHECK(base);
  hr_engine_config cfg;
  hr_engine_config_default(&cfg);
  /* Reads of at most 256 KiB per turn: the client sees a cut lane's
   * transfer half way. */
  cfg.io_budget = 256 * 1024;
  cfg.socket_buffer = 128 * 1024;
  hr_engine *e;
  CHECK(hr_ev_attach(&e, base, &cfg, NULL) == 0);
  const spec *w = find("w"), *big = find("big"), *r3 = find("r3");
  /* Parallel GETs: K shards over L lanes. */
  static const uint16_t ks[] = {1, 2, 3, 8};
  for (unsigned lanes = 1; lanes <= 4; lanes++) {
    cconn cc;
    open_lanes(e, url, lanes, &cc);
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
      got g;
      get(e, &cc, "w", ks[i], NULL, NULL, 0, &g);
      run_until(&g.done);
      if (g.rec.shards != ks[i] ||
          g.rec.lanes != (ks[i] < lanes ? ks[i] : lanes))
        die("L=%u K=%u: %u shards over %u lanes", lanes, ks[i], g.rec.shards,
            g.rec.lanes);
      same(&g, w, NULL, NULL);
    }
    close_lanes(&cc);
  }
  printf("parallel GETs over 1-4 lanes: ok\n");
  /* Regions: every corner and edge of r3, half of them sharded. */
  cconn cc;
  open_lanes(e, url, 3, &cc);
  got rg[27];
  uint64_t off[27][3], shp[27][3];
  for (unsigned c = 0; c < 27; c++) {
    unsigned x = c;
    for (unsigned k = 0; k < 3; k++, x /= 3) {
      off[c][k] = x % 3 == 1 ? r3->shape[k] - 1 : 0;
      shp[c][k] = x % 3 == 2 ? r3->shape[k] : 1;
    }
    get(e, &cc, "r3", (c & 1) ? 3 : 0, off[c], shp[c], 3, &rg[c]);
  }
  for (unsigned c = 0; c < 27; c++) {
    run_until(&rg[c].done);
    same(&rg[c], r3, off[c], shp[c]);
  }
  printf("regions at the corners and edges: ok\n");
  /* A lane cut mid-transfer, from the client, then from the server. */
  for (int side = 0; side < 2; side++) {
    got a, b, c;
    get(e, &cc, side ? "!cut2" : "big", 6, NULL, NULL, 0, &a);
    get(e, &cc, "big", 0, NULL, NULL, 0, &b);
    get(e, &cc, "big", 2, NULL, NULL, 0, &c);
    if (side == 0) {
      struct timeval tick = {0, 5000};
      for (int i = 0; i < 4000 && !a.done && lane_rx(&cc, 2) < (1u << 20);
           i++) {
        event_base_loopexit(base, &tick);
        event_base_loop(base, EVLOOP_ONCE);
      }
      CHECK(!a.done);
      hr_session *l2 =
          hr_group_lane(hr_session_group(hr_conn_session(cc.c)), 2);
      hr_conn_abort(hr_session_user_data(l2));
    }
    run_until(&a.done);
    run_until(&b.done);
    run_until(&c.done);
    if (a.rec.status != HR_ERR_CLOSED)
      die("cut from the %s: the GET with shards on lane 2 ended with %s",
          side ? "server" : "client", hr_strerror(a.rec.status));
    same(&b, big, NULL, NULL);
    same(&c, big, NULL, NULL);
    /* The rest of the session goes on; later GETs avoid lane 2. */
    got d;
    get(e, &cc, "big", 8, NULL, NULL, 0, &d);
    run_until(&d.done);
    CHECK(d.rec.shards == 2);
    same(&d, big, NULL, NULL);
    close_lanes(&cc);
    if (side == 0)
      open_lanes(e, url, 3, &cc);
  }
  printf("a lane cut from either side fails only its transfers: ok\n");
  hr_engine_close(e, NULL, NULL);
  for (int i = 0; i < 1000 && hr_engine_del(e) == HR_ERR_BUSY; i++)
    event_base_loop(base, EVLOOP_ONCE);
  event_base_free(base);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "serve"))
    return serve(argv[2]);
  if (argc == 3 && !strcmp(argv[1], "expect"))
    return expect(argv[2]);
  if (argc == 3 && !strcmp(argv[1], "check"))
    return check(argv[2]);
  fprintf(stderr, "usage: lanes_probe serve HOST:PORT | expect DIR | "
                  "check URL\n");
  return 2;
}
