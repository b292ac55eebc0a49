/*
 * libFuzzer target: a whole client hr_session fed arbitrary server bytes,
 * with GET, PUT, LIST, PING and CANCEL requests issued when the input
 * says (before the SERVER_HELLO or after, interleaved with the bytes).
 *
 * The input drives the session through fuzz_session.h's commands; its
 * mode byte's high bits are this target's:
 *   bit 5 strict composites off (torn composites are handed out in parts)
 *   bit 6 the CLIENT_HELLO carries an AUTH_TOKEN
 *   bit 7 GETs over RDMA register a destination (rdma_destination)
 * Action commands (op 7, arg): arg & 7 =
 *   0 GET: u8 key_len, the key, u8 flags, u8 max_shards, u8 layout count
 *     (mod 5) and per layout u8 tag, u8 ext_len (mod 16), ext bytes,
 *     u8 min_alignment_log2, u8 preferred_device, with REGION u8 rank
 *     (mod 5) and rank pairs of u8 offset, u8 shape.  arg >> 3 picks the
 *     destination: 0 allocated by the session, else an application
 *     buffer of 64 << (3 * ((arg >> 3) - 1)) bytes (64, 512, 4096)
 *   1 PUT: u8 key_len, the key, u8 flags, u8 tensor (mod 5)
 *   2 LIST: u8 prefix_len, prefix, u8 start_after_len, start_after,
 *     u8 max_entries
 *   3 PING   4 CANCEL: u8 v, the v-th request issued (else stream v)
 *   5 by arg >> 3: 0 hr_session_shutdown; 1 a new lane (the group is
 *     made on the first connection at the first one: hr_group_new,
 *     hr_group_add_lane), which becomes the current connection; 2 the
 *     next connection becomes current; 3 the first one does
 *   6 hr_session_terminate
 *   7 u8 c: with bit 7 set, a file descriptor arrives with the next
 *     (c & 127) + 1 bytes of input (hr_session_recv_fds: the SHM data
 *     plane); else a fabric command (fuzz_session.h: fz_fabric_action)
 *
 * The SHM host is fake: descriptors are numbers (never real files), and
 * shm_map hands out a zeroed heap block of the asked length (up to 1 MiB;
 * longer ones are refused like a short segment).  Checked: every
 * descriptor handed in is closed exactly once, by the end at the latest;
 * no unknown one is closed; every mapping is unmapped exactly once.
 *
 * Built with FZ_DEVICE (the target fuzz_device_session) the client has
 * the simulated device ("sim", always built, so it runs anywhere): a GET
 * with arg >> 3 = 3 lands in device memory (hr_get_opts.device) with
 * device_sync = u8 % 4 (the last value invalid), read after u8 key_len
 * and the key and before the rest; PUT tensor 4 is device memory on it
 * (staged for frames, or a GPUDirect source where the fake fabric reaches
 * the simulated device's memory); and the fake SHM host takes device
 * memory exported over SHM (shm_wake).  Hostile descriptors with device
 * buffers and sync modes then meet the device paths (engine/core
 * hr_devrx.c, hr_devput.c, hr_shm_dev.c).
 *
 * Checked besides the driver's checks: every request's completion runs
 * exactly once, at the latest when the session is deleted; a successful
 * GET hands out a tensor, a failed one none.  With lanes, every
 * connection's bytes come from the input (the driver's current one), so
 * a hostile server answers joins and sends shards on any lane.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_session.h"

#ifdef FZ_DEVICE
#include <hurray/gpu.h>
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MODE_LOOSE 0x20
#define MODE_AUTH 0x40
#define MODE_RDMA_DEST 0x80

#define MAX_REQ 64

typedef struct request {
  int kind; /* 0 GET, 1 PUT, 2 LIST, 3 PING */
  int calls;
  uint32_t stream_id;
  void *dest;     /* the application buffer of a GET (NULL: none) */
  uint8_t sum;    /* of the bytes a GET handed out */
  int trace;      /* HR_FUZZ_TRACE: completions on stderr */
  int dest_owned; /* the returned tensor's release frees dest */
} request;

#define MAX_FDS 64
#define FD_BASE 1000
#define MAX_MAP ((uint64_t)1 << 20)

typedef struct mapping {
  struct client *c;
  void *block;
  int unmapped;
} mapping;

typedef struct client {
  request req[MAX_REQ];
  int nreq;
  hr_tensor *tensors[5];
  int trace;
  /* The fake SHM host: descriptor FD_BASE + i is fds[i] (0 never handed
   * in, 1 handed in, 2 closed). */
  uint8_t fds[MAX_FDS];
  int nfds;
  mapping *maps[MAX_REQ];
  int nmaps;
  hr_group *grp; /* lanes: made at the first action 5 with arg >> 3 = 1 */
} client;

static void fd_close(hr_session *s, int fd, void *ud) {
  fz_driver *d = ud;
  client *c = d->target;
  (void)s;
  int i = fd - FD_BASE;
  if (i < 0 || i >= c->nfds || c->fds[i] != 1)
    hr_fuzz_fail("fd_close of a descriptor not handed in, or closed twice");
  c->fds[i] = 2;
}

static void unmap(void *ctx) {
  mapping *m = ctx;
  if (m->unmapped++)
    hr_fuzz_fail("a mapping was unmapped twice");
  free(m->block);
  m->block = NULL;
}

static int shm_map(hr_session *s, int fd, uint64_t offset, uint64_t len,
                   uint64_t align, hr_shm_mapping *out, char *why,
                   size_t why_len, void *ud) {
  fz_driver *d = ud;
  client *c = d->target;
  (void)s;
  int i = fd - FD_BASE;
  if (i < 0 || i >= c->nfds || c->fds[i] != 1)
    hr_fuzz_fail("shm_map of a descriptor not handed in, or closed");
  if (align == 0 || (align & (align - 1)) != 0)
    hr_fuzz_fail("shm_map: an alignment that is not a power of two");
  if (len > MAX_MAP || offset > UINT64_MAX - len || align > 4096 ||
      c->nmaps == MAX_REQ) {
    snprintf(why, why_len, "fuzz: the segment is too short");
    return -1;
  }
  mapping *m = calloc(1, sizeof *m);
  size_t n = len ? (size_t)len : 1;
  m->block = m ? aligned_alloc(4096, (n + 4095) & ~(size_t)4095) : NULL;
  if (m == NULL || m->block == NULL)
    hr_fuzz_fail("out of memory");
  memset(m->block, 0x5A, n);
  m->c = c;
  c->maps[c->nmaps++] = m;
  out->base = m->block;
  out->unmap = unmap;
  out->ctx = m;
  return 0;
}

/* A descriptor arrives with the next `len` bytes of input. */
static void recv_fd(fz_driver *d, client *c, size_t len) {
  if (c->nfds == MAX_FDS)
    return;
  int fd = FD_BASE + c->nfds;
  c->fds[c->nfds++] = 1;
  int rv = hr_session_recv_fds(d->s, &fd, 1, len, d->now);
  if (rv != 0 && rv != HR_ERR_NOMEM)
    hr_fuzz_fail("hr_session_recv_fds: an undocumented return");
  fz_check_rv(d, rv);
  /* The bytes it came with, fed as the feed commands do. */
  fz_feed(d, len);
}

static void release_dest(void *ctx) { free(ctx); }

static void done(request *r, int status) {
  if (++r->calls != 1)
    hr_fuzz_fail("a completion ran twice");
  if (r->trace)
    fprintf(stderr, "fuzz: request %d (stream %u) completed: %s\n", r->kind,
            r->stream_id, hr_strerror(status));
}

static void on_get(hr_session *s, uint32_t sid, hr_tensor *t,
                   const hr_transfer_record *rec, void *ud) {
  request *r = ud;
  (void)s;
  (void)sid;
  done(r, rec->status);
  if ((rec->status == 0) != (t != NULL))
    hr_fuzz_fail("a GET's status and tensor disagree");
  for (size_t i = 0; i < rec->partial_count; i++)
    if (rec->partial[i] == NULL)
      hr_fuzz_fail("a torn composite's part is NULL");
  if (t != NULL) {
    /* Read every byte handed out: ASan checks the buffers are real. */
    const hr_descriptor *desc = hr_tensor_descriptor(t);
    for (unsigned k = 0; k < desc->buffer_count; k++) {
      const uint8_t *b = hr_tensor_buffer(t, k);
      for (uint64_t i = 0; i < desc->buffers[k].size_bytes; i++)
        r->sum ^= b[i];
    }
    r->dest_owned = 1; /* the tensor's release frees dest */
    hr_tensor_unref(t);
  }
}

static void on_put(hr_session *s, uint32_t sid, const hr_transfer_record *rec,
                   void *ud) {
  (void)s;
  (void)sid;
  done(ud, rec->status);
}

static void on_list(hr_session *s, int status, uint32_t wire_error,
                    const hr_list_response *resp, void *ud) {
  (void)s;
  (void)wire_error;
  done(ud, status);
  if (status == 0 && resp == NULL)
    hr_fuzz_fail("a LIST succeeded without a response");
  if (resp != NULL) {
    size_t pos = 0, n = 0;
    hr_list_entry e;
    while (hr_list_entry_next(resp->entries_raw, resp->entries_raw_len, &pos,
                              &e) == 1)
      n++;
    if (n != resp->entry_count)
      hr_fuzz_fail("a LIST response's entries do not iterate to its count");
  }
}

static void on_ping(hr_session *s, int status, uint64_t rtt, void *ud) {
  (void)s;
  (void)rtt;
  done(ud, status);
}

/* u8 length, then that many bytes (fewer when the input ends). */
static uint16_t take_bytes(fz_input *in, uint8_t *out) {
  uint16_t n = fz_take(in);
  if (n > in->n)
    n = (uint16_t)in->n;
  memcpy(out, in->p, n);
  in->p += n;
  in->n -= n;
  return n;
}

static request *new_request(client *c, int kind) {
  if (c->nreq == MAX_REQ)
    return NULL;
  request *r = &c->req[c->nreq];
  memset(r, 0, sizeof(*r));
  r->kind = kind;
  r->trace = c->trace;
  return r;
}

#ifdef FZ_DEVICE
/* The simulated device: opened once for the process (opening one per
 * input would start and stop its threads every time). */
static hr_gpu *sim_device(void) {
  static hr_gpu *g;
  if (g == NULL && hr_gpu_open(&g, NULL, NULL, NULL) != 0)
    hr_fuzz_fail("the simulated device could not be opened");
  return g;
}

static void release_devbuf(void *ctx) { hr_gpu_buf_del(ctx); }

/* 300 bytes of device memory as a tensor (producer-synced: no event). */
static hr_tensor *device_tensor(void) {
  hr_gpu *g = sim_device();
  hr_gpu_caps caps;
  hr_gpu_buf *b = NULL;
  if (hr_gpu_query(g, &caps) != 0 ||
      hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, 300, &b) != 0)
    hr_fuzz_fail("device memory could not be allocated");
  hr_descriptor desc;
  memset(&desc, 0, sizeof(desc));
  desc.descriptor_version = 1;
  desc.element_type = HR_ELEM_UINT8;
  desc.rank = 1;
  desc.shape[0] = 300;
  desc.layout.tag = HR_LAYOUT_ROW_MAJOR;
  desc.buffer_count = 1;
  desc.buffers[0].size_bytes = 300;
  desc.buffers[0].device_tag = caps.device_tag;
  desc.buffers[0].device_index = caps.device_index;
  hr_tensor *t = NULL;
  if (hr_tensor_wrap_device(&t, &desc, &b, NULL, release_devbuf, b, NULL) !=
      0)
    hr_fuzz_fail("hr_tensor_wrap_device failed");
  return t;
}

/* Device memory imported over SHM: the token's unmap makes the host pull
 * (this driver pulls after every command anyway). */
static void wake_unmap(void *ctx) { (void)ctx; }

static int shm_wake(hr_session *s, hr_shm_mapping *out, void *ud) {
  (void)s;
  (void)ud;
  out->unmap = wake_unmap;
  out->ctx = NULL;
  return 0;
}
#endif

static void get(fz_driver *d, client *c, unsigned dest_sel) {
  uint8_t key[256], ext[4][16];
  uint16_t key_len = take_bytes(&d->in, key);
  hr_get_opts o;
  memset(&o, 0, sizeof(o));
  o.key = key;
  o.key_len = key_len;
#ifdef FZ_DEVICE
  if (dest_sel == 3) {
    o.device = sim_device();
    o.device_sync = fz_take(&d->in) % 4;
    if (o.device_sync == 3)
      o.device_sync = HR_SYNC_INVALID;
    dest_sel = 0;
  }
#endif
  o.flags = fz_take(&d->in);
  o.max_shards = fz_take(&d->in);
  hr_layout_entry layouts[4];
  o.layout_count = fz_take(&d->in) % 5;
  for (unsigned i = 0; i < o.layout_count; i++) {
    layouts[i].tag = fz_take(&d->in);
    layouts[i].ext_len = fz_take(&d->in) % 16;
    for (unsigned k = 0; k < layouts[i].ext_len; k++)
      ext[i][k] = fz_take(&d->in);
    layouts[i].ext = ext[i];
  }
  o.layouts = layouts;
  o.min_alignment_log2 = fz_take(&d->in);
  o.preferred_device = fz_take(&d->in);
  uint64_t off[4], shape[4];
  if (o.flags & HR_REQ_REGION) {
    o.region_rank = fz_take(&d->in) % 5;
    for (unsigned k = 0; k < o.region_rank; k++) {
      off[k] = fz_take(&d->in);
      shape[k] = fz_take(&d->in);
    }
    o.region_offset = off;
    o.region_shape = shape;
  }
  request *r = new_request(c, 0);
  if (r == NULL)
    return;
  hr_get_dest dest;
  if (dest_sel > 0) {
    memset(&dest, 0, sizeof(dest));
    dest.capacity = (uint64_t)64 << (3 * (dest_sel - 1));
    /* The buffer is handed over with the returned tensor; a failed GET
     * gives it back (the completion then frees it, see below). */
    r->dest = aligned_alloc(64, (size_t)dest.capacity);
    if (r->dest == NULL)
      hr_fuzz_fail("out of memory");
    dest.buffer = r->dest;
    dest.release = release_dest;
    dest.release_ctx = r->dest;
    o.dest = &dest;
  }
  int rv = hr_session_get(d->s, &o, on_get, r, &r->stream_id);
  fz_check_rv(d, rv);
  if (rv == 0) {
    c->nreq++;
  } else {
    free(r->dest);
  }
}

static void put(fz_driver *d, client *c) {
  uint8_t key[256];
  uint16_t key_len = take_bytes(&d->in, key);
  uint32_t flags = fz_take(&d->in);
  hr_tensor *t = c->tensors[fz_take(&d->in) % 5];
  request *r = new_request(c, 1);
  if (r == NULL)
    return;
  int rv = hr_session_put(d->s, key, key_len, flags, t, on_put, r,
                          &r->stream_id);
  fz_check_rv(d, rv);
  if (rv == 0)
    c->nreq++;
}

static void list(fz_driver *d, client *c) {
  uint8_t prefix[256], after[256];
  uint16_t plen = take_bytes(&d->in, prefix);
  uint16_t alen = take_bytes(&d->in, after);
  uint16_t max = fz_take(&d->in);
  request *r = new_request(c, 2);
  if (r == NULL)
    return;
  int rv = hr_session_list(d->s, prefix, plen, after, alen, max, on_list, r);
  fz_check_rv(d, rv);
  if (rv == 0)
    c->nreq++;
}

static void ping(fz_driver *d, client *c) {
  request *r = new_request(c, 3);
  if (r == NULL)
    return;
  int rv = hr_session_ping(d->s, on_ping, r);
  fz_check_rv(d, rv);
  if (rv == 0)
    c->nreq++;
}

/* Action 5: shutdown, or the lanes (a group over several connections). */
static void lanes(fz_driver *d, client *c, unsigned op) {
  int n = d->nconns ? d->nconns : 1;
  switch (op) {
  case 0: fz_check_rv(d, hr_session_shutdown(d->s, d->now)); break;
  case 1: {
    hr_session *lane0 = d->cur == 0 ? d->s : d->conns[0].s;
    if (c->grp == NULL) {
      int rv = hr_group_new(&c->grp, lane0);
      if (rv != 0 && rv != HR_ERR_STATE && rv != HR_ERR_NOMEM)
        hr_fuzz_fail("hr_group_new: an undocumented return");
      if (rv != 0)
        return;
    }
    hr_session *ls = NULL;
    int rv = hr_group_add_lane(c->grp, d, d->now, &ls);
    if (rv != 0 && rv != HR_ERR_STATE && rv != HR_ERR_UNSUPPORTED &&
        rv != HR_ERR_BUSY && rv != HR_ERR_LIMIT && rv != HR_ERR_NOMEM)
      hr_fuzz_fail("hr_group_add_lane: an undocumented return");
    if (rv != 0)
      return;
    int i = fz_conn_add(d, ls);
    if (i < 0) {
      /* No room for another connection: it never connects. */
      hr_session_del(ls);
      return;
    }
    fz_conn_switch(d, i);
    break;
  }
  case 2: fz_conn_switch(d, (d->cur + 1) % n); break;
  default: fz_conn_switch(d, 0); break;
  }
}

static void action(fz_driver *d, unsigned arg) {
  client *c = d->target;
  switch (arg & 7) {
  case 0: get(d, c, arg >> 3); break;
  case 1: put(d, c); break;
  case 2: list(d, c); break;
  case 3: ping(d, c); break;
  case 4: {
    uint8_t v = fz_take(&d->in);
    uint32_t id = v < c->nreq ? c->req[v].stream_id : v;
    fz_check_rv(d, hr_session_cancel(d->s, id));
    break;
  }
  case 5: lanes(d, c, arg >> 3); break;
  case 6: hr_session_terminate(d->s, d->now); break;
  default: {
    uint8_t b = fz_take(&d->in);
    if (b & 0x80)
      recv_fd(d, c, (size_t)(b & 0x7f) + 1);
    else
      fz_fabric_action(d, b);
    break;
  }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_driver d;
  fz_init(&d, data, size, HR_ROLE_CLIENT);
  client c;
  memset(&c, 0, sizeof(c));
  c.trace = d.trace;
  c.tensors[0] = fz_dense(HR_ELEM_FLOAT32, HR_LAYOUT_ROW_MAJOR, 2,
                          (uint64_t[]){2, 3}, NULL, 1);
  c.tensors[1] = fz_dense(HR_ELEM_INT16, HR_LAYOUT_COLUMN_MAJOR, 2,
                          (uint64_t[]){4, 5}, NULL, 2);
  c.tensors[2] = fz_csr(5, 4);
  c.tensors[3] = fz_tuple(c.tensors[0], c.tensors[1]);
#ifdef FZ_DEVICE
  c.tensors[4] = device_tensor();
#else
  c.tensors[4] = fz_dense(HR_ELEM_UINT8, HR_LAYOUT_ROW_MAJOR, 1,
                          (uint64_t[]){300}, NULL, 3);
#endif
  for (int i = 0; i < 5; i++)
    if (c.tensors[i] == NULL)
      hr_fuzz_fail("a fixture tensor could not be built");

  hr_settings set;
  fz_settings(&d, &set);
  set.strict_composites = !(d.mode & MODE_LOOSE);
  set.rdma_destination = (d.mode & MODE_RDMA_DEST) != 0;
#ifdef FZ_DEVICE
  /* The smallest ring: pieces fill, wait and spill with small tensors
   * (and 8 MiB pinned pieces would make every run slow). */
  set.device_piece = 4096;
  set.device_pieces = 2;
  /* The client names the simulated device among its devices: it takes
   * device memory exported over SHM. */
  static const uint8_t devices[] = {HR_DEV_CPU, HR_GPU_DEV_SIM};
  set.devices = devices;
  set.device_count = 2;
#endif
  static const uint8_t token[] = "fuzz-token";
  if (d.mode & MODE_AUTH) {
    set.auth_token = token;
    set.auth_token_len = sizeof(token) - 1;
  }
  hr_session_callbacks cb = fz_callbacks();
  cb.shm_map = shm_map;
  cb.fd_close = fd_close;
#ifdef FZ_DEVICE
  cb.shm_wake = shm_wake;
#endif
  if (hr_session_new(&d.s, HR_ROLE_CLIENT, &set, &cb, NULL, &d, d.now,
                     &d.mem) != 0)
    hr_fuzz_fail("hr_session_new failed");
  d.action = action;
  d.target = &c;
  fz_run(&d);
  /* The lanes' sessions are gone: the handle may go after them. */
  hr_group_del(c.grp);
  for (int i = 0; i < c.nreq; i++) {
    if (c.req[i].calls != 1)
      hr_fuzz_fail("a request never completed");
    if (c.req[i].dest != NULL && !c.req[i].dest_owned)
      free(c.req[i].dest);
  }
  for (int i = 0; i < 5; i++)
    hr_tensor_unref(c.tensors[i]);
  for (int i = 0; i < c.nfds; i++)
    if (c.fds[i] != 2)
      hr_fuzz_fail("a descriptor handed to the session was never closed");
  for (int i = 0; i < c.nmaps; i++) {
    if (c.maps[i]->unmapped != 1)
      hr_fuzz_fail("a mapping was never unmapped");
    free(c.maps[i]);
  }
  return 0;
}
