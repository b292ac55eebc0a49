/*
 * hr_descriptor_validate(): every rejection path with its wire error code
 * and offset, table-driven.  Each case starts from a valid fixture, applies
 * up to six field changes and is checked twice: on the struct (what a
 * sender validates) and, when it can be encoded, after encode -> decode
 * (what a receiver validates).  Then the valid corner cases, and
 * hr_descriptor_buffer_sizes() / hr_shape_elements().
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "desc_fixtures.h"

#define BUF_CAP 4096
#define BASE 100u /* where the descriptor sits in its (imaginary) message */

/* ---- field changes ------------------------------------------------------ */

enum field {
  M_END = 0, /* end of the list */
  M_VERSION, M_ELEM, M_RANK, M_FLAGS, M_TAG, M_EXT, M_EXT_NULL,
  M_SHAPE, M_PARENT, M_SHARD_OFF, M_BYTE_OFFSET,
  M_ORIGIN, M_STRIDE, M_ORDER, M_TILE, M_NNZ, M_INDEX_TYPE, M_SORTED,
  M_BR, M_BC, M_MEMBERS, M_RULE, M_AXIS, M_GROUP, M_HZP, M_PARAMS_NULL,
  M_BUF_COUNT, M_SIZE, M_ALIGN, M_DEVICE, M_DEVICE_ALL, M_MEMCLASS,
  M_DEVINDEX, M_SYNC, M_RESERVED,
  M_TOTAL, M_SHARD_INDEX, M_TOTAL_SHARDS, M_PLANE
};

typedef struct mut {
  uint8_t field; /* enum field */
  uint8_t index; /* dimension, buffer or byte index */
  uint64_t value;
} mut;

/* ext_metadata choices for M_EXT. */
static const uint8_t meta_mr0[4] = {0, 0, 0, 0};
static const uint8_t meta_mr2[4] = {2, 0, 0, 0};
static const uint8_t meta_mr16[4] = {16, 0, 0, 0};
static const uint8_t meta_5[5] = {4, 0, 0, 0, 0};
static const struct {
  const uint8_t *p;
  uint16_t len;
} metas[] = {{NULL, 0}, {meta_mr0, 4}, {meta_mr2, 4},
             {meta_mr16, 4}, {meta_5, 5}, {meta_5, 2}};
enum { META_NONE, META_MR0, META_MR2, META_MR16, META_5, META_2 };

static void apply(hr_descriptor *d, hr_transport_fields *x, const mut *m) {
  hr_layout_params *p = &d->params;
  hr_buffer_handle *b = &d->buffers[m->index];
  uint64_t v = m->value;
  switch (m->field) {
  case M_VERSION: d->descriptor_version = (uint8_t)v; break;
  case M_ELEM: d->element_type = (uint8_t)v; break;
  case M_RANK: d->rank = (uint8_t)v; break;
  case M_FLAGS: d->flags = (uint8_t)v; break;
  case M_TAG: d->layout.tag = (uint8_t)v; break;
  case M_EXT:
    d->layout.ext = metas[v].p;
    d->layout.ext_len = metas[v].len;
    /* Decoding mirrors a 4-byte PANEL metadata into params.mr. */
    p->mr = metas[v].len == 4 ? hr_load_u32(metas[v].p) : 0;
    break;
  case M_EXT_NULL: d->layout.ext = NULL; break;
  case M_SHAPE: d->shape[m->index] = v; break;
  case M_PARENT: d->parent_shape[m->index] = v; break;
  case M_SHARD_OFF: d->shard_offset[m->index] = v; break;
  case M_BYTE_OFFSET: d->byte_offset = v; break;
  case M_ORIGIN: p->origin = v; break;
  case M_STRIDE: p->strides[m->index] = (int64_t)v; break;
  case M_ORDER: p->order[m->index] = (uint8_t)v; break;
  case M_TILE: p->tile[m->index] = (uint32_t)v; break;
  case M_NNZ: p->nnz = v; break;
  case M_INDEX_TYPE: p->index_type = (uint8_t)v; break;
  case M_SORTED: p->sorted = (uint8_t)v; break;
  case M_BR: p->br = (uint32_t)v; break;
  case M_BC: p->bc = (uint32_t)v; break;
  case M_MEMBERS: p->member_count = (uint32_t)v; break;
  case M_RULE: p->rule = (uint8_t)v; break;
  case M_AXIS: p->axis = (uint8_t)v; break;
  case M_GROUP: p->group_size = (uint32_t)v; break;
  case M_HZP: p->has_zero_point = (uint8_t)v; break;
  case M_PARAMS_NULL: d->params_raw = NULL; break;
  case M_BUF_COUNT: d->buffer_count = (uint8_t)v; break;
  case M_SIZE: b->size_bytes = v; break;
  case M_ALIGN: b->alignment_log2 = (uint8_t)v; break;
  case M_DEVICE: b->device_tag = (uint8_t)v; break;
  case M_DEVICE_ALL:
    for (unsigned i = 0; i < HR_MAX_BUFFERS; i++)
      d->buffers[i].device_tag = (uint8_t)v;
    break;
  case M_MEMCLASS: b->memory_class = (uint8_t)v; break;
  case M_DEVINDEX: b->device_index = (uint16_t)v; break;
  case M_SYNC: b->sync_mode = (uint8_t)v; break;
  case M_RESERVED: d->buffers[0].reserved[m->index] = (uint8_t)v; break;
  case M_TOTAL: x->total_data_bytes = v; break;
  case M_SHARD_INDEX: x->shard_index = (uint16_t)v; break;
  case M_TOTAL_SHARDS: x->total_shards = (uint16_t)v; break;
  case M_PLANE: x->data_plane = (uint8_t)v; break;
  default: fail_msg("unknown field %u", m->field);
  }
}

/* ---- where a fault is reported ------------------------------------------ */

/* An offset is an anchor (a field found by walking the encoded bytes) plus
 * a byte count, so the table stays readable whatever the fixture's shape. */
enum anchor {
  A_ABS, A_SHAPE, A_PARAMS_LEN, A_PARAMS, A_BYTE_OFFSET, A_PARENT,
  A_SHARD_OFF, A_BUF_COUNT, A_BUF, A_XPORT
};
#define AT(anchor, n) (((uint32_t)(anchor) << 16) | (uint32_t)(n))
#define BUF(i, field) AT(A_BUF, 16 * (i) + (field))

static uint32_t resolve(uint32_t at, const hr_descriptor *d) {
  uint32_t anchor = at >> 16, n = at & 0xFFFF;
  if (anchor == A_ABS)
    return n;
  uint8_t e[BUF_CAP];
  assert_true(hr__desc_encoded_size(d) > 0);
  hr__desc_encode(e, d);
  /* Walk the wire format of § 7. */
  uint32_t rank = e[2], flags = e[3], tag = e[4];
  uint32_t pos[A_XPORT + 1];
  uint32_t p = 5;
  if (tag >= 0xF0 && tag <= 0xFE)
    p += 2 + (e[5] | (e[6] << 8));
  pos[A_SHAPE] = p;
  p += 8 * rank;
  pos[A_PARAMS_LEN] = p;
  p += 2 + (e[p] | (e[p + 1] << 8));
  pos[A_PARAMS] = pos[A_PARAMS_LEN] + 2;
  pos[A_BYTE_OFFSET] = p;
  p += 8;
  pos[A_PARENT] = p;
  pos[A_SHARD_OFF] = p + ((flags & 1) ? 8 * rank : 0);
  p += (flags & 1) ? 16 * rank : 0;
  pos[A_BUF_COUNT] = p;
  pos[A_BUF] = p + 1;
  pos[A_XPORT] = p + 1 + 16 * e[p];
  return pos[anchor] + n;
}

/* ---- the rejection table ------------------------------------------------ */

enum transport { NET, LOCAL, NET_NO_XPORT };
#define ID HR_WIRE_INVALID_DESCRIPTOR
#define ISM HR_WIRE_INVALID_SYNC_MODE
#define CI HR_WIRE_COMPOSITE_INVALID
#define MP HR_WIRE_MALFORMED_PAYLOAD

typedef struct reject_case {
  const char *name;
  uint8_t fx;        /* enum fx_kind */
  uint8_t transport; /* enum transport */
  uint8_t struct_only; /* the fault cannot travel (encoders write zeros) */
  uint32_t code;
  uint32_t at; /* AT(anchor, n) */
  mut m[6];
} reject_case;

#define S(field, value) {(field), 0, (uint64_t)(value)}
#define SI(field, index, value) {(field), (index), (uint64_t)(value)}

static const reject_case rejects[] = {
    /* Header fields. */
    {"version 0", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 0), {S(M_VERSION, 0)}},
    {"version 2", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 0), {S(M_VERSION, 2)}},
    {"element 0x14", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 1),
     {S(M_ELEM, 0x14)}},
    {"element 0xEF", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 1),
     {S(M_ELEM, 0xEF)}},
    {"element 0xF0", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 1),
     {S(M_ELEM, 0xF0)}},
    {"element 0xFE", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 1),
     {S(M_ELEM, 0xFE)}},
    {"element 0xFF", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 1),
     {S(M_ELEM, 0xFF)}},
    {"rank 33", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 2), {S(M_RANK, 33)}},
    {"flags bit 1", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 3),
     {S(M_FLAGS, 0x02)}},
    {"flags bit 7 with HAS_SHARD", FX_SHARD, NET, 0, ID, AT(A_ABS, 3),
     {S(M_FLAGS, 0x81)}},
    /* Layout tags. */
    {"tag 0x00", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 4), {S(M_TAG, 0x00)}},
    {"tag 0x0A", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 4), {S(M_TAG, 0x0A)}},
    {"tag 0x0C", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 4), {S(M_TAG, 0x0C)}},
    {"tag 0xEF", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 4), {S(M_TAG, 0xEF)}},
    {"tag 0xFF", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 4), {S(M_TAG, 0xFF)}},
    {"TILED_EXACT in a descriptor", FX_TILED, NET, 0, ID, AT(A_ABS, 4),
     {S(M_TAG, 0xF1)}},
    {"PERMUTED_EXACT in a descriptor", FX_PERMUTED, NET, 0, ID, AT(A_ABS, 4),
     {S(M_TAG, 0xF2)}},
    {"ext_metadata missing", FX_EXTENSION, NET, 0, ID, AT(A_ABS, 5),
     {S(M_EXT_NULL, 0)}},
    /* PANEL (§ 5.1). */
    {"PANEL without metadata", FX_PANEL, NET, 0, ID, AT(A_ABS, 5),
     {S(M_EXT, META_NONE)}},
    {"PANEL metadata of 2 bytes", FX_PANEL, NET, 0, ID, AT(A_ABS, 5),
     {S(M_EXT, META_2)}},
    {"PANEL metadata of 5 bytes", FX_PANEL, NET, 0, ID, AT(A_ABS, 5),
     {S(M_EXT, META_5)}},
    {"PANEL mr 0", FX_PANEL, NET, 0, ID, AT(A_ABS, 7), {S(M_EXT, META_MR0)}},
    {"PANEL rank 1", FX_PANEL, NET, 0, ID, AT(A_ABS, 2), {S(M_RANK, 1)}},
    {"PANEL rank 3", FX_PANEL, NET, 0, ID, AT(A_ABS, 2), {S(M_RANK, 3)}},
    /* Element type against layout. */
    {"NONE with ROW_MAJOR", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 1),
     {S(M_ELEM, HR_ELEM_NONE)}},
    {"NONE with an extension layout", FX_EXTENSION, NET, 0, ID, AT(A_ABS, 1),
     {S(M_ELEM, HR_ELEM_NONE)}},
    {"INT4 COLUMN_MAJOR", FX_COLUMN_MAJOR, NET, 0, ID, AT(A_ABS, 1),
     {S(M_ELEM, HR_ELEM_INT4)}},
    {"UINT4 STRIDED", FX_STRIDED, NET, 0, ID, AT(A_ABS, 1),
     {S(M_ELEM, HR_ELEM_UINT4)}},
    {"UINT4 TILED", FX_TILED, NET, 0, ID, AT(A_ABS, 1),
     {S(M_ELEM, HR_ELEM_UINT4)}},
    {"INT4 PANEL", FX_PANEL, NET, 0, ID, AT(A_ABS, 1),
     {S(M_ELEM, HR_ELEM_INT4)}},
    {"INT4 CSR", FX_CSR, NET, 0, ID, AT(A_ABS, 1), {S(M_ELEM, HR_ELEM_INT4)}},
    /* Rank against layout. */
    {"COO rank 0", FX_COO, NET, 0, ID, AT(A_ABS, 2), {S(M_RANK, 0)}},
    {"CSR rank 1", FX_CSR, NET, 0, ID, AT(A_ABS, 2), {S(M_RANK, 1)}},
    {"CSR rank 3", FX_CSR, NET, 0, ID, AT(A_ABS, 2),
     {S(M_RANK, 3), SI(M_SHAPE, 2, 2)}},
    {"CSC rank 3", FX_CSC, NET, 0, ID, AT(A_ABS, 2), {S(M_RANK, 3)}},
    {"BSR rank 1", FX_BSR, NET, 0, ID, AT(A_ABS, 2), {S(M_RANK, 1)}},
    /* shape product x element size (§ 17). */
    {"2^32 x 2^32 elements", FX_ROW_MAJOR, NET, 0, ID, AT(A_SHAPE, 0),
     {SI(M_SHAPE, 0, 1ull << 32), SI(M_SHAPE, 1, 1ull << 32)}},
    {"2^61 FLOAT64 bytes", FX_SCALAR, NET, 0, ID, AT(A_SHAPE, 0),
     {S(M_RANK, 1), SI(M_SHAPE, 0, 1ull << 61)}},
    {"2^62 x 2 FLOAT32 bytes", FX_ROW_MAJOR, NET, 0, ID, AT(A_SHAPE, 0),
     {SI(M_SHAPE, 0, 1ull << 62), SI(M_SHAPE, 1, 2)}},
    {"sparse shape overflow", FX_COO, NET, 0, ID, AT(A_SHAPE, 0),
     {SI(M_SHAPE, 0, 1ull << 40), SI(M_SHAPE, 1, 1ull << 40)}},
    {"composite head shape overflow", FX_CONCAT, NET, 0, ID, AT(A_SHAPE, 0),
     {SI(M_SHAPE, 0, UINT64_MAX), SI(M_SHAPE, 1, UINT64_MAX)}},
    /* layout_params. */
    {"opaque params missing", FX_EXTENSION, NET, 0, ID, AT(A_ABS, 30),
     {S(M_PARAMS_NULL, 0)}},
    {"PERMUTED order repeats", FX_PERMUTED, NET, 0, ID, AT(A_PARAMS, 0),
     {SI(M_ORDER, 1, 2)}},
    {"PERMUTED order out of range", FX_PERMUTED, NET, 0, ID, AT(A_PARAMS, 0),
     {SI(M_ORDER, 0, 3)}},
    {"TILED tile[0] 0", FX_TILED, NET, 0, ID, AT(A_PARAMS, 0),
     {SI(M_TILE, 0, 0)}},
    {"TILED tile[1] 0", FX_TILED, NET, 0, ID, AT(A_PARAMS, 4),
     {SI(M_TILE, 1, 0)}},
    {"COO index_type FLOAT32", FX_COO, NET, 0, ID, AT(A_PARAMS, 8),
     {S(M_INDEX_TYPE, HR_ELEM_FLOAT32)}},
    {"COO index_type INT16", FX_COO, NET, 0, ID, AT(A_PARAMS, 8),
     {S(M_INDEX_TYPE, HR_ELEM_INT16)}},
    {"COO sorted 2", FX_COO, NET, 0, ID, AT(A_PARAMS, 9), {S(M_SORTED, 2)}},
    {"CSR index_type UINT32", FX_CSR, NET, 0, ID, AT(A_PARAMS, 8),
     {S(M_INDEX_TYPE, HR_ELEM_UINT32)}},
    {"CSC index_type NONE", FX_CSC, NET, 0, ID, AT(A_PARAMS, 8),
     {S(M_INDEX_TYPE, HR_ELEM_NONE)}},
    {"BSR br 0", FX_BSR, NET, 0, ID, AT(A_PARAMS, 0), {S(M_BR, 0)}},
    {"BSR bc 0", FX_BSR, NET, 0, ID, AT(A_PARAMS, 4), {S(M_BC, 0)}},
    {"BSR rows not a multiple", FX_BSR, NET, 0, ID, AT(A_SHAPE, 0),
     {SI(M_SHAPE, 0, 5)}},
    {"BSR columns not a multiple", FX_BSR, NET, 0, ID, AT(A_SHAPE, 0),
     {SI(M_SHAPE, 1, 7)}},
    {"BSR index_type INT8", FX_BSR, NET, 0, ID, AT(A_PARAMS, 16),
     {S(M_INDEX_TYPE, HR_ELEM_INT8)}},
    /* Composite heads (§ 7.3, § 18 Composites). */
    {"member_count 0", FX_TUPLE, NET, 0, CI, AT(A_PARAMS, 0),
     {S(M_MEMBERS, 0)}},
    {"member_count 65536", FX_TUPLE, NET, 0, CI, AT(A_PARAMS, 0),
     {S(M_MEMBERS, 65536)}},
    {"member_count 2^32-1", FX_CONCAT, NET, 0, CI, AT(A_PARAMS, 0),
     {S(M_MEMBERS, UINT32_MAX)}},
    {"rule 3", FX_TUPLE, NET, 0, CI, AT(A_PARAMS, 4), {S(M_RULE, 3)}},
    {"rule 0xFF", FX_CONCAT, NET, 0, CI, AT(A_PARAMS, 4), {S(M_RULE, 0xFF)}},
    {"TUPLE head typed", FX_TUPLE, NET, 0, CI, AT(A_ABS, 1),
     {S(M_ELEM, HR_ELEM_FLOAT32)}},
    {"TUPLE head rank 1", FX_TUPLE, NET, 0, CI, AT(A_ABS, 2),
     {S(M_RANK, 1), SI(M_SHAPE, 0, 2)}},
    {"CONCAT head NONE", FX_CONCAT, NET, 0, CI, AT(A_ABS, 1),
     {S(M_ELEM, HR_ELEM_NONE)}},
    {"CONCAT axis = rank", FX_CONCAT, NET, 0, CI, AT(A_PARAMS, 5),
     {S(M_AXIS, 2)}},
    {"CONCAT rank 0", FX_CONCAT, NET, 0, CI, AT(A_PARAMS, 5),
     {S(M_RANK, 0)}},
    {"GROUP_QUANTIZED axis 2", FX_GQ, NET, 0, CI, AT(A_PARAMS, 5),
     {S(M_AXIS, 2)}},
    {"GROUP_QUANTIZED group_size 0", FX_GQ, NET, 0, CI, AT(A_PARAMS, 6),
     {S(M_GROUP, 0)}},
    {"GROUP_QUANTIZED has_zero_point 2", FX_GQ, NET, 0, CI, AT(A_PARAMS, 10),
     {S(M_HZP, 2)}},
    {"GROUP_QUANTIZED 2 members with zero points", FX_GQ, NET, 0, CI,
     AT(A_PARAMS, 0), {S(M_MEMBERS, 2)}},
    {"GROUP_QUANTIZED 3 members without", FX_GQ, NET, 0, CI,
     AT(A_PARAMS, 0), {S(M_HZP, 0)}},
    {"sharded composite head", FX_TUPLE, NET, 0, CI, AT(A_ABS, 3),
     {S(M_FLAGS, HR_DESC_HAS_SHARD)}},
    {"composite head with a buffer", FX_TUPLE, NET, 0, ID,
     AT(A_BUF_COUNT, 0), {S(M_BUF_COUNT, 1)}},
    {"composite head with data bytes", FX_CONCAT, NET, 0, ID, AT(A_XPORT, 0),
     {S(M_TOTAL, 1)}},
    {"composite head byte_offset", FX_GQ, NET, 0, ID, AT(A_BYTE_OFFSET, 0),
     {S(M_BYTE_OFFSET, 8)}},
    /* byte_offset (§ 7.1, § 18 Transports). */
    {"byte_offset with frames", FX_ROW_MAJOR, NET, 0, ID,
     AT(A_BYTE_OFFSET, 0), {S(M_BYTE_OFFSET, 64)}},
    {"byte_offset with RDMA", FX_ROW_MAJOR, NET, 0, ID, AT(A_BYTE_OFFSET, 0),
     {S(M_BYTE_OFFSET, 64), S(M_PLANE, HR_PLANE_RDMA)}},
    {"byte_offset without transport fields", FX_ROW_MAJOR, NET_NO_XPORT, 0,
     ID, AT(A_BYTE_OFFSET, 0), {S(M_BYTE_OFFSET, 1)}},
    /* Shards. */
    {"shard past the parent", FX_SHARD, NET, 0, ID, AT(A_SHARD_OFF, 0),
     {SI(M_PARENT, 0, 5)}},
    {"shard past the parent in dim 1", FX_SHARD, NET, 0, ID,
     AT(A_SHARD_OFF, 8), {SI(M_SHARD_OFF, 1, 1)}},
    {"shard offset beyond the parent", FX_SHARD, NET, 0, ID,
     AT(A_SHARD_OFF, 0), {SI(M_SHARD_OFF, 0, 7)}},
    /* offset + shape wraps to 0 in u64: a naive sum would accept it. */
    {"shard offset + shape overflows", FX_SHARD, NET, 0, ID,
     AT(A_SHARD_OFF, 0),
     {S(M_ELEM, HR_ELEM_UINT8), SI(M_PARENT, 0, UINT64_MAX),
      SI(M_PARENT, 1, 1), SI(M_SHAPE, 1, 1),
      SI(M_SHARD_OFF, 0, UINT64_MAX - 1)}},
    {"parent shape overflows", FX_SHARD, NET, 0, ID, AT(A_PARENT, 0),
     {SI(M_PARENT, 0, 3ull << 62)}},
    /* buffer_count against the layout. */
    {"ROW_MAJOR with 2 buffers", FX_ROW_MAJOR, NET, 0, ID,
     AT(A_BUF_COUNT, 0), {S(M_BUF_COUNT, 2)}},
    {"ROW_MAJOR with none", FX_ROW_MAJOR, NET, 0, ID, AT(A_BUF_COUNT, 0),
     {S(M_BUF_COUNT, 0)}},
    {"empty tensor with none", FX_EMPTY, NET, 0, ID, AT(A_BUF_COUNT, 0),
     {S(M_BUF_COUNT, 0)}},
    {"COO with 3 buffers", FX_COO, NET, 0, ID, AT(A_BUF_COUNT, 0),
     {S(M_BUF_COUNT, 3)}},
    {"CSR with 2 buffers", FX_CSR, NET, 0, ID, AT(A_BUF_COUNT, 0),
     {S(M_BUF_COUNT, 2)}},
    {"BSR with 4 buffers", FX_BSR, NET, 0, ID, AT(A_BUF_COUNT, 0),
     {S(M_BUF_COUNT, 4)}},
    {"PANEL with 2 buffers", FX_PANEL, NET, 0, ID, AT(A_BUF_COUNT, 0),
     {S(M_BUF_COUNT, 2)}},
    {"extension with none", FX_EXTENSION, NET, 0, ID, AT(A_BUF_COUNT, 0),
     {S(M_BUF_COUNT, 0)}},
    {"extension with 9", FX_EXTENSION, NET, 0, ID, AT(A_ABS, 43),
     {S(M_BUF_COUNT, 9)}},
    /* Buffer handles (§ 7.2, ADR-018). */
    {"alignment 22", FX_ROW_MAJOR, NET, 0, ID, BUF(0, 8), {S(M_ALIGN, 22)}},
    {"alignment 255", FX_CSR, NET, 0, ID, BUF(2, 8), {SI(M_ALIGN, 2, 255)}},
    {"device 0x09", FX_ROW_MAJOR, NET, 0, ID, BUF(0, 9), {S(M_DEVICE, 0x09)}},
    {"device 0xEF", FX_ROW_MAJOR, NET, 0, ID, BUF(0, 9), {S(M_DEVICE, 0xEF)}},
    {"device 0xFF", FX_ROW_MAJOR, NET, 0, ID, BUF(0, 9), {S(M_DEVICE, 0xFF)}},
    {"mixed devices", FX_CSR, LOCAL, 0, ID, BUF(2, 9),
     {SI(M_DEVICE, 2, HR_DEV_CUDA)}},
    {"memory class 3", FX_ROW_MAJOR, NET, 0, ID, BUF(0, 10),
     {S(M_MEMCLASS, 3)}},
    {"memory class 0xFF", FX_COO, NET, 0, ID, BUF(1, 10),
     {SI(M_MEMCLASS, 1, 0xFF)}},
    {"device_index on a network", FX_ROW_MAJOR, NET, 0, ID, BUF(0, 11),
     {S(M_DEVINDEX, 1)}},
    {"device_index of buffer 1", FX_CSR, NET, 0, ID, BUF(1, 11),
     {S(M_DEVICE_ALL, HR_DEV_ROCM), SI(M_DEVINDEX, 1, 2)}},
    {"sync_mode 3", FX_ROW_MAJOR, LOCAL, 0, ISM, BUF(0, 13),
     {S(M_DEVICE_ALL, HR_DEV_CUDA), S(M_SYNC, 3)}},
    {"sync_mode 0xFE", FX_ROW_MAJOR, LOCAL, 0, ISM, BUF(0, 13),
     {S(M_DEVICE_ALL, HR_DEV_CUDA), S(M_SYNC, 0xFE)}},
    {"sync_mode 0xFF", FX_ROW_MAJOR, NET, 0, ISM, BUF(0, 13),
     {S(M_SYNC, 0xFF)}},
    {"CPU SYNC_EVENT local", FX_ROW_MAJOR, LOCAL, 0, ISM, BUF(0, 13),
     {S(M_SYNC, HR_SYNC_EVENT)}},
    {"CPU SYNC_CONSUMER_STREAM", FX_ROW_MAJOR, NET, 0, ISM, BUF(0, 13),
     {S(M_SYNC, HR_SYNC_CONSUMER_STREAM)}},
    {"CUDA SYNC_EVENT on a network", FX_ROW_MAJOR, NET, 0, ISM, BUF(0, 13),
     {S(M_DEVICE_ALL, HR_DEV_CUDA), S(M_SYNC, HR_SYNC_EVENT)}},
    {"CUDA SYNC_CONSUMER_STREAM on a network", FX_ROW_MAJOR, NET, 0, ISM,
     BUF(0, 13),
     {S(M_DEVICE_ALL, HR_DEV_CUDA), S(M_SYNC, HR_SYNC_CONSUMER_STREAM)}},
    {"SYNC_EVENT on buffer 2 only", FX_CSR, NET, 0, ISM, BUF(2, 13),
     {S(M_DEVICE_ALL, HR_DEV_METAL), SI(M_SYNC, 2, HR_SYNC_EVENT)}},
    {"extension device SYNC_EVENT on a network", FX_ROW_MAJOR, NET, 0, ISM,
     BUF(0, 13), {S(M_DEVICE_ALL, 0xF0), S(M_SYNC, HR_SYNC_EVENT)}},
    {"reserved byte 14", FX_ROW_MAJOR, NET, 1, ID, BUF(0, 14),
     {SI(M_RESERVED, 0, 1)}},
    {"reserved byte 15", FX_ROW_MAJOR, LOCAL, 1, ID, BUF(0, 15),
     {SI(M_RESERVED, 1, 0x80)}},
    /* Buffer sizes (§ 18 "Buffer sizes are exact"). */
    {"ROW_MAJOR short", FX_ROW_MAJOR, NET, 0, ID, BUF(0, 0),
     {S(M_SIZE, 20), S(M_TOTAL, 20)}},
    {"ROW_MAJOR long", FX_ROW_MAJOR, NET, 0, ID, BUF(0, 0),
     {S(M_SIZE, 28), S(M_TOTAL, 28)}},
    {"COLUMN_MAJOR empty buffer", FX_COLUMN_MAJOR, NET, 0, ID, BUF(0, 0),
     {S(M_SIZE, 0), S(M_TOTAL, 0)}},
    {"PERMUTED 25 bytes", FX_PERMUTED, NET, 0, ID, BUF(0, 0),
     {S(M_SIZE, 25), S(M_TOTAL, 25)}},
    {"TILED without padding", FX_TILED, NET, 0, ID, BUF(0, 0),
     {S(M_SIZE, 60), S(M_TOTAL, 60)}},
    {"COO indices", FX_COO, NET, 0, ID, BUF(0, 0),
     {SI(M_SIZE, 0, 47), S(M_TOTAL, 71)}},
    {"COO values", FX_COO, NET, 0, ID, BUF(1, 0),
     {SI(M_SIZE, 1, 25), S(M_TOTAL, 73)}},
    {"CSR indptr of rows", FX_CSR, NET, 0, ID, BUF(0, 0),
     {SI(M_SIZE, 0, 12), S(M_TOTAL, 28)}},
    {"CSC indptr of rows+1", FX_CSC, NET, 0, ID, BUF(0, 0),
     {SI(M_SIZE, 0, 40), S(M_TOTAL, 70)}},
    {"CSC indices", FX_CSC, NET, 0, ID, BUF(1, 0),
     {SI(M_SIZE, 1, 12), S(M_TOTAL, 50)}},
    {"BSR values", FX_BSR, NET, 0, ID, BUF(2, 0),
     {SI(M_SIZE, 2, 24), S(M_TOTAL, 44)}},
    {"PANEL without padding", FX_PANEL, NET, 0, ID, BUF(0, 0),
     {S(M_SIZE, 120), S(M_TOTAL, 120)}},
    {"INT4 one byte per element", FX_INT4, NET, 0, ID, BUF(0, 0),
     {S(M_SIZE, 5), S(M_TOTAL, 5)}},
    {"INT4 floor(n/2)", FX_INT4, NET, 0, ID, BUF(0, 0),
     {S(M_SIZE, 2), S(M_TOTAL, 2)}},
    {"empty tensor with bytes", FX_EMPTY, NET, 0, ID, BUF(0, 0),
     {S(M_SIZE, 4), S(M_TOTAL, 4)}},
    {"STRIDED past the end", FX_STRIDED, NET, 0, ID, BUF(0, 0),
     {S(M_ORIGIN, 1), SI(M_STRIDE, 0, 3), SI(M_STRIDE, 1, 1)}},
    {"STRIDED below zero", FX_STRIDED, NET, 0, ID, AT(A_PARAMS, 0),
     {S(M_ORIGIN, 2), SI(M_STRIDE, 0, -2), SI(M_STRIDE, 1, -1)}},
    {"STRIDED INT64_MIN stride", FX_STRIDED, NET, 0, ID, AT(A_PARAMS, 0),
     {S(M_ORIGIN, 1ull << 62), SI(M_STRIDE, 0, INT64_MIN)}},
    {"STRIDED negative span overflows", FX_STRIDED, NET, 0, ID,
     AT(A_PARAMS, 16), {SI(M_STRIDE, 1, INT64_MIN)}},
    {"STRIDED positive span overflows", FX_STRIDED, NET, 0, ID,
     AT(A_PARAMS, 16), {SI(M_STRIDE, 0, 2), SI(M_STRIDE, 1, INT64_MAX)}},
    {"STRIDED origin at the top", FX_STRIDED, NET, 0, ID, AT(A_PARAMS, 0),
     {S(M_ORIGIN, UINT64_MAX), SI(M_STRIDE, 0, 0), SI(M_STRIDE, 1, 0)}},
    {"STRIDED span bytes overflow", FX_STRIDED, NET, 0, ID, AT(A_PARAMS, 0),
     {S(M_ORIGIN, 1ull << 62)}},
    {"STRIDED empty with bytes", FX_STRIDED, NET, 0, ID, BUF(0, 0),
     {SI(M_SHAPE, 1, 0)}},
    {"TILED padded count overflows", FX_TILED, NET, 0, ID, AT(A_PARAMS, 0),
     {S(M_ELEM, HR_ELEM_UINT8), SI(M_SHAPE, 0, UINT64_MAX),
      SI(M_SHAPE, 1, 1)}},
    {"PANEL padded count overflows", FX_PANEL, NET, 0, ID, AT(A_ABS, 7),
     {S(M_ELEM, HR_ELEM_UINT8), SI(M_SHAPE, 0, UINT64_MAX),
      SI(M_SHAPE, 1, 1)}},
    {"COO indices overflow", FX_COO, NET, 0, ID, AT(A_PARAMS, 0),
     {S(M_NNZ, 1ull << 62)}},
    {"CSR indices overflow", FX_CSR, NET, 0, ID, AT(A_PARAMS, 0),
     {S(M_NNZ, 1ull << 62)}},
    {"CSR indptr count overflows", FX_CSR, NET, 0, ID, AT(A_PARAMS, 0),
     {S(M_ELEM, HR_ELEM_UINT8), SI(M_SHAPE, 0, UINT64_MAX),
      SI(M_SHAPE, 1, 1)}},
    {"BSR values overflow", FX_BSR, NET, 0, ID, AT(A_PARAMS, 8),
     {S(M_NNZ, 1ull << 62)}},
    /* Several faults: the first in wire order is reported. */
    {"size before alignment", FX_ROW_MAJOR, NET, 0, ID, BUF(0, 0),
     {S(M_SIZE, 20), S(M_TOTAL, 20), S(M_ALIGN, 22)}},
    {"buffer 0 size before buffer 1 sync_mode", FX_CSR, NET, 0, ID,
     BUF(0, 0), {SI(M_SIZE, 0, 0), SI(M_SYNC, 1, 0xFF)}},
    {"STRIDED span before buffer_count", FX_STRIDED, NET, 0, ID,
     AT(A_PARAMS, 0),
     {S(M_ORIGIN, 0), SI(M_STRIDE, 0, -1), S(M_BUF_COUNT, 2)}},
    {"layout before element type fit", FX_ROW_MAJOR, NET, 0, ID, AT(A_ABS, 4),
     {S(M_ELEM, HR_ELEM_NONE), S(M_TAG, 0x0C)}},
    {"composite head before transport", FX_TUPLE, NET, 0, CI, AT(A_PARAMS, 0),
     {S(M_MEMBERS, 0), S(M_TOTAL_SHARDS, 0)}},
    {"buffer_count before composite total", FX_TUPLE, NET, 0, ID,
     AT(A_BUF_COUNT, 0), {S(M_BUF_COUNT, 1), S(M_TOTAL, 5)}},
    /* Transport fields (§ 10, § 9). */
    {"data_plane 3", FX_ROW_MAJOR, NET, 0, MP, AT(A_XPORT, 12),
     {S(M_PLANE, 3)}},
    {"total_data_bytes off by one", FX_ROW_MAJOR, NET, 0, ID, AT(A_XPORT, 0),
     {S(M_TOTAL, 23)}},
    {"buffer sizes sum overflows", FX_EXTENSION, NET, 0, ID, BUF(1, 0),
     {SI(M_SIZE, 0, UINT64_MAX), SI(M_SIZE, 1, 1)}},
    {"unsharded shard_index 1", FX_ROW_MAJOR, NET, 0, ID, AT(A_XPORT, 8),
     {S(M_SHARD_INDEX, 1), S(M_TOTAL_SHARDS, 2)}},
    {"unsharded total_shards 0", FX_ROW_MAJOR, NET, 0, ID, AT(A_XPORT, 10),
     {S(M_TOTAL_SHARDS, 0)}},
    {"unsharded total_shards 2", FX_ROW_MAJOR, NET, 0, ID, AT(A_XPORT, 10),
     {S(M_TOTAL_SHARDS, 2)}},
    {"sharded total_shards 0", FX_SHARD, NET, 0, ID, AT(A_XPORT, 10),
     {S(M_SHARD_INDEX, 0), S(M_TOTAL_SHARDS, 0)}},
    {"shard_index = total_shards", FX_SHARD, NET, 0, ID, AT(A_XPORT, 8),
     {S(M_SHARD_INDEX, 3)}},
    {"shard_index above total_shards", FX_SHARD, LOCAL, 0, ID,
     AT(A_XPORT, 8), {S(M_SHARD_INDEX, 65535)}},
};

static const hr_wire_ctx ctx_net = {HR_TRANSPORT_NETWORK, 0};
static const hr_wire_ctx ctx_local = {HR_TRANSPORT_LOCAL, 0};

static void expect(int rv, const hr_wire_status *st, const char *name,
                   const char *path, uint32_t code, uint32_t offset) {
  if (rv != HR_ERR_PROTO)
    fail_msg("%s (%s): returned %d, want HR_ERR_PROTO", name, path, rv);
  if (st->code != code || st->offset != offset)
    fail_msg("%s (%s): code %u at %u (%s), want %u at %u", name, path,
             st->code, st->offset, st->reason, code, offset);
  assert_non_null(st->reason);
}

/* A case's descriptor: fixture `fx` with mutations `m` (up to 6, ending
 * at M_END), and the context and transport fields (*xp: NULL or `x`) of
 * `transport`. */
static void case_build(uint8_t fx, uint8_t transport, const mut *m,
                       hr_descriptor *d, hr_transport_fields *x,
                       const hr_wire_ctx **ctx,
                       const hr_transport_fields **xp) {
  fx_build(fx, d, x);
  for (unsigned k = 0; k < 6 && m[k].field != M_END; k++)
    apply(d, x, &m[k]);
  *ctx = transport == LOCAL ? &ctx_local : &ctx_net;
  *xp = transport == NET_NO_XPORT ? NULL : x;
}

static void test_rejections(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof rejects / sizeof rejects[0]; i++) {
    const reject_case *c = &rejects[i];
    hr_descriptor d;
    hr_transport_fields x;
    hr_wire_status st = {0};
    const hr_wire_ctx *ctx;
    const hr_transport_fields *xp;
    case_build(c->fx, c->transport, c->m, &d, &x, &ctx, &xp);
    uint32_t at = resolve(c->at, &d);

    /* A sender's check of the struct. */
    expect(hr_descriptor_validate(&d, xp, ctx, BASE, &st), &st, c->name,
           "struct", c->code, BASE + at);
    /* A NULL status is allowed. */
    assert_int_equal(hr_descriptor_validate(&d, xp, ctx, BASE, NULL),
                     HR_ERR_PROTO);

    /* A receiver's check of the same descriptor off the wire. */
    if (c->struct_only || xp == NULL || hr__desc_encoded_size(&d) < 0)
      continue;
    uint8_t buf[BUF_CAP];
    hr_descriptor dec;
    hr_transport_fields xdec;
    size_t n = fx_encode(&d, &x, buf, sizeof buf);
    memset(&st, 0, sizeof st);
    expect(fx_decode_validate(buf, n, BASE, ctx, &dec, &xdec, &st), &st,
           c->name, "wire", c->code, BASE + at);
  }
}

/* ---- valid corner cases ------------------------------------------------- */

typedef struct accept_case {
  const char *name;
  uint8_t fx;
  uint8_t transport;
  mut m[6];
} accept_case;

static const accept_case accepts[] = {
    {"local CUDA SYNC_EVENT with index and offset", FX_ROW_MAJOR, LOCAL,
     {S(M_DEVICE_ALL, HR_DEV_CUDA), S(M_SYNC, HR_SYNC_EVENT),
      S(M_DEVINDEX, 3), S(M_BYTE_OFFSET, 4096)}},
    {"local byte_offset with frames", FX_COO, LOCAL,
     {S(M_BYTE_OFFSET, 1)}},
    {"network SHM byte_offset", FX_ROW_MAJOR, NET,
     {S(M_BYTE_OFFSET, 4096), S(M_PLANE, HR_PLANE_SHM)}},
    {"network RDMA plane", FX_CSR, NET, {S(M_PLANE, HR_PLANE_RDMA)}},
    {"network CUDA PINNED producer-synced", FX_CSR, NET,
     {S(M_DEVICE_ALL, HR_DEV_CUDA), SI(M_MEMCLASS, 1, HR_MEM_PINNED)}},
    {"extension device tag", FX_ROW_MAJOR, NET, {S(M_DEVICE_ALL, 0xFE)}},
    {"HEXAGON UNIFIED", FX_ROW_MAJOR, NET,
     {S(M_DEVICE_ALL, HR_DEV_HEXAGON), S(M_MEMCLASS, HR_MEM_UNIFIED)}},
    {"alignment 0 and 21", FX_CSR, NET,
     {SI(M_ALIGN, 0, 0), SI(M_ALIGN, 2, 21)}},
    {"STRIDED larger buffer", FX_STRIDED, NET,
     {S(M_SIZE, 32), S(M_TOTAL, 32)}},
    {"STRIDED negative strides", FX_STRIDED, NET,
     {S(M_ORIGIN, 5), SI(M_STRIDE, 0, -3), SI(M_STRIDE, 1, -1)}},
    {"STRIDED zero strides (broadcast)", FX_STRIDED, NET,
     {SI(M_STRIDE, 0, 0), SI(M_STRIDE, 1, 0), S(M_SIZE, 4), S(M_TOTAL, 4)}},
    {"STRIDED empty, wild strides", FX_STRIDED, NET,
     {SI(M_SHAPE, 0, 0), S(M_ORIGIN, UINT64_MAX), SI(M_STRIDE, 1, INT64_MIN),
      S(M_SIZE, 0), S(M_TOTAL, 0)}},
    {"TILED tiles larger than the shape", FX_TILED, NET,
     {SI(M_TILE, 0, 8), SI(M_TILE, 1, 8), S(M_SIZE, 256), S(M_TOTAL, 256)}},
    {"TILED empty", FX_TILED, NET,
     {SI(M_SHAPE, 1, 0), S(M_SIZE, 0), S(M_TOTAL, 0)}},
    {"PANEL mr above the rows", FX_PANEL, NET,
     {S(M_EXT, META_MR16), SI(M_SHAPE, 0, 3), S(M_SIZE, 16 * 3 * 4),
      S(M_TOTAL, 16 * 3 * 4)}},
    {"PANEL empty", FX_PANEL, NET,
     {SI(M_SHAPE, 0, 0), S(M_SIZE, 0), S(M_TOTAL, 0)}},
    {"PANEL mr 2 exact", FX_PANEL, NET, {S(M_EXT, META_MR2), S(M_SIZE, 120),
                                         S(M_TOTAL, 120)}},
    {"UINT4 even count", FX_INT4, NET,
     {S(M_ELEM, HR_ELEM_UINT4), SI(M_SHAPE, 0, 6)}},
    {"INT4 CONCAT head", FX_CONCAT, NET, {S(M_ELEM, HR_ELEM_INT4)}},
    {"COO rank 1, no non-zeros", FX_COO, NET,
     {S(M_RANK, 1), S(M_NNZ, 0), SI(M_SIZE, 0, 0), SI(M_SIZE, 1, 0),
      S(M_TOTAL, 0)}},
    {"CSR of zero rows", FX_CSR, NET,
     {SI(M_SHAPE, 0, 0), S(M_NNZ, 0), SI(M_SIZE, 0, 4), SI(M_SIZE, 1, 0),
      SI(M_SIZE, 2, 0), S(M_TOTAL, 4)}},
    {"BSR without blocks", FX_BSR, NET,
     {S(M_NNZ, 0), SI(M_SIZE, 1, 0), SI(M_SIZE, 2, 0), S(M_TOTAL, 12)}},
    {"GROUP_QUANTIZED without zero points", FX_GQ, NET,
     {S(M_HZP, 0), S(M_MEMBERS, 2)}},
    {"TUPLE of 65535", FX_TUPLE, NET, {S(M_MEMBERS, 65535)}},
    {"only shard", FX_SHARD, NET,
     {SI(M_PARENT, 0, 2), SI(M_SHARD_OFF, 0, 0), S(M_SHARD_INDEX, 0),
      S(M_TOTAL_SHARDS, 1)}},
    {"empty shard at the parent's end", FX_SHARD, NET,
     {SI(M_SHAPE, 0, 0), SI(M_SHARD_OFF, 0, 6), S(M_SIZE, 0),
      S(M_TOTAL, 0)}},
    {"zero dimension beside huge ones", FX_EMPTY, NET,
     {SI(M_SHAPE, 1, UINT64_MAX), S(M_RANK, 3), SI(M_SHAPE, 2, UINT64_MAX)}},
    {"extension layout, 8 odd buffers", FX_EXTENSION, NET,
     {S(M_BUF_COUNT, 8), SI(M_SIZE, 7, 1), S(M_TOTAL, 257)}},
    {"no transport fields", FX_BSR, NET_NO_XPORT, {S(M_TOTAL, 12345)}},
};

static void test_accepts(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof accepts / sizeof accepts[0]; i++) {
    const accept_case *c = &accepts[i];
    hr_descriptor d;
    hr_transport_fields x;
    hr_wire_status st = {0};
    const hr_wire_ctx *ctx;
    const hr_transport_fields *xp;
    case_build(c->fx, c->transport, c->m, &d, &x, &ctx, &xp);
    if (hr_descriptor_validate(&d, xp, ctx, 0, &st) != 0)
      fail_msg("%s: rejected: %s at %u", c->name, st.reason, st.offset);
    if (xp == NULL)
      continue;
    uint8_t buf[BUF_CAP];
    hr_descriptor dec;
    hr_transport_fields xdec;
    size_t n = fx_encode(&d, &x, buf, sizeof buf);
    if (fx_decode_validate(buf, n, 0, ctx, &dec, &xdec, &st) != 0)
      fail_msg("%s: rejected off the wire: %s at %u", c->name, st.reason,
               st.offset);
    fx_assert_desc_equal(&d, &dec);
  }
}

/* The ctx may be NULL: a network transport. */
static void test_null_ctx_is_network(void **state) {
  (void)state;
  hr_descriptor d;
  hr_transport_fields x;
  hr_wire_status st;
  fx_build(FX_ROW_MAJOR, &d, &x);
  assert_int_equal(hr_descriptor_validate(&d, &x, NULL, 0, &st), 0);
  d.buffers[0].device_index = 1;
  assert_int_equal(hr_descriptor_validate(&d, &x, NULL, 0, &st),
                   HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  assert_int_equal(hr_descriptor_validate(NULL, &x, NULL, 0, &st),
                   HR_ERR_INVALID_ARGUMENT);
}

/* ---- buffer sizes and element counts ------------------------------------ */

static void test_buffer_sizes(void **state) {
  (void)state;
  for (int k = 0; k < FX_COUNT; k++) {
    hr_descriptor d;
    hr_transport_fields x;
    uint64_t sizes[HR_MAX_BUFFERS];
    hr_wire_status st;
    fx_build(k, &d, &x);
    int n = hr_descriptor_buffer_sizes(&d, sizes, &st);
    if (k == FX_EXTENSION) {
      assert_int_equal(n, HR_ERR_UNSUPPORTED);
      continue;
    }
    print_message("fixture %s\n", fx_names[k]);
    assert_int_equal(n, d.buffer_count);
    for (int i = 0; i < n; i++)
      assert_int_equal(sizes[i], d.buffers[i].size_bytes);
  }
  /* STRIDED gives the addressed span, a minimum. */
  hr_descriptor d;
  hr_transport_fields x;
  uint64_t sizes[HR_MAX_BUFFERS];
  hr_wire_status st;
  fx_build(FX_STRIDED, &d, &x);
  d.params.origin = 3;
  d.params.strides[0] = 10;
  d.params.strides[1] = -1;
  /* highest element 3 + 10, lowest 3 - 2: 14 elements */
  assert_int_equal(hr_descriptor_buffer_sizes(&d, sizes, &st), 1);
  assert_int_equal(sizes[0], 14 * 4);
  /* Bad parameters are reported as validation would, offsets from the
   * descriptor's first byte. */
  d.params.strides[1] = -4;
  assert_int_equal(hr_descriptor_buffer_sizes(&d, sizes, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_INVALID_DESCRIPTOR);
  assert_int_equal(st.offset, 23);
  fx_build(FX_TUPLE, &d, &x);
  d.params.member_count = 0;
  assert_int_equal(hr_descriptor_buffer_sizes(&d, sizes, &st), HR_ERR_PROTO);
  assert_int_equal(st.code, HR_WIRE_COMPOSITE_INVALID);
  assert_int_equal(hr_descriptor_buffer_sizes(NULL, sizes, &st),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_descriptor_buffer_sizes(&d, NULL, &st),
                   HR_ERR_INVALID_ARGUMENT);
}

static void test_shape_elements(void **state) {
  (void)state;
  uint64_t n = 7;
  const uint64_t s[] = {2, 3, 4};
  assert_int_equal(hr_shape_elements(s, 3, &n), 0);
  assert_int_equal(n, 24);
  assert_int_equal(hr_shape_elements(NULL, 0, &n), 0);
  assert_int_equal(n, 1);
  const uint64_t big[] = {1ull << 32, 1ull << 32};
  assert_int_equal(hr_shape_elements(big, 2, &n), HR_ERR_INVALID_ARGUMENT);
  const uint64_t edge[] = {1ull << 32, (1ull << 32) - 1};
  assert_int_equal(hr_shape_elements(edge, 2, &n), 0);
  assert_int_equal(n, (1ull << 32) * ((1ull << 32) - 1));
  /* A zero anywhere makes the product 0, even after a would-be overflow. */
  const uint64_t zero_last[] = {UINT64_MAX, UINT64_MAX, 0};
  assert_int_equal(hr_shape_elements(zero_last, 3, &n), 0);
  assert_int_equal(n, 0);
  uint64_t shape33[33] = {0};
  assert_int_equal(hr_shape_elements(shape33, 33, &n),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_shape_elements(NULL, 1, &n), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_shape_elements(s, 3, NULL), HR_ERR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rejections),
      cmocka_unit_test(test_accepts),
      cmocka_unit_test(test_null_ctx_is_network),
      cmocka_unit_test(test_buffer_sizes),
      cmocka_unit_test(test_shape_elements),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
