/*
 * libFuzzer target: the AUTH_TOKEN table (engine/auth), fed an arbitrary
 * token file (an operator's file, but also whatever a reload picks up).
 *
 * Input: the token file's text.  hr_auth_load() parses it; when it is
 * accepted, the table is checked against the file read again line by
 * line here: every listed token is known, with the permission its line
 * names (`ro` refuses PUT), its first prefix (if any) is in scope and a
 * key that starts with no prefix is out of it; the table holds one entry
 * per token line.  A refused file leaves the previous table in place.
 *
 * Checked besides: no crash, leak or UB; only documented return codes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hurray/auth.h>

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int blank(char c) {
  return c == ' ' || c == '\t';
}

/* The next field of [*p, end), or 0 when none is left. */
static size_t field(const char **p, const char *end, const char **f) {
  while (*p < end && blank(**p))
    (*p)++;
  *f = *p;
  while (*p < end && !blank(**p))
    (*p)++;
  return (size_t)(*p - *f);
}

/* Checks one accepted line against the table; returns 1 for an entry. */
static int check_line(hr_auth *a, const char *s, const char *le) {
  const char *tok, *perm, *pfx;
  size_t tl = field(&s, le, &tok);
  if (tl == 0 || tok[0] == '#')
    return 0;
  size_t pl = field(&s, le, &perm);
  size_t xl = field(&s, le, &pfx);
  const uint8_t *t = (const uint8_t *)tok;
  if (hr_auth_check(a, t, tl, 0, NULL, 0) != 0)
    hr_fuzz_fail("a listed token is unknown");
  if (hr_auth_check(a, t, tl, HR_AUTH_READ, NULL, 0) != 0)
    hr_fuzz_fail("a listed token may not read");
  int ro = pl == 2 && memcmp(perm, "ro", 2) == 0;
  int rv = hr_auth_check(a, t, tl, HR_AUTH_WRITE, NULL, 0);
  if (rv != (ro ? HR_ERR_STATE : 0))
    hr_fuzz_fail("a token's write permission disagrees with its line");
  if (xl > 0) {
    const uint8_t *k = (const uint8_t *)pfx;
    if (hr_auth_check(a, t, tl, HR_AUTH_READ, k, xl) != 0)
      hr_fuzz_fail("a key equal to a token's prefix is out of scope");
    /* A key shorter than every prefix starts with none of them. */
    if (hr_auth_check(a, t, tl, HR_AUTH_READ, k, 0) != HR_ERR_STATE)
      hr_fuzz_fail("the empty key is in scope of a bounded token");
  } else if (hr_auth_check(a, t, tl, HR_AUTH_READ, (const uint8_t *)"", 0) !=
             0) {
    hr_fuzz_fail("an unbounded token may not read the empty key");
  }
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  hr_auth *a = NULL;
  if (hr_auth_new(&a, NULL) != 0)
    hr_fuzz_fail("hr_auth_new failed");
  /* A table in place first: a refused file must leave it. */
  static const char first[] = "fuzz-first-token ro a/\n";
  if (hr_auth_load(a, first, sizeof first - 1, NULL, 0) != 0 ||
      hr_auth_count(a) != 1)
    hr_fuzz_fail("the first table was refused");
  const char *text = (const char *)data;
  char why[256];
  int rv = hr_auth_load(a, text, size, why, sizeof why);
  if (rv != 0) {
    if (rv != HR_ERR_INVALID_ARGUMENT && rv != HR_ERR_NOMEM)
      hr_fuzz_fail("hr_auth_load: an undocumented return");
    if (why[0] == '\0')
      hr_fuzz_fail("hr_auth_load refused a file without saying why");
    if (hr_auth_count(a) != 1 ||
        hr_auth_check(a, (const uint8_t *)"fuzz-first-token", 16, HR_AUTH_READ,
                      (const uint8_t *)"a/b", 3) != 0)
      hr_fuzz_fail("a refused file changed the table");
    hr_auth_del(a);
    return 0;
  }
  size_t entries = 0;
  const char *p = text, *end = text + size;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *le = nl ? nl : end;
    const char *s = p;
    p = nl ? nl + 1 : end;
    if (le > s && le[-1] == '\r')
      le--;
    entries += (size_t)check_line(a, s, le);
  }
  if (hr_auth_count(a) != entries)
    hr_fuzz_fail("the table does not hold one entry per token line");
  hr_auth_del(a);
  return 0;
}
