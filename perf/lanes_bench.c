/*
 * lanes_bench: a parallel GET over 1, 2, 4 and 8 lanes against iperf3
 * with as many streams, on loopback, in the same run (guides/
 * performance.md: never compare with a table).
 *
 * For each N: a hurray GET of a 1 GiB FLOAT32 tensor with PARALLEL_OK and
 * max_shards N over a session of N connections, into the caller's buffer
 * (touched once beforehand: page faults are not the protocol's); the
 * best of --reps runs.  Then `iperf3 -c 127.0.0.1 -P N -t SECS` against
 * `iperf3 -s -1` on a free port.  Prints GB/s of both and their ratio.
 * The server is a forked process on its own libevent loop (like iperf3's),
 * the client the blocking API; nothing is pinned and no core count is
 * assumed, so it runs unchanged on a machine of many cores.
 *
 *   lanes_bench [--mib N] [--reps N] [--iperf-secs N] [--lanes 1,2,4,8]
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hurray/client.h>
#include <hurray/hr_event.h>
#include <hurray/store.h>

static uint64_t g_bytes = 1ull << 30;
static int g_reps = 3;
static int g_iperf_secs = 3;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *fmt, const char *arg) {
  fprintf(stderr, "lanes_bench: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n");
  exit(1);
}

/* A tensor of g_bytes as FLOAT32 rows of 4096, filled (every page real). */
static hr_tensor *make_tensor(void) {
  hr_descriptor d;
  hr_tensor *t;
  uint64_t rows = g_bytes / (4096 * 4);

  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_FLOAT32;
  d.rank = 2;
  d.shape[0] = rows;
  d.shape[1] = 4096;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  d.buffers[0].size_bytes = rows * 4096 * 4;
  d.buffers[0].alignment_log2 = 6;
  if (hr_tensor_alloc(&t, &d, 6, NULL))
    die("%s", "out of memory for the tensor");
  uint8_t *b = hr_tensor_buffer(t, 0);
  for (uint64_t i = 0; i < d.buffers[0].size_bytes; i += 4096)
    b[i] = (uint8_t)(i >> 12);
  return t;
}

/* ---- the server (a child process) ---------------------------------------- */

static void on_term(evutil_socket_t fd, short what, void *base) {
  (void)fd;
  (void)what;
  event_base_loopexit(base, NULL);
}

/* Serves "w" on 127.0.0.1:0 and writes the port to `ready`. */
static int serve(int ready) {
  struct event_base *base = event_base_new();
  hr_store *store = NULL;
  hr_store_config sc;
  hr_provider prov;
  hr_engine *e;
  hr_listener *l;
  hr_tensor *t = make_tensor();
  int port;

  hr_store_config_default(&sc);
  if (!base || hr_store_new(&store, &sc, NULL) ||
      hr_store_put(store, "w", 1, t, HR_PUT_REPLACE))
    die("%s", "server setup");
  hr_tensor_unref(t);
  hr_store_provider(store, &prov);
  if (hr_ev_attach(&e, base, NULL, NULL) ||
      hr_engine_listen(e, "127.0.0.1:0", &prov, &l))
    die("%s", "server listen");
  port = hr_listener_port(l);
  struct event *sig = evsignal_new(base, SIGTERM, on_term, base);
  event_add(sig, NULL);
  if (write(ready, &port, sizeof port) != sizeof port)
    die("%s", "server ready pipe");
  close(ready);
  event_base_dispatch(base);
  event_free(sig);
  hr_engine_close(e, NULL, NULL);
  while (hr_engine_del(e) == HR_ERR_BUSY)
    event_base_loop(base, EVLOOP_ONCE);
  hr_store_del(store);
  event_base_free(base);
  return 0;
}

/* ---- hurray -------------------------------------------------------------- */

/* Best GB/s of g_reps GETs over `lanes` connections with as many shards;
 * *shards_out and *lanes_out: what the last transfer reports. */
static double hurray_run(int port, unsigned lanes, void *dst,
                         uint32_t *shards_out, uint32_t *lanes_out) {
  hr_client_options o;
  hr_client *c;
  hr_client_error err;
  char url[64];
  double best = 0;

  hr_client_options_default(&o);
  o.lanes = lanes;
  o.timeout_ms = 120000;
  snprintf(url, sizeof url, "hurray://127.0.0.1:%d", port);
  if (hr_client_connect(&c, url, &o, NULL, &err))
    die("connect: %s", err.message);
  if (hr_client_lanes(c) != lanes)
    die("%s", "the server took fewer lanes than asked");
  for (int r = 0; r < g_reps; r++) {
    hr_get_opts go;
    hr_get_dest dest = {dst, g_bytes, NULL, NULL};
    hr_transfer_record rec;
    hr_tensor *t = NULL;
    memset(&go, 0, sizeof go);
    go.key = (const uint8_t *)"w";
    go.key_len = 1;
    go.flags = HR_REQ_PARALLEL_OK;
    go.max_shards = (uint16_t)lanes;
    go.min_alignment_log2 = 6;
    go.dest = &dest;
    double t0 = now_s();
    if (hr_client_get(c, &go, &t, &rec))
      die("GET: %s", hr_client_last_error(c)->message);
    double dt = now_s() - t0;
    if (hr_tensor_bytes(t) != g_bytes)
      die("%s", "short tensor");
    hr_tensor_unref(t);
    double gbs = (double)g_bytes / dt / 1e9;
    if (gbs > best)
      best = gbs;
    *shards_out = rec.shards;
    *lanes_out = rec.lanes;
  }
  hr_client_close(c);
  return best;
}

/* ---- iperf3 -------------------------------------------------------------- */

static int free_port(void) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;

  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

/* GB/s of `iperf3 -P streams`, or a negative value when iperf3 failed. */
static double iperf_run(unsigned streams) {
  int port = free_port(), out[2];
  char p[16], n[16], secs[16];
  pid_t srv, cli;

  if (port < 0 || pipe(out))
    return -1;
  snprintf(p, sizeof p, "%d", port);
  snprintf(n, sizeof n, "%u", streams);
  snprintf(secs, sizeof secs, "%d", g_iperf_secs);
  srv = fork();
  if (srv == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execlp("iperf3", "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", p,
           (char *)NULL);
    _exit(127);
  }
  if (srv < 0)
    return -1;
  /* Let the server listen; the client retries its connect anyway. */
  usleep(300000);
  cli = fork();
  if (cli == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execlp("iperf3", "iperf3", "-c", "127.0.0.1", "-p", p, "-P", n, "-t", secs,
           "-J", (char *)NULL);
    _exit(127);
  }
  close(out[1]);
  size_t cap = 1 << 20, len = 0;
  char *json = malloc(cap);
  ssize_t k;
  while (json && (k = read(out[0], json + len, cap - 1 - len)) > 0)
    len += (size_t)k;
  close(out[0]);
  int st = 0;
  waitpid(cli, &st, 0);
  /* -1 ends the server after one test; make sure it is gone. */
  kill(srv, SIGTERM);
  waitpid(srv, NULL, 0);
  double gbs = -1;
  if (json && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
    json[len] = '\0';
    cJSON *root = cJSON_Parse(json);
    cJSON *end = root ? cJSON_GetObjectItem(root, "end") : NULL;
    cJSON *sum = end ? cJSON_GetObjectItem(end, "sum_received") : NULL;
    cJSON *bps = sum ? cJSON_GetObjectItem(sum, "bits_per_second") : NULL;
    if (cJSON_IsNumber(bps))
      gbs = bps->valuedouble / 8e9;
    cJSON_Delete(root);
  }
  free(json);
  return gbs;
}

/* ---- main ---------------------------------------------------------------- */

int main(int argc, char **argv) {
  unsigned lanes[16] = {1, 2, 4, 8}, nl = 4;

  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mib") && i + 1 < argc) {
      g_bytes = strtoull(argv[++i], NULL, 10) << 20;
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      g_reps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--iperf-secs") && i + 1 < argc) {
      g_iperf_secs = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--lanes") && i + 1 < argc) {
      char *s = argv[++i];
      nl = 0;
      while (*s && nl < 16) {
        lanes[nl++] = (unsigned)strtoul(s, &s, 10);
        if (*s == ',')
          s++;
      }
    } else {
      fprintf(stderr, "usage: lanes_bench [--mib N] [--reps N] "
                      "[--iperf-secs N] [--lanes 1,2,4,8]\n");
      return 2;
    }
  }
  if (g_bytes < (16u << 20) || g_reps < 1 || g_iperf_secs < 1)
    die("%s", "--mib at least 16, --reps and --iperf-secs at least 1");
  for (unsigned i = 0; i < nl; i++)
    if (lanes[i] < 1 || lanes[i] > HR_MAX_LANES)
      die("%s", "--lanes: 1 to 64 each");
  signal(SIGPIPE, SIG_IGN);
  int ready[2];
  if (pipe(ready))
    die("%s", "pipe");
  pid_t srv = fork();
  if (srv == 0) {
    close(ready[0]);
    _exit(serve(ready[1]));
  }
  close(ready[1]);
  int port = 0;
  if (read(ready[0], &port, sizeof port) != sizeof port)
    die("%s", "the server did not start");
  close(ready[0]);
  void *dst = aligned_alloc(4096, g_bytes);
  if (!dst)
    die("%s", "out of memory for the destination");
  memset(dst, 0, g_bytes);
  printf("lanes_bench: %llu MiB over loopback, %ld CPUs, best of %d GETs, "
         "iperf3 -t %d\n",
         (unsigned long long)(g_bytes >> 20), sysconf(_SC_NPROCESSORS_ONLN),
         g_reps, g_iperf_secs);
  printf("%6s %7s %14s %14s %7s\n", "lanes", "shards", "hurray GB/s",
         "iperf3 GB/s", "ratio");
  for (unsigned i = 0; i < nl; i++) {
    uint32_t shards = 0, used = 0;
    double h = hurray_run(port, lanes[i], dst, &shards, &used);
    double p = iperf_run(lanes[i]);
    if (p > 0)
      printf("%6u %7u %14.2f %14.2f %7.2f\n", used, shards, h, p, h / p);
    else
      printf("%6u %7u %14.2f %14s %7s\n", used, shards, h, "(failed)", "-");
    fflush(stdout);
  }
  free(dst);
  kill(srv, SIGTERM);
  waitpid(srv, NULL, 0);
  return 0;
}
