/*
 * Feeds every wire-v1 test vector (valid and invalid, single messages and
 * sequences) to the frame reader, hr_reader, at every split point: whole,
 * [0,k) + [k,len) for each k in 1..len-1, one byte at a time, and a few
 * pseudo-random chunkings with a fixed seed; the whole feed and the
 * two-way splits again with the caller placing frame data itself
 * (zero-copy).  The events, with TENSOR_DATA pieces reassembled into
 * frames, must be the same for every split, and must match what the message
 * headers predict: each message whole, each frame with its sub-header fields
 * and bytes, and for a header-level fault the header check's error (fatal on
 * stream 0 and for MESSAGE_TOO_LARGE).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vec_common.h"

#define FEED_MAX_PAYLOAD (16u << 20)

enum { EV_MSG = 1, EV_FRAME, EV_ERR };

/* One event, data pieces reassembled. */
typedef struct ev_rec {
  int kind;
  hr_msg_header hdr;
  /* EV_FRAME */
  uint8_t buffer_index;
  uint64_t frame_offset;
  uint32_t frame_len;
  /* EV_MSG: the payload; EV_FRAME: the data */
  uint8_t *data;
  size_t len;
  /* EV_ERR */
  uint32_t code;
  uint32_t offset;
  int fatal;
} ev_rec;

typedef struct ev_log {
  ev_rec *r;
  size_t n, cap;
  int frame_open; /* the last record is a frame still receiving pieces */
  int fatal;      /* a fatal error ended the feed */
} ev_log;

static void log_free(ev_log *l) {
  for (size_t i = 0; i < l->n; i++)
    free(l->r[i].data);
  free(l->r);
  memset(l, 0, sizeof(*l));
}

static ev_rec *log_add(ev_log *l, int kind, const hr_msg_header *h) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 8;
    l->r = vec_chk(realloc(l->r, l->cap * sizeof(*l->r)));
  }
  ev_rec *r = &l->r[l->n++];
  memset(r, 0, sizeof(*r));
  r->kind = kind;
  r->hdr = *h;
  return r;
}

static void rec_append(ev_rec *r, const uint8_t *p, size_t n) {
  r->data = vec_chk(realloc(r->data, r->len + n + 1));
  if (n > 0)
    memcpy(r->data + r->len, p, n);
  r->len += n;
}

/* Takes one reader event into the log; returns -1 with `diag` when the
 * event breaks the reader's documented contract. */
static int take_event(ev_log *l, const hr_reader_event *ev, vec_buf *diag) {
  ev_rec *r;
  switch (ev->kind) {
  case HR_RD_MESSAGE:
    if (l->frame_open) {
      vec_buf_printf(diag, "reader: a message inside an open frame\n");
      return -1;
    }
    if (ev->hdr.type == HR_MSG_TENSOR_DATA) {
      vec_buf_printf(diag, "reader: TENSOR_DATA delivered as a message\n");
      return -1;
    }
    r = log_add(l, EV_MSG, &ev->hdr);
    rec_append(r, ev->payload, ev->hdr.payload_length);
    return 0;
  case HR_RD_DATA:
    if (ev->first) {
      if (l->frame_open) {
        vec_buf_printf(diag, "reader: a frame starts inside another\n");
        return -1;
      }
      r = log_add(l, EV_FRAME, &ev->hdr);
      r->buffer_index = ev->buffer_index;
      r->frame_offset = ev->frame_offset;
      r->frame_len = ev->frame_len;
      l->frame_open = 1;
    } else {
      if (!l->frame_open) {
        vec_buf_printf(diag, "reader: a data piece outside a frame\n");
        return -1;
      }
      r = &l->r[l->n - 1];
    }
    if (ev->hdr.type != r->hdr.type || ev->hdr.stream_id != r->hdr.stream_id ||
        ev->buffer_index != r->buffer_index ||
        ev->frame_offset != r->frame_offset || ev->frame_len != r->frame_len ||
        ev->offset != r->frame_offset + r->len) {
      vec_buf_printf(diag,
                     "reader: data piece fields disagree with its "
                     "frame (offset %llu after %zu of %u bytes at "
                     "%llu)\n",
                     (unsigned long long)ev->offset, r->len, r->frame_len,
                     (unsigned long long)r->frame_offset);
      return -1;
    }
    if (ev->len > r->frame_len - r->len ||
        (ev->len == 0 && !ev->first && !ev->last) ||
        (ev->len > 0 && ev->data == NULL)) {
      vec_buf_printf(diag, "reader: bad data piece of %zu bytes\n", ev->len);
      return -1;
    }
    rec_append(r, ev->data, ev->len);
    if (ev->last) {
      if (r->len != r->frame_len) {
        vec_buf_printf(diag, "reader: frame ends after %zu of %u bytes\n",
                       r->len, r->frame_len);
        return -1;
      }
      l->frame_open = 0;
    }
    return 0;
  case HR_RD_ERROR:
    if (l->frame_open) {
      vec_buf_printf(diag, "reader: an error inside an open frame\n");
      return -1;
    }
    r = log_add(l, EV_ERR, &ev->hdr);
    r->code = ev->status.code;
    r->offset = ev->status.offset;
    r->fatal = ev->fatal;
    if (ev->status.reason == NULL) {
      vec_buf_printf(diag, "reader: error without a reason\n");
      return -1;
    }
    if (ev->fatal)
      l->fatal = 1;
    return 0;
  default:
    vec_buf_printf(diag, "reader: unknown event kind %d\n", ev->kind);
    return -1;
  }
}

/* Zero-copy receive: after a data piece that did not end its frame, the
 * caller places what it has of the rest itself (hr_reader_data_pending()
 * and hr_reader_skip_data()), as an engine recv()ing into the destination
 * would.  Returns the bytes taken from `in`, or -1. */
static int64_t place_data(hr_reader *r, ev_log *l, const uint8_t *in,
                          size_t left, vec_buf *diag) {
  ev_rec *f = &l->r[l->n - 1];
  uint8_t bi = 0;
  uint64_t off = 0;
  uint64_t pending = hr_reader_data_pending(r, &bi, &off);
  if (pending != f->frame_len - f->len || bi != f->buffer_index ||
      off != f->frame_offset + f->len) {
    vec_buf_printf(diag,
                   "hr_reader_data_pending: %llu bytes for buffer %u "
                   "at %llu; the frame has %llu left at %llu\n",
                   (unsigned long long)pending, bi, (unsigned long long)off,
                   (unsigned long long)(f->frame_len - f->len),
                   (unsigned long long)(f->frame_offset + f->len));
    return -1;
  }
  if (hr_reader_skip_data(r, pending + 1) != HR_ERR_INVALID_ARGUMENT) {
    vec_buf_printf(diag, "hr_reader_skip_data took more than pending\n");
    return -1;
  }
  size_t n = pending < left ? (size_t)pending : left;
  if (hr_reader_skip_data(r, n) != 0) {
    vec_buf_printf(diag, "hr_reader_skip_data refused %zu pending bytes\n", n);
    return -1;
  }
  rec_append(f, in, n);
  if (f->len == f->frame_len)
    l->frame_open = 0;
  return (int64_t)n;
}

/* Feeds p[0..len) cut at cuts[0..ncuts) (ascending, inside (0, len)),
 * placing frame data itself when `zero_copy` is set. */
static int feed(const uint8_t *p, size_t len, const size_t *cuts, size_t ncuts,
                const hr_reader_settings *set, int zero_copy, ev_log *l,
                vec_buf *diag) {
  hr_reader *r = NULL;
  int rc = hr_reader_new(&r, set, NULL);
  if (rc != 0) {
    vec_buf_printf(diag, "hr_reader_new: rc %d\n", rc);
    return -1;
  }
  int res = 0;
  size_t start = 0;
  for (size_t c = 0; c <= ncuts && res == 0 && !l->fatal; c++) {
    size_t end = c < ncuts ? cuts[c] : len;
    const uint8_t *in = p + start;
    size_t left = end - start;
    int idle = 0; /* events in a row that consumed nothing */
    for (;;) {
      hr_reader_event ev;
      memset(&ev, 0, sizeof(ev));
      int64_t used = hr_reader_feed(r, in, left, &ev);
      if (used < 0 || (uint64_t)used > left) {
        vec_buf_printf(diag,
                       "hr_reader_feed returned %lld with %zu bytes "
                       "offered\n",
                       (long long)used, left);
        res = -1;
        break;
      }
      in += used;
      left -= (size_t)used;
      if (ev.kind == HR_RD_NONE) {
        if (left != 0) {
          vec_buf_printf(diag,
                         "hr_reader_feed: HR_RD_NONE with %zu bytes "
                         "left\n",
                         left);
          res = -1;
        }
        break;
      }
      if (take_event(l, &ev, diag) != 0) {
        res = -1;
        break;
      }
      if (l->fatal)
        break;
      if (zero_copy && ev.kind == HR_RD_DATA && !ev.last && left > 0) {
        int64_t placed = place_data(r, l, in, left, diag);
        if (placed < 0) {
          res = -1;
          break;
        }
        in += placed;
        left -= (size_t)placed;
        used += placed;
      }
      idle = used == 0 ? idle + 1 : 0;
      if (idle > 4) {
        vec_buf_printf(diag, "hr_reader_feed: no progress\n");
        res = -1;
        break;
      }
    }
    start = end;
  }
  if (res == 0 && !l->fatal) {
    if (l->frame_open) {
      vec_buf_printf(diag, "reader: the input ended inside a frame\n");
      res = -1;
    } else if (!hr_reader_at_boundary(r)) {
      vec_buf_printf(diag, "reader: not at a message boundary after whole "
                           "messages\n");
      res = -1;
    }
  }
  if (res == 0 && l->fatal) {
    /* After a fatal error the reader consumes nothing and repeats it. */
    hr_reader_event ev;
    memset(&ev, 0, sizeof(ev));
    int64_t used = hr_reader_feed(r, p, len, &ev);
    const ev_rec *last = &l->r[l->n - 1];
    if (used != 0 || ev.kind != HR_RD_ERROR || ev.status.code != last->code) {
      vec_buf_printf(diag,
                     "reader: after a fatal error it consumed %lld "
                     "and reported kind %d\n",
                     (long long)used, ev.kind);
      res = -1;
    }
  }
  hr_reader_del(r);
  return res;
}

static const char *kind_name(int k) {
  return k == EV_MSG ? "message" : k == EV_FRAME ? "frame" : "error";
}

static void describe_rec(vec_buf *diag, const ev_rec *r) {
  if (r == NULL) {
    vec_buf_printf(diag, "(none)");
    return;
  }
  vec_buf_printf(diag, "%s %s stream %u len %u", kind_name(r->kind),
                 hr_msg_type_name(r->hdr.type), r->hdr.stream_id,
                 r->hdr.payload_length);
  if (r->kind == EV_FRAME)
    vec_buf_printf(diag, " buffer %u offset %llu (%u bytes, %zu got)",
                   r->buffer_index, (unsigned long long)r->frame_offset,
                   r->frame_len, r->len);
  if (r->kind == EV_ERR)
    vec_buf_printf(diag, " %s at %u%s", hr_wire_error_name(r->code), r->offset,
                   r->fatal ? " fatal" : "");
}

static int rec_equal(const ev_rec *a, const ev_rec *b) {
  if (a->kind != b->kind || a->hdr.type != b->hdr.type ||
      a->hdr.stream_id != b->hdr.stream_id ||
      a->hdr.payload_length != b->hdr.payload_length)
    return 0;
  switch (a->kind) {
  case EV_ERR:
    return a->code == b->code && a->offset == b->offset && a->fatal == b->fatal;
  case EV_FRAME:
    if (a->buffer_index != b->buffer_index ||
        a->frame_offset != b->frame_offset || a->frame_len != b->frame_len)
      return 0;
    /* fall through */
  default:
    return a->len == b->len &&
           (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
  }
}

/* Compares the first `n` records of two logs (all when n is SIZE_MAX). */
static int compare_logs(const ev_log *want, const ev_log *got, size_t n,
                        const char *what, vec_buf *diag) {
  size_t cnt = want->n > got->n ? want->n : got->n;
  if (n < cnt)
    cnt = n;
  for (size_t i = 0; i < cnt; i++) {
    const ev_rec *a = i < want->n ? &want->r[i] : NULL;
    const ev_rec *b = i < got->n ? &got->r[i] : NULL;
    if (a != NULL && b != NULL && rec_equal(a, b))
      continue;
    vec_buf_printf(diag, "%s: event %zu differs\n  expected ", what, i);
    describe_rec(diag, a);
    vec_buf_printf(diag, "\n  got      ");
    describe_rec(diag, b);
    vec_buf_printf(diag, "\n");
    return -1;
  }
  return 0;
}

/*
 * The events the headers predict, as far as they can be predicted: a
 * TENSOR_DATA whose sub-header does not decode stops the prediction (the
 * reader may deliver or reject it; the split test still holds it to one
 * answer).  Returns 1 when `want` holds every event, 0 when only a prefix.
 */
static int predict(const vec_span *msgs, int n, const hr_reader_settings *set,
                   ev_log *want) {
  for (int i = 0; i < n; i++) {
    hr_msg_header h;
    hr_wire_status st = {0};
    hr_wire_parse_header(msgs[i].p, &h);
    const uint8_t *pl = msgs[i].p + HR_HEADER_SIZE;
    if (hr_wire_check_header(&h, set->max_payload, &set->ctx, &st) != 0) {
      ev_rec *r = log_add(want, EV_ERR, &h);
      r->code = st.code;
      r->offset = st.offset;
      r->fatal = st.code == HR_WIRE_MESSAGE_TOO_LARGE || h.stream_id == 0;
      if (r->fatal)
        break;
      continue;
    }
    if (h.type == HR_MSG_TENSOR_DATA) {
      hr_data d;
      if (h.payload_length < HR_DATA_SUBHEADER_SIZE ||
          hr_wire_decode_data_subheader(pl, h.payload_length, &d, &st) != 0)
        return 0;
      ev_rec *r = log_add(want, EV_FRAME, &h);
      r->buffer_index = d.buffer_index;
      r->frame_offset = d.offset;
      r->frame_len = d.data_len;
      rec_append(r, pl + HR_DATA_SUBHEADER_SIZE, d.data_len);
      continue;
    }
    ev_rec *r = log_add(want, EV_MSG, &h);
    rec_append(r, pl, h.payload_length);
  }
  return 1;
}

/* A small deterministic generator for the random chunkings. */
static uint32_t lcg(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return *s >> 8;
}

static int check_vector(const char *file, const cJSON *v, vec_buf *diag) {
  (void)file;
  int ok = 1;
  const char *kind = vec_get_str(v, "kind", &ok);
  const char *hex = vec_get_str(v, "hex", &ok);
  hr_reader_settings set;
  memset(&set, 0, sizeof(set));
  if (!ok || vec_transport(v, &set.ctx) != 0) {
    vec_buf_printf(diag, "vector: missing or bad kind/hex/transport\n");
    return -1;
  }
  int valid = strcmp(kind, "valid") == 0;
  int single = cJSON_GetObjectItemCaseSensitive(v, "sequence") == NULL;
  int code = -1;
  if (!valid) {
    const char *name = vec_get_str(v, "expect_error", &ok);
    code = ok ? hr_wire_error_from_name(name) : -1;
    if (code < 0) {
      vec_buf_printf(diag, "vector: bad expect_error\n");
      return -1;
    }
  }
  /* A generous limit, except for a vector about the limit itself, which is
   * the one before the HELLOs. */
  set.max_payload = code == HR_WIRE_MESSAGE_TOO_LARGE ? HR_PREHELLO_MAX_PAYLOAD
                                                      : FEED_MAX_PAYLOAD;

  uint8_t *p;
  size_t len;
  vec_span *msgs = NULL;
  int n;
  if (vec_hex_decode(hex, &p, &len) != 0) {
    vec_buf_printf(diag, "vector: `hex` is not hex\n");
    return -1;
  }
  if ((n = vec_split(p, len, &msgs)) < 0) {
    vec_buf_printf(diag, "vector: the bytes do not split into messages\n");
    free(p);
    return -1;
  }

  int res = 0;
  ev_log whole = {0}, want = {0};
  if (feed(p, len, NULL, 0, &set, 0, &whole, diag) != 0) {
    vec_buf_printf(diag, "  (whole feed)\n");
    res = -1;
  }
  int complete = predict(msgs, n, &set, &want);
  if (res == 0 && compare_logs(&want, &whole, complete ? SIZE_MAX : want.n,
                               "whole feed vs headers", diag) != 0)
    res = -1;

  /* The reader's own verdict on an invalid single message: a header-level
   * fault is reported with the vector's code; any other error it reports
   * (a bad TENSOR_DATA sub-header) has the vector's code too. */
  if (res == 0 && !valid && single) {
    int header_level = code == HR_WIRE_MESSAGE_TOO_LARGE ||
                       code == HR_WIRE_UNKNOWN_MESSAGE_TYPE ||
                       code == HR_WIRE_PROTOCOL_VIOLATION;
    const ev_rec *err = NULL;
    for (size_t i = 0; i < whole.n && err == NULL; i++)
      if (whole.r[i].kind == EV_ERR)
        err = &whole.r[i];
    if ((header_level && err == NULL) ||
        (err != NULL && err->code != (uint32_t)code)) {
      vec_buf_printf(diag, "reader: expected %s, got ",
                     header_level ? hr_wire_error_name((uint32_t)code)
                                  : "no error or the vector's");
      describe_rec(diag, err);
      vec_buf_printf(diag, "\n");
      res = -1;
    }
  }

  /* Every two-way split, one byte at a time, and random chunkings. */
  size_t *cuts = vec_chk(malloc((len + 1) * sizeof(*cuts)));
  for (int zc = 0; zc < 2; zc++) {
    for (size_t k = zc ? 0 : 1; k < len && res == 0; k++) {
      ev_log l = {0};
      cuts[0] = k;
      char what[64];
      snprintf(what, sizeof(what), "%ssplit at %zu", zc ? "zero-copy " : "", k);
      if (feed(p, len, cuts, k ? 1 : 0, &set, zc, &l, diag) != 0 ||
          compare_logs(&whole, &l, SIZE_MAX, what, diag) != 0) {
        vec_buf_printf(diag, "  (%s)\n", what);
        res = -1;
      }
      log_free(&l);
    }
  }
  if (res == 0 && len > 1) {
    ev_log l = {0};
    for (size_t k = 1; k < len; k++)
      cuts[k - 1] = k;
    if (feed(p, len, cuts, len - 1, &set, 0, &l, diag) != 0 ||
        compare_logs(&whole, &l, SIZE_MAX, "one byte at a time", diag) != 0) {
      vec_buf_printf(diag, "  (one byte at a time)\n");
      res = -1;
    }
    log_free(&l);
  }
  uint32_t seed = (uint32_t)len * 2654435761u;
  for (int round = 0; round < 8 && res == 0 && len > 1; round++) {
    size_t nc = 0;
    for (size_t at = 1 + lcg(&seed) % 40; at < len; at += 1 + lcg(&seed) % 40)
      cuts[nc++] = at;
    ev_log l = {0};
    if (feed(p, len, cuts, nc, &set, round % 2, &l, diag) != 0 ||
        compare_logs(&whole, &l, SIZE_MAX, "random chunks", diag) != 0) {
      vec_buf_printf(diag, "  (random chunking %d)\n", round);
      res = -1;
    }
    log_free(&l);
  }

  free(cuts);
  log_free(&whole);
  log_free(&want);
  free(msgs);
  free(p);
  return res;
}

int main(void) {
  return vec_main("vectors_feed_test", check_vector);
}
