/*
 * The wake-up token of a device tensor imported over the SHM data plane
 * (hr_session_callbacks.shm_wake; engine/core/hr_shm_dev.c).  The tensor
 * may be dropped on any thread, after the engine is gone: the token holds
 * its own duplicate of the engine's eventfd, writes it once (the loop
 * then sends BUFFER_RELEASE) and closes it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "hr_shm_io.h"

static void wake_once(void *ctx) {
  int *fd = ctx;
  uint64_t one = 1;
  ssize_t w;
  do {
    w = write(*fd, &one, sizeof one);
  } while (w < 0 && errno == EINTR);
  close(*fd);
  free(fd); /* any thread, maybe after the engine */
}

int hr__shm_wake_token(int wake_fd, hr_shm_mapping *out) {
  if (wake_fd < 0)
    return -1;
  int *fd = malloc(sizeof *fd);
  if (!fd)
    return -1;
  *fd = fcntl(wake_fd, F_DUPFD_CLOEXEC, 0);
  if (*fd < 0) {
    free(fd);
    return -1;
  }
  out->base = NULL;
  out->unmap = wake_once;
  out->ctx = fd;
  return 0;
}
