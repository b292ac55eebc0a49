/* The worker pool: see hr_pool.h. */
#include "hr_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "hr_internal.h"

/* A detachable job's state, on its worker's stack while it runs: the
 * worker moves it from RUNNING to DONE when the job returns, hr__pool_del()
 * from RUNNING to ABANDONED; whoever comes first decides. */
enum { DJ_RUNNING, DJ_DONE, DJ_ABANDONED };

typedef struct slot {
  pthread_t th;
  hr__pool *p;
  atomic_int *djob; /* the detachable job running, or NULL (under lock) */
  int abandoned;    /* hr__pool_del(): detach, do not join */
} slot;

struct hr__pool {
  hr_mem mem;
  pthread_mutex_t lock;
  pthread_cond_t cond; /* workers wait here for jobs or for `stop` */
  hr__job *queue_head, *queue_tail; /* submitted, not started */
  hr__job *done_head, *done_tail;   /* finished, not taken */
  size_t pending; /* submitted and not taken back (loop thread only) */
  int stop;
  int notify_fd;
  unsigned want;    /* threads to start */
  unsigned started; /* threads running */
  slot *slots;
};

static void notify(int fd) {
  uint64_t one = 1;
  ssize_t n;

  /* An eventfd write fails only when the counter would overflow, which
   * cannot happen with the reader draining it; EINTR is retried. */
  do {
    n = write(fd, &one, sizeof one);
  } while (n < 0 && errno == EINTR);
}

/* Appends a finished job to the completion list (the lock held).  One
 * wake-up per batch: the loop thread takes the whole list. */
static void done_push(hr__pool *p, hr__job *j) {
  int was_empty = p->done_head == NULL;

  j->next = NULL;
  if (p->done_tail)
    p->done_tail->next = j;
  else
    p->done_head = j;
  p->done_tail = j;
  if (was_empty)
    notify(p->notify_fd);
}

/* Runs detachable job `j` (taken off the queue, the lock held; returns
 * with it held again), or returns 0 without the lock when the job was
 * abandoned: then nothing of the pool or the job may be touched. */
static int run_detachable(slot *sl, hr__job *j) {
  union {
    max_align_t align;
    unsigned char b[HR__POOL_IO_MAX];
  } io;
  void (*run_io)(void *) = j->run_io, (*drop_io)(void *) = j->drop_io;
  atomic_int state = DJ_RUNNING;
  int expect = DJ_RUNNING;
  hr__pool *p = sl->p;

  memcpy(io.b, j->io, j->io_len);
  sl->djob = &state;
  pthread_mutex_unlock(&p->lock);

  /* From here until the lock is taken again `j` may be gone. */
  run_io(io.b);

  if (!atomic_compare_exchange_strong(&state, &expect, DJ_DONE)) {
    /* hr__pool_del() detached this thread and may have freed `p` and `j`
     * already. */
    drop_io(io.b);
    return 0;
  }
  pthread_mutex_lock(&p->lock);
  sl->djob = NULL;
  memcpy(j->io, io.b, j->io_len);
  done_push(p, j);
  return 1;
}

static void *worker(void *arg) {
  slot *sl = arg;
  hr__pool *p = sl->p;
  hr__job *j;

  pthread_mutex_lock(&p->lock);
  for (;;) {
    while (!p->queue_head && !p->stop)
      pthread_cond_wait(&p->cond, &p->lock);
    if (!p->queue_head)
      break; /* stop, and nothing left to run */
    j = p->queue_head;
    p->queue_head = j->next;
    if (!p->queue_head)
      p->queue_tail = NULL;
    if (!j->run) {
      if (!run_detachable(sl, j))
        return NULL;
      continue;
    }
    pthread_mutex_unlock(&p->lock);

    j->run(j);

    pthread_mutex_lock(&p->lock);
    done_push(p, j);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

int hr__pool_new(hr__pool **out, unsigned threads, int notify_fd,
                 const hr_mem *mem) {
  hr__pool *p;

  if (!mem)
    mem = hr_mem_default();
  if (threads < 1)
    threads = 1;
  p = hr__mem_calloc(mem, 1, sizeof *p);
  if (!p)
    return HR_ERR_NOMEM;
  p->mem = *mem;
  p->slots = hr__mem_calloc(mem, threads, sizeof *p->slots);
  if (!p->slots)
    goto fail;
  if (pthread_mutex_init(&p->lock, NULL) != 0)
    goto fail;
  if (pthread_cond_init(&p->cond, NULL) != 0) {
    pthread_mutex_destroy(&p->lock);
    goto fail;
  }
  p->notify_fd = notify_fd;
  p->want = threads;
  *out = p;
  return 0;
fail:
  hr__mem_free(mem, p->slots);
  hr__mem_free(mem, p);
  return HR_ERR_NOMEM;
}

int hr__pool_submit(hr__pool *p, hr__job *j) {
  /* Start the threads on first use; `started` is only touched here and in
   * hr__pool_del(), both on the loop thread. */
  if (!j->run && (!j->run_io || !j->drop_io || j->io_len > HR__POOL_IO_MAX))
    return HR_ERR_INVALID_ARGUMENT;
  while (p->started < p->want) {
    slot *sl = &p->slots[p->started];

    sl->p = p;
    if (pthread_create(&sl->th, NULL, worker, sl) != 0)
      break;
    p->started++;
  }
  if (p->started == 0)
    return HR_ERR_IO;
  j->next = NULL;
  pthread_mutex_lock(&p->lock);
  if (p->queue_tail)
    p->queue_tail->next = j;
  else
    p->queue_head = j;
  p->queue_tail = j;
  pthread_cond_signal(&p->cond);
  pthread_mutex_unlock(&p->lock);
  p->pending++;
  return 0;
}

void hr__pool_begin_async(hr__pool *p) {
  p->pending++;
}

void hr__pool_end_async(hr__pool *p) {
  p->pending--;
}

void hr__pool_post_done(hr__pool *p, hr__job *j) {
  pthread_mutex_lock(&p->lock);
  done_push(p, j);
  pthread_mutex_unlock(&p->lock);
}

hr__job *hr__pool_take_done(hr__pool *p) {
  hr__job *list, *j;

  pthread_mutex_lock(&p->lock);
  list = p->done_head;
  p->done_head = p->done_tail = NULL;
  pthread_mutex_unlock(&p->lock);
  for (j = list; j; j = j->next)
    p->pending--;
  return list;
}

int hr__pool_queued(hr__pool *p) {
  int q;

  pthread_mutex_lock(&p->lock);
  q = p->queue_head != NULL;
  pthread_mutex_unlock(&p->lock);
  return q;
}

size_t hr__pool_pending(const hr__pool *p) {
  return p->pending;
}

void hr__pool_del(hr__pool *p) {
  hr__job **pp, *j;
  unsigned i;

  if (!p)
    return;
  pthread_mutex_lock(&p->lock);
  p->stop = 1;
  /* Detachable jobs not started never run: their owner frees them. */
  p->queue_tail = NULL;
  for (pp = &p->queue_head; (j = *pp);) {
    if (!j->run) {
      *pp = j->next;
    } else {
      p->queue_tail = j;
      pp = &j->next;
    }
  }
  /* Running ones are abandoned unless they are done already (their
   * workers then wait for the lock to complete them, and are joined). */
  for (i = 0; i < p->started; i++) {
    int expect = DJ_RUNNING;

    if (p->slots[i].djob &&
        atomic_compare_exchange_strong(p->slots[i].djob, &expect,
                                       DJ_ABANDONED))
      p->slots[i].abandoned = 1;
  }
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  for (i = 0; i < p->started; i++) {
    if (p->slots[i].abandoned)
      pthread_detach(p->slots[i].th);
    else
      pthread_join(p->slots[i].th, NULL);
  }
  /* Plain jobs left in the queue found no worker (every one was
   * abandoned): they run here, as the contract says they run. */
  while ((j = p->queue_head)) {
    p->queue_head = j->next;
    j->run(j);
  }
  pthread_cond_destroy(&p->cond);
  pthread_mutex_destroy(&p->lock);
  hr__mem_free(&p->mem, p->slots);
  hr__mem_free(&p->mem, p);
}
