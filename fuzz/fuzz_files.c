/*
 * libFuzzer target: the tensor file readers of engine/files (.npy and
 * .safetensors), which `hurray serve` runs on files it did not write.
 *
 * Input: u8 mode, then the file's bytes.
 *   mode % 4 == 0  hr_npy_parse() of the bytes in memory, against the real
 *                  size (mode bit 2: UINT64_MAX, no size check)
 *   mode % 4 == 1  hr_npy_load() of the bytes as a file
 *   otherwise      hr_safetensors_open() of the bytes as a file, then
 *                  every tensor wrapped and read
 * Files are memfds opened through /proc/self/fd, so nothing touches the
 * disk.
 *
 * Checked: no crash, leak or UB; a parsed header's descriptor validates,
 * its data lies inside the file and its size agrees with dtype and shape;
 * a loaded tensor's bytes are readable; safetensors names are sorted and
 * unique, and no two tensors share a byte.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <hurray/files.h>
#include <hurray/tensor.h>

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The bytes as a file; writes its path to `path`.  Returns the fd. */
static int as_file(const uint8_t *p, size_t n, char *path, size_t cap) {
  int fd = memfd_create("fuzz", MFD_CLOEXEC);
  if (fd < 0)
    hr_fuzz_fail("memfd_create failed");
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0)
      hr_fuzz_fail("writing the memfd failed");
    p += w;
    n -= (size_t)w;
  }
  snprintf(path, cap, "/proc/self/fd/%d", fd);
  return fd;
}

static void check_desc(const hr_descriptor *d, uint64_t avail) {
  hr_wire_status st;
  memset(&st, 0, sizeof st);
  hr_wire_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.transport = HR_TRANSPORT_LOCAL;
  if (hr_descriptor_validate(d, NULL, &ctx, 0, &st) != 0)
    hr_fuzz_fail("a file's descriptor does not validate");
  uint64_t sizes[HR_MAX_BUFFERS];
  int n = hr_descriptor_buffer_sizes(d, sizes, &st);
  if (n != 1 || d->buffer_count != 1 || sizes[0] != d->buffers[0].size_bytes)
    hr_fuzz_fail("a file's buffer size disagrees with dtype and shape");
  if (d->buffers[0].size_bytes > avail)
    hr_fuzz_fail("a file's data runs past its end");
}

/* Reads every byte of t (ASan checks they are real). */
static uint8_t touch(hr_tensor *t) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  uint8_t sum = 0;
  for (unsigned k = 0; k < d->buffer_count; k++) {
    const uint8_t *b = hr_tensor_buffer(t, k);
    for (uint64_t i = 0; i < d->buffers[k].size_bytes; i++)
      sum ^= b[i];
  }
  return sum;
}

static void npy_parse(const uint8_t *p, size_t n, int unsized) {
  hr_npy_info info;
  char why[256];
  int rv = hr_npy_parse(p, n, unsized ? UINT64_MAX : n, &info, why, sizeof why);
  if (rv != 0) {
    if (rv != HR_ERR_INVALID_ARGUMENT && rv != HR_ERR_UNSUPPORTED)
      hr_fuzz_fail("hr_npy_parse: an undocumented return");
    return;
  }
  if (info.data_offset > n)
    hr_fuzz_fail("hr_npy_parse: the data starts past the header");
  check_desc(&info.desc, unsized ? UINT64_MAX : n - info.data_offset);
}

static void npy_load(const uint8_t *p, size_t n) {
  char path[64], why[256];
  int fd = as_file(p, n, path, sizeof path);
  hr_tensor *t = NULL;
  int rv = hr_npy_load(&t, path, NULL, why, sizeof why);
  close(fd);
  if (rv != 0) {
    if (t != NULL)
      hr_fuzz_fail("hr_npy_load failed but handed out a tensor");
    return;
  }
  check_desc(hr_tensor_descriptor(t), n);
  volatile uint8_t s = touch(t);
  (void)s;
  hr_tensor_unref(t);
}

typedef struct range {
  uint64_t begin, end;
} range;

static int by_begin(const void *a, const void *b) {
  const range *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static void safetensors(const uint8_t *p, size_t n) {
  char path[64], why[256];
  int fd = as_file(p, n, path, sizeof path);
  hr_safetensors *f = NULL;
  int rv = hr_safetensors_open(&f, path, NULL, why, sizeof why);
  close(fd);
  if (rv != 0) {
    if (rv != HR_ERR_INVALID_ARGUMENT && rv != HR_ERR_UNSUPPORTED &&
        rv != HR_ERR_NOMEM)
      hr_fuzz_fail("hr_safetensors_open: an undocumented return");
    return;
  }
  size_t count = hr_safetensors_count(f);
  range *r = calloc(count ? count : 1, sizeof *r);
  if (r == NULL)
    hr_fuzz_fail("out of memory");
  size_t nr = 0;
  for (size_t i = 0; i < count; i++) {
    const char *name = hr_safetensors_name(f, i);
    if (name == NULL)
      hr_fuzz_fail("a listed tensor has no name");
    if (i > 0 && strcmp(hr_safetensors_name(f, i - 1), name) >= 0)
      hr_fuzz_fail("safetensors names are not sorted and unique");
    hr_tensor *t = NULL;
    if (hr_safetensors_tensor(f, i, &t) != 0)
      continue;
    const hr_descriptor *d = hr_tensor_descriptor(t);
    check_desc(d, n);
    const uint8_t *b = hr_tensor_buffer(t, 0);
    uint64_t len = d->buffers[0].size_bytes;
    if (len > 0) {
      /* Where the tensor's bytes lie in the file's one mapping. */
      r[nr].begin = (uint64_t)(uintptr_t)b;
      r[nr].end = r[nr].begin + len;
      nr++;
    }
    volatile uint8_t s = touch(t);
    (void)s;
    hr_tensor_unref(t);
  }
  if (hr_safetensors_name(f, count) != NULL)
    hr_fuzz_fail("a name past the count");
  hr_safetensors_close(f);
  /* One mapping for every tensor: their addresses are comparable. */
  qsort(r, nr, sizeof *r, by_begin);
  uint64_t reach = 0;
  for (size_t i = 0; i < nr; i++) {
    if (i > 0 && r[i].begin < reach)
      hr_fuzz_fail("two safetensors tensors share bytes");
    if (r[i].end > reach)
      reach = r[i].end;
  }
  free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t mode = data[0];
  data++;
  size--;
  switch (mode % 4) {
  case 0: npy_parse(data, size, (mode >> 2) & 1); break;
  case 1: npy_load(data, size); break;
  default: safetensors(data, size); break;
  }
  return 0;
}
