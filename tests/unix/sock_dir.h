/*
 * The fixture of the Unix socket tests (test_unix.c, test_shm.c,
 * test_shm_arena.c): a fresh directory under /tmp, the socket path in it
 * and its "unix:PATH" URL.
 */
#ifndef HR_SOCK_DIR_H
#define HR_SOCK_DIR_H

#include "tl.h"

typedef struct fixture {
  char dir[64];
  char path[128]; /* dir/s.sock */
  char url[160];  /* unix:path */
} fixture;

/* cmocka group setup: makes "/tmp/STEM_XXXXXX" and a fixture for it in
 * *state.  Returns 0 or -1. */
int sock_dir_setup(void **state, const char *stem);

/* cmocka group teardown: removes the socket file and the directory (which
 * must hold nothing else), frees the fixture.  Returns 0 or -1. */
int sock_dir_teardown(void **state);

/* Has the started server `ts` serve its store on the fixture's socket
 * too (asserts that it listens). */
void sock_dir_listen(const fixture *f, tl_server *ts);

#endif /* HR_SOCK_DIR_H */
