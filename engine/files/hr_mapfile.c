/* Shared read-only file mappings: see hr_mapfile.h. */
#include "hr_mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hr_internal.h"

struct hr__mapfile {
  hr_mem mem;
  uint8_t *data; /* NULL for an empty file */
  uint64_t size;
  atomic_int refs;
  int fd; /* the file, read-only: the SHM plane hands it to clients */
};

void hr__files_why(char *why, size_t why_len, const char *fmt, ...) {
  va_list ap;

  if (!why || !why_len)
    return;
  va_start(ap, fmt);
  vsnprintf(why, why_len, fmt, ap);
  va_end(ap);
}

int hr__mapfile_open(hr__mapfile **out, const char *path, const hr_mem *mem,
                     char *why, size_t why_len) {
  hr__mapfile *m;
  struct stat st;
  int fd, err;

  if (!mem)
    mem = hr_mem_default();
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    hr__files_why(why, why_len, "cannot open %s: %s", path, strerror(errno));
    return HR_ERR_IO;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    err = errno;
    close(fd);
    hr__files_why(why, why_len, "%s is not a regular file%s%s", path,
                  err ? ": " : "", err ? strerror(err) : "");
    return HR_ERR_IO;
  }
  m = hr__mem_calloc(mem, 1, sizeof *m);
  if (!m) {
    close(fd);
    return HR_ERR_NOMEM;
  }
  m->mem = *mem;
  m->size = (uint64_t)st.st_size;
  if (m->size) {
    void *p = mmap(NULL, (size_t)m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      err = errno;
      close(fd);
      hr__mem_free(mem, m);
      hr__files_why(why, why_len, "cannot map %s: %s", path, strerror(err));
      return HR_ERR_IO;
    }
    /* Served files are read front to back. */
    madvise(p, (size_t)m->size, MADV_SEQUENTIAL);
    m->data = p;
  }
  /* Kept open: a server on a Unix socket passes the file itself (opened
   * O_RDONLY, so a client can never map it writable) instead of its
   * bytes (wire-v1 § 14). */
  m->fd = fd;
  atomic_init(&m->refs, 1);
  *out = m;
  return 0;
}

const uint8_t *hr__mapfile_data(const hr__mapfile *m) {
  return m->data;
}
uint64_t hr__mapfile_size(const hr__mapfile *m) {
  return m->size;
}

void hr__mapfile_ref(hr__mapfile *m) {
  atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
}

void hr__mapfile_unref(hr__mapfile *m) {
  hr_mem mem;

  if (!m || atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) != 1)
    return;
  if (m->data)
    munmap(m->data, (size_t)m->size);
  close(m->fd);
  mem = m->mem;
  hr__mem_free(&mem, m);
}

static void release_mapping(void *ctx) {
  hr__mapfile_unref(ctx);
}

int hr__mapfile_wrap(hr__mapfile *m, const hr_descriptor *d,
                     const uint8_t *data, hr_tensor **out) {
  void *bufs[1];
  int rv;

  bufs[0] = (void *)data;
  hr__mapfile_ref(m);
  rv = hr_tensor_wrap(out, d, bufs, release_mapping, m, &m->mem);
  if (rv) {
    hr__mapfile_unref(m); /* the release callback is not called then */
    return rv;
  }
  /* Where the data lies in the file is its byte_offset over SHM; data
   * not aligned for its buffer stays on frames (the call refuses it). */
  if (data)
    (void)hr_tensor_set_segment(*out, m->fd,
                                (uint64_t)(data - m->data));
  return 0;
}

int hr__files_dense_desc(hr_descriptor *d, uint8_t elem, uint8_t layout,
                         unsigned rank, const uint64_t *shape,
                         uint64_t *size_bytes) {
  uint64_t n = 1, bits = hr_elem_bits(elem), bytes;
  unsigned k;

  memset(d, 0, sizeof *d);
  d->descriptor_version = 1;
  d->element_type = elem;
  d->rank = (uint8_t)rank;
  d->layout.tag = layout;
  for (k = 0; k < rank; k++) {
    d->shape[k] = shape[k];
    if (__builtin_mul_overflow(n, shape[k], &n))
      return HR_ERR_INVALID_ARGUMENT;
  }
  if (bits == 0)
    return HR_ERR_INVALID_ARGUMENT;
  if (bits < 8)
    bytes = n / 2 + (n & 1); /* two 4-bit elements per byte */
  else if (__builtin_mul_overflow(n, bits / 8, &bytes))
    return HR_ERR_INVALID_ARGUMENT;
  d->buffer_count = 1;
  d->buffers[0].size_bytes = bytes;
  d->buffers[0].alignment_log2 = 0;
  d->buffers[0].device_tag = HR_DEV_CPU;
  d->buffers[0].memory_class = HR_MEM_STANDARD;
  d->buffers[0].sync_mode = HR_SYNC_PRODUCER_SYNCED;
  *size_bytes = bytes;
  return 0;
}
