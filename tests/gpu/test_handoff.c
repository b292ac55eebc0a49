/*
 * The ADR-018 rules that need no device: the § 6 capability query, the
 * reader's sync_mode check (reserved and invalid values, CPU buffers,
 * network transports, through the codec too), the C ABI cross-check of
 * § 4 with the producer's resources handed back on refusal, and the
 * ledger's exactly-once accounting (double and missing releases).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/handoff.h>
#include <hurray/wire.h>

#define P1 HR_SYNC_PRODUCER_SYNCED
#define P2 HR_SYNC_EVENT
#define P3 HR_SYNC_CONSUMER_STREAM
#define ALL (HR_SYNC_BIT(P1) | HR_SYNC_BIT(P2) | HR_SYNC_BIT(P3))

static void test_capability_query(void **state) {
  (void)state;
  const uint32_t ipc_ev = HR_GPU_CAP_IPC_EVENT;
  /* In-process: every mode for device buffers, P1 for CPU ones. */
  assert_int_equal(hr_sync_modes_available(HR_DEV_CUDA, 0,
                                           HR_HANDOFF_IN_PROCESS), ALL);
  assert_int_equal(hr_sync_modes_available(HR_DEV_CPU, 0xffffffffu,
                                           HR_HANDOFF_IN_PROCESS),
                   HR_SYNC_BIT(P1));
  /* IPC: nothing without exportable memory (host-staged fallback), then
   * P1; P2 only with exportable events, P3 only with exportable
   * streams. */
  assert_int_equal(hr_sync_modes_available(HR_DEV_ROCM, 0, HR_HANDOFF_IPC), 0);
  assert_int_equal(hr_sync_modes_available(HR_DEV_CUDA,
                                           ipc_ev | HR_GPU_CAP_IPC_STREAM,
                                           HR_HANDOFF_IPC),
                   0);
  assert_int_equal(hr_sync_modes_available(HR_DEV_ROCM, HR_GPU_CAP_IPC_FD,
                                           HR_HANDOFF_IPC),
                   HR_SYNC_BIT(P1));
  assert_int_equal(hr_sync_modes_available(HR_DEV_CUDA,
                                           ipc_ev | HR_GPU_CAP_IPC_MEM,
                                           HR_HANDOFF_IPC),
                   HR_SYNC_BIT(P1) | HR_SYNC_BIT(P2));
  assert_int_equal(hr_sync_modes_available(HR_DEV_CUDA,
                                           HR_GPU_CAP_IPC_STREAM |
                                               HR_GPU_CAP_IPC_FD,
                                           HR_HANDOFF_IPC),
                   HR_SYNC_BIT(P1) | HR_SYNC_BIT(P3));
  assert_int_equal(hr_sync_modes_available(HR_DEV_CPU, 0, HR_HANDOFF_IPC),
                   HR_SYNC_BIT(P1));
  /* Network: P1, whatever the device can do. */
  assert_int_equal(hr_sync_modes_available(HR_DEV_CUDA, 0xffffffffu,
                                           HR_HANDOFF_NETWORK),
                   HR_SYNC_BIT(P1));
  /* Reserved and invalid tags, unknown transports: nothing. */
  assert_int_equal(hr_sync_modes_available(0x09, 0, HR_HANDOFF_IN_PROCESS),
                   0);
  assert_int_equal(hr_sync_modes_available(0xFF, 0, HR_HANDOFF_IN_PROCESS),
                   0);
  assert_int_equal(hr_sync_modes_available(0xF0, 0, HR_HANDOFF_IN_PROCESS),
                   ALL);
  assert_int_equal(hr_sync_modes_available(HR_DEV_CUDA, 0, 7), 0);
  /* The producer's choice, and the host-staged fallback. */
  assert_int_equal(hr_sync_mode_choose(ALL, 1), P3);
  assert_int_equal(hr_sync_mode_choose(ALL, 0), P2);
  assert_int_equal(hr_sync_mode_choose(HR_SYNC_BIT(P1) | HR_SYNC_BIT(P3), 0),
                   P1);
  assert_int_equal(hr_sync_mode_choose(0, 1), -1);
  /* The same through an opened device (the simulated one: in-process
   * all, IPC P1: it exports memory as a memfd but no events). */
  hr_gpu *g;
  assert_int_equal(hr_gpu_open(&g, NULL, NULL, NULL), 0);
  assert_int_equal(hr_gpu_sync_modes(g, HR_HANDOFF_IN_PROCESS), ALL);
  assert_int_equal(hr_gpu_sync_modes(g, HR_HANDOFF_IPC), HR_SYNC_BIT(P1));
  assert_int_equal(hr_gpu_del(g), 0);
}

static hr_buffer_handle handle(uint8_t tag, uint8_t mode) {
  hr_buffer_handle b;
  memset(&b, 0, sizeof b);
  b.size_bytes = 64;
  b.device_tag = tag;
  b.sync_mode = mode;
  return b;
}

static void expect_ism(int rv, const hr_wire_status *st) {
  assert_int_equal(rv, HR_ERR_PROTO);
  assert_int_equal(st->code, HR_WIRE_INVALID_SYNC_MODE);
  assert_non_null(st->reason);
}

static void test_reader_rejects_reserved_values(void **state) {
  (void)state;
  hr_wire_status st;
  for (unsigned v = 0; v <= 0xFF; v++) {
    hr_buffer_handle b = handle(HR_DEV_CUDA, (uint8_t)v);
    int rv = hr_sync_mode_check(&b, HR_HANDOFF_IN_PROCESS, &st);
    if (v <= P3) {
      assert_int_equal(rv, 0);
    } else {
      expect_ism(rv, &st);
      assert_int_equal(st.offset, 13);
    }
  }
  /* CPU buffers: PRODUCER_SYNCED only, on every transport. */
  for (uint8_t m = P2; m <= P3; m++) {
    hr_buffer_handle b = handle(HR_DEV_CPU, m);
    expect_ism(hr_sync_mode_check(&b, HR_HANDOFF_IN_PROCESS, &st), &st);
  }
  hr_buffer_handle cpu = handle(HR_DEV_CPU, P1);
  assert_int_equal(hr_sync_mode_check(&cpu, HR_HANDOFF_NETWORK, &st), 0);
  /* Network: anything but P1 is INVALID_SYNC_MODE.  IPC without a
   * capability: P1. */
  for (uint8_t m = P2; m <= P3; m++) {
    hr_buffer_handle b = handle(HR_DEV_CUDA, m);
    expect_ism(hr_sync_mode_check(&b, HR_HANDOFF_NETWORK, &st), &st);
    expect_ism(hr_sync_mode_check(&b, HR_HANDOFF_IPC, &st), &st);
  }
  hr_buffer_handle b = handle(HR_DEV_CUDA, P1);
  expect_ism(hr_sync_mode_check(&b, 9, &st), &st);
}

/* A received TENSOR_DESCRIPTOR: the codec rejects a non-P1 buffer on a
 * network transport and accepts it locally. */
static void test_network_receiver_rejects(void **state) {
  (void)state;
  for (unsigned v = P1; v <= 0xFF; v++) {
    uint8_t mode = (uint8_t)v;
    hr_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = HR_MSG_TENSOR_DESCRIPTOR;
    m.hdr.stream_id = 1;
    hr_descriptor *d = &m.u.tensor.desc;
    d->descriptor_version = 1;
    d->element_type = HR_ELEM_FLOAT32;
    d->rank = 1;
    d->shape[0] = 4;
    d->layout.tag = HR_LAYOUT_ROW_MAJOR;
    d->buffer_count = 1;
    d->buffers[0] = handle(HR_DEV_CUDA, mode);
    d->buffers[0].size_bytes = 16;
    m.u.tensor.xport.total_data_bytes = 16;
    m.u.tensor.xport.total_shards = 1;
    uint8_t buf[512];
    int64_t n = hr_wire_encode(&m, buf, sizeof buf);
    assert_true(n > 0);
    hr_msg out;
    hr_wire_status st;
    int rv = hr_wire_decode(buf, (size_t)n, NULL, &out, &st); /* network */
    if (mode == P1) {
      assert_int_equal(rv, 0);
      assert_int_equal(out.u.tensor.desc.buffers[0].sync_mode, P1);
    } else {
      expect_ism(rv, &st);
    }
    hr_wire_ctx local = {HR_TRANSPORT_LOCAL, 0};
    rv = hr_wire_decode(buf, (size_t)n, &local, &out, &st);
    if (mode <= P3)
      assert_int_equal(rv, 0);
    else
      expect_ism(rv, &st);
  }
}

/* ---- the C ABI cross-check ---------------------------------------------- */

typedef struct calls {
  int buffer, event;
} calls;

static void rel_buffer(void *ctx) {
  __atomic_add_fetch(&((calls *)ctx)->buffer, 1, __ATOMIC_SEQ_CST);
}
static void rel_event(void *ctx) {
  __atomic_add_fetch(&((calls *)ctx)->event, 1, __ATOMIC_SEQ_CST);
}

static int dummy_event, dummy_stream, other_stream;

/* What a correct producer hands over in `mode`. */
static void good_payload(uint8_t mode, calls *c, hr_buffer_handle *b,
                         hr_handoff_payload *p) {
  *b = handle(HR_DEV_CUDA, mode);
  memset(p, 0, sizeof *p);
  p->ptr = b;
  p->release = rel_buffer;
  p->release_ctx = c;
  if (mode == P2) {
    p->sync_handle = &dummy_event;
    p->sync_handle_device_tag = HR_DEV_CUDA;
    p->event_release = rel_event;
    p->event_release_ctx = c;
  } else if (mode == P3) {
    p->ordered_stream = &dummy_stream;
  }
}

static hr_handoff_request request(int transport, void *stream) {
  hr_handoff_request r;
  memset(&r, 0, sizeof r);
  r.transport = transport;
  r.consumer_stream = stream;
  r.consumer_stream_device_tag = HR_DEV_CUDA;
  return r;
}

typedef struct bad_case {
  const char *name;
  uint8_t mode;
  void (*mutate)(hr_handoff_request *r, hr_buffer_handle *b,
                 hr_handoff_payload *p);
} bad_case;

static void m_p1_event(hr_handoff_request *r, hr_buffer_handle *b,
                       hr_handoff_payload *p) {
  (void)r;
  (void)b;
  p->sync_handle = &dummy_event;
}
static void m_p1_stream(hr_handoff_request *r, hr_buffer_handle *b,
                        hr_handoff_payload *p) {
  (void)r;
  (void)b;
  p->ordered_stream = &dummy_stream;
}
static void m_p2_no_event(hr_handoff_request *r, hr_buffer_handle *b,
                          hr_handoff_payload *p) {
  (void)r;
  (void)b;
  p->sync_handle = NULL;
}
static void m_p2_no_release(hr_handoff_request *r, hr_buffer_handle *b,
                            hr_handoff_payload *p) {
  (void)r;
  (void)b;
  p->event_release = NULL;
}
static void m_p2_tag(hr_handoff_request *r, hr_buffer_handle *b,
                     hr_handoff_payload *p) {
  (void)r;
  (void)b;
  p->sync_handle_device_tag = HR_DEV_ROCM;
}
static void m_p2_stream(hr_handoff_request *r, hr_buffer_handle *b,
                        hr_handoff_payload *p) {
  (void)r;
  (void)b;
  p->ordered_stream = &dummy_stream;
}
static void m_p3_no_request_stream(hr_handoff_request *r, hr_buffer_handle *b,
                                   hr_handoff_payload *p) {
  (void)b;
  (void)p;
  r->consumer_stream = NULL;
}
static void m_p3_other_stream(hr_handoff_request *r, hr_buffer_handle *b,
                              hr_handoff_payload *p) {
  (void)r;
  (void)b;
  p->ordered_stream = &other_stream;
}
static void m_p3_stream_tag(hr_handoff_request *r, hr_buffer_handle *b,
                            hr_handoff_payload *p) {
  (void)b;
  (void)p;
  r->consumer_stream_device_tag = HR_DEV_VULKAN;
}
static void m_p3_event(hr_handoff_request *r, hr_buffer_handle *b,
                       hr_handoff_payload *p) {
  (void)r;
  (void)b;
  p->sync_handle = &dummy_event;
  p->event_release = rel_event;
  p->event_release_ctx = p->release_ctx;
}
static void m_reserved(hr_handoff_request *r, hr_buffer_handle *b,
                       hr_handoff_payload *p) {
  (void)r;
  (void)p;
  b->sync_mode = 0x03;
}
static void m_invalid(hr_handoff_request *r, hr_buffer_handle *b,
                      hr_handoff_payload *p) {
  (void)r;
  (void)p;
  b->sync_mode = 0xFF;
}
static void m_cpu(hr_handoff_request *r, hr_buffer_handle *b,
                  hr_handoff_payload *p) {
  (void)r;
  b->device_tag = HR_DEV_CPU;
  p->sync_handle_device_tag = HR_DEV_CPU;
}
static void m_network(hr_handoff_request *r, hr_buffer_handle *b,
                      hr_handoff_payload *p) {
  (void)b;
  (void)p;
  r->transport = HR_HANDOFF_NETWORK;
}
static void m_ipc(hr_handoff_request *r, hr_buffer_handle *b,
                  hr_handoff_payload *p) {
  (void)b;
  (void)p;
  r->transport = HR_HANDOFF_IPC;
}
static void m_not_accepted(hr_handoff_request *r, hr_buffer_handle *b,
                           hr_handoff_payload *p) {
  (void)b;
  (void)p;
  r->accept_modes = HR_SYNC_BIT(P1);
}

static const bad_case bad_cases[] = {
    {"P1 with an event", P1, m_p1_event},
    {"P1 with a stream", P1, m_p1_stream},
    {"P2 without sync_handle", P2, m_p2_no_event},
    {"P2 without event_release", P2, m_p2_no_release},
    {"P2 with another device tag", P2, m_p2_tag},
    {"P2 with a stream", P2, m_p2_stream},
    {"P3 without a consumer stream", P3, m_p3_no_request_stream},
    {"P3 ordering another stream", P3, m_p3_other_stream},
    {"P3 with a stream of another device", P3, m_p3_stream_tag},
    {"P3 with an event", P3, m_p3_event},
    {"reserved 0x03", P1, m_reserved},
    {"invalid 0xFF", P1, m_invalid},
    {"P2 on a CPU buffer", P2, m_cpu},
    {"P2 on a network", P2, m_network},
    {"P3 on a network", P3, m_network},
    {"P2 over IPC without exportable events", P2, m_ipc},
    {"P3 over IPC", P3, m_ipc},
    {"P2 the consumer does not accept", P2, m_not_accepted},
};

typedef struct fixed_producer {
  hr_buffer_handle b;
  hr_handoff_payload p;
  int called;
} fixed_producer;

static int produce_fixed(void *user, const hr_handoff_request *req,
                         hr_buffer_handle *b, hr_handoff_payload *p) {
  (void)req;
  fixed_producer *fp = user;
  fp->called++;
  *b = fp->b;
  *p = fp->p;
  return 0;
}

static void test_abi_rejects_mismatch(void **state) {
  (void)state;
  hr_handoff_ledger *l;
  assert_int_equal(hr_handoff_ledger_new(&l, NULL), 0);
  for (size_t i = 0; i < sizeof bad_cases / sizeof *bad_cases; i++) {
    const bad_case *bc = &bad_cases[i];
    print_message("case: %s\n", bc->name);
    calls c = {0, 0};
    fixed_producer fp;
    memset(&fp, 0, sizeof fp);
    good_payload(bc->mode, &c, &fp.b, &fp.p);
    hr_handoff_request r = request(HR_HANDOFF_IN_PROCESS, &dummy_stream);
    /* The unmutated handoff is accepted... */
    hr_wire_status st;
    assert_int_equal(hr_handoff_check(&r, &fp.b, &fp.p, &st), 0);
    bc->mutate(&r, &fp.b, &fp.p);
    /* ...the mutated one refused before the consumer sees it. */
    expect_ism(hr_handoff_check(&r, &fp.b, &fp.p, &st), &st);
    hr_handoff *h = (hr_handoff *)&c; /* must be overwritten */
    expect_ism(hr_handoff_acquire(l, &r, produce_fixed, &fp, &h, &st), &st);
    assert_null(h);
    assert_int_equal(fp.called, 1);
    /* The producer got its resources back, once each. */
    assert_int_equal(c.buffer, 1);
    assert_int_equal(c.event, fp.p.event_release ? 1 : 0);
  }
  hr_handoff_counts k;
  hr_handoff_ledger_counts(l, &k);
  assert_int_equal(k.rejected, sizeof bad_cases / sizeof *bad_cases);
  assert_int_equal(k.accepted, 0);
  assert_int_equal(k.live, 0);
  assert_int_equal(hr_handoff_ledger_del(l, NULL), 0);
}

static void test_ipc_with_exportable_events(void **state) {
  (void)state;
  hr_handoff_ledger *l;
  assert_int_equal(hr_handoff_ledger_new(&l, NULL), 0);
  calls c = {0, 0};
  hr_buffer_handle b;
  hr_handoff_payload p;
  good_payload(P2, &c, &b, &p);
  hr_handoff_request r = request(HR_HANDOFF_IPC, NULL);
  r.accept_modes = hr_sync_modes_available(
      HR_DEV_CUDA, HR_GPU_CAP_IPC_EVENT | HR_GPU_CAP_IPC_MEM, HR_HANDOFF_IPC);
  hr_handoff *h;
  hr_wire_status st;
  assert_int_equal(hr_handoff_accept(l, &r, &b, &p, &h, &st), 0);
  assert_int_equal(hr_handoff_release_event(h), 0);
  assert_int_equal(hr_handoff_release_buffer(h), 0);
  hr_handoff_del(h);
  assert_int_equal(c.event, 1);
  assert_int_equal(c.buffer, 1);
  hr_handoff_counts k;
  assert_int_equal(hr_handoff_ledger_del(l, &k), 0);
  assert_int_equal(k.missing_releases, 0);
}

/* ---- exactly-once releases --------------------------------------------- */

static hr_handoff *accept_mode(hr_handoff_ledger *l, uint8_t mode, calls *c) {
  hr_buffer_handle b;
  hr_handoff_payload p;
  good_payload(mode, c, &b, &p);
  hr_handoff_request r = request(HR_HANDOFF_IN_PROCESS, &dummy_stream);
  hr_handoff *h;
  assert_int_equal(hr_handoff_accept(l, &r, &b, &p, &h, NULL), 0);
  assert_int_equal(hr_handoff_sync_mode(h), mode);
  assert_ptr_equal(hr_handoff_ptr(h), p.ptr);
  return h;
}

static void test_double_release(void **state) {
  (void)state;
  hr_handoff_ledger *l;
  assert_int_equal(hr_handoff_ledger_new(&l, NULL), 0);
  calls c = {0, 0};
  hr_handoff *h = accept_mode(l, P2, &c);
  assert_ptr_equal(hr_handoff_sync_handle(h), &dummy_event);
  assert_int_equal(hr_handoff_release_event(h), 0);
  assert_int_equal(hr_handoff_release_event(h), HR_ERR_STATE);
  assert_int_equal(hr_handoff_release_buffer(h), 0);
  assert_int_equal(hr_handoff_release_buffer(h), HR_ERR_STATE);
  hr_handoff_del(h);
  /* Forwarded once each; the second calls only counted. */
  assert_int_equal(c.event, 1);
  assert_int_equal(c.buffer, 1);
  hr_handoff_counts k;
  hr_handoff_ledger_counts(l, &k);
  assert_int_equal(k.double_releases, 2);
  assert_int_equal(k.event_releases, 1);
  assert_int_equal(k.buffer_releases, 1);
  assert_int_equal(k.missing_releases, 0);
  /* An event release on a mode without one is a caller error. */
  h = accept_mode(l, P1, &c);
  assert_int_equal(hr_handoff_release_event(h), HR_ERR_INVALID_ARGUMENT);
  assert_null(hr_handoff_sync_handle(h));
  assert_int_equal(hr_handoff_release_buffer(h), 0);
  hr_handoff_del(h);
  assert_int_equal(hr_handoff_ledger_del(l, &k), 0);
  assert_int_equal(k.double_releases, 2);
}

static void test_missing_release(void **state) {
  (void)state;
  hr_handoff_ledger *l;
  assert_int_equal(hr_handoff_ledger_new(&l, NULL), 0);
  calls c = {0, 0};
  /* Destroyed without any release: two missing in P2, one in P1/P3. */
  hr_handoff_del(accept_mode(l, P2, &c));
  hr_handoff_counts k;
  hr_handoff_ledger_counts(l, &k);
  assert_int_equal(k.missing_releases, 2);
  hr_handoff_del(accept_mode(l, P3, &c));
  hr_handoff_ledger_counts(l, &k);
  assert_int_equal(k.missing_releases, 3);
  /* Missing releases are not made on the consumer's behalf. */
  assert_int_equal(c.buffer, 0);
  assert_int_equal(c.event, 0);
  /* The buffer released before the event: the event release is missing
   * (counted) and made then, once. */
  hr_handoff *h = accept_mode(l, P2, &c);
  assert_int_equal(hr_handoff_release_buffer(h), 0);
  assert_int_equal(c.event, 1);
  assert_int_equal(hr_handoff_release_event(h), HR_ERR_STATE);
  hr_handoff_del(h);
  hr_handoff_ledger_counts(l, &k);
  assert_int_equal(k.missing_releases, 4);
  /* Handoffs still alive when the ledger goes are found too. */
  accept_mode(l, P1, &c);
  h = accept_mode(l, P2, &c);
  assert_int_equal(hr_handoff_release_event(h), 0);
  hr_handoff_ledger_counts(l, &k);
  assert_int_equal(k.live, 2);
  assert_int_equal(hr_handoff_ledger_del(l, &k), HR_ERR_BUSY);
  assert_int_equal(k.missing_releases, 6);
  assert_int_equal(k.live, 0);
}

/* Two threads race to release the same buffer: one wins, once. */
typedef struct racer {
  hr_handoff *h;
  int rv;
} racer;

static void *race(void *arg) {
  racer *r = arg;
  r->rv = hr_handoff_release_buffer(r->h);
  return NULL;
}

static void test_release_race(void **state) {
  (void)state;
  hr_handoff_ledger *l;
  assert_int_equal(hr_handoff_ledger_new(&l, NULL), 0);
  for (int i = 0; i < 50; i++) {
    calls c = {0, 0};
    hr_handoff *h = accept_mode(l, P1, &c);
    racer a = {h, 1}, b = {h, 1};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, race, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, race, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_true((a.rv == 0 && b.rv == HR_ERR_STATE) ||
                (b.rv == 0 && a.rv == HR_ERR_STATE));
    assert_int_equal(c.buffer, 1);
    hr_handoff_del(h);
  }
  hr_handoff_counts k;
  assert_int_equal(hr_handoff_ledger_del(l, &k), 0);
  assert_int_equal(k.double_releases, 50);
  assert_int_equal(k.buffer_releases, 50);
}

static void test_arguments(void **state) {
  (void)state;
  hr_handoff_ledger *l;
  assert_int_equal(hr_handoff_ledger_new(NULL, NULL), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_handoff_ledger_new(&l, NULL), 0);
  hr_handoff *h;
  hr_handoff_request r = request(HR_HANDOFF_IN_PROCESS, NULL);
  assert_int_equal(hr_handoff_acquire(l, &r, NULL, NULL, &h, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_handoff_check(NULL, NULL, NULL, NULL),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_handoff_release_buffer(NULL), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_sync_mode_check(NULL, 0, NULL), HR_ERR_INVALID_ARGUMENT);
  hr_handoff_del(NULL);
  assert_int_equal(hr_handoff_ledger_del(l, NULL), 0);
  assert_int_equal(hr_handoff_ledger_del(NULL, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capability_query),
      cmocka_unit_test(test_reader_rejects_reserved_values),
      cmocka_unit_test(test_network_receiver_rejects),
      cmocka_unit_test(test_abi_rejects_mismatch),
      cmocka_unit_test(test_ipc_with_exportable_events),
      cmocka_unit_test(test_double_release),
      cmocka_unit_test(test_missing_release),
      cmocka_unit_test(test_release_race),
      cmocka_unit_test(test_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
