/*
 * Device memory in a file descriptor, for the backends whose "device
 * memory" is host memory (the simulated device): a sealed memfd exported
 * read-only, and the importer's checked read-only mapping of it.  The
 * vendor backends export their drivers' own descriptors instead.
 *
 * The checks mirror the SHM plane's host segments (engine/io/hr_shm_io.c;
 * the device layer does not reach up into the engine): the importer
 * accepts a regular file holding at least the bytes it maps and sealed
 * against shrinking, so that the exporter cannot truncate it under the
 * mapping (which would turn a read into SIGBUS).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hr_gpu_int.h"

#define PAGE ((uint64_t)4096)

static size_t page_len(uint64_t size) {
  size_t len = (size_t)((size + PAGE - 1) & ~(PAGE - 1));
  return len ? len : (size_t)PAGE;
}

int hr__gpu_memfd_new(uint64_t size, hr__gpu_memfd *out) {
  memset(out, 0, sizeof *out);
  out->fd = -1;
  if (size > SIZE_MAX - PAGE)
    return HR_ERR_NOMEM;
  size_t len = page_len(size);
  int fd = memfd_create("hurray-device", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return errno == ENOMEM || errno == EMFILE ? HR_ERR_NOMEM : HR_ERR_IO;
  int rv = HR_ERR_IO;
  if (ftruncate(fd, (off_t)len) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    goto fail;
  void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    rv = HR_ERR_NOMEM;
    goto fail;
  }
  /* What another process gets: the same file opened read-only, so that
   * it can never map the producer's bytes writable. */
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int ro = open(path, O_RDONLY | O_CLOEXEC);
  if (ro < 0) {
    munmap(m, len);
    goto fail;
  }
  close(fd);
  out->addr = m;
  out->len = len;
  out->fd = ro;
  return 0;
fail:
  close(fd);
  return rv;
}

int hr__gpu_memfd_import(int fd, uint64_t size, hr__gpu_memfd *out) {
  memset(out, 0, sizeof *out);
  out->fd = -1;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0 ||
      (uint64_t)sb.st_size < size)
    return HR_ERR_PROTO;
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return HR_ERR_PROTO;
  if (size > SIZE_MAX - PAGE)
    return HR_ERR_NOMEM;
  size_t len = page_len(size);
  void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED)
    return errno == ENOMEM ? HR_ERR_NOMEM : HR_ERR_PROTO;
  out->addr = m;
  out->len = len;
  return 0;
}

void hr__gpu_memfd_free(hr__gpu_memfd *m) {
  if (m->addr)
    munmap(m->addr, m->len);
  if (m->fd >= 0)
    close(m->fd);
  m->addr = NULL;
  m->fd = -1;
}
