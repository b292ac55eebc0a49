/*
 * Device memory across a process boundary (issue 9 "GPU buffers over
 * IPC", issue 6 "IPC export/import"; ADR-018 § 6).
 *
 *  - The device layer: shareable memory exported as a file descriptor and
 *    imported by another process (a child started from this program),
 *    byte for byte; ordinary memory is not exportable; hostile
 *    descriptors (a pipe, an unsealed or short memfd) are refused.
 *  - The engine over a Unix socket: a client in another process asking
 *    for the device gets the server's exported memory (data_plane SHM, no
 *    staging) holding exactly what a slow producer wrote: the server waits
 *    for the producer's event (P1 over IPC) without blocking its loop.  A
 *    producer that lies (no event) is shown to deliver stale bytes, so the
 *    test fails if the engine skips the wait.
 *  - BUFFER_RELEASE: the server keeps the memory until the client drops
 *    its device tensor, and lets go of it then, on a live connection.
 *  - Fallbacks: a client that cannot import answers ERROR and the next
 *    GET gets frames; ordinary device memory, and a client asking for the
 *    host, get the host-staged frames.
 *
 * Usage: test_gpu_ipc [backend]  (default "sim"; 77 when the backend is
 * unavailable).  With `--import FD SIZE SEED` or `--client URL N`, the
 * program is the child process of the tests above.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/handoff.h>
#include <hurray/shm.h>
#include <hurray/tensor.h>

#include "gpu_testutil.h"
#include "tc.h"

extern char **environ;

/* The producer's "kernel" time: a GET made right after it started is
 * answered (or would be, without the wait) long before it ends, even on a
 * loaded machine under a sanitizer. */
#define GATE_NS 800000000ull
#define SEED_OLD 1u
#define SEED_NEW 2u

static const char *self_exe;

static int is_sim(void) { return strcmp(gt_backend, "sim") == 0; }

/* Host memory the device can copy to and from. */
static hr_gpu_buf *host_buf(hr_gpu *g, uint64_t n) {
  hr_gpu_caps caps;
  hr_gpu_buf *b = NULL;
  if (hr_gpu_query(g, &caps) != 0)
    return NULL;
  if (caps.flags & HR_GPU_CAP_PINNED) {
    if (hr_gpu_buf_alloc(g, HR_GPU_MEM_PINNED, n, &b) != 0)
      return NULL;
  } else {
    void *p = malloc(n);
    if (!p || hr_gpu_buf_wrap_host(g, p, n, &b) != 0) {
      free(p);
      return NULL;
    }
  }
  return b;
}

static void host_buf_del(hr_gpu_buf *b) {
  void *p = hr_gpu_buf_host_ptr(b);
  int wrapped = hr_gpu_buf_kind(b) == HR_GPU_MEM_HOST;
  hr_gpu_buf_del(b);
  if (wrapped)
    free(p);
}

/* Reads `n` bytes of device buffer `b` (after `ev` when non-NULL) and
 * compares them with the pattern of `seed`: 1 when equal, 0 when not, -1
 * on failure. */
static int device_is(hr_gpu *g, hr_gpu_buf *b, hr_gpu_event *ev, uint64_t n,
                     unsigned seed) {
  hr_gpu_stream *s = NULL;
  hr_gpu_buf *out = host_buf(g, n);
  uint8_t *want = malloc(n);
  int rv = -1;
  if (!out || !want || hr_gpu_stream_new(g, &s) != 0)
    goto done;
  memset(hr_gpu_buf_host_ptr(out), 0, n);
  gt_fill(want, n, seed);
  if (ev && hr_gpu_stream_wait_event(s, ev) != 0)
    goto done;
  if (hr_gpu_copy_async(s, out, 0, b, 0, n) != 0 || hr_gpu_stream_sync(s) != 0)
    goto done;
  rv = memcmp(hr_gpu_buf_host_ptr(out), want, n) == 0;
done:
  hr_gpu_stream_del(s);
  if (out)
    host_buf_del(out);
  free(want);
  return rv;
}

/* Runs this program as a child with `args` (NULL-terminated, after the
 * backend); returns its pid. */
static pid_t spawn_child(const char *const *args) {
  const char *argv[8];
  size_t n = 0;
  argv[n++] = self_exe;
  argv[n++] = gt_backend;
  while (*args && n < 7)
    argv[n++] = *args++;
  argv[n] = NULL;
  pid_t pid;
  assert_int_equal(posix_spawn(&pid, self_exe, NULL, NULL, (char **)argv,
                               environ),
                   0);
  return pid;
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

static int child_status(pid_t pid) {
  int st;
  pid_t r;
  do {
    r = waitpid(pid, &st, 0);
  } while (r < 0 && errno == EINTR);
  assert_int_equal(r, pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- the device layer -------------------------------------------------- */

/* Child: imports `fd` (inherited) and checks its bytes. */
static int child_import(int fd, uint64_t n, unsigned seed) {
  hr_gpu *g;
  if (gt_open(&g, 0, 0) != 0)
    return 2;
  hr_gpu_buf *b = NULL;
  int rv = hr_gpu_ipc_mem_import_fd(g, fd, n, &b);
  close(fd);
  if (rv != 0) {
    printf("child: import: %s\n", hr_strerror(rv));
    hr_gpu_del(g);
    return 3;
  }
  int eq = device_is(g, b, NULL, n, seed);
  hr_gpu_buf_del(b);
  hr_gpu_del(g);
  return eq == 1 ? 0 : 4;
}

static hr_gpu *open_dev(uint64_t delay_ns) {
  hr_gpu *g;
  assert_int_equal(gt_open(&g, is_sim() ? delay_ns : 0, 0), 0);
  return g;
}

/* Fills shareable memory with the pattern of `seed`. */
static void fill_dev(hr_gpu *g, hr_gpu_buf *dev, uint64_t n, unsigned seed) {
  hr_gpu_stream *s;
  hr_gpu_buf *h = host_buf(g, n);
  assert_non_null(h);
  gt_fill(hr_gpu_buf_host_ptr(h), n, seed);
  assert_int_equal(hr_gpu_stream_new(g, &s), 0);
  assert_int_equal(hr_gpu_copy_async(s, dev, 0, h, 0, n), 0);
  assert_int_equal(hr_gpu_stream_sync(s), 0);
  hr_gpu_stream_del(s);
  host_buf_del(h);
}

static void fd_export_import(void **state) {
  (void)state;
  hr_gpu *g = open_dev(0);
  hr_gpu_caps caps;
  assert_int_equal(hr_gpu_query(g, &caps), 0);
  const uint64_t n = 300000; /* not a multiple of any page size */
  hr_gpu_buf *dev = NULL, *plain = NULL;
  if (!(caps.flags & HR_GPU_CAP_IPC_FD)) {
    /* Reported as not supported, and the IPC query offers nothing: the
     * producer must stage through the host. */
    assert_int_equal(hr_gpu_buf_alloc_shareable(g, n, &dev),
                     HR_ERR_UNSUPPORTED);
    if (caps.device_tag != HR_DEV_CPU &&
        !(caps.flags & HR_GPU_CAP_IPC_MEM))
      assert_int_equal(hr_gpu_sync_modes(g, HR_HANDOFF_IPC), 0);
    assert_int_equal(hr_gpu_del(g), 0);
    skip();
  }
  assert_int_equal(hr_gpu_sync_modes(g, HR_HANDOFF_IPC) &
                       HR_SYNC_BIT(HR_SYNC_PRODUCER_SYNCED),
                   HR_SYNC_BIT(HR_SYNC_PRODUCER_SYNCED));
  assert_int_equal(hr_gpu_buf_alloc_shareable(g, n, &dev), 0);
  assert_int_equal(hr_gpu_buf_size(dev), n);
  fill_dev(g, dev, n, 5);
  int fd = -2;
  assert_int_equal(hr_gpu_ipc_mem_export_fd(dev, &fd), 0);
  assert_true(fd >= 0);
  /* Ordinary memory is not exportable this way. */
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, 64, &plain), 0);
  int pfd = 7;
  assert_int_equal(hr_gpu_ipc_mem_export_fd(plain, &pfd), HR_ERR_UNSUPPORTED);
  assert_int_equal(pfd, -1);
  hr_gpu_buf_del(plain);
  /* Another process imports it (the descriptor inherited without
   * CLOEXEC, as SCM_RIGHTS would deliver it). */
  int cfd = dup(fd);
  assert_true(cfd >= 0);
  char a_fd[16], a_n[24];
  snprintf(a_fd, sizeof a_fd, "%d", cfd);
  snprintf(a_n, sizeof a_n, "%llu", (unsigned long long)n);
  const char *args[] = {"--import", a_fd, a_n, "5", NULL};
  pid_t pid = spawn_child(args);
  close(cfd);
  assert_int_equal(child_status(pid), 0);
  /* And this one too; the import is not re-exported. */
  hr_gpu_buf *imp;
  assert_int_equal(hr_gpu_ipc_mem_import_fd(g, fd, n, &imp), 0);
  assert_int_equal(device_is(g, imp, NULL, n, 5), 1);
  assert_int_equal(hr_gpu_ipc_mem_export_fd(imp, &pfd), HR_ERR_UNSUPPORTED);
  hr_gpu_buf_del(imp);
  /* Arguments. */
  assert_int_equal(hr_gpu_ipc_mem_import_fd(g, -1, n, &imp),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_gpu_ipc_mem_import_fd(g, fd, 0, &imp),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_gpu_ipc_mem_export_fd(NULL, &pfd),
                   HR_ERR_INVALID_ARGUMENT);
  hr_gpu_buf_del(dev);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* Hostile descriptors: a pipe, and a memfd shorter than asked, are
 * refused by every backend with fd IPC (the simulated device and lavapipe
 * check them; a real driver refuses a handle it did not make).  An
 * unsealed memfd is the simulated device's case (a real driver's opaque
 * handle cannot be inspected: see gpu.h). */
static void fd_hostile(void **state) {
  (void)state;
  hr_gpu *g = open_dev(0);
  hr_gpu_caps caps;
  assert_int_equal(hr_gpu_query(g, &caps), 0);
  if (!(caps.flags & HR_GPU_CAP_IPC_FD)) {
    assert_int_equal(hr_gpu_del(g), 0);
    skip();
  }
  hr_gpu_buf *b = NULL;
  int p[2];
  assert_int_equal(pipe(p), 0);
  assert_int_equal(hr_gpu_ipc_mem_import_fd(g, p[0], 4096, &b), HR_ERR_PROTO);
  close(p[0]);
  close(p[1]);
  int m = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  assert_true(m >= 0);
  assert_int_equal(ftruncate(m, 8192), 0);
  if (is_sim()) {
    /* Unsealed: the exporter could shrink it under the mapping. */
    assert_int_equal(hr_gpu_ipc_mem_import_fd(g, m, 4096, &b), HR_ERR_PROTO);
  }
  /* Shorter than asked. */
  assert_int_equal(fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  assert_int_equal(hr_gpu_ipc_mem_import_fd(g, m, 1u << 20, &b),
                   HR_ERR_PROTO);
  if (is_sim()) {
    /* Sealed and long enough: accepted. */
    assert_int_equal(hr_gpu_ipc_mem_import_fd(g, m, 8192, &b), 0);
    hr_gpu_buf_del(b);
  }
  close(m);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* ---- the engine over a Unix socket ------------------------------------- */

/* A served device tensor in shareable memory: OLD, then a slow producer
 * writing NEW on its own stream, its end recorded in `ev`. */
typedef struct served {
  hr_gpu *g;
  hr_gpu_stream *P;
  hr_gpu_buf *dev, *newb;
  hr_gpu_event *ev;
  atomic_int released;
} served;

static void served_release(void *ctx) {
  atomic_fetch_add(&((served *)ctx)->released, 1);
}

static void sleep_gate(void *arg) {
  (void)arg;
  hr__test_sleep(GATE_NS);
}

static hr_descriptor bytes_desc(uint64_t n, uint8_t tag) {
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_UINT8;
  d.rank = 1;
  d.shape[0] = n;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  d.buffers[0].size_bytes = n;
  d.buffers[0].device_tag = tag;
  return d;
}

/* Starts the producer; `shareable` picks the memory; `slow` gates the
 * write of NEW.  Returns the tensor (with the event unless `lie`). */
static hr_tensor *produce(served *sv, hr_gpu *g, uint64_t n, int shareable,
                          int slow, int lie) {
  memset(sv, 0, sizeof *sv);
  sv->g = g;
  hr_gpu_caps caps;
  assert_int_equal(hr_gpu_query(g, &caps), 0);
  assert_int_equal(hr_gpu_stream_new(g, &sv->P), 0);
  if (shareable)
    assert_int_equal(hr_gpu_buf_alloc_shareable(g, n, &sv->dev), 0);
  else
    assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, n, &sv->dev), 0);
  fill_dev(g, sv->dev, n, SEED_OLD);
  sv->newb = host_buf(g, n);
  assert_non_null(sv->newb);
  gt_fill(hr_gpu_buf_host_ptr(sv->newb), n, SEED_NEW);
  assert_int_equal(hr_gpu_event_new(g, 0, &sv->ev), 0);
  if (slow)
    assert_int_equal(hr_gpu_launch_host_fn(sv->P, sleep_gate, NULL), 0);
  assert_int_equal(hr_gpu_copy_async(sv->P, sv->dev, 0, sv->newb, 0, n), 0);
  assert_int_equal(hr_gpu_event_record(sv->ev, sv->P), 0);
  hr_descriptor d = bytes_desc(n, caps.device_tag);
  hr_tensor *t;
  assert_int_equal(hr_tensor_wrap_device(&t, &d, &sv->dev, lie ? NULL : sv->ev,
                                         served_release, sv, NULL),
                   0);
  return t;
}

static void served_free(served *sv) {
  assert_int_equal(hr_gpu_stream_sync(sv->P), 0);
  hr_gpu_stream_del(sv->P);
  hr_gpu_event_del(sv->ev);
  hr_gpu_buf_del(sv->dev);
  host_buf_del(sv->newb);
}

typedef struct net {
  char dir[64];
  char url[160];
  tl_env *env;
  tl_server srv;
  uint8_t devs[2];
} net;

/* A store-backed engine listening on a Unix socket, advertising the CPU
 * and the device `tag`. */
static void net_start(net *nt, uint8_t tag) {
  memset(nt, 0, sizeof *nt);
  strcpy(nt->dir, "/tmp/hr_gipc_XXXXXX");
  assert_non_null(mkdtemp(nt->dir));
  snprintf(nt->url, sizeof nt->url, "unix:%s/s.sock", nt->dir);
  nt->devs[0] = HR_DEV_CPU;
  nt->devs[1] = tag;
  nt->env = tl_new(TL_EPOLL);
  hr_engine_config ec;
  hr_engine_config_default(&ec);
  ec.session.devices = nt->devs;
  ec.session.device_count = 2;
  tl_server_start(nt->env, &nt->srv, &ec, NULL);
  hr_provider prov;
  hr_store_provider(nt->srv.store, &prov);
  assert_int_equal(hr_engine_listen(nt->srv.e, nt->url, &prov, NULL), 0);
}

static void net_stop(net *nt) {
  tl_server_stop(nt->env, &nt->srv);
  tl_free(nt->env);
  char path[200];
  snprintf(path, sizeof path, "%s/s.sock", nt->dir);
  unlink(path);
  rmdir(nt->dir);
}

/* A client engine on the same loop. */
static hr_engine *net_client(net *nt, tc_conn *c) {
  hr_engine_config ec;
  hr_engine_config_default(&ec);
  ec.session.devices = nt->devs;
  ec.session.device_count = 2;
  hr_engine *ce = tl_engine(nt->env, &ec);
  tc_open(nt->env, ce, nt->url, c);
  return ce;
}

static void get_opts_dev(hr_get_opts *o, const char *key, hr_gpu *g,
                         uint8_t sync) {
  hr_gpu_caps caps;
  assert_int_equal(hr_gpu_query(g, &caps), 0);
  tc_opts(o, key);
  o->preferred_device = caps.device_tag;
  o->device = g;
  o->device_sync = sync;
}

/* Child: GETs `key` into its own device over `url`; checks the plane,
 * the descriptor and NEW; exit codes say which check failed. */
static int child_client(const char *url, uint64_t n) {
  hr_gpu *g;
  if (gt_open(&g, 0, 0) != 0)
    return 2;
  hr_gpu_caps caps;
  hr_gpu_query(g, &caps);
  uint8_t devs[2] = {HR_DEV_CPU, caps.device_tag};
  tl_env *env = tl_new(TL_EPOLL);
  hr_engine_config ec;
  hr_engine_config_default(&ec);
  ec.session.devices = devs;
  ec.session.device_count = 2;
  hr_engine *ce = tl_engine(env, &ec);
  tc_conn c;
  tc_open(env, ce, url, &c);
  hr_get_opts o;
  tc_opts(&o, "dev");
  o.preferred_device = caps.device_tag;
  o.device = g;
  o.device_sync = HR_SYNC_PRODUCER_SYNCED;
  tc_res r;
  int code = 0, rc = tc_get(&c, &o, &r);
  if (rc) {
    printf("child: GET: %s (%s)\n", hr_strerror(rc), r.rec.message);
    code = 3;
  } else if (r.rec.data_plane != HR_PLANE_SHM || !hr_tensor_on_device(r.t)) {
    printf("child: plane %u, fallback '%s'\n", r.rec.data_plane,
           r.rec.fallback);
    code = 4;
  } else {
    const hr_descriptor *d = hr_tensor_descriptor(r.t);
    if (d->buffers[0].device_tag != caps.device_tag ||
        d->buffers[0].memory_class != HR_MEM_PINNED ||
        d->buffers[0].sync_mode != HR_SYNC_PRODUCER_SYNCED)
      code = 5;
    else if (device_is(g, hr_tensor_gpu_buf(r.t, 0), NULL, n, SEED_NEW) != 1)
      code = 6;
  }
  tc_res_clear(&r);
  tc_close(&c);
  tl_engine_finish(env, ce);
  tl_free(env);
  hr_gpu_del(g);
  return code;
}

static int child_exited(pid_t pid, int *code) {
  int st;
  pid_t r = waitpid(pid, &st, WNOHANG);
  if (r != pid)
    return 0;
  *code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return 1;
}

/* A client in another process gets the exported memory, after the slow
 * producer's event, while the server's loop keeps running. */
static void engine_cross_process(void **state) {
  (void)state;
  hr_gpu *g = open_dev(0);
  hr_gpu_caps caps;
  assert_int_equal(hr_gpu_query(g, &caps), 0);
  if (!(caps.flags & HR_GPU_CAP_IPC_FD)) {
    assert_int_equal(hr_gpu_del(g), 0);
    skip();
  }
  const uint64_t n = 1u << 20;
  net nt;
  net_start(&nt, caps.device_tag);
  served sv;
  hr_tensor *t = produce(&sv, g, n, 1, 1, 0);
  tl_put(&nt.srv, "dev", t);
  hr_tensor_unref(t);
  char a_n[24];
  snprintf(a_n, sizeof a_n, "%llu", (unsigned long long)n);
  const char *args[] = {"--client", nt.url, a_n, NULL};
  pid_t pid = spawn_child(args);
  int code = -1;
  for (int i = 0; i < 3000 && !child_exited(pid, &code); i++)
    tl_spin(nt.env, 10);
  if (code < 0) {
    kill(pid, SIGKILL);
    child_status(pid);
  }
  assert_int_equal(code, 0);
  assert_int_equal(hr_store_remove(nt.srv.store, "dev", 3), 0);
  /* The child dropped its tensor (BUFFER_RELEASE) and left: the lease is
   * gone with the connection at the latest. */
  for (int i = 0; i < 2000 && !atomic_load(&sv.released); i++)
    tl_spin(nt.env, 10);
  assert_int_equal(atomic_load(&sv.released), 1);
  net_stop(&nt);
  served_free(&sv);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* In one process: NEW after the producer's event; the memory stays with
 * the server until the client drops its tensor, then BUFFER_RELEASE frees
 * it on a live connection.  P2 asked: a complete event comes along. */
static void engine_release_and_sync(void **state) {
  (void)state;
  hr_gpu *g = open_dev(0);
  hr_gpu_caps caps;
  assert_int_equal(hr_gpu_query(g, &caps), 0);
  if (!(caps.flags & HR_GPU_CAP_IPC_FD)) {
    assert_int_equal(hr_gpu_del(g), 0);
    skip();
  }
  const uint64_t n = 200000;
  net nt;
  net_start(&nt, caps.device_tag);
  tc_conn c;
  hr_engine *ce = net_client(&nt, &c);
  served sv;
  hr_tensor *t = produce(&sv, g, n, 1, 1, 0);
  tl_put(&nt.srv, "dev", t);
  hr_tensor_unref(t);
  if (is_sim())
    assert_int_equal(hr_gpu_event_query(sv.ev), HR_ERR_WOULDBLOCK);
  hr_get_opts o;
  get_opts_dev(&o, "dev", g, HR_SYNC_EVENT);
  tc_res r;
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_int_equal(r.rec.device, caps.device_tag);
  assert_true(hr_tensor_on_device(r.t));
  const hr_descriptor *d = hr_tensor_descriptor(r.t);
  assert_int_equal(d->buffers[0].sync_mode, HR_SYNC_EVENT);
  assert_int_equal(d->buffers[0].memory_class, HR_MEM_PINNED);
  assert_non_null(hr_tensor_gpu_event(r.t));
  assert_int_equal(hr_gpu_event_query(hr_tensor_gpu_event(r.t)), 0);
  /* The producer had finished before the descriptor went. */
  assert_int_equal(hr_gpu_event_query(sv.ev), 0);
  assert_int_equal(device_is(g, hr_tensor_gpu_buf(r.t, 0), NULL, n, SEED_NEW),
                   1);
  /* Held by the lease while the client holds the tensor. */
  assert_int_equal(hr_store_remove(nt.srv.store, "dev", 3), 0);
  tl_spin(nt.env, 100);
  assert_int_equal(atomic_load(&sv.released), 0);
  tc_res_clear(&r);
  for (int i = 0; i < 2000 && !atomic_load(&sv.released); i++)
    tl_spin(nt.env, 10);
  assert_int_equal(atomic_load(&sv.released), 1);
  assert_false(c.closed);
  /* The connection still serves: again, P1. */
  t = NULL;
  served sv2;
  t = produce(&sv2, g, n, 1, 0, 0);
  tl_put(&nt.srv, "dev2", t);
  hr_tensor_unref(t);
  get_opts_dev(&o, "dev2", g, HR_SYNC_PRODUCER_SYNCED);
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_null(hr_tensor_gpu_event(r.t));
  assert_int_equal(device_is(g, hr_tensor_gpu_buf(r.t, 0), NULL, n, SEED_NEW),
                   1);
  tc_res_clear(&r);
  tc_close(&c);
  tl_engine_finish(nt.env, ce);
  net_stop(&nt);
  assert_int_equal(atomic_load(&sv2.released), 1);
  served_free(&sv);
  served_free(&sv2);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* The same tensor declared without its event (a lying P1 producer): the
 * descriptor goes at once and the client reads OLD.  Proves the test
 * above fails if the engine does not wait for the event. */
static void engine_stale_without_event(void **state) {
  (void)state;
  if (!is_sim())
    skip();
  hr_gpu *g = open_dev(0);
  hr_gpu_caps caps;
  assert_int_equal(hr_gpu_query(g, &caps), 0);
  const uint64_t n = 200000;
  net nt;
  net_start(&nt, caps.device_tag);
  tc_conn c;
  hr_engine *ce = net_client(&nt, &c);
  served sv;
  hr_tensor *t = produce(&sv, g, n, 1, 1, 1);
  tl_put(&nt.srv, "dev", t);
  hr_tensor_unref(t);
  hr_get_opts o;
  get_opts_dev(&o, "dev", g, HR_SYNC_PRODUCER_SYNCED);
  tc_res r;
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_int_equal(hr_gpu_event_query(sv.ev), HR_ERR_WOULDBLOCK);
  assert_int_equal(device_is(g, hr_tensor_gpu_buf(r.t, 0), NULL, n, SEED_OLD),
                   1);
  tc_res_clear(&r);
  assert_int_equal(hr_store_remove(nt.srv.store, "dev", 3), 0);
  tc_close(&c);
  tl_engine_finish(nt.env, ce);
  net_stop(&nt);
  served_free(&sv);
  assert_int_equal(hr_gpu_del(g), 0);
}

/* What goes as frames, staged through the host: ordinary device memory,
 * a client asking for the host, and everything after a client could not
 * import. */
static void engine_fallbacks(void **state) {
  (void)state;
  hr_gpu *g = open_dev(0);
  hr_gpu_caps caps;
  assert_int_equal(hr_gpu_query(g, &caps), 0);
  int fds0 = fd_count();
  const uint64_t n = 100000;
  net nt;
  net_start(&nt, caps.device_tag);
  tc_conn c;
  hr_engine *ce = net_client(&nt, &c);
  served plain, shared;
  hr_tensor *t = produce(&plain, g, n, 0, 0, 0);
  tl_put(&nt.srv, "plain", t);
  hr_tensor_unref(t);
  int ipc = (caps.flags & HR_GPU_CAP_IPC_FD) != 0;
  if (ipc) {
    t = produce(&shared, g, n, 1, 0, 0);
    tl_put(&nt.srv, "shared", t);
    hr_tensor_unref(t);
  }
  /* A host tensor in a shared segment. */
  hr_descriptor hd = bytes_desc(n, HR_DEV_CPU);
  assert_int_equal(hr_shm_tensor_alloc(&t, &hd, NULL), 0);
  gt_fill(hr_tensor_buffer(t, 0), n, SEED_NEW);
  tl_put(&nt.srv, "host", t);
  hr_tensor_unref(t);
  hr_get_opts o;
  tc_res r;
  /* A GET into the device answered with a host segment: its bytes are
   * copied to the device (they once were not: the GET delivered
   * whatever the device memory held). */
  get_opts_dev(&o, "host", g, HR_SYNC_PRODUCER_SYNCED);
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_SHM);
  assert_true(hr_tensor_on_device(r.t));
  assert_int_equal(r.rec.bytes, n);
  assert_int_equal(device_is(g, hr_tensor_gpu_buf(r.t, 0), NULL, n, SEED_NEW),
                   1);
  tc_res_clear(&r);
  /* Ordinary device memory: staged frames. */
  get_opts_dev(&o, "plain", g, HR_SYNC_PRODUCER_SYNCED);
  assert_int_equal(tc_get(&c, &o, &r), 0);
  assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
  assert_int_equal(device_is(g, hr_tensor_gpu_buf(r.t, 0), NULL, n, SEED_NEW),
                   1);
  tc_res_clear(&r);
  if (ipc) {
    /* A client asking for the host gets the host. */
    tc_opts(&o, "shared");
    assert_int_equal(tc_get(&c, &o, &r), 0);
    assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
    assert_false(hr_tensor_on_device(r.t));
    uint8_t *want = malloc(n);
    gt_fill(want, n, SEED_NEW);
    assert_memory_equal(hr_tensor_buffer(r.t, 0), want, n);
    free(want);
    tc_res_clear(&r);
    /* A client that names the device but has none to import into: ERROR,
     * then frames for the rest of the connection (§ 14). */
    tc_opts(&o, "shared");
    o.preferred_device = caps.device_tag;
    assert_int_not_equal(tc_get(&c, &o, &r), 0);
    assert_int_equal(r.rec.wire_error, HR_WIRE_DEVICE_UNAVAILABLE);
    tc_res_clear(&r);
    get_opts_dev(&o, "shared", g, HR_SYNC_PRODUCER_SYNCED);
    int rc = tc_get(&c, &o, &r);
    if (rc)
      printf("GET: %s, wire 0x%x: %s\n", hr_strerror(rc), r.rec.wire_error,
             r.rec.message);
    assert_int_equal(rc, 0);
    assert_int_equal(r.rec.data_plane, HR_PLANE_FRAMES);
    assert_int_equal(
        device_is(g, hr_tensor_gpu_buf(r.t, 0), NULL, n, SEED_NEW), 1);
    tc_res_clear(&r);
    assert_false(c.closed);
  }
  tc_close(&c);
  tl_engine_finish(nt.env, ce);
  net_stop(&nt);
  assert_int_equal(atomic_load(&plain.released), 1);
  served_free(&plain);
  if (ipc) {
    assert_int_equal(atomic_load(&shared.released), 1);
    served_free(&shared);
  }
  /* Every descriptor passed, refused or imported was closed. */
  assert_int_equal(fd_count(), fds0);
  assert_int_equal(hr_gpu_del(g), 0);
}

int main(int argc, char **argv) {
  self_exe = "/proc/self/exe";
  if (argc > 1)
    gt_backend = argv[1];
  if (argc == 6 && strcmp(argv[2], "--import") == 0)
    return child_import(atoi(argv[3]), strtoull(argv[4], NULL, 10),
                        (unsigned)atoi(argv[5]));
  if (argc == 5 && strcmp(argv[2], "--client") == 0)
    return child_client(argv[3], strtoull(argv[4], NULL, 10));
  int rv = gt_main_prologue(argc, argv);
  if (rv != 0)
    return rv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fd_export_import),
      cmocka_unit_test(fd_hostile),
      cmocka_unit_test(engine_cross_process),
      cmocka_unit_test(engine_release_and_sync),
      cmocka_unit_test(engine_stale_without_event),
      cmocka_unit_test(engine_fallbacks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
