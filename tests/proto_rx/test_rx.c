/*
 * The transfer checker (hr_rx) and the frame tracker, driven from
 * hand-built messages: every acceptance path of the sequence vectors and
 * every rejection path of proto/hr_rx.c and proto/hr_frames.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "proto/hr_frames.h"
#include "proto/hr_rx_internal.h"
#include "proto_rx/rx_build.h"

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Runs a sequence that must be accepted and complete. */
#define EXPECT_OK(cfg, msgs)                                                   \
  do {                                                                         \
    t_result r_ = t_run(&(cfg), (msgs), N_OF(msgs));                           \
    if (r_.rv != 0)                                                            \
      print_error("rejected at %d: rv %d code %s: %s\n", r_.at, r_.rv,         \
                  hr_wire_error_name(r_.code), r_.why ? r_.why : "");          \
    assert_int_equal(r_.rv, 0);                                                \
    assert_int_equal(r_.done_events, 1);                                       \
    assert_true(r_.last.kind &HR_RXE_DONE);                                    \
  } while (0)

/* Runs a sequence that must fail at message `at` (N_OF(msgs) for finish)
 * with wire code `code`. */
#define EXPECT_FAIL(cfg, msgs, at_, code_)                                     \
  do {                                                                         \
    t_result r_ = t_run(&(cfg), (msgs), N_OF(msgs));                           \
    if (r_.at != (at_) || r_.code != (code_))                                  \
      print_error("got at %d rv %d code %s (%s)\n", r_.at, r_.rv,              \
                  hr_wire_error_name(r_.code), r_.why ? r_.why : "");          \
    assert_int_equal(r_.rv, HR_ERR_PROTO);                                     \
    assert_int_equal(r_.at, (at_));                                            \
    assert_int_equal(r_.code, (code_));                                        \
    assert_non_null(r_.why);                                                   \
  } while (0)

static const hr_rx_config *plain_cfg(void) {
  static hr_rx_config c;
  c = t_cfg(1, 0, 1);
  return &c;
}

/* ------------------------------------------------------------------------ */
/* Frames and ordering (data_frames.json)                                    */
/* ------------------------------------------------------------------------ */

static void frames_valid(void **state) {
  (void)state;
  hr_rx_config cfg = *plain_cfg();
  hr_msg one[] = {t_plain(1, 24), t_data(1, 0, 0, 24), t_end(1)};
  EXPECT_OK(cfg, one);
  hr_msg three[] = {t_plain(1, 24), t_data(1, 0, 0, 10), t_data(1, 0, 10, 10),
                    t_data(1, 0, 20, 4), t_end(1)};
  EXPECT_OK(cfg, three);
  hr_msg empty[] = {t_plain(1, 0), t_end(1)};
  EXPECT_OK(cfg, empty);
  /* CSR-like: frames split inside and across buffers. */
  uint64_t shape[2] = {3, 3};
  uint64_t sizes[3] = {16, 12, 12};
  hr_msg csr[] = {t_desc(1, HR_ELEM_FLOAT32, 2, shape, 3, sizes),
                  t_data(1, 0, 0, 6),
                  t_data(1, 0, 6, 6),
                  t_data(1, 0, 12, 4),
                  t_data(1, 1, 0, 6),
                  t_data(1, 1, 6, 6),
                  t_data(1, 2, 0, 6),
                  t_data(1, 2, 6, 6),
                  t_end(1)};
  EXPECT_OK(cfg, csr);
  /* Zero nnz: indptr only; size-0 buffers get no frames. */
  uint64_t zsizes[3] = {12, 0, 0};
  hr_msg zero_nnz[] = {t_desc(1, HR_ELEM_FLOAT32, 2, shape, 3, zsizes),
                       t_data(1, 0, 0, 12), t_end(1)};
  EXPECT_OK(cfg, zero_nnz);
  /* An empty buffer between two full ones is skipped over. */
  uint64_t msizes[3] = {4, 0, 4};
  hr_msg middle[] = {t_desc(1, HR_ELEM_FLOAT32, 2, shape, 3, msizes),
                     t_data(1, 0, 0, 4), t_data(1, 2, 0, 4), t_end(1)};
  EXPECT_OK(cfg, middle);
}

static void frames_events(void **state) {
  (void)state;
  hr_rx *rx = NULL;
  assert_int_equal(hr_rx_new(&rx, plain_cfg(), NULL), 0);
  hr_rx_event ev;
  hr_wire_status st;
  hr_msg d = t_plain(1, 24);
  assert_string_equal(hr__rx_mode_name(rx), "UNKNOWN");
  assert_int_equal(hr_rx_on_message(rx, &d, &ev, &st), 0);
  assert_int_equal(ev.kind, HR_RXE_TENSOR_BEGIN);
  assert_ptr_equal(ev.desc, &d.u.tensor.desc);
  assert_ptr_equal(ev.xport, &d.u.tensor.xport);
  assert_int_equal(ev.depth, 0);
  assert_int_equal(ev.total_shards, 1);
  assert_string_equal(hr__rx_mode_name(rx), "SINGLE");
  assert_string_equal(hr__rx_stream_state_name(rx, 1), "OPEN");
  assert_string_equal(hr__rx_stream_state_name(rx, 2), "OUTSIDE");
  hr_msg f = t_data(1, 0, 0, 10);
  assert_int_equal(hr_rx_on_message(rx, &f, &ev, &st), 0);
  assert_int_equal(ev.kind, HR_RXE_DATA);
  assert_int_equal(ev.len, 10);
  assert_int_equal(ev.received, 10);
  assert_null(ev.desc);
  f = t_data(1, 0, 10, 14);
  assert_int_equal(hr_rx_on_message(rx, &f, &ev, &st), 0);
  assert_int_equal(ev.offset, 10);
  assert_int_equal(ev.received, 24);
  assert_int_equal(hr_rx_done(rx), 0);
  assert_int_equal(hr_rx_finish(rx, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg e = t_end(1);
  assert_int_equal(hr_rx_on_message(rx, &e, &ev, &st), 0);
  assert_int_equal(ev.kind, HR_RXE_TENSOR_END | HR_RXE_DONE);
  assert_int_equal(ev.done, 1);
  assert_int_equal(hr_rx_done(rx), 1);
  assert_string_equal(hr__rx_stream_state_name(rx, 1), "DONE");
  assert_int_equal(hr_rx_finish(rx, &st), 0);
  assert_int_equal(hr_rx_finish(rx, &st), 0); /* idempotent */
  assert_int_equal(hr_rx_torn(rx), 0);
  hr_rx_del(rx);
}

static void frames_rejections(void **state) {
  (void)state;
  hr_rx_config cfg = *plain_cfg();
  uint64_t shape[2] = {3, 3};
  uint64_t sizes[3] = {16, 12, 12};
  hr_msg gap[] = {t_plain(1, 24), t_data(1, 0, 0, 8), t_data(1, 0, 12, 12),
                  t_end(1)};
  EXPECT_FAIL(cfg, gap, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg overlap[] = {t_plain(1, 24), t_data(1, 0, 0, 12), t_data(1, 0, 8, 16),
                      t_end(1)};
  EXPECT_FAIL(cfg, overlap, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg early[] = {t_plain(1, 24), t_data(1, 0, 0, 16), t_end(1)};
  EXPECT_FAIL(cfg, early, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg overrun[] = {t_plain(1, 24), t_data(1, 0, 0, 28), t_end(1)};
  EXPECT_FAIL(cfg, overrun, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg on_empty[] = {t_plain(1, 0), t_data(1, 0, 0, 1), t_end(1)};
  EXPECT_FAIL(cfg, on_empty, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg before[] = {t_data(1, 0, 0, 24), t_plain(1, 24), t_end(1)};
  EXPECT_FAIL(cfg, before, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg end_first[] = {t_end(1)};
  EXPECT_FAIL(cfg, end_first, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg second[] = {t_plain(1, 24), t_data(1, 0, 0, 24), t_end(1),
                     t_plain(1, 24)};
  EXPECT_FAIL(cfg, second, 3, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg after_done[] = {t_plain(1, 4), t_data(1, 0, 0, 4), t_end(1),
                         t_data(1, 0, 4, 4)};
  EXPECT_FAIL(cfg, after_done, 3, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg end_twice[] = {t_plain(1, 0), t_end(1), t_end(1)};
  EXPECT_FAIL(cfg, end_twice, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg desc_open[] = {t_plain(1, 24), t_data(1, 0, 0, 4), t_plain(1, 4)};
  EXPECT_FAIL(cfg, desc_open, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg b1_first[] = {t_desc(1, HR_ELEM_FLOAT32, 2, shape, 3, sizes),
                       t_data(1, 1, 0, 12), t_data(1, 0, 0, 16),
                       t_data(1, 2, 0, 12), t_end(1)};
  EXPECT_FAIL(cfg, b1_first, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg back[] = {t_desc(1, HR_ELEM_FLOAT32, 2, shape, 3, sizes),
                   t_data(1, 0, 0, 16), t_data(1, 1, 0, 12),
                   t_data(1, 0, 0, 4)};
  EXPECT_FAIL(cfg, back, 3, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg beyond[] = {t_desc(1, HR_ELEM_FLOAT32, 2, shape, 3, sizes),
                     t_data(1, 3, 0, 4)};
  EXPECT_FAIL(cfg, beyond, 1, HR_WIRE_PROTOCOL_VIOLATION);
  /* A frame may not span buffers even when the total would fit. */
  hr_msg span[] = {t_desc(1, HR_ELEM_FLOAT32, 2, shape, 3, sizes),
                   t_data(1, 0, 0, 20)};
  EXPECT_FAIL(cfg, span, 1, HR_WIRE_PROTOCOL_VIOLATION);
  uint64_t zsizes[3] = {12, 0, 4};
  hr_msg size0[] = {t_desc(1, HR_ELEM_FLOAT32, 2, shape, 3, zsizes),
                    t_data(1, 0, 0, 12), t_data(1, 1, 0, 1)};
  EXPECT_FAIL(cfg, size0, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg size0_ahead[] = {t_desc(1, HR_ELEM_FLOAT32, 2, shape, 3, zsizes),
                          t_data(1, 1, 0, 1)};
  EXPECT_FAIL(cfg, size0_ahead, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg past_all[] = {t_plain(1, 4), t_data(1, 0, 0, 4), t_data(1, 0, 4, 1)};
  EXPECT_FAIL(cfg, past_all, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg zero_len[] = {t_plain(1, 4), t_data(1, 0, 0, 0)};
  EXPECT_FAIL(cfg, zero_len, 1, HR_WIRE_MALFORMED_PAYLOAD);
  /* total_data_bytes must be the sum of the buffer sizes. */
  hr_msg bad_total[] = {t_plain(1, 4)};
  bad_total[0].u.tensor.xport.total_data_bytes = 5;
  EXPECT_FAIL(cfg, bad_total, 0, HR_WIRE_INVALID_DESCRIPTOR);
  uint64_t huge[2] = {UINT64_MAX, 2};
  hr_msg overflow[] = {t_desc(1, HR_ELEM_UINT8, 2, shape, 2, huge)};
  EXPECT_FAIL(cfg, overflow, 0, HR_WIRE_INVALID_DESCRIPTOR);
  hr_msg nine[] = {t_plain(1, 4)};
  nine[0].u.tensor.desc.buffer_count = 9;
  EXPECT_FAIL(cfg, nine, 0, HR_WIRE_INVALID_DESCRIPTOR);
  hr_msg rank33[] = {t_plain(1, 4)};
  rank33[0].u.tensor.desc.rank = 33;
  EXPECT_FAIL(cfg, rank33, 0, HR_WIRE_INVALID_DESCRIPTOR);
  hr_msg plane3[] = {t_plain(1, 4)};
  plane3[0].u.tensor.xport.data_plane = 3;
  EXPECT_FAIL(cfg, plane3, 0, HR_WIRE_MALFORMED_PAYLOAD);
  /* Unsharded: shard_index/total_shards 0/1. */
  hr_msg fake_shards[] = {t_plain(1, 4)};
  fake_shards[0].u.tensor.xport.total_shards = 2;
  EXPECT_FAIL(cfg, fake_shards, 0, HR_WIRE_INVALID_DESCRIPTOR);
  /* Stream ended before DATA_END, or before anything. */
  hr_msg cut[] = {t_plain(1, 4), t_data(1, 0, 0, 4)};
  EXPECT_FAIL(cfg, cut, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg nothing[1] = {t_end(1)};
  t_result r = t_run(&cfg, nothing, 0);
  assert_int_equal(r.rv, HR_ERR_PROTO);
  assert_int_equal(r.code, HR_WIRE_PROTOCOL_VIOLATION);
}

/* Offsets name the TENSOR_DATA field at fault. */
static void frames_offsets(void **state) {
  (void)state;
  hr_frames f;
  hr_wire_status st;
  hr_msg d = t_plain(1, 8);
  assert_int_equal(hr__frames_init(&f, &d.u.tensor.desc, 8, &st), 0);
  assert_int_equal(hr__frames_on_data(&f, 1, 0, 1, &st), HR_ERR_PROTO);
  assert_int_equal(st.offset, 12);
  assert_int_equal(hr__frames_on_data(&f, 0, 1, 1, &st), HR_ERR_PROTO);
  assert_int_equal(st.offset, 16);
  assert_int_equal(hr__frames_on_data(&f, 0, 0, 9, &st), HR_ERR_PROTO);
  assert_int_equal(st.offset, 8);
  /* Rejected frames changed nothing. */
  assert_int_equal(hr__frames_on_data(&f, 0, 0, 8, &st), 0);
  assert_true(hr__frames_complete(&f));
  assert_int_equal(hr__frames_end(&f, &st), 0);
  assert_int_equal(f.received, 8);
}

static void ordering_other_messages(void **state) {
  (void)state;
  hr_rx_config cfg = *plain_cfg();
  hr_msg outside[] = {t_plain(2, 4)};
  EXPECT_FAIL(cfg, outside, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg below[] = {t_plain(1, 4), t_data(0, 0, 0, 4)};
  EXPECT_FAIL(cfg, below, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg ready[] = {t_plain(1, 4), t_simple(HR_MSG_RDMA_READY, 1)};
  EXPECT_FAIL(cfg, ready, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg cancel[] = {t_simple(HR_MSG_CANCEL, 1)};
  EXPECT_FAIL(cfg, cancel, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg ack[] = {t_simple(HR_MSG_TENSOR_PUT_ACK, 1)};
  EXPECT_FAIL(cfg, ack, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg put[] = {t_put(t_plain(1, 4))};
  EXPECT_FAIL(cfg, put, 0, HR_WIRE_PROTOCOL_VIOLATION);

  /* After a failure every call is HR_ERR_STATE. */
  hr_rx *rx = NULL;
  assert_int_equal(hr_rx_new(&rx, &cfg, NULL), 0);
  hr_rx_event ev;
  hr_wire_status st;
  assert_int_equal(hr_rx_on_message(rx, &ready[1], &ev, &st), HR_ERR_PROTO);
  assert_int_equal(hr_rx_on_message(rx, &ready[0], &ev, &st), HR_ERR_STATE);
  assert_int_equal(hr_rx_finish(rx, &st), HR_ERR_STATE);
  assert_int_equal(hr_rx_done(rx), 0);
  assert_int_equal(hr_rx_on_message(NULL, &ready[0], &ev, &st),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_rx_on_message(rx, NULL, &ev, &st),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_rx_on_message(rx, &ready[0], NULL, &st),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_rx_finish(NULL, &st), HR_ERR_INVALID_ARGUMENT);
  hr_rx_del(rx);
  hr_rx_del(NULL);
}

static void new_arguments(void **state) {
  (void)state;
  hr_rx *rx = (hr_rx *)1;
  hr_rx_config c = t_cfg(1, 0, 1);
  assert_int_equal(hr_rx_new(NULL, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_rx_new(&rx, NULL, NULL), HR_ERR_INVALID_ARGUMENT);
  assert_null(rx);
  c.direction = 7;
  assert_int_equal(hr_rx_new(&rx, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  c = t_cfg(0, 0, 1);
  assert_int_equal(hr_rx_new(&rx, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  c = t_cfg(1, HR_REQ_PARALLEL_OK, 0);
  assert_int_equal(hr_rx_new(&rx, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  c = t_cfg(1, HR_REQ_REGION, 1);
  c.region_rank = 33;
  assert_int_equal(hr_rx_new(&rx, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  c = t_cfg(UINT32_MAX - 2, HR_REQ_PARALLEL_OK, 4);
  assert_int_equal(hr_rx_new(&rx, &c, NULL), HR_ERR_INVALID_ARGUMENT);
  c = t_cfg(UINT32_MAX - 3, HR_REQ_PARALLEL_OK, 4);
  assert_int_equal(hr_rx_new(&rx, &c, NULL), 0);
  hr_rx_del(rx);
}

/* ------------------------------------------------------------------------ */
/* RDMA and SHM data planes, ERROR                                           */
/* ------------------------------------------------------------------------ */

static hr_msg on_plane(hr_msg m, uint8_t plane) {
  m.u.tensor.xport.data_plane = plane;
  return m;
}

static void planes(void **state) {
  (void)state;
  hr_rx_config cfg = *plain_cfg();
  hr_msg rdma[] = {on_plane(t_plain(1, 64), HR_PLANE_RDMA),
                   t_rdma(1, HR_RDMA_SOURCE, 64), t_end(1)};
  EXPECT_OK(cfg, rdma);
  hr_msg rdma_big[] = {on_plane(t_plain(1, 64), HR_PLANE_RDMA),
                       t_rdma(1, HR_RDMA_SOURCE, 128), t_end(1)};
  EXPECT_OK(cfg, rdma_big);
  hr_msg rdma_empty[] = {on_plane(t_plain(1, 0), HR_PLANE_RDMA), t_end(1)};
  EXPECT_OK(cfg, rdma_empty);
  hr_msg shm[] = {on_plane(t_plain(1, 64), HR_PLANE_SHM), t_end(1)};
  EXPECT_OK(cfg, shm);

  hr_msg no_reg[] = {on_plane(t_plain(1, 64), HR_PLANE_RDMA), t_end(1)};
  EXPECT_FAIL(cfg, no_reg, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg dest[] = {on_plane(t_plain(1, 64), HR_PLANE_RDMA),
                   t_rdma(1, HR_RDMA_DESTINATION, 64)};
  EXPECT_FAIL(cfg, dest, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg twice[] = {on_plane(t_plain(1, 64), HR_PLANE_RDMA),
                    t_rdma(1, HR_RDMA_SOURCE, 64),
                    t_rdma(1, HR_RDMA_SOURCE, 64)};
  EXPECT_FAIL(cfg, twice, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg short_reg[] = {on_plane(t_plain(1, 64), HR_PLANE_RDMA),
                        t_rdma(1, HR_RDMA_SOURCE, 63)};
  EXPECT_FAIL(cfg, short_reg, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg frames_reg[] = {t_plain(1, 64), t_rdma(1, HR_RDMA_SOURCE, 64)};
  EXPECT_FAIL(cfg, frames_reg, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg reg_first[] = {t_rdma(1, HR_RDMA_SOURCE, 64)};
  EXPECT_FAIL(cfg, reg_first, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg reg_after[] = {on_plane(t_plain(1, 64), HR_PLANE_RDMA),
                        t_rdma(1, HR_RDMA_SOURCE, 64), t_end(1),
                        t_rdma(1, HR_RDMA_SOURCE, 64)};
  EXPECT_FAIL(cfg, reg_after, 3, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg data_rdma[] = {on_plane(t_plain(1, 64), HR_PLANE_RDMA),
                        t_data(1, 0, 0, 64)};
  EXPECT_FAIL(cfg, data_rdma, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg data_shm[] = {on_plane(t_plain(1, 64), HR_PLANE_SHM),
                       t_data(1, 0, 0, 64)};
  EXPECT_FAIL(cfg, data_shm, 1, HR_WIRE_PROTOCOL_VIOLATION);
}

static void error_ends_stream(void **state) {
  (void)state;
  hr_rx_config cfg = *plain_cfg();
  hr_rx *rx = NULL;
  hr_rx_event ev;
  hr_wire_status st;
  assert_int_equal(hr_rx_new(&rx, &cfg, NULL), 0);
  hr_msg d = t_plain(1, 8), f = t_data(1, 0, 0, 4);
  hr_msg e = t_error(1, HR_WIRE_RESOURCE_EXHAUSTED);
  assert_int_equal(hr_rx_on_message(rx, &d, &ev, &st), 0);
  assert_int_equal(hr_rx_on_message(rx, &f, &ev, &st), 0);
  assert_int_equal(hr_rx_on_message(rx, &e, &ev, &st), 0);
  assert_int_equal(ev.kind, HR_RXE_STREAM_ENDED);
  assert_int_equal(ev.error_code, HR_WIRE_RESOURCE_EXHAUSTED);
  assert_string_equal(hr__rx_stream_state_name(rx, 1), "ENDED");
  /* A second ERROR races the end: dropped. */
  hr_msg e2 = t_error(1, HR_WIRE_CANCELLED);
  assert_int_equal(hr_rx_on_message(rx, &e2, &ev, &st), 0);
  assert_int_equal(ev.kind, HR_RXE_NONE);
  assert_int_equal(hr_rx_done(rx), 0);
  assert_int_equal(hr_rx_finish(rx, &st), HR_ERR_REMOTE);
  assert_int_equal(st.code, HR_WIRE_RESOURCE_EXHAUSTED);
  assert_non_null(st.reason);
  /* Anything else on the ended stream is a violation. */
  hr_msg f2 = t_data(1, 0, 4, 4);
  assert_int_equal(hr_rx_on_message(rx, &f2, &ev, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_PROTOCOL_VIOLATION);
  hr_rx_del(rx);

  /* ERROR before anything (NOT_FOUND), then a descriptor: violation. */
  hr_msg nf[] = {t_error(1, HR_WIRE_NOT_FOUND), t_plain(1, 4)};
  EXPECT_FAIL(cfg, nf, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg nf_only[] = {t_error(1, HR_WIRE_NOT_FOUND)};
  t_result r = t_run(&cfg, nf_only, 1);
  assert_int_equal(r.rv, HR_ERR_REMOTE);
  assert_int_equal(r.code, HR_WIRE_NOT_FOUND);
  hr_msg nf_end[] = {t_error(1, HR_WIRE_NOT_FOUND), t_end(1)};
  EXPECT_FAIL(cfg, nf_end, 1, HR_WIRE_PROTOCOL_VIOLATION);

  /* ERROR after the answer completed: dropped, the transfer stands. */
  hr_msg late[] = {t_plain(1, 0), t_end(1), t_error(1, HR_WIRE_CANCELLED)};
  r = t_run(&cfg, late, N_OF(late));
  assert_int_equal(r.rv, 0);
  assert_int_equal(r.last.kind, HR_RXE_NONE);
  assert_int_equal(r.done_events, 1);
}

/* ------------------------------------------------------------------------ */
/* Composites (composite.json)                                               */
/* ------------------------------------------------------------------------ */

static void composite_valid(void **state) {
  (void)state;
  hr_rx_config cfg = *plain_cfg();
  hr_msg tuple[] = {t_tuple(1, 2),      t_end(1), t_plain(1, 8),
                    t_data(1, 0, 0, 8), t_end(1), t_plain(1, 3),
                    t_data(1, 0, 0, 3), t_end(1)};
  EXPECT_OK(cfg, tuple);

  uint64_t h[2] = {3, 2}, m0[2] = {2, 2}, m1[2] = {1, 2};
  hr_msg concat[] = {
      t_head(1, HR_ELEM_FLOAT32, 2, h, 2, HR_COMPOSITE_CONCAT, 0, 0, 0),
      t_end(1),
      t_typed(1, HR_ELEM_FLOAT32, 2, m0),
      t_data(1, 0, 0, 16),
      t_end(1),
      t_typed(1, HR_ELEM_FLOAT32, 2, m1),
      t_data(1, 0, 0, 8),
      t_end(1)};
  EXPECT_OK(cfg, concat);

  uint64_t gh[2] = {2, 8}, gs[2] = {2, 2};
  hr_msg gq[] = {t_head(1, HR_ELEM_FLOAT32, 2, gh, 3,
                        HR_COMPOSITE_GROUP_QUANTIZED, 1, 4, 1),
                 t_end(1),
                 t_typed(1, HR_ELEM_INT8, 2, gh),
                 t_data(1, 0, 0, 64),
                 t_end(1),
                 t_typed(1, HR_ELEM_FLOAT16, 2, gs),
                 t_data(1, 0, 0, 16),
                 t_end(1),
                 t_typed(1, HR_ELEM_INT8, 2, gs),
                 t_data(1, 0, 0, 16),
                 t_end(1)};
  EXPECT_OK(cfg, gq);
  /* Without zero points, and a group that does not divide the axis. */
  uint64_t gh2[2] = {2, 9}, gs2[2] = {2, 3};
  hr_msg gq2[] = {t_head(1, HR_ELEM_FLOAT32, 2, gh2, 2,
                         HR_COMPOSITE_GROUP_QUANTIZED, 1, 4, 0),
                  t_end(1),
                  t_typed(1, HR_ELEM_UINT4, 2, gh2),
                  t_data(1, 0, 0, 72),
                  t_end(1),
                  t_typed(1, HR_ELEM_BFLOAT16, 2, gs2),
                  t_data(1, 0, 0, 24),
                  t_end(1)};
  EXPECT_OK(cfg, gq2);
  /* An empty member inside a tuple. */
  hr_msg tuple_empty[] = {t_tuple(1, 1), t_end(1), t_plain(1, 0), t_end(1)};
  EXPECT_OK(cfg, tuple_empty);
}

/* 8 nested heads, each the single member of the one above, then a leaf:
 * valid; 9 heads: COMPOSITE_INVALID on the 9th. */
static void composite_depth(void **state) {
  (void)state;
  hr_rx_config cfg = *plain_cfg();
  hr_msg m[2 * 9 + 3];
  int n = 0;
  for (int i = 0; i < 8; i++) {
    m[n++] = t_tuple(1, 1);
    m[n++] = t_end(1);
  }
  m[n++] = t_plain(1, 8);
  m[n++] = t_data(1, 0, 0, 8);
  m[n++] = t_end(1);
  t_result r = t_run(&cfg, m, n);
  assert_int_equal(r.rv, 0);
  assert_int_equal(r.last.kind,
                   HR_RXE_TENSOR_END | HR_RXE_COMPOSITE_CLOSE | HR_RXE_DONE);
  assert_int_equal(r.last.composites_closed, 8);
  assert_int_equal(r.last.depth, 9);

  n = 0;
  for (int i = 0; i < 9; i++) {
    m[n++] = t_tuple(1, 1);
    m[n++] = t_end(1);
  }
  m[n++] = t_plain(1, 8);
  r = t_run(&cfg, m, n);
  assert_int_equal(r.rv, HR_ERR_PROTO);
  assert_int_equal(r.at, 16);
  assert_int_equal(r.code, HR_WIRE_COMPOSITE_INVALID);
}

/* Event fields through a nested composite: TUPLE(3) = [leaf, TUPLE(1) =
 * [leaf], leaf]. */
static void composite_events(void **state) {
  (void)state;
  hr_rx *rx = NULL;
  hr_rx_event ev;
  hr_wire_status st;
  assert_int_equal(hr_rx_new(&rx, plain_cfg(), NULL), 0);
  hr_msg seq[] = {
      t_tuple(1, 3), t_end(1),      t_plain(1, 0), t_end(1),
      t_tuple(1, 1), t_end(1),      t_plain(1, 2), t_data(1, 0, 0, 2),
      t_end(1),      t_plain(1, 0), t_end(1)};
  struct {
    int kind;
    unsigned depth;
    uint32_t member;
    unsigned closed;
  } want[] = {
      {HR_RXE_TENSOR_BEGIN, 1, 0, 0},
      {HR_RXE_TENSOR_END, 1, 0, 0},
      {HR_RXE_TENSOR_BEGIN, 2, 0, 0},
      {HR_RXE_TENSOR_END, 2, 0, 0},
      {HR_RXE_TENSOR_BEGIN, 2, 1, 0},
      {HR_RXE_TENSOR_END, 2, 1, 0},
      {HR_RXE_TENSOR_BEGIN, 3, 0, 0},
      {HR_RXE_DATA, 3, 0, 0},
      {HR_RXE_TENSOR_END | HR_RXE_COMPOSITE_CLOSE, 3, 0, 1},
      {HR_RXE_TENSOR_BEGIN, 2, 2, 0},
      {HR_RXE_TENSOR_END | HR_RXE_COMPOSITE_CLOSE | HR_RXE_DONE, 2, 2, 1},
  };
  for (int i = 0; i < N_OF(seq); i++) {
    assert_int_equal(hr_rx_on_message(rx, &seq[i], &ev, &st), 0);
    assert_int_equal(ev.kind, want[i].kind);
    assert_int_equal(ev.depth, want[i].depth);
    assert_int_equal(ev.member_index, want[i].member);
    assert_int_equal(ev.composites_closed, want[i].closed);
  }
  assert_int_equal(hr_rx_finish(rx, &st), 0);
  hr_rx_del(rx);
}

static void composite_head_rejections(void **state) {
  (void)state;
  hr_rx_config cfg = *plain_cfg();
  uint64_t h[2] = {3, 2};
  hr_msg typed[] = {t_tuple(1, 2)};
  typed[0].u.tensor.desc.element_type = HR_ELEM_FLOAT32;
  EXPECT_FAIL(cfg, typed, 0, HR_WIRE_COMPOSITE_INVALID);
  hr_msg rank1[] = {t_tuple(1, 2)};
  rank1[0].u.tensor.desc.rank = 1;
  rank1[0].u.tensor.desc.shape[0] = 2;
  EXPECT_FAIL(cfg, rank1, 0, HR_WIRE_COMPOSITE_INVALID);
  hr_msg none[] = {
      t_head(1, HR_ELEM_NONE, 2, h, 2, HR_COMPOSITE_CONCAT, 0, 0, 0)};
  EXPECT_FAIL(cfg, none, 0, HR_WIRE_COMPOSITE_INVALID);
  hr_msg axis[] = {
      t_head(1, HR_ELEM_FLOAT32, 2, h, 2, HR_COMPOSITE_CONCAT, 2, 0, 0)};
  EXPECT_FAIL(cfg, axis, 0, HR_WIRE_COMPOSITE_INVALID);
  hr_msg gaxis[] = {t_head(1, HR_ELEM_FLOAT32, 2, h, 2,
                           HR_COMPOSITE_GROUP_QUANTIZED, 5, 4, 0)};
  EXPECT_FAIL(cfg, gaxis, 0, HR_WIRE_COMPOSITE_INVALID);
  hr_msg zero[] = {t_tuple(1, 0)};
  EXPECT_FAIL(cfg, zero, 0, HR_WIRE_COMPOSITE_INVALID);
  hr_msg many[] = {t_tuple(1, 65536)};
  EXPECT_FAIL(cfg, many, 0, HR_WIRE_COMPOSITE_INVALID);
  hr_msg rule[] = {t_head(1, HR_ELEM_FLOAT32, 2, h, 2, 3, 0, 0, 0)};
  EXPECT_FAIL(cfg, rule, 0, HR_WIRE_COMPOSITE_INVALID);
  hr_msg group0[] = {t_head(1, HR_ELEM_FLOAT32, 2, h, 2,
                            HR_COMPOSITE_GROUP_QUANTIZED, 1, 0, 0)};
  EXPECT_FAIL(cfg, group0, 0, HR_WIRE_COMPOSITE_INVALID);
  hr_msg zp2[] = {t_head(1, HR_ELEM_FLOAT32, 2, h, 4,
                         HR_COMPOSITE_GROUP_QUANTIZED, 1, 2, 2)};
  EXPECT_FAIL(cfg, zp2, 0, HR_WIRE_COMPOSITE_INVALID);
  hr_msg count[] = {t_head(1, HR_ELEM_FLOAT32, 2, h, 2,
                           HR_COMPOSITE_GROUP_QUANTIZED, 1, 2, 1)};
  EXPECT_FAIL(cfg, count, 0, HR_WIRE_COMPOSITE_INVALID);
  hr_msg bufs[] = {t_tuple(1, 2)};
  bufs[0].u.tensor.desc.buffer_count = 1;
  EXPECT_FAIL(cfg, bufs, 0, HR_WIRE_INVALID_DESCRIPTOR);
  hr_msg total[] = {t_tuple(1, 2)};
  total[0].u.tensor.xport.total_data_bytes = 4;
  EXPECT_FAIL(cfg, total, 0, HR_WIRE_INVALID_DESCRIPTOR);
  /* The head owns no data, and its DATA_END comes before any member. */
  hr_msg frame[] = {t_tuple(1, 1), t_data(1, 0, 0, 1)};
  EXPECT_FAIL(cfg, frame, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg no_end[] = {t_tuple(1, 1), t_plain(1, 0)};
  EXPECT_FAIL(cfg, no_end, 1, HR_WIRE_PROTOCOL_VIOLATION);
}

static void composite_member_rejections(void **state) {
  (void)state;
  hr_rx_config cfg = *plain_cfg();
  uint64_t h[2] = {3, 2}, m0[2] = {2, 2}, m1[2] = {1, 2};
  hr_msg head =
      t_head(1, HR_ELEM_FLOAT32, 2, h, 2, HR_COMPOSITE_CONCAT, 0, 0, 0);
  hr_msg sum[] = {head,
                  t_end(1),
                  t_typed(1, HR_ELEM_FLOAT32, 2, m0),
                  t_data(1, 0, 0, 16),
                  t_end(1),
                  t_typed(1, HR_ELEM_FLOAT32, 2, m0),
                  t_data(1, 0, 0, 16),
                  t_end(1)};
  EXPECT_FAIL(cfg, sum, 5, HR_WIRE_COMPOSITE_INVALID); /* 4 > 3 early */
  hr_msg h4 = head;
  h4.u.tensor.desc.shape[0] = 4;
  hr_msg short_sum[] = {h4,
                        t_end(1),
                        t_typed(1, HR_ELEM_FLOAT32, 2, m0),
                        t_data(1, 0, 0, 16),
                        t_end(1),
                        t_typed(1, HR_ELEM_FLOAT32, 2, m1),
                        t_data(1, 0, 0, 8),
                        t_end(1)};
  EXPECT_FAIL(cfg, short_sum, 7, HR_WIRE_COMPOSITE_INVALID); /* at close */
  hr_msg type[] = {head, t_end(1), t_typed(1, HR_ELEM_INT32, 2, m0)};
  EXPECT_FAIL(cfg, type, 2, HR_WIRE_COMPOSITE_INVALID);
  hr_msg rank[] = {head, t_end(1), t_typed(1, HR_ELEM_FLOAT32, 1, m0)};
  EXPECT_FAIL(cfg, rank, 2, HR_WIRE_COMPOSITE_INVALID);
  uint64_t wide[2] = {1, 3};
  hr_msg off_axis[] = {head, t_end(1), t_typed(1, HR_ELEM_FLOAT32, 2, wide)};
  EXPECT_FAIL(cfg, off_axis, 2, HR_WIRE_COMPOSITE_INVALID);

  uint64_t gh[2] = {2, 8}, gs[2] = {2, 2}, bad[2] = {2, 4};
  hr_msg gq = t_head(1, HR_ELEM_FLOAT32, 2, gh, 3, HR_COMPOSITE_GROUP_QUANTIZED,
                     1, 4, 1);
  hr_msg scales[] = {gq,
                     t_end(1),
                     t_typed(1, HR_ELEM_INT8, 2, gh),
                     t_data(1, 0, 0, 64),
                     t_end(1),
                     t_typed(1, HR_ELEM_FLOAT16, 2, bad)};
  EXPECT_FAIL(cfg, scales, 5, HR_WIRE_COMPOSITE_INVALID);
  hr_msg m0_type[] = {gq, t_end(1), t_typed(1, HR_ELEM_FLOAT32, 2, gh)};
  EXPECT_FAIL(cfg, m0_type, 2, HR_WIRE_COMPOSITE_INVALID);
  hr_msg m0_shape[] = {gq, t_end(1), t_typed(1, HR_ELEM_INT8, 2, gs)};
  EXPECT_FAIL(cfg, m0_shape, 2, HR_WIRE_COMPOSITE_INVALID);
  hr_msg m0_rank[] = {gq, t_end(1), t_typed(1, HR_ELEM_INT8, 1, gh)};
  EXPECT_FAIL(cfg, m0_rank, 2, HR_WIRE_COMPOSITE_INVALID);
  hr_msg s_type[] = {gq,
                     t_end(1),
                     t_typed(1, HR_ELEM_INT8, 2, gh),
                     t_data(1, 0, 0, 64),
                     t_end(1),
                     t_typed(1, HR_ELEM_INT8, 2, gs)};
  EXPECT_FAIL(cfg, s_type, 5, HR_WIRE_COMPOSITE_INVALID);
  hr_msg zp_type[] = {gq,
                      t_end(1),
                      t_typed(1, HR_ELEM_INT8, 2, gh),
                      t_data(1, 0, 0, 64),
                      t_end(1),
                      t_typed(1, HR_ELEM_FLOAT32, 2, gs),
                      t_data(1, 0, 0, 16),
                      t_end(1),
                      t_typed(1, HR_ELEM_UINT8, 2, gs)};
  EXPECT_FAIL(cfg, zp_type, 8, HR_WIRE_COMPOSITE_INVALID);
  hr_msg zp_shape[] = {gq,
                       t_end(1),
                       t_typed(1, HR_ELEM_INT8, 2, gh),
                       t_data(1, 0, 0, 64),
                       t_end(1),
                       t_typed(1, HR_ELEM_FLOAT32, 2, gs),
                       t_data(1, 0, 0, 16),
                       t_end(1),
                       t_typed(1, HR_ELEM_INT8, 2, gh)};
  EXPECT_FAIL(cfg, zp_shape, 8, HR_WIRE_COMPOSITE_INVALID);

  /* Members are never shards. */
  hr_msg shard_member[] = {t_tuple(1, 1), t_end(1), t_plain(1, 4)};
  uint64_t parent[1] = {8}, off[1] = {0};
  t_shard(&shard_member[2], 0, 1, parent, off);
  EXPECT_FAIL(cfg, shard_member, 2, HR_WIRE_COMPOSITE_INVALID);
  hr_msg total_member[] = {t_tuple(1, 1), t_end(1), t_plain(1, 4)};
  total_member[2].u.tensor.xport.total_shards = 2;
  EXPECT_FAIL(cfg, total_member, 2, HR_WIRE_COMPOSITE_INVALID);
}

static void composite_torn(void **state) {
  (void)state;
  hr_rx_config cfg = *plain_cfg();
  hr_msg torn[] = {t_tuple(1, 2), t_end(1), t_plain(1, 8), t_data(1, 0, 0, 8),
                   t_end(1)};
  EXPECT_FAIL(cfg, torn, N_OF(torn), HR_WIRE_COMPOSITE_INVALID);
  hr_msg head_only[] = {t_tuple(1, 2)};
  EXPECT_FAIL(cfg, head_only, 1, HR_WIRE_COMPOSITE_INVALID);

  /* Permissive: accepted, reported torn, never complete. */
  cfg.strict = 0;
  hr_rx *rx = NULL;
  hr_rx_event ev;
  hr_wire_status st;
  assert_int_equal(hr_rx_new(&rx, &cfg, NULL), 0);
  hr_msg mid[] = {t_tuple(1, 3),      t_end(1), t_plain(1, 8),
                  t_data(1, 0, 0, 8), t_end(1), t_plain(1, 8),
                  t_data(1, 0, 0, 4)};
  for (int i = 0; i < N_OF(mid); i++) {
    assert_int_equal(hr_rx_on_message(rx, &mid[i], &ev, &st), 0);
    assert_false(ev.kind & (HR_RXE_COMPOSITE_CLOSE | HR_RXE_DONE));
  }
  assert_int_equal(hr_rx_torn(rx), 0);
  assert_int_equal(hr_rx_finish(rx, &st), 0);
  assert_int_equal(hr_rx_torn(rx), 1);
  assert_int_equal(hr_rx_done(rx), 0);
  hr_rx_del(rx);
}

/* ------------------------------------------------------------------------ */
/* Shards (shards.json)                                                      */
/* ------------------------------------------------------------------------ */

/* Shard i of an [8, 3] FLOAT32 tensor: rows [r0, r0 + rows). */
static hr_msg rows_shard(uint32_t sid, uint16_t i, uint16_t n, uint64_t r0,
                         uint64_t rows) {
  uint64_t shape[2] = {rows, 3}, parent[2] = {8, 3}, off[2] = {r0, 0};
  hr_msg m = t_typed(sid, HR_ELEM_FLOAT32, 2, shape);
  t_shard(&m, i, n, parent, off);
  return m;
}

static void shards_valid(void **state) {
  (void)state;
  hr_rx_config cfg = t_cfg(1, HR_REQ_PARALLEL_OK, 4);
  hr_msg two[] = {rows_shard(1, 0, 2, 0, 5), t_data(1, 0, 0, 60), t_end(1),
                  rows_shard(2, 1, 2, 5, 3), t_data(2, 0, 0, 36), t_end(2)};
  EXPECT_OK(cfg, two);
  /* Interleaved, shard 1 first. */
  hr_msg mixed[] = {rows_shard(2, 1, 2, 5, 3),
                    rows_shard(1, 0, 2, 0, 5),
                    t_data(1, 0, 0, 60),
                    t_data(2, 0, 0, 36),
                    t_end(2),
                    t_end(1)};
  t_result r = t_run(&cfg, mixed, N_OF(mixed));
  assert_int_equal(r.rv, 0);
  assert_int_equal(r.done_events, 1);
  assert_true(r.kinds_or & HR_RXE_SHARDS_VALID);
  hr_msg one[] = {rows_shard(1, 0, 1, 0, 8), t_data(1, 0, 0, 96), t_end(1)};
  EXPECT_OK(cfg, one);

  /* REGION (2, 1) + (3, 2) of [8, 3]. */
  hr_rx_config rc = t_cfg(1, HR_REQ_REGION, 1);
  rc.region_rank = 2;
  rc.region_offset[0] = 2;
  rc.region_offset[1] = 1;
  rc.region_shape[0] = 3;
  rc.region_shape[1] = 2;
  uint64_t shape[2] = {3, 2}, parent[2] = {8, 3}, off[2] = {2, 1};
  hr_msg reg = t_typed(1, HR_ELEM_FLOAT32, 2, shape);
  t_shard(&reg, 0, 1, parent, off);
  hr_msg region[] = {reg, t_data(1, 0, 0, 24), t_end(1)};
  cfg = rc;
  EXPECT_OK(cfg, region);
  /* REGION + PARALLEL_OK: two shards tiling the region. */
  rc.request_flags |= HR_REQ_PARALLEL_OK;
  rc.max_shards = 2;
  uint64_t s0[2] = {2, 2}, s1[2] = {1, 2}, o1[2] = {4, 1};
  hr_msg a = t_typed(1, HR_ELEM_FLOAT32, 2, s0);
  t_shard(&a, 0, 2, parent, off);
  hr_msg b = t_typed(2, HR_ELEM_FLOAT32, 2, s1);
  t_shard(&b, 1, 2, parent, o1);
  hr_msg region2[] = {a, t_data(1, 0, 0, 16), t_end(1),
                      b, t_data(2, 0, 0, 8),  t_end(2)};
  EXPECT_OK(rc, region2);

  /* Event fields. */
  hr_rx *rx = NULL;
  hr_rx_event ev;
  hr_wire_status st;
  cfg = t_cfg(1, HR_REQ_PARALLEL_OK, 4);
  assert_int_equal(hr_rx_new(&rx, &cfg, NULL), 0);
  hr_msg s = rows_shard(2, 1, 2, 5, 3);
  assert_int_equal(hr_rx_on_message(rx, &s, &ev, &st), 0);
  assert_int_equal(ev.kind, HR_RXE_TENSOR_BEGIN);
  assert_int_equal(ev.shard_index, 1);
  assert_int_equal(ev.total_shards, 2);
  assert_string_equal(hr__rx_mode_name(rx), "SHARDED");
  s = rows_shard(1, 0, 2, 0, 5);
  assert_int_equal(hr_rx_on_message(rx, &s, &ev, &st), 0);
  assert_int_equal(ev.kind, HR_RXE_TENSOR_BEGIN | HR_RXE_SHARDS_VALID);
  assert_int_equal(ev.shard_index, 0);
  hr_rx_del(rx);
}

static void shards_rejections(void **state) {
  (void)state;
  hr_rx_config cfg = t_cfg(1, HR_REQ_PARALLEL_OK, 4);
  hr_msg overlap[] = {rows_shard(1, 0, 2, 0, 5), rows_shard(2, 1, 2, 4, 4)};
  EXPECT_FAIL(cfg, overlap, 1, HR_WIRE_SHARD_INCONSISTENT);
  hr_msg gap[] = {rows_shard(1, 0, 2, 0, 4), rows_shard(2, 1, 2, 5, 3)};
  EXPECT_FAIL(cfg, gap, 1, HR_WIRE_SHARD_INCONSISTENT);
  hr_msg parent[] = {rows_shard(1, 0, 2, 0, 5), rows_shard(2, 1, 2, 5, 3)};
  parent[1].u.tensor.desc.parent_shape[0] = 9;
  EXPECT_FAIL(cfg, parent, 1, HR_WIRE_SHARD_INCONSISTENT);
  hr_msg prank[] = {rows_shard(1, 0, 2, 0, 5), rows_shard(2, 1, 2, 5, 3)};
  prank[1].u.tensor.desc.rank = 3;
  prank[1].u.tensor.desc.shape[2] = 1;
  prank[1].u.tensor.desc.parent_shape[2] = 1;
  EXPECT_FAIL(cfg, prank, 1, HR_WIRE_SHARD_INCONSISTENT);
  hr_msg type[] = {rows_shard(1, 0, 2, 0, 5), rows_shard(2, 1, 2, 5, 3)};
  type[1].u.tensor.desc.element_type = HR_ELEM_INT32;
  EXPECT_FAIL(cfg, type, 1, HR_WIRE_SHARD_INCONSISTENT);
  hr_msg tag[] = {rows_shard(1, 0, 2, 0, 5), rows_shard(2, 1, 2, 5, 3)};
  tag[1].u.tensor.desc.layout.tag = HR_LAYOUT_COLUMN_MAJOR;
  EXPECT_FAIL(cfg, tag, 1, HR_WIRE_SHARD_INCONSISTENT);
  hr_msg total[] = {rows_shard(1, 0, 2, 0, 5), rows_shard(2, 1, 3, 5, 3)};
  EXPECT_FAIL(cfg, total, 1, HR_WIRE_SHARD_INCONSISTENT);
  hr_msg wrong_stream[] = {rows_shard(1, 1, 2, 0, 5)};
  EXPECT_FAIL(cfg, wrong_stream, 0, HR_WIRE_SHARD_INCONSISTENT);
  hr_msg index_high[] = {rows_shard(3, 2, 2, 0, 5)};
  EXPECT_FAIL(cfg, index_high, 0, HR_WIRE_SHARD_INCONSISTENT);
  hr_msg zero[] = {rows_shard(1, 0, 0, 0, 8)};
  EXPECT_FAIL(cfg, zero, 0, HR_WIRE_SHARD_INCONSISTENT);
  hr_rx_config k2 = t_cfg(1, HR_REQ_PARALLEL_OK, 2);
  hr_msg more_than_k[] = {rows_shard(1, 0, 3, 0, 3)};
  EXPECT_FAIL(k2, more_than_k, 0, HR_WIRE_SHARD_INCONSISTENT);
  hr_rx_config srv = cfg;
  srv.server_max_shards = 2;
  hr_msg more_than_srv[] = {rows_shard(1, 0, 3, 0, 3)};
  EXPECT_FAIL(srv, more_than_srv, 0, HR_WIRE_SHARD_INCONSISTENT);
  /* Outside the reserved block: a shard, or anything else. */
  hr_msg block[] = {rows_shard(1, 0, 2, 0, 5), rows_shard(5, 1, 2, 5, 3)};
  EXPECT_FAIL(cfg, block, 1, HR_WIRE_SHARD_INCONSISTENT);
  hr_msg block_data[] = {rows_shard(1, 0, 2, 0, 5), t_data(5, 0, 0, 4)};
  EXPECT_FAIL(cfg, block_data, 1, HR_WIRE_PROTOCOL_VIOLATION);
  /* Reserved streams beyond N carry nothing once N is known. */
  hr_msg unused[] = {rows_shard(1, 0, 2, 0, 5), t_error(4, HR_WIRE_INTERNAL)};
  EXPECT_FAIL(cfg, unused, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg unused_data[] = {rows_shard(1, 0, 2, 0, 5), t_data(3, 0, 0, 4)};
  EXPECT_FAIL(cfg, unused_data, 1, HR_WIRE_PROTOCOL_VIOLATION);
  /* A shard outside its own parent is a descriptor fault. */
  hr_msg out_parent[] = {rows_shard(1, 0, 2, 6, 5)};
  EXPECT_FAIL(cfg, out_parent, 0, HR_WIRE_INVALID_DESCRIPTOR);

  /* HAS_SHARD rules. */
  hr_msg without[] = {t_plain(1, 96)};
  EXPECT_FAIL(cfg, without, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg later_without[] = {rows_shard(1, 0, 2, 0, 5), t_plain(2, 36)};
  EXPECT_FAIL(cfg, later_without, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg later_head[] = {rows_shard(1, 0, 2, 0, 5), t_tuple(2, 1)};
  EXPECT_FAIL(cfg, later_head, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_rx_config plain = *plain_cfg();
  hr_msg plain_shard[] = {rows_shard(1, 0, 1, 0, 8)};
  EXPECT_FAIL(plain, plain_shard, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_rx_config rc = t_cfg(1, HR_REQ_REGION, 1);
  rc.region_rank = 2;
  rc.region_shape[0] = 8;
  rc.region_shape[1] = 3;
  hr_msg reg_without[] = {t_plain(1, 96)};
  EXPECT_FAIL(rc, reg_without, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg reg_head[] = {t_tuple(1, 1)};
  EXPECT_FAIL(rc, reg_head, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg reg_ok[] = {rows_shard(1, 0, 1, 0, 8), t_data(1, 0, 0, 96), t_end(1)};
  EXPECT_OK(rc, reg_ok);
  rc.region_shape[0] = 4;
  hr_msg reg_outside[] = {rows_shard(1, 0, 1, 0, 8)};
  EXPECT_FAIL(rc, reg_outside, 0, HR_WIRE_SHARD_INCONSISTENT);
  rc.region_rank = 1;
  hr_msg reg_rank[] = {rows_shard(1, 0, 1, 0, 8)};
  EXPECT_FAIL(rc, reg_rank, 0, HR_WIRE_SHARD_INCONSISTENT);

  /* Missing shards at the end, or an ERROR on one of them. */
  hr_msg missing[] = {rows_shard(1, 0, 2, 0, 5), t_data(1, 0, 0, 60), t_end(1)};
  EXPECT_FAIL(cfg, missing, N_OF(missing), HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg open2[] = {rows_shard(1, 0, 2, 0, 5), rows_shard(2, 1, 2, 5, 3),
                    t_data(1, 0, 0, 60), t_end(1)};
  EXPECT_FAIL(cfg, open2, N_OF(open2), HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg err[] = {rows_shard(1, 0, 2, 0, 5), t_error(2, HR_WIRE_INTERNAL),
                  t_data(1, 0, 0, 60), t_end(1)};
  t_result r = t_run(&cfg, err, N_OF(err));
  assert_int_equal(r.rv, HR_ERR_REMOTE);
  assert_int_equal(r.code, HR_WIRE_INTERNAL);
  assert_int_equal(r.done_events, 0);
}

/* PARALLEL_OK for a composite: answered unsharded on the base stream. */
static void shards_composite(void **state) {
  (void)state;
  hr_rx_config cfg = t_cfg(1, HR_REQ_PARALLEL_OK, 4);
  hr_msg ok[] = {t_tuple(1, 1), t_end(1), t_plain(1, 4), t_data(1, 0, 0, 4),
                 t_end(1)};
  EXPECT_OK(cfg, ok);
  hr_msg other_stream[] = {t_tuple(2, 1)};
  EXPECT_FAIL(cfg, other_stream, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg then_shard[] = {t_tuple(1, 1), t_end(1), t_plain(2, 4)};
  EXPECT_FAIL(cfg, then_shard, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg error_unused[] = {t_tuple(1, 1), t_error(3, HR_WIRE_INTERNAL)};
  EXPECT_FAIL(cfg, error_unused, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg sharded_head[] = {t_tuple(1, 1)};
  uint64_t p[1] = {1}, o[1] = {0};
  t_shard(&sharded_head[0], 0, 1, p, o);
  EXPECT_FAIL(cfg, sharded_head, 0, HR_WIRE_COMPOSITE_INVALID);
}

/* ------------------------------------------------------------------------ */
/* PUT (put.json)                                                            */
/* ------------------------------------------------------------------------ */

static hr_rx_config put_cfg(uint32_t base) {
  hr_rx_config c;
  memset(&c, 0, sizeof c);
  c.direction = HR_RX_C2S;
  c.base_stream = base;
  c.strict = 1;
  return c;
}

static void put_sequences(void **state) {
  (void)state;
  hr_rx_config cfg = put_cfg(1);
  hr_msg frames[] = {t_put(t_plain(1, 24)), t_data(1, 0, 0, 16),
                     t_data(1, 0, 16, 8), t_end(1)};
  EXPECT_OK(cfg, frames);
  hr_msg empty[] = {t_put(t_plain(1, 0)), t_end(1)};
  EXPECT_OK(cfg, empty);
  /* Composite PUT: head in TENSOR_PUT, members as TENSOR_DESCRIPTOR,
   * a nested head among them. */
  hr_msg comp[] = {t_put(t_tuple(1, 2)),
                   t_end(1),
                   t_plain(1, 4),
                   t_data(1, 0, 0, 4),
                   t_end(1),
                   t_tuple(1, 1),
                   t_end(1),
                   t_plain(1, 0),
                   t_end(1)};
  EXPECT_OK(cfg, comp);
  /* base_stream 0: the PUT's stream is adopted. */
  hr_rx_config adopt = put_cfg(0);
  hr_msg on7[] = {t_put(t_plain(7, 4)), t_data(7, 0, 0, 4), t_end(7)};
  EXPECT_OK(adopt, on7);
  hr_msg on7_other[] = {t_put(t_plain(7, 4)), t_data(8, 0, 0, 4)};
  EXPECT_FAIL(adopt, on7_other, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg not_put[] = {t_plain(7, 4)};
  EXPECT_FAIL(adopt, not_put, 0, HR_WIRE_PROTOCOL_VIOLATION);

  hr_msg then_desc[] = {t_put(t_plain(1, 24)), t_plain(1, 24)};
  EXPECT_FAIL(cfg, then_desc, 1, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg after_desc[] = {t_put(t_plain(1, 0)), t_end(1), t_plain(1, 24)};
  EXPECT_FAIL(cfg, after_desc, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg desc_first[] = {t_plain(1, 24)};
  EXPECT_FAIL(cfg, desc_first, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg data_first[] = {t_data(1, 0, 0, 4)};
  EXPECT_FAIL(cfg, data_first, 0, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg second_put[] = {t_put(t_tuple(1, 1)), t_end(1), t_put(t_plain(1, 0))};
  EXPECT_FAIL(cfg, second_put, 2, HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg put_shard[] = {t_put(rows_shard(1, 0, 1, 0, 8))};
  EXPECT_FAIL(cfg, put_shard, 0, HR_WIRE_PUT_REJECTED);
  hr_msg member_shard[] = {t_put(t_tuple(1, 1)), t_end(1),
                           rows_shard(1, 0, 1, 0, 8)};
  EXPECT_FAIL(cfg, member_shard, 2, HR_WIRE_COMPOSITE_INVALID);
  hr_msg torn[] = {t_put(t_tuple(1, 2)), t_end(1), t_plain(1, 0), t_end(1)};
  EXPECT_FAIL(cfg, torn, N_OF(torn), HR_WIRE_COMPOSITE_INVALID);
  hr_msg cut[] = {t_put(t_plain(1, 8)), t_data(1, 0, 0, 4)};
  EXPECT_FAIL(cfg, cut, N_OF(cut), HR_WIRE_PROTOCOL_VIOLATION);
  hr_msg rdma[] = {t_put(t_plain(1, 8)), t_rdma(1, HR_RDMA_SOURCE, 8),
                   t_end(1)};
  rdma[0].u.put.xport.data_plane = HR_PLANE_RDMA;
  EXPECT_OK(cfg, rdma);
}

/* ------------------------------------------------------------------------ */
/* Allocation failures                                                       */
/* ------------------------------------------------------------------------ */

typedef struct fail_mem {
  int left; /* allocations that succeed before the failures start */
} fail_mem;

static void *fm_malloc(size_t n, void *ud) {
  fail_mem *f = ud;
  return f->left-- > 0 ? malloc(n) : NULL;
}
static void fm_free(void *p, void *ud) {
  (void)ud;
  free(p);
}
static void *fm_calloc(size_t a, size_t b, void *ud) {
  fail_mem *f = ud;
  return f->left-- > 0 ? calloc(a, b) : NULL;
}
static void *fm_realloc(void *p, size_t n, void *ud) {
  fail_mem *f = ud;
  return f->left-- > 0 ? realloc(p, n) : NULL;
}

/* Runs a sharded transfer with allocation number `k` failing: it must
 * fail cleanly with HR_ERR_NOMEM or succeed (LeakSanitizer checks the
 * rest). */
static void nomem(void **state) {
  (void)state;
  hr_rx_config cfg = t_cfg(1, HR_REQ_PARALLEL_OK, 4);
  hr_msg seq[] = {rows_shard(1, 0, 2, 0, 5), rows_shard(2, 1, 2, 5, 3),
                  t_data(1, 0, 0, 60),       t_end(1),
                  t_data(2, 0, 0, 36),       t_end(2)};
  int saw_nomem = 0, saw_ok = 0;
  for (int k = 0; k < 40; k++) {
    fail_mem f = {k};
    hr_mem mem = {&f, fm_malloc, fm_free, fm_calloc, fm_realloc};
    hr_rx *rx = NULL;
    int rv = hr_rx_new(&rx, &cfg, &mem);
    if (rv != 0) {
      assert_int_equal(rv, HR_ERR_NOMEM);
      assert_null(rx);
      saw_nomem = 1;
      continue;
    }
    hr_rx_event ev;
    hr_wire_status st;
    int i;
    for (i = 0; i < N_OF(seq); i++) {
      rv = hr_rx_on_message(rx, &seq[i], &ev, &st);
      if (rv != 0)
        break;
    }
    if (i < N_OF(seq)) {
      assert_int_equal(rv, HR_ERR_NOMEM);
      assert_int_equal(hr_rx_on_message(rx, &seq[0], &ev, &st), HR_ERR_STATE);
      saw_nomem = 1;
    } else {
      assert_int_equal(hr_rx_finish(rx, &st), 0);
      saw_ok = 1;
    }
    hr_rx_del(rx);
  }
  assert_true(saw_nomem);
  assert_true(saw_ok);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(frames_valid),
      cmocka_unit_test(frames_events),
      cmocka_unit_test(frames_rejections),
      cmocka_unit_test(frames_offsets),
      cmocka_unit_test(ordering_other_messages),
      cmocka_unit_test(new_arguments),
      cmocka_unit_test(planes),
      cmocka_unit_test(error_ends_stream),
      cmocka_unit_test(composite_valid),
      cmocka_unit_test(composite_depth),
      cmocka_unit_test(composite_events),
      cmocka_unit_test(composite_head_rejections),
      cmocka_unit_test(composite_member_rejections),
      cmocka_unit_test(composite_torn),
      cmocka_unit_test(shards_valid),
      cmocka_unit_test(shards_rejections),
      cmocka_unit_test(shards_composite),
      cmocka_unit_test(put_sequences),
      cmocka_unit_test(nomem),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
