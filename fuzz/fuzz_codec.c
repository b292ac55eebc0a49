/*
 * libFuzzer target: one whole message through hr_wire_decode(), under both
 * transports.  A message that decodes must pass hr_fuzz_check_decoded()
 * and re-encode to exactly the same bytes, and hr_wire_decode_payload()
 * (the frame reader's path) must agree with it; a rejection must carry
 * HR_ERR_PROTO, a defined code and a reason.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const int transports[] = {HR_TRANSPORT_NETWORK, HR_TRANSPORT_LOCAL};
  for (size_t t = 0; t < sizeof(transports) / sizeof(transports[0]); t++) {
    hr_wire_ctx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.transport = transports[t];
    hr_msg m;
    hr_wire_status st = {0};
    memset(&m, 0, sizeof(m));
    int rc = hr_wire_decode(data, size, &ctx, &m, &st);
    if (rc != 0) {
      hr_fuzz_check_rejection(rc, &st);
      continue;
    }
    if (size < HR_HEADER_SIZE)
      hr_fuzz_fail("hr_wire_decode accepted less than a header");
    hr_fuzz_check_decoded(&m, &ctx);
    hr_fuzz_check_roundtrip(&m, data, size);

    hr_msg_header h;
    hr_msg m2;
    memset(&m2, 0, sizeof(m2));
    hr_wire_parse_header(data, &h);
    rc = hr_wire_decode_payload(&h, data + HR_HEADER_SIZE, &ctx, &m2, &st);
    if (rc != 0)
      hr_fuzz_fail("hr_wire_decode_payload rejects what hr_wire_decode "
                   "accepted");
    hr_fuzz_check_roundtrip(&m2, data, size);
  }
  return 0;
}
