/*
 * The parameter block shared by the CUDA transcode kernels
 * (hr_xc_cuda_kernels.cu) and their host glue (hr_xc_cuda.c).  It is
 * passed by value to every kernel, so both compilers must lay it out the
 * same way: fixed-width fields only, 8-byte ones first.
 */
#ifndef HR_XC_CUDA_ARGS_H
#define HR_XC_CUDA_ARGS_H

#include <stdint.h>

#define XCU_MAX_DIMS 32

typedef struct xcu_args {
  int64_t base; /* source element offset of the first element read */
  uint64_t n;   /* output elements (padding included) */
  /* Gather and transpose: the output's dims, outermost first, and the
   * source stride (in elements) of one step along each.  TILED: the
   * logical dims (the region's shape) with their tiles; PANEL: rows and
   * columns, tile[0] = mr. */
  uint64_t ext[XCU_MAX_DIMS];
  int64_t sstride[XCU_MAX_DIMS];
  uint64_t tile[XCU_MAX_DIMS];
  uint32_t nd;   /* dims used */
  uint32_t pdim; /* transpose: the dim the source reads contiguously */
} xcu_args;

/* Threads per block of the 1-D kernels, and the transpose's tile. */
#define XCU_BLOCK 256
#define XCU_TILE 32
#define XCU_TILE_ROWS 8

#endif /* HR_XC_CUDA_ARGS_H */
