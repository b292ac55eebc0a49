/* Socket helpers: see hr_sock.h. */
#include "hr_sock.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
  p = text;
  if (strstr(p, "://")) {
    if (!allow_scheme || strncmp(p, "hurray://", 9) != 0)
      return HR_ERR_INVALID_ARGUMENT;
    p += 9;
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

static int resolve(const hr__addr *a, int passive, struct addrinfo **res,
                   char *why, size_t why_len) {
  struct addrinfo hints;
  char port[8];
  int rv;

  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  snprintf(port, sizeof port, "%u", (unsigned)a->port);
  rv = getaddrinfo(a->host, port, &hints, res);
  if (rv != 0) {
    if (why && why_len)
      snprintf(why, why_len, "cannot resolve %s: %s", a->host,
               gai_strerror(rv));
    return HR_ERR_INVALID_ARGUMENT;
  }
  return 0;
}

int hr__sock_listen(const hr__addr *a, char *why, size_t why_len) {
  struct addrinfo *res, *ai;
  int fd = -1, err = 0, one = 1, rv;

  rv = resolve(a, 1, &res, why, why_len);
  if (rv)
    return rv;
  for (ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0)
      break;
    err = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    char what[HR_SOCK_HOST_MAX + 32];
    snprintf(what, sizeof what, "cannot listen on %s:%u", a->host,
             (unsigned)a->port);
    hr__why(why, why_len, what, err);
    return HR_ERR_IO;
  }
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

int hr__sock_connect(const hr__addr *a, int *in_progress, char *why,
                     size_t why_len) {
  struct addrinfo *res, *ai;
  int fd = -1, err = 0, rv;

  rv = resolve(a, 0, &res, why, why_len);
  if (rv)
    return rv;
  /* Non-blocking connects report failure later; only the first address
   * that accepts the connect() call is tried. */
  for (ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
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
  freeaddrinfo(res);
  if (fd < 0) {
    char what[HR_SOCK_HOST_MAX + 32];
    snprintf(what, sizeof what, "cannot connect to %s:%u", a->host,
             (unsigned)a->port);
    hr__why(why, why_len, what, err);
    return HR_ERR_IO;
  }
  return fd;
}

int hr__sock_connect_result(int fd) {
  int err = 0;
  socklen_t len = sizeof err;

  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
    return errno;
  return err;
}

void hr__sock_tune(int fd, int bufsize) {
  int one = 1;

  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (bufsize > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof bufsize);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof bufsize);
  }
}
