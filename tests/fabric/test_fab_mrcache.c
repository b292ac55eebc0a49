/*
 * The registration cache: hits by containment, per-device keys, LRU
 * eviction of unused entries under both caps, invalidation (immediate or
 * at the last use), refused registrations, and allocation failures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fabric/hr_fab_int.h"

/* A fake backend: counts registrations and refuses on demand. */
typedef struct backend {
  int regs, deregs, live;
  int refuse;
  int handles[64];
  int next;
} backend;

static int reg(void *ctx, void *ptr, uint64_t len, uint8_t tag, uint16_t index,
               void **handle, void **desc, char *why, size_t cap) {
  backend *b = ctx;
  (void)ptr;
  (void)len;
  (void)tag;
  (void)index;
  if (b->refuse) {
    hr__fab_why(why, cap, "refused");
    return HR_ERR_UNSUPPORTED;
  }
  b->regs++;
  b->live++;
  *handle = &b->handles[b->next++ % 64];
  *desc = *handle;
  return 0;
}

static void dereg(void *ctx, void *handle) {
  backend *b = ctx;
  (void)handle;
  b->deregs++;
  b->live--;
}

static void test_hits_and_devices(void **state) {
  (void)state;
  backend b = {0};
  hr__mrc *c;
  static uint8_t mem[1 << 16];
  assert_int_equal(hr__mrc_new(&c, reg, dereg, &b, 8, 1 << 20, NULL), 0);
  hr__mrc_entry *e1, *e2, *e3;
  char why[64];
  assert_int_equal(hr__mrc_get(c, mem, 4096, HR_DEV_CPU, 0, &e1, why, 64), 0);
  /* A sub-range of a registration is a hit. */
  assert_int_equal(hr__mrc_get(c, mem + 100, 1000, HR_DEV_CPU, 0, &e2, why, 64),
                   0);
  assert_ptr_equal(e1, e2);
  /* A range reaching past it is not. */
  assert_int_equal(hr__mrc_get(c, mem + 100, 4096, HR_DEV_CPU, 0, &e3, why, 64),
                   0);
  assert_ptr_not_equal(e3, e1);
  /* Same addresses on another device are another registration. */
  hr__mrc_entry *e4;
  assert_int_equal(hr__mrc_get(c, mem, 4096, HR_DEV_CUDA, 1, &e4, why, 64), 0);
  assert_ptr_not_equal(e4, e1);
  hr__mrc_stats st;
  hr__mrc_get_stats(c, &st);
  assert_int_equal(st.hits, 1);
  assert_int_equal(st.misses, 3);
  assert_int_equal(st.entries, 3);
  assert_int_equal(st.unused, 0);
  assert_true(hr__mrc_busy(c));
  hr__mrc_put(c, e1);
  hr__mrc_put(c, e2);
  hr__mrc_put(c, e3);
  hr__mrc_put(c, e4);
  hr__mrc_put(c, NULL);
  assert_false(hr__mrc_busy(c));
  hr__mrc_get_stats(c, &st);
  assert_int_equal(st.unused, 3);
  /* Served again: registered once. */
  for (int i = 0; i < 10; i++) {
    assert_int_equal(hr__mrc_get(c, mem, 4096, HR_DEV_CPU, 0, &e1, why, 64), 0);
    hr__mrc_put(c, e1);
  }
  assert_int_equal(b.regs, 3);
  hr__mrc_del(c);
  assert_int_equal(b.live, 0);
}

static void test_eviction(void **state) {
  (void)state;
  backend b = {0};
  hr__mrc *c;
  static uint8_t mem[16][4096];
  char why[64];
  /* At most 2 unused entries and 3 pages of unused bytes. */
  assert_int_equal(hr__mrc_new(&c, reg, dereg, &b, 2, 3 * 4096, NULL), 0);
  hr__mrc_entry *e[4];
  for (int i = 0; i < 4; i++)
    assert_int_equal(hr__mrc_get(c, mem[i], 4096, 0, 0, &e[i], why, 64), 0);
  /* In use, all four stay although the cap is 2. */
  assert_int_equal(b.live, 4);
  for (int i = 0; i < 4; i++)
    hr__mrc_put(c, e[i]);
  /* The two least recently used (0 and 1) went. */
  assert_int_equal(b.live, 2);
  hr__mrc_entry *x;
  assert_int_equal(hr__mrc_get(c, mem[3], 4096, 0, 0, &x, why, 64), 0);
  hr__mrc_put(c, x);
  assert_int_equal(b.regs, 4);
  assert_int_equal(hr__mrc_get(c, mem[0], 4096, 0, 0, &x, why, 64), 0);
  assert_int_equal(b.regs, 5);
  hr__mrc_put(c, x);
  /* mem[2] was the oldest: evicted to keep 2 entries. */
  hr__mrc_stats st;
  hr__mrc_get_stats(c, &st);
  assert_int_equal(st.evictions, 3);
  assert_int_equal(st.unused, 2);
  /* The byte cap: one 4-page registration alone is over it. */
  static uint8_t bigmem[4 * 4096];
  assert_int_equal(hr__mrc_get(c, bigmem, sizeof bigmem, 0, 0, &x, why, 64), 0);
  hr__mrc_put(c, x);
  hr__mrc_get_stats(c, &st);
  assert_true(st.unused_bytes <= 3 * 4096);
  hr__mrc_del(c);
  assert_int_equal(b.live, 0);
}

static void test_invalidate(void **state) {
  (void)state;
  backend b = {0};
  hr__mrc *c;
  static uint8_t mem[3][4096];
  char why[64];
  assert_int_equal(hr__mrc_new(&c, reg, dereg, &b, 16, 1 << 30, NULL), 0);
  hr__mrc_entry *a, *u, *z;
  assert_int_equal(hr__mrc_get(c, mem[0], 4096, 0, 0, &a, why, 64), 0);
  assert_int_equal(hr__mrc_get(c, mem[1], 4096, 0, 0, &u, why, 64), 0);
  assert_int_equal(hr__mrc_get(c, mem[2], 4096, 0, 0, &z, why, 64), 0);
  hr__mrc_put(c, a);
  hr__mrc_put(c, z);
  /* The application releases a range touching all three by one byte. */
  hr__mrc_invalidate(c, mem[0] + 4095, 4096 + 2);
  /* Unused ones close now; the one in use when its use ends. */
  assert_int_equal(b.live, 1);
  hr__mrc_entry *again;
  assert_int_equal(hr__mrc_get(c, mem[1], 16, 0, 0, &again, why, 64), 0);
  assert_ptr_not_equal(again, u); /* never found again */
  assert_int_equal(b.live, 2);
  hr__mrc_put(c, u);
  assert_int_equal(b.live, 1);
  hr__mrc_put(c, again);
  /* Empty and disjoint ranges touch nothing. */
  hr__mrc_invalidate(c, mem[1], 0);
  hr__mrc_invalidate(c, mem[2] + 4096, 100);
  assert_int_equal(b.live, 1);
  hr__mrc_stats st;
  hr__mrc_get_stats(c, &st);
  assert_int_equal(st.invalidations, 3);
  hr__mrc_del(c);
  assert_int_equal(b.live, 0);
}

static void test_refused(void **state) {
  (void)state;
  backend b = {0};
  hr__mrc *c;
  static uint8_t mem[64];
  char why[64];
  assert_int_equal(hr__mrc_new(&c, reg, dereg, &b, 16, 1 << 30, NULL), 0);
  b.refuse = 1;
  hr__mrc_entry *e;
  assert_int_equal(hr__mrc_get(c, mem, 64, 0, 0, &e, why, sizeof why),
                   HR_ERR_UNSUPPORTED);
  assert_string_equal(why, "refused");
  hr__mrc_stats st;
  hr__mrc_get_stats(c, &st);
  assert_int_equal(st.entries, 0);
  hr__mrc_del(c);
  assert_int_equal(hr__mrc_new(NULL, reg, dereg, &b, 1, 1, NULL),
                   HR_ERR_INVALID_ARGUMENT);
}

/* An allocator that fails the nth allocation. */
typedef struct failer {
  int countdown;
  int live;
} failer;
static void *f_malloc(size_t n, void *ud) {
  failer *f = ud;
  if (f->countdown-- == 0)
    return NULL;
  f->live++;
  return malloc(n);
}
static void f_free(void *p, void *ud) {
  failer *f = ud;
  if (p)
    f->live--;
  free(p);
}
static void *f_calloc(size_t m, size_t n, void *ud) {
  failer *f = ud;
  if (f->countdown-- == 0)
    return NULL;
  f->live++;
  return calloc(m, n);
}
static void *f_realloc(void *p, size_t n, void *ud) {
  (void)ud;
  return realloc(p, n);
}

static void test_failmalloc(void **state) {
  (void)state;
  static uint8_t mem[64];
  for (int n = 0; n < 4; n++) {
    failer fl = {n, 0};
    hr_mem m = {&fl, f_malloc, f_free, f_calloc, f_realloc};
    backend b = {0};
    hr__mrc *c;
    char why[64];
    int rv = hr__mrc_new(&c, reg, dereg, &b, 16, 1 << 30, &m);
    if (rv == 0) {
      hr__mrc_entry *e;
      rv = hr__mrc_get(c, mem, 64, 0, 0, &e, why, sizeof why);
      if (rv == 0)
        hr__mrc_put(c, e);
      else
        assert_int_equal(rv, HR_ERR_NOMEM);
      hr__mrc_del(c);
    } else {
      assert_int_equal(rv, HR_ERR_NOMEM);
    }
    assert_int_equal(fl.live, 0);
    assert_int_equal(b.live, 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hits_and_devices), cmocka_unit_test(test_eviction),
      cmocka_unit_test(test_invalidate),       cmocka_unit_test(test_refused),
      cmocka_unit_test(test_failmalloc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
