/* The poll()-based loop of the blocking client: see hr_ploop.h. */
#include "hr_ploop.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <string.h>
#include <time.h>

#include "hr_internal.h"

/* A watched fd; the engine keeps the pointer in its fd_cookie slot. */
typedef struct pl_fd {
  int fd;
  int events;
  size_t index; /* position in l->fds */
} pl_fd;

struct hr__ploop {
  hr_mem mem;
  hr_engine *engine;
  pl_fd **fds;
  size_t n, cap;
  struct pollfd *pfd;
  size_t pfd_cap;
  hr_tstamp deadline; /* HR_TSTAMP_NEVER: no timer */
};

hr_tstamp hr__ploop_now(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (hr_tstamp)ts.tv_sec * 1000000000ull + (hr_tstamp)ts.tv_nsec;
}

static int pl_watch(void *loop_data, int fd, int events, void **cookie) {
  hr__ploop *l = loop_data;
  pl_fd *f = *cookie;

  if (events == 0) {
    if (f) {
      l->fds[f->index] = l->fds[--l->n];
      l->fds[f->index]->index = f->index;
      hr__mem_free(&l->mem, f);
      *cookie = NULL;
    }
    return 0;
  }
  if (!f) {
    if (l->n == l->cap) {
      size_t n = l->cap ? l->cap * 2 : 8;
      pl_fd **v = hr__mem_realloc(&l->mem, l->fds, n * sizeof *v);
      if (!v)
        return HR_ERR_NOMEM;
      l->fds = v;
      l->cap = n;
    }
    f = hr__mem_calloc(&l->mem, 1, sizeof *f);
    if (!f)
      return HR_ERR_NOMEM;
    f->fd = fd;
    f->index = l->n;
    l->fds[l->n++] = f;
    *cookie = f;
  }
  f->events = events;
  return 0;
}

static int pl_timer(void *loop_data, int64_t ms) {
  hr__ploop *l = loop_data;

  l->deadline =
      ms < 0 ? HR_TSTAMP_NEVER : hr__ploop_now() + (hr_tstamp)ms * 1000000ull;
  return 0;
}

static int pl_timer_ns(void *loop_data, int64_t ns) {
  hr__ploop *l = loop_data;

  l->deadline = ns < 0 ? HR_TSTAMP_NEVER : hr__ploop_now() + (hr_tstamp)ns;
  return 0;
}

void hr__ploop_ops(hr_loop_ops *ops) {
  memset(ops, 0, sizeof *ops);
  ops->size = sizeof *ops;
  ops->watch = pl_watch;
  ops->timer = pl_timer;
  ops->timer_ns = pl_timer_ns;
}

int hr__ploop_new(hr__ploop **out, const hr_mem *mem) {
  hr__ploop *l;

  if (!mem)
    mem = hr_mem_default();
  l = hr__mem_calloc(mem, 1, sizeof *l);
  if (!l)
    return HR_ERR_NOMEM;
  l->mem = *mem;
  l->deadline = HR_TSTAMP_NEVER;
  *out = l;
  return 0;
}

void hr__ploop_del(hr__ploop *l) {
  size_t i;

  if (!l)
    return;
  for (i = 0; i < l->n; i++)
    hr__mem_free(&l->mem, l->fds[i]);
  hr__mem_free(&l->mem, l->fds);
  hr__mem_free(&l->mem, l->pfd);
  hr__mem_free(&l->mem, l);
}

void hr__ploop_set_engine(hr__ploop *l, hr_engine *e) {
  l->engine = e;
}

int hr__ploop_step(hr__ploop *l, int max_ms) {
  hr_tstamp now = hr__ploop_now();
  size_t i, n = l->n;
  int rv;
  /* Nanoseconds (ppoll): the engine's timer may be shorter than 1 ms. */
  uint64_t wait = max_ms < 0 ? UINT64_MAX : (uint64_t)max_ms * 1000000u;
  struct timespec ts;

  if (l->deadline != HR_TSTAMP_NEVER) {
    uint64_t left = l->deadline > now ? l->deadline - now : 0;
    if (left < wait)
      wait = left;
  }
  ts.tv_sec = (time_t)(wait / 1000000000u);
  ts.tv_nsec = (long)(wait % 1000000000u);
  if (l->pfd_cap < n) {
    struct pollfd *p = hr__mem_realloc(&l->mem, l->pfd, n * sizeof *p);
    if (!p)
      return HR_ERR_NOMEM;
    l->pfd = p;
    l->pfd_cap = n;
  }
  /* A snapshot: callbacks below may change the watch set. */
  for (i = 0; i < n; i++) {
    l->pfd[i].fd = l->fds[i]->fd;
    l->pfd[i].events =
        (short)(((l->fds[i]->events & HR_POLL_IN) ? POLLIN : 0) |
                ((l->fds[i]->events & HR_POLL_OUT) ? POLLOUT : 0));
    l->pfd[i].revents = 0;
  }
  rv = ppoll(l->pfd, (nfds_t)n, wait == UINT64_MAX ? NULL : &ts, NULL);
  if (rv < 0 && errno != EINTR)
    return HR_ERR_IO;
  for (i = 0; rv > 0 && i < n; i++) {
    short re = l->pfd[i].revents;
    int ev = 0, r;
    if (!re || (re & POLLNVAL))
      continue; /* POLLNVAL: closed by an earlier callback of this step */
    if (re & (POLLIN | POLLHUP | POLLERR))
      ev |= HR_POLL_IN;
    if (re & (POLLOUT | POLLERR))
      ev |= HR_POLL_OUT;
    r = hr_engine_on_fd(l->engine, l->pfd[i].fd, ev);
    if (hr_err_is_fatal(r))
      return r;
  }
  if (l->deadline != HR_TSTAMP_NEVER && hr__ploop_now() >= l->deadline) {
    l->deadline = HR_TSTAMP_NEVER;
    rv = hr_engine_on_timeout(l->engine);
    if (hr_err_is_fatal(rv))
      return rv;
  }
  return 0;
}
