/*
 * The multi-message checker of one transfer (see <hurray/wire.h>) and the
 * shard tiling check.
 *
 * A transfer is a block of K streams [base, base + K): K = max_shards for
 * a PARALLEL_OK request, else 1.  Each stream runs a small machine
 * (IDLE → OPEN → ... → DONE, or ENDED by the peer's ERROR); the tensor open
 * on a stream has a frame tracker (hr_frames.h).  The transfer's mode is
 * decided by its first top-level descriptor: SINGLE (one tensor or one
 * composite on the base stream) or SHARDED (N shards on streams base + i).
 * Composites are never sharded, so the stack of open composites belongs to
 * the single stream of a SINGLE transfer.
 */
#include <stdlib.h>
#include <string.h>

#include "hr_frames.h"
#include "hr_internal.h"
#include "hr_rx_internal.h"

/* The state of one stream of the transfer. */
enum rx_stream_state {
  RXS_IDLE,  /* no tensor open: awaiting a descriptor (or a member) */
  RXS_OPEN,  /* a descriptor arrived: frames / RDMA, then DATA_END */
  RXS_DONE,  /* the stream's answer is complete */
  RXS_ENDED, /* the peer ended the stream with ERROR */
  RXS_COUNT
};

static const char *const rxs_names[] = {"IDLE", "OPEN", "DONE", "ENDED"};
_Static_assert(sizeof rxs_names / sizeof *rxs_names == RXS_COUNT,
               "one name per stream state");

/* The shape of the transfer, known from its first top-level descriptor. */
enum rx_mode {
  RXM_UNKNOWN, /* no top-level descriptor yet */
  RXM_SINGLE,  /* one tensor or composite on the base stream */
  RXM_SHARDED, /* N shards, shard i on stream base + i */
  RXM_COUNT
};

static const char *const rxm_names[] = {"UNKNOWN", "SINGLE", "SHARDED"};
_Static_assert(sizeof rxm_names / sizeof *rxm_names == RXM_COUNT,
               "one name per transfer mode");

typedef struct rx_stream {
  /* enum rx_stream_state. */
  uint8_t state;
  /* 1 once a tensor began on the stream. */
  uint8_t started;
  /* The open tensor's data_plane, whether its RDMA_REGISTER arrived, and
   * whether it is a composite head. */
  uint8_t plane;
  uint8_t rdma_seen;
  uint8_t is_head;
  /* The open tensor's event depth and member index (hr_rx_event). */
  unsigned depth;
  uint32_t member_index;
  /* Its frames. */
  hr_frames ft;
} rx_stream;

/* An open composite. */
typedef struct rx_comp {
  /* The head's shape, element type and rank. */
  uint64_t shape[HR_MAX_RANK];
  uint8_t elem;
  uint8_t rank;
  /* The head's parameters. */
  uint32_t member_count;
  uint8_t rule;
  uint8_t axis;
  uint8_t has_zero_point;
  uint32_t group_size;
  /* Members whose descriptor arrived, and members complete. */
  uint32_t begun;
  uint32_t ended;
  /* CONCAT: the members' sizes along the axis so far. */
  uint64_t axis_sum;
  /* GROUP_QUANTIZED: member 0's element type. */
  uint8_t m0_elem;
} rx_comp;

struct hr_rx {
  /* The allocator and the configuration (copies). */
  hr_mem mem;
  hr_rx_config cfg;
  /* 1 once a call failed (HR_ERR_PROTO or HR_ERR_NOMEM). */
  int failed;
  /* enum rx_mode. */
  int mode;
  /* The block of streams: K entries. */
  uint32_t k;
  rx_stream *streams;
  /* SHARDED: N, the shard descriptors arrived, whether they tile. */
  uint32_t n;
  uint32_t shards_seen;
  int shards_valid;
  /* Streams whose answer is complete. */
  uint32_t streams_done;
  /* The peer ended a stream with ERROR: the first such code. */
  int remote_ended;
  uint32_t remote_code;
  /* A permissive finish accepted a torn composite. */
  int torn;
  /* SHARDED: the reference the shards must agree with (the first shard
   * descriptor to arrive). */
  uint8_t ref_elem;
  uint8_t ref_tag;
  uint8_t ref_rank;
  uint64_t ref_parent[HR_MAX_RANK];
  /* SHARDED: per shard index, its shard_offset then its shape (rank
   * entries each). */
  uint64_t *boxes;
  /* SINGLE: the open composites, outermost first. */
  rx_comp comp[HR_MAX_COMPOSITE_DEPTH];
  unsigned depth;
};

/* Names for traces and test failures. */
static const char *rx_stream_state_name(int s) {
  return s >= 0 && s < RXS_COUNT ? rxs_names[s] : "?";
}
static const char *rx_mode_name(int m) {
  return m >= 0 && m < RXM_COUNT ? rxm_names[m] : "?";
}

/* Marks the checker failed and fills the status. */
static int rx_fail(hr_rx *rx, hr_wire_status *st, uint32_t code, uint32_t off,
                   const char *why) {
  rx->failed = 1;
  return hr__wire_fail(st, code, off, why);
}

/* ------------------------------------------------------------------------ */
/* Shard tiling                                                              */
/* ------------------------------------------------------------------------ */

/* The corner method's budget, in 32-bit words of scratch memory (16 MiB). */
#define TILE_CORNER_WORDS (1u << 22)

typedef int (*idx_cmp_fn)(uint32_t a, uint32_t b, const void *ctx);

/* Bottom-up merge sort of indices with a comparator taking a context
 * (qsort has none in C11).  `tmp` holds n entries.  O(n log n), stable. */
static void msort_idx(uint32_t *a, uint32_t *tmp, size_t n, idx_cmp_fn cmp,
                      const void *ctx) {
  uint32_t *src = a, *dst = tmp;
  for (size_t w = 1; w < n; w *= 2) {
    for (size_t lo = 0; lo < n; lo += 2 * w) {
      size_t mid = lo + w < n ? lo + w : n;
      size_t hi = lo + 2 * w < n ? lo + 2 * w : n;
      size_t i = lo, j = mid, o = lo;
      while (i < mid && j < hi)
        dst[o++] = cmp(src[j], src[i], ctx) < 0 ? src[j++] : src[i++];
      while (i < mid)
        dst[o++] = src[i++];
      while (j < hi)
        dst[o++] = src[j++];
    }
    uint32_t *t = src;
    src = dst;
    dst = t;
  }
  if (src != a)
    memcpy(a, src, n * sizeof *a);
}

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* Corner rows: `width` compressed coordinates per row. */
typedef struct corner_rows {
  const uint32_t *rows;
  unsigned width;
} corner_rows;

static int cmp_corner(uint32_t a, uint32_t b, const void *ctx) {
  const corner_rows *c = ctx;
  const uint32_t *ra = c->rows + (size_t)a * c->width;
  const uint32_t *rb = c->rows + (size_t)b * c->width;
  for (unsigned j = 0; j < c->width; j++) {
    if (ra[j] != rb[j])
      return ra[j] < rb[j] ? -1 : 1;
  }
  return 0;
}

/* Index of v in the sorted unique array u[0..n) (v is present). */
static uint32_t find_u64(const uint64_t *u, size_t n, uint64_t v) {
  size_t lo = 0, hi = n;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (u[mid] <= v)
      lo = mid;
    else
      hi = mid;
  }
  return (uint32_t)lo;
}

/*
 * The corner method.  Let m(x) count the boxes covering point x.  The
 * boxes tile the requested box B exactly iff m - 1_B is 0 everywhere.  A
 * function of compact support is 0 iff its mixed discrete difference is 0
 * (it is the prefix sum of that difference), and the difference of a box's
 * indicator is +1/-1 on its 2^r corners (the sign is the parity of the
 * "high" coordinates).  So: emit every corner of every box with its sign,
 * those of B with the opposite sign, and check that the signs cancel at
 * every point.  Axes that every box spans entirely are left out (the
 * problem factors along them), so r is the number of axes actually cut.
 */
static int tile_corners(unsigned r, const unsigned *ax,
                        const uint64_t *box_offset, const uint64_t *box_end,
                        size_t n, const uint64_t *const *offsets,
                        const uint64_t *const *shapes, const hr_mem *mem,
                        hr_wire_status *st) {
  size_t per = (size_t)1 << r;
  size_t m = (n + 1) * per;
  size_t nv = 2 * n + 2;
  int rv = HR_ERR_NOMEM;
  uint64_t *vals = hr__mem_malloc(mem, (r ? r : 1) * nv * sizeof *vals);
  size_t *nu = hr__mem_malloc(mem, (r ? r : 1) * sizeof *nu);
  uint32_t *rows = hr__mem_malloc(mem, (r ? r : 1) * m * sizeof *rows);
  int8_t *sign = hr__mem_malloc(mem, m);
  uint32_t *idx = hr__mem_malloc(mem, m * sizeof *idx);
  uint32_t *tmp = hr__mem_malloc(mem, m * sizeof *tmp);
  if (!vals || !nu || !rows || !sign || !idx || !tmp)
    goto out;

  /* Coordinate compression per cut axis, so a row is r small integers. */
  for (unsigned j = 0; j < r; j++) {
    uint64_t *v = vals + j * nv;
    unsigned k = ax[j];
    for (size_t i = 0; i < n; i++) {
      v[2 * i] = offsets[i][k];
      v[2 * i + 1] = offsets[i][k] + shapes[i][k];
    }
    v[2 * n] = box_offset[k];
    v[2 * n + 1] = box_end[k];
    qsort(v, nv, sizeof *v, cmp_u64);
    size_t u = 1;
    for (size_t i = 1; i < nv; i++) {
      if (v[i] != v[u - 1])
        v[u++] = v[i];
    }
    nu[j] = u;
  }

  for (size_t i = 0; i <= n; i++) {
    uint32_t lo[HR_MAX_RANK], hi[HR_MAX_RANK];
    for (unsigned j = 0; j < r; j++) {
      unsigned k = ax[j];
      uint64_t l = i < n ? offsets[i][k] : box_offset[k];
      uint64_t h = i < n ? offsets[i][k] + shapes[i][k] : box_end[k];
      lo[j] = find_u64(vals + j * nv, nu[j], l);
      hi[j] = find_u64(vals + j * nv, nu[j], h);
    }
    for (size_t mask = 0; mask < per; mask++) {
      size_t row = i * per + mask;
      unsigned odd = 0;
      for (unsigned j = 0; j < r; j++) {
        unsigned bit = (unsigned)(mask >> j) & 1u;
        rows[row * r + j] = bit ? hi[j] : lo[j];
        odd ^= bit;
      }
      int s = odd ? -1 : 1;
      sign[row] = (int8_t)(i < n ? s : -s);
      idx[row] = (uint32_t)row;
    }
  }

  corner_rows ctx = {rows, r};
  msort_idx(idx, tmp, m, cmp_corner, &ctx);
  rv = 0;
  for (size_t a = 0; a < m;) {
    int64_t sum = 0;
    size_t b = a;
    while (b < m && cmp_corner(idx[a], idx[b], &ctx) == 0)
      sum += sign[idx[b++]];
    if (sum != 0) {
      rv = hr__wire_fail(st, HR_WIRE_SHARD_INCONSISTENT, 0,
                         "shards overlap or leave a gap in the requested box");
      break;
    }
    a = b;
  }
out:
  hr__mem_free(mem, vals);
  hr__mem_free(mem, nu);
  hr__mem_free(mem, rows);
  hr__mem_free(mem, sign);
  hr__mem_free(mem, idx);
  hr__mem_free(mem, tmp);
  return rv;
}

/* A box's low coordinate on the sweep axis, and its index. */
typedef struct sweep_item {
  uint64_t lo;
  size_t i;
} sweep_item;

static int cmp_sweep(const void *x, const void *y) {
  const sweep_item *a = x, *b = y;
  if (a->lo != b->lo)
    return a->lo < b->lo ? -1 : 1;
  return a->i < b->i ? -1 : a->i > b->i;
}

/*
 * The fallback for boxes cut along many axes: the volumes must add up to
 * the requested box's, and no two boxes may overlap (boxes inside B whose
 * volumes sum to vol(B) without overlap cover it).  Pairs are compared
 * only while they share a slab of the sweep axis, the cut axis with the
 * most distinct low coordinates.
 */
static int tile_sweep(unsigned rank, unsigned r, const unsigned *ax,
                      const uint64_t *box_shape, size_t n,
                      const uint64_t *const *offsets,
                      const uint64_t *const *shapes, const hr_mem *mem,
                      hr_wire_status *st) {
  uint64_t vol = 1;
  for (unsigned k = 0; k < rank; k++) {
    if (!hr__mul_u64(vol, box_shape[k], &vol))
      return hr__wire_fail(st, HR_WIRE_SHARD_INCONSISTENT, 0,
                           "the requested box's volume overflows u64");
  }
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t v = 1;
    /* Inside the box, so no product overflows where vol did not. */
    for (unsigned k = 0; k < rank; k++)
      v *= shapes[i][k];
    if (!hr__add_u64(sum, v, &sum) || sum > vol)
      return hr__wire_fail(st, HR_WIRE_SHARD_INCONSISTENT, 0,
                           "shards overlap: their volumes exceed the box's");
  }
  if (sum != vol)
    return hr__wire_fail(st, HR_WIRE_SHARD_INCONSISTENT, 0,
                         "shards leave a gap: their volumes fall short");

  sweep_item *it = hr__mem_malloc(mem, n * sizeof *it);
  if (!it)
    return HR_ERR_NOMEM;
  unsigned best = ax[0];
  size_t best_distinct = 0;
  for (unsigned j = 0; j < r; j++) {
    for (size_t i = 0; i < n; i++) {
      it[i].lo = offsets[i][ax[j]];
      it[i].i = i;
    }
    qsort(it, n, sizeof *it, cmp_sweep);
    size_t distinct = 1;
    for (size_t i = 1; i < n; i++)
      distinct += it[i].lo != it[i - 1].lo;
    if (distinct > best_distinct) {
      best_distinct = distinct;
      best = ax[j];
    }
  }
  for (size_t i = 0; i < n; i++) {
    it[i].lo = offsets[i][best];
    it[i].i = i;
  }
  qsort(it, n, sizeof *it, cmp_sweep);
  int rv = 0;
  for (size_t p = 0; p < n && rv == 0; p++) {
    size_t a = it[p].i;
    uint64_t a_hi = offsets[a][best] + shapes[a][best];
    for (size_t q = p + 1; q < n && it[q].lo < a_hi; q++) {
      size_t b = it[q].i;
      unsigned k = 0;
      while (k < rank && offsets[a][k] < offsets[b][k] + shapes[b][k] &&
             offsets[b][k] < offsets[a][k] + shapes[a][k])
        k++;
      if (k == rank) {
        rv = hr__wire_fail(st, HR_WIRE_SHARD_INCONSISTENT, 0,
                           "shards overlap in the requested box");
        break;
      }
    }
  }
  hr__mem_free(mem, it);
  return rv;
}

int hr_shards_check_tiling(unsigned rank, const uint64_t *box_offset,
                           const uint64_t *box_shape, size_t n,
                           const uint64_t *const *offsets,
                           const uint64_t *const *shapes, const hr_mem *mem,
                           hr_wire_status *st) {
  if (rank > HR_MAX_RANK || (rank && (!box_offset || !box_shape)) ||
      (n && (!offsets || !shapes)))
    return HR_ERR_INVALID_ARGUMENT;
  for (size_t i = 0; i < n && rank; i++) {
    if (!offsets[i] || !shapes[i])
      return HR_ERR_INVALID_ARGUMENT;
  }
  if (!mem)
    mem = hr_mem_default();
  if (n == 0)
    return hr__wire_fail(st, HR_WIRE_SHARD_INCONSISTENT, 0,
                         "no shard covers the requested box");

  uint64_t box_end[HR_MAX_RANK];
  int box_empty = 0;
  for (unsigned k = 0; k < rank; k++) {
    if (!hr__add_u64(box_offset[k], box_shape[k], &box_end[k]))
      return hr__wire_fail(st, HR_WIRE_SHARD_INCONSISTENT, 0,
                           "the requested box overflows u64");
    box_empty |= box_shape[k] == 0;
  }
  /* Every box inside B, and (unless B is empty) none empty: an empty box
   * carries nothing, so a sender has no reason to send one. */
  for (size_t i = 0; i < n; i++) {
    int empty = 0;
    for (unsigned k = 0; k < rank; k++) {
      uint64_t hi;
      if (offsets[i][k] < box_offset[k] ||
          !hr__add_u64(offsets[i][k], shapes[i][k], &hi) || hi > box_end[k])
        return hr__wire_fail(st, HR_WIRE_SHARD_INCONSISTENT, 0,
                             "a shard lies outside the requested box");
      empty |= shapes[i][k] == 0;
    }
    if (empty && !box_empty)
      return hr__wire_fail(st, HR_WIRE_SHARD_INCONSISTENT, 0,
                           "an empty shard of a non-empty box");
  }
  if (box_empty)
    return 0;

  /* The cut axes: those where some box does not span B entirely. */
  unsigned ax[HR_MAX_RANK];
  unsigned r = 0;
  for (unsigned k = 0; k < rank; k++) {
    size_t i = 0;
    while (i < n && offsets[i][k] == box_offset[k] &&
           shapes[i][k] == box_shape[k])
      i++;
    if (i < n)
      ax[r++] = k;
  }
  /* No axis cut: every box is B itself, so exactly one may be sent. */
  if (r == 0)
    return n == 1 ? 0
                  : hr__wire_fail(st, HR_WIRE_SHARD_INCONSISTENT, 0,
                                  "shards overlap in the requested box");
  /* Corner rows cost (r + 3) words each, plus the compressed values. */
  if (r < 22 && n < (TILE_CORNER_WORDS >> r)) {
    size_t m = (n + 1) << r;
    size_t words = m * (r + 3) + (size_t)r * (2 * n + 2) * 2;
    if (words <= TILE_CORNER_WORDS)
      return tile_corners(r, ax, box_offset, box_end, n, offsets, shapes, mem,
                          st);
  }
  return tile_sweep(rank, r, ax, box_shape, n, offsets, shapes, mem, st);
}

/* ------------------------------------------------------------------------ */
/* The checker                                                               */
/* ------------------------------------------------------------------------ */

int hr_rx_new(hr_rx **out, const hr_rx_config *cfg, const hr_mem *mem) {
  if (!out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!cfg || (cfg->direction != HR_RX_S2C && cfg->direction != HR_RX_C2S))
    return HR_ERR_INVALID_ARGUMENT;
  uint32_t k = 1;
  if (cfg->direction == HR_RX_S2C) {
    if (cfg->base_stream == 0)
      return HR_ERR_INVALID_ARGUMENT;
    if ((cfg->request_flags & HR_REQ_REGION) && cfg->region_rank > HR_MAX_RANK)
      return HR_ERR_INVALID_ARGUMENT;
    if (cfg->request_flags & HR_REQ_PARALLEL_OK) {
      if (cfg->max_shards == 0)
        return HR_ERR_INVALID_ARGUMENT;
      k = cfg->max_shards;
    }
    if (cfg->base_stream > UINT32_MAX - (k - 1))
      return HR_ERR_INVALID_ARGUMENT;
  }
  if (!mem)
    mem = hr_mem_default();
  hr_rx *rx = hr__mem_calloc(mem, 1, sizeof *rx);
  if (!rx)
    return HR_ERR_NOMEM;
  rx->mem = *mem;
  rx->cfg = *cfg;
  rx->k = k;
  rx->streams = hr__mem_calloc(mem, k, sizeof *rx->streams);
  if (!rx->streams) {
    hr__mem_free(mem, rx);
    return HR_ERR_NOMEM;
  }
  *out = rx;
  return 0;
}

void hr_rx_del(hr_rx *rx) {
  if (!rx)
    return;
  hr__mem_free(&rx->mem, rx->boxes);
  hr__mem_free(&rx->mem, rx->streams);
  hr__mem_free(&rx->mem, rx);
}

static int rx_transfer_done(const hr_rx *rx) {
  if (rx->failed || rx->remote_ended)
    return 0;
  if (rx->mode == RXM_SINGLE)
    return rx->streams[0].state == RXS_DONE;
  if (rx->mode == RXM_SHARDED)
    return rx->shards_valid && rx->streams_done == rx->n;
  return 0;
}

int hr_rx_done(const hr_rx *rx) {
  return rx && rx_transfer_done(rx);
}

int hr_rx_torn(const hr_rx *rx) {
  return rx && rx->torn;
}

const char *hr__rx_mode_name(const hr_rx *rx) {
  return rx ? rx_mode_name(rx->mode) : "?";
}

const char *hr__rx_stream_state_name(const hr_rx *rx, uint32_t stream_id) {
  if (!rx)
    return "?";
  uint32_t base = rx->cfg.base_stream;
  if (stream_id < base || stream_id - base >= rx->k)
    return "OUTSIDE";
  return rx_stream_state_name(rx->streams[stream_id - base].state);
}

/* Why a message may not arrive on a stream in state `s`. */
static const char *rx_state_complaint(int s) {
  switch (s) {
  case RXS_IDLE: return "a message before its tensor's descriptor";
  case RXS_OPEN: return "a descriptor before the open tensor's DATA_END";
  case RXS_DONE: return "a message on a stream whose answer is complete";
  case RXS_ENDED: return "a message on a stream ended by ERROR";
  default: return rx_stream_state_name(s);
  }
}

/* Checks the values of a composite head alone (wire-v1 § 7.3, § 18). */
static int rx_head_check(hr_rx *rx, const hr_descriptor *d,
                         hr_wire_status *st) {
  const hr_layout_params *p = &d->params;
  if (d->buffer_count != 0)
    return rx_fail(rx, st, HR_WIRE_INVALID_DESCRIPTOR, 0,
                   "composite head: buffer_count must be 0");
  if (p->member_count < 1 || p->member_count > HR_MAX_COMPOSITE_MEMBERS)
    return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                   "composite head: member_count outside 1-65535");
  switch (p->rule) {
  case HR_COMPOSITE_TUPLE:
    if (d->element_type != HR_ELEM_NONE)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "TUPLE head: element_type must be NONE");
    if (d->rank != 0)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "TUPLE head: rank must be 0");
    return 0;
  case HR_COMPOSITE_CONCAT:
  case HR_COMPOSITE_GROUP_QUANTIZED:
    if (d->element_type == HR_ELEM_NONE)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "composite head: only TUPLE heads have element NONE");
    if (p->axis >= d->rank)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "composite head: axis must be below rank");
    if (p->rule == HR_COMPOSITE_CONCAT)
      return 0;
    if (p->group_size == 0)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "GROUP_QUANTIZED head: group_size must be >= 1");
    if (p->has_zero_point > 1)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "GROUP_QUANTIZED head: has_zero_point must be 0 or 1");
    if (p->member_count != 2u + p->has_zero_point)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "GROUP_QUANTIZED head: member_count must be "
                     "2 + has_zero_point");
    return 0;
  default:
    return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                   "composite head: unknown rule");
  }
}

static int elem_is_quantized(uint8_t e) {
  return e == HR_ELEM_INT8 || e == HR_ELEM_UINT8 || e == HR_ELEM_INT4 ||
         e == HR_ELEM_UINT4 || e == HR_ELEM_FLOAT8_E4M3FN ||
         e == HR_ELEM_FLOAT8_E5M2;
}

static int elem_is_scale(uint8_t e) {
  return e == HR_ELEM_FLOAT16 || e == HR_ELEM_BFLOAT16 || e == HR_ELEM_FLOAT32;
}

/*
 * Checks member number c->begun against its composite's rule, as soon as
 * its descriptor arrives (a nested head counts with its own element type
 * and shape).  The CONCAT sum is completed at the close.
 */
static int rx_member_check(hr_rx *rx, rx_comp *c, const hr_descriptor *d,
                           hr_wire_status *st) {
  if (c->rule == HR_COMPOSITE_CONCAT) {
    if (d->element_type != c->elem)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "CONCAT member: element type differs from the head's");
    if (d->rank != c->rank)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "CONCAT member: rank differs from the head's");
    for (unsigned k = 0; k < c->rank; k++) {
      if (k != c->axis && d->shape[k] != c->shape[k])
        return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                       "CONCAT member: a dimension off the axis differs "
                       "from the head's");
    }
    if (!hr__add_u64(c->axis_sum, d->shape[c->axis], &c->axis_sum) ||
        c->axis_sum > c->shape[c->axis])
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "CONCAT members: sizes along the axis exceed the "
                     "head's");
    return 0;
  }
  if (c->rule != HR_COMPOSITE_GROUP_QUANTIZED)
    return 0; /* TUPLE: any members */
  if (d->rank != c->rank)
    return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                   "GROUP_QUANTIZED member: rank differs from the head's");
  if (c->begun == 0) {
    if (!elem_is_quantized(d->element_type))
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "GROUP_QUANTIZED member 0: not a quantized type");
    for (unsigned k = 0; k < c->rank; k++) {
      if (d->shape[k] != c->shape[k])
        return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                       "GROUP_QUANTIZED member 0: shape differs from the "
                       "head's");
    }
    c->m0_elem = d->element_type;
    return 0;
  }
  if (c->begun == 1 && !elem_is_scale(d->element_type))
    return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                   "GROUP_QUANTIZED member 1 (scales): not FLOAT16, "
                   "BFLOAT16 or FLOAT32");
  if (c->begun == 2 && d->element_type != c->m0_elem)
    return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                   "GROUP_QUANTIZED member 2 (zero points): type differs "
                   "from member 0's");
  for (unsigned k = 0; k < c->rank; k++) {
    uint64_t want = c->shape[k];
    if (k == c->axis)
      want = want / c->group_size + (want % c->group_size != 0);
    if (d->shape[k] != want)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     c->begun == 1 ? "GROUP_QUANTIZED member 1 (scales): "
                                     "wrong shape"
                                   : "GROUP_QUANTIZED member 2 (zero "
                                     "points): wrong shape");
  }
  return 0;
}

/* Checks a composite that just received its last member's DATA_END. */
static int rx_close_check(hr_rx *rx, const rx_comp *c, hr_wire_status *st) {
  if (c->rule == HR_COMPOSITE_CONCAT && c->axis_sum != c->shape[c->axis])
    return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                   "CONCAT members: sizes along the axis do not sum to the "
                   "head's");
  return 0;
}

/*
 * A top-level shard descriptor (HAS_SHARD on the answer to a PARALLEL_OK
 * or REGION request) on stream base + idx.  Sets *valid when it completed
 * a set of shards that tiles the requested box.
 */
static int rx_shard_begin(hr_rx *rx, uint32_t idx, const hr_descriptor *d,
                          const hr_transport_fields *x, int *valid,
                          hr_wire_status *st) {
  const hr_rx_config *cfg = &rx->cfg;
  int region = (cfg->request_flags & HR_REQ_REGION) != 0;
  if (rx->mode == RXM_UNKNOWN) {
    uint32_t n = x->total_shards;
    if (n == 0)
      return rx_fail(rx, st, HR_WIRE_SHARD_INCONSISTENT, 0,
                     "total_shards: 0 shards");
    if (n > rx->k)
      return rx_fail(rx, st, HR_WIRE_SHARD_INCONSISTENT, 0,
                     "total_shards: more shards than the request's "
                     "max_shards");
    if (cfg->server_max_shards && n > cfg->server_max_shards)
      return rx_fail(rx, st, HR_WIRE_SHARD_INCONSISTENT, 0,
                     "total_shards: more shards than the server's "
                     "MAX_SHARDS");
    if (region && d->rank != cfg->region_rank)
      return rx_fail(rx, st, HR_WIRE_SHARD_INCONSISTENT, 0,
                     "shard: rank differs from the region's");
    rx->boxes = hr__mem_calloc(&rx->mem, (size_t)n * 2,
                               (d->rank ? d->rank : 1) * sizeof(uint64_t));
    if (!rx->boxes) {
      rx->failed = 1;
      return HR_ERR_NOMEM;
    }
    rx->mode = RXM_SHARDED;
    rx->n = n;
    rx->ref_elem = d->element_type;
    rx->ref_tag = d->layout.tag;
    rx->ref_rank = d->rank;
    memcpy(rx->ref_parent, d->parent_shape, d->rank * sizeof(uint64_t));
  } else {
    if (x->total_shards != rx->n)
      return rx_fail(rx, st, HR_WIRE_SHARD_INCONSISTENT, 0,
                     "shards disagree on total_shards");
    if (d->rank != rx->ref_rank || memcmp(d->parent_shape, rx->ref_parent,
                                          d->rank * sizeof(uint64_t)) != 0)
      return rx_fail(rx, st, HR_WIRE_SHARD_INCONSISTENT, 0,
                     "shards disagree on parent_shape");
    if (d->element_type != rx->ref_elem)
      return rx_fail(rx, st, HR_WIRE_SHARD_INCONSISTENT, 0,
                     "shards disagree on the element type");
    if (d->layout.tag != rx->ref_tag)
      return rx_fail(rx, st, HR_WIRE_SHARD_INCONSISTENT, 0,
                     "shards disagree on the layout tag");
  }
  if (x->shard_index >= rx->n)
    return rx_fail(rx, st, HR_WIRE_SHARD_INCONSISTENT, 0,
                   "shard_index: not below total_shards");
  if (x->shard_index != idx)
    return rx_fail(rx, st, HR_WIRE_SHARD_INCONSISTENT, 0,
                   "shard_index: shard i travels on stream id + i");
  const uint64_t *box_off = region ? cfg->region_offset : NULL;
  const uint64_t *box_shape = region ? cfg->region_shape : d->parent_shape;
  for (unsigned k = 0; k < d->rank; k++) {
    uint64_t hi;
    if (!hr__add_u64(d->shard_offset[k], d->shape[k], &hi) ||
        hi > d->parent_shape[k])
      return rx_fail(rx, st, HR_WIRE_INVALID_DESCRIPTOR, 0,
                     "shard: outside its parent_shape");
    uint64_t lo = box_off ? box_off[k] : 0;
    uint64_t box_hi;
    if (!hr__add_u64(lo, box_shape[k], &box_hi) || d->shard_offset[k] < lo ||
        hi > box_hi)
      return rx_fail(rx, st, HR_WIRE_SHARD_INCONSISTENT, 0,
                     "shard: outside the requested box");
  }
  uint64_t *b = rx->boxes + (size_t)idx * 2 * rx->ref_rank;
  memcpy(b, d->shard_offset, d->rank * sizeof(uint64_t));
  memcpy(b + d->rank, d->shape, d->rank * sizeof(uint64_t));
  rx->shards_seen++;
  if (rx->shards_seen < rx->n)
    return 0;

  /* Every shard descriptor arrived: check the coverage. */
  unsigned rank = rx->ref_rank;
  const uint64_t **ptrs = hr__mem_malloc(&rx->mem, rx->n * 2 * sizeof *ptrs);
  if (!ptrs) {
    rx->failed = 1;
    return HR_ERR_NOMEM;
  }
  for (uint32_t i = 0; i < rx->n; i++) {
    ptrs[i] = rx->boxes + (size_t)i * 2 * rank;
    ptrs[rx->n + i] = rx->boxes + (size_t)i * 2 * rank + rank;
  }
  uint64_t zero[HR_MAX_RANK] = {0};
  int rv = hr_shards_check_tiling(rank, box_off ? box_off : zero, box_shape,
                                  rx->n, ptrs, ptrs + rx->n, &rx->mem, st);
  hr__mem_free(&rx->mem, (void *)ptrs);
  if (rv != 0) {
    rx->failed = 1;
    return rv;
  }
  rx->shards_valid = 1;
  *valid = 1;
  return 0;
}

/* TENSOR_DESCRIPTOR or TENSOR_PUT on stream base + idx. */
static int rx_on_descriptor(hr_rx *rx, uint32_t idx, const hr_descriptor *d,
                            const hr_transport_fields *x, int is_put,
                            hr_rx_event *ev, hr_wire_status *st) {
  rx_stream *s = &rx->streams[idx];
  const hr_rx_config *cfg = &rx->cfg;
  int has_shard = (d->flags & HR_DESC_HAS_SHARD) != 0;
  int comp = d->layout.tag == HR_LAYOUT_COMPOSITE;
  int shards_valid = 0;
  rx_comp *parent = NULL;

  if (s->state != RXS_IDLE)
    return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                   rx_state_complaint(s->state));
  if (d->rank > HR_MAX_RANK)
    return rx_fail(rx, st, HR_WIRE_INVALID_DESCRIPTOR, 0,
                   "descriptor.rank: above 32");
  if (x->data_plane > HR_PLANE_SHM)
    return rx_fail(rx, st, HR_WIRE_MALFORMED_PAYLOAD, 0,
                   "data_plane: undefined value");

  if (cfg->direction == HR_RX_C2S) {
    if (is_put) {
      if (s->started)
        return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                       "TENSOR_PUT: a second PUT on the stream");
      if (has_shard)
        return rx_fail(rx, st, HR_WIRE_PUT_REJECTED, 0,
                       "TENSOR_PUT: a shard (HAS_SHARD) cannot be put");
    } else if (rx->depth == 0) {
      return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                     s->started ? "TENSOR_DESCRIPTOR: a non-composite PUT "
                                  "has no member descriptors"
                                : "TENSOR_DESCRIPTOR before TENSOR_PUT");
    }
    rx->mode = RXM_SINGLE;
  }

  if (rx->depth > 0) {
    /* A member of the innermost open composite. */
    parent = &rx->comp[rx->depth - 1];
    if (has_shard || x->total_shards != 1 || x->shard_index != 0)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "composite member: members are never shards");
    int rv = rx_member_check(rx, parent, d, st);
    if (rv != 0)
      return rv;
  } else if (cfg->direction == HR_RX_S2C) {
    uint32_t fl = cfg->request_flags;
    int par = (fl & HR_REQ_PARALLEL_OK) != 0;
    int reg = (fl & HR_REQ_REGION) != 0;
    if (!par && !reg) {
      if (has_shard)
        return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                       "HAS_SHARD on the answer to a plain request");
      rx->mode = RXM_SINGLE;
    } else if (rx->mode == RXM_UNKNOWN && comp && !has_shard) {
      /* Composites are never sharded: a PARALLEL_OK request for one is
       * answered unsharded, on the request's stream. */
      if (reg)
        return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                       "a REGION request answered with a composite");
      if (idx != 0)
        return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                       "an unsharded answer on a stream other than the "
                       "request's");
      rx->mode = RXM_SINGLE;
    } else {
      if (!has_shard)
        return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                       "the answer to a PARALLEL_OK or REGION request "
                       "lacks HAS_SHARD");
      if (comp)
        return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                       "a composite is never sharded");
      int rv = rx_shard_begin(rx, idx, d, x, &shards_valid, st);
      if (rv != 0)
        return rv;
    }
  }
  if (!has_shard && (x->total_shards != 1 || x->shard_index != 0))
    return rx_fail(rx, st, HR_WIRE_INVALID_DESCRIPTOR, 0,
                   "shard_index/total_shards: must be 0/1 without "
                   "HAS_SHARD");

  unsigned depth = rx->depth ? rx->depth + 1 : 0;
  uint32_t member_index = parent ? parent->begun : 0;
  if (comp) {
    int rv = rx_head_check(rx, d, st);
    if (rv != 0)
      return rv;
    if (rx->depth >= HR_MAX_COMPOSITE_DEPTH)
      return rx_fail(rx, st, HR_WIRE_COMPOSITE_INVALID, 0,
                     "composite: nesting deeper than 8");
    rx_comp *c = &rx->comp[rx->depth++];
    memset(c, 0, sizeof *c);
    memcpy(c->shape, d->shape, d->rank * sizeof(uint64_t));
    c->elem = d->element_type;
    c->rank = d->rank;
    c->member_count = d->params.member_count;
    c->rule = d->params.rule;
    c->axis = d->params.axis;
    c->has_zero_point = d->params.has_zero_point;
    c->group_size = d->params.group_size;
    depth = rx->depth;
  }
  int rv = hr__frames_init(&s->ft, d, x->total_data_bytes, st);
  if (rv != 0) {
    rx->failed = 1;
    return rv;
  }
  if (parent)
    parent->begun++;
  s->state = RXS_OPEN;
  s->started = 1;
  s->plane = x->data_plane;
  s->rdma_seen = 0;
  s->is_head = (uint8_t)comp;
  s->depth = depth;
  s->member_index = member_index;

  ev->kind = HR_RXE_TENSOR_BEGIN | (shards_valid ? HR_RXE_SHARDS_VALID : 0);
  ev->desc = d;
  ev->xport = x;
  ev->depth = depth;
  ev->member_index = member_index;
  return 0;
}

/* TENSOR_DATA_END: ends the open tensor, then any composites it completes. */
static int rx_on_end(hr_rx *rx, rx_stream *s, hr_rx_event *ev,
                     hr_wire_status *st) {
  if (s->state != RXS_OPEN)
    return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                   s->state == RXS_IDLE
                       ? "TENSOR_DATA_END before its tensor's descriptor"
                       : rx_state_complaint(s->state));
  if (s->plane == HR_PLANE_FRAMES) {
    int rv = hr__frames_end(&s->ft, st);
    if (rv != 0) {
      rx->failed = 1;
      return rv;
    }
  } else if (s->plane == HR_PLANE_RDMA && s->ft.total > 0 && !s->rdma_seen) {
    return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                   "TENSOR_DATA_END of an RDMA transfer before "
                   "RDMA_REGISTER");
  }
  ev->kind = HR_RXE_TENSOR_END;
  ev->depth = s->depth;
  ev->member_index = s->member_index;
  ev->received = s->ft.received;
  if (s->is_head) {
    /* The head owns no data; its members follow. */
    s->state = RXS_IDLE;
    return 0;
  }
  unsigned closed = 0;
  if (rx->depth > 0) {
    rx_comp *c = &rx->comp[rx->depth - 1];
    c->ended++;
    while (c->ended == c->member_count) {
      int rv = rx_close_check(rx, c, st);
      if (rv != 0)
        return rv;
      rx->depth--;
      closed++;
      if (rx->depth == 0)
        break;
      c = &rx->comp[rx->depth - 1];
      c->ended++; /* the nested composite was one member */
    }
  }
  if (closed) {
    ev->kind |= HR_RXE_COMPOSITE_CLOSE;
    ev->composites_closed = closed;
  }
  if (rx->depth == 0) {
    s->state = RXS_DONE;
    rx->streams_done++;
  } else {
    s->state = RXS_IDLE;
  }
  return 0;
}

int hr_rx_on_message(hr_rx *rx, const hr_msg *m, hr_rx_event *ev,
                     hr_wire_status *st) {
  if (!rx || !m || !ev)
    return HR_ERR_INVALID_ARGUMENT;
  memset(ev, 0, sizeof *ev);
  if (rx->failed)
    return HR_ERR_STATE;
  const hr_rx_config *cfg = &rx->cfg;
  uint32_t sid = m->hdr.stream_id;
  uint32_t type = m->hdr.type;
  ev->stream_id = sid;
  ev->total_shards = 1;

  if (cfg->direction == HR_RX_C2S && cfg->base_stream == 0) {
    if (type != HR_MSG_TENSOR_PUT || sid == 0)
      return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                     "a PUT transfer starts with TENSOR_PUT");
    rx->cfg.base_stream = sid;
  }
  uint32_t base = cfg->base_stream;
  if (sid < base || sid - base >= rx->k) {
    int shard = cfg->direction == HR_RX_S2C &&
                (cfg->request_flags & HR_REQ_PARALLEL_OK) &&
                type == HR_MSG_TENSOR_DESCRIPTOR &&
                (m->u.tensor.desc.flags & HR_DESC_HAS_SHARD);
    return rx_fail(
        rx, st, shard ? HR_WIRE_SHARD_INCONSISTENT : HR_WIRE_PROTOCOL_VIOLATION,
        0,
        shard ? "shard: outside the block of streams the "
                "request reserved"
              : "a message on a stream outside the transfer");
  }
  uint32_t idx = sid - base;
  rx_stream *s = &rx->streams[idx];
  int rv = 0;
  /* Reserved streams the answer turned out not to use carry nothing (a
   * shard descriptor there is judged by the shard rules instead). */
  if ((rx->mode == RXM_SINGLE && idx != 0) ||
      (rx->mode == RXM_SHARDED && idx >= rx->n &&
       type != HR_MSG_TENSOR_DESCRIPTOR))
    return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                   "a message on a reserved stream the answer does not use");

  switch (type) {
  case HR_MSG_TENSOR_DESCRIPTOR:
    rv = rx_on_descriptor(rx, idx, &m->u.tensor.desc, &m->u.tensor.xport, 0, ev,
                          st);
    break;
  case HR_MSG_TENSOR_PUT:
    if (cfg->direction != HR_RX_C2S)
      return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                     "TENSOR_PUT on the answer to a request");
    rv = rx_on_descriptor(rx, idx, &m->u.put.desc, &m->u.put.xport, 1, ev, st);
    break;
  case HR_MSG_TENSOR_DATA: {
    const hr_data *d = &m->u.data;
    if (s->state != RXS_OPEN)
      return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                     s->state == RXS_IDLE
                         ? "TENSOR_DATA before its tensor's descriptor"
                         : rx_state_complaint(s->state));
    if (s->plane != HR_PLANE_FRAMES)
      return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                     "TENSOR_DATA on a tensor sent over RDMA or SHM");
    rv =
        hr__frames_on_data(&s->ft, d->buffer_index, d->offset, d->data_len, st);
    if (rv != 0) {
      rx->failed = 1;
      return rv;
    }
    ev->kind = HR_RXE_DATA;
    ev->depth = s->depth;
    ev->member_index = s->member_index;
    ev->buffer_index = d->buffer_index;
    ev->offset = d->offset;
    ev->len = d->data_len;
    ev->received = s->ft.received;
    break;
  }
  case HR_MSG_TENSOR_DATA_END: rv = rx_on_end(rx, s, ev, st); break;
  case HR_MSG_RDMA_REGISTER: {
    const hr_rdma_register *r = &m->u.rdma;
    if (s->state != RXS_OPEN)
      return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                     s->state == RXS_IDLE
                         ? "RDMA_REGISTER before its tensor's descriptor"
                         : rx_state_complaint(s->state));
    if (s->plane != HR_PLANE_RDMA)
      return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                     "RDMA_REGISTER on a tensor not sent over RDMA");
    if (s->rdma_seen)
      return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                     "RDMA_REGISTER: a second registration of the source");
    if (r->role != HR_RDMA_SOURCE)
      return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 12,
                     "RDMA_REGISTER.role: the sender registers a SOURCE");
    if (r->length < s->ft.total)
      return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 16,
                     "RDMA_REGISTER.length: shorter than total_data_bytes");
    s->rdma_seen = 1;
    ev->depth = s->depth;
    ev->member_index = s->member_index;
    break;
  }
  case HR_MSG_ERROR:
    if (s->state == RXS_DONE || s->state == RXS_ENDED)
      break; /* an ERROR racing the end of its stream is dropped */
    s->state = RXS_ENDED;
    if (!rx->remote_ended) {
      rx->remote_ended = 1;
      rx->remote_code = m->u.error.code;
    }
    ev->kind = HR_RXE_STREAM_ENDED;
    ev->error_code = m->u.error.code;
    break;
  case HR_MSG_RDMA_READY:
    return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                   "RDMA_READY travels from the receiver to the sender");
  default:
    return rx_fail(rx, st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                   "a message type that has no place in this transfer");
  }
  if (rv != 0)
    return rv;
  if (rx->mode == RXM_SHARDED) {
    ev->shard_index = (uint16_t)idx;
    ev->total_shards = (uint16_t)rx->n;
  }
  if (rx_transfer_done(rx) && (ev->kind & HR_RXE_TENSOR_END)) {
    ev->kind |= HR_RXE_DONE;
    ev->done = 1;
  }
  return 0;
}

int hr_rx_finish(hr_rx *rx, hr_wire_status *st) {
  if (!rx)
    return HR_ERR_INVALID_ARGUMENT;
  if (rx->failed)
    return HR_ERR_STATE;
  if (rx->remote_ended) {
    if (st) {
      st->code = rx->remote_code;
      st->offset = 0;
      st->reason = "the peer ended a stream of the transfer with ERROR";
    }
    return HR_ERR_REMOTE;
  }
  if (rx_transfer_done(rx))
    return 0;
  if (rx->mode == RXM_SINGLE && rx->depth > 0) {
    if (rx->cfg.strict)
      return hr__wire_fail(st, HR_WIRE_COMPOSITE_INVALID, 0,
                           "torn composite: the stream ended before it closed");
    rx->torn = 1;
    return 0;
  }
  if (rx->mode == RXM_UNKNOWN)
    return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                         "the stream ended before any descriptor");
  if (rx->mode == RXM_SHARDED && rx->shards_seen < rx->n)
    return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                         "the stream ended before every shard's descriptor");
  return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 0,
                       "the stream ended before a tensor's TENSOR_DATA_END");
}
