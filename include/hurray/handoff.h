/*
 * libhurray: the in-process / IPC buffer handoff and the ADR-018 stream and
 * event synchronisation contract (docs/protocol.md § 10).
 *
 * The buffer handle's sync_mode (offset 13) is the single source of truth:
 *
 *   P1 SYNC_PRODUCER_SYNCED (0x00)  the producer waited on the host; the
 *      payload is the buffer pointer and its release callback only.
 *   P2 SYNC_EVENT (0x01)  the producer recorded an event on its writing
 *      stream(s); the payload adds sync_handle (the vendor event),
 *      sync_handle_device_tag (= the buffer's device_tag) and
 *      event_release (called exactly once, after the consumer's waits).
 *   P3 SYNC_CONSUMER_STREAM (0x02)  the consumer named its stream in the
 *      request; the producer made it wait for the writes before returning
 *      the handle; the payload echoes that stream (`ordered_stream`).
 *
 * hr_handoff_acquire() calls the producer, then cross-checks the payload
 * against the handle's sync_mode, the transport and the request, and
 * rejects a mismatch (HR_ERR_PROTO, INVALID_SYNC_MODE) before the consumer
 * sees anything, handing the producer's resources back through its own
 * release callbacks.  An accepted handoff is an hr_handoff that a ledger
 * tracks: the buffer release and (P2) the event release are two
 * independent exactly-once calls; a second call is not forwarded, and is
 * counted and, in debug builds, reported on stderr; a release still
 * missing when the handoff (or the ledger) is destroyed is counted and
 * reported the same way.
 *
 * Consumers use hr_handoff_consume() (the § 2 rule for every stream that
 * will touch the buffer) and hr_handoff_release_after() (the § 5 rule: the
 * buffer release waits for the consumer's device work).  Producers use
 * hr_handoff_prepare() to meet § 1 in the mode they chose.
 * hr_sync_modes_available() is the § 6 capability query.
 *
 * Thread safety: a ledger may be used from any number of threads; the
 * release calls of one hr_handoff may race each other (the exactly-once
 * guard is atomic).
 */
#ifndef HURRAY_HANDOFF_H
#define HURRAY_HANDOFF_H

#include <hurray/common.h>
#include <hurray/gpu.h>
#include <hurray/tensor.h>
#include <hurray/wire.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where a handoff travels (ADR-018 § 6).  NETWORK and IN_PROCESS equal
 * the codec's HR_TRANSPORT_NETWORK and HR_TRANSPORT_LOCAL. */
enum hr_handoff_transport {
  HR_HANDOFF_NETWORK = 0,    /* any framed socket: TCP, TLS, Unix */
  HR_HANDOFF_IN_PROCESS = 1, /* same process, shared driver context */
  HR_HANDOFF_IPC = 2         /* same machine, another process */
};

/* Bit for sync_mode `m` in a mode mask. */
#define HR_SYNC_BIT(m) (1u << (m))

/*
 * The § 6 capability query: the sync modes a producer may declare for a
 * buffer of `device_tag` on `transport`, given the device's capability
 * flags (HR_GPU_CAP_*, from hr_gpu_query(); ignored for CPU buffers).
 * Returns a mask of HR_SYNC_BIT() values: P1 is universal wherever the
 * buffer can travel at all; 0 for an unknown transport, a reserved or
 * invalid device_tag, and for a device buffer on IPC when the device
 * cannot export memory (neither HR_GPU_CAP_IPC_MEM nor HR_GPU_CAP_IPC_FD).
 * A producer that finds no mode it can serve for an IPC GPU buffer falls
 * back to a host-staged copy (hr_gpu_stager; the engine's frames).
 */
HR_EXTERN unsigned hr_sync_modes_available(uint8_t device_tag,
                                           uint32_t cap_flags, int transport);
/* The same for an opened device. */
HR_EXTERN unsigned hr_gpu_sync_modes(const hr_gpu *g, int transport);

/*
 * The cheapest mode in `mask` for a producer: P3 when the consumer named a
 * stream and P3 is allowed, else P2, else P1.  Returns the mode, or -1
 * when the mask is empty (nothing valid: stage through the host).
 */
HR_EXTERN int hr_sync_mode_choose(unsigned mask, int have_consumer_stream);

/*
 * A reader's check of one buffer handle's sync_mode (ADR-018 §§ 1-3, 6):
 * reserved (0x03-0xFE) and invalid (0xFF) values, a CPU buffer that is not
 * PRODUCER_SYNCED, any mode but PRODUCER_SYNCED on a network, and a mode
 * outside the transport's defaults.  Returns 0, HR_ERR_PROTO with `st`
 * (code INVALID_SYNC_MODE, offset 13 within the handle), or
 * HR_ERR_INVALID_ARGUMENT for a NULL handle.
 */
HR_EXTERN int hr_sync_mode_check(const hr_buffer_handle *b, int transport,
                                 hr_wire_status *st);

/* What the consumer supplies when it requests a buffer. */
typedef struct hr_handoff_request {
  int transport; /* enum hr_handoff_transport */
  /* P3: the consumer's stream (a vendor handle, hr_gpu_stream_native())
   * of the buffer's device type, or NULL when it has none. */
  void *consumer_stream;
  uint8_t consumer_stream_device_tag;
  /* Modes the consumer accepts (HR_SYNC_BIT mask); 0 means every mode the
   * transport allows by default (in-process: all three; IPC and network:
   * P1 only).  For IPC with exportable events, pass hr_gpu_sync_modes(). */
  unsigned accept_modes;
} hr_handoff_request;

/* What the producer hands over with the buffer handle (ADR-018 § 4). */
typedef struct hr_handoff_payload {
  void *ptr;             /* the buffer (device address, or vendor buffer) */
  hr_release_fn release; /* ADR-009 buffer release; may be NULL */
  void *release_ctx;
  /* P2 only (NULL otherwise). */
  void *sync_handle;              /* the vendor event */
  uint8_t sync_handle_device_tag; /* must equal the handle's device_tag */
  hr_release_fn event_release;    /* required in P2 */
  void *event_release_ctx;
  /* P3 only: the request's consumer_stream, which the producer ordered
   * after its writes (NULL otherwise). */
  void *ordered_stream;
} hr_handoff_payload;

/*
 * The producer side of hr_handoff_acquire(): fills `handle` (its sync_mode
 * declares the mode) and `payload` for `req`.  Returns 0 or a negative
 * HR_ERR_* (then nothing is handed over).
 */
typedef int (*hr_handoff_produce_fn)(void *user, const hr_handoff_request *req,
                                     hr_buffer_handle *handle,
                                     hr_handoff_payload *payload);

typedef struct hr_handoff_ledger hr_handoff_ledger;
typedef struct hr_handoff hr_handoff;

/* A ledger's counters (every build). */
typedef struct hr_handoff_counts {
  uint64_t accepted;         /* handoffs that passed the cross-check */
  uint64_t rejected;         /* handoffs refused by the cross-check */
  uint64_t buffer_releases;  /* first buffer releases (forwarded) */
  uint64_t event_releases;   /* first event releases (forwarded) */
  uint64_t double_releases;  /* second calls, not forwarded */
  uint64_t missing_releases; /* releases never made before destruction */
  uint64_t live;             /* handoffs not yet destroyed */
} hr_handoff_counts;

/* Creates a ledger.  Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM. */
HR_EXTERN int hr_handoff_ledger_new(hr_handoff_ledger **out,
                                    const hr_mem *mem);
/*
 * Destroys a ledger.  Handoffs still alive are destroyed too, their
 * missing releases counted and reported (not made: the consumer may still
 * be using the buffer, so leaking is the safe side).  `final` (may be
 * NULL) receives the last counters.  Returns 0, or HR_ERR_BUSY when
 * handoffs were still alive (the ledger is destroyed all the same).
 */
HR_EXTERN int hr_handoff_ledger_del(hr_handoff_ledger *l,
                                    hr_handoff_counts *final);
/* Reads the counters.  Thread-safe. */
HR_EXTERN void hr_handoff_ledger_counts(hr_handoff_ledger *l,
                                        hr_handoff_counts *c);

/*
 * Cross-checks a producer's handle and payload against `req` (the C ABI
 * check of ADR-018 § 4) without recording anything.  Returns 0 or
 * HR_ERR_PROTO with `st`: INVALID_SYNC_MODE for a reserved/invalid mode, a
 * mode the transport or request does not allow, a CPU buffer not
 * PRODUCER_SYNCED, a payload that does not match the mode (P1 with an
 * event or stream; P2 without sync_handle or event_release, or with a
 * sync_handle_device_tag that differs from device_tag; P3 without a
 * consumer stream in the request, or whose ordered_stream is not it);
 * HR_ERR_INVALID_ARGUMENT for a NULL req, handle or payload.
 */
HR_EXTERN int hr_handoff_check(const hr_handoff_request *req,
                               const hr_buffer_handle *handle,
                               const hr_handoff_payload *payload,
                               hr_wire_status *st);

/*
 * The C ABI handoff: runs `produce`, cross-checks its result, and on
 * success records it in `l` and returns the consumer's hr_handoff.  On a
 * mismatch the consumer gets nothing: the producer's event_release and
 * release callbacks are called (in that order) to hand its resources back,
 * the ledger counts a rejection, and HR_ERR_PROTO is returned with `st`.
 * Returns 0, HR_ERR_PROTO, the producer's own error, HR_ERR_NOMEM (then
 * the producer's resources are handed back too), HR_ERR_INVALID_ARGUMENT.
 */
HR_EXTERN int hr_handoff_acquire(hr_handoff_ledger *l,
                                 const hr_handoff_request *req,
                                 hr_handoff_produce_fn produce, void *user,
                                 hr_handoff **out, hr_wire_status *st);

/* hr_handoff_acquire() for a handle and payload already in hand: the
 * same checks, hand-back and ledger entry.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (a NULL argument but `st`; nothing is handed
 * back then), HR_ERR_PROTO, HR_ERR_NOMEM.  On success *out is the
 * consumer's until hr_handoff_del(). */
HR_EXTERN int hr_handoff_accept(hr_handoff_ledger *l,
                                const hr_handoff_request *req,
                                const hr_buffer_handle *handle,
                                const hr_handoff_payload *payload,
                                hr_handoff **out, hr_wire_status *st);

/* Accessors (valid while the handoff lives). */
HR_EXTERN const hr_buffer_handle *hr_handoff_handle(const hr_handoff *h);
HR_EXTERN uint8_t hr_handoff_sync_mode(const hr_handoff *h);
HR_EXTERN void *hr_handoff_ptr(const hr_handoff *h);
HR_EXTERN void *hr_handoff_sync_handle(const hr_handoff *h);
/* P3: the stream the producer ordered (the request's consumer_stream). */
HR_EXTERN void *hr_handoff_consumer_stream(const hr_handoff *h);

/*
 * The event release (P2): call exactly once, after the stream waits.
 * Returns 0 (forwarded to the producer), HR_ERR_STATE (a second call: not
 * forwarded, counted as a double release) or HR_ERR_INVALID_ARGUMENT (not
 * a P2 handoff).
 */
HR_EXTERN int hr_handoff_release_event(hr_handoff *h);
/*
 * The buffer release (ADR-009): call exactly once, after every device
 * operation of the consumer on the buffer has completed.  Returns 0,
 * HR_ERR_STATE (a second call: not forwarded, counted) or
 * HR_ERR_INVALID_ARGUMENT (NULL h).  In P2 it also counts a missing event
 * release if the event was never released (and releases it then, since
 * the buffer's end of use implies the waits).
 */
HR_EXTERN int hr_handoff_release_buffer(hr_handoff *h);

/* Drops the consumer's reference.  When no deferred release is pending,
 * the handoff is destroyed; a release still missing then is counted and
 * reported.  NULL is a no-op. */
HR_EXTERN void hr_handoff_del(hr_handoff *h);

/*
 * The consumer rule of ADR-018 § 2, for the `n` streams of device `g` that
 * will touch the buffer (n may be 0 for a host-only consumer):
 *  P1: nothing to do.
 *  P2: every stream waits on the event; then the event is released (once).
 *      With n == 0 the host waits for the event instead.
 *  P3: streams other than the ordered one wait for it (an inter-stream
 *      wait through a temporary event); with n == 0 the host waits for the
 *      ordered stream.
 * Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_UNSUPPORTED (the handle
 * belongs to another device type than `g`), HR_ERR_STATE (called twice),
 * HR_ERR_NOMEM, HR_ERR_IO.
 */
HR_EXTERN int hr_handoff_consume(hr_handoff *h, hr_gpu *g,
                                 hr_gpu_stream *const *streams, size_t n);

/*
 * The symmetric rule of ADR-018 § 5: releases the buffer once all work
 * enqueued so far on the `n` (>= 1) streams has completed, without
 * blocking the host (the release runs from a host function on streams[0],
 * after the others were made to wait for; it therefore runs on a device
 * thread, and the producer's release callback must then not call into that
 * device, as CUDA forbids driver calls from host functions).  The handoff
 * stays alive until then even if hr_handoff_del() is called first.  Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_STATE
 * (already released or pending), HR_ERR_NOMEM, HR_ERR_IO.
 */
HR_EXTERN int hr_handoff_release_after(hr_handoff *h,
                                       hr_gpu_stream *const *streams,
                                       size_t n);

/*
 * The producer rule of ADR-018 § 1 in mode `mode`, for a buffer written by
 * work enqueued on `producer`: sets handle->sync_mode and the payload's
 * sync part (ptr and release are the caller's):
 *  P1: host-waits for `producer`.
 *  P2: records a new event on `producer`; sync_handle is its vendor handle
 *      and event_release destroys it.
 *  P3: makes req->consumer_stream wait for `producer` on the device;
 *      ordered_stream = req->consumer_stream.
 * Returns 0, HR_ERR_INVALID_ARGUMENT (P3 without a consumer stream, a
 * reserved mode), HR_ERR_UNSUPPORTED, HR_ERR_NOMEM, HR_ERR_IO.
 */
HR_EXTERN int hr_handoff_prepare(hr_gpu_stream *producer, uint8_t mode,
                                 const hr_handoff_request *req,
                                 hr_buffer_handle *handle,
                                 hr_handoff_payload *payload);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_HANDOFF_H */
