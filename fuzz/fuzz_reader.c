/*
 * libFuzzer target: a byte stream through hr_reader in chunks chosen by the
 * input, every complete message decoded with hr_wire_decode_payload() and,
 * like every frame, fed to an hr_rx.
 *
 * Input layout (fuzz/seed_corpus.py writes the same):
 *   u8 mode   bit 0 C2S (else S2C), bit 1 local transport, bit 2 place
 *             frame data with hr_reader_data_pending()/skip_data(), bits
 *             3-5 request flags ALLOW_TRANSCODE, PARALLEL_OK, REGION, bit 6
 *             strict torn composites, bit 7 payload limit 65,536 (else
 *             16 MiB)
 *   u8 max_shards (0 read as 1)
 *   u8 base_stream (S2C: 0 read as 1; C2S: 0 = the first message's)
 *   with REGION: u8 rank (mod 5), then rank pairs of u8 offset, u8 shape
 *   u8 chunk count k (mod 16; 0: the rest in one chunk), k u8 chunk sizes
 *             (each + 1), used in a cycle
 *   the byte stream
 *
 * Checked: the reader's return values and event contract (pieces in order,
 * inside their frame; HR_RD_NONE only with the input used up; a fatal error
 * repeats and consumes nothing), every decoded message's round trip and
 * hr_fuzz_check_decoded(); hr_rx must never crash or leak, whatever order
 * the messages come in.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct input {
  const uint8_t *p;
  size_t n;
} input;

static uint8_t take(input *in) {
  if (in->n == 0)
    return 0;
  in->n--;
  return *in->p++;
}

/* The frame being delivered, as the pieces announced it. */
typedef struct frame {
  int open;
  hr_msg_header hdr;
  uint8_t buffer_index;
  uint64_t offset;
  uint32_t len;
  uint64_t delivered;
} frame;

static void on_message(const hr_reader_event *ev, const hr_wire_ctx *ctx,
                       hr_rx *rx) {
  hr_msg m;
  hr_wire_status st = {0};
  memset(&m, 0, sizeof(m));
  int rc = hr_wire_decode_payload(&ev->hdr, ev->payload, ctx, &m, &st);
  if (rc != 0) {
    hr_fuzz_check_rejection(rc, &st);
    return;
  }
  hr_fuzz_check_decoded(&m, ctx);
  size_t len = HR_HEADER_SIZE + (size_t)ev->hdr.payload_length;
  uint8_t *whole = malloc(len);
  if (whole == NULL)
    hr_fuzz_fail("out of memory");
  hr_wire_put_header(whole, ev->hdr.type, ev->hdr.stream_id,
                     ev->hdr.payload_length);
  if (ev->hdr.payload_length > 0)
    memcpy(whole + HR_HEADER_SIZE, ev->payload, ev->hdr.payload_length);
  hr_fuzz_check_roundtrip(&m, whole, len);
  free(whole);
  if (rx != NULL) {
    hr_rx_event rev;
    rc = hr_rx_on_message(rx, &m, &rev, &st);
    if (rc == HR_ERR_PROTO)
      hr_fuzz_check_rejection(rc, &st);
  }
}

/* A frame's first piece: the checker sees the frame's geometry only. */
static void on_frame(const frame *f, hr_rx *rx) {
  if (rx == NULL)
    return;
  hr_msg m;
  hr_wire_status st = {0};
  hr_rx_event rev;
  memset(&m, 0, sizeof(m));
  m.hdr = f->hdr;
  m.u.data.buffer_index = f->buffer_index;
  m.u.data.offset = f->offset;
  m.u.data.data_len = f->len;
  int rc = hr_rx_on_message(rx, &m, &rev, &st);
  if (rc == HR_ERR_PROTO)
    hr_fuzz_check_rejection(rc, &st);
}

static void on_piece(const hr_reader_event *ev, frame *f, hr_rx *rx) {
  if (ev->first) {
    if (f->open)
      hr_fuzz_fail("a frame starts inside another");
    if (ev->frame_len < 1 ||
        ev->frame_len != ev->hdr.payload_length - HR_DATA_SUBHEADER_SIZE)
      hr_fuzz_fail("a frame length disagrees with its header");
    f->open = 1;
    f->hdr = ev->hdr;
    f->buffer_index = ev->buffer_index;
    f->offset = ev->frame_offset;
    f->len = ev->frame_len;
    f->delivered = 0;
    on_frame(f, rx);
  } else if (!f->open) {
    hr_fuzz_fail("a data piece outside a frame");
  }
  if (ev->buffer_index != f->buffer_index || ev->frame_offset != f->offset ||
      ev->frame_len != f->len || ev->offset != f->offset + f->delivered ||
      ev->len > f->len - f->delivered || (ev->len > 0 && ev->data == NULL))
    hr_fuzz_fail("a data piece disagrees with its frame");
  f->delivered += ev->len;
  if (ev->last) {
    if (f->delivered != f->len)
      hr_fuzz_fail("a frame's last piece before its end");
    f->open = 0;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  input in = {data, size};
  uint8_t mode = take(&in), ms = take(&in), base = take(&in);

  hr_rx_config cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.direction = (mode & 1) ? HR_RX_C2S : HR_RX_S2C;
  cfg.request_flags = ((mode & 8) ? HR_REQ_ALLOW_TRANSCODE : 0) |
                      ((mode & 16) ? HR_REQ_PARALLEL_OK : 0) |
                      ((mode & 32) ? HR_REQ_REGION : 0);
  cfg.max_shards = ms ? ms : 1;
  cfg.base_stream = (base == 0 && cfg.direction == HR_RX_S2C) ? 1 : base;
  cfg.strict = (mode >> 6) & 1;
  if (mode & 32) {
    cfg.region_rank = take(&in) % 5;
    for (unsigned i = 0; i < cfg.region_rank; i++) {
      cfg.region_offset[i] = take(&in);
      cfg.region_shape[i] = take(&in);
    }
  }
  uint8_t chunks[16];
  unsigned nchunks = take(&in) % 16;
  for (unsigned i = 0; i < nchunks; i++)
    chunks[i] = take(&in);

  hr_reader_settings set;
  memset(&set, 0, sizeof(set));
  set.max_payload = (mode & 128) ? HR_PREHELLO_MAX_PAYLOAD : 16u << 20;
  set.ctx.transport = (mode & 2) ? HR_TRANSPORT_LOCAL : HR_TRANSPORT_NETWORK;
  int zero_copy = (mode & 4) != 0;

  hr_reader *r = NULL;
  if (hr_reader_new(&r, &set, NULL) != 0)
    hr_fuzz_fail("hr_reader_new failed");
  hr_rx *rx = NULL;
  if (hr_rx_new(&rx, &cfg, NULL) != 0)
    rx = NULL; /* a configuration the checker refuses: reader only */

  frame f;
  memset(&f, 0, sizeof(f));
  int dead = 0;
  unsigned c = 0;
  while (in.n > 0 && !dead) {
    size_t left = nchunks ? (size_t)chunks[c++ % nchunks] + 1 : in.n;
    if (left > in.n)
      left = in.n;
    const uint8_t *p = in.p;
    in.p += left;
    in.n -= left;
    for (;;) {
      hr_reader_event ev;
      memset(&ev, 0, sizeof(ev));
      int64_t used = hr_reader_feed(r, p, left, &ev);
      if (used < 0 || (uint64_t)used > left)
        hr_fuzz_fail("hr_reader_feed: bad return");
      p += used;
      left -= (size_t)used;
      if (ev.kind == HR_RD_NONE) {
        if (left != 0)
          hr_fuzz_fail("HR_RD_NONE with input left");
        break;
      }
      if (ev.kind == HR_RD_MESSAGE) {
        if (f.open || ev.hdr.type == HR_MSG_TENSOR_DATA)
          hr_fuzz_fail("a message inside a frame, or a frame as a message");
        on_message(&ev, &set.ctx, rx);
      } else if (ev.kind == HR_RD_DATA) {
        on_piece(&ev, &f, rx);
      } else if (ev.kind == HR_RD_ERROR) {
        if (f.open)
          hr_fuzz_fail("an error inside a frame");
        hr_fuzz_check_rejection(HR_ERR_PROTO, &ev.status);
        if (ev.fatal) {
          hr_reader_event again;
          if (hr_reader_feed(r, p, left, &again) != 0 ||
              again.kind != HR_RD_ERROR || again.status.code != ev.status.code)
            hr_fuzz_fail("a dead reader must repeat its error");
          dead = 1;
          break;
        }
      } else {
        hr_fuzz_fail("unknown event kind");
      }
      /* Zero-copy receive: place the rest of the frame ourselves. */
      if (zero_copy && ev.kind == HR_RD_DATA && !ev.last && left > 0) {
        uint8_t bi;
        uint64_t off;
        uint64_t pending = hr_reader_data_pending(r, &bi, &off);
        if (pending != f.len - f.delivered || bi != f.buffer_index ||
            off != f.offset + f.delivered)
          hr_fuzz_fail("hr_reader_data_pending disagrees with the frame");
        if (hr_reader_skip_data(r, pending + 1) != HR_ERR_INVALID_ARGUMENT)
          hr_fuzz_fail("hr_reader_skip_data accepted too many bytes");
        size_t n = pending < left ? (size_t)pending : left;
        if (hr_reader_skip_data(r, n) != 0)
          hr_fuzz_fail("hr_reader_skip_data refused pending bytes");
        f.delivered += n;
        if (f.delivered == f.len)
          f.open = 0;
        p += n;
        left -= n;
      }
    }
  }
  if (rx != NULL) {
    hr_wire_status st = {0};
    int rc = hr_rx_finish(rx, &st);
    if (rc == HR_ERR_PROTO)
      hr_fuzz_check_rejection(rc, &st);
    if (rc == 0 && !hr_rx_done(rx) && !hr_rx_torn(rx))
      hr_fuzz_fail("hr_rx_finish accepted an unfinished transfer");
  }
  hr_rx_del(rx);
  hr_reader_del(r);
  return 0;
}
