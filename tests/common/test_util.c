/* Helpers several test programs share: see test_util.h. */
#include "test_util.h"

#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

int tu_fd_count(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent *e;
  if (!d)
    return -1;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

hr_descriptor tu_bytes_desc(uint64_t n, uint8_t align_log2,
                            uint8_t device_tag) {
  hr_descriptor d;
  memset(&d, 0, sizeof d);
  d.descriptor_version = 1;
  d.element_type = HR_ELEM_UINT8;
  d.rank = 1;
  d.shape[0] = n;
  d.layout.tag = HR_LAYOUT_ROW_MAJOR;
  d.buffer_count = 1;
  d.buffers[0].size_bytes = n;
  d.buffers[0].alignment_log2 = align_log2;
  d.buffers[0].device_tag = device_tag;
  return d;
}

double tu_value(const char *body, const char *series) {
  char pat[512];
  snprintf(pat, sizeof pat, "\n%s ", series);
  const char *p = strstr(body, pat);
  if (!p) {
    print_error("series not found: %s\n", series);
    fail();
  }
  return strtod(p + strlen(pat), NULL);
}
