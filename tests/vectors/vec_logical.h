/*
 * Reassembles the tensor a valid sequence vector carries (shards placed by
 * shard_offset, every layout converted to row-major by a small
 * index-by-index reference) and compares it with the vector's `logical`.
 */
#ifndef VEC_LOGICAL_H
#define VEC_LOGICAL_H

#include "vec_common.h"

/* One tensor (or shard) as it arrives on one stream. */
typedef struct vec_tensor {
  uint32_t stream_id;
  hr_descriptor desc;
  uint8_t *buf[HR_MAX_BUFFERS]; /* desc.buffers[i].size_bytes each */
} vec_tensor;

typedef struct vec_assembly {
  vec_tensor *t;
  size_t n, cap;
  int composite; /* a composite head was seen: no logical reference */
} vec_assembly;

/* Records a decoded message of the sequence: descriptors (TENSOR_DESCRIPTOR,
 * TENSOR_PUT) open a tensor on their stream, frames are copied into it.
 * Returns 0, or -1 with `diag` when a frame falls outside its buffer (which
 * the codec should have rejected first). */
int vec_asm_on_msg(vec_assembly *a, const hr_msg *m, vec_buf *diag);

/* Compares the reassembled tensor with `logical` ({element_type, shape,
 * hex}).  `cfg` gives the requested box (the region of a REGION request).
 * Returns 0, or -1 with the reason in `diag`. */
int vec_asm_check_logical(const vec_assembly *a, const cJSON *logical,
                          const hr_rx_config *cfg, vec_buf *diag);

void vec_asm_free(vec_assembly *a);

#endif /* VEC_LOGICAL_H */
