/*
 * The libevent binding: hr_loop_ops on a host's event_base.
 *
 * One persistent event per watched fd (its flags follow the engine's
 * watch calls) and one timer event per engine.  Callbacks only translate
 * libevent's flags and call the engine's entry points; the engine may stop
 * watching an fd from inside its own callback, so nothing of the fd's
 * record is touched after the call.
 */
#include <hurray/hr_event.h>

#include <string.h>

#include "hr_internal.h"

typedef struct ev_binding {
  hr_mem mem;
  struct event_base *base;
  struct event *timer;
  hr_engine *engine;
} ev_binding;

/* The per-fd record, kept in the engine's fd_cookie slot. */
typedef struct ev_fd {
  struct event *ev;
  ev_binding *b;
  int events; /* HR_POLL_* the event is armed for */
} ev_fd;

static void on_fd(evutil_socket_t fd, short what, void *arg) {
  ev_fd *f = arg;
  hr_engine *e = f->b->engine;
  int revents = 0;

  if (what & EV_READ)
    revents |= HR_POLL_IN;
  if (what & EV_WRITE)
    revents |= HR_POLL_OUT;
  /* `f` may be freed from inside this call. */
  hr_engine_on_fd(e, (int)fd, revents);
}

static void on_timer(evutil_socket_t fd, short what, void *arg) {
  ev_binding *b = arg;

  (void)fd;
  (void)what;
  hr_engine_on_timeout(b->engine);
}

static short ev_flags(int events) {
  short f = EV_PERSIST;

  if (events & HR_POLL_IN)
    f |= EV_READ;
  if (events & HR_POLL_OUT)
    f |= EV_WRITE;
  return f;
}

static int ev_watch(void *loop_data, int fd, int events, void **cookie) {
  ev_binding *b = loop_data;
  ev_fd *f = *cookie;

  if (events == 0) {
    if (f) {
      event_free(f->ev); /* deletes it first, also while it runs */
      hr__mem_free(&b->mem, f);
      *cookie = NULL;
    }
    return 0;
  }
  if (!f) {
    f = hr__mem_calloc(&b->mem, 1, sizeof *f);
    if (!f)
      return HR_ERR_NOMEM;
    f->b = b;
    f->ev = event_new(b->base, fd, ev_flags(events), on_fd, f);
    if (!f->ev) {
      hr__mem_free(&b->mem, f);
      return HR_ERR_NOMEM;
    }
    *cookie = f;
  } else if (f->events != events) {
    event_del(f->ev);
    if (event_assign(f->ev, b->base, fd, ev_flags(events), on_fd, f) != 0)
      return HR_ERR_IO;
  } else {
    return 0;
  }
  if (event_add(f->ev, NULL) != 0)
    return HR_ERR_IO;
  f->events = events;
  return 0;
}

static int ev_timer(void *loop_data, int64_t ms) {
  ev_binding *b = loop_data;
  struct timeval tv;

  if (ms < 0)
    return event_del(b->timer) == 0 ? 0 : HR_ERR_IO;
  tv.tv_sec = (time_t)(ms / 1000);
  tv.tv_usec = (suseconds_t)((ms % 1000) * 1000);
  /* A zero timeout fires on the next loop turn, never from here. */
  return event_add(b->timer, &tv) == 0 ? 0 : HR_ERR_IO;
}

static void ev_release(void *loop_data) {
  ev_binding *b = loop_data;

  event_free(b->timer);
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
  b->timer = evtimer_new(base, on_timer, b);
  if (!b->timer) {
    hr__mem_free(mem, b);
    return HR_ERR_NOMEM;
  }
  memset(&ops, 0, sizeof ops);
  ops.size = sizeof ops;
  ops.watch = ev_watch;
  ops.timer = ev_timer;
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
