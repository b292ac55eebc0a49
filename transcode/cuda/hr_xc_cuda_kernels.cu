/*
 * CUDA kernels of the dense transcodes.  Compiled by nvcc into a fatbin
 * that the library embeds as bytes (no link-time CUDA dependency) and
 * loads through the driver API; see hr_xc_cuda.c for how the host glue
 * reduces a plan to one of these kernels.  Every kernel is instantiated
 * per element size (1, 2, 4, 8, 16 bytes): elements are moved as opaque
 * words, never interpreted, so NaN payloads and -0.0 survive.
 *
 * All loops over blocks are grid-stride loops, so any output fits the
 * grid the glue chooses (the glue caps each grid dimension).
 */
#include "hr_xc_cuda_args.h"

/* A 16-byte element (COMPLEX128): two words, 8-byte aligned as the
 * library's buffers are. */
struct xcu_e16 {
  unsigned long long lo, hi;
};

/*
 * Strided gather: out[linear] = in[base + sum idx_d * sstride_d].  The
 * output is cut into rows of its innermost dim; a block takes rows
 * (blockIdx.y, .z) and the threads of a row take consecutive elements, so
 * writes are coalesced (and reads too when the innermost dim is the
 * source's contiguous one).  The row's source offset is decoded once per
 * block.
 */
template <typename T>
__device__ void gather(const xcu_args &a, const T *__restrict__ src,
                       T *__restrict__ dst) {
  __shared__ long long srow;
  const unsigned nd = a.nd;
  const unsigned long long inner = a.ext[nd - 1];
  const long long is = a.sstride[nd - 1];
  const unsigned long long rows = a.n / inner;
  const unsigned long long rstep = (unsigned long long)gridDim.y * gridDim.z;
  for (unsigned long long row =
           blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z;
       row < rows; row += rstep) {
    __syncthreads();
    if (threadIdx.x == 0) {
      long long off = a.base;
      unsigned long long r = row;
      for (unsigned d = nd - 1; d-- > 0;) {
        off += (long long)(r % a.ext[d]) * a.sstride[d];
        r /= a.ext[d];
      }
      srow = off;
    }
    __syncthreads();
    const long long s0 = srow;
    T *out = dst + row * inner;
    for (unsigned long long x =
             (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         x < inner; x += (unsigned long long)gridDim.x * blockDim.x)
      out[x] = src[s0 + (long long)x * is];
  }
}

/*
 * Transpose through shared memory: the output's innermost dim q = nd - 1
 * is read with a large stride, while dim p = pdim reads the source
 * contiguously (stride 1).  A block moves a 32x32 tile of the (p, q) plane:
 * it reads along p (coalesced), then writes along q (coalesced).  The
 * padding column (+1) puts the tile's columns in different banks.  The
 * other dims are a batch: blockIdx.z, decoded once per block.
 */
template <typename T>
__device__ void xpose(const xcu_args &a, const T *__restrict__ src,
                      T *__restrict__ dst) {
  __shared__ T tile[XCU_TILE][XCU_TILE + 1];
  __shared__ long long sb, ob;
  const unsigned nd = a.nd, P = a.pdim, Q = nd - 1;
  const unsigned long long ep = a.ext[P], eq = a.ext[Q];
  const long long sq = a.sstride[Q];
  unsigned long long op = 1; /* output stride of dim p */
  for (unsigned d = P + 1; d < nd; d++)
    op *= a.ext[d];
  const unsigned long long batch = a.n / (ep * eq);
  const unsigned long long tp_n = (ep + XCU_TILE - 1) / XCU_TILE;
  const unsigned long long tq_n = (eq + XCU_TILE - 1) / XCU_TILE;
  const unsigned tx = threadIdx.x, ty = threadIdx.y;
  for (unsigned long long b = blockIdx.z; b < batch; b += gridDim.z) {
    __syncthreads();
    if (tx == 0 && ty == 0) {
      long long so = a.base;
      unsigned long long oo = 0, ostr = 1, r = b;
      for (unsigned d = nd; d-- > 0;) {
        if (d != P && d != Q) {
          unsigned long long i = r % a.ext[d];
          r /= a.ext[d];
          so += (long long)i * a.sstride[d];
          oo += i * ostr;
        }
        ostr *= a.ext[d];
      }
      sb = so;
      ob = (long long)oo;
    }
    __syncthreads();
    const long long s0 = sb;
    const unsigned long long o0 = (unsigned long long)ob;
    for (unsigned long long tp = blockIdx.y; tp < tp_n; tp += gridDim.y) {
      for (unsigned long long tq = blockIdx.x; tq < tq_n; tq += gridDim.x) {
        const unsigned long long p0 = tp * XCU_TILE, q0 = tq * XCU_TILE;
        __syncthreads();
        for (unsigned i = ty; i < XCU_TILE; i += XCU_TILE_ROWS) {
          const unsigned long long p = p0 + tx, q = q0 + i;
          if (p < ep && q < eq)
            tile[i][tx] = src[s0 + (long long)p + (long long)q * sq];
        }
        __syncthreads();
        for (unsigned i = ty; i < XCU_TILE; i += XCU_TILE_ROWS) {
          const unsigned long long p = p0 + i, q = q0 + tx;
          if (p < ep && q < eq)
            dst[o0 + p * op + q] = tile[tx][i];
        }
      }
    }
  }
}

/*
 * TILED target (wire-v1 § 5): tiles in row-major order over the tile
 * grid, each tile's elements row-major inside it; positions past the
 * shape (edge tiles) are zero.  One thread per output element.
 */
template <typename T>
__device__ void tiled(const xcu_args &a, const T *__restrict__ src,
                      T *__restrict__ dst) {
  const unsigned nd = a.nd;
  unsigned long long vol = 1;
  for (unsigned d = 0; d < nd; d++)
    vol *= a.tile[d];
  for (unsigned long long o =
           (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
       o < a.n; o += (unsigned long long)gridDim.x * blockDim.x) {
    unsigned long long t = o / vol, u = o - t * vol;
    long long off = a.base;
    bool in = true;
    for (unsigned d = nd; d-- > 0;) {
      const unsigned long long td = a.tile[d];
      const unsigned long long nt = (a.ext[d] + td - 1) / td;
      const unsigned long long i = (t % nt) * td + u % td;
      t /= nt;
      u /= td;
      in = in && i < a.ext[d];
      off += (long long)i * a.sstride[d];
    }
    dst[o] = in ? src[off] : T();
  }
}

/*
 * PANEL target (wire-v1 § 5.1): row panels of mr rows in order; inside a
 * panel column after column, each column's mr elements contiguous; rows
 * past the matrix (the last panel) are zero.
 */
template <typename T>
__device__ void panel(const xcu_args &a, const T *__restrict__ src,
                      T *__restrict__ dst) {
  const unsigned long long rows = a.ext[0], cols = a.ext[1], mr = a.tile[0];
  const unsigned long long pvol = cols * mr;
  for (unsigned long long o =
           (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
       o < a.n; o += (unsigned long long)gridDim.x * blockDim.x) {
    const unsigned long long p = o / pvol, rem = o - p * pvol;
    const unsigned long long j = rem / mr, row = p * mr + (rem - j * mr);
    dst[o] = row < rows ? src[a.base + (long long)row * a.sstride[0] +
                              (long long)j * a.sstride[1]]
                        : T();
  }
}

#define XCU_INST(S, T)                                                       \
  extern "C" __global__ void __launch_bounds__(XCU_BLOCK)                    \
      hr_xc_gather_##S(xcu_args a, const T *src, T *dst) {                   \
    gather<T>(a, src, dst);                                                  \
  }                                                                          \
  extern "C" __global__ void __launch_bounds__(XCU_TILE *XCU_TILE_ROWS)      \
      hr_xc_xpose_##S(xcu_args a, const T *src, T *dst) {                    \
    xpose<T>(a, src, dst);                                                   \
  }                                                                          \
  extern "C" __global__ void __launch_bounds__(XCU_BLOCK)                    \
      hr_xc_tiled_##S(xcu_args a, const T *src, T *dst) {                    \
    tiled<T>(a, src, dst);                                                   \
  }                                                                          \
  extern "C" __global__ void __launch_bounds__(XCU_BLOCK)                    \
      hr_xc_panel_##S(xcu_args a, const T *src, T *dst) {                    \
    panel<T>(a, src, dst);                                                   \
  }

XCU_INST(e1, unsigned char)
XCU_INST(e2, unsigned short)
XCU_INST(e4, unsigned int)
XCU_INST(e8, unsigned long long)
XCU_INST(e16, xcu_e16)
