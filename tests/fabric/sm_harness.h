/*
 * A harness for the RDMA handshake against the fake fabric: two peers
 * (A, the source owner, and B, the receiver), each with a fake endpoint, a
 * connection and one hr_rdma.  Every message a peer produces is encoded
 * with the wire codec and decoded again before the other peer sees it, so
 * the handshake's output is checked against the codec on the way.
 */
#ifndef HR_TEST_SM_HARNESS_H
#define HR_TEST_SM_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/fabric.h>

#include "fabric/hr_fab_fake.h"

#define H_MAXMSG 32
#define H_MAXEV 8

typedef struct h_event {
  int kind;
  uint32_t code;
  int sent;
  int retry;
  int destination;
  uint64_t bytes;
  char message[300];
  char fallback[300];
} h_event;

typedef struct h_side {
  const char *name;
  hr__fake_ep *ep;
  hr_rdma_conn *conn;
  hr_rdma *x;
  /* Messages sent, encoded, waiting for delivery to the other side. */
  uint8_t out[H_MAXMSG][2048];
  size_t out_len[H_MAXMSG];
  uint32_t out_type[H_MAXMSG];
  int nout, next_out;
  /* Every message type sent, in order. */
  uint32_t sent[H_MAXMSG];
  int nsent;
  h_event ev[H_MAXEV];
  int nev;
  int released;
  int del_on_event;    /* hr_rdma_del() from inside on_event */
  int commit_on_ready; /* PUT receiver: commit code + 1 on DATA_READY */
  uint8_t *buf[HR_MAX_BUFFERS];
  /* The last RDMA_REGISTER this side sent. */
  hr_fabric_key last_key;
} h_side;

typedef struct h_pair {
  const hr_mem *mem;
  hr__fake_world *w;
  h_side a, b;
  hr_descriptor desc;
  uint64_t total;
  int dir;
} h_pair;

static int h_send_msg(hr_rdma *x, const hr_msg *m, void *ud) {
  h_side *s = ud;
  (void)x;
  assert_true(s->nout < H_MAXMSG);
  int64_t n = hr_wire_encode(m, s->out[s->nout], sizeof s->out[0]);
  assert_true(n > 0);
  /* The codec must take back what the handshake wrote. */
  hr_msg back;
  hr_wire_status st;
  assert_int_equal(hr_wire_decode(s->out[s->nout], (size_t)n, NULL, &back, &st),
                   0);
  if (m->hdr.type == HR_MSG_RDMA_REGISTER) {
    s->last_key.length = m->u.rdma.length;
    s->last_key.address = m->u.rdma.address;
    s->last_key.key = m->u.rdma.key;
    s->last_key.raw_key_len = m->u.rdma.raw_key_len;
    if (m->u.rdma.raw_key_len)
      memcpy(s->last_key.raw_key, m->u.rdma.raw_key, m->u.rdma.raw_key_len);
  }
  s->out_len[s->nout] = (size_t)n;
  s->out_type[s->nout] = m->hdr.type;
  s->nout++;
  s->sent[s->nsent++] = m->hdr.type;
  return 0;
}

static void h_on_event(hr_rdma *x, const hr_rdma_event *ev, void *ud) {
  h_side *s = ud;
  assert_true(s->nev < H_MAXEV);
  h_event *e = &s->ev[s->nev++];
  e->kind = ev->kind;
  e->code = ev->wire_error;
  e->sent = ev->wire_error_sent;
  e->retry = ev->retry;
  e->destination = ev->destination;
  e->bytes = ev->bytes;
  assert_non_null(ev->message);
  assert_non_null(ev->fallback);
  snprintf(e->message, sizeof e->message, "%s", ev->message);
  snprintf(e->fallback, sizeof e->fallback, "%s", ev->fallback);
  if (s->del_on_event) {
    hr_rdma_del(x);
    s->x = NULL;
    return;
  }
  if (ev->kind == HR_RDMA_EV_DATA_READY && s->commit_on_ready)
    assert_int_equal(hr_rdma_commit(x, (uint32_t)(s->commit_on_ready - 1),
                                    "refused by the test"),
                     0);
}

static void h_release(void *ctx) {
  h_side *s = ctx;
  s->released++;
}

static const hr_rdma_callbacks h_cbs = {sizeof(hr_rdma_callbacks), h_send_msg,
                                        h_on_event};

/* Makes the connection of side `s` towards `peer`. */
static void h_conn(h_pair *p, h_side *s, h_side *peer, uint32_t caps,
                   uint32_t peer_caps) {
  hr_rdma_conn_config cc;
  hr_rdma_conn_config_init(&cc, hr__fake_ops(), s->ep, caps, NULL);
  cc.peer_caps = peer_caps;
  cc.peer_provider = (const uint8_t *)"fake";
  cc.peer_provider_len = 4;
  cc.peer_endpoint = (const uint8_t *)peer->name;
  cc.peer_endpoint_len = (uint16_t)strlen(peer->name);
  cc.min_bytes = 1;
  assert_int_equal(hr_rdma_conn_new(&s->conn, &cc, p->mem), 0);
}

/* A descriptor of `n` UINT8 buffers of the given sizes, alignment 1. */
static void h_desc(h_pair *p, unsigned n, const uint64_t *sizes) {
  memset(&p->desc, 0, sizeof p->desc);
  p->desc.descriptor_version = 1;
  p->desc.element_type = HR_ELEM_UINT8;
  p->desc.rank = 1;
  p->desc.layout.tag = HR_LAYOUT_ROW_MAJOR;
  p->desc.buffer_count = (uint8_t)n;
  p->total = 0;
  for (unsigned k = 0; k < n; k++) {
    p->desc.buffers[k].size_bytes = sizes[k];
    p->total += sizes[k];
  }
  p->desc.shape[0] = p->total;
}

/* Sets up both sides: endpoints (virt_addr/raw_keys), connections with the
 * given capability flags, and buffers (A patterned, B zeroed). */
static void h_setup(h_pair *p, const hr_mem *mem, int dir, uint32_t caps_a,
                    uint32_t caps_b, int virt_addr, int raw_keys, unsigned n,
                    const uint64_t *sizes) {
  memset(p, 0, sizeof *p);
  p->mem = mem;
  p->dir = dir;
  p->a.name = "alice";
  p->b.name = "bob";
  assert_int_equal(hr__fake_world_new(&p->w, mem), 0);
  assert_int_equal(
      hr__fake_ep_new(&p->a.ep, p->w, "alice", virt_addr, raw_keys), 0);
  assert_int_equal(hr__fake_ep_new(&p->b.ep, p->w, "bob", virt_addr, raw_keys),
                   0);
  h_conn(p, &p->a, &p->b, caps_a, caps_b);
  h_conn(p, &p->b, &p->a, caps_b, caps_a);
  h_desc(p, n, sizes);
  for (unsigned k = 0; k < n; k++) {
    p->a.buf[k] = malloc(sizes[k] ? sizes[k] : 1);
    p->b.buf[k] = calloc(1, sizes[k] ? sizes[k] : 1);
    assert_non_null(p->a.buf[k]);
    assert_non_null(p->b.buf[k]);
    for (uint64_t i = 0; i < sizes[k]; i++)
      p->a.buf[k][i] = (uint8_t)(i * 7 + k * 13 + 1);
  }
}

static int h_new(h_pair *p, h_side *s, int side, uint32_t stream,
                 int register_destination, hr_wire_status *st, char *why,
                 size_t cap) {
  hr_rdma_config c;
  memset(&c, 0, sizeof c);
  c.side = side;
  c.direction = p->dir;
  c.stream_id = stream;
  c.desc = &p->desc;
  c.total_data_bytes = p->total;
  c.buffers = (void *const *)s->buf;
  c.register_destination = register_destination;
  c.release = h_release;
  c.release_ctx = s;
  return hr_rdma_new(&s->x, s->conn, &c, &h_cbs, s, p->mem, st, why, cap);
}

/* Creates and starts both handshakes (A first, as a server would after
 * queuing its descriptor). */
static void h_start(h_pair *p, int register_destination) {
  char why[256];
  hr_wire_status st;
  assert_int_equal(h_new(p, &p->a, HR_RDMA_SENDER, 1, 0, &st, why, sizeof why),
                   0);
  assert_int_equal(h_new(p, &p->b, HR_RDMA_RECEIVER, 1, register_destination,
                         &st, why, sizeof why),
                   0);
  assert_int_equal(hr_rdma_start(p->a.x), 0);
  assert_int_equal(hr_rdma_start(p->b.x), 0);
}

/* Delivers the next message `from` sent to `to`'s handshake; returns 0
 * when none waits.  Messages to a finished handshake are dropped (the
 * session would judge them). */
static int h_deliver(h_side *from, h_side *to) {
  if (from->next_out >= from->nout)
    return 0;
  int i = from->next_out++;
  hr_msg m;
  hr_wire_status st;
  assert_int_equal(
      hr_wire_decode(from->out[i], from->out_len[i], NULL, &m, &st), 0);
  if (to->x) {
    int rv = hr_rdma_on_msg(to->x, &m);
    assert_true(rv == 0 || rv == HR_ERR_STATE);
  }
  return 1;
}

/* Runs everything until nothing moves. */
static void h_pump(h_pair *p) {
  for (;;) {
    int moved = 0;
    moved += h_deliver(&p->a, &p->b);
    moved += h_deliver(&p->b, &p->a);
    moved += hr__fake_progress(p->a.ep);
    moved += hr__fake_progress(p->b.ep);
    if (!moved)
      return;
  }
}

static void h_assert_bytes(h_pair *p) {
  for (unsigned k = 0; k < p->desc.buffer_count; k++)
    assert_memory_equal(p->a.buf[k], p->b.buf[k],
                        p->desc.buffers[k].size_bytes);
}

/* Frees everything and checks that nothing stayed registered. */
static void h_teardown(h_pair *p) {
  hr__fake_stats sa, sb;
  hr_rdma_del(p->a.x);
  hr_rdma_del(p->b.x);
  p->a.x = p->b.x = NULL;
  h_pump(p);
  hr__fake_get_stats(p->a.ep, &sa);
  hr__fake_get_stats(p->b.ep, &sb);
  assert_int_equal(sa.live_regs, 0);
  assert_int_equal(sb.live_regs, 0);
  hr_rdma_conn_del(p->a.conn);
  hr_rdma_conn_del(p->b.conn);
  hr__fake_get_stats(p->a.ep, &sa);
  hr__fake_get_stats(p->b.ep, &sb);
  assert_int_equal(sa.peers, 0);
  assert_int_equal(sb.peers, 0);
  hr__fake_ep_del(p->a.ep);
  hr__fake_ep_del(p->b.ep);
  hr__fake_world_del(p->w);
  for (unsigned k = 0; k < HR_MAX_BUFFERS; k++) {
    free(p->a.buf[k]);
    free(p->b.buf[k]);
  }
}

#define CAPS_RDMA HR_CAP_RDMA_DATA_PLANE
#define CAPS_GD (HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT)

#endif /* HR_TEST_SM_HARNESS_H */
