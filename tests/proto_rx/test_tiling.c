/*
 * hr_shards_check_tiling: hand-made tilings and near misses, a brute-force
 * cross-check on random box sets (both the corner method and the sweep
 * fallback), large N, and allocation failures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/wire.h>

#define MAXN 8192

/* A set of boxes. */
typedef struct boxes {
  unsigned rank;
  size_t n;
  uint64_t box_off[HR_MAX_RANK];
  uint64_t box_shape[HR_MAX_RANK];
  uint64_t (*off)[HR_MAX_RANK];
  uint64_t (*shape)[HR_MAX_RANK];
  const uint64_t **po;
  const uint64_t **ps;
} boxes;

static boxes *bx_new(unsigned rank, const uint64_t *box_off,
                     const uint64_t *box_shape) {
  boxes *b = calloc(1, sizeof *b);
  b->rank = rank;
  for (unsigned k = 0; k < rank; k++) {
    b->box_off[k] = box_off ? box_off[k] : 0;
    b->box_shape[k] = box_shape[k];
  }
  b->off = calloc(MAXN, sizeof *b->off);
  b->shape = calloc(MAXN, sizeof *b->shape);
  b->po = calloc(MAXN, sizeof *b->po);
  b->ps = calloc(MAXN, sizeof *b->ps);
  return b;
}

static void bx_del(boxes *b) {
  free(b->off);
  free(b->shape);
  free(b->po);
  free(b->ps);
  free(b);
}

static void bx_add(boxes *b, const uint64_t *off, const uint64_t *shape) {
  assert_true(b->n < MAXN);
  if (b->rank) {
    memcpy(b->off[b->n], off, b->rank * sizeof(uint64_t));
    memcpy(b->shape[b->n], shape, b->rank * sizeof(uint64_t));
  }
  b->n++;
}

/* 2-D helper: [r0, r0 + h) x [c0, c0 + w). */
static void bx_add2(boxes *b, uint64_t r0, uint64_t c0, uint64_t h,
                    uint64_t w) {
  uint64_t o[2] = {r0, c0}, s[2] = {h, w};
  bx_add(b, o, s);
}

static int bx_check_mem(boxes *b, const hr_mem *mem, hr_wire_status *st) {
  for (size_t i = 0; i < b->n; i++) {
    b->po[i] = b->off[i];
    b->ps[i] = b->shape[i];
  }
  return hr_shards_check_tiling(b->rank, b->box_off, b->box_shape, b->n, b->po,
                                b->ps, mem, st);
}

/* Returns 0 when accepted, else the wire code (asserting HR_ERR_PROTO). */
static uint32_t bx_check(boxes *b) {
  hr_wire_status st = {0, 0, NULL};
  int rv = bx_check_mem(b, NULL, &st);
  if (rv == 0)
    return 0;
  assert_int_equal(rv, HR_ERR_PROTO);
  assert_non_null(st.reason);
  return st.code;
}

static void hand_made(void **state) {
  (void)state;
  uint64_t box[2] = {8, 3};
  boxes *b = bx_new(2, NULL, box);
  bx_add2(b, 0, 0, 5, 3);
  bx_add2(b, 5, 0, 3, 3);
  assert_int_equal(bx_check(b), 0);
  b->n = 0; /* rows 4 in both */
  bx_add2(b, 0, 0, 5, 3);
  bx_add2(b, 4, 0, 4, 3);
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  b->n = 0; /* row 4 in none */
  bx_add2(b, 0, 0, 4, 3);
  bx_add2(b, 5, 0, 3, 3);
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  b->n = 0; /* overlap (row 3) and gap (row 7) of equal volume */
  bx_add2(b, 0, 0, 4, 3);
  bx_add2(b, 3, 0, 4, 3);
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  b->n = 0; /* outside */
  bx_add2(b, 0, 0, 8, 4);
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  b->n = 0; /* overflowing shard */
  bx_add2(b, 0, 0, 8, 3);
  b->off[0][0] = 2;
  b->shape[0][0] = UINT64_MAX;
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  b->n = 0; /* an empty shard in a non-empty box */
  bx_add2(b, 0, 0, 8, 3);
  bx_add2(b, 8, 0, 0, 3);
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  b->n = 0; /* the same shard twice */
  bx_add2(b, 0, 0, 8, 3);
  bx_add2(b, 0, 0, 8, 3);
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  b->n = 0; /* no shard */
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  b->n = 0; /* the pinwheel: 5 boxes, no guillotine cut */
  b->box_shape[0] = 3;
  b->box_shape[1] = 3;
  bx_add2(b, 0, 0, 1, 2);
  bx_add2(b, 0, 2, 2, 1);
  bx_add2(b, 2, 1, 1, 2);
  bx_add2(b, 1, 0, 2, 1);
  bx_add2(b, 1, 1, 1, 1);
  assert_int_equal(bx_check(b), 0);
  b->shape[4][0] = 2; /* the centre runs into the bottom box */
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  bx_del(b);

  /* A region box away from the origin. */
  uint64_t ro[2] = {2, 1}, rs[2] = {3, 2};
  b = bx_new(2, ro, rs);
  bx_add2(b, 2, 1, 2, 2);
  bx_add2(b, 4, 1, 1, 2);
  assert_int_equal(bx_check(b), 0);
  b->off[1][0] = 1; /* below the region */
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  bx_del(b);

  /* Empty box: empty shards inside are fine. */
  uint64_t eb[2] = {0, 3};
  b = bx_new(2, NULL, eb);
  bx_add2(b, 0, 0, 0, 3);
  bx_add2(b, 0, 0, 0, 1);
  assert_int_equal(bx_check(b), 0);
  bx_del(b);

  /* Rank 0: exactly one shard. */
  b = bx_new(0, NULL, eb);
  bx_add(b, NULL, NULL);
  assert_int_equal(bx_check(b), 0);
  bx_add(b, NULL, NULL);
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  bx_del(b);

  /* The requested box itself overflows. */
  uint64_t bo[1] = {UINT64_MAX}, bs[1] = {2};
  b = bx_new(1, bo, bs);
  bx_add(b, bo, bs);
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  bx_del(b);
}

static void arguments(void **state) {
  (void)state;
  uint64_t s[1] = {1};
  const uint64_t *p[1] = {s};
  hr_wire_status st;
  assert_int_equal(hr_shards_check_tiling(33, s, s, 1, p, p, NULL, &st),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_shards_check_tiling(1, NULL, s, 1, p, p, NULL, &st),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_shards_check_tiling(1, s, s, 1, NULL, p, NULL, &st),
                   HR_ERR_INVALID_ARGUMENT);
  const uint64_t *nul[1] = {NULL};
  assert_int_equal(hr_shards_check_tiling(1, s, s, 1, nul, p, NULL, &st),
                   HR_ERR_INVALID_ARGUMENT);
  uint64_t z[1] = {0};
  const uint64_t *pz[1] = {z};
  assert_int_equal(hr_shards_check_tiling(1, z, s, 1, pz, p, NULL, &st), 0);
}

/* A deterministic generator (xorshift64*). */
static uint64_t rnd(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1DULL;
}

/* Splits box i of `b` at a random place of a random axis, `cuts` times:
 * a random guillotine tiling. */
static void random_tiling(boxes *b, uint64_t *seed, int cuts) {
  b->n = 0;
  bx_add(b, b->box_off, b->box_shape);
  for (int c = 0; c < cuts && b->n < MAXN; c++) {
    size_t i = rnd(seed) % b->n;
    unsigned k = (unsigned)(rnd(seed) % b->rank);
    if (b->shape[i][k] < 2)
      continue;
    uint64_t cut = 1 + rnd(seed) % (b->shape[i][k] - 1);
    uint64_t o[HR_MAX_RANK], s[HR_MAX_RANK];
    memcpy(o, b->off[i], sizeof o);
    memcpy(s, b->shape[i], sizeof s);
    o[k] += cut;
    s[k] -= cut;
    b->shape[i][k] = cut;
    bx_add(b, o, s);
  }
}

/* The truth, by counting every cell (small boxes only). */
static int brute_force(const boxes *b) {
  uint64_t vol = 1;
  for (unsigned k = 0; k < b->rank; k++)
    vol *= b->box_shape[k];
  unsigned char *cnt = calloc(vol ? vol : 1, 1);
  int ok = 1;
  for (size_t i = 0; i < b->n && ok; i++) {
    uint64_t cells = 1;
    for (unsigned k = 0; k < b->rank; k++) {
      if (b->off[i][k] < b->box_off[k] ||
          b->off[i][k] + b->shape[i][k] > b->box_off[k] + b->box_shape[k])
        ok = 0;
      cells *= b->shape[i][k];
    }
    if (!ok || cells == 0) {
      ok = 0;
      break;
    }
    for (uint64_t c = 0; c < cells; c++) {
      uint64_t rem = c, lin = 0;
      for (unsigned k = 0; k < b->rank; k++) {
        uint64_t x = b->off[i][k] - b->box_off[k] + rem % b->shape[i][k];
        rem /= b->shape[i][k];
        lin = lin * b->box_shape[k] + x;
      }
      if (++cnt[lin] > 1)
        ok = 0;
    }
  }
  for (uint64_t c = 0; c < vol && ok; c++)
    ok = cnt[c] == 1;
  free(cnt);
  return ok;
}

/* Random tilings and perturbations of them, checked against the cell
 * count.  `rank`/`extent` choose the path: few cut axes take the corner
 * method; rank 12 with ~100 boxes exceeds its budget and takes the sweep. */
static void cross_check(unsigned rank, uint64_t extent, int cuts, int rounds,
                        uint64_t seed) {
  uint64_t shape[HR_MAX_RANK], off[HR_MAX_RANK];
  for (unsigned k = 0; k < rank; k++) {
    shape[k] = extent;
    off[k] = 3;
  }
  boxes *b = bx_new(rank, off, shape);
  int accepted = 0, rejected = 0;
  for (int round = 0; round < rounds; round++) {
    random_tiling(b, &seed, cuts);
    assert_int_equal(bx_check(b), 0);
    assert_true(brute_force(b));
    accepted++;
    /* Perturb: move, grow, shrink one box, drop or duplicate one. */
    size_t i = rnd(&seed) % b->n;
    unsigned k = (unsigned)(rnd(&seed) % rank);
    switch (rnd(&seed) % 5) {
    case 0: b->off[i][k] += 1; break;
    case 1: b->shape[i][k] += 1; break;
    case 2:
      if (b->shape[i][k] > 1)
        b->shape[i][k] -= 1;
      else
        b->off[i][k] -= 1;
      break;
    case 3:
      memcpy(b->off[i], b->off[b->n - 1], sizeof b->off[i]);
      memcpy(b->shape[i], b->shape[b->n - 1], sizeof b->shape[i]);
      if (b->n > 1)
        b->n--;
      else
        b->shape[0][k] -= 1;
      break;
    default: bx_add(b, b->off[i], b->shape[i]); break;
    }
    int truth = brute_force(b);
    assert_int_equal(bx_check(b) == 0, truth);
    rejected += !truth;
  }
  assert_true(accepted == rounds);
  assert_true(rejected > rounds / 2);
  bx_del(b);
}

static void random_corner_2d(void **state) {
  (void)state;
  cross_check(2, 12, 20, 300, 1);
}

static void random_corner_3d(void **state) {
  (void)state;
  cross_check(3, 6, 25, 300, 2);
}

static void random_corner_5d(void **state) {
  (void)state;
  cross_check(5, 3, 30, 200, 3);
}

static void random_sweep_12d(void **state) {
  (void)state;
  /* 2^12 = 4096 cells; ~100 boxes cut along all 12 axes go past the
   * corner budget ((n + 1) * 2^12 * 15 words > 2^22). */
  cross_check(12, 2, 400, 40, 4);
}

/* 4096 row slabs of a [4096 * 7, 5] tensor, and a 64 x 64 grid. */
static void large_n(void **state) {
  (void)state;
  uint64_t box[2] = {4096 * 7, 5};
  boxes *b = bx_new(2, NULL, box);
  for (uint64_t i = 0; i < 4096; i++)
    bx_add2(b, i * 7, 0, 7, 5);
  assert_int_equal(bx_check(b), 0);
  b->off[2000][0] += 1;
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  bx_del(b);

  uint64_t g[2] = {64 * 3, 64 * 2};
  b = bx_new(2, NULL, g);
  for (uint64_t i = 0; i < 64; i++)
    for (uint64_t j = 0; j < 64; j++)
      bx_add2(b, i * 3, j * 2, 3, 2);
  assert_int_equal(bx_check(b), 0);
  b->shape[777][1] = 1;
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  bx_del(b);

  /* The sweep fallback with 4096 unit cells of a 2^12 box. */
  uint64_t h[12];
  for (int k = 0; k < 12; k++)
    h[k] = 2;
  b = bx_new(12, NULL, h);
  for (uint64_t c = 0; c < 4096; c++) {
    uint64_t o[12], s[12];
    for (int k = 0; k < 12; k++) {
      o[k] = (c >> k) & 1;
      s[k] = 1;
    }
    bx_add(b, o, s);
  }
  assert_int_equal(bx_check(b), 0);
  memcpy(b->off[5], b->off[6], sizeof b->off[5]); /* overlap + gap */
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  b->n--; /* volume short */
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  bx_del(b);
}

/* A volume that overflows u64 on the sweep path (many cut axes). */
static void sweep_overflow(void **state) {
  (void)state;
  uint64_t h[24];
  for (int k = 0; k < 24; k++)
    h[k] = (uint64_t)1 << 20;
  boxes *b = bx_new(24, NULL, h);
  /* Two halves along each of 23 axes would be too many boxes; one box cut
   * along every axis at once is enough to make r = 24. */
  uint64_t o[24] = {0}, s[24];
  for (int k = 0; k < 24; k++)
    s[k] = (uint64_t)1 << 19;
  bx_add(b, o, s);
  assert_int_equal(bx_check(b), HR_WIRE_SHARD_INCONSISTENT);
  bx_del(b);
}

typedef struct fail_mem {
  int left;
} fail_mem;
static void *fm_malloc(size_t n, void *ud) {
  fail_mem *f = ud;
  return f->left-- > 0 ? malloc(n) : NULL;
}
static void fm_free(void *p, void *ud) {
  (void)ud;
  free(p);
}
static void *fm_calloc(size_t a, size_t n, void *ud) {
  fail_mem *f = ud;
  return f->left-- > 0 ? calloc(a, n) : NULL;
}
static void *fm_realloc(void *p, size_t n, void *ud) {
  fail_mem *f = ud;
  return f->left-- > 0 ? realloc(p, n) : NULL;
}

static void nomem(void **state) {
  (void)state;
  uint64_t box[2] = {8, 3};
  boxes *b = bx_new(2, NULL, box);
  bx_add2(b, 0, 0, 5, 3);
  bx_add2(b, 5, 0, 3, 3);
  int saw_nomem = 0, saw_ok = 0;
  for (int k = 0; k < 10; k++) {
    fail_mem f = {k};
    hr_mem mem = {&f, fm_malloc, fm_free, fm_calloc, fm_realloc};
    hr_wire_status st;
    int rv = bx_check_mem(b, &mem, &st);
    assert_true(rv == 0 || rv == HR_ERR_NOMEM);
    saw_nomem |= rv == HR_ERR_NOMEM;
    saw_ok |= rv == 0;
  }
  assert_true(saw_nomem && saw_ok);
  bx_del(b);

  /* The sweep path's allocation. */
  uint64_t h[12];
  for (int k = 0; k < 12; k++)
    h[k] = 2;
  b = bx_new(12, NULL, h);
  for (uint64_t c = 0; c < 4096; c++) {
    uint64_t o[12], s[12];
    for (int k = 0; k < 12; k++) {
      o[k] = (c >> k) & 1;
      s[k] = 1;
    }
    bx_add(b, o, s);
  }
  fail_mem f = {0};
  hr_mem mem = {&f, fm_malloc, fm_free, fm_calloc, fm_realloc};
  hr_wire_status st;
  assert_int_equal(bx_check_mem(b, &mem, &st), HR_ERR_NOMEM);
  bx_del(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(hand_made),
      cmocka_unit_test(arguments),
      cmocka_unit_test(random_corner_2d),
      cmocka_unit_test(random_corner_3d),
      cmocka_unit_test(random_corner_5d),
      cmocka_unit_test(random_sweep_12d),
      cmocka_unit_test(large_n),
      cmocka_unit_test(sweep_overflow),
      cmocka_unit_test(nomem),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
