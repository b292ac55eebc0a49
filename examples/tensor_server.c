/*
 * Example 3: a small custom tensor server.  Tensors are computed when
 * they are asked for, through an hr_provider:
 *
 *   arange/N        FLOAT32 [N]        0, 1, ..., N-1
 *   eye/N           FLOAT32 [N, N]     the identity
 *   matrix/R/C      FLOAT32 [R, C]     element (r, c) = r * C + c
 *
 *   tensor_server [HOST:PORT [METRICS_HOST:PORT]]
 *                                      (default 127.0.0.1:0: any port)
 *
 * It prints "listening on HOST:PORT", serves on a libevent loop, and
 * drains gracefully on SIGINT/SIGTERM.  Given METRICS_HOST:PORT, it also
 * logs a JSON line per request on stderr and serves Prometheus metrics at
 * http://METRICS_HOST:PORT/metrics (<hurray/metrics.h>).  Clients may ask for
 * any layout with ALLOW_TRANSCODE: the engine transcodes the row-major answer.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hurray/hr_event.h>
#include <hurray/metrics.h>

#define MAX_ELEMS (64u << 20) /* 256 MiB of float32 per answer */

static const char *const listed[] = {"arange/10", "eye/4", "matrix/3/4"};

/* Parses "arange/N", "eye/N", "matrix/R/C" into a shape; 0 when the key
 * names nothing. */
static int parse_key(const char *k, size_t n, unsigned *rank, uint64_t shape[2],
                     int *kind) {
  char buf[64];
  unsigned long long a, b;
  int used = 0;

  if (n >= sizeof buf)
    return 0;
  memcpy(buf, k, n);
  buf[n] = '\0';
  if (sscanf(buf, "arange/%llu%n", &a, &used) == 1 && (size_t)used == n) {
    *kind = 0;
    *rank = 1;
    shape[0] = a;
    return 1;
  }
  if (sscanf(buf, "eye/%llu%n", &a, &used) == 1 && (size_t)used == n) {
    *kind = 1;
    *rank = 2;
    shape[0] = shape[1] = a;
    return 1;
  }
  if (sscanf(buf, "matrix/%llu/%llu%n", &a, &b, &used) == 2 &&
      (size_t)used == n) {
    *kind = 2;
    *rank = 2;
    shape[0] = a;
    shape[1] = b;
    return 1;
  }
  return 0;
}

static int on_get(hr_session *s, hr_srv_get *g, void *ud) {
  const hr_get_info *info = hr_srv_get_info(g);
  hr_descriptor d;
  hr_tensor *t;
  uint64_t shape[2] = {0, 0}, n, i;
  unsigned rank = 0;
  int kind = 0;
  float *v;

  (void)s;
  (void)ud;
  if (!parse_key((const char *)info->key, info->key_len, &rank, shape, &kind)) {
    hr_get_fail(g, HR_WIRE_NOT_FOUND,
                "keys are arange/N, eye/N and matrix/R/C");
    return 0;
  }
  n = rank == 1 ? shape[0] : shape[0] * shape[1];
  if ((rank == 2 && shape[1] && shape[0] > MAX_ELEMS / shape[1]) ||
      n > MAX_ELEMS) {
    hr_get_fail(g, HR_WIRE_RESOURCE_EXHAUSTED, "at most 2^26 elements");
    return 0;
  }
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_FLOAT32;
  d.rank = (uint8_t)rank;
  d.shape[0] = shape[0];
  d.shape[1] = shape[1];
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  d.buffers[0].size_bytes = n * 4;
  d.buffers[0].alignment_log2 = 6;
  if (hr_tensor_alloc(&t, &d, 6, NULL) != 0) {
    hr_get_fail(g, HR_WIRE_RESOURCE_EXHAUSTED, "out of memory");
    return 0;
  }
  v = hr_tensor_buffer(t, 0);
  for (i = 0; i < n; i++) {
    if (kind == 0 || kind == 2)
      v[i] = (float)i; /* row-major r * C + c is the flat index */
    else
      v[i] = (i / shape[1] == i % shape[1]) ? 1.0f : 0.0f;
  }
  hr_get_answer(g, t); /* the session takes its own reference */
  hr_tensor_unref(t);
  return 0;
}

static int on_list(hr_session *s, const hr_list_request *req,
                   int (*emit)(void *ctx, const hr_list_entry *e),
                   void *emit_ctx, int *more, void *ud) {
  size_t i;

  (void)s;
  (void)ud;
  *more = 0;
  for (i = 0; i < sizeof listed / sizeof *listed; i++) {
    const char *k = listed[i];
    size_t n = strlen(k);
    hr_list_entry e;
    int kind;
    unsigned rank;
    if (n < req->prefix_len || memcmp(k, req->prefix, req->prefix_len))
      continue;
    if (req->start_after_len &&
        strncmp(k, (const char *)req->start_after, req->start_after_len) <= 0)
      continue;
    memset(&e, 0, sizeof e);
    e.key = (const uint8_t *)k;
    e.key_len = (uint16_t)n;
    parse_key(k, n, &rank, e.shape, &kind);
    e.rank = (uint8_t)rank;
    e.element_type = HR_ELEM_FLOAT32;
    e.layout_tag = HR_LAYOUT_ROW_MAJOR;
    e.total_data_bytes = 4 * (rank == 1 ? e.shape[0] : e.shape[0] * e.shape[1]);
    if (emit(emit_ctx, &e) != 0) {
      *more = 1;
      break;
    }
  }
  return 0;
}

typedef struct server {
  struct event_base *base;
  hr_engine *engine;
} server;

static void on_closed(hr_engine *e, void *ud) {
  (void)e;
  event_base_loopbreak(((server *)ud)->base);
}

static void on_signal(evutil_socket_t sig, short what, void *ud) {
  server *sv = ud;

  (void)sig;
  (void)what;
  if (hr_engine_close(sv->engine, on_closed, sv) != 0)
    exit(1); /* a second signal: stop at once */
}

static void log_line(int level, const char *line, size_t len, void *ud) {
  (void)level;
  (void)ud;
  fprintf(stderr, "%.*s\n", (int)len, line);
}

int main(int argc, char **argv) {
  const char *addr = argc > 1 ? argv[1] : "127.0.0.1:0";
  const char *metrics_addr = argc > 2 ? argv[2] : NULL;
  hr_metrics *metrics = NULL;
  hr_ev_metrics *endpoint = NULL;
  hr_engine_config ecfg;
  hr_provider prov;
  hr_listener *l;
  struct event *sigint, *sigterm;
  server sv;
  int rv;

  signal(SIGPIPE, SIG_IGN);
  sv.base = event_base_new();
  hr_engine_config_default(&ecfg);
  if (metrics_addr) {
    /* The registry is ours; the engine feeds it through its callbacks. */
    hr_metrics_config mcfg;
    hr_metrics_config_default(&mcfg);
    mcfg.log = log_line;
    if (hr_metrics_new(&metrics, &mcfg, NULL) != 0 ||
        hr_metrics_attach(metrics, &ecfg) != 0)
      return 1;
  }
  rv = hr_ev_attach(&sv.engine, sv.base, &ecfg, NULL);
  if (rv) {
    fprintf(stderr, "tensor_server: %s\n", hr_strerror(rv));
    return 1;
  }
  memset(&prov, 0, sizeof prov);
  prov.size = sizeof prov;
  prov.on_get = on_get;
  prov.on_list = on_list;
  rv = hr_engine_listen(sv.engine, addr, &prov, &l);
  if (rv) {
    fprintf(stderr, "tensor_server: cannot listen on %s: %s\n", addr,
            hr_strerror(rv));
    return 1;
  }
  printf("listening on %.*s:%d\n", (int)(strrchr(addr, ':') - addr), addr,
         hr_listener_port(l));
  if (metrics_addr) {
    rv = hr_ev_metrics_listen(&endpoint, sv.base, metrics, sv.engine,
                              metrics_addr, NULL);
    if (rv) {
      fprintf(stderr, "tensor_server: cannot serve metrics on %s: %s\n",
              metrics_addr, hr_strerror(rv));
      return 1;
    }
    printf("metrics on %.*s:%d\n",
           (int)(strrchr(metrics_addr, ':') - metrics_addr), metrics_addr,
           hr_ev_metrics_port(endpoint));
  }
  fflush(stdout);
  sigint = evsignal_new(sv.base, SIGINT, on_signal, &sv);
  sigterm = evsignal_new(sv.base, SIGTERM, on_signal, &sv);
  evsignal_add(sigint, NULL);
  evsignal_add(sigterm, NULL);
  event_base_dispatch(sv.base);
  hr_ev_metrics_close(endpoint);
  rv = hr_engine_del(sv.engine);
  hr_metrics_del(metrics);
  event_free(sigint);
  event_free(sigterm);
  event_base_free(sv.base);
  return rv ? 1 : 0;
}
