/*
 * Shared helpers of the test-vector programs.
 */
#include "vec_common.h"

#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#ifndef HR_VECTORS_BUILTIN
#define HR_VECTORS_BUILTIN ""
#endif

void *vec_chk(void *p) {
  if (p == NULL) {
    fprintf(stderr, "out of memory\n");
    abort();
  }
  return p;
}

void vec_buf_vprintf(vec_buf *b, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0)
    return;
  if (b->len + (size_t)n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + (size_t)n + 1)
      cap *= 2;
    b->s = vec_chk(realloc(b->s, cap));
    b->cap = cap;
  }
  vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
  b->len += (size_t)n;
}

void vec_buf_printf(vec_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vec_buf_vprintf(b, fmt, ap);
  va_end(ap);
}

void vec_buf_reset(vec_buf *b) {
  b->len = 0;
  if (b->s)
    b->s[0] = '\0';
}

void vec_buf_free(vec_buf *b) {
  free(b->s);
  b->s = NULL;
  b->len = b->cap = 0;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

int vec_hex_decode(const char *hex, uint8_t **out, size_t *len) {
  size_t n = strlen(hex);
  if (n % 2 != 0)
    return -1;
  /* One spare byte so that an empty string still gives a non-NULL
   * pointer. */
  uint8_t *p = vec_chk(malloc(n / 2 + 1));
  for (size_t i = 0; i < n / 2; i++) {
    int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      free(p);
      return -1;
    }
    p[i] = (uint8_t)(hi << 4 | lo);
  }
  *out = p;
  *len = n / 2;
  return 0;
}

char *vec_hex_encode(const uint8_t *p, size_t n) {
  static const char digits[] = "0123456789abcdef";
  char *s = vec_chk(malloc(2 * n + 1));
  for (size_t i = 0; i < n; i++) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  s[2 * n] = '\0';
  return s;
}

int vec_split(const uint8_t *p, size_t len, vec_span **out) {
  size_t count = 0, cap = 4, pos = 0;
  vec_span *v = vec_chk(malloc(cap * sizeof(*v)));
  while (pos < len) {
    if (len - pos < HR_HEADER_SIZE) {
      free(v);
      return -1;
    }
    hr_msg_header h;
    hr_wire_parse_header(p + pos, &h);
    if (h.payload_length > len - pos - HR_HEADER_SIZE) {
      free(v);
      return -1;
    }
    if (count == cap) {
      cap *= 2;
      v = vec_chk(realloc(v, cap * sizeof(*v)));
    }
    v[count].p = p + pos;
    v[count].len = HR_HEADER_SIZE + (size_t)h.payload_length;
    pos += v[count].len;
    count++;
  }
  *out = v;
  return (int)count;
}

const char *vec_get_str(const cJSON *o, const char *key, int *ok) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsString(j)) {
    *ok = 0;
    return "";
  }
  return j->valuestring;
}

int vec_json_u64(const cJSON *j, uint64_t *out) {
  if (cJSON_IsNumber(j)) {
    double d = j->valuedouble;
    if (d < 0 || d >= 18446744073709551616.0 || d != (double)(uint64_t)d)
      return -1;
    *out = (uint64_t)d;
    return 0;
  }
  if (cJSON_IsString(j)) {
    const char *s = j->valuestring;
    if (*s < '0' || *s > '9')
      return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
      return -1;
    *out = (uint64_t)v;
    return 0;
  }
  return -1;
}

int vec_json_u64_array(const cJSON *a, uint64_t *out, unsigned max,
                       unsigned *n) {
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > (int)max)
    return -1;
  unsigned i = 0;
  const cJSON *j;
  cJSON_ArrayForEach(j, a) {
    if (vec_json_u64(j, &out[i++]) != 0)
      return -1;
  }
  *n = i;
  return 0;
}

uint64_t vec_get_u64(const cJSON *o, const char *key, int *ok) {
  uint64_t v = 0;
  if (vec_json_u64(cJSON_GetObjectItemCaseSensitive(o, key), &v) != 0)
    *ok = 0;
  return v;
}

int vec_transport(const cJSON *v, hr_wire_ctx *ctx) {
  int ok = 1;
  const char *t = vec_get_str(v, "transport", &ok);
  memset(ctx, 0, sizeof(*ctx));
  if (ok && strcmp(t, "network") == 0)
    ctx->transport = HR_TRANSPORT_NETWORK;
  else if (ok && strcmp(t, "local") == 0)
    ctx->transport = HR_TRANSPORT_LOCAL;
  else
    return -1;
  return 0;
}

/* ---- the per-file driver ---- */

typedef struct vec_file_state {
  const char *program;
  char *path;
  char *name;
  vec_check_fn check;
  int total, passed;
} vec_file_state;

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  size_t cap = 65536, n = 0;
  char *s = vec_chk(malloc(cap + 1));
  for (;;) {
    size_t r = fread(s + n, 1, cap - n, f);
    n += r;
    if (n < cap)
      break;
    cap *= 2;
    s = vec_chk(realloc(s, cap + 1));
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    free(s);
    return NULL;
  }
  s[n] = '\0';
  *len = n;
  return s;
}

static void run_file(void **state) {
  vec_file_state *fs = *state;
  size_t len = 0;
  char *text = read_file(fs->path, &len);
  if (text == NULL)
    fail_msg("%s: cannot read: %s", fs->path, strerror(errno));
  cJSON *root = cJSON_ParseWithLength(text, len);
  free(text);
  if (root == NULL)
    fail_msg("%s: not valid JSON", fs->path);
  const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
  const cJSON *vectors = cJSON_GetObjectItemCaseSensitive(root, "vectors");
  if (!cJSON_IsNumber(format) || format->valuedouble != 1 ||
      !cJSON_IsArray(vectors)) {
    cJSON_Delete(root);
    fail_msg("%s: not a format-1 vector file", fs->path);
  }

  vec_buf diag = {0};
  const cJSON *v;
  cJSON_ArrayForEach(v, vectors) {
    int ok = 1;
    const char *name = vec_get_str(v, "name", &ok);
    const char *note = vec_get_str(v, "note", &ok);
    vec_buf_reset(&diag);
    fs->total++;
    if (fs->check(fs->name, v, &diag) == 0) {
      fs->passed++;
      continue;
    }
    int kok = 1;
    const char *kind = vec_get_str(v, "kind", &kok);
    print_error("FAIL %s / %s (%s)\n  note: %s\n", fs->name, ok ? name : "?",
                kok ? kind : "?", ok ? note : "?");
    /* The diagnostic, one indented line per difference. */
    for (const char *line = diag.s ? diag.s : ""; *line != '\0';) {
      const char *nl = strchr(line, '\n');
      int n = nl ? (int)(nl - line) : (int)strlen(line);
      print_error("  %.*s\n", n, line);
      line += n + (nl != NULL);
    }
  }
  vec_buf_free(&diag);
  cJSON_Delete(root);
  print_message("%s: %s: %d vectors, %d passed, %d failed\n", fs->program,
                fs->name, fs->total, fs->passed, fs->total - fs->passed);
  if (fs->total == 0)
    fail_msg("%s: no vectors", fs->name);
  if (fs->passed != fs->total)
    fail_msg("%s: %d of %d vectors failed", fs->name, fs->total - fs->passed,
             fs->total);
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Lists the *.json files of `dir`, sorted.  Returns the count, or -1 when
 * the folder cannot be opened. */
static int list_json(const char *dir, char ***out) {
  DIR *d = opendir(dir);
  if (d == NULL)
    return -1;
  size_t n = 0, cap = 16;
  char **names = vec_chk(malloc(cap * sizeof(*names)));
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name);
    if (l <= 5 || strcmp(e->d_name + l - 5, ".json") != 0)
      continue;
    if (n == cap) {
      cap *= 2;
      names = vec_chk(realloc(names, cap * sizeof(*names)));
    }
    names[n++] = vec_chk(strdup(e->d_name));
  }
  closedir(d);
  qsort(names, n, sizeof(*names), cmp_names);
  *out = names;
  return (int)n;
}

int vec_main(const char *program, vec_check_fn check) {
  const char *dir = getenv("HURRAY_VECTORS_DIR");
  const char *from = "HURRAY_VECTORS_DIR";
  if (dir == NULL || *dir == '\0') {
    dir = getenv("HR_VECTORS_DEFAULT");
    from = "HR_VECTORS_DEFAULT";
  }
  if (dir == NULL || *dir == '\0') {
    dir = HR_VECTORS_BUILTIN;
    from = "the build's default";
  }
  const char *ci = getenv("CI");
  int in_ci = ci != NULL && strcmp(ci, "true") == 0;

  char **names = NULL;
  int n = *dir ? list_json(dir, &names) : -1;
  if (n <= 0) {
    fprintf(stderr,
            "%s: the test-vector folder %s (from %s) is %s.\n"
            "Set HURRAY_VECTORS_DIR to a folder of wire-v1 *.json vectors.\n",
            program, *dir ? dir : "(none)", from,
            n < 0 ? "missing" : "empty (no *.json)");
    if (names != NULL)
      free(names);
    if (in_ci) {
      fprintf(stderr,
              "%s: CI=true: a missing or empty vector folder is a "
              "failure.\n",
              program);
      return 1;
    }
    fprintf(stderr, "%s: skipped.\n", program);
    return 77;
  }

  struct CMUnitTest *tests = vec_chk(calloc((size_t)n, sizeof(*tests)));
  vec_file_state *fs = vec_chk(calloc((size_t)n, sizeof(*fs)));
  for (int i = 0; i < n; i++) {
    size_t l = strlen(dir) + strlen(names[i]) + 2;
    fs[i].program = program;
    fs[i].path = vec_chk(malloc(l));
    snprintf(fs[i].path, l, "%s/%s", dir, names[i]);
    fs[i].name = names[i];
    fs[i].check = check;
    tests[i].name = names[i];
    tests[i].test_func = run_file;
    tests[i].initial_state = &fs[i];
  }
  printf("%s: vectors from %s (%s)\n", program, dir, from);
  int rc = _cmocka_run_group_tests(program, tests, (size_t)n, NULL, NULL);

  int total = 0, passed = 0;
  for (int i = 0; i < n; i++) {
    total += fs[i].total;
    passed += fs[i].passed;
    printf("  %-30s %4d passed %4d failed\n", fs[i].name, fs[i].passed,
           fs[i].total - fs[i].passed);
    free(fs[i].path);
    free(names[i]);
  }
  printf("%s: %d files, %d vectors, %d passed, %d failed\n", program, n, total,
         passed, total - passed);
  free(fs);
  free(tests);
  free(names);
  return rc == 0 ? 0 : 1;
}
