/*
 * Device memory over the SHM data plane (wire-v1 § 14 and § 16; ADR-018
 * § 6 "IPC").
 *
 * On a Unix socket a device tensor need not be staged through the host:
 * when the client asked for the device the tensor lives on, and the
 * tensor's memory was allocated shareable (hr_gpu_buf_alloc_shareable),
 * the server hands over the memory's own file descriptor with the
 * TENSOR_DESCRIPTOR, exactly where a host segment's would go.  The
 * descriptor carries the device's device_tag and memory_class PINNED
 * ("device memory exported for IPC"), byte_offset 0, and sync_mode 0: a
 * framed socket is a network transport (§ 18), so the only mode is
 * SYNC_PRODUCER_SYNCED (P1).  The server keeps that promise without
 * blocking its loop: before the descriptor goes, the session's stream of
 * the device waits for the producer's event and then runs a host
 * function (the staging path's zero-byte work item, hr_send.c), whose
 * completion lets the descriptor out.  The lease (hr_shm.c) keeps the
 * tensor, and so the memory, until BUFFER_RELEASE.
 *
 * The client imports the descriptor into the device of its GET
 * (hr_get_opts.device) with hr_gpu_ipc_mem_import_fd() and delivers a
 * device tensor over the imported memory; dropping it unmaps the import
 * and marks the stream's lease released, and the next pull sends
 * BUFFER_RELEASE.  A client that cannot import (no device of that tag in
 * the GET, a device without fd IPC, a descriptor the driver refuses)
 * answers ERROR DEVICE_UNAVAILABLE; the server turns the SHM plane off for
 * the connection and later requests get frames, staged through the host.
 *
 * Restrictions (each falls back to frames): one buffer per tensor (a
 * multi-buffer layout would need all its buffers in one allocation,
 * placed as § 7.1 says), served whole and as stored (no region, shard or
 * transcode), and at least one byte.
 */
#include <string.h>

#include "hr_session_int.h"

/* ---- both --------------------------------------------------------------- */

const uint8_t hr__shm_dev_classes[2] = {HR_MEM_STANDARD, HR_MEM_PINNED};

int hr__shm_dev_advertise(const hr_session *s) {
  if (!(s->our_caps & HR_CAP_SHM_DATA_PLANE) || !s->set.devices)
    return 0;
  if (s->role == HR_ROLE_CLIENT && !s->cbs.shm_wake)
    return 0;
  for (uint16_t i = 0; i < s->set.device_count; i++)
    if (s->set.devices[i] != HR_DEV_CPU)
      return 1;
  return 0;
}

static int peer_takes_pinned(const hr_session *s) {
  for (uint16_t i = 0; i < s->peer.memory_class_count; i++)
    if (s->peer.memory_classes[i] == HR_MEM_PINNED)
      return 1;
  return 0;
}

/* ---- server ------------------------------------------------------------ */

/* The exported descriptor of a device tensor the SHM plane could carry,
 * or -1. */
static int dev_fd(const hr_tensor *t) {
  if (!hr_tensor_on_device(t))
    return -1;
  const hr_descriptor *d = hr_tensor_descriptor(t);
  if (d->layout.tag == HR_LAYOUT_COMPOSITE || d->buffer_count != 1 ||
      d->buffers[0].size_bytes == 0)
    return -1;
  int fd;
  if (hr_gpu_ipc_mem_export_fd(hr_tensor_gpu_buf(t, 0), &fd) != 0)
    return -1;
  return fd;
}

int hr__shm_dev_serves(const hr_tensor *t) {
  return dev_fd(t) >= 0;
}

int hr__shm_dev_plan(const hr_session *s, hr_part *p, const char **miss) {
  if (!hr_tensor_on_device(p->t))
    return 0;
  const hr_descriptor *d = hr_tensor_descriptor(p->t);
  int fd = dev_fd(p->t);
  if (fd < 0) {
    *miss = "shm: the device tensor is not in shareable device memory";
    return 0;
  }
  if (!peer_takes_pinned(s)) {
    *miss = "shm: the client does not take exported device memory (PINNED)";
    return 0;
  }
  if (p->desc.buffers[0].device_tag == HR_DEV_CPU) {
    /* The client asked for the host (or for a device we do not place
     * on): staged frames. */
    *miss = "shm: device memory goes over SHM only to a client asking for "
            "that device";
    return 0;
  }
  if (p->xmode != HR_XM_STAGE || p->transcoded || p->doff[0] != 0 ||
      p->len[0] != d->buffers[0].size_bytes ||
      p->desc.buffer_count != 1 || p->desc.rank != d->rank ||
      (p->desc.flags & HR_DESC_HAS_SHARD)) {
    *miss = "shm: a region, shard or transcoded answer goes as frames";
    return 0;
  }
  for (unsigned k = 0; k < d->rank; k++)
    if (p->desc.shape[k] != d->shape[k]) {
      *miss = "shm: a region, shard or transcoded answer goes as frames";
      return 0;
    }
  p->shm = 1;
  p->shm_fd = fd;
  p->desc.byte_offset = 0;
  p->desc.buffers[0].memory_class = HR_MEM_PINNED;
  p->xp.data_plane = HR_PLANE_SHM;
  /* P1 over IPC: without a producer event the bytes are ready now;
   * otherwise the descriptor waits for the event (hr_send.c). */
  p->dipc = p->dready ? HR_DIPC_WAIT : HR_DIPC_SYNCED;
  return 1;
}

/* ---- client ------------------------------------------------------------ */

/* What a delivered device tensor owns. */
typedef struct dev_import {
  hr_mem mem;
  hr_gpu_buf *buf;
  hr_gpu_event *ev; /* P2 asked: an event that is already complete */
  struct hr_clease *lease;
  hr_shm_mapping wake;
} dev_import;

static void import_release(void *ctx) {
  dev_import *o = ctx;
  hr_gpu_event_del(o->ev);
  hr_gpu_buf_del(o->buf);
  /* Released first, then the host is woken: it must find the flag. */
  hr__shm_clease_let_go(o->lease);
  if (o->wake.unmap)
    o->wake.unmap(o->wake.ctx);
  hr_mem mem = o->mem;
  hr__mem_free(&mem, o);
}

static int refuse(hr_stream *st, hr_wire_status *ws, const char *why) {
  /* The text outlives this call: the stream's record keeps it. */
  hr__set_msg(st->shm_why, sizeof st->shm_why, why, strlen(why));
  hr__set_msg(st->rec.fallback, sizeof st->rec.fallback, why, strlen(why));
  return hr__wire_fail(ws, HR_WIRE_DEVICE_UNAVAILABLE, 0, st->shm_why);
}

int hr__shm_dev_import(hr_session *s, hr_stream *st, const hr_descriptor *d,
                       int fd, hr_tensor **out, hr_wire_status *ws) {
  *out = NULL;
  hr_gpu *g = st->kind == HR_SK_CLI_GET ? st->cg.opts.device : NULL;
  uint8_t tag = d->buffers[0].device_tag;
  hr_gpu_caps caps;
  if (!g || hr_gpu_query(g, &caps) != 0 || caps.device_tag != tag)
    return refuse(st, ws,
                  "shm: device memory for a GET that did not ask for that "
                  "device");
  if (!(caps.flags & HR_GPU_CAP_IPC_FD))
    return refuse(st, ws, "shm: the device cannot import exported memory");
  if (d->buffer_count != 1 || d->byte_offset != 0 ||
      d->buffers[0].size_bytes == 0)
    return refuse(st, ws,
                  "shm: device memory is imported as one buffer at offset 0");
  if (!s->cbs.shm_wake)
    return refuse(st, ws, "shm: the host cannot be woken for the release");
  dev_import *o = hr__mem_calloc(&s->mem, 1, sizeof *o);
  if (!o)
    return HR_ERR_NOMEM;
  o->mem = s->mem;
  int rc = hr_gpu_ipc_mem_import_fd(g, fd, d->buffers[0].size_bytes, &o->buf);
  if (rc == HR_ERR_NOMEM) {
    hr__mem_free(&s->mem, o);
    return rc;
  }
  if (rc) {
    hr__mem_free(&s->mem, o);
    return refuse(st, ws,
                  rc == HR_ERR_PROTO
                      ? "shm: the device refused the exported memory"
                      : "shm: importing the device memory failed");
  }
  uint8_t sync = st->cg.opts.device_sync;
  if (sync == HR_SYNC_EVENT &&
      (rc = hr_gpu_event_new(g, 0, &o->ev)) != 0) {
    /* Never recorded: complete, as the producer-synced bytes are. */
    hr_gpu_buf_del(o->buf);
    hr__mem_free(&s->mem, o);
    return rc == HR_ERR_NOMEM ? rc : refuse(st, ws, "shm: no device event");
  }
  hr__cb_enter(s);
  rc = s->cbs.shm_wake(s, &o->wake, s->ud);
  hr__cb_leave(s);
  if (rc || !(o->lease = hr__shm_clease_hold(s, st->id))) {
    if (rc == 0 && o->wake.unmap)
      o->wake.unmap(o->wake.ctx);
    hr_gpu_event_del(o->ev);
    hr_gpu_buf_del(o->buf);
    hr__mem_free(&s->mem, o);
    return HR_ERR_NOMEM;
  }
  hr_descriptor nd = *d;
  nd.buffers[0].sync_mode = sync;
  rc = hr_tensor_wrap_device(out, &nd, &o->buf, o->ev, import_release, o,
                             &s->mem);
  if (rc) {
    import_release(o);
    return rc == HR_ERR_NOMEM ? rc : HR_ERR_INTERNAL;
  }
  st->rec.device = tag;
  return 0;
}
