/*
 * The logical-tensor reference of the vector tests.
 *
 * Deliberately naive: every element is located index by index from the
 * tables of wire-v1 § 5 and § 5.1, independently of the library's
 * transcoder, so that a wrong reading of a layout on either side shows up
 * as a mismatch against the vectors' row-major `logical` bytes.
 */
#include "vec_logical.h"

#include <stdlib.h>
#include <string.h>

/* The reference refuses tensors above this many elements (the vectors are
 * tiny; a bigger one means a broken descriptor). */
#define REF_MAX_ELEMENTS (UINT64_C(1) << 24)

/* Element storage sizes of wire-v1 § 4, written out here rather than taken
 * from the library under test. */
static unsigned elem_bits(uint8_t t) {
  static const unsigned char bits[] = {0,  8,  8,  8,  16, 16, 32, 32,  64, 64,
                                       16, 16, 32, 64, 8,  8,  64, 128, 4,  4};
  return t < sizeof(bits) ? bits[t] : 0;
}

static vec_tensor *find_tensor(vec_assembly *a, uint32_t stream) {
  for (size_t i = a->n; i > 0; i--)
    if (a->t[i - 1].stream_id == stream)
      return &a->t[i - 1];
  return NULL;
}

static void free_tensor(vec_tensor *t) {
  for (unsigned i = 0; i < HR_MAX_BUFFERS; i++) {
    free(t->buf[i]);
    t->buf[i] = NULL;
  }
}

static int open_tensor(vec_assembly *a, uint32_t stream, const hr_descriptor *d,
                       vec_buf *diag) {
  if (d->layout.tag == HR_LAYOUT_COMPOSITE)
    a->composite = 1;
  vec_tensor *t = find_tensor(a, stream);
  if (t == NULL) {
    if (a->n == a->cap) {
      a->cap = a->cap ? 2 * a->cap : 4;
      a->t = vec_chk(realloc(a->t, a->cap * sizeof(*a->t)));
    }
    t = &a->t[a->n++];
    memset(t, 0, sizeof(*t));
  } else {
    /* A composite member replaces its predecessor on the stream; composites
     * have no logical reference anyway. */
    free_tensor(t);
  }
  t->stream_id = stream;
  t->desc = *d;
  for (unsigned i = 0; i < d->buffer_count && i < HR_MAX_BUFFERS; i++) {
    if (d->buffers[i].size_bytes > REF_MAX_ELEMENTS * 16) {
      vec_buf_printf(diag,
                     "logical: buffer %u of %llu bytes is too big for "
                     "the reference\n",
                     i, (unsigned long long)d->buffers[i].size_bytes);
      return -1;
    }
    t->buf[i] = vec_chk(calloc(1, (size_t)d->buffers[i].size_bytes + 1));
  }
  return 0;
}

int vec_asm_on_msg(vec_assembly *a, const hr_msg *m, vec_buf *diag) {
  switch (m->hdr.type) {
  case HR_MSG_TENSOR_DESCRIPTOR:
    return open_tensor(a, m->hdr.stream_id, &m->u.tensor.desc, diag);
  case HR_MSG_TENSOR_PUT:
    return open_tensor(a, m->hdr.stream_id, &m->u.put.desc, diag);
  case HR_MSG_TENSOR_DATA: {
    vec_tensor *t = find_tensor(a, m->hdr.stream_id);
    const hr_data *f = &m->u.data;
    if (t == NULL || f->buffer_index >= t->desc.buffer_count ||
        f->offset > t->desc.buffers[f->buffer_index].size_bytes ||
        f->data_len > t->desc.buffers[f->buffer_index].size_bytes - f->offset) {
      vec_buf_printf(diag,
                     "logical: frame on stream %u (buffer %u, offset "
                     "%llu, %u bytes) has no place in a tensor\n",
                     m->hdr.stream_id, f->buffer_index,
                     (unsigned long long)f->offset, f->data_len);
      return -1;
    }
    memcpy(t->buf[f->buffer_index] + f->offset, f->data, f->data_len);
    return 0;
  }
  default: return 0;
  }
}

void vec_asm_free(vec_assembly *a) {
  for (size_t i = 0; i < a->n; i++)
    free_tensor(&a->t[i]);
  free(a->t);
  memset(a, 0, sizeof(*a));
}

/* ---- element access (bits 4 = two per byte, element 2k low nibble) ---- */

static int elem_in(uint64_t size_bytes, uint64_t k, unsigned bits) {
  if (bits == 4)
    return k / 2 < size_bytes;
  uint64_t b = bits / 8;
  return k < size_bytes / b;
}

static void elem_copy(uint8_t *dst, uint64_t di, const uint8_t *src,
                      uint64_t si, unsigned bits) {
  if (bits == 4) {
    unsigned v = (src[si / 2] >> (si % 2 ? 4 : 0)) & 15u;
    uint8_t *d = &dst[di / 2];
    *d = (uint8_t)(di % 2 ? (*d & 0x0F) | (v << 4) : (*d & 0xF0) | v);
    return;
  }
  size_t b = bits / 8;
  memcpy(dst + di * b, src + si * b, b);
}

static uint64_t row_major_pos(const uint64_t *idx, const uint64_t *shape,
                              unsigned rank) {
  uint64_t p = 0;
  for (unsigned k = 0; k < rank; k++)
    p = p * shape[k] + idx[k];
  return p;
}

/* Advances a row-major multi-index; returns 0 after the last one. */
static int next_index(uint64_t *idx, const uint64_t *shape, unsigned rank) {
  for (unsigned k = rank; k > 0; k--) {
    if (++idx[k - 1] < shape[k - 1])
      return 1;
    idx[k - 1] = 0;
  }
  return 0;
}

static int count_elements(const uint64_t *shape, unsigned rank, uint64_t *out) {
  uint64_t n = 1;
  for (unsigned k = 0; k < rank; k++) {
    if (shape[k] != 0 && n > REF_MAX_ELEMENTS / shape[k])
      return -1;
    n *= shape[k];
  }
  *out = n;
  return 0;
}

/* Reads sparse index k of type INT32/INT64 (little-endian, signed). */
static int read_index(const uint8_t *buf, uint64_t size, uint64_t k,
                      uint8_t type, uint64_t *out) {
  unsigned w = type == HR_ELEM_INT32 ? 4 : type == HR_ELEM_INT64 ? 8 : 0;
  if (w == 0 || k >= size / w)
    return -1;
  uint64_t v = 0;
  for (unsigned i = 0; i < w; i++)
    v |= (uint64_t)buf[k * w + i] << (8 * i);
  if (w == 4 && (v & 0x80000000u))
    return -1;
  if (w == 8 && (v >> 63))
    return -1;
  *out = v;
  return 0;
}

/* Places values[p] at dense row-major position `pos`. */
static int put_value(const vec_tensor *t, uint8_t *dense, uint64_t pos,
                     uint64_t p, unsigned bits, unsigned vbuf, vec_buf *diag) {
  if (!elem_in(t->desc.buffers[vbuf].size_bytes, p, bits)) {
    vec_buf_printf(diag, "logical: value %llu outside buffer %u\n",
                   (unsigned long long)p, vbuf);
    return -1;
  }
  elem_copy(dense, pos, t->buf[vbuf], p, bits);
  return 0;
}

static int densify(const vec_tensor *t, uint8_t *dense, unsigned bits,
                   vec_buf *diag) {
  const hr_descriptor *d = &t->desc;
  const hr_layout_params *lp = &d->params;
  const uint64_t *shape = d->shape;
  uint64_t nnz = lp->nnz;
  uint64_t a, b, c;

  if (d->layout.tag == HR_LAYOUT_SPARSE_COO) {
    uint64_t idx[HR_MAX_RANK];
    for (uint64_t n = 0; n < nnz; n++) {
      for (unsigned k = 0; k < d->rank; k++) {
        if (read_index(t->buf[0], d->buffers[0].size_bytes, n * d->rank + k,
                       lp->index_type, &idx[k]) != 0 ||
            idx[k] >= shape[k]) {
          vec_buf_printf(diag, "logical: COO index %llu bad\n",
                         (unsigned long long)n);
          return -1;
        }
      }
      if (put_value(t, dense, row_major_pos(idx, shape, d->rank), n, bits, 1,
                    diag) != 0)
        return -1;
    }
    return 0;
  }

  /* CSR walks rows, CSC columns, BSR block rows. */
  uint64_t br = 1, bc = 1;
  if (d->layout.tag == HR_LAYOUT_SPARSE_BSR) {
    br = lp->br;
    bc = lp->bc;
    if (br == 0 || bc == 0)
      return -1;
  }
  int csc = d->layout.tag == HR_LAYOUT_SPARSE_CSC;
  uint64_t outer = csc ? shape[1] : shape[0] / br;
  uint64_t inner = csc ? shape[0] : shape[1] / bc;
  for (uint64_t i = 0; i < outer; i++) {
    if (read_index(t->buf[0], d->buffers[0].size_bytes, i, lp->index_type,
                   &a) != 0 ||
        read_index(t->buf[0], d->buffers[0].size_bytes, i + 1, lp->index_type,
                   &b) != 0 ||
        a > b || b > nnz) {
      vec_buf_printf(diag, "logical: bad indptr at %llu\n",
                     (unsigned long long)i);
      return -1;
    }
    for (uint64_t p = a; p < b; p++) {
      if (read_index(t->buf[1], d->buffers[1].size_bytes, p, lp->index_type,
                     &c) != 0 ||
          c >= inner) {
        vec_buf_printf(diag, "logical: bad index at %llu\n",
                       (unsigned long long)p);
        return -1;
      }
      for (uint64_t r = 0; r < br; r++) {
        for (uint64_t s = 0; s < bc; s++) {
          uint64_t row = csc ? c : i * br + r;
          uint64_t col = csc ? i : c * bc + s;
          if (put_value(t, dense, row * shape[1] + col, (p * br + r) * bc + s,
                        bits, 2, diag) != 0)
            return -1;
        }
      }
    }
  }
  return 0;
}

/* The storage position (in elements) of logical index `idx` for the dense
 * layouts; -1 when the layout cannot address it. */
static int dense_pos(const hr_descriptor *d, const uint64_t *idx,
                     uint64_t *pos) {
  const uint64_t *shape = d->shape;
  const hr_layout_params *lp = &d->params;
  unsigned rank = d->rank;
  uint64_t p = 0, mul = 1;
  switch (d->layout.tag) {
  case HR_LAYOUT_ROW_MAJOR: p = row_major_pos(idx, shape, rank); break;
  case HR_LAYOUT_COLUMN_MAJOR:
    for (unsigned k = 0; k < rank; k++) {
      p += idx[k] * mul;
      mul *= shape[k];
    }
    break;
  case HR_LAYOUT_STRIDED: {
    int64_t s = (int64_t)lp->origin;
    for (unsigned k = 0; k < rank; k++)
      s += (int64_t)idx[k] * lp->strides[k];
    if (s < 0)
      return -1;
    p = (uint64_t)s;
    break;
  }
  case HR_LAYOUT_PERMUTED:
    for (unsigned j = 0; j < rank; j++) {
      unsigned k = lp->order[j];
      if (k >= rank)
        return -1;
      p = p * shape[k] + idx[k];
    }
    break;
  case HR_LAYOUT_TILED: {
    uint64_t tile_pos = 0, in_pos = 0, tile_elems = 1;
    for (unsigned k = 0; k < rank; k++) {
      uint64_t t = lp->tile[k];
      if (t == 0)
        return -1;
      uint64_t grid = (shape[k] + t - 1) / t;
      tile_pos = tile_pos * grid + idx[k] / t;
      in_pos = in_pos * t + idx[k] % t;
      tile_elems *= t;
    }
    p = tile_pos * tile_elems + in_pos;
    break;
  }
  case HR_LAYOUT_PANEL: {
    if (rank != 2 || d->layout.ext_len != 4)
      return -1;
    /* ext_metadata is one u32 mr (§ 5.1), read here by hand. */
    const uint8_t *e = d->layout.ext;
    uint64_t mr = (uint64_t)e[0] | (uint64_t)e[1] << 8 | (uint64_t)e[2] << 16 |
                  (uint64_t)e[3] << 24;
    if (mr == 0)
      return -1;
    p = idx[0] / mr * mr * shape[1] + idx[1] * mr + idx[0] % mr;
    break;
  }
  default: return -1;
  }
  *pos = p;
  return 0;
}

/* Converts one tensor to row-major order of its own shape into `out`
 * (zeroed, elements x bits). */
static int to_row_major(const vec_tensor *t, uint8_t *out, uint64_t count,
                        unsigned bits, vec_buf *diag) {
  const hr_descriptor *d = &t->desc;
  switch (d->layout.tag) {
  case HR_LAYOUT_SPARSE_COO:
  case HR_LAYOUT_SPARSE_CSR:
  case HR_LAYOUT_SPARSE_CSC:
  case HR_LAYOUT_SPARSE_BSR: return densify(t, out, bits, diag);
  default: break;
  }
  if (count == 0)
    return 0;
  if (d->buffer_count < 1) {
    vec_buf_printf(diag, "logical: dense tensor without a buffer\n");
    return -1;
  }
  uint64_t idx[HR_MAX_RANK] = {0};
  uint64_t k = 0;
  do {
    uint64_t pos;
    if (dense_pos(d, idx, &pos) != 0 ||
        !elem_in(d->buffers[0].size_bytes, pos, bits)) {
      vec_buf_printf(diag,
                     "logical: layout 0x%02x cannot place element "
                     "%llu inside its buffer\n",
                     d->layout.tag, (unsigned long long)k);
      return -1;
    }
    elem_copy(out, k, t->buf[0], pos, bits);
    k++;
  } while (next_index(idx, d->shape, d->rank));
  return 0;
}

int vec_asm_check_logical(const vec_assembly *a, const cJSON *logical,
                          const hr_rx_config *cfg, vec_buf *diag) {
  int ok = 1;
  uint64_t elem = vec_get_u64(logical, "element_type", &ok);
  const char *hex = vec_get_str(logical, "hex", &ok);
  uint64_t shape[HR_MAX_RANK];
  unsigned rank = 0;
  if (!ok ||
      vec_json_u64_array(cJSON_GetObjectItemCaseSensitive(logical, "shape"),
                         shape, HR_MAX_RANK, &rank) != 0) {
    vec_buf_printf(diag, "logical: malformed `logical` field in the vector\n");
    return -1;
  }
  if (a->composite || a->n == 0) {
    vec_buf_printf(diag, "logical: %s\n",
                   a->n == 0 ? "no tensor arrived"
                             : "a composite has no logical reference");
    return -1;
  }

  /* The requested box: the region of a REGION request, else the parent of
   * the shards, else the tensor itself. */
  const hr_descriptor *d0 = &a->t[0].desc;
  uint64_t box_off[HR_MAX_RANK] = {0}, box_shape[HR_MAX_RANK];
  if (cfg->request_flags & HR_REQ_REGION) {
    memcpy(box_off, cfg->region_offset, sizeof(box_off));
    memcpy(box_shape, cfg->region_shape, sizeof(box_shape));
  } else if (d0->flags & HR_DESC_HAS_SHARD) {
    memcpy(box_shape, d0->parent_shape, sizeof(box_shape));
  } else {
    memcpy(box_shape, d0->shape, sizeof(box_shape));
  }
  int rc = 0;
  if (elem != d0->element_type || rank != d0->rank ||
      memcmp(shape, box_shape, rank * sizeof(uint64_t)) != 0) {
    vec_buf_printf(diag,
                   "logical: the vector's element type/shape do not "
                   "match what arrived (element type %u, rank %u)\n",
                   d0->element_type, d0->rank);
    return -1;
  }
  unsigned bits = elem_bits(d0->element_type);
  uint64_t total;
  if (bits == 0 || count_elements(shape, rank, &total) != 0) {
    vec_buf_printf(diag, "logical: cannot size the tensor\n");
    return -1;
  }
  size_t box_bytes = (size_t)((total * bits + 7) / 8);
  uint8_t *box = vec_chk(calloc(1, box_bytes + 1));

  for (size_t s = 0; s < a->n && rc == 0; s++) {
    const vec_tensor *t = &a->t[s];
    const hr_descriptor *d = &t->desc;
    uint64_t count;
    if (d->element_type != d0->element_type || d->rank != rank ||
        count_elements(d->shape, rank, &count) != 0) {
      vec_buf_printf(diag, "logical: shard on stream %u does not fit\n",
                     t->stream_id);
      rc = -1;
      break;
    }
    uint8_t *rm = vec_chk(calloc(1, (size_t)((count * bits + 7) / 8) + 1));
    rc = to_row_major(t, rm, count, bits, diag);
    uint64_t idx[HR_MAX_RANK] = {0}, dst[HR_MAX_RANK];
    uint64_t k = 0;
    if (rc == 0 && count > 0) {
      do {
        for (unsigned i = 0; i < rank; i++) {
          uint64_t off =
              (d->flags & HR_DESC_HAS_SHARD) ? d->shard_offset[i] : 0;
          dst[i] = idx[i] + off - box_off[i];
          if (idx[i] + off < box_off[i] || dst[i] >= box_shape[i]) {
            vec_buf_printf(diag,
                           "logical: shard on stream %u lies outside "
                           "the requested box\n",
                           t->stream_id);
            rc = -1;
            break;
          }
        }
        if (rc != 0)
          break;
        elem_copy(box, row_major_pos(dst, box_shape, rank), rm, k, bits);
        k++;
      } while (next_index(idx, d->shape, rank));
    }
    free(rm);
  }

  if (rc == 0) {
    char *got = vec_hex_encode(box, box_bytes);
    if (strcmp(got, hex) != 0) {
      vec_buf_printf(diag,
                     "logical: row-major bytes differ\n  expected %s\n"
                     "  got      %s\n",
                     hex, got);
      rc = -1;
    }
    free(got);
  }
  free(box);
  return rc;
}
