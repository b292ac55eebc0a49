/*
 * Small helpers several test programs share (tests/unix, tests/gpu,
 * tests/metrics, tests/fabric, tests/inproc): counting this process's
 * descriptors to prove nothing leaked, the descriptor of a plain byte
 * tensor, reading one sample from a Prometheus exposition text, a pipe
 * carrying one direction between two sans-IO sessions, host memory a
 * device copies to and from, a slow producer writing device memory, and
 * a device tensor's bytes compared.
 * Link with LIBS hr_test_util.
 */
#ifndef HR_TESTS_TEST_UTIL_H
#define HR_TESTS_TEST_UTIL_H

#include <stdint.h>

#include <hurray/gpu.h>
#include <hurray/session.h>
#include <hurray/tensor.h>

/* The number of open descriptors of this process (/proc/self/fd, the
 * directory's own descriptor included), or -1 when it cannot be read. */
int tu_fd_count(void);

/* The descriptor of a 1-D UINT8 ROW_MAJOR tensor of `n` bytes in one
 * buffer aligned to 2^align_log2, on device `device_tag` (HR_DEV_*). */
hr_descriptor tu_bytes_desc(uint64_t n, uint8_t align_log2, uint8_t device_tag);

/* The value of the sample line of `body` that starts with `series`
 * ("name" or "name{labels}"); fails the calling cmocka test when there is
 * none. */
double tu_value(const char *body, const char *series);

/* One direction between two sans-IO sessions in one thread: the bytes
 * the sender pulled and the receiver has not been given yet (zeroed to
 * start; tu_pipe_free() at the end). */
typedef struct tu_pipe {
  uint8_t *buf;
  size_t len, cap;
} tu_pipe;

/* Moves everything `from` has to send into `p`, then each whole message
 * in `p` into `to`, at time `now`; a message of type `drop_type` is
 * dropped instead (-1: none).  Fails the calling cmocka test when `to`
 * refuses a message.  Returns 1 when any byte moved, else 0. */
int tu_pipe_move(tu_pipe *p, hr_session *from, hr_session *to, hr_tstamp now,
                 int drop_type);

void tu_pipe_free(tu_pipe *p);

/* `n` bytes of host memory `g` copies to and from: pinned where the
 * device has pinned memory, else malloc()ed and wrapped.  Fails the
 * calling cmocka test when it cannot be had.  Free with tu_host_buf_del(). */
hr_gpu_buf *tu_host_buf(hr_gpu *g, uint64_t n);
void tu_host_buf_del(hr_gpu_buf *b);

/* A slow producer on a device (ADR-018 P2): `n` bytes of device memory
 * set to OLD, then written NEW on stream `P` after a gate of `gate_ns`
 * (the "kernel" time, slept on the host's side of the stream), its end
 * recorded in `ev`.  OLD and NEW (gt_fill() patterns 1 and 2) stay in
 * host memory for the checks.  The struct must stay where it is until
 * tu_produced_free() (the gate reads gate_ns from it). */
typedef struct tu_produced {
  hr_gpu_buf *dev, *oldb, *newb;
  hr_gpu_event *ev;
  uint64_t gate_ns;
} tu_produced;

/* Starts the producer (zeroing *pr first); fails the calling cmocka test
 * when a device step fails. */
void tu_produce(hr_gpu *g, hr_gpu_stream *P, uint64_t n, uint64_t gate_ns,
                tu_produced *pr);
/* Waits for `P` (the producer's stream), then frees what tu_produce()
 * made. */
void tu_produced_free(hr_gpu_stream *P, tu_produced *pr);

/* Whether the first `n` bytes of device tensor `t` on `g` equal `want`:
 * copied back on a stream of its own after the tensor's event, when it
 * has one.  Fails the calling cmocka test when a device step fails. */
int tu_device_equals(hr_gpu *g, hr_tensor *t, const void *want, uint64_t n);

#endif /* HR_TESTS_TEST_UTIL_H */
