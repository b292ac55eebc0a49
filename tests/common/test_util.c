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
