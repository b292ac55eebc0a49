/*
 * libFuzzer target: a whole server hr_session fed arbitrary client bytes.
 *
 * The provider is an hr_store (engine/store) holding a few small tensors
 * under the keys the wire-v1 vectors ask for, in several layouts, so that
 * selection, transcoding (dense and sparse sources), regions, shards,
 * composites, PUT (into the store, with REPLACE) and LIST all run.  The
 * input drives the session through fuzz_session.h's commands; its mode
 * byte's high bits are this target's:
 *   bit 5 GETs are answered later, by the action commands (else at once)
 *   bit 6 the session has a registry, so SESSION_JOIN and tokens run
 *   bit 7 the store refuses PUT (TENSOR_PUT not advertised)
 * Action commands (op 7, arg): arg & 7 =
 *   0 hr_session_shutdown   1 hr_session_terminate
 *   2 answer pending GET (arg >> 3) (from the store)
 *   3 fail pending GET (arg >> 3) with NOT_FOUND
 *   4 answer every pending GET
 *   5 a fabric command (fuzz_session.h: fz_fabric_action)
 *   6 connection (arg >> 3) % 4 becomes the current one; one past the
 *     last opens a new connection to the same server (same settings and
 *     registry: with bit 6 its CLIENT_HELLO may carry SESSION_JOIN and
 *     become a lane, shards then travel on every lane)
 *   7 a descriptor arrives with the next (u8 + 1) bytes
 *     (hr_session_recv_fds: a server must refuse it), which are fed
 *
 * The host is a Unix-socket one: it sets fd_close, so the server
 * advertises SHM_DATA_PLANE, and the fixtures "t", "w", "big", "img" and
 * "x" lie in (fake) shared segments, as do the tensors PUT lands in
 * (callbacks.alloc_tensor).  A client that offers SHM_DATA_PLANE gets
 * them as segments (hr_session_pull_fd, checked to be one of ours) under
 * a lease that its BUFFER_RELEASE or ERROR ends; descriptors are numbers,
 * never real files (the session only passes them on).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hurray/store.h>

#include "fuzz_session.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MODE_DEFER_GET 0x20
#define MODE_REGISTRY 0x40
#define MODE_NO_PUT 0x80

#define MAX_PENDING 32

/* The fake descriptors: segments SEG_FD + i (the fixtures, then PUT
 * landings), and the one a client sends (IN_FD, refused). */
#define SEG_FD 500
#define SEG_LAST 999
#define IN_FD 2000

typedef struct server {
  hr_store *store;
  hr_provider inner; /* the store's provider */
  int defer;
  hr_srv_get *pending[MAX_PENDING];
  hr_session *pending_s[MAX_PENDING]; /* the connection it came on */
  int npending;
  int next_seg;   /* the next segment's descriptor */
  int in_fd_open; /* IN_FD handed to a session and not closed yet */
  /* What the connections share. */
  hr_settings set;
  hr_session_callbacks cb;
  hr_provider prov;
  hr_registry *reg;
} server;

/* The driver is every session's user_data; the target hangs off it. */
static server *srv_of(void *ud) { return ((fz_driver *)ud)->target; }

static int on_get(hr_session *s, hr_srv_get *g, void *ud) {
  server *sv = ud;
  if (sv->defer && sv->npending < MAX_PENDING) {
    sv->pending_s[sv->npending] = s;
    sv->pending[sv->npending++] = g;
    return 0;
  }
  return sv->inner.on_get(s, g, sv->inner.user_data);
}

static void on_get_cancel(hr_session *s, hr_srv_get *g, void *ud) {
  server *sv = ud;
  (void)s;
  for (int i = 0; i < sv->npending; i++)
    if (sv->pending[i] == g) {
      sv->npending--;
      sv->pending[i] = sv->pending[sv->npending];
      sv->pending_s[i] = sv->pending_s[sv->npending];
      return;
    }
}

/* ---- the fake Unix-socket host ------------------------------------------- */

static void fd_close(hr_session *s, int fd, void *ud) {
  server *sv = srv_of(ud);
  (void)s;
  if (fd != IN_FD || !sv->in_fd_open)
    hr_fuzz_fail("fd_close of a descriptor the server never received");
  sv->in_fd_open = 0;
}

static void check_fd(fz_driver *d, int fd) {
  server *sv = d->target;
  if (fd < SEG_FD || fd >= sv->next_seg)
    hr_fuzz_fail("hr_session_pull_fd: not one of our segments");
}

/* Declares t's buffers a segment of its own (a fake descriptor; offset
 * 64 so that byte_offset is not always 0). */
static void segment(server *sv, hr_tensor *t) {
  if (t == NULL || hr_tensor_member_count(t) > 0 || sv->next_seg > SEG_LAST)
    return;
  if (hr_tensor_set_segment(t, sv->next_seg, 64) == 0)
    sv->next_seg++;
}

/* PUT lands in a segment, as a host with a shared arena does. */
static int alloc_tensor(hr_session *s, const hr_descriptor *desc,
                        unsigned min_alignment_log2, hr_tensor **out,
                        void *ud) {
  server *sv = srv_of(ud);
  (void)s;
  (void)min_alignment_log2;
  int rv = hr_tensor_alloc(out, desc, 0, NULL);
  if (rv == 0)
    segment(sv, *out);
  return rv;
}

static int on_put_begin(hr_session *s, const hr_put_info *info,
                        uint32_t *wire_error, void *ud) {
  server *sv = ud;
  return sv->inner.on_put_begin(s, info, wire_error, sv->inner.user_data);
}

static int on_put_commit(hr_session *s, const hr_put_info *info, hr_tensor *t,
                         uint32_t *wire_error, void *ud) {
  server *sv = ud;
  return sv->inner.on_put_commit(s, info, t, wire_error, sv->inner.user_data);
}

static void on_put_abort(hr_session *s, const hr_put_info *info, void *ud) {
  server *sv = ud;
  sv->inner.on_put_abort(s, info, sv->inner.user_data);
}

static int on_list(hr_session *s, const hr_list_request *req,
                   int (*emit)(void *emit_ctx, const hr_list_entry *e),
                   void *emit_ctx, int *more, void *ud) {
  server *sv = ud;
  return sv->inner.on_list(s, req, emit, emit_ctx, more, sv->inner.user_data);
}

/* Takes pending GET i off the list and answers it. */
static void answer(fz_driver *d, server *sv, int i, int fail) {
  hr_srv_get *g = sv->pending[i];
  hr_session *s = sv->pending_s[i];
  sv->npending--;
  sv->pending[i] = sv->pending[sv->npending];
  sv->pending_s[i] = sv->pending_s[sv->npending];
  int rv = fail ? hr_get_fail(g, HR_WIRE_NOT_FOUND, "fuzz: refused")
                : sv->inner.on_get(s, g, sv->inner.user_data);
  /* Errors of another connection's session are that session's. */
  if (s == d->s)
    fz_check_rv(d, rv);
}

/* Connection i becomes the current one; one past the last opens it. */
static void connection(fz_driver *d, server *sv, unsigned i) {
  int n = d->nconns ? d->nconns : 1;
  if ((int)i == n && n < FZ_MAX_CONNS) {
    hr_session *s = NULL;
    if (hr_session_new(&s, HR_ROLE_SERVER, &sv->set, &sv->cb, &sv->prov, d,
                       d->now, &d->mem) != 0)
      hr_fuzz_fail("hr_session_new failed");
    if (sv->reg && hr_session_set_registry(s, sv->reg) != 0)
      hr_fuzz_fail("hr_session_set_registry failed");
    if (fz_conn_add(d, s) < 0)
      hr_fuzz_fail("fz_conn_add refused a connection");
  }
  fz_conn_switch(d, (int)i);
}

/* A descriptor from the client: the server takes it over and must close
 * it (a protocol violation), whatever the bytes that come with it. */
static void recv_fd(fz_driver *d, server *sv) {
  size_t len = (size_t)fz_take(&d->in) + 1;
  int fd = IN_FD;
  sv->in_fd_open = 1;
  int rv = hr_session_recv_fds(d->s, &fd, 1, len, d->now);
  if (sv->in_fd_open)
    hr_fuzz_fail("hr_session_recv_fds: the server kept a descriptor");
  fz_check_rv(d, rv);
  if (rv < 0 && !d->dead)
    hr_fuzz_fail("hr_session_recv_fds: a non-fatal error");
  fz_feed(d, len);
}

static void action(fz_driver *d, unsigned arg) {
  server *sv = d->target;
  switch (arg & 7) {
  case 0: fz_check_rv(d, hr_session_shutdown(d->s, d->now)); break;
  case 1: hr_session_terminate(d->s, d->now); break;
  case 2:
  case 3:
    if (sv->npending > 0)
      answer(d, sv, (int)((arg >> 3) % (unsigned)sv->npending), (arg & 7) == 3);
    break;
  case 4:
    while (sv->npending > 0 && !d->dead)
      answer(d, sv, 0, 0);
    break;
  case 5: fz_fabric_action(d, fz_take(&d->in)); break;
  case 6: connection(d, sv, (arg >> 3) % FZ_MAX_CONNS); break;
  default: recv_fd(d, sv); break;
  }
}

/* Deterministic "randomness" for the registry's tokens. */
static int fake_random(void *buf, size_t len, void *ud) {
  uint8_t *b = buf;
  uint32_t *ctr = ud;
  for (size_t i = 0; i < len; i++)
    b[i] = (uint8_t)(++*ctr * 131u);
  return 0;
}

static void add(hr_store *st, const char *key, hr_tensor *t) {
  if (t == NULL)
    hr_fuzz_fail("a fixture tensor could not be built");
  if (hr_store_put(st, key, strlen(key), t, HR_PUT_REPLACE) != 0)
    hr_fuzz_fail("hr_store_put failed");
  hr_tensor_unref(t);
}

/* A fixture that lies in a shared segment. */
static void add_seg(server *sv, const char *key, hr_tensor *t) {
  segment(sv, t);
  add(sv->store, key, t);
}

/* The tensors, under the keys of the vectors' requests (t, w, weights,
 * big, img, x, model/...) and a few more. */
static void fill(server *sv) {
  hr_store *st = sv->store;
  add_seg(sv, "t",
      fz_dense(HR_ELEM_FLOAT32, HR_LAYOUT_ROW_MAJOR, 2, (uint64_t[]){8, 6},
               NULL, 1));
  add_seg(sv, "w",
      fz_dense(HR_ELEM_FLOAT32, HR_LAYOUT_COLUMN_MAJOR, 2,
               (uint64_t[]){8, 8}, NULL, 2));
  add(st, "weights",
      fz_dense(HR_ELEM_FLOAT64, HR_LAYOUT_ROW_MAJOR, 2, (uint64_t[]){4, 4},
               NULL, 3));
  add(st, "layer.0/w",
      fz_dense(HR_ELEM_FLOAT16, HR_LAYOUT_ROW_MAJOR, 3,
               (uint64_t[]){2, 3, 4}, NULL, 4));
  add_seg(sv, "big",
      fz_dense(HR_ELEM_UINT8, HR_LAYOUT_ROW_MAJOR, 2, (uint64_t[]){32, 16},
               NULL, 5));
  add_seg(sv, "img",
      fz_dense(HR_ELEM_UINT8, HR_LAYOUT_ROW_MAJOR, 2, (uint64_t[]){16, 8},
               NULL, 6));
  add_seg(sv, "x", fz_csr(6, 5));
  hr_layout_params tp;
  memset(&tp, 0, sizeof(tp));
  tp.tile[0] = 4;
  tp.tile[1] = 4;
  add(st, "tiled",
      fz_dense(HR_ELEM_INT16, HR_LAYOUT_TILED, 2, (uint64_t[]){6, 5}, &tp, 7));
  hr_tensor *a = fz_dense(HR_ELEM_FLOAT32, HR_LAYOUT_ROW_MAJOR, 2,
                          (uint64_t[]){3, 4}, NULL, 8);
  hr_tensor *b = fz_dense(HR_ELEM_INT8, HR_LAYOUT_ROW_MAJOR, 1,
                          (uint64_t[]){4}, NULL, 9);
  add(st, "pair", fz_tuple(a, b));
  hr_tensor_unref(a);
  hr_tensor_unref(b);
  add(st, "model/bias",
      fz_dense(HR_ELEM_BFLOAT16, HR_LAYOUT_ROW_MAJOR, 1, (uint64_t[]){8},
               NULL, 10));
  add(st, "model/weight", fz_csr(4, 8));
  add(st, "empty",
      fz_dense(HR_ELEM_FLOAT32, HR_LAYOUT_ROW_MAJOR, 2, (uint64_t[]){0, 3},
               NULL, 11));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_driver d;
  fz_init(&d, data, size, HR_ROLE_SERVER);
  server sv;
  memset(&sv, 0, sizeof(sv));
  sv.defer = (d.mode & MODE_DEFER_GET) != 0;
  sv.next_seg = SEG_FD;

  hr_store_config sc;
  hr_store_config_default(&sc);
  sc.allow_put = !(d.mode & MODE_NO_PUT);
  sc.allow_replace = 1;
  sc.max_bytes = 1 << 20;
  if (hr_store_new(&sv.store, &sc, NULL) != 0)
    hr_fuzz_fail("hr_store_new failed");
  fill(&sv);
  hr_store_provider(sv.store, &sv.inner);

  hr_provider *prov = &sv.prov;
  prov->size = sizeof(*prov);
  prov->user_data = &sv;
  prov->on_get = on_get;
  prov->on_get_cancel = on_get_cancel;
  prov->on_list = on_list;
  if (sc.allow_put) {
    prov->on_put_begin = on_put_begin;
    prov->on_put_commit = on_put_commit;
    prov->on_put_abort = on_put_abort;
  }

  fz_settings(&d, &sv.set);
  sv.set.rdma_destination = 1;
  sv.cb = fz_callbacks();
  sv.cb.fd_close = fd_close;
  sv.cb.alloc_tensor = alloc_tensor;
  d.action = action;
  d.target = &sv;
  d.check_fd = check_fd;
  if (hr_session_new(&d.s, HR_ROLE_SERVER, &sv.set, &sv.cb, prov, &d, d.now,
                     &d.mem) != 0)
    hr_fuzz_fail("hr_session_new failed");
  uint32_t ctr = 0;
  if (d.mode & MODE_REGISTRY) {
    if (hr_registry_new(&sv.reg, fake_random, &ctr, &d.mem) != 0 ||
        hr_session_set_registry(d.s, sv.reg) != 0)
      hr_fuzz_fail("the registry could not be set up");
  }
  fz_run(&d);
  /* Every pending GET was cancelled by the session's teardown. */
  if (sv.npending != 0)
    hr_fuzz_fail("a GET outlived its session without on_get_cancel");
  hr_registry_del(sv.reg);
  hr_store_del(sv.store);
  return 0;
}
