/*
 * The worker pool and the socket helpers: jobs run off the calling
 * thread and come back on the completion list with an eventfd wake-up;
 * address parsing accepts exactly the documented forms.
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/io/hr_pool.h"
#include "engine/io/hr_sock.h"

typedef struct tjob {
  hr__job base;
  pthread_t ran_on;
  uint64_t in, out;
} tjob;

static void run(hr__job *j) {
  tjob *t = (tjob *)j;
  uint64_t x = t->in, k;
  for (k = 0; k < 1000; k++)
    x = x * 6364136223846793005ull + 1442695040888963407ull;
  t->out = x;
  t->ran_on = pthread_self();
}

static uint64_t expect(uint64_t x) {
  uint64_t k;
  for (k = 0; k < 1000; k++)
    x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}

static void test_pool_completes_everything(void **state) {
  enum { N = 2000 };
  static tjob jobs[N];
  int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  hr__pool *p;
  size_t got = 0, i;
  int seen[N];

  (void)state;
  assert_true(efd >= 0);
  assert_int_equal(hr__pool_new(&p, 4, efd, NULL), 0);
  memset(seen, 0, sizeof seen);
  for (i = 0; i < N; i++) {
    jobs[i].base.run = run;
    jobs[i].in = i;
    assert_int_equal(hr__pool_submit(p, &jobs[i].base), 0);
  }
  assert_int_equal(hr__pool_pending(p), N);
  while (got < N) {
    struct pollfd pfd = {efd, POLLIN, 0};
    uint64_t v;
    hr__job *l;
    assert_int_equal(poll(&pfd, 1, 30000), 1);
    assert_int_equal(read(efd, &v, sizeof v), sizeof v);
    for (l = hr__pool_take_done(p); l; l = l->next) {
      tjob *t = (tjob *)l;
      size_t idx = (size_t)(t - jobs);
      assert_true(idx < N);
      assert_int_equal(seen[idx], 0);
      seen[idx] = 1;
      assert_int_equal(t->out, expect(t->in));
      assert_false(pthread_equal(t->ran_on, pthread_self()));
      got++;
    }
  }
  assert_int_equal(hr__pool_pending(p), 0);
  hr__pool_del(p);
  close(efd);
}

static void test_pool_del_runs_queued(void **state) {
  enum { N = 64 };
  static tjob jobs[N];
  int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  hr__pool *p;
  size_t i;

  (void)state;
  assert_int_equal(hr__pool_new(&p, 1, efd, NULL), 0);
  for (i = 0; i < N; i++) {
    jobs[i].base.run = run;
    jobs[i].in = i + 7;
    jobs[i].out = 0;
    assert_int_equal(hr__pool_submit(p, &jobs[i].base), 0);
  }
  hr__pool_del(p); /* joins after the queue ran */
  for (i = 0; i < N; i++)
    assert_int_equal(jobs[i].out, expect(i + 7));
  close(efd);
}

static void test_pool_lazy_threads(void **state) {
  int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  hr__pool *p;

  (void)state;
  /* No submission: no thread; deleting is immediate. */
  assert_int_equal(hr__pool_new(&p, 8, efd, NULL), 0);
  assert_null(hr__pool_take_done(p));
  hr__pool_del(p);
  close(efd);
}

/* ---- detachable jobs ---------------------------------------------------- */

/* A detachable job's io: `in` read, `out` and `held` (a heap block, as
 * getaddrinfo()'s answer is) written.  Gated jobs wait for the gate. */
typedef struct dio {
  int gated;
  uint64_t in, out;
  void *held;
} dio;

typedef struct djob {
  hr__job base;
  dio io;
} djob;

static pthread_mutex_t dmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dcv = PTHREAD_COND_INITIALIZER;
static int dgate_open;
static atomic_int dstarted, dran, ddropped;

static void dgate(int open) {
  pthread_mutex_lock(&dmu);
  dgate_open = open;
  pthread_cond_broadcast(&dcv);
  pthread_mutex_unlock(&dmu);
}

static void drun(void *v) {
  dio *io = v;

  atomic_fetch_add(&dstarted, 1);
  if (io->gated) {
    pthread_mutex_lock(&dmu);
    while (!dgate_open)
      pthread_cond_wait(&dcv, &dmu);
    pthread_mutex_unlock(&dmu);
  }
  io->out = expect(io->in);
  io->held = malloc(64);
  atomic_fetch_add(&dran, 1);
}

static void ddrop(void *v) {
  dio *io = v;

  free(io->held);
  atomic_fetch_add(&ddropped, 1);
}

static void djob_init(djob *d, uint64_t in, int gated) {
  memset(d, 0, sizeof *d);
  d->base.run_io = drun;
  d->base.drop_io = ddrop;
  d->base.io = &d->io;
  d->base.io_len = sizeof d->io;
  d->io.in = in;
  d->io.gated = gated;
}

/* A detachable job that completes is copied back into its io and comes
 * back as any other; one with an io above the limit is refused. */
static void test_pool_detachable_completes(void **state) {
  int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  djob d, big;
  hr__pool *p;
  hr__job *got = NULL;

  (void)state;
  assert_int_equal(hr__pool_new(&p, 2, efd, NULL), 0);
  djob_init(&d, 11, 0);
  assert_int_equal(hr__pool_submit(p, &d.base), 0);
  djob_init(&big, 1, 0);
  big.base.io_len = HR__POOL_IO_MAX + 1;
  assert_int_equal(hr__pool_submit(p, &big.base), HR_ERR_INVALID_ARGUMENT);
  while (!got) {
    struct pollfd pf = {efd, POLLIN, 0};
    poll(&pf, 1, 1000);
    got = hr__pool_take_done(p);
  }
  assert_ptr_equal(got, &d.base);
  assert_null(got->next);
  assert_int_equal(d.io.out, expect(11));
  assert_non_null(d.io.held);
  free(d.io.held);
  assert_int_equal(hr__pool_pending(p), 0);
  hr__pool_del(p);
  close(efd);
}

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* hr__pool_del() while detachable jobs block both workers: it returns at
 * once; a detachable job still queued never runs; a plain job still
 * queued runs all the same (on the calling thread, no worker being left);
 * the blocked workers drop their results when they are let go
 * (LeakSanitizer would report the blocks otherwise).  The jobs' memory is
 * the caller's and may go right after the call. */
static void test_pool_del_abandons_detachable(void **state) {
  int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  djob *held[2], *queued;
  tjob plain;
  hr__pool *p;
  uint64_t t0;
  int ran, dropped, i;

  (void)state;
  dgate(0);
  ran = atomic_load(&dran);
  dropped = atomic_load(&ddropped);
  atomic_store(&dstarted, 0);
  assert_int_equal(hr__pool_new(&p, 2, efd, NULL), 0);
  for (i = 0; i < 2; i++) {
    held[i] = malloc(sizeof *held[i]);
    assert_non_null(held[i]);
    djob_init(held[i], 5 + (uint64_t)i, 1);
    assert_int_equal(hr__pool_submit(p, &held[i]->base), 0);
  }
  while (atomic_load(&dstarted) < 2)
    usleep(1000);
  queued = malloc(sizeof *queued);
  assert_non_null(queued);
  djob_init(queued, 7, 0);
  assert_int_equal(hr__pool_submit(p, &queued->base), 0);
  memset(&plain, 0, sizeof plain);
  plain.base.run = run;
  plain.in = 9;
  assert_int_equal(hr__pool_submit(p, &plain.base), 0);
  t0 = mono_ms();
  hr__pool_del(p);
  assert_true(mono_ms() - t0 < 2000);
  assert_int_equal(plain.out, expect(9));
  for (i = 0; i < 2; i++)
    free(held[i]);
  free(queued);
  assert_int_equal(atomic_load(&dran), ran);
  dgate(1);
  for (t0 = mono_ms(); atomic_load(&ddropped) < dropped + 2 &&
                       mono_ms() - t0 < 5000;)
    usleep(1000);
  assert_int_equal(atomic_load(&ddropped), dropped + 2);
  assert_int_equal(atomic_load(&dran), ran + 2); /* the queued one: never */
  assert_int_equal(atomic_load(&dstarted), 2);
  close(efd);
}

static void test_addr_parse(void **state) {
  hr__addr a;

  (void)state;
  assert_int_equal(hr__addr_parse("127.0.0.1:7474", 0, &a), 0);
  assert_string_equal(a.host, "127.0.0.1");
  assert_int_equal(a.port, 7474);
  assert_int_equal(hr__addr_parse("hurray://localhost:0", 1, &a), 0);
  assert_string_equal(a.host, "localhost");
  assert_int_equal(a.port, 0);
  assert_int_equal(hr__addr_parse("hurray://[::1]:80/", 1, &a), 0);
  assert_string_equal(a.host, "::1");
  assert_int_equal(a.port, 80);
  assert_int_equal(hr__addr_parse("hurray://h:1", 0, &a),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr__addr_parse("http://h:1", 1, &a),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr__addr_parse("h", 1, &a), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr__addr_parse(":1", 1, &a), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr__addr_parse("h:", 1, &a), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr__addr_parse("h:65536", 1, &a), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr__addr_parse("h:-1", 1, &a), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr__addr_parse("h:1x", 1, &a), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr__addr_parse("::1:80", 1, &a), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr__addr_parse("[::1]80", 1, &a), HR_ERR_INVALID_ARGUMENT);
}

static void test_listen_port0(void **state) {
  hr__addr a;
  int fd, port, c, inprog = 0;

  (void)state;
  assert_int_equal(hr__addr_parse("127.0.0.1:0", 0, &a), 0);
  fd = hr__sock_listen(&a, NULL, 0);
  assert_true(fd >= 0);
  port = hr__sock_local_port(fd);
  assert_true(port > 0);
  a.port = (uint16_t)port;
  c = hr__sock_connect(&a, &inprog, NULL, 0);
  assert_true(c >= 0);
  {
    struct pollfd pfd = {c, POLLOUT, 0};
    assert_int_equal(poll(&pfd, 1, 5000), 1);
  }
  assert_int_equal(hr__sock_connect_result(c), 0);
  close(c);
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_completes_everything),
      cmocka_unit_test(test_pool_del_runs_queued),
      cmocka_unit_test(test_pool_lazy_threads),
      cmocka_unit_test(test_pool_detachable_completes),
      cmocka_unit_test(test_pool_del_abandons_detachable),
      cmocka_unit_test(test_addr_parse),
      cmocka_unit_test(test_listen_port0),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
