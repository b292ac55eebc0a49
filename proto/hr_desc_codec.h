/*
 * Internal interface between the message codec (hr_msg.c) and the
 * descriptor codec (hr_descriptor.c).
 *
 * hr_msg.c decodes TENSOR_DESCRIPTOR and TENSOR_PUT by calling
 * hr__desc_decode() then hr__xport_decode() on its cursor, then
 * hr_descriptor_validate(d, &xport, ctx, desc_start_offset, st); it
 * encodes them with hr__desc_encoded_size()/hr__desc_encode() and
 * hr__xport_encode().  Layout entries in HELLO and request lists use
 * hr__layout_entry_decode() with HR_LE_LIST.
 */
#ifndef HR_DESC_CODEC_H
#define HR_DESC_CODEC_H

#include "hr_cursor.h"
#include "hr_internal.h"

#define HR_XPORT_SIZE 16u /* u64 total, u16 index, u16 total, u8 plane, 3 */

/* Where a layout entry is read: in a HELLO/request list (reserved tags are
 * kept, 0x00/0xFF are MALFORMED_PAYLOAD) or in a descriptor (the tag is
 * checked by hr_descriptor_validate()). */
enum { HR_LE_LIST = 0, HR_LE_DESCRIPTOR = 1 };

/* Reads one layout entry.  Returns 0 or HR_ERR_PROTO (MALFORMED_PAYLOAD
 * for framing; in a list also for tags 0x00/0xFF). */
int hr__layout_entry_decode(hr_cursor *c, int where, hr_layout_entry *e,
                            hr_wire_status *st);
/* Size and encoding of one layout entry. */
size_t hr__layout_entry_size(const hr_layout_entry *e);
uint8_t *hr__layout_entry_encode(uint8_t *o, const hr_layout_entry *e);

/* Reads a descriptor (§ 7) from the cursor: framing and the checks needed
 * to stay inside fixed arrays (rank <= 32, buffer_count <= 8, reported as
 * INVALID_DESCRIPTOR); every other rule is left to
 * hr_descriptor_validate().  Parses layout_params into d->params when their
 * length fits the layout (a mismatch is left for validation to report). */
int hr__desc_decode(hr_cursor *c, hr_descriptor *d, hr_wire_status *st);

/* Reads the 16 transport field bytes (§ 10): MALFORMED_PAYLOAD for
 * framing, reserved bytes or data_plane > 2. */
int hr__xport_decode(hr_cursor *c, hr_transport_fields *x,
                     hr_wire_status *st);

/* Exact encoded size of a descriptor, or -1 when it cannot be encoded
 * (rank > 32, buffer_count > 8, unknown-extension params missing). */
int64_t hr__desc_encoded_size(const hr_descriptor *d);
/* Writes the descriptor; returns the end pointer.  The caller sized the
 * output with hr__desc_encoded_size(). */
uint8_t *hr__desc_encode(uint8_t *o, const hr_descriptor *d);
uint8_t *hr__xport_encode(uint8_t *o, const hr_transport_fields *x);

#endif /* HR_DESC_CODEC_H */
