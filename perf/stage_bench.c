/*
 * stage_bench: the staged RDMA source (docs/protocol.md decision 76) in
 * steady state, beside what it replaces and what it approximates.
 *
 * For each provider (tcp;ofi_rxm and shm; one libfabric lacks is
 * skipped), one process runs two servers (libevent loops on their own
 * threads, stores in host memory, PUT allowed) and two blocking clients,
 * every engine with that provider's fabric on 127.0.0.1:
 *   server A and client A stage device tensors for RDMA (the default
 *   rdma_stage_budget), server B and client B do not (budget 0: frames).
 * It then times, round after round, each of
 *   GET dev  staged RDMA  (client A from server A, a device tensor),
 *   GET dev  frames       (client A from server B: staged frames),
 *   GET host RDMA         (client A from server A, the same bytes in host
 *                          memory: the baseline staging approximates),
 *   PUT dev  staged RDMA  (client A to server A, a device tensor),
 *   PUT dev  frames       (client B to server A),
 *   PUT host RDMA         (client A to server A, host memory),
 * the order rotated each round (load that comes and goes meets all
 * alike), and prints each one's median seconds and GB/s and the ratios
 * of the medians: staged RDMA to frames and to host RDMA.  The device is
 * the simulated one (`sim`; --backend another), whose device memory is
 * host memory: the staging copy is a memcpy, as a pinned copy from a GPU
 * would be at its own speed.  Every round's bytes are checked once: the
 * GETs' tensors, and the stored tensor after the PUTs.  Each transfer's
 * record is checked for the plane it was meant to take (a fallback the
 * benchmark did not ask for ends it).
 *
 *   stage_bench [--backend NAME] [--size BYTES[K|M|G]] [--iters N]
 *               [-p PROVIDER]... [--modes LIST]
 * (--modes: a comma-separated subset of gs,gf,gh,ps,pf,ph, the six above
 * in their order: to profile one of them alone)
 * Exit status: 0, 2 on an error, 77 when the device backend or every
 * provider is unavailable here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hurray/client.h>
#include <hurray/engine.h>
#include <hurray/fabric.h>
#include <hurray/gpu.h>
#include <hurray/store.h>

#include "bench_common.h"

enum { GET_STAGED, GET_FRAMES, GET_HOST, PUT_STAGED, PUT_FRAMES, PUT_HOST, NM };

static const char *const mode_name[NM] = {
    "GET device, staged RDMA",   "GET device, staged frames",
    "GET host,   RDMA       ",   "PUT device, staged RDMA",
    "PUT device, staged frames", "PUT host,   RDMA       "};

#define MAX_ITERS 64

typedef struct bench {
  uint64_t n;
  hr_tensor *ht, *dt; /* the bytes in host and in device memory */
  const uint8_t *want;
  hr_client *ca, *cb; /* staging, and budget 0 */
  hr_store *sa;       /* server A's store (PUTs land there) */
  int port_a, port_b;
} bench;

/* The plane and the fallback a mode's transfer must report. */
static void check_record(int m, const hr_transfer_record *rec) {
  int rdma =
      m == GET_STAGED || m == GET_HOST || m == PUT_STAGED || m == PUT_HOST;
  int staged_frames = m == GET_FRAMES || m == PUT_FRAMES;
  if (rdma && rec->data_plane != HR_PLANE_RDMA) {
    fprintf(stderr, "stage_bench: %s went on plane %u (%s)\n", mode_name[m],
            rec->data_plane, rec->fallback);
    exit(2);
  }
  if (staged_frames && rec->data_plane == HR_PLANE_RDMA) {
    fprintf(stderr, "stage_bench: %s went over RDMA\n", mode_name[m]);
    exit(2);
  }
}

/* One transfer of mode m: seconds (from the record), bytes checked when
 * `verify`. */
static double one(bench *b, int m, int verify) {
  hr_transfer_record rec;
  memset(&rec, 0, sizeof rec);
  if (m <= GET_HOST) {
    hr_client *c = b->ca;
    hr_get_opts o;
    hr_tensor *t = NULL;
    memset(&o, 0, sizeof o);
    const char *key = m == GET_HOST ? "host" : "dev";
    o.key = (const uint8_t *)key;
    o.key_len = (uint16_t)strlen(key);
    o.max_shards = 1;
    /* GET_FRAMES asks server B, whose budget is 0: another connection. */
    if (m == GET_FRAMES)
      c = b->cb;
    int rv = hr_client_get(c, &o, &t, &rec);
    if (rv) {
      fprintf(stderr, "stage_bench: %s: %s\n", mode_name[m],
              hr_client_last_error(c)->message);
      exit(2);
    }
    if (verify && memcmp(hr_tensor_buffer(t, 0), b->want, b->n)) {
      fprintf(stderr, "stage_bench: %s: bytes differ\n", mode_name[m]);
      exit(2);
    }
    hr_tensor_unref(t);
  } else {
    hr_client *c = m == PUT_FRAMES ? b->cb : b->ca;
    hr_tensor *t = m == PUT_HOST ? b->ht : b->dt;
    int rv =
        hr_client_put(c, (const uint8_t *)"put", 3, HR_PUT_REPLACE, t, &rec);
    if (rv) {
      fprintf(stderr, "stage_bench: %s: %s\n", mode_name[m],
              hr_client_last_error(c)->message);
      exit(2);
    }
    if (verify) {
      /* The store is server A's, read here while its loop may run:
       * hr_store_get is thread-safe (the store swaps one pointer). */
      hr_tensor *got = NULL;
      BC_CHECK("store get", hr_store_get(b->sa, "put", 3, &got));
      if (memcmp(hr_tensor_buffer(got, 0), b->want, b->n)) {
        fprintf(stderr, "stage_bench: %s: stored bytes differ\n", mode_name[m]);
        exit(2);
      }
      hr_tensor_unref(got);
    }
  }
  check_record(m, &rec);
  return (double)(rec.finished - rec.started) / 1e9;
}

static hr_client *connect_to(int port, const char *prov, uint64_t budget) {
  hr_client *c;
  hr_client_options co;
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", port);
  hr_client_options_default(&co);
  co.fabric_provider = prov;
  co.fabric_node = "127.0.0.1";
  co.settings.rdma_stage_budget = budget;
  co.timeout_ms = 120000;
  BC_CHECK("hr_client_connect", hr_client_connect(&c, url, &co, NULL, NULL));
  return c;
}

/* Runs every mode on one provider: 0, or 77 when it is unavailable. */
static int run_provider(const char *prov, uint64_t n, int iters,
                        const int *want, hr_tensor *ht, hr_tensor *dt,
                        const uint8_t *pattern) {
  hr_store_config sc;
  hr_store *sa, *sb;
  hr_store_config_default(&sc);
  sc.allow_put = 1;
  sc.allow_replace = 1;
  sc.max_bytes = 0;
  BC_CHECK("store", hr_store_new(&sa, &sc, NULL));
  BC_CHECK("store", hr_store_new(&sb, &sc, NULL));
  BC_CHECK("put", hr_store_put(sa, "host", 4, ht, HR_PUT_REPLACE));
  BC_CHECK("put", hr_store_put(sa, "dev", 3, dt, HR_PUT_REPLACE));
  BC_CHECK("put", hr_store_put(sb, "dev", 3, dt, HR_PUT_REPLACE));

  /* Whether this libfabric has the provider: open and close one. */
  {
    hr_fabric_config fc;
    hr_fabric *f;
    char why[256] = "";
    hr_fabric_config_default(&fc);
    fc.provider = prov;
    fc.node = "127.0.0.1";
    if (hr_fabric_new(&f, &fc, NULL, why, sizeof why) != 0) {
      printf("SKIP %s: %s\n", prov, why);
      hr_store_del(sa);
      hr_store_del(sb);
      return 77;
    }
    hr_fabric_del(f);
  }
  hr_engine_config ca, cb;
  hr_engine_config_default(&ca);
  ca.fabric_provider = prov;
  ca.fabric_node = "127.0.0.1";
  cb = ca;
  cb.session.rdma_stage_budget = 0;
  bc_server A, B;
  bc_server_start(&A, sa, &ca, NULL);
  bc_server_start(&B, sb, &cb, NULL);
  bench b;
  memset(&b, 0, sizeof b);
  b.n = n;
  b.ht = ht;
  b.dt = dt;
  b.want = pattern;
  b.sa = sa;
  b.port_a = A.port;
  b.port_b = B.port;
  hr_settings ds;
  hr_settings_default(&ds);
  b.ca = connect_to(A.port, prov, ds.rdma_stage_budget);
  b.cb = NULL;

  static double t[NM][MAX_ITERS], cpu[NM][MAX_ITERS];
  int modes[NM], nm = 0;
  for (int m = 0; m < NM; m++)
    if (want[m])
      modes[nm++] = m;
  /* GET_FRAMES goes to server B, PUT_FRAMES from a budget-0 client to A:
   * two connections, made once. */
  hr_client *cb_get = connect_to(B.port, prov, ds.rdma_stage_budget);
  hr_client *cb_put = connect_to(A.port, prov, 0);
  /* Warm-up: each mode once, bytes checked (fabric connections, first
   * registrations, the store's first pages). */
  for (int j = 0; j < nm; j++) {
    b.cb = modes[j] == GET_FRAMES ? cb_get : cb_put;
    one(&b, modes[j], 1);
  }
  for (int r = 0; r < iters; r++)
    for (int j = 0; j < nm; j++) {
      int m = modes[(j + r) % nm];
      b.cb = m == GET_FRAMES ? cb_get : cb_put;
      double c0 = bc_cpu_s();
      t[m][r] = one(&b, m, 0);
      cpu[m][r] = bc_cpu_s() - c0;
    }
  /* The bytes of each mode once more, after the timed rounds. */
  for (int j = 0; j < nm; j++) {
    b.cb = modes[j] == GET_FRAMES ? cb_get : cb_put;
    one(&b, modes[j], 1);
  }
  printf("%s: %.0f MiB, %d interleaved rounds after a warm-up, medians "
         "(CPU: all threads of the process)\n",
         prov, (double)n / (1 << 20), iters);
  double med[NM] = {0};
  for (int j = 0; j < nm; j++) {
    int m = modes[j];
    med[m] = bc_median(t[m], iters);
    printf("  %-26s %7.3f s  %6.2f GB/s  %6.3f CPU s\n", mode_name[m], med[m],
           (double)n / med[m] / 1e9, bc_median(cpu[m], iters));
  }
  if (want[GET_STAGED] && want[GET_FRAMES] && want[GET_HOST])
    printf("  GET staged RDMA: %.2fx the time of staged frames, %.2fx that "
           "of host RDMA\n",
           med[GET_STAGED] / med[GET_FRAMES], med[GET_STAGED] / med[GET_HOST]);
  if (want[PUT_STAGED] && want[PUT_FRAMES] && want[PUT_HOST])
    printf("  PUT staged RDMA: %.2fx the time of staged frames, %.2fx that "
           "of host RDMA\n",
           med[PUT_STAGED] / med[PUT_FRAMES], med[PUT_STAGED] / med[PUT_HOST]);
  fflush(stdout);
  hr_client_close(b.ca);
  hr_client_close(cb_get);
  hr_client_close(cb_put);
  bc_server_stop(&A);
  bc_server_stop(&B);
  hr_store_del(sa);
  hr_store_del(sb);
  return 0;
}

int main(int argc, char **argv) {
  const char *backend = "sim";
  const char *provs[4];
  int nprov = 0, want[NM] = {1, 1, 1, 1, 1, 1};
  static const char *const tag[NM] = {"gs", "gf", "gh", "ps", "pf", "ph"};
  uint64_t n = 256ull << 20;
  int iters = 5;
  for (int i = 1; i < argc; i++) {
    if (bc_device_arg(argc, argv, &i, &backend, &n, &iters))
      continue;
    if (!strcmp(argv[i], "-p") && i + 1 < argc && nprov < 4)
      provs[nprov++] = argv[++i];
    else if (!strcmp(argv[i], "--modes") && i + 1 < argc) {
      i++;
      for (int m = 0; m < NM; m++)
        want[m] = strstr(argv[i], tag[m]) != NULL;
    } else {
      fprintf(stderr, "usage: stage_bench [--backend NAME] [--size N] "
                      "[--iters N] [-p PROVIDER]... [--modes gs,gf,...]\n");
      return 2;
    }
  }
  if (n < 4096 || n % 8 || iters < 1 || iters > MAX_ITERS)
    return 2;
  if (!nprov) {
    provs[nprov++] = "tcp;ofi_rxm";
    provs[nprov++] = "shm";
  }

  hr_gpu_caps caps;
  hr_gpu *g = bc_gpu_open(backend, &caps);
  if (!g)
    return 77;

  /* The bytes: a host tensor, and a device tensor holding the same. */
  hr_tensor *ht = bc_big_tensor(n);
  const uint8_t *pattern = hr_tensor_buffer(ht, 0);
  hr_descriptor dd;
  bc_bytes_desc(&dd, n, 6);
  dd.buffers[0].device_tag = caps.device_tag;
  hr_gpu_buf *dev, *pin;
  hr_gpu_stream *s;
  hr_tensor *dt;
  BC_CHECK("stream", hr_gpu_stream_new(g, &s));
  BC_CHECK("device memory", hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, n, &dev));
  BC_CHECK("wrap", hr_gpu_buf_wrap_host(g, (void *)pattern, n, &pin));
  BC_CHECK("copy", hr_gpu_copy_async(s, dev, 0, pin, 0, n));
  BC_CHECK("sync", hr_gpu_stream_sync(s));
  hr_gpu_buf_del(pin);
  hr_gpu_stream_del(s);
  BC_CHECK("wrap_device",
           hr_tensor_wrap_device(&dt, &dd, &dev, NULL, NULL, NULL, NULL));
  printf("device: %s (%s)\n", caps.name, backend);
  int ran = 0;
  for (int k = 0; k < nprov; k++)
    if (run_provider(provs[k], n, iters, want, ht, dt, pattern) == 0)
      ran++;
  hr_tensor_unref(dt);
  hr_tensor_unref(ht);
  hr_gpu_buf_del(dev);
  hr_gpu_del(g);
  return ran ? 0 : 77;
}
