/*
 * gpu_engine_bench: device memory through the engine, against the copies
 * it is made of, in the same run (issue 6).
 *
 *   D2H: a GET of a SIZE-byte device tensor to host memory (the server
 *        stages it through pinned chunks, frames leave as copies land);
 *   H2D: a GET of a SIZE-byte host tensor into device memory (frames land
 *        in pinned memory, copied to the device piece by piece; P1);
 * each beside
 *   - one copy of SIZE bytes between device memory and pinned memory
 *     (cuMemcpyAsync on cuMemHostAlloc memory on CUDA: cudaMemcpy of
 *     pinned memory), and
 *   - one copy of SIZE pinned bytes into device memory allocated for it
 *     (a GET into device memory allocates its tensor's memory each time;
 *     on sim and lavapipe that memory is host memory, faulted in by its
 *     first write), and
 *   - the same GET host to host (the loopback network's ceiling: the
 *     engine cannot move bytes faster than its transport),
 * printing GB/s and the ratios.  The pipeline's target is that the device
 * GET reaches at least 0.85 of the slower of its two parts (the copy and
 * the transport); the ratio to the copy alone is printed too.
 *
 *   gpu_engine_bench [--backend NAME] [--size BYTES[K|M|G]] [--iters N]
 *                    [--target RATIO] [--piece BYTES] [--pieces N]
 *                    [--ab PIECExN,PIECExN...]
 * (--piece/--pieces: the client's device receive ring, settings
 * device_piece/device_pieces; 0: the defaults.  --ab: instead of the
 * above, ITERS interleaved rounds of a host GET and a GET into the device
 * through each ring given (0x0: the defaults), printing medians: an A/B
 * comparison on a loaded machine)
 * Exit status: 0 when both ratios reach the target, 1 when one does not,
 * 2 on an error, 77 when the backend is unavailable here.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <hurray/client.h>
#include <hurray/engine.h>
#include <hurray/gpu.h>
#include <hurray/store.h>

#include "bench_common.h"
#include "hr_ploop.h" /* engine/io: the library's private poll() loop */

/* ---- a server on its own thread ---------------------------------------- */

/* The server runs on the library's private poll() loop (the one the
 * blocking client uses), so the benchmark needs no libevent and builds
 * from the sources alone (perf/gpu_check.sh's direct build). */
typedef struct server {
  pthread_t th;
  hr__ploop *loop;
  hr_engine *e;
  hr_store *store;
  int port;
  atomic_int stop, ready;
} server;

static void *srv_main(void *arg) {
  server *s = arg;
  hr_engine_config cfg;
  hr_loop_ops ops;
  hr_provider prov;
  hr_listener *l;

  BC_CHECK("loop", hr__ploop_new(&s->loop, NULL));
  hr_engine_config_default(&cfg);
  hr__ploop_ops(&ops);
  BC_CHECK("hr_engine_new", hr_engine_new(&s->e, &ops, s->loop, &cfg, NULL));
  hr__ploop_set_engine(s->loop, s->e);
  hr_store_provider(s->store, &prov);
  BC_CHECK("listen", hr_engine_listen(s->e, "127.0.0.1:0", &prov, &l));
  s->port = hr_listener_port(l);
  atomic_store(&s->ready, 1);
  while (!atomic_load(&s->stop))
    hr__ploop_step(s->loop, 50);
  hr_engine_close(s->e, NULL, NULL);
  for (int i = 0; i < 100 && hr_engine_del(s->e) == HR_ERR_BUSY; i++)
    hr__ploop_step(s->loop, 10);
  hr__ploop_del(s->loop);
  return NULL;
}

static void srv_start(server *s, hr_store *store) {
  memset(s, 0, sizeof *s);
  s->store = store;
  pthread_create(&s->th, NULL, srv_main, s);
  while (!atomic_load(&s->ready))
    usleep(1000);
}

static void srv_stop(server *s) {
  atomic_store(&s->stop, 1);
  pthread_join(s->th, NULL);
}

/* ---- measurements ------------------------------------------------------- */

static hr_descriptor bytes_desc(uint64_t n, uint8_t tag) {
  hr_descriptor d;
  bc_bytes_desc(&d, n, 0);
  d.buffers[0].device_tag = tag;
  return d;
}

/* Best GB/s of `iters` copies dst <- src (after one warm-up). */
static double copy_gbps(hr_gpu_stream *s, hr_gpu_buf *dst, hr_gpu_buf *src,
                        uint64_t n, int iters) {
  double best = 0;
  for (int i = 0; i <= iters; i++) {
    double t0 = bc_now_s();
    BC_CHECK("copy", hr_gpu_copy_async(s, dst, 0, src, 0, n));
    BC_CHECK("sync", hr_gpu_stream_sync(s));
    double g = (double)n / (bc_now_s() - t0) / 1e9;
    if (i > 0 && g > best)
      best = g;
  }
  return best;
}

/* Best GB/s of `iters` copies of n pinned bytes into device memory
 * allocated for the copy, the allocation timed too: what a GET into
 * device memory must do at least (its tensor gets new device memory).
 * On backends whose device memory is host memory (sim, lavapipe) the
 * first write faults the pages in, which a reused buffer hides. */
static double fresh_gbps(hr_gpu *g, hr_gpu_stream *s, hr_gpu_buf *src,
                         uint64_t n, int iters) {
  double best = 0;
  for (int i = 0; i <= iters; i++) {
    hr_gpu_buf *dst;
    double t0 = bc_now_s();
    BC_CHECK("device memory", hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, n, &dst));
    BC_CHECK("copy", hr_gpu_copy_async(s, dst, 0, src, 0, n));
    BC_CHECK("sync", hr_gpu_stream_sync(s));
    double gb = (double)n / (bc_now_s() - t0) / 1e9;
    hr_gpu_buf_del(dst);
    if (i > 0 && gb > best)
      best = gb;
  }
  return best;
}

/* Best GB/s of `iters` GETs of `key` (after one warm-up), on one
 * connection; into host memory `dst` or into device g (then `verify`
 * receives the first result's tensor). */
/* The client's device receive ring (--piece, --pieces; 0: defaults). */
static uint64_t ring_piece;
static uint32_t ring_pieces;
/* The record of the fastest timed GET of the last get_gbps() call. */
static hr_transfer_record best_rec;

static double get_gbps(int port, const char *key, uint64_t n, int iters,
                       uint8_t *dst, hr_gpu *g, hr_tensor **verify) {
  hr_client *c;
  hr_client_options co;
  char url[64];
  double best = 0;
  snprintf(url, sizeof url, "127.0.0.1:%d", port);
  hr_client_options_default(&co);
  co.settings.device_piece = ring_piece;
  co.settings.device_pieces = ring_pieces;
  BC_CHECK("hr_client_connect", hr_client_connect(&c, url, &co, NULL, NULL));
  for (int i = 0; i <= iters; i++) {
    hr_get_opts o;
    hr_get_dest dest;
    hr_tensor *t;
    hr_transfer_record rec;
    memset(&o, 0, sizeof o);
    o.key = (const uint8_t *)key;
    o.key_len = (uint16_t)strlen(key);
    o.max_shards = 1;
    if (g) {
      o.device = g;
      o.device_sync = HR_SYNC_PRODUCER_SYNCED;
    } else {
      memset(&dest, 0, sizeof dest);
      dest.buffer = dst;
      dest.capacity = n;
      o.dest = &dest;
    }
    int rv = hr_client_get(c, &o, &t, &rec);
    if (rv) {
      fprintf(stderr, "GET %s: %s\n", key, hr_client_last_error(c)->message);
      exit(2);
    }
    double gb = (double)n / ((double)(rec.finished - rec.started) / 1e9) / 1e9;
    if (i > 0 && gb > best) {
      best = gb;
      best_rec = rec;
    }
    if (verify && !*verify)
      *verify = t;
    else
      hr_tensor_unref(t);
  }
  hr_client_close(c);
  return best;
}

/* ---- --ab: interleaved comparison of receive rings ---------------------- */

static hr_client *connect_ring(int port, uint64_t piece, uint32_t pieces) {
  hr_client *c;
  hr_client_options co;
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", port);
  hr_client_options_default(&co);
  co.settings.device_piece = piece;
  co.settings.device_pieces = pieces;
  BC_CHECK("hr_client_connect", hr_client_connect(&c, url, &co, NULL, NULL));
  return c;
}

/* CPU seconds (all threads: client, server, device) of the last one_get. */
static double last_cpu;

/* One GET on `c` (into `dst`, or into device g when dst is NULL): GB/s,
 * its record in *rec. */
static double one_get(hr_client *c, uint64_t n, uint8_t *dst, hr_gpu *g,
                      hr_transfer_record *rec) {
  hr_get_opts o;
  hr_get_dest dest;
  hr_tensor *t;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)"host";
  o.key_len = 4;
  o.max_shards = 1;
  if (g) {
    o.device = g;
    o.device_sync = HR_SYNC_PRODUCER_SYNCED;
  } else {
    memset(&dest, 0, sizeof dest);
    dest.buffer = dst;
    dest.capacity = n;
    o.dest = &dest;
  }
  double c0 = bc_cpu_s();
  if (hr_client_get(c, &o, &t, rec)) {
    fprintf(stderr, "GET: %s\n", hr_client_last_error(c)->message);
    exit(2);
  }
  hr_tensor_unref(t);
  last_cpu = bc_cpu_s() - c0;
  return (double)n / ((double)(rec->finished - rec->started) / 1e9) / 1e9;
}

#define AB_MAX 4
#define AB_ROUNDS 64

/* Rounds of one host GET and one GET into the device per ring, the order
 * rotated each round (other load hits all alike); prints medians. */
static void run_ab(int port, uint64_t n, int rounds, uint8_t *dst, hr_gpu *g,
                   const char *spec) {
  uint64_t piece[AB_MAX];
  uint32_t pieces[AB_MAX];
  int nring = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", spec);
  for (char *tok = strtok(buf, ","); tok && nring < AB_MAX;
       tok = strtok(NULL, ",")) {
    char *x = strchr(tok, 'x');
    piece[nring] = bc_parse_size(tok);
    pieces[nring] = x ? (uint32_t)atoi(x + 1) : 0;
    nring++;
  }
  if (rounds > AB_ROUNDS)
    rounds = AB_ROUNDS;
  hr_client *host = connect_ring(port, 0, 0), *dev[AB_MAX];
  for (int k = 0; k < nring; k++)
    dev[k] = connect_ring(port, piece[k], pieces[k]);
  static double gb[AB_MAX + 1][AB_ROUNDS], ratio[AB_MAX][AB_ROUNDS],
      paused[AB_MAX][AB_ROUNDS], busy[AB_MAX][AB_ROUNDS],
      npause[AB_MAX][AB_ROUNDS], cpu[AB_MAX + 1][AB_ROUNDS];
  hr_transfer_record rec;
  for (int w = 0; w <= nring; w++) /* warm-up: pinned pieces, pages */
    one_get(w ? dev[w - 1] : host, n, w ? NULL : dst, w ? g : NULL, &rec);
  for (int r = 0; r < rounds; r++) {
    for (int j = 0; j <= nring; j++) {
      int w = (j + r) % (nring + 1);
      gb[w][r] = one_get(w ? dev[w - 1] : host, n, w ? NULL : dst,
                         w ? g : NULL, &rec);
      cpu[w][r] = last_cpu / ((double)n / 1e9); /* CPU s per GB */
      if (w) {
        double all = (double)(rec.finished - rec.started);
        paused[w - 1][r] = 100.0 * (double)rec.recv_paused_ns / all;
        busy[w - 1][r] = 100.0 * (double)rec.device_busy_ns / all;
        npause[w - 1][r] = rec.recv_pauses;
      }
    }
    for (int k = 0; k < nring; k++)
      ratio[k][r] = gb[k + 1][r] / gb[0][r];
  }
  printf("%d interleaved rounds, medians:\n", rounds);
  printf("  GET host->host:                 %6.2f GB/s, %.3f CPU s/GB\n",
         bc_median(gb[0], rounds), bc_median(cpu[0], rounds));
  for (int k = 0; k < nring; k++) {
    printf("  GET into device, ring %4llu KiB x %2u: %6.2f GB/s, %.2f of the "
           "host GET of its round; paused %.0f times, %.0f%% of the time; "
           "copies in flight %.0f%%; %.3f CPU s/GB\n",
           (unsigned long long)(piece[k] >> 10), pieces[k],
           bc_median(gb[k + 1], rounds), bc_median(ratio[k], rounds),
           bc_median(npause[k], rounds), bc_median(paused[k], rounds),
           bc_median(busy[k], rounds), bc_median(cpu[k + 1], rounds));
    hr_client_close(dev[k]);
  }
  hr_client_close(host);
}

int main(int argc, char **argv) {
  const char *backend = "cuda";
  uint64_t n = 1ull << 30;
  int iters = 3;
  double target = 0.85;
  const char *ab = NULL;
  for (int i = 1; i < argc; i++) {
    if (bc_device_arg(argc, argv, &i, &backend, &n, &iters))
      continue;
    if (!strcmp(argv[i], "--target") && i + 1 < argc)
      target = atof(argv[++i]);
    else if (!strcmp(argv[i], "--piece") && i + 1 < argc)
      ring_piece = bc_parse_size(argv[++i]);
    else if (!strcmp(argv[i], "--pieces") && i + 1 < argc)
      ring_pieces = (uint32_t)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--ab") && i + 1 < argc)
      ab = argv[++i];
    else {
      fprintf(stderr, "usage: gpu_engine_bench [--backend NAME] [--size N] "
                      "[--iters N] [--target R] [--piece N] [--pieces N] "
                      "[--ab PIECExN,...]\n");
      return 2;
    }
  }
  if (n < 4096 || iters < 1)
    return 2;

  hr_gpu_caps caps;
  hr_gpu *g = bc_gpu_open(backend, &caps);
  if (!g)
    return 77;
  if (!(caps.flags & HR_GPU_CAP_PINNED)) {
    printf("SKIP: %s has no pinned memory\n", backend);
    hr_gpu_del(g);
    return 77;
  }
  printf("device: %s (%s), %.2f GiB, %d timed runs each (best)\n", caps.name,
         backend, (double)n / (1u << 30), iters);

  hr_gpu_stream *s;
  hr_gpu_buf *dev, *pin;
  BC_CHECK("stream", hr_gpu_stream_new(g, &s));
  BC_CHECK("device memory", hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, n, &dev));
  BC_CHECK("pinned memory", hr_gpu_buf_alloc(g, HR_GPU_MEM_PINNED, n, &pin));
  uint8_t *hp = hr_gpu_buf_host_ptr(pin);
  for (uint64_t i = 0; i < n; i++)
    hp[i] = (uint8_t)(i * 131 + (i >> 12));

  /* The copies alone. */
  double h2d_copy = ab ? 0 : copy_gbps(s, dev, pin, n, iters);
  double d2h_copy = ab ? 0 : copy_gbps(s, pin, dev, n, iters);
  double h2d_fresh = ab ? 0 : fresh_gbps(g, s, pin, n, iters);

  /* A server holding the bytes in host memory and in device memory. */
  hr_store *store;
  hr_store_config sc;
  hr_store_config_default(&sc);
  sc.max_bytes = 0;
  BC_CHECK("store", hr_store_new(&store, &sc, NULL));
  uint8_t *host = malloc(n), *dst = malloc(n);
  if (!host || !dst)
    bc_die_rv("malloc", HR_ERR_NOMEM);
  memcpy(host, hp, n);
  memset(dst, 0, n);
  hr_descriptor hd = bytes_desc(n, HR_DEV_CPU);
  hr_descriptor dd = bytes_desc(n, caps.device_tag);
  hr_tensor *ht, *dt;
  void *hb = host;
  BC_CHECK("wrap", hr_tensor_wrap(&ht, &hd, &hb, NULL, NULL, NULL));
  BC_CHECK("wrap_device",
        hr_tensor_wrap_device(&dt, &dd, &dev, NULL, NULL, NULL, NULL));
  BC_CHECK("put", hr_store_put(store, "host", 4, ht, HR_PUT_REPLACE));
  BC_CHECK("put", hr_store_put(store, "dev", 3, dt, HR_PUT_REPLACE));
  hr_tensor_unref(ht);
  hr_tensor_unref(dt);
  server srv;
  srv_start(&srv, store);

  if (ab) {
    run_ab(srv.port, n, iters, dst, g, ab);
    srv_stop(&srv);
    hr_store_del(store);
    free(host);
    free(dst);
    hr_gpu_buf_del(pin);
    hr_gpu_buf_del(dev);
    hr_gpu_stream_del(s);
    hr_gpu_del(g);
    return 0;
  }
  double net = get_gbps(srv.port, "host", n, iters, dst, NULL, NULL);
  double d2h = get_gbps(srv.port, "dev", n, iters, dst, NULL, NULL);
  int ok_d2h = memcmp(dst, host, n) == 0;
  hr_tensor *landed = NULL;
  struct rusage ru0, ru1;
  getrusage(RUSAGE_SELF, &ru0);
  double h2d = get_gbps(srv.port, "host", n, iters, NULL, g, &landed);
  getrusage(RUSAGE_SELF, &ru1);
  hr_transfer_record h2d_rec = best_rec;
  /* Verify the device result by copying it back. */
  memset(hp, 0, n);
  BC_CHECK("copy back",
        hr_gpu_copy_async(s, pin, 0, hr_tensor_gpu_buf(landed, 0), 0, n));
  BC_CHECK("sync", hr_gpu_stream_sync(s));
  int ok_h2d = memcmp(hp, host, n) == 0;
  hr_tensor_unref(landed);

  srv_stop(&srv);
  hr_store_del(store);
  free(host);
  free(dst);
  hr_gpu_buf_del(pin);
  hr_gpu_buf_del(dev);
  hr_gpu_stream_del(s);
  hr_gpu_del(g);

  if (!ok_d2h || !ok_h2d) {
    fprintf(stderr, "gpu_engine_bench: bytes differ (%s)\n",
            !ok_d2h ? "device tensor GET" : "GET into device");
    return 2;
  }
  double d2h_ceil = d2h_copy < net ? d2h_copy : net;
  double h2d_ceil = h2d_copy < net ? h2d_copy : net;
  printf("copy device->pinned (cudaMemcpy-like):  %7.2f GB/s\n", d2h_copy);
  printf("copy pinned->device (cudaMemcpy-like):  %7.2f GB/s\n", h2d_copy);
  printf("copy pinned->new device memory (+alloc): %6.2f GB/s\n", h2d_fresh);
  printf("GET host->host over loopback:           %7.2f GB/s\n", net);
  printf("GET of a device tensor (D2H staged):    %7.2f GB/s  ratio %.2f to "
         "the copy, %.2f to min(copy, loopback)\n",
         d2h, d2h / d2h_copy, d2h / d2h_ceil);
  printf("GET into device memory (H2D staged):    %7.2f GB/s  ratio %.2f to "
         "the copy, %.2f to min(copy, loopback)\n",
         h2d, h2d / h2d_copy, h2d / h2d_ceil);
  {
    /* Where the fastest GET into device memory spent its time. */
    const hr_transfer_record *r = &h2d_rec;
    double all = (double)(r->finished - r->started);
    printf("  its ring: %u pieces, input paused %u times for %.1f ms "
           "(%.0f%% of the GET), copies in flight %.0f%% of the GET, "
           "%.2f ms from the last byte to the end\n",
           r->device_pieces, r->recv_pauses, (double)r->recv_paused_ns / 1e6,
           100.0 * (double)r->recv_paused_ns / all,
           100.0 * (double)r->device_busy_ns / all,
           (double)r->device_tail_ns / 1e6);
  }
  printf("page faults per GET into device memory: %.0f (%.0f per MiB)\n",
         (double)(ru1.ru_minflt - ru0.ru_minflt) / (iters + 1),
         (double)(ru1.ru_minflt - ru0.ru_minflt) / (iters + 1) /
             ((double)n / (1 << 20)));
  /* The GET into device memory also allocates its tensor's memory. */
  double h2d_floor = h2d_fresh < net ? h2d_fresh : net;
  printf("GET into device memory vs min(copy into new memory, loopback): "
         "ratio %.2f\n",
         h2d / h2d_floor);
  int pass = d2h / d2h_ceil >= target && h2d / h2d_ceil >= target;
  printf("target: >= %.2f of min(copy, loopback): %s\n", target,
         pass ? "met" : "NOT met");
  return pass ? 0 : 1;
}
