/*
 * The RDMA handshake state machine against the fake fabric: both
 * directions, both data paths (RMA write into a destination registration,
 * tagged messages into posted receives), key revocation, the fallback
 * rules of docs/protocol.md §§ 16.7 and 25.2, every injected failure, the
 * protocol faults, deletion from callbacks and in flight, and allocation
 * failure at every step.
 */
#include "sm_harness.h"

static const uint64_t SIZES3[] = {4096, 64, 8192};

/* ---- the happy paths ---- */

static void run_ok(int dir, int dest, int virt_addr, int raw_keys) {
  h_pair p;
  h_setup(&p, NULL, dir, dest ? CAPS_GD : CAPS_RDMA, dest ? CAPS_GD : CAPS_RDMA,
          virt_addr, raw_keys, 3, SIZES3);
  if (dir == HR_RDMA_PUT)
    p.b.commit_on_ready = 1; /* commit with code 0: ACK */
  h_start(&p, dest);
  h_pump(&p);
  h_assert_bytes(&p);

  /* The messages, in order. */
  int i = 0;
  assert_int_equal(p.a.sent[i++], HR_MSG_RDMA_REGISTER);
  assert_int_equal(p.a.sent[i++], HR_MSG_TENSOR_DATA_END);
  assert_int_equal(p.a.nsent, i);
  i = 0;
  if (dest)
    assert_int_equal(p.b.sent[i++], HR_MSG_RDMA_REGISTER);
  assert_int_equal(p.b.sent[i++], HR_MSG_RDMA_READY);
  if (dir == HR_RDMA_PUT)
    assert_int_equal(p.b.sent[i++], HR_MSG_TENSOR_PUT_ACK);
  assert_int_equal(p.b.nsent, i);

  /* The events. */
  assert_int_equal(p.a.nev, 1);
  assert_int_equal(p.a.ev[0].kind, HR_RDMA_EV_COMPLETE);
  assert_int_equal(p.a.ev[0].destination, dest);
  if (dir == HR_RDMA_PUT) {
    assert_int_equal(p.b.nev, 2);
    assert_int_equal(p.b.ev[0].kind, HR_RDMA_EV_DATA_READY);
    assert_int_equal(p.b.ev[1].kind, HR_RDMA_EV_COMPLETE);
  } else {
    assert_int_equal(p.b.nev, 1);
    assert_int_equal(p.b.ev[0].kind, HR_RDMA_EV_COMPLETE);
  }
  assert_int_equal(p.b.ev[0].bytes, p.total);
  assert_int_equal(p.b.ev[0].destination, dest);
  assert_string_equal(p.b.ev[0].fallback, "");
  assert_int_equal(hr_rdma_state(p.a.x), HR_RDMA_ST_DONE);
  assert_int_equal(hr_rdma_state(p.b.x), HR_RDMA_ST_DONE);
  assert_int_equal(p.a.released, 1);
  assert_int_equal(p.b.released, 1);

  /* The keys: a raw key travels as bytes with key 0; offsets start at 0
   * without virtual addressing. */
  if (raw_keys) {
    assert_int_equal(p.a.last_key.key, 0);
    assert_int_equal(p.a.last_key.raw_key_len, 12);
  }
  if (!virt_addr)
    assert_int_equal(p.a.last_key.address, 0);
  else
    assert_int_equal(p.a.last_key.address, (uint64_t)(uintptr_t)p.a.buf[0]);
  assert_int_equal(p.a.last_key.length, p.total);

  /* Both keys are revoked: the finished transfer's keys open nothing. */
  hr__fake_stats sa, sb;
  hr__fake_get_stats(p.a.ep, &sa);
  hr__fake_get_stats(p.b.ep, &sb);
  assert_int_equal(sa.live_regs, 0);
  assert_int_equal(sb.live_regs, 0);
  if (dest) {
    static const uint8_t junk[16] = {0xee};
    assert_int_equal(sb.regs, 1);
    assert_int_equal(hr__fake_poke(p.b.ep, &p.b.last_key, p.b.last_key.address,
                                   junk, sizeof junk),
                     HR_ERR_IO);
    assert_int_equal(sa.writes, 1);
    assert_int_equal(sa.sends, 0);
  } else {
    assert_int_equal(sa.sends, 1);
    assert_int_equal(sb.recvs, 1);
  }
  h_assert_bytes(&p);
  h_teardown(&p);
}

static void test_get_tagged(void **s) {
  (void)s;
  run_ok(HR_RDMA_GET, 0, 1, 0);
}
static void test_get_dest(void **s) {
  (void)s;
  run_ok(HR_RDMA_GET, 1, 1, 0);
}
static void test_put_tagged(void **s) {
  (void)s;
  run_ok(HR_RDMA_PUT, 0, 1, 0);
}
static void test_put_dest(void **s) {
  (void)s;
  run_ok(HR_RDMA_PUT, 1, 1, 0);
}
static void test_raw_offsets(void **s) {
  (void)s;
  run_ok(HR_RDMA_GET, 1, 0, 1);
  run_ok(HR_RDMA_PUT, 0, 0, 1);
}

/* While the transfer runs the destination key opens the region; after it,
 * nothing. */
static void test_dest_key_scoped(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_GD, CAPS_GD, 1, 0, 3, SIZES3);
  h_start(&p, 1);
  h_deliver(&p.a, &p.b); /* SOURCE */
  static const uint8_t one[4] = {1, 2, 3, 4};
  assert_int_equal(
      hr__fake_poke(p.b.ep, &p.b.last_key, p.b.last_key.address, one, 4), 0);
  assert_memory_equal(p.b.buf[0], one, 4);
  /* Out of bounds never opens. */
  assert_int_equal(hr__fake_poke(p.b.ep, &p.b.last_key,
                                 p.b.last_key.address + p.total - 2, one, 4),
                   HR_ERR_IO);
  h_pump(&p);
  h_assert_bytes(&p);
  assert_int_equal(
      hr__fake_poke(p.b.ep, &p.b.last_key, p.b.last_key.address, one, 4),
      HR_ERR_IO);
  h_teardown(&p);
}

/* The tagged path with more than one piece per buffer (4 MiB pieces). */
static void test_tagged_pieces(void **state) {
  (void)state;
  const uint64_t big[] = {(12u << 20) + 1, 3};
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 2, big);
  h_start(&p, 0);
  h_pump(&p);
  h_assert_bytes(&p);
  assert_int_equal(p.b.ev[0].kind, HR_RDMA_EV_COMPLETE);
  h_teardown(&p);
}

/* DATA_END can overtake the receiver's own receive completions: the
 * receiver waits for them before it reports the bytes in place. */
static void test_end_before_receives(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  h_start(&p, 0);
  h_deliver(&p.a, &p.b);     /* SOURCE: B posts its receives */
  h_deliver(&p.b, &p.a);     /* READY: A sends */
  hr__fake_progress(p.a.ep); /* the sends match; A's completion: DATA_END */
  assert_int_equal(p.a.nev, 1);
  h_deliver(&p.a, &p.b); /* DATA_END reaches B before its completion */
  assert_int_equal(p.b.nev, 0);
  assert_int_equal(hr_rdma_state(p.b.x), HR_RDMA_ST_AWAIT_END);
  assert_int_equal(p.b.released, 0);
  hr__fake_progress(p.b.ep);
  assert_int_equal(p.b.nev, 1);
  assert_int_equal(p.b.ev[0].kind, HR_RDMA_EV_COMPLETE);
  h_assert_bytes(&p);
  h_teardown(&p);
}

/* Composite members run one handshake after the other on one stream: the
 * tag is reused. */
static void test_same_stream_twice(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  for (int round = 0; round < 2; round++) {
    hr_rdma_del(p.a.x);
    hr_rdma_del(p.b.x);
    p.a.x = p.b.x = NULL;
    p.a.nev = p.b.nev = 0;
    memset(p.b.buf[0], 0, SIZES3[0]);
    h_start(&p, 0);
    h_pump(&p);
    h_assert_bytes(&p);
    assert_int_equal(p.b.ev[0].kind, HR_RDMA_EV_COMPLETE);
  }
  h_teardown(&p);
}

static void test_empty_tensor(void **state) {
  (void)state;
  static const uint64_t none[] = {0};
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 1, none);
  char why[256];
  hr_wire_status st;
  /* No source owner sends an empty tensor over RDMA... */
  assert_int_equal(h_new(&p, &p.a, HR_RDMA_SENDER, 1, 0, &st, why, sizeof why),
                   HR_ERR_UNSUPPORTED);
  /* ... but a receiver takes DATA_END without registration. */
  assert_int_equal(
      h_new(&p, &p.b, HR_RDMA_RECEIVER, 1, 0, &st, why, sizeof why), 0);
  assert_int_equal(hr_rdma_start(p.b.x), 0);
  hr_msg m = {.hdr = {HR_MSG_TENSOR_DATA_END, 1, 0}};
  assert_int_equal(hr_rdma_on_msg(p.b.x, &m), 0);
  assert_int_equal(p.b.ev[0].kind, HR_RDMA_EV_COMPLETE);
  assert_int_equal(p.b.released, 1);
  h_teardown(&p);
}

/* ---- refusals and fallbacks ---- */

static void test_source_reg_refused(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  hr__fake_faults_of(p.a.ep)->reg_source = 1;
  char why[256];
  hr_wire_status st;
  assert_int_equal(h_new(&p, &p.a, HR_RDMA_SENDER, 1, 0, &st, why, sizeof why),
                   HR_ERR_UNSUPPORTED);
  assert_non_null(strstr(why, "registering the source failed"));
  assert_null(p.a.x);
  assert_int_equal(p.a.released, 0); /* nothing taken over */
  /* The refusal is local: the next tensor may still go over RDMA. */
  assert_int_equal(
      hr_rdma_conn_can_source(p.a.conn, &p.desc, p.total, why, sizeof why), 1);
  h_teardown(&p);
}

static void test_dest_reg_refused(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_GD, CAPS_GD, 1, 0, 3, SIZES3);
  hr__fake_faults_of(p.b.ep)->reg_dest = 1;
  h_start(&p, 1);
  h_pump(&p);
  h_assert_bytes(&p);
  /* No DESTINATION went out; the tagged path carried the bytes. */
  assert_int_equal(p.b.sent[0], HR_MSG_RDMA_READY);
  assert_int_equal(p.b.ev[0].kind, HR_RDMA_EV_COMPLETE);
  assert_int_equal(p.b.ev[0].destination, 0);
  assert_non_null(
      strstr(p.b.ev[0].fallback, "destination registration failed"));
  h_teardown(&p);
}

static void check_peer_fell_back(h_pair *p, const char *needle) {
  char why[256];
  assert_int_equal(p->a.nev, 1);
  assert_int_equal(p->a.ev[0].kind, HR_RDMA_EV_FAILED);
  assert_int_equal(p->a.ev[0].retry, 1);
  assert_non_null(strstr(p->a.ev[0].fallback, "frames from now on"));
  assert_int_equal(
      hr_rdma_conn_can_source(p->a.conn, &p->desc, p->total, why, sizeof why),
      0);
  assert_non_null(strstr(why, "frames since"));
  assert_non_null(strstr(why, needle));
  assert_non_null(hr_rdma_conn_fallback(p->a.conn));
  /* A new source handshake on that connection is refused: frames. */
  h_side extra = p->a;
  extra.x = NULL;
  hr_wire_status st;
  assert_int_equal(h_new(p, &extra, HR_RDMA_SENDER, 3, 0, &st, why, sizeof why),
                   HR_ERR_UNSUPPORTED);
  assert_int_equal(p->a.released, 1);
  assert_int_equal(p->b.released, 1);
}

static void test_recv_refused(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  hr__fake_faults_of(p.b.ep)->recv_start = 1;
  h_start(&p, 0);
  h_pump(&p);
  /* B answers ERROR RDMA_SETUP_FAILED instead of RDMA_READY. */
  assert_int_equal(p.b.nsent, 1);
  assert_int_equal(p.b.sent[0], HR_MSG_ERROR);
  assert_int_equal(p.b.ev[0].kind, HR_RDMA_EV_FAILED);
  assert_int_equal(p.b.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  assert_int_equal(p.b.ev[0].sent, 1);
  assert_int_equal(p.b.ev[0].retry, 1);
  assert_non_null(strstr(p.b.ev[0].message, "posting the receives failed"));
  assert_non_null(strstr(p.b.ev[0].fallback, "frames on a retry"));
  /* A saw it, revoked its key and stops using RDMA on the connection. */
  assert_int_equal(p.a.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  assert_int_equal(p.a.ev[0].sent, 0);
  assert_non_null(strstr(p.a.ev[0].message, "posting the receives failed"));
  check_peer_fell_back(&p, "RDMA_SETUP_FAILED from the peer");
  h_teardown(&p);
}

static void test_gaps_refused(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  p.desc.buffers[2].alignment_log2 = 12; /* 4160 is not 4 KiB aligned */
  char why[256];
  hr_wire_status st;
  assert_int_equal(h_new(&p, &p.a, HR_RDMA_SENDER, 1, 0, &st, why, sizeof why),
                   HR_ERR_UNSUPPORTED);
  assert_non_null(strstr(why, "gap"));
  /* A foreign sender may try: the receiver refuses at once. */
  assert_int_equal(
      h_new(&p, &p.b, HR_RDMA_RECEIVER, 1, 0, &st, why, sizeof why), 0);
  assert_int_equal(hr_rdma_start(p.b.x), 0);
  assert_int_equal(p.b.sent[0], HR_MSG_ERROR);
  assert_int_equal(p.b.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  assert_non_null(strstr(p.b.ev[0].message, "gap"));
  h_teardown(&p);
}

static void test_unusable_connections(void **state) {
  (void)state;
  h_pair p;
  char why[256];
  hr_wire_status st;
  const char *r;
  /* The peer did not advertise RDMA_DATA_PLANE. */
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, 0, 1, 0, 3, SIZES3);
  assert_int_equal(hr_rdma_conn_usable(p.a.conn, &r), 0);
  assert_non_null(strstr(r, "lacks RDMA_DATA_PLANE"));
  assert_int_equal(h_new(&p, &p.a, HR_RDMA_SENDER, 1, 0, &st, why, sizeof why),
                   HR_ERR_UNSUPPORTED);
  /* data_plane 1 arriving anyway is the peer's protocol violation. */
  assert_int_equal(
      h_new(&p, &p.a, HR_RDMA_RECEIVER, 1, 0, &st, why, sizeof why),
      HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_PROTOCOL_VIOLATION);
  assert_int_equal(hr_rdma_conn_usable(p.b.conn, &r), 0);
  assert_non_null(strstr(r, "not in our HELLO"));
  h_teardown(&p);

  /* A fabric address the backend refuses: usable 0, the receiver answers
   * RDMA_SETUP_FAILED. */
  memset(&p, 0, sizeof p);
  assert_int_equal(hr__fake_world_new(&p.w, NULL), 0);
  p.a.name = "alice";
  p.b.name = "bob";
  assert_int_equal(hr__fake_ep_new(&p.a.ep, p.w, "alice", 1, 0), 0);
  assert_int_equal(hr__fake_ep_new(&p.b.ep, p.w, "bob", 1, 0), 0);
  hr__fake_faults_of(p.b.ep)->peer_add = 1;
  h_conn(&p, &p.a, &p.b, CAPS_GD, CAPS_GD);
  h_conn(&p, &p.b, &p.a, CAPS_GD, CAPS_GD);
  h_desc(&p, 3, SIZES3);
  for (int k = 0; k < 3; k++)
    p.b.buf[k] = calloc(1, SIZES3[k]);
  assert_int_equal(hr_rdma_conn_usable(p.b.conn, &r), 0);
  assert_non_null(strstr(r, "injected"));
  assert_int_equal(hr_rdma_conn_gpudirect(p.b.conn, &r), 0);
  assert_int_equal(hr_rdma_conn_gpudirect(p.a.conn, &r), 1);
  assert_int_equal(
      h_new(&p, &p.b, HR_RDMA_RECEIVER, 1, 1, &st, why, sizeof why), 0);
  assert_int_equal(hr_rdma_start(p.b.x), 0);
  assert_int_equal(p.b.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  h_teardown(&p);

  /* A peer without FABRIC_ADDRESS. */
  hr_rdma_conn *c;
  hr_rdma_conn_config cc;
  hr_rdma_conn_config_init(&cc, hr__fake_ops(), NULL, CAPS_RDMA, NULL);
  cc.peer_caps = CAPS_RDMA;
  assert_int_equal(hr_rdma_conn_new(&c, &cc, NULL), 0);
  assert_int_equal(hr_rdma_conn_usable(c, &r), 0);
  assert_non_null(strstr(r, "FABRIC_ADDRESS"));
  hr_rdma_conn_del(c);
  hr_rdma_conn_del(NULL);
  cc.ops = NULL;
  assert_int_equal(hr_rdma_conn_new(&c, &cc, NULL), HR_ERR_INVALID_ARGUMENT);
}

static void test_sync_mode(void **state) {
  (void)state;
  h_pair p;
  char why[256];
  hr_wire_status st;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  p.desc.buffers[1].sync_mode = HR_SYNC_EVENT;
  assert_int_equal(h_new(&p, &p.a, HR_RDMA_SENDER, 1, 0, &st, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(why, "SYNC_PRODUCER_SYNCED"));
  assert_int_equal(
      hr_rdma_conn_can_source(p.a.conn, &p.desc, p.total, why, sizeof why), 0);
  assert_int_equal(
      h_new(&p, &p.b, HR_RDMA_RECEIVER, 1, 0, &st, why, sizeof why),
      HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_SYNC_MODE);
  assert_null(p.a.x);
  assert_null(p.b.x);
  h_teardown(&p);
}

static void test_min_bytes(void **state) {
  (void)state;
  h_pair p;
  char why[256];
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  hr_rdma_conn_del(p.a.conn);
  hr_rdma_conn_config cc;
  hr_rdma_conn_config_init(&cc, hr__fake_ops(), p.a.ep, CAPS_RDMA, NULL);
  cc.peer_caps = CAPS_RDMA;
  cc.peer_provider = (const uint8_t *)"fake";
  cc.peer_provider_len = 4;
  cc.peer_endpoint = (const uint8_t *)"bob";
  cc.peer_endpoint_len = 3;
  assert_int_equal(hr_rdma_conn_new(&p.a.conn, &cc, NULL), 0);
  assert_int_equal(
      hr_rdma_conn_can_source(p.a.conn, &p.desc, p.total, why, sizeof why), 0);
  assert_non_null(strstr(why, "threshold"));
  h_teardown(&p);
}

/* ---- injected failures during the transfer ---- */

static void test_write_start_refused(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_GD, CAPS_GD, 1, 0, 3, SIZES3);
  hr__fake_faults_of(p.a.ep)->write_start = 1;
  h_start(&p, 1);
  h_pump(&p);
  /* Rule 5: GPUDIRECT_UNAVAILABLE instead of the transfer. */
  assert_int_equal(p.a.sent[1], HR_MSG_ERROR);
  assert_int_equal(p.a.ev[0].code, HR_WIRE_GPUDIRECT_UNAVAILABLE);
  assert_int_equal(p.a.ev[0].sent, 1);
  assert_int_equal(p.b.ev[0].code, HR_WIRE_GPUDIRECT_UNAVAILABLE);
  assert_int_equal(p.b.ev[0].retry, 1);
  /* B registers no destination on this connection any more. */
  const char *r;
  assert_int_equal(hr_rdma_conn_gpudirect(p.b.conn, &r), 0);
  assert_non_null(strstr(r, "GPUDIRECT_UNAVAILABLE"));
  assert_int_equal(p.a.released, 1);
  assert_int_equal(p.b.released, 1);
  h_teardown(&p);
}

static void test_write_error(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_PUT, CAPS_GD, CAPS_GD, 1, 0, 3, SIZES3);
  hr__fake_faults_of(p.a.ep)->write_error = 1;
  h_start(&p, 1);
  h_pump(&p);
  assert_int_equal(p.a.ev[0].kind, HR_RDMA_EV_FAILED);
  assert_int_equal(p.a.ev[0].code, HR_WIRE_GPUDIRECT_UNAVAILABLE);
  assert_non_null(strstr(p.a.ev[0].message, "injected"));
  assert_int_equal(p.b.ev[0].kind, HR_RDMA_EV_FAILED);
  assert_int_equal(p.b.ev[0].sent, 0);
  check_peer_fell_back(&p, "RMA write");
  h_teardown(&p);
}

static void test_send_error(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  hr__fake_faults_of(p.a.ep)->send_error = 1;
  h_start(&p, 0);
  h_pump(&p);
  assert_int_equal(p.a.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  assert_int_equal(p.a.ev[0].sent, 1);
  /* B's posted receives were cancelled before its release. */
  assert_int_equal(p.b.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  assert_int_equal(p.b.ev[0].sent, 0);
  assert_int_equal(p.b.ev[0].retry, 1);
  hr__fake_stats sb;
  hr__fake_get_stats(p.b.ep, &sb);
  assert_int_equal(sb.cancels, 1);
  check_peer_fell_back(&p, "tagged sends");
  h_teardown(&p);
}

static void test_recv_error(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_PUT, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  hr__fake_faults_of(p.b.ep)->recv_error = 1;
  h_start(&p, 0);
  h_pump(&p);
  /* The receiver's own completion failed: RDMA_SETUP_FAILED from B. */
  assert_int_equal(p.b.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  assert_int_equal(p.b.ev[0].sent, 1);
  assert_non_null(strstr(p.b.ev[0].message, "receiving"));
  assert_int_equal(p.a.ev[0].kind, HR_RDMA_EV_FAILED);
  assert_int_equal(p.a.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  h_teardown(&p);
}

static void run_peer_gone(int dest) {
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, dest ? CAPS_GD : CAPS_RDMA,
          dest ? CAPS_GD : CAPS_RDMA, 1, 0, 3, SIZES3);
  hr__fake_faults_of(p.a.ep)->peer_gone_after = 5000;
  h_start(&p, dest);
  h_pump(&p);
  assert_int_equal(p.a.ev[0].kind, HR_RDMA_EV_FAILED);
  assert_non_null(strstr(p.a.ev[0].message, "peer gone"));
  assert_int_equal(p.a.released, 1);
  if (dest) {
    /* The write stopped part-way: the first 5000 bytes only. */
    assert_memory_equal(p.a.buf[0], p.b.buf[0], 4096);
    assert_memory_equal(p.a.buf[1], p.b.buf[1], 64);
    assert_memory_equal(p.a.buf[2], p.b.buf[2], 5000 - 4160);
    assert_int_equal(p.b.buf[2][5000 - 4160], 0);
  }
  /* The receiver learns it from the ERROR; without one (the connection
   * went too), its session aborts it. */
  assert_int_equal(p.b.ev[0].kind, HR_RDMA_EV_FAILED);
  assert_int_equal(p.b.released, 1);
  h_teardown(&p);
}

static void test_peer_gone_write(void **s) {
  (void)s;
  run_peer_gone(1);
}
static void test_peer_gone_send(void **s) {
  (void)s;
  run_peer_gone(0);
}

/* The peer's endpoint disappears while the receiver waits: the session
 * aborts without a message when the connection closes. */
static void test_connection_gone(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  h_start(&p, 0);
  h_deliver(&p.a, &p.b); /* SOURCE; B posts */
  assert_int_equal(hr_rdma_abort(p.b.x, 0, "connection closed"), 0);
  assert_int_equal(p.b.nsent, 1); /* READY only, no ERROR */
  assert_int_equal(p.b.ev[0].kind, HR_RDMA_EV_FAILED);
  assert_int_equal(p.b.ev[0].code, 0);
  assert_string_equal(p.b.ev[0].message, "connection closed");
  /* The receives are cancelled, released on completion. */
  assert_int_equal(p.b.released, 0);
  hr__fake_progress(p.b.ep);
  assert_int_equal(p.b.released, 1);
  assert_int_equal(hr_rdma_abort(p.b.x, 0, NULL), HR_ERR_STATE);
  assert_int_equal(hr_rdma_abort(p.a.x, 0, NULL), 0);
  h_teardown(&p);
}

/* The receiver never sends READY: the sender waits, holding its key, until
 * its session gives up. */
static void test_ready_never_sent(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  h_start(&p, 0);
  h_deliver(&p.a, &p.b);
  p.b.next_out = p.b.nout; /* READY is lost */
  h_pump(&p);
  assert_int_equal(hr_rdma_state(p.a.x), HR_RDMA_ST_AWAIT_READY);
  hr__fake_stats sa;
  hr__fake_get_stats(p.a.ep, &sa);
  assert_int_equal(sa.live_regs, 1);
  assert_int_equal(hr_rdma_abort(p.a.x, HR_WIRE_TIMEOUT, "no RDMA_READY"), 0);
  hr__fake_get_stats(p.a.ep, &sa);
  assert_int_equal(sa.live_regs, 0);
  assert_int_equal(p.a.released, 1);
  assert_int_equal(p.a.ev[0].code, HR_WIRE_TIMEOUT);
  assert_int_equal(p.a.ev[0].sent, 1);
  assert_int_equal(p.a.sent[1], HR_MSG_ERROR);
  h_pump(&p);
  assert_int_equal(p.b.ev[0].code, HR_WIRE_TIMEOUT);
  assert_int_equal(p.b.released, 1);
  h_teardown(&p);
}

/* The requester ends the stream while the sender writes (ERROR on a GET
 * stream): the write is cancelled and the buffers released after it. */
static void test_error_during_transfer(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_GD, CAPS_GD, 1, 0, 3, SIZES3);
  h_start(&p, 1);
  h_deliver(&p.a, &p.b);
  h_deliver(&p.b, &p.a);
  h_deliver(&p.b, &p.a); /* DEST, READY: A's write is queued */
  assert_int_equal(hr_rdma_state(p.a.x), HR_RDMA_ST_TRANSFER);
  assert_int_equal(hr_rdma_abort(p.b.x, HR_WIRE_CANCELLED, "bye"), 0);
  h_deliver(&p.b, &p.a);
  assert_int_equal(p.a.ev[0].code, HR_WIRE_CANCELLED);
  assert_int_equal(p.a.ev[0].retry, 0);
  assert_null(hr_rdma_conn_fallback(p.a.conn));
  assert_int_equal(p.a.released, 0); /* the write is still in flight */
  hr__fake_progress(p.a.ep);
  assert_int_equal(p.a.released, 1);
  /* The write found the destination key revoked: nothing landed. */
  assert_int_equal(p.b.buf[0][0], 0);
  h_teardown(&p);
}

/* A receiver meeting a foreign cut of the tagged messages fails cleanly. */
static void test_foreign_cut(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  hr__fake_faults_of(p.a.ep)->send_piece = 1000;
  h_start(&p, 0);
  h_pump(&p);
  assert_int_equal(p.b.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  assert_int_equal(p.b.ev[0].sent, 1);
  assert_non_null(strstr(p.b.ev[0].message, "bytes met a receive"));
  assert_int_equal(p.a.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  assert_int_equal(p.a.released, 1);
  h_teardown(&p);
}

/* Two connections from one peer endpoint use the same stream id at once:
 * the second receiver cannot post its tag and refuses. */
static void test_tag_busy(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  h_start(&p, 0);
  h_deliver(&p.a, &p.b); /* B posts tag 1 */
  h_side b2 = p.b;
  b2.x = NULL;
  b2.nev = b2.nsent = b2.nout = b2.next_out = 0;
  b2.released = 0;
  char why[256];
  hr_wire_status st;
  assert_int_equal(h_new(&p, &b2, HR_RDMA_RECEIVER, 1, 0, &st, why, sizeof why),
                   0);
  assert_int_equal(hr_rdma_start(b2.x), 0);
  hr_msg m;
  assert_int_equal(hr_wire_decode(p.a.out[0], p.a.out_len[0], NULL, &m, &st),
                   0);
  assert_int_equal(hr_rdma_on_msg(b2.x, &m), 0);
  assert_int_equal(b2.ev[0].code, HR_WIRE_RDMA_SETUP_FAILED);
  assert_non_null(strstr(b2.ev[0].message, "posted already"));
  assert_int_equal(b2.released, 1);
  hr_rdma_del(b2.x);
  h_pump(&p);
  h_assert_bytes(&p);
  h_teardown(&p);
}

/* ---- protocol faults ---- */

typedef struct pv_case {
  const char *name;
  int dir;
  int gd;      /* both GPUDIRECT */
  int victim;  /* 0: A (sender), 1: B (receiver) */
  int advance; /* messages to exchange first: 1 SOURCE, 2 READY/DEST... */
  hr_msg msg;
  const char *needle;
} pv_case;

static hr_msg reg_msg(uint8_t role, uint64_t length) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_RDMA_REGISTER;
  m.hdr.stream_id = 1;
  m.u.rdma.role = role;
  m.u.rdma.length = length;
  m.u.rdma.address = 0x1000;
  m.u.rdma.key = 77;
  return m;
}

static hr_msg empty_msg(uint32_t type) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = type;
  m.hdr.stream_id = 1;
  return m;
}

static void test_protocol_faults(void **state) {
  (void)state;
  const uint64_t total = 4096 + 64 + 8192;
  const pv_case cases[] = {
      {"receiver: DESTINATION first", HR_RDMA_GET, 0, 1, 0,
       reg_msg(HR_RDMA_DESTINATION, total), "SOURCE first"},
      {"receiver: SOURCE too short", HR_RDMA_GET, 0, 1, 0,
       reg_msg(HR_RDMA_SOURCE, total - 1), "shorter"},
      {"receiver: DATA_END before SOURCE", HR_RDMA_GET, 0, 1, 0,
       empty_msg(HR_MSG_TENSOR_DATA_END), "before RDMA_REGISTER"},
      {"receiver: READY", HR_RDMA_GET, 0, 1, 0, empty_msg(HR_MSG_RDMA_READY),
       "SOURCE) expected"},
      {"receiver: second SOURCE", HR_RDMA_GET, 0, 1, 1,
       reg_msg(HR_RDMA_SOURCE, total), "after RDMA_READY"},
      {"receiver: PUT_ACK", HR_RDMA_PUT, 0, 1, 1,
       empty_msg(HR_MSG_TENSOR_PUT_ACK), "expected after RDMA_READY"},
      {"sender: SOURCE role", HR_RDMA_GET, 1, 0, 1,
       reg_msg(HR_RDMA_SOURCE, total), "registers a DESTINATION"},
      {"sender: DESTINATION without GPUDIRECT", HR_RDMA_GET, 0, 0, 1,
       reg_msg(HR_RDMA_DESTINATION, total), "without RDMA_GPUDIRECT"},
      {"sender: DESTINATION length", HR_RDMA_GET, 1, 0, 1,
       reg_msg(HR_RDMA_DESTINATION, total + 1), "must equal"},
      {"sender: DATA_END", HR_RDMA_GET, 0, 0, 1,
       empty_msg(HR_MSG_TENSOR_DATA_END), "receiver's direction"},
      {"sender: PUT_ACK early", HR_RDMA_PUT, 0, 0, 1,
       empty_msg(HR_MSG_TENSOR_PUT_ACK), "receiver's direction"},
      {"sender: READY twice", HR_RDMA_GET, 0, 0, 2,
       empty_msg(HR_MSG_RDMA_READY), "during the RDMA transfer"},
      {"sender: CANCEL", HR_RDMA_GET, 0, 0, 1, empty_msg(HR_MSG_CANCEL),
       "session's"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const pv_case *c = &cases[i];
    h_pair p;
    h_setup(&p, NULL, c->dir, c->gd ? CAPS_GD : CAPS_RDMA,
            c->gd ? CAPS_GD : CAPS_RDMA, 1, 0, 3, SIZES3);
    h_start(&p, 0);
    if (c->advance >= 1)
      h_deliver(&p.a, &p.b); /* SOURCE */
    if (c->advance >= 2)
      h_deliver(&p.b, &p.a); /* READY */
    h_side *v = c->victim ? &p.b : &p.a;
    h_side *o = c->victim ? &p.a : &p.b;
    int before = v->nsent;
    assert_int_equal(hr_rdma_on_msg(v->x, &c->msg), 0);
    if (v->nev != 1 || v->ev[0].code != HR_WIRE_PROTOCOL_VIOLATION ||
        !strstr(v->ev[0].message, c->needle))
      fail_msg("%s: events %d, code %u, message '%s'", c->name, v->nev,
               v->nev ? v->ev[0].code : 0, v->nev ? v->ev[0].message : "");
    assert_int_equal(v->sent[before], HR_MSG_ERROR);
    assert_int_equal(v->ev[0].sent, 1);
    assert_int_equal(hr_rdma_state(v->x), HR_RDMA_ST_FAILED);
    /* Finished: more messages are the session's to judge. */
    assert_int_equal(hr_rdma_on_msg(v->x, &c->msg), HR_ERR_STATE);
    h_pump(&p);
    assert_int_equal(v->released, 1);
    assert_int_equal(o->released, 1);
    assert_int_equal(o->ev[0].kind, HR_RDMA_EV_FAILED);
    assert_int_equal(o->ev[0].code, HR_WIRE_PROTOCOL_VIOLATION);
    h_teardown(&p);
  }
}

static void test_api_misuse(void **state) {
  (void)state;
  h_pair p;
  char why[256];
  hr_wire_status st;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  assert_int_equal(h_new(&p, &p.a, HR_RDMA_SENDER, 0, 0, &st, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT); /* stream 0 */
  assert_int_equal(h_new(&p, &p.a, 7, 1, 0, &st, why, sizeof why),
                   HR_ERR_INVALID_ARGUMENT);
  h_start(&p, 0);
  assert_int_equal(hr_rdma_start(p.a.x), HR_ERR_STATE);
  assert_int_equal(hr_rdma_commit(p.b.x, 0, NULL), HR_ERR_STATE);
  assert_int_equal(hr_rdma_on_msg(p.a.x, NULL), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_rdma_state(NULL), -1);
  assert_string_equal(hr_rdma_state_name(HR_RDMA_ST_AWAIT_READY),
                      "AWAIT_READY");
  assert_string_equal(hr_rdma_state_name(99), "UNKNOWN");
  h_pump(&p);
  h_teardown(&p);
  hr_rdma_del(NULL);

  /* A message before start is a violation (a session bug or a peer racing
   * the descriptor). */
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  assert_int_equal(
      h_new(&p, &p.b, HR_RDMA_RECEIVER, 1, 0, &st, why, sizeof why), 0);
  hr_msg m = reg_msg(HR_RDMA_SOURCE, p.total);
  assert_int_equal(hr_rdma_on_msg(p.b.x, &m), 0);
  assert_int_equal(p.b.ev[0].code, HR_WIRE_PROTOCOL_VIOLATION);
  h_teardown(&p);
}

/* ---- lifetime ---- */

static void test_delete_in_callback(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  p.a.del_on_event = 1;
  p.b.del_on_event = 1;
  h_start(&p, 0);
  h_pump(&p);
  assert_null(p.a.x);
  assert_null(p.b.x);
  assert_int_equal(p.a.released, 1);
  assert_int_equal(p.b.released, 1);
  h_assert_bytes(&p);
  h_teardown(&p);
}

static void test_delete_in_flight(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  h_start(&p, 0);
  h_deliver(&p.a, &p.b);
  h_deliver(&p.b, &p.a); /* A's sends are queued, B's receives posted */
  hr_rdma_del(p.a.x);
  hr_rdma_del(p.b.x);
  p.a.x = p.b.x = NULL;
  /* No events after a delete; the release waits for the backend. */
  assert_int_equal(p.a.released, 0);
  assert_int_equal(p.b.released, 0);
  h_pump(&p);
  assert_int_equal(p.a.nev, 0);
  assert_int_equal(p.b.nev, 0);
  assert_int_equal(p.a.released, 1);
  assert_int_equal(p.b.released, 1);
  h_teardown(&p);
}

/* The connection outlives its owner while a handshake still uses it. */
static void test_conn_outlives_owner(void **state) {
  (void)state;
  h_pair p;
  h_setup(&p, NULL, HR_RDMA_GET, CAPS_RDMA, CAPS_RDMA, 1, 0, 3, SIZES3);
  h_start(&p, 0);
  hr_rdma_conn_del(p.a.conn);
  hr_rdma_conn_del(p.a.conn); /* twice is harmless */
  h_pump(&p);
  h_assert_bytes(&p);
  hr__fake_stats sa;
  hr__fake_get_stats(p.a.ep, &sa);
  assert_int_equal(sa.peers, 1);
  hr_rdma_del(p.a.x);
  p.a.x = NULL;
  hr__fake_get_stats(p.a.ep, &sa);
  assert_int_equal(sa.peers, 0);
  p.a.conn = NULL;
  h_teardown(&p);
}

/* ---- allocation failure at every step ---- */

typedef struct failer {
  long countdown;
  long live;
  int failed;
} failer;
static void *f_malloc(size_t n, void *ud) {
  failer *f = ud;
  if (f->countdown-- == 0) {
    f->failed = 1;
    return NULL;
  }
  f->live++;
  return malloc(n);
}
static void f_free(void *ptr, void *ud) {
  failer *f = ud;
  if (ptr)
    f->live--;
  free(ptr);
}
static void *f_calloc(size_t m, size_t n, void *ud) {
  failer *f = ud;
  if (f->countdown-- == 0) {
    f->failed = 1;
    return NULL;
  }
  f->live++;
  return calloc(m, n);
}
static void *f_realloc(void *ptr, size_t n, void *ud) {
  (void)ud;
  return realloc(ptr, n);
}

/* A whole GET, allocations failing at N; each run must end in a clean
 * error or a complete transfer, and free everything. */
static void run_failmalloc(int dest) {
  for (long n = 0;; n++) {
    failer fl = {n, 0, 0};
    hr_mem m = {&fl, f_malloc, f_free, f_calloc, f_realloc};
    hr__fake_world *w;
    hr__fake_ep *ea = NULL, *eb = NULL;
    int rv = hr__fake_world_new(&w, &m);
    if (rv) {
      assert_int_equal(rv, HR_ERR_NOMEM);
      assert_int_equal(fl.live, 0);
      continue;
    }
    h_pair p;
    memset(&p, 0, sizeof p);
    p.mem = &m;
    p.w = w;
    p.a.name = "alice";
    p.b.name = "bob";
    p.dir = HR_RDMA_GET;
    h_desc(&p, 3, SIZES3);
    for (int k = 0; k < 3; k++) {
      p.a.buf[k] = malloc(SIZES3[k]);
      memset(p.a.buf[k], 0x5a, SIZES3[k]);
      p.b.buf[k] = calloc(1, SIZES3[k]);
    }
    int ok = 0;
    char why[256];
    hr_wire_status st;
    uint32_t caps = dest ? CAPS_GD : CAPS_RDMA;
    if (hr__fake_ep_new(&ea, w, "alice", 1, 0) == 0 &&
        hr__fake_ep_new(&eb, w, "bob", 1, 0) == 0) {
      p.a.ep = ea;
      p.b.ep = eb;
      hr_rdma_conn_config cc;
      hr_rdma_conn_config_init(&cc, hr__fake_ops(), ea, caps, NULL);
      cc.peer_caps = caps;
      cc.peer_provider = (const uint8_t *)"fake";
      cc.peer_provider_len = 4;
      cc.peer_endpoint = (const uint8_t *)"bob";
      cc.peer_endpoint_len = 3;
      cc.min_bytes = 1;
      if (hr_rdma_conn_new(&p.a.conn, &cc, &m) == 0) {
        cc.ops_ctx = eb;
        cc.peer_endpoint = (const uint8_t *)"alice";
        cc.peer_endpoint_len = 5;
        if (hr_rdma_conn_new(&p.b.conn, &cc, &m) == 0 &&
            h_new(&p, &p.a, HR_RDMA_SENDER, 1, 0, &st, why, sizeof why) == 0 &&
            h_new(&p, &p.b, HR_RDMA_RECEIVER, 1, dest, &st, why, sizeof why) ==
                0) {
          assert_int_equal(hr_rdma_start(p.a.x), 0);
          assert_int_equal(hr_rdma_start(p.b.x), 0);
          h_pump(&p);
          ok = p.b.nev == 1 && p.b.ev[0].kind == HR_RDMA_EV_COMPLETE;
          if (ok)
            h_assert_bytes(&p);
          else
            assert_int_equal(fl.failed, 1);
        }
      }
    }
    hr_rdma_del(p.a.x);
    hr_rdma_del(p.b.x);
    if (ea && eb)
      h_pump(&p);
    if (p.a.x)
      assert_int_equal(p.a.released, 1);
    if (p.b.x)
      assert_int_equal(p.b.released, 1);
    hr_rdma_conn_del(p.a.conn);
    hr_rdma_conn_del(p.b.conn);
    hr__fake_ep_del(ea);
    hr__fake_ep_del(eb);
    hr__fake_world_del(w);
    for (int k = 0; k < 3; k++) {
      free(p.a.buf[k]);
      free(p.b.buf[k]);
    }
    assert_int_equal(fl.live, 0);
    if (!fl.failed) {
      assert_true(ok);
      break; /* no allocation left to fail */
    }
  }
}

static void test_failmalloc(void **state) {
  (void)state;
  run_failmalloc(0);
  run_failmalloc(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_tagged),
      cmocka_unit_test(test_get_dest),
      cmocka_unit_test(test_put_tagged),
      cmocka_unit_test(test_put_dest),
      cmocka_unit_test(test_raw_offsets),
      cmocka_unit_test(test_dest_key_scoped),
      cmocka_unit_test(test_tagged_pieces),
      cmocka_unit_test(test_end_before_receives),
      cmocka_unit_test(test_same_stream_twice),
      cmocka_unit_test(test_empty_tensor),
      cmocka_unit_test(test_source_reg_refused),
      cmocka_unit_test(test_dest_reg_refused),
      cmocka_unit_test(test_recv_refused),
      cmocka_unit_test(test_gaps_refused),
      cmocka_unit_test(test_unusable_connections),
      cmocka_unit_test(test_sync_mode),
      cmocka_unit_test(test_min_bytes),
      cmocka_unit_test(test_write_start_refused),
      cmocka_unit_test(test_write_error),
      cmocka_unit_test(test_send_error),
      cmocka_unit_test(test_recv_error),
      cmocka_unit_test(test_peer_gone_write),
      cmocka_unit_test(test_peer_gone_send),
      cmocka_unit_test(test_connection_gone),
      cmocka_unit_test(test_ready_never_sent),
      cmocka_unit_test(test_error_during_transfer),
      cmocka_unit_test(test_foreign_cut),
      cmocka_unit_test(test_tag_busy),
      cmocka_unit_test(test_protocol_faults),
      cmocka_unit_test(test_api_misuse),
      cmocka_unit_test(test_delete_in_callback),
      cmocka_unit_test(test_delete_in_flight),
      cmocka_unit_test(test_conn_outlives_owner),
      cmocka_unit_test(test_failmalloc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
