/*
 * The driver the session targets share (see fuzz_session.h).
 */
#include "fuzz_session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint8_t fz_take(fz_input *in) {
  if (in->n == 0)
    return 0;
  in->n--;
  return *in->p++;
}

/* ---- memory -------------------------------------------------------------- */

/* Peers declare sizes; a real malloc refuses what it cannot give.  Under
 * ASan a huge request aborts instead, so the driver refuses anything over
 * 64 MiB itself, which also sends the library down its HR_ERR_NOMEM
 * paths. */
#define FZ_MAX_BLOCK ((size_t)64 << 20)

static void *fz_malloc(size_t n, void *ud) {
  (void)ud;
  return n > FZ_MAX_BLOCK ? NULL : malloc(n);
}
static void fz_free(void *p, void *ud) {
  (void)ud;
  free(p);
}
static void *fz_calloc(size_t m, size_t n, void *ud) {
  (void)ud;
  if (n && m > FZ_MAX_BLOCK / n)
    return NULL;
  return calloc(m, n);
}
static void *fz_realloc(void *p, size_t n, void *ud) {
  (void)ud;
  return n > FZ_MAX_BLOCK ? NULL : realloc(p, n);
}

/* ---- settings and callbacks ---------------------------------------------- */

#define MS 1000000ull

void fz_settings(const fz_driver *d, hr_settings *set) {
  hr_settings_default(set);
  set->handshake_timeout = 500 * MS;
  set->idle_timeout = 2000 * MS;
  set->read_timeout = 300 * MS;
  set->keepalive_interval = 1000 * MS;
  set->max_streams = 16;
  set->send_budget = 4096;
  set->transcode_chunk = 256;
  set->transcode_window = 2;
  set->shard_bytes = 64;
  set->max_shards = 8;
  if (d->mode & FZ_MODE_SMALL_FRAMES)
    set->frame_data_size = 64;
  fz_fabric_settings(d, set);
}

static int fz_submit(hr_session *s, hr_work *w, void *ud) {
  fz_driver *d = ud;
  if (!(d->mode & FZ_MODE_DEFER_WORK) || d->nwork == FZ_MAX_WORK)
    return -1; /* the session runs it inline */
  d->work_s[d->nwork] = s;
  d->work[d->nwork++] = w;
  return 0;
}

hr_session_callbacks fz_callbacks(void) {
  hr_session_callbacks cb;
  memset(&cb, 0, sizeof(cb));
  cb.size = sizeof(cb);
  cb.submit_work = fz_submit;
  return cb;
}

void fz_check_rv(fz_driver *d, int rv) {
  if (hr_err_is_fatal(rv))
    d->dead = 1;
}

/* ---- the output checker -------------------------------------------------- */

static int sent_by(int role, uint8_t type) {
  switch (type) {
  case HR_MSG_TENSOR_DATA:
  case HR_MSG_TENSOR_DATA_END:
  case HR_MSG_TENSOR_DESCRIPTOR: /* C2S: the members of a composite PUT */
  case HR_MSG_ERROR:
  case HR_MSG_GOAWAY:
  case HR_MSG_PING:
  case HR_MSG_PONG:
  /* The RDMA handshake runs either way: GET and PUT swap the roles. */
  case HR_MSG_RDMA_REGISTER:
  case HR_MSG_RDMA_READY: return 1;
  case HR_MSG_CLIENT_HELLO:
  case HR_MSG_TENSOR_REQUEST:
  case HR_MSG_TENSOR_PUT:
  case HR_MSG_CANCEL:
  case HR_MSG_LIST_REQUEST:
  case HR_MSG_BUFFER_RELEASE: return role == HR_ROLE_CLIENT;
  case HR_MSG_SERVER_HELLO:
  case HR_MSG_TENSOR_PUT_ACK:
  case HR_MSG_LIST_RESPONSE: return role == HR_ROLE_SERVER;
  default: return 0;
  }
}

static void check_output(fz_driver *d, const uint8_t *p, size_t len) {
  while (len > 0) {
    hr_reader_event ev;
    memset(&ev, 0, sizeof(ev));
    int64_t used = hr_reader_feed(d->out_rd, p, len, &ev);
    if (used < 0 || (uint64_t)used > len)
      hr_fuzz_fail("checker: hr_reader_feed failed");
    p += used;
    len -= (size_t)used;
    if (ev.kind == HR_RD_NONE)
      break;
    if (d->trace && (ev.kind == HR_RD_MESSAGE || ev.first))
      fprintf(stderr, "fuzz: conn %d sent type 0x%02x stream %u (%u bytes)\n",
              d->cur, ev.hdr.type, ev.hdr.stream_id, ev.hdr.payload_length);
    if (ev.kind == HR_RD_ERROR)
      hr_fuzz_fail("the session sent a malformed message");
    if (!sent_by(d->role, ev.hdr.type))
      hr_fuzz_fail("the session sent a message of the other direction");
    int fd_due = d->fd_due && (ev.kind == HR_RD_MESSAGE || ev.first);
    if (fd_due) {
      d->fd_due = 0;
      if (ev.kind != HR_RD_MESSAGE ||
          (ev.hdr.type != HR_MSG_TENSOR_DESCRIPTOR &&
           ev.hdr.type != HR_MSG_TENSOR_PUT))
        hr_fuzz_fail("a file descriptor went with a message not a "
                     "descriptor");
    }
    if (ev.kind == HR_RD_MESSAGE) {
      hr_msg m;
      hr_wire_status st = {0};
      memset(&m, 0, sizeof(m));
      hr_wire_ctx ctx;
      memset(&ctx, 0, sizeof(ctx));
      ctx.transport = HR_TRANSPORT_NETWORK;
      if (hr_wire_decode_payload(&ev.hdr, ev.payload, &ctx, &m, &st) != 0)
        hr_fuzz_fail("the session sent a message that does not decode");
      hr_fuzz_check_decoded(&m, &ctx);
      if (fd_due) {
        const hr_transport_fields *xp = ev.hdr.type == HR_MSG_TENSOR_PUT
                                            ? &m.u.put.xport
                                            : &m.u.tensor.xport;
        if (xp->data_plane != HR_PLANE_SHM)
          hr_fuzz_fail("a file descriptor went with a descriptor not SHM");
      }
    }
  }
}

/* ---- output -------------------------------------------------------------- */

/* One pull; consumes per `how` (0 all, 1 half, 2 one byte, 3 nothing).
 * Returns the bytes consumed. */
static size_t pull_once(fz_driver *d, int max, unsigned how) {
  if (d->dead)
    return 0;
  hr_iov iov[8];
  int n = hr_session_pull(d->s, iov, max, d->now);
  if (n < 0) {
    fz_check_rv(d, n);
    if (!d->dead)
      hr_fuzz_fail("hr_session_pull: a non-fatal error");
    return 0;
  }
  if (n > max)
    hr_fuzz_fail("hr_session_pull: more iovecs than asked for");
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    if (iov[i].len == 0 || iov[i].base == NULL)
      hr_fuzz_fail("hr_session_pull: an empty iovec");
    total += iov[i].len;
  }
  size_t take = how == 0 ? total : how == 1 ? total / 2
              : how == 2 ? (total > 0) : 0;
  /* A descriptor rides on the first byte of the pull: it is sent once
   * that byte is, and its message must then start there. */
  int fd = hr_session_pull_fd(d->s);
  if (fd >= 0 && take > 0) {
    if (d->fd_due)
      hr_fuzz_fail("hr_session_pull_fd: two descriptors for one message");
    if (d->check_fd)
      d->check_fd(d, fd);
    if (d->trace)
      fprintf(stderr, "fuzz: conn %d sends descriptor %d\n", d->cur, fd);
    d->fd_due = 1;
  }
  /* Only the bytes consumed are sent; the checker reads them in order. */
  size_t left = take;
  for (int i = 0; i < n && left > 0; i++) {
    size_t k = iov[i].len < left ? iov[i].len : left;
    check_output(d, iov[i].base, k);
    left -= k;
  }
  if (take > 0)
    hr_session_consumed(d->s, take, d->now);
  return take;
}

void fz_drain(fz_driver *d) {
  /* Output is finite: every stream's tensors are small and the session
   * stops queueing while nothing is consumed; the bound turns a runaway
   * into a failure rather than a hang. */
  for (int rounds = 0; !d->dead; rounds++) {
    if (rounds == 100000)
      hr_fuzz_fail("the session's output never ends");
    if (pull_once(d, 8, 0) == 0)
      break;
  }
}

/* ---- work ---------------------------------------------------------------- */

static void run_work(fz_driver *d, int i) {
  hr_work *w = d->work[i];
  hr_session *s = d->work_s[i];
  d->nwork--;
  d->work[i] = d->work[d->nwork];
  d->work_s[i] = d->work_s[d->nwork];
  w->run(w);
  hr_session_work_done(s, w, d->now);
}

/* ---- connections --------------------------------------------------------- */

static void conn_save(fz_driver *d) {
  fz_conn *c = &d->conns[d->cur];
  c->s = d->s;
  c->out_rd = d->out_rd;
  c->dead = d->dead;
  c->fd_due = d->fd_due;
}

static void conn_load(fz_driver *d, int i) {
  fz_conn *c = &d->conns[i];
  d->cur = i;
  d->s = c->s;
  d->out_rd = c->out_rd;
  d->dead = c->dead;
  d->fd_due = c->fd_due;
}

static hr_reader *new_checker(void) {
  hr_reader_settings rs;
  memset(&rs, 0, sizeof(rs));
  rs.max_payload = 1u << 30;
  rs.ctx.transport = HR_TRANSPORT_NETWORK;
  hr_reader *rd = NULL;
  if (hr_reader_new(&rd, &rs, NULL) != 0)
    hr_fuzz_fail("hr_reader_new failed");
  return rd;
}

int fz_conn_add(fz_driver *d, hr_session *s) {
  if (d->nconns == 0) {
    d->nconns = 1;
    d->cur = 0;
  }
  if (d->nconns == FZ_MAX_CONNS)
    return -1;
  int i = d->nconns++;
  fz_conn *c = &d->conns[i];
  memset(c, 0, sizeof(*c));
  c->s = s;
  c->out_rd = new_checker();
  return i;
}

void fz_conn_switch(fz_driver *d, int i) {
  if (i < 0 || i >= d->nconns || i == d->cur)
    return;
  conn_save(d);
  conn_load(d, i);
}

/* Pulls everything from every connection, the current one first. */
static void drain_all(fz_driver *d) {
  fz_drain(d);
  if (d->nconns < 2)
    return;
  int cur = d->cur;
  /* A pull on one lane may give another lane output (a shard cancelled),
   * so go round until none has any. */
  for (int rounds = 0, more = 1; more; rounds++) {
    if (rounds == 1000)
      hr_fuzz_fail("the lanes' output never ends");
    more = 0;
    for (int i = 0; i < d->nconns; i++) {
      fz_conn_switch(d, i);
      for (int k = 0; !d->dead && pull_once(d, 8, 0) > 0; k++) {
        if (k == 100000)
          hr_fuzz_fail("the session's output never ends");
        more = 1;
      }
    }
  }
  fz_conn_switch(d, cur);
}

/* ---- input --------------------------------------------------------------- */

void fz_feed(fz_driver *d, size_t len) {
  if (len > d->in.n)
    len = d->in.n;
  const uint8_t *p = d->in.p;
  d->in.p += len;
  d->in.n -= len;
  while (len > 0 && !d->dead) {
    void *dst;
    size_t n;
    if ((d->mode & FZ_MODE_ZERO_COPY) &&
        hr_session_recv_target(d->s, &dst, &n) == 1) {
      if (n == 0 || dst == NULL)
        hr_fuzz_fail("hr_session_recv_target: an empty target");
      if (n > len)
        n = len;
      memcpy(dst, p, n);
      int rv = hr_session_recv_placed(d->s, n, d->now);
      if (rv < 0) {
        fz_check_rv(d, rv);
        if (!d->dead)
          hr_fuzz_fail("hr_session_recv_placed: a non-fatal error");
        return;
      }
      p += n;
      len -= n;
      continue;
    }
    int64_t rv = hr_session_recv(d->s, p, len, d->now);
    if (rv < 0) {
      fz_check_rv(d, (int)rv);
      if (!d->dead)
        hr_fuzz_fail("hr_session_recv: a non-fatal error");
      return;
    }
    if ((uint64_t)rv != len)
      hr_fuzz_fail("hr_session_recv did not take all its input");
    len = 0;
  }
}

static void advance(fz_driver *d, unsigned log2ns) {
  d->now += (hr_tstamp)1 << log2ns;
  if (d->dead)
    return;
  hr_tstamp due = hr_session_get_expiry(d->s);
  if (due != HR_TSTAMP_NEVER && due <= d->now)
    fz_check_rv(d, hr_session_handle_expiry(d->s, d->now));
}

/* ---- the run ------------------------------------------------------------- */

void fz_init(fz_driver *d, const uint8_t *data, size_t size, int role) {
  memset(d, 0, sizeof(*d));
  d->in.p = data;
  d->in.n = size;
  d->mode = fz_take(&d->in);
  d->now = 1000 * MS;
  d->mem.malloc = fz_malloc;
  d->mem.free = fz_free;
  d->mem.calloc = fz_calloc;
  d->mem.realloc = fz_realloc;
  d->out_rd = new_checker();
  d->role = role;
  d->trace = getenv("HR_FUZZ_TRACE") != NULL;
  fz_fabric_init(d);
}

void fz_run(fz_driver *d) {
  int manual = (d->mode & FZ_MODE_MANUAL_OUT) != 0;
  if (!manual)
    drain_all(d);
  while (d->in.n > 0) {
    uint8_t c = fz_take(&d->in);
    unsigned op = c >> 5, arg = c & 31;
    if (d->dead && op != 4 && op != 6)
      continue;
    switch (op) {
    case 0:
    case 1:
    case 2:
    case 3: fz_feed(d, (size_t)(arg + 1) << (4 * op)); break;
    case 4: advance(d, arg); break;
    case 5: pull_once(d, 1 + (int)(arg & 7), arg >> 3); break;
    case 6:
      if (d->nwork > 0)
        run_work(d, (int)(arg % (unsigned)d->nwork));
      break;
    default: d->action(d, arg); break;
    }
    if (!manual) {
      fz_fabric_step(d);
      drain_all(d);
    }
  }
  /* The end: either every work item comes back first, or the session is
   * deleted with work out (it must then live until the last report). */
  int early = (d->mode & FZ_MODE_DEL_EARLY) != 0;
  if (!early) {
    for (int rounds = 0; d->nwork > 0; rounds++) {
      if (rounds == 100000)
        hr_fuzz_fail("work items never stop coming");
      run_work(d, 0);
      drain_all(d);
    }
  }
  /* Work still out keeps the session's memory: it is reported on the
   * deleted session as usual, and the last report frees it. */
  if (d->nconns == 0) {
    hr_session_del(d->s);
    d->s = NULL;
    hr_reader_del(d->out_rd);
  } else {
    conn_save(d);
    for (int i = 0; i < d->nconns; i++) {
      hr_session_del(d->conns[i].s);
      hr_reader_del(d->conns[i].out_rd);
    }
    d->s = NULL;
  }
  while (d->nwork > 0)
    run_work(d, d->nwork - 1);
  /* The data plane outlives the session until the fabric lets go. */
  fz_fabric_done(d);
}

/* ---- tensors ------------------------------------------------------------- */

hr_tensor *fz_dense(uint8_t elem, uint8_t layout, unsigned rank,
                    const uint64_t *shape, const hr_layout_params *params,
                    uint8_t seed) {
  hr_descriptor desc;
  memset(&desc, 0, sizeof(desc));
  desc.descriptor_version = 1;
  desc.element_type = elem;
  desc.rank = (uint8_t)rank;
  desc.layout.tag = layout;
  for (unsigned k = 0; k < rank; k++)
    desc.shape[k] = shape[k];
  if (params)
    desc.params = *params;
  uint64_t sizes[HR_MAX_BUFFERS];
  hr_wire_status st;
  int n = hr_descriptor_buffer_sizes(&desc, sizes, &st);
  if (n < 0)
    return NULL;
  desc.buffer_count = (uint8_t)n;
  for (int k = 0; k < n; k++)
    desc.buffers[k].size_bytes = sizes[k];
  hr_tensor *t = NULL;
  if (hr_tensor_alloc(&t, &desc, 0, NULL) != 0)
    return NULL;
  for (int k = 0; k < n; k++) {
    uint8_t *b = hr_tensor_buffer(t, (unsigned)k);
    for (uint64_t i = 0; i < sizes[k]; i++)
      b[i] = (uint8_t)(seed + i * 7);
  }
  return t;
}

hr_tensor *fz_csr(uint64_t rows, uint64_t cols) {
  hr_layout_params pp;
  memset(&pp, 0, sizeof(pp));
  pp.nnz = (rows + 1) / 2;
  pp.index_type = HR_ELEM_INT32;
  uint64_t shape[2] = {rows, cols};
  hr_tensor *t = fz_dense(HR_ELEM_FLOAT32, HR_LAYOUT_SPARSE_CSR, 2, shape,
                          &pp, 0);
  if (t == NULL)
    return NULL;
  int32_t *indptr = hr_tensor_buffer(t, 0);
  int32_t *idx = hr_tensor_buffer(t, 1);
  float *val = hr_tensor_buffer(t, 2);
  int32_t k = 0;
  for (uint64_t i = 0; i < rows; i++) {
    indptr[i] = k;
    if (i % 2 == 0) {
      idx[k] = (int32_t)((i * 3) % cols);
      val[k] = (float)i + 0.5f;
      k++;
    }
  }
  indptr[rows] = k;
  return t;
}

hr_tensor *fz_tuple(hr_tensor *a, hr_tensor *b) {
  if (a == NULL || b == NULL)
    return NULL;
  hr_descriptor h;
  memset(&h, 0, sizeof(h));
  h.descriptor_version = 1;
  h.element_type = HR_ELEM_NONE;
  h.layout.tag = HR_LAYOUT_COMPOSITE;
  h.params.member_count = 2;
  h.params.rule = HR_COMPOSITE_TUPLE;
  hr_tensor *m[2] = {a, b};
  hr_tensor *c = NULL;
  if (hr_tensor_new_composite(&c, &h, m, 2, NULL, NULL) != 0)
    return NULL;
  return c;
}
