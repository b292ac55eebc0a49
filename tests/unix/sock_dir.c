/* The Unix socket tests' fixture: see sock_dir.h. */
#include "sock_dir.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

int sock_dir_setup(void **state, const char *stem) {
  fixture *f = calloc(1, sizeof *f);

  if (!f)
    return -1;
  snprintf(f->dir, sizeof f->dir, "/tmp/%s_XXXXXX", stem);
  if (!mkdtemp(f->dir)) {
    free(f);
    return -1;
  }
  snprintf(f->path, sizeof f->path, "%s/s.sock", f->dir);
  snprintf(f->url, sizeof f->url, "unix:%s", f->path);
  *state = f;
  return 0;
}

int sock_dir_teardown(void **state) {
  fixture *f = *state;
  int rv;

  unlink(f->path);
  rv = rmdir(f->dir);
  free(f);
  return rv;
}

void sock_dir_listen(const fixture *f, tl_server *ts) {
  hr_provider prov;

  hr_store_provider(ts->store, &prov);
  assert_int_equal(hr_engine_listen(ts->e, f->url, &prov, NULL), 0);
}
