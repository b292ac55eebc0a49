/* Fixtures of the descriptor codec tests (see desc_fixtures.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "desc_fixtures.h"

const char *const fx_names[FX_COUNT] = {
    "ROW_MAJOR", "COLUMN_MAJOR", "STRIDED", "PERMUTED",  "TILED",
    "COO",       "CSR",          "CSC",     "BSR",       "TUPLE",
    "CONCAT",    "GQ",           "PANEL",   "EXTENSION", "SHARD",
    "SCALAR",    "INT4",         "EMPTY"};

static const uint8_t panel_mr4[4] = {4, 0, 0, 0};
static const uint8_t ext_meta[7] = {0x10, 0x04, 'p', 'a', 'n', 'e', 'l'};
static const uint8_t ext_params[3] = {0xAA, 0xBB, 0xCC};

static void set_shape(hr_descriptor *d, unsigned rank, const uint64_t *s) {
  d->rank = (uint8_t)rank;
  memcpy(d->shape, s, rank * sizeof *s);
}

/* Gives the descriptor `n` CPU buffers of the given sizes and sets the
 * transport total to their sum. */
static void set_buffers(hr_descriptor *d, hr_transport_fields *x, unsigned n,
                        const uint64_t *sizes) {
  d->buffer_count = (uint8_t)n;
  x->total_data_bytes = 0;
  for (unsigned i = 0; i < n; i++) {
    d->buffers[i].size_bytes = sizes[i];
    d->buffers[i].alignment_log2 = 6;
    x->total_data_bytes += sizes[i];
  }
}

void fx_build(int kind, hr_descriptor *d, hr_transport_fields *x) {
  memset(d, 0, sizeof *d);
  memset(x, 0, sizeof *x);
  d->descriptor_version = 1;
  d->element_type = HR_ELEM_FLOAT32;
  x->total_shards = 1;
  hr_layout_params *p = &d->params;
  switch (kind) {
  case FX_ROW_MAJOR:
    d->layout.tag = HR_LAYOUT_ROW_MAJOR;
    set_shape(d, 2, (const uint64_t[]){2, 3});
    set_buffers(d, x, 1, (const uint64_t[]){24});
    break;
  case FX_COLUMN_MAJOR:
    d->element_type = HR_ELEM_INT16;
    d->layout.tag = HR_LAYOUT_COLUMN_MAJOR;
    set_shape(d, 2, (const uint64_t[]){3, 2});
    set_buffers(d, x, 1, (const uint64_t[]){12});
    break;
  case FX_STRIDED:
    d->layout.tag = HR_LAYOUT_STRIDED;
    set_shape(d, 2, (const uint64_t[]){2, 3});
    p->origin = 0;
    p->strides[0] = 1;
    p->strides[1] = 2;
    set_buffers(d, x, 1, (const uint64_t[]){24});
    break;
  case FX_PERMUTED:
    d->element_type = HR_ELEM_UINT8;
    d->layout.tag = HR_LAYOUT_PERMUTED;
    set_shape(d, 3, (const uint64_t[]){2, 3, 4});
    memcpy(p->order, (const uint8_t[]){2, 0, 1}, 3);
    set_buffers(d, x, 1, (const uint64_t[]){24});
    break;
  case FX_TILED:
    d->layout.tag = HR_LAYOUT_TILED;
    set_shape(d, 2, (const uint64_t[]){5, 3});
    p->tile[0] = 2;
    p->tile[1] = 2;
    set_buffers(d, x, 1, (const uint64_t[]){6 * 4 * 4});
    break;
  case FX_COO:
    d->element_type = HR_ELEM_FLOAT64;
    d->layout.tag = HR_LAYOUT_SPARSE_COO;
    set_shape(d, 2, (const uint64_t[]){4, 4});
    p->nnz = 3;
    p->index_type = HR_ELEM_INT64;
    p->sorted = 1;
    set_buffers(d, x, 2, (const uint64_t[]){3 * 2 * 8, 3 * 8});
    break;
  case FX_CSR:
    d->layout.tag = HR_LAYOUT_SPARSE_CSR;
    set_shape(d, 2, (const uint64_t[]){3, 4});
    p->nnz = 2;
    p->index_type = HR_ELEM_INT32;
    set_buffers(d, x, 3, (const uint64_t[]){4 * 4, 2 * 4, 2 * 4});
    break;
  case FX_CSC:
    d->element_type = HR_ELEM_FLOAT16;
    d->layout.tag = HR_LAYOUT_SPARSE_CSC;
    set_shape(d, 2, (const uint64_t[]){4, 3});
    p->nnz = 3;
    p->index_type = HR_ELEM_INT64;
    set_buffers(d, x, 3, (const uint64_t[]){4 * 8, 3 * 8, 3 * 2});
    break;
  case FX_BSR:
    d->layout.tag = HR_LAYOUT_SPARSE_BSR;
    set_shape(d, 2, (const uint64_t[]){4, 6});
    p->br = 2;
    p->bc = 3;
    p->nnz = 2;
    p->index_type = HR_ELEM_INT32;
    set_buffers(d, x, 3, (const uint64_t[]){3 * 4, 2 * 4, 2 * 2 * 3 * 4});
    break;
  case FX_TUPLE:
    d->element_type = HR_ELEM_NONE;
    d->layout.tag = HR_LAYOUT_COMPOSITE;
    p->member_count = 2;
    p->rule = HR_COMPOSITE_TUPLE;
    break;
  case FX_CONCAT:
    d->layout.tag = HR_LAYOUT_COMPOSITE;
    set_shape(d, 2, (const uint64_t[]){6, 4});
    p->member_count = 2;
    p->rule = HR_COMPOSITE_CONCAT;
    p->axis = 0;
    break;
  case FX_GQ:
    d->element_type = HR_ELEM_FLOAT16;
    d->layout.tag = HR_LAYOUT_COMPOSITE;
    set_shape(d, 2, (const uint64_t[]){4, 64});
    p->member_count = 3;
    p->rule = HR_COMPOSITE_GROUP_QUANTIZED;
    p->axis = 1;
    p->group_size = 32;
    p->has_zero_point = 1;
    break;
  case FX_PANEL:
    d->layout.tag = HR_LAYOUT_PANEL;
    d->layout.ext = panel_mr4;
    d->layout.ext_len = sizeof panel_mr4;
    p->mr = 4;
    set_shape(d, 2, (const uint64_t[]){10, 3});
    set_buffers(d, x, 1, (const uint64_t[]){12 * 3 * 4});
    break;
  case FX_EXTENSION:
    d->layout.tag = 0xF7;
    d->layout.ext = ext_meta;
    d->layout.ext_len = sizeof ext_meta;
    d->params_raw = ext_params;
    d->params_len = sizeof ext_params;
    set_shape(d, 2, (const uint64_t[]){8, 8});
    set_buffers(d, x, 2, (const uint64_t[]){200, 56});
    break;
  case FX_SHARD:
    d->flags = HR_DESC_HAS_SHARD;
    d->layout.tag = HR_LAYOUT_ROW_MAJOR;
    set_shape(d, 2, (const uint64_t[]){2, 3});
    memcpy(d->parent_shape, (const uint64_t[]){6, 3}, 2 * sizeof(uint64_t));
    memcpy(d->shard_offset, (const uint64_t[]){4, 0}, 2 * sizeof(uint64_t));
    set_buffers(d, x, 1, (const uint64_t[]){24});
    x->shard_index = 2;
    x->total_shards = 3;
    break;
  case FX_SCALAR:
    d->element_type = HR_ELEM_FLOAT64;
    d->layout.tag = HR_LAYOUT_ROW_MAJOR;
    set_buffers(d, x, 1, (const uint64_t[]){8});
    break;
  case FX_INT4:
    d->element_type = HR_ELEM_INT4;
    d->layout.tag = HR_LAYOUT_ROW_MAJOR;
    set_shape(d, 1, (const uint64_t[]){5});
    set_buffers(d, x, 1, (const uint64_t[]){3});
    break;
  case FX_EMPTY:
    d->layout.tag = HR_LAYOUT_ROW_MAJOR;
    set_shape(d, 2, (const uint64_t[]){0, 5});
    set_buffers(d, x, 1, (const uint64_t[]){0});
    break;
  default:
    fail_msg("unknown fixture %d", kind);
  }
}

size_t fx_encode(const hr_descriptor *d, const hr_transport_fields *x,
                 uint8_t *out, size_t cap) {
  int64_t n = hr__desc_encoded_size(d);
  assert_true(n > 0);
  assert_true((size_t)n + HR_XPORT_SIZE <= cap);
  uint8_t *end = hr__desc_encode(out, d);
  assert_int_equal(end - out, n);
  end = hr__xport_encode(end, x);
  assert_int_equal(end - out, n + HR_XPORT_SIZE);
  return (size_t)(end - out);
}

int fx_decode_validate(const uint8_t *in, size_t len, uint32_t base,
                       const hr_wire_ctx *ctx, hr_descriptor *d,
                       hr_transport_fields *x, hr_wire_status *st) {
  hr_cursor c;
  hr_cursor_init(&c, in, len, base);
  int rv = hr__desc_decode(&c, d, st);
  if (rv == 0)
    rv = hr__xport_decode(&c, x, st);
  if (rv == 0)
    rv = hr_descriptor_validate(d, x, ctx, base, st);
  if (rv == 0 && hr_cursor_left(&c) != 0)
    rv = hr__wire_fail(st, HR_WIRE_MALFORMED_PAYLOAD, hr_cursor_off(&c),
                       "trailing bytes");
  return rv;
}

static void assert_params_equal(const hr_layout_params *a,
                                const hr_layout_params *b) {
  assert_int_equal(a->origin, b->origin);
  assert_memory_equal(a->strides, b->strides, sizeof a->strides);
  assert_memory_equal(a->order, b->order, sizeof a->order);
  assert_memory_equal(a->tile, b->tile, sizeof a->tile);
  assert_int_equal(a->nnz, b->nnz);
  assert_int_equal(a->index_type, b->index_type);
  assert_int_equal(a->sorted, b->sorted);
  assert_int_equal(a->br, b->br);
  assert_int_equal(a->bc, b->bc);
  assert_int_equal(a->member_count, b->member_count);
  assert_int_equal(a->rule, b->rule);
  assert_int_equal(a->axis, b->axis);
  assert_int_equal(a->group_size, b->group_size);
  assert_int_equal(a->has_zero_point, b->has_zero_point);
  assert_int_equal(a->mr, b->mr);
}

void fx_assert_desc_equal(const hr_descriptor *a, const hr_descriptor *b) {
  assert_int_equal(a->descriptor_version, b->descriptor_version);
  assert_int_equal(a->element_type, b->element_type);
  assert_int_equal(a->rank, b->rank);
  assert_int_equal(a->flags, b->flags);
  assert_int_equal(a->layout.tag, b->layout.tag);
  assert_int_equal(a->layout.ext_len, b->layout.ext_len);
  if (a->layout.ext_len > 0)
    assert_memory_equal(a->layout.ext, b->layout.ext, a->layout.ext_len);
  assert_memory_equal(a->shape, b->shape, a->rank * sizeof(uint64_t));
  assert_params_equal(&a->params, &b->params);
  if (a->layout.tag >= 0xF1) {
    /* Opaque parameters travel raw. */
    assert_int_equal(a->params_len, b->params_len);
    if (a->params_len > 0)
      assert_memory_equal(a->params_raw, b->params_raw, a->params_len);
  }
  assert_int_equal(a->byte_offset, b->byte_offset);
  if (a->flags & HR_DESC_HAS_SHARD) {
    assert_memory_equal(a->parent_shape, b->parent_shape,
                        a->rank * sizeof(uint64_t));
    assert_memory_equal(a->shard_offset, b->shard_offset,
                        a->rank * sizeof(uint64_t));
  }
  assert_int_equal(a->buffer_count, b->buffer_count);
  for (unsigned i = 0; i < a->buffer_count; i++) {
    const hr_buffer_handle *x = &a->buffers[i], *y = &b->buffers[i];
    assert_int_equal(x->size_bytes, y->size_bytes);
    assert_int_equal(x->alignment_log2, y->alignment_log2);
    assert_int_equal(x->device_tag, y->device_tag);
    assert_int_equal(x->memory_class, y->memory_class);
    assert_int_equal(x->device_index, y->device_index);
    assert_int_equal(x->sync_mode, y->sync_mode);
    assert_memory_equal(x->reserved, y->reserved, sizeof x->reserved);
  }
}

size_t fx_unhex(const char *hex, uint8_t *out, size_t cap) {
  size_t n = strlen(hex) / 2;
  assert_true(n <= cap);
  for (size_t i = 0; i < n; i++) {
    unsigned v = 0;
    for (int j = 0; j < 2; j++) {
      char ch = hex[2 * i + j];
      v = v * 16 + (unsigned)(ch <= '9' ? ch - '0' : ch - 'a' + 10);
    }
    out[i] = (uint8_t)v;
  }
  return n;
}
