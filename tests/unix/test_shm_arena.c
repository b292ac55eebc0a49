/*
 * Shared arenas and the client's mapping cache (SHM data plane, wire-v1
 * § 14), over a Unix socket through the engine:
 *  - the arena itself: placement (granule, buffer alignments up to 2 MiB,
 *    § 7.1 inside a region), zeroed contents, first-fit reuse, growth by
 *    segments, the cap, an empty segment given back, the owner going
 *    before its tensors;
 *  - a store with an arena: GETs hand out the arena's fd with the tensor's
 *    byte_offset; the client maps the arena once for all of them;
 *  - release before reuse: a replaced tensor's region is not reused while
 *    a client holds it, and is after BUFFER_RELEASE; a client process
 *    killed without releasing frees it;
 *  - scope: a token bounded to prefixes never receives the arena's fd
 *    (frames for a small tensor, a private segment for a large one);
 *  - the cache's bound, and hostile segments (not a file, too small, an
 *    offset past the end), through the engine and the cache directly.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/auth.h>
#include <hurray/client.h>
#include <hurray/shm.h>

#include "common/test_util.h"
#include "hr_shm_io.h"
#include "sock_dir.h"
#include "tc.h"
#include "tl.h"

static int setup(void **state) {
  return sock_dir_setup(state, "hr_arena");
}

static int teardown(void **state) {
  return sock_dir_teardown(state);
}

/* Mappings of memfd `name` in this process with permissions `perms`
 * ("r--s": a client's, "rw-s": a server's own). */
static int maps_of(const char *name, const char *perms) {
  FILE *fp = fopen("/proc/self/maps", "r");
  char line[512], want[96];
  int n = 0;
  if (!fp)
    return -1;
  snprintf(want, sizeof want, "memfd:%s", name);
  while (fgets(line, sizeof line, fp))
    if (strstr(line, want) && strstr(line, perms))
      n++;
  fclose(fp);
  return n;
}

/* The name of the mapping that holds `p` ("" when anonymous). */
static void map_name_of(const void *p, char *out, size_t cap) {
  FILE *fp = fopen("/proc/self/maps", "r");
  char line[512];
  out[0] = 0;
  if (!fp)
    return;
  while (fgets(line, sizeof line, fp)) {
    unsigned long lo, hi;
    int off = 0;
    if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &off) < 2)
      continue;
    if ((uintptr_t)p >= lo && (uintptr_t)p < hi) {
      snprintf(out, cap, "%s", off ? line + off : "");
      break;
    }
  }
  fclose(fp);
}

/* A heap tensor of n bytes, byte i = seed + i. */
static hr_tensor *heap_bytes(uint64_t n, uint8_t seed) {
  hr_descriptor d = tu_bytes_desc(n, 6, HR_DEV_CPU);
  hr_tensor *t;
  assert_int_equal(hr_tensor_alloc(&t, &d, 0, NULL), 0);
  uint8_t *p = hr_tensor_buffer(t, 0);
  for (uint64_t i = 0; i < n; i++)
    p[i] = (uint8_t)(seed + i);
  return t;
}

static int bytes_are(hr_tensor *t, uint64_t n, uint8_t seed) {
  const uint8_t *p = hr_tensor_buffer(t, 0);
  if (hr_tensor_descriptor(t)->buffers[0].size_bytes != n)
    return 0;
  for (uint64_t i = 0; i < n; i++)
    if (p[i] != (uint8_t)(seed + i))
      return 0;
  return 1;
}

static uint64_t seg_off(hr_tensor *t) {
  uint64_t off = UINT64_MAX;
  assert_true(hr_tensor_segment(t, NULL, &off));
  return off;
}

/* Whether `p` lies in a mapping of memfd `name` ("hurray-arena"). */
static int in_memfd(const void *p, const char *name) {
  char line[256], want[96];
  map_name_of(p, line, sizeof line);
  snprintf(want, sizeof want, "memfd:%s", name);
  return strstr(line, want) != NULL;
}

/* ---- the arena --------------------------------------------------------- */

static void test_arena_alloc(void **state) {
  hr_shm_arena_config ac;
  hr_shm_arena *a;
  hr_shm_arena_stats st;
  hr_tensor *t[8];
  (void)state;

  hr_shm_arena_config_default(&ac);
  assert_int_equal(hr_shm_arena_new(&a, &ac, NULL), HR_ERR_INVALID_ARGUMENT);
  ac.max_bytes = 8u << 20;
  ac.segment_bytes = 1u << 20;
  assert_int_equal(hr_shm_arena_new(&a, &ac, NULL), 0);

  /* 100 bytes: one 128-byte region at 0; the next starts at 128. */
  hr_descriptor d = tu_bytes_desc(100, 0, HR_DEV_CPU);
  assert_int_equal(hr_shm_arena_alloc(a, &t[0], &d), 0);
  assert_int_equal(seg_off(t[0]), 0);
  assert_int_equal(hr_shm_arena_alloc(a, &t[1], &d), 0);
  assert_int_equal(seg_off(t[1]), 128);
  /* Contents start zeroed; the buffer is the segment's byte. */
  for (int i = 0; i < 100; i++)
    assert_int_equal(((uint8_t *)hr_tensor_buffer(t[1], 0))[i], 0);
  assert_true(hr_shm_arena_owns(a, t[0]));

  /* A page-aligned buffer starts on a page; a 2 MiB-aligned one in a
   * segment of its own (this one is 1 MiB). */
  d = tu_bytes_desc(5000, 12, HR_DEV_CPU);
  assert_int_equal(hr_shm_arena_alloc(a, &t[2], &d), 0);
  assert_int_equal(seg_off(t[2]), 4096);
  assert_int_equal((uintptr_t)hr_tensor_buffer(t[2], 0) % 4096, 0);
  d = tu_bytes_desc(64, 21, HR_DEV_CPU);
  assert_int_equal(hr_shm_arena_alloc(a, &t[3], &d), 0);
  assert_int_equal(seg_off(t[3]) % (1u << 21), 0);
  assert_int_equal((uintptr_t)hr_tensor_buffer(t[3], 0) % (1u << 21), 0);

  /* Several buffers: § 7.1 placement inside the region (CSR). */
  {
    hr_tensor *ref = tl_sparse(HR_LAYOUT_SPARSE_CSR, 4, 4, 3,
                               (const uint32_t[]){0, 1, 3},
                               (const uint32_t[]){1, 2, 0},
                               (const float[]){1.f, 2.f, 3.f}, 1);
    hr_tensor *c;
    const hr_descriptor *cd = hr_tensor_descriptor(ref);
    assert_int_equal(hr_shm_arena_copy(a, &c, ref), 0);
    uint64_t pos = seg_off(c);
    for (unsigned k = 0; k < cd->buffer_count; k++) {
      uint64_t al = (uint64_t)1 << cd->buffers[k].alignment_log2;
      pos = (pos + al - 1) & ~(al - 1);
      assert_int_equal((uintptr_t)hr_tensor_buffer(c, k) -
                           (uintptr_t)hr_tensor_buffer(c, 0),
                       pos - seg_off(c));
      assert_memory_equal(hr_tensor_buffer(c, k), hr_tensor_buffer(ref, k),
                          cd->buffers[k].size_bytes);
      pos += cd->buffers[k].size_bytes;
    }
    hr_tensor_unref(c);
    hr_tensor_unref(ref);
  }

  /* Free then reuse: first fit gives the same place back, zeroed. */
  memset(hr_tensor_buffer(t[1], 0), 0xAB, 100);
  hr_tensor_unref(t[1]);
  d = tu_bytes_desc(90, 0, HR_DEV_CPU);
  assert_int_equal(hr_shm_arena_alloc(a, &t[1], &d), 0);
  assert_int_equal(seg_off(t[1]), 128);
  for (int i = 0; i < 90; i++)
    assert_int_equal(((uint8_t *)hr_tensor_buffer(t[1], 0))[i], 0);

  /* Large regions are punched out of the memfd when freed and read back
   * as zeros. */
  d = tu_bytes_desc(600u << 10, 12, HR_DEV_CPU);
  assert_int_equal(hr_shm_arena_alloc(a, &t[4], &d), 0);
  uint64_t big_off = seg_off(t[4]);
  memset(hr_tensor_buffer(t[4], 0), 0xCD, 600u << 10);
  hr_tensor_unref(t[4]);
  assert_int_equal(hr_shm_arena_alloc(a, &t[4], &d), 0);
  assert_int_equal(seg_off(t[4]), big_off);
  for (uint64_t i = 0; i < (600u << 10); i += 511)
    assert_int_equal(((uint8_t *)hr_tensor_buffer(t[4], 0))[i], 0);

  /* A tensor larger than a segment gets one of its own; the cap holds. */
  hr_shm_arena_stats_get(a, &st);
  uint32_t segs = st.segments;
  d = tu_bytes_desc(3u << 20, 6, HR_DEV_CPU);
  assert_int_equal(hr_shm_arena_alloc(a, &t[5], &d), 0);
  hr_shm_arena_stats_get(a, &st);
  assert_int_equal(st.segments, segs + 1);
  assert_true(st.segment_bytes <= ac.max_bytes);
  d = tu_bytes_desc(7u << 20, 6, HR_DEV_CPU);
  assert_int_equal(hr_shm_arena_alloc(a, &t[6], &d), HR_ERR_LIMIT);
  /* Its segment goes back to the kernel once empty. */
  hr_tensor_unref(t[5]);
  hr_shm_arena_stats_get(a, &st);
  assert_int_equal(st.segments, segs);
  assert_int_equal(st.live, 5);

  /* The owner may go first: the tensors keep their segments. */
  hr_shm_arena_del(a);
  assert_int_equal(((uint8_t *)hr_tensor_buffer(t[1], 0))[0], 0);
  for (int i = 0; i < 5; i++)
    hr_tensor_unref(t[i]);
}

/* ---- over the socket ------------------------------------------------- */

static void arena_server(tl_env *env, tl_server *ts, const char *url,
                         hr_auth *auth) {
  hr_store_config sc;
  hr_provider prov;
  hr_store_config_default(&sc);
  sc.shm_arena_bytes = 64u << 20;
  tl_server_start(env, ts, NULL, &sc);
  hr_store_provider(ts->store, &prov);
  if (auth)
    assert_int_equal(hr_auth_wrap(auth, &prov, &prov), 0);
  assert_int_equal(hr_engine_listen(ts->e, url, &prov, NULL), 0);
}

/* Stores heap_bytes(n, seed) under `key` in the server's store. */
static void put_bytes(tl_server *ts, const char *key, uint64_t n,
                      uint8_t seed) {
  hr_tensor *t = heap_bytes(n, seed);
  tl_put(ts, key, t);
  hr_tensor_unref(t);
}

static int arena_live_is(void *ud) {
  void **p = ud;
  hr_shm_arena_stats st;
  hr_shm_arena_stats_get(p[0], &st);
  return st.live == (uint32_t)(uintptr_t)p[1];
}

static void wait_live(tl_env *env, hr_shm_arena *a, uint32_t n) {
  void *p[2] = {a, (void *)(uintptr_t)n};
  assert_true(tl_run(env, arena_live_is, p, TL_WAIT_MS));
}

/* GETs of arena tensors: SHM, the arena's fd, one client mapping for all
 * of them (read-only), and the cache reused by the next GETs. */
static void test_arena_get(void **state) {
  fixture *f = *state;
  int fds0 = tu_fd_count();
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_engine *ce = tl_engine(env, NULL);
  tc_conn c;
  tc_res r[3];
  const char *keys[3] = {"a", "b", "c"};
  uint64_t sizes[3] = {100, 4096, 70000};

  arena_server(env, &ts, f->url, NULL);
  for (int i = 0; i < 3; i++)
    put_bytes(&ts, keys[i], sizes[i], (uint8_t)(i * 40));
  int client_maps0 = maps_of("hurray-arena", "r--s");
  tc_open(env, ce, f->url, &c);
  uint8_t *base = NULL;
  for (int i = 0; i < 3; i++) {
    hr_tensor *st;
    assert_int_equal(tc_get_key(&c, keys[i], &r[i]), 0);
    assert_int_equal(r[i].rec.data_plane, HR_PLANE_SHM);
    assert_true(bytes_are(r[i].t, sizes[i], (uint8_t)(i * 40)));
    assert_int_equal(hr_store_get(ts.store, keys[i], 1, &st), 0);
    assert_true(hr_shm_arena_owns(hr_store_arena(ts.store), st));
    /* Every tensor lies at its byte_offset in one mapping of the arena. */
    uint8_t *b = (uint8_t *)hr_tensor_buffer(r[i].t, 0) - seg_off(st);
    if (i == 0)
      base = b;
    assert_ptr_equal(b, base);
    hr_tensor_unref(st);
    assert_true(in_memfd(hr_tensor_buffer(r[i].t, 0), "hurray-arena"));
  }
  assert_int_equal(maps_of("hurray-arena", "r--s"), client_maps0 + 1);
  /* Released: the idle mapping stays and the next GET reuses it. */
  for (int i = 0; i < 3; i++)
    tc_res_clear(&r[i]);
  assert_int_equal(tc_get_key(&c, "b", &r[0]), 0);
  assert_ptr_equal((uint8_t *)hr_tensor_buffer(r[0].t, 0) - 128, base);
  assert_int_equal(maps_of("hurray-arena", "r--s"), client_maps0 + 1);
  tc_res_clear(&r[0]);
  tc_close(&c);
  tl_engine_finish(env, ce);
  /* The client engine is gone: its idle mapping with it. */
  assert_int_equal(maps_of("hurray-arena", "r--s"), client_maps0);
  tl_server_stop(env, &ts);
  tl_free(env);
  assert_int_equal(tu_fd_count(), fds0);
}

/* ---- PUTs land in the arena -------------------------------------------- */

/* The store's provider with its commit watched: the tensor it was given. */
typedef struct spy {
  hr_provider inner;
  hr_tensor *committed; /* borrowed: compared by address only */
  int commits;
} spy;

static int spy_commit(hr_session *s, const hr_put_info *info, hr_tensor *t,
                      uint32_t *wire_error, void *ud) {
  spy *p = ud;

  p->committed = t;
  p->commits++;
  return p->inner.on_put_commit(s, info, t, wire_error, p->inner.user_data);
}

static int spy_begin(hr_session *s, const hr_put_info *info,
                     uint32_t *wire_error, void *ud) {
  spy *p = ud;
  return p->inner.on_put_begin(s, info, wire_error, p->inner.user_data);
}

static void spy_abort(hr_session *s, const hr_put_info *info, void *ud) {
  spy *p = ud;
  p->inner.on_put_abort(s, info, p->inner.user_data);
}

static int spy_alloc(hr_session *s, const hr_descriptor *d, unsigned a,
                     hr_tensor **out, void *ud) {
  spy *p = ud;
  return p->inner.on_put_alloc(s, d, a, out, p->inner.user_data);
}

static int spy_get(hr_session *s, hr_srv_get *g, void *ud) {
  spy *p = ud;
  return p->inner.on_get(s, g, p->inner.user_data);
}

/* The spy's provider; user_data is the spy. */
static const hr_provider spy_provider = {
    .size = sizeof(hr_provider),
    .on_get = spy_get,
    .on_put_begin = spy_begin,
    .on_put_commit = spy_commit,
    .on_put_abort = spy_abort,
    .on_put_alloc = spy_alloc,
};

/* A PUT into a store with an arena, over TCP (where the engine would land
 * it in heap memory) and over the Unix socket (where it would land in a
 * segment of its own): the landing tensor is allocated in the arena, the
 * commit gets it and the store keeps that very tensor (no copy at the
 * commit), and a GET over SHM serves it from the arena's segment.  A PUT
 * larger than the arena's room still succeeds, in ordinary memory. */
static void test_arena_put_lands(void **state) {
  fixture *f = *state;
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_engine *ce = tl_engine(env, NULL);
  hr_store_config sc;
  hr_provider prov;
  hr_shm_arena *arena;
  hr_shm_arena_stats as;
  spy sp;
  tc_conn tcp, ux;
  tc_res r;
  const char *keys[2] = {"tcp", "unix"};
  hr_listener *tl;
  char turl[64];

  hr_store_config_default(&sc);
  sc.shm_arena_bytes = 1u << 20;
  sc.allow_put = 1;
  tl_server_start(env, &ts, NULL, &sc);
  arena = hr_store_arena(ts.store);
  memset(&sp, 0, sizeof sp);
  hr_store_provider(ts.store, &sp.inner);
  assert_non_null(sp.inner.on_put_alloc);
  prov = spy_provider;
  prov.user_data = &sp;
  assert_int_equal(hr_engine_listen(ts.e, f->url, &prov, NULL), 0);
  assert_int_equal(hr_engine_listen(ts.e, "127.0.0.1:0", &prov, &tl), 0);
  snprintf(turl, sizeof turl, "127.0.0.1:%d", hr_listener_port(tl));
  tc_open(env, ce, turl, &tcp);
  tc_open(env, ce, f->url, &ux);

  for (int i = 0; i < 2; i++) {
    hr_tensor *t = heap_bytes(70000, (uint8_t)(i * 31)), *st;
    tc_conn *c = i == 0 ? &tcp : &ux;
    int commits = sp.commits;

    assert_int_equal(tc_put(c, keys[i], 0, t, &r), 0);
    tc_res_clear(&r);
    hr_tensor_unref(t);
    assert_int_equal(hr_store_get(ts.store, keys[i], strlen(keys[i]), &st),
                     0);
    assert_true(hr_shm_arena_owns(arena, st));
    assert_true(bytes_are(st, 70000, (uint8_t)(i * 31)));
    /* The stored tensor is the one the bytes landed in. */
    assert_int_equal(sp.commits, commits + 1);
    assert_ptr_equal(st, sp.committed);
    hr_tensor_unref(st);
    /* Served over SHM from the arena. */
    assert_int_equal(tc_get_key(&ux, keys[i], &r), 0);
    assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
    assert_true(bytes_are(r.t, 70000, (uint8_t)(i * 31)));
    assert_true(in_memfd(hr_tensor_buffer(r.t, 0), "hurray-arena"));
    tc_res_clear(&r);
  }
  /* Two tensors live in the arena, no third (no copy was ever made). */
  hr_shm_arena_stats_get(arena, &as);
  assert_int_equal(as.live, 2);

  /* Larger than the arena: lands and stays in ordinary memory. */
  {
    hr_tensor *big = heap_bytes(2u << 20, 7), *st;
    assert_int_equal(tc_put(&ux, "big", 0, big, &r), 0);
    tc_res_clear(&r);
    hr_tensor_unref(big);
    assert_int_equal(hr_store_get(ts.store, "big", 3, &st), 0);
    assert_false(hr_shm_arena_owns(arena, st));
    assert_true(bytes_are(st, 2u << 20, 7));
    hr_tensor_unref(st);
  }
  tc_close(&tcp);
  tc_close(&ux);
  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  tl_free(env);
}

/* A provider's on_put_alloc that fails, or gives a tensor that does not
 * fit the descriptor, refuses the PUT with RESOURCE_EXHAUSTED; one that
 * declines (HR_ERR_NOT_FOUND) lets the session allocate. */
typedef struct bad_alloc {
  hr_store *store;
  int mode; /* 0: fail, 1: too small, 2: decline */
} bad_alloc;

static int bad_put_begin(hr_session *s, const hr_put_info *info,
                         uint32_t *wire_error, void *ud) {
  (void)s;
  (void)info;
  (void)wire_error;
  (void)ud;
  return 0;
}

static int bad_put_commit(hr_session *s, const hr_put_info *info,
                          hr_tensor *t, uint32_t *wire_error, void *ud) {
  bad_alloc *b = ud;
  (void)s;
  if (hr_store_put(b->store, info->key, info->key_len, t, HR_PUT_REPLACE))
    *wire_error = HR_WIRE_INTERNAL;
  return 0;
}

static void bad_put_abort(hr_session *s, const hr_put_info *info, void *ud) {
  (void)s;
  (void)info;
  (void)ud;
}

static int bad_get(hr_session *s, hr_srv_get *g, void *ud) {
  (void)s;
  (void)ud;
  hr_get_fail(g, HR_WIRE_NOT_FOUND, "no");
  return 0;
}

static int bad_put_alloc(hr_session *s, const hr_descriptor *d, unsigned a,
                         hr_tensor **out, void *ud) {
  bad_alloc *b = ud;
  hr_descriptor small;
  (void)s;
  if (b->mode == 0)
    return HR_ERR_NOMEM;
  if (b->mode == 2)
    return HR_ERR_NOT_FOUND;
  small = *d;
  small.shape[0] = 1;
  small.buffers[0].size_bytes = 1;
  return hr_tensor_alloc(out, &small, a, NULL);
}

/* The refusing provider; user_data is the bad_alloc. */
static const hr_provider bad_provider = {
    .size = sizeof(hr_provider),
    .on_get = bad_get,
    .on_put_begin = bad_put_begin,
    .on_put_commit = bad_put_commit,
    .on_put_abort = bad_put_abort,
    .on_put_alloc = bad_put_alloc,
};

static void test_put_alloc_refusals(void **state) {
  fixture *f = *state;
  tl_env *env = tl_new(TL_EPOLL);
  hr_engine *se = tl_engine(env, NULL), *ce = tl_engine(env, NULL);
  hr_store_config sc;
  hr_provider prov;
  bad_alloc b;
  tc_conn c;
  tc_res r;
  hr_tensor *t = heap_bytes(5000, 3), *st;

  hr_store_config_default(&sc);
  assert_int_equal(hr_store_new(&b.store, &sc, NULL), 0);
  prov = bad_provider;
  prov.user_data = &b;
  assert_int_equal(hr_engine_listen(se, f->url, &prov, NULL), 0);
  tc_open(env, ce, f->url, &c);
  for (b.mode = 0; b.mode < 2; b.mode++) {
    assert_int_equal(tc_put(&c, "k", 0, t, &r), HR_ERR_REMOTE);
    assert_int_equal(r.rec.wire_error, HR_WIRE_RESOURCE_EXHAUSTED);
    tc_res_clear(&r);
  }
  assert_int_equal(hr_store_get(b.store, "k", 1, &st), HR_ERR_NOT_FOUND);
  b.mode = 2;
  assert_int_equal(tc_put(&c, "k", 0, t, &r), 0);
  tc_res_clear(&r);
  assert_int_equal(hr_store_get(b.store, "k", 1, &st), 0);
  assert_true(bytes_are(st, 5000, 3));
  hr_tensor_unref(st);
  /* The connection outlived the refusals. */
  assert_int_equal(tc_ping(&c, &r), 0);
  tc_close(&c);
  tl_engine_finish(env, ce);
  tl_engine_finish(env, se);
  hr_store_del(b.store);
  hr_tensor_unref(t);
  tl_free(env);
}

/* A replaced tensor's region is reused only after the client released
 * it. */
static void test_arena_release_reuse(void **state) {
  fixture *f = *state;
  tl_env *env = tl_new(TL_LIBEVENT);
  tl_server ts;
  hr_engine *ce = tl_engine(env, NULL);
  tc_conn c;
  tc_res r;
  hr_tensor *st;
  hr_shm_arena *a;

  arena_server(env, &ts, f->url, NULL);
  a = hr_store_arena(ts.store);
  put_bytes(&ts, "k", 1000, 1);
  assert_int_equal(hr_store_get(ts.store, "k", 1, &st), 0);
  uint64_t old_off = seg_off(st);
  hr_tensor_unref(st);

  tc_open(env, ce, f->url, &c);
  assert_int_equal(tc_get_key(&c, "k", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  /* Replaced while the client reads it: the old region stays leased. */
  put_bytes(&ts, "k", 1000, 2);
  put_bytes(&ts, "other", 1000, 3);
  tl_spin(env, 50);
  wait_live(env, a, 3);
  assert_int_equal(hr_store_get(ts.store, "other", 5, &st), 0);
  assert_int_not_equal(seg_off(st), old_off);
  hr_tensor_unref(st);
  assert_true(bytes_are(r.t, 1000, 1));
  /* BUFFER_RELEASE: the region is free, and the next tensor takes it. */
  tc_res_clear(&r);
  wait_live(env, a, 2);
  put_bytes(&ts, "third", 1000, 4);
  assert_int_equal(hr_store_get(ts.store, "third", 5, &st), 0);
  assert_int_equal(seg_off(st), old_off);
  hr_tensor_unref(st);
  /* The client sees the new tensor under "k". */
  assert_int_equal(tc_get_key(&c, "k", &r), 0);
  assert_true(bytes_are(r.t, 1000, 2));
  tc_res_clear(&r);
  tc_close(&c);
  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  tl_free(env);
}

/* A client process killed while it holds an arena tensor: the
 * connection's end frees the region. */
static void test_arena_client_dies(void **state) {
  fixture *f = *state;
  int go[2], done[2];
  char b = 0;

  /* Fork before any thread exists; the child waits for the server. */
  assert_int_equal(pipe(go), 0);
  assert_int_equal(pipe(done), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    hr_client *cl;
    hr_get_opts o;
    hr_tensor *t;
    hr_transfer_record rec;
    close(go[1]);
    close(done[0]);
    if (read(go[0], &b, 1) != 1)
      _exit(2);
    if (hr_client_connect(&cl, f->url, NULL, NULL, NULL) != 0)
      _exit(3);
    memset(&o, 0, sizeof o);
    o.key = (const uint8_t *)"k";
    o.key_len = 1;
    if (hr_client_get(cl, &o, &t, &rec) != 0 ||
        rec.data_plane != HR_PLANE_SHM || !bytes_are(t, 3000, 7))
      _exit(4);
    b = 1;
    if (write(done[1], &b, 1) != 1)
      _exit(5);
    for (;;)
      pause(); /* killed holding the tensor */
  }
  close(go[0]);
  close(done[1]);
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  arena_server(env, &ts, f->url, NULL);
  hr_shm_arena *a = hr_store_arena(ts.store);
  put_bytes(&ts, "k", 3000, 7);
  assert_int_equal(write(go[1], &b, 1), 1);
  /* Serve until the child has its tensor. */
  fcntl(done[0], F_SETFL, O_NONBLOCK);
  int got = 0;
  for (int i = 0; i < TL_WAIT_MS / 10 && !got; i++) {
    tl_spin(env, 10);
    got = read(done[0], &b, 1) == 1;
  }
  assert_true(got);
  assert_int_equal(hr_store_remove(ts.store, "k", 1), 0);
  tl_spin(env, 20);
  wait_live(env, a, 1); /* the lease holds it */
  kill(pid, SIGKILL);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
  wait_live(env, a, 0);
  close(go[1]);
  close(done[0]);
  tl_server_stop(env, &ts);
  tl_free(env);
}

/* A token bounded to prefixes never gets the arena's fd. */
static void test_arena_narrow_token(void **state) {
  fixture *f = *state;
  static const char tokens[] = "full ro\nnarrow ro pub/\n";
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_engine *ce = tl_engine(env, NULL);
  hr_auth *auth;
  char why[128];
  tc_conn cf, cn;
  tc_res r;
  hr_settings set;

  assert_int_equal(hr_auth_new(&auth, NULL), 0);
  assert_int_equal(
      hr_auth_load(auth, tokens, sizeof tokens - 1, why, sizeof why), 0);
  arena_server(env, &ts, f->url, auth);
  put_bytes(&ts, "pub/small", 500, 9);
  put_bytes(&ts, "pub/large", 2u << 20, 11);
  put_bytes(&ts, "secret/x", 500, 13);

  hr_settings_default(&set);
  set.auth_token = (const uint8_t *)"full";
  set.auth_token_len = 4;
  tc_connect(env, ce, f->url, &cf, &set);
  assert_true(tc_wait_up(&cf, TL_WAIT_MS));
  assert_int_equal(tc_get_key(&cf, "pub/small", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_true(in_memfd(hr_tensor_buffer(r.t, 0), "hurray-arena"));
  tc_res_clear(&r);

  set.auth_token = (const uint8_t *)"narrow";
  set.auth_token_len = 6;
  tc_connect(env, ce, f->url, &cn, &set);
  assert_true(tc_wait_up(&cn, TL_WAIT_MS));
  /* Small: a view with no segment, so frames. */
  assert_int_equal(tc_get_key(&cn, "pub/small", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
  assert_true(bytes_are(r.t, 500, 9));
  tc_res_clear(&r);
  /* Large: a private segment holding only this tensor. */
  assert_int_equal(tc_get_key(&cn, "pub/large", &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_true(bytes_are(r.t, 2u << 20, 11));
  assert_true(in_memfd(hr_tensor_buffer(r.t, 0), "hurray-segment"));
  tc_res_clear(&r);
  /* Out of scope as before. */
  assert_int_not_equal(tc_get_key(&cn, "secret/x", &r), 0);
  assert_int_equal(r.rec.wire_error, HR_WIRE_UNAUTHORIZED);
  tc_res_clear(&r);
  tc_close(&cn);
  tc_close(&cf);
  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  hr_auth_del(auth);
  tl_free(env);
}

/* The cache: a segment received twice is mapped once; idle mappings are
 * bounded (shm_map_cache = 2); mappings in use are not. */
static void test_cache_bound(void **state) {
  fixture *f = *state;
  int fds0 = tu_fd_count();
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_engine_config ecfg;
  tc_conn c;
  tc_res r[5], again;
  char key[8];

  tl_server_start(env, &ts, NULL, NULL);
  sock_dir_listen(f, &ts);
  hr_engine_config_default(&ecfg);
  ecfg.shm_map_cache = 2;
  hr_engine *ce = tl_engine(env, &ecfg);
  for (int i = 0; i < 5; i++) {
    hr_tensor *h = heap_bytes(8192, (uint8_t)i), *t;
    assert_int_equal(hr_shm_tensor_copy(&t, h, NULL), 0);
    snprintf(key, sizeof key, "s%d", i);
    tl_put(&ts, key, t);
    hr_tensor_unref(t);
    hr_tensor_unref(h);
  }
  int m0 = maps_of("hurray-segment", "r--s");
  tc_open(env, ce, f->url, &c);
  for (int i = 0; i < 5; i++) {
    snprintf(key, sizeof key, "s%d", i);
    assert_int_equal(tc_get_key(&c, key, &r[i]), 0);
    assert_int_equal(r[i].rec.data_plane, HR_PLANE_SHM);
    assert_true(bytes_are(r[i].t, 8192, (uint8_t)i));
  }
  /* The same segment again while in use: the same mapping. */
  assert_int_equal(tc_get_key(&c, "s3", &again), 0);
  assert_ptr_equal(hr_tensor_buffer(again.t, 0), hr_tensor_buffer(r[3].t, 0));
  tc_res_clear(&again);
  assert_int_equal(maps_of("hurray-segment", "r--s"), m0 + 5);
  for (int i = 0; i < 5; i++)
    tc_res_clear(&r[i]);
  assert_int_equal(maps_of("hurray-segment", "r--s"), m0 + 2);
  /* A kept one is found again (the last released is the newest). */
  assert_int_equal(tc_get_key(&c, "s4", &again), 0);
  assert_int_equal(maps_of("hurray-segment", "r--s"), m0 + 2);
  tc_res_clear(&again);
  tc_close(&c);
  tl_engine_finish(env, ce);
  assert_int_equal(maps_of("hurray-segment", "r--s"), m0);
  tl_server_stop(env, &ts);
  tl_free(env);
  assert_int_equal(tu_fd_count(), fds0);
}

/* Hostile segments over the socket: a descriptor that is not a file, a
 * sealed memfd smaller than the tensor, and a byte_offset past the
 * segment's end.  Each fails its GET and the next GET goes as frames. */
typedef struct hostile {
  int fd;
  void *buf;
} hostile;

static void hostile_release(void *ctx) {
  hostile *h = ctx;
  close(h->fd);
  free(h->buf);
  free(h);
}

static hr_tensor *hostile_tensor(int kind) {
  hostile *h = calloc(1, sizeof *h);
  hr_descriptor d = tu_bytes_desc(8192, 6, HR_DEV_CPU);
  hr_tensor *t;
  uint64_t off = 0;
  assert_non_null(h);
  h->buf = calloc(1, 8192);
  if (kind == 0) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    close(p[1]);
    h->fd = p[0];
  } else {
    h->fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(h->fd >= 0);
    assert_int_equal(ftruncate(h->fd, kind == 1 ? 4096 : 16384), 0);
    assert_int_equal(fcntl(h->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    if (kind == 2)
      off = 1u << 20; /* past the end of a 16 KiB file */
  }
  assert_int_equal(hr_tensor_wrap(&t, &d, &h->buf, hostile_release, h, NULL),
                   0);
  assert_int_equal(hr_tensor_set_segment(t, h->fd, off), 0);
  return t;
}

static void test_hostile_segments(void **state) {
  fixture *f = *state;
  int fds0 = tu_fd_count();
  tl_env *env = tl_new(TL_EPOLL);
  tl_server ts;
  hr_engine *ce = tl_engine(env, NULL);
  tc_conn c;
  tc_res r;
  static const char *why[3] = {"regular file", "smaller", "smaller"};

  tl_server_start(env, &ts, NULL, NULL);
  sock_dir_listen(f, &ts);
  for (int kind = 0; kind < 3; kind++) {
    hr_tensor *t = hostile_tensor(kind);
    tl_put(&ts, "h", t);
    hr_tensor_unref(t);
    tc_open(env, ce, f->url, &c);
    assert_int_not_equal(tc_get_key(&c, "h", &r), 0);
    assert_int_equal(r.rec.wire_error, HR_WIRE_DEVICE_UNAVAILABLE);
    assert_non_null(strstr(r.rec.fallback, why[kind]));
    tc_res_clear(&r);
    assert_int_equal(tc_get_key(&c, "h", &r), 0);
    assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
    tc_res_clear(&r);
    tc_close(&c);
  }
  tl_engine_finish(env, ce);
  tl_server_stop(env, &ts);
  tl_free(env);
  assert_int_equal(tu_fd_count(), fds0);
}

/* The cache itself: a cached entry is never a way around the size
 * check, a non-file is refused, an unsealed file is mapped per GET. */
static void test_cache_direct(void **state) {
  hr__shm_cache *c;
  hr__shm_cache_stats st;
  hr_shm_mapping m1, m2;
  char why[128];
  (void)state;

  assert_int_equal(hr__shm_cache_new(&c, -1, 4, 0), 0);
  int fd = memfd_create("direct", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 65536), 0);
  assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  assert_int_equal(pwrite(fd, "xyz", 3, 4096), 3);
  memset(&m1, 0, sizeof m1);
  assert_int_equal(hr__shm_cache_map(c, fd, 4096, 3, 1, &m1, why, sizeof why),
                   0);
  assert_memory_equal(m1.base, "xyz", 3);
  /* The same file through another descriptor: a hit. */
  int fd2 = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  assert_int_equal(hr__shm_cache_map(c, fd2, 4096, 3, 1, &m2, why, sizeof why),
                   0);
  assert_ptr_equal(m1.base, m2.base);
  hr__shm_cache_stats_get(c, &st);
  assert_int_equal(st.hits, 1);
  assert_int_equal(st.misses, 1);
  /* Past the end of a cached file: refused, not served from the entry. */
  hr_shm_mapping bad;
  memset(&bad, 0, sizeof bad);
  assert_int_equal(
      hr__shm_cache_map(c, fd2, 65536 - 2, 3, 1, &bad, why, sizeof why), -1);
  assert_non_null(strstr(why, "smaller"));
  assert_int_equal(
      hr__shm_cache_map(c, fd2, UINT64_MAX - 1, 3, 1, &bad, why, sizeof why),
      -1);
  /* Not a file. */
  int p[2];
  assert_int_equal(pipe(p), 0);
  assert_int_equal(hr__shm_cache_map(c, p[0], 0, 1, 1, &bad, why, sizeof why),
                   -1);
  close(p[0]);
  close(p[1]);
  /* Unsealed: refused (it could shrink under us). */
  int u = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  assert_int_equal(ftruncate(u, 4096), 0);
  assert_int_equal(hr__shm_cache_map(c, u, 0, 16, 1, &bad, why, sizeof why),
                   -1);
  assert_non_null(strstr(why, "sealed"));
  close(u);
  assert_null(bad.ctx);
  /* One entry, in use twice; released once it stays in use. */
  m1.unmap(m1.ctx);
  hr__shm_cache_stats_get(c, &st);
  assert_int_equal(st.entries, 1);
  assert_int_equal(st.idle, 0);
  /* The engine goes first; the mapping in use stays readable and its
   * release frees the rest. */
  hr__shm_cache_close(c);
  close(fd);
  close(fd2);
  assert_memory_equal(m2.base, "xyz", 3);
  m2.unmap(m2.ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_arena_alloc),
      cmocka_unit_test_setup_teardown(test_arena_get, setup, teardown),
      cmocka_unit_test_setup_teardown(test_arena_release_reuse, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_arena_client_dies, setup, teardown),
      cmocka_unit_test_setup_teardown(test_arena_narrow_token, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_bound, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hostile_segments, setup, teardown),
      cmocka_unit_test(test_cache_direct),
      cmocka_unit_test_setup_teardown(test_arena_put_lands, setup, teardown),
      cmocka_unit_test_setup_teardown(test_put_alloc_refusals, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
