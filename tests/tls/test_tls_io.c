/*
 * The TLS transport (engine/io/hr_tls.c) against a plain OpenSSL peer,
 * driven the way the engine drives it (events, short writes retried with
 * the same bytes, draining): a send of mixed small and large items
 * through a small socket buffer and a slow reader, so that gathered
 * records are left behind and sent by the next call; a TLS 1.3 key
 * update asked by the peer in the middle and answered in order; a
 * close_notify behind all the data; and a receive of many records per
 * read with a key update, byte-exact, ending at the peer's close_notify;
 * and a read of several records that meets the peer's close or a damaged
 * record: the bytes before it first, the close or failure next.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "certs.h"
#include "engine/io/hr_tls.h"

#define N_BYTES (24u << 20)

static certs C;

static int group_setup(void **state) {
  (void)state;
  return certs_make(&C);
}

static int group_teardown(void **state) {
  (void)state;
  certs_remove(&C);
  return 0;
}

static uint8_t pattern(size_t i) {
  return (uint8_t)((i * 2654435761u) >> 13);
}

/* A connected loopback pair: `*ours` non-blocking, `*theirs` blocking. */
static void tcp_pair(int *ours, int *theirs, int small_buffers) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1, small = 16384;

  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(l, 1), 0);
  assert_int_equal(getsockname(l, (struct sockaddr *)&a, &len), 0);
  *theirs = socket(AF_INET, SOCK_STREAM, 0);
  if (small_buffers)
    setsockopt(*theirs, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  assert_int_equal(connect(*theirs, (struct sockaddr *)&a, sizeof a), 0);
  *ours = accept(l, NULL, NULL);
  assert_true(*ours >= 0);
  close(l);
  if (small_buffers)
    setsockopt(*ours, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  setsockopt(*ours, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  assert_int_equal(fcntl(*ours, F_SETFL, fcntl(*ours, F_GETFL) | O_NONBLOCK),
                   0);
}

/* ---- the plain OpenSSL peer ---------------------------------------------- */

typedef struct peer {
  pthread_t th;
  int fd;
  int server; /* the peer's role */
  /* results */
  int ok;            /* every byte matched */
  int close_notify;  /* the stream ended with close_notify */
  int key_updates;   /* KeyUpdate messages received */
  char fail[160];
} peer;

static void on_msg(int write_p, int version, int content_type,
                   const void *buf, size_t len, SSL *ssl, void *arg) {
  peer *p = arg;

  (void)version;
  (void)ssl;
  /* Handshake message 24: KeyUpdate. */
  if (!write_p && content_type == SSL3_RT_HANDSHAKE && len > 0 &&
      ((const uint8_t *)buf)[0] == 24)
    p->key_updates++;
}

static SSL *peer_ssl(peer *p, SSL_CTX **ctxp) {
  SSL_CTX *ctx = SSL_CTX_new(p->server ? TLS_server_method()
                                       : TLS_client_method());
  SSL *ssl;

  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  if (p->server) {
    SSL_CTX_use_certificate_chain_file(ctx, C.server_cert);
    SSL_CTX_use_PrivateKey_file(ctx, C.server_key, SSL_FILETYPE_PEM);
    SSL_CTX_set_num_tickets(ctx, 0);
  } else {
    SSL_CTX_load_verify_locations(ctx, C.ca, NULL);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  }
  ssl = SSL_new(ctx);
  SSL_set_fd(ssl, p->fd);
  SSL_set_msg_callback(ssl, on_msg);
  SSL_set_msg_callback_arg(ssl, p);
  if (!p->server)
    SSL_set1_host(ssl, "127.0.0.1");
  *ctxp = ctx;
  return ssl;
}

/* Client peer: reads N_BYTES slowly in odd pieces, asks for a key update
 * (and sends a word) a third of the way, then expects close_notify. */
static void *reader_main(void *arg) {
  peer *p = arg;
  SSL_CTX *ctx;
  SSL *ssl = peer_ssl(p, &ctx);
  static uint8_t buf[70000];
  size_t got = 0, k = 0, piece;
  int asked = 0, r;

  p->ok = 1;
  if (SSL_connect(ssl) != 1) {
    snprintf(p->fail, sizeof p->fail, "SSL_connect failed");
    p->ok = 0;
    goto out;
  }
  while (got < N_BYTES) {
    piece = 1 + (k * 7919) % sizeof buf;
    if (piece > N_BYTES - got)
      piece = N_BYTES - got;
    if (!SSL_read_ex(ssl, buf, piece, &piece)) {
      snprintf(p->fail, sizeof p->fail, "SSL_read failed at %zu: %d", got,
               SSL_get_error(ssl, 0));
      p->ok = 0;
      goto out;
    }
    for (size_t i = 0; i < piece; i++)
      if (buf[i] != pattern(got + i)) {
        snprintf(p->fail, sizeof p->fail, "byte %zu differs", got + i);
        p->ok = 0;
        goto out;
      }
    got += piece;
    /* Slow now and then: the sender's socket fills. */
    if (++k % 64 == 0)
      usleep(2000);
    if (!asked && got > N_BYTES / 3) {
      asked = 1;
      if (SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED) != 1 ||
          SSL_write(ssl, "ku", 2) != 2) {
        snprintf(p->fail, sizeof p->fail, "key update failed");
        p->ok = 0;
        goto out;
      }
    }
  }
  r = SSL_read_ex(ssl, buf, 1, &piece);
  p->close_notify = !r && SSL_get_error(ssl, 0) == SSL_ERROR_ZERO_RETURN &&
                    (SSL_get_shutdown(ssl) & SSL_RECEIVED_SHUTDOWN);
out:
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  ERR_clear_error();
  return NULL;
}

/* Server peer: writes N_BYTES in large pieces with a key update (asked
 * of us) in the middle, then close_notify. */
static void *writer_main(void *arg) {
  peer *p = arg;
  SSL_CTX *ctx;
  SSL *ssl = peer_ssl(p, &ctx);
  uint8_t *src = malloc(N_BYTES);
  size_t off = 0, w;

  p->ok = 0;
  for (size_t i = 0; i < N_BYTES; i++)
    src[i] = pattern(i);
  if (SSL_accept(ssl) != 1) {
    snprintf(p->fail, sizeof p->fail, "SSL_accept failed");
    goto out;
  }
  while (off < N_BYTES) {
    size_t k = N_BYTES - off < (3u << 20) + 5 ? N_BYTES - off
                                               : (3u << 20) + 5;
    if (off >= N_BYTES / 2 && off < N_BYTES / 2 + k &&
        SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED) != 1)
      goto out;
    if (!SSL_write_ex(ssl, src + off, k, &w)) {
      snprintf(p->fail, sizeof p->fail, "SSL_write failed at %zu", off);
      goto out;
    }
    off += w;
  }
  p->ok = 1;
  SSL_shutdown(ssl);
out:
  free(src);
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  ERR_clear_error();
  return NULL;
}

/* ---- our side ------------------------------------------------------------- */

static int wait_for(hr__tls *t, int fd, int want) {
  struct pollfd pf = {fd, 0, 0};
  int ev = hr__tls_events(t, want), r = 0;

  if (ev & HR_POLL_IN)
    pf.events |= POLLIN;
  if (ev & HR_POLL_OUT)
    pf.events |= POLLOUT;
  if (poll(&pf, 1, 30000) != 1)
    return 0;
  if (pf.revents & (POLLIN | POLLHUP | POLLERR))
    r |= HR_POLL_IN;
  if (pf.revents & (POLLOUT | POLLERR))
    r |= HR_POLL_OUT;
  return hr__tls_revents(t, r);
}

/* The items the data is cut into, in turn: frame prefixes, control
 * messages, tensor pieces of odd sizes. */
static const size_t cuts[] = {24,    100, 3000, (1u << 20) + 13, 7,
                              40,    24,  (3u << 16) + 1, 5000, 16384,
                              16385, 24};

static void test_send(void **state) {
  hr__tls_ctx *cx;
  hr__tls *t;
  hr_tls_config tc;
  peer p;
  char why[256] = "";
  uint8_t *src = malloc(N_BYTES), rbuf[64];
  size_t sent = 0, got_ku = 0;
  int fd, short_writes = 0, turns = 0;

  (void)state;
  for (size_t i = 0; i < N_BYTES; i++)
    src[i] = pattern(i);
  memset(&tc, 0, sizeof tc);
  tc.cert_file = C.server_cert;
  tc.key_file = C.server_key;
  tc.no_ktls = 1;
  assert_int_equal(hr__tls_ctx_new(&cx, 1, &tc, NULL, why, sizeof why), 0);
  memset(&p, 0, sizeof p);
  tcp_pair(&fd, &p.fd, 1);
  p.server = 0;
  assert_int_equal(hr__tls_new(&t, cx, fd, NULL, why, sizeof why), 0);
  pthread_create(&p.th, NULL, reader_main, &p);

  while (sent < N_BYTES) {
    struct iovec iov[16];
    size_t pos = 0, total = 0;
    int n = 0, c = 0, rev;
    ssize_t w, r;

    assert_true(++turns < 1000000);
    rev = wait_for(t, fd, HR_POLL_IN | HR_POLL_OUT);
    if (rev & HR_POLL_IN) {
      /* The peer's word (and its key update) arrive while we send. */
      do {
        r = hr__tls_recv(t, rbuf, sizeof rbuf, 0);
        if (r > 0)
          got_ku += (size_t)r;
      } while (r > 0 || (r < 0 && errno == EINTR));
      assert_true(r < 0 && errno == EAGAIN);
    }
    if (!(rev & HR_POLL_OUT))
      continue;
    /* The items from `sent` on, the first one's rest as the engine hands
     * it: the bytes not reported come again, from the same place. */
    while (pos + cuts[c % 12] <= sent) {
      pos += cuts[c % 12];
      c++;
    }
    while (n < 16 && pos < N_BYTES) {
      size_t end = pos + cuts[c % 12], from = pos > sent ? pos : sent;
      if (end > N_BYTES)
        end = N_BYTES;
      iov[n].iov_base = src + from;
      iov[n].iov_len = end - from;
      total += end - from;
      n++;
      pos = end;
      c++;
    }
    w = hr__tls_sendv(t, iov, n);
    if (w < 0) {
      assert_int_equal(errno, EAGAIN);
      short_writes++;
      continue;
    }
    assert_true(w > 0 && (size_t)w <= total);
    if ((size_t)w < total)
      short_writes++;
    sent += (size_t)w;
  }
  /* Everything was reported sent, so nothing waits in our buffer: the
   * close_notify goes behind it once the socket has room. */
  while (!(wait_for(t, fd, HR_POLL_OUT) & HR_POLL_OUT))
    ;
  hr__tls_close_notify(t);
  shutdown(fd, SHUT_WR);
  pthread_join(p.th, NULL);
  fprintf(stderr, "  %d short writes, %d key updates seen by the peer\n",
          short_writes, p.key_updates);
  if (p.fail[0])
    fprintf(stderr, "  peer: %s\n", p.fail);
  assert_true(p.ok);
  assert_true(short_writes > 0);
  /* Our answer to the key update it asked for, in order. */
  assert_true(p.key_updates >= 1);
  assert_true(p.close_notify);
  /* Its word arrived (read while sending, under the new keys). */
  while (got_ku < 2) {
    ssize_t r;
    wait_for(t, fd, HR_POLL_IN);
    r = hr__tls_recv(t, rbuf, sizeof rbuf, 0);
    if (r <= 0)
      break;
    got_ku += (size_t)r;
  }
  assert_int_equal(got_ku, 2);
  hr__tls_del(t);
  hr__tls_ctx_del(cx);
  close(fd);
  close(p.fd);
  free(src);
}

static void test_recv(void **state) {
  hr__tls_ctx *cx;
  hr__tls *t;
  hr_tls_config tc;
  peer p;
  char why[256] = "";
  uint8_t *dst = malloc(N_BYTES + 1);
  size_t got = 0, k = 0;
  int fd, eof = 0, drains = 0;

  (void)state;
  memset(&tc, 0, sizeof tc);
  tc.ca_file = C.ca;
  tc.no_ktls = 1;
  assert_int_equal(hr__tls_ctx_new(&cx, 0, &tc, NULL, why, sizeof why), 0);
  memset(&p, 0, sizeof p);
  tcp_pair(&fd, &p.fd, 0);
  p.server = 1;
  assert_int_equal(hr__tls_new(&t, cx, fd, "127.0.0.1", why, sizeof why),
                   0);
  pthread_create(&p.th, NULL, writer_main, &p);
  while (!eof) {
    /* Like the engine's read loop: a budget, then drain what we hold. */
    size_t budget = 40000;
    /* The first call starts the handshake (the ClientHello). */
    if (k && !(wait_for(t, fd, HR_POLL_IN) & HR_POLL_IN))
      fail_msg("stalled at %zu of %u bytes (peer: %s)", got, N_BYTES,
               p.fail);
    for (;;) {
      int draining = budget == 0;
      size_t want = 1 + (k++ * 4099) % 70000;
      ssize_t r;
      if (draining && !hr__tls_pending(t))
        break;
      drains += draining;
      if (want > N_BYTES + 1 - got)
        want = N_BYTES + 1 - got;
      r = hr__tls_recv(t, dst + got, want, draining);
      if (r == 0) {
        eof = 1;
        break;
      }
      if (r < 0) {
        assert_int_equal(errno, EAGAIN);
        break;
      }
      got += (size_t)r;
      budget -= (size_t)r < budget ? (size_t)r : budget;
    }
  }
  pthread_join(p.th, NULL);
  if (p.fail[0])
    fprintf(stderr, "  peer: %s\n", p.fail);
  assert_true(p.ok);
  assert_int_equal(got, N_BYTES);
  for (size_t i = 0; i < N_BYTES; i++)
    if (dst[i] != pattern(i))
      fail_msg("byte %zu differs", i);
  /* Bytes held past the budget were drained. */
  assert_true(drains > 0);
  hr__tls_del(t);
  hr__tls_ctx_del(cx);
  close(fd);
  close(p.fd);
  free(dst);
}

/* ---- what ends a read that took several records -------------------------- */

#define REC_BYTES 1000

typedef struct ender {
  pthread_t th;
  int fd;
  int corrupt; /* the second record's tag is damaged (else: close_notify) */
  size_t wire; /* bytes written after the "go" */
  char fail[160];
} ender;

/* Server peer: after our "go", a 1000-byte record, then a damaged record
 * or a close_notify, all in one write(), so that one recv() of ours gets
 * them together. */
static void *ender_main(void *arg) {
  ender *e = arg;
  peer p;
  SSL_CTX *ctx;
  SSL *ssl;
  BIO *mem;
  uint8_t rec[REC_BYTES];
  char go, *wire;
  long n;

  memset(&p, 0, sizeof p);
  p.fd = e->fd;
  p.server = 1;
  ssl = peer_ssl(&p, &ctx);
  for (size_t i = 0; i < sizeof rec; i++)
    rec[i] = pattern(i);
  if (SSL_accept(ssl) != 1 || SSL_read(ssl, &go, 1) != 1) {
    snprintf(e->fail, sizeof e->fail, "handshake or go failed");
    goto out;
  }
  mem = BIO_new(BIO_s_mem());
  SSL_set0_wbio(ssl, mem);
  if (SSL_write(ssl, rec, REC_BYTES) != REC_BYTES ||
      (e->corrupt ? SSL_write(ssl, rec, REC_BYTES) != REC_BYTES
                  : SSL_shutdown(ssl) < 0)) {
    snprintf(e->fail, sizeof e->fail, "writing the records failed");
    goto out;
  }
  n = BIO_get_mem_data(mem, &wire);
  if (e->corrupt)
    wire[n - 1] ^= 0x5a; /* the last byte of the second record's tag */
  e->wire = (size_t)n;
  if (write(e->fd, wire, (size_t)n) != n)
    snprintf(e->fail, sizeof e->fail, "write failed");
out:
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  ERR_clear_error();
  return NULL;
}

/* A read that reads a record and then meets the peer's close or a record
 * that does not decrypt returns the record's bytes; the object says it
 * holds something more, and the next read returns the close (0) or the
 * failure (EPROTO, with the message written). */
static void run_ender(int corrupt) {
  hr__tls_ctx *cx;
  hr__tls *t;
  hr_tls_config tc;
  ender e;
  char why[256] = "";
  uint8_t buf[65536];
  struct iovec go = {(void *)"g", 1};
  int fd, avail = 0, k;
  ssize_t r;

  memset(&tc, 0, sizeof tc);
  tc.ca_file = C.ca;
  tc.no_ktls = 1;
  assert_int_equal(hr__tls_ctx_new(&cx, 0, &tc, NULL, why, sizeof why), 0);
  memset(&e, 0, sizeof e);
  e.corrupt = corrupt;
  tcp_pair(&fd, &e.fd, 0);
  assert_int_equal(hr__tls_new(&t, cx, fd, "127.0.0.1", why, sizeof why),
                   0);
  pthread_create(&e.th, NULL, ender_main, &e);
  for (k = 0; !hr__tls_ready(t); k++) {
    assert_true(k < 1000);
    r = hr__tls_recv(t, buf, sizeof buf, 0);
    assert_true(r < 0 && errno == EAGAIN);
    if (!hr__tls_ready(t))
      assert_true(wait_for(t, fd, HR_POLL_IN) != 0);
  }
  while ((r = hr__tls_sendv(t, &go, 1)) < 0 && errno == EAGAIN)
    wait_for(t, fd, HR_POLL_OUT);
  assert_int_equal(r, 1);
  pthread_join(e.th, NULL);
  if (e.fail[0])
    fail_msg("peer: %s", e.fail);
  /* Everything has arrived: one recv() takes both records. */
  for (k = 0; (size_t)avail < e.wire; k++) {
    assert_true(k < 10000);
    assert_int_equal(ioctl(fd, FIONREAD, &avail), 0);
    if ((size_t)avail < e.wire)
      usleep(1000);
  }
  r = hr__tls_recv(t, buf, sizeof buf, 0);
  assert_int_equal(r, REC_BYTES);
  for (size_t i = 0; i < REC_BYTES; i++)
    assert_int_equal(buf[i], pattern(i));
  assert_true(hr__tls_pending(t));
  r = hr__tls_recv(t, buf, sizeof buf, 0);
  if (corrupt) {
    assert_int_equal(r, -1);
    assert_int_equal(errno, EPROTO);
    if (!strstr(why, "TLS connection failed"))
      fail_msg("message: %s", why);
    r = hr__tls_recv(t, buf, sizeof buf, 0);
    assert_int_equal(r, -1);
    assert_int_equal(errno, EPROTO);
  } else {
    assert_int_equal(r, 0);
    assert_string_equal(why, "");
  }
  hr__tls_del(t);
  hr__tls_ctx_del(cx);
  close(fd);
  close(e.fd);
}

static void test_recv_then_close(void **state) {
  (void)state;
  run_ender(0);
}

static void test_recv_then_bad_record(void **state) {
  (void)state;
  run_ender(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_send),
      cmocka_unit_test(test_recv),
      cmocka_unit_test(test_recv_then_close),
      cmocka_unit_test(test_recv_then_bad_record),
  };

  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
