/*
 * Example 1: the hurray client embedded in a plain epoll loop.
 *
 *   epoll_client hurray://127.0.0.1:7474 KEY
 *
 * The host owns the loop: it implements hr_loop_ops with epoll (readiness)
 * and a timerfd (the engine's single timer), calls hr_engine_on_fd() and
 * hr_engine_on_timeout() when they fire, and keeps doing its own work in
 * between.  The engine never blocks and never creates a thread for I/O.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <hurray/engine.h>

/* ---- the host's loop ---------------------------------------------------- */

typedef struct host_loop {
  int ep;  /* epoll instance */
  int tfd; /* timerfd for the engine's timer */
  hr_engine *engine;
  int done; /* set by the application when it wants to stop */
} host_loop;

/* The fd cookie is unused here: epoll keeps the fd itself in its event
 * data, and EPOLL_CTL_MOD/ADD/DEL tell apart the three cases. */
static int loop_watch(void *ud, int fd, int events, void **cookie) {
  host_loop *l = ud;
  struct epoll_event ev;

  memset(&ev, 0, sizeof ev);
  ev.data.fd = fd;
  if (events & HR_POLL_IN)
    ev.events |= EPOLLIN;
  if (events & HR_POLL_OUT)
    ev.events |= EPOLLOUT;
  if (events == 0) {
    *cookie = NULL;
    return epoll_ctl(l->ep, EPOLL_CTL_DEL, fd, NULL) == 0 ? 0 : HR_ERR_IO;
  }
  if (*cookie == NULL) {
    *cookie = l; /* any non-NULL value: "registered" */
    return epoll_ctl(l->ep, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : HR_ERR_IO;
  }
  return epoll_ctl(l->ep, EPOLL_CTL_MOD, fd, &ev) == 0 ? 0 : HR_ERR_IO;
}

static int loop_timer(void *ud, int64_t ms) {
  host_loop *l = ud;
  struct itimerspec its;

  memset(&its, 0, sizeof its);
  if (ms >= 0) {
    /* A zero it_value disarms a timerfd: use 1 ns for "next turn". */
    its.it_value.tv_sec = ms / 1000;
    its.it_value.tv_nsec = (ms % 1000) * 1000000L;
    if (ms == 0)
      its.it_value.tv_nsec = 1;
  }
  return timerfd_settime(l->tfd, 0, &its, NULL) == 0 ? 0 : HR_ERR_IO;
}

static void loop_run(host_loop *l) {
  struct epoll_event evs[64];

  while (!l->done) {
    int n = epoll_wait(l->ep, evs, 64, -1), i;
    if (n < 0 && errno == EINTR)
      continue;
    for (i = 0; i < n; i++) {
      int fd = evs[i].data.fd, re = 0;
      if (fd == l->tfd) {
        uint64_t expirations;
        if (read(l->tfd, &expirations, sizeof expirations) > 0)
          hr_engine_on_timeout(l->engine);
        continue;
      }
      if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
        re |= HR_POLL_IN;
      if (evs[i].events & (EPOLLOUT | EPOLLERR))
        re |= HR_POLL_OUT;
      hr_engine_on_fd(l->engine, fd, re);
    }
  }
}

/* ---- the application ---------------------------------------------------- */

typedef struct app {
  host_loop *loop;
  const char *key;
  hr_conn *conn;
  int status;
} app;

static void on_tensor(hr_session *s, uint32_t stream_id, hr_tensor *t,
                      const hr_transfer_record *rec, void *ud) {
  app *a = ud;
  const hr_descriptor *d;
  unsigned k;

  (void)s;
  (void)stream_id;
  if (!t) {
    fprintf(stderr, "epoll_client: GET %s failed: %s%s%s\n", a->key,
            rec->wire_error ? hr_wire_error_name(rec->wire_error)
                            : hr_strerror(rec->status),
            rec->message[0] ? ": " : "", rec->message);
    a->status = 1;
  } else {
    d = hr_tensor_descriptor(t);
    printf("%s: %s [", a->key, hr_elem_type_name(d->element_type));
    for (k = 0; k < d->rank; k++)
      printf("%s%llu", k ? ", " : "", (unsigned long long)d->shape[k]);
    printf("] %s, %llu bytes in %.3f ms\n", hr_layout_name(d->layout.tag),
           (unsigned long long)hr_tensor_bytes(t),
           (double)(rec->finished - rec->started) / 1e6);
    hr_tensor_unref(t);
  }
  /* Done: close gracefully; the close callback ends the loop. */
  hr_conn_close(a->conn);
}

static void on_conn(hr_conn *c, int status, void *ud) {
  app *a = ud;
  hr_get_opts o;

  if (status == 0) {
    /* Established: ask for the tensor (flushed when this returns). */
    memset(&o, 0, sizeof o);
    o.key = (const uint8_t *)a->key;
    o.key_len = (uint16_t)strlen(a->key);
    o.max_shards = 1;
    if (hr_session_get(hr_conn_session(c), &o, on_tensor, a, NULL) != 0) {
      a->status = 1;
      hr_conn_close(c);
    }
    return;
  }
  if (status != HR_ERR_CLOSED) {
    const char *msg;
    hr_conn_error(c, NULL, NULL, &msg);
    fprintf(stderr, "epoll_client: connection: %s%s%s\n", hr_strerror(status),
            msg[0] ? ": " : "", msg);
    a->status = 1;
  }
  a->loop->done = 1;
}

int main(int argc, char **argv) {
  host_loop loop;
  hr_loop_ops ops;
  app a;
  int rv;

  if (argc != 3) {
    fprintf(stderr, "usage: %s hurray://HOST:PORT KEY\n", argv[0]);
    return 2;
  }
  memset(&loop, 0, sizeof loop);
  loop.ep = epoll_create1(EPOLL_CLOEXEC);
  loop.tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (loop.ep < 0 || loop.tfd < 0) {
    perror("epoll/timerfd");
    return 1;
  }
  {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.fd = loop.tfd;
    epoll_ctl(loop.ep, EPOLL_CTL_ADD, loop.tfd, &ev);
  }
  memset(&ops, 0, sizeof ops);
  ops.size = sizeof ops;
  ops.watch = loop_watch;
  ops.timer = loop_timer;
  rv = hr_engine_new(&loop.engine, &ops, &loop, NULL, NULL);
  if (rv) {
    fprintf(stderr, "epoll_client: %s\n", hr_strerror(rv));
    return 1;
  }
  memset(&a, 0, sizeof a);
  a.loop = &loop;
  a.key = argv[2];
  rv = hr_engine_connect(loop.engine, argv[1], NULL, on_conn, &a, &a.conn);
  if (rv) {
    fprintf(stderr, "epoll_client: cannot connect to %s: %s\n", argv[1],
            hr_strerror(rv));
    hr_engine_del(loop.engine);
    return 1;
  }
  loop_run(&loop);
  rv = hr_engine_del(loop.engine);
  if (rv)
    fprintf(stderr, "epoll_client: engine still busy: %s\n", hr_strerror(rv));
  close(loop.tfd);
  close(loop.ep);
  return a.status || rv;
}
