/*
 * The TLS transport (hr_tls.h): OpenSSL 1.3-only contexts, and one SSL
 * object per connection driven by the engine's non-blocking read and write
 * loops.
 *
 * Data path.  OpenSSL 3.0 writes one record (16 KiB) per write() and, with
 * read-ahead, moves what is left in its read buffer to the front before
 * every record: on loopback that was a syscall and a TCP segment per
 * record on the sending side and a copy quadratic in the read size on the
 * receiving side.  So, once the handshake is done and the kernel does not
 * do the record layer (kernel TLS), the SSL object talks to the socket
 * through this file's own BIO (docs/internals/engine.md, "The socket
 * BIO"):
 *  - writes: the records of one hr__tls_sendv() are gathered into `obuf`
 *    (OBUF_SIZE) and leave in one send() per OBUF_SIZE bytes, so TCP sees
 *    writes as large as a plain connection's;
 *  - reads: one recv() fills `ibuf` (IBUF_SIZE, many records) and
 *    OpenSSL, without read-ahead, takes each record's header and body
 *    from it; it decrypts the record and copies the plaintext into the
 *    buffer the engine names (the destination tensor for bulk bytes).
 *    One hr__tls_recv() takes every record that lies whole in `ibuf`.
 * The handshake runs on a plain socket BIO (kernel TLS is switched on
 * there, at the key change); the switch happens at the first call after
 * it finished, between records, so no byte is reordered.
 *
 * Writes are one SSL_write_ex() per record from the application's memory;
 * items under SMALL_ITEM (frame prefixes, control messages) are gathered
 * into one record first, so that a 24-byte prefix does not cost a record
 * of its own.  Partial writes are on (SSL_MODE_ENABLE_PARTIAL_WRITE): a
 * call reports the bytes whose records went out, exactly like a short
 * sendmsg().  Records gathered in `obuf` that the socket did not take
 * before the call returns stay there and their plaintext is not reported
 * (`owed`): the next call, which by the engine's rule starts with the same
 * bytes (the session's items never move once handed out), sends them
 * first and then reports those bytes without encrypting them again.  A
 * record OpenSSL could not hand over is retried by OpenSSL itself with
 * the same bytes, as before.
 *
 * OpenSSL's error queue is per thread; every call clears it first so that
 * a message describes this connection's failure.
 */
#include "hr_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "hr_internal.h"

/* TLS 1.3 suites, AES-128-GCM first: the fastest with AES-NI, and the
 * benchmark's baseline uses the same (docs/protocol.md § 25.1). */
#define CIPHERS                                                               \
  "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#define GATHER_SIZE 16384u /* one record's plaintext */
#define SMALL_ITEM 4096u
#define WRITE_CHUNK (1u << 30)
#define NAME_MAX_LEN 256
/* Records per send(): 16 records, four 64 KiB loopback segments.  More
 * buys nothing measurable and costs memory per connection. */
#define OBUF_SIZE (256u << 10)
/* Bytes per recv(): many records.  A record (at most 2^14 + 256 bytes of
 * ciphertext and its header) always fits. */
#define IBUF_SIZE (256u << 10)
/* A send of this many bytes or more gathers its records in obuf. */
#define BATCH_MIN (2u * GATHER_SIZE)

struct hr__tls_ctx {
  hr_mem mem;
  SSL_CTX *ctx;
  BIO_METHOD *bio; /* the socket BIO used after the handshake */
  int server;
  int ktls;
  char server_name[NAME_MAX_LEN]; /* client: the name to verify ("": URL) */
};

struct hr__tls {
  hr_mem mem;
  hr__tls_ctx *cx;
  SSL *ssl;
  int rd_wants_w; /* the last read needs writability */
  int wr_wants_r; /* the last write needs input */
  int failed;     /* a fatal TLS error: every later call fails */
  int switched;   /* the post-handshake BIO decision was made */
  int fd;
  int draining; /* hr__tls_recv(draining): read at most what is asked */
  int batching; /* inside hr__tls_sendv() with obuf: gather records */
  int in_eof;   /* the socket read returned 0 */
  int own_w;    /* our write BIO is in use (no kernel TLS send) */
  char name[NAME_MAX_LEN]; /* client: the name verified */
  char *why;
  size_t why_len;
  uint8_t *obuf;      /* NULL until the first large write */
  size_t ooff, olen;  /* obuf: sent up to ooff, filled up to olen */
  size_t owed;        /* plaintext of obuf's records not yet reported */
  uint8_t *ibuf;      /* NULL: our read BIO is not in use */
  size_t ioff, ilen;  /* ibuf: consumed up to ioff, filled up to ilen */
  int kept;           /* the last read's outcome after its bytes: */
  ssize_t kept_ret;   /* what the next hr__tls_recv() returns */
  int kept_errno;     /* and its errno */
  uint8_t gather[GATHER_SIZE];
};

/* OpenSSL's reason for the first error queued, or `fallback`. */
static const char *ossl_reason(const char *fallback) {
  unsigned long e = ERR_peek_error();
  const char *r = e ? ERR_reason_error_string(e) : NULL;

  return r ? r : fallback;
}

static int ctx_fail(char *why, size_t why_len, const char *what,
                    const char *file) {
  if (why && why_len)
    snprintf(why, why_len, "%s %s: %s", what, file,
             ossl_reason("unknown error"));
  ERR_clear_error();
  return HR_ERR_INVALID_ARGUMENT;
}

static int ctx_setup(SSL_CTX *ctx, int server, const hr_tls_config *cfg,
                     char *why, size_t why_len) {
  const char *cert = cfg ? cfg->cert_file : NULL;
  const char *key = cfg ? cfg->key_file : NULL;
  const char *ca = cfg ? cfg->ca_file : NULL;

  if (!SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
      !SSL_CTX_set_ciphersuites(ctx, CIPHERS))
    return HR_ERR_NOMEM;
  if (!cert != !key) {
    snprintf(why, why_len,
             "a TLS certificate needs its key and a key its certificate "
             "(give both)");
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (server && !cert) {
    snprintf(why, why_len, "a TLS server needs a certificate and its key");
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (cert) {
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1)
      return ctx_fail(why, why_len, "cannot load the TLS certificate", cert);
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
      unsigned long e = ERR_peek_error();
      if (ERR_GET_LIB(e) == ERR_LIB_X509 &&
          (ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH ||
           ERR_GET_REASON(e) == X509_R_KEY_TYPE_MISMATCH)) {
        snprintf(why, why_len,
                 "the TLS key %s does not match the certificate %s", key,
                 cert);
        ERR_clear_error();
        return HR_ERR_INVALID_ARGUMENT;
      }
      return ctx_fail(why, why_len, "cannot load the TLS key", key);
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
      snprintf(why, why_len, "the TLS key %s does not match the certificate %s",
               key, cert);
      ERR_clear_error();
      return HR_ERR_INVALID_ARGUMENT;
    }
  }
  if (ca) {
    if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1)
      return ctx_fail(why, why_len, "cannot load the TLS CA file", ca);
  } else if (!server && SSL_CTX_set_default_verify_paths(ctx) != 1) {
    /* No system store: verification fails later, with its reason. */
    ERR_clear_error();
  }
  if (server) {
    if (ca) {
      STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca);
      /* The names only guide the client's choice of certificate. */
      if (names)
        SSL_CTX_set_client_CA_list(ctx, names);
      SSL_CTX_set_verify(ctx,
                         SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                         NULL);
    }
    /* No resumption: connections are long-lived and a ticket would only
     * cost a write after every handshake. */
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  }
  ERR_clear_error();
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The socket BIO after the handshake                                        */
/* ------------------------------------------------------------------------ */

static int would_block(int err) {
  return err == EAGAIN || err == EWOULDBLOCK;
}

/* Sends what obuf holds.  Returns 0 (obuf is empty) or -1 with errno
 * (EAGAIN: the socket is full and the rest stays). */
static int obuf_flush(hr__tls *t) {
  while (t->ooff < t->olen) {
    ssize_t n = send(t->fd, t->obuf + t->ooff, t->olen - t->ooff,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    t->ooff += (size_t)n;
  }
  t->ooff = t->olen = 0;
  return 0;
}

/* OpenSSL hands over one record (or the rest of one) per call. */
static int bio_write(BIO *b, const char *data, int len) {
  hr__tls *t = BIO_get_data(b);
  ssize_t n;

  BIO_clear_retry_flags(b);
  if (len <= 0)
    return 0;
  /* Gathered records go first: their order is the stream's.  Outside
   * hr__tls_sendv() (an alert, a key update answered while reading) a
   * record goes out at once, behind them. */
  if (t->ooff < t->olen &&
      (!t->batching || OBUF_SIZE - t->olen < (size_t)len) &&
      obuf_flush(t) != 0) {
    if (would_block(errno))
      BIO_set_retry_write(b);
    return -1;
  }
  if (t->batching && OBUF_SIZE - t->olen >= (size_t)len) {
    memcpy(t->obuf + t->olen, data, (size_t)len);
    t->olen += (size_t)len;
    return len;
  }
  do
    n = send(t->fd, data, (size_t)len, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (would_block(errno))
      BIO_set_retry_write(b);
    return -1;
  }
  return (int)n;
}

/* OpenSSL asks for a record's header, then for its body (no read-ahead):
 * both come from ibuf, refilled by one recv() of up to IBUF_SIZE. */
static int bio_read(BIO *b, char *out, int len) {
  hr__tls *t = BIO_get_data(b);
  size_t avail = t->ilen - t->ioff;
  ssize_t n;

  BIO_clear_retry_flags(b);
  if (len <= 0)
    return 0;
  if (avail == 0) {
    t->ioff = t->ilen = 0;
    do {
      /* Draining (hr__tls_recv) reads only the rest of this record, so
       * that it ends. */
      if (t->draining)
        n = recv(t->fd, out, (size_t)len, MSG_DONTWAIT);
      else
        n = recv(t->fd, t->ibuf, IBUF_SIZE, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n == 0)
      t->in_eof = 1;
    if (n <= 0) {
      if (n < 0 && would_block(errno))
        BIO_set_retry_read(b);
      return (int)n;
    }
    if (t->draining)
      return (int)n;
    t->ilen = (size_t)n;
    avail = (size_t)n;
  }
  if (avail > (size_t)len)
    avail = (size_t)len;
  memcpy(out, t->ibuf + t->ioff, avail);
  t->ioff += avail;
  return (int)avail;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr) {
  hr__tls *t = BIO_get_data(b);

  (void)num;
  (void)ptr;
  switch (cmd) {
  case BIO_CTRL_FLUSH:
    /* After a handshake message or an alert: what obuf holds must go. */
    BIO_clear_retry_flags(b);
    if (t->ooff < t->olen && obuf_flush(t) != 0) {
      if (would_block(errno))
        BIO_set_retry_write(b);
      return 0;
    }
    return 1;
  case BIO_CTRL_EOF: return t->in_eof && t->ioff == t->ilen;
  case BIO_CTRL_PENDING: return (long)(t->ilen - t->ioff);
  case BIO_CTRL_WPENDING: return (long)(t->olen - t->ooff);
  default: return 0;
  }
}

static BIO *new_bio(hr__tls *t) {
  BIO *b = BIO_new(t->cx->bio);

  if (b) {
    BIO_set_data(b, t);
    BIO_set_init(b, 1);
  }
  return b;
}

/* Once the handshake finished: our BIO for each direction the kernel does
 * not encrypt.  Between records, so nothing is reordered: the plain socket
 * BIO buffers nothing and, without read-ahead, OpenSSL read no byte past
 * the records it processed.  Without memory the socket BIOs stay (one
 * write() per record, two read()s per record: slower, not wrong). */
static void switch_bios(hr__tls *t) {
  BIO *b;

  if (t->switched || !SSL_is_init_finished(t->ssl))
    return;
  t->switched = 1;
  if (!BIO_get_ktls_recv(SSL_get_rbio(t->ssl))) {
    t->ibuf = hr__mem_malloc(&t->mem, IBUF_SIZE);
    if (t->ibuf && (b = new_bio(t)) != NULL) {
      SSL_set0_rbio(t->ssl, b);
      /* A host's context may ask for read-ahead: with this BIO it would
       * only bring back the memmove.  What it already read stays first. */
      SSL_set_read_ahead(t->ssl, 0);
    } else {
      hr__mem_free(&t->mem, t->ibuf);
      t->ibuf = NULL;
    }
  }
  if (!BIO_get_ktls_send(SSL_get_wbio(t->ssl)) &&
      (b = new_bio(t)) != NULL) {
    SSL_set0_wbio(t->ssl, b);
    t->own_w = 1;
  }
  ERR_clear_error();
}

static BIO_METHOD *bio_method(void) {
  /* The type is informational (BIO_find_type); a dynamic index would be
   * used up by many contexts over a process's life. */
  BIO_METHOD *m = BIO_meth_new(BIO_TYPE_SOURCE_SINK | 0x7e, "hurray socket");

  if (m && (!BIO_meth_set_write(m, bio_write) ||
            !BIO_meth_set_read(m, bio_read) ||
            !BIO_meth_set_ctrl(m, bio_ctrl))) {
    BIO_meth_free(m);
    m = NULL;
  }
  return m;
}

int hr__tls_ctx_new(hr__tls_ctx **out, int server, const hr_tls_config *cfg,
                    const hr_mem *mem, char *why, size_t why_len) {
  char scratch[8];
  hr__tls_ctx *cx;
  int rv;

  if (!why || !why_len) {
    why = scratch;
    why_len = sizeof scratch;
  }
  why[0] = '\0';
  if (!mem)
    mem = hr_mem_default();
  if (cfg && cfg->server_name && strlen(cfg->server_name) >= NAME_MAX_LEN) {
    snprintf(why, why_len, "the TLS server name is too long");
    return HR_ERR_INVALID_ARGUMENT;
  }
  cx = hr__mem_calloc(mem, 1, sizeof *cx);
  if (!cx)
    return HR_ERR_NOMEM;
  cx->mem = *mem;
  cx->server = server;
  cx->ktls = !(cfg && cfg->no_ktls);
  if (cfg && cfg->server_name)
    memcpy(cx->server_name, cfg->server_name, strlen(cfg->server_name) + 1);
  ERR_clear_error();
  cx->bio = bio_method();
  if (!cx->bio) {
    snprintf(why, why_len, "cannot create a TLS context: out of memory");
    ERR_clear_error();
    hr__mem_free(mem, cx);
    return HR_ERR_NOMEM;
  }
  if (cfg && cfg->ssl_ctx) {
    if (SSL_CTX_up_ref(cfg->ssl_ctx) != 1) {
      BIO_meth_free(cx->bio);
      hr__mem_free(mem, cx);
      return HR_ERR_NOMEM;
    }
    cx->ctx = cfg->ssl_ctx;
    *out = cx;
    return 0;
  }
  cx->ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (!cx->ctx) {
    snprintf(why, why_len, "cannot create a TLS context: %s",
             ossl_reason("out of memory"));
    ERR_clear_error();
    BIO_meth_free(cx->bio);
    hr__mem_free(mem, cx);
    return HR_ERR_NOMEM;
  }
  rv = ctx_setup(cx->ctx, server, cfg, why, why_len);
  if (rv) {
    SSL_CTX_free(cx->ctx);
    BIO_meth_free(cx->bio);
    hr__mem_free(mem, cx);
    return rv;
  }
  *out = cx;
  return 0;
}

void hr__tls_ctx_del(hr__tls_ctx *cx) {
  if (!cx)
    return;
  SSL_CTX_free(cx->ctx);
  BIO_meth_free(cx->bio);
  hr__mem_free(&cx->mem, cx);
}

int hr_tls_config_check(const hr_tls_config *cfg, int server, char *why,
                        size_t why_len) {
  hr__tls_ctx *cx = NULL;
  int rv = hr__tls_ctx_new(&cx, server, cfg, NULL, why, why_len);

  hr__tls_ctx_del(cx);
  return rv;
}

static int is_ip(const char *s) {
  unsigned char buf[16];

  return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

int hr__tls_new(hr__tls **out, hr__tls_ctx *cx, int fd, const char *host,
                char *why, size_t why_len) {
  uint64_t opts = SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION;
  hr__tls *t;
  int ok;

  if (!cx || fd < 0 || !why || !why_len)
    return HR_ERR_INVALID_ARGUMENT;
  t = hr__mem_calloc(&cx->mem, 1, sizeof *t);
  if (!t)
    return HR_ERR_NOMEM;
  t->mem = cx->mem;
  t->cx = cx;
  t->why = why;
  t->why_len = why_len;
  t->fd = fd;
  ERR_clear_error();
  t->ssl = SSL_new(cx->ctx);
  if (!t->ssl)
    goto nomem;
  if (cx->ktls)
    opts |= SSL_OP_ENABLE_KTLS;
  SSL_set_options(t->ssl, opts);
  SSL_set_mode(t->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE |
                           SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  /* Also for a host's context: this protocol speaks TLS 1.3 only. */
  if (!SSL_set_min_proto_version(t->ssl, TLS1_3_VERSION) ||
      !SSL_set_fd(t->ssl, fd))
    goto nomem;
  if (cx->server) {
    SSL_set_accept_state(t->ssl);
  } else {
    const char *name = cx->server_name[0] ? cx->server_name : host;
    if (!name || !name[0] || strlen(name) >= sizeof t->name) {
      SSL_free(t->ssl);
      hr__mem_free(&t->mem, t);
      return HR_ERR_INVALID_ARGUMENT;
    }
    memcpy(t->name, name, strlen(name) + 1);
    if (is_ip(name)) {
      /* RFC 6066: no SNI for addresses; they match IP SANs. */
      ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), name);
    } else {
      SSL_set_hostflags(t->ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      ok = SSL_set_tlsext_host_name(t->ssl, name) == 1 &&
           SSL_set1_host(t->ssl, name) == 1;
    }
    if (!ok)
      goto nomem;
    SSL_set_connect_state(t->ssl);
  }
  *out = t;
  return 0;
nomem:
  ERR_clear_error();
  SSL_free(t->ssl);
  hr__mem_free(&t->mem, t);
  return HR_ERR_NOMEM;
}

void hr__tls_del(hr__tls *t) {
  if (!t)
    return;
  SSL_free(t->ssl);
  hr__mem_free(&t->mem, t->ibuf);
  hr__mem_free(&t->mem, t->obuf);
  hr__mem_free(&t->mem, t);
}

/* The hint that goes with an OpenSSL reason: what to do about it. */
static const char *hint_of(const hr__tls *t, int reason) {
  int server = t->cx->server;

  switch (reason) {
  case SSL_R_WRONG_VERSION_NUMBER:
  case SSL_R_PACKET_LENGTH_TOO_LONG:
  case SSL_R_HTTP_REQUEST:
  case SSL_R_RECORD_LENGTH_MISMATCH:
    return server ? " (the client does not speak TLS: it must use hurrays://)"
                  : " (the server does not speak TLS: use hurray://)";
  case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
  case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
  case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
  case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
  case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
    return server ? " (the client does not trust this server's certificate)"
                  : " (the server wants a client certificate it trusts: "
                    "--tls-cert and --tls-key)";
  case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
    return " (mutual TLS: the client must present a certificate)";
  case SSL_R_UNSUPPORTED_PROTOCOL:
  case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
    return " (the peer does not speak TLS 1.3)";
  case SSL_R_UNEXPECTED_EOF_WHILE_READING:
    return server ? " (the client gave up)"
                  : " (the server closed the connection: does it speak TLS, "
                    "and does it accept our certificate?)";
  default: return "";
  }
}

/* Writes what failed into the connection's message (the first failure
 * only) and marks the object failed. */
static void describe(hr__tls *t) {
  unsigned long e = ERR_peek_error();
  long vr = SSL_get_verify_result(t->ssl);
  int reason = e && ERR_GET_LIB(e) == ERR_LIB_SSL ? ERR_GET_REASON(e) : 0;
  /* After a fatal error OpenSSL no longer says the handshake finished:
   * `switched` remembers that it had. */
  const char *stage = t->switched || SSL_is_init_finished(t->ssl)
                          ? "TLS connection failed"
                          : "TLS handshake failed";

  t->failed = 1;
  if (t->why[0]) {
    ERR_clear_error();
    return;
  }
  if (vr != X509_V_OK && (reason == SSL_R_CERTIFICATE_VERIFY_FAILED || !e)) {
    if (vr == X509_V_ERR_HOSTNAME_MISMATCH ||
        vr == X509_V_ERR_IP_ADDRESS_MISMATCH)
      snprintf(t->why, t->why_len,
               "%s: certificate verify failed: %s (the server's certificate "
               "is not for %s)",
               stage, X509_verify_cert_error_string(vr), t->name);
    else
      snprintf(t->why, t->why_len, "%s: certificate verify failed: %s (%s)",
               stage, X509_verify_cert_error_string(vr),
               t->cx->server ? "the client's certificate is not from "
                               "--tls-client-ca"
                             : "is --tls-ca the CA that issued the server's "
                               "certificate?");
  } else {
    snprintf(t->why, t->why_len, "%s: %s%s", stage,
             ossl_reason("protocol error"), hint_of(t, reason));
  }
  ERR_clear_error();
}

/* Maps a failed SSL call's error onto recv()/sendmsg() results. */
static ssize_t call_failed(hr__tls *t, int ret, int reading) {
  int err = SSL_get_error(t->ssl, ret), sys = errno;

  switch (err) {
  case SSL_ERROR_WANT_READ:
    if (!reading)
      t->wr_wants_r = 1;
    errno = EAGAIN;
    return -1;
  case SSL_ERROR_WANT_WRITE:
    if (reading)
      t->rd_wants_w = 1;
    errno = EAGAIN;
    return -1;
  case SSL_ERROR_ZERO_RETURN:
    /* The peer's close_notify (or, with SSL_OP_IGNORE_UNEXPECTED_EOF, a
     * plain close after the handshake: the protocol's own framing tells a
     * cut transfer from a finished one). */
    if (reading)
      return 0;
    errno = EPIPE;
    return -1;
  case SSL_ERROR_SYSCALL:
    if (ERR_peek_error() == 0) {
      ERR_clear_error();
      if (sys == 0) {
        if (reading && SSL_is_init_finished(t->ssl))
          return 0;
        if (!t->why[0])
          snprintf(t->why, t->why_len,
                   "TLS handshake failed: the peer closed the connection%s",
                   t->cx->server ? "" : " (does the server speak TLS?)");
        t->failed = 1;
        sys = EPROTO;
      }
      errno = sys;
      return -1;
    }
    describe(t);
    errno = EPROTO;
    return -1;
  default:
    describe(t);
    errno = EPROTO;
    return -1;
  }
}

/* Whether ibuf holds the whole of the next record (its 5-byte header
 * and the length it declares): OpenSSL reads it without a system call.
 * A length over the protocol's limit is OpenSSL's to reject. */
static int record_buffered(const hr__tls *t) {
  size_t avail = t->ilen - t->ioff;
  const uint8_t *h;

  if (!t->ibuf || avail < 5)
    return 0;
  h = t->ibuf + t->ioff;
  return avail - 5 >= ((size_t)h[3] << 8 | h[4]);
}

ssize_t hr__tls_recv(hr__tls *t, void *buf, size_t len, int draining) {
  size_t got = 0;
  int ret;

  t->rd_wants_w = 0;
  if (t->failed && !t->kept) {
    errno = EPROTO;
    return -1;
  }
  if (t->kept) {
    t->kept = 0;
    errno = t->kept_errno;
    return t->kept_ret;
  }
  switch_bios(t);
  if (len > INT_MAX)
    len = INT_MAX;
  ERR_clear_error();
  errno = 0;
  t->draining = draining;
  ret = SSL_read_ex(t->ssl, buf, len, &got);
  /* SSL_read_ex() returns one record.  The records that lie whole in
   * ibuf are read in the same call: no system call is needed for them,
   * and the engine's read loop runs once per recv(), not per 16 KiB. */
  while (ret == 1 && got < len && record_buffered(t)) {
    size_t more = 0;
    errno = 0;
    ret = SSL_read_ex(t->ssl, (uint8_t *)buf + got, len - got, &more);
    if (ret != 1) {
      /* The bytes read are returned; the outcome (the peer's close, a
       * socket error, a fatal TLS error with its message written) is
       * kept for the next call, and hr__tls_pending() says there is one
       * (no readiness of the socket may come for it).  A read that waits
       * for the socket keeps nothing: its direction is noted. */
      ssize_t r = call_failed(t, ret, 1);
      if (r == 0 || !would_block(errno)) {
        t->kept = 1;
        t->kept_ret = r;
        t->kept_errno = errno;
      }
      ERR_clear_error();
      ret = 1;
      break;
    }
    got += more;
  }
  t->draining = 0;
  if (ret == 1)
    return (ssize_t)got;
  return call_failed(t, ret, 1);
}

/* Writes `len` bytes at `p`; returns the bytes written (possibly fewer:
 * the socket is full or failed, see the flags) or -1. */
static ssize_t write_some(hr__tls *t, const uint8_t *p, size_t len) {
  size_t off = 0;

  /* A successful call leaves the queue empty: clearing it once is enough
   * (per record it was measurable). */
  ERR_clear_error();
  while (off < len) {
    size_t chunk = len - off, w = 0;
    int ret;
    if (chunk > WRITE_CHUNK)
      chunk = WRITE_CHUNK;
    errno = 0;
    ret = SSL_write_ex(t->ssl, p + off, chunk, &w);
    if (ret != 1) {
      ssize_t r = call_failed(t, ret, 0);
      return off ? (ssize_t)off : r;
    }
    off += w;
  }
  return (ssize_t)off;
}

ssize_t hr__tls_sendv(hr__tls *t, const struct iovec *iov, int n) {
  size_t reported = 0, accepted = 0, skip, off = 0, rest = 0;
  int i = 0, j, err = 0;

  t->wr_wants_r = 0;
  if (t->failed) {
    errno = EPROTO;
    return -1;
  }
  switch_bios(t);
  /* The records of the last call's bytes that obuf still holds go first;
   * then those bytes (the first `owed` of `iov`) are reported. */
  if (t->ooff < t->olen && obuf_flush(t) != 0)
    return -1;
  skip = t->owed;
  t->owed = 0;
  for (; i < n && skip >= iov[i].iov_len; i++) {
    skip -= iov[i].iov_len;
    reported += iov[i].iov_len;
  }
  if (skip > 0 && i == n) {
    /* The engine's rule was broken: the stream cannot go on. */
    t->failed = 1;
    if (!t->why[0])
      snprintf(t->why, t->why_len,
               "TLS connection failed: a write was retried with fewer "
               "bytes than were sent");
    errno = EPROTO;
    return -1;
  }
  off = skip;
  reported += skip;
  for (j = i; j < n; j++)
    rest += iov[j].iov_len;
  rest -= off;
  if (t->own_w && !t->obuf && rest >= BATCH_MIN)
    t->obuf = hr__mem_malloc(&t->mem, OBUF_SIZE);
  t->batching = t->obuf != NULL;
  while (i < n) {
    const uint8_t *base = (const uint8_t *)iov[i].iov_base + off, *p;
    size_t len = iov[i].iov_len - off;
    int next;
    ssize_t w;

    if (len == 0) {
      i++;
      off = 0;
      continue;
    }
    if (len < SMALL_ITEM && i + 1 < n && iov[i + 1].iov_len < SMALL_ITEM &&
        len + iov[i + 1].iov_len <= GATHER_SIZE) {
      /* Several small items: one record.  Only headers and control
       * messages are this small; tensor bytes are written in place. */
      memcpy(t->gather, base, len);
      next = i + 1;
      while (next < n && iov[next].iov_len < SMALL_ITEM &&
             len + iov[next].iov_len <= GATHER_SIZE) {
        memcpy(t->gather + len, iov[next].iov_base, iov[next].iov_len);
        len += iov[next].iov_len;
        next++;
      }
      p = t->gather;
    } else {
      p = base;
      next = i + 1;
    }
    w = write_some(t, p, len);
    if (w < 0) {
      err = errno;
      break;
    }
    accepted += (size_t)w;
    if ((size_t)w < len)
      break;
    i = next;
    off = 0;
  }
  t->batching = 0;
  if (t->ooff < t->olen && obuf_flush(t) != 0) {
    /* Full: these records leave with the next call, which reports their
     * bytes.  Any other failure ends the connection. */
    if (!err)
      err = errno;
    if (would_block(errno))
      t->owed = accepted;
    accepted = 0;
  }
  if (reported + accepted > 0)
    return (ssize_t)(reported + accepted);
  errno = err ? err : EAGAIN;
  return -1;
}

int hr__tls_ready(const hr__tls *t) {
  return SSL_is_init_finished(t->ssl);
}

int hr__tls_pending(const hr__tls *t) {
  return t->kept ||
         (!t->failed && (SSL_has_pending(t->ssl) || t->ioff < t->ilen));
}

int hr__tls_events(const hr__tls *t, int events) {
  int ev = 0;

  if (events & HR_POLL_IN)
    ev |= t->rd_wants_w ? HR_POLL_OUT : HR_POLL_IN;
  if (events & HR_POLL_OUT)
    ev |= t->wr_wants_r ? HR_POLL_IN : HR_POLL_OUT;
  return ev;
}

int hr__tls_revents(const hr__tls *t, int revents) {
  int r = revents;

  if ((revents & HR_POLL_OUT) && t->rd_wants_w)
    r |= HR_POLL_IN;
  if ((revents & HR_POLL_IN) && t->wr_wants_r)
    r |= HR_POLL_OUT;
  return r;
}

void hr__tls_close_notify(hr__tls *t) {
  if (!t || t->failed || !SSL_is_init_finished(t->ssl))
    return;
  ERR_clear_error();
  /* One try: a full socket just means the peer sees a plain close. */
  (void)SSL_shutdown(t->ssl);
  ERR_clear_error();
}

int hr__tls_info(const hr__tls *t, hr_tls_info *out) {
  const SSL_CIPHER *c;
  X509 *peer;

  if (!SSL_is_init_finished(t->ssl))
    return HR_ERR_STATE;
  memset(out, 0, sizeof *out);
  snprintf(out->version, sizeof out->version, "%s", SSL_get_version(t->ssl));
  c = SSL_get_current_cipher(t->ssl);
  snprintf(out->cipher, sizeof out->cipher, "%s",
           c ? SSL_CIPHER_get_name(c) : "");
  out->ktls_tx = BIO_get_ktls_send(SSL_get_wbio(t->ssl)) ? 1 : 0;
  out->ktls_rx = BIO_get_ktls_recv(SSL_get_rbio(t->ssl)) ? 1 : 0;
  peer = SSL_get0_peer_certificate(t->ssl);
  if (peer && SSL_get_verify_result(t->ssl) == X509_V_OK) {
    out->peer_cert = 1;
    X509_NAME_oneline(X509_get_subject_name(peer), out->peer_subject,
                      (int)sizeof out->peer_subject);
  }
  return 0;
}

int hr__tls_sniff(const void *buf, size_t len) {
  const uint8_t *p = buf;

  /* A TLS record: content type handshake (22) or alert (21), then the
   * legacy version 3.x. */
  return len >= 2 && (p[0] == 22 || p[0] == 21) && p[1] == 3;
}
