/*
 * Internal structures of the sans-IO session (engine/core/).
 *
 * Modules:
 *   hr_session.c  the connection: state machine, receive dispatch, HELLOs,
 *                 stream table, id history, timers, errors, public glue;
 *   hr_outq.c     the output queue (what pull() hands out) and scheduling;
 *   hr_send.c     the sending side of a stream (descriptors, frames,
 *                 DATA_END; transcoding chunks through hr_work);
 *   hr_recv.c     the receiving side of a transfer (hr_rx checks, landing
 *                 tensors, shard placement, composite assembly);
 *   hr_select.c   server decisions: layout, device, shards, regions;
 *   hr_server.c   server streams: GET, PUT, LIST;
 *   hr_client.c   client streams: GET, PUT, LIST, PING.
 */
#ifndef HR_SESSION_INT_H
#define HR_SESSION_INT_H

#include <hurray/session.h>
#include <hurray/tensor.h>
#include <hurray/wire.h>

#include "hr_core.h"
#include "hr_local_get.h"
#include "hr_rdma_stage.h"

#ifdef HR_HAVE_TRANSCODE
#include <hurray/transcode.h>
#endif

/* ---- connection state machine (§ 1.7 of the style guide) -------------- */

enum hr_conn_state {
  HR_CS_AWAIT_HELLO = 0, /* HELLOs not yet exchanged */
  HR_CS_ESTABLISHED,     /* serving / requesting */
  HR_CS_DRAINING,        /* GOAWAY sent or received: finish, open nothing */
  HR_CS_CLOSED,          /* no more input; flush what is queued, then close */
  HR_CS_COUNT
};
extern const char *const hr__conn_state_names[HR_CS_COUNT];

/* Every state change goes through here (legality is asserted). */
void hr__session_set_state(hr_session *s, int state);

/* ---- streams ------------------------------------------------------------ */

enum hr_stream_kind {
  HR_SK_SRV_GET = 0, /* server: a TENSOR_REQUEST (or one shard of it) */
  HR_SK_SRV_PUT,     /* server: a TENSOR_PUT being received */
  HR_SK_CLI_GET,     /* client: a GET (the whole block of a parallel one) */
  HR_SK_CLI_PUT,     /* client: a PUT being sent */
  HR_SK_CLI_LIST,    /* client: a LIST waiting for its response */
  HR_SK_COUNT
};

typedef struct hr_stream hr_stream;
typedef struct hr_xjob hr_xjob;
typedef struct hr_xwork hr_xwork;

/* One tensor of a send sequence: a plain tensor, a shard, a composite head
 * or member.  Composites are flattened pre-order into consecutive parts. */
typedef struct hr_part {
  hr_tensor *t;       /* source (reference held) */
  hr_descriptor desc; /* descriptor as sent (ext points into t or xjob) */
  hr_transport_fields xp;
  /* Direct parts send bytes straight from memory: src[k] + [0, len[k]),
   * kept alive by `hold`. */
  const uint8_t *src[HR_MAX_BUFFERS];
  uint64_t len[HR_MAX_BUFFERS];
  hr_tensor *hold; /* reference */
  hr_xjob *xj;     /* transcoding job (reference; NULL: none) */
  int xmode;       /* HR_XM_*: how the data is produced */
  int transcoded;  /* the layout differs from the stored one */
  /* HR_XM_STAGE: buffer k is dsrc[k] + [doff[k], doff[k] + len[k]) on a
   * device, ready once `dready` (may be NULL) completes; `hold` keeps
   * them alive. */
  hr_gpu_buf *dsrc[HR_MAX_BUFFERS];
  uint64_t doff[HR_MAX_BUFFERS];
  hr_gpu_event *dready;
  int shm;         /* sent over the SHM plane: descriptor + fd, no frames */
  int shm_fd;      /* the segment (borrowed from t) when shm */
  int dipc;        /* HR_DIPC_*: exported device memory (hr_shm_dev.c) */
  struct hr_rstage *rstage; /* staged for RDMA (hr_rdma_stage.c), or NULL */
} hr_part;

/* hr_part.dipc: the descriptor of exported device memory (P1 over IPC),
 * or of a GPUDirect source (hr_rdma_glue.c), waits until the producer's
 * event completed. */
enum { HR_DIPC_NONE = 0, HR_DIPC_WAIT, HR_DIPC_SYNCED };

/* One chunk of transcoded output in the stream's window. */
typedef struct hr_chunk {
  uint64_t begin, len; /* byte range of the target buffer */
  hr_tensor *mem;      /* holds the bytes (frames take references) */
  hr_xwork *work;      /* in flight (NULL once done) */
  int done;            /* produced */
  int rc;              /* result of the work */
  unsigned buf;        /* buffer index (HR_XM_STAGE; 0 for transcodes) */
} hr_chunk;

/* The sending side of a stream. */
typedef struct hr_tx {
  hr_part *parts;
  size_t nparts;
  size_t cur;   /* part being sent */
  int phase;    /* HR_TXP_* */
  unsigned buf; /* buffer being sent */
  uint64_t off; /* next byte of that buffer */
  /* TENSOR_PUT replaces the first descriptor (client PUT). */
  const uint8_t *put_key;
  uint16_t put_key_len;
  uint32_t put_flags;
  /* Transcoding window of the current part (ring of chunks). */
  hr_chunk *win;
  uint32_t win_cap, win_head, win_count;
  uint64_t next_chunk; /* first byte not yet submitted */
  int failed;          /* a work item failed: stream error queued */
  unsigned next_buf;   /* HR_XM_STAGE: buffer of next_chunk */
} hr_tx;

enum { HR_TXP_DESC = 0, HR_TXP_DATA, HR_TXP_END, HR_TXP_DONE,
       HR_TXP_RDMA /* the RDMA data plane moves the part (hr_rdma_glue.c) */ };

/* How a part's bytes are produced. */
enum {
  HR_XM_DIRECT = 0, /* straight from memory (src/len/hold) */
  HR_XM_WINDOW,     /* dense transcode: chunks through the window */
  HR_XM_WHOLE,      /* sparse transcode: one work item, then direct */
  HR_XM_STAGE       /* device memory: staged chunk by chunk to the host */
};

/* A transcoding job: the plan and what it reads.  Shared by the part and
 * its work items; counted on the driving thread only. */
struct hr_xjob {
  int refs;
  hr_mem mem;
  void *plan;        /* hr_xc_plan */
  hr_tensor *src;    /* the source tensor (reference) */
  uint64_t out_size; /* dense: target buffer bytes */
  uint64_t grain;    /* chunk granularity */
  hr_tensor *whole;  /* sparse: the materialised output */
};

/* A received tensor node (plain tensor or composite head). */
typedef struct hr_rnode {
  struct hr_rnode *parent;
  hr_descriptor desc;     /* copy; ext/params_raw cleared (params parsed) */
  uint8_t ext[16];        /* PANEL metadata kept for the tensor */
  hr_tensor *t;           /* the tensor once built (plain: at begin) */
  struct hr_rnode **kids; /* composite: members so far */
  uint32_t nkids, want;   /* members arrived / member_count */
  int complete;
} hr_rnode;

/* Per-shard state of a sharded answer (N > 1). */
typedef struct hr_rshard {
  uint64_t shape[HR_MAX_RANK];
  uint64_t offset[HR_MAX_RANK]; /* relative to the assembled box */
  int began, ended;
} hr_rshard;

/* Mapping of the frame being received to its destination. */
typedef struct hr_rcur {
  hr_stream *st; /* stream receiving (NULL: discard) */
  uint32_t stream_id;
  uint8_t buffer_index;
  uint64_t next; /* buffer offset of the next byte */
  uint64_t left; /* bytes of the frame still to come */
  int active;
} hr_rcur;

/* The receiving side of a transfer (client GET, server PUT). */
typedef struct hr_recv {
  hr_rx *rx;
  uint32_t base;    /* first stream id */
  int sharded;      /* answer carries HAS_SHARD */
  uint32_t nshards; /* total_shards (0: not known yet) */
  uint32_t shards_ended;
  hr_rshard *shards;
  hr_tensor *assembled;          /* N > 1: one box-sized tensor */
  hr_descriptor adesc;           /* its descriptor */
  uint64_t astride[HR_MAX_RANK]; /* element strides of the box, storage order */
  unsigned aperm[HR_MAX_RANK];   /* storage order: aperm[0] outermost dim */
  int aslab;                     /* TILED/PANEL: shards must be slabs */
  int has_box;                   /* a REGION request: the box is the region */
  uint64_t box_offset[HR_MAX_RANK];
  uint64_t box_shape[HR_MAX_RANK];
  hr_rnode *root; /* unsharded: the tree */
  hr_rnode *top;  /* innermost open composite head (or NULL) */
  hr_rnode *cur;  /* plain tensor receiving frames */
  hr_tensor *shm_next; /* SHM: the mapped tensor of the next descriptor */
  /* Application destination (client GET). */
  uint8_t *app;
  uint64_t app_cap, app_used;
  unsigned min_align;
  uint64_t bytes; /* tensor bytes landed */
  int complete;
  /* Permissive torn composites: completed plain tensors, in order. */
  hr_tensor **done_list;
  size_t ndone;
  struct hr_devrx *dev; /* client GET into device memory (hr_devrx.c) */
} hr_recv;

/* ---- hr_devrx.c --------------------------------------------------------- */
typedef struct hr_devrx hr_devrx;
/* Makes rv land into device g's memory (sync: P1 or P2). */
int hr__devrx_new(hr_session *s, hr_recv *rv, hr_gpu *g, uint8_t sync);
void hr__devrx_free(hr_session *s, hr_devrx *d);
/* The landing tensor for `desc`: a shell standing for the device
 * buffers, which are allocated by a work item (inline without
 * submit_work); the frames, or an RDMA receive's setup, wait for them.  HR_ERR_LIMIT (an inline
 * allocation failed), HR_ERR_NOMEM, HR_ERR_UNSUPPORTED (a composite, a
 * second tensor). */
int hr__devrx_dest(hr_session *s, hr_recv *rv, const hr_descriptor *desc,
                   hr_tensor **out);
/* Bytes [off, off + n) of buffer bi landed (where hr__devrx_where said). */
void hr__devrx_landed(hr_recv *rv, unsigned bi, uint64_t off, uint64_t n);
/* Where byte `off` of buffer bi lands (a staging slot; *run bytes from
 * there on), or NULL when no slot is free now. */
uint8_t *hr__devrx_where(hr_recv *rv, unsigned bi, uint64_t off,
                         uint64_t *run);
/* Copies n received bytes into place, keeping aside what a full ring
 * cannot take yet.  0, or the error that fails the GET. */
int hr__devrx_place(hr_recv *rv, unsigned bi, uint64_t off, const uint8_t *p,
                    uint64_t n);
/* 1 when byte `off` of buffer bi must wait for a slot (stop reading). */
int hr__devrx_full(const hr_recv *rv, unsigned bi, uint64_t off);
/* Every byte landed (`landed` taken over): completes the GET now (P2) or
 * once the copies are done (P1); ends the stream either way. */
int hr__devrx_finish(hr_session *s, hr_stream *st, hr_tensor *landed);
/* The stream goes: a pending P1 completion forgets it. */
void hr__devrx_detach(hr_recv *rv);
/* At the exit of the outermost call on `s`: notes whether its input is
 * paused for a device ring now, and when it resumes moves the read
 * timeout's and keepalive's clocks forward by the time paused. */
void hr__devrx_track_pause(hr_session *s);
/* RDMA into a device GET without GPUDirect: a host tensor of `desc`'s
 * buffers (CPU) that the transfer lands in, copied to the device through
 * the ring once hr__devrx_finish() runs.  The ring keeps the reference;
 * NULL when it cannot be had (no memory, a ring already fed). */
hr_tensor *hr__devrx_rdma_host(hr_session *s, hr_recv *rv,
                               const hr_descriptor *desc);
/* RDMA with GPUDirect: `local` is `desc` with the device's tag and index,
 * ptrs[] the device buffers' addresses.  Returns 0 or HR_ERR_UNSUPPORTED
 * (a ring already fed, a device without device pointers). */
int hr__devrx_device_region(hr_recv *rv, const hr_descriptor *desc,
                            hr_descriptor *local, void **ptrs);
/* ... then: the data plane lands in the device buffers themselves.  The
 * returned reference (NULL: out of memory, nothing changed) owns them
 * from now on, for the caller's data-plane hold. */
hr_tensor *hr__devrx_rdma_device(hr_session *s, hr_recv *rv,
                                 const hr_descriptor *local);
/* hr_client.c: calls the GET's completion with t (taken over). */
void hr__cli_get_deliver(hr_session *s, hr_stream *st, hr_tensor *t);
/* hr_client.c: ends GET `st` for a local reason: ERROR `code` (`why`) to
 * the server, the request failed with `rc`, what still comes for it
 * dropped.  Ends the stream.  0, or a fatal error (the session failed). */
int hr__cli_get_abandon(hr_session *s, hr_stream *st, int rc, uint32_t code,
                        const char *why);
/* The data plane of the descriptor about to arrive in rv (before its
 * hr__devrx_dest): over RDMA the receive's setup waits for the device
 * memory (GPUDirect registers it), and the allocation's completion
 * resumes it (hr__rdma_rx_resume). */
void hr__devrx_plane(hr_recv *rv, uint8_t data_plane);
/* 1 while the device memory of rv's GET is being allocated on a worker. */
int hr__devrx_allocating(const hr_recv *rv);
/* The application cancelled the GET (a CANCEL is on its way): while the
 * device memory is still being allocated, the stream's bytes are dropped
 * from now on instead of waiting for it, so the server's answer is read;
 * an answer that completes the transfer anyway fails the GET as
 * cancelled. */
void hr__devrx_cancel(hr_session *s, hr_recv *rv);

/* A server GET (base stream or shard stream). */
typedef struct hr_srvget_state {
  uint8_t *key;   /* copied request */
  hr_request req; /* layouts' ext point into `ext_store` */
  uint8_t *ext_store;
  hr_get_info info;
  int answered; /* hr_get_answer/fail called */
  int in_on_get;
  uint32_t block_last; /* last id of the reserved block */
  unsigned lanes;      /* L: lanes when the request arrived */
} hr_srvget_state;

/* struct hr_srv_get: hr_local_get.h (the in-process server's too). */
struct hr_srv_put {
  hr_stream *st;
};

typedef struct hr_cliget_state {
  hr_get_cb cb;
  void *ud;
  hr_get_opts opts; /* copied; pointers into `store` */
  uint8_t *store;
  hr_get_dest dest;
  int has_dest;
  int cancelling;  /* CANCEL sent (or failing): discard until end */
  int fail_status; /* first failure (0: none) */
  uint32_t fail_wire;
  int fail_sent;
  char fail_msg[256];
  uint8_t *ended; /* per shard stream: ended (N known) */
  int base_ended; /* the base id got ERROR/END */
  /* Lanes joined when it was sent: the server counts at least these
   * (§ 14.5), more when joins overtook the request. */
  unsigned lanes_lo;
} hr_cliget_state;

struct hr_stream {
  hr_session *s;
  int kind;      /* enum hr_stream_kind */
  uint32_t id;   /* first id */
  uint32_t last; /* last id of its block (== id unless parallel) */
  /* Scheduling (ready list). */
  hr_stream *rnext, *rprev;
  int in_ready;
  int sent_any;     /* had a turn already (new streams go first) */
  int ended;        /* finished; kept until the outermost call ends */
  int counted;      /* counts against max_streams */
  hr_stream *zlink; /* list of ended streams awaiting free */
  hr_tx tx;         /* sending side (server GET, client PUT) */
  hr_recv rv;       /* receiving side (client GET, server PUT) */
  hr_transfer_record rec;
  int has_rec; /* on_transfer reported for this stream */
  /* Kind-specific. */
  hr_srvget_state sg;
  hr_srv_get gh;
  hr_srv_put ph;
  hr_put_info pinfo; /* server PUT: key copy + head desc */
  uint8_t *pkey;
  int put_accepted; /* on_put_begin accepted */
  hr_cliget_state cg;
  hr_put_cb put_cb;
  hr_list_cb list_cb;
  void *cb_ud;
  int cb_done;  /* the completion callback ran */
  uint8_t *req; /* client: the encoded request, until sent */
  size_t req_len;
  uint8_t *list_msg; /* server LIST: the encoded response */
  size_t list_len;
  /* Shard streams of one server answer share the base's request. */
  hr_stream *base;
  uint64_t lane_mask; /* client GET: lanes its messages arrived on */
  uint32_t nshards;   /* server shard streams: N */
  uint32_t shard_index;
  hr_tensor *chunk_hold; /* a transcoded chunk being sent (reference) */
  char shm_why[160];     /* client: why its SHM segment was not mapped */
  /* Client PUT: the tail its callback may need (hr_devput.c). */
  struct hr_put_tail *put_spare;
};

/* ---- the output queue ---------------------------------------------------- */

/* One item handed out by pull(): up to two byte ranges. */
typedef struct hr_oitem {
  struct hr_oitem *next;
  const uint8_t *p1; /* header / control bytes */
  size_t l1;
  const uint8_t *p2; /* frame data (tensor memory) */
  size_t l2;
  hr_tensor *hold;      /* keeps p2 alive */
  uint8_t *heap;        /* owned storage of p1 (large messages) */
  int is_frame;         /* counts against send_budget */
  int ctrl;             /* counts against the control backlog */
  struct hr_ping *ping; /* PING: stamp when first pulled */
  uint8_t inl[40];      /* small messages and frame prefixes */
  int has_fd;           /* SHM: `fd` goes with the item's first byte */
  int fd;
} hr_oitem;

typedef struct hr_ping {
  struct hr_ping *next;
  uint64_t opaque;
  hr_tstamp sent;
  int stamped;
  int keepalive; /* sent by the session itself */
  hr_ping_cb cb;
  void *ud;
  struct hr_oitem *item; /* the queued PING that points back at us (NULL
                            once it is gone): whichever of the two goes
                            first clears the other's pointer */
} hr_ping;

/* ---- id history: which ids were opened (bounded) ------------------------ */

typedef struct hr_idrange {
  uint32_t first, last;
} hr_idrange;

#define HR_ID_HISTORY 256     /* ranges of opened ids remembered */
#define HR_DISCARD_RANGES 256 /* ranges whose late messages are dropped */
#define HR_CTRL_BACKLOG_MAX ((uint64_t)1 << 20) /* flood limit (bytes) */
#define HR_SPARE_MAX 64 /* recycled streams / output items per session */

/* The stream id space of a session (§ 21).  Stream ids belong to the
 * session, not to a connection (§ 14.5): the lanes of a group share one. */
typedef struct hr_ids {
  uint32_t max_seen;        /* highest id opened or reserved */
  uint32_t last_open_first; /* server: first id of the last request */
  uint32_t next_id;         /* client: next id to use */
  hr_idrange hist[HR_ID_HISTORY];
  unsigned nhist, hist_head;
  hr_idrange discard[HR_DISCARD_RANGES];
  unsigned ndiscard, discard_head;
} hr_ids;

/* ---- lanes: one session over several connections (hr_group.c) ---------- */

#define HR_LANE_NONE (-1) /* not in a group, or joining */
#define HR_TOKEN_MAX 255  /* longest SESSION_TOKEN a client keeps */
#define HR_TOKEN_LEN 16   /* bytes of the tokens this server makes */

/*
 * The connections of one session (§ 14.5), each driven by its own
 * hr_session on the same thread.  A lane keeps its position (join order)
 * for the session's life: a lane that closed still counts in `nlanes`, so
 * both peers map shard i to lane i mod L the same way whatever they know
 * about closed connections.  The group shares what is per session: the
 * id space, and the call and callback brackets (so that a stream ended
 * on behalf of one lane is freed only when no lane is inside a call).
 */
struct hr_group {
  int refs; /* one per lane session, plus the application's handle */
  int has_handle;
  hr_mem mem;
  int role;
  hr_ids ids;
  hr_session *lanes[HR_MAX_LANES]; /* by position; NULL once deleted */
  unsigned nlanes;                 /* positions taken (closed included) */
  hr_session *joining;             /* client: HELLO sent, no answer yet */
  uint8_t token[HR_TOKEN_MAX];
  uint16_t token_len;
  hr_registry *reg; /* server: registered there (NULL: not / no longer) */
  int depth;        /* public calls in progress on any lane */
  int in_cb;        /* callbacks in progress on any lane */
  hr_tstamp last_activity;
};

struct hr_registry {
  int refs; /* the application's handle plus one per attached session */
  hr_mem mem;
  hr_random_fn random;
  void *random_ud;
  hr_group **groups; /* sorted by token */
  size_t n, cap;
};

/* Lane bookkeeping (hr_group.c). */
/* Server: the CLIENT_HELLO arrived: joins the session it names or starts
 * a new one.  Returns 0, 1 when refused (*wire set), or fatal. */
int hr__group_on_client_hello(hr_session *s, uint32_t *wire, const char **why);
/* Client: this lane's SERVER_HELLO arrived.  Returns 0, 1 when it must be
 * refused (*why set, PROTOCOL_VIOLATION), or fatal. */
int hr__group_on_server_hello(hr_session *s, const char **why);
/* The lane closed (idempotent): the transfers that had shards on it
 * fail. */
void hr__group_lane_down(hr_session *s);
/* The session is being freed: leaves its group. */
void hr__group_leave(hr_session *s);
/* Lanes when a request arrives (1 without a group). */
unsigned hr__lanes_now(const hr_session *s);
/* The session of position i, NULL when closed or unknown. */
hr_session *hr__lane_at(const hr_session *s, unsigned i);
/* Client: the lane requests go on (lane 0), NULL when it closed. */
hr_session *hr__request_lane(hr_session *s);
/* Streams open on every lane of the session. */
size_t hr__session_streams(const hr_session *s);
void hr__group_unref(hr_group *g);
void hr__registry_unref(hr_registry *r);
/* Client: lane `pos` closed: every GET on lane 0 `s` that may have a
 * shard on it fails and cancels its other shards. */
void hr__cli_lane_lost(hr_session *s, unsigned pos);
/* hr_session_new() for a lane joining `join` (NULL: an ordinary
 * session). */
int hr__session_create(hr_session **out, int role, const hr_settings *settings,
                       const hr_session_callbacks *cbs,
                       const hr_provider *provider, void *user_data,
                       hr_tstamp now, const hr_mem *mem, hr_group *join);

/* ---- the session --------------------------------------------------------- */

struct hr_session {
  hr_mem mem;
  int role;
  int state; /* enum hr_conn_state */
  hr_settings set;
  char peer_name_buf[64];
  uint8_t *devices_copy;
  uint8_t *auth_copy;
  hr_session_callbacks cbs;
  hr_provider prov;
  int has_prov;
  void *ud;
  hr_wire_ctx wctx;
  hr_reader *rd;
  /* Peer HELLO (copied). */
  hr_hello peer;
  uint8_t *peer_store;
  int have_peer;
  int client_has_cpu;       /* the client advertised CPU (server side) */
  uint32_t our_caps;        /* capabilities we advertised */
  uint32_t peer_max;        /* largest payload we may send */
  uint16_t peer_max_shards; /* client: server's MAX_SHARDS */
  /* Streams. */
  hr_stream **tab; /* sorted by id */
  size_t ntab, captab;
  size_t nrequests; /* open streams counted for max_streams */
  size_t puts_in;   /* server: PUT streams being received (their silence
                       counts against the read timeout) */
  hr_ids *ids;      /* &own_ids, or the group's */
  hr_ids own_ids;
  /* Lanes. */
  hr_group *grp;     /* NULL: a session of one connection */
  int lane;          /* position in grp (HR_LANE_NONE while joining) */
  int lane_down;     /* hr__group_lane_down() ran */
  hr_registry *reg;  /* server: where SESSION_JOIN tokens are looked up */
  uint64_t consumed; /* bytes the host wrote (pull/consumed) */
  int refused;       /* client: ERROR came instead of SERVER_HELLO */
  /* GOAWAY. */
  int goaway_sent, goaway_recv;
  uint32_t goaway_last; /* what we sent */
  uint32_t goaway_peer_last;
  /* Output. */
  hr_oitem *qhead, *qtail;
  size_t qoff;              /* bytes of qhead already consumed */
  uint64_t frame_queued;    /* frame bytes queued, not consumed */
  uint64_t ctrl_queued;     /* control bytes queued, not consumed */
  hr_stream *rhead, *rtail; /* ready list */
  /* Receive. */
  hr_rcur rc;
  hr_tstamp now;
  hr_tstamp created;
  hr_tstamp last_rx;       /* last byte received */
  hr_tstamp tx_progress;   /* CLOSED: entered, or last output consumed
                              since (bounds the final flush) */
  hr_tstamp last_activity; /* last stream activity (idle timer) */
  hr_tstamp msg_started;   /* last progress inside a message */
  /* PING. */
  hr_ping *pings;
  uint64_t ping_seq;
  int keepalive_out;
  hr_tstamp keepalive_sent;
  /* Callbacks and deferred frees. */
  int depth; /* public calls in progress (re-entrancy) */
  int in_cb; /* callbacks in progress */
  int del_pending;
  int fatal;              /* a fatal error happened */
  hr_stream *zombies;     /* ended streams, freed at the outermost exit */
  /* Freed streams and output items kept for reuse (at most HR_SPARE_MAX
   * of each): a busy connection opens and ends a stream per request, and
   * recycling them keeps malloc out of the per-request path. */
  hr_stream *spare_streams;
  unsigned nspare_streams;
  hr_oitem *spare_items;
  unsigned nspare_items;
  size_t works_inflight;  /* hr_work items not yet reported */
  int deleted;            /* hr_session_del ran; freed with the last work */
  uint32_t closing_error; /* code of the connection ERROR we sent */
  struct hr_cpool *cpool; /* reusable chunk buffers (hr_chunks.c) */
  /* The RDMA data plane (hr_rdma_glue.c; NULL: none configured). */
  struct hr_rdma_glue *rdma;
  /* The SHM data plane (hr_shm.c). */
  struct hr_slease *sleases; /* server: segments the client may map
                              * (an array, hr_shm.c: nsleases below) */
  struct hr_clease *cleases; /* client: mapped segments not yet released */
  struct hr_pfd *pfds;       /* received descriptors not yet claimed */
  size_t npfds;
  uint64_t rx_total;  /* input bytes fed so far */
  uint64_t msg_start; /* input position of the message being handled */
  int shm_ok;         /* both HELLOs carry SHM_DATA_PLANE */
  int shm_off;        /* server: the client could not map a segment */
  int pull_fd;        /* the fd of the last pull, or -1 */
  unsigned dev_spilling; /* GETs into a device holding bytes aside */
  /* Asynchronous I/O (hr_session_io_hold): the last pull's iovecs are
   * being written, or the last recv target read into, off the driving
   * thread; io_fence stops it before the memory may go. */
  int tx_held, rx_held;
  /* Input paused for a device receive ring (hr_session_recv_paused()),
   * tracked at each call's exit (hr__devrx_track_pause): while paused,
   * the read timeout and keepalive are stopped, and the clocks they run
   * on move forward by the paused time when input resumes. */
  int rx_paused;
  hr_tstamp rx_paused_at;
  uint32_t rx_pauses;      /* pauses so far */
  uint64_t rx_paused_ns;   /* time paused so far (ended pauses) */
  /* Device PUTs ended while staging copies ran (hr_devput.c). */
  struct hr_put_tail *put_tails;
  /* Request calls (hr_session_get/put/list) in progress: no completion
   * callback runs inside one; what ends there is due (decision 78). */
  unsigned req_calls;
  unsigned put_due; /* tails due: hr_session_get_expiry() says "now" */
  /* Server: the leases' array (sleases): entries, room, entries not
   * ended (HR_SHM_LEASES_MAX bounds these). */
  size_t nsleases, sleases_cap, sleases_live;
};

/* Before the session drops output a held pull may still be writing:
 * asks the host to stop the write and consumes what it wrote. */
void hr__io_fence_tx(hr_session *s);
/* Before stream `st` ends or completes: stops a held read into it on any
 * lane of the group. */
void hr__io_fence_rx(hr_session *s, hr_stream *st);

/* Makes `p` send device tensor t (whole, or buffer 0's [start, start +
 * len)) through staging chunks; takes a reference to t. */
void hr__part_device(hr_part *p, hr_tensor *t, int whole, uint64_t start,
                     uint64_t len);

/* ---- hr_chunks.c ------------------------------------------------------- */

/* A chunk buffer for `len` (<= `size`) bytes: host memory (g NULL) or
 * pinned memory of device g, taken from the session's pool of `size`-byte
 * blocks or newly allocated.  The tensor returned (one reference) gives
 * the block back to the pool when its last reference goes (driving thread
 * only: chunk tensors never leave the session).  *gbuf receives the
 * block's hr_gpu_buf when g is set.  Returns 0, HR_ERR_NOMEM, or a device
 * error. */
int hr__chunk_get(hr_session *s, hr_gpu *g, uint64_t size, uint64_t len,
                  hr_tensor **out, hr_gpu_buf **gbuf);
/* An idle pinned block of (g, size) as a chunk tensor of `size` bytes, or
 * HR_ERR_NOT_FOUND when the pool has none (nothing is allocated). */
int hr__chunk_take(hr_session *s, hr_gpu *g, uint64_t size, hr_tensor **out,
                   hr_gpu_buf **gbuf);
/* Makes `pinned` (a PINNED buffer of g allocated elsewhere, e.g. on a
 * worker) a block of the pool, handed out at once as a chunk tensor of
 * its size; takes ownership of `pinned` in every case. */
int hr__chunk_adopt(hr_session *s, hr_gpu *g, hr_gpu_buf *pinned,
                    hr_tensor **out, hr_gpu_buf **gbuf);
/* The session's staging stream on device g (created on first use). */
int hr__chunk_stream(hr_session *s, hr_gpu *g, hr_gpu_stream **out);
/* Waits on this thread until the device has done what was enqueued on
 * `gs` so far, through an event recorded on it (never a device-wide
 * sync): the `run` of the device-copy work items, for hosts without
 * `start`.  0 or the device's error. */
int hr__gpu_stream_wait(hr_gpu_stream *gs);
/* Hands `w` to the host (cbs.submit_work), counted in works_inflight;
 * without a host's workers, or when the host refuses it, runs it here and
 * calls its done() before returning. */
void hr__work_submit(hr_session *s, hr_work *w);
/* The asynchronous end of a device-copy work item (hr_work.start): where
 * the device's host function reports it. */
typedef struct hr_gpu_work {
  hr_work *w;
  void (*complete)(hr_work *w, void *ctx);
  void *complete_ctx;
} hr_gpu_work;
/* A device-copy item's `start`: enqueue(w) (NULL: its device work was
 * enqueued at submission), then a host function on `gs` that calls
 * complete(w, ctx) once the device reached it.  Returns 0 or the first
 * failure, which is also stored in *failed unless that is NULL; on a
 * failure the work enqueued stays enqueued (the host then runs `run`,
 * which is what hr__gpu_work_run does). */
int hr__gpu_work_start(hr_gpu_work *g, hr_work *w, hr_gpu_stream *gs,
                       int (*enqueue)(hr_work *w),
                       void (*complete)(hr_work *w, void *ctx), void *ctx,
                       int *failed);
/* The same item's `run`: enqueue(w) (when not NULL), then
 * hr__gpu_stream_wait(gs).  0 or the first failure. */
int hr__gpu_work_run(hr_work *w, hr_gpu_stream *gs,
                     int (*enqueue)(hr_work *w));
/* ... without creating it: 0, or HR_ERR_NOT_FOUND when it has none. */
int hr__chunk_stream_get(hr_session *s, hr_gpu *g, hr_gpu_stream **out);
/* Makes `gs` (a stream of g created elsewhere, e.g. on a worker) the
 * session's staging stream on g, taking it over in every case: when the
 * pool got one meanwhile, `gs` is deleted and *out is that one.  0,
 * HR_ERR_LIMIT (streams of too many devices), HR_ERR_NOMEM. */
int hr__chunk_stream_adopt(hr_session *s, hr_gpu *g, hr_gpu_stream *gs,
                           hr_gpu_stream **out);
/* Blocks allocated / reused so far (tests, metrics). */
void hr__chunk_stats(const hr_session *s, uint64_t *allocs, uint64_t *reuses);
/* The session is being freed: frees idle blocks and the streams; blocks
 * still out are freed when they come back. */
void hr__chunks_close(hr_session *s);
/* ---- hr_shm.c: the SHM data plane ---------------------------------------- */

/* Server: the tensor can be answered over SHM on this session (negotiated,
 * not turned off, the tensor has a segment). */
int hr__shm_serves(const hr_session *s, const hr_tensor *t);
/* Server: marks the parts of `tx` that go over SHM (native, whole,
 * in a segment); fills *why when SHM was negotiated but not used. */
void hr__shm_plan(hr_session *s, hr_tx *tx, char *why, size_t why_len);
/* Server: the SHM descriptor for stream `sid` was queued: keep `t` until
 * BUFFER_RELEASE, ERROR on `sid`, or the session's end. */
int hr__shm_lease_add(hr_session *s, uint32_t sid, hr_tensor *t);
/* Server: BUFFER_RELEASE (or ERROR: then SHM is turned off) on `sid`. */
void hr__shm_lease_drop(hr_session *s, uint32_t sid, int failed);
/* A message starting at input position `start` is about to be handled:
 * descriptors received with earlier messages that none claimed are a
 * violation.  Returns 0 or what hr__conn_error returns. */
int hr__shm_check_fds(hr_session *s, uint64_t start);
/* Client: maps the segment of an SHM descriptor that arrived on `st` and
 * wraps it (*out: a new reference).  HR_ERR_PROTO with `ws` on failure
 * (the descriptor's fd is closed either way). */
int hr__shm_cli_map(hr_session *s, hr_stream *st, const hr_descriptor *d,
                    const hr_transport_fields *xp, hr_tensor **out,
                    hr_wire_status *ws);
/* Client: queues BUFFER_RELEASE for segments the application released.
 * Returns 0 or a fatal error. */
int hr__shm_flush_releases(hr_session *s);
/* Client: a released segment still owes its BUFFER_RELEASE. */
int hr__shm_release_due(const hr_session *s);
/* Session teardown: server leases dropped, client leases detached,
 * unclaimed descriptors closed. */
void hr__shm_free(hr_session *s);
/* Client: closes the descriptor that came with the message starting at
 * `start`, which was refused before it could claim it. */
void hr__shm_drop_fd(hr_session *s, uint64_t start);
/* A client's hold on stream `sid`'s lease for one more delivered tensor
 * (NULL: no memory), and its release from any thread. */
struct hr_clease *hr__shm_clease_hold(hr_session *s, uint32_t sid);
void hr__shm_clease_let_go(struct hr_clease *l);

/* ---- hr_shm_dev.c: device memory over the SHM plane --------------------- */

/* 1 when our HELLO lists memory class PINNED (device memory exported for
 * IPC): we speak SHM and advertise a device, and a client can be woken
 * for the release.  hr__shm_dev_classes is that list. */
int hr__shm_dev_advertise(const hr_session *s);
extern const uint8_t hr__shm_dev_classes[2];
/* 1 when `t` is a device tensor whose memory can be exported. */
int hr__shm_dev_serves(const hr_tensor *t);
/* Server: marks part `p` (of a device tensor) to go as its exported
 * memory; returns 1, or 0 with the reason in *miss. */
int hr__shm_dev_plan(const hr_session *s, hr_part *p, const char **miss);
/* Client: imports descriptor `fd` (not taken) for stream st's GET into
 * its device.  Returns 0 with *out, HR_ERR_PROTO with `ws` (ERROR
 * DEVICE_UNAVAILABLE: the server falls back to frames), HR_ERR_NOMEM. */
int hr__shm_dev_import(hr_session *s, hr_stream *st, const hr_descriptor *d,
                       int fd, hr_tensor **out, hr_wire_status *ws);
/* Queues an encoded message carrying descriptor `fd`. */
int hr__out_msg_fd(hr_session *s, const hr_msg *m, int fd);

/* ---- hr_outq.c ---------------------------------------------------------- */

/* Frees a PING record, detaching it from its queued message first. */
void hr__ping_free(hr_session *s, hr_ping *p);

/* Queues a whole encoded control message (connection-level or a stream's
 * single answer).  `ctrl` counts it against the flood limit.  Returns 0 or
 * HR_ERR_NOMEM. */
int hr__out_msg(hr_session *s, const hr_msg *m, int ctrl);
/* Queues a frame: prefix + data borrowed from `hold` (reference taken). */
int hr__out_frame(hr_session *s, uint32_t stream_id, uint8_t bi, uint64_t off,
                  const uint8_t *data, uint32_t len, hr_tensor *hold);
/* Queues pre-encoded bytes that `heap` owns (taken over on success). */
int hr__out_bytes(hr_session *s, uint8_t *heap, size_t len, int is_frame);
/* Convenience encoders. */
int hr__out_error(hr_session *s, uint32_t stream_id, uint32_t code,
                  const char *text);
int hr__out_empty(hr_session *s, uint32_t type, uint32_t stream_id);
/* Frees every queued item. */
void hr__out_clear(hr_session *s);
void hr__out_free_spares(hr_session *s); /* at session free */
/* Fills iovecs from the queue. */
int hr__out_iov(hr_session *s, hr_iov *iov, int max);
/* Drops the first n bytes. */
void hr__out_consume(hr_session *s, size_t n);
int hr__out_pending(const hr_session *s);

/* Ready list. */
void hr__ready_add(hr_session *s, hr_stream *st);
void hr__ready_remove(hr_session *s, hr_stream *st);
/* One scheduling round; returns 0 or a fatal error. */
int hr__schedule(hr_session *s);

/* ---- hr_send.c ----------------------------------------------------------- */

/* Largest TENSOR_DATA data length we may send now. */
uint32_t hr__frame_cap(const hr_session *s);
/* Builds the parts for sending tensor `t` (composites flattened). */
int hr__tx_add_tensor(hr_session *s, hr_tx *tx, hr_tensor *t);
/* The stream's turn: queue messages up to one frame.  Sets *more when it
 * has more to send now, *budget_hit when the budget stopped it.  Returns 0,
 * 1 when the whole send sequence finished, or a fatal error. */
int hr__tx_turn(hr_session *s, hr_stream *st, int *more, int *budget_hit);
/* Queues the first message (a client's TENSOR_PUT) at once, so that
 * stream ids reach the wire in the order they were taken. */
int hr__tx_send_head(hr_session *s, hr_stream *st);
/* Has something to send right now. */
int hr__tx_ready(const hr_stream *st);
/* Starts the transcode window of the current part when needed. */
int hr__tx_pump(hr_session *s, hr_stream *st);
void hr__tx_free(hr_session *s, hr_tx *tx);
/* A sanitised network descriptor of `t` (sync 0, device_index 0, ...). */
void hr__net_desc(const hr_descriptor *in, hr_descriptor *out);
void hr__xport_for(const hr_descriptor *d, hr_transport_fields *xp);
void hr__xjob_unref(hr_xjob *xj);
/* Work item bookkeeping on session teardown. */
void hr__work_detach_stream(hr_stream *st);
/* A client PUT ending while staging copies of its device tensor are in
 * flight, or the fabric may still read it, or inside a request call:
 * parks its callback (already recorded in st->rec) until they let go, or
 * until the session's next step.  Returns 1 when parked, 0 when the
 * caller calls it now. */
int hr__tx_park_put(hr_session *s, hr_stream *st);
/* A client PUT whose TENSOR_PUT has not gone yet although it had turns:
 * a GPUDirect source waiting for its producer's event. */
int hr__tx_put_unsent(const hr_stream *st);

/* ---- hr_devput.c: parked callbacks of client PUTs ------------------------ */

typedef struct hr_put_tail hr_put_tail;
/* Allocates st's spare tail (for a key of key_len bytes) before anything
 * can end the PUT inside hr_session_put().  0 or HR_ERR_NOMEM. */
int hr__put_tail_reserve(hr_session *s, hr_stream *st, size_t key_len);
/* Frees st's unused spare tail (stream release). */
void hr__put_tail_unreserve(hr_session *s, hr_stream *st);
/* A tail for st's callback and record, held by `refs` copies (and fabric
 * holds, hr__put_tail_hold).  With refs 0 it is due at once: the PUT
 * ended inside a request call.  NULL: out of memory. */
hr_put_tail *hr__put_tail_new(hr_session *s, hr_stream *st, unsigned refs);
/* One more holder (a fabric registration still read). */
void hr__put_tail_hold(hr_put_tail *t);
/* A holder let go: the last one fires the callback (due instead inside a
 * request call; nothing for an orphan, whose session's delete fired it)
 * and frees the tail. */
void hr__put_tail_drop(hr_put_tail *t);
/* hr_session_put() fails after the PUT with stream `id` was parked: the
 * call's error is its only report (no callback). */
void hr__put_tails_forget(hr_session *s, uint32_t id);
/* Fires the due tails (outside request calls). */
void hr__put_tails_run_due(hr_session *s);
/* hr_session_del: the parked callbacks fire now; tails still held become
 * orphans. */
void hr__put_tails_flush(hr_session *s);

/* ---- hr_recv.c ----------------------------------------------------------- */

int hr__recv_init(hr_session *s, hr_recv *rv, const hr_rx_config *cfg);
void hr__recv_free(hr_session *s, hr_recv *rv);
/* Feeds one decoded message (descriptor, data geometry, end, put).  On
 * HR_ERR_PROTO `st` names the code; HR_ERR_LIMIT: the destination is too
 * small; HR_ERR_UNSUPPORTED: cannot place these shards; fatal errors. */
int hr__recv_msg(hr_session *s, hr_stream *st, hr_recv *rv, const hr_msg *m,
                 hr_wire_status *ws);
/* Where buffer `bi` byte `off` of stream `sid`'s current tensor lands:
 * returns the pointer and the contiguous length available there. */
uint8_t *hr__recv_where(hr_recv *rv, uint32_t sid, uint8_t bi, uint64_t off,
                        uint64_t *run);
/* The result tensor (reference transferred) once complete. */
hr_tensor *hr__recv_take(hr_recv *rv);

/* ---- hr_select.c --------------------------------------------------------- */

/* Plans a server answer of `t` to request `req` into shard streams: fills
 * parts lists (one per shard), and the decision summary.  `lanes` is L,
 * the session's lanes when the request arrived.  Errors: wire
 * error code in *wire and a message (stream-level refusal), or fatal. */
typedef struct hr_answer_plan {
  uint32_t nshards; /* 0: unsharded answer */
  hr_tx *txs;       /* nshards (or 1) send sequences */
  uint8_t layout;
  int transcoded;
  uint8_t device;
  char fallback[128];
} hr_answer_plan;

int hr__select_answer(hr_session *s, const hr_request *req, hr_tensor *t,
                      unsigned lanes, hr_answer_plan *plan, uint32_t *wire,
                      char *msg, size_t msgcap);
void hr__answer_plan_free(hr_session *s, hr_answer_plan *plan);

/* ---- hr_server.c / hr_client.c ------------------------------------------- */

int hr__srv_on_open(hr_session *s, const hr_msg *m, hr_wire_status *ws);
int hr__srv_on_stream_msg(hr_session *s, hr_stream *st, const hr_msg *m);
/* A PUT's landing tensor from the provider's on_put_alloc: 0 with *out,
 * HR_ERR_NOT_FOUND (no such callback, or it declined: allocate as usual),
 * or HR_ERR_LIMIT (it failed, or gave a tensor that does not fit `d`). */
int hr__put_alloc(hr_session *s, const hr_descriptor *d, unsigned min_align,
                  hr_tensor **out);
int hr__cli_on_stream_msg(hr_session *s, hr_stream *st, const hr_msg *m);
/* Per-role halves of the stream events below. */
int hr__srv_stream_sent(hr_session *s, hr_stream *st);
int hr__cli_stream_sent(hr_session *s, hr_stream *st);
void hr__srv_stream_fail(hr_session *s, hr_stream *st, int status,
                         uint32_t wire, int sent, const char *msg);
void hr__cli_stream_fail(hr_session *s, hr_stream *st, int status,
                         uint32_t wire, int sent, const char *msg);
/* Library status for a wire error we sent. */
int hr__status_for_wire(uint32_t code);
/* The session established: client streams queued before may go. */
int hr__cli_established(hr_session *s);
/* Client GET: CANCEL every used id of its block but `except`. */
int hr__cli_cancel_others(hr_session *s, hr_stream *st, uint32_t except);
/* A GOAWAY arrived (client): fail streams above last. */
void hr__cli_goaway(hr_session *s, uint32_t last);
/* Queues a PING (keepalive: sent by the session itself). */
int hr__ping_send(hr_session *s, hr_ping_cb cb, void *ud, int keepalive);
/* A PONG arrived. */
void hr__cli_pong(hr_session *s, uint64_t opaque);
/* The stream's send sequence finished (called by the scheduler). */
int hr__stream_sent(hr_session *s, hr_stream *st);
/* A transcode chunk completed for `st`. */
int hr__stream_chunk_done(hr_session *s, hr_stream *st);
/* Ends a stream on failure with every callback it owes. */
void hr__stream_fail(hr_session *s, hr_stream *st, int status, uint32_t wire,
                     int sent, const char *msg);

/* ---- hr_session.c helpers ------------------------------------------------ */

int hr__stream_new(hr_session *s, int kind, uint32_t id, uint32_t last,
                   hr_stream **out);
/* Removes the stream from the table and the ready list, frees what it owns
 * and parks it for freeing when the outermost call ends. */
void hr__stream_end(hr_session *s, hr_stream *st);
hr_stream *hr__stream_find(const hr_session *s, uint32_t id);
/* Stream-level error: queue ERROR on `sid`, end the stream if any, drop
 * its late messages.  Returns 0 or fatal. */
int hr__stream_error(hr_session *s, uint32_t sid, uint32_t code,
                     const char *text);
/* Connection-level error: ERROR on stream 0, fail all, CLOSED. */
int hr__conn_error(hr_session *s, uint32_t code, const char *text);
void hr__discard_add(hr_session *s, uint32_t first, uint32_t last);
void hr__hist_add(hr_session *s, uint32_t first, uint32_t last);
void hr__record_init(hr_session *s, hr_transfer_record *rec);
void hr__report_transfer(hr_session *s, const hr_transfer_record *rec);
/* Server: on_request for a request that ends without a transfer record
 * (wire 0: answered; else the ERROR sent, with its text). */
void hr__report_request(hr_session *s, int kind, uint32_t sid,
                        const uint8_t *key, uint16_t key_len, uint32_t wire,
                        const char *msg);
/* Brackets a public call made outside hr_session_recv/pull/...: ended
 * streams are freed (and a deferred del runs) when the outermost call
 * returns.  Do not touch `s` after hr__api_leave(). */
void hr__api_enter(hr_session *s);
void hr__api_leave(hr_session *s);
/* Callback bracket (re-entrancy accounting). */
static inline void hr__cb_enter(hr_session *s) {
  s->in_cb++;
  if (s->grp)
    s->grp->in_cb++;
}
static inline void hr__cb_leave(hr_session *s) {
  s->in_cb--;
  if (s->grp)
    s->grp->in_cb--;
}
/* Fatal error: marks the session and returns rv. */
int hr__fatal(hr_session *s, int rv);
/* Sets a record's error text from a C string (NULL: empty). */
void hr__set_msg(char *dst, size_t cap, const char *src, size_t len);

/* ---- hr_rdma_glue.c: the RDMA data plane (fabric/) ----------------------
 * Small hooks; every one is a no-op (0) on a session without a fabric and
 * in builds without fabric/. */

/* hr_session_new: copies the fabric settings; returns the capabilities
 * the fabric adds to our HELLO, or a negative error. */
int hr__rdma_session_init(hr_session *s, const hr_settings *in);
/* Session freed. */
void hr__rdma_session_free(hr_session *s);
/* The HELLO's extra extensions. */
const uint8_t *hr__rdma_hello_ext(const hr_session *s, uint16_t *len,
                                  uint16_t *count);
/* Both HELLOs are in: the connection's RDMA state.  Returns 0 or fatal. */
int hr__rdma_established(hr_session *s);
/* A stream message for owner `s`: 1 when the data plane took it, 0 when
 * the session handles it, or a fatal error. */
int hr__rdma_stream_msg(hr_session *s, hr_stream *st, const hr_msg *m);
/* The stream ends: its handshakes are dropped without messages. */
void hr__rdma_stream_end(hr_session *s, hr_stream *st);
/* Client PUT `st` ends early: how many of its registrations the fabric
 * may still read (not released), and parking its callback `t` on them
 * (each lets go of `t` once the fabric released it). */
unsigned hr__rdma_put_holds(hr_session *s, const hr_stream *st);
void hr__rdma_put_park(hr_session *s, const hr_stream *st, hr_put_tail *t);
/* Sender, before part `p`'s descriptor goes: 1 when the part goes over
 * RDMA (p->xp.data_plane set), 0 for frames (a reason may be in the
 * record), or fatal.  hr__rdma_tx_start() after the descriptor. */
int hr__rdma_tx_prepare(hr_session *s, hr_stream *st, hr_part *p);
int hr__rdma_tx_start(hr_session *s, hr_stream *st);
/* hr__rdma_tx_prepare()'s third answer: the part goes over RDMA from
 * device memory (GPUDirect source), but its producer's event comes first:
 * p->dipc is HR_DIPC_WAIT and the descriptor waits for hr__tx_pump(). */
#define HR_RDMA_TX_WAIT 2
/* 1 when device part `p` may go over RDMA straight from device memory:
 * its staging must not start before its descriptor's choice. */
int hr__rdma_tx_device_first(hr_session *s, const hr_stream *st,
                             const hr_part *p);
/* A device part's memory as an RDMA source region (hr_rdma_src.c): fills
 * `local` (p->desc with the device's tag and index) and bufs[] (device
 * addresses).  Returns 0, or HR_ERR_UNSUPPORTED with *why (static text). */
int hr__rdma_src_region(const hr_part *p, hr_descriptor *local, void **bufs,
                        const char **why);
/* Receiver: a descriptor with data_plane RDMA began a tensor on `sid`.
 * Returns 0 or fatal. */
int hr__rdma_rx_begin(hr_session *s, hr_stream *st, uint32_t sid,
                      const hr_descriptor *d, const hr_transport_fields *xp);
/* A device GET's RDMA receive deferred by hr__rdma_rx_begin while its
 * device memory was allocated on a worker: the memory is there, set the
 * receive up (and replay what the sender sent meanwhile).  May end the
 * stream.  0 (also when nothing waited) or fatal. */
int hr__rdma_rx_resume(hr_session *s, hr_stream *st);
/* Server PUT commit: 1 when the handshake sent the answer (ACK or
 * ERROR), 0 when the session must, or fatal. */
int hr__rdma_put_answer(hr_session *s, hr_stream *st, uint32_t wire,
                        const char *text);
/* Client GET: keeps what a retry needs. */
int hr__rdma_get_keep(hr_session *s, hr_stream *st, const hr_get_opts *o);
/* ---- hr_rdma_stage.c: staged RDMA sources (decision 76) -----------------
 * A part the fabric cannot read where it lies is copied into one host
 * region first; its descriptor waits for that. */
typedef struct hr_rstage hr_rstage;
/* Starts staging part `p` (device, or transcoded output) into a host
 * region counted in `acct` under `cap`.  Returns 1 (its descriptor waits
 * while hr__rstage_waiting(p); the stage may be done, or the stream
 * failed, already), 0 when it cannot (*why says why: frames), or
 * HR_ERR_NOMEM. */
int hr__rstage_begin(hr_session *s, hr_stream *st, hr_part *p,
                     hr_stage_account *acct, uint64_t cap, char *why,
                     size_t why_cap);
/* Keeps a fabric tracker's reference `trk` (ops: its fabric) with the
 * memory of staged region tensor `t`, to be told when that memory is
 * freed rather than when `t` is: 0 kept, 1 kept already (`trk` is the
 * caller's to drop), HR_ERR_UNSUPPORTED when `t` is no staged region or
 * has no room for another fabric (watch the tensor instead). */
int hr__rstage_watch(hr_tensor *t, const struct hr_fabric_ops *ops,
                     void *trk);
/* 1 while the part's stage is not complete. */
int hr__rstage_waiting(const hr_part *p);
/* A staged part's host region: its descriptor (host memory) and buffer
 * addresses.  0, or HR_ERR_STATE when the part is not staged. */
int hr__rstage_local(const hr_part *p, hr_descriptor *local, void **bufs);
/* A client PUT whose stage is under way: its TENSOR_PUT has not gone. */
int hr__rstage_put_unsent(const hr_stream *st);
/* The part goes (its stream ended): items in flight finish on their own
 * and free the stage with the last one. */
void hr__rstage_detach(hr_session *s, hr_part *p);
/* Staging copies of the part in flight, and parking a PUT's callback on
 * them (hr_devput.c). */
unsigned hr__rstage_copies(const hr_part *p);
void hr__rstage_park(hr_part *p, struct hr_put_tail *t);
/* hr_send.c: a staging failure ends stream `st` only (as a framed
 * staging failure does): 0 or fatal. */
int hr__tx_stage_error(hr_session *s, hr_stream *st, int rc, uint32_t wire,
                       const char *text);

/* Client PUT: the acknowledgement arrived (also through the data plane). */
int hr__cli_put_acked(hr_session *s, hr_stream *st);

#endif /* HR_SESSION_INT_H */
