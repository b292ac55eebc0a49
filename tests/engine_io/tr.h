/*
 * A raw client's conversation with a server under test
 * (tests/engine_io/test_errors.c, tests/attack/test_attack.c): the HELLO
 * exchange, the ERROR a crafted message must get, the PING that shows the
 * connection still works, and the request and PUT messages the cases
 * then spoil.  Every wait runs the loop of `env` (may be NULL) for at
 * most 5 s; `buf` (cap bytes) is the scratch the answers are read into.
 * Failures are cmocka assertions.
 */
#ifndef HR_TR_H
#define HR_TR_H

#include <stddef.h>
#include <stdint.h>

#include "tl.h"

/* A raw client of 127.0.0.1:port that sent `hello` (NULL: tl_hello()'s)
 * and read the SERVER_HELLO.  Returns the socket. */
int tr_client(tl_env *env, int port, const hr_msg *hello, uint8_t *buf,
              size_t cap);

/* Reads up to an ERROR on `stream` (UINT32_MAX: any) and asserts that its
 * code is `code`, printing the one that came instead.  Returns its
 * stream. */
uint32_t tr_expect_error(tl_env *env, int fd, uint32_t stream, uint32_t code,
                         uint8_t *buf, size_t cap);

/* The connection still works: a PING carrying `value` gets its PONG. */
void tr_expect_alive(tl_env *env, int fd, uint64_t value, uint8_t *buf,
                     size_t cap);

/* Sends a TENSOR_REQUEST for `key` on stream `sid`. */
void tr_send_request(tl_env *env, int fd, uint32_t sid, const char *key,
                     uint32_t flags, uint8_t device, uint16_t max_shards);

/* A TENSOR_PUT head for a ROW_MAJOR `elem` vector of `n` elements,
 * `bytes` bytes in one shard (the key is not copied). */
void tr_put_head(hr_msg *m, uint32_t sid, const char *key, uint8_t elem,
                 uint64_t n, uint64_t bytes);

#endif /* HR_TR_H */
