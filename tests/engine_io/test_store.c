/*
 * The tensor store: the map itself, its provider callbacks called
 * directly (LIST paging, PUT begin/commit refusals, the byte cap), and
 * atomic replacement under concurrent readers.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tl.h"

static hr_tensor *vec(uint64_t n, uint32_t seed) {
  uint64_t shape[1] = {n};
  return tl_dense(HR_ELEM_UINT8, 1, shape, seed);
}

static void test_map(void **state) {
  hr_store *s;
  hr_tensor *a = vec(10, 1), *b = vec(20, 2), *got;
  char big[HR_MAX_KEY + 1];

  (void)state;
  assert_int_equal(hr_store_new(&s, NULL, NULL), 0);
  assert_int_equal(hr_store_put(s, "a", 1, a, 0), 0);
  assert_int_equal(hr_store_put(s, "a", 1, b, 0), HR_ERR_STATE);
  assert_int_equal(hr_store_count(s), 1);
  assert_int_equal(hr_store_bytes(s), 10);
  assert_int_equal(hr_store_get(s, "a", 1, &got), 0);
  assert_ptr_equal(got, a);
  hr_tensor_unref(got);
  assert_int_equal(hr_store_put(s, "a", 1, b, HR_PUT_REPLACE), 0);
  assert_int_equal(hr_store_bytes(s), 20);
  assert_int_equal(hr_store_get(s, "a", 1, &got), 0);
  assert_ptr_equal(got, b);
  hr_tensor_unref(got);
  assert_int_equal(hr_store_get(s, "b", 1, &got), HR_ERR_NOT_FOUND);
  assert_null(got);
  memset(big, 'k', sizeof big);
  assert_int_equal(hr_store_put(s, big, HR_MAX_KEY + 1, a, 0),
                   HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_store_put(s, big, HR_MAX_KEY, a, 0), 0);
  assert_int_equal(hr_store_put(s, "", 0, a, 0), HR_ERR_INVALID_ARGUMENT);
  assert_int_equal(hr_store_remove(s, "a", 1), 0);
  assert_int_equal(hr_store_remove(s, "a", 1), HR_ERR_NOT_FOUND);
  assert_int_equal(hr_store_count(s), 1);
  assert_int_equal(hr_store_bytes(s), 10);
  hr_store_del(s);
  hr_tensor_unref(a);
  hr_tensor_unref(b);
}

/* ---- LIST through the provider ---- */

typedef struct page {
  char keys[16][16];
  int n, cap;
} page;

static int emit(void *ctx, const hr_list_entry *e) {
  page *p = ctx;
  if (p->n == p->cap)
    return 1; /* page full */
  snprintf(p->keys[p->n], sizeof p->keys[0], "%.*s", (int)e->key_len,
           (const char *)e->key);
  p->n++;
  return 0;
}

static int list(hr_provider *prov, const char *prefix, const char *after,
                int cap, page *p) {
  hr_list_request req;
  int more = -1;

  memset(p, 0, sizeof *p);
  p->cap = cap;
  memset(&req, 0, sizeof req);
  req.prefix = (const uint8_t *)prefix;
  req.prefix_len = (uint16_t)strlen(prefix);
  req.start_after = (const uint8_t *)after;
  req.start_after_len = (uint16_t)strlen(after);
  req.max_entries = (uint16_t)cap;
  assert_int_equal(prov->on_list(NULL, &req, emit, p, &more, prov->user_data),
                   0);
  return more;
}

static void test_list(void **state) {
  static const char *keys[] = {"b", "a/2", "a/10", "a/1", "ab", "a", "c/x"};
  hr_store *s;
  hr_provider prov;
  hr_tensor *t = vec(3, 1);
  page p;
  size_t i;

  (void)state;
  assert_int_equal(hr_store_new(&s, NULL, NULL), 0);
  for (i = 0; i < sizeof keys / sizeof *keys; i++)
    assert_int_equal(hr_store_put(s, keys[i], strlen(keys[i]), t, 0), 0);
  hr_store_provider(s, &prov);
  assert_null(prov.on_put_begin); /* PUT off by default */
  /* Byte order: "a" < "a/1" < "a/10" < "a/2" < "ab" < "b" < "c/x". */
  assert_int_equal(list(&prov, "", "", 16, &p), 0);
  assert_int_equal(p.n, 7);
  assert_string_equal(p.keys[0], "a");
  assert_string_equal(p.keys[2], "a/10");
  assert_string_equal(p.keys[6], "c/x");
  assert_int_equal(list(&prov, "a/", "", 2, &p), 1);
  assert_int_equal(p.n, 2);
  assert_string_equal(p.keys[1], "a/10");
  assert_int_equal(list(&prov, "a/", "a/10", 2, &p), 0);
  assert_int_equal(p.n, 1);
  assert_string_equal(p.keys[0], "a/2");
  /* start_after between keys and before the prefix. */
  assert_int_equal(list(&prov, "", "a/15", 16, &p), 0);
  assert_string_equal(p.keys[0], "a/2");
  assert_int_equal(list(&prov, "c", "a", 16, &p), 0);
  assert_int_equal(p.n, 1);
  assert_int_equal(list(&prov, "zz", "", 16, &p), 0);
  assert_int_equal(p.n, 0);
  hr_store_del(s);
  hr_tensor_unref(t);
}

/* ---- PUT through the provider ---- */

static hr_put_info info_of(const char *key, uint32_t flags, hr_tensor *t) {
  hr_put_info in;
  memset(&in, 0, sizeof in);
  in.key = (const uint8_t *)key;
  in.key_len = (uint16_t)strlen(key);
  in.flags = flags;
  in.desc = hr_tensor_descriptor(t);
  in.stream_id = 1;
  return in;
}

static void test_put_provider(void **state) {
  hr_store_config cfg;
  hr_store *s;
  hr_provider prov;
  hr_tensor *a = vec(100, 1), *b = vec(100, 2), *big = vec(1000, 3), *got;
  hr_put_info in;
  uint32_t we;

  (void)state;
  hr_store_config_default(&cfg);
  cfg.allow_put = 1;
  cfg.max_bytes = 500;
  assert_int_equal(hr_store_new(&s, &cfg, NULL), 0);
  hr_store_provider(s, &prov);
  assert_non_null(prov.on_put_begin);
  in = info_of("k", 0, a);
  we = 0;
  assert_int_equal(prov.on_put_begin(NULL, &in, &we, prov.user_data), 0);
  assert_int_equal(we, 0);
  /* A racing PUT of the same key also passes its begin... */
  in = info_of("k", 0, b);
  assert_int_equal(prov.on_put_begin(NULL, &in, &we, prov.user_data), 0);
  assert_int_equal(we, 0);
  in = info_of("k", 0, a);
  assert_int_equal(prov.on_put_commit(NULL, &in, a, &we, prov.user_data), 0);
  assert_int_equal(we, 0);
  /* ...and loses at its commit. */
  in = info_of("k", 0, b);
  assert_int_equal(prov.on_put_commit(NULL, &in, b, &we, prov.user_data), 0);
  assert_int_equal(we, HR_WIRE_ALREADY_EXISTS);
  assert_int_equal(hr_store_get(s, "k", 1, &got), 0);
  assert_ptr_equal(got, a);
  hr_tensor_unref(got);
  /* Exists, no REPLACE: refused at the head already. */
  we = 0;
  assert_int_equal(prov.on_put_begin(NULL, &in, &we, prov.user_data), 0);
  assert_int_equal(we, HR_WIRE_ALREADY_EXISTS);
  /* REPLACE works. */
  in = info_of("k", HR_PUT_REPLACE, b);
  we = 0;
  assert_int_equal(prov.on_put_begin(NULL, &in, &we, prov.user_data), 0);
  assert_int_equal(prov.on_put_commit(NULL, &in, b, &we, prov.user_data), 0);
  assert_int_equal(we, 0);
  assert_int_equal(hr_store_get(s, "k", 1, &got), 0);
  assert_ptr_equal(got, b);
  hr_tensor_unref(got);
  /* The byte cap. */
  in = info_of("huge", 0, big);
  we = 0;
  assert_int_equal(prov.on_put_begin(NULL, &in, &we, prov.user_data), 0);
  assert_int_equal(we, HR_WIRE_RESOURCE_EXHAUSTED);
  we = 0;
  assert_int_equal(prov.on_put_commit(NULL, &in, big, &we, prov.user_data), 0);
  assert_int_equal(we, HR_WIRE_RESOURCE_EXHAUSTED);
  prov.on_put_abort(NULL, &in, prov.user_data);
  assert_int_equal(hr_store_count(s), 1);
  hr_store_del(s);
  /* allow_replace = 0: REPLACE is not honoured. */
  cfg.max_bytes = 0;
  cfg.allow_replace = 0;
  assert_int_equal(hr_store_new(&s, &cfg, NULL), 0);
  hr_store_provider(s, &prov);
  assert_int_equal(hr_store_put(s, "k", 1, a, 0), 0);
  in = info_of("k", HR_PUT_REPLACE, b);
  we = 0;
  assert_int_equal(prov.on_put_begin(NULL, &in, &we, prov.user_data), 0);
  assert_int_equal(we, HR_WIRE_ALREADY_EXISTS);
  hr_store_del(s);
  hr_tensor_unref(a);
  hr_tensor_unref(b);
  hr_tensor_unref(big);
}

static void test_composite_entry(void **state) {
  uint64_t s1[1] = {4}, s2[2] = {2, 3};
  hr_tensor *m[2], *c;
  hr_descriptor head;
  hr_wire_status st;
  hr_list_entry e;

  (void)state;
  m[0] = tl_dense(HR_ELEM_INT32, 1, s1, 1);
  m[1] = tl_dense(HR_ELEM_FLOAT64, 2, s2, 2);
  memset(&head, 0, sizeof head);
  head.descriptor_version = 1;
  head.layout.tag = HR_LAYOUT_COMPOSITE;
  head.params.member_count = 2;
  head.params.rule = HR_COMPOSITE_TUPLE;
  assert_int_equal(hr_tensor_new_composite(&c, &head, m, 2, NULL, &st), 0);
  hr_store_entry_of(c, &e);
  assert_int_equal(e.layout_tag, HR_LAYOUT_COMPOSITE);
  assert_int_equal(e.element_type, HR_ELEM_NONE);
  assert_int_equal(e.rank, 0);
  assert_int_equal(e.total_data_bytes, 16 + 48);
  hr_store_entry_of(m[1], &e);
  assert_int_equal(e.element_type, HR_ELEM_FLOAT64);
  assert_int_equal(e.shape[1], 3);
  assert_int_equal(e.total_data_bytes, 48);
  hr_tensor_unref(c);
  hr_tensor_unref(m[0]);
  hr_tensor_unref(m[1]);
}

/* ---- atomic replacement ---- */

typedef struct race {
  hr_store *s;
  hr_tensor *x, *y;
  atomic_int stop;
  atomic_int mixes;
  atomic_long reads;
} race;

static hr_tensor *uniform(uint8_t v) {
  hr_tensor *t = vec(1u << 16, 0);
  memset(hr_tensor_buffer(t, 0), v, 1u << 16);
  return t;
}

/* The writer replaces until the readers have had a fair share of the
 * race: a fixed count alone can finish before a reader thread is ever
 * scheduled on a loaded machine. */
static void *writer(void *arg) {
  race *r = arg;
  long i;
  for (i = 0; i < 20000 || atomic_load(&r->reads) < 2000; i++)
    hr_store_put(r->s, "k", 1, (i & 1) ? r->x : r->y, HR_PUT_REPLACE);
  atomic_store(&r->stop, 1);
  return NULL;
}

static void *reader(void *arg) {
  race *r = arg;
  while (!atomic_load(&r->stop)) {
    hr_tensor *t;
    const uint8_t *p;
    size_t i;
    if (hr_store_get(r->s, "k", 1, &t) != 0)
      continue;
    p = hr_tensor_buffer(t, 0);
    for (i = 1; i < (1u << 16); i += 4093)
      if (p[i] != p[0])
        atomic_fetch_add(&r->mixes, 1);
    hr_tensor_unref(t);
    atomic_fetch_add(&r->reads, 1);
  }
  return NULL;
}

static void test_atomic_replace(void **state) {
  race r;
  pthread_t w, rd[2];

  (void)state;
  memset(&r, 0, sizeof r);
  assert_int_equal(hr_store_new(&r.s, NULL, NULL), 0);
  r.x = uniform(0xAA);
  r.y = uniform(0x55);
  assert_int_equal(hr_store_put(r.s, "k", 1, r.x, 0), 0);
  pthread_create(&rd[0], NULL, reader, &r);
  pthread_create(&rd[1], NULL, reader, &r);
  pthread_create(&w, NULL, writer, &r);
  pthread_join(w, NULL);
  pthread_join(rd[0], NULL);
  pthread_join(rd[1], NULL);
  assert_int_equal(atomic_load(&r.mixes), 0);
  assert_true(atomic_load(&r.reads) >= 2000);
  hr_store_del(r.s);
  hr_tensor_unref(r.x);
  hr_tensor_unref(r.y);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_map),
      cmocka_unit_test(test_list),
      cmocka_unit_test(test_put_provider),
      cmocka_unit_test(test_composite_entry),
      cmocka_unit_test(test_atomic_replace),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
