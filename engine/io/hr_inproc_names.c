/* The names of "inproc:NAME" listeners: see hr_inproc_names.h. */
#include "hr_inproc_names.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hr_internal.h"
#include "hr_sock.h"

struct hr__inproc_name {
  hr__inproc_name *next;
  int fd; /* the hand-over socket's sending end, or -1: a hub server */
  char name[HR__INPROC_NAME_MAX + 1];
};

int hr__inproc_names_init(hr__inproc_names *n, const hr_mem *mem) {
  memset(n, 0, sizeof *n);
  n->mem = mem ? *mem : *hr_mem_default();
  return pthread_mutex_init(&n->mu, NULL) == 0 ? 0 : HR_ERR_IO;
}

void hr__inproc_names_fini(hr__inproc_names *n) {
  hr__inproc_name *x;

  while ((x = n->head)) {
    n->head = x->next;
    if (x->fd >= 0)
      close(x->fd);
    hr__mem_free(&n->mem, x);
  }
  pthread_mutex_destroy(&n->mu);
}

size_t hr__inproc_names_count(hr__inproc_names *n) {
  size_t c;

  pthread_mutex_lock(&n->mu);
  c = n->count;
  pthread_mutex_unlock(&n->mu);
  return c;
}

/* The entry called `name` (the lock held), or NULL. */
static hr__inproc_name *find(hr__inproc_names *n, const char *name) {
  hr__inproc_name *x;

  for (x = n->head; x; x = x->next)
    if (strcmp(x->name, name) == 0)
      return x;
  return NULL;
}

static int name_ok(const char *name) {
  size_t len = name ? strnlen(name, HR__INPROC_NAME_MAX + 1) : 0;

  return len >= 1 && len <= HR__INPROC_NAME_MAX;
}

int hr__inproc_names_bind(hr__inproc_names *n, const char *name, int fd) {
  hr__inproc_name *x;
  int rv = 0;

  if (!name_ok(name)) {
    rv = HR_ERR_INVALID_ARGUMENT;
    goto out;
  }
  x = hr__mem_calloc(&n->mem, 1, sizeof *x);
  if (!x) {
    rv = HR_ERR_NOMEM;
    goto out;
  }
  x->fd = fd;
  memcpy(x->name, name, strlen(name) + 1);
  pthread_mutex_lock(&n->mu);
  if (find(n, name)) {
    rv = HR_ERR_BUSY;
  } else {
    x->next = n->head;
    n->head = x;
    n->count++;
  }
  pthread_mutex_unlock(&n->mu);
  if (rv == 0)
    return 0;
  hr__mem_free(&n->mem, x);
out:
  if (fd >= 0)
    close(fd);
  return rv;
}

void hr__inproc_names_unbind(hr__inproc_names *n, const char *name) {
  hr__inproc_name **pp, *x = NULL;

  pthread_mutex_lock(&n->mu);
  for (pp = &n->head; *pp; pp = &(*pp)->next) {
    if (strcmp((*pp)->name, name) == 0) {
      x = *pp;
      *pp = x->next;
      n->count--;
      break;
    }
  }
  pthread_mutex_unlock(&n->mu);
  if (!x)
    return;
  /* Closed after the lock: no connect can hold this descriptor now. */
  if (x->fd >= 0)
    close(x->fd);
  hr__mem_free(&n->mem, x);
}

int hr__inproc_handover_pair(int *rx, int *tx) {
  int sv[2];

  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                 sv) != 0)
    return HR_ERR_IO;
  /* One way only: connects write, the listener reads. */
  if (shutdown(sv[0], SHUT_WR) != 0 || shutdown(sv[1], SHUT_RD) != 0) {
    close(sv[0]);
    close(sv[1]);
    return HR_ERR_IO;
  }
  *rx = sv[0];
  *tx = sv[1];
  return 0;
}

int hr__inproc_accept(int rx) {
  union {
    struct cmsghdr h;
    char b[CMSG_SPACE(sizeof(int))];
  } ctl;
  struct msghdr m;
  struct cmsghdr *h;
  struct iovec iov;
  char byte;
  ssize_t got;
  int fd = -1;

  for (;;) {
    memset(&m, 0, sizeof m);
    iov.iov_base = &byte;
    iov.iov_len = 1;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.b;
    m.msg_controllen = sizeof ctl.b;
    got = recvmsg(rx, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return errno == EAGAIN || errno == EWOULDBLOCK ? HR_ERR_WOULDBLOCK
                                                     : HR_ERR_IO;
    if (got == 0 && m.msg_controllen == 0)
      return HR_ERR_WOULDBLOCK; /* the table's end closed, nothing left */
    for (h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
      if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
          h->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(&fd, CMSG_DATA(h), sizeof fd);
    if (fd >= 0)
      break;
    /* A message without a descriptor (MSG_CTRUNC: we are out of them, and
     * the kernel closed it): that client sees its connection close. */
    if (m.msg_flags & MSG_CTRUNC)
      return HR_ERR_IO;
  }
  /* The connect made it non-blocking, a status flag of the open file
   * that travels with it; set again should a descriptor come otherwise
   * (the engine must never block on a socket). */
  {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK))) {
      close(fd);
      return HR_ERR_IO;
    }
  }
  return fd;
}

int hr__inproc_connect(hr__inproc_names *n, const char *name, char *why,
                       size_t why_len) {
  union {
    struct cmsghdr h;
    char b[CMSG_SPACE(sizeof(int))];
  } ctl;
  struct msghdr m;
  struct cmsghdr *h;
  struct iovec iov;
  hr__inproc_name *x;
  char byte = 0;
  ssize_t sent;
  int sv[2], rv, err = 0;

  if (!name_ok(name)) {
    hr__why(why, why_len, "inproc: bad name", EINVAL);
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                 sv) != 0) {
    hr__why(why, why_len, "inproc: socketpair", errno);
    return HR_ERR_IO;
  }
  memset(&m, 0, sizeof m);
  memset(&ctl, 0, sizeof ctl);
  iov.iov_base = &byte;
  iov.iov_len = 1;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl.b;
  m.msg_controllen = sizeof ctl.b;
  h = CMSG_FIRSTHDR(&m);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(h), &sv[1], sizeof sv[1]);
  pthread_mutex_lock(&n->mu);
  x = find(n, name);
  if (!x) {
    rv = HR_ERR_NOT_FOUND;
  } else if (x->fd < 0) {
    rv = HR_ERR_UNSUPPORTED;
  } else {
    do {
      sent = sendmsg(x->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    err = sent < 0 ? errno : 0;
    rv = sent < 0 ? (err == EAGAIN || err == EWOULDBLOCK ? HR_ERR_WOULDBLOCK
                                                         : HR_ERR_IO)
                  : 0;
  }
  pthread_mutex_unlock(&n->mu);
  /* Ours to close in any case: the listener got its own copy. */
  close(sv[1]);
  if (rv) {
    close(sv[0]);
    if (why && why_len) {
      if (rv == HR_ERR_NOT_FOUND)
        snprintf(why, why_len, "inproc:%s: no such listener", name);
      else if (rv == HR_ERR_UNSUPPORTED)
        snprintf(why, why_len,
                 "inproc:%s: a hub server (use hr_inproc_connect())", name);
      else if (rv == HR_ERR_WOULDBLOCK)
        snprintf(why, why_len, "inproc:%s: too many connections waiting",
                 name);
      else
        hr__why(why, why_len, "inproc: sendmsg", err);
    }
    return rv;
  }
  return sv[0];
}
