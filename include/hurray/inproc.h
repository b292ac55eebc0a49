/*
 * libhurray: in-process interchange (the seed's "In-Process" section;
 * docs/internals/inproc.md; the choices in docs/protocol.md § 25.1,
 * decision 53).
 *
 * Within one address space a tensor is handed over by passing its
 * descriptor and its buffer handle by value: no serialisation, no copy,
 * no socket.  The receiver holds the handle while it uses the buffers and
 * releases it exactly once; the producer's release callback then runs.
 *
 * Two levels:
 *
 *  - hr_inproc_chan: a bounded channel from producer threads to a
 *    consumer.  Each message is an hr_tensor (descriptor + buffers + the
 *    producer's ADR-009 release) plus the ADR-018 § 4 sync payload for
 *    device buffers (P1 nothing; P2 the event and its release; P3 the
 *    consumer's stream, declared when the channel was made).  The payload
 *    is cross-checked against the descriptor's sync_mode before the
 *    consumer can see the message, and every message is an hr_handoff of
 *    the channel's ledger (<hurray/handoff.h>), so a double or missing
 *    release is detected and counted.  An eventfd (hr_inproc_chan_fd())
 *    is readable while messages wait, so a loop-based consumer never
 *    polls; the consumer's engine may be woken instead.
 *
 *  - The in-process server/client pair: an application-owned hub names
 *    servers; a client engine connects to one by name and makes GET, PUT
 *    and LIST requests that reach the server engine's provider through the
 *    same hr_provider callbacks as over a socket, and complete through the
 *    same hr_get_cb / hr_put_cb / hr_list_cb callbacks.  A GET hands the
 *    provider's tensor over by reference (the client's tensor points at
 *    the server's buffers) and its release flows back to the server's loop
 *    thread exactly once.  The pair is built on the engines' wakeup
 *    (hr_engine_wakeup()): requests, answers and releases are messages to
 *    the other engine's loop thread, so both engines may run on different
 *    threads or on the same loop (they may even be one engine).
 *
 * No global state: every object here belongs to the application.
 */
#ifndef HURRAY_INPROC_H
#define HURRAY_INPROC_H

#include <hurray/common.h>
#include <hurray/engine.h>
#include <hurray/handoff.h>
#include <hurray/session.h>
#include <hurray/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* The channel                                                               */
/* ------------------------------------------------------------------------ */

typedef struct hr_inproc_chan hr_inproc_chan;
typedef struct hr_inproc_msg hr_inproc_msg;

typedef struct hr_inproc_chan_config {
  size_t size;       /* sizeof(hr_inproc_chan_config) */
  uint32_t capacity; /* messages queued at most (64; 1 to 1 << 20) */
  /* The consumer's side of every handoff (ADR-018 § 4): its stream for P3
   * and the modes it accepts.  `transport` is forced to
   * HR_HANDOFF_IN_PROCESS.  Producers read it with
   * hr_inproc_chan_request() and meet it before they send. */
  hr_handoff_request request;
  /* When set, every message (and the close) also calls
   * hr_engine_wakeup(wake_engine), so a consumer on that engine's loop
   * drains the channel from its config.on_wakeup.  The engine must stay
   * alive while anyone may still send or close, and its on_wakeup must not
   * touch the channel once it was deleted. */
  hr_engine *wake_engine;
} hr_inproc_chan_config;

/* Fills `c` with the defaults above (capacity 64, every in-process mode,
 * no consumer stream, no engine). */
HR_EXTERN void hr_inproc_chan_config_default(hr_inproc_chan_config *c);

/*
 * Creates a channel (`cfg` copied; NULL: defaults) with its own handoff
 * ledger and eventfd.  Returns 0, HR_ERR_INVALID_ARGUMENT (capacity out
 * of range, bad size), HR_ERR_NOMEM, HR_ERR_IO (eventfd).
 */
HR_EXTERN int hr_inproc_chan_new(hr_inproc_chan **out,
                                 const hr_inproc_chan_config *cfg,
                                 const hr_mem *mem);

/*
 * Destroys the channel.  Messages still queued were never seen by the
 * consumer: their releases are made now (on the calling thread).
 * Messages received and not yet deleted are destroyed too, their missing
 * releases counted and reported, not made (the consumer may still be
 * reading: leaking is the safe side).  No thread may use the channel
 * during or after the call.  `final` (may be NULL) receives the ledger's
 * last counters.  Returns 0, or HR_ERR_BUSY when received messages were
 * still alive (the channel is destroyed all the same).  NULL: 0.
 */
HR_EXTERN int hr_inproc_chan_del(hr_inproc_chan *ch, hr_handoff_counts *final);

/* The consumer's request (valid for the channel's life; any thread). */
HR_EXTERN const hr_handoff_request *
hr_inproc_chan_request(const hr_inproc_chan *ch);

/* An eventfd that is readable while messages wait or after the channel
 * was closed; the channel drains it itself (never read it).  Any
 * thread. */
HR_EXTERN int hr_inproc_chan_fd(const hr_inproc_chan *ch);

/* Messages queued now, and the ledger's counters.  Any thread. */
HR_EXTERN size_t hr_inproc_chan_pending(hr_inproc_chan *ch);
HR_EXTERN void hr_inproc_chan_counts(hr_inproc_chan *ch, hr_handoff_counts *c);

/*
 * Producer: queues tensor `t` (a reference is taken; the caller keeps its
 * own).  `sync` (NULL for P1) is the ADR-018 payload for the buffers: its
 * sync_handle, sync_handle_device_tag, event_release(+ctx) and
 * ordered_stream are used; ptr and release are the channel's (buffer 0's
 * memory, and dropping the reference taken here, whose last drop calls
 * the tensor's release).  The mode is the descriptor's: every buffer
 * handle must declare the same sync_mode and device_tag (a composite is
 * refused: send its members).  The cross-check of ADR-018 § 4
 * (hr_handoff_check() against hr_inproc_chan_request()) runs before the
 * message is queued.  Any thread.
 *
 * Returns 0; HR_ERR_WOULDBLOCK when the channel is full (nothing taken,
 * nothing called: retry later or use hr_inproc_send_wait()); HR_ERR_CLOSED
 * after hr_inproc_chan_close() (nothing taken); HR_ERR_PROTO with `st`
 * (may be NULL; INVALID_SYNC_MODE) when the payload does not match the
 * descriptor or the request: the payload's event_release is then called,
 * as § 4 hands a refused producer's resources back, and the reference
 * taken is dropped again; HR_ERR_INVALID_ARGUMENT; HR_ERR_NOMEM (the
 * event released as for a refusal).
 */
HR_EXTERN int hr_inproc_send(hr_inproc_chan *ch, hr_tensor *t,
                             const hr_handoff_payload *sync,
                             hr_wire_status *st);

/* The blocking variant: waits up to `timeout_ns` (-1: for ever) for room.
 * Returns as hr_inproc_send(), HR_ERR_TIMEOUT instead of
 * HR_ERR_WOULDBLOCK when no room came in time.  Never call it from a
 * loop thread that also consumes the channel. */
HR_EXTERN int hr_inproc_send_wait(hr_inproc_chan *ch, hr_tensor *t,
                                  const hr_handoff_payload *sync,
                                  int64_t timeout_ns, hr_wire_status *st);

/* Producer: no more messages.  The consumer receives what is queued, then
 * HR_ERR_CLOSED; blocked senders return HR_ERR_CLOSED.  Idempotent; any
 * thread. */
HR_EXTERN void hr_inproc_chan_close(hr_inproc_chan *ch);

/*
 * Consumer: takes the oldest message.  Returns 0 with *out set,
 * HR_ERR_WOULDBLOCK (empty: wait for hr_inproc_chan_fd() or the engine's
 * wakeup), HR_ERR_CLOSED (closed and drained), HR_ERR_INVALID_ARGUMENT.
 * Any thread (several consumers may share a channel).
 */
HR_EXTERN int hr_inproc_recv(hr_inproc_chan *ch, hr_inproc_msg **out);
/* The blocking variant: waits up to `timeout_ns` (-1: for ever).  Returns
 * as hr_inproc_recv(), HR_ERR_TIMEOUT instead of HR_ERR_WOULDBLOCK when
 * nothing came in time.  On success *out is the caller's until
 * hr_inproc_msg_del() (both variants). */
HR_EXTERN int hr_inproc_recv_wait(hr_inproc_chan *ch, hr_inproc_msg **out,
                                  int64_t timeout_ns);

/* The message's tensor: descriptor and buffers, borrowed (valid until the
 * buffer release; take no reference).  For device buffers the pointers
 * are device addresses (or vendor buffers), as the producer gave them. */
HR_EXTERN hr_tensor *hr_inproc_msg_tensor(const hr_inproc_msg *m);
/* The ledger's handoff: hr_handoff_sync_mode(), hr_handoff_consume(),
 * hr_handoff_release_event() (P2), hr_handoff_release_after() (§ 5) work
 * on it.  Valid until hr_inproc_msg_del(). */
HR_EXTERN hr_handoff *hr_inproc_msg_handoff(const hr_inproc_msg *m);
/*
 * The buffer release: call exactly once when done with the buffers
 * (hr_handoff_release_buffer(); or use hr_handoff_release_after() on the
 * handoff instead).  Any thread.  Returns 0, HR_ERR_STATE for a second
 * release (not forwarded; counted as a double release), or
 * HR_ERR_INVALID_ARGUMENT (NULL m).
 */
HR_EXTERN int hr_inproc_msg_release(hr_inproc_msg *m);
/* Drops the consumer's message.  A release still missing is counted and
 * reported (not made).  NULL is a no-op. */
HR_EXTERN void hr_inproc_msg_del(hr_inproc_msg *m);

/* ------------------------------------------------------------------------ */
/* The in-process server/client pair                                         */
/* ------------------------------------------------------------------------ */

typedef struct hr_inproc_hub hr_inproc_hub;
typedef struct hr_inproc_server hr_inproc_server;
typedef struct hr_inproc_conn hr_inproc_conn;

/* Creates a hub: the table of server names and the handoff ledger of
 * every GET answer.  Engines whose hr_engine_config.inproc_hub is the hub
 * also listen and connect through it by "inproc:NAME" URLs
 * (hr_engine_listen(), hr_engine_connect()): one namespace for both kinds
 * of names.  Any thread may use a hub.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM, HR_ERR_IO (a mutex). */
HR_EXTERN int hr_inproc_hub_new(hr_inproc_hub **out, const hr_mem *mem);
/* Frees the hub.  Returns HR_ERR_BUSY (and frees nothing) while servers
 * or connections made through it are open, tensors it handed over are
 * held or an engine's "inproc:NAME" listener holds a name in it (the
 * connections themselves do not hold the hub; engines configured with it
 * must not listen or connect by "inproc:" after it was freed); `final` (may be NULL) receives the ledger's last counters on
 * success.  NULL: 0. */
HR_EXTERN int hr_inproc_hub_del(hr_inproc_hub *h, hr_handoff_counts *final);
/* The ledger's counters: one handoff per GET answer and per PUT
 * committed; `live` counts tensors not yet released.  Any thread. */
HR_EXTERN void hr_inproc_hub_counts(hr_inproc_hub *h, hr_handoff_counts *c);

/*
 * Serves `provider` (copied) under `name` (1-255 bytes, copied) on engine
 * `e`: every callback runs on e's loop thread.  Call on that thread.  The
 * provider's session argument is a session that carries no connection
 * (hr_session_user_data() is NULL, role SERVER); never drive it.
 * Returns 0, HR_ERR_INVALID_ARGUMENT (no on_get, bad name), HR_ERR_BUSY
 * (the name is served already, or an engine listens on "inproc:NAME" in
 * this hub), HR_ERR_NOMEM.
 */
HR_EXTERN int hr_inproc_listen(hr_inproc_hub *hub, hr_engine *e,
                               const char *name, const hr_provider *provider,
                               hr_inproc_server **out);
/*
 * Stops serving (on e's loop thread): the name is free again, GETs not
 * answered yet get on_get_cancel and their clients HR_ERR_CLOSED, later
 * requests fail with HR_ERR_CLOSED.  Tensors handed out stay valid until
 * their clients drop them; their releases then run on e's loop thread
 * while e lives, and on the releasing thread after hr_engine_del(e).
 * Frees `s`.  NULL is a no-op.
 */
HR_EXTERN void hr_inproc_server_close(hr_inproc_server *s);

/*
 * Connects engine `e` (its loop thread runs every completion) to the
 * server called `name`.  No handshake: the connection is usable at once.
 * Call on e's loop thread.  Returns 0, HR_ERR_NOT_FOUND (no such server;
 * an engine's "inproc:NAME" listener is reached by hr_engine_connect()),
 * HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM.
 */
HR_EXTERN int hr_inproc_connect(hr_inproc_hub *hub, hr_engine *e,
                                const char *name, hr_inproc_conn **out);

/*
 * GET, as hr_session_get() (opts copied; the callback called exactly once,
 * on the client engine's loop thread, never from inside this call; its
 * session argument is NULL).  The answer:
 *  - the provider's tensor by reference: the client's tensor has the same
 *    descriptor and its buffers are the server's memory (pointer
 *    identity), kept alive until the client drops its last reference;
 *    then the server's reference is dropped once, on the server's loop
 *    thread (a composite's members count as one);
 *  - layout: the first preference that the stored tensor meets as stored;
 *    with ALLOW_TRANSCODE, a ROW_MAJOR or COLUMN_MAJOR preference met
 *    before it is produced by the transcoding module (a copy, made on the
 *    server's loop thread); otherwise the tensor as stored, like a
 *    network server's fall-through to the native layout;
 *  - device: served where it is stored; a preferred_device other than the
 *    stored device_tag fails with DEVICE_UNAVAILABLE (no silent fallback;
 *    nothing is staged in-process);
 *  - sync: every buffer handle must be PRODUCER_SYNCED (the provider's
 *    tensor carries no event): others fail with INVALID_SYNC_MODE;
 *  - PARALLEL_OK and max_shards are ignored (one tensor, no shards).
 * Failures: HR_ERR_REMOTE (the provider's hr_get_fail() or the rules
 * above; rec->wire_error), HR_ERR_CLOSED (connection or server closed).
 * Returns 0; HR_ERR_UNSUPPORTED (REGION, or a `dest`: the answer is the
 * server's memory, not a copy); HR_ERR_STATE (closed);
 * HR_ERR_INVALID_ARGUMENT; HR_ERR_NOMEM.
 */
HR_EXTERN int hr_inproc_get(hr_inproc_conn *c, const hr_get_opts *opts,
                            hr_get_cb cb, void *user_data, uint32_t *stream_id);

/*
 * PUT, as hr_session_put(): the provider's on_put_begin and on_put_commit
 * run on the server's loop thread; the committed tensor shares `t`'s
 * buffers (no copy): `t` must not change while any reference to it lives
 * (the hr_tensor rule), and its last reference may be dropped on the
 * server's thread, where its release then runs.  The callback (session
 * NULL) reports 0, HR_ERR_REMOTE (the provider's wire error), or
 * HR_ERR_CLOSED.  Returns 0, HR_ERR_UNSUPPORTED (the provider has no
 * PUT), HR_ERR_STATE, HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM.
 */
HR_EXTERN int hr_inproc_put(hr_inproc_conn *c, const uint8_t *key,
                            uint16_t key_len, uint32_t flags, hr_tensor *t,
                            hr_put_cb cb, void *user_data, uint32_t *stream_id);

/*
 * LIST, as hr_session_list() (entries encoded as a LIST_RESPONSE's, read
 * them with hr_list_entry_next(); session argument NULL).  Returns 0,
 * HR_ERR_UNSUPPORTED (no on_list), HR_ERR_STATE, HR_ERR_INVALID_ARGUMENT
 * (max_entries 0 or above 1024), HR_ERR_NOMEM.
 */
HR_EXTERN int hr_inproc_list(hr_inproc_conn *c, const uint8_t *prefix,
                             uint16_t prefix_len, const uint8_t *start_after,
                             uint16_t start_after_len, uint16_t max_entries,
                             hr_list_cb cb, void *user_data);

/* Requests made and not completed yet. */
HR_EXTERN size_t hr_inproc_conn_pending(const hr_inproc_conn *c);

/*
 * Closes the connection (on its engine's loop thread): requests not
 * completed yet complete with HR_ERR_CLOSED from the engine's next loop
 * turn; the server forgets them (on_get_cancel for unanswered GETs).
 * Tensors already received stay valid.  The memory goes once the last
 * answer in flight has come back.  NULL is a no-op.
 */
HR_EXTERN void hr_inproc_conn_close(hr_inproc_conn *c);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_INPROC_H */
