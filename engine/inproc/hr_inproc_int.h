/*
 * What the in-process channel (hr_inproc_chan.c) and the in-process
 * server/client pair (hr_inproc.c) share: the one way a tensor is handed
 * over by value inside a process.
 *
 *   1. hr__inproc_describe(): the tensor's buffers as one buffer handle
 *      and one ADR-018 payload (every buffer of every leaf must agree on
 *      sync_mode and device_tag, since one payload serves them all);
 *   2. hr_handoff_accept() on a ledger (<hurray/handoff.h>) with the
 *      producer's release in the payload: the ledger forwards the
 *      consumer's hr_handoff_release_buffer() exactly once, counts a
 *      double or missing one, and calls the release itself on a refusal;
 *   3. the consumer ends its use with hr_handoff_release_buffer() and
 *      hr_handoff_del().
 *
 * The channel queues the handoff for a consumer thread; the pair posts it
 * to the client engine's mailbox inside an answer and wraps the buffers
 * as the GET's tensor.  Delivery differs, the handoff is the same.
 */
#ifndef HR_INPROC_INT_H
#define HR_INPROC_INT_H

#include <hurray/handoff.h>
#include <hurray/tensor.h>

/* Fills *b with the handle of `t`'s first buffer (a composite: of its
 * first leaf that has one; none at all: a CPU, PRODUCER_SYNCED handle of
 * size 0) and *p with `sync` (NULL: zeros) and the first buffer's address;
 * the caller sets p->release and p->release_ctx.  Nothing is taken over.
 * Returns 0, or HR_ERR_PROTO with `st` (may be NULL) filled
 * (INVALID_SYNC_MODE) when the buffers disagree on sync_mode or
 * device_tag. */
int hr__inproc_describe(hr_tensor *t, const hr_handoff_payload *sync,
                        hr_buffer_handle *b, hr_handoff_payload *p,
                        hr_wire_status *st);

#endif /* HR_INPROC_INT_H */
