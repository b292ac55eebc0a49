/*
 * fabric_bench: the RDMA data plane against raw libfabric, on loopback.
 *
 * For each provider (tcp;ofi_rxm and shm by default) two processes (fork)
 * move a region (1 GiB by default) from the parent to the child:
 *
 *  1. raw: plain libfabric, fi_writemsg of 4 MiB pieces, 16 in flight,
 *     FI_DELIVERY_COMPLETE where the provider has it (as the data plane
 *     uses), both sides busy-polling their completion queues, and again
 *     either (providers with a CQ wait fd) both sides blocking in poll()
 *     after fi_trywait, or (without one) both sides sleeping 50 us when
 *     the queue is empty, as the engine's loop does; timed from the first
 *     post to the last completion; the better variant is the reference
 *     (on a loaded machine, busy-polling loses to the sleepers);
 *  2. hurray, RMA write: the same bytes through libhurray's data plane:
 *     hr_fabric (registration cache, CQ fd / timer loop), hr_rdma_conn and
 *     the hr_rdma handshake on both sides (SOURCE, DESTINATION, READY,
 *     DATA_END), messages wire-encoded over a socketpair; timed from
 *     hr_rdma_new() (source registration) to the sender's COMPLETE, so the
 *     handshake and the registrations are included;
 *  3. hurray, tagged: the same without the destination registration;
 *  4. hurray, engine GET: a server process (store, engine with the same
 *     provider, libevent loop) and the blocking hr_client: the whole region
 *     as one tensor over the TCP control connection and the RDMA data
 *     plane into an application buffer (huge pages advised and every page
 *     touched beforehand, as raw's); timed around hr_client_get(),
 *     checked byte for byte.  The first GET (the data plane's connection
 *     and first registrations included) is reported on its own, beside
 *     raw's first pass, then the median of the next ITERS (steady state).
 *
 * 1 and 4 are interleaved: both raw variants and the engine stay set up,
 * and each pass runs every raw variant and one GET, alternating which goes
 * first, so that load that comes and goes meets both alike; the ratio is
 * taken pass by pass (against that pass's better raw variant, and against
 * each variant) and its median printed, with the CPU seconds per GiB of
 * both processes of each (the load of a shared machine stretches wall
 * time, not CPU time).  Idle raw targets block on their control socket;
 * the engine's server must use no CPU while raw runs (printed).  No
 * process shares the source copy-on-write with the raw initiator: shm's
 * process_vm_readv would pay for it.
 *
 * In 2 and 3 the control messages go over a socketpair, which the output
 * says.  The destination registration is
 * forced (both peers are given RDMA_GPUDIRECT although these providers
 * reach no device memory) so that the RMA-write path runs on host memory.
 *
 * Usage: fabric_bench [-p PROVIDER]... [-s BYTES] [-c CHUNK] [-w WINDOW]
 *                     [-n ITERS] [-m PARTS]
 * PARTS: any of r (raw), l (the data plane alone), e (engine GET);
 * default rle.
 * Only loopback addresses are used.
 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include <hurray/client.h>
#include <hurray/engine.h>
#include <hurray/fabric.h>
#include <hurray/hr_event.h>
#include <hurray/store.h>

#define MAX_ITERS 16

static uint64_t opt_size = 1ull << 30;
static uint64_t opt_chunk = 4ull << 20;
static uint32_t opt_window = 16;
static int opt_iters = 3;
static const char *opt_parts = "rle"; /* r: raw, l: data plane, e: engine */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static hr_tstamp now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (hr_tstamp)ts.tv_sec * 1000000000u + (hr_tstamp)ts.tv_nsec;
}

/* CPU time of every thread of `pid` (0: this process) in seconds, from
 * /proc/PID/task/TID/schedstat (nanoseconds on the CPU): the loaded
 * machine stretches wall time, CPU seconds per GiB stay comparable. */
static double cpu_s(pid_t pid) {
  char dir[64], path[128];
  snprintf(dir, sizeof dir, "/proc/%d/task", pid ? (int)pid : (int)getpid());
  DIR *d = opendir(dir);
  if (!d)
    return 0;
  double total = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.')
      continue;
    snprintf(path, sizeof path, "%s/%.32s/schedstat", dir, de->d_name);
    FILE *fp = fopen(path, "r");
    unsigned long long ns;
    if (!fp)
      continue;
    if (fscanf(fp, "%llu", &ns) == 1)
      total += (double)ns * 1e-9;
    fclose(fp);
  }
  closedir(d);
  return total;
}

static void die(const char *what, const char *detail) {
  fprintf(stderr, "fabric_bench: %s: %s\n", what, detail);
  exit(1);
}

static void *big_buffer(uint64_t n, int fill) {
  void *p =
      mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    die("mmap", strerror(errno));
  madvise(p, n, MADV_HUGEPAGE);
  /* Touch every page before timing. */
  memset(p, fill, n);
  return p;
}

/* ---- control channel: length-delimited datagrams ---- */

static void ctl_send(int fd, const void *p, size_t n) {
  if (send(fd, p, n, 0) != (ssize_t)n)
    die("control send", strerror(errno));
}

static size_t ctl_recv(int fd, void *p, size_t cap) {
  ssize_t n = recv(fd, p, cap, 0);
  if (n < 0)
    die("control recv", strerror(errno));
  return (size_t)n;
}

/* ------------------------------------------------------------------------ */
/* 1. raw libfabric                                                          */
/* ------------------------------------------------------------------------ */

typedef struct raw {
  struct fi_info *info;
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_cq *cq;
  struct fid_av *av;
  struct fid_ep *ep;
  int dc;      /* FI_DELIVERY_COMPLETE granted */
  int wait_fd; /* -1: busy-polling */
} raw;

static void raw_check(int rv, const char *what) {
  if (rv)
    die(what, fi_strerror(-rv));
}

/* Opens an endpoint; `wait` asks for a CQ wait fd (the blocking variant),
 * else the CQ is busy-polled. */
static void raw_open(raw *r, const char *prov, int wait) {
  struct fi_info *h = fi_allocinfo();
  for (int dc = 1; dc >= 0; dc--) {
    h->caps = FI_RMA;
    h->ep_attr->type = FI_EP_RDM;
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                              FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->tx_attr->op_flags = dc ? FI_DELIVERY_COMPLETE : 0;
    free(h->fabric_attr->prov_name);
    h->fabric_attr->prov_name = strdup(prov);
    int rv = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION),
                        strcmp(prov, "shm") ? "127.0.0.1" : NULL, NULL, 0, h,
                        &r->info);
    if (rv == 0) {
      r->dc = dc;
      break;
    }
    if (!dc)
      die("fi_getinfo", fi_strerror(-rv));
  }
  fi_freeinfo(h);
  raw_check(fi_fabric(r->info->fabric_attr, &r->fabric, NULL), "fi_fabric");
  raw_check(fi_domain(r->fabric, r->info, &r->domain, NULL), "fi_domain");
  struct fi_cq_attr ca;
  memset(&ca, 0, sizeof ca);
  ca.format = FI_CQ_FORMAT_CONTEXT;
  ca.wait_obj = wait == 1 ? FI_WAIT_FD : FI_WAIT_NONE;
  raw_check(fi_cq_open(r->domain, &ca, &r->cq, NULL), "fi_cq_open");
  r->wait_fd = -1;
  if (wait == 1)
    raw_check(fi_control(&r->cq->fid, FI_GETWAIT, &r->wait_fd), "FI_GETWAIT");
  struct fi_av_attr aa;
  memset(&aa, 0, sizeof aa);
  aa.type = r->info->domain_attr->av_type;
  raw_check(fi_av_open(r->domain, &aa, &r->av, NULL), "fi_av_open");
  raw_check(fi_endpoint(r->domain, r->info, &r->ep, NULL), "fi_endpoint");
  raw_check(fi_ep_bind(r->ep, &r->av->fid, 0), "fi_ep_bind av");
  raw_check(fi_ep_bind(r->ep, &r->cq->fid, FI_TRANSMIT | FI_RECV),
            "fi_ep_bind cq");
  raw_check(fi_enable(r->ep), "fi_enable");
}

/* wait 2: the CQ found empty, sleep for the data plane's poll interval
 * (what a loop without a wait fd does instead of spinning). */
static void raw_nap(void) {
  struct timespec ts = {0, 50000};
  nanosleep(&ts, NULL);
}

/* Blocks until the CQ (or `ctl`, when >= 0) has something: fi_trywait,
 * then poll. */
static void raw_block(raw *r, int ctl) {
  struct fid *fids[1] = {&r->cq->fid};
  if (fi_trywait(r->fabric, fids, 1) != 0)
    return;
  struct pollfd pfd[2] = {{r->wait_fd, POLLIN, 0}, {ctl, POLLIN, 0}};
  poll(pfd, ctl >= 0 ? 2 : 1, 1000);
}

static struct fid_mr *raw_reg(raw *r, void *p, uint64_t n, uint64_t access,
                              uint64_t key) {
  struct fid_mr *mr;
  raw_check(fi_mr_reg(r->domain, p, n, access, 0, key, 0, &mr, NULL),
            "fi_mr_reg");
  if (r->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    raw_check(fi_mr_bind(mr, &r->ep->fid, 0), "fi_mr_bind");
    raw_check(fi_mr_enable(mr), "fi_mr_enable");
  }
  return mr;
}

static void raw_close(raw *r) {
  fi_close(&r->ep->fid);
  fi_close(&r->av->fid);
  fi_close(&r->cq->fid);
  fi_close(&r->domain->fid);
  fi_close(&r->fabric->fid);
  fi_freeinfo(r->info);
}

typedef struct raw_hello {
  uint64_t addr, key;
  size_t name_len;
  uint8_t name[256];
} raw_hello;

/* The child: registers the destination, then progresses until told. */
static void raw_target(int ctl, const char *prov, int wait) {
  raw r;
  raw_open(&r, prov, wait);
  uint8_t *dst = big_buffer(opt_size, 0);
  struct fid_mr *mr = raw_reg(&r, dst, opt_size, FI_REMOTE_WRITE, 0x5eed);
  raw_hello h;
  memset(&h, 0, sizeof h);
  h.name_len = sizeof h.name;
  raw_check(fi_getname(&r.ep->fid, h.name, &h.name_len), "fi_getname");
  h.key = fi_mr_key(mr);
  h.addr = r.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR
               ? (uint64_t)(uintptr_t)dst
               : 0;
  ctl_send(ctl, &h, sizeof h);
  /* Between passes (and while the engine's GETs run) the target blocks on
   * the control socket: 'g' starts a pass, which runs until the next
   * message ('i': idle again, 'd': done). */
  char c;
  for (;;) {
    ctl_recv(ctl, &c, 1);
    if (c == 'd')
      break;
    if (c != 'g')
      continue;
    /* Busy-poll: manual-progress providers move the data on the target
     * only while it reads its CQ. */
    struct pollfd pfd = {ctl, POLLIN, 0};
    for (unsigned spin = 0;; spin++) {
      struct fi_cq_entry e[8];
      ssize_t got = fi_cq_read(r.cq, e, 8);
      /* Look at the control socket only now and then: a syscall per turn
       * would slow the target down. */
      if ((wait || (spin & 1023) == 0) && poll(&pfd, 1, 0) > 0)
        break;
      if (wait == 1 && got == -FI_EAGAIN)
        raw_block(&r, ctl);
      if (wait == 2 && got == -FI_EAGAIN)
        raw_nap();
    }
  }
  /* Check a sample of the bytes. */
  for (uint64_t i = 0; i < opt_size; i += 4093)
    if (dst[i] != (uint8_t)(i * 131 + 7))
      die("raw", "the bytes differ");
  c = 'v';
  ctl_send(ctl, &c, 1);
  fi_close(&mr->fid);
  raw_close(&r);
  munmap(dst, opt_size);
}

typedef struct slot {
  struct fi_context2 ctx;
  int busy;
} slot;

/* The initiator's side of one raw variant, kept open across the
 * interleaved passes. */
typedef struct raw_init {
  raw r;
  int ctl;
  int wait;
  uint8_t *src;
  raw_hello h;
  fi_addr_t peer;
  struct fid_mr *mr;
  void *desc;
  slot *slots;
  pid_t target;  /* the target's process */
  double cpu[2]; /* the last pass's CPU seconds: initiator, target */
} raw_init;

static void raw_init_open(raw_init *ri, int ctl, const char *prov, int wait,
                          uint8_t *src) {
  memset(ri, 0, sizeof *ri);
  ri->ctl = ctl;
  ri->wait = wait;
  ri->src = src;
  raw_open(&ri->r, prov, wait);
  ctl_recv(ctl, &ri->h, sizeof ri->h);
  if (fi_av_insert(ri->r.av, ri->h.name, 1, &ri->peer, 0, NULL) != 1)
    die("fi_av_insert", "failed");
  ri->mr = raw_reg(&ri->r, src, opt_size, FI_WRITE, 0x5eee);
  ri->desc = fi_mr_desc(ri->mr);
  ri->slots = calloc(opt_window, sizeof *ri->slots);
  if (!ri->slots)
    die("raw", "out of memory");
}

/* One pass: the whole region in pieces, timed from the first post to the
 * last completion.  Returns GB/s. */
static double raw_pass(raw_init *ri) {
  raw *r = &ri->r;
  uint64_t posted = 0, done = 0, n = (opt_size + opt_chunk - 1) / opt_chunk;
  char c = 'g';
  double c0 = cpu_s(0), c1 = cpu_s(ri->target);
  ctl_send(ri->ctl, &c, 1);
  double t0 = now_s();
  while (done < n) {
    for (uint32_t k = 0; k < opt_window && posted < n; k++) {
      if (ri->slots[k].busy)
        continue;
      uint64_t off = posted * opt_chunk;
      uint64_t len = opt_size - off < opt_chunk ? opt_size - off : opt_chunk;
      struct iovec iov = {ri->src + off, len};
      struct fi_rma_iov rma = {ri->h.addr + off, len, ri->h.key};
      struct fi_msg_rma m = {&iov, &ri->desc,         1, ri->peer, &rma,
                             1,    &ri->slots[k].ctx, 0};
      ssize_t rv = fi_writemsg(
          r->ep, &m, FI_COMPLETION | (r->dc ? FI_DELIVERY_COMPLETE : 0));
      if (rv == -FI_EAGAIN)
        break;
      raw_check((int)rv, "fi_writemsg");
      ri->slots[k].busy = 1;
      posted++;
    }
    struct fi_cq_entry e[16];
    ssize_t got = fi_cq_read(r->cq, e, 16);
    if (got == -FI_EAVAIL) {
      struct fi_cq_err_entry err;
      memset(&err, 0, sizeof err);
      fi_cq_readerr(r->cq, &err, 0);
      die("raw write", fi_strerror(err.err));
    }
    for (ssize_t i = 0; i < got; i++) {
      ((slot *)e[i].op_context)->busy = 0;
      done++;
    }
    if (ri->wait == 1 && got == -FI_EAGAIN)
      raw_block(r, -1);
    if (ri->wait == 2 && got == -FI_EAGAIN)
      raw_nap();
  }
  double gbs = (double)opt_size / (now_s() - t0) / 1e9;
  c = 'i';
  ctl_send(ri->ctl, &c, 1);
  /* The target has stopped polling once it answers nothing more: its CPU
   * time is read after the pass's end reached it. */
  ri->cpu[0] = cpu_s(0) - c0;
  ri->cpu[1] = cpu_s(ri->target) - c1;
  return gbs;
}

/* Tells the target to check the bytes and end, then closes. */
static void raw_init_close(raw_init *ri) {
  char c = 'd';
  ctl_send(ri->ctl, &c, 1);
  ctl_recv(ri->ctl, &c, 1);
  free(ri->slots);
  fi_close(&ri->mr->fid);
  raw_close(&ri->r);
}

/* ------------------------------------------------------------------------ */
/* 2, 3. through the data plane                                              */
/* ------------------------------------------------------------------------ */

typedef struct side {
  int ctl;
  hr_fabric *f;
  hr_rdma_conn *conn;
  hr_rdma *x;
  uint32_t stream; /* receiver: the stream of x */
  int started;     /* receiver: transfers begun */
  int completes;   /* COMPLETE events so far */
  int complete;
  int failed;
  int released;
  char why[300];
} side;

static int cb_send(hr_rdma *x, const hr_msg *m, void *ud) {
  side *s = ud;
  (void)x;
  uint8_t buf[2048];
  int64_t n = hr_wire_encode(m, buf, sizeof buf);
  if (n <= 0)
    die("hr_wire_encode", "failed");
  ctl_send(s->ctl, buf, (size_t)n);
  return 0;
}

static void cb_event(hr_rdma *x, const hr_rdma_event *ev, void *ud) {
  side *s = ud;
  (void)x;
  if (ev->kind == HR_RDMA_EV_COMPLETE) {
    s->complete = 1;
    s->completes++;
  }
  if (ev->kind == HR_RDMA_EV_FAILED) {
    s->failed = 1;
    snprintf(s->why, sizeof s->why, "%s (%s)", ev->message,
             hr_wire_error_name(ev->wire_error));
  }
}

static void cb_release(void *ctx) {
  ((side *)ctx)->released = 1;
}

static const hr_rdma_callbacks cbs = {sizeof(hr_rdma_callbacks), cb_send,
                                      cb_event};

static void side_open(side *s, int ctl, const char *prov) {
  memset(s, 0, sizeof *s);
  s->ctl = ctl;
  hr_fabric_config c;
  hr_fabric_config_default(&c);
  c.provider = prov;
  c.node = "127.0.0.1";
  c.rma_chunk = opt_chunk;
  c.window = opt_window;
  char why[256];
  if (hr_fabric_new(&s->f, &c, NULL, why, sizeof why))
    die("hr_fabric_new", why);
}

/* Exchanges FABRIC_ADDRESS values and makes the connection. */
static void side_connect(side *s) {
  uint8_t mine[600], theirs[600];
  int64_t n = hr_fabric_address(s->f, mine, sizeof mine);
  ctl_send(s->ctl, mine, (size_t)n);
  size_t m = ctl_recv(s->ctl, theirs, sizeof theirs);
  uint16_t plen = (uint16_t)(theirs[0] | theirs[1] << 8);
  uint16_t elen = (uint16_t)(theirs[2 + plen] | theirs[3 + plen] << 8);
  if (m != 4u + plen + elen)
    die("FABRIC_ADDRESS", "malformed");
  hr_rdma_conn_config cc;
  uint32_t caps = HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT;
  hr_rdma_conn_config_init(&cc, hr_fabric_get_ops(), s->f, caps, NULL);
  cc.peer_caps = caps;
  cc.peer_provider = theirs + 2;
  cc.peer_provider_len = plen;
  cc.peer_endpoint = theirs + 4 + plen;
  cc.peer_endpoint_len = elen;
  if (hr_rdma_conn_new(&s->conn, &cc, NULL))
    die("hr_rdma_conn_new", "failed");
  const char *why;
  if (!hr_rdma_conn_usable(s->conn, &why))
    die("connection", why);
}

static void one_desc(hr_descriptor *d) {
  memset(d, 0, sizeof *d);
  d->descriptor_version = 1;
  d->element_type = HR_ELEM_UINT8;
  d->rank = 1;
  d->shape[0] = opt_size;
  d->layout.tag = HR_LAYOUT_ROW_MAJOR;
  d->buffer_count = 1;
  d->buffers[0].size_bytes = opt_size;
  d->buffers[0].alignment_log2 = 12;
}

/* One loop turn, as the engine runs it: wait for the control socket, the
 * CQ fd or the fabric's deadline; then handle. */
static void turn(side *s, int receiver, hr_descriptor *d, void *buf) {
  struct pollfd pfd[2] = {{s->ctl, POLLIN, 0}, {hr_fabric_fd(s->f), POLLIN, 0}};
  int n = pfd[1].fd >= 0 ? 2 : 1;
  hr_tstamp now = now_ns();
  hr_tstamp due = hr_fabric_get_expiry(s->f);
  struct timespec ts = {0, 100000000};
  if (due != HR_TSTAMP_NEVER) {
    hr_tstamp w = due > now ? due - now : 0;
    ts.tv_sec = (time_t)(w / 1000000000u);
    ts.tv_nsec = (long)(w % 1000000000u);
  }
  ppoll(pfd, (nfds_t)n, &ts, NULL);
  if (pfd[0].revents) {
    uint8_t msg[4096];
    size_t len = ctl_recv(s->ctl, msg, sizeof msg);
    hr_msg m;
    hr_wire_status st;
    if (hr_wire_decode(msg, len, NULL, &m, &st))
      die("hr_wire_decode", st.reason);
    if (receiver && s->x && m.hdr.stream_id != s->stream) {
      /* The previous transfer is over (the sender only starts the next
       * one after its DATA_END). */
      if (s->failed)
        die("receiver", s->why);
      hr_rdma_del(s->x);
      s->x = NULL;
    }
    if (receiver && !s->x) {
      /* The first message of a transfer: as a session would on the
       * descriptor, make the receiving handshake.  The first series (a
       * warm-up and opt_iters transfers) registers a destination, the
       * second goes tagged. */
      int want_dest = s->started++ < opt_iters + 1;
      s->stream = m.hdr.stream_id;
      hr_rdma_config c;
      memset(&c, 0, sizeof c);
      c.side = HR_RDMA_RECEIVER;
      c.direction = HR_RDMA_GET;
      c.stream_id = m.hdr.stream_id;
      c.desc = d;
      c.total_data_bytes = opt_size;
      c.buffers = &buf;
      c.register_destination = want_dest;
      c.release = cb_release;
      c.release_ctx = s;
      char why[256];
      if (hr_rdma_new(&s->x, s->conn, &c, &cbs, s, NULL, &st, why,
                      sizeof why) ||
          hr_rdma_start(s->x))
        die("receiver", why);
    }
    if (s->x)
      hr_rdma_on_msg(s->x, &m);
  }
  hr_fabric_progress(s->f, now_ns());
}

static void layer_target(int ctl, const char *prov) {
  side s;
  side_open(&s, ctl, prov);
  side_connect(&s);
  uint8_t *dst = big_buffer(opt_size, 0);
  hr_descriptor d;
  one_desc(&d);
  while (s.completes < 2 * (opt_iters + 1) || !s.released) {
    turn(&s, 1, &d, dst);
    if (s.failed)
      die("receiver", s.why);
  }
  hr_rdma_del(s.x);
  s.x = NULL;
  for (uint64_t i = 0; i < opt_size; i += 4093)
    if (dst[i] != (uint8_t)(i * 131 + 7))
      die("hurray", "the bytes differ");
  char c = 'v';
  ctl_send(ctl, &c, 1);
  hr_rdma_conn_del(s.conn);
  while (hr_fabric_busy(s.f))
    hr_fabric_progress(s.f, now_ns());
  hr_fabric_del(s.f);
  munmap(dst, opt_size);
}

static void layer_initiator(int ctl, const char *prov, uint8_t *src,
                            double runs[2][MAX_ITERS], hr_fabric_stats *st) {
  side s;
  side_open(&s, ctl, prov);
  side_connect(&s);
  hr_descriptor d;
  one_desc(&d);
  void *bufs[1] = {src};
  uint32_t stream = 1;
  for (int pass = 0; pass < 2; pass++) {
    /* Pass -1 of each series warms up and is not counted. */
    for (int it = -1; it < opt_iters; it++) {
      s.complete = s.failed = s.released = 0;
      hr_rdma_config c;
      memset(&c, 0, sizeof c);
      c.side = HR_RDMA_SENDER;
      c.direction = HR_RDMA_GET;
      c.stream_id = stream;
      stream += 2;
      c.desc = &d;
      c.total_data_bytes = opt_size;
      c.buffers = bufs;
      c.release = cb_release;
      c.release_ctx = &s;
      char why[256];
      hr_wire_status wst;
      double t0 = now_s();
      if (hr_rdma_new(&s.x, s.conn, &c, &cbs, &s, NULL, &wst, why,
                      sizeof why) ||
          hr_rdma_start(s.x))
        die("sender", why);
      while (!((s.complete || s.failed) && s.released))
        turn(&s, 0, &d, src);
      double t = now_s() - t0;
      if (s.failed)
        die("sender", s.why);
      if (it >= 0)
        runs[pass][it] = (double)opt_size / t / 1e9;
      hr_rdma_del(s.x);
      s.x = NULL;
    }
  }
  char c;
  ctl_recv(ctl, &c, 1);
  hr_fabric_get_stats(s.f, st);
  hr_rdma_conn_del(s.conn);
  while (hr_fabric_busy(s.f))
    hr_fabric_progress(s.f, now_ns());
  hr_fabric_del(s.f);
}

/* ------------------------------------------------------------------------ */

static double best_of(const double *r, int n) {
  double b = 0;
  for (int i = 0; i < n; i++)
    if (r[i] > b)
      b = r[i];
  return b;
}

static void print_runs(const double *r, int n) {
  printf(" (runs:");
  for (int i = 0; i < n; i++)
    printf(" %.2f", r[i]);
  printf(")");
}

/* The engine GET's client (4), kept open across the interleaved passes. */
typedef struct engine_cl {
  hr_client *c;
  hr_get_opts g;
  hr_get_dest dest;
  uint8_t *buf;
  const uint8_t *src;
  pid_t server;
  int ctl;
  double cpu[2]; /* the last GET's CPU seconds: client, server */
} engine_cl;
static void engine_open(engine_cl *ec, const char *prov, const uint8_t *src);
static double engine_pass(engine_cl *ec);
static void engine_close(engine_cl *ec);
static void layer_bench(const char *prov, uint8_t *src, double raw_best);

static double median_of(const double *r, int n) {
  double s[MAX_ITERS];
  memcpy(s, r, (size_t)n * sizeof *s);
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
      double t = s[j];
      s[j] = s[j - 1];
      s[j - 1] = t;
    }
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static int bench(const char *prov) {
  /* Is the provider here at all? */
  hr_fabric_config c;
  hr_fabric_config_default(&c);
  c.provider = prov;
  c.node = "127.0.0.1";
  hr_fabric *probe;
  char why[256];
  if (hr_fabric_new(&probe, &c, NULL, why, sizeof why)) {
    printf("%s: skipped (%s)\n", prov, why);
    return 0;
  }
  hr_fabric_stats ps;
  hr_fabric_get_stats(probe, &ps);
  hr_fabric_del(probe);

  uint8_t *src = big_buffer(opt_size, 0);
  for (uint64_t i = 0; i < opt_size; i++)
    src[i] = (uint8_t)(i * 131 + 7);
  printf("\n== %s: %.2f GiB, %.0f KiB pieces, %u in flight; %s; %s\n", prov,
         (double)opt_size / (1 << 30), (double)opt_chunk / 1024, opt_window,
         ps.wait_fd ? "CQ wait fd + fi_trywait" : "no wait fd: timer polling",
         ps.delivery_complete ? "FI_DELIVERY_COMPLETE" : "transmit complete");
  /* What the engine's GET posts: host memory and no RDMA_GPUDIRECT on
   * these providers, so no DESTINATION: tagged sends into posted
   * receives, cut by hr_fabric_tag_piece(), all signalled. */
  uint64_t tp = hr_fabric_tag_piece(prov, opt_size);
  uint64_t tn = (opt_size + tp - 1) / tp;
  printf("engine GET: tagged sends of %.0f MiB (%llu), %llu in flight "
         "(%s), every piece FI_COMPLETION\n",
         (double)tp / (1 << 20), (unsigned long long)tn,
         (unsigned long long)(ps.send_ordered ? (tn < 16 ? tn : 16) : 1),
         ps.send_ordered ? "FI_ORDER_SAS" : "no FI_ORDER_SAS: one at a time");

  /* 1 and 4 interleaved: raw (busy-polling, and either blocking in poll()
   * as an event loop does or, without a wait fd, napping 50 us) and the
   * engine's GET take turns, pass by pass, so that a load that comes and
   * goes on the machine meets both alike.  The better raw variant of each
   * pass is that pass's reference. */
  static const char *const raw_names[3] = {"busy-polling  ", "poll + trywait",
                                           "50 us naps    "};
  raw_init ri[3];
  pid_t rpid[3];
  int rvar[3], nv = 0, status;
  for (int wait = 0; strchr(opt_parts, 'r') && wait <= 2; wait++) {
    int sv[2];
    if (wait == 1 && !ps.wait_fd)
      continue; /* no wait fd to block on */
    if (wait == 2 && ps.wait_fd)
      continue; /* the data plane blocks on the fd: so does raw */
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv))
      die("socketpair", strerror(errno));
    fflush(stdout);
    rpid[nv] = fork();
    if (rpid[nv] == 0) {
      close(sv[0]);
      munmap(src, opt_size);
      raw_target(sv[1], prov, wait);
      _exit(0);
    }
    close(sv[1]);
    raw_init_open(&ri[nv], sv[0], prov, wait, src);
    ri[nv].target = rpid[nv];
    rvar[nv++] = wait;
  }
  int eng = strchr(opt_parts, 'e') != NULL;
  engine_cl ecl;
  if (eng)
    engine_open(&ecl, prov, src);

  /* Pass -1: the first (connections, first registrations, first
   * touches), reported apart; then opt_iters passes, the order of raw and
   * engine alternating. */
  double rfirst[3] = {0}, rruns[3][MAX_ITERS], efirst = 0, eruns[MAX_ITERS];
  double ratio[MAX_ITERS], best_pass[MAX_ITERS];
  /* CPU seconds per GiB, [initiator/client, target/server][pass]. */
  double gib = (double)opt_size / (1 << 30);
  double rcpu[3][2][MAX_ITERS], ecpu[2][MAX_ITERS];
  double idle_cpu = 0, idle_wall = 0;
  double vratio[3][MAX_ITERS]; /* engine / each raw variant, pass by pass */
  for (int it = -1; it < opt_iters; it++) {
    double e = 0, rb = 0;
    if (eng && it % 2 != 0)
      e = engine_pass(&ecl);
    double idle0 = eng ? cpu_s(ecl.server) : 0, idle_t0 = now_s();
    for (int v = 0; v < nv; v++) {
      double g = raw_pass(&ri[v]);
      if (it < 0) {
        rfirst[v] = g;
      } else {
        rruns[v][it] = g;
        rcpu[v][0][it] = ri[v].cpu[0] / gib;
        rcpu[v][1][it] = ri[v].cpu[1] / gib;
      }
      if (g > rb)
        rb = g;
    }
    if (eng) {
      /* The engine's processes must be asleep while raw runs. */
      idle_cpu += cpu_s(ecl.server) - idle0;
      idle_wall += now_s() - idle_t0;
    }
    if (eng && it % 2 == 0)
      e = engine_pass(&ecl);
    if (it < 0) {
      efirst = e;
      continue;
    }
    eruns[it] = e;
    for (int v = 0; v < nv; v++)
      vratio[v][it] = rruns[v][it] > 0 ? e / rruns[v][it] : 0;
    if (eng) {
      ecpu[0][it] = ecl.cpu[0] / gib;
      ecpu[1][it] = ecl.cpu[1] / gib;
    }
    best_pass[it] = rb;
    ratio[it] = rb > 0 ? e / rb : 0;
  }
  for (int v = 0; v < nv; v++) {
    raw_init_close(&ri[v]);
    close(ri[v].ctl);
    waitpid(rpid[v], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status))
      die("raw", "the target failed");
  }
  if (eng)
    engine_close(&ecl);

  double raw_best = 0, raw_first = 0;
  for (int v = 0; v < nv; v++) {
    double b = best_of(rruns[v], opt_iters);
    printf("raw fi_writemsg (%s): best %6.2f GB/s, median %.2f; first pass "
           "%.2f",
           raw_names[rvar[v]], b, median_of(rruns[v], opt_iters), rfirst[v]);
    print_runs(rruns[v], opt_iters);
    printf("\n    CPU s/GiB (median): initiator %.2f, target %.2f\n",
           median_of(rcpu[v][0], opt_iters), median_of(rcpu[v][1], opt_iters));
    if (b > raw_best)
      raw_best = b;
    if (rfirst[v] > raw_first)
      raw_first = rfirst[v];
  }
  double raw_med = nv ? median_of(best_pass, opt_iters) : 0;
  if (eng) {
    /* 4. the engine: a GET over its TCP control connection and the data
     * plane, tagged (no destination registration: these providers reach
     * no device memory, so the sessions never advertise
     * RDMA_GPUDIRECT). */
    double med = median_of(eruns, opt_iters);
    printf("hurray engine GET, first:       %6.2f GB/s", efirst);
    if (nv)
      printf(", %.2f of raw's first pass (%.2f)", efirst / raw_first,
             raw_first);
    printf("\nhurray engine GET, steady state: median %6.2f GB/s, best %.2f",
           med, best_of(eruns, opt_iters));
    print_runs(eruns, opt_iters);
    if (nv)
      printf("\n  vs raw, pass by pass (the better raw variant of each "
             "pass): median ratio %.2f; median engine / median raw %.2f / "
             "%.2f = %.2f; best / best %.2f",
             median_of(ratio, opt_iters), med, raw_med, med / raw_med,
             best_of(eruns, opt_iters) / raw_best);
    printf("\n    CPU s/GiB (median): server (sender) %.2f, client (receiver) "
           "%.2f\n",
           median_of(ecpu[1], opt_iters), median_of(ecpu[0], opt_iters));
    printf("    the engine's server while raw ran: %.1f ms CPU in %.1f ms\n",
           idle_cpu * 1e3, idle_wall * 1e3);
    /* Like with like: the engine sleeps on the CQ fd (or naps on its
     * timer); the raw variant that waits the same way is its direct
     * counterpart, busy-polling shows what spinning would buy. */
    for (int v = 0; v < nv; v++)
      printf("  engine / raw %s, pass by pass: median %.2f\n",
             raw_names[rvar[v]], median_of(vratio[v], opt_iters));
  }
  if (raw_best == 0)
    raw_best = 1; /* not measured: ratios are to 1 GB/s */
  if (strchr(opt_parts, 'l'))
    layer_bench(prov, src, raw_best);
  munmap(src, opt_size);
  return 0;
}

/* 2, 3. the data plane alone. */
static void layer_bench(const char *prov, uint8_t *src, double raw_best) {
  int sv[2], status;
  pid_t pid;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv))
    die("socketpair", strerror(errno));
  fflush(stdout);
  pid = fork();
  if (pid == 0) {
    close(sv[0]);
    munmap(src, opt_size);
    layer_target(sv[1], prov);
    _exit(0);
  }
  close(sv[1]);
  double runs[2][MAX_ITERS];
  hr_fabric_stats st;
  layer_initiator(sv[0], prov, src, runs, &st);
  close(sv[0]);
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status))
    die("hurray", "the receiver failed");
  double w = best_of(runs[0], opt_iters), t = best_of(runs[1], opt_iters);
  printf("hurray RMA write (handshake+reg):  %6.2f GB/s, %.2f of best raw", w,
         w / raw_best);
  print_runs(runs[0], opt_iters);
  printf("\nhurray tagged sends (%3llu MiB):     %6.2f GB/s, %.2f of best raw",
         (unsigned long long)(hr_fabric_tag_piece(prov, opt_size) >> 20), t,
         t / raw_best);
  print_runs(runs[1], opt_iters);
  printf("\n  sender: registration cache %llu hit(s), %llu miss(es); %llu "
         "remote keys made and revoked; %llu progress calls, %llu "
         "completions\n",
         (unsigned long long)st.mr_cache_hits,
         (unsigned long long)st.mr_cache_misses,
         (unsigned long long)st.remote_deregs,
         (unsigned long long)st.progress_calls,
         (unsigned long long)st.completions);
}

/* ------------------------------------------------------------------------ */
/* 4. a GET through the engine                                               */
/* ------------------------------------------------------------------------ */

/* The server process: a store holding the region as one tensor, an engine
 * with a fabric of `prov` on a libevent loop; it reports its port and runs
 * until it is killed. */
static void engine_server(int ctl, const char *prov, const uint8_t *src) {
  hr_store_config sc;
  hr_store *store;
  hr_tensor *t;
  hr_descriptor d;
  hr_engine_config ec;
  hr_engine *e = NULL;
  hr_provider pv;
  hr_listener *l;
  struct event_base *base;
  int port;

  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_UINT8;
  d.rank = 1;
  d.shape[0] = opt_size;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  d.buffers[0].size_bytes = opt_size;
  if (hr_tensor_alloc(&t, &d, 12, NULL))
    die("engine server", "no memory for the tensor");
  memcpy(hr_tensor_buffer(t, 0), src, opt_size);
  /* The parent's source is shared with this process copy-on-write since
   * the fork: dropping it leaves the parent's pages its own, so that a
   * raw pass's process_vm_readv (shm), which pins them, does not have to
   * unshare them. */
  munmap((void *)src, opt_size);
  hr_store_config_default(&sc);
  if (hr_store_new(&store, &sc, NULL) ||
      hr_store_put(store, "t", 1, t, HR_PUT_REPLACE))
    die("engine server", "store");
  hr_tensor_unref(t);
  base = event_base_new();
  hr_engine_config_default(&ec);
  ec.fabric_provider = prov;
  ec.fabric_node = "127.0.0.1";
  if (!base || hr_ev_attach(&e, base, &ec, NULL))
    die("engine server", "cannot start the engine with the fabric");
  hr_store_provider(store, &pv);
  if (hr_engine_listen(e, "127.0.0.1:0", &pv, &l))
    die("engine server", "listen");
  port = hr_listener_port(l);
  if (write(ctl, &port, sizeof port) != (ssize_t)sizeof port)
    die("engine server", "control");
  event_base_dispatch(base);
}

/* The client: the blocking hr_client with a fabric of `prov`; each pass
 * is one GET of the whole region into one application buffer (faulted in
 * beforehand), checked. */

static void engine_open(engine_cl *ec, const char *prov, const uint8_t *src) {
  int sv[2], port = 0;
  hr_client_options o;
  hr_client_error err;
  char url[64];

  memset(ec, 0, sizeof *ec);
  ec->src = src;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv))
    die("socketpair", strerror(errno));
  fflush(stdout);
  ec->server = fork();
  if (ec->server == 0) {
    close(sv[0]);
    engine_server(sv[1], prov, src);
    _exit(0);
  }
  close(sv[1]);
  ec->ctl = sv[0];
  if (read(sv[0], &port, sizeof port) != (ssize_t)sizeof port)
    die("engine", "the server did not start");
  /* The destination as the raw benchmark's: huge pages advised, every
   * page touched once before the first GET. */
  ec->buf = big_buffer(opt_size, 0);
  hr_client_options_default(&o);
  o.fabric_provider = prov;
  o.fabric_node = "127.0.0.1";
  o.timeout_ms = 300000;
  snprintf(url, sizeof url, "127.0.0.1:%d", port);
  if (hr_client_connect(&ec->c, url, &o, NULL, &err))
    die("engine client", err.message);
  ec->g.key = (const uint8_t *)"t";
  ec->g.key_len = 1;
  ec->g.max_shards = 1;
  ec->dest.buffer = ec->buf;
  ec->dest.capacity = opt_size;
  ec->g.dest = &ec->dest;
}

/* One GET, timed around hr_client_get(); returns GB/s. */
static double engine_pass(engine_cl *ec) {
  hr_transfer_record rec;
  hr_tensor *t = NULL;
  memset(ec->buf, 0, 4096);
  double c0 = cpu_s(0), c1 = cpu_s(ec->server);
  double t0 = now_s();
  if (hr_client_get(ec->c, &ec->g, &t, &rec))
    die("engine client", hr_client_last_error(ec->c)->message);
  double t1 = now_s();
  ec->cpu[0] = cpu_s(0) - c0;
  ec->cpu[1] = cpu_s(ec->server) - c1;
  if (rec.data_plane != HR_PLANE_RDMA)
    die("engine client", rec.fallback[0] ? rec.fallback : "sent as frames");
  if (memcmp(ec->buf, ec->src, opt_size))
    die("engine client", "the bytes differ");
  hr_tensor_unref(t);
  return (double)opt_size / (t1 - t0) / 1e9;
}

static void engine_close(engine_cl *ec) {
  int status;
  hr_client_close(ec->c);
  munmap(ec->buf, opt_size);
  kill(ec->server, SIGKILL);
  waitpid(ec->server, &status, 0);
  close(ec->ctl);
}

int main(int argc, char **argv) {
  const char *provs[8];
  int np = 0, o;
  while ((o = getopt(argc, argv, "p:s:c:w:n:m:")) != -1) {
    switch (o) {
    case 'p':
      if (np < 8)
        provs[np++] = optarg;
      break;
    case 's': opt_size = strtoull(optarg, NULL, 0); break;
    case 'c': opt_chunk = strtoull(optarg, NULL, 0); break;
    case 'w': opt_window = (uint32_t)strtoul(optarg, NULL, 0); break;
    case 'n': opt_iters = atoi(optarg); break;
    case 'm': opt_parts = optarg; break;
    default:
      fprintf(stderr, "usage: fabric_bench [-p PROVIDER]... [-s BYTES] "
                      "[-c CHUNK] [-w WINDOW] [-n ITERS] [-m rle]\n");
      return 2;
    }
  }
  if (opt_iters < 1 || opt_iters > MAX_ITERS || opt_size == 0 ||
      opt_chunk == 0 || opt_window == 0)
    die("options", "out of range");
  if (np == 0) {
    provs[np++] = "tcp;ofi_rxm";
    provs[np++] = "shm";
  }
  signal(SIGPIPE, SIG_IGN);
  printf("fabric_bench: raw libfabric RMA writes vs. libhurray's RDMA data "
         "plane, loopback, two processes.\n"
         "RMA write / tagged: the data plane alone, its control messages "
         "wire-encoded over a socketpair\n(the destination registration "
         "forced on host memory for the RMA-write path).\nengine GET: a "
         "whole GET through two engines (TCP control connection + data "
         "plane).  GB/s = 1e9 bytes/s.\n");
  for (int i = 0; i < np; i++)
    bench(provs[i]);
  return 0;
}
