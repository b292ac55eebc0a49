/*
 * The libfabric backend of the data plane: one fabric, domain, completion
 * queue, address vector and RDM endpoint per engine (hr_fabric), and the
 * hr_fabric_ops that move a transfer's bytes over it.
 *
 * Operations.  A write, send or receive is an "xop": the region is cut into
 * pieces (RMA writes by rma_chunk, tagged messages by hr_fabric_tag_piece()),
 * each posted with its own struct fi_context2 (so providers that need
 * FI_CONTEXT2 work too), at most `window` in flight for writes and sends;
 * receives are all posted at once, before RDMA_READY goes out.  A post that
 * meets -FI_EAGAIN (a full queue) waits for the next hr_fabric_progress().
 * The xop ends, and calls the op's `done`, when no piece is in flight any
 * more: all completed, or an error or cancel stopped it.
 *
 * Registrations.  Local registrations (the `desc` of every post) come from
 * the cache (hr_fab_mrcache.c); providers that need none (FI_MR_LOCAL
 * unset) still get them, because a descriptor spares ofi_rxm registering a
 * rendezvous buffer per message.  Remote registrations carry one
 * transfer's key and are closed when it ends.  Keys we choose (providers
 * without FI_MR_PROV_KEY) are random, so a key is never guessable and a
 * revoked one is not reissued.
 *
 * The event loop.  With FI_WAIT_FD the engine watches the CQ's fd; each
 * hr_fabric_progress() drains the CQ and re-arms with fi_trywait.  Without
 * it (shm), the expiry asks for a poll every `poll_interval` while there is
 * outstanding work, and never otherwise.
 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <dlfcn.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "hr_fab_int.h"

#define HR_FI_VERSION FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)
#define NAME_MAX_LEN 256u
#define CQ_BATCH 16
/* Completions read per hr_fabric_progress() before it yields the loop. */
#define CQ_BUDGET 4096
/* fi_trywait rounds per hr_fabric_progress() before it asks for the next
 * loop turn instead. */
#define TRYWAIT_ROUNDS 8

enum { K_WRITE, K_SEND, K_RECV };

typedef struct fab_peer fab_peer;
struct fab_peer {
  fab_peer *next;
  fi_addr_t addr;
  unsigned refs;
  size_t len;
  uint8_t name[NAME_MAX_LEN];
};

typedef struct fab_xop fab_xop;

/* One posted fi_write / fi_tsend / fi_trecv; the CQ entry's op_context
 * points at `ctx`, the first member. */
typedef struct fab_piece {
  struct fi_context2 ctx;
  fab_xop *x;
  uint64_t len;
  int busy;
} fab_piece;

struct fab_xop {
  fab_xop *prev, *next; /* the fabric's live operations */
  hr_fabric *f;
  hr_fabric_op *op;
  int kind;
  fi_addr_t peer;
  fab_peer *peer_obj;
  uint64_t tag;
  hr_fabric_region r;
  uint64_t raddr; /* write: remote address of region offset 0 */
  uint64_t rkey;  /* write: the key to use */
  int key_mapped; /* rkey came from fi_mr_map_raw */
  hr__mrc_entry *mr[HR_MAX_BUFFERS];
  uint64_t piece;     /* piece size */
  hr__fab_cursor cur; /* the next piece to post */
  uint64_t total;     /* pieces in all */
  uint64_t posted;
  uint64_t completed;
  uint64_t succeeded; /* completions without error */
  uint32_t inflight;
  uint32_t window;
  uint32_t nslots;
  fab_piece *slots;
  int cancelled;
  int status;
  char why[160];
};

/* The few functions libfabric really exports (the rest of its API is
 * static inline, calling through the ops tables of the objects these
 * return).  libfabric is loaded at run time: linking it would run its
 * providers' constructors (libinfinipath's among them, tens of
 * milliseconds) in every process that links libhurray, fabric or not. */
typedef struct fab_lib {
  void *handle; /* dlopen() */
  __typeof__(fi_getinfo) *getinfo;
  __typeof__(fi_freeinfo) *freeinfo;
  __typeof__(fi_dupinfo) *dupinfo;
  __typeof__(fi_fabric) *fabric;
  __typeof__(fi_strerror) *strerror;
  __typeof__(fi_tostr) *tostr;
  __typeof__(fi_version) *version;
} fab_lib;

struct hr_fabric {
  hr_mem mem;
  fab_lib lib;
  hr_fabric_config cfg;
  char provider[64];
  char node[64];
  struct fi_info *info;
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_cq *cq;
  struct fid_av *av;
  struct fid_ep *ep;
  int wait_fd;
  uint8_t name[NAME_MAX_LEN];
  size_t name_len;
  uint64_t mr_mode;
  uint64_t key_mask;
  size_t mr_iov_limit;
  int delivery_complete;
  int directed;
  int ordered;
  int hmem;
  int gpudirect;
  hr__mrc *cache;
  hr__fab_track *track; /* memory freed on other threads */
  fab_peer *peers;
  fab_xop *ops;
  uint64_t remote_mrs;
  uint64_t npeers;
  hr_tstamp last_poll;
  int need_progress;
  int armed;
  int cq_failed;
  int down; /* hr_fabric_shutdown() closed the endpoint */
  hr_fabric_stats st;
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static void fi_why(const hr_fabric *f, char *why, size_t cap, const char *what,
                   int rv) {
  hr__fab_why(why, cap, "%s: %s (%d)", what,
              f->lib.strerror(rv < 0 ? -rv : rv),
              rv);
}

static int iface_of(const hr_fabric *f, uint8_t tag, uint16_t index,
                    struct fi_mr_attr *a, char *why, size_t cap) {
  switch (tag) {
  case HR_DEV_CPU: a->iface = FI_HMEM_SYSTEM; return 0;
  case HR_DEV_CUDA:
    a->iface = FI_HMEM_CUDA;
    a->device.cuda = index;
    break;
  case HR_DEV_ROCM:
    a->iface = FI_HMEM_ROCR;
    a->device.reserved = index;
    break;
  case HR_DEV_LEVEL_ZERO:
    a->iface = FI_HMEM_ZE;
    a->device.ze = index;
    break;
  default:
    hr__fab_why(why, cap, "%s memory cannot be registered",
                hr_device_name(tag));
    return HR_ERR_UNSUPPORTED;
  }
  if (!f->hmem) {
    hr__fab_why(why, cap, "%s memory needs FI_HMEM, which %s lacks here",
                hr_device_name(tag), f->provider);
    return HR_ERR_UNSUPPORTED;
  }
  return 0;
}

static uint64_t random_key(const hr_fabric *f) {
  uint64_t k = 0;
  if (getrandom(&k, sizeof k, 0) != (ssize_t)sizeof k)
    k ^= (uint64_t)(uintptr_t)&k * 0x9e3779b97f4a7c15ull;
  return k & f->key_mask;
}

/* Registers iov[0..n) with `access`; binds and enables it where the
 * provider asks (FI_MR_ENDPOINT) unless `probe` (before the endpoint is
 * enabled).  Retries a key that collides. */
static int mr_register(hr_fabric *f, const struct iovec *iov, size_t n,
                       uint64_t access, uint8_t tag, uint16_t index, int probe,
                       struct fid_mr **out, char *why, size_t cap) {
  struct fi_mr_attr a;
  memset(&a, 0, sizeof a);
  a.mr_iov = iov;
  a.iov_count = n;
  a.access = access;
  int rv = iface_of(f, tag, index, &a, why, cap);
  if (rv)
    return rv;
  for (int tries = 0;; tries++) {
    a.requested_key = random_key(f);
    rv = fi_mr_regattr(f->domain, &a, 0, out);
    if (rv != -FI_ENOKEY || tries >= 8)
      break;
  }
  if (rv) {
    fi_why(f, why, cap, "fi_mr_regattr", rv);
    return rv == -FI_ENOMEM ? HR_ERR_NOMEM : HR_ERR_UNSUPPORTED;
  }
  if ((f->mr_mode & FI_MR_ENDPOINT) && !probe) {
    rv = fi_mr_bind(*out, &f->ep->fid, 0);
    if (!rv)
      rv = fi_mr_enable(*out);
    if (rv) {
      fi_close(&(*out)->fid);
      fi_why(f, why, cap, "fi_mr_bind/enable", rv);
      return HR_ERR_IO;
    }
  }
  return 0;
}

/* The cache's registration functions. */
static int cache_reg(void *ctx, void *ptr, uint64_t len, uint8_t tag,
                     uint16_t index, void **handle, void **desc, char *why,
                     size_t cap) {
  hr_fabric *f = ctx;
  struct iovec iov = {ptr, (size_t)len};
  struct fid_mr *mr;
  int rv = mr_register(f, &iov, 1, FI_SEND | FI_RECV | FI_READ | FI_WRITE, tag,
                       index, 0, &mr, why, cap);
  if (rv)
    return rv;
  *handle = mr;
  *desc = fi_mr_desc(mr);
  return 0;
}

static void cache_dereg(void *ctx, void *handle) {
  (void)ctx;
  fi_close(&((struct fid_mr *)handle)->fid);
}

/* ------------------------------------------------------------------------ */
/* Opening                                                                   */
/* ------------------------------------------------------------------------ */

void hr_fabric_config_default(hr_fabric_config *c) {
  memset(c, 0, sizeof *c);
  c->version = HR_FABRIC_CONFIG_VERSION;
  c->scope = HR_FABRIC_SCOPE_AUTO;
  c->rma_chunk = 4u << 20;
  c->window = 16;
  c->poll_interval = 50000;
  c->mr_cache_entries = 1024;
  c->mr_cache_bytes = 16ull << 30;
}

static int is_loopback(const char *node) {
  return node && (strncmp(node, "127.", 4) == 0 || strcmp(node, "::1") == 0 ||
                  strcmp(node, "localhost") == 0);
}

/* Providers that reach device memory only through host copies: never
 * GPUDirect. */
static int host_staged(const char *prov) {
  return strstr(prov, "tcp") || strstr(prov, "sockets") ||
         strstr(prov, "udp") || strstr(prov, "net");
}

/* Asks libfabric for `prov` with the capabilities the data plane needs,
 * relaxing the optional ones (delivery completion, directed receive,
 * FI_HMEM) one by one when the provider refuses them. */
static int get_info(const hr_fabric *f, const char *prov, const char *node,
                    struct fi_info **out) {
  const hr_fabric_config *cfg = &f->cfg;
  static const int variants[][3] = {/* delivery_complete, directed_recv, hmem */
                                    {1, 1, 1}, {1, 0, 1}, {0, 1, 1}, {0, 0, 1},
                                    {1, 1, 0}, {1, 0, 0}, {0, 1, 0}, {0, 0, 0}};
  int last = -FI_ENODATA;
  for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
    if (variants[v][2] && !cfg->hmem)
      continue;
    struct fi_info *h = f->lib.dupinfo(NULL); /* fi_allocinfo() */
    if (!h)
      return -FI_ENOMEM;
    h->caps = FI_RMA | FI_TAGGED;
    if (variants[v][1])
      h->caps |= FI_DIRECTED_RECV;
    if (variants[v][2])
      h->caps |= FI_HMEM;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->ep_attr->type = FI_EP_RDM;
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                              FI_MR_PROV_KEY | FI_MR_RAW | FI_MR_ENDPOINT;
    if (variants[v][2])
      h->domain_attr->mr_mode |= FI_MR_HMEM;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    if (variants[v][0])
      h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
    h->fabric_attr->prov_name = strdup(prov); /* lint-ok: fi_freeinfo */
    if (!h->fabric_attr->prov_name) {
      f->lib.freeinfo(h);
      return -FI_ENOMEM;
    }
    struct fi_info *info = NULL;
    int rv = f->lib.getinfo(HR_FI_VERSION, node, NULL, 0, h, &info);
    f->lib.freeinfo(h);
    if (rv == 0 && info) {
      /* The layered name must match exactly: asking for "tcp" also
       * returns "tcp;ofi_rxm", and that is the one we want to name. */
      *out = info;
      return 0;
    }
    last = rv ? rv : -FI_ENODATA;
  }
  return last;
}

static int select_provider(hr_fabric *f, char *why, size_t cap) {
  const hr_fabric_config *c = &f->cfg;
  const char *node = f->node[0] ? f->node : NULL;
  if (f->provider[0]) {
    int rv = get_info(f, f->provider, strcmp(f->provider, "shm") ? node : NULL,
                      &f->info);
    if (rv) {
      hr__fab_why(why, cap, "provider %s: %s", f->provider,
                  f->lib.strerror(-rv));
      return rv == -FI_ENOMEM ? HR_ERR_NOMEM : HR_ERR_UNSUPPORTED;
    }
    return 0;
  }
  int local = c->scope == HR_FABRIC_SCOPE_LOCAL ||
              (c->scope == HR_FABRIC_SCOPE_AUTO && is_loopback(node));
  /* Best first.  shm reaches only this host's peers; sockets, udp;ofi_rxd
   * and the utility providers are never chosen automatically. */
  static const char *const network[] = {"cxi",  "verbs;ofi_rxm", "efa", "opx",
                                        "psm3", "psm2",          "ucx"};
  for (size_t i = 0; i < sizeof network / sizeof *network; i++)
    if (get_info(f, network[i], node, &f->info) == 0)
      return 0;
  if (local && get_info(f, "shm", NULL, &f->info) == 0)
    return 0;
  if (get_info(f, "tcp;ofi_rxm", node, &f->info) == 0)
    return 0;
  hr__fab_why(why, cap, "no provider with FI_RMA and FI_TAGGED (%s scope)",
              local ? "local" : "network");
  return HR_ERR_UNSUPPORTED;
}

/* Registers a small buffer of each configured device kind: does the
 * provider really reach device memory? */
static int probe_hmem(hr_fabric *f, const hr_fabric_config *c) {
  int ok = 0;
  if (!f->hmem || !c->hmem_alloc || !c->hmem_free)
    return 0;
  for (unsigned i = 0; i < c->hmem_device_count; i++) {
    uint8_t tag = c->hmem_devices[i];
    void *p = NULL;
    if (c->hmem_alloc(c->hmem_user_data, tag, 0, 65536, &p) != 0 || !p)
      continue;
    struct iovec iov = {p, 65536};
    struct fid_mr *mr;
    char why[128];
    if (mr_register(f, &iov, 1, FI_REMOTE_WRITE, tag, 0, 1, &mr, why,
                    sizeof why) == 0) {
      fi_close(&mr->fid);
      ok = 1;
    }
    c->hmem_free(c->hmem_user_data, tag, 0, p);
  }
  return ok;
}

/* Loads libfabric and resolves its exported functions into f->lib.
 * RTLD_NODELETE: providers hook memory functions (the registration cache's
 * monitors) and start threads, so the library must never be unmapped;
 * the handle is closed with the fabric, the library stays. */
static int lib_load(hr_fabric *f, const char *name, char *why, size_t cap) {
  static const char *const syms[] = {"fi_getinfo", "fi_freeinfo",
                                     "fi_dupinfo", "fi_fabric",
                                     "fi_strerror", "fi_tostr", "fi_version"};
  void **slots[] = {(void **)&f->lib.getinfo,  (void **)&f->lib.freeinfo,
                    (void **)&f->lib.dupinfo,  (void **)&f->lib.fabric,
                    (void **)&f->lib.strerror, (void **)&f->lib.tostr,
                    (void **)&f->lib.version};
  if (!name)
    name = "libfabric.so.1";
  f->lib.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!f->lib.handle) {
    const char *e = dlerror();
    hr__fab_why(why, cap, "libfabric is not available: %s", e ? e : name);
    return HR_ERR_UNSUPPORTED;
  }
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
    void *p = dlsym(f->lib.handle, syms[i]);
    if (!p) {
      hr__fab_why(why, cap, "libfabric is not available: %s lacks %s", name,
                  syms[i]);
      return HR_ERR_UNSUPPORTED;
    }
    /* POSIX guarantees that object and function pointers convert. */
    memcpy(slots[i], &p, sizeof p);
  }
  uint32_t v = f->lib.version();
  if (FI_MAJOR(v) != FI_MAJOR_VERSION || v < FI_VERSION(1, 17)) {
    hr__fab_why(why, cap,
                "libfabric is not available: %s is version %u.%u, 1.17 or a "
                "later 1.x is needed",
                name, FI_MAJOR(v), FI_MINOR(v));
    return HR_ERR_UNSUPPORTED;
  }
  return 0;
}

static void close_all(hr_fabric *f) {
  /* Tensors may outlive the fabric and still report into the tracker. */
  hr__fab_track_set_wake(f->track, NULL, NULL);
  hr__fab_track_unref(f->track);
  f->track = NULL;
  hr__mrc_del(f->cache);
  f->cache = NULL;
  if (f->ep)
    fi_close(&f->ep->fid);
  if (f->av)
    fi_close(&f->av->fid);
  if (f->cq)
    fi_close(&f->cq->fid);
  if (f->domain)
    fi_close(&f->domain->fid);
  if (f->fabric)
    fi_close(&f->fabric->fid);
  if (f->info)
    f->lib.freeinfo(f->info);
  if (f->lib.handle)
    dlclose(f->lib.handle);
}

int hr_fabric_new(hr_fabric **out, const hr_fabric_config *cfg,
                  const hr_mem *mem, char *why, size_t cap) {
  hr_fabric_config defaults;
  hr__fab_why(why, cap, "%s", "");
  if (!out) {
    hr__fab_why(why, cap, "out is NULL");
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (!cfg) {
    hr_fabric_config_default(&defaults);
    cfg = &defaults;
  }
  if (cfg->version < 1 || cfg->window == 0 || cfg->rma_chunk == 0 ||
      (cfg->provider && strlen(cfg->provider) >= 64) ||
      (cfg->node && strlen(cfg->node) >= 64) ||
      (cfg->hmem_device_count && !cfg->hmem_devices)) {
    hr__fab_why(why, cap, "invalid configuration");
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (!mem)
    mem = hr_mem_default();
  hr_fabric *f = hr__mem_calloc(mem, 1, sizeof *f);
  if (!f) {
    hr__fab_why(why, cap, "out of memory");
    return HR_ERR_NOMEM;
  }
  f->mem = *mem;
  /* A version 1 configuration ends before `library`. */
  memcpy(&f->cfg, cfg,
         cfg->version >= 2 ? sizeof *cfg : offsetof(hr_fabric_config, library));
  f->cfg.provider = NULL;
  f->cfg.node = NULL;
  f->cfg.hmem_devices = NULL; /* only read during hr_fabric_new */
  f->cfg.library = NULL;
  f->wait_fd = -1;
  if (cfg->provider)
    memcpy(f->provider, cfg->provider, strlen(cfg->provider) + 1);
  if (cfg->node)
    memcpy(f->node, cfg->node, strlen(cfg->node) + 1);

  int rv = lib_load(f, cfg->version >= 2 ? cfg->library : NULL, why, cap);
  if (!rv)
    rv = select_provider(f, why, cap);
  if (rv)
    goto fail;
  struct fi_info *i = f->info;
  if (strlen(i->fabric_attr->prov_name) >= sizeof f->provider) {
    hr__fab_why(why, cap, "provider name too long");
    rv = HR_ERR_UNSUPPORTED;
    goto fail;
  }
  memcpy(f->provider, i->fabric_attr->prov_name,
         strlen(i->fabric_attr->prov_name) + 1);
  f->mr_mode = (uint64_t)i->domain_attr->mr_mode;
  size_t ks = i->domain_attr->mr_key_size;
  f->key_mask = ks >= 8 || ks == 0 ? UINT64_MAX : (1ull << (8 * ks)) - 1;
  f->mr_iov_limit =
      i->domain_attr->mr_iov_limit ? i->domain_attr->mr_iov_limit : 1;
  f->delivery_complete = !!(i->tx_attr->op_flags & FI_DELIVERY_COMPLETE);
  f->directed = !!(i->caps & FI_DIRECTED_RECV);
  f->ordered = !!(i->tx_attr->msg_order & FI_ORDER_SAS);
  f->hmem = !!(i->caps & FI_HMEM);

  int step;
  const char *what = "fi_fabric";
  step = f->lib.fabric(i->fabric_attr, &f->fabric, NULL);
  if (!step) {
    what = "fi_domain";
    step = fi_domain(f->fabric, i, &f->domain, NULL);
  }
  if (!step) {
    struct fi_cq_attr ca;
    memset(&ca, 0, sizeof ca);
    ca.format = FI_CQ_FORMAT_TAGGED;
    ca.wait_obj = FI_WAIT_FD;
    what = "fi_cq_open";
    step = fi_cq_open(f->domain, &ca, &f->cq, NULL);
    if (step == 0) {
      if (fi_control(&f->cq->fid, FI_GETWAIT, &f->wait_fd) != 0 ||
          f->wait_fd < 0) {
        fi_close(&f->cq->fid);
        f->cq = NULL;
        f->wait_fd = -1;
        step = -FI_ENOSYS;
      }
    }
    if (step != 0) {
      /* No wait fd here (shm): poll on a timer instead. */
      ca.wait_obj = FI_WAIT_NONE;
      f->wait_fd = -1;
      step = fi_cq_open(f->domain, &ca, &f->cq, NULL);
    }
  }
  if (!step) {
    struct fi_av_attr aa;
    memset(&aa, 0, sizeof aa);
    aa.type = i->domain_attr->av_type;
    what = "fi_av_open";
    step = fi_av_open(f->domain, &aa, &f->av, NULL);
  }
  if (!step) {
    what = "fi_endpoint";
    step = fi_endpoint(f->domain, i, &f->ep, NULL);
  }
  if (!step) {
    what = "fi_ep_bind";
    step = fi_ep_bind(f->ep, &f->av->fid, 0);
    if (!step)
      step = fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV);
  }
  if (!step && probe_hmem(f, cfg) && !host_staged(f->provider)) {
    int p2p = FI_HMEM_P2P_REQUIRED;
    f->gpudirect = fi_setopt(&f->ep->fid, FI_OPT_ENDPOINT, FI_OPT_FI_HMEM_P2P,
                             &p2p, sizeof p2p) == 0;
  }
  if (!step) {
    what = "fi_enable";
    step = fi_enable(f->ep);
  }
  if (!step) {
    what = "fi_getname";
    f->name_len = sizeof f->name;
    step = fi_getname(&f->ep->fid, f->name, &f->name_len);
  }
  if (step) {
    fi_why(f, why, cap, what, step);
    rv = step == -FI_ENOMEM ? HR_ERR_NOMEM : HR_ERR_IO;
    goto fail;
  }
  rv = hr__mrc_new(&f->cache, cache_reg, cache_dereg, f, cfg->mr_cache_entries,
                   cfg->mr_cache_bytes, mem);
  if (!rv)
    rv = hr__fab_track_new(&f->track, mem);
  if (rv) {
    hr__fab_why(why, cap, "out of memory");
    goto fail;
  }
  f->st.wait_fd = f->wait_fd >= 0;
  f->st.delivery_complete = f->delivery_complete;
  f->st.directed_recv = f->directed;
  f->st.send_ordered = f->ordered;
  f->st.mr_local = !!(f->mr_mode & FI_MR_LOCAL);
  f->st.mr_virt_addr = !!(f->mr_mode & FI_MR_VIRT_ADDR);
  f->st.mr_prov_key = !!(f->mr_mode & FI_MR_PROV_KEY);
  f->st.mr_raw = !!(f->mr_mode & FI_MR_RAW);
  f->st.hmem = f->hmem;
  f->need_progress = 1;
  *out = f;
  return 0;
fail:
  close_all(f);
  hr__mem_free(mem, f);
  return rv;
}

int hr_fabric_busy(const hr_fabric *f) {
  return f && (f->ops || f->remote_mrs || f->peers || hr__mrc_busy(f->cache));
}

int hr_fabric_del(hr_fabric *f) {
  if (!f)
    return 0;
  if (hr_fabric_busy(f))
    return HR_ERR_BUSY;
  hr_mem mem = f->mem;
  close_all(f);
  hr__mem_free(&mem, f);
  return 0;
}

const char *hr_fabric_provider(const hr_fabric *f) {
  return f->provider;
}

uint32_t hr_fabric_capabilities(const hr_fabric *f) {
  return HR_CAP_RDMA_DATA_PLANE | (f->gpudirect ? HR_CAP_RDMA_GPUDIRECT : 0);
}

int64_t hr_fabric_address(const hr_fabric *f, uint8_t *out, size_t cap) {
  return hr_fabric_address_encode(f->provider, f->name, f->name_len, out, cap);
}

int hr_fabric_fd(const hr_fabric *f) {
  return f->wait_fd;
}

void hr_fabric_invalidate(hr_fabric *f, const void *ptr, uint64_t len) {
  if (f)
    hr__mrc_invalidate(f->cache, ptr, len);
}

static void drained(void *ctx, const void *ptr, uint64_t len) {
  hr__mrc_invalidate(((hr_fabric *)ctx)->cache, ptr, len);
}

/* Closes the registrations of memory freed on any thread, before the
 * cache could hand one of them out again. */
static void take_invalidations(hr_fabric *f) {
  hr__fab_track_drain(f->track, drained, f);
}

void hr_fabric_set_wake(hr_fabric *f, void (*wake)(void *ctx), void *ctx) {
  if (f)
    hr__fab_track_set_wake(f->track, wake, ctx);
}

void hr_fabric_get_stats(const hr_fabric *f, hr_fabric_stats *st) {
  hr__mrc_stats m;
  *st = f->st;
  hr__mrc_get_stats(f->cache, &m);
  st->mr_cache_hits = m.hits;
  st->mr_cache_misses = m.misses;
  st->mr_cache_evictions = m.evictions;
  st->mr_cache_invalidations = m.invalidations;
  st->mr_cache_entries = m.entries;
}

/* ------------------------------------------------------------------------ */
/* Peers                                                                     */
/* ------------------------------------------------------------------------ */

/* The IP of a sockaddr as 16 bytes (IPv4 mapped into IPv6); 0 when it is
 * not an IP address. */
static int ip_of(const void *sa, size_t len, uint8_t ip[16]) {
  sa_family_t fam;
  if (!sa || len < sizeof fam)
    return 0;
  memcpy(&fam, sa, sizeof fam);
  if (fam == AF_INET && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in in;
    memcpy(&in, sa, sizeof in);
    memset(ip, 0, 10);
    ip[10] = ip[11] = 0xff;
    memcpy(ip + 12, &in.sin_addr, 4);
    return 1;
  }
  if (fam == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 in6;
    memcpy(&in6, sa, sizeof in6);
    memcpy(ip, &in6.sin6_addr, 16);
    return 1;
  }
  return 0;
}

static int ip_loopback(const uint8_t ip[16]) {
  static const uint8_t v6[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                 0, 0, 0, 0, 0, 0, 0, 1};
  static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(ip, v6, 16) == 0 || (memcmp(ip, v4, 12) == 0 && ip[12] == 127);
}

/* Checks a hostile fi_getname blob against our address format. */
static int check_name(const hr_fabric *f, const uint8_t *name, uint16_t len,
                      char *why, size_t cap) {
  sa_family_t fam = 0;
  if (len == 0 || len > NAME_MAX_LEN) {
    hr__fab_why(why, cap, "endpoint name of %u bytes", len);
    return HR_ERR_UNSUPPORTED;
  }
  if (len >= sizeof fam)
    memcpy(&fam, name, sizeof fam);
  switch (f->info->addr_format) {
  case FI_SOCKADDR_IN:
    if (len != sizeof(struct sockaddr_in) || fam != AF_INET)
      goto bad;
    return 0;
  case FI_SOCKADDR_IN6:
    if (len != sizeof(struct sockaddr_in6) || fam != AF_INET6)
      goto bad;
    return 0;
  case FI_SOCKADDR:
    if ((fam == AF_INET && len == sizeof(struct sockaddr_in)) ||
        (fam == AF_INET6 && len == sizeof(struct sockaddr_in6)))
      return 0;
    goto bad;
  case FI_ADDR_STR:
    /* Printable text ending with its NUL (the provider parses it). */
    if (name[len - 1] != 0)
      goto bad;
    for (uint16_t k = 0; k + 1 < len; k++)
      if (name[k] < 0x20 || name[k] > 0x7e)
        goto bad;
    return 0;
  default: return 0;
  }
bad:
  hr__fab_why(why, cap, "not a %s endpoint name",
              f->lib.tostr(&f->info->addr_format, FI_TYPE_ADDR_FORMAT));
  return HR_ERR_UNSUPPORTED;
}

static int fab_peer_add(void *ctx, const uint8_t *prov, uint16_t prov_len,
                        const uint8_t *name, uint16_t name_len,
                        const void *ctl_addr, size_t ctl_addr_len, void **peer,
                        char *why, size_t cap) {
  hr_fabric *f = ctx;
  size_t ours = strlen(f->provider);
  if (prov_len != ours || memcmp(prov, f->provider, ours) != 0) {
    char theirs[64];
    size_t n = prov_len < sizeof theirs - 1 ? prov_len : sizeof theirs - 1;
    memcpy(theirs, prov, n);
    theirs[n] = 0;
    hr__fab_ascii(theirs);
    hr__fab_why(why, cap, "the peer's provider %s is not ours (%s)", theirs,
                f->provider);
    return HR_ERR_UNSUPPORTED;
  }
  int rv = check_name(f, name, name_len, why, cap);
  if (rv)
    return rv;
  uint8_t a[16], b[16];
  if (ip_of(ctl_addr, ctl_addr_len, a) && ip_of(name, name_len, b) &&
      memcmp(a, b, 16) != 0 && !(ip_loopback(a) && ip_loopback(b))) {
    hr__fab_why(why, cap,
                "the fabric address is on another host than the "
                "connection's peer");
    return HR_ERR_UNSUPPORTED;
  }
  for (fab_peer *p = f->peers; p; p = p->next)
    if (p->len == name_len && memcmp(p->name, name, name_len) == 0) {
      p->refs++;
      *peer = p;
      return 0;
    }
  fab_peer *p = hr__mem_calloc(&f->mem, 1, sizeof *p);
  if (!p) {
    hr__fab_why(why, cap, "out of memory");
    return HR_ERR_NOMEM;
  }
  memcpy(p->name, name, name_len);
  p->len = name_len;
  int n = fi_av_insert(f->av, p->name, 1, &p->addr, 0, NULL);
  if (n != 1) {
    hr__mem_free(&f->mem, p);
    fi_why(f, why, cap, "fi_av_insert", n < 0 ? n : -FI_EADDRNOTAVAIL);
    return HR_ERR_UNSUPPORTED;
  }
  p->refs = 1;
  p->next = f->peers;
  f->peers = p;
  *peer = p;
  return 0;
}

static void fab_peer_del(void *ctx, void *peer) {
  hr_fabric *f = ctx;
  fab_peer *p = peer;
  if (--p->refs)
    return;
  for (fab_peer **pp = &f->peers; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  fi_av_remove(f->av, &p->addr, 1, 0);
  hr__mem_free(&f->mem, p);
}

/* ------------------------------------------------------------------------ */
/* Remote registrations                                                      */
/* ------------------------------------------------------------------------ */

static int fab_reg(void *ctx, const hr_fabric_region *r, int access,
                   hr_fabric_key *key, void **mr, char *why, size_t cap) {
  hr_fabric *f = ctx;
  struct iovec iov[HR_MAX_BUFFERS];
  size_t n = 0;
  if (r->length == 0) {
    hr__fab_why(why, cap, "an empty region");
    return HR_ERR_UNSUPPORTED;
  }
  if (f->down) {
    hr__fab_why(why, cap, "the fabric is shut down");
    return HR_ERR_CLOSED;
  }
  if (hr__fab_region_contiguous(r)) {
    for (unsigned k = 0; k < r->nseg; k++)
      if (r->seg[k].len) {
        iov[0].iov_base = r->seg[k].ptr;
        iov[0].iov_len = (size_t)r->length;
        n = 1;
        break;
      }
  } else {
    for (unsigned k = 0; k < r->nseg; k++)
      if (r->seg[k].len) {
        iov[n].iov_base = r->seg[k].ptr;
        iov[n].iov_len = (size_t)r->seg[k].len;
        n++;
      }
    if (n > f->mr_iov_limit) {
      hr__fab_why(why, cap,
                  "%zu separate buffers, and %s registers at most %zu", n,
                  f->provider, f->mr_iov_limit);
      return HR_ERR_UNSUPPORTED;
    }
  }
  struct fid_mr *m;
  int rv = mr_register(f, iov, n,
                       access == HR_FABRIC_REMOTE_READ ? FI_REMOTE_READ
                                                       : FI_REMOTE_WRITE,
                       r->device_tag, r->device_index, 0, &m, why, cap);
  if (rv)
    return rv;
  memset(key, 0, sizeof *key);
  key->length = r->length;
  key->address =
      f->mr_mode & FI_MR_VIRT_ADDR ? (uint64_t)(uintptr_t)iov[0].iov_base : 0;
  if (f->mr_mode & FI_MR_RAW) {
    uint64_t base = 0;
    size_t ks = HR_FABRIC_RAW_KEY_MAX;
    rv = fi_mr_raw_attr(m, &base, key->raw_key, &ks, 0);
    if (rv || ks == 0 || ks > HR_FABRIC_RAW_KEY_MAX) {
      fi_close(&m->fid);
      fi_why(f, why, cap, "fi_mr_raw_attr", rv ? rv : -FI_ETOOSMALL);
      return HR_ERR_UNSUPPORTED;
    }
    key->raw_key_len = (uint16_t)ks;
  } else {
    key->key = fi_mr_key(m);
  }
  f->remote_mrs++;
  f->st.remote_regs++;
  *mr = m;
  return 0;
}

static void fab_dereg(void *ctx, void *mr) {
  hr_fabric *f = ctx;
  fi_close(&((struct fid_mr *)mr)->fid);
  f->remote_mrs--;
  f->st.remote_deregs++;
}

/* ------------------------------------------------------------------------ */
/* Operations                                                                */
/* ------------------------------------------------------------------------ */

static void xop_unlink(hr_fabric *f, fab_xop *x) {
  if (x->prev)
    x->prev->next = x->next;
  else
    f->ops = x->next;
  if (x->next)
    x->next->prev = x->prev;
}

static void xop_free(hr_fabric *f, fab_xop *x) {
  for (unsigned k = 0; k < HR_MAX_BUFFERS; k++)
    if (x->mr[k])
      hr__mrc_put(f->cache, x->mr[k]);
  if (x->key_mapped)
    fi_mr_unmap_key(f->domain, x->rkey);
  if (x->peer_obj)
    fab_peer_del(f, x->peer_obj);
  hr__mem_free(&f->mem, x->slots);
  hr__mem_free(&f->mem, x);
}

/* Builds an xop and takes the local registrations of its segments. */
static int xop_new(hr_fabric *f, int kind, void *peer,
                   const hr_fabric_region *r, hr_fabric_op *op, fab_xop **out,
                   char *why, size_t cap) {
  if (f->cq_failed || f->down) {
    hr__fab_why(why, cap,
                f->down ? "the fabric is shut down"
                        : "the completion queue failed");
    return f->down ? HR_ERR_CLOSED : HR_ERR_IO;
  }
  fab_xop *x = hr__mem_calloc(&f->mem, 1, sizeof *x);
  if (!x) {
    hr__fab_why(why, cap, "out of memory");
    return HR_ERR_NOMEM;
  }
  x->f = f;
  x->op = op;
  x->kind = kind;
  x->r = *r;
  fab_peer *p = peer;
  x->peer = p->addr;
  x->peer_obj = p;
  p->refs++; /* the peer stays while the op runs */
  x->piece = kind == K_WRITE ? f->cfg.rma_chunk
                              : hr_fabric_tag_piece(f->provider, r->length);
  x->total = hr__fab_count_pieces(r, x->piece);
  if (kind == K_RECV)
    x->window = x->total > UINT32_MAX ? UINT32_MAX : (uint32_t)x->total;
  else if (kind == K_SEND && !f->ordered)
    x->window = 1; /* the receiver's posts match in send order only */
  else
    x->window = f->cfg.window;
  x->nslots = x->window < x->total ? x->window : (uint32_t)x->total;
  if (x->nslots) {
    x->slots = hr__mem_calloc(&f->mem, x->nslots, sizeof *x->slots);
    if (!x->slots) {
      xop_free(f, x);
      hr__fab_why(why, cap, "out of memory");
      return HR_ERR_NOMEM;
    }
  }
  take_invalidations(f);
  for (unsigned k = 0; k < r->nseg; k++) {
    if (r->seg[k].len == 0)
      continue;
    int rv = hr__mrc_get(f->cache, r->seg[k].ptr, r->seg[k].len, r->device_tag,
                         r->device_index, &x->mr[k], why, cap);
    if (rv) {
      xop_free(f, x);
      return rv;
    }
  }
  *out = x;
  return 0;
}

static void xop_start(hr_fabric *f, fab_xop *x) {
  x->next = f->ops;
  if (f->ops)
    f->ops->prev = x;
  f->ops = x;
  x->op->backend = x;
  f->st.ops_started++;
  f->need_progress = 1;
}

static fab_piece *free_slot(fab_xop *x) {
  for (uint32_t i = 0; i < x->nslots; i++)
    if (!x->slots[i].busy)
      return &x->slots[i];
  return NULL;
}

/* Posts the next pieces while the window and the queue allow.  Returns 0,
 * or a fatal libfabric error (the xop is marked failed). */
static void post_more(hr_fabric *f, fab_xop *x) {
  while (!x->status && !x->cancelled && x->posted < x->total &&
         x->inflight < x->window) {
    fab_piece *s = free_slot(x);
    if (!s)
      return;
    hr__fab_cursor save = x->cur;
    void *ptr;
    uint64_t len, off;
    if (!hr__fab_next_piece(&x->r, &x->cur, x->piece, &ptr, &len, &off))
      return;
    hr__mrc_entry *e = x->mr[x->cur.seg < HR_MAX_BUFFERS ? x->cur.seg : 0];
    void *desc = e ? e->desc : NULL;
    struct iovec iov = {ptr, (size_t)len};
    memset(&s->ctx, 0, sizeof s->ctx);
    s->x = x;
    s->len = len;
    ssize_t rv;
    if (x->kind == K_WRITE) {
      struct fi_rma_iov rma = {x->raddr + off, (size_t)len, x->rkey};
      struct fi_msg_rma m = {&iov, &desc, 1, x->peer, &rma, 1, &s->ctx, 0};
      rv = fi_writemsg(f->ep, &m,
                       FI_COMPLETION |
                           (f->delivery_complete ? FI_DELIVERY_COMPLETE : 0));
    } else if (x->kind == K_SEND) {
      struct fi_msg_tagged m = {&iov, &desc, 1, x->peer, x->tag, 0, &s->ctx, 0};
      rv = fi_tsendmsg(f->ep, &m, FI_COMPLETION);
    } else {
      struct fi_msg_tagged m = {
          &iov,   &desc, 1,       f->directed ? x->peer : FI_ADDR_UNSPEC,
          x->tag, 0,     &s->ctx, 0};
      rv = fi_trecvmsg(f->ep, &m, FI_COMPLETION);
    }
    if (rv == -FI_EAGAIN) {
      /* The queue is full: retry from the next progress call. */
      x->cur = save;
      return;
    }
    if (rv) {
      x->cur = save;
      x->status = HR_ERR_IO;
      fi_why(f, x->why, sizeof x->why,
             x->kind == K_WRITE  ? "fi_writemsg"
             : x->kind == K_SEND ? "fi_tsendmsg"
                                 : "fi_trecvmsg",
             (int)rv);
      return;
    }
    s->busy = 1;
    x->inflight++;
    x->posted++;
    f->st.pieces++;
  }
}

/* Ends an xop once nothing of it is in flight. */
static int maybe_finish(hr_fabric *f, fab_xop *x) {
  if (x->inflight)
    return 0;
  if (!x->status && !x->cancelled && x->completed < x->total)
    return 0;
  int status = x->status                                 ? x->status
               : x->cancelled && x->succeeded < x->total ? HR_ERR_CLOSED
                                                         : 0;
  char why[sizeof x->why];
  memcpy(why, x->why, sizeof why);
  if (status == HR_ERR_CLOSED && !why[0])
    hr__fab_why(why, sizeof why, "cancelled");
  hr_fabric_op *op = x->op;
  xop_unlink(f, x);
  xop_free(f, x);
  if (status)
    f->st.ops_failed++;
  op->backend = NULL;
  op->done(op, status, status ? why : NULL);
  return 1;
}

/* Cancels the receives still posted (after an error or a cancel). */
static void cancel_posted(hr_fabric *f, fab_xop *x) {
  for (uint32_t i = 0; i < x->nslots; i++)
    if (x->slots[i].busy)
      fi_cancel(&f->ep->fid, &x->slots[i].ctx);
}

static void piece_done(hr_fabric *f, fab_piece *s, int err, size_t len,
                       const char *text) {
  fab_xop *x = s->x;
  s->busy = 0;
  x->inflight--;
  x->completed++;
  if (err) {
    if (!(err == FI_ECANCELED && x->cancelled) && !x->status) {
      x->status = HR_ERR_IO;
      hr__fab_why(x->why, sizeof x->why, "%s", text);
      if (x->kind == K_RECV)
        cancel_posted(f, x);
    }
  } else if (x->kind == K_RECV && len != s->len && !x->status) {
    x->status = HR_ERR_PROTO;
    hr__fab_why(x->why, sizeof x->why,
                "a tagged message of %zu bytes met a receive of %llu", len,
                (unsigned long long)s->len);
    cancel_posted(f, x);
  } else if (!err) {
    x->succeeded++;
    if (x->kind == K_WRITE)
      f->st.bytes_written += s->len;
    else if (x->kind == K_SEND)
      f->st.bytes_sent += s->len;
    else
      f->st.bytes_received += len;
  }
}

static void fail_everything(hr_fabric *f, const char *text) {
  for (fab_xop *x = f->ops; x; x = x->next) {
    if (!x->status) {
      x->status = HR_ERR_IO;
      hr__fab_why(x->why, sizeof x->why, "%s", text);
    }
    /* Nothing will complete any more: forget what is in flight. */
    for (uint32_t i = 0; i < x->nslots; i++)
      x->slots[i].busy = 0;
    x->inflight = 0;
  }
}

/* Reads the CQ until it is empty (or the budget is spent). */
static int drain(hr_fabric *f, int *more) {
  struct fi_cq_tagged_entry e[CQ_BATCH];
  int budget = CQ_BUDGET;
  *more = 0;
  while (budget > 0) {
    ssize_t n = fi_cq_read(f->cq, e, CQ_BATCH);
    if (n == -FI_EAGAIN)
      return 0;
    if (n > 0) {
      for (ssize_t k = 0; k < n; k++) {
        f->st.completions++;
        if (e[k].op_context)
          piece_done(f, e[k].op_context, 0, e[k].len, "");
      }
      budget -= (int)n;
      continue;
    }
    if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err;
      char text[160], buf[128];
      memset(&err, 0, sizeof err);
      ssize_t r = fi_cq_readerr(f->cq, &err, 0);
      if (r == -FI_EAGAIN) {
        budget--;
        continue;
      }
      if (r < 0) {
        n = r;
      } else {
        f->st.completions++;
        f->st.cq_errors++;
        const char *pt = fi_cq_strerror(f->cq, err.prov_errno, err.err_data,
                                        buf, sizeof buf);
        hr__fab_why(text, sizeof text, "completion error: %s (%s)",
                    f->lib.strerror(err.err), pt ? pt : "");
        if (err.op_context)
          piece_done(f, err.op_context, err.err, err.len, text);
        budget--;
        continue;
      }
    }
    char text[160];
    fi_why(f, text, sizeof text, "fi_cq_read", (int)n);
    f->cq_failed = 1;
    fail_everything(f, text);
    return HR_ERR_IO;
  }
  *more = 1;
  return 0;
}

/* Posts what waits for room and ends what is over.  Finishing calls `done`,
 * which may start or cancel operations: restart the walk after each. */
static void service(hr_fabric *f) {
  for (;;) {
    int again = 0;
    for (fab_xop *x = f->ops; x; x = x->next) {
      post_more(f, x);
      if (maybe_finish(f, x)) {
        again = 1;
        break;
      }
    }
    if (!again)
      return;
  }
}

int hr_fabric_progress(hr_fabric *f, hr_tstamp now) {
  f->last_poll = now;
  f->st.progress_calls++;
  take_invalidations(f);
  if (f->down) {
    f->need_progress = 0;
    return 0;
  }
  for (int round = 0; round < TRYWAIT_ROUNDS; round++) {
    int more;
    int rv = drain(f, &more);
    service(f);
    if (rv)
      return rv;
    if (more)
      break;
    if (f->wait_fd < 0) {
      f->need_progress = 0;
      f->armed = 0;
      return 0;
    }
    f->need_progress = 0;
    struct fid *fids[1] = {&f->cq->fid};
    int t = fi_trywait(f->fabric, fids, 1);
    if (t == 0) {
      f->armed = 1;
      return 0;
    }
    if (t != -FI_EAGAIN) {
      /* The wait object cannot be armed: poll on the timer instead. */
      f->wait_fd = -1;
      f->st.wait_fd = 0;
      f->armed = 0;
      return 0;
    }
    f->st.trywait_again++;
  }
  /* Still busy: come back on the next loop turn rather than spin here. */
  f->armed = 0;
  f->need_progress = 1;
  return 0;
}

int hr_fabric_shutdown(hr_fabric *f) {
  if (!f || f->down)
    return 0;
  f->down = 1;
  /* Closing the endpoint discards what is in flight: nothing completes
   * and nothing touches the buffers after it returns. */
  int rv = fi_close(&f->ep->fid);
  f->ep = NULL;
  f->wait_fd = -1;
  f->st.wait_fd = 0;
  for (fab_xop *x = f->ops; x; x = x->next) {
    for (uint32_t i = 0; i < x->nslots; i++)
      x->slots[i].busy = 0;
    x->inflight = 0;
    if (!x->status) {
      x->status = HR_ERR_CLOSED;
      hr__fab_why(x->why, sizeof x->why, "the fabric was shut down");
    }
  }
  /* `done` may start operations (refused now) or cancel others. */
  while (f->ops)
    maybe_finish(f, f->ops);
  return rv ? HR_ERR_IO : 0;
}

hr_tstamp hr_fabric_get_expiry(const hr_fabric *f) {
  if (f->need_progress || hr__fab_track_pending(f->track))
    return 0;
  if (f->wait_fd >= 0)
    return f->armed ? HR_TSTAMP_NEVER : 0;
  if (!f->ops && !f->remote_mrs)
    return HR_TSTAMP_NEVER;
  return f->last_poll + f->cfg.poll_interval;
}

/* ---- the ops ---- */

static int fab_write(void *ctx, void *peer, const hr_fabric_region *src,
                     const hr_fabric_key *dst, hr_fabric_op *op, char *why,
                     size_t cap) {
  hr_fabric *f = ctx;
  if (dst->raw_key_len && !(f->mr_mode & FI_MR_RAW)) {
    hr__fab_why(why, cap, "a raw key, and %s uses none", f->provider);
    return HR_ERR_UNSUPPORTED;
  }
  if (dst->length < src->length) {
    hr__fab_why(why, cap, "the destination is shorter than the region");
    return HR_ERR_UNSUPPORTED;
  }
  fab_xop *x;
  int rv = xop_new(f, K_WRITE, peer, src, op, &x, why, cap);
  if (rv)
    return rv;
  x->raddr = dst->address;
  if (dst->raw_key_len) {
    uint8_t raw[HR_FABRIC_RAW_KEY_MAX];
    memcpy(raw, dst->raw_key, dst->raw_key_len);
    int m = fi_mr_map_raw(f->domain, dst->address, raw, dst->raw_key_len,
                          &x->rkey, 0);
    if (m) {
      xop_free(f, x);
      fi_why(f, why, cap, "fi_mr_map_raw", m);
      return HR_ERR_UNSUPPORTED;
    }
    x->key_mapped = 1;
  } else {
    x->rkey = dst->key;
  }
  xop_start(f, x);
  post_more(f, x);
  return 0;
}

static int fab_send(void *ctx, void *peer, uint64_t tag,
                    const hr_fabric_region *src, hr_fabric_op *op, char *why,
                    size_t cap) {
  hr_fabric *f = ctx;
  fab_xop *x;
  int rv = xop_new(f, K_SEND, peer, src, op, &x, why, cap);
  if (rv)
    return rv;
  x->tag = tag;
  xop_start(f, x);
  post_more(f, x);
  return 0;
}

static int fab_recv(void *ctx, void *peer, uint64_t tag,
                    const hr_fabric_region *dst, hr_fabric_op *op, char *why,
                    size_t cap) {
  hr_fabric *f = ctx;
  fab_peer *p = peer;
  /* Tags are stream ids, unique per connection only: two connections from
   * one peer endpoint (or from any, without directed receive) must not
   * have receives of one tag posted at once. */
  for (fab_xop *o = f->ops; o; o = o->next)
    if (o->kind == K_RECV && o->tag == tag &&
        (!f->directed || o->peer == p->addr)) {
      hr__fab_why(why, cap, "receives with tag %llu are posted already",
                  (unsigned long long)tag);
      return HR_ERR_BUSY;
    }
  fab_xop *x;
  int rv = xop_new(f, K_RECV, peer, dst, op, &x, why, cap);
  if (rv)
    return rv;
  x->tag = tag;
  post_more(f, x);
  if (x->status) {
    /* Nothing completes for a post that failed; cancel what went out. */
    int status = x->status;
    hr__fab_why(why, cap, "%s", x->why);
    if (x->inflight == 0) {
      xop_free(f, x);
      return status;
    }
    cancel_posted(f, x);
  }
  xop_start(f, x);
  return 0;
}

static void fab_cancel(void *ctx, hr_fabric_op *op) {
  hr_fabric *f = ctx;
  fab_xop *x = op->backend;
  if (!x || x->cancelled || f->down)
    return;
  x->cancelled = 1;
  /* Receives can be taken back; writes and sends in flight run to their
   * completion, and no new piece is posted. */
  if (x->kind == K_RECV)
    cancel_posted(f, x);
  f->need_progress = 1;
}

static void *fab_tracker(void *ctx) {
  return hr__fab_track_ref(((hr_fabric *)ctx)->track);
}

static void fab_tracker_invalidate(void *trk, const void *ptr, uint64_t len) {
  hr__fab_track_push(trk, ptr, len);
}

static void fab_tracker_unref(void *trk) {
  hr__fab_track_unref(trk);
}

static const hr_fabric_ops fabric_ops = {sizeof(hr_fabric_ops),
                                         fab_peer_add,
                                         fab_peer_del,
                                         fab_reg,
                                         fab_dereg,
                                         fab_write,
                                         fab_send,
                                         fab_recv,
                                         fab_cancel,
                                         fab_tracker,
                                         fab_tracker_invalidate,
                                         fab_tracker_unref};

const hr_fabric_ops *hr_fabric_get_ops(void) {
  return &fabric_ops;
}
