/*
 * The fake fabric under the session targets (see fuzz_session.h).
 */
#include "fuzz_session.h"

#ifdef FZ_FABRIC

#include <stdlib.h>
#include <string.h>

#include <hurray/fabric.h>

#include "fabric/hr_fab_fake.h"

#ifdef FZ_DEVICE
#include <hurray/gpu.h>
#endif

#define PEER_OPS 8
#define PEER_REGS 4
#define PEER_BUF 4096

typedef struct peer_op {
  hr_fabric_op op;
  int active;
  hr_fabric_region r;
} peer_op;

struct fz_fabric {
  hr__fake_world *w;
  hr__fake_ep *me, *peer;
  void *peer_handle; /* the peer's view of "me" */
  uint8_t ext[512];  /* our FABRIC_ADDRESS extension */
  uint16_t ext_len;
  uint8_t buf[PEER_BUF];
  peer_op ops[PEER_OPS];
  void *mr[PEER_REGS];
  int nmr;
};

void fz_fabric_init(fz_driver *d) {
  struct fz_fabric *f = calloc(1, sizeof *f);
  if (f == NULL)
    hr_fuzz_fail("out of memory");
  /* Keys carry offsets, not addresses, so that an input can name them
   * (the fake numbers its keys from 0x1000 in each world). */
  if (hr__fake_world_new(&f->w, NULL) != 0 ||
      hr__fake_ep_new(&f->me, f->w, "me", 0, 0) != 0 ||
      hr__fake_ep_new(&f->peer, f->w, "peer", 0, 0) != 0)
    hr_fuzz_fail("the fake fabric could not be set up");
#ifdef FZ_DEVICE
  /* Both ends reach the simulated device's memory: device tensors can be
   * GPUDirect sources and destinations. */
  hr__fake_set_hmem(f->me, HR_GPU_DEV_SIM);
  hr__fake_set_hmem(f->peer, HR_GPU_DEV_SIM);
#endif
  uint8_t addr[128];
  int64_t n = hr__fake_address(f->me, addr, sizeof addr);
  int e = n > 0 ? hr_ext_put(f->ext, sizeof f->ext, HR_EXT_FABRIC_ADDRESS, addr,
                             (uint16_t)n)
                : -1;
  if (e <= 0)
    hr_fuzz_fail("the FABRIC_ADDRESS extension could not be built");
  f->ext_len = (uint16_t)e;
  char why[128];
  if (hr__fake_ops()->peer_add(f->peer, (const uint8_t *)"fake", 4,
                               (const uint8_t *)"me", 2, NULL, 0,
                               &f->peer_handle, why, sizeof why) != 0)
    hr_fuzz_fail("the peer endpoint cannot reach ours");
  d->fab = f;
}

void fz_fabric_settings(const fz_driver *d, hr_settings *set) {
  const struct fz_fabric *f = d->fab;
  if (f == NULL)
    return;
  set->fabric_ops = hr__fake_ops();
  set->fabric_ctx = f->me;
  set->fabric_caps = HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT;
  set->hello_ext = f->ext;
  set->hello_ext_len = f->ext_len;
  set->hello_ext_count = 1;
  /* The fixtures are small: 256 bytes splits them between the data
   * plane and frames. */
  set->rdma_min_bytes = 256;
}

void fz_fabric_step(fz_driver *d) {
  struct fz_fabric *f = d->fab;
  if (f == NULL)
    return;
  hr__fake_progress(f->me);
  hr__fake_progress(f->peer);
}

static void peer_done(hr_fabric_op *op, int status, const char *why) {
  peer_op *p = op->user_data;
  if (status != 0 && why == NULL)
    hr_fuzz_fail("a fabric operation failed without a reason");
  p->active = 0;
}

static peer_op *free_op(struct fz_fabric *f) {
  for (int i = 0; i < PEER_OPS; i++)
    if (!f->ops[i].active)
      return &f->ops[i];
  return NULL;
}

static void region(struct fz_fabric *f, hr_fabric_region *r, uint64_t len) {
  memset(r, 0, sizeof *r);
  r->length = len;
  r->device_tag = HR_DEV_CPU;
  r->nseg = 1;
  r->seg[0].ptr = f->buf;
  r->seg[0].len = len;
}

/* u16 big-endian, at most the peer's buffer. */
static uint64_t take_len(fz_driver *d) {
  uint64_t hi = fz_take(&d->in);
  uint64_t len = hi << 8 | fz_take(&d->in);
  return len < PEER_BUF ? len : PEER_BUF;
}

static void tagged(fz_driver *d, int recv) {
  struct fz_fabric *f = d->fab;
  uint64_t len = take_len(d);
  uint64_t tag = fz_take(&d->in);
  uint64_t piece = (uint64_t)(recv ? 0 : fz_take(&d->in)) * 8;
  peer_op *p = free_op(f);
  if (p == NULL)
    return;
  hr__fake_faults_of(f->peer)->send_piece = piece;
  region(f, &p->r, len);
  memset(&p->op, 0, sizeof p->op);
  p->op.done = peer_done;
  p->op.user_data = p;
  char why[128];
  const hr_fabric_ops *ops = hr__fake_ops();
  int rv = recv ? ops->recv(f->peer, f->peer_handle, tag, &p->r, &p->op, why,
                            sizeof why)
                : ops->send(f->peer, f->peer_handle, tag, &p->r, &p->op, why,
                            sizeof why);
  if (rv == 0)
    p->active = 1;
}

void fz_fabric_action(fz_driver *d, uint8_t c) {
  struct fz_fabric *f = d->fab;
  if (f == NULL)
    return;
  switch (c % 6) {
  case 0: hr__fake_progress(f->me); break;
  case 1: hr__fake_progress_one(f->me); break;
  case 2: hr__fake_progress(f->peer); break;
  case 3: tagged(d, 1); break;
  case 4: tagged(d, 0); break;
  default: {
    uint64_t len = take_len(d);
    if (f->nmr == PEER_REGS)
      break;
    hr_fabric_region r;
    region(f, &r, len);
    hr_fabric_key key;
    char why[128];
    if (hr__fake_ops()->reg(f->peer, &r, HR_FABRIC_REMOTE_WRITE, &key,
                            &f->mr[f->nmr], why, sizeof why) == 0)
      f->nmr++;
    break;
  }
  }
}

void fz_fabric_done(fz_driver *d) {
  struct fz_fabric *f = d->fab;
  if (f == NULL)
    return;
  const hr_fabric_ops *ops = hr__fake_ops();
  for (int i = 0; i < PEER_OPS; i++)
    if (f->ops[i].active)
      ops->cancel(f->peer, &f->ops[i].op);
  for (int rounds = 0;; rounds++) {
    if (rounds == 10000)
      hr_fuzz_fail("the fake fabric never settles");
    if (hr__fake_progress(f->me) + hr__fake_progress(f->peer) == 0)
      break;
  }
  for (int i = 0; i < PEER_OPS; i++)
    if (f->ops[i].active)
      hr_fuzz_fail("a cancelled fabric operation never ended");
  hr__fake_stats st;
  hr__fake_get_stats(f->me, &st);
  if (st.live_regs != 0)
    hr_fuzz_fail("a remote registration outlived its session");
  for (int i = 0; i < f->nmr; i++)
    ops->dereg(f->peer, f->mr[i]);
  ops->peer_del(f->peer, f->peer_handle);
  hr__fake_ep_del(f->me);
  hr__fake_ep_del(f->peer);
  hr__fake_world_del(f->w);
  free(f);
  d->fab = NULL;
}

#else /* !FZ_FABRIC */

void fz_fabric_init(fz_driver *d) {
  d->fab = NULL;
}
void fz_fabric_settings(const fz_driver *d, hr_settings *set) {
  (void)d;
  (void)set;
}
void fz_fabric_step(fz_driver *d) {
  (void)d;
}
void fz_fabric_action(fz_driver *d, uint8_t c) {
  (void)d;
  (void)c;
}
void fz_fabric_done(fz_driver *d) {
  (void)d;
}

#endif
