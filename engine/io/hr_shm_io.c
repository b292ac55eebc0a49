/*
 * The SHM data plane's system side (wire-v1 § 14): shared segments
 * (sealed memfds), descriptors over a Unix socket (SCM_RIGHTS), and the
 * client's read-only mapping of what it receives.  The protocol side is in
 * engine/core/hr_shm.c; the engine reaches this file through a few hook
 * lines in conn_read/conn_flush and the session callbacks.
 *
 * Segments.  A segment is a memfd created with MFD_ALLOW_SEALING and
 * sealed against shrinking and growing (and further sealing) before its
 * first use.  We keep only our writable mapping: the fd we keep for the
 * tensor, and so hand to clients, is a read-only reopening of the memfd
 * (/proc/self/fd/N, O_RDONLY), so a client can never map our bytes
 * writable (a MAP_SHARED, PROT_WRITE mapping of an O_RDONLY fd fails).
 *
 * Client mapping policy (docs/internals/shm.md): the fd must be a regular
 * file holding offset + len bytes; a sealable file must carry F_SEAL_SHRINK
 * (else a server could truncate it under us: SIGBUS); a file that cannot
 * take seals (a .npy on disk, F_GET_SEALS: EINVAL, or a tmpfs file whose
 * only seal is F_SEAL_SEAL) is accepted, as the server serves a file it
 * maps itself.
 */

#include <hurray/shm.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/hr_core.h"
#include "hr_internal.h"
#include "hr_shm_io.h"

#define PAGE ((uint64_t)4096)

/* Maps `len` bytes of `fd` from file offset `foff` (page-aligned) so that
 * byte `delta` of the mapping is aligned to `align`.  Returns the
 * mapping's start or MAP_FAILED. */
static void *map_aligned(int fd, uint64_t foff, size_t len, int prot,
                         uint64_t delta, uint64_t align) {
  if (align <= PAGE && delta % align == 0)
    return mmap(NULL, len, prot, MAP_SHARED, fd, (off_t)foff);
  /* Reserve enough address space to slide into alignment, then map the
   * file over the aligned spot and give back the rest. */
  size_t extra = (size_t)align;
  uint8_t *r = mmap(NULL, len + extra, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED)
    return MAP_FAILED;
  uintptr_t want = ((uintptr_t)r + (uintptr_t)delta + (uintptr_t)align - 1) &
                   ~((uintptr_t)align - 1);
  uint8_t *at = (uint8_t *)(want - (uintptr_t)delta);
  if (at < r)
    at += align; /* stays page-aligned: align and delta are */
  void *m = mmap(at, len, prot, MAP_SHARED | MAP_FIXED, fd, (off_t)foff);
  if (m == MAP_FAILED) {
    munmap(r, len + extra);
    return MAP_FAILED;
  }
  if (at > r)
    munmap(r, (size_t)(at - r));
  uint8_t *end = at + ((len + PAGE - 1) & ~(PAGE - 1));
  if (end < r + len + extra)
    munmap(end, (size_t)(r + len + extra - end));
  return m;
}

/* ---- segments --------------------------------------------------------- */

typedef struct seg {
  void *addr;
  size_t len;
  int fd; /* read-only */
  hr_mem mem;
} seg;

static void seg_release(void *ctx) {
  seg *g = ctx;
  if (g->addr && g->len)
    munmap(g->addr, g->len);
  if (g->fd >= 0)
    close(g->fd);
  hr_mem mem = g->mem;
  hr__mem_free(&mem, g);
}

int hr__shm_segment_new(uint64_t size, uint64_t align, void **addr, int *ro_fd,
                        size_t *map_len) {
  return hr__shm_segment_named("hurray-segment", size, align, addr, ro_fd,
                               map_len);
}

int hr__shm_segment_named(const char *name, uint64_t size, uint64_t align,
                          void **addr, int *ro_fd, size_t *map_len) {
  size_t len = (size_t)((size + PAGE - 1) & ~(PAGE - 1));
  if (size > SIZE_MAX - PAGE)
    return HR_ERR_NOMEM;
  if (len == 0)
    len = (size_t)PAGE;
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return errno == ENOMEM ? HR_ERR_NOMEM : HR_ERR_IO;
  int rv = HR_ERR_IO;
  if (ftruncate(fd, (off_t)len) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    goto fail;
  void *m = map_aligned(fd, 0, len, PROT_READ | PROT_WRITE, 0, align);
  if (m == MAP_FAILED) {
    rv = HR_ERR_NOMEM;
    goto fail;
  }
#ifdef MADV_HUGEPAGE
  /* Advice only: honoured where shmem_enabled allows huge pages. */
  if (len >= ((size_t)2 << 20))
    (void)madvise(m, len, MADV_HUGEPAGE);
#endif
  /* What we hand out: the same file, opened read-only. */
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int ro = open(path, O_RDONLY | O_CLOEXEC);
  if (ro < 0) {
    munmap(m, len);
    goto fail;
  }
  close(fd);
  *addr = m;
  *ro_fd = ro;
  *map_len = len;
  return 0;
fail:
  close(fd);
  return rv;
}

int hr_shm_tensor_alloc(hr_tensor **out, const hr_descriptor *desc,
                        const hr_mem *mem) {
  if (!out || !desc || desc->layout.tag == HR_LAYOUT_COMPOSITE ||
      desc->buffer_count > HR_MAX_BUFFERS)
    return HR_ERR_INVALID_ARGUMENT;
  const hr_mem *m = mem ? mem : hr_mem_default();
  /* § 7.1 placement from offset 0: the segment is the tensor. */
  uint64_t off[HR_MAX_BUFFERS], pos, align;
  if (hr__tensor_placement(desc, 0, off, &pos, &align))
    return HR_ERR_INVALID_ARGUMENT;
  seg *g = hr__mem_calloc(m, 1, sizeof *g);
  if (!g)
    return HR_ERR_NOMEM;
  g->mem = *m;
  g->fd = -1;
  int rv = hr__shm_segment_new(pos, align, &g->addr, &g->fd, &g->len);
  if (rv) {
    hr__mem_free(m, g);
    return rv;
  }
  void *bufs[HR_MAX_BUFFERS];
  for (unsigned k = 0; k < desc->buffer_count; k++)
    bufs[k] = (uint8_t *)g->addr + off[k];
  rv = hr_tensor_wrap(out, desc, bufs, seg_release, g, m);
  if (rv) {
    seg_release(g);
    return rv;
  }
  rv = hr_tensor_set_segment(*out, g->fd, 0);
  if (rv) {
    hr_tensor_unref(*out);
    *out = NULL;
  }
  return rv;
}

int hr_shm_tensor_copy(hr_tensor **out, const hr_tensor *t,
                       const hr_mem *mem) {
  if (!out || !t || hr_tensor_member_count(t))
    return HR_ERR_INVALID_ARGUMENT;
  const hr_descriptor *d = hr_tensor_descriptor(t);
  int rv = hr_shm_tensor_alloc(out, d, mem);
  if (rv)
    return rv;
  for (unsigned k = 0; k < d->buffer_count; k++)
    if (d->buffers[k].size_bytes)
      memcpy(hr_tensor_buffer(*out, k), hr_tensor_buffer(t, k),
             (size_t)d->buffers[k].size_bytes);
  return 0;
}

/* ---- the client's mapping -------------------------------------------- */

typedef struct cmap {
  void *addr;
  size_t len;
  int wake_fd; /* a dup of the engine's eventfd, or -1 */
} cmap;

static void cmap_unmap(void *ctx) {
  cmap *c = ctx;
  if (c->addr)
    munmap(c->addr, c->len);
  if (c->wake_fd >= 0) {
    /* The session owes a BUFFER_RELEASE: run the loop.  The dup keeps the
     * eventfd alive even if the engine is already gone. */
    uint64_t one = 1;
    ssize_t w;
    do {
      w = write(c->wake_fd, &one, sizeof one);
    } while (w < 0 && errno == EINTR);
    close(c->wake_fd);
  }
  free(c); /* any thread, maybe after the engine */
}

int hr__shm_map(int fd, uint64_t offset, uint64_t len, uint64_t align,
                int wake_fd, hr_shm_mapping *out, char *why, size_t why_len) {
  struct stat sb;
  uint64_t end;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    snprintf(why, why_len, "the descriptor is not a regular file");
    return -1;
  }
  if (!hr__add_u64(offset, len, &end) || sb.st_size < 0 ||
      (uint64_t)sb.st_size < end) {
    snprintf(why, why_len,
             "segment of %lld bytes is smaller than offset + length "
             "%llu",
             (long long)sb.st_size, (unsigned long long)end);
    return -1;
  }
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals >= 0 && !(seals & F_SEAL_SHRINK) && seals != F_SEAL_SEAL) {
    /* Sealable but not sealed: the server could truncate it. */
    snprintf(why, why_len, "segment not sealed against shrinking");
    return -1;
  }
  if (seals < 0 && errno != EINVAL) {
    snprintf(why, why_len, "F_GET_SEALS: %s", strerror(errno));
    return -1;
  }
  cmap *c = calloc(1, sizeof *c); /* freed on any thread */
  if (!c) {
    snprintf(why, why_len, "out of memory");
    return -1;
  }
  c->wake_fd = -1;
  if (len) {
    uint64_t foff = offset & ~(PAGE - 1), delta = offset - foff;
    if (delta + len > SIZE_MAX) {
      free(c);
      snprintf(why, why_len, "segment too large to map");
      return -1;
    }
    void *m = map_aligned(fd, foff, (size_t)(delta + len), PROT_READ, delta,
                          align ? align : 1);
    if (m == MAP_FAILED) {
      snprintf(why, why_len, "mmap: %s", strerror(errno));
      free(c);
      return -1;
    }
    c->addr = m;
    c->len = (size_t)(delta + len);
    out->base = (uint8_t *)m + delta;
  } else {
    out->base = NULL;
  }
  if (wake_fd >= 0)
    c->wake_fd = fcntl(wake_fd, F_DUPFD_CLOEXEC, 0);
  out->unmap = cmap_unmap;
  out->ctx = c;
  return 0;
}

/* ---- descriptors over the socket ---------------------------------------- */

ssize_t hr__shm_recv(int sock, void *buf, size_t len, int *fds, size_t *nfds) {
  union {
    struct cmsghdr align;
    char b[CMSG_SPACE(sizeof(int) * HR_SHM_MAX_FDS)];
  } cbuf;
  struct iovec iov = {buf, len};
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf.b;
  mh.msg_controllen = sizeof cbuf.b;
  *nfds = 0;
  ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  if (n < 0)
    return n;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
      continue;
    size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    int tmp[HR_SHM_MAX_FDS];
    if (k > HR_SHM_MAX_FDS)
      k = HR_SHM_MAX_FDS;
    memcpy(tmp, CMSG_DATA(cm), k * sizeof(int));
    for (size_t i = 0; i < k; i++) {
      if (*nfds < HR_SHM_MAX_FDS)
        fds[(*nfds)++] = tmp[i];
      else
        close(tmp[i]);
    }
  }
  /* Descriptors the control buffer could not hold were dropped by the
   * kernel; report one more than we have so the session sees the flood. */
  if ((mh.msg_flags & MSG_CTRUNC) && *nfds < 2 && *nfds > 0) {
    int extra = fcntl(fds[0], F_DUPFD_CLOEXEC, 0);
    if (extra >= 0)
      fds[(*nfds)++] = extra;
  }
  return n;
}

ssize_t hr__shm_sendmsg(int sock, struct msghdr *mh, int fd, int flags) {
  union {
    struct cmsghdr align;
    char b[CMSG_SPACE(sizeof(int))];
  } cbuf;
  if (fd >= 0) {
    memset(&cbuf, 0, sizeof cbuf);
    mh->msg_control = cbuf.b;
    mh->msg_controllen = sizeof cbuf.b;
    struct cmsghdr *cm = CMSG_FIRSTHDR(mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
  }
  ssize_t w = sendmsg(sock, mh, flags);
  mh->msg_control = NULL;
  mh->msg_controllen = 0;
  return w;
}
