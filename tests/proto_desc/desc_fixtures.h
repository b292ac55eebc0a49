/*
 * Shared fixtures of the descriptor codec tests: one valid descriptor (with
 * matching transport fields) per layout, and helpers to push a descriptor
 * through the wire (encode, then decode with the internal cursor API).
 */
#ifndef DESC_FIXTURES_H
#define DESC_FIXTURES_H

#include <stddef.h>
#include <stdint.h>

#include "proto/hr_desc_codec.h"

/* One valid descriptor per layout (and a few shapes of interest). */
enum fx_kind {
  FX_ROW_MAJOR,    /* FLOAT32 2x3 */
  FX_COLUMN_MAJOR, /* INT16 3x2 */
  FX_STRIDED,      /* FLOAT32 2x3, column-major strides */
  FX_PERMUTED,     /* UINT8 2x3x4, order (2, 0, 1) */
  FX_TILED,        /* FLOAT32 5x3 in 2x2 tiles */
  FX_COO,          /* FLOAT64 4x4, 3 non-zeros, INT64 sorted */
  FX_CSR,          /* FLOAT32 3x4, 2 non-zeros, INT32 */
  FX_CSC,          /* FLOAT16 4x3, 3 non-zeros, INT64 */
  FX_BSR,          /* FLOAT32 4x6 in 2x3 blocks, 2 blocks, INT32 */
  FX_TUPLE,        /* composite TUPLE head, 2 members */
  FX_CONCAT,       /* composite CONCAT head FLOAT32 6x4 along axis 0 */
  FX_GQ,           /* composite GROUP_QUANTIZED head FLOAT16 4x64 */
  FX_PANEL,        /* FLOAT32 10x3, mr 4 */
  FX_EXTENSION,    /* tag 0xF7 with metadata, opaque params, 2 buffers */
  FX_SHARD,        /* FLOAT32 2x3 shard at (4, 0) of 6x3, shard 2 of 3 */
  FX_SCALAR,       /* FLOAT64 rank 0 */
  FX_INT4,         /* INT4 ROW_MAJOR of 5 elements: 3 bytes */
  FX_EMPTY,        /* FLOAT32 0x5 ROW_MAJOR: one buffer of size 0 */
  FX_COUNT
};

extern const char *const fx_names[FX_COUNT];

/* Fills a valid descriptor and its transport fields (network transport,
 * frames).  Pointers in `d` refer to static storage. */
void fx_build(int kind, hr_descriptor *d, hr_transport_fields *x);

/* Encodes d then x into out (cap bytes); returns the length.  Fails the
 * test when hr__desc_encoded_size() disagrees with what was written. */
size_t fx_encode(const hr_descriptor *d, const hr_transport_fields *x,
                 uint8_t *out, size_t cap);

/*
 * Decodes a descriptor and its transport fields from in[0..len) placed at
 * `base` in a message, then validates them unless a decode step failed,
 * and requires that nothing is left over.  Returns 0 or HR_ERR_PROTO with
 * st filled.  The decoded results stay in *d / *x.
 */
int fx_decode_validate(const uint8_t *in, size_t len, uint32_t base,
                       const hr_wire_ctx *ctx, hr_descriptor *d,
                       hr_transport_fields *x, hr_wire_status *st);

/* Asserts that two descriptors have the same wire content. */
void fx_assert_desc_equal(const hr_descriptor *a, const hr_descriptor *b);

/* Parses lowercase hex into out (cap bytes); returns the byte count. */
size_t fx_unhex(const char *hex, uint8_t *out, size_t cap);

#endif /* DESC_FIXTURES_H */
