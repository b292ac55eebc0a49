/*
 * libhurray: the RDMA data plane (fabric/).
 *
 * Three pieces, from the bottom up:
 *
 *  1. hr_fabric_ops: what the data plane needs from an RDMA library, as an
 *     ops table (size first).  Two implementations exist: the real one over
 *     libfabric (hr_fabric, below) and a deterministic in-memory fake used by
 *     the tests (fabric/hr_fab_fake.h).
 *
 *  2. hr_fabric: one libfabric domain, RDM endpoint, address vector and
 *     completion queue per engine, shared by all its sessions.  It picks the
 *     provider, produces the FABRIC_ADDRESS HELLO extension, owns the
 *     registration cache, and joins the engine's event loop through the
 *     completion queue's wait fd (or a timer where the provider has none).
 *
 *  3. hr_rdma_conn and hr_rdma: the sans-IO RDMA handshake (docs/protocol.md
 *     § 16).  An hr_rdma_conn is the RDMA state of one connection (the peer's
 *     address and capabilities, and whether RDMA still may be used on it); an
 *     hr_rdma is the handshake of one tensor on one stream, either side, GET
 *     or PUT.  It consumes RDMA_REGISTER, RDMA_READY, TENSOR_DATA_END,
 *     TENSOR_PUT_ACK and ERROR, produces the same through a callback, and
 *     moves the bytes through the ops table.
 *
 * This header needs no libfabric headers.  Everything here runs on one
 * thread (the engine's loop thread): an hr_fabric and the hr_rdma objects
 * using it must not be called from two threads at once.  Callbacks run on
 * that thread, from hr_rdma_* calls or from the backend's progress call
 * (hr_fabric_progress()).
 */
#ifndef HURRAY_FABRIC_H
#define HURRAY_FABRIC_H

#include <hurray/common.h>
#include <hurray/wire.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Regions, keys and operations                                              */
/* ------------------------------------------------------------------------ */

/* The longest raw key (FI_MR_RAW) the data plane accepts or produces. */
#define HR_FABRIC_RAW_KEY_MAX 256u

/* One piece of memory of a region. */
typedef struct hr_fabric_seg {
  void *ptr;    /* first byte (may be NULL only when len is 0) */
  uint64_t len; /* bytes */
} hr_fabric_seg;

/*
 * An RDMA region: the bytes [0, length) of a tensor as the data plane sees
 * them, made of `nseg` memory segments back to back.  hr_rdma builds one
 * segment per descriptor buffer (empty ones included), so that both sides
 * cut the region at the same places (see hr_fabric_tag_piece()).
 */
typedef struct hr_fabric_region {
  uint64_t length;       /* sum of the segments' lengths */
  uint8_t device_tag;    /* HR_DEV_*: where all segments live */
  uint16_t device_index; /* which device of that kind */
  uint8_t nseg;          /* 0 to HR_MAX_BUFFERS */
  hr_fabric_seg seg[HR_MAX_BUFFERS];
} hr_fabric_region;

/* What one RDMA_REGISTER carries: a region's remote access. */
typedef struct hr_fabric_key {
  uint64_t length;      /* the region's length */
  uint64_t address;     /* virtual address, or offset where the provider lacks
                           FI_MR_VIRT_ADDR; the remote side adds its offsets */
  uint64_t key;         /* the memory-region key (0 with a raw key) */
  uint16_t raw_key_len; /* 0: no raw key */
  uint8_t raw_key[HR_FABRIC_RAW_KEY_MAX]; /* FI_MR_RAW providers */
} hr_fabric_key;

/* Access of a remote registration. */
#define HR_FABRIC_REMOTE_READ 1  /* a SOURCE region */
#define HR_FABRIC_REMOTE_WRITE 2 /* a DESTINATION region */

/*
 * One asynchronous data operation (an RMA write, the tagged sends or the
 * tagged receives of one region).  The caller owns the struct, fills `done`
 * (and `user_data`) and keeps it alive until `done` has been called.
 */
typedef struct hr_fabric_op hr_fabric_op;
struct hr_fabric_op {
  /* Called exactly once when the operation ended and the backend no longer
   * touches the region's memory: `status` 0, or a negative HR_ERR_* with a
   * NUL-terminated `why` valid during the call (HR_ERR_CLOSED after
   * cancel(), HR_ERR_IO for a completion error, HR_ERR_PROTO when a
   * received piece had the wrong size).  Never called from inside the call
   * that started the operation. */
  void (*done)(hr_fabric_op *op, int status, const char *why);
  void *user_data; /* the caller's */
  void *backend;   /* the backend's, between the start and `done` */
};

/*
 * The fabric backend.  `ctx` is the backend object (for the real one, the
 * hr_fabric).  Functions that can fail write a NUL-terminated reason into
 * why[0..why_cap) (why_cap may be 0).  None of them calls an op's `done`
 * synchronously.
 */
typedef struct hr_fabric_ops {
  size_t size; /* sizeof(hr_fabric_ops) */
  /* Resolves the peer's FABRIC_ADDRESS (provider name and fi_getname
   * bytes, both hostile input) into *peer.  `ctl_addr` (a struct sockaddr
   * of the control connection's peer, or NULL) lets the backend refuse a
   * fabric address on another host.  Returns 0, HR_ERR_UNSUPPORTED (other
   * provider, bad or unreachable address), HR_ERR_NOMEM. */
  int (*peer_add)(void *ctx, const uint8_t *provider, uint16_t provider_len,
                  const uint8_t *name, uint16_t name_len, const void *ctl_addr,
                  size_t ctl_addr_len, void **peer, char *why, size_t why_cap);
  /* Forgets a peer (no operation on it may be outstanding). */
  void (*peer_del)(void *ctx, void *peer);
  /* Registers `r` for one transfer with HR_FABRIC_REMOTE_READ or _WRITE and
   * fills *key; *mr receives the handle for dereg().  Returns 0,
   * HR_ERR_UNSUPPORTED (the memory cannot be registered: device memory the
   * provider cannot reach, too many segments), HR_ERR_IO, HR_ERR_NOMEM. */
  int (*reg)(void *ctx, const hr_fabric_region *r, int access,
             hr_fabric_key *key, void **mr, char *why, size_t why_cap);
  /* Revokes a registration: its key opens nothing afterwards. */
  void (*dereg)(void *ctx, void *mr);
  /* RMA-writes the whole of `src` into the remote region `dst` (from its
   * address on).  Returns 0 (op started), HR_ERR_UNSUPPORTED (the key
   * cannot be used, e.g. a raw key that does not map), HR_ERR_IO,
   * HR_ERR_NOMEM. */
  int (*write)(void *ctx, void *peer, const hr_fabric_region *src,
               const hr_fabric_key *dst, hr_fabric_op *op, char *why,
               size_t why_cap);
  /* Sends `src` as tagged messages cut by hr_fabric_tag_piece(). */
  int (*send)(void *ctx, void *peer, uint64_t tag, const hr_fabric_region *src,
              hr_fabric_op *op, char *why, size_t why_cap);
  /* Posts the receives for `dst`, cut like send() cuts, from `peer` with
   * `tag`.  Returns 0, HR_ERR_BUSY (receives with this peer and tag are
   * already posted), HR_ERR_IO, HR_ERR_NOMEM. */
  int (*recv)(void *ctx, void *peer, uint64_t tag, const hr_fabric_region *dst,
              hr_fabric_op *op, char *why, size_t why_cap);
  /* Asks a started op to end early.  It still ends through `done`, once,
   * when no piece of it is in flight any more. */
  void (*cancel)(void *ctx, hr_fabric_op *op);
  /* Registration invalidation from any thread (NULL: the backend caches
   * nothing).  tracker() (the fabric's thread) returns a new reference on
   * the backend's thread-safe invalidation handle, the same handle for
   * every call on one backend (NULL: out of memory).  With it, from any
   * thread and even after the backend is gone: tracker_invalidate() says
   * that [ptr, ptr + len) is being freed (the backend closes its cached
   * registrations there before it registers anything again, and wakes its
   * loop through hr_fabric_set_wake()); tracker_unref() drops the
   * reference.  The session watches every tensor it moves over the data
   * plane and reports its buffers when the tensor is freed. */
  void *(*tracker)(void *ctx);
  void (*tracker_invalidate)(void *trk, const void *ptr, uint64_t len);
  void (*tracker_unref)(void *trk);
} hr_fabric_ops;

/*
 * The tagged-message cut (libhurray's decision 43, docs/protocol.md
 * § 25.1; the specification leaves it open, § 25.2): each non-empty
 * buffer of the region is sent as messages of
 * hr_fabric_tag_piece(provider, total) bytes, the last one of a buffer
 * shorter, in region order, all tagged with the stream id.  Both peers
 * use the same provider (FABRIC_ADDRESS must name ours), so both cut
 * alike.  The piece is 4 MiB, or total / 256 rounded up to 4 KiB when
 * that is larger; on `shm` it is 64 MiB, or total / 128 rounded up to
 * 4 KiB.  A transfer has at most 264 messages, so the receiver can post
 * all its receives before RDMA_READY.  `provider` is the resolved name
 * (hr_fabric_provider()); NULL is any provider but shm.  Pure function,
 * any thread.
 */
HR_EXTERN uint64_t hr_fabric_tag_piece(const char *provider, uint64_t total);

/*
 * Writes the FABRIC_ADDRESS extension value (`str provider`, `bytes
 * endpoint_name`) into out[0..cap).  Returns its length, or
 * HR_ERR_BUFFER_TOO_SMALL, or HR_ERR_INVALID_ARGUMENT (a provider name
 * that is empty or longer than 65535 bytes, a name longer than 65535).
 */
HR_EXTERN int64_t hr_fabric_address_encode(const char *provider,
                                           const void *name, size_t name_len,
                                           uint8_t *out, size_t cap);

/*
 * The RDMA region of a tensor: buffer k at offsets[k], buffer 0 at 0, each
 * later one at the first multiple of its alignment at or after the end of
 * the previous one (§ 9.3).  Returns 0 when the placement has no gap, so
 * that the region's length equals `total_data_bytes` (§ 25.2: libhurray
 * uses RDMA only then); HR_ERR_UNSUPPORTED with *why set otherwise (a gap,
 * a composite head, a total that disagrees with the buffers);
 * HR_ERR_INVALID_ARGUMENT for NULL arguments.
 */
HR_EXTERN int hr_fabric_placement(const hr_descriptor *d,
                                  uint64_t total_data_bytes,
                                  uint64_t offsets[HR_MAX_BUFFERS],
                                  const char **why);

/* ------------------------------------------------------------------------ */
/* hr_fabric: the libfabric backend (one per engine)                         */
/* ------------------------------------------------------------------------ */

typedef struct hr_fabric hr_fabric;

#define HR_FABRIC_CONFIG_VERSION 2

/* Where the peers are, for automatic provider selection. */
enum hr_fabric_scope {
  /* LOCAL when `node` is a loopback address, else NETWORK. */
  HR_FABRIC_SCOPE_AUTO = 0,
  /* Every peer runs on this host: shared memory (`shm`) is preferred. */
  HR_FABRIC_SCOPE_LOCAL = 1,
  /* Peers on other hosts: `shm` is never chosen. */
  HR_FABRIC_SCOPE_NETWORK = 2
};

typedef struct hr_fabric_config {
  int version; /* HR_FABRIC_CONFIG_VERSION */
  /* A libfabric provider name ("verbs;ofi_rxm", "efa", "tcp;ofi_rxm",
   * "shm", ...), or NULL / "" to choose automatically: the best provider
   * with FI_RMA and FI_TAGGED for the scope: verbs, efa, cxi, opx, psm3,
   * psm2, ucx, then shm (LOCAL scope only), then tcp;ofi_rxm; never
   * `sockets`, `udp;ofi_rxd` or the utility and hook providers. */
  const char *provider;
  /* The local address whose interface the endpoint uses ("127.0.0.1"), or
   * NULL for the provider's default.  Not used with `shm`. */
  const char *node;
  int scope; /* enum hr_fabric_scope */
  /* RMA writes are cut into pieces of this many bytes (4 MiB) ... */
  uint64_t rma_chunk;
  /* ... and at most this many pieces (RMA or tagged sends) of one transfer
   * are in flight at once (16; tagged sends use 1 where the provider does
   * not keep send-after-send order). */
  uint32_t window;
  /* Providers without a wait fd: the completion queue is polled every
   * poll_interval ns while work is outstanding (50 us). */
  uint64_t poll_interval;
  /* The registration cache keeps unused local registrations up to these
   * caps (1024 entries, 16 GiB), least recently used evicted first. */
  uint32_t mr_cache_entries;
  uint64_t mr_cache_bytes;
  /* Device memory: non-zero requests FI_HMEM.  To learn whether the
   * provider really reaches a device kind, the fabric registers a small
   * buffer allocated with hmem_alloc() (both callbacks NULL: no device
   * memory is used and RDMA_GPUDIRECT is never advertised). */
  int hmem;
  int (*hmem_alloc)(void *user_data, uint8_t device_tag, uint16_t device_index,
                    size_t len, void **ptr);
  void (*hmem_free)(void *user_data, uint8_t device_tag, uint16_t device_index,
                    void *ptr);
  void *hmem_user_data;
  const uint8_t *hmem_devices; /* device tags to probe (HR_DEV_CUDA, ...) */
  uint8_t hmem_device_count;
  /* Version 2.  libfabric is loaded (dlopen) by hr_fabric_new(), not
   * linked: this names the library to load, NULL for "libfabric.so.1"
   * (a path, or a name the dynamic loader searches for).  Once loaded it
   * stays loaded for the life of the process (providers install memory
   * hooks that must not be unmapped). */
  const char *library;
} hr_fabric_config;

/* Fills `c` with the defaults documented above. */
HR_EXTERN void hr_fabric_config_default(hr_fabric_config *c);

/*
 * Loads libfabric (cfg->library) on first use, then opens the fabric,
 * domain, completion queue (FI_WAIT_FD where the provider has it, else
 * none), address vector and RDM endpoint.  `cfg` is copied (NULL:
 * defaults); `mem` NULL: hr_mem_default().  On failure a reason goes to
 * why[0..why_cap).
 * Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_UNSUPPORTED (libfabric cannot
 * be loaded or is older than 1.17, no such provider, or none with FI_RMA
 * and FI_TAGGED), HR_ERR_IO (a libfabric call failed),
 * HR_ERR_NOMEM.  May not be called from callbacks of this fabric.
 */
HR_EXTERN int hr_fabric_new(hr_fabric **out, const hr_fabric_config *cfg,
                            const hr_mem *mem, char *why, size_t why_cap);

/*
 * Closes everything.  Returns HR_ERR_BUSY, and closes nothing, while
 * operations, remote registrations or peers are outstanding (abort and
 * delete the hr_rdma objects and hr_rdma_conns first, then run
 * hr_fabric_progress() until hr_fabric_busy() is 0).  NULL: 0.
 */
HR_EXTERN int hr_fabric_del(hr_fabric *f);

/*
 * Closes the endpoint and ends every outstanding operation at once with
 * HR_ERR_CLOSED (their `done` callbacks run from this call): after it
 * returns the provider touches no buffer.  For engine shutdown, and for
 * operations a peer never completes (shm, for one, drops a write whose key
 * it does not know without telling the writer).  Afterwards the fabric
 * starts no operation (HR_ERR_CLOSED); registrations and peers are still
 * released normally, then hr_fabric_del().  Returns 0 or HR_ERR_IO (the
 * endpoint's close failed; the operations ended anyway).  NULL: 0.
 */
HR_EXTERN int hr_fabric_shutdown(hr_fabric *f);

/* 1 while operations, remote registrations or peers are outstanding. */
HR_EXTERN int hr_fabric_busy(const hr_fabric *f);

/* The ops table whose ctx is an hr_fabric. */
HR_EXTERN const hr_fabric_ops *hr_fabric_get_ops(void);

/* The provider's name ("tcp;ofi_rxm"), as FABRIC_ADDRESS carries it. */
HR_EXTERN const char *hr_fabric_provider(const hr_fabric *f);

/* The capability flags this fabric justifies in a HELLO:
 * HR_CAP_RDMA_DATA_PLANE, plus HR_CAP_RDMA_GPUDIRECT only when the
 * provider registered probe device memory and accepted
 * FI_HMEM_P2P_REQUIRED (never for tcp, sockets or udp based providers). */
HR_EXTERN uint32_t hr_fabric_capabilities(const hr_fabric *f);

/* Writes this endpoint's FABRIC_ADDRESS extension value (see
 * hr_fabric_address_encode()).  Returns its length or
 * HR_ERR_BUFFER_TOO_SMALL. */
HR_EXTERN int64_t hr_fabric_address(const hr_fabric *f, uint8_t *out,
                                    size_t cap);

/*
 * Event loop.  The engine watches hr_fabric_fd() for HR_POLL_IN (when it is
 * >= 0) and arms its timer for hr_fabric_get_expiry(); on either it calls
 * hr_fabric_progress().  That call reads the completion queue until it is
 * empty (fi_cq_read until -FI_EAGAIN), dispatches the completions (op
 * `done` callbacks, and through them hr_rdma events and messages), posts
 * the pieces that wait for room, and re-arms the wait object with
 * fi_trywait, draining again while that reports -FI_EAGAIN (a bounded
 * number of times; then the expiry becomes `now` so that the next loop
 * turn tries again).  No thread ever spins.
 *
 * Providers without FI_WAIT_FD (`shm` here): hr_fabric_fd() is -1 and,
 * while anything is outstanding (operations, posted receives, or remote
 * registrations a peer may write into), the expiry is the last poll plus
 * `poll_interval`; when nothing is, it is HR_TSTAMP_NEVER.
 *
 * Starting an operation (through hr_rdma calls) makes the expiry `now`:
 * the engine must call hr_fabric_progress() before its loop sleeps.
 *
 * hr_fabric_progress() returns 0, or HR_ERR_IO when the completion queue
 * failed (fatal for the data plane: every operation then ends with it).
 */
HR_EXTERN int hr_fabric_fd(const hr_fabric *f);
HR_EXTERN hr_tstamp hr_fabric_get_expiry(const hr_fabric *f);
HR_EXTERN int hr_fabric_progress(hr_fabric *f, hr_tstamp now);

/*
 * Registration cache.  Local registrations (the memory an RMA write or a
 * tagged send reads, or the tagged receives fill) are cached by address
 * range, so that a tensor served many times is registered once.  The
 * application's release of a buffer must be reported here, or through the
 * ops' tracker_invalidate() (the session does it for every tensor it
 * moved over the data plane, when the tensor is freed): registrations
 * overlapping
 * [ptr, ptr + len) are closed at once, or when their last user ends.
 * Remote registrations (the keys RDMA_REGISTER carries) are never cached:
 * each is closed when its transfer ends.
 */
HR_EXTERN void hr_fabric_invalidate(hr_fabric *f, const void *ptr,
                                    uint64_t len);

/*
 * `wake(ctx)` is called, from whichever thread frees a tensor, when an
 * invalidation is queued through the ops' tracker_invalidate(): the
 * engine wakes its loop (it writes its eventfd), whose next
 * hr_fabric_progress() closes the registrations (hr_fabric_get_expiry()
 * is 0 while some are queued).  wake must be thread-safe and must not
 * call into the fabric.  NULL removes it; once this returns, wake is no
 * longer called (it may be running on another thread until then).
 */
HR_EXTERN void hr_fabric_set_wake(hr_fabric *f, void (*wake)(void *ctx),
                                  void *ctx);

/* Counters, for --stats and the tests. */
typedef struct hr_fabric_stats {
  uint64_t mr_cache_hits;          /* local registrations found in the cache */
  uint64_t mr_cache_misses;        /* local registrations made */
  uint64_t mr_cache_evictions;     /* closed by the caps */
  uint64_t mr_cache_invalidations; /* closed by hr_fabric_invalidate() */
  uint64_t mr_cache_entries;       /* open now */
  uint64_t remote_regs;            /* remote registrations made ... */
  uint64_t remote_deregs;          /* ... and revoked */
  uint64_t ops_started;            /* write/send/recv operations */
  uint64_t ops_failed;
  uint64_t pieces;      /* fi_write/fi_tsend/fi_trecv posted */
  uint64_t completions; /* CQ entries read (errors included) */
  uint64_t cq_errors;
  uint64_t progress_calls;
  uint64_t trywait_again; /* fi_trywait answered -FI_EAGAIN */
  uint64_t bytes_written; /* RMA-written, sent, received */
  uint64_t bytes_sent;
  uint64_t bytes_received;
  int wait_fd;           /* 1: FI_WAIT_FD; 0: timer polling */
  int delivery_complete; /* 1: writes complete with FI_DELIVERY_COMPLETE */
  int directed_recv;     /* 1: receives filter on the peer */
  int send_ordered;      /* 1: FI_ORDER_SAS (tagged window > 1) */
  int mr_local;          /* 1: FI_MR_LOCAL */
  int mr_virt_addr;      /* 1: FI_MR_VIRT_ADDR */
  int mr_prov_key;       /* 1: FI_MR_PROV_KEY */
  int mr_raw;            /* 1: FI_MR_RAW */
  int hmem;              /* 1: FI_HMEM granted */
} hr_fabric_stats;

HR_EXTERN void hr_fabric_get_stats(const hr_fabric *f, hr_fabric_stats *st);

/* ------------------------------------------------------------------------ */
/* hr_rdma_conn: the RDMA state of one connection                            */
/* ------------------------------------------------------------------------ */

typedef struct hr_rdma_conn hr_rdma_conn;

#define HR_RDMA_CONN_CONFIG_VERSION 1

typedef struct hr_rdma_conn_config {
  int version; /* HR_RDMA_CONN_CONFIG_VERSION */
  const hr_fabric_ops *ops;
  void *ops_ctx;
  /* The capability flags of our HELLO and of the peer's. */
  uint32_t local_caps;
  uint32_t peer_caps;
  /* The peer's FABRIC_ADDRESS (hr_hello_exts: fabric_provider,
   * fabric_endpoint), or NULL when it sent none.  Borrowed for the call. */
  const uint8_t *peer_provider;
  uint16_t peer_provider_len;
  const uint8_t *peer_endpoint;
  uint16_t peer_endpoint_len;
  /* The control connection's peer (struct sockaddr), or NULL. */
  const void *ctl_addr;
  size_t ctl_addr_len;
  /* The smallest tensor this side sends over RDMA as the source owner
   * (64 KiB): smaller ones go as frames. */
  uint64_t min_bytes;
} hr_rdma_conn_config;

/* Fills `c` with version, min_bytes and, from `peer` (a decoded HELLO),
 * peer_caps and the FABRIC_ADDRESS pointers (which point into `peer`). */
HR_EXTERN void hr_rdma_conn_config_init(hr_rdma_conn_config *c,
                                        const hr_fabric_ops *ops, void *ops_ctx,
                                        uint32_t local_caps,
                                        const hr_hello *peer);

/*
 * Creates the RDMA state of a connection, after both HELLOs.  When either
 * HELLO lacks RDMA_DATA_PLANE, or the peer's FABRIC_ADDRESS is missing or
 * refused by ops->peer_add, the connection exists with RDMA unusable and a
 * reason (hr_rdma_conn_usable()).  `cfg` is copied.
 * Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM.
 */
HR_EXTERN int hr_rdma_conn_new(hr_rdma_conn **out,
                               const hr_rdma_conn_config *cfg,
                               const hr_mem *mem);

/* Drops the connection's reference; the object (and the backend's peer)
 * goes when the last hr_rdma of it is gone too.  NULL is a no-op. */
HR_EXTERN void hr_rdma_conn_del(hr_rdma_conn *c);

/* 1 when the RDMA data plane may carry transfers on this connection in
 * either direction (both flags, the peer resolved); else 0 with *why.
 * As the source owner, see hr_rdma_conn_can_source() too. */
HR_EXTERN int hr_rdma_conn_usable(const hr_rdma_conn *c, const char **why);

/* 1 when a receiver may register a destination (both HELLOs have
 * RDMA_GPUDIRECT and no GPUDIRECT_UNAVAILABLE was met on the connection);
 * else 0 with *why. */
HR_EXTERN int hr_rdma_conn_gpudirect(const hr_rdma_conn *c, const char **why);

/*
 * As the source owner: 1 when this tensor should go over RDMA (connection
 * usable and not fallen back to frames, at least min_bytes, every buffer
 * SYNC_PRODUCER_SYNCED, a gap-free placement); else 0 with the reason
 * written to why[0..why_cap) for the transfer record's `fallback`.
 */
HR_EXTERN int hr_rdma_conn_can_source(const hr_rdma_conn *c,
                                      const hr_descriptor *d,
                                      uint64_t total_data_bytes, char *why,
                                      size_t why_cap);

/* Why RDMA stopped being used on this connection as the source owner
 * (a failed handshake or transfer, § 25.2), or NULL while it has not. */
HR_EXTERN const char *hr_rdma_conn_fallback(const hr_rdma_conn *c);

/* ------------------------------------------------------------------------ */
/* hr_rdma: the handshake of one tensor on one stream                        */
/* ------------------------------------------------------------------------ */

typedef struct hr_rdma hr_rdma;

/* Which side: the source owner (the server of a GET, the client of a PUT)
 * or the receiver. */
enum hr_rdma_side { HR_RDMA_SENDER = 0, HR_RDMA_RECEIVER = 1 };
enum hr_rdma_direction { HR_RDMA_GET = 0, HR_RDMA_PUT = 1 };

/* The states (a name table: hr_rdma_state_name()). */
enum hr_rdma_state {
  HR_RDMA_ST_PREPARED = 0, /* sender: source registered, nothing sent */
  HR_RDMA_ST_AWAIT_SOURCE, /* receiver: waiting for RDMA_REGISTER SOURCE */
  HR_RDMA_ST_AWAIT_READY,  /* sender: SOURCE sent, waiting for READY */
  HR_RDMA_ST_TRANSFER,     /* sender: writing or sending */
  HR_RDMA_ST_AWAIT_END,    /* receiver: READY sent, waiting for DATA_END
                              and its own receives */
  HR_RDMA_ST_AWAIT_ACK,    /* PUT sender: DATA_END sent */
  HR_RDMA_ST_AWAIT_COMMIT, /* PUT receiver: data in place, waiting for
                              hr_rdma_commit() */
  HR_RDMA_ST_DONE,         /* completed */
  HR_RDMA_ST_FAILED,       /* ended by an ERROR (sent or received) or an
                              abort */
  HR_RDMA_ST_COUNT
};

HR_EXTERN const char *hr_rdma_state_name(int state);

enum hr_rdma_event_kind {
  /* The transfer completed: GET sender (DATA_END queued), GET receiver
   * (bytes in place, producer-synced), PUT sender (TENSOR_PUT_ACK
   * received), PUT receiver (TENSOR_PUT_ACK queued by hr_rdma_commit). */
  HR_RDMA_EV_COMPLETE = 1,
  /* PUT receiver: every byte is in place; commit, then hr_rdma_commit(). */
  HR_RDMA_EV_DATA_READY = 2,
  /* The stream ended with an ERROR (sent or received) or an abort. */
  HR_RDMA_EV_FAILED = 3
};

/* An event; pointers valid during the callback. */
typedef struct hr_rdma_event {
  int kind; /* enum hr_rdma_event_kind */
  uint32_t stream_id;
  uint32_t wire_error; /* FAILED: the code sent or received (0 after an
                          abort without ERROR) */
  int wire_error_sent; /* FAILED: 1 we sent it, 0 the peer did */
  const char *message; /* FAILED: our or the peer's text ("" if none) */
  /* "" or what fell back and why, for hr_transfer_record.fallback:
   * "RDMA_SETUP_FAILED from peer: ...; frames from now on on this
   * connection", "destination registration failed: ...; tagged sends". */
  const char *fallback;
  /* FAILED: the failure was the data plane's, and the connection now uses
   * frames (or no destination registration) for it: the requester should
   * retry the request once on the same connection (§ 25.2). */
  int retry;
  int destination; /* 1: RMA write into a destination registration,
                      0: tagged messages */
  uint64_t bytes;  /* bytes moved (COMPLETE, DATA_READY) */
} hr_rdma_event;

typedef struct hr_rdma_callbacks {
  size_t size; /* sizeof(hr_rdma_callbacks) */
  /* Required: queue `m` on the stream (the session encodes it; pointers
   * inside are valid during the call).  Return 0, or a fatal error that
   * hr_rdma passes up from the call that made it. */
  int (*send_msg)(hr_rdma *x, const hr_msg *m, void *user_data);
  /* Required: see enum hr_rdma_event_kind. */
  void (*on_event)(hr_rdma *x, const hr_rdma_event *ev, void *user_data);
} hr_rdma_callbacks;

typedef struct hr_rdma_config {
  int side;           /* enum hr_rdma_side */
  int direction;      /* enum hr_rdma_direction */
  uint32_t stream_id; /* also the tag of the tagged messages */
  /* The tensor's descriptor and total_data_bytes (receiver: as received;
   * borrowed for hr_rdma_new). */
  const hr_descriptor *desc;
  uint64_t total_data_bytes;
  /* desc->buffer_count pointers: the sender's source buffers, or the
   * receiver's landing buffers (each at least its handle's size_bytes).
   * They must stay valid until `release` is called. */
  void *const *buffers;
  /* Receiver: register the landing buffers as a DESTINATION (only honoured
   * when hr_rdma_conn_gpudirect() allows it; the caller has checked that
   * the memory matches the descriptor's device, § 16.4 rule 3). */
  int register_destination;
  /* Called exactly once, possibly after hr_rdma_del(), when the data plane
   * no longer reads or writes the buffers (may be NULL). */
  void (*release)(void *release_ctx);
  void *release_ctx;
} hr_rdma_config;

/*
 * Creates the handshake of one tensor.
 *
 * Sender: call before sending TENSOR_DESCRIPTOR / TENSOR_PUT with
 * data_plane 1: it registers the source region, so that a refusal still
 * leaves the choice of frames.  Returns 0; HR_ERR_UNSUPPORTED with the
 * reason in why[] (use frames; put the reason in the record's fallback);
 * HR_ERR_INVALID_ARGUMENT (a buffer handle whose sync_mode is not
 * SYNC_PRODUCER_SYNCED, bad arguments); HR_ERR_NOMEM.
 *
 * Receiver: call when TENSOR_DESCRIPTOR / TENSOR_PUT with data_plane 1
 * arrived.  Returns 0; HR_ERR_PROTO with `st` filled when the peer broke
 * a rule (INVALID_SYNC_MODE: a sync_mode other than 0; PROTOCOL_VIOLATION:
 * data_plane 1 without both RDMA_DATA_PLANE flags): send that ERROR on the
 * stream, which ends; HR_ERR_INVALID_ARGUMENT; HR_ERR_NOMEM.  A receiver
 * that merely cannot do RDMA is created fine and refuses at
 * hr_rdma_start() with RDMA_SETUP_FAILED.
 *
 * `cfg` and `cbs` are copied; `c` gains a reference.  Nothing is sent and
 * no callback is called here.
 */
HR_EXTERN int hr_rdma_new(hr_rdma **out, hr_rdma_conn *c,
                          const hr_rdma_config *cfg,
                          const hr_rdma_callbacks *cbs, void *user_data,
                          const hr_mem *mem, hr_wire_status *st, char *why,
                          size_t why_cap);

/*
 * Starts the handshake.  Sender: after the descriptor (or TENSOR_PUT) was
 * queued, sends RDMA_REGISTER (SOURCE).  Receiver: checks that it can take
 * the transfer over RDMA and, if not, sends ERROR RDMA_SETUP_FAILED at
 * once (FAILED event).  Returns 0, HR_ERR_STATE (started already, or
 * over), HR_ERR_INVALID_ARGUMENT (NULL, or hr_rdma_del() was called from
 * a callback), or a fatal error from send_msg.
 */
HR_EXTERN int hr_rdma_start(hr_rdma *x);

/*
 * Feeds a decoded message of the stream (RDMA_REGISTER, RDMA_READY,
 * TENSOR_DATA_END, TENSOR_PUT_ACK, ERROR; CANCEL is the session's: it calls
 * hr_rdma_abort()).  `m` is borrowed for the call.  A message that breaks
 * the handshake's order, role or direction rules makes hr_rdma send ERROR
 * PROTOCOL_VIOLATION itself and report FAILED; the caller learns every
 * outcome from the events.  Returns 0, HR_ERR_STATE (the handshake is
 * over: the message is the session's to judge), HR_ERR_INVALID_ARGUMENT
 * (as for hr_rdma_start()), or a fatal error from send_msg.
 */
HR_EXTERN int hr_rdma_on_msg(hr_rdma *x, const hr_msg *m);

/*
 * PUT receiver, after HR_RDMA_EV_DATA_READY: `wire_error` 0 sends
 * TENSOR_PUT_ACK (COMPLETE), another code sends ERROR with `message` (NULL:
 * none) and reports FAILED.  Returns 0, HR_ERR_STATE (not awaiting the
 * commit), HR_ERR_INVALID_ARGUMENT (as for hr_rdma_start()), or a fatal
 * error from send_msg.
 */
HR_EXTERN int hr_rdma_commit(hr_rdma *x, uint32_t wire_error,
                             const char *message);

/*
 * Ends the handshake early: outstanding fabric work is cancelled and the
 * remote registration revoked.  `wire_error` non-zero sends ERROR with it
 * (CANCELLED after a CANCEL, TIMEOUT, ...); 0 sends nothing (the
 * connection is gone).  Reports FAILED unless the handshake was over
 * already (then returns HR_ERR_STATE and does nothing).  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (as for hr_rdma_start()), or a fatal error from
 * send_msg.
 */
HR_EXTERN int hr_rdma_abort(hr_rdma *x, uint32_t wire_error,
                            const char *message);

/* Frees the handshake.  Anything outstanding is aborted without a message
 * and without events; the release callback follows once the backend let
 * go of the buffers.  NULL is a no-op. */
HR_EXTERN void hr_rdma_del(hr_rdma *x);

/* The state (enum hr_rdma_state). */
HR_EXTERN int hr_rdma_state(const hr_rdma *x);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_FABRIC_H */
