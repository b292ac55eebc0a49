/*
 * The SHM data plane (wire-v1 § 14) in the sans-IO session.
 *
 * The session never touches a descriptor itself: it passes integers.
 *  - Server: a tensor with a segment (hr_tensor_set_segment) is answered
 *    with data_plane = SHM, byte_offset = where buffer 0 lies in the
 *    segment, and the segment's fd attached to the TENSOR_DESCRIPTOR's
 *    first byte (hr_session_pull_fd); TENSOR_DATA_END follows with no
 *    frames.  A lease keeps the tensor (so the segment and its bytes)
 *    until the client's BUFFER_RELEASE on that stream, an ERROR on it (the
 *    client could not map: SHM is off for the rest of the connection), or
 *    the session's end.
 *  - Client: descriptors handed in by hr_session_recv_fds() wait with the
 *    input range they arrived with.  An SHM descriptor claims the one whose
 *    range holds the message's first byte; one that no message claims is
 *    a violation.  The host maps the segment (callbacks.shm_map) and the
 *    session wraps the mapping as the GET's tensor; when the application
 *    drops it (any thread) the mapping goes and the stream's lease is
 *    marked released, and the next pull queues BUFFER_RELEASE.
 */
#include <stdatomic.h>
#include <string.h>

#include "hr_session_int.h"

/* Descriptors waiting to be claimed (one per recvmsg; more are
 * refused as a flood). */
#define HR_PFD_MAX 8

struct hr_pfd {
  int fd;
  uint64_t lo, hi; /* input range it arrived with */
};

/* Server: the leases are an array sorted by stream id (s->sleases, of
 * s->nsleases entries), so that the lookup every BUFFER_RELEASE or
 * stream ERROR makes, whatever its stream, costs a binary search: a
 * client chooses those messages freely.  An ended lease keeps its place
 * with t NULL until the array is compacted. */
struct hr_slease {
  uint32_t stream_id;
  hr_tensor *t; /* reference; NULL: ended */
};

/* Client: one GET stream's mapped segments.  Shared by the session and
 * the mappings' tensors (which may die on any thread, after the session). */
struct hr_clease {
  struct hr_clease *next; /* the session's list (driving thread) */
  atomic_int refs;        /* the session's + one per live mapping */
  atomic_int live;        /* mappings not yet released */
  atomic_int released;    /* live dropped to 0 */
  uint32_t stream_id;
  hr_mem mem;
};

/* The release context of one mapped tensor. */
typedef struct shm_map_ctx {
  struct hr_clease *lease;
  hr_shm_mapping map;
  hr_mem mem;
} shm_map_ctx;

static void clease_unref(struct hr_clease *l) {
  if (atomic_fetch_sub_explicit(&l->refs, 1, memory_order_acq_rel) == 1) {
    hr_mem mem = l->mem;
    hr__mem_free(&mem, l);
  }
}

/* ---- server ------------------------------------------------------------ */

int hr__shm_serves(const hr_session *s, const hr_tensor *t) {
  return s->shm_ok && !s->shm_off &&
         (hr_tensor_segment(t, NULL, NULL) || hr__shm_dev_serves(t));
}

/* The part sends its tensor whole and as stored: the SHM plane can carry
 * it by handing over the tensor's own segment. */
static int part_whole_native(const hr_part *p) {
  if (p->xmode != HR_XM_DIRECT || p->transcoded || !p->t || !p->hold ||
      p->hold != p->t)
    return 0;
  const hr_descriptor *d = hr_tensor_descriptor(p->t);
  if (d->layout.tag == HR_LAYOUT_COMPOSITE ||
      p->desc.buffer_count != d->buffer_count || p->desc.rank != d->rank)
    return 0;
  for (unsigned k = 0; k < d->rank; k++)
    if (p->desc.shape[k] != d->shape[k] ||
        ((p->desc.flags & HR_DESC_HAS_SHARD) && p->desc.shard_offset[k]))
      return 0;
  for (unsigned k = 0; k < d->buffer_count; k++)
    if (p->src[k] != hr_tensor_buffer(p->t, k) ||
        p->len[k] != d->buffers[k].size_bytes)
      return 0;
  return 1;
}

#define STR_(x) #x
#define STR(x) STR_(x)

void hr__shm_plan(hr_session *s, hr_tx *tx, char *why, size_t why_len) {
  if (!s->shm_ok)
    return;
  const char *miss = NULL;
  size_t leases = s->sleases_live;
  for (size_t i = 0; i < tx->nparts; i++) {
    hr_part *p = &tx->parts[i];
    if (p->desc.layout.tag == HR_LAYOUT_COMPOSITE)
      continue; /* a head has no bytes: it goes as frames (none) */
    int fd;
    uint64_t off;
    if (s->shm_off) {
      miss = "shm: off on this connection since the client could not map";
    } else if (leases >= HR_SHM_LEASES_MAX) {
      /* Answers planned and not yet sent may pass the bound by the
       * leases they will take; the client must release some first. */
      miss = "shm: " STR(HR_SHM_LEASES_MAX) " segments leased on this "
             "connection and not released";
    } else if (hr_tensor_on_device(p->t)) {
      /* Exported device memory (hr_shm_dev.c). */
      (void)hr__shm_dev_plan(s, p, &miss);
    } else if (!hr_tensor_segment(p->t, &fd, &off)) {
      miss = "shm: the tensor is not in a shared segment";
    } else if (!part_whole_native(p)) {
      miss = "shm: a region, shard or transcoded answer goes as frames";
    } else {
      p->shm = 1;
      p->shm_fd = fd;
      p->desc.byte_offset = off;
      p->xp.data_plane = HR_PLANE_SHM;
    }
    /* Each part sent over SHM takes a lease. */
    if (p->shm)
      leases++;
  }
  if (miss && why && !why[0])
    hr__set_msg(why, why_len, miss, strlen(miss));
}

/* The first lease of stream `sid` or above. */
static size_t lease_lower(const hr_session *s, uint32_t sid) {
  size_t lo = 0, hi = s->nsleases;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->sleases[mid].stream_id < sid)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Drops the ended leases' places. */
static void lease_compact(hr_session *s) {
  size_t n = 0;
  for (size_t i = 0; i < s->nsleases; i++)
    if (s->sleases[i].t)
      s->sleases[n++] = s->sleases[i];
  s->nsleases = n;
}

int hr__shm_lease_add(hr_session *s, uint32_t sid, hr_tensor *t) {
  if (s->nsleases == s->sleases_cap && s->sleases_live < s->nsleases / 2) {
    lease_compact(s);
  } else if (s->nsleases == s->sleases_cap) {
    size_t cap = s->sleases_cap ? 2 * s->sleases_cap : 16;
    struct hr_slease *a =
        hr__mem_realloc(&s->mem, s->sleases, cap * sizeof *a);
    if (!a)
      return HR_ERR_NOMEM;
    s->sleases = a;
    s->sleases_cap = cap;
  }
  /* Stream ids grow, so this is mostly an append; an answer given late
   * goes before those given since. */
  size_t i = s->nsleases;
  if (i > 0 && s->sleases[i - 1].stream_id > sid) {
    i = lease_lower(s, sid + 1);
    memmove(&s->sleases[i + 1], &s->sleases[i],
            (s->nsleases - i) * sizeof s->sleases[0]);
  }
  s->sleases[i].stream_id = sid;
  s->sleases[i].t = hr_tensor_ref(t);
  s->nsleases++;
  s->sleases_live++;
  return 0;
}

void hr__shm_lease_drop(hr_session *s, uint32_t sid, int failed) {
  int found = 0;
  /* A composite's members are leased under their one stream id. */
  for (size_t i = lease_lower(s, sid);
       i < s->nsleases && s->sleases[i].stream_id == sid; i++) {
    if (!s->sleases[i].t)
      continue;
    hr_tensor_unref(s->sleases[i].t);
    s->sleases[i].t = NULL;
    s->sleases_live--;
    found = 1;
  }
  if (!found)
    return;
  if (s->sleases_live == 0)
    s->nsleases = 0;
  /* The client answered our segment with ERROR: it cannot map what we
   * send, so the rest of the connection goes as frames (§ 14). */
  if (failed)
    s->shm_off = 1;
}

/* ---- received descriptors ------------------------------------------------ */

static void fd_close(hr_session *s, int fd) {
  if (s->cbs.fd_close) {
    hr__cb_enter(s);
    s->cbs.fd_close(s, fd, s->ud);
    hr__cb_leave(s);
  }
}

static void pfd_drop(hr_session *s, size_t i) {
  fd_close(s, s->pfds[i].fd);
  memmove(&s->pfds[i], &s->pfds[i + 1],
          (s->npfds - i - 1) * sizeof s->pfds[0]);
  s->npfds--;
}

int hr_session_recv_fds(hr_session *s, const int *fds, size_t n, size_t len,
                        hr_tstamp now) {
  if (!s || (n && !fds))
    return HR_ERR_INVALID_ARGUMENT;
  if (s->in_cb) {
    /* Still ours to close: nobody else will. */
    for (size_t i = 0; i < n; i++)
      fd_close(s, fds[i]);
    return HR_ERR_IN_CALLBACK;
  }
  if (n == 0)
    return 0;
  hr__api_enter(s);
  if (now != HR_TSTAMP_NEVER && now > s->now)
    s->now = now;
  const char *bad = NULL;
  if (s->role != HR_ROLE_CLIENT)
    bad = "a file descriptor sent to the server";
  else if (!s->shm_ok)
    bad = "a file descriptor without SHM_DATA_PLANE negotiated";
  else if (n > 1)
    bad = "several file descriptors with one message";
  else if (len == 0)
    bad = "a file descriptor without bytes";
  else if (s->npfds >= HR_PFD_MAX)
    bad = "file descriptors nobody claims";
  if (bad || s->state == HR_CS_CLOSED || s->fatal) {
    for (size_t i = 0; i < n; i++)
      fd_close(s, fds[i]);
    int rv = 0;
    if (bad && s->state != HR_CS_CLOSED && !s->fatal)
      rv = hr__conn_error(s, HR_WIRE_PROTOCOL_VIOLATION, bad);
    hr__api_leave(s);
    return rv < 0 && hr_err_is_fatal(rv) ? rv : 0;
  }
  if (!s->pfds) {
    s->pfds = hr__mem_calloc(&s->mem, HR_PFD_MAX, sizeof *s->pfds);
    if (!s->pfds) {
      fd_close(s, fds[0]);
      hr__api_leave(s);
      return hr__fatal(s, HR_ERR_NOMEM);
    }
  }
  struct hr_pfd *p = &s->pfds[s->npfds++];
  p->fd = fds[0];
  p->lo = s->rx_total;
  p->hi = s->rx_total + len;
  hr__api_leave(s);
  return 0;
}

int hr__shm_check_fds(hr_session *s, uint64_t start) {
  /* Descriptors arrive in input order: only the oldest can be stale. */
  if (s->npfds == 0 || start < s->pfds[0].hi)
    return 0;
  while (s->npfds)
    pfd_drop(s, 0);
  return hr__conn_error(s, HR_WIRE_PROTOCOL_VIOLATION,
                        "a file descriptor with a message that carries none");
}

/* The descriptor that came with the message starting at `start`. */
static int take_fd(hr_session *s, uint64_t start, int *fd) {
  for (size_t i = 0; i < s->npfds; i++) {
    if (start >= s->pfds[i].lo && start < s->pfds[i].hi) {
      *fd = s->pfds[i].fd;
      memmove(&s->pfds[i], &s->pfds[i + 1],
              (s->npfds - i - 1) * sizeof s->pfds[0]);
      s->npfds--;
      return 1;
    }
  }
  return 0;
}

void hr__shm_drop_fd(hr_session *s, uint64_t start) {
  int fd;
  if (take_fd(s, start, &fd))
    fd_close(s, fd);
}

/* ---- client ------------------------------------------------------------ */

static void map_release(void *ctx) {
  shm_map_ctx *c = ctx;
  struct hr_clease *l = c->lease;
  /* Released first, then unmapped: the host's unmap also wakes its loop,
   * which must then find the flag set. */
  if (atomic_fetch_sub_explicit(&l->live, 1, memory_order_acq_rel) == 1)
    atomic_store_explicit(&l->released, 1, memory_order_release);
  if (c->map.unmap)
    c->map.unmap(c->map.ctx);
  clease_unref(l);
  hr_mem mem = c->mem;
  hr__mem_free(&mem, c);
}

static struct hr_clease *clease_for(hr_session *s, uint32_t sid);

struct hr_clease *hr__shm_clease_hold(hr_session *s, uint32_t sid) {
  struct hr_clease *l = clease_for(s, sid);
  if (l) {
    atomic_fetch_add_explicit(&l->live, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
  }
  return l;
}

void hr__shm_clease_let_go(struct hr_clease *l) {
  if (atomic_fetch_sub_explicit(&l->live, 1, memory_order_acq_rel) == 1)
    atomic_store_explicit(&l->released, 1, memory_order_release);
  clease_unref(l);
}

static struct hr_clease *clease_for(hr_session *s, uint32_t sid) {
  for (struct hr_clease *l = s->cleases; l; l = l->next)
    if (l->stream_id == sid &&
        !atomic_load_explicit(&l->released, memory_order_acquire))
      return l;
  struct hr_clease *l = hr__mem_calloc(&s->mem, 1, sizeof *l);
  if (!l)
    return NULL;
  l->mem = s->mem;
  l->stream_id = sid;
  atomic_init(&l->refs, 1);
  atomic_init(&l->live, 0);
  atomic_init(&l->released, 0);
  l->next = s->cleases;
  s->cleases = l;
  return l;
}

static int map_fail(hr_session *s, hr_stream *st, hr_wire_status *ws,
                    uint32_t code, const char *why) {
  if (code == HR_WIRE_DEVICE_UNAVAILABLE)
    hr__set_msg(st->rec.fallback, sizeof st->rec.fallback, why, strlen(why));
  (void)s;
  return hr__wire_fail(ws, code, 0, why);
}

int hr__shm_cli_map(hr_session *s, hr_stream *st, const hr_descriptor *d,
                    const hr_transport_fields *xp, hr_tensor **out,
                    hr_wire_status *ws) {
  *out = NULL;
  int fd;
  if (!s->shm_ok || s->role != HR_ROLE_CLIENT)
    return map_fail(s, st, ws, HR_WIRE_PROTOCOL_VIOLATION,
                    "data_plane SHM without SHM_DATA_PLANE negotiated");
  if (!take_fd(s, s->msg_start, &fd))
    return map_fail(s, st, ws, HR_WIRE_PROTOCOL_VIOLATION,
                    "data_plane SHM without a file descriptor");
  if (xp->total_shards > 1) {
    /* One segment per shard would have to be placed into one box: a
     * libhurray server never does it, and this client declines it. */
    fd_close(s, fd);
    return map_fail(s, st, ws, HR_WIRE_DEVICE_UNAVAILABLE,
                    "shm: one of several shards over SHM is not accepted");
  }
  st->rec.data_plane = HR_PLANE_SHM;
  if (d->layout.tag == HR_LAYOUT_COMPOSITE) {
    /* A head has no bytes: nothing to map. */
    fd_close(s, fd);
    return 0;
  }
  if (d->buffer_count && d->buffers[0].device_tag != HR_DEV_CPU) {
    /* Device memory exported for IPC (hr_shm_dev.c). */
    int rc = hr__shm_dev_import(s, st, d, fd, out, ws);
    fd_close(s, fd);
    return rc;
  }
  /* § 7.1: buffer 0 at byte_offset, buffer k at the first multiple of its
   * alignment after buffer k-1.  Overflow here is the peer's. */
  uint64_t off[HR_MAX_BUFFERS], pos = d->byte_offset, align = 1;
  for (unsigned k = 0; k < d->buffer_count; k++) {
    uint64_t a = (uint64_t)1 << d->buffers[k].alignment_log2;
    if (a > align)
      align = a;
    if (!hr__add_u64(pos, a - 1, &pos) ||
        (k == 0 && (d->byte_offset % a) != 0)) {
      fd_close(s, fd);
      return map_fail(s, st, ws, HR_WIRE_INVALID_DESCRIPTOR,
                      "SHM byte_offset not aligned for buffer 0");
    }
    pos &= ~(a - 1);
    off[k] = pos;
    if (!hr__add_u64(pos, d->buffers[k].size_bytes, &pos)) {
      fd_close(s, fd);
      return map_fail(s, st, ws, HR_WIRE_INVALID_DESCRIPTOR,
                      "SHM buffers overflow the segment offsets");
    }
  }
  uint64_t span = pos - d->byte_offset;
  char why[160] = "";
  hr_shm_mapping map;
  memset(&map, 0, sizeof map);
  int rc = 1;
  if (s->cbs.shm_map) {
    hr__cb_enter(s);
    rc = s->cbs.shm_map(s, fd, d->byte_offset, span, align, &map, why,
                        sizeof why, s->ud);
    hr__cb_leave(s);
  }
  fd_close(s, fd);
  if (rc != 0 || (!map.base && span)) {
    if (rc == 0 && map.unmap)
      map.unmap(map.ctx);
    if (!why[0])
      hr__set_msg(why, sizeof why, "cannot map the segment", 22);
    /* The server learns from this ERROR and answers with frames next.
     * The text outlives this call: the stream's record keeps it. */
    hr__set_msg(st->shm_why, sizeof st->shm_why, "shm: ", 5);
    size_t n = strlen(st->shm_why);
    hr__set_msg(st->shm_why + n, sizeof st->shm_why - n, why, strlen(why));
    return map_fail(s, st, ws, HR_WIRE_DEVICE_UNAVAILABLE, st->shm_why);
  }
  struct hr_clease *l = clease_for(s, st->id);
  shm_map_ctx *c = l ? hr__mem_calloc(&s->mem, 1, sizeof *c) : NULL;
  if (!c) {
    if (map.unmap)
      map.unmap(map.ctx);
    return HR_ERR_NOMEM;
  }
  c->lease = l;
  c->map = map;
  c->mem = s->mem;
  void *bufs[HR_MAX_BUFFERS];
  for (unsigned k = 0; k < d->buffer_count; k++)
    bufs[k] = (uint8_t *)(uintptr_t)map.base + (off[k] - d->byte_offset);
  /* The mapping counts as live before the wrap can release it. */
  atomic_fetch_add_explicit(&l->live, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
  hr_descriptor nd = *d;
  nd.byte_offset = 0;
  rc = hr_tensor_wrap(out, &nd, bufs, map_release, c, &s->mem);
  if (rc) {
    map_release(c);
    return rc == HR_ERR_NOMEM ? rc : HR_ERR_INTERNAL;
  }
  return 0;
}

int hr__shm_release_due(const hr_session *s) {
  for (const struct hr_clease *l = s->cleases; l; l = l->next)
    if (atomic_load_explicit(&((struct hr_clease *)l)->released,
                             memory_order_acquire))
      return 1;
  return 0;
}

int hr__shm_flush_releases(hr_session *s) {
  struct hr_clease **pp = &s->cleases;
  int live = s->state == HR_CS_ESTABLISHED || s->state == HR_CS_DRAINING;
  while (*pp) {
    struct hr_clease *l = *pp;
    if (!atomic_load_explicit(&l->released, memory_order_acquire)) {
      pp = &l->next;
      continue;
    }
    *pp = l->next;
    int rv = live ? hr__out_empty(s, HR_MSG_BUFFER_RELEASE, l->stream_id) : 0;
    clease_unref(l);
    if (rv)
      return rv;
  }
  return 0;
}

void hr__shm_free(hr_session *s) {
  for (size_t i = 0; i < s->nsleases; i++)
    hr_tensor_unref(s->sleases[i].t);
  hr__mem_free(&s->mem, s->sleases);
  s->sleases = NULL;
  s->nsleases = s->sleases_cap = s->sleases_live = 0;
  /* Mappings outlive the session: they only lose the way back. */
  while (s->cleases) {
    struct hr_clease *l = s->cleases;
    s->cleases = l->next;
    clease_unref(l);
  }
  while (s->npfds)
    pfd_drop(s, 0);
  hr__mem_free(&s->mem, s->pfds);
  s->pfds = NULL;
}
