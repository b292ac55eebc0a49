/*
 * Small helpers several test programs share (tests/unix, tests/gpu,
 * tests/metrics, tests/fabric, tests/inproc): counting this process's
 * descriptors to prove nothing leaked, the descriptor of a plain byte
 * tensor, and reading one sample from a Prometheus exposition text.
 * Link with LIBS hr_test_util.
 */
#ifndef HR_TESTS_TEST_UTIL_H
#define HR_TESTS_TEST_UTIL_H

#include <stdint.h>

#include <hurray/tensor.h>

/* The number of open descriptors of this process (/proc/self/fd, the
 * directory's own descriptor included), or -1 when it cannot be read. */
int tu_fd_count(void);

/* The descriptor of a 1-D UINT8 ROW_MAJOR tensor of `n` bytes in one
 * buffer aligned to 2^align_log2, on device `device_tag` (HR_DEV_*). */
hr_descriptor tu_bytes_desc(uint64_t n, uint8_t align_log2,
                            uint8_t device_tag);

/* The value of the sample line of `body` that starts with `series`
 * ("name" or "name{labels}"); fails the calling cmocka test when there is
 * none. */
double tu_value(const char *body, const char *series);

#endif /* HR_TESTS_TEST_UTIL_H */
