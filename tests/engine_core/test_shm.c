/*
 * The SHM data plane in the sans-IO session (engine/core/hr_shm.c), with
 * descriptors handed across in memory as a Unix socket would (dup() for
 * SCM_RIGHTS): the round trip and BUFFER_RELEASE, the fallback after a
 * failed map, and a hostile peer's descriptors (none with an SHM
 * descriptor, two at once, one with a message that carries none, one sent
 * to the server), and the bound on the server's leases.  Every test
 * checks that no descriptor leaked.
 */

#include <fcntl.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/test_util.h"
#include "engine_core/harness.h"

enum { M_NORMAL = 0, M_DROP, M_TWO, M_STRAY };

typedef struct shm_pair {
  pair p; /* first: the harness callbacks get this pointer */
  int mode;
  int stray_done;
  int fail_map;
  int heap_map; /* map into a zeroed heap block (no mmap: no map limit) */
  int maps, unmaps, closes;
  int fds0; /* descriptors open before the pair (sp_close_check) */
} shm_pair;

typedef struct tmap {
  shm_pair *sp;
  void *addr;
  size_t len;
} tmap;

static void t_unmap(void *ctx) {
  tmap *m = ctx;
  if (m->addr && m->sp->heap_map)
    free(m->addr);
  else if (m->addr)
    munmap(m->addr, m->len);
  m->sp->unmaps++;
  free(m);
}

static int t_map(hr_session *s, int fd, uint64_t offset, uint64_t len,
                 uint64_t align, hr_shm_mapping *out, char *why, size_t why_len,
                 void *ud) {
  shm_pair *sp = ud;
  (void)s;
  (void)align;
  if (sp->fail_map) {
    snprintf(why, why_len, "test: mapping refused");
    return -1;
  }
  assert_int_equal(offset % 4096, 0);
  tmap *m = calloc(1, sizeof *m);
  m->sp = sp;
  if (len && sp->heap_map) {
    m->len = (size_t)len;
    m->addr = calloc(1, m->len);
    assert_non_null(m->addr);
  } else if (len) {
    m->len = (size_t)len;
    m->addr = mmap(NULL, m->len, PROT_READ, MAP_SHARED, fd, (off_t)offset);
    assert_true(m->addr != MAP_FAILED);
  }
  sp->maps++;
  out->base = m->addr;
  out->unmap = t_unmap;
  out->ctx = m;
  return 0;
}

static void t_close(hr_session *s, int fd, void *ud) {
  shm_pair *sp = ud;
  (void)s;
  sp->closes++;
  close(fd);
}

static void sp_open(shm_pair *sp, int client_shm) {
  memset(sp, 0, sizeof *sp);
  sp->fds0 = tu_fd_count();
  hr_session_callbacks cb = pair_callbacks(&sp->p);
  hr_provider prov = store_provider(&sp->p.st);
  hr_settings cs;
  cb.fd_close = t_close;
  hr_settings_default(&cs);
  if (!client_shm)
    cs.capabilities = 0;
  sp->p.iov_max = 64;
  hr_session_callbacks ccb = cb;
  ccb.shm_map = t_map;
  assert_int_equal(
      hr_session_new(&sp->p.c, HR_ROLE_CLIENT, &cs, &ccb, NULL, sp, 0, NULL),
      0);
  assert_int_equal(
      hr_session_new(&sp->p.s, HR_ROLE_SERVER, NULL, &cb, &prov, sp, 0, NULL),
      0);
}

/* The descriptors of each pull, per `mode`. */
static int pick_fds(void *ud, hr_session *from, int fd, int fds[2]) {
  shm_pair *sp = ud;
  int nfds = 0;
  if (fd >= 0 && sp->mode != M_DROP) {
    fds[nfds++] = dup(fd);
    if (sp->mode == M_TWO)
      fds[nfds++] = dup(fd);
  }
  if (fd < 0 && sp->mode == M_STRAY && from == sp->p.s && !sp->stray_done) {
    /* A hostile server: a descriptor with its SERVER_HELLO. */
    sp->stray_done = 1;
    fds[nfds++] = memfd_create("stray", MFD_CLOEXEC);
  }
  return nfds;
}

static int64_t fpump(shm_pair *sp, hr_session *from, hr_session *to) {
  return pump_fds(&sp->p, from, to, pick_fds, sp);
}

static void frun(shm_pair *sp) {
  for (int r = 0; r < 100000; r++) {
    int64_t a = fpump(sp, sp->p.c, sp->p.s);
    int64_t b = fpump(sp, sp->p.s, sp->p.c);
    assert_true(a >= 0 && b >= 0);
    if (a == 0 && b == 0)
      return;
  }
  fail();
}

static void sp_close(shm_pair *sp) {
  pair_close(&sp->p);
}

/* A sealed memfd tensor with a release we watch. */
typedef struct seg {
  atomic_int released;
  int fd;
  void *addr;
  size_t len;
} seg;

static void seg_release(void *ctx) {
  seg *g = ctx;
  munmap(g->addr, g->len);
  close(g->fd);
  atomic_store(&g->released, 1);
}

static hr_tensor *seg_tensor(seg *g, uint64_t n) {
  hr_descriptor d;
  desc_init(&d, HR_ELEM_INT32, HR_LAYOUT_ROW_MAJOR, 1, &n);
  d.buffer_count = 1;
  d.buffers[0].size_bytes = n * 4;
  d.buffers[0].alignment_log2 = 6;
  atomic_init(&g->released, 0);
  g->len = (size_t)(n * 4);
  g->fd = memfd_create("seg", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  assert_true(g->fd >= 0);
  assert_int_equal(ftruncate(g->fd, (off_t)g->len), 0);
  assert_int_equal(fcntl(g->fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  g->addr = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
  assert_true(g->addr != MAP_FAILED);
  for (uint64_t i = 0; i < n; i++)
    ((int32_t *)g->addr)[i] = (int32_t)(i * 3);
  hr_tensor *t;
  void *b = g->addr;
  assert_int_equal(hr_tensor_wrap(&t, &d, &b, seg_release, g, NULL), 0);
  assert_int_equal(hr_tensor_set_segment(t, g->fd, 0), 0);
  return t;
}

/* Stores a fresh segment tensor of `n` int32 (in `g`) under `key`. */
static void put_seg(shm_pair *sp, const char *key, seg *g, uint64_t n) {
  hr_tensor *t = seg_tensor(g, n);
  store_put(&sp->p.st, key, t);
  hr_tensor_unref(t);
}

/* Opens the pair with a segment tensor of `n` int32 (in `g`) stored under
 * "a", and a fresh result `r`. */
static void sp_open_seg(shm_pair *sp, int client_shm, seg *g, uint64_t n,
                        result *r) {
  sp_open(sp, client_shm);
  memset(r, 0, sizeof *r);
  put_seg(sp, "a", g, n);
}

/* Closes the pair and checks that no descriptor leaked since it
 * opened. */
static void sp_close_check(shm_pair *sp) {
  sp_close(sp);
  assert_int_equal(tu_fd_count(), sp->fds0);
}

/* Asks for `key` (one shard) into `r`; the pair does not run. */
static void start_get(shm_pair *sp, const char *key, result *r) {
  hr_get_opts o;
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)key;
  o.key_len = (uint16_t)strlen(key);
  o.max_shards = 1;
  assert_int_equal(hr_session_get(sp->p.c, &o, on_get_done, r, NULL), 0);
}

static int get(shm_pair *sp, const char *key, result *r) {
  start_get(sp, key, r);
  frun(sp);
  assert_int_equal(r->calls, 1);
  return r->status;
}

/* GETs `key` and checks that it came over SHM; returns the tensor, which
 * holds the lease (the caller's reference: dropping it owes the server
 * a BUFFER_RELEASE). */
static hr_tensor *get_lease(shm_pair *sp, const char *key) {
  result r;
  memset(&r, 0, sizeof r);
  assert_int_equal(get(sp, key, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  return r.t;
}

/* Drops a lease's tensor and runs the pair: its BUFFER_RELEASE reaches
 * the server. */
static void release(shm_pair *sp, hr_tensor *t) {
  hr_tensor_unref(t);
  frun(sp);
}

/* Drops the store's tensors and runs the pair: from now on only leases
 * hold segments. */
static void store_drop(shm_pair *sp) {
  store_clear(&sp->p.st);
  frun(sp);
}

static void test_roundtrip_release(void **state) {
  (void)state;
  shm_pair sp;
  seg g;
  result r;
  sp_open_seg(&sp, 1, &g, 5000, &r);
  assert_int_equal(get(&sp, "a", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_int_equal(sp.p.last_srv_rec.data_plane, HR_PLANE_SHM);
  assert_int_equal(sp.maps, 1);
  assert_int_equal(((const int32_t *)hr_tensor_buffer(r.t, 0))[4999], 4999 * 3);
  /* Only the lease holds the tensor now. */
  store_drop(&sp);
  assert_false(atomic_load(&g.released));
  assert_false(hr_session_want_write(sp.p.c));
  result_clear(&r);
  assert_int_equal(sp.unmaps, 1);
  /* The release is owed: the client wants to write BUFFER_RELEASE. */
  assert_true(hr_session_want_write(sp.p.c));
  frun(&sp);
  assert_true(atomic_load(&g.released));
  /* The session is still fine for more. */
  put_seg(&sp, "b", &g, 10);
  hr_tensor *t = get_lease(&sp, "b");
  /* The connection ends with the segment held: the server lets go. */
  store_clear(&sp.p.st);
  hr_session_terminate(sp.p.s, 0);
  assert_true(atomic_load(&g.released));
  assert_int_equal(((const int32_t *)hr_tensor_buffer(t, 0))[9], 27);
  /* The tensor outlives the session that brought it. */
  sp_close(&sp);
  hr_tensor_unref(t);
  assert_int_equal(tu_fd_count(), sp.fds0);
}

static void test_fallback_after_failed_map(void **state) {
  (void)state;
  shm_pair sp;
  seg g;
  result r;
  sp_open_seg(&sp, 1, &g, 100, &r);
  sp.fail_map = 1;
  assert_int_not_equal(get(&sp, "a", &r), 0);
  assert_int_equal(r.rec.wire_error, HR_WIRE_DEVICE_UNAVAILABLE);
  assert_int_equal(r.rec.wire_error_sent, 1);
  assert_memory_equal(r.rec.fallback, "shm:", 4);
  result_clear(&r);
  /* The server read the ERROR: frames from now on. */
  assert_int_equal(get(&sp, "a", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
  assert_non_null(strstr(sp.p.last_srv_rec.fallback, "could not map"));
  assert_int_equal(((const int32_t *)hr_tensor_buffer(r.t, 0))[99], 297);
  assert_int_equal(sp.p.errors_c, 0);
  result_clear(&r);
  sp_close_check(&sp);
  assert_true(atomic_load(&g.released));
}

static void test_no_fd(void **state) {
  (void)state;
  shm_pair sp;
  seg g;
  result r;
  sp_open_seg(&sp, 1, &g, 100, &r);
  sp.mode = M_DROP;
  assert_int_not_equal(get(&sp, "a", &r), 0);
  assert_int_equal(r.rec.wire_error, HR_WIRE_PROTOCOL_VIOLATION);
  assert_int_equal(r.rec.wire_error_sent, 1);
  assert_int_equal(sp.maps, 0);
  /* The ERROR on the stream released the server's lease too. */
  store_clear(&sp.p.st);
  assert_true(atomic_load(&g.released));
  result_clear(&r);
  sp_close_check(&sp);
}

static void test_two_fds(void **state) {
  (void)state;
  shm_pair sp;
  seg g;
  result r;
  sp_open_seg(&sp, 1, &g, 100, &r);
  sp.mode = M_TWO;
  assert_int_not_equal(get(&sp, "a", &r), 0);
  assert_int_equal(sp.p.errors_c, 1);
  assert_int_equal(sp.p.last_err_c, HR_WIRE_PROTOCOL_VIOLATION);
  assert_int_equal(sp.p.err_sent_c, 1);
  assert_false(hr_session_want_read(sp.p.c));
  assert_int_equal(sp.maps, 0);
  assert_int_equal(sp.closes, 2);
  result_clear(&r);
  sp_close_check(&sp);
  assert_true(atomic_load(&g.released));
}

static void test_stray_fd(void **state) {
  (void)state;
  int fds0 = tu_fd_count();
  for (int client_shm = 0; client_shm < 2; client_shm++) {
    shm_pair sp;
    sp_open(&sp, client_shm);
    sp.mode = M_STRAY;
    frun(&sp);
    assert_int_equal(sp.p.errors_c, 1);
    assert_int_equal(sp.p.last_err_c, HR_WIRE_PROTOCOL_VIOLATION);
    assert_false(hr_session_want_read(sp.p.c));
    assert_int_equal(sp.closes, 1);
    sp_close(&sp);
  }
  assert_int_equal(tu_fd_count(), fds0);
}

static void test_fd_to_server(void **state) {
  (void)state;
  shm_pair sp;
  sp_open(&sp, 1);
  frun(&sp);
  int fd = memfd_create("to-server", MFD_CLOEXEC);
  assert_int_equal(hr_session_recv_fds(sp.p.s, &fd, 1, 12, 0), 0);
  assert_int_equal(sp.p.errors_s, 1);
  assert_int_equal(sp.p.last_err_s, HR_WIRE_PROTOCOL_VIOLATION);
  assert_int_equal(sp.closes, 1);
  sp_close_check(&sp);
}

/* A server without SHM_DATA_PLANE from the client never sends an fd. */
static void test_not_negotiated(void **state) {
  (void)state;
  shm_pair sp;
  seg g;
  result r;
  sp_open_seg(&sp, 0, &g, 100, &r);
  assert_int_equal(get(&sp, "a", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
  assert_int_equal(sp.maps, 0);
  result_clear(&r);
  sp_close(&sp);
}

/* A client that keeps every segment mapped (or a hostile one that never
 * sends BUFFER_RELEASE) cannot make the server keep leases without
 * bound: past HR_SHM_LEASES_MAX leases on the connection the answers go
 * as frames, and say why; once the client lets go of some, SHM again. */
static void test_lease_bound(void **state) {
  (void)state;
  shm_pair sp;
  seg g;
  result r;
  sp_open_seg(&sp, 1, &g, 16, &r);
  sp.heap_map = 1;
  enum { N = HR_SHM_LEASES_MAX };
  hr_tensor **held = calloc(N, sizeof *held);
  assert_non_null(held);
  for (int i = 0; i < N; i++)
    held[i] = get_lease(&sp, "a");
  /* One more: frames, with the reason on the server's record. */
  assert_int_equal(get(&sp, "a", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
  assert_int_equal(sp.p.last_srv_rec.data_plane, HR_PLANE_FRAMES);
  assert_non_null(strstr(sp.p.last_srv_rec.fallback, "not released"));
  assert_int_equal(((const int32_t *)hr_tensor_buffer(r.t, 0))[15], 45);
  result_clear(&r);
  /* The client drops one: its BUFFER_RELEASE frees a lease. */
  release(&sp, held[N / 2]);
  held[N / 2] = NULL;
  release(&sp, get_lease(&sp, "a"));
  for (int i = 0; i < N; i++)
    hr_tensor_unref(held[i]);
  free(held);
  frun(&sp);
  assert_int_equal(sp.unmaps, sp.maps);
  store_drop(&sp);
  /* Every lease ended with its release: the segment is free. */
  assert_true(atomic_load(&g.released));
  sp_close_check(&sp);
}

/* Leases taken out of stream order (GETs answered late, the last first)
 * end with their own stream's BUFFER_RELEASE, each releasing its own
 * segment and no other. */
static void test_leases_out_of_order(void **state) {
  (void)state;
  shm_pair sp;
  seg g[3];
  result r[3];
  const char *keys[3] = {"a", "b", "c"};
  sp_open(&sp, 1);
  for (int i = 0; i < 3; i++)
    put_seg(&sp, keys[i], &g[i], 32 + (uint64_t)i);
  frun(&sp);
  memset(r, 0, sizeof r);
  sp.p.st.defer = 1;
  for (int i = 0; i < 3; i++)
    start_get(&sp, keys[i], &r[i]);
  frun(&sp);
  assert_int_equal(sp.p.st.npending, 3);
  hr_srv_get *first = sp.p.st.pending[0];
  sp.p.st.pending[0] = sp.p.st.pending[2];
  sp.p.st.pending[2] = first;
  store_answer_pending(&sp.p.st);
  frun(&sp);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(r[i].calls, 1);
    assert_int_equal(r[i].status, 0);
    assert_int_equal(r[i].rec.data_plane, HR_PLANE_SHM);
  }
  /* Only the leases hold the segments now. */
  store_drop(&sp);
  int order[3] = {1, 2, 0};
  for (int k = 0; k < 3; k++) {
    result_clear(&r[order[k]]);
    frun(&sp);
    for (int i = 0; i < 3; i++) {
      int gone = 0;
      for (int j = 0; j <= k; j++)
        gone |= order[j] == i;
      assert_int_equal(atomic_load(&g[i].released), gone);
    }
  }
  sp_close_check(&sp);
}

/* Leases released out of order make room that later ones reuse (the
 * array is compacted): none is lost or kept twice, so the segment goes
 * exactly with the last release. */
static void test_leases_reused(void **state) {
  (void)state;
  shm_pair sp;
  seg g;
  result r;
  sp_open_seg(&sp, 1, &g, 16, &r);
  enum { N = 40, ROUNDS = 3 };
  hr_tensor *held[N], *kept[ROUNDS];
  for (int round = 0; round < ROUNDS; round++) {
    for (int i = 0; i < N; i++)
      held[i] = get_lease(&sp, "a");
    /* Every other one, then the rest but the last, which stays; each
     * batch of BUFFER_RELEASEs goes at once. */
    for (int i = 0; i < N; i += 2)
      hr_tensor_unref(held[i]);
    frun(&sp);
    for (int i = 1; i < N - 1; i += 2)
      hr_tensor_unref(held[i]);
    frun(&sp);
    kept[round] = held[N - 1];
  }
  /* Only the kept ones' leases hold the segment now. */
  store_drop(&sp);
  for (int round = 0; round < ROUNDS; round++) {
    assert_false(atomic_load(&g.released));
    release(&sp, kept[round]);
  }
  assert_true(atomic_load(&g.released));
  assert_int_equal(sp.unmaps, sp.maps);
  sp_close_check(&sp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_release),
      cmocka_unit_test(test_fallback_after_failed_map),
      cmocka_unit_test(test_no_fd),
      cmocka_unit_test(test_two_fds),
      cmocka_unit_test(test_stray_fd),
      cmocka_unit_test(test_fd_to_server),
      cmocka_unit_test(test_not_negotiated),
      cmocka_unit_test(test_lease_bound),
      cmocka_unit_test(test_leases_out_of_order),
      cmocka_unit_test(test_leases_reused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
