/*
 * The engine's worker pool: N threads running jobs off the loop thread.
 *
 * Jobs are queued with hr__pool_submit() on the loop thread, run on a
 * worker (`run`), and come back on a completion list.  When the list goes
 * from empty to non-empty the pool writes to `notify_fd` (an eventfd the
 * engine watches through hr_loop_ops); the loop thread then takes the
 * finished jobs with hr__pool_take_done() and completes them there.  No
 * job ever completes on a worker thread.
 *
 * Threads start lazily on the first submission, so engines that neither
 * transcode, look up a host name nor move bulk bytes (hr_bulk.h) never
 * create a thread.
 */
#ifndef HR_POOL_H
#define HR_POOL_H

#include <hurray/common.h>

typedef struct hr__pool hr__pool;

/* One unit of work.  The pool owns `next` while the job is queued. */
typedef struct hr__job hr__job;
struct hr__job {
  void (*run)(hr__job *j); /* on a worker thread */
  hr__job *next;
  /*
   * A detachable job (a host name lookup) sets `run` to NULL and these
   * instead: hr__pool_del() does not wait for it.  The worker copies the
   * `io_len` bytes at `io` (at most HR__POOL_IO_MAX) to its own stack
   * when it starts the job and runs `run_io` on that copy, so the job's
   * memory is never touched while it runs.  When it is done it copies the
   * bytes back into `io` and completes the job as any other; but when
   * hr__pool_del() came first, the job was abandoned: the worker calls
   * `drop_io` on its copy (to free what `run_io` acquired) and exits,
   * touching neither the job nor the pool again.  The owner frees every
   * detachable job it has not taken back after hr__pool_del(); an
   * abandoned job's `io` then holds what it held when it was submitted.
   */
  void (*run_io)(void *io);
  void (*drop_io)(void *io);
  void *io;
  size_t io_len;
};

/* The most bytes a detachable job's `io` may have. */
#define HR__POOL_IO_MAX 1024

/*
 * Creates a pool of `threads` workers (>= 1) that signals completions by
 * writing 1 to the eventfd `notify_fd` (not owned).  Returns 0 or
 * HR_ERR_NOMEM / HR_ERR_IO.
 */
int hr__pool_new(hr__pool **out, unsigned threads, int notify_fd,
                 const hr_mem *mem);

/* Queues a job (starting the threads if needed).  Returns 0, HR_ERR_IO
 * (no thread could be started) or HR_ERR_INVALID_ARGUMENT (a detachable
 * job's io_len above HR__POOL_IO_MAX). */
int hr__pool_submit(hr__pool *p, hr__job *j);

/*
 * Asynchronous jobs (device copies) run nowhere in the pool: the loop
 * thread counts one with hr__pool_begin_async() before starting it, and
 * whatever finishes it (a device's completion thread, any thread) hands it
 * back with hr__pool_post_done(), which puts it on the completion list and
 * writes `notify_fd` as a worker would.  Needs no pool thread.
 */
void hr__pool_begin_async(hr__pool *p);
void hr__pool_post_done(hr__pool *p, hr__job *j);
/* Uncounts a job whose start failed (it was never posted). */
void hr__pool_end_async(hr__pool *p);

/* Takes every finished job, oldest first (NULL: none).  Loop thread. */
hr__job *hr__pool_take_done(hr__pool *p);

/* Whether jobs wait for a thread (any thread may ask: a running job
 * that would block yields to them). */
int hr__pool_queued(hr__pool *p);

/* Jobs submitted and not yet taken back. */
size_t hr__pool_pending(const hr__pool *p);

/* Stops the workers after the queued jobs ran, joins them, frees the pool.
 * Finished jobs not taken are dropped (the caller takes them first).
 * Detachable jobs are the exception: queued ones never run, and a worker
 * running one is detached, not joined (it drops the job's result and
 * exits when the job returns; see hr__job).  So the call never waits for
 * a detachable job, however long it blocks; plain jobs still queued when
 * every worker was abandoned run on the calling thread.  The pool's memory is freed
 * here: an abandoned worker needs nothing of it. */
void hr__pool_del(hr__pool *p);

#endif /* HR_POOL_H */
