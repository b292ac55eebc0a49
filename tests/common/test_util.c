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

#include <hurray/wire.h>

#include "../gpu/gpu_testutil.h"

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

int tu_pipe_move(tu_pipe *p, hr_session *from, hr_session *to, hr_tstamp now,
                 int drop_type) {
  hr_iov iov[16];
  int moved = 0, n;
  while ((n = hr_session_pull(from, iov, 16, now)) > 0) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
      if (p->len + iov[i].len > p->cap) {
        p->cap = (p->len + iov[i].len) * 2;
        p->buf = realloc(p->buf, p->cap);
        assert_non_null(p->buf);
      }
      memcpy(p->buf + p->len, iov[i].base, iov[i].len);
      p->len += iov[i].len;
      total += iov[i].len;
    }
    hr_session_consumed(from, total, now);
    moved = 1;
  }
  size_t off = 0;
  while (p->len - off >= HR_HEADER_SIZE) {
    hr_msg_header h;
    hr_wire_parse_header(p->buf + off, &h);
    size_t whole = HR_HEADER_SIZE + h.payload_length;
    if (p->len - off < whole)
      break;
    if ((int)h.type != drop_type)
      assert_true(hr_session_recv(to, p->buf + off, whole, now) >= 0);
    off += whole;
    moved = 1;
  }
  if (p->len > off)
    memmove(p->buf, p->buf + off, p->len - off);
  p->len -= off;
  return moved;
}

void tu_pipe_free(tu_pipe *p) {
  free(p->buf);
  p->buf = NULL;
  p->len = p->cap = 0;
}

hr_gpu_buf *tu_host_buf(hr_gpu *g, uint64_t n) {
  hr_gpu_caps caps;
  hr_gpu_buf *b = NULL;
  assert_int_equal(hr_gpu_query(g, &caps), 0);
  if (caps.flags & HR_GPU_CAP_PINNED) {
    assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_PINNED, n, &b), 0);
  } else {
    void *p = malloc(n);
    assert_non_null(p);
    assert_int_equal(hr_gpu_buf_wrap_host(g, p, n, &b), 0);
  }
  return b;
}

void tu_host_buf_del(hr_gpu_buf *b) {
  void *p = hr_gpu_buf_host_ptr(b);
  int wrapped = hr_gpu_buf_kind(b) == HR_GPU_MEM_HOST;
  hr_gpu_buf_del(b);
  if (wrapped)
    free(p);
}

static void sleep_gate(void *arg) {
  const tu_produced *pr = arg;
  hr__test_sleep(pr->gate_ns);
}

void tu_produce(hr_gpu *g, hr_gpu_stream *P, uint64_t n, uint64_t gate_ns,
                tu_produced *pr) {
  memset(pr, 0, sizeof *pr);
  pr->gate_ns = gate_ns;
  pr->oldb = tu_host_buf(g, n);
  pr->newb = tu_host_buf(g, n);
  gt_fill(hr_gpu_buf_host_ptr(pr->oldb), n, 1);
  gt_fill(hr_gpu_buf_host_ptr(pr->newb), n, 2);
  assert_int_equal(hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, n, &pr->dev), 0);
  assert_int_equal(hr_gpu_copy_async(P, pr->dev, 0, pr->oldb, 0, n), 0);
  assert_int_equal(hr_gpu_stream_sync(P), 0);
  assert_int_equal(hr_gpu_event_new(g, 0, &pr->ev), 0);
  assert_int_equal(hr_gpu_launch_host_fn(P, sleep_gate, pr), 0);
  assert_int_equal(hr_gpu_copy_async(P, pr->dev, 0, pr->newb, 0, n), 0);
  assert_int_equal(hr_gpu_event_record(pr->ev, P), 0);
}

void tu_produced_free(hr_gpu_stream *P, tu_produced *pr) {
  assert_int_equal(hr_gpu_stream_sync(P), 0);
  hr_gpu_event_del(pr->ev);
  hr_gpu_buf_del(pr->dev);
  tu_host_buf_del(pr->oldb);
  tu_host_buf_del(pr->newb);
}

int tu_device_equals(hr_gpu *g, hr_tensor *t, const void *want, uint64_t n) {
  hr_gpu_stream *s;
  hr_gpu_buf *h;
  void *p = calloc(1, n ? n : 1);
  assert_non_null(p);
  assert_int_equal(hr_gpu_stream_new(g, &s), 0);
  assert_int_equal(hr_gpu_buf_wrap_host(g, p, n ? n : 1, &h), 0);
  hr_gpu_event *ev = hr_tensor_gpu_event(t);
  if (ev)
    assert_int_equal(hr_gpu_stream_wait_event(s, ev), 0);
  assert_int_equal(hr_gpu_copy_async(s, h, 0, hr_tensor_gpu_buf(t, 0), 0, n),
                   0);
  assert_int_equal(hr_gpu_stream_sync(s), 0);
  int eq = memcmp(p, want, n) == 0;
  hr_gpu_buf_del(h);
  hr_gpu_stream_del(s);
  free(p);
  return eq;
}
