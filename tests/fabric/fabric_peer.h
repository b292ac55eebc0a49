/*
 * A peer for the end-to-end tests over real libfabric providers: an
 * hr_fabric (one endpoint), a connection towards the other peer, one
 * handshake at a time, and a control channel (a SOCK_SEQPACKET socketpair
 * carrying the wire-encoded messages, in place of the engine's TCP
 * connection).  The loop is the engine's: poll the control socket and the
 * completion queue's fd, arm a timer for hr_fabric_get_expiry(), and call
 * hr_fabric_progress().
 */
#ifndef HR_TEST_FABRIC_PEER_H
#define HR_TEST_FABRIC_PEER_H

#include <stddef.h>
#include <stdint.h>

#include <hurray/fabric.h>

#define FP_MAXEV 8

typedef struct fp_event {
  int kind;
  uint32_t code;
  int sent;
  int retry;
  int destination;
  char message[300];
  char fallback[300];
} fp_event;

typedef struct fpeer {
  const char *name;
  hr_fabric *f;
  hr_rdma_conn *conn;
  hr_rdma *x;
  int ctl; /* our end of the control channel */
  fp_event ev[FP_MAXEV];
  int nev;
  int released;
  int commit_code;        /* PUT receiver: commit with this code - 1, if set */
  hr_fabric_key last_key; /* the last RDMA_REGISTER we sent */
  uint32_t sent[16];
  int nsent;
} fpeer;

/* The provider to test ("tcp" or "shm") as libfabric names it. */
const char *fp_provider_name(const char *short_name);

/* Whether libfabric opens `provider` on loopback here, as main() asks
 * before running the tests: 0 yes, 77 (the CTest skip) when it has no
 * such provider, 1 when opening failed otherwise (both say why on
 * stderr). */
int fp_probe(const char *provider);

/* Opens the peer's fabric for `provider` ("tcp;ofi_rxm" or "shm") on
 * loopback.  Returns 0, or HR_ERR_UNSUPPORTED when the provider is absent
 * (the test then exits 77); anything else fails the test. */
int fp_open(fpeer *p, const char *name, const char *provider,
            const hr_fabric_config *cfg);

/* Connects two opened peers: control channel, FABRIC_ADDRESS exchange,
 * connections with the given HELLO capability flags. */
void fp_connect(fpeer *a, fpeer *b, uint32_t caps_a, uint32_t caps_b);

/* Creates and starts a handshake on `p` (side, direction, stream). */
void fp_begin(fpeer *p, int side, int dir, uint32_t stream,
              const hr_descriptor *d, uint64_t total, void *const *buffers,
              int register_destination);

/* One turn of the loop of `n` peers: wait (at most `max_ms`) for their
 * control sockets, CQ fds and expiries, then handle what is ready. */
void fp_turn(fpeer *const *peers, int n, int max_ms);

/* Runs turns until every peer's handshake reported a final event and the
 * release, or `seconds` passed (then the test fails). */
void fp_run(fpeer *const *peers, int n, double seconds);

/* Deletes the handshake, the connection and the fabric (checking that the
 * fabric is idle and closes). */
void fp_close(fpeer *p);

/* Monotonic now in ns. */
hr_tstamp fp_now(void);

/* A descriptor of n UINT8 buffers with the given sizes and alignments. */
void fp_desc(hr_descriptor *d, unsigned n, const uint64_t *sizes,
             const uint8_t *align_log2);

/* Allocates n buffers back to back in one block (free bufs[0] only) and
 * fills them (pattern seed) or zeroes them (seed 0). */
void fp_buffers(uint8_t **bufs, unsigned n, const uint64_t *sizes,
                unsigned seed);

#endif /* HR_TEST_FABRIC_PEER_H */
