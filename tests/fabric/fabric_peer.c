/* The end-to-end test peer (see fabric_peer.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fabric_peer.h"

hr_tstamp fp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (hr_tstamp)ts.tv_sec * 1000000000u + (hr_tstamp)ts.tv_nsec;
}

const char *fp_provider_name(const char *short_name) {
  return strcmp(short_name, "tcp") == 0 ? "tcp;ofi_rxm" : short_name;
}

int fp_probe(const char *provider) {
  hr_fabric_config c;
  hr_fabric_config_default(&c);
  c.provider = provider;
  c.node = "127.0.0.1";
  hr_fabric *f;
  char why[256];
  int rv = hr_fabric_new(&f, &c, NULL, why, sizeof why);
  if (rv == HR_ERR_UNSUPPORTED) {
    fprintf(stderr, "skipped: %s\n", why);
    return 77;
  }
  if (rv != 0) {
    fprintf(stderr, "hr_fabric_new: %s\n", why);
    return 1;
  }
  hr_fabric_del(f);
  return 0;
}

int fp_open(fpeer *p, const char *name, const char *provider,
            const hr_fabric_config *cfg) {
  memset(p, 0, sizeof *p);
  p->name = name;
  p->ctl = -1;
  hr_fabric_config c;
  if (cfg)
    c = *cfg;
  else
    hr_fabric_config_default(&c);
  c.provider = provider;
  c.node = "127.0.0.1";
  char why[256];
  int rv = hr_fabric_new(&p->f, &c, NULL, why, sizeof why);
  if (rv == HR_ERR_UNSUPPORTED) {
    print_message("%s: %s\n", name, why);
    return rv;
  }
  if (rv)
    fail_msg("hr_fabric_new(%s): %s: %s", provider, hr_strerror(rv), why);
  assert_string_equal(hr_fabric_provider(p->f), provider);
  /* The data plane needs the fabric to run from the first turn. */
  assert_int_equal(hr_fabric_get_expiry(p->f), 0);
  return 0;
}

/* Reads `str provider`, `bytes endpoint_name` of a FABRIC_ADDRESS value. */
static void parse_address(const uint8_t *v, size_t n, const uint8_t **prov,
                          uint16_t *prov_len, const uint8_t **ep,
                          uint16_t *ep_len) {
  assert_true(n >= 4);
  *prov_len = (uint16_t)(v[0] | v[1] << 8);
  assert_true(n >= 4u + *prov_len);
  *prov = v + 2;
  *ep_len = (uint16_t)(v[2 + *prov_len] | v[3 + *prov_len] << 8);
  assert_int_equal(n, 4u + *prov_len + *ep_len);
  *ep = v + 4 + *prov_len;
}

static void make_conn(fpeer *p, const fpeer *peer, uint32_t caps,
                      uint32_t peer_caps) {
  uint8_t addr[600];
  int64_t n = hr_fabric_address(peer->f, addr, sizeof addr);
  assert_true(n > 0);
  hr_rdma_conn_config cc;
  hr_rdma_conn_config_init(&cc, hr_fabric_get_ops(), p->f, caps, NULL);
  cc.peer_caps = peer_caps;
  parse_address(addr, (size_t)n, &cc.peer_provider, &cc.peer_provider_len,
                &cc.peer_endpoint, &cc.peer_endpoint_len);
  /* The control connection runs over loopback too. */
  struct sockaddr_in ctl;
  memset(&ctl, 0, sizeof ctl);
  ctl.sin_family = AF_INET;
  ctl.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cc.ctl_addr = &ctl;
  cc.ctl_addr_len = sizeof ctl;
  cc.min_bytes = 1;
  assert_int_equal(hr_rdma_conn_new(&p->conn, &cc, NULL), 0);
  const char *why;
  if (!hr_rdma_conn_usable(p->conn, &why))
    fail_msg("%s: connection unusable: %s", p->name, why);
}

void fp_connect(fpeer *a, fpeer *b, uint32_t caps_a, uint32_t caps_b) {
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, sv),
                   0);
  a->ctl = sv[0];
  b->ctl = sv[1];
  make_conn(a, b, caps_a, caps_b);
  make_conn(b, a, caps_b, caps_a);
}

static int send_msg(hr_rdma *x, const hr_msg *m, void *ud) {
  fpeer *p = ud;
  (void)x;
  uint8_t buf[2048];
  int64_t n = hr_wire_encode(m, buf, sizeof buf);
  assert_true(n > 0);
  if (m->hdr.type == HR_MSG_RDMA_REGISTER) {
    p->last_key.length = m->u.rdma.length;
    p->last_key.address = m->u.rdma.address;
    p->last_key.key = m->u.rdma.key;
    p->last_key.raw_key_len = m->u.rdma.raw_key_len;
    if (m->u.rdma.raw_key_len)
      memcpy(p->last_key.raw_key, m->u.rdma.raw_key, m->u.rdma.raw_key_len);
  }
  if (p->nsent < 16)
    p->sent[p->nsent++] = m->hdr.type;
  /* Control messages are small; a full socket buffer would be a bug. */
  assert_int_equal(send(p->ctl, buf, (size_t)n, 0), n);
  return 0;
}

static void on_event(hr_rdma *x, const hr_rdma_event *ev, void *ud) {
  fpeer *p = ud;
  assert_true(p->nev < FP_MAXEV);
  fp_event *e = &p->ev[p->nev++];
  e->kind = ev->kind;
  e->code = ev->wire_error;
  e->sent = ev->wire_error_sent;
  e->retry = ev->retry;
  e->destination = ev->destination;
  snprintf(e->message, sizeof e->message, "%s", ev->message);
  snprintf(e->fallback, sizeof e->fallback, "%s", ev->fallback);
  if (ev->kind == HR_RDMA_EV_DATA_READY)
    assert_int_equal(
        hr_rdma_commit(x, p->commit_code ? p->commit_code - 1 : 0, "refused"),
        0);
}

static void release(void *ctx) {
  fpeer *p = ctx;
  p->released++;
}

static const hr_rdma_callbacks cbs = {sizeof(hr_rdma_callbacks), send_msg,
                                      on_event};

void fp_begin(fpeer *p, int side, int dir, uint32_t stream,
              const hr_descriptor *d, uint64_t total, void *const *buffers,
              int register_destination) {
  hr_rdma_config c;
  memset(&c, 0, sizeof c);
  c.side = side;
  c.direction = dir;
  c.stream_id = stream;
  c.desc = d;
  c.total_data_bytes = total;
  c.buffers = buffers;
  c.register_destination = register_destination;
  c.release = release;
  c.release_ctx = p;
  p->nev = 0;
  p->released = 0;
  p->nsent = 0;
  char why[256];
  hr_wire_status st;
  int rv = hr_rdma_new(&p->x, p->conn, &c, &cbs, p, NULL, &st, why, sizeof why);
  if (rv)
    fail_msg("%s: hr_rdma_new: %s: %s", p->name, hr_strerror(rv), why);
  assert_int_equal(hr_rdma_start(p->x), 0);
}

static void read_ctl(fpeer *p) {
  for (;;) {
    uint8_t buf[4096];
    ssize_t n = recv(p->ctl, buf, sizeof buf, 0);
    if (n < 0) {
      assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
      return;
    }
    if (n == 0)
      return;
    hr_msg m;
    hr_wire_status st;
    if (hr_wire_decode(buf, (size_t)n, NULL, &m, &st) != 0)
      fail_msg("%s: undecodable message: %s", p->name, st.reason);
    if (p->x) {
      int rv = hr_rdma_on_msg(p->x, &m);
      assert_true(rv == 0 || rv == HR_ERR_STATE);
    }
  }
}

void fp_turn(fpeer *const *peers, int n, int max_ms) {
  struct pollfd pfd[8];
  int owner[8];
  int np = 0;
  hr_tstamp now = fp_now();
  hr_tstamp due = now + (hr_tstamp)max_ms * 1000000u;
  for (int i = 0; i < n; i++) {
    const fpeer *p = peers[i];
    pfd[np] = (struct pollfd){p->ctl, POLLIN, 0};
    owner[np++] = i;
    int fd = hr_fabric_fd(p->f);
    if (fd >= 0) {
      pfd[np] = (struct pollfd){fd, POLLIN, 0};
      owner[np++] = i;
    }
    hr_tstamp e = hr_fabric_get_expiry(p->f);
    if (e < due)
      due = e;
  }
  struct timespec ts = {0, 0};
  if (due > now) {
    ts.tv_sec = (time_t)((due - now) / 1000000000u);
    ts.tv_nsec = (long)((due - now) % 1000000000u);
  }
  int rv = ppoll(pfd, (nfds_t)np, &ts, NULL);
  assert_true(rv >= 0 || errno == EINTR);
  int touched[8] = {0};
  for (int k = 0; k < np; k++)
    if (pfd[k].revents)
      touched[owner[k]] = 1;
  now = fp_now();
  for (int i = 0; i < n; i++) {
    fpeer *p = peers[i];
    read_ctl(p);
    if (touched[i] || hr_fabric_get_expiry(p->f) <= now)
      assert_int_equal(hr_fabric_progress(p->f, now), 0);
  }
}

static int finished(const fpeer *p) {
  if (!p->x)
    return 1;
  int s = hr_rdma_state(p->x);
  return (s == HR_RDMA_ST_DONE || s == HR_RDMA_ST_FAILED) && p->released;
}

void fp_run(fpeer *const *peers, int n, double seconds) {
  hr_tstamp end = fp_now() + (hr_tstamp)(seconds * 1e9);
  for (;;) {
    int all = 1;
    for (int i = 0; i < n; i++)
      all &= finished(peers[i]);
    if (all) {
      /* One more turn: the other side may still have messages queued. */
      fp_turn(peers, n, 0);
      return;
    }
    if (fp_now() > end) {
      for (int i = 0; i < n; i++)
        print_message("%s: state %s, released %d\n", peers[i]->name,
                      hr_rdma_state_name(hr_rdma_state(peers[i]->x)),
                      peers[i]->released);
      fail_msg("transfer did not finish in %.0f s", seconds);
    }
    fp_turn(peers, n, 100);
  }
}

void fp_close(fpeer *p) {
  hr_rdma_del(p->x);
  p->x = NULL;
  hr_rdma_conn_del(p->conn);
  p->conn = NULL;
  /* Whatever was cancelled completes within a few turns. */
  hr_tstamp end = fp_now() + 20000000000ull;
  while (hr_fabric_busy(p->f) && fp_now() < end) {
    fpeer *one[1] = {p};
    fp_turn(one, 1, 10);
  }
  assert_int_equal(hr_fabric_del(p->f), 0);
  p->f = NULL;
  if (p->ctl >= 0)
    close(p->ctl);
  p->ctl = -1;
}

void fp_desc(hr_descriptor *d, unsigned n, const uint64_t *sizes,
             const uint8_t *align_log2) {
  memset(d, 0, sizeof *d);
  d->descriptor_version = 1;
  d->element_type = HR_ELEM_UINT8;
  d->rank = 1;
  d->layout.tag = HR_LAYOUT_ROW_MAJOR;
  d->buffer_count = (uint8_t)n;
  for (unsigned k = 0; k < n; k++) {
    d->buffers[k].size_bytes = sizes[k];
    d->buffers[k].alignment_log2 = align_log2 ? align_log2[k] : 0;
    d->shape[0] += sizes[k];
  }
}

void fp_buffers(uint8_t **bufs, unsigned n, const uint64_t *sizes,
                unsigned seed) {
  /* One block, buffers back to back (gap-free placement), as
   * hr_tensor_alloc() lays a tensor out: one registration covers it. */
  uint64_t total = 0;
  for (unsigned k = 0; k < n; k++)
    total += sizes[k];
  uint8_t *block = malloc(total ? total : 1);
  assert_non_null(block);
  for (unsigned k = 0; k < n; k++) {
    bufs[k] = block;
    block += sizes[k];
    if (!seed) {
      memset(bufs[k], 0, sizes[k]);
      continue;
    }
    uint32_t x = seed * 2654435761u + k;
    for (uint64_t i = 0; i < sizes[k]; i++) {
      x = x * 1664525u + 1013904223u;
      bufs[k][i] = (uint8_t)(x >> 24);
    }
  }
}
