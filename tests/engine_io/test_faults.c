/*
 * The fault suite: a peer that closes at every message boundary and in
 * the middle of every message (header, TENSOR_DATA sub-header, payload)
 * of a GET, a PUT and a composite transfer, on either side.
 *
 * The byte streams are first recorded from a healthy exchange (the
 * engine's taps), then replayed cut short by a raw socket peer.  The
 * engine on the other side must report a clean error, free everything
 * (ASan/LSan builds check that) and, for a server, keep serving: a
 * healthy connection kept open through the whole suite is used after
 * every fault.
 */
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "tc.h"

#define FRAME 65536u

typedef struct bytes {
  uint8_t *p;
  size_t n, cap;
} bytes;

static void tap(const void *b, size_t n, void *ud) {
  bytes *x = ud;
  if (x->n + n > x->cap) {
    x->cap = (x->n + n) * 2;
    x->p = realloc(x->p, x->cap);
    assert_non_null(x->p);
  }
  memcpy(x->p + x->n, b, n);
  x->n += n;
}

/* Records rx and tx of one connection. */
typedef struct rec2 {
  bytes rx, tx;
} rec2;

static void tap_rx(const void *b, size_t n, void *ud) {
  tap(b, n, &((rec2 *)ud)->rx);
}
static void tap_tx(const void *b, size_t n, void *ud) {
  tap(b, n, &((rec2 *)ud)->tx);
}

typedef struct fx {
  tl_env *env;
  tl_server srv;
  hr_engine *ce;
  tc_conn healthy;
  hr_tensor *g, *c, *p, *pc;
  rec2 get_g, get_c, put_p, put_c;
  uint8_t buf[1 << 17];
} fx;

static hr_tensor *composite(uint32_t seed) {
  uint64_t s[1] = {100000};
  hr_tensor *m[2], *c;
  hr_descriptor head;
  hr_wire_status st;

  m[0] = tl_dense(HR_ELEM_UINT8, 1, s, seed);
  m[1] = tl_dense(HR_ELEM_UINT8, 1, s, seed + 1);
  memset(&head, 0, sizeof head);
  head.descriptor_version = 1;
  head.layout.tag = HR_LAYOUT_COMPOSITE;
  head.params.member_count = 2;
  head.params.rule = HR_COMPOSITE_TUPLE;
  assert_int_equal(hr_tensor_new_composite(&c, &head, m, 2, NULL, &st), 0);
  hr_tensor_unref(m[0]);
  hr_tensor_unref(m[1]);
  return c;
}

/* Runs the loop until the server holds at most `n` connections. */
static void wait_server_conns(fx *f, size_t n) {
  assert_true(tl_wait_conns(f->env, f->srv.e, n));
}

/* Records a healthy GET or PUT on a fresh connection. */
static void record(fx *f, rec2 *r, const char *key, hr_tensor *put) {
  tc_conn c;
  tc_res res;

  memset(r, 0, sizeof *r);
  tc_connect(f->env, f->ce, f->srv.url, &c, NULL);
  hr_conn_set_tap(c.c, tap_rx, tap_tx, r);
  assert_true(tc_wait_up(&c, TL_WAIT_MS));
  if (put) {
    assert_int_equal(tc_put(&c, key, 0, put, &res), 0);
    assert_int_equal(hr_store_remove(f->srv.store, key, strlen(key)), 0);
  } else {
    assert_int_equal(tc_get_key(&c, key, &res), 0);
    tc_res_clear(&res);
  }
  tc_close(&c);
}

static int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  hr_engine_config ec;
  uint64_t s[1] = {300000};

  f->env = tl_new(TL_EPOLL);
  hr_engine_config_default(&ec);
  ec.session.frame_data_size = FRAME;
  tl_server_start(f->env, &f->srv, &ec, NULL);
  f->ce = tl_engine(f->env, &ec);
  f->g = tl_dense(HR_ELEM_UINT8, 1, s, 1);
  f->c = composite(2);
  f->p = tl_dense(HR_ELEM_UINT8, 1, s, 3);
  f->pc = composite(4);
  tl_put(&f->srv, "g", f->g);
  tl_put(&f->srv, "c", f->c);
  record(f, &f->get_g, "g", NULL);
  record(f, &f->get_c, "c", NULL);
  record(f, &f->put_p, "p", f->p);
  record(f, &f->put_c, "pc", f->pc);
  tc_open(f->env, f->ce, f->srv.url, &f->healthy);
  /* The recording connections are gone on the server's side too: the
   * tests count the server's connections from here. */
  wait_server_conns(f, 1);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;
  rec2 *all[4] = {&f->get_g, &f->get_c, &f->put_p, &f->put_c};
  int i;

  tc_close(&f->healthy);
  tl_engine_finish(f->env, f->ce);
  tl_server_stop(f->env, &f->srv);
  tl_free(f->env);
  for (i = 0; i < 4; i++) {
    free(all[i]->rx.p);
    free(all[i]->tx.p);
  }
  hr_tensor_unref(f->g);
  hr_tensor_unref(f->c);
  hr_tensor_unref(f->p);
  hr_tensor_unref(f->pc);
  free(f);
  return 0;
}

/* The cut points of a recorded stream: every message boundary, the middle
 * of each header, of each TENSOR_DATA sub-header and of each payload;
 * ascending, starting at `from` (the byte after the HELLO). */
static size_t cuts_of(const bytes *b, size_t from, size_t *out, size_t max) {
  size_t off = 0, n = 0;

  while (off + HR_HEADER_SIZE <= b->n) {
    hr_msg_header h;
    hr_wire_parse_header(b->p + off, &h);
    /* The closing GOAWAY is not part of the transfer. */
    if (h.type == HR_MSG_GOAWAY)
      break;
    if (off >= from && n + 4 <= max) {
      out[n++] = off;
      out[n++] = off + HR_HEADER_SIZE / 2;
      if (h.type == HR_MSG_TENSOR_DATA)
        out[n++] = off + HR_HEADER_SIZE + 6;
      if (h.payload_length > 1)
        out[n++] = off + HR_HEADER_SIZE + h.payload_length / 2;
    }
    off += HR_HEADER_SIZE + h.payload_length;
  }
  return n;
}

/* The offset after the first `k` messages. */
static size_t msgs_end(const bytes *b, int k) {
  size_t off = 0;

  while (k-- > 0 && off + HR_HEADER_SIZE <= b->n) {
    hr_msg_header h;
    hr_wire_parse_header(b->p + off, &h);
    off += HR_HEADER_SIZE + h.payload_length;
  }
  return off;
}

static size_t first_msg_len(const bytes *b) {
  return msgs_end(b, 1);
}

/* After a fault: the server still serves, the healthy connection too,
 * and the faulty connection is gone. */
static void still_serving(fx *f, size_t conns_before) {
  tc_res r;
  tc_conn fresh;

  assert_int_equal(tc_get_key(&f->healthy, "g", &r), 0);
  assert_memory_equal(hr_tensor_buffer(r.t, 0), hr_tensor_buffer(f->g, 0),
                      hr_tensor_bytes(f->g));
  tc_res_clear(&r);
  tc_open(f->env, f->ce, f->srv.url, &fresh);
  assert_int_equal(tc_ping(&fresh, &r), 0);
  tc_close(&fresh);
  wait_server_conns(f, conns_before);
  assert_int_equal(hr_engine_conn_count(f->srv.e), conns_before);
}

/* ---- the server's side: a raw client dies --------------------------- */

/* Sends the recorded client bytes up to `cut`, then closes. */
static void raw_client_cut(fx *f, const bytes *c2s, size_t cut,
                           size_t read_first) {
  int fd = tl_raw_connect(f->srv.port);
  assert_true(fd >= 0);
  assert_int_equal(tl_raw_send(f->env, fd, c2s->p, cut), 0);
  /* Optionally read part of the answer before dying. */
  if (read_first) {
    size_t got = 0;
    while (got < read_first) {
      struct pollfd p = {fd, POLLIN, 0};
      ssize_t k;
      if (poll(&p, 1, 0) != 1) {
        tl_spin(f->env, 1);
        continue;
      }
      k = recv(fd, f->buf,
               read_first - got < sizeof f->buf ? read_first - got
                                                : sizeof f->buf,
               MSG_DONTWAIT);
      if (k <= 0)
        break;
      got += (size_t)k;
    }
  } else {
    tl_spin(f->env, 1);
  }
  close(fd);
  tl_spin(f->env, 5);
}

static void server_side_put(fx *f, const rec2 *r, const char *key) {
  size_t cuts[512], n, i, base = hr_engine_conn_count(f->srv.e);

  n = cuts_of(&r->tx, first_msg_len(&r->tx), cuts, 512);
  assert_true(n > 10);
  for (i = 0; i < n; i++) {
    raw_client_cut(f, &r->tx, cuts[i], 0);
    still_serving(f, base);
    /* A torn PUT stores nothing. */
    {
      hr_tensor *t = NULL;
      assert_int_equal(hr_store_get(f->srv.store, key, strlen(key), &t),
                       HR_ERR_NOT_FOUND);
    }
  }
}

static void test_server_put_torn(void **state) {
  fx *f = *state;
  server_side_put(f, &f->put_p, "p");
}

static void test_server_composite_put_torn(void **state) {
  fx *f = *state;
  server_side_put(f, &f->put_c, "pc");
}

static void test_server_get_reader_dies(void **state) {
  fx *f = *state;
  const rec2 *recs[2] = {&f->get_g, &f->get_c};
  size_t base = hr_engine_conn_count(f->srv.e);
  int k;

  for (k = 0; k < 2; k++) {
    size_t cuts[512], n, i;
    /* The client sent HELLO + request; it reads the answer up to each
     * cut point, then closes. */
    n = cuts_of(&recs[k]->rx, 0, cuts, 512);
    for (i = 0; i < n; i++) {
      raw_client_cut(f, &recs[k]->tx, msgs_end(&recs[k]->tx, 2), cuts[i] + 1);
      still_serving(f, base);
    }
  }
}

/* ---- the client's side: a raw server dies --------------------------- */

typedef struct rawsrv {
  int lfd, port, fd;
  tc_conn c;
} rawsrv;

static void raw_listen(fx *f, rawsrv *rs) {
  char url[64];
  struct pollfd p;

  rs->lfd = tl_raw_listen(&rs->port);
  assert_true(rs->lfd >= 0);
  snprintf(url, sizeof url, "127.0.0.1:%d", rs->port);
  tc_connect(f->env, f->ce, url, &rs->c, NULL);
  p.fd = rs->lfd;
  p.events = POLLIN;
  while (poll(&p, 1, 0) != 1)
    tl_spin(f->env, 1);
  rs->fd = accept(rs->lfd, NULL, NULL);
  assert_true(rs->fd >= 0);
}

static void client_side_get(fx *f, const rec2 *r, const char *key) {
  size_t cuts[512], n, i;

  n = cuts_of(&r->rx, 0, cuts, 512);
  for (i = 0; i < n; i++) {
    rawsrv rs;
    hr_msg m;
    tc_res res;
    int started = 0;

    raw_listen(f, &rs);
    assert_true(tl_raw_expect(f->env, rs.fd, HR_MSG_CLIENT_HELLO, 0, f->buf,
                              sizeof f->buf, &m, TL_WAIT_MS));
    if (cuts[i] > first_msg_len(&r->rx)) {
      /* Past the SERVER_HELLO: a request is on its way. */
      assert_int_equal(
          tl_raw_send(f->env, rs.fd, r->rx.p, first_msg_len(&r->rx)), 0);
      assert_true(tc_wait_up(&rs.c, TL_WAIT_MS));
      {
        hr_get_opts o;
        tc_opts(&o, key);
        assert_int_equal(tc_get_start(&rs.c, &o, &res, NULL), 0);
        started = 1;
      }
      assert_true(tl_raw_expect(f->env, rs.fd, HR_MSG_TENSOR_REQUEST, 1, f->buf,
                                sizeof f->buf, &m, TL_WAIT_MS));
      assert_int_equal(tl_raw_send(f->env, rs.fd,
                                   r->rx.p + first_msg_len(&r->rx),
                                   cuts[i] - first_msg_len(&r->rx)),
                       0);
    } else {
      assert_int_equal(tl_raw_send(f->env, rs.fd, r->rx.p, cuts[i]), 0);
    }
    close(rs.fd);
    close(rs.lfd);
    assert_true(tc_wait_closed(&rs.c, TL_WAIT_MS));
    assert_int_not_equal(rs.c.status, 0);
    if (started) {
      assert_true(res.done);
      assert_int_not_equal(res.status, 0);
      assert_null(res.t);
    }
  }
}

static void test_client_get_torn(void **state) {
  fx *f = *state;
  client_side_get(f, &f->get_g, "g");
}

static void test_client_composite_get_torn(void **state) {
  fx *f = *state;
  client_side_get(f, &f->get_c, "c");
}

static void test_client_put_server_dies(void **state) {
  fx *f = *state;
  const rec2 *recs[2] = {&f->put_p, &f->put_c};
  hr_tensor *ts[2] = {f->p, f->pc};
  int k;

  for (k = 0; k < 2; k++) {
    size_t cuts[512], n, i;
    n = cuts_of(&recs[k]->tx, first_msg_len(&recs[k]->tx), cuts, 512);
    for (i = 0; i < n; i++) {
      rawsrv rs;
      tc_res res;
      size_t want = cuts[i] - first_msg_len(&recs[k]->tx), got = 0;
      hr_msg m;
      raw_listen(f, &rs);
      assert_true(tl_raw_expect(f->env, rs.fd, HR_MSG_CLIENT_HELLO, 0, f->buf,
                                sizeof f->buf, &m, TL_WAIT_MS));
      assert_int_equal(tl_raw_send(f->env, rs.fd, recs[k]->rx.p,
                                   first_msg_len(&recs[k]->rx)),
                       0);
      assert_true(tc_wait_up(&rs.c, TL_WAIT_MS));
      assert_int_equal(tc_put_start(&rs.c, "x", 0, ts[k], &res), 0);
      /* The raw server reads `want` bytes of the PUT, then dies. */
      while (got < want) {
        struct pollfd p = {rs.fd, POLLIN, 0};
        ssize_t r;
        if (poll(&p, 1, 0) != 1) {
          tl_spin(f->env, 1);
          continue;
        }
        r = recv(rs.fd, f->buf,
                 want - got < sizeof f->buf ? want - got : sizeof f->buf,
                 MSG_DONTWAIT);
        if (r <= 0)
          break;
        got += (size_t)r;
      }
      close(rs.fd);
      close(rs.lfd);
      assert_true(tc_wait_closed(&rs.c, TL_WAIT_MS));
      assert_int_not_equal(rs.c.status, 0);
      assert_true(res.done);
      assert_int_not_equal(res.status, 0);
    }
  }
}

int main(void) {
  /* The default action: a SIGPIPE from a write to a dead peer would kill
   * the test (the engine must never raise one). */
  signal(SIGPIPE, SIG_DFL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_server_put_torn),
      cmocka_unit_test(test_server_composite_put_torn),
      cmocka_unit_test(test_server_get_reader_dies),
      cmocka_unit_test(test_client_get_torn),
      cmocka_unit_test(test_client_composite_get_torn),
      cmocka_unit_test(test_client_put_server_dies),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
