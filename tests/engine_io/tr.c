/* A raw client's conversation with a server under test: see tr.h. */
#include "tr.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

int tr_client(tl_env *env, int port, const hr_msg *hello, uint8_t *buf,
              size_t cap) {
  int fd = tl_raw_connect(port);
  hr_msg m;

  assert_true(fd >= 0);
  if (hello)
    m = *hello;
  else
    tl_hello(&m, 0);
  assert_int_equal(tl_raw_send_msg(env, fd, &m), 0);
  assert_true(
      tl_raw_expect(env, fd, HR_MSG_SERVER_HELLO, 0, buf, cap, &m, TL_WAIT_MS));
  return fd;
}

uint32_t tr_expect_error(tl_env *env, int fd, uint32_t stream, uint32_t code,
                         uint8_t *buf, size_t cap) {
  hr_msg m;

  assert_true(
      tl_raw_expect(env, fd, HR_MSG_ERROR, stream, buf, cap, &m, TL_WAIT_MS));
  if (m.u.error.code != code)
    fprintf(stderr, "expected %s, got %s on stream %u: %.*s\n",
            hr_wire_error_name(code), hr_wire_error_name(m.u.error.code),
            m.hdr.stream_id, (int)m.u.error.message_len,
            (const char *)m.u.error.message);
  assert_int_equal(m.u.error.code, code);
  return m.hdr.stream_id;
}

void tr_expect_alive(tl_env *env, int fd, uint64_t value, uint8_t *buf,
                     size_t cap) {
  hr_msg m;

  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_PING;
  m.u.ping = value;
  assert_int_equal(tl_raw_send_msg(env, fd, &m), 0);
  assert_true(tl_raw_expect(env, fd, HR_MSG_PONG, 0, buf, cap, &m, TL_WAIT_MS));
  assert_int_equal(m.u.ping, value);
}

void tr_send_request(tl_env *env, int fd, uint32_t sid, const char *key,
                     uint32_t flags, uint8_t device, uint16_t max_shards) {
  hr_msg m;

  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_REQUEST;
  m.hdr.stream_id = sid;
  m.u.request.key = (const uint8_t *)key;
  m.u.request.key_len = (uint16_t)strlen(key);
  m.u.request.flags = flags;
  m.u.request.preferred_device = device;
  m.u.request.max_shards = max_shards;
  assert_int_equal(tl_raw_send_msg(env, fd, &m), 0);
}

void tr_put_head(hr_msg *m, uint32_t sid, const char *key, uint8_t elem,
                 uint64_t n, uint64_t bytes) {
  hr_descriptor *d = &m->u.put.desc;

  memset(m, 0, sizeof *m);
  m->hdr.type = HR_MSG_TENSOR_PUT;
  m->hdr.stream_id = sid;
  m->u.put.key = (const uint8_t *)key;
  m->u.put.key_len = (uint16_t)strlen(key);
  d->descriptor_version = 1;
  d->element_type = elem;
  d->rank = 1;
  d->shape[0] = n;
  d->layout.tag = HR_LAYOUT_ROW_MAJOR;
  d->buffer_count = 1;
  d->buffers[0].size_bytes = bytes;
  m->u.put.xport.total_data_bytes = bytes;
  m->u.put.xport.total_shards = 1;
}
