/*
 * The tensor descriptor (wire-v1 §§ 4, 5, 5.1, 7, 10, 17, 18 and ADR-018):
 * layout entries, the descriptor and transport field codec, validation,
 * buffer sizes and the registered layout profiles.
 *
 * Decoding only frames: it reads every field as it is on the wire and stops
 * early only where a value would overflow a fixed array (rank > 32,
 * buffer_count > 8).  hr_descriptor_validate() then applies every rule in
 * the order the fields travel, so that a descriptor with several faults is
 * reported at its first faulty field:
 *
 *   version, element type, rank, flags, layout tag (and PANEL metadata),
 *   element type x layout, rank x layout, shape overflow, layout_params
 *   length, layout_params values (composite heads: COMPOSITE_INVALID) and
 *   the buffer sizes they imply (overflow, STRIDED span), byte_offset,
 *   shard box, buffer_count, then per buffer handle its size and fields
 *   (sync_mode: INVALID_SYNC_MODE), transport fields.
 *
 * All size arithmetic is done in u64 with overflow checks; nothing here
 * allocates.
 */
#include <string.h>

#include "hr_desc_codec.h"

/* ------------------------------------------------------------------------ */
/* Per-layout facts (§ 5)                                                    */
/* ------------------------------------------------------------------------ */

/* How a layout's layout_params are sized. */
enum params_kind {
  PARAMS_FIXED,  /* params_fixed + params_per_dim * rank bytes, parsed */
  PARAMS_RULE,   /* composite head: 5 bytes plus the rule's parameters */
  PARAMS_OPAQUE  /* unregistered extension: any bytes, carried raw */
};

/* buffer_count of an unregistered extension layout: any of 1..8. */
#define BUFFERS_AT_LEAST_ONE 0xFFu

typedef struct layout_info {
  uint8_t buffers;        /* exact buffer count or BUFFERS_AT_LEAST_ONE */
  uint8_t rank_min;       /* smallest legal rank */
  uint8_t rank_max;       /* largest legal rank */
  uint8_t params;         /* enum params_kind */
  uint8_t params_fixed;   /* PARAMS_FIXED: bytes independent of rank */
  uint8_t params_per_dim; /* PARAMS_FIXED: bytes per dimension */
} layout_info;

static const layout_info layouts_core[] = {
  [HR_LAYOUT_ROW_MAJOR] = {1, 0, HR_MAX_RANK, PARAMS_FIXED, 0, 0},
  [HR_LAYOUT_COLUMN_MAJOR] = {1, 0, HR_MAX_RANK, PARAMS_FIXED, 0, 0},
  /* u64 origin, i64 strides[rank] */
  [HR_LAYOUT_STRIDED] = {1, 0, HR_MAX_RANK, PARAMS_FIXED, 8, 8},
  /* u8 order[rank] */
  [HR_LAYOUT_PERMUTED] = {1, 0, HR_MAX_RANK, PARAMS_FIXED, 0, 1},
  /* u32 tile[rank] */
  [HR_LAYOUT_TILED] = {1, 0, HR_MAX_RANK, PARAMS_FIXED, 0, 4},
  /* u64 nnz, u8 index_type, u8 sorted */
  [HR_LAYOUT_SPARSE_COO] = {2, 1, HR_MAX_RANK, PARAMS_FIXED, 10, 0},
  /* u64 nnz, u8 index_type */
  [HR_LAYOUT_SPARSE_CSR] = {3, 2, 2, PARAMS_FIXED, 9, 0},
  [HR_LAYOUT_SPARSE_CSC] = {3, 2, 2, PARAMS_FIXED, 9, 0},
  /* u32 br, u32 bc, u64 nnz_blocks, u8 index_type */
  [HR_LAYOUT_SPARSE_BSR] = {3, 2, 2, PARAMS_FIXED, 17, 0},
  [HR_LAYOUT_COMPOSITE] = {0, 0, HR_MAX_RANK, PARAMS_RULE, 0, 0},
};

/* PANEL's mr travels in the layout entry's ext_metadata: layout_params are
 * empty (§ 5.1). */
static const layout_info layout_panel = {1, 2, 2, PARAMS_FIXED, 0, 0};
static const layout_info layout_extension = {
    BUFFERS_AT_LEAST_ONE, 0, HR_MAX_RANK, PARAMS_OPAQUE, 0, 0};

/* Returns the facts of a layout a descriptor may carry, or NULL for tags a
 * descriptor must not carry (0x00, 0x0A, 0x0C-0xEF, 0xF1, 0xF2, 0xFF). */
static const layout_info *layout_lookup(uint8_t tag) {
  if (tag >= HR_LAYOUT_ROW_MAJOR && tag <= HR_LAYOUT_COMPOSITE &&
      tag != 0x0A)
    return &layouts_core[tag];
  if (tag == HR_LAYOUT_PANEL)
    return &layout_panel;
  if (tag > HR_LAYOUT_PERMUTED_EXACT && tag <= HR_LAYOUT_EXT_LAST)
    return &layout_extension;
  return NULL;
}

static int is_ext_tag(uint8_t tag) {
  return tag >= HR_LAYOUT_EXT_FIRST && tag <= HR_LAYOUT_EXT_LAST;
}

/* Extra layout_params bytes of each composite rule after member_count and
 * rule (§ 7.3); -1 for rules v1 does not define. */
static int composite_rule_extra(uint8_t rule) {
  switch (rule) {
  case HR_COMPOSITE_TUPLE: return 0;
  case HR_COMPOSITE_CONCAT: return 1;          /* u8 axis */
  case HR_COMPOSITE_GROUP_QUANTIZED: return 6; /* u8, u32, u8 */
  default: return -1;
  }
}
#define COMPOSITE_PARAMS_HEAD 5u /* u32 member_count, u8 rule */

/*
 * Length of layout_params as the encoder writes them: fixed by the layout
 * (and the composite rule) for layouts with parsed parameters, the raw
 * bytes' length for every other tag.  A composite head with an undefined
 * rule is written with member_count and rule only.
 */
static uint32_t params_encoded_len(const hr_descriptor *d) {
  const layout_info *li = layout_lookup(d->layout.tag);
  if (li == NULL || li->params == PARAMS_OPAQUE)
    return d->params_len;
  if (li->params == PARAMS_RULE) {
    int extra = composite_rule_extra(d->params.rule);
    return COMPOSITE_PARAMS_HEAD + (extra > 0 ? (uint32_t)extra : 0);
  }
  return li->params_fixed + (uint32_t)li->params_per_dim * d->rank;
}

/* Bytes per sparse index of an index_type, 0 when it is not INT32/INT64. */
static unsigned index_bytes(uint8_t index_type) {
  if (index_type == HR_ELEM_INT32)
    return 4;
  if (index_type == HR_ELEM_INT64)
    return 8;
  return 0;
}

/* Returns 1 when order[0..rank) is a permutation of 0..rank-1. */
static int is_permutation(const uint8_t *order, unsigned rank) {
  uint32_t seen = 0;
  for (unsigned k = 0; k < rank; k++) {
    if (order[k] >= rank || (seen & (1u << order[k])))
      return 0;
    seen |= 1u << order[k];
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Sizes                                                                     */
/* ------------------------------------------------------------------------ */

int hr_shape_elements(const uint64_t *shape, unsigned rank, uint64_t *out) {
  if (out == NULL || rank > HR_MAX_RANK || (shape == NULL && rank > 0))
    return HR_ERR_INVALID_ARGUMENT;
  /* The product is the true product: a zero dimension makes it 0 however
   * large the others are, so zeros are looked for before multiplying. */
  for (unsigned k = 0; k < rank; k++) {
    if (shape[k] == 0) {
      *out = 0;
      return 0;
    }
  }
  uint64_t n = 1;
  for (unsigned k = 0; k < rank; k++)
    if (!hr__mul_u64(n, shape[k], &n))
      return HR_ERR_INVALID_ARGUMENT;
  *out = n;
  return 0;
}

/* Bytes taken by n elements of `bits` bits: 4-bit types pack two per byte
 * (ceil(n/2), § 4).  Returns 0 on overflow. */
static int elem_bytes(uint64_t n, unsigned bits, uint64_t *out) {
  if (bits % 8 == 0)
    return hr__mul_u64(n, bits / 8, out);
  *out = n / 2 + (n & 1);
  return 1;
}

/* ceil(a/b)*b, b >= 1.  Returns 0 on overflow. */
static int round_up_u64(uint64_t a, uint64_t b, uint64_t *out) {
  uint64_t q = a / b + (a % b != 0);
  return hr__mul_u64(q, b, out);
}

/* ------------------------------------------------------------------------ */
/* Field offsets                                                             */
/* ------------------------------------------------------------------------ */

/* Byte offsets of a descriptor's fields, counted from its first byte. */
typedef struct desc_offsets {
  uint32_t layout;       /* the layout entry */
  uint32_t shape;        /* u64 shape[rank] */
  uint32_t params_len;   /* u16 layout_params length */
  uint32_t params;       /* the layout_params bytes */
  uint32_t byte_offset;  /* u64 byte_offset */
  uint32_t parent_shape; /* HAS_SHARD: u64 parent_shape[rank] */
  uint32_t shard_offset; /* HAS_SHARD: u64 shard_offset[rank] */
  uint32_t buffer_count; /* u8 buffer_count */
  uint32_t buffers;      /* 16-byte buffer handles */
  uint32_t end;          /* first byte after the descriptor */
} desc_offsets;

#define BUF_SIZE 0u      /* u64 size_bytes */
#define BUF_ALIGN 8u     /* u8 alignment_log2 */
#define BUF_DEVICE 9u    /* u8 device_tag */
#define BUF_MEMCLASS 10u /* u8 memory_class */
#define BUF_INDEX 11u    /* u16 device_index */
#define BUF_SYNC 13u     /* u8 sync_mode */
#define BUF_RESERVED 14u /* u8[2] reserved */
#define BUF_HANDLE_SIZE 16u

#define XP_TOTAL 0u   /* u64 total_data_bytes */
#define XP_INDEX 8u   /* u16 shard_index */
#define XP_SHARDS 10u /* u16 total_shards */
#define XP_PLANE 12u  /* u8 data_plane */

size_t hr__layout_entry_size(const hr_layout_entry *e) {
  return is_ext_tag(e->tag) ? 3u + e->ext_len : 1u;
}

/* Fills `o` for a descriptor whose layout_params take `params_len` bytes.
 * Rank and buffer_count are clamped to their caps so that the offsets stay
 * meaningful for any input (callers reject larger values first). */
static void desc_offsets_compute(const hr_descriptor *d, uint32_t params_len,
                                 desc_offsets *o) {
  uint32_t rank = d->rank <= HR_MAX_RANK ? d->rank : HR_MAX_RANK;
  uint32_t nbuf = d->buffer_count <= HR_MAX_BUFFERS ? d->buffer_count
                                                    : HR_MAX_BUFFERS;
  uint32_t shard = (d->flags & HR_DESC_HAS_SHARD) ? 8u * rank : 0;
  o->layout = 4;
  o->shape = o->layout + (uint32_t)hr__layout_entry_size(&d->layout);
  o->params_len = o->shape + 8u * rank;
  o->params = o->params_len + 2;
  o->byte_offset = o->params + params_len;
  o->parent_shape = o->byte_offset + 8;
  o->shard_offset = o->parent_shape + shard;
  o->buffer_count = o->shard_offset + shard;
  o->buffers = o->buffer_count + 1;
  o->end = o->buffers + BUF_HANDLE_SIZE * nbuf;
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */
/* ------------------------------------------------------------------------ */

/* What every check needs: the descriptor, where its fields are, and where
 * to report. */
typedef struct vctx {
  const hr_descriptor *d;
  const layout_info *li; /* set once the layout tag is known to be legal */
  unsigned bits;         /* element storage bits (0: NONE) */
  uint32_t mr;           /* PANEL height, from the layout entry */
  uint32_t base;         /* offset of the descriptor in its message */
  desc_offsets off;
  hr_wire_status *st;
  /* Buffer sizes the layout implies, once check_static() passed. */
  int sized;                      /* 0: an extension layout, unknown */
  int minimum;                    /* need[0] is a lower bound (STRIDED) */
  unsigned nneed;                 /* the layout's buffer count */
  uint64_t need[HR_MAX_BUFFERS];  /* required size_bytes */
} vctx;

static int fail(const vctx *v, uint32_t code, uint32_t off,
                const char *reason) {
  return HR_FAIL(v->st, code, v->base + off, reason);
}
static int bad(const vctx *v, uint32_t off, const char *reason) {
  return fail(v, HR_WIRE_INVALID_DESCRIPTOR, off, reason);
}

/* Element type alone (§ 4): reserved 0x14-0xEF, extension 0xF0-0xFE (which
 * v1 cannot size) and 0xFF are rejected. */
static int check_element_type(vctx *v) {
  uint8_t e = v->d->element_type;
  if (e > HR_ELEM_LAST)
    return bad(v, 1, e >= 0xF0 && e != 0xFF
                         ? "descriptor.element_type: extension element "
                           "types cannot be sized by a v1 reader"
                         : "descriptor.element_type: reserved or invalid");
  v->bits = hr_elem_bits(e);
  return 0;
}

/* Layout tag and, for PANEL, its ext_metadata (§ 5, § 5.1). */
static int check_layout_tag(vctx *v) {
  const hr_descriptor *d = v->d;
  uint8_t tag = d->layout.tag;
  if (tag == HR_LAYOUT_TILED_EXACT || tag == HR_LAYOUT_PERMUTED_EXACT)
    return bad(v, v->off.layout,
               "descriptor.layout: TILED_EXACT/PERMUTED_EXACT are "
               "preferences, never a descriptor's layout");
  v->li = layout_lookup(tag);
  if (v->li == NULL)
    return bad(v, v->off.layout,
               "descriptor.layout: tag invalid or reserved in a descriptor");
  if (is_ext_tag(tag) && d->layout.ext_len > 0 && d->layout.ext == NULL)
    return bad(v, v->off.layout + 1,
               "descriptor.layout: ext_metadata missing");
  if (tag == HR_LAYOUT_PANEL) {
    /* The metadata is read here, not from d->params.mr: the entry is what
     * travels. */
    if (d->layout.ext_len != 4)
      return bad(v, v->off.layout + 1,
                 "descriptor.layout: PANEL needs exactly one u32 mr");
    v->mr = hr_load_u32(d->layout.ext);
    if (v->mr == 0)
      return bad(v, v->off.layout + 3,
                 "descriptor.layout: PANEL mr must be >= 1");
  }
  return 0;
}

/* Rules joining the element type or the rank to the layout. */
static int check_layout_fit(vctx *v) {
  const hr_descriptor *d = v->d;
  uint8_t tag = d->layout.tag;
  if (d->element_type == HR_ELEM_NONE && tag != HR_LAYOUT_COMPOSITE)
    return bad(v, 1, "descriptor.element_type: NONE only for composite "
                     "TUPLE heads");
  /* A composite head owns no buffer, so the INT4 packing rule has nothing
   * to constrain there (a CONCAT of INT4 members has an INT4 head). */
  if ((d->element_type == HR_ELEM_INT4 || d->element_type == HR_ELEM_UINT4) &&
      tag != HR_LAYOUT_ROW_MAJOR && tag != HR_LAYOUT_COMPOSITE)
    return bad(v, 1, "descriptor.element_type: INT4/UINT4 only with "
                     "ROW_MAJOR");
  if (d->rank < v->li->rank_min || d->rank > v->li->rank_max)
    return bad(v, 2, v->li->rank_min == 2 && v->li->rank_max == 2
                         ? "descriptor.rank: the layout needs rank 2"
                         : "descriptor.rank: the layout needs rank >= 1");
  return 0;
}

/* shape product x element size must fit u64 (§ 17), for the tensor and,
 * with HAS_SHARD, for the parent a receiver reassembles into. */
static int shape_fits(const uint64_t *shape, unsigned rank, unsigned bits) {
  uint64_t n, bytes;
  if (hr_shape_elements(shape, rank, &n) != 0)
    return 0;
  return elem_bytes(n, bits, &bytes);
}

/* layout_params length against the layout (§ 7: exact per layout).  Only a
 * decoded descriptor (params_raw set) can disagree: an application's
 * parsed `params` are written at exactly the expected length. */
static int check_params_len(vctx *v) {
  const hr_descriptor *d = v->d;
  const layout_info *li = v->li;
  if (li->params == PARAMS_OPAQUE) {
    if (d->params_len > 0 && d->params_raw == NULL)
      return bad(v, v->off.params_len,
                 "descriptor.layout_params: opaque parameters missing");
    return 0;
  }
  if (d->params_raw == NULL)
    return 0;
  if (li->params == PARAMS_RULE) {
    if (d->params_len < COMPOSITE_PARAMS_HEAD)
      return bad(v, v->off.params_len, "descriptor.layout_params: a "
                                       "composite head needs member_count "
                                       "and rule");
    /* An undefined rule has no length to compare with: the head's checks
     * report it (COMPOSITE_INVALID). */
    if (composite_rule_extra(d->params.rule) < 0)
      return 0;
  }
  if (d->params_len != params_encoded_len(d))
    return bad(v, v->off.params_len,
               "descriptor.layout_params: wrong length for the layout");
  return 0;
}

/* Head values of a composite (§ 7.3, § 18 Composites): COMPOSITE_INVALID
 * except where § 18 keeps INVALID_DESCRIPTOR (length, buffer_count). */
static int check_composite_head(vctx *v) {
  const hr_descriptor *d = v->d;
  const hr_layout_params *p = &d->params;
  uint32_t at = v->off.params;
  const uint32_t ci = HR_WIRE_COMPOSITE_INVALID;
  if (d->flags & HR_DESC_HAS_SHARD)
    return fail(v, ci, 3, "descriptor.flags: composites are never sharded");
  if (p->member_count < 1 || p->member_count > HR_MAX_COMPOSITE_MEMBERS)
    return fail(v, ci, at,
                "descriptor.layout_params: member_count must be 1-65535");
  if (composite_rule_extra(p->rule) < 0)
    return fail(v, ci, at + 4, "descriptor.layout_params: unknown rule");
  if (p->rule == HR_COMPOSITE_TUPLE) {
    if (d->element_type != HR_ELEM_NONE)
      return fail(v, ci, 1, "descriptor.element_type: a TUPLE head is NONE");
    if (d->rank != 0)
      return fail(v, ci, 2, "descriptor.rank: a TUPLE head has rank 0");
    return 0;
  }
  if (d->element_type == HR_ELEM_NONE)
    return fail(v, ci, 1,
                "descriptor.element_type: NONE only for TUPLE heads");
  if (p->axis >= d->rank)
    return fail(v, ci, at + 5, "descriptor.layout_params: axis >= rank");
  if (p->rule == HR_COMPOSITE_GROUP_QUANTIZED) {
    if (p->group_size == 0)
      return fail(v, ci, at + 6,
                  "descriptor.layout_params: group_size must be >= 1");
    if (p->has_zero_point > 1)
      return fail(v, ci, at + 10,
                  "descriptor.layout_params: has_zero_point is 0 or 1");
    if (p->member_count != 2u + p->has_zero_point)
      return fail(v, ci, at,
                  "descriptor.layout_params: GROUP_QUANTIZED member_count "
                  "is 2 + has_zero_point");
  }
  return 0;
}

/* The values of layout_params (§ 5, § 18 Layouts). */
static int check_params_values(vctx *v) {
  const hr_descriptor *d = v->d;
  const hr_layout_params *p = &d->params;
  uint32_t at = v->off.params;
  switch (d->layout.tag) {
  case HR_LAYOUT_PERMUTED:
    if (!is_permutation(p->order, d->rank))
      return bad(v, at, "descriptor.layout_params: PERMUTED order is not a "
                        "permutation of 0..rank-1");
    return 0;
  case HR_LAYOUT_TILED:
    for (unsigned k = 0; k < d->rank; k++)
      if (p->tile[k] == 0)
        return bad(v, at + 4 * k,
                   "descriptor.layout_params: TILED tiles must be >= 1");
    return 0;
  case HR_LAYOUT_SPARSE_COO:
    if (index_bytes(p->index_type) == 0)
      return bad(v, at + 8, "descriptor.layout_params: index_type must be "
                            "INT32 or INT64");
    if (p->sorted > 1)
      return bad(v, at + 9, "descriptor.layout_params: sorted is 0 or 1");
    return 0;
  case HR_LAYOUT_SPARSE_CSR:
  case HR_LAYOUT_SPARSE_CSC:
    if (index_bytes(p->index_type) == 0)
      return bad(v, at + 8, "descriptor.layout_params: index_type must be "
                            "INT32 or INT64");
    return 0;
  case HR_LAYOUT_SPARSE_BSR:
    if (p->br == 0 || p->bc == 0)
      return bad(v, at + (p->br == 0 ? 0 : 4),
                 "descriptor.layout_params: BSR block sides must be >= 1");
    if (d->shape[0] % p->br != 0 || d->shape[1] % p->bc != 0)
      return bad(v, v->off.shape, "descriptor.shape: not a multiple of the "
                                  "BSR block");
    if (index_bytes(p->index_type) == 0)
      return bad(v, at + 16, "descriptor.layout_params: index_type must be "
                             "INT32 or INT64");
    return 0;
  case HR_LAYOUT_COMPOSITE:
    return check_composite_head(v);
  default:
    /* ROW_MAJOR, COLUMN_MAJOR, PANEL: nothing to check; STRIDED: its
     * span is checked by compute_sizes(); unregistered extensions:
     * opaque. */
    return 0;
  }
}

/* Addressed span of a STRIDED tensor in bytes (§ 5): the lowest element
 * must not lie below offset 0 and the span ends after the highest one.
 * Any arithmetic overflow means the tensor addresses outside every
 * possible buffer. */
static int strided_span(vctx *v, uint64_t *span) {
  const hr_descriptor *d = v->d;
  const hr_layout_params *p = &d->params;
  uint64_t up = 0, down = 0, hi, t;
  for (unsigned k = 0; k < d->rank; k++) {
    uint64_t extent = d->shape[k] - 1; /* the tensor is not empty */
    int64_t s = p->strides[k];
    /* |s| as u64 is exact even for INT64_MIN. */
    uint64_t mag = s < 0 ? 0 - (uint64_t)s : (uint64_t)s;
    if (!hr__mul_u64(mag, extent, &t) ||
        !hr__add_u64(s < 0 ? down : up, t, s < 0 ? &down : &up))
      return bad(v, v->off.params + 8 + 8 * k,
                 "descriptor.layout_params: STRIDED addresses outside the "
                 "buffer (overflow)");
  }
  if (down > p->origin)
    return bad(v, v->off.params,
               "descriptor.layout_params: STRIDED lowest element below "
               "offset 0");
  if (!hr__add_u64(p->origin, up, &hi) || !hr__add_u64(hi, 1, &hi) ||
      !elem_bytes(hi, v->bits, span))
    return bad(v, v->off.params,
               "descriptor.layout_params: STRIDED addresses outside the "
               "buffer (overflow)");
  return 0;
}

/*
 * Required buffer sizes (§ 5, § 18 "Buffer sizes are exact") of a
 * descriptor whose fields up to layout_params passed their checks: fills
 * v->need[0..v->nneed) and sets v->minimum when need[0] is a lower bound
 * (a non-empty STRIDED tensor).  Returns 0, HR_ERR_PROTO (overflow) or
 * HR_ERR_UNSUPPORTED (unregistered extension layouts, whose sizes v1
 * cannot know).
 */
static int compute_sizes(vctx *v) {
  const hr_descriptor *d = v->d;
  const hr_layout_params *p = &d->params;
  const char *ovf = "descriptor: buffer size overflows u64";
  uint64_t *sizes = v->need;
  uint64_t elems, t;
  unsigned ib = index_bytes(p->index_type);
  v->minimum = 0;
  v->nneed = v->li->buffers;
  /* check_static() proved the element count and its bytes fit. */
  (void)hr_shape_elements(d->shape, d->rank, &elems);
  switch (d->layout.tag) {
  case HR_LAYOUT_ROW_MAJOR:
  case HR_LAYOUT_COLUMN_MAJOR:
  case HR_LAYOUT_PERMUTED:
    (void)elem_bytes(elems, v->bits, &sizes[0]);
    return 0;
  case HR_LAYOUT_STRIDED:
    if (elems == 0) {
      sizes[0] = 0;
      return 0;
    }
    v->minimum = 1;
    return strided_span(v, &sizes[0]);
  case HR_LAYOUT_TILED:
    t = elems == 0 ? 0 : 1;
    for (unsigned k = 0; k < d->rank && t != 0; k++) {
      uint64_t padded;
      if (!round_up_u64(d->shape[k], p->tile[k], &padded) ||
          !hr__mul_u64(t, padded, &t))
        return bad(v, v->off.params + 4 * k, ovf);
    }
    if (!elem_bytes(t, v->bits, &sizes[0]))
      return bad(v, v->off.params, ovf);
    return 0;
  case HR_LAYOUT_PANEL:
    if (!round_up_u64(d->shape[0], v->mr, &t) ||
        !hr__mul_u64(t, d->shape[1], &t) || !elem_bytes(t, v->bits, &sizes[0]))
      return bad(v, v->off.layout + 3, ovf);
    return 0;
  case HR_LAYOUT_SPARSE_COO:
    /* indices: nnz x rank, row-major; values: nnz */
    if (!hr__mul_u64(p->nnz, d->rank, &t) || !hr__mul_u64(t, ib, &sizes[0]) ||
        !elem_bytes(p->nnz, v->bits, &sizes[1]))
      return bad(v, v->off.params, ovf);
    return 0;
  case HR_LAYOUT_SPARSE_CSR:
  case HR_LAYOUT_SPARSE_CSC:
  case HR_LAYOUT_SPARSE_BSR: {
    /* indptr: (outer + 1) entries over rows (CSR), columns (CSC) or block
     * rows (BSR); indices: one per non-zero (block); values: nnz elements,
     * or nnz_blocks x br x bc. */
    uint64_t outer = d->shape[d->layout.tag == HR_LAYOUT_SPARSE_CSC ? 1 : 0];
    uint64_t vals = p->nnz;
    if (d->layout.tag == HR_LAYOUT_SPARSE_BSR) {
      outer /= p->br;
      if (!hr__mul_u64(vals, p->br, &vals) ||
          !hr__mul_u64(vals, p->bc, &vals))
        return bad(v, v->off.params + 8, ovf);
    }
    if (!hr__add_u64(outer, 1, &t) || !hr__mul_u64(t, ib, &sizes[0]) ||
        !hr__mul_u64(p->nnz, ib, &sizes[1]) ||
        !elem_bytes(vals, v->bits, &sizes[2]))
      return bad(v, v->off.params, ovf);
    return 0;
  }
  case HR_LAYOUT_COMPOSITE:
    v->nneed = 0;
    return 0;
  default:
    v->nneed = 0;
    return HR_ERR_UNSUPPORTED;
  }
}

/*
 * The checks that need nothing but the descriptor's own fields up to
 * layout_params, then the buffer sizes these fields imply (overflow there
 * is a fault of the parameters): everything hr_descriptor_buffer_sizes()
 * relies on.
 */
static int check_static(vctx *v) {
  const hr_descriptor *d = v->d;
  int rv;
  if (d->descriptor_version != 1)
    return bad(v, 0, "descriptor.descriptor_version: must be 1");
  if ((rv = check_element_type(v)) != 0)
    return rv;
  if (d->rank > HR_MAX_RANK)
    return bad(v, 2, "descriptor.rank: at most 32");
  if (d->flags & ~HR_DESC_HAS_SHARD)
    return bad(v, 3, "descriptor.flags: reserved bit set");
  desc_offsets_compute(d, d->params_raw ? d->params_len
                                        : params_encoded_len(d),
                       &v->off);
  if ((rv = check_layout_tag(v)) != 0)
    return rv;
  if ((rv = check_layout_fit(v)) != 0)
    return rv;
  if (!shape_fits(d->shape, d->rank, v->bits))
    return bad(v, v->off.shape,
               "descriptor.shape: shape product x element size overflows "
               "u64");
  if ((rv = check_params_len(v)) != 0)
    return rv;
  if ((rv = check_params_values(v)) != 0)
    return rv;
  rv = compute_sizes(v);
  v->sized = rv != HR_ERR_UNSUPPORTED;
  return rv == HR_ERR_UNSUPPORTED ? 0 : rv;
}

/* byte_offset (§ 7.1, § 18 Transports): frames place the bytes, so only the
 * SHM data plane, or a descriptor handed over locally, may carry one. */
static int check_byte_offset(vctx *v, const hr_transport_fields *x,
                             int local) {
  if (v->d->byte_offset != 0 && !local &&
      !(x != NULL && x->data_plane == HR_PLANE_SHM))
    return bad(v, v->off.byte_offset,
               "descriptor.byte_offset: must be 0 on a network transport "
               "unless data_plane is SHM");
  return 0;
}

/* HAS_SHARD: the shard box lies inside the parent (§ 7, § 9). */
static int check_shard_box(vctx *v) {
  const hr_descriptor *d = v->d;
  if (!(d->flags & HR_DESC_HAS_SHARD))
    return 0;
  if (!shape_fits(d->parent_shape, d->rank, v->bits))
    return bad(v, v->off.parent_shape,
               "descriptor.parent_shape: product x element size overflows "
               "u64");
  for (unsigned k = 0; k < d->rank; k++) {
    /* offset + shape <= parent, written so that it cannot overflow. */
    if (d->shard_offset[k] > d->parent_shape[k] ||
        d->shape[k] > d->parent_shape[k] - d->shard_offset[k])
      return bad(v, v->off.shard_offset + 8 * k,
                 "descriptor.shard_offset: shard_offset + shape exceeds "
                 "parent_shape");
  }
  return 0;
}

static int check_buffer_count(vctx *v) {
  const hr_descriptor *d = v->d;
  uint8_t want = v->li->buffers;
  if (d->buffer_count > HR_MAX_BUFFERS)
    return bad(v, v->off.buffer_count, "descriptor.buffer_count: at most 8");
  if (want == BUFFERS_AT_LEAST_ONE ? d->buffer_count == 0
                                   : d->buffer_count != want)
    return bad(v, v->off.buffer_count,
               d->layout.tag == HR_LAYOUT_COMPOSITE
                   ? "descriptor.buffer_count: a composite head has none"
                   : "descriptor.buffer_count: does not match the layout");
  return 0;
}

/* Device tags 0x09-0xEF are reserved and 0xFF is invalid; extension tags
 * 0xF0-0xFE are legal values (agreed out of band like the HELLO lists). */
static int device_tag_ok(uint8_t tag) {
  return tag <= HR_DEV_LAST || (tag >= 0xF0 && tag != HR_DEV_INVALID);
}

/* One buffer handle (§ 7.2, ADR-018 § 3, § 6), in wire order: its size
 * against the layout (exact, or at least the STRIDED span), then its
 * fields. */
static int check_handle(vctx *v, unsigned i, int local) {
  const hr_buffer_handle *b = &v->d->buffers[i];
  uint32_t at = v->off.buffers + BUF_HANDLE_SIZE * i;
  const uint32_t ism = HR_WIRE_INVALID_SYNC_MODE;
  if (v->sized && (v->minimum ? b->size_bytes < v->need[i]
                              : b->size_bytes != v->need[i]))
    return bad(v, at + BUF_SIZE,
               v->minimum ? "descriptor.buffers.size_bytes: STRIDED "
                            "addresses past the end of the buffer"
                          : "descriptor.buffers.size_bytes: not the size "
                            "the layout implies");
  if (b->alignment_log2 > HR_MAX_ALIGNMENT_LOG2)
    return bad(v, at + BUF_ALIGN, "descriptor.buffers.alignment_log2: 0-21");
  if (!device_tag_ok(b->device_tag))
    return bad(v, at + BUF_DEVICE,
               "descriptor.buffers.device_tag: reserved or invalid");
  if (b->device_tag != v->d->buffers[0].device_tag)
    return bad(v, at + BUF_DEVICE, "descriptor.buffers.device_tag: all "
                                   "buffers of a tensor share the device");
  if (b->memory_class > HR_MEM_LAST)
    return bad(v, at + BUF_MEMCLASS,
               "descriptor.buffers.memory_class: reserved or invalid");
  if (b->device_index != 0 && !local)
    return bad(v, at + BUF_INDEX, "descriptor.buffers.device_index: must "
                                  "be 0 on a network transport");
  if (b->sync_mode > HR_SYNC_CONSUMER_STREAM)
    return fail(v, ism, at + BUF_SYNC,
                "descriptor.buffers.sync_mode: reserved or invalid value");
  if (b->sync_mode != HR_SYNC_PRODUCER_SYNCED && b->device_tag == HR_DEV_CPU)
    return fail(v, ism, at + BUF_SYNC, "descriptor.buffers.sync_mode: CPU "
                                       "buffers require PRODUCER_SYNCED");
  if (b->sync_mode != HR_SYNC_PRODUCER_SYNCED && !local)
    return fail(v, ism, at + BUF_SYNC,
                "descriptor.buffers.sync_mode: only PRODUCER_SYNCED on a "
                "network transport");
  for (unsigned r = 0; r < 2; r++)
    if (b->reserved[r] != 0)
      return bad(v, at + BUF_RESERVED + r,
                 "descriptor.buffers.reserved: must be 0");
  return 0;
}

/* Transport fields that must agree with the descriptor (§ 10, § 9). */
static int check_transport(vctx *v, const hr_transport_fields *x) {
  const hr_descriptor *d = v->d;
  uint32_t at = v->off.end;
  uint64_t sum = 0;
  if (x->data_plane > HR_PLANE_SHM)
    return fail(v, HR_WIRE_MALFORMED_PAYLOAD, at + XP_PLANE,
                "transport.data_plane: 0-2");
  for (unsigned i = 0; i < d->buffer_count; i++)
    if (!hr__add_u64(sum, d->buffers[i].size_bytes, &sum))
      return bad(v, v->off.buffers + BUF_HANDLE_SIZE * i,
                 "descriptor.buffers.size_bytes: their sum overflows u64");
  if (x->total_data_bytes != sum)
    return bad(v, at + XP_TOTAL,
               "transport.total_data_bytes: not the sum of buffer sizes");
  if (!(d->flags & HR_DESC_HAS_SHARD)) {
    if (x->shard_index != 0)
      return bad(v, at + XP_INDEX,
                 "transport.shard_index: 0 without HAS_SHARD");
    if (x->total_shards != 1)
      return bad(v, at + XP_SHARDS,
                 "transport.total_shards: 1 without HAS_SHARD");
    return 0;
  }
  if (x->total_shards == 0)
    return bad(v, at + XP_SHARDS, "transport.total_shards: must be >= 1");
  if (x->shard_index >= x->total_shards)
    return bad(v, at + XP_INDEX,
               "transport.shard_index: must be below total_shards");
  return 0;
}

int hr_descriptor_validate(const hr_descriptor *d,
                           const hr_transport_fields *xport,
                           const hr_wire_ctx *ctx, uint32_t base_offset,
                           hr_wire_status *st) {
  if (d == NULL)
    return HR_ERR_INVALID_ARGUMENT;
  int local = ctx != NULL && ctx->transport == HR_TRANSPORT_LOCAL;
  vctx v = {.d = d, .base = base_offset, .st = st};
  int rv;
  if ((rv = check_static(&v)) != 0)
    return rv;
  if ((rv = check_byte_offset(&v, xport, local)) != 0)
    return rv;
  if ((rv = check_shard_box(&v)) != 0)
    return rv;
  if ((rv = check_buffer_count(&v)) != 0)
    return rv;
  for (unsigned i = 0; i < d->buffer_count; i++)
    if ((rv = check_handle(&v, i, local)) != 0)
      return rv;
  if (xport != NULL && (rv = check_transport(&v, xport)) != 0)
    return rv;
  return 0;
}

int hr_descriptor_buffer_sizes(const hr_descriptor *d,
                               uint64_t sizes[HR_MAX_BUFFERS],
                               hr_wire_status *st) {
  if (d == NULL || sizes == NULL)
    return HR_ERR_INVALID_ARGUMENT;
  /* Offsets in `st` count from the descriptor's first byte. */
  vctx v = {.d = d, .st = st};
  int rv = check_static(&v);
  if (rv != 0)
    return rv;
  if (!v.sized)
    return HR_ERR_UNSUPPORTED;
  memcpy(sizes, v.need, v.nneed * sizeof *sizes);
  return (int)v.nneed;
}

/* ------------------------------------------------------------------------ */
/* Layout entries                                                            */
/* ------------------------------------------------------------------------ */

int hr__layout_entry_decode(hr_cursor *c, int where, hr_layout_entry *e,
                            hr_wire_status *st) {
  uint32_t at = hr_cursor_off(c);
  e->tag = hr_get_u8(c);
  e->ext_len = 0;
  e->ext = NULL;
  if (c->bad)
    return HR_FAIL(st, HR_WIRE_MALFORMED_PAYLOAD, at,
                   "layout entry: payload ends before the tag");
  if (where == HR_LE_LIST &&
      (e->tag == HR_LAYOUT_INVALID || e->tag == HR_LAYOUT_INVALID_FF))
    return HR_FAIL(st, HR_WIRE_MALFORMED_PAYLOAD, at,
                   "layout entry: tag 0x00/0xFF in a list");
  if (!is_ext_tag(e->tag))
    return 0;
  uint32_t len_at = hr_cursor_off(c);
  e->ext_len = hr_get_u16(c);
  e->ext = hr_get_bytes(c, e->ext_len);
  if (c->bad)
    return HR_FAIL(st, HR_WIRE_MALFORMED_PAYLOAD, len_at,
                   "layout entry: ext_metadata runs past the payload");
  return 0;
}

uint8_t *hr__layout_entry_encode(uint8_t *o, const hr_layout_entry *e) {
  o = hr_put_u8(o, e->tag);
  if (is_ext_tag(e->tag)) {
    o = hr_put_u16(o, e->ext_len);
    o = hr_put_bytes(o, e->ext, e->ext_len);
  }
  return o;
}

/* ------------------------------------------------------------------------ */
/* layout_params                                                             */
/* ------------------------------------------------------------------------ */

/* Parses layout_params of a layout with known parameters when their length
 * is the one the layout needs; otherwise leaves d->params zero (composite
 * heads: member_count and rule are read whenever present) for validation to
 * report. */
static void params_parse(hr_descriptor *d) {
  const layout_info *li = layout_lookup(d->layout.tag);
  hr_layout_params *p = &d->params;
  hr_cursor c;
  if (li == NULL || li->params == PARAMS_OPAQUE)
    return;
  hr_cursor_init(&c, d->params_raw, d->params_len, 0);
  if (li->params == PARAMS_RULE) {
    if (d->params_len < COMPOSITE_PARAMS_HEAD)
      return;
    p->member_count = hr_get_u32(&c);
    p->rule = hr_get_u8(&c);
    if (d->params_len != params_encoded_len(d))
      return;
    if (p->rule == HR_COMPOSITE_CONCAT) {
      p->axis = hr_get_u8(&c);
    } else if (p->rule == HR_COMPOSITE_GROUP_QUANTIZED) {
      p->axis = hr_get_u8(&c);
      p->group_size = hr_get_u32(&c);
      p->has_zero_point = hr_get_u8(&c);
    }
    return;
  }
  if (d->params_len != params_encoded_len(d))
    return;
  switch (d->layout.tag) {
  case HR_LAYOUT_STRIDED:
    p->origin = hr_get_u64(&c);
    for (unsigned k = 0; k < d->rank; k++)
      p->strides[k] = hr_get_i64(&c);
    break;
  case HR_LAYOUT_PERMUTED:
    for (unsigned k = 0; k < d->rank; k++)
      p->order[k] = hr_get_u8(&c);
    break;
  case HR_LAYOUT_TILED:
    for (unsigned k = 0; k < d->rank; k++)
      p->tile[k] = hr_get_u32(&c);
    break;
  case HR_LAYOUT_SPARSE_COO:
    p->nnz = hr_get_u64(&c);
    p->index_type = hr_get_u8(&c);
    p->sorted = hr_get_u8(&c);
    break;
  case HR_LAYOUT_SPARSE_CSR:
  case HR_LAYOUT_SPARSE_CSC:
    p->nnz = hr_get_u64(&c);
    p->index_type = hr_get_u8(&c);
    break;
  case HR_LAYOUT_SPARSE_BSR:
    p->br = hr_get_u32(&c);
    p->bc = hr_get_u32(&c);
    p->nnz = hr_get_u64(&c);
    p->index_type = hr_get_u8(&c);
    break;
  default: /* ROW_MAJOR, COLUMN_MAJOR, PANEL: empty */
    break;
  }
}

/* Writes layout_params: the parsed `params` for layouts that have them, the
 * raw bytes for the others.  Exactly params_encoded_len(d) bytes. */
static uint8_t *params_write(uint8_t *o, const hr_descriptor *d) {
  const layout_info *li = layout_lookup(d->layout.tag);
  const hr_layout_params *p = &d->params;
  if (li == NULL || li->params == PARAMS_OPAQUE)
    return hr_put_bytes(o, d->params_raw, d->params_len);
  switch (d->layout.tag) {
  case HR_LAYOUT_STRIDED:
    o = hr_put_u64(o, p->origin);
    for (unsigned k = 0; k < d->rank; k++)
      o = hr_put_u64(o, (uint64_t)p->strides[k]);
    break;
  case HR_LAYOUT_PERMUTED:
    o = hr_put_bytes(o, p->order, d->rank);
    break;
  case HR_LAYOUT_TILED:
    for (unsigned k = 0; k < d->rank; k++)
      o = hr_put_u32(o, p->tile[k]);
    break;
  case HR_LAYOUT_SPARSE_COO:
    o = hr_put_u64(o, p->nnz);
    o = hr_put_u8(o, p->index_type);
    o = hr_put_u8(o, p->sorted);
    break;
  case HR_LAYOUT_SPARSE_CSR:
  case HR_LAYOUT_SPARSE_CSC:
    o = hr_put_u64(o, p->nnz);
    o = hr_put_u8(o, p->index_type);
    break;
  case HR_LAYOUT_SPARSE_BSR:
    o = hr_put_u32(o, p->br);
    o = hr_put_u32(o, p->bc);
    o = hr_put_u64(o, p->nnz);
    o = hr_put_u8(o, p->index_type);
    break;
  case HR_LAYOUT_COMPOSITE:
    o = hr_put_u32(o, p->member_count);
    o = hr_put_u8(o, p->rule);
    if (p->rule == HR_COMPOSITE_CONCAT) {
      o = hr_put_u8(o, p->axis);
    } else if (p->rule == HR_COMPOSITE_GROUP_QUANTIZED) {
      o = hr_put_u8(o, p->axis);
      o = hr_put_u32(o, p->group_size);
      o = hr_put_u8(o, p->has_zero_point);
    }
    break;
  default: /* ROW_MAJOR, COLUMN_MAJOR, PANEL: empty */
    break;
  }
  return o;
}

/* ------------------------------------------------------------------------ */
/* Descriptor and transport fields                                           */
/* ------------------------------------------------------------------------ */

/* A read ran past the payload: the cursor stopped at the field that did
 * not fit. */
static int malformed(const hr_cursor *c, hr_wire_status *st,
                     const char *reason) {
  return HR_FAIL(st, HR_WIRE_MALFORMED_PAYLOAD, hr_cursor_off(c), reason);
}

int hr__desc_decode(hr_cursor *c, hr_descriptor *d, hr_wire_status *st) {
  memset(d, 0, sizeof *d);
  uint32_t start = hr_cursor_off(c);
  d->descriptor_version = hr_get_u8(c);
  d->element_type = hr_get_u8(c);
  d->rank = hr_get_u8(c);
  if (c->bad)
    return malformed(c, st, "descriptor: payload ends inside the header");
  /* Checked before anything that depends on it is read. */
  if (d->rank > HR_MAX_RANK)
    return HR_FAIL(st, HR_WIRE_INVALID_DESCRIPTOR, start + 2,
                   "descriptor.rank: at most 32");
  d->flags = hr_get_u8(c);
  if (c->bad)
    return malformed(c, st, "descriptor: payload ends inside the header");

  int rv = hr__layout_entry_decode(c, HR_LE_DESCRIPTOR, &d->layout, st);
  if (rv != 0)
    return rv;
  if (d->layout.tag == HR_LAYOUT_PANEL && d->layout.ext_len == 4)
    d->params.mr = hr_load_u32(d->layout.ext);

  for (unsigned k = 0; k < d->rank; k++)
    d->shape[k] = hr_get_u64(c);
  if (c->bad)
    return malformed(c, st, "descriptor.shape: payload ends inside the shape");

  uint32_t len_at = hr_cursor_off(c);
  d->params_len = hr_get_u16(c);
  if (c->bad)
    return malformed(c, st, "descriptor.layout_params: payload ends inside "
                        "the length");
  /* Point into the input even when empty, so that params_raw != NULL marks
   * a decoded descriptor. */
  d->params_raw = c->p + c->pos;
  if (!hr_cursor_need(c, d->params_len))
    return HR_FAIL(st, HR_WIRE_MALFORMED_PAYLOAD, len_at,
                   "descriptor.layout_params: length runs past the payload");
  c->pos += d->params_len;
  params_parse(d);

  d->byte_offset = hr_get_u64(c);
  if (d->flags & HR_DESC_HAS_SHARD) {
    for (unsigned k = 0; k < d->rank; k++)
      d->parent_shape[k] = hr_get_u64(c);
    for (unsigned k = 0; k < d->rank; k++)
      d->shard_offset[k] = hr_get_u64(c);
  }
  uint32_t count_at = hr_cursor_off(c);
  d->buffer_count = hr_get_u8(c);
  if (c->bad)
    return malformed(c, st, "descriptor: payload ends before the buffers");
  if (d->buffer_count > HR_MAX_BUFFERS)
    return HR_FAIL(st, HR_WIRE_INVALID_DESCRIPTOR, count_at,
                   "descriptor.buffer_count: at most 8");
  for (unsigned i = 0; i < d->buffer_count; i++) {
    hr_buffer_handle *b = &d->buffers[i];
    b->size_bytes = hr_get_u64(c);
    b->alignment_log2 = hr_get_u8(c);
    b->device_tag = hr_get_u8(c);
    b->memory_class = hr_get_u8(c);
    b->device_index = hr_get_u16(c);
    b->sync_mode = hr_get_u8(c);
    b->reserved[0] = hr_get_u8(c);
    b->reserved[1] = hr_get_u8(c);
  }
  if (c->bad)
    return malformed(c, st, "descriptor.buffers: payload ends inside a buffer "
                        "handle");
  return 0;
}

int hr__xport_decode(hr_cursor *c, hr_transport_fields *x,
                     hr_wire_status *st) {
  uint32_t start = hr_cursor_off(c);
  x->total_data_bytes = hr_get_u64(c);
  x->shard_index = hr_get_u16(c);
  x->total_shards = hr_get_u16(c);
  x->data_plane = hr_get_u8(c);
  const uint8_t *reserved = hr_get_bytes(c, 3);
  if (c->bad)
    return malformed(c, st, "transport: payload ends inside the transport "
                        "fields");
  if (x->data_plane > HR_PLANE_SHM)
    return HR_FAIL(st, HR_WIRE_MALFORMED_PAYLOAD, start + XP_PLANE,
                   "transport.data_plane: 0-2");
  for (unsigned i = 0; i < 3; i++)
    if (reserved[i] != 0)
      return HR_FAIL(st, HR_WIRE_MALFORMED_PAYLOAD, start + XP_PLANE + 1 + i,
                     "transport.reserved: must be 0");
  return 0;
}

int64_t hr__desc_encoded_size(const hr_descriptor *d) {
  const layout_info *li = layout_lookup(d->layout.tag);
  int opaque = li == NULL || li->params == PARAMS_OPAQUE;
  desc_offsets o;
  if (d->rank > HR_MAX_RANK || d->buffer_count > HR_MAX_BUFFERS)
    return -1;
  if (is_ext_tag(d->layout.tag) && d->layout.ext_len > 0 &&
      d->layout.ext == NULL)
    return -1;
  /* Only opaque parameters are written from params_raw. */
  if (opaque && d->params_len > 0 && d->params_raw == NULL)
    return -1;
  desc_offsets_compute(d, params_encoded_len(d), &o);
  return o.end;
}

uint8_t *hr__desc_encode(uint8_t *o, const hr_descriptor *d) {
  o = hr_put_u8(o, d->descriptor_version);
  o = hr_put_u8(o, d->element_type);
  o = hr_put_u8(o, d->rank);
  o = hr_put_u8(o, d->flags);
  o = hr__layout_entry_encode(o, &d->layout);
  for (unsigned k = 0; k < d->rank; k++)
    o = hr_put_u64(o, d->shape[k]);
  o = hr_put_u16(o, (uint16_t)params_encoded_len(d));
  o = params_write(o, d);
  o = hr_put_u64(o, d->byte_offset);
  if (d->flags & HR_DESC_HAS_SHARD) {
    for (unsigned k = 0; k < d->rank; k++)
      o = hr_put_u64(o, d->parent_shape[k]);
    for (unsigned k = 0; k < d->rank; k++)
      o = hr_put_u64(o, d->shard_offset[k]);
  }
  o = hr_put_u8(o, d->buffer_count);
  for (unsigned i = 0; i < d->buffer_count; i++) {
    const hr_buffer_handle *b = &d->buffers[i];
    o = hr_put_u64(o, b->size_bytes);
    o = hr_put_u8(o, b->alignment_log2);
    o = hr_put_u8(o, b->device_tag);
    o = hr_put_u8(o, b->memory_class);
    o = hr_put_u16(o, b->device_index);
    o = hr_put_u8(o, b->sync_mode);
    o = hr_put_u16(o, 0); /* reserved */
  }
  return o;
}

uint8_t *hr__xport_encode(uint8_t *o, const hr_transport_fields *x) {
  o = hr_put_u64(o, x->total_data_bytes);
  o = hr_put_u16(o, x->shard_index);
  o = hr_put_u16(o, x->total_shards);
  o = hr_put_u8(o, x->data_plane);
  o = hr_put_u8(o, 0);
  o = hr_put_u16(o, 0); /* reserved[3] */
  return o;
}

/* ------------------------------------------------------------------------ */
/* Registered profiles (§ 5.1)                                               */
/* ------------------------------------------------------------------------ */

int hr_layout_profile_parse(const hr_layout_entry *e, hr_layout_profile *out) {
  if (e == NULL || out == NULL || (e->ext_len > 0 && e->ext == NULL))
    return HR_ERR_INVALID_ARGUMENT;
  memset(out, 0, sizeof *out);
  out->tag = e->tag;
  const uint8_t *m = e->ext;
  size_t len = e->ext_len;
  switch (e->tag) {
  case HR_LAYOUT_PANEL:
    if (len != 4)
      return HR_ERR_INVALID_ARGUMENT;
    out->mr = hr_load_u32(m);
    return out->mr >= 1 ? 0 : HR_ERR_INVALID_ARGUMENT;
  case HR_LAYOUT_TILED_EXACT:
    if (len < 1 || m[0] > HR_MAX_RANK || len != 1 + 4 * (size_t)m[0])
      return HR_ERR_INVALID_ARGUMENT;
    out->rank = m[0];
    for (unsigned k = 0; k < out->rank; k++) {
      out->tile[k] = hr_load_u32(m + 1 + 4 * k);
      if (out->tile[k] == 0)
        return HR_ERR_INVALID_ARGUMENT;
    }
    return 0;
  case HR_LAYOUT_PERMUTED_EXACT:
    if (len < 1 || m[0] > HR_MAX_RANK || len != 1 + (size_t)m[0] ||
        !is_permutation(m + 1, m[0]))
      return HR_ERR_INVALID_ARGUMENT;
    out->rank = m[0];
    memcpy(out->order, m + 1, out->rank);
    return 0;
  default:
    return HR_ERR_UNSUPPORTED;
  }
}

int hr_layout_profile_encode(const hr_layout_profile *p, uint8_t *out,
                             size_t cap) {
  size_t len;
  if (p == NULL)
    return HR_ERR_INVALID_ARGUMENT;
  /* Only metadata that hr_layout_profile_parse() accepts is written. */
  switch (p->tag) {
  case HR_LAYOUT_PANEL:
    if (p->mr == 0)
      return HR_ERR_INVALID_ARGUMENT;
    len = 4;
    break;
  case HR_LAYOUT_TILED_EXACT:
    if (p->rank > HR_MAX_RANK)
      return HR_ERR_INVALID_ARGUMENT;
    for (unsigned k = 0; k < p->rank; k++)
      if (p->tile[k] == 0)
        return HR_ERR_INVALID_ARGUMENT;
    len = 1 + 4 * (size_t)p->rank;
    break;
  case HR_LAYOUT_PERMUTED_EXACT:
    if (p->rank > HR_MAX_RANK || !is_permutation(p->order, p->rank))
      return HR_ERR_INVALID_ARGUMENT;
    len = 1 + (size_t)p->rank;
    break;
  default:
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (out == NULL || cap < len)
    return HR_ERR_BUFFER_TOO_SMALL;
  uint8_t *o = out;
  if (p->tag == HR_LAYOUT_PANEL) {
    hr_put_u32(o, p->mr);
  } else if (p->tag == HR_LAYOUT_TILED_EXACT) {
    o = hr_put_u8(o, p->rank);
    for (unsigned k = 0; k < p->rank; k++)
      o = hr_put_u32(o, p->tile[k]);
  } else {
    o = hr_put_u8(o, p->rank);
    hr_put_bytes(o, p->order, p->rank);
  }
  return (int)len;
}
