/*
 * shm_bench: one GET of a large tensor three ways, in one run
 * (guides/performance.md: the baselines are measured beside the figure):
 *
 *   1. TCP loopback, frames, into a pre-faulted application buffer, the
 *      server sending from ordinary (heap, huge-page) memory;
 *   2. a Unix domain socket, frames (--no-shm), same buffers;
 *   3. the same Unix socket with the SHM data plane: the server hands over
 *      the tensor's sealed memfd, the client maps it (no copy).
 * (SHM_BENCH_NOTAP=1 runs without the receive tap that times the first
 * byte, to check it costs nothing.)
 *
 * For each: the GET's wall time (request sent to tensor usable), GB/s,
 * and the time to first byte (the first tensor byte readable by the
 * application: for frames the first receive after the descriptor and the
 * first frame prefix; for SHM the completion, when the whole mapping is
 * there).  Then the SHM GET of a 64 MiB tensor, to show its time does not
 * grow with the size, and the time to touch every page of the 1 GiB
 * mapping once (the page faults an application reading it pays).
 * Target: SHM >= 10x faster than TCP at 1 GiB.
 *
 * --sweep: SHM GETs of 4 KiB .. 1 GiB tensors (--max-mib caps it), per-GET
 * latency (the median GET, one at a time, each released before the next)
 * and GETs/s (the best round) with 64 in flight on one connection (each
 * released in its callback), for tensors in their own segment and in a
 * shared arena, with the client's mapping cache on and off.
 *
 *   shm_bench [--mib N] [--sweep [--max-mib N | --max-kib N]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <hurray/client.h>
#include <hurray/shm.h>
#include <hurray/store.h>

#include "bench_common.h"

/* A segment-backed tensor of `bytes` bytes, every page written. */
static hr_tensor *seg_tensor(uint64_t bytes) {
  hr_descriptor d;
  hr_tensor *t;
  bc_bytes_desc(&d, bytes, 12);
  if (hr_shm_tensor_alloc(&t, &d, NULL) != 0)
    bc_die("hr_shm_tensor_alloc");
  uint8_t *p = hr_tensor_buffer(t, 0);
  for (uint64_t i = 0; i < bytes; i++)
    p[i] = (uint8_t)(i * 131 + (i >> 12));
  return t;
}

typedef struct tap {
  int armed;
  uint64_t seen;
  double first; /* time the first tensor byte arrived */
} tap;

static void on_rx(const void *b, size_t n, void *ud) {
  tap *tp = ud;
  (void)b;
  if (!tp->armed)
    return;
  tp->seen += n;
  /* Past the descriptor (~100 bytes) and the first frame prefix. */
  if (tp->first == 0 && tp->seen > 160)
    tp->first = bc_now_s();
}

/* GET options for `key`, in one shard. */
static void get_opts(hr_get_opts *o, const char *key) {
  memset(o, 0, sizeof *o);
  o->key = (const uint8_t *)key;
  o->key_len = (uint16_t)strlen(key);
  o->max_shards = 1;
}

typedef struct result {
  double secs, ttfb;
  int plane;
} result;

static result fetch(const char *url, int shm, const char *key, hr_tensor *ref,
                    uint8_t *dst, uint64_t n) {
  hr_client_options co;
  hr_client *c;
  hr_get_opts o;
  hr_get_dest dest;
  hr_tensor *t;
  hr_transfer_record rec;
  tap tp;
  result r;
  double t0;

  memset(&tp, 0, sizeof tp);
  hr_client_options_default(&co);
  co.on_rx = getenv("SHM_BENCH_NOTAP") ? NULL : on_rx;
  co.user_data = &tp;
  co.timeout_ms = 120000;
  if (!shm)
    co.settings.capabilities &= ~(uint32_t)HR_CAP_SHM_DATA_PLANE;
  if (hr_client_connect(&c, url, &co, NULL, NULL) != 0)
    bc_die("connect");
  get_opts(&o, key);
  if (!shm) {
    memset(&dest, 0, sizeof dest);
    dest.buffer = dst;
    dest.capacity = n;
    o.dest = &dest;
  }
  tp.armed = 1;
  t0 = bc_now_s();
  if (hr_client_get(c, &o, &t, &rec) != 0)
    bc_die(hr_client_last_error(c)->message);
  r.secs = bc_now_s() - t0;
  r.ttfb = shm ? r.secs : (tp.first ? tp.first - t0 : r.secs);
  r.plane = rec.data_plane;
  /* Spot checks (a full compare would touch every page of the SHM
   * mapping, measured separately below). */
  const uint8_t *a = hr_tensor_buffer(t, 0), *b = hr_tensor_buffer(ref, 0);
  for (uint64_t i = 0; i < n; i += n / 64 + 1)
    if (a[i] != b[i])
      bc_die("bytes differ");
  if (a[n - 1] != b[n - 1])
    bc_die("last byte differs");
  hr_tensor_unref(t);
  hr_client_close(c);
  return r;
}

/* ---- the sweep ---------------------------------------------------------- */

static volatile uint8_t sink;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct inflight {
  int left, bad;
} inflight;

static void sweep_cb(hr_session *s, uint32_t sid, hr_tensor *t,
                     const hr_transfer_record *rec, void *ud) {
  inflight *f = ud;
  (void)s;
  (void)sid;
  if (!t || rec->data_plane != HR_PLANE_SHM)
    f->bad++;
  else
    sink ^= ((const volatile uint8_t *)hr_tensor_buffer(t, 0))[0];
  hr_tensor_unref(t);
  f->left--;
}

static int sweep_done(void *ud) { return ((inflight *)ud)->left <= 0; }

#define MANY 256 /* keys of the many-keys lines */
static char many_keys[MANY][16];

/* Points `o` at the key of GET `i` of a sweep over `nkeys` keys (the
 * first `nkeys` of many_keys; with one key, `o` keeps its own). */
static void pick(hr_get_opts *o, int nkeys, int i) {
  if (nkeys > 1) {
    o->key = (const uint8_t *)many_keys[i % nkeys];
    o->key_len = (uint16_t)strlen(many_keys[i % nkeys]);
  }
}

/* Per-GET latency (us) and GETs/s with `depth` in flight for `key` (or,
 * with nkeys > 1, for keys KEY000.. in turn). */
static void sweep_one(const char *url, const char *key, int nkeys,
                      uint64_t bytes, int cache, double *lat_us,
                      double *rate) {
  hr_client_options co;
  hr_client *c;
  hr_get_opts o;
  hr_tensor *t;
  hr_transfer_record rec;
  int n = bytes <= (1u << 20) ? 2000 : bytes <= (64u << 20) ? 200 : 10;
  int depth = 64, rounds = n / depth > 4 ? n / depth : 4;
  double t0;

  hr_client_options_default(&co);
  co.timeout_ms = 120000;
  co.shm_map_cache = cache ? 0 : -1;
  if (hr_client_connect(&c, url, &co, NULL, NULL) != 0)
    bc_die("connect");
  get_opts(&o, key);
  for (int i = 0; i < nkeys && nkeys > 1; i++)
    snprintf(many_keys[i], sizeof many_keys[i], "%s%03d", key, i);
  for (int i = 0; i < 3; i++) { /* warm-up */
    pick(&o, nkeys, i);
    if (hr_client_get(c, &o, &t, &rec) != 0 || rec.data_plane != HR_PLANE_SHM)
      bc_die("sweep warm-up");
    hr_tensor_unref(t);
  }
  /* The machine is shared: the median GET and the best round say more
   * than means. */
  double *lat = malloc(sizeof *lat * (size_t)n), best = 0;
  if (!lat)
    bc_die("malloc");
  for (int i = 0; i < n; i++) {
    pick(&o, nkeys, i);
    t0 = bc_now_s();
    if (hr_client_get(c, &o, &t, &rec) != 0)
      bc_die(hr_client_last_error(c)->message);
    const volatile uint8_t *p = hr_tensor_buffer(t, 0);
    sink ^= p[0] ^ p[bytes - 1]; /* read it, as an application would */
    hr_tensor_unref(t);
    lat[i] = bc_now_s() - t0;
  }
  qsort(lat, (size_t)n, sizeof *lat, cmp_double);
  *lat_us = lat[n / 2] * 1e6;
  free(lat);
  for (int r = 0; r < rounds; r++) {
    inflight f = {depth, 0};
    t0 = bc_now_s();
    for (int i = 0; i < depth; i++) {
      pick(&o, nkeys, r * depth + i);
      if (hr_session_get(hr_client_session(c), &o, sweep_cb, &f, NULL) != 0)
        bc_die("hr_session_get");
    }
    if (hr_client_wait(c, sweep_done, &f, 120000) != 0 || f.bad)
      bc_die("in-flight GETs failed");
    double rr = depth / (bc_now_s() - t0);
    if (rr > best)
      best = rr;
  }
  *rate = best;
  hr_client_close(c);
}

/* One line of the sweep; SHM_BENCH_ONLY=WHAT runs only that case (to
 * count its system calls with strace -c). */
static void sweep_case(const char *url, const char *key, int nkeys,
                       uint64_t b, int cache, const char *label,
                       const char *what) {
  const char *only = getenv("SHM_BENCH_ONLY");
  double lat, rate;
  if (only && strcmp(only, what))
    return;
  sweep_one(url, key, nkeys, b, cache, &lat, &rate);
  printf("  %-9s %-34s %12.1f %14.0f\n", label, what, lat, rate);
}

static int sweep(uint64_t max_bytes) {
  bc_server s;
  hr_store *store;
  char path[96], unix_url[128];
  static const uint64_t sizes[] = {4096,      65536,      1u << 20,
                                   16u << 20, 256u << 20, 1024u << 20};
  hr_store_config sc;

  hr_store_config_default(&sc);
  sc.shm_arena_bytes = max_bytes + (64u << 20);
  hr_store_new(&store, &sc, NULL);
  snprintf(path, sizeof path, "/tmp/shm_bench.%d.sock", (int)getpid());
  bc_server_start(&s, store, NULL, path);
  snprintf(unix_url, sizeof unix_url, "unix:%s", path);
  printf("shm_bench --sweep: SHM GETs, one connection (one run; "
         "indicative)\n");
  printf("  %-9s %-34s %12s %14s\n", "size", "tensor in",
         "us per GET (median)", "GETs/s (64 in flight, best round)");
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    uint64_t b = sizes[i];
    char label[32];
    if (b > max_bytes)
      break;
    if (b >= (1u << 20))
      snprintf(label, sizeof label, "%llu MiB", (unsigned long long)(b >> 20));
    else
      snprintf(label, sizeof label, "%llu KiB", (unsigned long long)(b >> 10));
    hr_tensor *seg = seg_tensor(b);
    hr_store_put(store, "seg", 3, seg, HR_PUT_REPLACE);
    sweep_case(unix_url, "seg", 1, b, 0, label, "own segment, no cache");
    sweep_case(unix_url, "seg", 1, b, 1, label, "own segment, cache");
    /* The same bytes as a heap tensor: the store copies it into the
     * arena. */
    {
      hr_tensor *h, *got;
      if (hr_tensor_alloc(&h, hr_tensor_descriptor(seg), 0, NULL) != 0)
        bc_die("alloc");
      memcpy(hr_tensor_buffer(h, 0), hr_tensor_buffer(seg, 0), (size_t)b);
      hr_store_put(store, "arena", 5, h, HR_PUT_REPLACE);
      hr_tensor_unref(h);
      if (hr_store_get(store, "arena", 5, &got) != 0 ||
          !hr_shm_arena_owns(hr_store_arena(store), got))
        bc_die("the tensor did not go into the arena");
      hr_tensor_unref(got);
    }
    sweep_case(unix_url, "arena", 1, b, 0, label, "arena, no cache");
    sweep_case(unix_url, "arena", 1, b, 1, label, "arena, cache");
    hr_store_remove(store, "arena", 5);
    /* Many small keys read in turn: each in its own segment (a mapping
     * each, more than the cache keeps), or all in the arena. */
    if (b <= (64u << 10)) {
      char k[16];
      for (int j = 0; j < MANY; j++) {
        hr_tensor *m = seg_tensor(b);
        snprintf(k, sizeof k, "mseg%03d", j);
        hr_store_put(store, k, strlen(k), m, HR_PUT_REPLACE);
        hr_tensor_unref(m);
      }
      sweep_case(unix_url, "mseg", MANY, b, 0, label,
                 "256 keys, own segments, no cache");
      sweep_case(unix_url, "mseg", MANY, b, 1, label,
                 "256 keys, own segments, cache");
      for (int j = 0; j < MANY; j++) {
        hr_tensor *h;
        snprintf(k, sizeof k, "mar%03d", j);
        if (hr_tensor_alloc(&h, hr_tensor_descriptor(seg), 0, NULL) != 0)
          bc_die("alloc");
        hr_store_put(store, k, strlen(k), h, HR_PUT_REPLACE);
        hr_tensor_unref(h);
      }
      sweep_case(unix_url, "mar", MANY, b, 1, label,
                 "256 keys, arena, cache");
      for (int j = 0; j < MANY; j++) {
        snprintf(k, sizeof k, "mar%03d", j);
        hr_store_remove(store, k, strlen(k));
      }
      for (int j = 0; j < MANY; j++) {
        snprintf(k, sizeof k, "mseg%03d", j);
        hr_store_remove(store, k, strlen(k));
      }
    }
    hr_store_remove(store, "seg", 3);
    hr_tensor_unref(seg);
    fflush(stdout);
  }
  bc_server_stop(&s);
  unlink(path);
  hr_store_del(store);
  return 0;
}

int main(int argc, char **argv) {
  uint64_t mib = 1024, n, max_bytes = 1024ull << 20;
  bc_server s;
  hr_store *store;
  hr_tensor *big, *small;
  uint8_t *dst;
  char path[96], unix_url[128], tcp_url[64];
  result tcp, uds, shm, shm64;
  int i;

  for (i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--mib") && i + 1 < argc)
      mib = strtoull(argv[++i], NULL, 10);
  for (i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--max-mib") && i + 1 < argc)
      max_bytes = strtoull(argv[++i], NULL, 10) << 20;
    else if (!strcmp(argv[i], "--max-kib") && i + 1 < argc)
      max_bytes = strtoull(argv[++i], NULL, 10) << 10;
  for (i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--sweep"))
      return sweep(max_bytes);
  n = mib << 20;
  big = seg_tensor(n);
  small = seg_tensor(64ull << 20);
  dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
             0);
  if (dst == MAP_FAILED)
    bc_die("mmap");
  madvise(dst, n, MADV_HUGEPAGE);
  memset(dst, 0, n); /* fault the frames' destination in once */

  hr_store_new(&store, NULL, NULL);
  hr_store_put(store, "big", 3, big, 0);
  hr_store_put(store, "small", 5, small, 0);
  /* The same bytes in ordinary (heap, huge-page) memory: the frames
   * baseline from where an application's tensor usually lies. */
  {
    hr_tensor *h;
    if (hr_tensor_alloc(&h, hr_tensor_descriptor(big), 0, NULL) != 0)
      bc_die("hr_tensor_alloc");
    memcpy(hr_tensor_buffer(h, 0), hr_tensor_buffer(big, 0), n);
    hr_store_put(store, "heap", 4, h, 0);
    hr_tensor_unref(h);
  }
  snprintf(path, sizeof path, "/tmp/shm_bench.%d.sock", (int)getpid());
  bc_server_start(&s, store, NULL, path);
  snprintf(tcp_url, sizeof tcp_url, "127.0.0.1:%d", s.port);
  snprintf(unix_url, sizeof unix_url, "unix:%s", path);

  /* Warm-up (connections, the server's first touches). */
  (void)fetch(unix_url, 1, "small", small, dst, 64ull << 20);

  tcp = fetch(tcp_url, 0, "heap", big, dst, n);
  uds = fetch(unix_url, 0, "heap", big, dst, n);
  shm = fetch(unix_url, 1, "big", big, dst, n);
  shm64 = fetch(unix_url, 1, "small", small, dst, 64ull << 20);
  if (tcp.plane != HR_PLANE_FRAMES || uds.plane != HR_PLANE_FRAMES ||
      shm.plane != HR_PLANE_SHM || shm64.plane != HR_PLANE_SHM)
    bc_die("unexpected data plane");

  printf("shm_bench: GET of %llu MiB (one run; indicative)\n",
         (unsigned long long)mib);
  printf("  %-26s %10s %10s %12s\n", "transport", "time ms", "GB/s",
         "TTFB ms");
  printf("  %-26s %10.2f %10.2f %12.3f\n", "TCP loopback, frames",
         tcp.secs * 1e3, (double)n / tcp.secs / 1e9, tcp.ttfb * 1e3);
  printf("  %-26s %10.2f %10.2f %12.3f\n", "Unix socket, frames",
         uds.secs * 1e3, (double)n / uds.secs / 1e9, uds.ttfb * 1e3);
  printf("  %-26s %10.2f %10.2f %12.3f\n", "Unix socket, SHM plane",
         shm.secs * 1e3, (double)n / shm.secs / 1e9, shm.ttfb * 1e3);
  printf("  %-26s %10.2f %10s %12.3f\n", "Unix socket, SHM, 64 MiB",
         shm64.secs * 1e3, "-", shm64.ttfb * 1e3);
  printf("  SHM vs TCP: %.0fx faster; vs Unix frames: %.0fx\n",
         tcp.secs / shm.secs, uds.secs / shm.secs);

  /* What reading the mapping costs the application afterwards. */
  {
    hr_client *c;
    hr_get_opts o;
    hr_tensor *t;
    uint64_t sum = 0;
    double t0, t1;
    if (hr_client_connect(&c, unix_url, NULL, NULL, NULL) != 0)
      bc_die("connect");
    get_opts(&o, "big");
    if (hr_client_get(c, &o, &t, NULL) != 0)
      bc_die("get");
    const uint8_t *p = hr_tensor_buffer(t, 0);
    t0 = bc_now_s();
    for (uint64_t k = 0; k < n; k += 4096)
      sum += p[k];
    t1 = bc_now_s();
    printf("  touching every page of the %llu MiB mapping once: %.2f ms "
           "(checksum %llu)\n",
           (unsigned long long)mib, (t1 - t0) * 1e3,
           (unsigned long long)sum);
    hr_tensor_unref(t);
    hr_client_close(c);
  }

  bc_server_stop(&s);
  unlink(path);
  hr_store_del(store);
  hr_tensor_unref(big);
  hr_tensor_unref(small);
  munmap(dst, n);
  return 0;
}
