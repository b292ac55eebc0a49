/*
 * The incremental frame reader (see <hurray/wire.h>).
 *
 * An nghttp2-style decoder: one `for (;;) switch (state)` loop over the
 * caller's input that stops at the first event or when the input runs out.
 * The 12-byte header and the 12-byte TENSOR_DATA sub-header are gathered in
 * inline buffers, so a message split anywhere costs no allocation; control
 * payloads go through a buffer that grows only with the bytes that actually
 * arrived; TENSOR_DATA bytes are never copied.  When a whole header, sub-
 * header or control payload is already contiguous in the input, the reader
 * reads it in place (the fast path: no copy at all for a message that
 * arrives in one piece).
 */
#include <string.h>

#include "hr_internal.h"
#include "hr_rx_internal.h"

/* The decoder's states. */
enum hr_rd_state {
  HR_RDS_HEADER,    /* gathering the 12-byte header */
  HR_RDS_CONTROL,   /* buffering a control payload */
  HR_RDS_SUBHEADER, /* gathering a TENSOR_DATA sub-header */
  HR_RDS_DATA,      /* handing on the data of a TENSOR_DATA frame */
  HR_RDS_SKIP,      /* discarding the payload of a rejected message */
  HR_RDS_FATAL,     /* a fatal rejection: the connection must close */
  HR_RDS_COUNT
};

static const char *const rd_state_names[] = {
    "HEADER", "CONTROL", "SUBHEADER", "DATA", "SKIP", "FATAL",
};
_Static_assert(sizeof rd_state_names / sizeof *rd_state_names == HR_RDS_COUNT,
               "one name per reader state");

/* A control buffer above this size is released once its message was
 * delivered, so that one large message does not pin memory for the
 * connection's lifetime. */
#define RD_KEEP_BUFFER 65536u
/* The first allocation of the control buffer. */
#define RD_MIN_BUFFER 256u

struct hr_reader {
  /* The allocator (a copy). */
  hr_mem mem;
  /* The payload limit checked against the next header. */
  uint32_t max_payload;
  /* The decoding context (agreed private types). */
  hr_wire_ctx ctx;
  /* enum hr_rd_state. */
  int state;
  /* The header being gathered (HR_RDS_HEADER) and its byte count. */
  uint8_t hbuf[HR_HEADER_SIZE];
  size_t hhave;
  /* The current message's header (every state but HR_RDS_HEADER). */
  hr_msg_header hdr;
  /* The sub-header being gathered (HR_RDS_SUBHEADER) and its byte count. */
  uint8_t sbuf[HR_DATA_SUBHEADER_SIZE];
  size_t shave;
  /* The control buffer: capacity and bytes of the current payload. */
  uint8_t *buf;
  size_t cap;
  size_t have;
  /* 1 when `buf` is to be released at the next call (its message, now
   * delivered, may still be read until then). */
  int release_buf;
  /* HR_RDS_DATA / HR_RDS_SKIP: payload bytes still to come. */
  uint64_t left;
  /* HR_RDS_DATA: the frame's sub-header fields and the data bytes of it
   * delivered so far. */
  uint8_t bidx;
  uint64_t frame_off;
  uint32_t frame_len;
  uint64_t frame_done;
  /* HR_RDS_FATAL: the error to repeat and the header it came with. */
  hr_wire_status fatal_st;
  hr_msg_header fatal_hdr;
};

/* Returns the name of a state (for traces and test failures). */
static const char *rd_state_name(int s) {
  return s >= 0 && s < HR_RDS_COUNT ? rd_state_names[s] : "?";
}

const char *hr__reader_state_name(const hr_reader *r) {
  return r ? rd_state_name(r->state) : "?";
}

int hr_reader_new(hr_reader **out, const hr_reader_settings *s,
                  const hr_mem *mem) {
  if (!out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!mem)
    mem = hr_mem_default();
  hr_reader *r = hr__mem_calloc(mem, 1, sizeof *r);
  if (!r)
    return HR_ERR_NOMEM;
  r->mem = *mem;
  r->max_payload = HR_PREHELLO_MAX_PAYLOAD;
  if (s) {
    if (s->max_payload)
      r->max_payload = s->max_payload;
    r->ctx = s->ctx;
  }
  r->state = HR_RDS_HEADER;
  *out = r;
  return 0;
}

void hr_reader_del(hr_reader *r) {
  if (!r)
    return;
  hr__mem_free(&r->mem, r->buf);
  hr__mem_free(&r->mem, r);
}

void hr_reader_set_max_payload(hr_reader *r, uint32_t max_payload) {
  if (r)
    r->max_payload = max_payload ? max_payload : HR_PREHELLO_MAX_PAYLOAD;
}

int hr_reader_at_boundary(const hr_reader *r) {
  return r && r->state == HR_RDS_HEADER && r->hhave == 0;
}

uint64_t hr_reader_data_pending(const hr_reader *r, uint8_t *buffer_index,
                                uint64_t *offset) {
  if (!r || r->state != HR_RDS_DATA)
    return 0;
  if (buffer_index)
    *buffer_index = r->bidx;
  if (offset)
    *offset = r->frame_off + r->frame_done;
  return r->left;
}

int hr_reader_skip_data(hr_reader *r, uint64_t n) {
  if (!r)
    return HR_ERR_INVALID_ARGUMENT;
  if (n == 0)
    return 0;
  if (n > hr_reader_data_pending(r, NULL, NULL))
    return HR_ERR_INVALID_ARGUMENT;
  r->left -= n;
  r->frame_done += n;
  if (r->left == 0)
    r->state = HR_RDS_HEADER;
  return 0;
}

/* Makes room for `need` payload bytes in the control buffer.  The buffer
 * grows geometrically but never beyond the payload length, and never to
 * more than twice the bytes that arrived: a peer announcing a huge payload
 * has to send it to make us allocate it. */
static int rd_reserve(hr_reader *r, size_t need) {
  if (need <= r->cap)
    return 0;
  size_t ncap = r->cap ? r->cap * 2 : RD_MIN_BUFFER;
  if (ncap > r->hdr.payload_length)
    ncap = r->hdr.payload_length;
  if (ncap < need)
    ncap = need;
  uint8_t *nb = hr__mem_realloc(&r->mem, r->buf, ncap);
  if (!nb)
    return HR_ERR_NOMEM;
  r->buf = nb;
  r->cap = ncap;
  return 0;
}

/* Fills an HR_RD_ERROR event. */
static void rd_error_event(const hr_reader *r, hr_reader_event *ev,
                           const hr_wire_status *st, int fatal) {
  ev->kind = HR_RD_ERROR;
  ev->hdr = r->hdr;
  ev->status = *st;
  ev->fatal = fatal;
}

/* Rejects the current message: fatal ones kill the reader, others are
 * skipped (`skip` payload bytes still to come). */
static void rd_reject(hr_reader *r, hr_reader_event *ev,
                      const hr_wire_status *st, int fatal, uint64_t skip) {
  if (fatal) {
    r->state = HR_RDS_FATAL;
    r->fatal_st = *st;
    r->fatal_hdr = r->hdr;
  } else {
    r->left = skip;
    r->state = skip ? HR_RDS_SKIP : HR_RDS_HEADER;
  }
  rd_error_event(r, ev, st, fatal);
}

/*
 * A header is complete: runs the header checks and picks the next state.
 * Returns 1 when an error event was produced (the caller returns), else 0.
 */
static int rd_on_header(hr_reader *r, hr_reader_event *ev) {
  const hr_msg_header *h = &r->hdr;
  hr_wire_status st = {HR_WIRE_INTERNAL, 0, "header rejected"};
  if (hr_wire_check_header(h, r->max_payload, &r->ctx, &st) != 0) {
    /* The size limit comes first: the payload of a too-large message is
     * never read, so the stream is lost and the connection closes. */
    int fatal = st.code == HR_WIRE_MESSAGE_TOO_LARGE || h->stream_id == 0;
    rd_reject(r, ev, &st, fatal, h->payload_length);
    return 1;
  }
  if (h->type == HR_MSG_TENSOR_DATA) {
    if (h->payload_length < HR_DATA_SUBHEADER_SIZE + 1u) {
      /* Reading a sub-header would run into the next message. */
      hr_wire_status bad = {HR_WIRE_MALFORMED_PAYLOAD, 8,
                            "TENSOR_DATA: payload shorter than 13 bytes"};
      rd_reject(r, ev, &bad, h->stream_id == 0, h->payload_length);
      return 1;
    }
    r->shave = 0;
    r->left = h->payload_length;
    r->state = HR_RDS_SUBHEADER;
    return 0;
  }
  r->have = 0;
  r->state = HR_RDS_CONTROL;
  return 0;
}

/* A sub-header is complete (at `sub`): decodes it and starts the frame.
 * Returns 1 when an error event was produced, else 0. */
static int rd_on_subheader(hr_reader *r, const uint8_t *sub,
                           hr_reader_event *ev) {
  hr_data d;
  memset(&d, 0, sizeof d);
  hr_wire_status st = {HR_WIRE_MALFORMED_PAYLOAD, HR_HEADER_SIZE,
                       "TENSOR_DATA: bad sub-header"};
  if (hr_wire_decode_data_subheader(sub, r->hdr.payload_length, &d, &st) != 0) {
    rd_reject(r, ev, &st, r->hdr.stream_id == 0,
              r->hdr.payload_length - HR_DATA_SUBHEADER_SIZE);
    return 1;
  }
  r->bidx = d.buffer_index;
  r->frame_off = d.offset;
  r->frame_len = r->hdr.payload_length - HR_DATA_SUBHEADER_SIZE;
  r->frame_done = 0;
  r->left = r->frame_len;
  r->state = HR_RDS_DATA;
  return 0;
}

/* Emits one HR_RD_DATA piece of up to `avail` bytes at `p`; returns the
 * bytes taken. */
static size_t rd_data_piece(hr_reader *r, const uint8_t *p, size_t avail,
                            int first, hr_reader_event *ev) {
  size_t take = avail < r->left ? avail : (size_t)r->left;
  ev->kind = HR_RD_DATA;
  ev->hdr = r->hdr;
  ev->buffer_index = r->bidx;
  ev->offset = r->frame_off + r->frame_done;
  ev->data = take ? p : NULL;
  ev->len = take;
  ev->frame_offset = r->frame_off;
  ev->frame_len = r->frame_len;
  ev->first = first;
  r->left -= take;
  r->frame_done += take;
  ev->last = r->left == 0;
  if (ev->last)
    r->state = HR_RDS_HEADER;
  return take;
}

int64_t hr_reader_feed(hr_reader *r, const uint8_t *in, size_t len,
                       hr_reader_event *ev) {
  if (!r || !ev || (!in && len))
    return HR_ERR_INVALID_ARGUMENT;
  memset(ev, 0, sizeof *ev);
  if (r->state == HR_RDS_FATAL) {
    ev->kind = HR_RD_ERROR;
    ev->hdr = r->fatal_hdr;
    ev->status = r->fatal_st;
    ev->fatal = 1;
    return 0;
  }
  if (r->release_buf) {
    hr__mem_free(&r->mem, r->buf);
    r->buf = NULL;
    r->cap = 0;
    r->release_buf = 0;
  }
  /* No arithmetic on a NULL input (len is then 0). */
  static const uint8_t none[1] = {0};
  const uint8_t *p = in ? in : none;
  const uint8_t *end = p + len;
  in = p;
  for (;;) {
    size_t avail = (size_t)(end - p);
    switch (r->state) {
    case HR_RDS_HEADER: {
      if (r->hhave == 0 && avail >= HR_HEADER_SIZE) {
        hr_wire_parse_header(p, &r->hdr);
        p += HR_HEADER_SIZE;
      } else {
        size_t take = HR_HEADER_SIZE - r->hhave;
        if (take > avail)
          take = avail;
        if (take)
          memcpy(r->hbuf + r->hhave, p, take);
        r->hhave += take;
        p += take;
        if (r->hhave < HR_HEADER_SIZE)
          goto starved;
        r->hhave = 0;
        hr_wire_parse_header(r->hbuf, &r->hdr);
      }
      if (rd_on_header(r, ev))
        return p - in;
      if (r->state == HR_RDS_CONTROL &&
          (size_t)(end - p) >= r->hdr.payload_length) {
        /* Fast path: the whole payload is in the input. */
        ev->kind = HR_RD_MESSAGE;
        ev->hdr = r->hdr;
        ev->payload = r->hdr.payload_length ? p : NULL;
        p += r->hdr.payload_length;
        r->state = HR_RDS_HEADER;
        return p - in;
      }
      break; /* on to CONTROL or SUBHEADER with the rest */
    }
    case HR_RDS_CONTROL: {
      size_t need = r->hdr.payload_length - r->have;
      size_t take = avail < need ? avail : need;
      if (take) {
        if (rd_reserve(r, r->have + take) != 0)
          return HR_ERR_NOMEM;
        memcpy(r->buf + r->have, p, take);
        r->have += take;
        p += take;
      }
      if (r->have < r->hdr.payload_length)
        goto starved;
      ev->kind = HR_RD_MESSAGE;
      ev->hdr = r->hdr;
      ev->payload = r->buf;
      r->state = HR_RDS_HEADER;
      if (r->cap > RD_KEEP_BUFFER)
        r->release_buf = 1;
      return p - in;
    }
    case HR_RDS_SUBHEADER: {
      const uint8_t *sub;
      if (r->shave == 0 && avail >= HR_DATA_SUBHEADER_SIZE) {
        sub = p;
        p += HR_DATA_SUBHEADER_SIZE;
      } else {
        size_t take = HR_DATA_SUBHEADER_SIZE - r->shave;
        if (take > avail)
          take = avail;
        if (take)
          memcpy(r->sbuf + r->shave, p, take);
        r->shave += take;
        p += take;
        if (r->shave < HR_DATA_SUBHEADER_SIZE)
          goto starved;
        sub = r->sbuf;
      }
      if (rd_on_subheader(r, sub, ev))
        return p - in;
      /* The first piece, possibly of 0 bytes: it tells the caller where
       * the frame goes before any of its data arrived. */
      p += rd_data_piece(r, p, (size_t)(end - p), 1, ev);
      return p - in;
    }
    case HR_RDS_DATA:
      if (avail == 0)
        goto starved;
      p += rd_data_piece(r, p, avail, 0, ev);
      return p - in;
    case HR_RDS_SKIP: {
      size_t take = avail < r->left ? avail : (size_t)r->left;
      r->left -= take;
      p += take;
      if (r->left)
        goto starved;
      r->state = HR_RDS_HEADER;
      break;
    }
    default:
      /* HR_RDS_FATAL was handled on entry; nothing else exists. */
      hr__wire_fail(&ev->status, HR_WIRE_INTERNAL, 0, rd_state_name(r->state));
      return HR_ERR_INTERNAL;
    }
  }
starved:
  ev->kind = HR_RD_NONE;
  return p - in;
}
