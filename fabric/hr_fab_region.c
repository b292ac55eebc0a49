/*
 * Pure helpers of the data plane: the RDMA region's placement, the pieces
 * it is cut into, the FABRIC_ADDRESS extension value, and text helpers.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "hr_fab_int.h"

void hr__fab_why(char *why, size_t cap, const char *fmt, ...) {
  if (!why || cap == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, cap, fmt, ap);
  va_end(ap);
}

void hr__fab_ascii(char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
      *s = '?';
}

/* The cut (decision 43), chosen by measurement on loopback
 * (fabric/README.md, "Tagged piece size"): over ofi_rxm each piece is one
 * rendezvous, which the receiver reads, and 4 MiB pieces moved 1 GiB at
 * 3.8 GB/s where 64 MiB pieces moved it at 3.2 (a 256 MiB tensor: 4.0
 * against 3.1); over shm the engine GET was about 8 % slower with 4 MiB
 * pieces than with 64 MiB.  Either way at most MAX_COUNT full pieces,
 * plus one short piece per buffer (HR_MAX_BUFFERS). */
#define TAG_PIECE_MIN (4ull << 20)
#define TAG_PIECE_MAX_COUNT 256ull
#define TAG_PIECE_MIN_SHM (64ull << 20)
#define TAG_PIECE_MAX_COUNT_SHM 128ull
#define TAG_PIECE_ROUND 4096ull

uint64_t hr_fabric_tag_piece(const char *provider, uint64_t total) {
  int shm = provider && strcmp(provider, "shm") == 0;
  uint64_t count = shm ? TAG_PIECE_MAX_COUNT_SHM : TAG_PIECE_MAX_COUNT;
  uint64_t min = shm ? TAG_PIECE_MIN_SHM : TAG_PIECE_MIN;
  uint64_t p = total / count + (total % count ? 1 : 0);
  p = (p + TAG_PIECE_ROUND - 1) / TAG_PIECE_ROUND * TAG_PIECE_ROUND;
  return p > min ? p : min;
}

int64_t hr_fabric_address_encode(const char *provider, const void *name,
                                 size_t name_len, uint8_t *out, size_t cap) {
  if (!provider || (!name && name_len))
    return HR_ERR_INVALID_ARGUMENT;
  size_t plen = strlen(provider);
  if (plen == 0 || plen > UINT16_MAX || name_len > UINT16_MAX)
    return HR_ERR_INVALID_ARGUMENT;
  size_t need = 2 + plen + 2 + name_len;
  if (!out || cap < need)
    return HR_ERR_BUFFER_TOO_SMALL;
  out[0] = (uint8_t)plen;
  out[1] = (uint8_t)(plen >> 8);
  memcpy(out + 2, provider, plen);
  out[2 + plen] = (uint8_t)name_len;
  out[3 + plen] = (uint8_t)(name_len >> 8);
  if (name_len)
    memcpy(out + 4 + plen, name, name_len);
  return (int64_t)need;
}

int hr_fabric_placement(const hr_descriptor *d, uint64_t total,
                        uint64_t offsets[HR_MAX_BUFFERS], const char **why) {
  const char *dummy;
  if (!why)
    why = &dummy;
  if (!d || !offsets) {
    *why = "no descriptor";
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (d->layout.tag == HR_LAYOUT_COMPOSITE) {
    *why = "a composite head has no region (its members have)";
    return HR_ERR_UNSUPPORTED;
  }
  if (d->buffer_count > HR_MAX_BUFFERS) {
    *why = "more than 8 buffers";
    return HR_ERR_UNSUPPORTED;
  }
  uint64_t end = 0;
  for (unsigned k = 0; k < d->buffer_count; k++) {
    const hr_buffer_handle *b = &d->buffers[k];
    if (b->alignment_log2 > HR_MAX_ALIGNMENT_LOG2) {
      *why = "alignment above 2 MiB";
      return HR_ERR_UNSUPPORTED;
    }
    uint64_t a = 1ull << b->alignment_log2;
    /* Buffer 0 starts the region; later ones start at their alignment. */
    if (k > 0 && end % a != 0) {
      *why = "the buffers' alignments leave gaps in the region, so its "
             "length would differ from total_data_bytes";
      return HR_ERR_UNSUPPORTED;
    }
    offsets[k] = end;
    if (!hr__add_u64(end, b->size_bytes, &end)) {
      *why = "the buffer sizes overflow";
      return HR_ERR_UNSUPPORTED;
    }
  }
  if (end != total) {
    *why = "total_data_bytes differs from the sum of the buffer sizes";
    return HR_ERR_UNSUPPORTED;
  }
  return 0;
}

int hr__fab_region_build(const hr_descriptor *d, void *const *buffers,
                         hr_fabric_region *r) {
  memset(r, 0, sizeof *r);
  if (!d || d->buffer_count > HR_MAX_BUFFERS || (d->buffer_count && !buffers))
    return HR_ERR_INVALID_ARGUMENT;
  r->nseg = d->buffer_count;
  if (d->buffer_count) {
    r->device_tag = d->buffers[0].device_tag;
    r->device_index = d->buffers[0].device_index;
  }
  for (unsigned k = 0; k < d->buffer_count; k++) {
    if (!buffers[k] && d->buffers[k].size_bytes)
      return HR_ERR_INVALID_ARGUMENT;
    r->seg[k].ptr = buffers[k];
    r->seg[k].len = d->buffers[k].size_bytes;
    if (!hr__add_u64(r->length, r->seg[k].len, &r->length))
      return HR_ERR_INVALID_ARGUMENT;
  }
  return 0;
}

int hr__fab_region_contiguous(const hr_fabric_region *r) {
  const uint8_t *next = NULL;
  for (unsigned k = 0; k < r->nseg; k++) {
    if (r->seg[k].len == 0)
      continue;
    if (next && (const uint8_t *)r->seg[k].ptr != next)
      return 0;
    next = (const uint8_t *)r->seg[k].ptr + r->seg[k].len;
  }
  return 1;
}

int hr__fab_next_piece(const hr_fabric_region *r, hr__fab_cursor *c,
                       uint64_t piece, void **ptr, uint64_t *len,
                       uint64_t *off) {
  while (c->seg < r->nseg && c->seg_off >= r->seg[c->seg].len) {
    c->seg++;
    c->seg_off = 0;
  }
  if (c->seg >= r->nseg || piece == 0)
    return 0;
  const hr_fabric_seg *s = &r->seg[c->seg];
  uint64_t n = s->len - c->seg_off;
  if (n > piece)
    n = piece;
  *ptr = (uint8_t *)s->ptr + c->seg_off;
  *len = n;
  *off = c->off;
  c->seg_off += n;
  c->off += n;
  return 1;
}

uint64_t hr__fab_count_pieces(const hr_fabric_region *r, uint64_t piece) {
  uint64_t n = 0;
  if (piece == 0)
    return 0;
  for (unsigned k = 0; k < r->nseg; k++)
    n += r->seg[k].len / piece + (r->seg[k].len % piece ? 1 : 0);
  return n;
}
