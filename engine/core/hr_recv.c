/*
 * The receiving side of a transfer: a client's GET answer or a server's
 * PUT.  hr_rx (proto/) checks every rule that spans messages; this module
 * decides where bytes land and builds the result:
 *
 *  - an unsharded answer lands in one tensor per plain tensor, allocated
 *    (or carved out of the application's buffer) when its descriptor
 *    arrives; composites are assembled from their members as they close;
 *  - a sharded answer with N > 1 shards lands in one box-sized tensor
 *    (the parent, or the requested region): each shard's bytes go straight
 *    to their final place.  Row-major, column-major and permuted shards
 *    map run by run (one run when the shard is a slab along the outermost
 *    stored dimension); TILED and PANEL shards must be slabs along whole
 *    tiles or panels.
 *
 * Shard boxes are bounds-checked against the box before any byte lands;
 * their exact tiling is hr_rx's check, at the end.
 */
#include <string.h>

#include "hr_session_int.h"

static unsigned elem_bytes(uint8_t e) {
  unsigned b = hr_elem_bits(e);
  return b >= 8 ? b / 8 : 1;
}

int hr__recv_init(hr_session *s, hr_recv *rv, const hr_rx_config *cfg) {
  memset(rv, 0, sizeof *rv);
  rv->base = cfg->base_stream;
  if (cfg->request_flags & HR_REQ_REGION) {
    rv->has_box = 1;
    for (unsigned k = 0; k < cfg->region_rank && k < HR_MAX_RANK; k++) {
      rv->box_offset[k] = cfg->region_offset[k];
      rv->box_shape[k] = cfg->region_shape[k];
    }
  }
  return hr_rx_new(&rv->rx, cfg, &s->mem);
}

static void node_free(hr_session *s, hr_rnode *n) {
  if (!n)
    return;
  for (uint32_t i = 0; i < n->nkids; i++)
    node_free(s, n->kids[i]);
  hr__mem_free(&s->mem, n->kids);
  hr_tensor_unref(n->t);
  hr__mem_free(&s->mem, n);
}

void hr__recv_free(hr_session *s, hr_recv *rv) {
  hr_rx_del(rv->rx);
  hr_tensor_unref(rv->shm_next);
  node_free(s, rv->root);
  hr_tensor_unref(rv->assembled);
  hr__mem_free(&s->mem, rv->shards);
  for (size_t i = 0; i < rv->ndone; i++)
    hr_tensor_unref(rv->done_list[i]);
  hr__mem_free(&s->mem, rv->done_list);
  hr__devrx_free(s, rv->dev);
  memset(rv, 0, sizeof *rv);
}

/* Creates the memory for descriptor `d`: carved out of the application's
 * buffer when there is one, else allocated. */
static int dest_tensor(hr_session *s, hr_recv *rv, const hr_descriptor *d,
                       hr_tensor **out);

/* An SHM descriptor's mapped tensor becomes the node's tensor; with an
 * application buffer its bytes are copied there and the segment released
 * at once. */
static int shm_tensor(hr_session *s, hr_recv *rv, const hr_descriptor *d,
                      hr_tensor **out) {
  hr_tensor *m = rv->shm_next;
  rv->shm_next = NULL;
  rv->bytes += hr_tensor_bytes(m);
  if (!rv->app) {
    *out = m;
    return 0;
  }
  int rc = dest_tensor(s, rv, d, out);
  if (rc == 0)
    for (unsigned k = 0; k < d->buffer_count; k++)
      if (d->buffers[k].size_bytes)
        memcpy(hr_tensor_buffer(*out, k), hr_tensor_buffer(m, k),
               (size_t)d->buffers[k].size_bytes);
  hr_tensor_unref(m);
  return rc;
}

static int dest_tensor(hr_session *s, hr_recv *rv, const hr_descriptor *d,
                       hr_tensor **out) {
  /* Imported device memory is already the device tensor (hr_shm_dev.c):
   * no staging ring, and it is delivered as is. */
  if (rv->shm_next && hr_tensor_on_device(rv->shm_next)) {
    hr__devrx_free(s, rv->dev);
    rv->dev = NULL;
    return shm_tensor(s, rv, d, out);
  }
  if (rv->dev)
    return hr__devrx_dest(s, rv, d, out);
  if (rv->shm_next)
    return shm_tensor(s, rv, d, out);
  if (!rv->app) {
    /* The size comes from the peer: failing to allocate it refuses the
     * transfer (RESOURCE_EXHAUSTED), it does not break the session. */
    if (s->role == HR_ROLE_SERVER) {
      int rc = hr__put_alloc(s, d, rv->min_align, out);
      if (rc != HR_ERR_NOT_FOUND)
        return rc ? HR_ERR_LIMIT : 0;
    }
    if (s->role == HR_ROLE_SERVER && s->cbs.alloc_tensor) {
      hr__cb_enter(s);
      int rc = s->cbs.alloc_tensor(s, d, rv->min_align, out, s->ud);
      hr__cb_leave(s);
      return rc || !*out ? HR_ERR_LIMIT : 0;
    }
    return hr_tensor_alloc(out, d, rv->min_align, &s->mem) ? HR_ERR_LIMIT : 0;
  }
  uint64_t off[HR_MAX_BUFFERS], span, align;
  if (hr__tensor_placement(d, rv->min_align, off, &span, &align))
    return HR_ERR_LIMIT;
  uintptr_t base = (uintptr_t)rv->app + rv->app_used;
  uintptr_t aligned = (base + (uintptr_t)align - 1) & ~((uintptr_t)align - 1);
  uint64_t start = rv->app_used + (aligned - base);
  uint64_t end;
  if (!hr__add_u64(start, span, &end) || end > rv->app_cap)
    return HR_ERR_LIMIT;
  void *bufs[HR_MAX_BUFFERS];
  for (unsigned k = 0; k < d->buffer_count; k++)
    bufs[k] = (void *)(aligned + (uintptr_t)off[k]);
  int rc = hr_tensor_wrap(out, d, bufs, NULL, NULL, &s->mem);
  if (rc == 0)
    rv->app_used = end;
  return rc == HR_ERR_NOMEM ? rc : (rc ? HR_ERR_LIMIT : 0);
}

static int kid_add(hr_session *s, hr_rnode *p, hr_rnode *k) {
  hr_rnode **nk =
      hr__mem_realloc(&s->mem, p->kids, (p->nkids + 1) * sizeof *nk);
  if (!nk)
    return HR_ERR_NOMEM;
  p->kids = nk;
  p->kids[p->nkids++] = k;
  k->parent = p;
  return 0;
}

static int begin_node(hr_session *s, hr_recv *rv, const hr_descriptor *d) {
  hr_rnode *n = hr__mem_calloc(&s->mem, 1, sizeof *n);
  if (!n)
    return HR_ERR_NOMEM;
  n->desc = *d;
  /* The message's bytes go away after this call: the tensor keeps deep
   * copies; the head's parsed params are all a composite needs. */
  n->desc.params_raw = NULL;
  n->desc.params_len = 0;
  int rc = 0;
  if (d->layout.tag == HR_LAYOUT_COMPOSITE) {
    n->desc.layout.ext = NULL;
    n->desc.layout.ext_len = 0;
    n->want = d->params.member_count;
  } else {
    rc = dest_tensor(s, rv, d, &n->t);
  }
  if (rc == 0 && rv->top)
    rc = kid_add(s, rv->top, n);
  if (rc) {
    node_free(s, n);
    return rc;
  }
  if (!rv->root)
    rv->root = n;
  if (d->layout.tag == HR_LAYOUT_COMPOSITE) {
    rv->top = n;
    rv->cur = NULL;
  } else {
    rv->cur = n;
  }
  return 0;
}

/* A plain node completed: close every composite it completes. */
static int close_up(hr_session *s, hr_recv *rv, hr_rnode *n,
                    hr_wire_status *ws) {
  n->complete = 1;
  hr_tensor **nd =
      hr__mem_realloc(&s->mem, rv->done_list, (rv->ndone + 1) * sizeof *nd);
  if (!nd)
    return HR_ERR_NOMEM;
  rv->done_list = nd;
  rv->done_list[rv->ndone++] = hr_tensor_ref(n->t);
  for (hr_rnode *p = n->parent; p; p = p->parent) {
    if (p->nkids < p->want || !p->kids[p->nkids - 1]->complete)
      break;
    hr_tensor *m[1];
    hr_tensor **members =
        p->nkids ? hr__mem_malloc(&s->mem, p->nkids * sizeof *m) : m;
    if (!members)
      return HR_ERR_NOMEM;
    for (uint32_t i = 0; i < p->nkids; i++)
      members[i] = p->kids[i]->t;
    int rc = hr_tensor_new_composite(&p->t, &p->desc, members, p->nkids,
                                     &s->mem, ws);
    if (members != m)
      hr__mem_free(&s->mem, members);
    if (rc == HR_ERR_INVALID_ARGUMENT)
      rc = hr__wire_fail(ws, HR_WIRE_COMPOSITE_INVALID, 0,
                         "composite: members do not match the head");
    if (rc)
      return rc;
    p->complete = 1;
    rv->top = p->parent;
  }
  if (rv->root && rv->root->complete)
    rv->complete = 1;
  return 0;
}

/* ---- sharded answers ----------------------------------------------------- */

static int perm_of(const hr_descriptor *d, unsigned *perm) {
  unsigned r = d->rank;
  switch (d->layout.tag) {
  case HR_LAYOUT_ROW_MAJOR:
  case HR_LAYOUT_TILED:
  case HR_LAYOUT_PANEL:
    for (unsigned k = 0; k < r; k++)
      perm[k] = k;
    return 0;
  case HR_LAYOUT_COLUMN_MAJOR:
    for (unsigned k = 0; k < r; k++)
      perm[k] = r - 1 - k;
    return 0;
  case HR_LAYOUT_PERMUTED:
    for (unsigned k = 0; k < r; k++)
      perm[k] = d->params.order[k];
    return 0;
  default:
    return HR_ERR_UNSUPPORTED;
  }
}

static uint32_t panel_mr(const hr_descriptor *d) {
  if (d->params.mr)
    return d->params.mr;
  if (d->layout.ext && d->layout.ext_len == 4)
    return (uint32_t)d->layout.ext[0] | (uint32_t)d->layout.ext[1] << 8 |
           (uint32_t)d->layout.ext[2] << 16 | (uint32_t)d->layout.ext[3] << 24;
  return 0;
}

/* Rows (along dim 0) of one slab unit: a tile row or a panel. */
static uint64_t slab_unit(const hr_descriptor *d) {
  if (d->layout.tag == HR_LAYOUT_TILED)
    return d->params.tile[0];
  if (d->layout.tag == HR_LAYOUT_PANEL)
    return panel_mr(d);
  return 1;
}

static int shards_setup(hr_session *s, hr_recv *rv, const hr_descriptor *d,
                        uint32_t n, hr_wire_status *ws) {
  hr_descriptor *a = &rv->adesc;
  if (d->rank == 0)
    return hr__wire_fail(ws, HR_WIRE_SHARD_INCONSISTENT, 0,
                         "shards: a scalar cannot be sharded");
  if (!rv->has_box)
    for (unsigned k = 0; k < d->rank; k++)
      rv->box_shape[k] = d->parent_shape[k];
  *a = *d;
  a->params_raw = NULL;
  a->params_len = 0;
  for (unsigned k = 0; k < d->rank; k++)
    a->shape[k] = rv->box_shape[k];
  int region = 0;
  for (unsigned k = 0; k < d->rank; k++)
    region |= rv->box_offset[k] != 0 || rv->box_shape[k] != d->parent_shape[k];
  if (region) {
    for (unsigned k = 0; k < d->rank; k++)
      a->shard_offset[k] = rv->box_offset[k];
  } else {
    a->flags &= (uint8_t)~HR_DESC_HAS_SHARD;
    memset(a->parent_shape, 0, sizeof a->parent_shape);
    memset(a->shard_offset, 0, sizeof a->shard_offset);
  }
  if (perm_of(d, rv->aperm))
    return HR_ERR_UNSUPPORTED;
  uint64_t sizes[HR_MAX_BUFFERS];
  hr_wire_status tmp;
  if (hr_descriptor_buffer_sizes(a, sizes, &tmp) != 1)
    return HR_ERR_UNSUPPORTED;
  a->buffers[0].size_bytes = sizes[0];
  rv->aslab = d->layout.tag == HR_LAYOUT_TILED ||
              d->layout.tag == HR_LAYOUT_PANEL ||
              hr_elem_bits(d->element_type) < 8;
  uint64_t st = 1;
  for (unsigned k = d->rank; k-- > 0;) {
    rv->astride[k] = st;
    st *= rv->box_shape[rv->aperm[k]];
  }
  rv->shards = hr__mem_calloc(&s->mem, n, sizeof *rv->shards);
  if (!rv->shards)
    return HR_ERR_NOMEM;
  rv->nshards = n;
  int rc = dest_tensor(s, rv, a, &rv->assembled);
  return rc;
}

static int same_family(const hr_descriptor *a, const hr_descriptor *d) {
  if (a->element_type != d->element_type || a->rank != d->rank ||
      a->layout.tag != d->layout.tag)
    return 0;
  if (d->layout.tag == HR_LAYOUT_PERMUTED)
    return memcmp(a->params.order, d->params.order, d->rank) == 0;
  if (d->layout.tag == HR_LAYOUT_TILED)
    return memcmp(a->params.tile, d->params.tile,
                  d->rank * sizeof d->params.tile[0]) == 0;
  if (d->layout.tag == HR_LAYOUT_PANEL)
    return panel_mr(a) == panel_mr(d);
  return 1;
}

static int begin_shard(hr_session *s, hr_recv *rv, const hr_descriptor *d,
                       const hr_transport_fields *xp, uint32_t sid,
                       hr_wire_status *ws) {
  if (!rv->shards) {
    int rc = shards_setup(s, rv, d, xp->total_shards, ws);
    if (rc)
      return rc;
  }
  uint32_t i = sid - rv->base;
  if (i >= rv->nshards || xp->total_shards != rv->nshards ||
      rv->shards[i].began)
    return hr__wire_fail(ws, HR_WIRE_SHARD_INCONSISTENT, 0,
                         "shards: index, count or stream disagree");
  if (!same_family(&rv->adesc, d))
    return hr__wire_fail(ws, HR_WIRE_SHARD_INCONSISTENT, 0,
                         "shards: element type or layout differs");
  hr_rshard *sh = &rv->shards[i];
  for (unsigned k = 0; k < d->rank; k++) {
    uint64_t end;
    if (d->shard_offset[k] < rv->box_offset[k] ||
        !hr__add_u64(d->shard_offset[k], d->shape[k], &end) ||
        end > rv->box_offset[k] + rv->box_shape[k])
      return hr__wire_fail(ws, HR_WIRE_SHARD_INCONSISTENT, 0,
                           "shard outside the requested box");
    sh->offset[k] = d->shard_offset[k] - rv->box_offset[k];
    sh->shape[k] = d->shape[k];
  }
  if (rv->aslab) {
    /* Slabs along dim 0, on whole tile rows / panels, full elsewhere. */
    uint64_t unit = slab_unit(d);
    for (unsigned k = 1; k < d->rank; k++)
      if (sh->offset[k] || sh->shape[k] != rv->box_shape[k])
        return HR_ERR_UNSUPPORTED;
    if (!unit || sh->offset[0] % unit ||
        (sh->shape[0] % unit &&
         sh->offset[0] + sh->shape[0] != rv->box_shape[0]))
      return HR_ERR_UNSUPPORTED;
    if (hr_elem_bits(d->element_type) < 8) {
      uint64_t inner = 1;
      for (unsigned k = 1; k < d->rank; k++)
        inner *= rv->box_shape[k];
      if ((sh->offset[0] * inner) % 2)
        return HR_ERR_UNSUPPORTED;
    }
  }
  sh->began = 1;
  rv->sharded = 1;
  return 0;
}

/* Byte offset in the assembled buffer where shard i's slab starts. */
static uint64_t slab_start(const hr_recv *rv, const hr_rshard *sh) {
  const hr_descriptor *a = &rv->adesc;
  if (hr_elem_bits(a->element_type) < 8) {
    uint64_t inner = 1;
    for (unsigned k = 1; k < a->rank; k++)
      inner *= rv->box_shape[k];
    return sh->offset[0] * inner / 2;
  }
  uint64_t unit = slab_unit(a);
  uint64_t rows_bytes = a->buffers[0].size_bytes;
  uint64_t units = (rv->box_shape[0] + unit - 1) / unit;
  /* Every unit (tile row, panel, row) has the same byte size. */
  return units ? sh->offset[0] / unit * (rows_bytes / units) : 0;
}

static uint8_t *shard_where(hr_recv *rv, uint32_t i, uint64_t off,
                            uint64_t *run) {
  hr_rshard *sh = &rv->shards[i];
  uint8_t *base = hr_tensor_buffer(rv->assembled, 0);
  const hr_descriptor *a = &rv->adesc;
  if (rv->aslab) {
    *run = UINT64_MAX;
    return base + slab_start(rv, sh) + off;
  }
  unsigned r = a->rank, esz = elem_bytes(a->element_type);
  uint64_t e = off / esz, within = off % esz;
  uint64_t c[HR_MAX_RANK];
  for (unsigned k = r; k-- > 0;) {
    uint64_t ext = sh->shape[rv->aperm[k]];
    c[k] = ext ? e % ext : 0;
    e = ext ? e / ext : 0;
  }
  uint64_t pidx = 0;
  for (unsigned k = 0; k < r; k++)
    pidx += (sh->offset[rv->aperm[k]] + c[k]) * rv->astride[k];
  /* Contiguous in both: the innermost dims the shard spans fully, then
   * the rest of the first dim it does not. */
  unsigned j = r;
  uint64_t inner = 1, lin = 0;
  while (j-- > 0) {
    unsigned dim = rv->aperm[j];
    if (sh->shape[dim] != rv->box_shape[dim] || j == 0)
      break;
    lin += c[j] * inner;
    inner *= sh->shape[dim];
  }
  uint64_t elems = (sh->shape[rv->aperm[j]] - c[j]) * inner - lin;
  *run = elems * esz - within;
  return base + pidx * esz + within;
}

uint8_t *hr__recv_where(hr_recv *rv, uint32_t sid, uint8_t bi, uint64_t off,
                        uint64_t *run) {
  if (rv->dev)
    return hr__devrx_where(rv, bi, off, run);
  if (rv->assembled && rv->shards) {
    uint32_t i = sid - rv->base;
    if (i >= rv->nshards || !rv->shards[i].began || bi != 0)
      return NULL;
    return shard_where(rv, i, off, run);
  }
  hr_rnode *n = rv->cur;
  if (!n || !n->t)
    return NULL;
  const hr_descriptor *d = hr_tensor_descriptor(n->t);
  if (bi >= d->buffer_count || off > d->buffers[bi].size_bytes)
    return NULL;
  *run = d->buffers[bi].size_bytes - off;
  return (uint8_t *)hr_tensor_buffer(n->t, bi) + off;
}

int hr__recv_msg(hr_session *s, hr_stream *st, hr_recv *rv, const hr_msg *m,
                 hr_wire_status *ws) {
  hr_rx_event ev;
  memset(&ev, 0, sizeof ev);
  int rc = hr_rx_on_message(rv->rx, m, &ev, ws);
  if (rc)
    return rc;
  switch (m->hdr.type) {
  case HR_MSG_TENSOR_DESCRIPTOR:
  case HR_MSG_TENSOR_PUT: {
    const hr_descriptor *d =
        m->hdr.type == HR_MSG_TENSOR_PUT ? &m->u.put.desc : &m->u.tensor.desc;
    const hr_transport_fields *xp =
        m->hdr.type == HR_MSG_TENSOR_PUT ? &m->u.put.xport : &m->u.tensor.xport;
    if (xp->data_plane == HR_PLANE_SHM) {
      /* The bytes are in the segment that came with the message. */
      rc = hr__shm_cli_map(s, st, d, xp, &rv->shm_next, ws);
      if (rc)
        return rc;
      if (!rv->shm_next && d->layout.tag != HR_LAYOUT_COMPOSITE)
        return HR_ERR_INTERNAL;
    }
    if (rv->dev)
      hr__devrx_plane(rv, xp->data_plane);
    if ((d->flags & HR_DESC_HAS_SHARD) && xp->total_shards > 1)
      rc = begin_shard(s, rv, d, xp, m->hdr.stream_id, ws);
    else
      rc = begin_node(s, rv, d);
    if (rv->shm_next) {
      /* Not taken (a failure on the way): release it. */
      hr_tensor_unref(rv->shm_next);
      rv->shm_next = NULL;
    }
    /* The RDMA data plane fills the landing memory (hr_rdma_glue.c). */
    if (rc == 0 && xp->data_plane == HR_PLANE_RDMA)
      return hr__rdma_rx_begin(s, st, m->hdr.stream_id, d, xp);
    break;
  }
  case HR_MSG_TENSOR_DATA_END:
    if (rv->shards) {
      uint32_t i = m->hdr.stream_id - rv->base;
      if (i < rv->nshards && rv->shards[i].began && !rv->shards[i].ended) {
        rv->shards[i].ended = 1;
        rv->shards_ended++;
      }
    } else if (rv->cur) {
      hr_rnode *n = rv->cur;
      rv->cur = NULL;
      rc = close_up(s, rv, n, ws);
    }
    break;
  default:
    break;
  }
  if (rc)
    return rc;
  if (hr_rx_done(rv->rx)) {
    if (rv->shards && rv->shards_ended == rv->nshards)
      rv->complete = 1;
    if (!rv->shards && rv->root && rv->root->complete)
      rv->complete = 1;
    if (!rv->complete)
      return hr__wire_fail(ws, HR_WIRE_PROTOCOL_VIOLATION, 0,
                           "transfer ended before every tensor completed");
  }
  return 0;
}

hr_tensor *hr__recv_take(hr_recv *rv) {
  hr_tensor *t = NULL;
  if (rv->shards) {
    t = rv->assembled;
    rv->assembled = NULL;
  } else if (rv->root) {
    t = rv->root->t;
    rv->root->t = NULL;
  }
  return t;
}
