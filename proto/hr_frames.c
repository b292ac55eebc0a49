/* The frame tracker: see hr_frames.h. */
#include <string.h>

#include "hr_frames.h"

/* Moves `cur` past complete and empty buffers, so that it always names the
 * buffer the next frame must belong to. */
static void frames_settle(hr_frames *f) {
  while (f->cur < f->count && f->pos == f->sizes[f->cur]) {
    f->cur++;
    f->pos = 0;
  }
}

int hr__frames_init(hr_frames *f, const hr_descriptor *d, uint64_t total,
                    hr_wire_status *st) {
  memset(f, 0, sizeof *f);
  if (d->buffer_count > HR_MAX_BUFFERS)
    return hr__wire_fail(st, HR_WIRE_INVALID_DESCRIPTOR, 0,
                         "descriptor.buffer_count: more than 8 buffers");
  uint64_t sum = 0;
  for (unsigned i = 0; i < d->buffer_count; i++) {
    if (!hr__add_u64(sum, d->buffers[i].size_bytes, &sum))
      return hr__wire_fail(st, HR_WIRE_INVALID_DESCRIPTOR, 0,
                           "descriptor.buffers: sizes overflow u64");
  }
  if (sum != total)
    return hr__wire_fail(st, HR_WIRE_INVALID_DESCRIPTOR, 0,
                         "total_data_bytes: not the sum of the buffer sizes");
  for (unsigned i = 0; i < d->buffer_count; i++)
    f->sizes[i] = d->buffers[i].size_bytes;
  f->count = d->buffer_count;
  f->total = total;
  frames_settle(f);
  return 0;
}

int hr__frames_on_data(hr_frames *f, uint8_t index, uint64_t offset,
                       uint64_t len, hr_wire_status *st) {
  if (len == 0)
    return hr__wire_fail(st, HR_WIRE_MALFORMED_PAYLOAD, 8,
                         "TENSOR_DATA: a frame carries at least one byte");
  if (f->total == 0)
    return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 12,
                         "TENSOR_DATA: a frame on a tensor of 0 bytes");
  if (index >= f->count)
    return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 12,
                         "TENSOR_DATA.buffer_index: beyond buffer_count");
  if (f->cur == f->count)
    return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 12,
                         "TENSOR_DATA: a frame after all bytes arrived");
  if (index < f->cur) {
    /* Either a buffer already complete or a size-0 buffer. */
    return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 12,
                         f->sizes[index] == 0
                             ? "TENSOR_DATA: a frame on a buffer of size 0"
                             : "TENSOR_DATA.buffer_index: a buffer already "
                               "complete (overlap)");
  }
  if (index > f->cur)
    return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 12,
                         f->sizes[index] == 0
                             ? "TENSOR_DATA: a frame on a buffer of size 0"
                             : "TENSOR_DATA.buffer_index: buffers out of order "
                               "(an earlier buffer is incomplete)");
  if (offset < f->pos)
    return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 16,
                         "TENSOR_DATA.byte_offset_in_buffer: overlaps an "
                         "earlier frame");
  if (offset > f->pos)
    return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 16,
                         "TENSOR_DATA.byte_offset_in_buffer: leaves a gap");
  /* pos < sizes[cur] holds (cur is settled), so the subtraction is safe. */
  if (len > f->sizes[f->cur] - f->pos)
    return hr__wire_fail(st, HR_WIRE_PROTOCOL_VIOLATION, 8,
                         "TENSOR_DATA: the frame runs past its buffer");
  f->pos += len;
  f->received += len;
  frames_settle(f);
  return 0;
}

int hr__frames_end(const hr_frames *f, hr_wire_status *st) {
  if (f->cur != f->count)
    return hr__wire_fail(
        st, HR_WIRE_PROTOCOL_VIOLATION, 0,
        "TENSOR_DATA_END: before all total_data_bytes arrived");
  return 0;
}
