/* A program built against the installed libhurray: encodes a PING, decodes
 * it back, and checks the round trip. */
#include <hurray/hurray.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  const hr_info *info = hr_version(0);
  if (!info)
    return 1;
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_PING;
  m.u.ping = 0x0123456789abcdefULL;
  uint8_t buf[64];
  int64_t n = hr_wire_encode(&m, buf, sizeof buf);
  if (n != 20)
    return 2;
  hr_msg back;
  hr_wire_status st;
  if (hr_wire_decode(buf, (size_t)n, NULL, &back, &st) != 0 ||
      back.u.ping != m.u.ping)
    return 3;
  printf("%s: libhurray %s speaks %s\n", argc > 1 ? argv[1] : "consumer",
         info->version, info->proto);
  return 0;
}
