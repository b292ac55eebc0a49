/* The test harness of tests/engine_io: see tl.h. */
#include "tl.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <hurray/hr_event.h>
#include <hurray/session.h>

#define CHECK(x)                                                               \
  do {                                                                         \
    if (!(x)) {                                                                \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x);    \
      abort();                                                                 \
    }                                                                          \
  } while (0)

static hr_tstamp now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (hr_tstamp)ts.tv_sec * 1000000000ull + (hr_tstamp)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* The epoll loop                                                            */
/* ------------------------------------------------------------------------ */

typedef struct tl_adapter tl_adapter;

/* One watched fd; freed only after the batch of events it may be in. */
typedef struct tl_fd {
  tl_adapter *a;
  int fd;
  int dead;
  struct tl_fd *next_dead;
} tl_fd;

struct tl_adapter {
  tl_env *env;
  hr_engine *e;
  hr_tstamp deadline;
  tl_adapter *next;
  hr_tstamp (*clock)(void *ud); /* tl_engine_clock() */
  void *clock_ud;
};

struct tl_env {
  int mode;
  int ep;
  tl_adapter *adapters;
  tl_fd *graveyard;
  struct event_base *base;
  struct event *tick;
};

static int ep_watch(void *ud, int fd, int events, void **cookie) {
  tl_adapter *a = ud;
  tl_fd *f = *cookie;
  struct epoll_event ev;

  if (events == 0) {
    if (f) {
      epoll_ctl(a->env->ep, EPOLL_CTL_DEL, fd, NULL);
      f->dead = 1;
      f->next_dead = a->env->graveyard;
      a->env->graveyard = f;
      *cookie = NULL;
    }
    return 0;
  }
  memset(&ev, 0, sizeof ev);
  if (events & HR_POLL_IN)
    ev.events |= EPOLLIN;
  if (events & HR_POLL_OUT)
    ev.events |= EPOLLOUT;
  if (!f) {
    f = calloc(1, sizeof *f);
    CHECK(f);
    f->a = a;
    f->fd = fd;
    ev.data.ptr = f;
    if (epoll_ctl(a->env->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
      free(f);
      return HR_ERR_IO;
    }
    *cookie = f;
    return 0;
  }
  ev.data.ptr = f;
  return epoll_ctl(a->env->ep, EPOLL_CTL_MOD, fd, &ev) == 0 ? 0 : HR_ERR_IO;
}

static int ep_timer(void *ud, int64_t ms) {
  tl_adapter *a = ud;
  a->deadline =
      ms < 0 ? HR_TSTAMP_NEVER : now_ns() + (hr_tstamp)ms * 1000000ull;
  return 0;
}

static void ep_release(void *ud) {
  tl_adapter *a = ud, **pp;
  for (pp = &a->env->adapters; *pp; pp = &(*pp)->next) {
    if (*pp == a) {
      *pp = a->next;
      break;
    }
  }
  free(a);
}

static void bury(tl_env *env) {
  while (env->graveyard) {
    tl_fd *f = env->graveyard;
    env->graveyard = f->next_dead;
    free(f);
  }
}

/* One epoll step of at most `max_ms`. */
static void ep_step(tl_env *env, int max_ms) {
  struct epoll_event evs[256];
  hr_tstamp now = now_ns(), next = HR_TSTAMP_NEVER;
  tl_adapter *a;
  int n, i, wait = max_ms;

  for (a = env->adapters; a; a = a->next)
    if (a->deadline < next)
      next = a->deadline;
  if (next != HR_TSTAMP_NEVER) {
    int64_t ms = next > now ? (int64_t)((next - now + 999999) / 1000000) : 0;
    if (ms < wait)
      wait = (int)ms;
  }
  n = epoll_wait(env->ep, evs, 256, wait);
  for (i = 0; i < n; i++) {
    tl_fd *f = evs[i].data.ptr;
    int re = 0;
    if (f->dead)
      continue;
    if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))
      re |= HR_POLL_IN;
    if (evs[i].events & (EPOLLOUT | EPOLLERR))
      re |= HR_POLL_OUT;
    CHECK(!hr_err_is_fatal(hr_engine_on_fd(f->a->e, f->fd, re)));
  }
  now = now_ns();
  for (a = env->adapters; a; a = a->next) {
    if (a->deadline <= now) {
      a->deadline = HR_TSTAMP_NEVER;
      CHECK(!hr_err_is_fatal(hr_engine_on_timeout(a->e)));
    }
  }
  bury(env);
}

/* ------------------------------------------------------------------------ */

static void on_tick(evutil_socket_t fd, short what, void *ud) {
  (void)fd;
  (void)what;
  (void)ud;
}

tl_env *tl_new(int mode) {
  tl_env *env = calloc(1, sizeof *env);
  CHECK(env);
  env->mode = mode;
  env->ep = -1;
  if (mode == TL_EPOLL) {
    env->ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(env->ep >= 0);
  } else {
    struct timeval tv = {0, 10000};
    env->base = event_base_new();
    CHECK(env->base);
    /* Wakes the loop regularly so tl_run can check its predicate. */
    env->tick = event_new(env->base, -1, EV_PERSIST, on_tick, NULL);
    event_add(env->tick, &tv);
  }
  return env;
}

void tl_free(tl_env *env) {
  CHECK(env->adapters == NULL);
  bury(env);
  if (env->ep >= 0)
    close(env->ep);
  if (env->tick)
    event_free(env->tick);
  if (env->base)
    event_base_free(env->base);
  free(env);
}

int tl_mode(const tl_env *env) {
  return env->mode;
}

static hr_tstamp ep_now(void *ud) {
  tl_adapter *a = ud;
  return a->clock(a->clock_ud);
}

static hr_engine *engine_on(tl_env *env, const hr_engine_config *cfg,
                            hr_tstamp (*clock)(void *ud), void *ud) {
  hr_engine *e = NULL;

  if (env->mode == TL_EPOLL) {
    hr_loop_ops ops;
    tl_adapter *a = calloc(1, sizeof *a);
    CHECK(a);
    a->env = env;
    a->deadline = HR_TSTAMP_NEVER;
    a->clock = clock;
    a->clock_ud = ud;
    memset(&ops, 0, sizeof ops);
    ops.size = sizeof ops;
    ops.watch = ep_watch;
    ops.timer = ep_timer;
    ops.release = ep_release;
    if (clock)
      ops.now = ep_now;
    a->next = env->adapters;
    env->adapters = a;
    CHECK(hr_engine_new(&e, &ops, a, cfg, NULL) == 0);
    a->e = e;
  } else {
    CHECK(!clock);
    CHECK(hr_ev_attach(&e, env->base, cfg, NULL) == 0);
  }
  return e;
}

hr_engine *tl_engine(tl_env *env, const hr_engine_config *cfg) {
  return engine_on(env, cfg, NULL, NULL);
}

hr_engine *tl_engine_clock(tl_env *env, const hr_engine_config *cfg,
                           hr_tstamp (*clock)(void *ud), void *ud) {
  CHECK(clock && env->mode == TL_EPOLL);
  return engine_on(env, cfg, clock, ud);
}

int tl_run(tl_env *env, int (*done)(void *), void *ud, int timeout_ms) {
  hr_tstamp end = now_ns() + (hr_tstamp)timeout_ms * 1000000ull;

  while (!done(ud)) {
    hr_tstamp now = now_ns();
    if (now >= end)
      return 0;
    if (env->mode == TL_EPOLL) {
      int64_t left = (int64_t)((end - now) / 1000000ull);
      ep_step(env, left > 10 ? 10 : (int)left + 1);
    } else {
      event_base_loop(env->base, EVLOOP_ONCE);
    }
  }
  return 1;
}

static int never(void *ud) {
  (void)ud;
  return 0;
}

void tl_spin(tl_env *env, int ms) {
  tl_run(env, never, NULL, ms);
}

typedef struct conns_at_most {
  hr_engine *e;
  size_t n;
} conns_at_most;

static int conns_down(void *ud) {
  conns_at_most *w = ud;
  return hr_engine_conn_count(w->e) <= w->n;
}

int tl_wait_conns(tl_env *env, hr_engine *e, size_t n) {
  conns_at_most w = {e, n};
  return tl_run(env, conns_down, &w, TL_WAIT_MS);
}

typedef struct closed_flag {
  int closed;
} closed_flag;

static void on_engine_closed(hr_engine *e, void *ud) {
  (void)e;
  ((closed_flag *)ud)->closed = 1;
}

static int is_closed(void *ud) {
  return ((closed_flag *)ud)->closed;
}

void tl_engine_finish(tl_env *env, hr_engine *e) {
  closed_flag f = {0};

  CHECK(hr_engine_close(e, on_engine_closed, &f) == 0);
  CHECK(tl_run(env, is_closed, &f, 10000));
  CHECK(hr_engine_del(e) == 0);
}

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */
/* ------------------------------------------------------------------------ */

hr_tensor *tl_tensor(uint8_t elem, uint8_t layout, unsigned rank,
                     const uint64_t *shape, const uint32_t *param,
                     uint32_t seed) {
  hr_descriptor d;
  hr_wire_status st;
  uint64_t sizes[HR_MAX_BUFFERS], k, n;
  hr_tensor *t;
  uint8_t *p;
  unsigned i;
  int nb;

  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = elem;
  d.rank = (uint8_t)rank;
  d.layout.tag = layout;
  for (i = 0; i < rank; i++)
    d.shape[i] = shape[i];
  if (layout == HR_LAYOUT_PERMUTED) {
    for (i = 0; i < rank; i++)
      d.params.order[i] = (uint8_t)(param ? param[i] : rank - 1 - i);
  } else if (layout == HR_LAYOUT_TILED) {
    for (i = 0; i < rank; i++)
      d.params.tile[i] = param ? param[i] : 2;
  } else if (layout == HR_LAYOUT_STRIDED) {
    /* Row-major strides with one spare element per row, dim 0 walked
     * backwards: negative strides and a non-zero origin. */
    int64_t s = 1;
    for (i = rank; i-- > 0;) {
      d.params.strides[i] = s;
      s *= (int64_t)shape[i] + (i == rank - 1 ? 1 : 0);
    }
    if (rank > 0 && shape[0] > 0) {
      d.params.origin = (uint64_t)d.params.strides[0] * (shape[0] - 1);
      d.params.strides[0] = -d.params.strides[0];
    }
  }
  d.buffer_count = 1;
  nb = hr_descriptor_buffer_sizes(&d, sizes, &st);
  CHECK(nb == 1);
  d.buffers[0].size_bytes = sizes[0];
  d.buffers[0].alignment_log2 = 6;
  CHECK(hr_tensor_alloc(&t, &d, 6, NULL) == 0);
  p = hr_tensor_buffer(t, 0);
  n = sizes[0];
  for (k = 0; k < n; k++)
    p[k] = tl_byte(seed, k);
  if (elem == HR_ELEM_BOOL)
    for (k = 0; k < n; k++)
      p[k] &= 1;
  return t;
}

hr_tensor *tl_dense(uint8_t elem, unsigned rank, const uint64_t *shape,
                    uint32_t seed) {
  return tl_tensor(elem, HR_LAYOUT_ROW_MAJOR, rank, shape, NULL, seed);
}

hr_tensor *tl_sparse(uint8_t layout, uint64_t r, uint64_t c, size_t nnz,
                     const uint32_t *rows, const uint32_t *cols,
                     const float *vals, int sorted) {
  hr_descriptor d;
  hr_wire_status st;
  uint64_t sizes[HR_MAX_BUFFERS];
  hr_tensor *t;
  uint32_t *ix;
  size_t i;

  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_FLOAT32;
  d.rank = 2;
  d.shape[0] = r;
  d.shape[1] = c;
  d.layout.tag = layout;
  d.params.nnz = nnz;
  d.params.index_type = HR_ELEM_INT32;
  d.params.sorted = (uint8_t)sorted;
  d.buffer_count = layout == HR_LAYOUT_SPARSE_COO ? 2 : 3;
  CHECK(hr_descriptor_buffer_sizes(&d, sizes, &st) == d.buffer_count);
  for (i = 0; i < d.buffer_count; i++) {
    d.buffers[i].size_bytes = sizes[i];
    d.buffers[i].alignment_log2 = 3;
  }
  CHECK(hr_tensor_alloc(&t, &d, 6, NULL) == 0);
  if (layout == HR_LAYOUT_SPARSE_COO) {
    ix = hr_tensor_buffer(t, 0);
    for (i = 0; i < nnz; i++) {
      ix[2 * i] = rows[i];
      ix[2 * i + 1] = cols[i];
    }
    memcpy(hr_tensor_buffer(t, 1), vals, nnz * sizeof *vals);
  } else {
    uint32_t *indptr = hr_tensor_buffer(t, 0);
    ix = hr_tensor_buffer(t, 1);
    memset(indptr, 0, (r + 1) * sizeof *indptr);
    for (i = 0; i < nnz; i++) {
      indptr[rows[i] + 1]++;
      ix[i] = cols[i];
    }
    for (i = 0; i < r; i++)
      indptr[i + 1] += indptr[i];
    memcpy(hr_tensor_buffer(t, 2), vals, nnz * sizeof *vals);
  }
  return t;
}

const uint8_t *tl_elem(const hr_descriptor *d, const void *buf,
                       const uint64_t *idx) {
  const uint8_t *b = buf;
  uint64_t esz = hr_elem_bits(d->element_type) / 8, off = 0, m;
  unsigned r = d->rank, k;

  switch (d->layout.tag) {
  case HR_LAYOUT_ROW_MAJOR:
    for (k = 0; k < r; k++)
      off = off * d->shape[k] + idx[k];
    break;
  case HR_LAYOUT_COLUMN_MAJOR:
    for (k = r; k-- > 0;)
      off = off * d->shape[k] + idx[k];
    break;
  case HR_LAYOUT_STRIDED: {
    int64_t o = (int64_t)d->params.origin;
    for (k = 0; k < r; k++)
      o += (int64_t)idx[k] * d->params.strides[k];
    off = (uint64_t)o;
    break;
  }
  case HR_LAYOUT_PERMUTED:
    for (k = 0; k < r; k++) {
      unsigned dim = d->params.order[k];
      off = off * d->shape[dim] + idx[dim];
    }
    break;
  case HR_LAYOUT_TILED: {
    uint64_t tiles = 0, inside = 0, vol = 1;
    for (k = 0; k < r; k++) {
      uint64_t t = d->params.tile[k];
      uint64_t nt = (d->shape[k] + t - 1) / t;
      tiles = tiles * nt + idx[k] / t;
      inside = inside * t + idx[k] % t;
      vol *= t;
    }
    off = tiles * vol + inside;
    break;
  }
  case HR_LAYOUT_PANEL: {
    hr_layout_profile pr;
    CHECK(hr_layout_profile_parse(&d->layout, &pr) == 0);
    m = pr.mr;
    off = (idx[0] / m) * (m * d->shape[1]) + idx[1] * m + idx[0] % m;
    break;
  }
  default: CHECK(0);
  }
  return b + off * esz;
}

int tl_same_elements(hr_tensor *ref, const uint64_t *offset, hr_tensor *got) {
  const hr_descriptor *rd = hr_tensor_descriptor(ref);
  const hr_descriptor *gd = hr_tensor_descriptor(got);
  uint64_t idx[HR_MAX_RANK], ridx[HR_MAX_RANK], total = 1, i;
  unsigned r = gd->rank, k;
  size_t esz = hr_elem_bits(rd->element_type) / 8;

  if (gd->element_type != rd->element_type || gd->rank != rd->rank) {
    fprintf(stderr, "type/rank differ: %s/%u vs %s/%u\n",
            hr_elem_type_name(gd->element_type), gd->rank,
            hr_elem_type_name(rd->element_type), rd->rank);
    return 0;
  }
  for (k = 0; k < r; k++)
    total *= gd->shape[k];
  memset(idx, 0, sizeof idx);
  for (i = 0; i < total; i++) {
    const uint8_t *a, *b;
    for (k = 0; k < r; k++)
      ridx[k] = idx[k] + (offset ? offset[k] : 0);
    a = tl_elem(rd, hr_tensor_buffer(ref, 0), ridx);
    b = tl_elem(gd, hr_tensor_buffer(got, 0), idx);
    if (memcmp(a, b, esz) != 0) {
      fprintf(stderr, "element %llu differs (%s vs %s)\n",
              (unsigned long long)i, hr_layout_name(gd->layout.tag),
              hr_layout_name(rd->layout.tag));
      return 0;
    }
    for (k = r; k-- > 0;) {
      if (++idx[k] < gd->shape[k])
        break;
      idx[k] = 0;
    }
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Raw peers                                                                 */
/* ------------------------------------------------------------------------ */

int tl_raw_connect(int port) {
  struct sockaddr_in sa;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

  if (fd < 0)
    return -1;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/* A TCP socket bound to a free loopback port (*port), listening when
 * `backlog` is not 0; -1 on failure. */
static int bound_loopback(int *port, int backlog) {
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  if (fd < 0)
    return -1;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      (backlog && listen(fd, backlog) != 0) ||
      getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(sa.sin_port);
  return fd;
}

int tl_raw_listen(int *port) {
  return bound_loopback(port, 16);
}

int tl_raw_dead_port(int *port) {
  return bound_loopback(port, 0);
}

int tl_raw_send(tl_env *env, int fd, const void *p, size_t n) {
  const uint8_t *b = p;

  while (n) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && errno == EAGAIN) {
      if (env)
        tl_spin(env, 1);
      else
        usleep(1000);
      continue;
    }
    if (w < 0)
      return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

int tl_raw_send_msg(tl_env *env, int fd, const hr_msg *m) {
  static uint8_t buf[70000];
  int64_t n = hr_wire_encode(m, buf, sizeof buf);

  CHECK(n > 0);
  return tl_raw_send(env, fd, buf, (size_t)n);
}

void tl_hello(hr_msg *m, int server) {
  static const uint8_t devs[1] = {HR_DEV_CPU};
  static const uint8_t mcs[1] = {HR_MEM_STANDARD};

  memset(m, 0, sizeof *m);
  m->hdr.type = server ? HR_MSG_SERVER_HELLO : HR_MSG_CLIENT_HELLO;
  m->u.hello.magic = HR_MAGIC;
  m->u.hello.version_major = 1;
  m->u.hello.version_minor = 0;
  m->u.hello.capability_flags =
      server ? (HR_CAP_TRANSCODING | HR_CAP_PARALLEL_STREAMS |
                HR_CAP_TENSOR_PUT | HR_CAP_LIST | HR_CAP_REGION_REQUESTS)
             : 0;
  m->u.hello.max_message_size = 16u << 20;
  m->u.hello.layout_count = 2;
  m->u.hello.layouts[0].tag = HR_LAYOUT_ROW_MAJOR;
  m->u.hello.layouts[1].tag = HR_LAYOUT_COLUMN_MAJOR;
  m->u.hello.device_count = 1;
  m->u.hello.devices = devs;
  m->u.hello.memory_class_count = 1;
  m->u.hello.memory_classes = mcs;
}

/* Waits for `fd` to be readable while running the loop.  Returns 1 when
 * readable, 0 on timeout. */
static int wait_readable(tl_env *env, int fd, hr_tstamp end) {
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 0) == 1)
      return 1;
    if (now_ns() >= end)
      return 0;
    if (env)
      tl_spin(env, 1);
    else
      poll(&p, 1, 1);
  }
}

static int read_exact(tl_env *env, int fd, uint8_t *p, size_t n,
                      hr_tstamp end) {
  while (n) {
    ssize_t r;
    if (!wait_readable(env, fd, end))
      return -1;
    r = recv(fd, p, n, MSG_DONTWAIT);
    if (r == 0)
      return 0;
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR)
        continue;
      return 0; /* a reset counts as the end */
    }
    p += r;
    n -= (size_t)r;
  }
  return 1;
}

int64_t tl_raw_read_msg(tl_env *env, int fd, uint8_t *buf, size_t cap,
                        int timeout_ms) {
  hr_tstamp end = now_ns() + (hr_tstamp)timeout_ms * 1000000ull;
  hr_msg_header h;
  int r;

  r = read_exact(env, fd, buf, HR_HEADER_SIZE, end);
  if (r <= 0)
    return r;
  hr_wire_parse_header(buf, &h);
  if (h.payload_length > cap - HR_HEADER_SIZE) {
    /* Too big for the caller: skip the payload (bulk data). */
    uint64_t left = h.payload_length;
    while (left) {
      size_t k =
          left > cap - HR_HEADER_SIZE ? cap - HR_HEADER_SIZE : (size_t)left;
      r = read_exact(env, fd, buf + HR_HEADER_SIZE, k, end);
      if (r <= 0)
        return r;
      left -= k;
    }
    return -2;
  }
  r = read_exact(env, fd, buf + HR_HEADER_SIZE, h.payload_length, end);
  if (r <= 0)
    return r;
  return HR_HEADER_SIZE + h.payload_length;
}

int tl_raw_wait_eof(tl_env *env, int fd, int timeout_ms) {
  hr_tstamp end = now_ns() + (hr_tstamp)timeout_ms * 1000000ull;
  uint8_t sink[65536];

  for (;;) {
    ssize_t r;
    if (!wait_readable(env, fd, end))
      return 0;
    r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
      return 1;
  }
}

int tl_raw_expect(tl_env *env, int fd, uint32_t type, uint32_t stream,
                  uint8_t *buf, size_t cap, hr_msg *m, int timeout_ms) {
  for (;;) {
    int64_t n = tl_raw_read_msg(env, fd, buf, cap, timeout_ms);
    hr_wire_status st;
    hr_msg_header h;
    if (n == -2)
      continue; /* a payload too big to keep: not what we wait for */
    if (n <= 0)
      return 0;
    hr_wire_parse_header(buf, &h);
    if (h.type != type || (stream != UINT32_MAX && h.stream_id != stream))
      continue;
    CHECK(hr_wire_decode(buf, (size_t)n, NULL, m, &st) == 0);
    return 1;
  }
}

/* ------------------------------------------------------------------------ */
/* Servers                                                                   */
/* ------------------------------------------------------------------------ */

void tl_server_start(tl_env *env, tl_server *s, const hr_engine_config *ecfg,
                     const hr_store_config *scfg) {
  hr_store_config sc;
  hr_provider prov;

  memset(s, 0, sizeof *s);
  if (!scfg) {
    hr_store_config_default(&sc);
    sc.allow_put = 1;
    scfg = &sc;
  }
  CHECK(hr_store_new(&s->store, scfg, NULL) == 0);
  s->e = tl_engine(env, ecfg);
  hr_store_provider(s->store, &prov);
  CHECK(hr_engine_listen(s->e, "127.0.0.1:0", &prov, &s->lis) == 0);
  s->port = hr_listener_port(s->lis);
  CHECK(s->port > 0);
  snprintf(s->url, sizeof s->url, "hurray://127.0.0.1:%d", s->port);
}

void tl_server_stop(tl_env *env, tl_server *s) {
  tl_engine_finish(env, s->e);
  hr_store_del(s->store);
  memset(s, 0, sizeof *s);
}

void tl_put(tl_server *s, const char *key, hr_tensor *t) {
  CHECK(hr_store_put(s->store, key, strlen(key), t, HR_PUT_REPLACE) == 0);
}
