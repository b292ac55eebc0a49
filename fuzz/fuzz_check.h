/*
 * Invariants shared by the libFuzzer targets.  A violation aborts, which
 * libFuzzer reports as a crash with the input that caused it.
 */
#ifndef HR_FUZZ_CHECK_H
#define HR_FUZZ_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <hurray/wire.h>

/* Aborts with a message on stderr. */
void hr_fuzz_fail(const char *what) __attribute__((noreturn));

/* A message that decoded must re-encode to exactly its bytes (`len` with
 * the header), and a buffer one byte short must be refused. */
void hr_fuzz_check_roundtrip(const hr_msg *m, const uint8_t *bytes, size_t len);

/* Checks a decoded message beyond the round trip: a decoded descriptor
 * validates and its buffer sizes agree with the layout; the raw lists
 * (HELLO extensions, LIST_RESPONSE entries) iterate to their counts; the
 * registered profiles of layout entries parse or fail cleanly. */
void hr_fuzz_check_decoded(const hr_msg *m, const hr_wire_ctx *ctx);

/* A rejection carries HR_ERR_PROTO, a defined wire code and a reason. */
void hr_fuzz_check_rejection(int rc, const hr_wire_status *st);

#endif /* HR_FUZZ_CHECK_H */
