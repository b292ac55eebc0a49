/*
 * The fake fabric: a deterministic, in-memory hr_fabric_ops for tests.
 *
 * A world holds endpoints; each endpoint is the ops ctx of one peer.  RMA
 * writes resolve the destination key in the target endpoint's live
 * registrations (a revoked key fails the write, as on a real NIC), tagged
 * sends match the target's posted receives in order (or wait in its
 * unexpected queue), and everything completes through a FIFO per endpoint
 * that only hr__fake_progress() drains: nothing happens behind the test's
 * back.  Faults can be injected at every step.
 */
#ifndef HR_FAB_FAKE_H
#define HR_FAB_FAKE_H

#include <hurray/fabric.h>

typedef struct hr__fake_world hr__fake_world;
typedef struct hr__fake_ep hr__fake_ep;

/* Faults, read at the step they name; counters are decremented as they
 * fire (N > 0: the next N such steps fail). */
typedef struct hr__fake_faults {
  int peer_add;    /* peer_add refuses the address */
  int reg_source;  /* a REMOTE_READ registration is refused */
  int reg_dest;    /* a REMOTE_WRITE registration is refused */
  int write_start; /* write() refuses to start */
  int send_start;  /* send() refuses to start */
  int recv_start;  /* recv() refuses to start */
  int write_error; /* the write completes with HR_ERR_IO, nothing copied */
  int send_error;  /* the sends complete with HR_ERR_IO, nothing sent */
  int recv_error;  /* the receives complete with HR_ERR_IO */
  /* >= 0: a write or send moves this many bytes, then the peer is gone
   * (HR_ERR_CLOSED); -1: off. */
  int64_t peer_gone_after;
  /* Non-zero: send() cuts pieces of this size instead of the rule (to
   * test a receiver meeting a foreign cut). */
  uint64_t send_piece;
} hr__fake_faults;

typedef struct hr__fake_stats {
  uint64_t regs;      /* remote registrations made */
  uint64_t deregs;    /* and revoked */
  uint64_t live_regs; /* open now */
  uint64_t peers;     /* peer_add successes minus peer_del */
  uint64_t writes;    /* operations started */
  uint64_t sends;
  uint64_t recvs;
  uint64_t cancels;    /* cancel() calls */
  uint64_t bytes;      /* bytes this endpoint wrote or sent */
  uint64_t unexpected; /* tagged pieces that waited for a receive */
  /* Ranges reported freed through the ops' tracker, taken by
   * hr__fake_progress(), and the last one. */
  uint64_t invalidations;
  const void *last_invalidated;
  uint64_t last_invalidated_len;
} hr__fake_stats;

/* Creates a world (mem NULL: default).  Returns 0 or HR_ERR_NOMEM. */
int hr__fake_world_new(hr__fake_world **out, const hr_mem *mem);
/* Frees the world; its endpoints must be gone. */
void hr__fake_world_del(hr__fake_world *w);

/*
 * Creates an endpoint named `name` (its fi_getname).  `virt_addr`: keys
 * carry virtual addresses (else offsets from 0); `raw_keys`: keys travel
 * as raw bytes (FI_MR_RAW), with `key` 0.  Returns 0, HR_ERR_NOMEM,
 * HR_ERR_INVALID_ARGUMENT (a name in use).
 */
int hr__fake_ep_new(hr__fake_ep **out, hr__fake_world *w, const char *name,
                    int virt_addr, int raw_keys);
/* Frees an endpoint; pending operations are dropped without completion. */
void hr__fake_ep_del(hr__fake_ep *e);

const hr_fabric_ops *hr__fake_ops(void);

/* The FABRIC_ADDRESS value of the endpoint (provider "fake"). */
int64_t hr__fake_address(const hr__fake_ep *e, uint8_t *out, size_t cap);

/* Runs this endpoint's started operations, then delivers its completions,
 * until nothing is left; returns how many completions were delivered. */
int hr__fake_progress(hr__fake_ep *e);
/* Runs the started operations and delivers at most one completion;
 * returns 1 if it delivered one. */
int hr__fake_progress_one(hr__fake_ep *e);
/* Completions waiting for delivery plus operations not run yet. */
size_t hr__fake_pending(const hr__fake_ep *e);

hr__fake_faults *hr__fake_faults_of(hr__fake_ep *e);
void hr__fake_get_stats(const hr__fake_ep *e, hr__fake_stats *st);

/* Writes `len` bytes from `src` into the endpoint `target`'s registration
 * named by `key` at `address`, as a raw RMA write would, without a
 * handshake.  Returns 0, or HR_ERR_IO when the key opens nothing there
 * (revoked, never issued, wrong access or out of bounds). */
int hr__fake_poke(hr__fake_ep *target, const hr_fabric_key *key,
                  uint64_t address, const void *src, uint64_t len);

#endif /* HR_FAB_FAKE_H */
