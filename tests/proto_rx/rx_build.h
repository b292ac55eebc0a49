/*
 * Test helpers: hand-built hr_msg values for the transfer checker, and a
 * driver that feeds a sequence and reports where and how it failed.
 */
#ifndef TEST_RX_BUILD_H
#define TEST_RX_BUILD_H

#include <stdarg.h>
#include <string.h>

#include <hurray/wire.h>

/* A dense tensor descriptor: `nbuf` buffers of the given sizes; the
 * total is their sum. */
static inline hr_msg t_desc(uint32_t sid, uint8_t elem, uint8_t rank,
                            const uint64_t *shape, unsigned nbuf,
                            const uint64_t *sizes) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DESCRIPTOR;
  m.hdr.stream_id = sid;
  hr_descriptor *d = &m.u.tensor.desc;
  d->descriptor_version = 1;
  d->element_type = elem;
  d->rank = rank;
  d->layout.tag = nbuf == 1 ? HR_LAYOUT_ROW_MAJOR : HR_LAYOUT_SPARSE_CSR;
  for (unsigned k = 0; k < rank; k++)
    d->shape[k] = shape[k];
  d->buffer_count = (uint8_t)nbuf;
  uint64_t total = 0;
  for (unsigned i = 0; i < nbuf; i++) {
    d->buffers[i].size_bytes = sizes[i];
    total += sizes[i];
  }
  m.u.tensor.xport.total_data_bytes = total;
  m.u.tensor.xport.shard_index = 0;
  m.u.tensor.xport.total_shards = 1;
  return m;
}

/* A one-buffer tensor of `bytes` bytes, rank 1 of UINT8. */
static inline hr_msg t_plain(uint32_t sid, uint64_t bytes) {
  uint64_t shape[1] = {bytes};
  return t_desc(sid, HR_ELEM_UINT8, 1, shape, 1, &bytes);
}

/* Same with an explicit element type and shape (size = elements * 4). */
static inline hr_msg t_typed(uint32_t sid, uint8_t elem, uint8_t rank,
                             const uint64_t *shape) {
  uint64_t n = 1;
  for (unsigned k = 0; k < rank; k++)
    n *= shape[k];
  uint64_t size = n * 4;
  return t_desc(sid, elem, rank, shape, 1, &size);
}

/* Makes a descriptor a shard (HAS_SHARD) of `parent` at `offset`. */
static inline void t_shard(hr_msg *m, uint16_t index, uint16_t total,
                           const uint64_t *parent, const uint64_t *offset) {
  hr_descriptor *d = &m->u.tensor.desc;
  d->flags |= HR_DESC_HAS_SHARD;
  for (unsigned k = 0; k < d->rank; k++) {
    d->parent_shape[k] = parent[k];
    d->shard_offset[k] = offset[k];
  }
  m->u.tensor.xport.shard_index = index;
  m->u.tensor.xport.total_shards = total;
}

/* A composite head. */
static inline hr_msg t_head(uint32_t sid, uint8_t elem, uint8_t rank,
                            const uint64_t *shape, uint32_t members,
                            uint8_t rule, uint8_t axis, uint32_t group,
                            uint8_t zp) {
  hr_msg m = t_desc(sid, elem, rank, shape, 0, NULL);
  hr_descriptor *d = &m.u.tensor.desc;
  d->layout.tag = HR_LAYOUT_COMPOSITE;
  d->params.member_count = members;
  d->params.rule = rule;
  d->params.axis = axis;
  d->params.group_size = group;
  d->params.has_zero_point = zp;
  return m;
}

static inline hr_msg t_tuple(uint32_t sid, uint32_t members) {
  return t_head(sid, HR_ELEM_NONE, 0, NULL, members, HR_COMPOSITE_TUPLE, 0, 0,
                0);
}

/* Turns a TENSOR_DESCRIPTOR into a TENSOR_PUT of the same descriptor. */
static inline hr_msg t_put(hr_msg d) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr = d.hdr;
  m.hdr.type = HR_MSG_TENSOR_PUT;
  m.u.put.key = (const uint8_t *)"k";
  m.u.put.key_len = 1;
  m.u.put.desc = d.u.tensor.desc;
  m.u.put.xport = d.u.tensor.xport;
  return m;
}

static inline hr_msg t_data(uint32_t sid, uint8_t bidx, uint64_t off,
                            uint32_t len) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DATA;
  m.hdr.stream_id = sid;
  m.hdr.payload_length = 12 + len;
  m.u.data.buffer_index = bidx;
  m.u.data.offset = off;
  m.u.data.data_len = len;
  return m;
}

static inline hr_msg t_simple(uint32_t type, uint32_t sid) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = type;
  m.hdr.stream_id = sid;
  return m;
}

static inline hr_msg t_end(uint32_t sid) {
  return t_simple(HR_MSG_TENSOR_DATA_END, sid);
}

static inline hr_msg t_error(uint32_t sid, uint32_t code) {
  hr_msg m = t_simple(HR_MSG_ERROR, sid);
  m.u.error.code = code;
  return m;
}

static inline hr_msg t_rdma(uint32_t sid, uint8_t role, uint64_t length) {
  hr_msg m = t_simple(HR_MSG_RDMA_REGISTER, sid);
  m.u.rdma.role = role;
  m.u.rdma.length = length;
  return m;
}

/* A GET of one stream with plain flags. */
static inline hr_rx_config t_cfg(uint32_t base, uint32_t flags,
                                 uint16_t max_shards) {
  hr_rx_config c;
  memset(&c, 0, sizeof c);
  c.direction = HR_RX_S2C;
  c.base_stream = base;
  c.request_flags = flags;
  c.max_shards = max_shards;
  c.strict = 1;
  return c;
}

/* The outcome of a sequence. */
typedef struct t_result {
  int rv;           /* the failing call's return value, or finish's */
  int at;           /* the failing message's index; n for finish; -1 ok */
  uint32_t code;    /* the status code on HR_ERR_PROTO / HR_ERR_REMOTE */
  const char *why;  /* its reason */
  hr_rx_event last; /* the last event (of the last message fed) */
  int kinds_or;     /* all event kinds or'ed */
  int done_events;  /* messages that carried DONE */
} t_result;

/* Feeds `n` messages, then finish (unless a message failed). */
static inline t_result t_run(const hr_rx_config *cfg, const hr_msg *msgs,
                             int n) {
  t_result r;
  memset(&r, 0, sizeof r);
  r.at = -1;
  hr_rx *rx = NULL;
  r.rv = hr_rx_new(&rx, cfg, NULL);
  if (r.rv != 0) {
    r.at = -2;
    return r;
  }
  for (int i = 0; i < n; i++) {
    hr_wire_status st = {0, 0, NULL};
    hr_rx_event ev;
    int rv = hr_rx_on_message(rx, &msgs[i], &ev, &st);
    if (rv != 0) {
      r.rv = rv;
      r.at = i;
      r.code = st.code;
      r.why = st.reason;
      hr_rx_del(rx);
      return r;
    }
    r.last = ev;
    r.kinds_or |= ev.kind;
    r.done_events += (ev.kind & HR_RXE_DONE) != 0;
  }
  hr_wire_status st = {0, 0, NULL};
  r.rv = hr_rx_finish(rx, &st);
  if (r.rv != 0) {
    r.at = n;
    r.code = st.code;
    r.why = st.reason;
  }
  hr_rx_del(rx);
  return r;
}

#endif /* TEST_RX_BUILD_H */
