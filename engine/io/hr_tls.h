/*
 * The TLS transport of the engine: OpenSSL on a non-blocking socket.
 *
 * A connection's bytes go through one of two transports: the plain socket
 * (recv/sendmsg in hr_engine.c) or an hr__tls, whose calls have the same
 * shape — recv-like and sendmsg-like, -1 with errno EAGAIN when they would
 * block — so that the engine's read and write loops stay the same.  The
 * handshake runs inside those calls (OpenSSL does it on the first
 * SSL_read/SSL_write); what the TLS layer needs from the socket in the
 * meantime, or afterwards (a read that must write first, a write waiting
 * for the peer), is folded into the engine's watch()es by
 * hr__tls_events() and back into its readiness by hr__tls_revents().
 *
 * Failures are written, once, into the connection's message buffer given
 * to hr__tls_new() ("TLS handshake failed: certificate verify failed:
 * hostname mismatch ..."), and the call fails with errno EPROTO.
 */
#ifndef HR_TLS_H
#define HR_TLS_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <hurray/engine.h>

typedef struct hr__tls_ctx hr__tls_ctx; /* one SSL_CTX: server or client */
typedef struct hr__tls hr__tls;         /* one connection's SSL */

/* Makes a context from `cfg` (server: certificate and key required).
 * `why` receives one line on failure.  Returns 0, HR_ERR_INVALID_ARGUMENT
 * (a file does not load, key mismatch, incomplete config), HR_ERR_NOMEM. */
int hr__tls_ctx_new(hr__tls_ctx **out, int server, const hr_tls_config *cfg,
                    const hr_mem *mem, char *why, size_t why_len);
void hr__tls_ctx_del(hr__tls_ctx *cx);

/*
 * Starts TLS on connected (or connecting) socket `fd`.  Client: `host`
 * (the URL's host) is the name to verify unless the context names one;
 * an IP address is matched against IP SANs and sends no SNI.  `why`
 * (`why_len` bytes, normally hr_conn's message) receives the first
 * failure's description and must outlive the object.  Returns 0,
 * HR_ERR_NOMEM, HR_ERR_INVALID_ARGUMENT.
 */
int hr__tls_new(hr__tls **out, hr__tls_ctx *cx, int fd, const char *host,
                char *why, size_t why_len);
/* Frees the SSL object (not the socket). */
void hr__tls_del(hr__tls *t);

/* Like recv(): bytes read (> 0), 0 at the peer's close, -1 with errno
 * (EAGAIN: wait, see hr__tls_events(); EPROTO: TLS failed, the message
 * was written).  `draining`: the caller only empties what the object
 * holds (hr__tls_pending()); then at most the rest of one record is read
 * from the socket, so that draining ends.  One call returns every record
 * that lies whole in the object's receive buffer (up to `len`); what ends
 * it early (the peer's close, an error) comes with the next call. */
ssize_t hr__tls_recv(hr__tls *t, void *buf, size_t len, int draining);
/* Like sendmsg(): bytes of `iov` sent (possibly fewer), or -1 with errno
 * as for hr__tls_recv().  Small items are gathered into one record; large
 * ones are encrypted from where they are. */
ssize_t hr__tls_sendv(hr__tls *t, const struct iovec *iov, int n);
/* Whether decrypted or raw bytes, or the outcome of the last read (see
 * hr__tls_recv()), wait inside the object: the caller must read them
 * without waiting for the socket's readiness. */
int hr__tls_pending(const hr__tls *t);
/* The socket events to watch for the engine's wanted `events`
 * (HR_POLL_IN/OUT): a read waiting for writability, or a write waiting
 * for input, swap the direction. */
int hr__tls_events(const hr__tls *t, int events);
/* The engine's readiness for the socket's `revents`: the inverse. */
int hr__tls_revents(const hr__tls *t, int revents);
/* Whether the handshake finished. */
int hr__tls_ready(const hr__tls *t);
/* Sends close_notify if it can go at once (never waits). */
void hr__tls_close_notify(hr__tls *t);
/* The negotiated state; HR_ERR_STATE before the handshake finished. */
int hr__tls_info(const hr__tls *t, hr_tls_info *out);
/* Whether `buf` (the first bytes a plain client received) is a TLS
 * record: the server speaks TLS. */
int hr__tls_sniff(const void *buf, size_t len);

#endif /* HR_TLS_H */
