/*
 * libhurray: the sans-IO protocol core.
 *
 * An hr_session is one Hurray connection seen as a pure state machine, in
 * the style of nghttp2 and ngtcp2: it consumes bytes and timestamps and
 * produces bytes, events and timer deadlines.  It never touches a socket,
 * a clock or a thread.  The engine (<hurray/engine.h>) drives sessions over
 * real sockets; tests and unusual hosts may drive them directly.
 *
 * Data path: tensor bytes are never copied through the session.
 *  - Sending: hr_session_pull() returns iovecs that point at the 24-byte
 *    frame prefix the session wrote and straight into the tensor's memory;
 *    the host writev()s them and reports hr_session_consumed().
 *  - Receiving: hr_session_recv_target() tells the host where the next
 *    payload bytes belong (inside the destination tensor), so it can
 *    recv() straight into place and report hr_session_recv_placed();
 *    everything else goes through hr_session_recv().
 *
 * State machines: session (AWAIT_HELLO -> ESTABLISHED -> DRAINING ->
 * CLOSED), and per stream: a GET, a PUT, a LIST, each on either side.
 *
 * Threading: a session is single-threaded: every call, and every callback
 * it makes, happens on the thread that drives it.  Work submitted through
 * hr_session_callbacks.submit_work (transcoding) runs elsewhere; its
 * completion comes back through hr_session_work_done() on the driving
 * thread.
 *
 * Re-entrancy: callbacks must not call hr_session_recv/pull/del on the same
 * session (HR_ERR_IN_CALLBACK); the request/answer functions marked "may
 * be called from callbacks" are fine.
 */
#ifndef HURRAY_SESSION_H
#define HURRAY_SESSION_H

#include <hurray/common.h>
#include <hurray/tensor.h>
#include <hurray/wire.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_session hr_session;
struct hr_shm_mapping;

/* Host I/O vector (same layout as struct iovec, without its header). */
typedef struct hr_iov {
  const void *base;
  size_t len;
} hr_iov;

enum hr_role { HR_ROLE_CLIENT = 0, HR_ROLE_SERVER = 1 };

/* ------------------------------------------------------------------------ */
/* Settings                                                                  */
/* ------------------------------------------------------------------------ */

#define HR_SETTINGS_VERSION 1

/*
 * Session settings.  Fill with hr_settings_default(), then change fields.
 * Copied at hr_session_new(); pointers inside must stay valid only for the
 * duration of that call.  Fields are only ever appended.
 */
typedef struct hr_settings {
  int version;                 /* HR_SETTINGS_VERSION */
  uint32_t max_message_size;   /* largest payload we accept (16 MiB) */
  uint32_t frame_data_size;    /* data bytes per TENSOR_DATA we send (4 MiB;
                                  capped by the peer's max_message_size) */
  uint64_t send_budget;        /* max bytes of frames queued but not yet
                                  consumed by the host, per session (8 MiB;
                                  control messages are always let through) */
  uint32_t max_streams;        /* concurrent streams per connection (256) */
  uint64_t handshake_timeout;  /* ns; 10 s */
  uint64_t idle_timeout;       /* ns with no stream open, opened or
                                  ended (PINGs do not count) before
                                  GOAWAY (NO_ERROR) and close;
                                  300 s (0: none) */
  uint64_t read_timeout;       /* ns a message header or control
                                  payload may take from its first byte,
                                  and a TENSOR_DATA payload between two
                                  pieces (a server receiving a PUT: also
                                  between messages), before ERROR
                                  TIMEOUT on stream 0; 30 s (0: none).
                                  Time with input paused for a device
                                  (hr_session_recv_paused()) does not
                                  count.
                                  Also bounds the last flush after the
                                  session stopped reading (a connection
                                  ERROR, GOAWAY at idle): a peer that
                                  takes none of it for this long (10 s
                                  when 0) is cut, the rest dropped */
  uint64_t keepalive_interval; /* client: ns without input before a PING;
                                  when nothing arrives for another
                                  interval, ERROR TIMEOUT and close.
                                  30 s (0: none).  Stopped while input is
                                  paused for a device, as read_timeout */
  uint32_t capabilities;       /* HR_CAP_* we may advertise; masked by
                                  what this build does (TRANSCODING and
                                  REGION_REQUESTS only with the transcode
                                  kernels; SHM_DATA_PLANE only with the
                                  host's descriptor callbacks; RDMA comes
                                  from fabric_caps below, never from
                                  here) and, on a
                                  server, by the provider (TENSOR_PUT needs
                                  on_put_begin and on_put_commit, LIST
                                  on_list).  A client advertises only
                                  SHM_DATA_PLANE (clear it to refuse the
                                  SHM plane). */
  uint16_t max_shards;         /* server: MAX_SHARDS advertised (64) */
  uint64_t transcode_mem_limit;/* server: bytes one transcode may
                                  materialise at once (1 GiB): a sparse
                                  target (built whole) or the index of a
                                  sparse source.  Dense targets stream
                                  chunk by chunk and never reach it.  Over
                                  it, selection falls through to the next
                                  preference; per shard (§ 18). */
  uint64_t transcode_chunk;    /* server: bytes per transcode work item
                                  (4 MiB) */
  uint32_t transcode_window;   /* server: work items in flight per stream (4) */
  int strict_composites;       /* client: reject torn composites (1) */
  const uint8_t *devices;      /* device tags we support (NULL: CPU only) */
  uint16_t device_count;
  const uint8_t *auth_token;   /* client: AUTH_TOKEN extension (NULL: none) */
  uint16_t auth_token_len;
  const char *peer_name;       /* PEER_NAME ("libhurray/<version>") */
  /* ---- appended in 0.1 (0: the default) ---- */
  uint64_t shard_bytes;        /* server: a parallel answer has at most
                                  ceil(bytes / shard_bytes) shards
                                  (16 MiB) */
  uint16_t shards_per_lane;    /* server: ... and at most lanes x this
                                  (4) */
  /* ---- appended: the RDMA data plane (fabric/, <hurray/fabric.h>) ---- */
  /* The fabric the session moves tensors through (NULL: frames only).
   * The session reaches it only through these ops (the engine passes
   * hr_fabric_get_ops() and its hr_fabric; tests pass the fake fabric).
   * Unlike the other pointers here, `fabric_ops` and `fabric_ctx` are not
   * copied: they must outlive the session and every transfer it started
   * (see hr_fabric_busy()).  Builds without fabric/ ignore them. */
  const struct hr_fabric_ops *fabric_ops;
  void *fabric_ctx;
  /* What the fabric justifies in the HELLO: HR_CAP_RDMA_DATA_PLANE and
   * maybe HR_CAP_RDMA_GPUDIRECT (hr_fabric_capabilities()).  Advertised
   * by clients and servers alike when fabric_ops is set. */
  uint32_t fabric_caps;
  /* Extra HELLO extensions, encoded back to back as hr_ext_put() writes
   * them (the engine puts FABRIC_ADDRESS here), `hello_ext_count` of them
   * in `hello_ext_len` bytes (at most 1024).  Copied. */
  const uint8_t *hello_ext;
  uint16_t hello_ext_len;
  uint16_t hello_ext_count;
  /* Receiver (client GET, server PUT): register the landing buffers as an
   * RDMA DESTINATION, so that the sender RMA-writes into them, where both
   * HELLOs carry RDMA_GPUDIRECT (0: tagged messages into posted
   * receives). */
  int rdma_destination;
  /* Source owner: tensors smaller than this go as frames (0: 64 KiB). */
  uint64_t rdma_min_bytes;
  /* ---- appended: GET into device memory (hr_get_opts.device) ----
   * The bytes pass through a ring of `device_pieces` pinned staging
   * pieces of `device_piece` bytes each (0: 8 MiB and 4; at least 4 KiB,
   * 2 to 16 pieces): a GET pins at most that much host memory whatever
   * the tensor's size, and input waits (hr_session_recv_paused()) while
   * every piece is being copied. */
  uint64_t device_piece;
  uint32_t device_pieces;
  /* ---- appended: staged RDMA sources (docs/protocol.md decision 76) ----
   * Source owner: a single tensor the fabric cannot read where it lies
   * (device memory without GPUDirect, dense transcoded output) goes over
   * RDMA from a host copy of the whole tensor (pinned memory of its
   * device for a device tensor), made off the loop thread before its
   * descriptor goes and freed (or kept for reuse: rdma_stage_keep) when
   * the fabric is done with it.  Such
   * copies in flight take at most `rdma_stage_budget` bytes in all (4 GiB
   * by hr_settings_default(); 0: no copies, those tensors go as frames);
   * a tensor that does not fit goes as frames, and its record's
   * `fallback` says so.  The engine counts the copies of all its
   * sessions together. */
  uint64_t rdma_stage_budget;
  /* Internal: the account those bytes are counted in (the engine sets
   * its own; NULL: each session counts its own).  Not copied. */
  struct hr_stage_account *rdma_stage_account;
  /* ---- appended: reuse of staged RDMA sources (decision 79) ----
   * Of those copies' memory, up to this many bytes (counted in
   * rdma_stage_budget all the same) are kept when their transfer ends,
   * in at most 4 regions, for the next staged tensor of about the same
   * size (within an eighth) and the same device: it skips the
   * allocation, the page faults and the fabric registration.  Kept
   * memory is freed when a staged tensor needs its budget, and with the
   * engine (or, without one, the session).  1 GiB by hr_settings_default();
   * 0: every copy is freed when its transfer ends. */
  uint64_t rdma_stage_keep;
} hr_settings;

/* Fills `s` with the defaults documented above. */
HR_EXTERN void hr_settings_default(hr_settings *s);

/* ------------------------------------------------------------------------ */
/* Transfer records                                                          */
/* ------------------------------------------------------------------------ */

/* What happened in one finished transfer (GET or PUT), for --stats, logs
 * and metrics; on_request reports LIST, PING and early refusals in the
 * same shape (kind tells them apart). */
typedef struct hr_transfer_record {
  int status;              /* 0, or a library error (HR_ERR_REMOTE: see
                              wire_error) */
  uint32_t wire_error;     /* the wire code sent or received, 0 if none */
  int wire_error_sent;     /* 1 when we sent it, 0 when the peer did */
  char message[256];       /* the peer's or our error text (UTF-8) */
  uint8_t data_plane;      /* HR_PLANE_* that carried the bytes */
  uint8_t layout;          /* layout tag delivered */
  int transcoded;          /* server side: 1 when the layout sent differs
                              from the stored one (transcoded, or stored
                              ROW/COLUMN_MAJOR bytes described as PERMUTED),
                              0 when sent as stored.  Client side: -1, since
                              the wire does not say whether the server
                              transcoded (the stored layout is unknown to
                              the client) */
  uint8_t device;          /* device tag delivered */
  char fallback[128];      /* "" or why a fallback happened */
  uint32_t shards;         /* shards received (1 when unsharded) */
  uint32_t lanes;          /* connections used: client, the lanes its
                              messages arrived on; server, those its
                              shards were spread over (min(N, L)) */
  uint64_t bytes;          /* tensor bytes moved */
  hr_tstamp started;       /* request sent / received */
  hr_tstamp finished;      /* last byte in place */
  /* Client GET with strict_composites = 0 whose composite tore (the
   * stream ended before the composite closed): the members that arrived
   * complete, in stream order, as independent tensors (never presented as
   * a composite).  Borrowed during the callback: take references to keep
   * them.  NULL / 0 otherwise.  version-added: 0.1 */
  hr_tensor *const *partial;
  size_t partial_count;
  /* ---- appended in 0.1 (logs and metrics) ---- */
  uint8_t kind;           /* HR_XFER_GET, _PUT, _LIST or _PING */
  uint32_t stream_id;     /* the stream it ran on (a shard's own id; 0 for
                             a PING) */
  const uint8_t *key;     /* the key (LIST: the prefix); borrowed during
                             the callback only; NULL on a client GET
                             (the application has it) */
  uint16_t key_len;
  uint32_t shard_index;   /* server: which of `shards` streams of the
                             answer this is (0: the request's own) */
  /* ---- appended in 0.3: a client GET into device memory (hr_get_opts.
   * device) through the receive ring; 0 for everything else.  Times are
   * the session's clock (the `now` the host passes in), so they are as
   * fine as the host's calls.  version-added: 0.3 ---- */
  uint32_t recv_pauses;    /* times the session stopped taking input
                              (hr_session_recv_paused()) because every
                              ring piece was full or being copied */
  uint64_t recv_paused_ns; /* the time it spent so, in all (never counted
                              against read_timeout or keepalive) */
  uint32_t device_pieces;  /* ring pieces copied into the device */
  uint64_t device_busy_ns; /* time at least one of those copies was in
                              flight (the device's copy engine busy with
                              this GET, as the session saw it) */
  uint64_t device_tail_ns; /* from the last byte's arrival to the end of
                              the GET (P1: the last copies; P2: 0 or
                              nearly) */
} hr_transfer_record;

/* hr_transfer_record.kind: which request the record is about. */
#define HR_XFER_GET 1
#define HR_XFER_PUT 2
#define HR_XFER_LIST 3
#define HR_XFER_PING 4

/* ------------------------------------------------------------------------ */
/* Server side: the tensor provider                                          */
/* ------------------------------------------------------------------------ */

/* One GET the server must answer.  Valid from on_get until it is answered
 * with hr_get_answer() or hr_get_fail() (exactly one of them, once), or
 * until the stream is cancelled (then on_get_cancel is called and the
 * handle must not be used afterwards). */
typedef struct hr_srv_get hr_srv_get;

/* What the client asked, as hr_srv_get_info() reports it. */
typedef struct hr_get_info {
  const uint8_t *key;
  uint16_t key_len;
  const hr_request *request; /* the decoded TENSOR_REQUEST */
  uint32_t stream_id;
} hr_get_info;

HR_EXTERN const hr_get_info *hr_srv_get_info(const hr_srv_get *g);

/* Marks the GET as coming from a client that may read only some of the
 * provider's keys (hr_auth_wrap() does it for a token bounded to key
 * prefixes, before the inner provider's on_get runs).  A provider must
 * then not answer with memory that also holds other keys' bytes, such as
 * the segment of a shared arena (<hurray/shm.h>): hr_store answers such a
 * GET from a private copy instead.  hr_get_narrow() tells whether the mark
 * is set (0 for NULL).  Call from on_get, before answering.
 * version-added: 0.2 */
HR_EXTERN void hr_get_set_narrow(hr_srv_get *g);
HR_EXTERN int hr_get_narrow(const hr_srv_get *g);

/* Answers a GET with a tensor (a reference is taken; the caller keeps its
 * own).  The session picks the layout, device, shards and transcoding
 * (see docs/protocol.md); a request it cannot serve (device, region,
 * transcoding failure) is answered with the ERROR the rules name.  The
 * tensor's buffers must be host memory and must not change until the
 * transfer ends.  May be called from callbacks and later from the driving
 * thread, but not after on_get_cancel for `g`.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (NULL g or t), HR_ERR_STATE (already answered,
 * or the session closed), or the fatal error that ended the session while
 * answering (HR_ERR_NOMEM, HR_ERR_INTERNAL, HR_ERR_CALLBACK_FAILURE). */
HR_EXTERN int hr_get_answer(hr_srv_get *g, hr_tensor *t);
/* Refuses a GET with a wire error (NOT_FOUND, UNAUTHORIZED, ...) and a
 * message (UTF-8, NULL: none).  Same rules as hr_get_answer(). */
HR_EXTERN int hr_get_fail(hr_srv_get *g, uint32_t wire_error,
                          const char *message);

/* A PUT under way. */
typedef struct hr_srv_put hr_srv_put;

typedef struct hr_put_info {
  const uint8_t *key;
  uint16_t key_len;
  uint32_t flags;             /* HR_PUT_REPLACE */
  const hr_descriptor *desc;  /* the head's descriptor */
  uint32_t stream_id;
} hr_put_info;

HR_EXTERN const hr_put_info *hr_srv_put_info(const hr_srv_put *p);

/*
 * The provider: how a server finds, stores and lists tensors.  All
 * callbacks run on the driving thread.  NULL members mean "not supported"
 * (the matching capability is not advertised).
 */
typedef struct hr_provider {
  size_t size; /* sizeof(hr_provider) */
  void *user_data;
  /* A GET arrived.  Answer now or later (hr_get_answer / hr_get_fail).
   * Return 0, or HR_ERR_CALLBACK_FAILURE to kill the session. */
  int (*on_get)(hr_session *s, hr_srv_get *g, void *user_data);
  /* A GET that was not answered yet was cancelled or its connection
   * closed: forget `g`. */
  void (*on_get_cancel)(hr_session *s, hr_srv_get *g, void *user_data);
  /* A PUT's descriptor arrived and passed validation.  Accept by returning
   * 0 with *wire_error left 0 (the session allocates the landing tensor),
   * or refuse with a wire error (ALREADY_EXISTS, PUT_REJECTED,
   * RESOURCE_EXHAUSTED, DEVICE_UNAVAILABLE, UNAUTHORIZED). */
  int (*on_put_begin)(hr_session *s, const hr_put_info *info,
                      uint32_t *wire_error, void *user_data);
  /* Every byte arrived and validated: commit atomically (the tensor
   * becomes visible only now).  A reference to `t` is lent; take one to
   * keep it.  Return 0 to ACK, or set *wire_error to refuse. */
  int (*on_put_commit)(hr_session *s, const hr_put_info *info, hr_tensor *t,
                       uint32_t *wire_error, void *user_data);
  /* A PUT ended before its commit (torn, cancelled, refused): nothing was
   * stored. */
  void (*on_put_abort)(hr_session *s, const hr_put_info *info,
                       void *user_data);
  /* LIST: write entries with `emit` (in ascending key order, keys >
   * start_after with the prefix) until it returns non-zero (page full);
   * set *more when entries remain. */
  int (*on_list)(hr_session *s, const hr_list_request *req,
                 int (*emit)(void *emit_ctx, const hr_list_entry *e),
                 void *emit_ctx, int *more, void *user_data);
  /* The CLIENT_HELLO arrived (AUTH_TOKEN and PEER_NAME are in
   * peer->exts).  Leave *wire_error 0 to accept, or set it (UNAUTHORIZED,
   * RESOURCE_EXHAUSTED) to answer ERROR on stream 0 and close.  Return 0,
   * or HR_ERR_CALLBACK_FAILURE to kill the session.  NULL: accept every
   * client.  version-added: 0.1 (appended; `size` tells whether it is
   * present). */
  int (*on_hello)(hr_session *s, const hr_hello *peer, uint32_t *wire_error,
                  void *user_data);
  /* ---- appended in 0.3: the PUT's landing memory ---- */
  /* An accepted PUT's bytes are about to arrive: allocate the tensor they
   * land in, for descriptor `d` (one plain tensor: a composite's members
   * come one by one; buffers placed as wire-v1 § 7.1 says, each at least
   * 1 << min_alignment_log2 aligned), e.g. where the provider will keep
   * it, so that on_put_commit gets that very tensor (its members, for a
   * composite) and storing it costs no copy.  Return 0 with *out (a new
   * reference, host memory, d's buffer count and at least d's buffer
   * sizes; the session drops it if the PUT ends before the commit), or
   * HR_ERR_NOT_FOUND to let the session allocate as it does without this
   * callback (callbacks.alloc_tensor, else hr_tensor_alloc()); any other
   * error, or a tensor that does not fit `d`, refuses the PUT with
   * RESOURCE_EXHAUSTED.  Runs on the driving thread, inside the session
   * (no session calls).  Not used for PUTs over RDMA (their landing
   * memory is registered by the data plane) nor by the in-process pair
   * (which hands the client's tensor over).  NULL: as HR_ERR_NOT_FOUND.
   * hr_store_provider() sets it for a store with a shared arena. */
  int (*on_put_alloc)(hr_session *s, const hr_descriptor *d,
                      unsigned min_alignment_log2, hr_tensor **out,
                      void *user_data);
} hr_provider;

/* ------------------------------------------------------------------------ */
/* Client side                                                               */
/* ------------------------------------------------------------------------ */

/* Completion of a GET: `t` is the received tensor (a reference the
 * callback now owns; NULL on failure), `rec` the transfer record (valid
 * during the callback).  The tensor is:
 *  - the answer as described (with HAS_SHARD for a REGION request or a
 *    PARALLEL_OK request answered with one shard);
 *  - for N > 1 shards, one tensor of the requested box (the parent, or
 *    the region: then HAS_SHARD with parent_shape and shard_offset of the
 *    region) in the shards' layout, every shard placed directly by its
 *    shard_offset (ROW/COLUMN_MAJOR and PERMUTED shards cut any way;
 *    TILED and PANEL shards must be whole tile rows / panels along dim 0,
 *    else the GET fails with HR_ERR_UNSUPPORTED);
 *  - a composite hr_tensor whose members are the received tensors.
 * Over the SHM data plane (callbacks.shm_map set, rec->data_plane
 * HR_PLANE_SHM) and without `dest`, a tensor's buffers are a read-only
 * mapping of the server's segment: never write them; dropping the last
 * reference (on any thread) unmaps it and makes the session owe the
 * server a BUFFER_RELEASE, sent on its next pull.  With `dest` the bytes
 * are copied there and the segment released at once.
 * Failures: HR_ERR_REMOTE (the server's ERROR, code in rec->wire_error),
 * HR_ERR_PROTO (we found a violation and sent ERROR), HR_ERR_LIMIT (the
 * destination is too small or cannot be allocated: ERROR
 * RESOURCE_EXHAUSTED sent), HR_ERR_UNSUPPORTED, HR_ERR_CLOSED (the
 * session ended, or GOAWAY said the request was not processed: safe to
 * retry elsewhere), HR_ERR_TIMEOUT. */
typedef void (*hr_get_cb)(hr_session *s, uint32_t stream_id, hr_tensor *t,
                          const hr_transfer_record *rec, void *user_data);

/* Where received bytes land.  A composite's members, and a sharded
 * answer's one box-sized tensor, are carved out of the same buffer at
 * their alignments.  `release` is attached to the tensor returned by a
 * successful GET; when the GET fails it is not called (the buffer is the
 * application's again once the callback returns). */
typedef struct hr_get_dest {
  /* Application buffer for the tensor's (or, with shards, the parent's)
   * bytes, or NULL to let the session allocate with min_alignment_log2.
   * Must be large enough for the delivered layout's total bytes; it is
   * checked against the descriptor before any byte lands (too small:
   * the stream is refused with RESOURCE_EXHAUSTED locally). */
  void *buffer;
  uint64_t capacity;
  hr_release_fn release; /* called when the returned tensor dies */
  void *release_ctx;
} hr_get_dest;

typedef struct hr_get_opts {
  const uint8_t *key;
  uint16_t key_len;
  uint32_t flags; /* HR_REQ_ALLOW_TRANSCODE | PARALLEL_OK | REGION */
  const hr_layout_entry *layouts;
  uint16_t layout_count;
  uint8_t preferred_device;
  uint8_t min_alignment_log2;
  uint16_t max_shards;
  uint8_t region_rank;
  const uint64_t *region_offset;
  const uint64_t *region_shape;
  const hr_get_dest *dest; /* NULL: allocate */
  /* Receive into device memory (NULL: host memory).  The bytes land in
   * a bounded ring of pinned staging pieces of `device`
   * (settings.device_piece, device_pieces) and each piece is copied to
   * device memory as soon as it is complete, the copy overlapping the
   * receive of what follows; a piece is reused once its copy is done, and
   * the session stops reading while none is free.  Over the SHM data
   * plane the pieces are filled from the mapped segment.  The tensor
   * delivered is a device tensor (hr_tensor_on_device; hr_tensor_gpu_buf
   * gives its memory, its descriptor carries the device's device_tag and
   * `device_sync`) that owns its device buffers: they are freed when it
   * dies.  `device_sync`
   * says when it is delivered (ADR-018):
   *   HR_SYNC_PRODUCER_SYNCED (P1): once the device finished the copies;
   *     use it at once.
   *   HR_SYNC_EVENT (P2): as soon as the last piece's copy is enqueued
   *     (the last byte arrived);
   *     hr_tensor_gpu_event() is the event to wait on
   *     (hr_gpu_stream_wait_event) on every stream that touches it.
   * Any placement the server chose (the device's tag or CPU) lands on the
   * device.  Not with `dest` or PARALLEL_OK (HR_ERR_INVALID_ARGUMENT); a
   * composite answer fails with HR_ERR_UNSUPPORTED.  The device memory
   * (and the ring's pinned pieces not yet in the session's pool) is
   * allocated by a work item (callbacks.submit_work; inline without it),
   * input (over RDMA: the receive's setup) waiting meanwhile as for a
   * full ring; a failed allocation (out of device memory) fails the GET with
   * HR_ERR_LIMIT and RESOURCE_EXHAUSTED sent to the server, the session
   * goes on.  `device` must outlive the session. */
  struct hr_gpu *device;
  uint8_t device_sync;
} hr_get_opts;

/*
 * Queues a GET.  `opts` is copied.  *stream_id receives the stream id
 * (may be NULL).  The completion callback is called exactly once (also on
 * failure, cancel and session teardown), never from inside the request
 * call that queued it (hr_session_get/put/list): a request refused there
 * returns its error and has no callback; one that ends there calls back
 * at the session's next step (decision 78).  May be called from
 * callbacks.
 * On a lane of a group the request goes on lane 0 whichever lane `s` is
 * (so do PUT, LIST and CANCEL), and max_shards is capped at the position
 * of the group's first closed lane (see the lanes section below); the
 * callback then gets lane 0's session.
 * Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_STATE (not a client, or
 * GOAWAY received / closing), HR_ERR_LIMIT (max_streams), HR_ERR_NOMEM.
 */
HR_EXTERN int hr_session_get(hr_session *s, const hr_get_opts *opts,
                             hr_get_cb cb, void *user_data,
                             uint32_t *stream_id);

/* Completion of a PUT or LIST or PING. */
typedef void (*hr_put_cb)(hr_session *s, uint32_t stream_id,
                          const hr_transfer_record *rec, void *user_data);
typedef void (*hr_list_cb)(hr_session *s, int status, uint32_t wire_error,
                           const hr_list_response *resp, void *user_data);
typedef void (*hr_ping_cb)(hr_session *s, int status, uint64_t rtt_ns,
                           void *user_data);

/*
 * Queues a PUT of `t` under key (REPLACE in flags).  A reference to `t` is
 * held until completion.  Same rules as hr_session_get().
 *
 * A device tensor (hr_tensor_wrap_device(), a GET into a device, a DLPack
 * import; members of a composite too) is sent from its device memory:
 * staged through pinned chunks of the session's pool by copies on the
 * session's stream of that device, each ordered after the tensor's event
 * on the device (ADR-018 P2; without an event the producer must have
 * synced, P1), and framed as they land; or, with RDMA_GPUDIRECT
 * negotiated and a fabric that registers the device's memory, read by the
 * NIC from the device after that event (the record's `fallback` says why
 * it was staged otherwise).  The wire descriptor declares CPU as the
 * destination (sync_mode 0) whatever `t`'s device_tag.  The device
 * buffers must stay unchanged until the callback; the engine's last
 * reference to `t` goes when its last copy finished, so `t`'s release
 * callback (ADR-018 § 5) never runs while a copy may still read it.  A
 * PUT that ends early (cancel, a staging failure, the connection lost)
 * gets its callback only once its copies in flight finished and, for a
 * GPUDirect source, once the fabric reported its operation on the device
 * memory ended and released the registration (the tensor's reference
 * goes first; a cancel or hr_session_terminate() while the NIC reads
 * calls back then); except that hr_session_del() calls it during the
 * delete, as every callback, and the tensor's release then still waits
 * for the copies and the fabric.
 * A staging failure ends that PUT only; the callback's record says
 * HR_ERR_NOMEM (no pinned memory for a chunk, no device stream) or
 * HR_ERR_IO (the device failed a copy or the wait for the producer's
 * event).  The callback never runs inside hr_session_put(): when the
 * first chunk already failed there (or a host without submit_work ran
 * its copy inline and it failed), hr_session_put() returns 0 with the
 * stream id, hr_session_get_expiry() then names a deadline already
 * passed and the next hr_session_handle_expiry() (or
 * hr_session_terminate(), or hr_session_del()) calls back; the engine
 * and hr_client do that on their loop's next turn (decision 78).
 *
 * Returns 0, HR_ERR_INVALID_ARGUMENT (bad key or flags, `t` is a shard,
 * a descriptor the network rules refuse, composites nested deeper than
 * HR_MAX_COMPOSITE_DEPTH), HR_ERR_UNSUPPORTED (a
 * descriptor names a device but `t` is not a device tensor: host memory
 * under a device tag cannot be read), HR_ERR_STATE (not a client,
 * GOAWAY received / closing), HR_ERR_LIMIT (max_streams), HR_ERR_NOMEM.
 */
HR_EXTERN int hr_session_put(hr_session *s, const uint8_t *key,
                             uint16_t key_len, uint32_t flags, hr_tensor *t,
                             hr_put_cb cb, void *user_data,
                             uint32_t *stream_id);

/* Queues a LIST.  `resp` in the callback is valid during the call only;
 * the callback never runs inside this call (see hr_session_get()).
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL s, a prefix or start_after
 * that is not a valid key, max_entries 0 or above HR_MAX_LIST_ENTRIES),
 * HR_ERR_STATE (not a client, or GOAWAY received / closing), HR_ERR_LIMIT
 * (max_streams), HR_ERR_NOMEM. */
HR_EXTERN int hr_session_list(hr_session *s, const uint8_t *prefix,
                              uint16_t prefix_len, const uint8_t *start_after,
                              uint16_t start_after_len, uint16_t max_entries,
                              hr_list_cb cb, void *user_data);

/* Sends a PING; the callback gets the round trip.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (NULL s), HR_ERR_STATE (the handshake is not
 * done yet, or the session failed or closed), HR_ERR_NOMEM. */
HR_EXTERN int hr_session_ping(hr_session *s, hr_ping_cb cb, void *user_data);

/* Cancels a GET or PUT.  `stream_id` may be any id of a parallel GET's
 * block; CANCEL goes on every shard stream (every id of the block while
 * the shard count is unknown; unused ids are ignored by servers).  The
 * completion then reports HR_ERR_REMOTE with CANCELLED (the first ERROR
 * on any of its streams ends it; later ones are dropped) or the result if
 * it raced.  A request not yet sent (before the handshake) completes at
 * once with HR_ERR_CLOSED and wire_error CANCELLED: its callback runs
 * inside this call (the application named the stream, so it has it),
 * unless a device PUT's copies or fabric still read the tensor (then
 * once they let go).  A GET into device
 * memory cancelled while that memory is being allocated drops its bytes
 * from then on and never delivers: an answer that raced the CANCEL ends
 * it with HR_ERR_CLOSED and CANCELLED.  May be called from
 * callbacks.  Returns 0, HR_ERR_NOT_FOUND (no such GET/PUT, or already
 * complete), HR_ERR_NOMEM. */
HR_EXTERN int hr_session_cancel(hr_session *s, uint32_t stream_id);

/* ------------------------------------------------------------------------ */
/* The session object                                                        */
/* ------------------------------------------------------------------------ */

/* Work the session wants run off the driving thread (transcoding). */
typedef struct hr_work hr_work;
struct hr_work {
  void (*run)(hr_work *w);  /* on a worker thread; touches no session */
  void (*done)(hr_work *w); /* called by hr_session_work_done() */
  hr_work *next_;           /* free for the host's queue */
  /* Asynchronous work (device copies), or NULL.  A host may call
   * start(w, complete, ctx) on the driving thread instead of running `run`
   * on a worker: start enqueues the work and returns 0 at once (non-zero:
   * nothing was started; run `run` instead), and the work calls
   * complete(w, ctx) exactly once, from any thread (typically the device
   * driver's), when it has finished.  The host then reports
   * hr_session_work_done() on the driving thread as for any work.  A host
   * that ignores `start` runs `run`, which does the same work and waits
   * for it on the calling thread.  The engine uses `start`: its loop
   * sleeps until complete() writes its eventfd. */
  int (*start)(hr_work *w, void (*complete)(hr_work *w, void *ctx),
               void *ctx);
};

typedef struct hr_session_callbacks {
  size_t size; /* sizeof(hr_session_callbacks) */
  /* Run w->run() somewhere, then call hr_session_work_done(s, w) on the
   * driving thread.  NULL, or a non-zero return (the host cannot take it
   * now): the session runs it inline (synchronously) at submission. */
  int (*submit_work)(hr_session *s, hr_work *w, void *user_data);
  /* The handshake completed (both HELLOs). */
  void (*on_established)(hr_session *s, const hr_hello *peer,
                         void *user_data);
  /* A GOAWAY arrived. */
  void (*on_goaway)(hr_session *s, const hr_goaway *g, void *user_data);
  /* A connection-level error was sent or received; the session closes. */
  void (*on_error)(hr_session *s, uint32_t wire_error, int sent,
                   const char *message, void *user_data);
  /* A transfer finished (server side too), for logs and metrics.  A
   * server reports each stream of an answer (each shard) on its own. */
  void (*on_transfer)(hr_session *s, const hr_transfer_record *rec,
                      void *user_data);
  /* ---- appended in 0.2: the SHM data plane (wire-v1 § 14) ----
   * A session advertises SHM_DATA_PLANE (when settings.capabilities has
   * it) only if the host sets fd_close and, on a client, shm_map: a host
   * sets them only for a Unix domain socket, which can carry descriptors
   * (hr_session_pull_fd, hr_session_recv_fds).  version-added: 0.2 */
  /* Client: map `len` bytes at `offset` of segment `fd` read-only, the
   * first byte aligned to `align` (a power of two); check before mapping
   * that it is a regular file at least offset + len long and sealed
   * against shrinking (see docs/internals/shm.md for the policy).  The
   * session keeps `fd` (it closes it with fd_close afterwards).  Fill
   * *out and return 0, or return non-zero with a reason in why[why_len]:
   * the GET fails and the session sends ERROR DEVICE_UNAVAILABLE, after
   * which a libhurray server answers with frames. */
  int (*shm_map)(hr_session *s, int fd, uint64_t offset, uint64_t len,
                 uint64_t align, struct hr_shm_mapping *out, char *why,
                 size_t why_len, void *user_data);
  /* Close a descriptor the session received (hr_session_recv_fds) and no
   * longer needs. */
  void (*fd_close)(hr_session *s, int fd, void *user_data);
  /* Server: allocate the landing tensor of a PUT (descriptor `d`, buffers
   * placed as wire-v1 § 7.1 says, at least 1 << min_alignment_log2
   * aligned), e.g. in a shared segment so that what is PUT can be served
   * over SHM without a copy.  Return 0 with *out (a new reference), or an
   * error: the PUT is refused with RESOURCE_EXHAUSTED.  NULL:
   * hr_tensor_alloc().  version-added: 0.2 */
  int (*alloc_tensor)(hr_session *s, const hr_descriptor *d,
                      unsigned min_alignment_log2, hr_tensor **out,
                      void *user_data);
  /* ---- appended in 0.2: logs and metrics ---- */
  /* Server: a request that moved no tensor bytes through on_transfer
   * finished: a LIST answered or refused, a PING answered, or a GET or
   * PUT refused before it became a stream (shutting down, too many
   * streams, a capability not served, sent on a lane other than 0).
   * rec->kind says which; wire_error is the ERROR sent (0: answered).
   * For logs and metrics; NULL: not reported. */
  void (*on_request)(hr_session *s, const hr_transfer_record *rec,
                     void *user_data);
  /* ---- appended in 0.3: device memory over the SHM data plane ----
   * Client: a token for a device tensor imported from the server's
   * exported memory (wire-v1 § 16 PINNED; docs/internals/shm.md).  Fill
   * out->unmap/ctx (base unused) so that unmap(ctx), called exactly once
   * from whichever thread drops the tensor (possibly after the session is
   * gone), makes the host call hr_session_pull() soon: the session owes
   * the server a BUFFER_RELEASE.  Return 0, or non-zero when it cannot.
   * NULL: device memory over SHM is refused (ERROR DEVICE_UNAVAILABLE,
   * then frames).  version-added: 0.3 */
  int (*shm_wake)(hr_session *s, struct hr_shm_mapping *out, void *user_data);
  /* ---- appended: asynchronous I/O (hr_session_io_hold) ---- */
  /* The session is about to drop memory that I/O held with
   * hr_session_io_hold(s, dir) may still touch: stop that I/O now and
   * wait until it no longer touches the memory (a thread of the host's
   * that moves the bytes must have returned from its last call).
   * HR_IO_TX: return how many bytes of the held pull went out; the
   * session counts them itself, and the host does not report that write
   * with hr_session_consumed().  HR_IO_RX: the return value is ignored;
   * the host still reports the bytes read with hr_session_recv_placed()
   * later (the session skips them when their stream is gone).  Called on
   * the driving thread from inside session calls (no session call may be
   * made from it).  Required once hr_session_io_hold() is used.
   * version-added: 0.3 */
  size_t (*io_fence)(hr_session *s, int dir, void *user_data);
} hr_session_callbacks;

/* hr_session_io_hold() directions. */
#define HR_IO_TX 1
#define HR_IO_RX 2

/* A segment mapped by hr_session_callbacks.shm_map. */
typedef struct hr_shm_mapping {
  const void *base; /* the segment's byte `offset` */
  /* Called exactly once, from whichever thread drops the last reference
   * to the tensor built on the mapping (possibly after the session is
   * gone): unmap, and make the host call hr_session_pull() soon (the
   * session owes the server a BUFFER_RELEASE). */
  void (*unmap)(void *ctx);
  void *ctx;
} hr_shm_mapping;

/*
 * Creates a session.  `settings` and `cbs` are copied; `provider` (server
 * only; NULL for a client) is copied too.  The client's CLIENT_HELLO is
 * queued at once (pull it).  Returns 0, HR_ERR_INVALID_ARGUMENT,
 * HR_ERR_NOMEM.
 */
HR_EXTERN int hr_session_new(hr_session **out, int role,
                             const hr_settings *settings,
                             const hr_session_callbacks *cbs,
                             const hr_provider *provider, void *user_data,
                             hr_tstamp now, const hr_mem *mem);

/* Frees the session; every pending completion is called with
 * HR_ERR_CLOSED first.  From a callback, the free is deferred to the end
 * of the outermost call.  NULL is a no-op. */
HR_EXTERN void hr_session_del(hr_session *s);

/*
 * Feeds received bytes.  Returns the bytes consumed (all of them; after
 * the session closed they are discarded), or a fatal error (HR_ERR_NOMEM,
 * HR_ERR_CALLBACK_FAILURE; HR_ERR_IN_CALLBACK from a callback).  Protocol
 * errors by the peer are not returned: the session queues the ERROR it
 * must send (on the stream, or on stream 0 and then want_read becomes 0).
 */
HR_EXTERN int64_t hr_session_recv(hr_session *s, const uint8_t *in,
                                  size_t len, hr_tstamp now);

/* Zero-copy receive: when the next `*len` (> 0) bytes of input belong in
 * place at `*dst`, returns 1; the host may read them straight there and
 * report hr_session_recv_placed().  Returns 0 otherwise (NULL arguments
 * included).  `*dst` stays the session's and is valid until that report.
 * hr_session_recv_placed() returns 0, HR_ERR_INVALID_ARGUMENT (NULL s, no
 * target, or n above it), HR_ERR_IN_CALLBACK, or a fatal error as
 * hr_session_recv(). */
HR_EXTERN int hr_session_recv_target(hr_session *s, void **dst, size_t *len);
HR_EXTERN int hr_session_recv_placed(hr_session *s, size_t n, hr_tstamp now);

/*
 * Output: fills up to `max` iovecs with bytes to send, in order, and
 * returns how many (0: nothing to send now).  The iovecs stay valid until
 * the next hr_session_consumed() or hr_session_del().  Scheduling is fair:
 * streams take turns one frame at a time, and control messages go first.
 * Errors: HR_ERR_INVALID_ARGUMENT (NULL s, NULL iov with max > 0, max <
 * 0),
 * HR_ERR_IN_CALLBACK, or the fatal error that ended the session.
 */
HR_EXTERN int hr_session_pull(hr_session *s, hr_iov *iov, int max,
                              hr_tstamp now);
/* Reports that the first `n` bytes of the last pull were written. */
HR_EXTERN void hr_session_consumed(hr_session *s, size_t n, hr_tstamp now);

/* SHM data plane: the descriptor to attach (SCM_RIGHTS) to the first byte
 * of the iovecs the last hr_session_pull() returned, or -1.  A pull never
 * spans two such descriptors, and one that carries a descriptor starts
 * with its message's first byte; attach it to a write that sends at least
 * that byte.  The descriptor stays the session's (the host does not close
 * it).  version-added: 0.2 */
HR_EXTERN int hr_session_pull_fd(const hr_session *s);

/* SHM data plane, server: the most segments one connection may hold
 * leased at a time (answered over SHM and not yet released with
 * BUFFER_RELEASE or ERROR).  Past it the server answers with frames, the
 * record's fallback saying so, until the client releases some: a client
 * that keeps every mapping (or never releases) cannot make the server
 * pin tensors and bookkeeping without bound.  version-added: 0.3 */
#define HR_SHM_LEASES_MAX 4096

/*
 * Asynchronous I/O (a host that moves bulk bytes on other threads).
 * HR_IO_TX, right after hr_session_pull(): the returned iovecs are being
 * written elsewhere; the host makes no other pull on this session until
 * it reports the write with hr_session_consumed().  HR_IO_RX, right after
 * hr_session_recv_target(): the target is being read into elsewhere; the
 * host feeds nothing else until hr_session_recv_placed().  Meanwhile the
 * session runs as usual (other calls, other lanes, timers), and before it
 * frees what the held I/O points at (the output dropped on a connection
 * error, close or final-flush timeout; the target's stream failing,
 * cancelled, or its session terminated) it calls callbacks.io_fence.
 * hr_session_del() makes no fence call: the host's I/O must have stopped
 * before it.  Returns 0, HR_ERR_INVALID_ARGUMENT (NULL, an unknown
 * direction, no io_fence callback), HR_ERR_STATE (nothing was pulled or
 * targeted, or that direction is already held).  version-added: 0.3
 */
HR_EXTERN int hr_session_io_hold(hr_session *s, int dir);

/* SHM data plane: `n` descriptors arrived with the next `len` bytes the
 * host feeds (hr_session_recv, or recv_placed).  Call it before feeding
 * them.  The session takes every descriptor over, whatever the result,
 * and closes those it does not use through callbacks.fd_close.  A
 * descriptor the protocol does not expect (SHM not negotiated, several at
 * once, none of the messages in those bytes carries one) is a protocol
 * violation: ERROR PROTOCOL_VIOLATION on stream 0, the session closes.
 * Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_IN_CALLBACK, HR_ERR_NOMEM, or
 * the fatal error that ended the session.  version-added: 0.2 */
HR_EXTERN int hr_session_recv_fds(hr_session *s, const int *fds, size_t n,
                                  size_t len, hr_tstamp now);

/* nghttp2 rule: both 0 means the connection should be closed. */
HR_EXTERN int hr_session_want_read(const hr_session *s);
/* 1 while the session cannot take input now although it wants to read:
 * a GET into device memory waits for a free staging piece (its copies are
 * in flight).  The host stops reading (and watching for input) until a
 * work item completes (hr_session_work_done()), then asks again.  Bytes
 * fed anyway are kept, up to a bound, then fail that GET.  Not a reason
 * to close: hr_session_want_read() stays 1.  While paused, neither the
 * read timeout nor the keepalive runs (hr_session_get_expiry() names
 * neither; the peer may be waiting on us): when input resumes they count
 * from that moment (since 0.3; before, a device slower than read_timeout
 * cut a healthy connection).  version-added: 0.2 */
HR_EXTERN int hr_session_recv_paused(const hr_session *s);
HR_EXTERN int hr_session_want_write(const hr_session *s);

/* The next timer deadline, or HR_TSTAMP_NEVER.  A deadline already
 * passed (the latest `now` the session was given) while a completion is
 * due: a PUT that ended inside hr_session_put() (see there).  Ask again
 * after every call into the session, the request calls included. */
HR_EXTERN hr_tstamp hr_session_get_expiry(const hr_session *s);
/* Runs what is due at `now` (due completions, timeouts, keepalive);
 * callbacks may run from it.  A stream or handshake that timed out is
 * failed with HR_ERR_TIMEOUT through its callback, not returned.  Returns
 * 0, HR_ERR_INVALID_ARGUMENT (NULL s), or a fatal error (the session's,
 * e.g. HR_ERR_NOMEM). */
HR_EXTERN int hr_session_handle_expiry(hr_session *s, hr_tstamp now);

/* 1 while a completion callback is parked on work or the fabric: a PUT
 * that ended early while staging copies or the fabric may still read its
 * tensor (see hr_session_put()).  hr_session_del() would run it before
 * they let go; a host that can wait keeps the session (its work and the
 * fabric going on) until this is 0, as the engine does with a closed
 * connection's session.  0 for NULL.  version-added: 0.3 */
HR_EXTERN int hr_session_callbacks_parked(const hr_session *s);

/* The peer closed or the transport failed: fails every open stream with
 * HR_ERR_CLOSED (completion callbacks run, due ones too; a device PUT's
 * still waits for its copies and the fabric, see hr_session_put()) and
 * frees per-stream state. */
HR_EXTERN void hr_session_terminate(hr_session *s, hr_tstamp now);

/* Starts a graceful shutdown: GOAWAY (NO_ERROR) with the last stream id
 * accepted (server: the first id of the last request it opened; client:
 * the last id it opened); active streams finish, then both want_read and
 * want_write drop to 0.  A server answers requests above last_stream_id
 * that raced the GOAWAY with ERROR RESOURCE_EXHAUSTED.  Before the
 * handshake it closes without sending anything.  May be called from
 * callbacks.  Returns 0, HR_ERR_INVALID_ARGUMENT (NULL s), HR_ERR_NOMEM or
 * another fatal error (then the session is failed). */
HR_EXTERN int hr_session_shutdown(hr_session *s, hr_tstamp now);

/* Reports a finished work item (see submit_work): calls w->done.  Work
 * still in flight when hr_session_del() runs keeps the session's memory
 * alive: report it as usual (no callback is made for it); the last report
 * frees the session. */
HR_EXTERN void hr_session_work_done(hr_session *s, hr_work *w, hr_tstamp now);

HR_EXTERN void *hr_session_user_data(const hr_session *s);
HR_EXTERN int hr_session_role(const hr_session *s);
/* The peer's HELLO after the handshake, else NULL. */
HR_EXTERN const hr_hello *hr_session_peer_hello(const hr_session *s);
/* Active streams of the session: with lanes, those of every lane (a lane
 * with none of its own still carries shards of the others'). */
HR_EXTERN size_t hr_session_stream_count(const hr_session *s);
/* The connection state's name ("AWAIT_HELLO", "ESTABLISHED", "DRAINING",
 * "CLOSED"), for logs.  Never NULL.  version-added: 0.1 */
HR_EXTERN const char *hr_session_state_name(const hr_session *s);

/*
 * The control connection's peer address (a struct sockaddr of `len`
 * bytes, copied), which the RDMA data plane compares with the peer's
 * FABRIC_ADDRESS (an IP endpoint must be on the same host).  Call before
 * the HELLOs complete; without it the fabric decides alone.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (NULL, len 0 or above 128), HR_ERR_STATE (the
 * handshake already completed).  version-added: 0.1 */
HR_EXTERN int hr_session_set_peer_addr(hr_session *s, const void *addr,
                                       size_t len);

/* ------------------------------------------------------------------------ */
/* Sessions over several connections: lanes (docs/protocol.md § 14.5)       */
/* ------------------------------------------------------------------------ */

/*
 * A session may span several connections, its *lanes*: the first
 * connection's SERVER_HELLO carries a SESSION_TOKEN; further connections
 * send it back in SESSION_JOIN and become lanes 1, 2, ... in join order.
 * Requests go on lane 0; shard i of a parallel answer travels on lane
 * (i mod L), L being the lanes when the request arrived; stream ids are
 * per session.  Each lane is an ordinary hr_session driven over its own
 * connection by the host, on one thread for the whole group: the group
 * links them.  A call on one lane may give another lane output (a shard
 * answered on lane 0 is sent by lane 2; a client's CANCEL for a shard that
 * arrived on lane 1 goes out on lane 0), so after any call a host pulls
 * from every lane of the group, not only the one it called.
 *
 * A lane keeps its position for the session's life.  A lane that closes
 * ends the shard streams it carried: on the server they stop; on the
 * client every GET with a shard mapped to it fails with HR_ERR_CLOSED and
 * cancels its other shards, while transfers on the other lanes go on.  A
 * closed lane still counts in L, so both peers keep mapping shards the
 * same way; a libhurray client therefore caps max_shards at the position
 * of the first closed lane, so that its later requests avoid it.
 */
typedef struct hr_group hr_group;
typedef struct hr_registry hr_registry;

/* The most lanes of one session (a server refuses further joins with
 * RESOURCE_EXHAUSTED). */
#define HR_MAX_LANES 64

/* Fills buf[0..len) with unpredictable bytes (getrandom(2) in the
 * engine).  Returns 0, or non-zero when no randomness is available. */
typedef int (*hr_random_fn)(void *buf, size_t len, void *user_data);

/*
 * Server: the table of sessions that connections may join, keyed by their
 * SESSION_TOKENs (16 bytes from `random`).  One per server (the engine
 * keeps one); attach every server session to it with
 * hr_session_set_registry().  The sans-IO core takes its randomness only
 * from `random`.  Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM.
 */
HR_EXTERN int hr_registry_new(hr_registry **out, hr_random_fn random,
                              void *random_user_data, const hr_mem *mem);
/* Drops the application's reference.  Sessions attached keep the
 * registry's memory until they are freed, but no session can be joined
 * any more.  NULL is a no-op. */
HR_EXTERN void hr_registry_del(hr_registry *r);
/* Sessions that can be joined now (their lane 0 is open). */
HR_EXTERN size_t hr_registry_count(const hr_registry *r);

/*
 * Server: lets the session's client start a multi-lane session (its
 * SERVER_HELLO then carries a SESSION_TOKEN) or join one (SESSION_JOIN).
 * Without a registry the server sends no token and answers every
 * SESSION_JOIN with ERROR UNAUTHORIZED.  Call before the CLIENT_HELLO is
 * fed.  Returns 0, HR_ERR_INVALID_ARGUMENT (not a server), HR_ERR_STATE
 * (the handshake already ran, or a registry is set).
 */
HR_EXTERN int hr_session_set_registry(hr_session *s, hr_registry *r);

/*
 * Client: makes client session `lane0` the lane 0 of a new group.  Its
 * requests, queued before or after, are the group's.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (not a client session, already in a group),
 * HR_ERR_STATE (closed), HR_ERR_NOMEM.
 */
HR_EXTERN int hr_group_new(hr_group **out, hr_session *lane0);

/*
 * Client: a new lane: a client session (settings and callbacks of lane
 * 0; `user_data` its own) whose CLIENT_HELLO carries SESSION_JOIN.  Drive
 * it over a new connection to the same server and free it with
 * hr_session_del() like any session.  Lanes join one at a time, so that
 * both peers number them alike: add the next one once this one's
 * on_established (or its failure) was seen.  On success *out is the new
 * lane's session.  Returns 0, HR_ERR_INVALID_ARGUMENT (NULL g or out, a
 * server's group), HR_ERR_STATE
 * (lane 0 not established, or closed), HR_ERR_UNSUPPORTED (the server
 * sent no SESSION_TOKEN), HR_ERR_BUSY (a lane is still joining),
 * HR_ERR_LIMIT (HR_MAX_LANES), HR_ERR_NOMEM.
 */
HR_EXTERN int hr_group_add_lane(hr_group *g, void *user_data, hr_tstamp now,
                                hr_session **out);

/* Drops the application's handle.  The lanes' sessions are not freed
 * (their hosts free them); the group's memory goes with the last of them.
 * NULL is a no-op. */
HR_EXTERN void hr_group_del(hr_group *g);

/* Lanes joined so far (closed ones included; a joining one not). */
HR_EXTERN unsigned hr_group_lanes(const hr_group *g);
/* Lanes joined and still open. */
HR_EXTERN unsigned hr_group_open_lanes(const hr_group *g);
/* The session of lane i, or NULL (closed and freed, or i out of range). */
HR_EXTERN hr_session *hr_group_lane(const hr_group *g, unsigned i);
/* The session's group (client or server), or NULL. */
HR_EXTERN hr_group *hr_session_group(const hr_session *s);
/* The session's lane position: 0 for a session of one connection, -1
 * while it is joining. */
HR_EXTERN int hr_session_lane(const hr_session *s);

/*
 * Tensor-parallel loading: the slice that rank `index` of `count` reads
 * of a tensor of shape[0..rank), cut along dimension `dim` into `count`
 * slices whose extents differ by at most one (the first shape[dim] %
 * count slices get one more).  Fills offset[] and extent[] for a REGION
 * request (hr_get_opts.region_offset / region_shape).  A slice may be
 * empty when count exceeds shape[dim].  Returns 0 or
 * HR_ERR_INVALID_ARGUMENT (rank 0 or above 32, dim >= rank, count 0,
 * index >= count, NULL arrays).
 */
HR_EXTERN int hr_region_slice(unsigned rank, const uint64_t *shape,
                              unsigned dim, uint32_t index, uint32_t count,
                              uint64_t *offset, uint64_t *extent);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_SESSION_H */
