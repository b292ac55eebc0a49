/*
 * Internal: introspection of the frame reader and the transfer checker,
 * for tests and trace lines.  Every function returns a static name and
 * never NULL.
 */
#ifndef HR_RX_INTERNAL_H
#define HR_RX_INTERNAL_H

#include <hurray/wire.h>

/* The reader's decoder state: "HEADER", "CONTROL", "SUBHEADER", "DATA",
 * "SKIP" or "FATAL". */
const char *hr__reader_state_name(const hr_reader *r);

/* The checker's transfer mode: "UNKNOWN" (no top-level descriptor yet),
 * "SINGLE" or "SHARDED". */
const char *hr__rx_mode_name(const hr_rx *rx);

/* The state of one stream of the transfer: "IDLE", "OPEN", "DONE" or
 * "ENDED"; "OUTSIDE" for a stream outside the transfer's block. */
const char *hr__rx_stream_state_name(const hr_rx *rx, uint32_t stream_id);

#endif /* HR_RX_INTERNAL_H */
