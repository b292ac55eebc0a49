/*
 * The metrics endpoint: GET /metrics over libevent's evhttp, on the same
 * event_base (and thread) as the engine, so the registry needs no lock.
 */
#include <hurray/hr_event.h>
#include <hurray/metrics.h>

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "hr_internal.h"

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define REQUEST_TIMEOUT_S 10

struct hr_ev_metrics {
  hr_mem mem;
  struct evhttp *http;
  hr_metrics *m;
  const hr_engine *engine;
  int port;
};

static int to_evbuffer(const char *text, size_t len, void *ud) {
  return evbuffer_add(ud, text, len) == 0 ? 0 : -1;
}

static void on_request(struct evhttp_request *req, void *arg) {
  hr_ev_metrics *s = arg;
  const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
  const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
  enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  struct evbuffer *body;

  if (!path || strcmp(path, "/metrics") != 0) {
    evhttp_send_error(req, HTTP_NOTFOUND, "only /metrics is served here");
    return;
  }
  if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
    evhttp_add_header(h, "Allow", "GET, HEAD");
    evhttp_send_error(req, HTTP_BADMETHOD, NULL);
    return;
  }
  body = evbuffer_new();
  if (!body) {
    evhttp_send_error(req, HTTP_SERVUNAVAIL, "out of memory");
    return;
  }
  if (s->engine)
    hr_metrics_sample(s->m, s->engine);
  if (hr_metrics_render(s->m, to_evbuffer, body) != 0) {
    evbuffer_free(body);
    evhttp_send_error(req, HTTP_INTERNAL, "rendering failed");
    return;
  }
  evhttp_add_header(h, "Content-Type", CONTENT_TYPE);
  evhttp_send_reply(req, HTTP_OK, "OK", body);
  evbuffer_free(body);
}

/* "HOST:PORT" or "[v6]:PORT" into host (brackets removed) and port. */
static int split_addr(const char *addr, char *host, size_t cap,
                      unsigned *port) {
  const char *colon, *h = addr;
  size_t hl;
  char *end;
  unsigned long p;

  colon = strrchr(addr, ':');
  if (!colon || !colon[1])
    return HR_ERR_INVALID_ARGUMENT;
  hl = (size_t)(colon - addr);
  if (hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']') {
    h = addr + 1;
    hl -= 2;
  } else if (memchr(addr, ':', hl)) {
    return HR_ERR_INVALID_ARGUMENT; /* a v6 address needs brackets */
  }
  if (hl == 0 || hl >= cap)
    return HR_ERR_INVALID_ARGUMENT;
  memcpy(host, h, hl);
  host[hl] = 0;
  errno = 0;
  p = strtoul(colon + 1, &end, 10);
  if (*end || errno || p > 65535 || colon[1] < '0' || colon[1] > '9')
    return HR_ERR_INVALID_ARGUMENT;
  *port = (unsigned)p;
  return 0;
}

int hr_ev_metrics_listen(hr_ev_metrics **out, struct event_base *base,
                         hr_metrics *m, const hr_engine *engine,
                         const char *addr, const hr_mem *mem) {
  struct evhttp_bound_socket *bs;
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char host[256];
  unsigned port;
  hr_ev_metrics *s;
  int rv;

  if (!out || !base || !m || !addr)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  rv = split_addr(addr, host, sizeof host, &port);
  if (rv)
    return rv;
  if (!mem)
    mem = hr_mem_default();
  s = hr__mem_calloc(mem, 1, sizeof *s);
  if (!s)
    return HR_ERR_NOMEM;
  s->mem = *mem;
  s->m = m;
  s->engine = engine;
  s->http = evhttp_new(base);
  if (!s->http) {
    hr__mem_free(mem, s);
    return HR_ERR_NOMEM;
  }
  /* Every method reaches on_request, which answers 405 with an Allow
   * header (evhttp's own answer to a method it filters is 501). */
  evhttp_set_allowed_methods(
      s->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
                   EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
                   EVHTTP_REQ_PATCH | EVHTTP_REQ_TRACE);
  evhttp_set_timeout(s->http, REQUEST_TIMEOUT_S);
  evhttp_set_max_headers_size(s->http, 16384);
  evhttp_set_max_body_size(s->http, 4096);
  evhttp_set_gencb(s->http, on_request, s);
  bs = evhttp_bind_socket_with_handle(s->http, host, (ev_uint16_t)port);
  if (!bs) {
    int err = errno;
    evhttp_free(s->http);
    hr__mem_free(mem, s);
    errno = err;
    return HR_ERR_IO;
  }
  if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss,
                  &len) == 0) {
    if (ss.ss_family == AF_INET)
      s->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6)
      s->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  }
  *out = s;
  return 0;
}

int hr_ev_metrics_port(const hr_ev_metrics *s) {
  return s ? s->port : -1;
}

void hr_ev_metrics_close(hr_ev_metrics *s) {
  if (!s)
    return;
  evhttp_free(s->http);
  hr__mem_free(&s->mem, s);
}
