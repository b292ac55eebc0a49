/*
 * Device memory over the SHM data plane in the sans-IO session
 * (engine/core/hr_shm_dev.c), with descriptors handed across in memory as
 * a Unix socket would (dup() for SCM_RIGHTS), on the simulated device:
 * the round trip (the descriptor waits for the producer's event through a
 * work item), BUFFER_RELEASE through the wake token, and a hostile server
 * whose descriptor is not what it claims (a pipe, a too short memfd,
 * none at all): the client refuses it, the server falls back to frames,
 * and no descriptor leaks.
 */

#include <fcntl.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include <hurray/gpu.h>

#include "common/test_util.h"
#include "engine_core/harness.h"

enum { M_NORMAL = 0, M_PIPE, M_SHORT, M_DROP };

typedef struct dev_pair {
  pair p; /* first: the harness callbacks get this pointer */
  int mode;
  int swapped;
  int wakes_made, wakes;
  hr_gpu *g;
  uint8_t devs[2];
} dev_pair;

static void t_close(hr_session *s, int fd, void *ud) {
  (void)s;
  (void)ud;
  close(fd);
}

/* Host segments are not used here: a map request is a failure. */
static int t_map(hr_session *s, int fd, uint64_t offset, uint64_t len,
                 uint64_t align, hr_shm_mapping *out, char *why,
                 size_t why_len, void *ud) {
  (void)s, (void)fd, (void)offset, (void)len, (void)align, (void)out;
  (void)ud;
  snprintf(why, why_len, "test: no host segments expected");
  return -1;
}

static void t_wake(void *ctx) {
  dev_pair *dp = ctx;
  dp->wakes++;
}

static int t_shm_wake(hr_session *s, hr_shm_mapping *out, void *ud) {
  dev_pair *dp = ud;
  (void)s;
  dp->wakes_made++;
  out->base = NULL;
  out->unmap = t_wake;
  out->ctx = dp;
  return 0;
}

static void dp_open(dev_pair *dp) {
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  assert_int_equal(hr_gpu_open(&dp->g, &cfg, NULL, NULL), 0);
  dp->devs[0] = HR_DEV_CPU;
  dp->devs[1] = HR_GPU_DEV_SIM;
  dp->p.async_work = 1;
  dp->p.iov_max = 64;
  hr_session_callbacks cb = pair_callbacks(&dp->p);
  cb.fd_close = t_close;
  hr_provider prov = store_provider(&dp->p.st);
  hr_settings set;
  hr_settings_default(&set);
  set.devices = dp->devs;
  set.device_count = 2;
  hr_session_callbacks ccb = cb;
  ccb.shm_map = t_map;
  ccb.shm_wake = t_shm_wake;
  assert_int_equal(
      hr_session_new(&dp->p.c, HR_ROLE_CLIENT, &set, &ccb, NULL, dp, 0, NULL),
      0);
  assert_int_equal(
      hr_session_new(&dp->p.s, HR_ROLE_SERVER, &set, &cb, &prov, dp, 0, NULL),
      0);
}

/* The descriptors of each pull, per `mode`. */
static int pick_fds(void *ud, hr_session *from, int fd, int fds[2]) {
  dev_pair *dp = ud;
  (void)from;
  if (fd < 0)
    return 0;
  if (dp->mode == M_NORMAL || dp->swapped) {
    fds[0] = dup(fd);
    return 1;
  }
  /* The hostile server's descriptor, once. */
  dp->swapped = 1;
  if (dp->mode == M_PIPE) {
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    close(p[1]);
    fds[0] = p[0];
    return 1;
  }
  if (dp->mode == M_SHORT) {
    int m = memfd_create("short", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(m >= 0);
    assert_int_equal(ftruncate(m, 4096), 0);
    assert_int_equal(fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    fds[0] = m;
    return 1;
  }
  return 0;
}

static int64_t fpump(dev_pair *dp, hr_session *from, hr_session *to) {
  return pump_fds(&dp->p, from, to, pick_fds, dp);
}

static void frun(dev_pair *dp) {
  for (int r = 0; r < 100000; r++) {
    int64_t a = fpump(dp, dp->p.c, dp->p.s);
    int64_t b = fpump(dp, dp->p.s, dp->p.c);
    assert_true(a >= 0 && b >= 0);
    int w = run_work(&dp->p);
    if (a == 0 && b == 0 && w == 0)
      return;
  }
  fail();
}

/* A served device tensor in shareable memory, written by a stream whose
 * end its event records. */
typedef struct served {
  hr_gpu_stream *P;
  hr_gpu_buf *dev, *src;
  hr_gpu_event *ev;
  atomic_int released;
  uint8_t bytes[65536];
} served;

static void served_release(void *ctx) {
  atomic_store(&((served *)ctx)->released, 1);
}

static hr_tensor *serve(dev_pair *dp, served *sv) {
  uint64_t n = sizeof sv->bytes;
  for (uint64_t i = 0; i < n; i++)
    sv->bytes[i] = (uint8_t)(i * 7 + 3);
  atomic_init(&sv->released, 0);
  assert_int_equal(hr_gpu_stream_new(dp->g, &sv->P), 0);
  assert_int_equal(hr_gpu_buf_alloc_shareable(dp->g, n, &sv->dev), 0);
  assert_int_equal(hr_gpu_buf_wrap_host(dp->g, sv->bytes, n, &sv->src), 0);
  assert_int_equal(hr_gpu_event_new(dp->g, 0, &sv->ev), 0);
  assert_int_equal(hr_gpu_copy_async(sv->P, sv->dev, 0, sv->src, 0, n), 0);
  assert_int_equal(hr_gpu_event_record(sv->ev, sv->P), 0);
  hr_descriptor d;
  desc_init(&d, HR_ELEM_UINT8, HR_LAYOUT_ROW_MAJOR, 1, &n);
  d.buffer_count = 1;
  d.buffers[0].size_bytes = n;
  d.buffers[0].device_tag = HR_GPU_DEV_SIM;
  hr_tensor *t;
  assert_int_equal(hr_tensor_wrap_device(&t, &d, &sv->dev, sv->ev,
                                         served_release, sv, NULL),
                   0);
  return t;
}

static void served_free(served *sv) {
  assert_int_equal(hr_gpu_stream_sync(sv->P), 0);
  hr_gpu_stream_del(sv->P);
  hr_gpu_event_del(sv->ev);
  hr_gpu_buf_del(sv->dev);
  hr_gpu_buf_del(sv->src);
}

static int get(dev_pair *dp, const char *key, result *r) {
  hr_get_opts o;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)key;
  o.key_len = (uint16_t)strlen(key);
  o.max_shards = 1;
  o.preferred_device = HR_GPU_DEV_SIM;
  o.device = dp->g;
  o.device_sync = HR_SYNC_PRODUCER_SYNCED;
  assert_int_equal(hr_session_get(dp->p.c, &o, on_get_done, r, NULL), 0);
  frun(dp);
  assert_int_equal(r->calls, 1);
  if (r->status)
    printf("GET %s: %s, wire 0x%x: %s\n", key, hr_strerror(r->status),
           r->rec.wire_error, r->rec.message);
  return r->status;
}

/* The delivered device tensor holds the producer's bytes. */
static int device_holds(dev_pair *dp, hr_tensor *t, const served *sv) {
  uint8_t out[sizeof sv->bytes];
  hr_gpu_buf *h;
  hr_gpu_stream *s;
  memset(out, 0, sizeof out);
  assert_int_equal(hr_gpu_buf_wrap_host(dp->g, out, sizeof out, &h), 0);
  assert_int_equal(hr_gpu_stream_new(dp->g, &s), 0);
  assert_int_equal(
      hr_gpu_copy_async(s, h, 0, hr_tensor_gpu_buf(t, 0), 0, sizeof out), 0);
  assert_int_equal(hr_gpu_stream_sync(s), 0);
  hr_gpu_stream_del(s);
  hr_gpu_buf_del(h);
  return memcmp(out, sv->bytes, sizeof out) == 0;
}

/* Closes the sessions, then the producer's objects, then the device. */
static void dp_close(dev_pair *dp, served *sv) {
  pair_close(&dp->p);
  served_free(sv);
  assert_int_equal(hr_gpu_del(dp->g), 0);
}

static void test_roundtrip_release(void **state) {
  (void)state;
  int fds0 = tu_fd_count();
  dev_pair dp;
  served sv;
  result r;
  memset(&dp, 0, sizeof dp);
  memset(&r, 0, sizeof r);
  dp_open(&dp);
  hr_tensor *t = serve(&dp, &sv);
  store_put(&dp.p.st, "d", t);
  hr_tensor_unref(t);
  assert_int_equal(get(&dp, "d", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_int_equal(dp.p.last_srv_rec.data_plane, HR_PLANE_SHM);
  assert_true(hr_tensor_on_device(r.t));
  assert_int_equal(hr_tensor_descriptor(r.t)->buffers[0].memory_class,
                   HR_MEM_PINNED);
  assert_true(device_holds(&dp, r.t, &sv));
  assert_int_equal(dp.wakes_made, 1);
  /* Only the lease holds the tensor now. */
  store_clear(&dp.p.st);
  frun(&dp);
  assert_false(atomic_load(&sv.released));
  assert_false(hr_session_want_write(dp.p.c));
  result_clear(&r);
  assert_int_equal(dp.wakes, 1);
  assert_true(hr_session_want_write(dp.p.c));
  frun(&dp);
  assert_true(atomic_load(&sv.released));
  dp_close(&dp, &sv);
  assert_int_equal(tu_fd_count(), fds0);
}

/* A hostile server's descriptor: refused (DEVICE_UNAVAILABLE for one that
 * does not import, PROTOCOL_VIOLATION for none), then frames. */
static void hostile(int mode, uint32_t wire) {
  int fds0 = tu_fd_count();
  dev_pair dp;
  served sv;
  result r;
  memset(&dp, 0, sizeof dp);
  memset(&r, 0, sizeof r);
  dp_open(&dp);
  dp.mode = mode;
  hr_tensor *t = serve(&dp, &sv);
  store_put(&dp.p.st, "d", t);
  hr_tensor_unref(t);
  assert_int_not_equal(get(&dp, "d", &r), 0);
  assert_int_equal(r.rec.wire_error, wire);
  assert_int_equal(r.rec.wire_error_sent, 1);
  assert_int_equal(dp.wakes_made, 0);
  result_clear(&r);
  if (mode != M_DROP) {
    /* The server read the ERROR: staged frames from now on, landed on
     * the device. */
    assert_int_equal(get(&dp, "d", &r), 0);
    assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
    assert_true(hr_tensor_on_device(r.t));
    assert_true(device_holds(&dp, r.t, &sv));
    assert_int_equal(dp.p.errors_c, 0);
    result_clear(&r);
  }
  store_clear(&dp.p.st);
  frun(&dp);
  assert_true(atomic_load(&sv.released));
  dp_close(&dp, &sv);
  assert_int_equal(tu_fd_count(), fds0);
}

static void test_pipe(void **state) {
  (void)state;
  hostile(M_PIPE, HR_WIRE_DEVICE_UNAVAILABLE);
}

static void test_short(void **state) {
  (void)state;
  hostile(M_SHORT, HR_WIRE_DEVICE_UNAVAILABLE);
}

static void test_no_fd(void **state) {
  (void)state;
  hostile(M_DROP, HR_WIRE_PROTOCOL_VIOLATION);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_release),
      cmocka_unit_test(test_pipe),
      cmocka_unit_test(test_short),
      cmocka_unit_test(test_no_fd),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
