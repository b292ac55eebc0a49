/*
 * Socket helpers of the engine: address parsing, non-blocking listeners and
 * connects, socket options, and the errno-to-library-error mapping.
 *
 * Everything here is a thin layer over POSIX sockets; it keeps the
 * system-call details out of hr_engine.c.
 */
#ifndef HR_SOCK_H
#define HR_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <hurray/common.h>

/* Largest host name accepted in an address ("HOST:PORT"). */
#define HR_SOCK_HOST_MAX 256

/* Longest Unix socket path accepted (sun_path holds it and a NUL). */
#define HR_SOCK_PATH_MAX 107

/* A parsed "HOST:PORT" or "[V6]:PORT" (optionally "hurray://" or
 * "hurrays://" first), or
 * "unix:PATH" (then `path` is non-empty and host/port are unused). */
typedef struct hr__addr {
  char host[HR_SOCK_HOST_MAX]; /* without brackets, NUL-terminated */
  uint16_t port;
  char path[HR_SOCK_PATH_MAX + 1]; /* a Unix socket's path, or "" */
  int tls; /* "hurrays://": TLS over TCP */
  /* "inproc:NAME" (hr_engine only; hr__addr_parse() refuses it): NAME is
   * in `host`, the listener's name in the engine's hub. */
  int inproc;
} hr__addr;

/*
 * Parses `text`.  "unix:PATH" names a Unix domain socket (a non-empty PATH
 * of at most HR_SOCK_PATH_MAX bytes).  Otherwise a "hurray://" prefix is
 * skipped when `allow_scheme` is set, and "hurrays://" sets `tls`; any other scheme, a missing or
 * non-numeric port, a port above 65535, an empty host or a trailing path
 * are rejected.  Returns 0 or HR_ERR_INVALID_ARGUMENT.
 */
int hr__addr_parse(const char *text, int allow_scheme, hr__addr *out);

/*
 * Creates a non-blocking, close-on-exec listening socket bound to `a`
 * (backlog 1024): TCP with SO_REUSEADDR, or a Unix socket at a->path.  A
 * socket file left at the path by a dead server is removed first, but
 * only when a connect to it is refused: a live server keeps its path (the
 * bind fails with EADDRINUSE), and a path that is not a socket is never
 * removed.  Returns the fd, or HR_ERR_INVALID_ARGUMENT (the host does not
 * resolve) / HR_ERR_IO.  `why` (may be NULL) receives a one-line reason on
 * failure.
 */
int hr__sock_listen(const hr__addr *a, char *why, size_t why_len);

/* The local port of a bound socket, or -1. */
int hr__sock_local_port(int fd);

/*
 * Starts a non-blocking connect to `a`.  On success returns the fd and
 * sets *in_progress (1: wait for writability, then check
 * hr__sock_connect_result()).  Returns HR_ERR_INVALID_ARGUMENT (does not
 * resolve) or HR_ERR_IO.  Name resolution uses getaddrinfo() and may block
 * for names that are not numeric or in /etc/hosts: the engine resolves
 * names on its worker pool (hr__sock_resolve()) and connects with
 * hr__sock_connect_ai() instead.
 */
int hr__sock_connect(const hr__addr *a, int *in_progress, char *why,
                     size_t why_len);

struct addrinfo;

/*
 * Resolves the TCP address `a` (not a Unix path) into a list for
 * hr__sock_connect_ai(), freed with freeaddrinfo().  With `numeric_only`
 * the host must be a numeric address (AI_NUMERICHOST: no lookup, never
 * blocks) and a name returns HR_ERR_WOULDBLOCK; otherwise getaddrinfo()
 * runs in full and may block for seconds (DNS).  Thread-safe.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (the host does not resolve; `why`, may be NULL,
 * says "cannot resolve HOST: reason"), HR_ERR_WOULDBLOCK or HR_ERR_NOMEM.
 */
int hr__sock_resolve(const hr__addr *a, int numeric_only,
                     struct addrinfo **res, char *why, size_t why_len);

/*
 * Starts a non-blocking connect to the first address of `res` that
 * accepts the connect() call (`a` names it in `why`).  Returns the fd and
 * sets *in_progress like hr__sock_connect(); `used` (may be NULL) receives
 * that address and *used_len its length, `rest` (may be NULL) the entry
 * after it in `res` (NULL: the last), where a caller whose connect then
 * fails goes on.  Returns HR_ERR_IO on failure.
 */
int hr__sock_connect_ai(const hr__addr *a, const struct addrinfo *res,
                        int *in_progress, struct sockaddr_storage *used,
                        socklen_t *used_len, const struct addrinfo **rest,
                        char *why, size_t why_len);

/* After writability of a connecting socket: 0, or the connect's errno. */
int hr__sock_connect_result(int fd);

/*
 * Tunes a connected socket: TCP_NODELAY on TCP (skipped on Unix sockets) (control messages must not
 * wait for Nagle), and SO_SNDBUF/SO_RCVBUF when `bufsize` > 0 (0 leaves
 * the kernel's autotuning alone).  Failures are ignored: these are
 * optimisations.
 */
void hr__sock_tune(int fd, int bufsize);

/* Whether `fd` is a Unix domain socket. */
int hr__sock_is_unix(int fd);

/* SO_PEERCRED of a connected Unix socket: 0, or HR_ERR_UNSUPPORTED (not
 * a Unix socket) / HR_ERR_IO. */
int hr__sock_peer_cred(int fd, int32_t *pid, uint32_t *uid, uint32_t *gid);

/* Room for hr__sock_peer_name(): "[v6 address]:port" or "unix:pid=N". */
#define HR_SOCK_PEER_MAX 64
/* Writes the peer's address as text ("1.2.3.4:5", "[::1]:5", "unix:pid=N",
 * "unix", or "" when unknown) into buf (cap bytes, always terminated). */
void hr__sock_peer_name(int fd, char *buf, size_t cap);

/* "a.b.c.d:port" or "[v6 address]:port" for an IPv4 or IPv6 address into
 * `buf` (room: HR_SOCK_PEER_MAX); "" for any other family. */
void hr__sock_addr_name(const struct sockaddr_storage *ss, char *buf,
                        size_t cap);

/* Formats "what: strerror(err)" into why (when non-NULL). */
void hr__why(char *why, size_t why_len, const char *what, int err);

#endif /* HR_SOCK_H */
