/*
 * A minimal poll()-based hr_loop_ops, run step by step by its owner on its
 * own thread.  It backs the blocking client (<hurray/client.h>): the
 * client's calls run this loop until their operation completes, so no
 * thread is hidden behind the blocking API.
 */
#ifndef HR_PLOOP_H
#define HR_PLOOP_H

#include <hurray/engine.h>

typedef struct hr__ploop hr__ploop;

/* Creates an empty loop.  Returns 0 or HR_ERR_NOMEM. */
int hr__ploop_new(hr__ploop **out, const hr_mem *mem);
/* Frees the loop (after the engine using it was deleted). */
void hr__ploop_del(hr__ploop *l);
/* Fills the ops that drive `l` (loop_data: `l`; no release hook). */
void hr__ploop_ops(hr_loop_ops *ops);
/* The engine events are dispatched to. */
void hr__ploop_set_engine(hr__ploop *l, hr_engine *e);
/* Monotonic now in ns. */
hr_tstamp hr__ploop_now(void);
/*
 * Waits up to `max_ms` (-1: until something happens) for readiness or
 * the engine's timer, and dispatches what happened to the engine.
 * Returns 0, HR_ERR_IO (poll failed), or the engine's fatal error.
 */
int hr__ploop_step(hr__ploop *l, int max_ms);

#endif /* HR_PLOOP_H */
