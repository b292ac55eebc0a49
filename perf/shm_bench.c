/*
 * shm_bench: one GET of a large tensor three ways, in one run
 * (guides/performance.md: the baselines are measured beside the figure):
 *
 *   1. TCP loopback, frames, into a pre-faulted application buffer, the
 *      server sending from ordinary (heap, huge-page) memory;
 *   2. a Unix domain socket, frames (--no-shm), same buffers;
 *   3. the same Unix socket with the SHM data plane: the server hands over
 *      the tensor's sealed memfd, the client maps it (no copy).
 * (SHM_BENCH_NOTAP=1 runs without the receive tap that times the first
 * byte, to check it costs nothing.)
 *
 * For each: the GET's wall time (request sent to tensor usable), GB/s,
 * and the time to first byte (the first tensor byte readable by the
 * application: for frames the first receive after the descriptor and the
 * first frame prefix; for SHM the completion, when the whole mapping is
 * there).  Then the SHM GET of a 64 MiB tensor, to show its time does not
 * grow with the size, and the time to touch every page of the 1 GiB
 * mapping once (the page faults an application reading it pays).
 * Target: SHM >= 10x faster than TCP at 1 GiB.
 *
 *   shm_bench [--mib N]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <hurray/client.h>
#include <hurray/hr_event.h>
#include <hurray/shm.h>
#include <hurray/store.h>

#include "bench_common.h"

static void die(const char *what) {
  fprintf(stderr, "shm_bench: %s\n", what);
  exit(1);
}

/* A segment-backed tensor of `bytes` bytes, every page written. */
static hr_tensor *seg_tensor(uint64_t bytes) {
  hr_descriptor d;
  hr_tensor *t;
  bc_bytes_desc(&d, bytes, 12);
  if (hr_shm_tensor_alloc(&t, &d, NULL) != 0)
    die("hr_shm_tensor_alloc");
  uint8_t *p = hr_tensor_buffer(t, 0);
  for (uint64_t i = 0; i < bytes; i++)
    p[i] = (uint8_t)(i * 131 + (i >> 12));
  return t;
}

typedef struct tap {
  int armed;
  uint64_t seen;
  double first; /* time the first tensor byte arrived */
} tap;

static void on_rx(const void *b, size_t n, void *ud) {
  tap *tp = ud;
  (void)b;
  if (!tp->armed)
    return;
  tp->seen += n;
  /* Past the descriptor (~100 bytes) and the first frame prefix. */
  if (tp->first == 0 && tp->seen > 160)
    tp->first = bc_now_s();
}

typedef struct result {
  double secs, ttfb;
  int plane;
} result;

static result fetch(const char *url, int shm, const char *key, hr_tensor *ref,
                    uint8_t *dst, uint64_t n) {
  hr_client_options co;
  hr_client *c;
  hr_get_opts o;
  hr_get_dest dest;
  hr_tensor *t;
  hr_transfer_record rec;
  tap tp;
  result r;
  double t0;

  memset(&tp, 0, sizeof tp);
  hr_client_options_default(&co);
  co.on_rx = getenv("SHM_BENCH_NOTAP") ? NULL : on_rx;
  co.user_data = &tp;
  co.timeout_ms = 120000;
  if (!shm)
    co.settings.capabilities &= ~(uint32_t)HR_CAP_SHM_DATA_PLANE;
  if (hr_client_connect(&c, url, &co, NULL, NULL) != 0)
    die("connect");
  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)key;
  o.key_len = (uint16_t)strlen(key);
  o.max_shards = 1;
  if (!shm) {
    memset(&dest, 0, sizeof dest);
    dest.buffer = dst;
    dest.capacity = n;
    o.dest = &dest;
  }
  tp.armed = 1;
  t0 = bc_now_s();
  if (hr_client_get(c, &o, &t, &rec) != 0)
    die(hr_client_last_error(c)->message);
  r.secs = bc_now_s() - t0;
  r.ttfb = shm ? r.secs : (tp.first ? tp.first - t0 : r.secs);
  r.plane = rec.data_plane;
  /* Spot checks (a full compare would touch every page of the SHM
   * mapping, measured separately below). */
  const uint8_t *a = hr_tensor_buffer(t, 0), *b = hr_tensor_buffer(ref, 0);
  for (uint64_t i = 0; i < n; i += n / 64 + 1)
    if (a[i] != b[i])
      die("bytes differ");
  if (a[n - 1] != b[n - 1])
    die("last byte differs");
  hr_tensor_unref(t);
  hr_client_close(c);
  return r;
}

int main(int argc, char **argv) {
  uint64_t mib = 1024, n;
  bc_server s;
  hr_store *store;
  hr_tensor *big, *small;
  uint8_t *dst;
  char unix_url[128], tcp_url[64], path[96];
  result tcp, uds, shm, shm64;
  int i;

  for (i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--mib") && i + 1 < argc)
      mib = strtoull(argv[++i], NULL, 10);
  n = mib << 20;
  big = seg_tensor(n);
  small = seg_tensor(64ull << 20);
  dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
             0);
  if (dst == MAP_FAILED)
    die("mmap");
  madvise(dst, n, MADV_HUGEPAGE);
  memset(dst, 0, n); /* fault the frames' destination in once */

  hr_store_new(&store, NULL, NULL);
  hr_store_put(store, "big", 3, big, 0);
  hr_store_put(store, "small", 5, small, 0);
  /* The same bytes in ordinary (heap, huge-page) memory: the frames
   * baseline from where an application's tensor usually lies. */
  {
    hr_tensor *h;
    if (hr_tensor_alloc(&h, hr_tensor_descriptor(big), 0, NULL) != 0)
      die("hr_tensor_alloc");
    memcpy(hr_tensor_buffer(h, 0), hr_tensor_buffer(big, 0), n);
    hr_store_put(store, "heap", 4, h, 0);
    hr_tensor_unref(h);
  }
  snprintf(path, sizeof path, "/tmp/shm_bench.%d.sock", (int)getpid());
  bc_server_start(&s, store, NULL, path);
  snprintf(tcp_url, sizeof tcp_url, "127.0.0.1:%d", s.port);
  snprintf(unix_url, sizeof unix_url, "unix:%s", path);

  /* Warm-up (connections, the server's first touches). */
  (void)fetch(unix_url, 1, "small", small, dst, 64ull << 20);

  tcp = fetch(tcp_url, 0, "heap", big, dst, n);
  uds = fetch(unix_url, 0, "heap", big, dst, n);
  shm = fetch(unix_url, 1, "big", big, dst, n);
  shm64 = fetch(unix_url, 1, "small", small, dst, 64ull << 20);
  if (tcp.plane != HR_PLANE_FRAMES || uds.plane != HR_PLANE_FRAMES ||
      shm.plane != HR_PLANE_SHM || shm64.plane != HR_PLANE_SHM)
    die("unexpected data plane");

  printf("shm_bench: GET of %llu MiB (one run; indicative)\n",
         (unsigned long long)mib);
  printf("  %-26s %10s %10s %12s\n", "transport", "time ms", "GB/s",
         "TTFB ms");
  printf("  %-26s %10.2f %10.2f %12.3f\n", "TCP loopback, frames",
         tcp.secs * 1e3, (double)n / tcp.secs / 1e9, tcp.ttfb * 1e3);
  printf("  %-26s %10.2f %10.2f %12.3f\n", "Unix socket, frames",
         uds.secs * 1e3, (double)n / uds.secs / 1e9, uds.ttfb * 1e3);
  printf("  %-26s %10.2f %10.2f %12.3f\n", "Unix socket, SHM plane",
         shm.secs * 1e3, (double)n / shm.secs / 1e9, shm.ttfb * 1e3);
  printf("  %-26s %10.2f %10s %12.3f\n", "Unix socket, SHM, 64 MiB",
         shm64.secs * 1e3, "-", shm64.ttfb * 1e3);
  printf("  SHM vs TCP: %.0fx faster; vs Unix frames: %.0fx\n",
         tcp.secs / shm.secs, uds.secs / shm.secs);

  /* What reading the mapping costs the application afterwards. */
  {
    hr_client *c;
    hr_get_opts o;
    hr_tensor *t;
    uint64_t sum = 0;
    double t0, t1;
    if (hr_client_connect(&c, unix_url, NULL, NULL, NULL) != 0)
      die("connect");
    memset(&o, 0, sizeof o);
    o.key = (const uint8_t *)"big";
    o.key_len = 3;
    o.max_shards = 1;
    if (hr_client_get(c, &o, &t, NULL) != 0)
      die("get");
    const uint8_t *p = hr_tensor_buffer(t, 0);
    t0 = bc_now_s();
    for (uint64_t k = 0; k < n; k += 4096)
      sum += p[k];
    t1 = bc_now_s();
    printf("  touching every page of the %llu MiB mapping once: %.2f ms "
           "(checksum %llu)\n",
           (unsigned long long)mib, (t1 - t0) * 1e3,
           (unsigned long long)sum);
    hr_tensor_unref(t);
    hr_client_close(c);
  }

  bc_server_stop(&s);
  unlink(path);
  hr_store_del(store);
  hr_tensor_unref(big);
  hr_tensor_unref(small);
  munmap(dst, n);
  return 0;
}
