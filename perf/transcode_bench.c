/*
 * transcode_bench: throughput of the layout transcoding kernels against
 * memcpy of the same bytes, measured in the same run.
 *
 * For float32, bfloat16 and float64 tensors of 256 MiB: memcpy, ROW_MAJOR
 * -> COLUMN_MAJOR (8192 rows), the rank-4 permutation (0, 2, 3, 1) of a
 * 64 x 64 x 128 x N tensor, ROW_MAJOR -> TILED 32 x 32 and ROW_MAJOR ->
 * PANEL mr = 8; each with 1 thread and with 2 (plain pthreads splitting
 * the output into two ranges, as an engine's pool would).  Buffers are
 * huge-page advised and pre-faulted; each figure is the best of 3 runs.
 *
 *   transcode_bench [--quick] [--reps N] [--threads N] [--chunk BYTES]
 *
 * --quick uses 16 MiB tensors for a smoke run.  --chunk adds a column:
 * one thread producing the output in consecutive calls of BYTES each, as a
 * streaming engine does frame by frame (chunks below 8 MiB are written
 * through the cache, larger ones with non-temporal stores).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <hurray/transcode.h>

typedef struct bench_job {
  const hr_xc_plan *plan; /* NULL: memcpy */
  const uint8_t *src;
  uint8_t *dst;
  uint64_t begin, len;
  uint64_t chunk; /* bytes per call; 0: the whole range at once */
  int rv;
} bench_job;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *alloc_huge(size_t n) {
  void *p =
      mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
#ifdef MADV_HUGEPAGE
  madvise(p, n, MADV_HUGEPAGE);
#endif
  return p;
}

static void *job_main(void *a) {
  bench_job *j = a;
  uint64_t step = j->chunk ? j->chunk : j->len;
  for (uint64_t o = 0; o < j->len; o += step) {
    uint64_t b = j->begin + o, n = j->len - o < step ? j->len - o : step;
    if (j->plan) {
      int rv = hr_xc_run(j->plan, b, n, j->dst + b);
      if (rv)
        j->rv = rv;
    } else {
      memcpy(j->dst + b, j->src + b, (size_t)n);
    }
  }
  return NULL;
}

/* Runs the output [0, total) split into `nt` ranges (cut on multiples of
 * `grain`), one thread each; returns the seconds taken. */
static double run_once(const hr_xc_plan *plan, const uint8_t *src, uint8_t *dst,
                       uint64_t total, uint64_t grain, int nt, uint64_t chunk) {
  bench_job jobs[64];
  pthread_t th[64];
  uint64_t at = 0;
  for (int i = 0; i < nt; i++) {
    uint64_t end = total / (uint64_t)nt * (uint64_t)(i + 1);
    end = i == nt - 1 ? total : end / grain * grain;
    if (end < at)
      end = at;
    jobs[i] = (bench_job){plan, src, dst, at, end - at, chunk, 0};
    at = end;
  }
  double t0 = now_s();
  if (nt == 1) {
    job_main(&jobs[0]);
  } else {
    for (int i = 0; i < nt; i++)
      pthread_create(&th[i], NULL, job_main, &jobs[i]);
    for (int i = 0; i < nt; i++)
      pthread_join(th[i], NULL);
  }
  double t = now_s() - t0;
  for (int i = 0; i < nt; i++)
    if (jobs[i].rv) {
      fprintf(stderr, "hr_xc_run: %s\n", hr_strerror(jobs[i].rv));
      exit(1);
    }
  return t;
}

static double best_of(int reps, const hr_xc_plan *plan, const uint8_t *src,
                      uint8_t *dst, uint64_t total, uint64_t grain, int nt,
                      uint64_t chunk) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t = run_once(plan, src, dst, total, grain, nt, chunk);
    if (t < best)
      best = t;
  }
  return best;
}

/* Spot-checks the output of a plan at random logical indices. */
static uint64_t rng_state = 88172645463325252ULL;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

enum op { OP_COL, OP_PERM, OP_TILED, OP_PANEL, OP_COUNT };
static const char *op_names[OP_COUNT] = {"ROW->COLUMN", "perm (0,2,3,1)",
                                         "ROW->TILED 32x32", "ROW->PANEL mr=8"};

static int spot_check(enum op op, const uint64_t *s, unsigned e,
                      const uint8_t *src, const uint8_t *dst) {
  for (int n = 0; n < 2000; n++) {
    uint64_t i[4], so, dof;
    if (op == OP_PERM) {
      for (int k = 0; k < 4; k++)
        i[k] = rnd() % s[k];
      so = ((i[0] * s[1] + i[1]) * s[2] + i[2]) * s[3] + i[3];
      dof = ((i[0] * s[2] + i[2]) * s[3] + i[3]) * s[1] + i[1];
    } else {
      i[0] = rnd() % s[0];
      i[1] = rnd() % s[1];
      so = i[0] * s[1] + i[1];
      if (op == OP_COL)
        dof = i[1] * s[0] + i[0];
      else if (op == OP_TILED)
        dof = (i[0] / 32 * (s[1] / 32) + i[1] / 32) * 1024 + i[0] % 32 * 32 +
              i[1] % 32;
      else
        dof = i[0] / 8 * 8 * s[1] + i[1] * 8 + i[0] % 8;
    }
    if (memcmp(src + so * e, dst + dof * e, e) != 0)
      return 0;
  }
  return 1;
}

int main(int argc, char **argv) {
  uint64_t bytes = 256ull << 20;
  int reps = 3, threads = 2;
  uint64_t chunk = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) {
      bytes = 16ull << 20;
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) {
      chunk = strtoull(argv[++i], NULL, 0);
    } else {
      fprintf(stderr,
              "usage: %s [--quick] [--reps N] [--threads N] "
              "[--chunk BYTES]\n",
              argv[0]);
      return 2;
    }
  }
  if (reps < 1)
    reps = 1;
  if (threads < 1 || threads > 64)
    threads = 2;
  const uint64_t rows = bytes >= (256ull << 20) ? 8192 : 2048;
  uint8_t *src = alloc_huge(bytes), *dst = alloc_huge(bytes);
  for (uint64_t i = 0; i < bytes; i += 8) {
    uint64_t v = rnd();
    memcpy(src + i, &v, 8);
  }
  memset(dst, 0, bytes);

  static const struct {
    const char *name;
    uint8_t type;
    unsigned e;
  } types[3] = {{"float32", HR_ELEM_FLOAT32, 4},
                {"bfloat16", HR_ELEM_BFLOAT16, 2},
                {"float64", HR_ELEM_FLOAT64, 8}};

  printf("transcode_bench: %llu MiB tensors, best of %d, %s\n",
         (unsigned long long)(bytes >> 20), reps,
         bytes >= (256ull << 20) ? "full size" : "quick");
  printf("%-9s %-17s %-13s %8s %6s  %8s %6s", "dtype", "operation", "shape",
         "1T GB/s", "x mcpy", "2T GB/s", "x mcpy");
  if (chunk)
    printf("  %10s %6s", "chunk GB/s", "x mcpy");
  printf("\n%.*s\n", chunk ? 96 : 78,
         "-----------------------------------------------------------------"
         "-----------------------------------");
  int bad = 0;
  for (int ti = 0; ti < 3; ti++) {
    const unsigned e = types[ti].e;
    const uint64_t elems = bytes / e;
    double mc[3];
    mc[0] = best_of(reps, NULL, src, dst, bytes, 4096, 1, 0);
    mc[1] = best_of(reps, NULL, src, dst, bytes, 4096, threads, 0);
    printf("%-9s %-17s %-13s %8.2f %6s  %8.2f %6s", types[ti].name, "memcpy",
           "", bytes / mc[0] / 1e9, "1.00", bytes / mc[1] / 1e9, "1.00");
    if (chunk) {
      mc[2] = best_of(reps, NULL, src, dst, bytes, 4096, 1, chunk);
      printf("  %10.2f %6s", bytes / mc[2] / 1e9, "1.00");
    }
    printf("\n");
    for (int op = 0; op < OP_COUNT; op++) {
      hr_descriptor d;
      memset(&d, 0, sizeof d);
      d.descriptor_version = 1;
      d.element_type = types[ti].type;
      d.layout.tag = HR_LAYOUT_ROW_MAJOR;
      d.buffer_count = 1;
      hr_xc_target t;
      memset(&t, 0, sizeof t);
      char shape[32];
      if (op == OP_PERM) {
        d.rank = 4;
        d.shape[0] = 64;
        d.shape[1] = 64;
        d.shape[2] = 128;
        d.shape[3] = elems / (64 * 64 * 128);
        snprintf(shape, sizeof shape, "64x64x128x%llu",
                 (unsigned long long)d.shape[3]);
        t.layout = HR_LAYOUT_PERMUTED;
        t.params.order[0] = 0;
        t.params.order[1] = 2;
        t.params.order[2] = 3;
        t.params.order[3] = 1;
      } else {
        d.rank = 2;
        d.shape[0] = rows;
        d.shape[1] = elems / rows;
        snprintf(shape, sizeof shape, "%llux%llu", (unsigned long long)rows,
                 (unsigned long long)d.shape[1]);
        if (op == OP_COL) {
          t.layout = HR_LAYOUT_COLUMN_MAJOR;
        } else if (op == OP_TILED) {
          t.layout = HR_LAYOUT_TILED;
          t.params.tile[0] = t.params.tile[1] = 32;
        } else {
          t.layout = HR_LAYOUT_PANEL;
          t.params.mr = 8;
        }
      }
      hr_xc_tensor x;
      memset(&x, 0, sizeof x);
      x.desc = &d;
      x.buffers[0] = src;
      x.sizes[0] = bytes;
      hr_xc_plan *p;
      hr_wire_status st;
      int rv = hr_xc_plan_new(&p, &x, &t, NULL, NULL, NULL, &st);
      if (rv) {
        fprintf(stderr, "plan: %s\n", hr_strerror(rv));
        return 1;
      }
      uint64_t out = hr_xc_plan_out_size(p), grain = hr_xc_plan_grain(p);
      double t1 = best_of(reps, p, src, dst, out, grain, 1, 0);
      int ok = spot_check((enum op)op, d.shape, e, src, dst);
      double t2 = best_of(reps, p, src, dst, out, grain, threads, 0);
      ok &= spot_check((enum op)op, d.shape, e, src, dst);
      printf("%-9s %-17s %-13s %8.2f %6.2f  %8.2f %6.2f", types[ti].name,
             op_names[op], shape, bytes / t1 / 1e9, mc[0] / t1,
             bytes / t2 / 1e9, mc[1] / t2);
      if (chunk) {
        memset(dst, 0, bytes);
        double t3 = best_of(reps, p, src, dst, out, grain, 1, chunk);
        ok &= spot_check((enum op)op, d.shape, e, src, dst);
        printf("  %10.2f %6.2f", bytes / t3 / 1e9, mc[2] / t3);
      }
      printf("%s\n", ok ? "" : "  WRONG OUTPUT");
      bad |= !ok;
      hr_xc_plan_del(p);
    }
  }
  printf("(GB/s = 10^9 tensor bytes per second; x mcpy = throughput relative "
         "to memcpy\n of the same bytes with the same thread count and "
         "chunking; %d threads in\n the 2T column",
         threads);
  if (chunk)
    printf("; chunk: 1 thread, %llu-byte calls", (unsigned long long)chunk);
  printf(")\n");
  munmap(src, bytes);
  munmap(dst, bytes);
  return bad;
}
