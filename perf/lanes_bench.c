/*
 * lanes_bench: a parallel GET over 1, 2, 4 and 8 lanes against iperf3
 * with as many streams, on loopback, in the same run (guides/
 * performance.md: never compare with a table).
 *
 * For each N, --reps rounds, each of: a hurray GET of a 1 GiB FLOAT32
 * tensor with PARALLEL_OK and max_shards N over a session of N
 * connections, into the caller's buffer (touched once beforehand: page
 * faults are not the protocol's), with the engines' defaults (bulk I/O
 * on the worker pools, as many jobs at once as bulk_offload_jobs allows:
 * automatic, sized to the CPUs, or --offload-jobs); the same GET with
 * every lane's bytes on the worker pools whatever the CPUs
 * (bulk_offload_jobs 64, the default before it was sized to the CPUs);
 * the same GET with every byte on the loop threads (bulk offload off on
 * both ends: the baseline); and `iperf3 -c 127.0.0.1 -P N -t SECS`
 * against `iperf3 -s -1`.  The four are interleaved so that a noisy
 * machine (a shared 2-core VM) disturbs them alike; the median and the
 * best of each are printed, with the ratios of the medians.  During the
 * default GETs the CPU time of every thread of both ends is read from
 * /proc (utime + stime): the busiest thread's share of its process's CPU
 * time, and how many threads did at least 5 % of it, show whether lanes
 * spread over cores (1 lane: one thread does nearly all; N lanes: about
 * 1/N each).  A second table gives, for each of the three GETs, the CPU
 * seconds and the context switches (voluntary + involuntary, all
 * threads) of both ends per GiB: on a machine whose cores are all busy,
 * throughput is the cores over the CPU seconds per GiB, so these show
 * where the time of N lanes goes however loaded the machine is.
 *
 * The servers are forked processes on their own libevent loops (like
 * iperf3's), the client the blocking API; nothing is pinned and no core
 * count is assumed, so it runs unchanged on a machine of many cores.
 *
 *   lanes_bench [--mib N] [--reps N] [--iperf-secs N] [--lanes 1,2,4,8]
 *               [--offload-min BYTES] [--offload-jobs N] [--no-baseline]
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hurray/client.h>
#include <hurray/hr_event.h>
#include <hurray/store.h>

static uint64_t g_bytes = 1ull << 30;
static int g_reps = 5;
static int g_iperf_secs = 2;
static uint64_t g_offload_min = 0; /* 0: the engine's default */
static int g_offload_jobs = 0;     /* 0: automatic (the engine's default) */
/* bulk_offload_jobs of the "all offloaded" GETs: more than any lanes. */
#define ALL_JOBS 64

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

/* Serves "w" on 127.0.0.1:0 with bulk I/O from `bulk_min` bytes, at most
 * `jobs` at once (0: automatic), and writes the port to `ready`. */
static int serve(int ready, uint64_t bulk_min, int jobs) {
  struct event_base *base = event_base_new();
  hr_store *store = NULL;
  hr_store_config sc;
  hr_provider prov;
  hr_engine *e;
  hr_listener *l;
  hr_tensor *t = make_tensor();
  hr_engine_config ec;
  int port;

  hr_store_config_default(&sc);
  if (!base || hr_store_new(&store, &sc, NULL) ||
      hr_store_put(store, "w", 1, t, HR_PUT_REPLACE))
    die("%s", "server setup");
  hr_tensor_unref(t);
  hr_store_provider(store, &prov);
  hr_engine_config_default(&ec);
  ec.bulk_offload_min = bulk_min;
  ec.bulk_offload_jobs = jobs;
  if (hr_ev_attach(&e, base, &ec, NULL) ||
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

static hr_client *hurray_connect(int port, unsigned lanes, uint64_t bulk_min,
                                 int jobs) {
  hr_client_options o;
  hr_client *c;
  hr_client_error err;
  char url[64];

  hr_client_options_default(&o);
  o.lanes = lanes;
  o.timeout_ms = 120000;
  o.bulk_offload_min = bulk_min;
  o.bulk_offload_jobs = jobs;
  snprintf(url, sizeof url, "hurray://127.0.0.1:%d", port);
  if (hr_client_connect(&c, url, &o, NULL, &err))
    die("connect: %s", err.message);
  if (hr_client_lanes(c) != lanes)
    die("%s", "the server took fewer lanes than asked");
  return c;
}

/* GB/s of one GET over `lanes` connections with as many shards;
 * *shards_out and *lanes_out: what the transfer reports. */
static double hurray_get(hr_client *c, unsigned lanes, void *dst,
                         uint32_t *shards_out, uint32_t *lanes_out) {
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
  *shards_out = rec.shards;
  *lanes_out = rec.lanes;
  return (double)g_bytes / dt / 1e9;
}

/* ---- per-thread CPU time ------------------------------------------------- */

#define MAX_THREADS 256

/* CPU ticks (utime + stime) and context switches of each thread of a
 * process. */
typedef struct cpu_snap {
  int n;
  int tid[MAX_THREADS];
  unsigned long long ticks[MAX_THREADS];
  unsigned long long cs[MAX_THREADS];
} cpu_snap;

/* Voluntary + involuntary context switches of one thread (0: unknown). */
static unsigned long long ctx_switches(pid_t pid, const char *tid) {
  char path[320], line[256];
  unsigned long long n = 0, v;
  FILE *f;

  snprintf(path, sizeof path, "/proc/%d/task/%s/status", (int)pid, tid);
  f = fopen(path, "r");
  if (!f)
    return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1 ||
        sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1)
      n += v;
  fclose(f);
  return n;
}

static void cpu_read(pid_t pid, cpu_snap *cs) {
  char path[320], buf[1024];
  struct dirent *d;
  DIR *dir;

  cs->n = 0;
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  dir = opendir(path);
  if (!dir)
    return;
  while ((d = readdir(dir)) && cs->n < MAX_THREADS) {
    if (d->d_name[0] == '.')
      continue;
    snprintf(path, sizeof path, "/proc/%d/task/%s/stat", (int)pid, d->d_name);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    /* The name may hold spaces: fields start after its ')'. */
    char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu "
                            "%llu",
                     &ut, &st) != 2)
      continue;
    cs->tid[cs->n] = atoi(d->d_name);
    cs->ticks[cs->n] = ut + st;
    cs->cs[cs->n] = ctx_switches(pid, d->d_name);
    cs->n++;
  }
  closedir(dir);
}

/* Per-thread CPU ticks accumulated over several intervals, and the
 * context switches of all threads. */
typedef struct cpu_acc {
  int n;
  int tid[MAX_THREADS];
  unsigned long long ticks[MAX_THREADS];
  unsigned long long cs;
} cpu_acc;

static void cpu_add(cpu_acc *a, const cpu_snap *before, const cpu_snap *after) {
  for (int i = 0; i < after->n; i++) {
    unsigned long long b = 0, bcs = 0;
    for (int k = 0; k < before->n; k++)
      if (before->tid[k] == after->tid[i]) {
        b = before->ticks[k];
        bcs = before->cs[k];
      }
    a->cs += after->cs[i] - bcs;
    int j;
    for (j = 0; j < a->n; j++)
      if (a->tid[j] == after->tid[i])
        break;
    if (j == a->n) {
      if (a->n == MAX_THREADS)
        continue;
      a->tid[a->n] = after->tid[i];
      a->ticks[a->n++] = 0;
    }
    a->ticks[j] += after->ticks[i] - b;
  }
}

/* CPU seconds of all threads. */
static double cpu_secs(const cpu_acc *a) {
  unsigned long long total = 0;
  for (int i = 0; i < a->n; i++)
    total += a->ticks[i];
  return (double)total / (double)sysconf(_SC_CLK_TCK);
}

/* "CPU s / busiest thread's % / threads with at least 5 %". */
static void cpu_fmt(const cpu_acc *a, char *out, size_t cap) {
  unsigned long long total = 0, top = 0;
  int busy = 0;
  double hz = (double)sysconf(_SC_CLK_TCK);

  for (int i = 0; i < a->n; i++) {
    total += a->ticks[i];
    if (a->ticks[i] > top)
      top = a->ticks[i];
  }
  for (int i = 0; i < a->n; i++)
    if (total && a->ticks[i] * 20 >= total)
      busy++;
  snprintf(out, cap, "%5.2f %3.0f%% %2d", (double)total / hz,
           total ? 100.0 * (double)top / (double)total : 0.0, busy);
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
    /* Not the client's pipe: a server that never saw its test (a client
     * that gave up on a loaded machine) would keep it open, and the read
     * below would wait for it for ever. */
    close(out[0]);
    close(out[1]);
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

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median and best of n values (sorted in place; failures, < 0, last). */
static void med_best(double *v, int n, double *med, double *best) {
  int ok = 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  while (ok < n && v[n - 1 - ok] >= 0)
    ok++;
  v += n - ok;
  *med = ok ? (ok % 2 ? v[ok / 2] : (v[ok / 2 - 1] + v[ok / 2]) / 2) : -1;
  *best = ok ? v[ok - 1] : -1;
}

static pid_t start_server(uint64_t bulk_min, int jobs, int *port) {
  int ready[2];
  if (pipe(ready))
    die("%s", "pipe");
  pid_t srv = fork();
  if (srv == 0) {
    close(ready[0]);
    _exit(serve(ready[1], bulk_min, jobs));
  }
  close(ready[1]);
  if (read(ready[0], port, sizeof *port) != sizeof *port)
    die("%s", "the server did not start");
  close(ready[0]);
  return srv;
}

/* The three hurray GETs of a round. */
enum { V_AUTO, V_ALL, V_LOOP, NV };

int main(int argc, char **argv) {
  unsigned lanes[16] = {1, 2, 4, 8}, nl = 4;
  int baseline = 1;

  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mib") && i + 1 < argc) {
      g_bytes = strtoull(argv[++i], NULL, 10) << 20;
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      g_reps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--iperf-secs") && i + 1 < argc) {
      g_iperf_secs = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--offload-min") && i + 1 < argc) {
      g_offload_min = strtoull(argv[++i], NULL, 10);
    } else if (!strcmp(argv[i], "--offload-jobs") && i + 1 < argc) {
      g_offload_jobs = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--no-baseline")) {
      baseline = 0;
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
                      "[--iperf-secs N] [--lanes 1,2,4,8] "
                      "[--offload-min BYTES] [--offload-jobs N] "
                      "[--no-baseline]\n");
      return 2;
    }
  }
  if (g_bytes < (16u << 20) || g_reps < 1 || g_reps > 64 ||
      g_iperf_secs < 1 || g_offload_min == UINT64_MAX || g_offload_jobs < 0)
    die("%s", "--mib at least 16, --reps 1 to 64, --iperf-secs at least 1, "
              "--offload-jobs at least 0");
  for (unsigned i = 0; i < nl; i++)
    if (lanes[i] < 1 || lanes[i] > HR_MAX_LANES)
      die("%s", "--lanes: 1 to 64 each");
  signal(SIGPIPE, SIG_IGN);
  /* Each GET's engines, on both ends: bulk_offload_min and _jobs. */
  const uint64_t vmin[NV] = {g_offload_min, g_offload_min, UINT64_MAX};
  const int vjobs[NV] = {g_offload_jobs, ALL_JOBS, 0};
  const char *vname[NV] = {"default", "all-offl", "loop-only"};
  int nv = baseline ? NV : 1, port[NV];
  pid_t srv[NV];
  for (int v = 0; v < nv; v++)
    srv[v] = start_server(vmin[v], vjobs[v], &port[v]);
  void *dst = aligned_alloc(4096, g_bytes);
  if (!dst)
    die("%s", "out of memory for the destination");
  /* iperf3 is started with fork(): that would write-protect every page
   * of the destination, and the next GET would pay a copy-on-write fault
   * per page (40 % of its time on a VM).  The children never need it. */
  madvise(dst, g_bytes, MADV_DONTFORK);
  memset(dst, 0, g_bytes);
  printf("lanes_bench: %llu MiB over loopback, %ld CPUs, %d interleaved "
         "rounds (median / best), iperf3 -t %d\n",
         (unsigned long long)(g_bytes >> 20), sysconf(_SC_NPROCESSORS_ONLN),
         g_reps, g_iperf_secs);
  printf("  hurray: the engines' defaults (bulk_offload_jobs %d%s); "
         "all-offl: every lane's bytes on the worker pools (jobs %d, the "
         "default before); loop-only: every byte on the loop threads\n",
         g_offload_jobs, g_offload_jobs ? "" : ", automatic", ALL_JOBS);
  printf("  cpu: CPU s of the default GETs / busiest thread's share / "
         "threads with >= 5%%\n");
  printf("%5s %6s %13s %13s %13s %13s %6s %6s %6s %6s  %-16s %-16s\n",
         "lanes", "shards", "hurray GB/s", "all-offl", "loop-only",
         "iperf3 GB/s", "h/ip3", "h/h1", "h/all", "h/loop", "client cpu",
         "server cpu");
  /* One GET first, unmeasured: the first touches of the servers' and the
   * client's memory are nobody's throughput. */
  for (int v = 0; v < nv; v++) {
    uint32_t s0, u0;
    hr_client *c = hurray_connect(port[v], lanes[0], vmin[v], vjobs[v]);
    hurray_get(c, lanes[0], dst, &s0, &u0);
    hr_client_close(c);
  }
  double h1 = -1;
  /* Per lane count and GET: CPU s and context switches (both ends) per
   * GiB, for the second table. */
  double eff_cpu[16][NV], eff_cs[16][NV];
  for (unsigned i = 0; i < nl; i++) {
    uint32_t shards = 0, used = 0, s2, u2;
    double h[NV][64], p[64];
    cpu_acc cc[NV], sc[NV];
    hr_client *c[NV];
    memset(cc, 0, sizeof cc);
    memset(sc, 0, sizeof sc);
    for (int v = 0; v < nv; v++)
      c[v] = hurray_connect(port[v], lanes[i], vmin[v], vjobs[v]);
    for (int r = 0; r < g_reps; r++) {
      for (int v = 0; v < NV; v++) {
        cpu_snap cb, ca, sb, sa;
        if (v >= nv) {
          h[v][r] = -1;
          continue;
        }
        cpu_read(getpid(), &cb);
        cpu_read(srv[v], &sb);
        h[v][r] = hurray_get(c[v], lanes[i], dst, v ? &s2 : &shards,
                             v ? &u2 : &used);
        cpu_read(getpid(), &ca);
        cpu_read(srv[v], &sa);
        cpu_add(&cc[v], &cb, &ca);
        cpu_add(&sc[v], &sb, &sa);
      }
      p[r] = iperf_run(lanes[i]);
    }
    for (int v = 0; v < nv; v++) {
      double gib = (double)g_reps * (double)g_bytes / (double)(1u << 30);
      hr_client_close(c[v]);
      eff_cpu[i][v] = (cpu_secs(&cc[v]) + cpu_secs(&sc[v])) / gib;
      eff_cs[i][v] = (double)(cc[v].cs + sc[v].cs) / gib;
    }
    double hm[NV], hb[NV], pm, pb;
    char ccpu[32], scpu[32], ratio[4][16];
    for (int v = 0; v < NV; v++)
      med_best(h[v], g_reps, &hm[v], &hb[v]);
    med_best(p, g_reps, &pm, &pb);
    if (lanes[i] == 1)
      h1 = hm[V_AUTO];
    cpu_fmt(&cc[V_AUTO], ccpu, sizeof ccpu);
    cpu_fmt(&sc[V_AUTO], scpu, sizeof scpu);
    snprintf(ratio[0], sizeof ratio[0], pm > 0 ? "%.2f" : "-",
             hm[V_AUTO] / pm);
    snprintf(ratio[1], sizeof ratio[1], h1 > 0 ? "%.2f" : "-",
             hm[V_AUTO] / h1);
    snprintf(ratio[2], sizeof ratio[2], hm[V_ALL] > 0 ? "%.2f" : "-",
             hm[V_AUTO] / hm[V_ALL]);
    snprintf(ratio[3], sizeof ratio[3], hm[V_LOOP] > 0 ? "%.2f" : "-",
             hm[V_AUTO] / hm[V_LOOP]);
    char hs[NV][32], ps[32];
    for (int v = 0; v < NV; v++) {
      if (hm[v] > 0)
        snprintf(hs[v], sizeof hs[v], "%5.2f /%5.2f", hm[v], hb[v]);
      else
        snprintf(hs[v], sizeof hs[v], "-");
    }
    if (pm > 0)
      snprintf(ps, sizeof ps, "%5.2f /%5.2f", pm, pb);
    else
      snprintf(ps, sizeof ps, "(failed)");
    printf("%5u %6u %13s %13s %13s %13s %6s %6s %6s %6s  %-16s %-16s\n", used,
           shards, hs[V_AUTO], hs[V_ALL], hs[V_LOOP], ps, ratio[0], ratio[1],
           ratio[2], ratio[3], ccpu, scpu);
    fflush(stdout);
  }
  printf("both ends per GiB: CPU s / context switches\n%5s", "lanes");
  for (int v = 0; v < nv; v++)
    printf(" %18s", vname[v]);
  printf("\n");
  for (unsigned i = 0; i < nl; i++) {
    printf("%5u", lanes[i]);
    for (int v = 0; v < nv; v++)
      printf(" %8.2f / %7.0f", eff_cpu[i][v], eff_cs[i][v]);
    printf("\n");
  }
  free(dst);
  for (int v = 0; v < nv; v++) {
    kill(srv[v], SIGTERM);
    waitpid(srv[v], NULL, 0);
  }
  return 0;
}
