/*
 * Server decisions for one GET: device (seeds § Server Device Selection),
 * layout (seeds § Server Layout Selection with the profiles of wire-v1
 * § 5.1), region (§ 8) and shards (§ 9), turned into send sequences.
 *
 * Layout: the first preference that is satisfiable wins: stored in that
 * layout, or ALLOW_TRANSCODE with our TRANSCODING capability and a kernel
 * for it.  STRIDED only matches a tensor stored STRIDED; a registered
 * profile matches only when its metadata parses and its rank is the
 * tensor's.  A sparse target must exist whole in memory, so it falls
 * through when it would exceed transcode_mem_limit; dense targets stream
 * chunk by chunk and never do, but a dense target whose padding (PANEL,
 * TILED) would exceed the tensor's own bytes (or 64 KiB) falls through
 * too.  Nothing satisfiable: the stored layout.
 *
 * PERMUTED requested as a plain tag lets us choose the order: for a
 * tensor stored ROW_MAJOR or COLUMN_MAJOR we choose the order its bytes
 * already have (identity / reversed), so the answer costs no copy.
 *
 * Shards: N = min(max_shards asked, our MAX_SHARDS, lanes x
 * shards_per_lane (4), ceil(bytes / shard_bytes (16 MiB)), the extent
 * cut), cut along the outermost stored
 * dimension of the layout sent whose extent in the box exceeds 1 (dim 0
 * for row-major, the last for column-major, order[0] for PERMUTED, unless
 * those are 1; always dim 0 on whole tile rows or panels for TILED and
 * PANEL), into slices whose extents differ by at most one.  Each shard of
 * an untranscoded tensor is then one contiguous run of its buffer and is
 * sent without a copy.  Sparse, STRIDED, INT4/UINT4 and extension layouts
 * are answered with one shard.
 */
#include <string.h>

#include "hr_session_int.h"

/* The layout chosen for one tensor. */
typedef struct choice {
  int native;              /* send the stored layout */
  int relabel;             /* stored ROW/COL sent as PERMUTED, same bytes */
  uint8_t tag;             /* layout sent (descriptor tag) */
  hr_layout_params params; /* its parameters (transcode target) */
  uint32_t mr;             /* PANEL */
} choice;

static void put_reason(char *msg, size_t cap, const char *r) {
  hr__set_msg(msg, cap, r, r ? strlen(r) : 0);
}

static unsigned elem_bytes(uint8_t e) {
  unsigned b = hr_elem_bits(e);
  return b >= 8 ? b / 8 : 1;
}

static unsigned log2_of(uint64_t v) {
  unsigned l = 0;
  while (((uint64_t)1 << (l + 1)) <= v && l < 63)
    l++;
  return l;
}

static int is_int4(uint8_t e) {
  return e == HR_ELEM_INT4 || e == HR_ELEM_UINT4;
}

static int is_dense(uint8_t tag) {
  return tag == HR_LAYOUT_ROW_MAJOR || tag == HR_LAYOUT_COLUMN_MAJOR ||
         tag == HR_LAYOUT_PERMUTED || tag == HR_LAYOUT_TILED ||
         tag == HR_LAYOUT_PANEL;
}

static int is_sparse_target(uint8_t tag) {
  return tag == HR_LAYOUT_SPARSE_COO || tag == HR_LAYOUT_SPARSE_CSR ||
         tag == HR_LAYOUT_SPARSE_CSC;
}

static uint32_t desc_mr(const hr_descriptor *d) {
  if (d->params.mr)
    return d->params.mr;
  if (d->layout.ext && d->layout.ext_len == 4)
    return (uint32_t)d->layout.ext[0] | (uint32_t)d->layout.ext[1] << 8 |
           (uint32_t)d->layout.ext[2] << 16 | (uint32_t)d->layout.ext[3] << 24;
  return 0;
}

/* Can this build transcode `elem` from `src` to `dst` for this request? */
static int can_xc(const hr_session *s, const hr_request *req, uint8_t elem,
                  uint8_t src, uint8_t dst) {
  if (!(req->flags & HR_REQ_ALLOW_TRANSCODE) ||
      !(s->our_caps & HR_CAP_TRANSCODING) || is_int4(elem))
    return 0;
#ifdef HR_HAVE_TRANSCODE
  return hr_xc_supported(elem, src, dst);
#else
  (void)src;
  (void)dst;
  return 0;
#endif
}

/* ---- transcoding plans --------------------------------------------------- */

#ifdef HR_HAVE_TRANSCODE
/* Padding a transcoded dense target may add (PANEL's last panel, TILED's
 * edge tiles): at most the logical bytes of the box, or this much for a
 * small tensor.  Without a bound a 75-byte request for PANEL mr 2^32 - 1
 * of an 8 x 8 tensor asks for 100 GB of zeros: the answer would stream
 * for hours (found by fuzz/fuzz_server_session). */
#define HR_PAD_FREE ((uint64_t)64 << 10)

static int padding_ok(const hr_descriptor *d, const uint64_t *box_shape,
                      uint64_t out_size) {
  uint64_t elems = 1, bits, logical;
  for (unsigned k = 0; k < d->rank; k++)
    if (!hr__mul_u64(elems, box_shape ? box_shape[k] : d->shape[k], &elems))
      return 0;
  if (!hr__mul_u64(elems, hr_elem_bits(d->element_type), &bits))
    return 0;
  logical = bits / 8 + (bits % 8 != 0);
  return out_size <= logical ||
         out_size - logical <= (logical > HR_PAD_FREE ? logical : HR_PAD_FREE);
}

/* Creates a plan for `t` (restricted to box, NULL: whole) into `c`.
 * Returns 0, HR_ERR_LIMIT (memory limit: fall through), HR_ERR_UNSUPPORTED
 * (cannot), HR_ERR_PROTO (the source is bad: answer with st), NOMEM. */
static int make_plan(hr_session *s, hr_tensor *t, const choice *c,
                     const uint64_t *box_off, const uint64_t *box_shape,
                     hr_xc_plan **out, hr_wire_status *st) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  hr_xc_tensor src;
  memset(&src, 0, sizeof src);
  src.desc = d;
  for (unsigned k = 0; k < d->buffer_count; k++) {
    src.buffers[k] = hr_tensor_buffer(t, k);
    src.sizes[k] = d->buffers[k].size_bytes;
  }
  hr_xc_target tg;
  memset(&tg, 0, sizeof tg);
  tg.layout = c->tag;
  tg.params = c->params;
  if (c->tag == HR_LAYOUT_PANEL)
    tg.params.mr = c->mr;
  if (is_sparse_target(c->tag))
    tg.params.index_type = 0;
  hr_xc_region reg, *rp = NULL;
  if (box_off) {
    memset(&reg, 0, sizeof reg);
    for (unsigned k = 0; k < d->rank; k++) {
      reg.offset[k] = box_off[k];
      reg.shape[k] = box_shape[k];
    }
    rp = &reg;
  }
  hr_xc_opts opts;
  memset(&opts, 0, sizeof opts);
  opts.max_scratch = s->set.transcode_mem_limit;
  int rv = hr_xc_plan_new(out, &src, &tg, rp, &opts, &s->mem, st);
  if (rv == HR_ERR_INVALID_ARGUMENT)
    rv = HR_ERR_UNSUPPORTED;
  if (rv)
    return rv;
  if (hr_xc_plan_needs_whole(*out)) {
    /* The whole output must exist at once: the memory limit applies. */
    rv = hr_xc_plan_count(*out, st);
    if (rv == 0 && hr_xc_plan_out_size(*out) > s->set.transcode_mem_limit)
      rv = HR_ERR_LIMIT;
    if (rv == HR_ERR_PROTO || rv == HR_ERR_INVALID_ARGUMENT)
      rv = HR_ERR_UNSUPPORTED;
    if (rv) {
      hr_xc_plan_del(*out);
      *out = NULL;
    }
  } else if (!c->native &&
             !padding_ok(d, box_shape, hr_xc_plan_out_size(*out))) {
    hr_xc_plan_del(*out);
    *out = NULL;
    rv = HR_ERR_LIMIT;
  }
  return rv;
}
#endif

/* ---- layout selection ---------------------------------------------------- */

/* Tiles of our choosing for a plain TILED preference: 32 x 32 on the two
 * innermost dims (a good transpose block), 1 on the others. */
static void default_tiles(const hr_descriptor *d, uint32_t *tile) {
  for (unsigned k = 0; k < d->rank; k++)
    tile[k] = 1;
  if (d->rank == 1)
    tile[0] = 256;
  for (unsigned k = d->rank >= 2 ? d->rank - 2 : d->rank; k < d->rank; k++)
    if (d->rank >= 2)
      tile[k] = 32;
}

/* Does a transcode to `c` work within the limits?  0: yes; 1: fall
 * through; negative: answer with an error (st) or fatal. */
static int xc_feasible(hr_session *s, hr_tensor *t, const choice *c,
                       hr_wire_status *st) {
#ifdef HR_HAVE_TRANSCODE
  hr_xc_plan *p = NULL;
  int rv = make_plan(s, t, c, NULL, NULL, &p, st);
  hr_xc_plan_del(p);
  if (rv == HR_ERR_LIMIT || rv == HR_ERR_UNSUPPORTED)
    return 1;
  return rv;
#else
  (void)s;
  (void)t;
  (void)c;
  (void)st;
  return 1;
#endif
}

static int select_layout(hr_session *s, const hr_request *req, hr_tensor *t,
                         choice *out, hr_wire_status *st) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  uint8_t stored = d->layout.tag;
  memset(out, 0, sizeof *out);
  for (uint16_t i = 0; i < req->layout_count; i++) {
    const hr_layout_entry *e = &req->layouts[i];
    choice c;
    memset(&c, 0, sizeof c);
    c.tag = e->tag;
    int xc = 0;
    switch (e->tag) {
    case HR_LAYOUT_ROW_MAJOR:
    case HR_LAYOUT_COLUMN_MAJOR:
      if (stored == e->tag) {
        c.native = 1;
        break;
      }
      xc = 1;
      break;
    case HR_LAYOUT_PERMUTED:
      if (stored == HR_LAYOUT_PERMUTED) {
        c.native = 1;
        break;
      }
      if ((stored == HR_LAYOUT_ROW_MAJOR || stored == HR_LAYOUT_COLUMN_MAJOR) &&
          can_xc(s, req, d->element_type, stored, HR_LAYOUT_PERMUTED)) {
        c.relabel = 1;
        for (unsigned k = 0; k < d->rank; k++)
          c.params.order[k] =
              (uint8_t)(stored == HR_LAYOUT_ROW_MAJOR ? k : d->rank - 1 - k);
        break;
      }
      for (unsigned k = 0; k < d->rank; k++)
        c.params.order[k] = (uint8_t)k;
      xc = 1;
      break;
    case HR_LAYOUT_TILED:
      if (stored == HR_LAYOUT_TILED) {
        c.native = 1;
        break;
      }
      default_tiles(d, c.params.tile);
      xc = 1;
      break;
    case HR_LAYOUT_STRIDED:
    case HR_LAYOUT_SPARSE_BSR:
      if (stored == e->tag)
        c.native = 1;
      break;
    case HR_LAYOUT_SPARSE_COO:
    case HR_LAYOUT_SPARSE_CSR:
    case HR_LAYOUT_SPARSE_CSC:
      if (stored == e->tag) {
        c.native = 1;
        break;
      }
      xc = 1;
      break;
    case HR_LAYOUT_PANEL:
    case HR_LAYOUT_TILED_EXACT:
    case HR_LAYOUT_PERMUTED_EXACT: {
      hr_layout_profile pr;
      if (hr_layout_profile_parse(e, &pr))
        break; /* unparsable metadata: not satisfiable */
      if (e->tag == HR_LAYOUT_PANEL) {
        if (d->rank != 2)
          break;
        c.mr = pr.mr;
        if (stored == HR_LAYOUT_PANEL && desc_mr(d) == pr.mr) {
          c.native = 1;
          break;
        }
        xc = 1;
        break;
      }
      if (pr.rank != d->rank)
        break;
      if (e->tag == HR_LAYOUT_TILED_EXACT) {
        c.tag = HR_LAYOUT_TILED;
        memcpy(c.params.tile, pr.tile, sizeof pr.tile);
        if (stored == HR_LAYOUT_TILED &&
            !memcmp(d->params.tile, pr.tile, d->rank * sizeof pr.tile[0])) {
          c.native = 1;
          break;
        }
        xc = 1;
        break;
      }
      c.tag = HR_LAYOUT_PERMUTED;
      memcpy(c.params.order, pr.order, sizeof pr.order);
      if (stored == HR_LAYOUT_PERMUTED &&
          !memcmp(d->params.order, pr.order, d->rank)) {
        c.native = 1;
        break;
      }
      int ident = 1, rev = 1;
      for (unsigned k = 0; k < d->rank; k++) {
        ident &= pr.order[k] == k;
        rev &= pr.order[k] == d->rank - 1 - k;
      }
      if (((stored == HR_LAYOUT_ROW_MAJOR && ident) ||
           (stored == HR_LAYOUT_COLUMN_MAJOR && rev)) &&
          can_xc(s, req, d->element_type, stored, HR_LAYOUT_PERMUTED)) {
        c.relabel = 1;
        break;
      }
      xc = 1;
      break;
    }
    default:
      /* Reserved tags are skipped; an unregistered extension matches only
       * a tensor stored in exactly that layout. */
      if (e->tag >= HR_LAYOUT_EXT_FIRST && e->tag <= HR_LAYOUT_EXT_LAST &&
          stored == e->tag && d->layout.ext_len == e->ext_len &&
          (!e->ext_len || !memcmp(d->layout.ext, e->ext, e->ext_len)))
        c.native = 1;
      break;
    }
    if (c.native || c.relabel) {
      if (c.native)
        c.tag = stored;
      *out = c;
      return 0;
    }
    if (!xc || !can_xc(s, req, d->element_type, stored, c.tag))
      continue;
    int rv = xc_feasible(s, t, &c, st);
    if (rv < 0)
      return rv;
    if (rv == 0) {
      *out = c;
      return 0;
    }
  }
  out->native = 1;
  out->tag = stored;
  return 0;
}

/* ---- devices ------------------------------------------------------------- */

static int we_advertise(const hr_session *s, uint8_t dev) {
  if (!s->set.devices)
    return dev == HR_DEV_CPU;
  for (uint16_t i = 0; i < s->set.device_count; i++)
    if (s->set.devices[i] == dev)
      return 1;
  return 0;
}

/* Whether the response can be placed on `dev` now.  Over the network a
 * device placement is a label: the bytes travel in host frames,
 * producer-synced, and the client lands them on its device (wire-v1
 * § 7.2).  We place on a device when we advertise it and the tensor lives
 * there (hr_tensor_wrap_device with that device_tag); a host tensor asked
 * for on a device counts as "advertised but unavailable" (rule 4), so the
 * client decides whether CPU will do. */
static int tensor_on_dev(hr_tensor *t, uint8_t dev) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  size_t n = hr_tensor_member_count(t);
  for (size_t i = 0; i < n; i++)
    if (!tensor_on_dev(hr_tensor_member(t, i), dev))
      return 0;
  if (d->layout.tag == HR_LAYOUT_COMPOSITE)
    return 1;
  if (!hr_tensor_on_device(t))
    return 0;
  for (unsigned k = 0; k < d->buffer_count; k++)
    if (d->buffers[k].device_tag != dev)
      return 0;
  return 1;
}

static int device_can_place(const hr_session *s, hr_tensor *t, uint8_t dev) {
  if (dev == HR_DEV_CPU)
    return 1;
  return we_advertise(s, dev) && tensor_on_dev(t, dev);
}

static int select_device(hr_session *s, const hr_request *req, hr_tensor *t,
                         uint8_t *dev, char *fallback, size_t fcap,
                         uint32_t *wire, char *msg, size_t msgcap) {
  uint8_t pd = req->preferred_device;
  /* Rule 1: advertised and placeable now. */
  if (we_advertise(s, pd) && device_can_place(s, t, pd)) {
    *dev = pd;
    return 0;
  }
  /* Rule 2: CPU is the universal fallback; failing it is final. */
  if (pd == HR_DEV_CPU) {
    *wire = HR_WIRE_DEVICE_UNAVAILABLE;
    hr__set_msg(msg, msgcap, "CPU placement unavailable", 25);
    return 1;
  }
  /* Rule 4: advertised but unavailable now: CPU only if the client
   * advertised CPU, and only when we can serve CPU ourselves. */
  if (we_advertise(s, pd) && s->client_has_cpu && we_advertise(s, 0) &&
      device_can_place(s, t, HR_DEV_CPU)) {
    *dev = HR_DEV_CPU;
    const char *name = hr_device_name(pd);
    char b[128];
    size_t n = 0;
    const char *a = "preferred device ", *z = " unavailable; served on CPU";
    for (const char *p = a; *p && n < sizeof b - 1; p++)
      b[n++] = *p;
    for (const char *p = name; *p && n < sizeof b - 1; p++)
      b[n++] = *p;
    for (const char *p = z; *p && n < sizeof b - 1; p++)
      b[n++] = *p;
    hr__set_msg(fallback, fcap, b, n);
    return 0;
  }
  /* Rule 3: never a silent fallback otherwise. */
  *wire = HR_WIRE_DEVICE_UNAVAILABLE;
  hr__set_msg(msg, msgcap, "preferred device unavailable", 28);
  return 1;
}

/* ---- building parts ------------------------------------------------------ */

/* Finishes a descriptor for the wire: device, memory class, alignment,
 * shard fields. */
static void finish_desc(const hr_request *req, const hr_descriptor *stored,
                        hr_descriptor *d, uint8_t dev, int shard,
                        const uint64_t *box_off) {
  for (unsigned k = 0; k < d->buffer_count; k++) {
    hr_buffer_handle *b = &d->buffers[k];
    uint64_t size = b->size_bytes;
    unsigned natural = 0;
    if (k < stored->buffer_count && stored->layout.tag == d->layout.tag)
      natural = stored->buffers[k].alignment_log2;
    else if (is_sparse_target(d->layout.tag) && k + 1 < d->buffer_count)
      natural = log2_of(d->params.index_type == HR_ELEM_INT64 ? 8 : 4);
    else
      natural = log2_of(elem_bytes(d->element_type));
    memset(b, 0, sizeof *b);
    b->size_bytes = size;
    b->alignment_log2 =
        (uint8_t)(natural > req->min_alignment_log2 ? natural
                                                    : req->min_alignment_log2);
    if (b->alignment_log2 > HR_MAX_ALIGNMENT_LOG2)
      b->alignment_log2 = HR_MAX_ALIGNMENT_LOG2;
    b->device_tag = dev;
    b->memory_class = HR_MEM_STANDARD;
  }
  d->byte_offset = 0;
  d->params_raw = NULL;
  d->params_len = 0;
  if (shard) {
    d->flags |= HR_DESC_HAS_SHARD;
    for (unsigned k = 0; k < d->rank; k++) {
      d->parent_shape[k] = stored->shape[k];
      d->shard_offset[k] = box_off ? box_off[k] : 0;
    }
  } else {
    d->flags &= (uint8_t)~HR_DESC_HAS_SHARD;
  }
}

static hr_part *new_part(hr_session *s, hr_tx *tx) {
  hr_part *np =
      hr__mem_realloc(&s->mem, tx->parts, (tx->nparts + 1) * sizeof *np);
  if (!np)
    return NULL;
  tx->parts = np;
  hr_part *p = &np[tx->nparts++];
  memset(p, 0, sizeof *p);
  return p;
}

/* Dims from the storage-outermost to the innermost, for the layout sent
 * (TILED and PANEL: row-major order of their tiles or panels). */
static void storage_order(const hr_descriptor *d, const choice *c,
                          unsigned *perm) {
  for (unsigned k = 0; k < d->rank; k++) {
    if (c->tag == HR_LAYOUT_COLUMN_MAJOR)
      perm[k] = d->rank - 1 - k;
    else if (c->tag == HR_LAYOUT_PERMUTED)
      perm[k] = c->native ? d->params.order[k] : c->params.order[k];
    else
      perm[k] = k;
  }
}

/* Shards of TILED and PANEL are slabs of whole tile rows / panels along
 * dim 0, and INT4 ones whole bytes: their receivers place nothing else. */
static int slab_only(const hr_descriptor *d, const choice *c) {
  return c->tag == HR_LAYOUT_TILED || c->tag == HR_LAYOUT_PANEL ||
         is_int4(d->element_type);
}

/* The dimension shards are cut along: the storage-outermost one whose
 * extent in the box exceeds 1 (dims of extent 1 outside it leave every
 * slice one contiguous run of the buffer); dim 0 for slab-only layouts. */
static unsigned cut_dim(const hr_descriptor *d, const choice *c,
                        const uint64_t *box_shape) {
  unsigned perm[HR_MAX_RANK];
  if (slab_only(d, c))
    return 0;
  storage_order(d, c, perm);
  for (unsigned k = 0; k < d->rank; k++)
    if (box_shape[perm[k]] > 1)
      return perm[k];
  return perm[0];
}

/* Slab unit along the outer dim: rows of a tile row or a panel. */
static uint64_t slab_unit(const hr_descriptor *d, const choice *c) {
  if (c->tag == HR_LAYOUT_TILED)
    return c->native ? d->params.tile[0] : c->params.tile[0];
  if (c->tag == HR_LAYOUT_PANEL)
    return c->native ? desc_mr(d) : c->mr;
  return 1;
}

/* Dense element layouts: is the box one contiguous run of the stored
 * buffer?  It is when, in storage order, the dims inside some dim j span
 * the whole tensor and those outside j have extent 1 in the box. */
static int run_of(const hr_descriptor *d, const choice *c, const uint64_t *off,
                  const uint64_t *shape, uint64_t *start, uint64_t *len) {
  unsigned perm[HR_MAX_RANK];
  storage_order(d, c, perm);
  uint64_t esz = elem_bytes(d->element_type), elems = 1;
  for (unsigned k = 0; k < d->rank; k++)
    elems *= shape[k];
  if (elems == 0) {
    *start = *len = 0;
    return 1;
  }
  unsigned j = d->rank - 1;
  while (j > 0 && off[perm[j]] == 0 && shape[perm[j]] == d->shape[perm[j]])
    j--;
  for (unsigned i = 0; i < j; i++)
    if (shape[perm[i]] != 1)
      return 0;
  uint64_t first = 0, stride = 1;
  for (unsigned i = d->rank; i-- > 0;) {
    first += off[perm[i]] * stride;
    stride *= d->shape[perm[i]];
  }
  *start = first * esz;
  *len = elems * esz;
  return 1;
}

/* Is box a slab of the stored buffer (native or relabelled data only)?
 * Sets *start and *len to its byte range. */
static int slab_of(const hr_descriptor *d, const choice *c, const uint64_t *off,
                   const uint64_t *shape, uint64_t *start, uint64_t *len) {
  if (!(c->native || c->relabel) || !is_dense(c->tag) || d->rank == 0)
    return 0;
  if (!slab_only(d, c))
    return run_of(d, c, off, shape, start, len);
  unsigned od = 0;
  for (unsigned k = 0; k < d->rank; k++)
    if (k != od && (off[k] != 0 || shape[k] != d->shape[k]))
      return 0;
  uint64_t unit = slab_unit(d, c);
  if (!unit || off[od] % unit)
    return 0;
  uint64_t ext = d->shape[od];
  if (shape[od] % unit && off[od] + shape[od] != ext)
    return 0;
  uint64_t total = d->buffers[0].size_bytes;
  if (is_int4(d->element_type)) {
    uint64_t inner = ext ? 1 : 0;
    for (unsigned k = 1; k < d->rank; k++)
      inner *= d->shape[k];
    if ((off[od] * inner) % 2 ||
        (shape[od] * inner % 2 && off[od] + shape[od] != ext))
      return 0;
    *start = off[od] * inner / 2;
    *len = (shape[od] * inner + 1) / 2;
    return 1;
  }
  uint64_t units = ext ? (ext + unit - 1) / unit : 0;
  uint64_t per = units ? total / units : 0;
  *start = off[od] / unit * per;
  *len = (shape[od] + unit - 1) / unit * per;
  return 1;
}

/* A STRIDED box: the same buffer bytes, a sub-span, a shifted origin. */
static int strided_box(const hr_descriptor *d, const uint64_t *off,
                       const uint64_t *shape, hr_descriptor *out,
                       uint64_t *start, uint64_t *len) {
  unsigned esz = elem_bytes(d->element_type);
  __int128 base = (__int128)d->params.origin, lo = 0, hi = 0;
  int empty = 0;
  for (unsigned k = 0; k < d->rank; k++) {
    __int128 st = d->params.strides[k];
    base += (__int128)off[k] * st;
    if (shape[k] == 0)
      empty = 1;
    else if (st > 0)
      hi += (__int128)(shape[k] - 1) * st;
    else
      lo += (__int128)(shape[k] - 1) * st;
  }
  *out = *d;
  for (unsigned k = 0; k < d->rank; k++)
    out->shape[k] = shape[k];
  if (empty) {
    out->params.origin = 0;
    out->buffers[0].size_bytes = 0;
    *start = *len = 0;
    return 0;
  }
  __int128 first = base + lo, last = base + hi;
  if (first < 0 || (uint64_t)((last + 1) * esz) > d->buffers[0].size_bytes)
    return HR_ERR_INVALID_ARGUMENT;
  out->params.origin = (uint64_t)(base - first);
  *start = (uint64_t)first * esz;
  *len = (uint64_t)(last - first + 1) * esz;
  out->buffers[0].size_bytes = *len;
  return 0;
}

/* Appends the part sending box (off, shape) of plain tensor t as c. */
static int box_part(hr_session *s, const hr_request *req, hr_tensor *t,
                    const choice *c, uint8_t dev, int shard,
                    const uint64_t *off, const uint64_t *shape, int whole,
                    hr_tx *tx, uint32_t *wire, char *msg, size_t msgcap) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  hr_part *p = new_part(s, tx);
  if (!p)
    return HR_ERR_NOMEM;
  p->t = hr_tensor_ref(t);
  p->transcoded = !c->native;
  uint64_t start = 0, len = 0;
  if (hr_tensor_on_device(t)) {
    /* Device memory leaves through staging chunks, as stored: a slab of
     * it, or all of it (transcoding would need the device's kernels). */
    if (!(c->native || c->relabel) ||
        !(whole || slab_of(d, c, off, shape, &start, &len))) {
      *wire = c->native ? HR_WIRE_INVALID_REGION : HR_WIRE_TRANSCODE_FAILED;
      hr__set_msg(msg, msgcap, "a device tensor is served as stored", 35);
      return 1;
    }
    p->desc = *d;
    if (!whole) {
      for (unsigned k = 0; k < d->rank; k++)
        p->desc.shape[k] = shape[k];
      p->desc.buffers[0].size_bytes = len;
    }
    if (c->relabel) {
      p->desc.layout.tag = HR_LAYOUT_PERMUTED;
      p->desc.layout.ext = NULL;
      p->desc.layout.ext_len = 0;
      memcpy(p->desc.params.order, c->params.order, sizeof c->params.order);
    }
    hr__part_device(p, t, whole, start, len);
  } else if ((c->native || c->relabel) &&
             (whole || slab_of(d, c, off, shape, &start, &len))) {
    p->desc = *d;
    if (whole) {
      for (unsigned k = 0; k < d->buffer_count; k++) {
        p->src[k] = hr_tensor_buffer(t, k);
        p->len[k] = d->buffers[k].size_bytes;
      }
    } else {
      for (unsigned k = 0; k < d->rank; k++)
        p->desc.shape[k] = shape[k];
      p->desc.buffers[0].size_bytes = len;
      p->src[0] = (const uint8_t *)hr_tensor_buffer(t, 0) + start;
      p->len[0] = len;
    }
    if (c->relabel) {
      p->desc.layout.tag = HR_LAYOUT_PERMUTED;
      p->desc.layout.ext = NULL;
      p->desc.layout.ext_len = 0;
      memcpy(p->desc.params.order, c->params.order, sizeof c->params.order);
    }
    p->hold = hr_tensor_ref(t);
  } else if (c->native && d->layout.tag == HR_LAYOUT_STRIDED) {
    if (strided_box(d, off, shape, &p->desc, &start, &len)) {
      *wire = HR_WIRE_INVALID_DESCRIPTOR;
      hr__set_msg(msg, msgcap, "stored STRIDED tensor out of its buffer", 39);
      return 1;
    }
    p->src[0] = (const uint8_t *)hr_tensor_buffer(t, 0) + start;
    p->len[0] = len;
    p->hold = hr_tensor_ref(t);
  } else {
#ifdef HR_HAVE_TRANSCODE
    hr_wire_status st = {0, 0, NULL};
    hr_xc_plan *plan = NULL;
    choice cc = *c;
    if (c->native) {
      cc.params = d->params;
      cc.mr = desc_mr(d);
    }
    int rv = make_plan(s, t, &cc, whole ? NULL : off, shape, &plan, &st);
    if (rv == HR_ERR_NOMEM)
      return rv;
    if (rv) {
      if (rv == HR_ERR_PROTO) {
        *wire = st.code;
        put_reason(msg, msgcap, st.reason);
      } else if (rv == HR_ERR_LIMIT) {
        *wire = HR_WIRE_RESOURCE_EXHAUSTED;
        hr__set_msg(msg, msgcap, "transcoding memory limit", 24);
      } else {
        *wire = c->native ? HR_WIRE_INVALID_REGION : HR_WIRE_TRANSCODE_FAILED;
        hr__set_msg(msg, msgcap, "this region cannot be produced", 30);
      }
      return 1;
    }
    hr_xjob *xj = hr__mem_calloc(&s->mem, 1, sizeof *xj);
    if (!xj) {
      hr_xc_plan_del(plan);
      return HR_ERR_NOMEM;
    }
    xj->refs = 1;
    xj->mem = s->mem;
    xj->plan = plan;
    xj->src = hr_tensor_ref(t);
    xj->out_size = hr_xc_plan_out_size(plan);
    xj->grain = hr_xc_plan_grain(plan);
    p->xj = xj;
    hr_xc_plan_describe(plan, &p->desc);
    if (hr_xc_plan_needs_whole(plan)) {
      rv = hr_tensor_alloc(&xj->whole, &p->desc, 6, &s->mem);
      if (rv) {
        *wire = HR_WIRE_RESOURCE_EXHAUSTED;
        hr__set_msg(msg, msgcap, "no memory for the transcoded tensor", 35);
        return 1;
      }
      p->xmode = HR_XM_WHOLE;
    } else {
      p->xmode = HR_XM_WINDOW;
    }
#else
    (void)s;
    *wire = c->native ? HR_WIRE_INVALID_REGION : HR_WIRE_TRANSCODE_FAILED;
    hr__set_msg(msg, msgcap, "this build has no transcoding kernels", 37);
    return 1;
#endif
  }
  finish_desc(req, d, &p->desc, dev, shard, off);
  hr__xport_for(&p->desc, &p->xp);
  hr_wire_status vs = {0, 0, NULL};
  if (hr_descriptor_validate(&p->desc, &p->xp, NULL, 0, &vs)) {
    *wire = HR_WIRE_INTERNAL;
    hr__set_msg(msg, msgcap, "the stored tensor has an invalid descriptor", 43);
    return 1;
  }
  return 0;
}

/* Composite: head, then every member pre-order, each member with its own
 * layout choice.  Never sharded (§ 18). */
static int composite_parts(hr_session *s, const hr_request *req, hr_tensor *t,
                           uint8_t dev, hr_tx *tx, int *xc, uint32_t *wire,
                           char *msg, size_t msgcap) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  if (d->layout.tag != HR_LAYOUT_COMPOSITE) {
    choice c;
    hr_wire_status st = {0, 0, NULL};
    int rv = select_layout(s, req, t, &c, &st);
    if (rv == HR_ERR_PROTO) {
      *wire = st.code;
      put_reason(msg, msgcap, st.reason);
      return 1;
    }
    if (rv)
      return rv;
    *xc |= !c.native;
    return box_part(s, req, t, &c, dev, 0, NULL, d->shape, 1, tx, wire, msg,
                    msgcap);
  }
  hr_part *p = new_part(s, tx);
  if (!p)
    return HR_ERR_NOMEM;
  p->t = hr_tensor_ref(t);
  hr__net_desc(d, &p->desc);
  p->desc.flags &= (uint8_t)~HR_DESC_HAS_SHARD;
  p->desc.params_raw = NULL;
  p->desc.params_len = 0;
  hr__xport_for(&p->desc, &p->xp);
  size_t n = hr_tensor_member_count(t);
  for (size_t i = 0; i < n; i++) {
    int rv = composite_parts(s, req, hr_tensor_member(t, i), dev, tx, xc, wire,
                             msg, msgcap);
    if (rv)
      return rv;
  }
  return 0;
}

/* Host memory, or device memory the engine can stage (a tensor made by
 * hr_tensor_wrap_device); a host tensor whose descriptor names a device
 * is not servable. */
static int tensor_on_cpu(hr_tensor *t) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  for (unsigned k = 0; k < d->buffer_count; k++)
    if (d->buffers[k].device_tag != HR_DEV_CPU && !hr_tensor_on_device(t))
      return 0;
  size_t n = hr_tensor_member_count(t);
  for (size_t i = 0; i < n; i++)
    if (!tensor_on_cpu(hr_tensor_member(t, i)))
      return 0;
  return 1;
}

void hr__answer_plan_free(hr_session *s, hr_answer_plan *plan) {
  if (plan->txs) {
    uint32_t n = plan->nshards ? plan->nshards : 1;
    for (uint32_t i = 0; i < n; i++)
      hr__tx_free(s, &plan->txs[i]);
    hr__mem_free(&s->mem, plan->txs);
  }
  memset(plan, 0, sizeof *plan);
}

int hr__select_answer(hr_session *s, const hr_request *req, hr_tensor *t,
                      unsigned lanes, hr_answer_plan *plan, uint32_t *wire,
                      char *msg, size_t msgcap) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  memset(plan, 0, sizeof *plan);
  *wire = 0;
  if (!tensor_on_cpu(t)) {
    *wire = HR_WIRE_DEVICE_UNAVAILABLE;
    hr__set_msg(msg, msgcap, "the tensor is not in host memory", 32);
    return 1;
  }
  if (select_device(s, req, t, &plan->device, plan->fallback,
                    sizeof plan->fallback, wire, msg, msgcap))
    return 1;
  int composite = d->layout.tag == HR_LAYOUT_COMPOSITE;
  int region = (req->flags & HR_REQ_REGION) != 0;
  int parallel = (req->flags & HR_REQ_PARALLEL_OK) != 0;
  if (region) {
    if (composite || req->region_rank != d->rank) {
      *wire = HR_WIRE_INVALID_REGION;
      hr__set_msg(msg, msgcap,
                  composite ? "REGION on a composite"
                            : "region rank differs from the tensor's",
                  composite ? 21 : 37);
      return 1;
    }
    for (unsigned k = 0; k < d->rank; k++) {
      uint64_t end;
      if (!hr__add_u64(req->region_offset[k], req->region_shape[k], &end) ||
          end > d->shape[k]) {
        *wire = HR_WIRE_INVALID_REGION;
        hr__set_msg(msg, msgcap, "region outside the tensor", 25);
        return 1;
      }
    }
  }
  plan->txs = hr__mem_calloc(&s->mem, 1, sizeof *plan->txs);
  if (!plan->txs)
    return HR_ERR_NOMEM;
  if (composite) {
    int xc = 0;
    int rv = composite_parts(s, req, t, plan->device, &plan->txs[0], &xc, wire,
                             msg, msgcap);
    plan->layout = HR_LAYOUT_COMPOSITE;
    plan->transcoded = xc;
    return rv;
  }
  choice c;
  hr_wire_status st = {0, 0, NULL};
  int rv = select_layout(s, req, t, &c, &st);
  if (rv == HR_ERR_PROTO) {
    *wire = st.code;
    put_reason(msg, msgcap, st.reason);
    return 1;
  }
  if (rv)
    return rv;
  plan->layout = c.tag;
  plan->transcoded = !c.native;
  uint64_t box_off[HR_MAX_RANK] = {0}, box_shape[HR_MAX_RANK];
  for (unsigned k = 0; k < d->rank; k++) {
    box_off[k] = region ? req->region_offset[k] : 0;
    box_shape[k] = region ? req->region_shape[k] : d->shape[k];
  }
  /* How many shards. */
  uint32_t n = 1;
  int shard = region || parallel;
  if (parallel && (s->our_caps & HR_CAP_PARALLEL_STREAMS) && d->rank &&
      is_dense(c.tag) && !is_int4(d->element_type)) {
    uint64_t elems = 1;
    for (unsigned k = 0; k < d->rank; k++)
      elems *= box_shape[k];
    uint64_t bytes = elems * elem_bytes(d->element_type);
    uint64_t sb = s->set.shard_bytes;
    uint64_t want = bytes / sb + (bytes % sb != 0);
    if (want > req->max_shards)
      want = req->max_shards;
    if (want > s->set.max_shards)
      want = s->set.max_shards;
    if (want > (uint64_t)lanes * s->set.shards_per_lane)
      want = (uint64_t)lanes * s->set.shards_per_lane;
    unsigned od = cut_dim(d, &c, box_shape);
    uint64_t unit = slab_unit(d, &c);
    uint64_t units = unit ? (box_shape[od] + unit - 1) / unit : 0;
    if (want > units)
      want = units;
    n = want ? (uint32_t)want : 1;
    if (n > 1) {
      hr_tx *txs = hr__mem_realloc(&s->mem, plan->txs, n * sizeof *txs);
      if (!txs)
        return HR_ERR_NOMEM;
      plan->txs = txs;
      plan->nshards = n;
      memset(txs + 1, 0, (n - 1) * sizeof *txs);
      for (uint32_t i = 0; i < n; i++) {
        uint64_t u0 = units * i / n, u1 = units * (i + 1) / n;
        uint64_t off[HR_MAX_RANK], shp[HR_MAX_RANK];
        memcpy(off, box_off, sizeof off);
        memcpy(shp, box_shape, sizeof shp);
        off[od] = box_off[od] + u0 * unit;
        uint64_t end = u1 * unit;
        if (end > box_shape[od])
          end = box_shape[od];
        shp[od] = end - u0 * unit;
        rv = box_part(s, req, t, &c, plan->device, 1, off, shp, 0, &txs[i],
                      wire, msg, msgcap);
        if (rv)
          return rv;
        txs[i].parts[0].xp.shard_index = (uint16_t)i;
        txs[i].parts[0].xp.total_shards = (uint16_t)n;
      }
      return 0;
    }
  }
  int whole = !region;
  rv = box_part(s, req, t, &c, plan->device, shard, box_off, box_shape, whole,
                &plan->txs[0], wire, msg, msgcap);
  if (rv)
    return rv;
  if (shard)
    plan->nshards = 0; /* one stream; HAS_SHARD already set */
  return 0;
}
