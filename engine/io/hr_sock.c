/* Socket helpers: see hr_sock.h. */
#include "hr_sock.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

void hr__why(char *why, size_t why_len, const char *what, int err) {
  if (why && why_len)
    snprintf(why, why_len, "%s: %s", what, strerror(err));
}

int hr__addr_parse(const char *text, int allow_scheme, hr__addr *out) {
  const char *p, *colon, *host;
  size_t host_len;
  char *end;
  unsigned long port;

  if (!text || !out)
    return HR_ERR_INVALID_ARGUMENT;
  memset(out, 0, sizeof *out);
  if (strncmp(text, "unix:", 5) == 0) {
    size_t n = strlen(text + 5);
    if (n == 0 || n > HR_SOCK_PATH_MAX)
      return HR_ERR_INVALID_ARGUMENT;
    memcpy(out->path, text + 5, n + 1);
    return 0;
  }
  p = text;
  if (strstr(p, "://")) {
    if (allow_scheme && strncmp(p, "hurray://", 9) == 0) {
      p += 9;
    } else if (allow_scheme && strncmp(p, "hurrays://", 10) == 0) {
      p += 10;
      out->tls = 1;
    } else {
      return HR_ERR_INVALID_ARGUMENT;
    }
  }
  if (*p == '[') {
    const char *close = strchr(p, ']');
    if (!close || close[1] != ':')
      return HR_ERR_INVALID_ARGUMENT;
    host = p + 1;
    host_len = (size_t)(close - host);
    colon = close + 1;
  } else {
    colon = strrchr(p, ':');
    if (!colon)
      return HR_ERR_INVALID_ARGUMENT;
    host = p;
    host_len = (size_t)(colon - p);
    /* An unbracketed IPv6 literal is ambiguous about its port. */
    if (memchr(host, ':', host_len))
      return HR_ERR_INVALID_ARGUMENT;
  }
  if (host_len == 0 || host_len >= sizeof out->host)
    return HR_ERR_INVALID_ARGUMENT;
  if (colon[1] < '0' || colon[1] > '9')
    return HR_ERR_INVALID_ARGUMENT;
  errno = 0;
  port = strtoul(colon + 1, &end, 10);
  /* A trailing '/' (an empty path) is tolerated in URLs. */
  if (errno || port > 65535 ||
      (*end && !(allow_scheme && strcmp(end, "/") == 0)))
    return HR_ERR_INVALID_ARGUMENT;
  memcpy(out->host, host, host_len);
  out->host[host_len] = '\0';
  out->port = (uint16_t)port;
  return 0;
}

static int resolve(const hr__addr *a, int flags, struct addrinfo **res,
                   char *why, size_t why_len) {
  struct addrinfo hints;
  char port[8];
  int rv;

  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | flags;
  snprintf(port, sizeof port, "%u", (unsigned)a->port);
  rv = getaddrinfo(a->host, port, &hints, res);
  if (rv == EAI_NONAME && (flags & AI_NUMERICHOST))
    return HR_ERR_WOULDBLOCK; /* a name: the caller looks it up */
  if (rv == EAI_MEMORY)
    return HR_ERR_NOMEM;
  if (rv != 0) {
    if (why && why_len)
      snprintf(why, why_len, "cannot resolve %s: %s", a->host,
               gai_strerror(rv));
    return HR_ERR_INVALID_ARGUMENT;
  }
  return 0;
}

int hr__sock_resolve(const hr__addr *a, int numeric_only,
                     struct addrinfo **res, char *why, size_t why_len) {
  return resolve(a, numeric_only ? AI_NUMERICHOST : 0, res, why, why_len);
}

/* A non-blocking, close-on-exec socket for `ai`, or -1 with *err set. */
static int ai_socket(const struct addrinfo *ai, int *err) {
  int fd = socket(ai->ai_family,
                  ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                  ai->ai_protocol);
  if (fd < 0)
    *err = errno;
  return fd;
}

/* Writes "cannot VERB HOST:PORT: strerror(err)" (or "... unix:PATH") into
 * `why`; returns HR_ERR_IO. */
static int sock_fail(const hr__addr *a, const char *verb, int err, char *why,
                     size_t why_len) {
  char what[HR_SOCK_HOST_MAX + HR_SOCK_PATH_MAX + 32];

  if (a->path[0])
    snprintf(what, sizeof what, "cannot %s unix:%s", verb, a->path);
  else
    snprintf(what, sizeof what, "cannot %s %s:%u", verb, a->host,
             (unsigned)a->port);
  hr__why(why, why_len, what, err);
  return HR_ERR_IO;
}

/* A non-blocking, close-on-exec Unix stream socket and the address of
 * a->path in *sun; -1 with *err set when there is no socket. */
static int unix_socket(const hr__addr *a, struct sockaddr_un *sun, int *err) {
  int fd;

  memset(sun, 0, sizeof *sun);
  sun->sun_family = AF_UNIX;
  /* hr__addr_parse() bounded the path below sizeof sun_path. */
  memcpy(sun->sun_path, a->path, strlen(a->path) + 1);
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    *err = errno;
  return fd;
}

/* Whether the socket file at `sun` is stale: a socket nobody accepts on.
 * A blocking connect to a Unix socket answers at once. */
static int unix_stale(const struct sockaddr_un *sun) {
  struct stat st;
  int fd, stale;

  if (lstat(sun->sun_path, &st) != 0 || !S_ISSOCK(st.st_mode))
    return 0;
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0;
  stale = connect(fd, (const struct sockaddr *)sun, sizeof *sun) != 0 &&
          errno == ECONNREFUSED;
  close(fd);
  return stale;
}

static int unix_listen(const hr__addr *a, char *why, size_t why_len) {
  struct sockaddr_un sun;
  int fd, err;

  fd = unix_socket(a, &sun, &err);
  if (fd < 0)
    goto fail;
  if (bind(fd, (struct sockaddr *)&sun, sizeof sun) != 0) {
    err = errno;
    /* EADDRINUSE stands unless the file is a socket nobody serves. */
    if (err != EADDRINUSE || !unix_stale(&sun))
      goto fail;
    if (unlink(sun.sun_path) != 0 ||
        bind(fd, (struct sockaddr *)&sun, sizeof sun) != 0) {
      err = errno;
      goto fail;
    }
  }
  if (listen(fd, 1024) != 0) {
    err = errno;
    unlink(sun.sun_path);
    goto fail;
  }
  return fd;
fail:
  if (fd >= 0)
    close(fd);
  return sock_fail(a, "listen on", err, why, why_len);
}

int hr__sock_listen(const hr__addr *a, char *why, size_t why_len) {
  struct addrinfo *res, *ai;
  int fd = -1, err = 0, one = 1, rv;

  if (a->path[0])
    return unix_listen(a, why, why_len);
  rv = resolve(a, AI_PASSIVE, &res, why, why_len);
  if (rv)
    return rv;
  for (ai = res; ai; ai = ai->ai_next) {
    fd = ai_socket(ai, &err);
    if (fd < 0)
      continue;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0)
      break;
    err = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0)
    return sock_fail(a, "listen on", err, why, why_len);
  return fd;
}

int hr__sock_local_port(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;

  if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
    return -1;
  if (ss.ss_family == AF_INET)
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
  if (ss.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return -1;
}

static int unix_connect(const hr__addr *a, int *in_progress, char *why,
                        size_t why_len) {
  struct sockaddr_un sun;
  int fd, err;

  fd = unix_socket(a, &sun, &err);
  if (fd < 0)
    goto fail;
  if (connect(fd, (struct sockaddr *)&sun, sizeof sun) == 0) {
    *in_progress = 0;
    return fd;
  }
  /* A full backlog makes a non-blocking Unix connect fail with EAGAIN;
   * that is as final as a refusal (there is nothing to wait on). */
  if (errno == EINPROGRESS) {
    *in_progress = 1;
    return fd;
  }
  err = errno;
  close(fd);
fail:
  return sock_fail(a, "connect to", err, why, why_len);
}

int hr__sock_connect_ai(const hr__addr *a, const struct addrinfo *res,
                        int *in_progress, struct sockaddr_storage *used,
                        socklen_t *used_len, const struct addrinfo **rest,
                        char *why, size_t why_len) {
  const struct addrinfo *ai;
  int fd = -1, err = 0;

  /* Non-blocking connects report failure later: this stops at the first
   * address that accepts the connect() call, and `rest` lets the caller
   * go on from there when that connect fails after all. */
  for (ai = res; ai; ai = ai->ai_next) {
    fd = ai_socket(ai, &err);
    if (fd < 0)
      continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      *in_progress = 0;
      break;
    }
    if (errno == EINPROGRESS) {
      *in_progress = 1;
      break;
    }
    err = errno;
    close(fd);
    fd = -1;
  }
  if (fd < 0)
    return sock_fail(a, "connect to", err, why, why_len);
  if (used && used_len && ai->ai_addrlen <= sizeof *used) {
    memcpy(used, ai->ai_addr, ai->ai_addrlen);
    *used_len = ai->ai_addrlen;
  }
  if (rest)
    *rest = ai->ai_next;
  return fd;
}

int hr__sock_connect(const hr__addr *a, int *in_progress, char *why,
                     size_t why_len) {
  struct addrinfo *res;
  int fd;

  if (a->path[0])
    return unix_connect(a, in_progress, why, why_len);
  fd = resolve(a, 0, &res, why, why_len);
  if (fd < 0)
    return fd;
  fd = hr__sock_connect_ai(a, res, in_progress, NULL, NULL, NULL, why,
                          why_len);
  freeaddrinfo(res);
  return fd;
}

int hr__sock_connect_result(int fd) {
  int err = 0;
  socklen_t len = sizeof err;

  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
    return errno;
  return err;
}

int hr__sock_is_unix(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;

  return getsockname(fd, (struct sockaddr *)&ss, &len) == 0 &&
         ss.ss_family == AF_UNIX;
}

int hr__sock_peer_cred(int fd, int32_t *pid, uint32_t *uid, uint32_t *gid) {
  struct ucred cr;
  socklen_t len = sizeof cr;

  if (!hr__sock_is_unix(fd))
    return HR_ERR_UNSUPPORTED;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 ||
      len != sizeof cr)
    return HR_ERR_IO;
  *pid = (int32_t)cr.pid;
  *uid = (uint32_t)cr.uid;
  *gid = (uint32_t)cr.gid;
  return 0;
}

void hr__sock_tune(int fd, int bufsize) {
  int one = 1;

  if (!hr__sock_is_unix(fd))
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (bufsize > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof bufsize);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof bufsize);
  }
}

void hr__sock_addr_name(const struct sockaddr_storage *ss, char *buf,
                        size_t cap) {
  char host[INET6_ADDRSTRLEN];

  if (!cap)
    return;
  buf[0] = 0;
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    if (inet_ntop(AF_INET, &a->sin_addr, host, sizeof host))
      snprintf(buf, cap, "%s:%u", host, (unsigned)ntohs(a->sin_port));
  } else if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    if (inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host))
      snprintf(buf, cap, "[%s]:%u", host, (unsigned)ntohs(a->sin6_port));
  }
}

void hr__sock_peer_name(int fd, char *buf, size_t cap) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  int32_t pid;
  uint32_t uid, gid;

  if (!cap)
    return;
  buf[0] = 0;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
    return;
  if (ss.ss_family == AF_UNIX) {
    /* A Unix peer is usually unnamed: its process says more. */
    if (hr__sock_peer_cred(fd, &pid, &uid, &gid) == 0)
      snprintf(buf, cap, "unix:pid=%ld", (long)pid);
    else
      snprintf(buf, cap, "unix");
  } else {
    hr__sock_addr_name(&ss, buf, cap);
  }
}
