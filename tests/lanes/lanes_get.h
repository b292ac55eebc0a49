/*
 * A GET on a lanes session and its completion, shared by the loopback
 * test (test_loopback.c) and the two-host probe (lanes_probe.c).
 */
#ifndef HR_LANES_GET_H
#define HR_LANES_GET_H

#include <stdint.h>

#include <hurray/engine.h>
#include <hurray/session.h>

/* What came back: `done` once the completion ran; `t` is the caller's
 * reference (NULL on failure), `rec` the transfer record. */
typedef struct got {
  int done;
  hr_tensor *t;
  hr_transfer_record rec;
} got;

/*
 * Queues a GET of `key` on the session of connection `c` (lane 0) into
 * `g` (cleared first) and flushes engine `e`: in `k` shards (0: one, no
 * HR_REQ_PARALLEL_OK), of the region at `off` with `shape` (`rank`
 * dimensions; off NULL: the whole tensor; the arrays must live until the
 * completion).  Returns 0 or hr_session_get()'s / hr_engine_flush()'s
 * error.
 */
int lanes_get_start(hr_engine *e, hr_conn *c, const char *key, uint16_t k,
                    const uint64_t *off, const uint64_t *shape, unsigned rank,
                    got *g);

#endif /* HR_LANES_GET_H */
