/* Shared helpers of the device-layer tests: which backend to run on (the
 * first command-line argument; "sim" by default), opening it or skipping
 * with exit code 77, and byte patterns. */
#ifndef HR_TEST_GPU_UTIL_H
#define HR_TEST_GPU_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hurray/gpu.h>

/* Sleeps `ns` nanoseconds. */
static inline void hr__test_sleep(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* The backend under test; set once by main() before any test runs. */
static const char *gt_backend = "sim";

/* Opens the backend under test, or returns 77 (CTest skip) with the
 * reason printed when it is unavailable here. */
static inline int gt_open(hr_gpu **g, uint64_t sim_delay_ns,
                          uint64_t sim_bps) {
  hr_gpu_config cfg;
  hr_gpu_config_default(&cfg);
  cfg.backend = gt_backend;
  cfg.sim_op_delay_ns = sim_delay_ns;
  cfg.sim_bytes_per_sec = sim_bps;
  hr_gpu_probe_info why;
  int rv = hr_gpu_open(g, &cfg, NULL, &why);
  if (rv == HR_ERR_UNSUPPORTED) {
    printf("SKIP: backend %s unavailable: %s\n", gt_backend, why.reason);
    return 77;
  }
  if (rv != 0) {
    printf("FAIL: backend %s: %s (%s)\n", gt_backend, hr_strerror(rv),
           why.reason);
    return 1;
  }
  return 0;
}

/* Picks the backend from argv and checks it can be opened: returns 0 to
 * go on, 77 to skip, 1 on failure. */
static inline int gt_main_prologue(int argc, char **argv) {
  if (argc > 1)
    gt_backend = argv[1];
  hr_gpu *g;
  int rv = gt_open(&g, 0, 0);
  if (rv != 0)
    return rv;
  hr_gpu_caps caps;
  hr_gpu_query(g, &caps);
  printf("backend %s: %s (device_tag 0x%02x, flags 0x%x)\n", gt_backend,
         caps.name, caps.device_tag, caps.flags);
  hr_gpu_del(g);
  return 0;
}

/* Fills p[0..n) with a pattern derived from `seed`. */
static inline void gt_fill(uint8_t *p, size_t n, unsigned seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1103515245u + 12345u;
    p[i] = (uint8_t)(x >> 16);
  }
}

#endif /* HR_TEST_GPU_UTIL_H */
