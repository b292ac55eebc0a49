/* What the loopback benchmarks share: see bench_common.h.  The server on
 * its own thread (libevent) is in bench_server.c, so that a benchmark
 * without it (gpu_engine_bench) builds from this file and the library
 * alone (perf/gpu_check.sh's direct build). */
#include "bench_common.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

void bc_die(const char *what) {
  fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what,
          strerror(errno));
  exit(1);
}

void bc_die_rv(const char *what, int rv) {
  fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what,
          hr_strerror(rv));
  exit(2);
}

double bc_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double bc_cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
         ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) * 1e-6;
}

uint64_t bc_parse_size(const char *s) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  switch (*end) {
  case 'k':
  case 'K': v <<= 10; break;
  case 'm':
  case 'M': v <<= 20; break;
  case 'g':
  case 'G': v <<= 30; break;
  default: break;
  }
  return v;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double bc_median(double *v, int k) {
  qsort(v, (size_t)k, sizeof *v, cmp_double);
  return k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}

int bc_device_arg(int argc, char **argv, int *i, const char **backend,
                  uint64_t *size, int *iters) {
  if (*i + 1 >= argc)
    return 0;
  if (!strcmp(argv[*i], "--backend"))
    *backend = argv[*i + 1];
  else if (!strcmp(argv[*i], "--size"))
    *size = bc_parse_size(argv[*i + 1]);
  else if (!strcmp(argv[*i], "--iters"))
    *iters = atoi(argv[*i + 1]);
  else
    return 0;
  ++*i;
  return 1;
}

hr_gpu *bc_gpu_open(const char *backend, hr_gpu_caps *caps) {
  hr_gpu_config cfg;
  hr_gpu_probe_info why;
  hr_gpu *g;
  hr_gpu_config_default(&cfg);
  cfg.backend = backend;
  int rv = hr_gpu_open(&g, &cfg, NULL, &why);
  if (rv == HR_ERR_UNSUPPORTED) {
    printf("SKIP: backend %s unavailable: %s\n", backend, why.reason);
    return NULL;
  }
  if (rv)
    bc_die_rv("hr_gpu_open", rv);
  BC_CHECK("query", hr_gpu_query(g, caps));
  return g;
}

int bc_listen_any(int *port) {
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 64) ||
      getsockname(fd, (struct sockaddr *)&sa, &len))
    bc_die("listen");
  *port = ntohs(sa.sin_port);
  return fd;
}

int bc_connect_to(int port) {
  struct sockaddr_in sa;
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa))
    bc_die("connect");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void bc_bytes_desc(hr_descriptor *d, uint64_t bytes, uint8_t align_log2) {
  memset(d, 0, sizeof *d);
  d->descriptor_version = 1;
  d->element_type = HR_ELEM_UINT8;
  d->rank = 1;
  d->shape[0] = bytes;
  d->layout.tag = HR_LAYOUT_ROW_MAJOR;
  d->buffer_count = 1;
  d->buffers[0].size_bytes = bytes;
  d->buffers[0].alignment_log2 = align_log2;
}

hr_tensor *bc_big_tensor(uint64_t bytes) {
  hr_descriptor d;
  hr_tensor *t;
  uint64_t *p, i;

  bc_bytes_desc(&d, bytes, 6);
  if (hr_tensor_alloc(&t, &d, 12, NULL) != 0)
    bc_die("hr_tensor_alloc");
  p = hr_tensor_buffer(t, 0);
  for (i = 0; i < bytes / 8; i++)
    p[i] = i * 0x9E3779B97F4A7C15ull;
  return t;
}
