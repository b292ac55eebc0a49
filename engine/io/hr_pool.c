/* The worker pool: see hr_pool.h. */
#include "hr_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "hr_internal.h"

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
  pthread_t *threads;
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

static void *worker(void *arg) {
  hr__pool *p = arg;
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
  p->threads = hr__mem_calloc(mem, threads, sizeof *p->threads);
  if (!p->threads)
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
  hr__mem_free(mem, p->threads);
  hr__mem_free(mem, p);
  return HR_ERR_NOMEM;
}

int hr__pool_submit(hr__pool *p, hr__job *j) {
  /* Start the threads on first use; `started` is only touched here and in
   * hr__pool_del(), both on the loop thread. */
  while (p->started < p->want) {
    if (pthread_create(&p->threads[p->started], NULL, worker, p) != 0)
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
  unsigned i;

  if (!p)
    return;
  pthread_mutex_lock(&p->lock);
  p->stop = 1;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  for (i = 0; i < p->started; i++)
    pthread_join(p->threads[i], NULL);
  pthread_cond_destroy(&p->cond);
  pthread_mutex_destroy(&p->lock);
  hr__mem_free(&p->mem, p->threads);
  hr__mem_free(&p->mem, p);
}
