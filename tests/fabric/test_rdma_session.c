/*
 * The RDMA data plane through the sans-IO session, against the fake
 * fabric: a client and a server session exchange bytes in memory while
 * both fake endpoints progress, so that every transfer runs the real
 * session code (hr_rdma_glue.c) and the real handshake.  Faults are
 * injected at every step; each test checks the outcome the session
 * reports (bytes, error, data plane and the record's fallback reason).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/fabric.h>
#include <hurray/gpu.h>
#include <hurray/session.h>
#include <hurray/tensor.h>

#include "common/test_util.h"
#include "fabric/hr_fab_fake.h"
#include "rdma_pair.h"

#define SIZE ((uint64_t)1 << 20)

typedef struct world {
  hr__fake_world *fw;
  hr__fake_ep *ec, *es;
  uint8_t ext_c[RP_EXT_CAP], ext_s[RP_EXT_CAP];
  hr_session *c, *s;
  hr_tstamp now;
  tu_pipe c2s, s2c;
  int drop_ready; /* RDMA_READY from the client vanishes */
  rp_store st;    /* what the server serves, and the last PUT stored */
  hr_transfer_record srv_rec;
  int srv_recs;
  rp_result r; /* the client's completion */
} world;

static int same(hr_tensor *a, hr_tensor *b) {
  if (!a || !b)
    return 0;
  uint64_t n = hr_tensor_descriptor(a)->buffers[0].size_bytes;
  if (hr_tensor_descriptor(b)->buffers[0].size_bytes != n)
    return 0;
  return memcmp(hr_tensor_buffer(a, 0), hr_tensor_buffer(b, 0), n) == 0;
}

/* ---- the server's records ---------------------------------------------- */

static void srv_transfer(hr_session *s, const hr_transfer_record *r, void *ud) {
  world *w = hr_session_user_data(s);
  (void)ud;
  w->srv_rec = *r;
  w->srv_recs++;
}

/* ---- setup --------------------------------------------------------------- */

static void pump(world *w);

/* The client's device staging piece for the next world (0: default). */
static uint64_t next_device_piece;

/* The server's rdma_stage_budget for the next world (UINT64_MAX: the
 * default). */
static uint64_t next_stage_budget = UINT64_MAX;

static world *world_open_x(uint32_t caps, int dest, int peer_refuse) {
  world *w = calloc(1, sizeof *w);
  assert_non_null(w);
  rp_fabric_open(&w->fw, &w->ec, &w->es);
  hr_settings sc, ss;
  rp_settings(&sc, w->ec, w->ext_c, caps, dest);
  rp_settings(&ss, w->es, w->ext_s, caps, dest);
  sc.device_piece = next_device_piece;
  sc.device_pieces = 2;
  if (next_stage_budget != UINT64_MAX)
    ss.rdma_stage_budget = next_stage_budget;
  hr_provider prov;
  rp_provider(&prov, &w->st);
  hr_session_callbacks cbs;
  memset(&cbs, 0, sizeof cbs);
  cbs.size = sizeof cbs;
  cbs.on_transfer = srv_transfer;
  w->now = 1000;
  assert_int_equal(
      hr_session_new(&w->c, HR_ROLE_CLIENT, &sc, NULL, NULL, w, w->now, NULL),
      0);
  assert_int_equal(
      hr_session_new(&w->s, HR_ROLE_SERVER, &ss, &cbs, &prov, w, w->now, NULL),
      0);
  w->st.served = rp_make_tensor(SIZE, 7);
  hr__fake_faults_of(w->es)->peer_add = peer_refuse;
  pump(w);
  assert_non_null(hr_session_peer_hello(w->c));
  return w;
}

static world *world_open(uint32_t caps, int dest) {
  return world_open_x(caps, dest, 0);
}

static world *world_open_b(uint32_t caps, int dest, uint64_t budget) {
  next_stage_budget = budget;
  world *w = world_open_x(caps, dest, 0);
  next_stage_budget = UINT64_MAX;
  return w;
}

static void world_close(world *w) {
  hr_session_del(w->c);
  hr_session_del(w->s);
  /* What the fabric still runs ends now (the buffers' release). */
  rp_fabric_close(w->fw, w->ec, w->es);
  rp_store_free(&w->st);
  hr_tensor_unref(w->r.got);
  tu_pipe_free(&w->c2s);
  tu_pipe_free(&w->s2c);
  free(w);
}

static void pump(world *w) {
  for (int idle = 0, i = 0; idle < 3 && i < 100000; i++) {
    w->now += 1000;
    int a = tu_pipe_move(&w->c2s, w->c, w->s, w->now,
                         w->drop_ready ? HR_MSG_RDMA_READY : -1);
    int b = tu_pipe_move(&w->s2c, w->s, w->c, w->now, -1);
    int c = hr__fake_progress(w->ec) > 0;
    int d = hr__fake_progress(w->es) > 0;
    idle = a || b || c || d ? 0 : idle + 1;
  }
}

static void get(world *w, uint32_t *sid) {
  rp_get_start(w->c, &w->r, "t", NULL, 0, sid);
  pump(w);
}

static void put(world *w, hr_tensor *t) {
  w->r.done = 0;
  assert_int_equal(hr_session_put(w->c, (const uint8_t *)"p", 1, 0, t,
                                  rp_on_put, &w->r, NULL),
                   0);
  pump(w);
}

/* ---- tests --------------------------------------------------------------- */

/* A GET into device memory over the data plane: the transfer lands in
 * host memory (tagged sends, or a host destination registration) and goes
 * to the device through the staging ring, in pieces smaller than the
 * tensor; the record names the fallback. */
static void device_get(uint32_t caps, int dest, uint8_t sync, int hmem) {
  hr_gpu_config cfg;
  hr_gpu *g;
  hr_gpu_config_default(&cfg);
  cfg.backend = "sim";
  assert_int_equal(hr_gpu_open(&g, &cfg, NULL, NULL), 0);
  next_device_piece = 64 << 10;
  world *w = world_open(caps, dest);
  next_device_piece = 0;
  if (hmem)
    hr__fake_set_hmem(w->ec, HR_GPU_DEV_SIM);
  int direct = hmem && (caps & HR_CAP_RDMA_GPUDIRECT);
  rp_get_start(w->c, &w->r, "t", g, sync, NULL);
  pump(w);
  assert_true(w->r.done);
  assert_int_equal(w->r.status, 0);
  assert_non_null(w->r.got);
  assert_true(hr_tensor_on_device(w->r.got));
  assert_int_equal(hr_tensor_descriptor(w->r.got)->buffers[0].sync_mode, sync);
  assert_true(
      tu_device_equals(g, w->r.got, hr_tensor_buffer(w->st.served, 0), SIZE));
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
  hr__fake_stats st;
  if (direct) {
    /* GPUDirect: no fallback; the destination registered as the device's
     * memory (a probe, then the destination itself). */
    assert_string_equal(w->r.rec.fallback, "");
    hr__fake_get_stats(w->ec, &st);
    assert_int_equal(st.last_reg_device_tag, HR_GPU_DEV_SIM);
    assert_int_equal(st.regs, dest ? 2 : 1);
  } else {
    assert_non_null(strstr(w->r.rec.fallback, "RDMA into host memory, copied "
                                              "to the device: "));
    assert_non_null(strstr(w->r.rec.fallback,
                           caps & HR_CAP_RDMA_GPUDIRECT
                               ? "device memory (tag 0xf0) needs FI_HMEM"
                               : "RDMA_GPUDIRECT is not in both HELLOs"));
  }
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
  hr__fake_get_stats(w->es, &st);
  if (dest)
    assert_true(st.writes > 0);
  else
    assert_true(st.sends > 0);
  hr_tensor_unref(w->r.got);
  w->r.got = NULL;
  world_close(w);
  assert_int_equal(hr_gpu_del(g), 0);
}

#define GD (HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT)

/* Serving a device tensor with GPUDirect negotiated and a fabric that
 * reaches the device: the data plane reads it from the device (the
 * GPUDirect source; test_rdma_devsrc.c has its cases). */
static void test_device_served(void **state) {
  (void)state;
  hr_gpu_config cfg;
  hr_gpu *g;
  hr_gpu_config_default(&cfg);
  cfg.backend = "sim";
  assert_int_equal(hr_gpu_open(&g, &cfg, NULL, NULL), 0);
  hr_gpu_caps caps;
  assert_int_equal(hr_gpu_query(g, &caps), 0);
  world *w = world_open(GD, 1);
  hr__fake_set_hmem(w->es, HR_GPU_DEV_SIM);
  hr_descriptor d = *hr_tensor_descriptor(w->st.served);
  d.buffers[0].device_tag = caps.device_tag;
  hr_gpu_buf *b;
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, SIZE, &b), 0);
  hr_gpu_stream *gs;
  hr_gpu_buf *h;
  assert_int_equal(hr_gpu_stream_new(g, &gs), 0);
  assert_int_equal(
      hr_gpu_buf_wrap_host(g, hr_tensor_buffer(w->st.served, 0), SIZE, &h), 0);
  assert_int_equal(hr_gpu_copy_async(gs, b, 0, h, 0, SIZE), 0);
  assert_int_equal(hr_gpu_stream_sync(gs), 0);
  hr_gpu_buf_del(h);
  hr_gpu_stream_del(gs);
  hr_tensor *dt;
  assert_int_equal(hr_tensor_wrap_device(&dt, &d, &b, NULL, NULL, NULL, NULL),
                   0);
  hr_tensor *host = w->st.served;
  w->st.served = dt;
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_true(same(w->r.got, host));
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
  assert_string_equal(w->srv_rec.fallback, "");
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.last_reg_device_tag, HR_GPU_DEV_SIM);
  world_close(w);
  hr_tensor_unref(host);
  hr_gpu_buf_del(b);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* No GPUDirect in the HELLOs (the fabric could reach the device). */
static void test_device_get_p1(void **state) {
  (void)state;
  device_get(HR_CAP_RDMA_DATA_PLANE, 0, HR_SYNC_PRODUCER_SYNCED, 1);
}

static void test_device_get_p2(void **state) {
  (void)state;
  device_get(HR_CAP_RDMA_DATA_PLANE, 0, HR_SYNC_EVENT, 0);
}

/* GPUDirect negotiated, but this fabric cannot register the device's
 * memory: a host destination registration, then the ring. */
static void test_device_get_host_destination(void **state) {
  (void)state;
  device_get(GD, 1, HR_SYNC_PRODUCER_SYNCED, 0);
}

/* GPUDirect: RMA writes into the device buffers, P1 and P2. */
static void test_device_get_gpudirect_p1(void **state) {
  (void)state;
  device_get(GD, 1, HR_SYNC_PRODUCER_SYNCED, 1);
}

static void test_device_get_gpudirect_p2(void **state) {
  (void)state;
  device_get(GD, 1, HR_SYNC_EVENT, 1);
}

/* GPUDirect without destination registration: tagged receives posted
 * into the device buffers. */
static void test_device_get_gpudirect_tagged(void **state) {
  (void)state;
  device_get(GD, 0, HR_SYNC_EVENT, 1);
}

static void test_get_tagged(void **state) {
  (void)state;
  world *w = world_open(HR_CAP_RDMA_DATA_PLANE, 0);
  get(w, NULL);
  assert_true(w->r.done);
  assert_int_equal(w->r.status, 0);
  assert_true(same(w->r.got, w->st.served));
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
  assert_string_equal(w->r.rec.fallback, "");
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
  assert_int_equal(w->srv_rec.status, 0);
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_true(st.sends > 0);
  assert_int_equal(st.writes, 0);
  world_close(w);
}

static void test_get_destination(void **state) {
  (void)state;
  world *w = world_open(HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT, 1);
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_true(same(w->r.got, w->st.served));
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_true(st.writes > 0);
  world_close(w);
}

/* Tensors moved over the data plane report their buffers when freed: the
 * served tensor (replaced in the provider and dropped) on the server's
 * fabric, the received one (dropped by the application) on the client's,
 * once each, and only when freed: a tensor served twice is watched once. */
static void test_freed_tensors_invalidate(void **state) {
  (void)state;
  world *w = world_open(HR_CAP_RDMA_DATA_PLANE, 0);
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  hr_tensor_unref(w->r.got);
  w->r.got = NULL;
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  hr__fake_stats st;
  hr__fake_progress(w->es);
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.invalidations, 0); /* still served */
  /* The first received tensor is gone: its landing buffer was reported. */
  hr__fake_progress(w->ec);
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.invalidations, 1);
  const void *landing = hr_tensor_buffer(w->r.got, 0);
  hr_tensor_unref(w->r.got);
  w->r.got = NULL;
  hr__fake_progress(w->ec);
  hr__fake_get_stats(w->ec, &st);
  assert_int_equal(st.invalidations, 2);
  assert_ptr_equal(st.last_invalidated, landing);
  assert_int_equal(st.last_invalidated_len, SIZE);
  /* The provider lets the served tensor go: freed, reported. */
  const void *src = hr_tensor_buffer(w->st.served, 0);
  hr_tensor_unref(w->st.served);
  w->st.served = rp_make_tensor(SIZE, 9);
  hr__fake_progress(w->es);
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.invalidations, 1);
  assert_ptr_equal(st.last_invalidated, src);
  assert_int_equal(st.last_invalidated_len, SIZE);
  /* A tensor outliving its fabric reports into nothing, harmlessly. */
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  hr_tensor *keep = hr_tensor_ref(w->r.got);
  world_close(w);
  hr_tensor_unref(keep);
}

static void test_put(void **state) {
  (void)state;
  for (int dest = 0; dest < 2; dest++) {
    world *w = world_open(
        HR_CAP_RDMA_DATA_PLANE | (dest ? HR_CAP_RDMA_GPUDIRECT : 0), dest);
    hr_tensor *t = rp_make_tensor(SIZE, 3);
    put(w, t);
    assert_true(w->r.done);
    assert_int_equal(w->r.status, 0);
    assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
    assert_true(same(w->st.committed, t));
    assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
    hr__fake_stats st;
    hr__fake_get_stats(w->ec, &st);
    assert_true(dest ? st.writes > 0 : st.sends > 0);
    hr_tensor_unref(t);
    world_close(w);
  }
}

/* The source registration is refused: the server sends frames at once and
 * says why in its record. */
static void test_source_refused(void **state) {
  (void)state;
  world *w = world_open(HR_CAP_RDMA_DATA_PLANE, 0);
  hr__fake_faults_of(w->es)->reg_source = 1;
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_true(same(w->r.got, w->st.served));
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_FRAMES);
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_FRAMES);
  assert_true(w->srv_rec.fallback[0] != 0);
  world_close(w);
}

/* Faults after the descriptor went: the stream fails with ERROR, the
 * client retries once on the same connection, which now uses frames, and
 * the record of the retry says why. */
static void retry_case(hr__fake_ep *(*which)(world *), int field, uint32_t caps,
                       int dest, const char *want) {
  world *w = world_open(caps, dest);
  hr__fake_faults *f = hr__fake_faults_of(which(w));
  switch (field) {
  case 0: f->recv_start = 1; break;
  case 1: f->send_error = 1; break;
  case 2: f->recv_error = 1; break;
  case 3: f->peer_gone_after = 4096; break;
  case 4: f->write_error = 1; break;
  default: fail();
  }
  uint32_t sid = 0;
  get(w, &sid);
  assert_true(w->r.done);
  assert_int_equal(w->r.status, 0);
  assert_true(same(w->r.got, w->st.served));
  assert_true(w->r.sid != sid); /* completed as the retry */
  if (!strstr(w->r.rec.fallback, want))
    fail_msg("fallback \"%s\" lacks \"%s\"", w->r.rec.fallback, want);
  /* A second GET on the connection: frames, or tagged after a failed
   * destination write. */
  hr_tensor_unref(w->r.got);
  w->r.got = NULL;
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_true(same(w->r.got, w->st.served));
  world_close(w);
}

static hr__fake_ep *cli_ep(world *w) {
  return w->ec;
}
static hr__fake_ep *srv_ep(world *w) {
  return w->es;
}

static void test_receiver_refuses(void **state) {
  (void)state;
  retry_case(cli_ep, 0, HR_CAP_RDMA_DATA_PLANE, 0, "frames");
}
static void test_send_error(void **state) {
  (void)state;
  retry_case(srv_ep, 1, HR_CAP_RDMA_DATA_PLANE, 0, "frames");
}
static void test_recv_error(void **state) {
  (void)state;
  retry_case(cli_ep, 2, HR_CAP_RDMA_DATA_PLANE, 0,
             "receiving the tagged messages failed");
}
static void test_peer_gone(void **state) {
  (void)state;
  retry_case(srv_ep, 3, HR_CAP_RDMA_DATA_PLANE, 0, "transfer failed");
}
static void test_write_error(void **state) {
  (void)state;
  retry_case(srv_ep, 4, HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT, 1,
             "GPUDIRECT_UNAVAILABLE");
}

/* RDMA_READY never arrives: the server waits; the client's CANCEL ends the
 * handshake with CANCELLED on both sides and no registration is left. */
static void test_ready_never_sent(void **state) {
  (void)state;
  world *w = world_open(HR_CAP_RDMA_DATA_PLANE, 0);
  w->drop_ready = 1;
  uint32_t sid = 0;
  get(w, &sid);
  assert_false(w->r.done);
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.live_regs, 1); /* the SOURCE, waiting */
  assert_int_equal(hr_session_cancel(w->c, sid), 0);
  pump(w);
  assert_true(w->r.done);
  assert_int_equal(w->r.status, HR_ERR_REMOTE);
  assert_int_equal(w->r.rec.wire_error, HR_WIRE_CANCELLED);
  assert_null(w->r.got);
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.live_regs, 0);
  assert_int_equal(w->srv_rec.wire_error, HR_WIRE_CANCELLED);
  world_close(w);
}

/* A PUT the server cannot receive over RDMA is retried as frames. */
static void test_put_refused(void **state) {
  (void)state;
  world *w = world_open(HR_CAP_RDMA_DATA_PLANE, 0);
  hr__fake_faults_of(w->es)->recv_start = 1;
  hr_tensor *t = rp_make_tensor(SIZE, 5);
  put(w, t);
  assert_true(w->r.done);
  assert_int_equal(w->r.status, 0);
  assert_true(same(w->st.committed, t));
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_FRAMES);
  assert_non_null(strstr(w->r.rec.fallback, "RDMA_SETUP_FAILED"));
  hr_tensor_unref(t);
  world_close(w);
}

/* The server refuses the client's FABRIC_ADDRESS: its answers go as
 * frames, with the reason in its record. */
static void test_peer_refused(void **state) {
  (void)state;
  world *w = world_open_x(HR_CAP_RDMA_DATA_PLANE, 0, 1);
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_true(same(w->r.got, w->st.served));
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_FRAMES);
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_FRAMES);
  assert_true(w->srv_rec.fallback[0] != 0);
  world_close(w);
}

/* The connection goes away in the middle: every handshake ends without
 * messages and the fabric lets go of every registration. */
static void test_terminate(void **state) {
  (void)state;
  world *w = world_open(HR_CAP_RDMA_DATA_PLANE, 0);
  w->drop_ready = 1;
  get(w, NULL);
  assert_false(w->r.done);
  hr_session_terminate(w->c, w->now);
  hr_session_terminate(w->s, w->now);
  assert_true(w->r.done);
  assert_int_equal(w->r.status, HR_ERR_CLOSED);
  world_close(w);
}

/* A small tensor goes as frames by design, without a fallback reason. */
static void test_small(void **state) {
  (void)state;
  world *w = world_open(HR_CAP_RDMA_DATA_PLANE, 0);
  hr_tensor_unref(w->st.served);
  w->st.served = rp_make_tensor(1000, 9);
  get(w, NULL);
  assert_int_equal(w->r.status, 0);
  assert_true(same(w->r.got, w->st.served));
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_FRAMES);
  assert_string_equal(w->r.rec.fallback, "");
  world_close(w);
}

/* ---- transcoded output (decision 76) ------------------------------------- */

/* A 2-D float32 tensor of `layout` (dense or COO with `nnz`), contents
 * from the seed. */
static hr_tensor *matrix(uint8_t layout, uint64_t n, uint64_t nnz) {
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_FLOAT32;
  d.rank = 2;
  d.shape[0] = n;
  d.shape[1] = n;
  d.layout.tag = layout;
  d.params.nnz = nnz;
  d.params.index_type = HR_ELEM_INT64;
  uint64_t sizes[HR_MAX_BUFFERS];
  hr_wire_status st;
  int nb = hr_descriptor_buffer_sizes(&d, sizes, &st);
  assert_true(nb > 0);
  d.buffer_count = (uint8_t)nb;
  for (int k = 0; k < nb; k++)
    d.buffers[k].size_bytes = sizes[k];
  hr_tensor *t = NULL;
  assert_int_equal(hr_tensor_alloc(&t, &d, 6, NULL), 0);
  for (int k = 0; k < nb; k++) {
    uint8_t *p = hr_tensor_buffer(t, (unsigned)k);
    for (uint64_t i = 0; i < sizes[k]; i++)
      p[i] = (uint8_t)((i * 2654435761u) >> 11);
  }
  return t;
}

static void get_as(world *w, uint8_t layout, uint32_t *sid) {
  hr_layout_entry l = {layout, 0, NULL};
  hr_get_opts o;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)"t";
  o.key_len = 1;
  o.preferred_device = HR_DEV_CPU;
  o.layouts = &l;
  o.layout_count = 1;
  o.flags = HR_REQ_ALLOW_TRANSCODE;
  w->r.done = 0;
  assert_int_equal(hr_session_get(w->c, &o, rp_on_get, &w->r, sid), 0);
  pump(w);
}

/* A ROW_MAJOR matrix asked as COLUMN_MAJOR: the server transcodes it into
 * one host region, then sends it over RDMA from there; the bytes are the
 * transpose. */
static void test_transcoded(void **state) {
  (void)state;
  world *w = world_open(HR_CAP_RDMA_DATA_PLANE, 0);
  hr_tensor_unref(w->st.served);
  const uint64_t n = 512; /* 1 MiB of float32 */
  w->st.served = matrix(HR_LAYOUT_ROW_MAJOR, n, 0);
  get_as(w, HR_LAYOUT_COLUMN_MAJOR, NULL);
  if (w->r.status == HR_ERR_REMOTE &&
      w->r.rec.wire_error == HR_WIRE_TRANSCODE_FAILED) {
    world_close(w);
    skip(); /* a build without transcoding kernels */
  }
  assert_int_equal(w->r.status, 0);
  assert_int_equal(hr_tensor_descriptor(w->r.got)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  const float *a = hr_tensor_buffer(w->st.served, 0);
  const float *b = hr_tensor_buffer(w->r.got, 0);
  for (uint64_t i = 0; i < n; i++)
    for (uint64_t j = 0; j < n; j++)
      if (memcmp(&a[i * n + j], &b[j * n + i], 4) != 0)
        fail_msg("element (%llu, %llu) differs", (unsigned long long)i,
                 (unsigned long long)j);
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
  assert_int_equal(w->r.rec.data_plane, HR_PLANE_RDMA);
  assert_null(strstr(w->srv_rec.fallback, "goes as frames"));
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.regs, 1);
  assert_int_equal(st.bytes, n * n * 4);
  /* With no staging budget, frames as before, and the record says so. */
  world_close(w);
  w = world_open_b(HR_CAP_RDMA_DATA_PLANE, 0, 0);
  hr_tensor_unref(w->st.served);
  w->st.served = matrix(HR_LAYOUT_ROW_MAJOR, n, 0);
  get_as(w, HR_LAYOUT_COLUMN_MAJOR, NULL);
  assert_int_equal(w->r.status, 0);
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_FRAMES);
  if (!strstr(w->srv_rec.fallback, "transcoded output goes as frames: RDMA "
                                   "staging is off"))
    fail_msg("fallback: %s", w->srv_rec.fallback);
  world_close(w);
}

/* A COO matrix whose coordinate repeats cannot be densified: the
 * transcode into the region fails, that GET ends with TRANSCODE_FAILED,
 * nothing was registered, and the next GET goes. */
static void test_transcode_fails(void **state) {
  (void)state;
  world *w = world_open(HR_CAP_RDMA_DATA_PLANE, 0);
  hr_tensor_unref(w->st.served);
  const uint64_t n = 256; /* 256 KiB dense */
  w->st.served = matrix(HR_LAYOUT_SPARSE_COO, n, 2);
  int64_t *idx = hr_tensor_buffer(w->st.served, 0);
  idx[0] = 1;
  idx[1] = 2;
  idx[2] = 1;
  idx[3] = 2;
  get_as(w, HR_LAYOUT_ROW_MAJOR, NULL);
  assert_true(w->r.done);
  assert_int_equal(w->r.status, HR_ERR_REMOTE);
  assert_int_equal(w->r.rec.wire_error, HR_WIRE_TRANSCODE_FAILED);
  hr__fake_stats st;
  hr__fake_get_stats(w->es, &st);
  assert_int_equal(st.regs, 0);
  idx[2] = 3;
  get_as(w, HR_LAYOUT_ROW_MAJOR, NULL);
  assert_int_equal(w->r.status, 0);
  assert_int_equal(w->srv_rec.data_plane, HR_PLANE_RDMA);
  world_close(w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_tagged),
      cmocka_unit_test(test_get_destination),
      cmocka_unit_test(test_put),
      cmocka_unit_test(test_source_refused),
      cmocka_unit_test(test_receiver_refuses),
      cmocka_unit_test(test_send_error),
      cmocka_unit_test(test_recv_error),
      cmocka_unit_test(test_peer_gone),
      cmocka_unit_test(test_write_error),
      cmocka_unit_test(test_ready_never_sent),
      cmocka_unit_test(test_put_refused),
      cmocka_unit_test(test_peer_refused),
      cmocka_unit_test(test_terminate),
      cmocka_unit_test(test_small),
      cmocka_unit_test(test_freed_tensors_invalidate),
      cmocka_unit_test(test_device_get_p1),
      cmocka_unit_test(test_device_get_p2),
      cmocka_unit_test(test_device_get_host_destination),
      cmocka_unit_test(test_device_get_gpudirect_p1),
      cmocka_unit_test(test_device_get_gpudirect_p2),
      cmocka_unit_test(test_device_get_gpudirect_tagged),
      cmocka_unit_test(test_device_served),
      cmocka_unit_test(test_transcoded),
      cmocka_unit_test(test_transcode_fails),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
