/*
 * engine_bench: the engine against raw TCP on the same machine, in the
 * same run (guides/performance.md: never compare with a table).
 *
 *  (a) bulk: 1 GiB over loopback into its final buffer, first with plain
 *      send()/recv() (the ceiling), then as a hurray GET of a 1 GiB
 *      tensor (server on a libevent loop, client the blocking API into a
 *      caller's buffer); GB/s of both and their ratio (target >= 0.9).
 *  (b) small: 4 KiB tensor GETs with 64 streams in flight on one
 *      connection, and one at a time; requests/s and p50/p99 latency,
 *      beside raw TCP of the same size at the same concurrency.  The
 *      target (p50 <= 1.5x) is against the raw ping-pong, one message in
 *      flight: a ping-pong's latency is one round trip, and a GET's p50 is
 *      comparable to it only when it is one round trip too.  With 64 in
 *      flight, p50 is queueing (64 x the per-request cost), so that ratio
 *      is printed as the cost per request of the protocol against a
 *      server that does nothing but writev() canned bytes.
 *  (c) memory: peak RSS of a client process fetching 1 GiB (target
 *      < 1.1 GiB), and the growth of a server process serving a mapped
 *      1 GiB .npy to 8 clients at once (target <= 64 MiB over idle,
 *      counted as anonymous memory: the file's pages are the page cache,
 *      shared and reclaimable).
 *
 *   engine_bench [--mib N] [--skip-a] [--skip-b] [--skip-c] [--depth 1|64]
 *                [--no-raw] [--sockbuf BYTES]
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hurray/client.h>
#include <hurray/files.h>
#include <hurray/hr_event.h>
#include <hurray/store.h>

#include "bench_common.h"

static uint64_t g_bytes = 1ull << 30;
static int g_only_depth; /* (b): run only this depth (0: 64 and 1) */
static int g_no_raw;     /* skip the raw baselines (a, b) */
static int g_sockbuf;    /* the server's SO_SNDBUF/SO_RCVBUF (0: auto) */

static void die(const char *what) {
  fprintf(stderr, "engine_bench: %s: %s\n", what, strerror(errno));
  exit(1);
}

/* ------------------------------------------------------------------------ */
/* A hurray server on its own thread (libevent loop)                        */
/* ------------------------------------------------------------------------ */

/* The server runs with the --sockbuf setting. */
static void srv_start(bc_server *s, hr_store *store) {
  hr_engine_config cfg;

  hr_engine_config_default(&cfg);
  cfg.socket_buffer = g_sockbuf;
  bc_server_start(s, store, &cfg, NULL);
}

/* ------------------------------------------------------------------------ */
/* (a) bulk                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct raw_sender {
  int lfd;
  const uint8_t *src;
  uint64_t n;
} raw_sender;

static void *raw_send_main(void *arg) {
  raw_sender *r = arg;
  int fd = accept(r->lfd, NULL, NULL);
  uint64_t off = 0;
  char go;

  if (recv(fd, &go, 1, MSG_WAITALL) != 1)
    die("raw go");
  while (off < r->n) {
    size_t k = r->n - off > (8u << 20) ? (8u << 20) : (size_t)(r->n - off);
    ssize_t w = send(fd, r->src + off, k, 0);
    if (w <= 0)
      die("raw send");
    off += (uint64_t)w;
  }
  close(fd);
  return NULL;
}

/* send() -> recv() straight into the final buffer: the ceiling. */
static double raw_bulk(const uint8_t *src, uint8_t *dst, uint64_t n) {
  raw_sender r;
  pthread_t th;
  int port, fd;
  uint64_t off = 0;
  double t0, t1;

  r.lfd = bc_listen_any(&port);
  r.src = src;
  r.n = n;
  pthread_create(&th, NULL, raw_send_main, &r);
  fd = bc_connect_to(port);
  t0 = bc_now_s();
  if (send(fd, "g", 1, 0) != 1) /* the request */
    die("raw go");
  while (off < n) {
    ssize_t k =
        recv(fd, dst + off, n - off > (64u << 20) ? (64u << 20) : n - off, 0);
    if (k <= 0)
      die("raw recv");
    off += (uint64_t)k;
  }
  t1 = bc_now_s();
  pthread_join(th, NULL);
  close(fd);
  close(r.lfd);
  if (memcmp(src, dst, n) != 0) {
    fprintf(stderr, "raw: bytes differ\n");
    exit(1);
  }
  return (double)n / (t1 - t0) / 1e9;
}

static double hurray_bulk(int port, hr_tensor *ref, uint8_t *dst, uint64_t n) {
  hr_client *c;
  hr_get_opts o;
  hr_get_dest dest;
  hr_tensor *t;
  hr_transfer_record rec;
  char url[64];
  double secs;

  snprintf(url, sizeof url, "127.0.0.1:%d", port);
  if (hr_client_connect(&c, url, NULL, NULL, NULL) != 0)
    die("hr_client_connect");
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)"big";
  o.key_len = 3;
  o.max_shards = 1;
  memset(&dest, 0, sizeof dest);
  dest.buffer = dst;
  dest.capacity = n;
  o.dest = &dest;
  if (hr_client_get(c, &o, &t, &rec) != 0) {
    fprintf(stderr, "GET failed: %s\n", hr_client_last_error(c)->message);
    exit(1);
  }
  secs = (double)(rec.finished - rec.started) / 1e9;
  if (hr_tensor_buffer(t, 0) != dst ||
      memcmp(dst, hr_tensor_buffer(ref, 0), n) != 0) {
    fprintf(stderr, "hurray: bytes differ or not in place\n");
    exit(1);
  }
  hr_tensor_unref(t);
  hr_client_close(c);
  return (double)n / secs / 1e9;
}

static void section_a(void) {
  hr_store *store;
  hr_tensor *t = bc_big_tensor(g_bytes);
  uint8_t *dst = mmap(NULL, g_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  bc_server s;
  double raw[3], hr[3], best_raw = 0, best_hr = 0;
  int i;

  if (dst == MAP_FAILED)
    die("mmap");
  madvise(dst, g_bytes, MADV_HUGEPAGE);
  memset(dst, 0, g_bytes); /* fault the destination in once for both */
  hr_store_new(&store, NULL, NULL);
  hr_store_put(store, "big", 3, t, 0);
  srv_start(&s, store);
  printf("(a) bulk: %.0f MiB over loopback TCP into the final buffer\n",
         (double)g_bytes / (1 << 20));
  for (i = 0; i < 3; i++) {
    raw[i] = g_no_raw ? 1 : raw_bulk(hr_tensor_buffer(t, 0), dst, g_bytes);
    memset(dst, 0, 4096);
    hr[i] = hurray_bulk(s.port, t, dst, g_bytes);
    printf("    run %d: raw send/recv %.2f GB/s   hurray GET %.2f GB/s   "
           "ratio %.2f\n",
           i + 1, raw[i], hr[i], hr[i] / raw[i]);
    if (raw[i] > best_raw)
      best_raw = raw[i];
    if (hr[i] > best_hr)
      best_hr = hr[i];
  }
  printf("    best: raw %.2f GB/s, hurray %.2f GB/s, ratio %.2f "
         "(target >= 0.90)\n",
         best_raw, best_hr, best_hr / best_raw);
  bc_server_stop(&s);
  hr_store_del(store);
  hr_tensor_unref(t);
  munmap(dst, g_bytes);
}

/* ------------------------------------------------------------------------ */
/* (b) small requests                                                        */
/* ------------------------------------------------------------------------ */

#define SMALL 4096
#define ROUNDS 40000

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct lat {
  double *v;
  size_t n;
} lat;

static void report(const char *what, lat *l, double secs) {
  double sum = 0;
  size_t i;

  for (i = 0; i < l->n; i++)
    sum += l->v[i];
  qsort(l->v, l->n, sizeof *l->v, cmp_d);
  printf("    %-34s %8.0f req/s   p50 %6.1f us   p99 %6.1f us   mean %6.1f "
         "us\n",
         what, (double)l->n / secs, l->v[l->n / 2] * 1e6,
         l->v[(size_t)((double)l->n * 0.99)] * 1e6, sum / (double)l->n * 1e6);
}

/* Raw: the server thread answers each 16-byte request with 4 KiB. */
typedef struct raw_pp {
  int lfd;
} raw_pp;

static void *raw_pp_main(void *arg) {
  raw_pp *r = arg;
  int fd = accept(r->lfd, NULL, NULL), one = 1;
  static uint8_t resp[64][SMALL];
  uint8_t req[64 * 16];
  size_t have = 0;

  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  memset(resp, 0x5a, sizeof resp);
  for (;;) {
    ssize_t k = recv(fd, req + have, sizeof req - have, 0);
    struct iovec iov[64];
    size_t n, i;
    if (k <= 0)
      break;
    have += (size_t)k;
    n = have / 16;
    for (i = 0; i < n; i++) {
      iov[i].iov_base = resp[i];
      iov[i].iov_len = SMALL;
    }
    /* Answer everything that arrived with one writev, as an engine
     * would. */
    {
      size_t left = n * SMALL, vi = 0;
      while (left) {
        ssize_t w = writev(fd, iov + vi, (int)(n - vi));
        if (w <= 0)
          goto out;
        left -= (size_t)w;
        while (w > 0) {
          if ((size_t)w >= iov[vi].iov_len) {
            w -= (ssize_t)iov[vi].iov_len;
            vi++;
          } else {
            iov[vi].iov_base = (uint8_t *)iov[vi].iov_base + w;
            iov[vi].iov_len -= (size_t)w;
            w = 0;
          }
        }
      }
    }
    memmove(req, req + n * 16, have - n * 16);
    have -= n * 16;
  }
out:
  close(fd);
  return NULL;
}

static void raw_small(int depth, lat *l, double *secs) {
  raw_pp r;
  pthread_t th;
  int port, fd;
  static uint8_t buf[1 << 20];
  double *issued = calloc(ROUNDS, sizeof *issued), t0;
  size_t sent = 0, done = 0, have = 0;
  uint8_t req[16] = {0};
  static uint8_t reqs_buf[64 * 16];

  r.lfd = bc_listen_any(&port);
  pthread_create(&th, NULL, raw_pp_main, &r);
  fd = bc_connect_to(port);
  t0 = bc_now_s();
  while (done < ROUNDS) {
    /* Refill to `depth` in flight with one send, as the engine's single
     * writev per turn does. */
    size_t batch = 0;
    double t = bc_now_s();
    while (sent < ROUNDS && sent - done < (size_t)depth) {
      issued[sent++] = t;
      batch++;
    }
    if (batch && send(fd, reqs_buf, batch * sizeof req, 0) !=
                     (ssize_t)(batch * sizeof req))
      die("raw pp send");
    {
      ssize_t k = recv(fd, buf + have, sizeof buf - have, 0);
      if (k <= 0)
        die("raw pp recv");
      have += (size_t)k;
      while (have >= SMALL) {
        l->v[l->n++] = bc_now_s() - issued[done++];
        memmove(buf, buf + SMALL, have - SMALL);
        have -= SMALL;
      }
    }
  }
  *secs = bc_now_s() - t0;
  close(fd);
  pthread_join(th, NULL);
  close(r.lfd);
  free(issued);
}

typedef struct small_run {
  hr_client *c;
  int depth;
  size_t sent, done, bad;
  double *issued; /* by request number */
  lat *l;
} small_run;

typedef struct small_req {
  small_run *r;
  size_t n;
} small_req;

static small_req reqs[ROUNDS];
static void issue(small_run *r);

static void small_cb(hr_session *s, uint32_t sid, hr_tensor *t,
                     const hr_transfer_record *rec, void *ud) {
  small_req *q = ud;
  small_run *r = q->r;

  (void)s;
  (void)sid;
  (void)rec;
  if (!t || hr_tensor_bytes(t) != SMALL)
    r->bad++;
  hr_tensor_unref(t);
  r->l->v[r->l->n++] = bc_now_s() - r->issued[q->n];
  r->done++;
  issue(r); /* keep `depth` in flight */
}

static void issue(small_run *r) {
  hr_get_opts o;

  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)"small";
  o.key_len = 5;
  o.max_shards = 1;
  while (r->sent < ROUNDS && r->sent - r->done < (size_t)r->depth) {
    small_req *q = &reqs[r->sent];
    q->r = r;
    q->n = r->sent;
    r->issued[r->sent] = bc_now_s();
    if (hr_session_get(hr_client_session(r->c), &o, small_cb, q, NULL) != 0)
      die("hr_session_get");
    r->sent++;
  }
}

static int small_done(void *ud) {
  return ((small_run *)ud)->done == ROUNDS;
}

static void hurray_small(int port, int depth, lat *l, double *secs) {
  small_run r;
  char url[64];
  double t0;

  memset(&r, 0, sizeof r);
  snprintf(url, sizeof url, "127.0.0.1:%d", port);
  if (hr_client_connect(&r.c, url, NULL, NULL, NULL) != 0)
    die("hr_client_connect");
  r.depth = depth;
  r.issued = calloc(ROUNDS, sizeof *r.issued);
  r.l = l;
  t0 = bc_now_s();
  issue(&r);
  if (hr_client_wait(r.c, small_done, &r, 120000) != 0)
    die("hr_client_wait");
  *secs = bc_now_s() - t0;
  if (r.bad)
    fprintf(stderr, "hurray: %zu bad answers\n", r.bad);
  hr_client_close(r.c);
  free(r.issued);
}

static void section_b(void) {
  hr_store *store;
  hr_tensor *t = bc_big_tensor(SMALL);
  bc_server s;
  lat l;
  double secs;
  int depths[2] = {64, 1}, i;

  hr_store_new(&store, NULL, NULL);
  hr_store_put(store, "small", 5, t, 0);
  srv_start(&s, store);
  l.v = calloc(ROUNDS, sizeof *l.v);
  printf("(b) 4 KiB requests, %d per run, one connection\n", ROUNDS);
  for (i = 0; i < 2; i++) {
    char what[64];
    double rp50 = 0, hp50;
    if (g_only_depth && depths[i] != g_only_depth)
      continue;
    if (!g_no_raw) {
      l.n = 0;
      raw_small(depths[i], &l, &secs);
      snprintf(what, sizeof what, "raw TCP ping-pong, %d in flight", depths[i]);
      report(what, &l, secs);
      rp50 = l.v[l.n / 2];
    }
    l.n = 0;
    hurray_small(s.port, depths[i], &l, &secs);
    snprintf(what, sizeof what, "hurray GET, %d streams", depths[i]);
    report(what, &l, secs);
    hp50 = l.v[l.n / 2];
    if (rp50 > 0 && depths[i] == 1)
      printf("    p50 ratio, one in flight (the ping-pong): %.2fx "
             "(target <= 1.5x)\n", hp50 / rp50);
    else if (rp50 > 0)
      printf("    p50 ratio at %d in flight (per-request cost against "
             "canned raw answers; no target): %.2fx\n", depths[i],
             hp50 / rp50);
  }
  free(l.v);
  bc_server_stop(&s);
  hr_store_del(store);
  hr_tensor_unref(t);
}

/* ------------------------------------------------------------------------ */
/* (c) memory                                                                */
/* ------------------------------------------------------------------------ */

typedef struct memst {
  long rss_kb, anon_kb, file_kb;
} memst;

static memst read_mem(pid_t pid) {
  char path[64], line[256];
  memst m = {0, 0, 0};
  FILE *f;

  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  f = fopen(path, "r");
  if (!f)
    return m;
  while (fgets(line, sizeof line, f)) {
    sscanf(line, "VmRSS: %ld", &m.rss_kb);
    sscanf(line, "RssAnon: %ld", &m.anon_kb);
    sscanf(line, "RssFile: %ld", &m.file_kb);
  }
  fclose(f);
  return m;
}

/* The server process: maps the .npy, serves it, writes its port. */
static void server_process(const char *path, int pipe_w) {
  hr_store *store;
  hr_tensor *t;
  char why[256];
  bc_server s;

  if (hr_npy_load(&t, path, NULL, why, sizeof why) != 0) {
    fprintf(stderr, "server: %s\n", why);
    _exit(1);
  }
  hr_store_new(&store, NULL, NULL);
  hr_store_put(store, "file", 4, t, 0);
  hr_tensor_unref(t);
  srv_start(&s, store);
  if (write(pipe_w, &s.port, sizeof s.port) != sizeof s.port)
    _exit(1);
  pause(); /* until SIGTERM */
  _exit(0);
}

typedef struct fetcher {
  int port;
  uint8_t *dst; /* shared by all fetchers: only memory use is measured */
  int ok;
} fetcher;

static void *fetch_main(void *arg) {
  fetcher *f = arg;
  hr_client *c;
  hr_get_opts o;
  hr_get_dest dest;
  hr_tensor *t;
  char url[64];

  snprintf(url, sizeof url, "127.0.0.1:%d", f->port);
  if (hr_client_connect(&c, url, NULL, NULL, NULL) != 0)
    return NULL;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)"file";
  o.key_len = 4;
  o.max_shards = 1;
  if (f->dst) {
    memset(&dest, 0, sizeof dest);
    dest.buffer = f->dst;
    dest.capacity = g_bytes;
    o.dest = &dest;
  }
  if (hr_client_get(c, &o, &t, NULL) == 0) {
    f->ok = 1;
    hr_tensor_unref(t);
  }
  hr_client_close(c);
  return NULL;
}

/* A client process: `n` fetchers at once; reports ok count and peak RSS. */
static void client_process(int port, int n, int shared_dst, int pipe_w) {
  pthread_t th[8];
  fetcher f[8];
  struct rusage ru;
  uint8_t *dst = NULL;
  long out[2];
  int i;

  if (shared_dst) {
    dst = mmap(NULL, g_bytes, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (dst == MAP_FAILED)
      _exit(1);
  }
  for (i = 0; i < n; i++) {
    f[i].port = port;
    f[i].dst = dst;
    f[i].ok = 0;
    pthread_create(&th[i], NULL, fetch_main, &f[i]);
  }
  out[0] = 0;
  for (i = 0; i < n; i++) {
    pthread_join(th[i], NULL);
    out[0] += f[i].ok;
  }
  getrusage(RUSAGE_SELF, &ru);
  out[1] = ru.ru_maxrss;
  if (write(pipe_w, out, sizeof out) != sizeof out)
    _exit(1);
  _exit(0);
}

static void section_c(void) {
  char path[] = "/tmp/engine_bench_XXXXXX.npy";
  hr_descriptor d;
  hr_tensor *t;
  int fd, p[2], port;
  pid_t srv, cli;
  memst idle, peak, m;
  long out[2];
  int k;

  printf("(c) memory with a %.0f MiB tensor\n", (double)g_bytes / (1 << 20));
  fd = mkstemps(path, 4);
  if (fd < 0)
    die("mkstemps");
  close(fd);
  t = bc_big_tensor(g_bytes);
  d = *hr_tensor_descriptor(t);
  if (hr_npy_save(path, &d, hr_tensor_buffer(t, 0), NULL, 0) != 0)
    die("hr_npy_save");
  hr_tensor_unref(t);

  if (pipe(p))
    die("pipe");
  srv = fork();
  if (srv == 0) {
    close(p[0]);
    server_process(path, p[1]);
  }
  if (read(p[0], &port, sizeof port) != sizeof port)
    die("server start");
  usleep(200000);
  idle = read_mem(srv);

  /* One client fetching 1 GiB into memory the session allocates. */
  cli = fork();
  if (cli == 0) {
    close(p[0]);
    client_process(port, 1, 0, p[1]);
  }
  if (read(p[0], out, sizeof out) != sizeof out)
    die("client");
  waitpid(cli, NULL, 0);
  printf("    client fetching %.0f MiB: ok=%ld, peak RSS %.1f MiB "
         "(target < %.0f MiB)\n",
         (double)g_bytes / (1 << 20), out[0], (double)out[1] / 1024,
         1.1 * (double)g_bytes / (1 << 20));

  /* The server serving the mapped file to 8 clients at once; the parent
   * samples the server's memory meanwhile. */
  peak = read_mem(srv);
  cli = fork();
  if (cli == 0) {
    close(p[0]);
    client_process(port, 8, 1, p[1]);
  }
  for (k = 0;; k++) {
    struct pollfd pf = {p[0], POLLIN, 0};
    m = read_mem(srv);
    if (m.rss_kb > peak.rss_kb)
      peak.rss_kb = m.rss_kb;
    if (m.anon_kb > peak.anon_kb)
      peak.anon_kb = m.anon_kb;
    if (m.file_kb > peak.file_kb)
      peak.file_kb = m.file_kb;
    if (poll(&pf, 1, 5) == 1)
      break;
  }
  if (read(p[0], out, sizeof out) != sizeof out)
    die("clients");
  waitpid(cli, NULL, 0);
  printf("    server, 8 clients at once (ok=%ld): idle RSS %.1f MiB "
         "(anon %.1f, file %.1f)\n",
         out[0], (double)idle.rss_kb / 1024, (double)idle.anon_kb / 1024,
         (double)idle.file_kb / 1024);
  printf("    peak RSS %.1f MiB (anon %.1f, file pages mapped %.1f): "
         "anonymous growth %.1f MiB (target <= 64 MiB), %d samples\n",
         (double)peak.rss_kb / 1024, (double)peak.anon_kb / 1024,
         (double)peak.file_kb / 1024,
         (double)(peak.anon_kb - idle.anon_kb) / 1024, k);
  kill(srv, SIGTERM);
  waitpid(srv, NULL, 0);
  unlink(path);
  close(p[0]);
  close(p[1]);
}

int main(int argc, char **argv) {
  int i, a = 1, b = 1, c = 1;

  signal(SIGPIPE, SIG_IGN);
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mib") && i + 1 < argc)
      g_bytes = strtoull(argv[++i], NULL, 10) << 20;
    else if (!strcmp(argv[i], "--skip-a"))
      a = 0;
    else if (!strcmp(argv[i], "--skip-b"))
      b = 0;
    else if (!strcmp(argv[i], "--skip-c"))
      c = 0;
    else if (!strcmp(argv[i], "--depth") && i + 1 < argc)
      g_only_depth = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-raw"))
      g_no_raw = 1;
    else if (!strcmp(argv[i], "--sockbuf") && i + 1 < argc)
      g_sockbuf = atoi(argv[++i]);
    else {
      fprintf(stderr,
              "usage: engine_bench [--mib N] [--skip-a] [--skip-b] "
              "[--skip-c] [--depth 1|64] [--no-raw] [--sockbuf BYTES]\n");
      return 2;
    }
  }
  /* (c) forks: run it first, before any thread exists. */
  if (c)
    section_c();
  if (a)
    section_a();
  if (b)
    section_b();
  return 0;
}
