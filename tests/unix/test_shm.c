/*
 * The SHM data plane over a Unix socket, through the engine: GETs of
 * segment-backed tensors (every dense layout, multi-buffer sparse,
 * composites, PARALLEL_OK) arrive mapped; regions, transcodes and plain
 * heap tensors go as frames with a reason; a client or engine without SHM
 * gets frames; segments stay with the server until BUFFER_RELEASE or the
 * connection's end; a segment the client refuses (too small, unsealed)
 * fails that GET and turns SHM off for the connection; no descriptor
 * leaks.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/shm.h>

#include "sock_dir.h"
#include "tc.h"
#include "tl.h"

static int setup(void **state) {
  return sock_dir_setup(state, "hr_shm");
}

static int teardown(void **state) {
  return sock_dir_teardown(state);
}

static int fd_count(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent *e;
  if (!d)
    return -1;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

/* A segment-backed copy of `t` (composites member by member). */
static hr_tensor *shm_of(hr_tensor *t) {
  hr_tensor *out = NULL;
  size_t n = hr_tensor_member_count(t);
  if (n == 0) {
    assert_int_equal(hr_shm_tensor_copy(&out, t, NULL), 0);
    return out;
  }
  hr_tensor *m[8];
  assert_true(n <= 8);
  for (size_t i = 0; i < n; i++)
    m[i] = shm_of(hr_tensor_member(t, i));
  assert_int_equal(hr_tensor_new_composite(&out, hr_tensor_descriptor(t), m, n,
                                           NULL, NULL),
                   0);
  for (size_t i = 0; i < n; i++)
    hr_tensor_unref(m[i]);
  return out;
}

/* Byte-identical (plain tensors, or composites member by member). */
static int same_bytes(hr_tensor *a, hr_tensor *b) {
  size_t n = hr_tensor_member_count(a);
  if (n != hr_tensor_member_count(b))
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!same_bytes(hr_tensor_member(a, i), hr_tensor_member(b, i)))
      return 0;
  const hr_descriptor *da = hr_tensor_descriptor(a),
                      *db = hr_tensor_descriptor(b);
  if (da->buffer_count != db->buffer_count)
    return 0;
  for (unsigned k = 0; k < da->buffer_count; k++)
    if (da->buffers[k].size_bytes != db->buffers[k].size_bytes ||
        memcmp(hr_tensor_buffer(a, k), hr_tensor_buffer(b, k),
               (size_t)da->buffers[k].size_bytes))
      return 0;
  return 1;
}

/* A tensor in a memfd of our own making, with a release we can watch. */
typedef struct own_seg {
  atomic_int released;
  int fd;
  void *addr;
  size_t len;
} own_seg;

static void own_release(void *ctx) {
  own_seg *g = ctx;
  munmap(g->addr, g->len);
  close(g->fd);
  atomic_store(&g->released, 1);
}

/* 4096 float32s; the memfd holds `file_len` bytes (smaller than the
 * tensor to play a broken server), sealed or not. */
static hr_tensor *own_tensor(own_seg *g, size_t file_len, int seal) {
  hr_descriptor d;
  uint64_t n = 4096;
  hr_tensor *t;
  void *buf;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_FLOAT32;
  d.rank = 1;
  d.shape[0] = n;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  d.buffers[0].size_bytes = n * 4;
  d.buffers[0].alignment_log2 = 6;
  atomic_init(&g->released, 0);
  g->fd = memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  assert_true(g->fd >= 0);
  g->len = n * 4;
  assert_int_equal(ftruncate(g->fd, (off_t)g->len), 0);
  g->addr = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
  assert_true(g->addr != MAP_FAILED);
  for (uint64_t i = 0; i < n; i++)
    ((float *)g->addr)[i] = (float)i;
  if (file_len < g->len)
    assert_int_equal(ftruncate(g->fd, (off_t)file_len), 0);
  if (seal)
    assert_int_equal(fcntl(g->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  /* A short file leaves the tail of our mapping without pages: serve a
   * heap copy of the bytes, described by the (short) segment. */
  buf = g->addr;
  if (file_len < g->len) {
    static float heap[4096];
    for (uint64_t i = 0; i < n; i++)
      heap[i] = (float)i;
    buf = heap;
  }
  assert_int_equal(hr_tensor_wrap(&t, &d, &buf, own_release, g, NULL), 0);
  assert_int_equal(hr_tensor_set_segment(t, g->fd, 0), 0);
  return t;
}

static int flag_set(void *ud) { return atomic_load((atomic_int *)ud) != 0; }

static void test_shm_flows(void **state) {
  fixture *f = *state;
  int fds0 = fd_count();
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_provider prov;
  hr_engine *ce = tl_engine(env, NULL);
  tc_conn c, tcp;
  tc_res r;
  hr_get_opts o;
  uint64_t sh2[2] = {6, 5}, sh3[3] = {3, 4, 5}, off[2] = {1, 2},
           box[2] = {3, 2};
  uint32_t tiles[2] = {2, 2};
  hr_layout_entry col = {HR_LAYOUT_COLUMN_MAJOR, 0, NULL};
  uint32_t rows[3] = {0, 2, 5}, cols[3] = {1, 0, 4};
  float vals[3] = {1.5f, -2.0f, 3.25f};
  struct {
    const char *key;
    hr_tensor *ref;
  } cases[6];
  hr_tensor *heap = tl_dense(HR_ELEM_INT32, 2, sh2, 3);
  size_t i, ncases = 0;

  cases[ncases].key = "row";
  cases[ncases++].ref = tl_dense(HR_ELEM_FLOAT32, 2, sh2, 7);
  cases[ncases].key = "col";
  cases[ncases++].ref =
      tl_tensor(HR_ELEM_FLOAT64, HR_LAYOUT_COLUMN_MAJOR, 3, sh3, NULL, 8);
  cases[ncases].key = "tiled";
  cases[ncases++].ref =
      tl_tensor(HR_ELEM_UINT8, HR_LAYOUT_TILED, 2, sh2, tiles, 9);
  cases[ncases].key = "csr";
  cases[ncases++].ref =
      tl_sparse(HR_LAYOUT_SPARSE_CSR, 6, 5, 3, rows, cols, vals, 1);
  {
    hr_tensor *m[2] = {cases[0].ref, cases[1].ref};
    hr_descriptor head;
    memset(&head, 0, sizeof head);
    head.descriptor_version = 1;
    head.element_type = HR_ELEM_NONE;
    head.layout.tag = HR_LAYOUT_COMPOSITE;
    head.params.member_count = 2;
    head.params.rule = HR_COMPOSITE_TUPLE;
    cases[ncases].key = "tuple";
    assert_int_equal(hr_tensor_new_composite(&cases[ncases].ref, &head, m, 2,
                                             NULL, NULL),
                     0);
    ncases++;
  }

  tl_server_start(env, &ts, NULL, NULL);
  for (i = 0; i < ncases; i++) {
    hr_tensor *s = shm_of(cases[i].ref);
    tl_put(&ts, cases[i].key, s);
    hr_tensor_unref(s);
  }
  tl_put(&ts, "heap", heap);
  hr_store_provider(ts.store, &prov);
  assert_int_equal(hr_engine_listen(ts.e, f->url, &prov, NULL), 0);
  tc_open(env, ce, f->url, &c);
  assert_true(hr_conn_session(c.c) != NULL);

  /* Every layout arrives over SHM, byte for byte. */
  for (i = 0; i < ncases; i++) {
    assert_int_equal(tc_get_key(&c, cases[i].key, &r), 0);
    assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
    assert_true(same_bytes(cases[i].ref, r.t));
    tc_res_clear(&r);
  }
  /* PARALLEL_OK: one shard, handed over whole. */
  tc_opts(&o, "row");
  o.flags = HR_REQ_PARALLEL_OK;
  o.max_shards = 4;
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_int_equal(r.rec.shards, 1);
  assert_true(tl_same_elements(cases[0].ref, NULL, r.t));
  tc_res_clear(&r);
  /* A region and a transcode go as frames. */
  tc_opts(&o, "row");
  o.flags = HR_REQ_REGION;
  o.region_rank = 2;
  o.region_offset = off;
  o.region_shape = box;
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
  assert_true(tl_same_elements(cases[0].ref, off, r.t));
  tc_res_clear(&r);
  tc_opts(&o, "row");
  o.flags = HR_REQ_ALLOW_TRANSCODE;
  o.layouts = &col;
  o.layout_count = 1;
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
  assert_true(tl_same_elements(cases[0].ref, NULL, r.t));
  tc_res_clear(&r);
  /* A heap tensor has no segment: frames. */
  assert_int_equal(tc_get_key(&c, "heap", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
  assert_true(tl_same_elements(heap, NULL, r.t));
  tc_res_clear(&r);
  /* Into an application buffer: copied out of the segment. */
  {
    static _Alignas(4096) uint8_t buf[4096];
    hr_get_dest dest = {buf, sizeof buf, NULL, NULL};
    tc_opts(&o, "row");
    o.dest = &dest;
    assert_int_equal(tc_get(&c, &o, &r), 0);
    assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
    assert_true(same_bytes(cases[0].ref, r.t));
    assert_ptr_equal(hr_tensor_buffer(r.t, 0), buf);
    tc_res_clear(&r);
  }
  /* What is PUT (1 MiB or more) lands in a segment: served over SHM. */
  {
    uint64_t shp[2] = {512, 1024};
    hr_tensor *big = tl_dense(HR_ELEM_UINT16, 2, shp, 11);
    assert_int_equal(tc_put(&c, "put", 0, big, &r), 0);
    tc_res_clear(&r);
    assert_int_equal(tc_get_key(&c, "put", &r), 0);
    assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
    assert_true(same_bytes(big, r.t));
    tc_res_clear(&r);
    hr_tensor_unref(big);
  }
  tc_close(&c);

  /* A client that asks for frames, and TCP, get frames. */
  {
    hr_settings st;
    hr_settings_default(&st);
    st.capabilities &= ~(uint32_t)HR_CAP_SHM_DATA_PLANE;
    tc_connect(env, ce, f->url, &c, &st);
    assert_true(tc_wait_up(&c, TL_WAIT_MS));
    assert_int_equal(tc_get_key(&c, "tuple", &r), 0);
    assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
    assert_true(same_bytes(cases[4].ref, r.t));
    tc_res_clear(&r);
    tc_close(&c);
  }
  tc_open(env, ce, ts.url, &tcp);
  assert_int_equal(tc_get_key(&tcp, "row", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
  tc_res_clear(&r);
  tc_close(&tcp);

  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  for (i = 0; i < ncases; i++)
    hr_tensor_unref(cases[i].ref);
  hr_tensor_unref(heap);
  tl_free(env);
  assert_int_equal(fd_count(), fds0);
}

/* The server keeps a segment until BUFFER_RELEASE, or until the client's
 * connection ends; the client's mapping outlives the connection. */
static void test_shm_release(void **state) {
  fixture *f = *state;
  int fds0 = fd_count();
  tl_env *env = tl_new(TL_LIBEVENT);
  tl_server ts;
  hr_provider prov;
  hr_engine *ce = tl_engine(env, NULL);
  tc_conn c;
  tc_res r;
  own_seg g1, g2;
  hr_tensor *t;

  tl_server_start(env, &ts, NULL, NULL);
  hr_store_provider(ts.store, &prov);
  assert_int_equal(hr_engine_listen(ts.e, f->url, &prov, NULL), 0);
  tc_open(env, ce, f->url, &c);

  t = own_tensor(&g1, 4096 * 4, 1);
  tl_put(&ts, "a", t);
  hr_tensor_unref(t);
  assert_int_equal(tc_get_key(&c, "a", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  /* Gone from the store: only the lease holds it now. */
  assert_int_equal(hr_store_remove(ts.store, "a", 1), 0);
  tl_spin(env, 50);
  assert_false(atomic_load(&g1.released));
  assert_true(((const float *)hr_tensor_buffer(r.t, 0))[4095] == 4095.0f);
  /* The application lets go: BUFFER_RELEASE, the server frees it. */
  tc_res_clear(&r);
  assert_true(tl_run(env, flag_set, &g1.released, TL_WAIT_MS));

  /* A client that goes away without releasing. */
  t = own_tensor(&g2, 4096 * 4, 1);
  tl_put(&ts, "b", t);
  hr_tensor_unref(t);
  assert_int_equal(tc_get_key(&c, "b", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_int_equal(hr_store_remove(ts.store, "b", 1), 0);
  tc_close(&c);
  assert_true(tl_run(env, flag_set, &g2.released, TL_WAIT_MS));
  /* Our mapping stays readable after the server let go. */
  assert_true(((const float *)hr_tensor_buffer(r.t, 0))[17] == 17.0f);
  tc_res_clear(&r);

  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  tl_free(env);
  assert_int_equal(fd_count(), fds0);
}

static void *unref_main(void *arg) {
  hr_tensor_unref(arg);
  return NULL;
}

/* The application drops the mapped tensor on another thread while the
 * loop runs: the unmap wakes the engine, which sends BUFFER_RELEASE. */
static void test_shm_release_other_thread(void **state) {
  fixture *f = *state;
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_provider prov;
  hr_engine *ce = tl_engine(env, NULL);
  tc_conn c;
  tc_res r;
  own_seg g;
  pthread_t th;
  hr_tensor *t = own_tensor(&g, 4096 * 4, 1);

  tl_server_start(env, &ts, NULL, NULL);
  tl_put(&ts, "a", t);
  hr_tensor_unref(t);
  hr_store_provider(ts.store, &prov);
  assert_int_equal(hr_engine_listen(ts.e, f->url, &prov, NULL), 0);
  tc_open(env, ce, f->url, &c);
  assert_int_equal(tc_get_key(&c, "a", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_int_equal(hr_store_remove(ts.store, "a", 1), 0);
  assert_int_equal(pthread_create(&th, NULL, unref_main, r.t), 0);
  r.t = NULL;
  assert_true(tl_run(env, flag_set, &g.released, TL_WAIT_MS));
  pthread_join(th, NULL);
  tc_res_clear(&r);
  tc_close(&c);
  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  tl_free(env);
}

/* Segments the client must refuse: too small for the descriptor, and not
 * sealed against shrinking.  The GET fails with a fallback reason and the
 * server answers the next one with frames. */
static void test_shm_refused(void **state) {
  fixture *f = *state;
  int fds0 = fd_count();
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_provider prov;
  hr_engine *ce = tl_engine(env, NULL);
  tc_conn c;
  tc_res r;
  own_seg g;
  hr_tensor *t;
  int pass;

  tl_server_start(env, &ts, NULL, NULL);
  hr_store_provider(ts.store, &prov);
  assert_int_equal(hr_engine_listen(ts.e, f->url, &prov, NULL), 0);
  for (pass = 0; pass < 2; pass++) {
    /* pass 0: 4 KiB file for 16 KiB of tensor; pass 1: unsealed. */
    t = pass == 0 ? own_tensor(&g, 4096, 1) : own_tensor(&g, 4096 * 4, 0);
    tl_put(&ts, "x", t);
    hr_tensor_unref(t);
    tc_open(env, ce, f->url, &c);
    assert_int_not_equal(tc_get_key(&c, "x", &r), 0);
    assert_int_equal(r.rec.wire_error, HR_WIRE_DEVICE_UNAVAILABLE);
    assert_memory_equal(r.rec.fallback, "shm:", 4);
    assert_non_null(strstr(r.rec.fallback, pass == 0 ? "smaller" : "sealed"));
    tc_res_clear(&r);
    assert_int_equal(tc_get_key(&c, "x", &r), 0);
    assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
    assert_true(((const float *)hr_tensor_buffer(r.t, 0))[4095] == 4095.0f);
    tc_res_clear(&r);
    tc_close(&c);
    assert_int_equal(hr_store_remove(ts.store, "x", 1), 0);
    assert_true(tl_run(env, flag_set, &g.released, TL_WAIT_MS));
  }
  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  tl_free(env);
  assert_int_equal(fd_count(), fds0);
}

/* An engine configured without SHM neither offers nor accepts it. */
static void test_shm_engine_off(void **state) {
  fixture *f = *state;
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_provider prov;
  hr_engine_config cfg;
  hr_engine *ce;
  tc_conn c;
  tc_res r;
  uint64_t sh[1] = {1000};
  hr_tensor *t = tl_dense(HR_ELEM_FLOAT32, 1, sh, 5), *s;

  hr_engine_config_default(&cfg);
  cfg.no_shm = 1;
  ce = tl_engine(env, &cfg);
  tl_server_start(env, &ts, NULL, NULL);
  s = shm_of(t);
  tl_put(&ts, "t", s);
  hr_tensor_unref(s);
  hr_store_provider(ts.store, &prov);
  assert_int_equal(hr_engine_listen(ts.e, f->url, &prov, NULL), 0);
  tc_open(env, ce, f->url, &c);
  assert_int_equal(tc_get_key(&c, "t", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
  assert_true(tl_same_elements(t, NULL, r.t));
  tc_res_clear(&r);
  tc_close(&c);
  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  hr_tensor_unref(t);
  tl_free(env);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_shm_flows, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shm_release, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shm_release_other_thread, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_shm_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shm_engine_off, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
