/*
 * The asynchronous operation queue of the backends whose streams are
 * worker threads (sim, vulkan): a stream is one thread executing its
 * queue of operations in order; an event record is a completion point
 * that the stream's thread marks reached when it gets there, and a wait
 * on an event blocks the waiting stream's thread until the point is
 * reached.  The queue, the worker loop, the points' lifetime, events,
 * host functions and the wrappers of native objects live here; what an
 * operation does when its thread reaches it is the backend's (exec).
 *
 * One mutex and one condition variable per device (hr__gpu_opq.mu/cv)
 * guard every queue, point and counter; a backend may guard its own
 * per-stream state with them too.
 */
#ifndef HR_GPU_OPQ_H
#define HR_GPU_OPQ_H

#include <pthread.h>

#include "hr_gpu_int.h"

typedef struct hr__gpu_opq hr__gpu_opq;

enum {
  HR__GPU_OP_COPY,
  HR__GPU_OP_HOST_FN,
  HR__GPU_OP_RECORD,
  HR__GPU_OP_WAIT
};

/* A completion point: one recording of an event.  Freed (after the
 * backend's point_fini) when the last of the event, the record op and the
 * wait ops and waiters that refer to it lets go.  A backend's point
 * starts with this. */
typedef struct hr__gpu_qpoint {
  int reached; /* the stream's thread reached the record (set by exec) */
  int refs;
} hr__gpu_qpoint;

/* An operation; a backend's operation starts with this. */
typedef struct hr__gpu_qop {
  struct hr__gpu_qop *next;
  int kind;          /* HR__GPU_OP_* */
  hr_gpu_host_fn fn; /* HOST_FN */
  void *arg;
  hr__gpu_qpoint *point; /* RECORD: to mark reached; WAIT: waited for */
} hr__gpu_qop;

/* A stream; a backend's stream starts with this.  A wrapper of a native
 * stream (hr__gpu_opq_wrap_native) has `target` set and no thread. */
typedef struct hr__gpu_qstream {
  hr__gpu_opq *q;
  struct hr__gpu_qstream *target;
  pthread_t thread;
  hr__gpu_qop *head, *tail;
  uint64_t enqueued, completed; /* op counts */
  int stop;
} hr__gpu_qstream;

/* An event: its latest recording, or a wrapper of another event. */
typedef struct hr__gpu_qevent {
  struct hr__gpu_qevent *target;
  hr__gpu_qpoint *last;
} hr__gpu_qevent;

typedef struct hr__gpu_opq_cbs {
  size_t stream_size, op_size, point_size; /* of the backend's types */
  /* Executes `op` on its stream's thread; q->mu is held on entry and
   * exit (it may be released in between).  A RECORD sets op->point's
   * `reached`. */
  void (*exec)(hr__gpu_qstream *s, hr__gpu_qop *op);
  /* After exec, before the op is freed (its point already let go);
   * q->mu held.  NULL: nothing to do. */
  void (*op_fini)(hr__gpu_qstream *s, hr__gpu_qop *op);
  /* Before a point is freed; q->mu held.  NULL: nothing to do. */
  void (*point_fini)(hr__gpu_opq *q, hr__gpu_qpoint *p);
} hr__gpu_opq_cbs;

/* Embedded first in the backend's device, so that a callback given `q`
 * may cast it back. */
struct hr__gpu_opq {
  hr_mem mem;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const hr__gpu_opq_cbs *cbs;
};

/* 0, or HR_ERR_IO (no mutex or condition variable). */
int hr__gpu_opq_init(hr__gpu_opq *q, const hr_mem *mem,
                     const hr__gpu_opq_cbs *cbs);
void hr__gpu_opq_fini(hr__gpu_opq *q);

/* The stream or event a wrapper stands for (itself when none). */
hr__gpu_qstream *hr__gpu_opq_stream_real(void *sp);
hr__gpu_qevent *hr__gpu_opq_event_real(void *ep);

/* Starts the thread of `s` (zeroed but for the backend's own fields):
 * 0, or HR_ERR_IO with nothing started. */
int hr__gpu_opq_stream_start(hr__gpu_opq *q, hr__gpu_qstream *s);
/* Lets the thread of `s` finish what is queued, then joins it. */
void hr__gpu_opq_stream_stop(hr__gpu_qstream *s);
/* Waits until `s` completed what was enqueued on it so far; q->mu held. */
void hr__gpu_opq_stream_idle_locked(hr__gpu_qstream *s);

/* A zeroed op of the backend's size and `kind`, or NULL. */
hr__gpu_qop *hr__gpu_opq_op_new(hr__gpu_opq *q, int kind);
/* Appends `op` to the stream `sp` stands for; takes q->mu. */
void hr__gpu_opq_push(hr__gpu_opq *q, void *sp, hr__gpu_qop *op);
/* Blocks until `p` is reached; q->mu held. */
void hr__gpu_opq_point_wait_locked(hr__gpu_opq *q, hr__gpu_qpoint *p);
/* Drops a reference to `p` (NULL: none); q->mu held. */
void hr__gpu_opq_point_unref_locked(hr__gpu_opq *q, hr__gpu_qpoint *p);

/* The entries of hr_gpu_ops that every such backend does alike, for its
 * ops table as they are: `dev` is the backend's device, which begins with
 * its hr__gpu_opq. */
int hr__gpu_opq_event_new(void *dev, unsigned flags, void **out);
void hr__gpu_opq_event_del(void *dev, void *ep);
int hr__gpu_opq_event_record(void *dev, void *ep, void *sp);
int hr__gpu_opq_stream_wait_event(void *dev, void *sp, void *ep);
int hr__gpu_opq_host_fn(void *dev, void *sp, hr_gpu_host_fn fn, void *arg);
void *hr__gpu_opq_native(void *dev, int what, void *obj);
int hr__gpu_opq_wrap_native(void *dev, int what, void *native, void **out);
/* The latest recording of `ep` once reached, with a reference the caller
 * drops (hr__gpu_opq_point_unref_locked); NULL when never recorded. */
hr__gpu_qpoint *hr__gpu_opq_event_reach(hr__gpu_opq *q, void *ep);

#endif
