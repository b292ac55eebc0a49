/*
 * The libevent binding's timers: a sub-millisecond deadline (a fabric
 * without a wait object polling every 50 us) is armed on a timerfd, since
 * libevent's epoll backend rounds timeouts up to whole milliseconds; longer
 * ones, zero and "none" use libevent's timer, and only one of the two is
 * armed at a time.  The binding's file is compiled into this test so that
 * its loop operations can be called directly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

/* The library has its own hr_ev_attach: this copy gets another name. */
#define hr_ev_attach test_ev_attach
#include "engine/ev/hr_ev.c"

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct fixture {
  struct event_base *base;
  hr_engine *e; /* an idle engine for the timeouts to land in */
  ev_binding *b;
} fixture;

static int setup(void **state) {
  fixture *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  fx->base = event_base_new();
  assert_non_null(fx->base);
  assert_int_equal(test_ev_attach(&fx->e, fx->base, NULL, NULL), 0);
  /* A second binding on the same base, driven by hand. */
  fx->b = calloc(1, sizeof *fx->b);
  assert_non_null(fx->b);
  fx->b->mem = *hr_mem_default();
  fx->b->base = fx->base;
  fx->b->tfd = -1;
  fx->b->engine = fx->e;
  fx->b->timer = evtimer_new(fx->base, on_timer, fx->b);
  assert_non_null(fx->b->timer);
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fixture *fx = *state;
  ev_release(fx->b); /* frees the binding */
  hr_engine_del(fx->e);
  event_base_free(fx->base);
  free(fx);
  return 0;
}

static void sub_ms_uses_timerfd(void **state) {
  fixture *fx = *state;
  ev_binding *b = fx->b;
#ifdef __linux__
  assert_int_equal(ev_timer_ns(b, 200000), 0);
  assert_true(b->tfd >= 0);
  assert_true(b->tfd_armed);
  assert_false(evtimer_pending(b->timer, NULL));
  /* One loop turn: it returns when the timerfd fires, which clears it. */
  uint64_t t0 = mono_ns();
  assert_int_equal(event_base_loop(fx->base, EVLOOP_ONCE), 0);
  assert_true(mono_ns() - t0 >= 150000);
  assert_false(b->tfd_armed);
  /* Fired, it is no event of the base's any more: an idle binding lets
   * event_base_dispatch() return. */
  assert_false(event_pending(b->tfd_ev, EV_READ, NULL));
  /* Armed again, then replaced by a long deadline: libevent's timer. */
  assert_int_equal(ev_timer_ns(b, 300000), 0);
  assert_true(b->tfd_armed);
  assert_int_equal(ev_timer_ns(b, 5000000), 0);
  assert_false(b->tfd_armed);
  assert_true(evtimer_pending(b->timer, NULL));
  /* And back: the libevent timer goes. */
  assert_int_equal(ev_timer_ns(b, 100000), 0);
  assert_true(b->tfd_armed);
  assert_false(evtimer_pending(b->timer, NULL));
  /* The millisecond interface disarms the timerfd. */
  assert_int_equal(ev_timer(b, 3), 0);
  assert_false(b->tfd_armed);
  assert_true(evtimer_pending(b->timer, NULL));
  /* No deadline: nothing armed; a disarmed timerfd never fires. */
  assert_int_equal(ev_timer_ns(b, 50000), 0);
  assert_int_equal(ev_timer_ns(b, -1), 0);
  assert_false(b->tfd_armed);
  assert_false(event_pending(b->tfd_ev, EV_READ, NULL));
  assert_false(evtimer_pending(b->timer, NULL));
  struct timeval tv = {0, 2000};
  assert_int_equal(event_base_loopexit(fx->base, &tv), 0);
  assert_int_equal(event_base_loop(fx->base, 0), 0);
  uint64_t ticks;
  assert_int_equal(read(b->tfd, &ticks, sizeof ticks), -1);
#else
  skip();
#endif
}

static void zero_and_long_use_libevent(void **state) {
  fixture *fx = *state;
  ev_binding *b = fx->b;
  /* Zero is the next loop turn (libevent's own zero timeout). */
  assert_int_equal(ev_timer_ns(b, 0), 0);
  assert_int_equal(b->tfd, -1);
  assert_true(evtimer_pending(b->timer, NULL));
  assert_int_equal(ev_timer_ns(b, 2000000), 0);
  assert_int_equal(b->tfd, -1); /* never opened for long deadlines */
  assert_true(evtimer_pending(b->timer, NULL));
  assert_int_equal(ev_timer_ns(b, -1), 0);
  assert_false(evtimer_pending(b->timer, NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(sub_ms_uses_timerfd, setup, teardown),
      cmocka_unit_test_setup_teardown(zero_and_long_use_libevent, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
