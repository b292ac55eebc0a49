/*
 * End to end over a real libfabric provider on loopback (HR_TEST_PROVIDER:
 * "tcp" for tcp;ofi_rxm, or "shm"): two endpoints in one process, driven
 * by one event loop the way the engine drives them.  GET and PUT, RMA
 * write into a destination registration and tagged messages, byte-exact;
 * keys revoked after use; the registration cache; the loop objects; the
 * peer address checks; provider selection.  Exits 77 when libfabric has
 * no such provider here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "fabric_peer.h"

#ifndef HR_TEST_PROVIDER
#define HR_TEST_PROVIDER "tcp"
#endif

/* 4 MiB + a little in four buffers, gap-free (alignment 0 after odd
 * sizes), moved in 256 KiB RMA pieces, four in flight. */
static const uint64_t SIZES[] = {3u << 20, 64, (1u << 20) + 3, 7};
#define NBUF 4

typedef struct world {
  fpeer a, b; /* a owns the source */
  hr_descriptor d;
  uint64_t total;
  uint8_t *src[NBUF], *dst[NBUF];
} world;

static const char *provider(void) {
  return fp_provider_name(HR_TEST_PROVIDER);
}

static void small_pieces(hr_fabric_config *c) {
  hr_fabric_config_default(c);
  c->rma_chunk = 256u << 10;
  c->window = 4;
}

static void world_open(world *w, uint32_t caps) {
  memset(w, 0, sizeof *w);
  hr_fabric_config c;
  small_pieces(&c);
  assert_int_equal(fp_open(&w->a, "A", provider(), &c), 0);
  assert_int_equal(fp_open(&w->b, "B", provider(), &c), 0);
  fp_connect(&w->a, &w->b, caps, caps);
  fp_desc(&w->d, NBUF, SIZES, NULL);
  w->total = 0;
  for (int k = 0; k < NBUF; k++)
    w->total += SIZES[k];
  fp_buffers(w->src, NBUF, SIZES, 7);
  fp_buffers(w->dst, NBUF, SIZES, 0);
}

static void world_close(world *w) {
  fp_close(&w->a);
  fp_close(&w->b);
  free(w->src[0]);
  free(w->dst[0]);
}

static void assert_moved(const world *w) {
  for (int k = 0; k < NBUF; k++)
    assert_memory_equal(w->src[k], w->dst[k], SIZES[k]);
}

/* One transfer from a to b; stream ids from 1 up. */
static void transfer(world *w, int dir, int dest, uint32_t stream) {
  for (int k = 0; k < NBUF; k++)
    memset(w->dst[k], 0, SIZES[k]);
  hr_rdma_del(w->a.x);
  hr_rdma_del(w->b.x);
  fp_begin(&w->a, HR_RDMA_SENDER, dir, stream, &w->d, w->total,
           (void *const *)w->src, 0);
  fp_begin(&w->b, HR_RDMA_RECEIVER, dir, stream, &w->d, w->total,
           (void *const *)w->dst, dest);
  fpeer *both[2] = {&w->a, &w->b};
  fp_run(both, 2, 60);
  if (w->a.ev[0].kind == HR_RDMA_EV_FAILED)
    fail_msg("sender failed: %s", w->a.ev[0].message);
  if (w->b.ev[0].kind == HR_RDMA_EV_FAILED)
    fail_msg("receiver failed: %s", w->b.ev[0].message);
  assert_int_equal(w->a.ev[w->a.nev - 1].kind, HR_RDMA_EV_COMPLETE);
  assert_int_equal(w->b.ev[w->b.nev - 1].kind, HR_RDMA_EV_COMPLETE);
  assert_int_equal(w->b.ev[0].destination, dest);
  assert_int_equal(w->a.released, 1);
  assert_int_equal(w->b.released, 1);
  assert_moved(w);
}

static void run_transfer(int dir, int dest) {
  world w;
  world_open(&w, dest ? HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT
                      : HR_CAP_RDMA_DATA_PLANE);
  transfer(&w, dir, dest, 1);
  hr_fabric_stats sa, sb;
  hr_fabric_get_stats(w.a.f, &sa);
  hr_fabric_get_stats(w.b.f, &sb);
  if (dest) {
    assert_int_equal(sa.bytes_written, w.total);
    /* 4 MiB + 74 bytes in 256 KiB pieces not crossing buffers. */
    assert_int_equal(sa.pieces, 12 + 1 + 5 + 1);
  } else {
    assert_int_equal(sa.bytes_sent, w.total);
    assert_int_equal(sb.bytes_received, w.total);
    assert_int_equal(sa.pieces, NBUF);
  }
  /* Every remote key was revoked. */
  assert_int_equal(sa.remote_regs, sa.remote_deregs);
  assert_int_equal(sb.remote_regs, sb.remote_deregs);
  assert_int_equal(sb.remote_regs, dest ? 1 : 0);
  world_close(&w);
}

static void test_get_tagged(void **s) {
  (void)s;
  run_transfer(HR_RDMA_GET, 0);
}
static void test_get_write(void **s) {
  (void)s;
  run_transfer(HR_RDMA_GET, 1);
}
static void test_put_tagged(void **s) {
  (void)s;
  run_transfer(HR_RDMA_PUT, 0);
}
static void test_put_write(void **s) {
  (void)s;
  run_transfer(HR_RDMA_PUT, 1);
}

/* A PUT the receiver refuses at commit ends in ERROR, not ACK. */
static void test_put_refused(void **state) {
  (void)state;
  world w;
  world_open(&w, HR_CAP_RDMA_DATA_PLANE);
  w.b.commit_code = HR_WIRE_PUT_REJECTED + 1;
  fp_begin(&w.a, HR_RDMA_SENDER, HR_RDMA_PUT, 1, &w.d, w.total,
           (void *const *)w.src, 0);
  fp_begin(&w.b, HR_RDMA_RECEIVER, HR_RDMA_PUT, 1, &w.d, w.total,
           (void *const *)w.dst, 0);
  fpeer *both[2] = {&w.a, &w.b};
  fp_run(both, 2, 60);
  assert_int_equal(w.a.ev[0].kind, HR_RDMA_EV_FAILED);
  assert_int_equal(w.a.ev[0].code, HR_WIRE_PUT_REJECTED);
  assert_int_equal(w.a.ev[0].retry, 0);
  world_close(&w);
}

static void op_done(hr_fabric_op *op, int status, const char *why) {
  int *out = op->user_data;
  (void)why;
  *out = status == 0 ? 1 : -1;
}

/* After the transfer, the destination key it used opens nothing: an RMA
 * write with it fails and the bytes stay. */
static void test_stale_key(void **state) {
  (void)state;
  world w;
  world_open(&w, HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT);
  transfer(&w, HR_RDMA_GET, 1, 1);
  hr_fabric_key stale = w.b.last_key;
  assert_int_equal(stale.length, w.total);

  /* Another registration made since must not be what the stale key
   * names either. */
  static uint8_t junk[4096];
  memset(junk, 0xee, sizeof junk);
  hr_fabric_region r;
  memset(&r, 0, sizeof r);
  r.nseg = 1;
  r.seg[0].ptr = junk;
  r.seg[0].len = sizeof junk;
  r.length = sizeof junk;

  /* A peer handle towards b, through the ops table. */
  uint8_t addr[600];
  int64_t n = hr_fabric_address(w.b.f, addr, sizeof addr);
  const hr_fabric_ops *ops = hr_fabric_get_ops();
  void *peer;
  char why[256];
  uint16_t plen = (uint16_t)(addr[0] | addr[1] << 8);
  uint16_t elen = (uint16_t)(addr[2 + plen] | addr[3 + plen] << 8);
  assert_int_equal(n, 4 + plen + elen);
  assert_int_equal(ops->peer_add(w.a.f, addr + 2, plen, addr + 4 + plen, elen,
                                 NULL, 0, &peer, why, sizeof why),
                   0);
  int result = 0;
  hr_fabric_op op = {op_done, &result, NULL};
  int rv = ops->write(w.a.f, peer, &r, &stale, &op, why, sizeof why);
  if (rv == 0) {
    fpeer *both[2] = {&w.a, &w.b};
    hr_tstamp end = fp_now() + 2000000000u;
    while (result == 0 && fp_now() < end)
      fp_turn(both, 2, 50);
    /* tcp;ofi_rxm reports the refused key as a completion error; shm
     * drops the write at the target without telling the writer, so the
     * writer's only way out is to close its endpoint. */
    if (result == 0) {
      assert_moved(&w);
      assert_int_equal(hr_fabric_shutdown(w.a.f), 0);
    }
    assert_int_equal(result, -1);
    hr_fabric_stats sa;
    hr_fabric_get_stats(w.a.f, &sa);
    assert_int_equal(sa.ops_failed, 1);
  } else {
    assert_int_equal(rv, HR_ERR_UNSUPPORTED);
  }
  ops->peer_del(w.a.f, peer);
  assert_moved(&w);
  world_close(&w);
}

/* A tensor served twice is registered once locally; each transfer has its
 * own remote key; releasing the buffers invalidates the cache. */
static void test_cache(void **state) {
  (void)state;
  world w;
  world_open(&w, HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT);
  transfer(&w, HR_RDMA_GET, 1, 1);
  hr_fabric_stats s1, s2;
  hr_fabric_get_stats(w.a.f, &s1);
  assert_int_equal(s1.mr_cache_misses, NBUF);
  transfer(&w, HR_RDMA_GET, 1, 3);
  transfer(&w, HR_RDMA_GET, 0, 5);
  hr_fabric_get_stats(w.a.f, &s2);
  assert_int_equal(s2.mr_cache_misses, NBUF);
  assert_int_equal(s2.mr_cache_hits, s1.mr_cache_hits + 2 * NBUF);
  assert_int_equal(s2.remote_regs, 3);
  assert_int_equal(s2.remote_deregs, 3);
  /* The application releases the source tensor. */
  for (int k = 0; k < NBUF; k++)
    hr_fabric_invalidate(w.a.f, w.src[k], SIZES[k]);
  hr_fabric_get_stats(w.a.f, &s2);
  assert_int_equal(s2.mr_cache_invalidations, NBUF);
  assert_int_equal(s2.mr_cache_entries, 0);
  world_close(&w);
}

/* The loop objects: a wait fd where the provider has one, else a timer
 * that is set only while something is outstanding. */
static void test_loop_objects(void **state) {
  (void)state;
  world w;
  world_open(&w, HR_CAP_RDMA_DATA_PLANE);
  hr_fabric_stats st;
  hr_fabric_get_stats(w.a.f, &st);
  fpeer *both[2] = {&w.a, &w.b};
  fp_turn(both, 2, 0);
  if (hr_fabric_fd(w.a.f) >= 0) {
    assert_int_equal(st.wait_fd, 1);
    /* Armed by fi_trywait: no timer. */
    assert_int_equal(hr_fabric_get_expiry(w.a.f), HR_TSTAMP_NEVER);
  } else {
    assert_int_equal(st.wait_fd, 0);
    /* Idle: no polling at all. */
    assert_int_equal(hr_fabric_get_expiry(w.a.f), HR_TSTAMP_NEVER);
    fp_begin(&w.b, HR_RDMA_RECEIVER, HR_RDMA_GET, 1, &w.d, w.total,
             (void *const *)w.dst, 0);
    fp_begin(&w.a, HR_RDMA_SENDER, HR_RDMA_GET, 1, &w.d, w.total,
             (void *const *)w.src, 0);
    /* The sender's remote key is live: a poll is due within 50 us. */
    hr_tstamp now = fp_now();
    assert_int_equal(hr_fabric_progress(w.a.f, now), 0);
    hr_tstamp e = hr_fabric_get_expiry(w.a.f);
    assert_true(e != HR_TSTAMP_NEVER && e <= now + 50000);
    fp_run(both, 2, 60);
    assert_moved(&w);
    assert_int_equal(hr_fabric_progress(w.a.f, fp_now()), 0);
    assert_int_equal(hr_fabric_get_expiry(w.a.f), HR_TSTAMP_NEVER);
  }
  /* Neither tcp nor shm here reaches device memory: no GPUDirect. */
  assert_int_equal(hr_fabric_capabilities(w.a.f), HR_CAP_RDMA_DATA_PLANE);
  world_close(&w);
}

/* Hostile FABRIC_ADDRESS values are refused before they reach the AV. */
static void test_peer_checks(void **state) {
  (void)state;
  world w;
  world_open(&w, HR_CAP_RDMA_DATA_PLANE);
  const hr_fabric_ops *ops = hr_fabric_get_ops();
  uint8_t addr[600];
  int64_t n = hr_fabric_address(w.b.f, addr, sizeof addr);
  uint16_t plen = (uint16_t)(addr[0] | addr[1] << 8);
  uint16_t elen = (uint16_t)(addr[2 + plen] | addr[3 + plen] << 8);
  assert_int_equal(n, 4 + plen + elen);
  const uint8_t *ep = addr + 4 + plen;
  void *peer;
  char why[256];
  /* Another provider. */
  assert_int_equal(ops->peer_add(w.a.f, (const uint8_t *)"efa", 3, ep, elen,
                                 NULL, 0, &peer, why, sizeof why),
                   HR_ERR_UNSUPPORTED);
  assert_non_null(strstr(why, "not ours"));
  /* A name of the wrong size or shape. */
  assert_int_equal(ops->peer_add(w.a.f, addr + 2, plen, ep,
                                 (uint16_t)(elen - 1), NULL, 0, &peer, why,
                                 sizeof why),
                   HR_ERR_UNSUPPORTED);
  uint8_t big[300] = {0};
  assert_int_equal(ops->peer_add(w.a.f, addr + 2, plen, big, sizeof big, NULL,
                                 0, &peer, why, sizeof why),
                   HR_ERR_UNSUPPORTED);
  if (strcmp(HR_TEST_PROVIDER, "tcp") == 0) {
    /* A fabric address on another host than the control connection's
     * peer (compared only; nothing is sent). */
    struct sockaddr_in other;
    memset(&other, 0, sizeof other);
    other.sin_family = AF_INET;
    other.sin_addr.s_addr = htonl(0x0a000001);
    assert_int_equal(ops->peer_add(w.a.f, addr + 2, plen, ep, elen, &other,
                                   sizeof other, &peer, why, sizeof why),
                     HR_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "another host"));
  }
  /* The same endpoint twice is one AV entry, counted. */
  void *p1, *p2;
  assert_int_equal(ops->peer_add(w.a.f, addr + 2, plen, ep, elen, NULL, 0, &p1,
                                 why, sizeof why),
                   0);
  assert_int_equal(ops->peer_add(w.a.f, addr + 2, plen, ep, elen, NULL, 0, &p2,
                                 why, sizeof why),
                   0);
  assert_ptr_equal(p1, p2);
  ops->peer_del(w.a.f, p1);
  ops->peer_del(w.a.f, p2);
  world_close(&w);
}

/* Receives posted, then the connection goes: the cancel completes, the
 * buffers are released, and the fabric closes idle. */
static void test_cancel_receives(void **state) {
  (void)state;
  world w;
  world_open(&w, HR_CAP_RDMA_DATA_PLANE);
  fp_begin(&w.a, HR_RDMA_SENDER, HR_RDMA_GET, 1, &w.d, w.total,
           (void *const *)w.src, 0);
  fp_begin(&w.b, HR_RDMA_RECEIVER, HR_RDMA_GET, 1, &w.d, w.total,
           (void *const *)w.dst, 0);
  fpeer *just_b[1] = {&w.b};
  fpeer *both[2] = {&w.a, &w.b};
  /* Let b take SOURCE and post its receives, without a seeing READY. */
  hr_tstamp end = fp_now() + 20000000000ull;
  while (hr_rdma_state(w.b.x) != HR_RDMA_ST_AWAIT_END && fp_now() < end)
    fp_turn(just_b, 1, 10);
  assert_int_equal(hr_rdma_state(w.b.x), HR_RDMA_ST_AWAIT_END);
  assert_int_equal(hr_rdma_abort(w.b.x, 0, "connection closed"), 0);
  assert_int_equal(hr_rdma_abort(w.a.x, 0, "connection closed"), 0);
  fp_run(both, 2, 60);
  assert_int_equal(w.a.released, 1);
  assert_int_equal(w.b.released, 1);
  hr_fabric_stats sb;
  hr_fabric_get_stats(w.b.f, &sb);
  assert_int_equal(sb.ops_failed, 1);
  world_close(&w);
}

/* Two receivers of one tag from one peer at once: the second refuses. */
static void test_tag_busy(void **state) {
  (void)state;
  world w;
  world_open(&w, HR_CAP_RDMA_DATA_PLANE);
  fpeer b2 = w.b;
  b2.name = "B2";
  b2.x = NULL;
  fp_begin(&w.b, HR_RDMA_RECEIVER, HR_RDMA_GET, 1, &w.d, w.total,
           (void *const *)w.dst, 0);
  fp_begin(&b2, HR_RDMA_RECEIVER, HR_RDMA_GET, 1, &w.d, w.total,
           (void *const *)w.dst, 0);
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_RDMA_REGISTER;
  m.hdr.stream_id = 1;
  m.u.rdma.role = HR_RDMA_SOURCE;
  m.u.rdma.length = w.total;
  /* b2 shares b's control socket: drain what it sends there later. */
  assert_int_equal(hr_rdma_on_msg(w.b.x, &m), 0);
  assert_int_equal(hr_rdma_state(w.b.x), HR_RDMA_ST_AWAIT_END);
  assert_int_equal(hr_rdma_on_msg(b2.x, &m), 0);
  assert_int_equal(b2.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  assert_non_null(strstr(b2.ev[0].message, "posted already"));
  hr_rdma_del(b2.x);
  assert_int_equal(hr_rdma_abort(w.b.x, 0, NULL), 0);
  fpeer *both[2] = {&w.a, &w.b};
  fp_run(both, 2, 60);
  world_close(&w);
}

/* Automatic selection on loopback: shm first where present, tcp;ofi_rxm
 * for a network scope; never sockets. */
static void test_auto_select(void **state) {
  (void)state;
  hr_fabric_config c;
  hr_fabric_config_default(&c);
  c.node = "127.0.0.1";
  hr_fabric *f;
  char why[256];
  int rv = hr_fabric_new(&f, &c, NULL, why, sizeof why);
  assert_int_equal(rv, 0);
  const char *p = hr_fabric_provider(f);
  assert_true(strcmp(p, "shm") == 0 || strcmp(p, "tcp;ofi_rxm") == 0);
  assert_int_equal(hr_fabric_del(f), 0);
  c.scope = HR_FABRIC_SCOPE_NETWORK;
  rv = hr_fabric_new(&f, &c, NULL, why, sizeof why);
  if (rv == 0) {
    p = hr_fabric_provider(f);
    assert_true(strcmp(p, "shm") != 0 && strcmp(p, "sockets") != 0);
    assert_int_equal(hr_fabric_del(f), 0);
  } else {
    assert_int_equal(rv, HR_ERR_UNSUPPORTED);
  }
  /* A provider that does not exist. */
  c.provider = "no-such-provider";
  assert_int_equal(hr_fabric_new(&f, &c, NULL, why, sizeof why),
                   HR_ERR_UNSUPPORTED);
  assert_non_null(strstr(why, "no-such-provider"));
  c.provider = NULL;
  c.window = 0;
  assert_int_equal(hr_fabric_new(&f, &c, NULL, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_fabric_del(NULL), 0);
}

int main(void) {
  /* Skip (77) only when libfabric has no such provider here. */
  int rv = fp_probe(provider());
  if (rv)
    return rv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_tagged),
      cmocka_unit_test(test_get_write),
      cmocka_unit_test(test_put_tagged),
      cmocka_unit_test(test_put_write),
      cmocka_unit_test(test_put_refused),
      cmocka_unit_test(test_stale_key),
      cmocka_unit_test(test_cache),
      cmocka_unit_test(test_loop_objects),
      cmocka_unit_test(test_peer_checks),
      cmocka_unit_test(test_cancel_receives),
      cmocka_unit_test(test_tag_busy),
      cmocka_unit_test(test_auto_select),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
