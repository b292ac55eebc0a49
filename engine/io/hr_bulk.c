/* Bulk I/O on the worker pool: see hr_bulk.h. */
#include "hr_bulk.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <hurray/session.h>

static uint64_t mono_ns(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Writes what is left of the iovecs after `done` bytes (the iovecs stay as
 * the loop gave them: its tap reads them afterwards). */
static ssize_t send_rest(hr__bulk *b) {
  struct iovec v[HR__BULK_IOV];
  struct msghdr mh;
  size_t skip = b->done;
  int i = 0, n = 0;

  while (i < b->niov && skip >= b->iov[i].iov_len)
    skip -= b->iov[i++].iov_len;
  for (; i < b->niov; i++) {
    v[n].iov_base = (uint8_t *)b->iov[i].iov_base + skip;
    v[n].iov_len = b->iov[i].iov_len - skip;
    skip = 0;
    n++;
  }
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = v;
  mh.msg_iovlen = (size_t)n;
  /* MSG_NOSIGNAL: a vanished peer gives EPIPE, not SIGPIPE. */
  return sendmsg(b->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void run(hr__job *j) {
  hr__bulk *b = (hr__bulk *)j;
  uint64_t start = mono_ns();

  pthread_mutex_lock(&b->mu);
  if (b->abort) {
    b->state = HR__BULK_FINISHED;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return;
  }
  b->state = HR__BULK_RUNNING;
  pthread_mutex_unlock(&b->mu);
  while (b->done < b->total && !__atomic_load_n(&b->abort, __ATOMIC_ACQUIRE)) {
    ssize_t n;
    if (b->dir == HR_IO_TX) {
      n = send_rest(b);
    } else {
      n = recv(b->fd, (uint8_t *)b->iov[0].iov_base + b->done,
               b->total - b->done, MSG_DONTWAIT);
      if (n == 0) {
        b->eof = 1;
        break;
      }
    }
    if (n > 0) {
      b->done += (size_t)n;
      continue;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      b->err = errno;
      break;
    }
    /* Would wait: other jobs may go first (the loop waits instead). */
    if (hr__pool_queued(b->pool))
      break;
    uint64_t spent = mono_ns() - start;
    if (spent >= HR__BULK_STALL_NS) {
      b->stalled = 1;
      break;
    }
    struct pollfd p[2] = {
        {b->fd, (short)(b->dir == HR_IO_TX ? POLLOUT : POLLIN), 0},
        {b->abort_fd, POLLIN, 0}};
    int ms = (int)((HR__BULK_STALL_NS - spent + 999999u) / 1000000u);
    /* Short naps: a job queued meanwhile is noticed within one. */
    if (ms > HR__BULK_NAP_MS)
      ms = HR__BULK_NAP_MS;
    if (poll(p, 2, ms) < 0 && errno != EINTR) {
      b->err = errno;
      break;
    }
    if (p[1].revents)
      break; /* stopped */
  }
  pthread_mutex_lock(&b->mu);
  b->state = HR__BULK_FINISHED;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

int hr__bulk_is(const hr__job *j) {
  return j->run == run;
}

int hr__bulk_init(hr__bulk *b, void *owner, hr__pool *pool) {
  memset(b, 0, sizeof *b);
  b->owner = owner;
  b->pool = pool;
  b->base.run = run;
  b->fd = -1;
  b->abort_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (b->abort_fd < 0)
    return HR_ERR_IO;
  if (pthread_mutex_init(&b->mu, NULL) != 0) {
    close(b->abort_fd);
    return HR_ERR_IO;
  }
  if (pthread_cond_init(&b->cv, NULL) != 0) {
    pthread_mutex_destroy(&b->mu);
    close(b->abort_fd);
    return HR_ERR_IO;
  }
  return 0;
}

void hr__bulk_fini(hr__bulk *b) {
  pthread_cond_destroy(&b->cv);
  pthread_mutex_destroy(&b->mu);
  close(b->abort_fd);
}

void hr__bulk_arm(hr__bulk *b, int dir, int fd) {
  uint64_t v;
  ssize_t n;

  /* A stop of the previous job may have left the eventfd readable. */
  do {
    n = read(b->abort_fd, &v, sizeof v);
  } while (n < 0 && errno == EINTR);
  b->dir = dir;
  b->fd = fd;
  b->done = 0;
  b->err = 0;
  b->eof = 0;
  b->stalled = 0;
  b->fenced = 0;
  pthread_mutex_lock(&b->mu);
  b->state = HR__BULK_QUEUED;
  __atomic_store_n(&b->abort, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&b->mu);
}

void hr__bulk_stop(hr__bulk *b) {
  uint64_t one = 1;
  ssize_t n;

  pthread_mutex_lock(&b->mu);
  if (b->state == HR__BULK_QUEUED || b->state == HR__BULK_RUNNING) {
    __atomic_store_n(&b->abort, 1, __ATOMIC_RELEASE);
    if (b->state == HR__BULK_RUNNING) {
      do {
        n = write(b->abort_fd, &one, sizeof one);
      } while (n < 0 && errno == EINTR);
      while (b->state == HR__BULK_RUNNING)
        pthread_cond_wait(&b->cv, &b->mu);
    }
  }
  pthread_mutex_unlock(&b->mu);
}

/* ---- How many jobs at once -------------------------------------------- */

unsigned hr__bulk_jobs_max(int setting, long cpus, int same_host) {
  long mine;

  if (setting > 0)
    return (unsigned)setting;
  mine = cpus < 1 ? 1 : cpus;
  if (same_host)
    mine /= 2;
  return mine > 1 ? (unsigned)(mine - 1) : 0;
}

static int v4_loopback(uint32_t be) {
  return (ntohl(be) >> 24) == 127;
}

int hr__bulk_same_host(const struct sockaddr *local,
                       const struct sockaddr *peer) {
  if (!local || !peer)
    return 0;
  if (peer->sa_family == AF_UNIX)
    return 1;
  if (peer->sa_family == AF_INET) {
    const struct sockaddr_in *p = (const struct sockaddr_in *)peer;
    const struct sockaddr_in *l = (const struct sockaddr_in *)local;
    if (v4_loopback(p->sin_addr.s_addr))
      return 1;
    return local->sa_family == AF_INET &&
           l->sin_addr.s_addr == p->sin_addr.s_addr;
  }
  if (peer->sa_family == AF_INET6) {
    const struct sockaddr_in6 *p = (const struct sockaddr_in6 *)peer;
    const struct sockaddr_in6 *l = (const struct sockaddr_in6 *)local;
    uint32_t v4;
    if (IN6_IS_ADDR_LOOPBACK(&p->sin6_addr))
      return 1;
    if (IN6_IS_ADDR_V4MAPPED(&p->sin6_addr)) {
      memcpy(&v4, &p->sin6_addr.s6_addr[12], sizeof v4);
      if (v4_loopback(v4))
        return 1;
    }
    return local->sa_family == AF_INET6 &&
           memcmp(&l->sin6_addr, &p->sin6_addr, sizeof p->sin6_addr) == 0;
  }
  return 0;
}

int hr__bulk_fd_same_host(int fd) {
  struct sockaddr_storage l, p;
  socklen_t ll = sizeof l, pl = sizeof p;

  if (getsockname(fd, (struct sockaddr *)&l, &ll) != 0 ||
      getpeername(fd, (struct sockaddr *)&p, &pl) != 0)
    return 0;
  return hr__bulk_same_host((const struct sockaddr *)&l,
                            (const struct sockaddr *)&p);
}
