/*
 * The libevent binding: hr_loop_ops on a host's event_base.
 *
 * Two persistent events per watched fd (reading, writing), added and
 * deleted as the engine's watch calls say, and one timer event per engine.
 * Callbacks only call the engine's entry points; the engine may stop
 * watching an fd from inside its own callback, so nothing of the fd's
 * record is touched after the call.
 *
 * Sub-millisecond deadlines (a fabric without a wait object polls every
 * 50 us while a transfer runs) go to a timerfd on Linux: libevent's epoll
 * backend rounds a timeout up to whole milliseconds unless the base was
 * made with EVENT_BASE_FLAG_PRECISE_TIMER, which is the application's
 * choice, so the 50 us naps became 1 ms ones (seen with strace on the shm
 * provider: epoll_wait(..., 1) between polls).
 */
#include <hurray/hr_event.h>

#include <string.h>

#ifdef __linux__
#include <sys/timerfd.h>
#include <unistd.h>
#endif

#include "hr_internal.h"

typedef struct ev_binding {
  hr_mem mem;
  struct event_base *base;
  struct event *timer;
  hr_engine *engine;
  int tfd;              /* timerfd for sub-millisecond deadlines, or -1 */
  struct event *tfd_ev; /* its read event (persistent) */
  int tfd_armed;
} ev_binding;

/* The per-fd record, kept in the engine's fd_cookie slot.  Reading and
 * writing are two events on the same fd, added and deleted on their own:
 * libevent then changes the epoll interest with one epoll_ctl(MOD)
 * instead of a DEL and an ADD, which matters on the bulk path where
 * HR_POLL_OUT comes and goes with every full socket buffer. */
typedef struct ev_fd {
  struct event *rd, *wr;
  ev_binding *b;
  int events; /* HR_POLL_* currently added */
} ev_fd;

static void on_readable(evutil_socket_t fd, short what, void *arg) {
  ev_fd *f = arg;

  (void)what;
  /* `f` may be freed from inside this call. */
  hr_engine_on_fd(f->b->engine, (int)fd, HR_POLL_IN);
}

static void on_writable(evutil_socket_t fd, short what, void *arg) {
  ev_fd *f = arg;

  (void)what;
  hr_engine_on_fd(f->b->engine, (int)fd, HR_POLL_OUT);
}

static void on_timer(evutil_socket_t fd, short what, void *arg) {
  ev_binding *b = arg;

  (void)fd;
  (void)what;
  hr_engine_on_timeout(b->engine);
}

#ifdef __linux__
static void on_tfd(evutil_socket_t fd, short what, void *arg) {
  ev_binding *b = arg;
  uint64_t ticks;

  (void)what;
  /* Clears the readiness.  A timer re-armed after it became readable
   * reads nothing (EAGAIN) and waits for its new deadline: the event is
   * not persistent, so it is added again. */
  if (read((int)fd, &ticks, sizeof ticks) != (ssize_t)sizeof ticks) {
    if (b->tfd_armed)
      (void)event_add(b->tfd_ev, NULL);
    return;
  }
  b->tfd_armed = 0;
  hr_engine_on_timeout(b->engine);
}

/* Disarms the timerfd (a no-op when it is not armed). */
static void tfd_disarm(ev_binding *b) {
  struct itimerspec its;

  if (b->tfd < 0 || !b->tfd_armed)
    return;
  memset(&its, 0, sizeof its);
  (void)timerfd_settime(b->tfd, 0, &its, NULL);
  (void)event_del(b->tfd_ev);
  b->tfd_armed = 0;
}

/* Arms the timerfd `ns` (1 to 999999) from now, opening it on first use.
 * Returns 0, or -1 where it cannot (the caller uses libevent's timer). */
static int tfd_arm(ev_binding *b, int64_t ns) {
  struct itimerspec its;

  if (b->tfd < 0) {
    int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (fd < 0)
      return -1;
    /* Not persistent, and added only while armed: an idle binding must
     * not keep event_base_dispatch() from returning. */
    b->tfd_ev = event_new(b->base, fd, EV_READ, on_tfd, b);
    if (!b->tfd_ev) {
      close(fd);
      return -1;
    }
    b->tfd = fd;
  }
  memset(&its, 0, sizeof its);
  its.it_value.tv_nsec = (long)ns;
  if (timerfd_settime(b->tfd, 0, &its, NULL) != 0)
    return -1;
  if (event_add(b->tfd_ev, NULL) != 0) {
    memset(&its, 0, sizeof its);
    (void)timerfd_settime(b->tfd, 0, &its, NULL);
    return -1;
  }
  b->tfd_armed = 1;
  return 0;
}
#endif

static void fd_free(ev_binding *b, ev_fd *f) {
  /* event_free() deletes first, also an event whose callback runs. */
  if (f->rd)
    event_free(f->rd);
  if (f->wr)
    event_free(f->wr);
  hr__mem_free(&b->mem, f);
}

/* Adds or deletes one of the two events to match `want`. */
static int toggle(struct event *ev, int want, int have) {
  if (want && !have)
    return event_add(ev, NULL) == 0 ? 0 : HR_ERR_IO;
  if (!want && have)
    return event_del(ev) == 0 ? 0 : HR_ERR_IO;
  return 0;
}

static int ev_watch(void *loop_data, int fd, int events, void **cookie) {
  ev_binding *b = loop_data;
  ev_fd *f = *cookie;
  int rv;

  if (events == 0) {
    if (f) {
      fd_free(b, f);
      *cookie = NULL;
    }
    return 0;
  }
  if (!f) {
    f = hr__mem_calloc(&b->mem, 1, sizeof *f);
    if (!f)
      return HR_ERR_NOMEM;
    f->b = b;
    f->rd = event_new(b->base, fd, EV_READ | EV_PERSIST, on_readable, f);
    f->wr = event_new(b->base, fd, EV_WRITE | EV_PERSIST, on_writable, f);
    if (!f->rd || !f->wr) {
      fd_free(b, f);
      return HR_ERR_NOMEM;
    }
    *cookie = f;
  }
  rv = toggle(f->rd, events & HR_POLL_IN, f->events & HR_POLL_IN);
  if (rv == 0)
    rv = toggle(f->wr, events & HR_POLL_OUT, f->events & HR_POLL_OUT);
  if (rv == 0)
    f->events = events;
  return rv;
}

static int ev_timer(void *loop_data, int64_t ms) {
  ev_binding *b = loop_data;
  struct timeval tv;

#ifdef __linux__
  tfd_disarm(b);
#endif
  if (ms < 0)
    return event_del(b->timer) == 0 ? 0 : HR_ERR_IO;
  tv.tv_sec = (time_t)(ms / 1000);
  tv.tv_usec = (suseconds_t)((ms % 1000) * 1000);
  /* A zero timeout fires on the next loop turn, never from here. */
  return event_add(b->timer, &tv) == 0 ? 0 : HR_ERR_IO;
}

static int ev_timer_ns(void *loop_data, int64_t ns) {
  ev_binding *b = loop_data;
  struct timeval tv;

#ifdef __linux__
  if (ns > 0 && ns < 1000000 && tfd_arm(b, ns) == 0)
    return event_del(b->timer) == 0 ? 0 : HR_ERR_IO;
  tfd_disarm(b);
#endif
  if (ns < 0)
    return event_del(b->timer) == 0 ? 0 : HR_ERR_IO;
  /* Microseconds, rounded up: libevent's resolution. */
  int64_t us = ns / 1000 + (ns % 1000 != 0);
  tv.tv_sec = (time_t)(us / 1000000);
  tv.tv_usec = (suseconds_t)(us % 1000000);
  return event_add(b->timer, &tv) == 0 ? 0 : HR_ERR_IO;
}

static void ev_release(void *loop_data) {
  ev_binding *b = loop_data;

  event_free(b->timer);
#ifdef __linux__
  if (b->tfd >= 0) {
    event_free(b->tfd_ev);
    close(b->tfd);
  }
#endif
  hr__mem_free(&b->mem, b);
}

int hr_ev_attach(hr_engine **out, struct event_base *base,
                 const hr_engine_config *cfg, const hr_mem *mem) {
  hr_loop_ops ops;
  ev_binding *b;
  int rv;

  if (!out || !base)
    return HR_ERR_INVALID_ARGUMENT;
  if (!mem)
    mem = hr_mem_default();
  b = hr__mem_calloc(mem, 1, sizeof *b);
  if (!b)
    return HR_ERR_NOMEM;
  b->mem = *mem;
  b->base = base;
  b->tfd = -1;
  b->timer = evtimer_new(base, on_timer, b);
  if (!b->timer) {
    hr__mem_free(mem, b);
    return HR_ERR_NOMEM;
  }
  memset(&ops, 0, sizeof ops);
  ops.size = sizeof ops;
  ops.watch = ev_watch;
  ops.timer = ev_timer;
  ops.timer_ns = ev_timer_ns;
  ops.release = ev_release;
  rv = hr_engine_new(&b->engine, &ops, b, cfg, mem);
  if (rv) {
    event_free(b->timer);
    hr__mem_free(mem, b);
    return rv;
  }
  *out = b->engine;
  return 0;
}
