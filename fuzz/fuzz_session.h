/*
 * The driver the two session targets share (fuzz_server_session,
 * fuzz_client_session): one hr_session fed the input's bytes in chunks
 * the input chooses, its output pulled, partly consumed and checked, a
 * fake clock advanced and its work items run in an order the input
 * chooses.
 *
 * Input layout (fuzz/seed_corpus.py writes the same):
 *   u8 mode    bit 0 manual output (else everything is pulled and consumed
 *              after each command), bit 1 zero-copy receive through
 *              hr_session_recv_target(), bit 2 deferred work (else the
 *              session runs it inline), bit 3 delete the session before
 *              its outstanding work is reported, bit 4 small frames (64
 *              data bytes), bits 5-7 the target's own
 *   commands, each one byte c: op = c >> 5, arg = c & 31
 *     0-3  feed (arg + 1) << (4 * op) bytes of the rest (at most what is
 *          left): op 0 1-32 bytes, 1 16-512, 2 256-8 KiB, 3 4-128 KiB
 *     4    advance the clock by 2^arg ns, then run the expiry if due
 *     5    pull into 1 + (arg & 7) iovecs and consume: arg >> 3 = 0 all,
 *          1 half, 2 one byte, 3 nothing
 *     6    run the deferred work item arg % count (run and report it)
 *     7    the target's action `arg` (more bytes may follow)
 *   When the input ends: all work is run, the output drained, and the
 *   session deleted.  A target with several connections (fz_conn_add)
 *   has the output of all of them pulled after each command (a call on
 *   one lane may give another output), and all deleted at the end.
 *
 * Checked: no crash, leak or UB (the sanitizers); hr_session_recv takes
 * all of its input or fails fatally; what the session sends is a stream
 * of well-formed messages (every one decodes), in the direction its role
 * sends; a descriptor attached to the output (hr_session_pull_fd) goes
 * with a TENSOR_DESCRIPTOR or TENSOR_PUT whose data_plane is SHM; a
 * session that failed fatally stays failed.
 *
 * With HR_FUZZ_TRACE set in the environment, every message the session
 * sends is listed on stderr (to see what a seed reaches).
 */
#ifndef HR_FUZZ_SESSION_H
#define HR_FUZZ_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include <hurray/session.h>
#include <hurray/tensor.h>
#include <hurray/wire.h>

#include "fuzz_check.h"

#define FZ_MODE_MANUAL_OUT 0x01
#define FZ_MODE_ZERO_COPY 0x02
#define FZ_MODE_DEFER_WORK 0x04
#define FZ_MODE_DEL_EARLY 0x08
#define FZ_MODE_SMALL_FRAMES 0x10

#define FZ_MAX_WORK 256
#define FZ_MAX_CONNS 4

typedef struct fz_input {
  const uint8_t *p;
  size_t n;
} fz_input;

/* The next input byte (0 once the input is used up). */
uint8_t fz_take(fz_input *in);

/* One connection's session and its output checker (fz_conn_add). */
typedef struct fz_conn {
  hr_session *s;
  hr_reader *out_rd;
  int dead;
  int fd_due;
} fz_conn;

typedef struct fz_driver fz_driver;
struct fz_driver {
  hr_session *s;
  hr_tstamp now;
  uint8_t mode;
  fz_input in;
  int dead;       /* a call failed fatally: only del is left */
  hr_mem mem;     /* malloc, refusing single blocks over 64 MiB */
  hr_work *work[FZ_MAX_WORK];
  int nwork;
  /* The output checker: the session's byte stream, parsed. */
  hr_reader *out_rd;
  int role;
  int trace; /* HR_FUZZ_TRACE set: what the session sends, on stderr */
  /* The target's action for op 7. */
  void (*action)(fz_driver *d, unsigned arg);
  void *target;
  /* The fake fabric (fuzz_fabric.c; NULL where fabric/ is not built). */
  struct fz_fabric *fab;
  /* Several connections to one server (lanes of a session, or separate
   * sessions): conns[cur] is the one s, dead, out_rd and fd_due stand
   * for; the others are kept here (fz_conn_add, fz_conn_switch).  With a
   * single connection nconns is 0 and only s counts. */
  fz_conn conns[FZ_MAX_CONNS];
  int nconns;
  int cur;
  /* The session each deferred work item belongs to. */
  hr_session *work_s[FZ_MAX_WORK];
  /* The SHM data plane: a descriptor hr_session_pull_fd() named went with
   * the bytes consumed, so the next message the checker sees must be a
   * descriptor with data_plane SHM. */
  int fd_due;
  /* Optional: checks such a descriptor (the target knows its segments). */
  void (*check_fd)(fz_driver *d, int fd);
};

/* Fills settings for a fuzzed session: short timeouts so the fake clock
 * reaches them, small frames with FZ_MODE_SMALL_FRAMES. */
void fz_settings(const fz_driver *d, hr_settings *set);
/* Callbacks: submit_work defers with FZ_MODE_DEFER_WORK; the others are
 * no-ops. */
hr_session_callbacks fz_callbacks(void);

/* Sets up the driver (mode byte taken from the input; the output checker
 * reads the direction `role` sends).  Call before creating the session. */
void fz_init(fz_driver *d, const uint8_t *data, size_t size, int role);
/* Runs the commands, then drains and deletes the session (every
 * connection's, lane 0 first). */
void fz_run(fz_driver *d);
/* Feeds the next `len` bytes of the input (fewer when it ends), as the
 * feed commands do. */
void fz_feed(fz_driver *d, size_t len);
/* Pulls and consumes everything the session has to send. */
void fz_drain(fz_driver *d);
/* Checks a return of the session API: a fatal one marks the driver dead. */
void fz_check_rv(fz_driver *d, int rv);
/* Another connection: session `s` (created by the target), with its own
 * output checker.  Returns its index, or -1 when FZ_MAX_CONNS are open
 * (then the target deletes s).  The current connection stays current. */
int fz_conn_add(fz_driver *d, hr_session *s);
/* Makes connection i current (feeds, pulls and actions go to it). */
void fz_conn_switch(fz_driver *d, int i);

/*
 * The RDMA data plane on the fake fabric (fuzz_fabric.c).  Where fabric/
 * is built (FZ_FABRIC), every fuzzed session gets a fake endpoint "me"
 * and advertises RDMA_DATA_PLANE and RDMA_GPUDIRECT with its
 * FABRIC_ADDRESS; a second endpoint "peer" of the same world stands for
 * the fuzzed side's fabric.  A HELLO naming provider "fake" and endpoint
 * "peer" with those flags makes the connection's RDMA usable, so the
 * session's RDMA glue and handshakes run on hostile messages.
 *
 * fz_fabric_init() (called by fz_init) sets up the world, fz_settings()
 * names it in the settings (fz_fabric_settings()); fz_fabric_step() runs
 * both endpoints' fake progress (after each command unless the output is
 * manual);
 * fz_fabric_action() runs one fabric command, c (read by the target) and
 * what follows it in the input:
 *   c % 6 = 0 our progress, 1 one completion of ours, 2 the peer's
 *   progress, 3 the peer posts receives (u16 size, u8 stream id), 4 the
 *   peer sends tagged pieces (u16 size, u8 stream id, u8 piece x 8), 5 the
 *   peer registers a buffer for RMA writes (u16 size); sizes big-endian,
 *   at most 4096
 * fz_fabric_done() runs after the session is deleted: it lets the fabric
 * finish, checks that no remote registration of ours is left open, and
 * frees the world.  Without FZ_FABRIC all of them do nothing.
 */
void fz_fabric_init(fz_driver *d);
void fz_fabric_settings(const fz_driver *d, hr_settings *set);
void fz_fabric_step(fz_driver *d);
void fz_fabric_action(fz_driver *d, uint8_t c);
void fz_fabric_done(fz_driver *d);

/* A dense tensor with deterministic contents (NULL on a bad
 * description). */
hr_tensor *fz_dense(uint8_t elem, uint8_t layout, unsigned rank,
                    const uint64_t *shape, const hr_layout_params *params,
                    uint8_t seed);
/* A CSR matrix (f32 values, i32 indices) with a value in every other
 * row. */
hr_tensor *fz_csr(uint64_t rows, uint64_t cols);
/* A TUPLE composite of a and b. */
hr_tensor *fz_tuple(hr_tensor *a, hr_tensor *b);

#endif /* HR_FUZZ_SESSION_H */
