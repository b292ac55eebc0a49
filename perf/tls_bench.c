/*
 * tls_bench: a GET over TLS beside plain OpenSSL and beside plain TCP, in
 * the same run (guides/performance.md: never compare with a table).
 *
 *  1. baseline: OpenSSL TLS 1.3 send/recv of N bytes over loopback, the
 *     receiver SSL_read()ing straight into the final buffer, with the
 *     cipher and kernel-TLS setting the engine uses;
 *  2. a hurray GET of an N-byte tensor over hurrays:// (server on a
 *     libevent loop, the blocking client into a caller's buffer);
 *  3. the same GET over plain TCP.
 * The three are measured the same way: from the request (the GET's
 * record start, the baseline's one-byte "go") to the last byte in the
 * destination, connect and handshake excluded; bytes are compared after
 * the clock stopped.  The runs are interleaved (run i starts with a
 * different one of the three) so that a load change on a shared machine
 * hits all three alike; each run's ratios are taken within the run.
 * Prints every run, then the median and best GB/s of each, the median of
 * the per-run ratios and the ratio of the bests (targets: TLS GET >= 0.85
 * x the OpenSSL baseline, >= 0.5 x the plain GET), CPU seconds per GiB
 * (user and system, both ends), and whether kernel TLS was used.
 * Certificates are made at run time (tests/tls/certs.c).  The server
 * thread and tensor are engine_bench.c's (bench_common.c).
 *
 * --only runs one of the three (for a profiler; no ratios then).
 *
 *   tls_bench [--mib N] [--runs R] [--no-ktls] [--only openssl|tls|tcp]
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <hurray/client.h>
#include <hurray/hr_event.h>
#include <hurray/store.h>

#include "bench_common.h"
#include "certs.h"

/* The engine's first preference (engine/io/hr_tls.c). */
#define CIPHER "TLS_AES_128_GCM_SHA256"

static uint64_t g_bytes = 1ull << 30;
static int g_no_ktls;
static certs g_certs;

/* CPU seconds of the whole process (both ends run in it): user in [0],
 * system in [1]. */
static void cpu_s(double out[2]) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  out[0] = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6;
  out[1] = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* CPU seconds of one thread. */
static double thread_cpu_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One measurement: GB/s, the CPU seconds (user, system) it took, and
 * those of each side: [0] the sending thread (server), [1] the receiving
 * one (client). */
typedef struct sample {
  double gbs;
  double cpu[2];
  double side[2];
} sample;

static void die(const char *what) {
  fprintf(stderr, "tls_bench: %s: %s\n", what, strerror(errno));
  ERR_print_errors_fp(stderr);
  exit(1);
}

/* ------------------------------------------------------------------------ */
/* A hurray server on its own thread (libevent loop)                        */
/* ------------------------------------------------------------------------ */

/* The server speaks TLS (`tls`) with the run's certificate, or plain
 * TCP. */
static void srv_start(bc_server *s, hr_store *store, int tls) {
  hr_engine_config cfg;
  hr_tls_config tc;

  hr_engine_config_default(&cfg);
  memset(&tc, 0, sizeof tc);
  tc.cert_file = g_certs.server_cert;
  tc.key_file = g_certs.server_key;
  tc.no_ktls = g_no_ktls;
  if (tls)
    cfg.tls_server = &tc;
  bc_server_start(s, store, &cfg, NULL);
}

/* ------------------------------------------------------------------------ */
/* 1. plain OpenSSL                                                          */
/* ------------------------------------------------------------------------ */

/* A context set up like the engine's: TLS 1.3, its cipher, kTLS asked. */
static SSL_CTX *ossl_ctx(int is_server) {
  SSL_CTX *ctx = SSL_CTX_new(is_server ? TLS_server_method() : TLS_client_method());

  if (!ctx || !SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
      !SSL_CTX_set_ciphersuites(ctx, CIPHER))
    die("SSL_CTX_new");
  if (!g_no_ktls)
    SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS);
  if (is_server) {
    if (SSL_CTX_use_certificate_chain_file(ctx, g_certs.server_cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, g_certs.server_key,
                                    SSL_FILETYPE_PEM) != 1)
      die("server certificate");
    SSL_CTX_set_num_tickets(ctx, 0);
  } else {
    if (SSL_CTX_load_verify_locations(ctx, g_certs.ca, NULL) != 1)
      die("CA");
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  }
  return ctx;
}

typedef struct ossl_sender {
  int lfd;
  SSL_CTX *ctx;
  const uint8_t *src;
  uint64_t n;
  int ktls_tx;
  double cpu; /* the sending thread's CPU seconds, from "go" on */
} ossl_sender;

static void *ossl_send_main(void *arg) {
  ossl_sender *r = arg;
  int fd = accept(r->lfd, NULL, NULL), one = 1;
  SSL *ssl = SSL_new(r->ctx);
  uint64_t off = 0;
  char go;

  /* Like the engine's sockets (hr__sock_tune): records must not wait
   * for Nagle. */
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  SSL_set_fd(ssl, fd);
  if (SSL_accept(ssl) != 1)
    die("SSL_accept");
  r->ktls_tx = BIO_get_ktls_send(SSL_get_wbio(ssl)) ? 1 : 0;
  if (SSL_read(ssl, &go, 1) != 1)
    die("go");
  r->cpu = thread_cpu_s(CLOCK_THREAD_CPUTIME_ID);
  while (off < r->n) {
    size_t k = r->n - off > (8u << 20) ? (8u << 20) : (size_t)(r->n - off);
    size_t w = 0;
    if (SSL_write_ex(ssl, r->src + off, k, &w) != 1)
      die("SSL_write");
    off += w;
  }
  r->cpu = thread_cpu_s(CLOCK_THREAD_CPUTIME_ID) - r->cpu;
  SSL_shutdown(ssl);
  SSL_free(ssl);
  close(fd);
  return NULL;
}

/* SSL_write -> SSL_read straight into the final buffer. */
static sample ossl_bulk(const uint8_t *src, uint8_t *dst, uint64_t n,
                        int *ktls_tx, int *ktls_rx, char *cipher,
                        size_t cipher_len) {
  ossl_sender r;
  SSL_CTX *cctx = ossl_ctx(0);
  SSL *ssl;
  pthread_t th;
  int port, fd;
  uint64_t off = 0;
  double t0, t1, c0[2], c1[2], rc;
  sample sm;

  r.lfd = bc_listen_any(&port);
  r.ctx = ossl_ctx(1);
  r.src = src;
  r.n = n;
  pthread_create(&th, NULL, ossl_send_main, &r);
  fd = bc_connect_to(port);
  ssl = SSL_new(cctx);
  SSL_set_fd(ssl, fd);
  SSL_set1_host(ssl, "127.0.0.1");
  /* The engine's read side (hr_tls.c): read-ahead in a 256 KiB buffer
   * once the handshake is done, unless the kernel receives. */
  SSL_set_default_read_buffer_len(ssl, 256u << 10);
  if (SSL_connect(ssl) != 1)
    die("SSL_connect");
  *ktls_rx = BIO_get_ktls_recv(SSL_get_rbio(ssl)) ? 1 : 0;
  if (!*ktls_rx)
    SSL_set_read_ahead(ssl, 1);
  snprintf(cipher, cipher_len, "%s",
           SSL_CIPHER_get_name(SSL_get_current_cipher(ssl)));
  cpu_s(c0);
  rc = thread_cpu_s(CLOCK_THREAD_CPUTIME_ID);
  t0 = bc_now_s();
  if (SSL_write(ssl, "g", 1) != 1)
    die("go");
  while (off < n) {
    size_t k = 0;
    if (SSL_read_ex(ssl, dst + off, n - off, &k) != 1)
      die("SSL_read");
    off += k;
  }
  t1 = bc_now_s();
  rc = thread_cpu_s(CLOCK_THREAD_CPUTIME_ID) - rc;
  pthread_join(th, NULL);
  cpu_s(c1);
  *ktls_tx = r.ktls_tx;
  SSL_free(ssl);
  SSL_CTX_free(cctx);
  SSL_CTX_free(r.ctx);
  close(fd);
  close(r.lfd);
  if (memcmp(src, dst, n) != 0) {
    fprintf(stderr, "openssl: bytes differ\n");
    exit(1);
  }
  sm.gbs = (double)n / (t1 - t0) / 1e9;
  sm.cpu[0] = c1[0] - c0[0];
  sm.cpu[1] = c1[1] - c0[1];
  sm.side[0] = r.cpu;
  sm.side[1] = rc;
  return sm;
}

/* ------------------------------------------------------------------------ */
/* 2, 3. hurray GETs                                                         */
/* ------------------------------------------------------------------------ */

static sample hurray_get(const bc_server *srv, int tls, hr_tensor *ref,
                         uint8_t *dst, uint64_t n, hr_tls_info *ti) {
  hr_client_options co;
  hr_tls_config tc;
  hr_client_error err;
  hr_client *c;
  hr_get_opts o;
  hr_get_dest dest;
  hr_tensor *t;
  hr_transfer_record rec;
  char url[64];
  double c0[2], c1[2], s0, r0;
  clockid_t sid;
  sample sm;

  hr_client_options_default(&co);
  memset(&tc, 0, sizeof tc);
  tc.ca_file = g_certs.ca;
  tc.no_ktls = g_no_ktls;
  co.tls = &tc;
  co.timeout_ms = 120000;
  snprintf(url, sizeof url, "%s://127.0.0.1:%d", tls ? "hurrays" : "hurray",
           srv->port);
  if (pthread_getcpuclockid(srv->th, &sid) != 0)
    die("pthread_getcpuclockid");
  if (hr_client_connect(&c, url, &co, NULL, &err) != 0) {
    fprintf(stderr, "connect %s: %s\n", url, err.message);
    exit(1);
  }
  if (tls && hr_client_tls_info(c, ti) != 0)
    die("hr_client_tls_info");
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)"big";
  o.key_len = 3;
  o.max_shards = 1;
  memset(&dest, 0, sizeof dest);
  dest.buffer = dst;
  dest.capacity = n;
  o.dest = &dest;
  cpu_s(c0);
  s0 = thread_cpu_s(sid);
  r0 = thread_cpu_s(CLOCK_THREAD_CPUTIME_ID);
  if (hr_client_get(c, &o, &t, &rec) != 0) {
    fprintf(stderr, "GET failed: %s\n", hr_client_last_error(c)->message);
    exit(1);
  }
  sm.side[0] = thread_cpu_s(sid) - s0;
  sm.side[1] = thread_cpu_s(CLOCK_THREAD_CPUTIME_ID) - r0;
  cpu_s(c1);
  sm.gbs = (double)n / ((double)(rec.finished - rec.started) / 1e9) / 1e9;
  sm.cpu[0] = c1[0] - c0[0];
  sm.cpu[1] = c1[1] - c0[1];
  if (hr_tensor_buffer(t, 0) != dst ||
      memcmp(dst, hr_tensor_buffer(ref, 0), n) != 0) {
    fprintf(stderr, "hurray: bytes differ or not in place\n");
    exit(1);
  }
  hr_tensor_unref(t);
  hr_client_close(c);
  return sm;
}

#define MAX_RUNS 64

int main(int argc, char **argv) {
  static const char *const names[3] = {"openssl", "hurray TLS GET",
                                       "hurray TCP GET"};
  hr_store *store;
  hr_tensor *t;
  uint8_t *dst;
  bc_server tls_srv, tcp_srv;
  hr_tls_info ti;
  char cipher[64];
  sample sm[3][MAX_RUNS];
  double v[MAX_RUNS], best[3], med[3], gib;
  int i, k, m, runs = 5, ktx = 0, krx = 0, only = -1;

  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mib") && i + 1 < argc)
      g_bytes = strtoull(argv[++i], NULL, 10) << 20;
    else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
      runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-ktls"))
      g_no_ktls = 1;
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
      i++;
      only = !strcmp(argv[i], "openssl") ? 0
             : !strcmp(argv[i], "tls")   ? 1
             : !strcmp(argv[i], "tcp")   ? 2
                                         : -2;
      if (only == -2)
        return 2;
    } else {
      fprintf(stderr, "usage: tls_bench [--mib N] [--runs R] [--no-ktls] "
                      "[--only openssl|tls|tcp]\n");
      return 2;
    }
  }
  if (g_bytes == 0 || runs < 1 || runs > MAX_RUNS) {
    fprintf(stderr, "tls_bench: --mib must be > 0, --runs 1..%d\n",
            MAX_RUNS);
    return 2;
  }
  gib = (double)g_bytes / (1 << 30);
  if (certs_make(&g_certs))
    die("certificates");
  t = bc_big_tensor(g_bytes);
  dst = mmap(NULL, g_bytes, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (dst == MAP_FAILED)
    die("mmap");
  madvise(dst, g_bytes, MADV_HUGEPAGE);
  memset(dst, 0, g_bytes); /* fault the destination in once for all */
  hr_store_new(&store, NULL, NULL);
  hr_store_put(store, "big", 3, t, 0);
  srv_start(&tls_srv, store, 1);
  srv_start(&tcp_srv, store, 0);
  printf("tls_bench: %.0f MiB over loopback into the final buffer, %d "
         "interleaved runs%s\n",
         (double)g_bytes / (1 << 20), runs, g_no_ktls ? " (kTLS off)" : "");
  for (i = 0; i < runs; i++) {
    /* Run i starts with a different one of the three. */
    for (k = 0; k < 3; k++) {
      m = (i + k) % 3;
      if (only >= 0 && m != only) {
        sm[m][i].gbs = 1;
        sm[m][i].cpu[0] = sm[m][i].cpu[1] = 0;
        sm[m][i].side[0] = sm[m][i].side[1] = 0;
        continue;
      }
      memset(dst, 0, 4096);
      if (m == 0)
        sm[0][i] = ossl_bulk(hr_tensor_buffer(t, 0), dst, g_bytes, &ktx,
                             &krx, cipher, sizeof cipher);
      else
        sm[m][i] = hurray_get(m == 1 ? &tls_srv : &tcp_srv, m == 1, t, dst,
                              g_bytes, &ti);
    }
    if (only >= 0)
      printf("  run %d: %s %.2f GB/s, CPU s user %.2f sys %.2f, sender "
             "%.2f receiver %.2f\n",
             i + 1, names[only], sm[only][i].gbs, sm[only][i].cpu[0],
             sm[only][i].cpu[1], sm[only][i].side[0], sm[only][i].side[1]);
    else
      printf("  run %d: openssl %.2f GB/s  hurray TLS GET %.2f GB/s  "
           "hurray TCP GET %.2f GB/s  TLS/openssl %.2f  TLS/TCP %.2f\n",
           i + 1, sm[0][i].gbs, sm[1][i].gbs, sm[2][i].gbs,
           sm[1][i].gbs / sm[0][i].gbs, sm[1][i].gbs / sm[2][i].gbs);
    fflush(stdout);
  }
  if (only >= 0) {
    for (i = 0; i < runs; i++)
      v[i] = sm[only][i].gbs;
    printf("  %s only: median %.2f GB/s\n", names[only], bc_median(v, runs));
    goto out;
  }
  printf("  cipher: openssl %s (kTLS tx %d rx %d), hurray %s %s (kTLS tx %d "
         "rx %d)\n",
         cipher, ktx, krx, ti.version, ti.cipher, ti.ktls_tx, ti.ktls_rx);
  if (strcmp(cipher, ti.cipher) != 0)
    printf("  WARNING: the ciphers differ; the comparison is unfair\n");
  for (m = 0; m < 3; m++) {
    double cu, cs, ss, rs;
    best[m] = 0;
    for (i = 0; i < runs; i++) {
      v[i] = sm[m][i].gbs;
      if (v[i] > best[m])
        best[m] = v[i];
    }
    med[m] = bc_median(v, runs);
    for (i = 0; i < runs; i++)
      v[i] = sm[m][i].cpu[0];
    cu = bc_median(v, runs) / gib;
    for (i = 0; i < runs; i++)
      v[i] = sm[m][i].cpu[1];
    cs = bc_median(v, runs) / gib;
    for (i = 0; i < runs; i++)
      v[i] = sm[m][i].side[0];
    ss = bc_median(v, runs) / gib;
    for (i = 0; i < runs; i++)
      v[i] = sm[m][i].side[1];
    rs = bc_median(v, runs) / gib;
    /* CPU time per GiB, both ends together: the steadier figure on a
     * loaded machine.  With two cores GB/s cannot beat 2 / (user + sys),
     * nor 1 / the busier side. */
    printf("  %-15s median %.2f GB/s, best %.2f GB/s; CPU s per GiB: user "
           "%.2f + sys %.2f = %.2f (sender %.2f, receiver %.2f)\n",
           names[m], med[m], best[m], cu, cs, cu + cs, ss, rs);
  }
  for (i = 0; i < runs; i++)
    v[i] = sm[1][i].gbs / sm[0][i].gbs;
  printf("  TLS GET / openssl: median of runs %.2f, of bests %.2f (target "
         ">= 0.85)\n",
         bc_median(v, runs), best[1] / best[0]);
  for (i = 0; i < runs; i++)
    v[i] = sm[1][i].gbs / sm[2][i].gbs;
  printf("  TLS GET / TCP GET: median of runs %.2f, of bests %.2f (target "
         ">= 0.50)\n",
         bc_median(v, runs), best[1] / best[2]);
out:
  bc_server_stop(&tls_srv);
  bc_server_stop(&tcp_srv);
  hr_store_del(store);
  hr_tensor_unref(t);
  munmap(dst, g_bytes);
  certs_remove(&g_certs);
  return 0;
}
