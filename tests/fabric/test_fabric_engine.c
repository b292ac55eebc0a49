/*
 * The RDMA data plane end to end through the engine, over a real libfabric
 * provider on loopback (HR_TEST_PROVIDER: "tcp" is tcp;ofi_rxm, "shm"):
 * a server engine and a client engine, each with its own fabric, on one
 * epoll loop.  GET and PUT, with and without destination registration,
 * parallel shards, byte-exact; a client without a fabric gets frames; a
 * client on another provider gets frames with the reason in the server's
 * record.  Exits 77 only when libfabric has no such provider.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <cmocka.h>

#include <hurray/store.h>

#include <hurray/fabric.h>
#include <hurray/gpu.h>

#include "../engine_io/tc.h"
#include "../engine_io/tl.h"
#include "common/test_util.h"

static const char *provider(void) {
  return strcmp(HR_TEST_PROVIDER, "tcp") == 0 ? "tcp;ofi_rxm"
                                              : HR_TEST_PROVIDER;
}

typedef struct srv_log {
  int n;
  hr_transfer_record last;
} srv_log;

static void on_srv_transfer(hr_conn *c, const hr_transfer_record *rec,
                            void *ud) {
  srv_log *l = ud;
  (void)c;
  l->n++;
  l->last = *rec;
}

typedef struct fixture {
  tl_env *env;
  tl_server srv;
  srv_log log;
  hr_engine *ce;
  tc_conn conn;
} fixture;

/* A server and a client, both with `prov` (NULL: the client has no
 * fabric); `dest`: both advertise RDMA_GPUDIRECT and receivers register
 * their landing buffers as destinations. */
static void open_pair(fixture *f, const char *cprov, int dest) {
  hr_engine_config sc, cc;
  memset(f, 0, sizeof *f);
  f->env = tl_new(TL_EPOLL);
  hr_engine_config_default(&sc);
  sc.fabric_provider = provider();
  sc.fabric_node = "127.0.0.1";
  sc.on_transfer = on_srv_transfer;
  sc.user_data = &f->log;
  sc.session.shard_bytes = 1u << 20;
  if (dest) {
    sc.fabric_caps = HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT;
    sc.session.rdma_destination = 1;
  }
  tl_server_start(f->env, &f->srv, &sc, NULL);
  hr_engine_config_default(&cc);
  cc.fabric_provider = cprov;
  cc.fabric_node = "127.0.0.1";
  if (dest) {
    cc.fabric_caps = sc.fabric_caps;
    cc.session.rdma_destination = 1;
  }
  f->ce = tl_engine(f->env, &cc);
  assert_true(!cprov || hr_engine_fabric(f->ce) != NULL);
  tc_open(f->env, f->ce, f->srv.url, &f->conn);
}

static void close_pair(fixture *f) {
  tc_close(&f->conn);
  tl_engine_finish(f->env, f->ce);
  tl_server_stop(f->env, &f->srv);
  tl_free(f->env);
}

static hr_tensor *tensor(uint64_t rows, uint64_t cols, uint32_t seed) {
  uint64_t shape[2] = {rows, cols};
  return tl_dense(HR_ELEM_UINT8, 2, shape, seed);
}

static void get_check(fixture *f, hr_tensor *ref, uint16_t shards,
                      uint8_t plane) {
  hr_get_opts o;
  tc_res r;
  memset(&r, 0, sizeof r);
  tc_opts(&o, "t");
  if (shards > 1) {
    o.flags = HR_REQ_PARALLEL_OK;
    o.max_shards = shards;
  }
  assert_int_equal(tc_get(&f->conn, &o, &r), 0);
  assert_true(tl_same_elements(ref, NULL, r.t));
  assert_int_equal(r.rec.data_plane, plane);
  if (shards > 1)
    assert_true(r.rec.shards > 1);
  assert_int_equal(f->log.last.data_plane, plane);
  tc_res_clear(&r);
}

/* GET (plain, again, parallel) and PUT on one pair of engines. */
static void run(int dest) {
  fixture f;
  open_pair(&f, provider(), dest);
  hr_tensor *t = tensor(64, 128 << 10, 11); /* 8 MiB */
  tl_put(&f.srv, "t", t);
  get_check(&f, t, 1, HR_PLANE_RDMA);
  assert_string_equal(f.log.last.fallback, "");
  /* Served again: the same registration, the same bytes. */
  get_check(&f, t, 1, HR_PLANE_RDMA);
  /* Parallel: every shard over RDMA. */
  get_check(&f, t, 4, HR_PLANE_RDMA);
  hr_tensor_unref(t);
  /* PUT over RDMA, then read back. */
  t = tensor(32, 128 << 10, 23); /* 4 MiB */
  tc_res r;
  memset(&r, 0, sizeof r);
  assert_int_equal(tc_put(&f.conn, "t", HR_PUT_REPLACE, t, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_RDMA);
  assert_int_equal(f.log.last.data_plane, HR_PLANE_RDMA);
  tc_res_clear(&r);
  get_check(&f, t, 1, HR_PLANE_RDMA);
  hr_tensor_unref(t);
  close_pair(&f);
}

/* ---- registration lifetime ---- */

#define LIFE_LEN ((size_t)4 << 20)

/* A fresh anonymous mapping (at `at` exactly when not NULL: memory freed
 * and reallocated at the same address), filled from `seed`. */
static uint8_t *mapping(void *at, uint32_t seed) {
  uint8_t *p = mmap(at, LIFE_LEN, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED : 0), -1, 0);
  assert_true(p != MAP_FAILED);
  if (at)
    assert_ptr_equal(p, at);
  for (size_t i = 0; i < LIFE_LEN; i++)
    p[i] = tl_byte(seed, i);
  return p;
}

static hr_tensor *wrap(uint8_t *p) {
  hr_descriptor d = tu_bytes_desc(LIFE_LEN, 0, HR_DEV_CPU);
  void *bufs[1] = {p};
  hr_tensor *t;
  assert_int_equal(hr_tensor_wrap(&t, &d, bufs, NULL, NULL, NULL), 0);
  return t;
}

typedef struct inval_wait {
  hr_fabric *f;
  uint64_t want;
} inval_wait;

static int invalidated(void *ud) {
  inval_wait *iw = ud;
  hr_fabric_stats st;
  hr_fabric_get_stats(iw->f, &st);
  return st.mr_cache_invalidations >= iw->want;
}

/* GET into the application's buffer `dst`; checks the bytes against
 * `seed`. */
static void get_into(fixture *f, uint8_t *dst, uint32_t seed) {
  hr_get_opts o;
  hr_get_dest dest;
  tc_res r;
  memset(&r, 0, sizeof r);
  memset(&dest, 0, sizeof dest);
  memset(dst, 0, LIFE_LEN);
  dest.buffer = dst;
  dest.capacity = LIFE_LEN;
  tc_opts(&o, "t");
  o.dest = &dest;
  assert_int_equal(tc_get(&f->conn, &o, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_RDMA);
  assert_ptr_equal(hr_tensor_buffer(r.t, 0), dst);
  tc_res_clear(&r); /* the application drops the received tensor */
  for (size_t i = 0; i < LIFE_LEN; i++)
    if (dst[i] != tl_byte(seed, i))
      fail_msg("byte %zu differs", i);
}

/*
 * A cached registration never outlives its memory.  Server: a tensor
 * served twice is registered once; replaced in the store and freed, its
 * registration is closed (the engine wakes for it), and a new tensor in
 * memory mapped again at the same address is registered anew and served
 * with its own bytes.  Client: each GET's destination (the application's
 * buffer, unmapped and mapped again at the same address in between) is
 * registered for that GET and closed when the received tensor is dropped.
 * Every transfer's remote key is revoked at its end.
 */
static void test_registration_lifetime(void **state) {
  (void)state;
  fixture f;
  open_pair(&f, provider(), 0);
  hr_fabric *sf = hr_engine_fabric(f.srv.e), *cf = hr_engine_fabric(f.ce);
  hr_fabric_stats s0, s1, c0, c1;
  uint8_t *src = mapping(NULL, 31), *dst = mapping(NULL, 0);
  hr_tensor *t = wrap(src);
  tl_put(&f.srv, "t", t);
  hr_fabric_get_stats(sf, &s0);
  hr_fabric_get_stats(cf, &c0);
  get_into(&f, dst, 31);
  get_into(&f, dst, 31);
  hr_fabric_get_stats(sf, &s1);
  /* Served twice, registered once. */
  assert_int_equal(s1.mr_cache_misses - s0.mr_cache_misses, 1);
  assert_true(s1.mr_cache_hits > s0.mr_cache_hits);
  assert_int_equal(s1.mr_cache_invalidations, s0.mr_cache_invalidations);
  /* The client's destination: registered per GET, closed after it. */
  inval_wait cw = {cf, c0.mr_cache_invalidations + 2};
  assert_int_equal(tl_run(f.env, invalidated, &cw, TL_WAIT_MS), 1);
  hr_fabric_get_stats(cf, &c1);
  assert_int_equal(c1.mr_cache_misses - c0.mr_cache_misses, 2);
  /* Freed and mapped again at the same address: registered anew. */
  assert_int_equal(munmap(dst, LIFE_LEN), 0);
  assert_ptr_equal(mapping(dst, 0), dst);
  get_into(&f, dst, 31);
  hr_fabric_get_stats(cf, &c1);
  assert_int_equal(c1.mr_cache_misses - c0.mr_cache_misses, 3);

  /* The store lets the tensor go; its memory is freed. */
  hr_tensor *other = tensor(1, 64, 5);
  tl_put(&f.srv, "t", other);
  hr_tensor_unref(other);
  hr_tensor_unref(t);
  inval_wait sw = {sf, s0.mr_cache_invalidations + 1};
  assert_int_equal(tl_run(f.env, invalidated, &sw, TL_WAIT_MS), 1);
  assert_int_equal(munmap(src, LIFE_LEN), 0);
  /* New memory at the same address, other bytes: a new registration. */
  assert_ptr_equal(mapping(src, 47), src);
  t = wrap(src);
  tl_put(&f.srv, "t", t);
  get_into(&f, dst, 47);
  hr_fabric_get_stats(sf, &s1);
  assert_int_equal(s1.mr_cache_misses - s0.mr_cache_misses, 2);
  /* Every remote key made was revoked. */
  assert_true(s1.remote_regs > s0.remote_regs);
  assert_int_equal(s1.remote_regs, s1.remote_deregs);
  hr_fabric_get_stats(cf, &c1);
  assert_int_equal(c1.remote_regs, c1.remote_deregs);
  hr_tensor_unref(t);
  close_pair(&f);
  munmap(src, LIFE_LEN);
  munmap(dst, LIFE_LEN);
}

static void test_get_put(void **state) {
  (void)state;
  run(0);
}

static void test_get_put_destination(void **state) {
  (void)state;
  run(1);
}

/* A client without a fabric: frames, and no fallback (nothing was
 * negotiated). */
static void test_client_without_fabric(void **state) {
  (void)state;
  fixture f;
  open_pair(&f, NULL, 0);
  hr_tensor *t = tensor(16, 128 << 10, 5);
  tl_put(&f.srv, "t", t);
  get_check(&f, t, 1, HR_PLANE_FRAMES);
  assert_string_equal(f.log.last.fallback, "");
  hr_tensor_unref(t);
  close_pair(&f);
}

/* A client whose fabric is another provider: the server refuses its
 * FABRIC_ADDRESS, sends frames and says why. */
static void test_client_other_provider(void **state) {
  (void)state;
  const char *other =
      strcmp(HR_TEST_PROVIDER, "tcp") == 0 ? "shm" : "tcp;ofi_rxm";
  hr_fabric *probe = NULL;
  hr_fabric_config fc;
  hr_fabric_config_default(&fc);
  fc.provider = other;
  fc.node = "127.0.0.1";
  if (hr_fabric_new(&probe, &fc, NULL, NULL, 0) != 0)
    skip();
  hr_fabric_del(probe);
  fixture f;
  open_pair(&f, other, 0);
  hr_tensor *t = tensor(16, 128 << 10, 6);
  tl_put(&f.srv, "t", t);
  get_check(&f, t, 1, HR_PLANE_FRAMES);
  assert_true(f.log.last.fallback[0] != 0);
  hr_tensor_unref(t);
  close_pair(&f);
}

static void slow_gate(void *arg) {
  (void)arg;
  struct timespec ts = {0, 100000000}; /* 100 ms */
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* A device tensor of the simulated device whose producer (a gate, then
 * the copy of `want`) is still running: the tensor's event ends it. */
#define DEV_SRC_BYTES ((uint64_t)8 << 20)
typedef struct dev_src {
  hr_gpu *g;
  hr_gpu_stream *p;
  hr_gpu_buf *dev, *host;
  hr_gpu_event *ev;
  hr_tensor *want; /* the bytes the producer writes */
} dev_src;

/* Starts the producer of `want` (pattern `seed`); returns the device
 * tensor (the caller's reference). */
static hr_tensor *dev_src_open(dev_src *ds, uint32_t seed) {
  hr_gpu_config gc;
  hr_gpu_config_default(&gc);
  gc.backend = "sim";
  assert_int_equal(hr_gpu_open(&ds->g, &gc, NULL, NULL), 0);
  hr_gpu_caps caps;
  assert_int_equal(hr_gpu_query(ds->g, &caps), 0);
  uint64_t n = DEV_SRC_BYTES;
  ds->want = tensor(64, 128 << 10, seed);
  assert_int_equal(hr_gpu_stream_new(ds->g, &ds->p), 0);
  assert_int_equal(hr_gpu_buf_alloc(ds->g, HR_GPU_MEM_DEVICE, n, &ds->dev), 0);
  assert_int_equal(
      hr_gpu_buf_wrap_host(ds->g, hr_tensor_buffer(ds->want, 0), n, &ds->host),
      0);
  assert_int_equal(hr_gpu_event_new(ds->g, 0, &ds->ev), 0);
  assert_int_equal(hr_gpu_launch_host_fn(ds->p, slow_gate, NULL), 0);
  assert_int_equal(hr_gpu_copy_async(ds->p, ds->dev, 0, ds->host, 0, n), 0);
  assert_int_equal(hr_gpu_event_record(ds->ev, ds->p), 0);
  hr_descriptor d = *hr_tensor_descriptor(ds->want);
  d.buffers[0].device_tag = caps.device_tag;
  hr_tensor *t;
  assert_int_equal(
      hr_tensor_wrap_device(&t, &d, &ds->dev, ds->ev, NULL, NULL, NULL), 0);
  return t;
}

/* Waits for the producer and frees what dev_src_open() made. */
static void dev_src_close(dev_src *ds) {
  assert_int_equal(hr_gpu_stream_sync(ds->p), 0);
  hr_gpu_event_del(ds->ev);
  hr_gpu_buf_del(ds->host);
  hr_gpu_buf_del(ds->dev);
  hr_gpu_stream_del(ds->p);
  hr_tensor_unref(ds->want);
  assert_int_equal(hr_gpu_del(ds->g), 0);
}

/*
 * A device tensor served where GPUDirect cannot be the source: with it
 * advertised (both HELLOs; `dest`), this provider cannot register device
 * memory (the simulated device's, here), the registration is refused by
 * libfabric's side of the backend; without it, nothing is tried.  Either
 * way the tensor is staged into a host region after its producer's event
 * and goes over RDMA from there (decision 76); the server's record says
 * why; the bytes are the producer's (written after the GET was answered).
 */
static void device_get(int dest) {
  dev_src ds;
  hr_tensor *t = dev_src_open(&ds, 13);
  fixture f;
  open_pair(&f, provider(), dest);
  tl_put(&f.srv, "t", t);
  hr_tensor_unref(t);
  hr_fabric_stats s0, s1;
  hr_fabric_get_stats(hr_engine_fabric(f.srv.e), &s0);
  get_check(&f, ds.want, 1, HR_PLANE_RDMA);
  if (!strstr(f.log.last.fallback, "device tensor staged for RDMA: ") ||
      !strstr(f.log.last.fallback, dest ? "registering the source failed"
                                        : "RDMA_GPUDIRECT is not in both"))
    fail_msg("fallback \"%s\"", f.log.last.fallback);
  hr_fabric_get_stats(hr_engine_fabric(f.srv.e), &s1);
  assert_true(s1.remote_regs > s0.remote_regs); /* the staged region */
  /* Parallel: each shard stages its own range. */
  get_check(&f, ds.want, 4, HR_PLANE_RDMA);
  close_pair(&f);
  dev_src_close(&ds);
}

static void test_device_source_refused(void **state) {
  (void)state;
  device_get(1);
}

static void test_device_source_staged(void **state) {
  (void)state;
  device_get(0);
}

/*
 * The same for a client PUT of the device tensor (decision 75): GPUDirect
 * advertised and the registration refused by this provider, or not
 * advertised; the tensor is staged after its producer's event and goes
 * over RDMA from the host region, the client's record says why, and the
 * server stores the producer's bytes.
 */
static void device_put(int dest) {
  dev_src ds;
  hr_tensor *t = dev_src_open(&ds, 17);
  uint64_t n = DEV_SRC_BYTES;
  fixture f;
  open_pair(&f, provider(), dest);
  tc_res r;
  assert_int_equal(tc_put(&f.conn, "up", 0, t, &r), 0);
  hr_tensor_unref(t);
  assert_int_equal(r.rec.data_plane, HR_PLANE_RDMA);
  assert_int_equal(f.log.last.data_plane, HR_PLANE_RDMA);
  if (!strstr(r.rec.fallback, "device tensor staged for RDMA: ") ||
      !strstr(r.rec.fallback, dest ? "registering the source failed"
                                   : "RDMA_GPUDIRECT is not in both"))
    fail_msg("fallback \"%s\"", r.rec.fallback);
  tc_res_clear(&r);
  hr_tensor *got = NULL;
  assert_int_equal(hr_store_get(f.srv.store, "up", 2, &got), 0);
  assert_int_equal(hr_tensor_bytes(got), n);
  assert_memory_equal(hr_tensor_buffer(got, 0), hr_tensor_buffer(ds.want, 0),
                      n);
  hr_tensor_unref(got);
  close_pair(&f);
  dev_src_close(&ds);
}

static void test_device_put_refused(void **state) {
  (void)state;
  device_put(1);
}

static void test_device_put_staged(void **state) {
  (void)state;
  device_put(0);
}

/* A transcoded GET (ROW_MAJOR stored, COLUMN_MAJOR asked): the output is
 * produced into one host region and goes over RDMA from there, byte-exact
 * (decision 76). */
static void test_transcoded_get(void **state) {
  (void)state;
  fixture f;
  open_pair(&f, provider(), 0);
  uint64_t shape[2] = {1024, 4096}; /* 4 MiB of uint8 */
  hr_tensor *t = tl_dense(HR_ELEM_UINT8, 2, shape, 29);
  tl_put(&f.srv, "t", t);
  hr_layout_entry l = {HR_LAYOUT_COLUMN_MAJOR, 0, NULL};
  hr_get_opts o;
  tc_res r;
  memset(&r, 0, sizeof r);
  tc_opts(&o, "t");
  o.layouts = &l;
  o.layout_count = 1;
  o.flags = HR_REQ_ALLOW_TRANSCODE;
  assert_int_equal(tc_get(&f.conn, &o, &r), 0);
  assert_int_equal(hr_tensor_descriptor(r.t)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  assert_true(tl_same_elements(t, NULL, r.t));
  assert_int_equal(r.rec.data_plane, HR_PLANE_RDMA);
  assert_int_equal(f.log.last.data_plane, HR_PLANE_RDMA);
  assert_int_equal(f.log.last.transcoded, 1);
  if (strstr(f.log.last.fallback, "frames"))
    fail_msg("fallback \"%s\"", f.log.last.fallback);
  tc_res_clear(&r);
  hr_tensor_unref(t);
  close_pair(&f);
}

int main(void) {
  hr_fabric *probe = NULL;
  hr_fabric_config fc;
  hr_fabric_config_default(&fc);
  fc.provider = provider();
  fc.node = "127.0.0.1";
  int rv = hr_fabric_new(&probe, &fc, NULL, NULL, 0);
  if (rv == HR_ERR_UNSUPPORTED) {
    printf("libfabric has no %s provider here: skipped\n", provider());
    return 77;
  }
  if (rv != 0) {
    printf("cannot open %s: %s\n", provider(), hr_strerror(rv));
    return 1;
  }
  hr_fabric_del(probe);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_put),
      cmocka_unit_test(test_get_put_destination),
      cmocka_unit_test(test_client_without_fabric),
      cmocka_unit_test(test_client_other_provider),
      cmocka_unit_test(test_registration_lifetime),
      cmocka_unit_test(test_device_source_refused),
      cmocka_unit_test(test_device_put_refused),
      cmocka_unit_test(test_device_source_staged),
      cmocka_unit_test(test_device_put_staged),
      cmocka_unit_test(test_transcoded_get),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
