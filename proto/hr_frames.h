/*
 * Internal: the frame tracker, i.e. the rules of wire-v1 § 10 for the
 * TENSOR_DATA frames of one tensor (or shard, or composite member):
 *
 *  - frames run through buffer 0 from offset 0 to its end, then buffer 1,
 *    and so on: ascending, no gap, no overlap;
 *  - a frame never spans two buffers and never runs past its buffer;
 *  - a buffer of size 0 gets no frame, and neither does a tensor of 0
 *    bytes (an empty tensor, a composite head);
 *  - buffer_index < buffer_count;
 *  - the frames' data lengths sum to total_data_bytes, which must equal
 *    the sum of the buffer sizes.
 *
 * Used by hr_rx on the receiving side, and usable by a sender to check the
 * frames it is about to cut.  No allocation; the struct is plain data
 * (copyable, no destructor).
 */
#ifndef HR_FRAMES_H
#define HR_FRAMES_H

#include "hr_internal.h"

typedef struct hr_frames {
  /* The buffer sizes, copied from the descriptor. */
  uint64_t sizes[HR_MAX_BUFFERS];
  /* total_data_bytes (= the sum of sizes). */
  uint64_t total;
  /* Bytes accepted so far. */
  uint64_t received;
  /* The offset, in buffer `cur`, the next frame must start at. */
  uint64_t pos;
  /* buffer_count. */
  uint8_t count;
  /* The first buffer that still expects bytes; `count` once all are
   * complete.  Empty buffers are skipped over as soon as they are
   * reached. */
  uint8_t cur;
} hr_frames;

/*
 * Starts tracking the frames of a tensor described by `d` with
 * total_data_bytes `total`.  Returns 0, or HR_ERR_PROTO with
 * INVALID_DESCRIPTOR in `st` (offset 0) when buffer_count exceeds 8 or the
 * buffer sizes do not sum to `total` (or overflow u64).  On failure `f` is
 * left as an empty tracker that accepts no frame.
 */
int hr__frames_init(hr_frames *f, const hr_descriptor *d, uint64_t total,
                    hr_wire_status *st);

/*
 * Accepts one frame: `len` data bytes at `offset` of buffer `index`.
 * Returns 0, or HR_ERR_PROTO with PROTOCOL_VIOLATION in `st` (offsets name
 * the TENSOR_DATA fields: 12 buffer_index, 16 byte_offset_in_buffer, 8 the
 * length) when the frame breaks a rule of the header comment; `len` 0 is
 * MALFORMED_PAYLOAD (a frame carries at least one byte).  A rejected frame
 * changes nothing.
 */
int hr__frames_on_data(hr_frames *f, uint8_t index, uint64_t offset,
                       uint64_t len, hr_wire_status *st);

/* Returns 0 when every byte arrived (DATA_END may come), else
 * HR_ERR_PROTO with PROTOCOL_VIOLATION (offset 0). */
int hr__frames_end(const hr_frames *f, hr_wire_status *st);

/* Returns 1 when every byte arrived. */
static inline int hr__frames_complete(const hr_frames *f) {
  return f->cur == f->count;
}

#endif /* HR_FRAMES_H */
