/*
 * .safetensors reading: an 8-byte little-endian header length, a JSON
 * header ({"name": {"dtype", "shape", "data_offsets"}, "__metadata__":
 * {...}}), then the data section.  The file is hostile input: every
 * number is checked to be an exact non-negative integer, offsets lie in
 * the data section, sizes match dtype x shape and tensors do not overlap.
 */
#include <hurray/files.h>

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "hr_internal.h"
#include "hr_mapfile.h"

#define HEADER_MAX (100u * 1000u * 1000u)

typedef struct st_tensor {
  char *name;
  hr_descriptor desc;
  uint64_t begin, end; /* in the data section */
} st_tensor;

struct hr_safetensors {
  hr_mem mem;
  hr__mapfile *map;
  uint64_t data_start;
  st_tensor *v;
  size_t n;
};

static const struct {
  const char *name;
  uint8_t elem;
} dtypes[] = {
    {"BOOL", HR_ELEM_BOOL},
    {"U8", HR_ELEM_UINT8},
    {"I8", HR_ELEM_INT8},
    {"U16", HR_ELEM_UINT16},
    {"I16", HR_ELEM_INT16},
    {"U32", HR_ELEM_UINT32},
    {"I32", HR_ELEM_INT32},
    {"U64", HR_ELEM_UINT64},
    {"I64", HR_ELEM_INT64},
    {"F16", HR_ELEM_FLOAT16},
    {"BF16", HR_ELEM_BFLOAT16},
    {"F32", HR_ELEM_FLOAT32},
    {"F64", HR_ELEM_FLOAT64},
    {"F8_E4M3", HR_ELEM_FLOAT8_E4M3FN},
    {"F8_E5M2", HR_ELEM_FLOAT8_E5M2},
    {"C64", HR_ELEM_COMPLEX64},
    {"C128", HR_ELEM_COMPLEX128},
};

const char *hr_safetensors_dtype_name(uint8_t e) {
  size_t i;

  for (i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
    if (dtypes[i].elem == e)
      return dtypes[i].name;
  return NULL;
}

uint8_t hr_safetensors_dtype_parse(const char *name) {
  size_t i;

  if (!name)
    return HR_ELEM_NONE;
  for (i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
    if (strcmp(dtypes[i].name, name) == 0)
      return dtypes[i].elem;
  return HR_ELEM_NONE;
}

/* An exact integer in [0, 2^53]: JSON numbers arrive as doubles. */
static int json_u64(const cJSON *n, uint64_t *out) {
  double v;

  if (!cJSON_IsNumber(n))
    return -1;
  v = n->valuedouble;
  if (!(v >= 0) || v > 9007199254740992.0 || v != (double)(uint64_t)v)
    return -1;
  *out = (uint64_t)v;
  return 0;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int cmp_begin(const void *a, const void *b) {
  const st_tensor *x = *(const st_tensor *const *)a;
  const st_tensor *y = *(const st_tensor *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

static void free_tensors(hr_safetensors *f) {
  size_t i;

  for (i = 0; i < f->n; i++)
    hr__mem_free(&f->mem, f->v[i].name);
  hr__mem_free(&f->mem, f->v);
  f->v = NULL;
  f->n = 0;
}

/* Parses one entry of the header object. */
static int parse_entry(hr_safetensors *f, const cJSON *it, uint64_t data_len,
                       st_tensor *t, char *why, size_t why_len) {
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
  uint64_t shape[HR_MAX_RANK], bytes;
  unsigned rank = 0;
  const cJSON *d;
  uint8_t elem;
  size_t nlen;

  if (!cJSON_IsObject(it) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) ||
      !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2) {
    hr__files_why(why, why_len, "tensor \"%s\": malformed header entry",
                  it->string);
    return HR_ERR_INVALID_ARGUMENT;
  }
  elem = hr_safetensors_dtype_parse(dt->valuestring);
  if (elem == HR_ELEM_NONE) {
    hr__files_why(why, why_len, "tensor \"%s\": dtype %s is not supported",
                  it->string, dt->valuestring);
    return HR_ERR_UNSUPPORTED;
  }
  cJSON_ArrayForEach(d, sh) {
    if (rank >= HR_MAX_RANK || json_u64(d, &shape[rank]) != 0) {
      hr__files_why(why, why_len, "tensor \"%s\": bad shape", it->string);
      return HR_ERR_INVALID_ARGUMENT;
    }
    rank++;
  }
  if (json_u64(cJSON_GetArrayItem(off, 0), &t->begin) != 0 ||
      json_u64(cJSON_GetArrayItem(off, 1), &t->end) != 0 || t->begin > t->end ||
      t->end > data_len) {
    hr__files_why(why, why_len,
                  "tensor \"%s\": data_offsets outside the data section",
                  it->string);
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (hr__files_dense_desc(&t->desc, elem, HR_LAYOUT_ROW_MAJOR, rank, shape,
                           &bytes) != 0 ||
      bytes != t->end - t->begin) {
    hr__files_why(why, why_len,
                  "tensor \"%s\": %llu data bytes do not match dtype and "
                  "shape",
                  it->string, (unsigned long long)(t->end - t->begin));
    return HR_ERR_INVALID_ARGUMENT;
  }
  nlen = strlen(it->string) + 1;
  t->name = hr__mem_malloc(&f->mem, nlen);
  if (!t->name)
    return HR_ERR_NOMEM;
  memcpy(t->name, it->string, nlen);
  return 0;
}

static int parse_header(hr_safetensors *f, const char *json, size_t len,
                        uint64_t data_len, char *why, size_t why_len) {
  cJSON *root = cJSON_ParseWithLength(json, len), *it;
  st_tensor **order = NULL;
  size_t cap, i;
  int rv = 0;

  if (!cJSON_IsObject(root)) {
    hr__files_why(why, why_len, "the safetensors header is not a JSON object");
    rv = HR_ERR_INVALID_ARGUMENT;
    goto out;
  }
  cap = (size_t)cJSON_GetArraySize(root);
  f->v = hr__mem_calloc(&f->mem, cap ? cap : 1, sizeof *f->v);
  if (!f->v) {
    rv = HR_ERR_NOMEM;
    goto out;
  }
  cJSON_ArrayForEach(it, root) {
    if (!it->string) {
      rv = HR_ERR_INVALID_ARGUMENT;
      goto out;
    }
    if (strcmp(it->string, "__metadata__") == 0)
      continue;
    rv = parse_entry(f, it, data_len, &f->v[f->n], why, why_len);
    if (rv)
      goto out;
    f->n++;
  }
  /* No two tensors may share bytes (a shared byte would make a PUT of
   * one visible through the other). */
  order = hr__mem_malloc(&f->mem, (f->n ? f->n : 1) * sizeof *order);
  if (!order) {
    rv = HR_ERR_NOMEM;
    goto out;
  }
  for (i = 0; i < f->n; i++)
    order[i] = &f->v[i];
  qsort(order, f->n, sizeof *order, cmp_begin);
  /* Compared with the non-empty tensor that reaches furthest so far, not
   * with the previous one: an empty tensor (which shares no byte) between
   * two that overlap must not hide the overlap. */
  st_tensor *reach = NULL;
  for (i = 0; i < f->n; i++) {
    if (order[i]->begin == order[i]->end)
      continue;
    if (reach && order[i]->begin < reach->end) {
      hr__files_why(why, why_len, "tensors \"%s\" and \"%s\" overlap",
                    reach->name, order[i]->name);
      rv = HR_ERR_INVALID_ARGUMENT;
      goto out;
    }
    if (!reach || order[i]->end > reach->end)
      reach = order[i];
  }
  qsort(f->v, f->n, sizeof *f->v, cmp_name);
  for (i = 1; i < f->n; i++) {
    if (strcmp(f->v[i].name, f->v[i - 1].name) == 0) {
      hr__files_why(why, why_len, "tensor \"%s\" appears twice", f->v[i].name);
      rv = HR_ERR_INVALID_ARGUMENT;
      goto out;
    }
  }
out:
  hr__mem_free(&f->mem, order);
  cJSON_Delete(root);
  if (rv)
    free_tensors(f);
  return rv;
}

int hr_safetensors_open(hr_safetensors **out, const char *path,
                        const hr_mem *mem, char *why, size_t why_len) {
  hr_safetensors *f;
  const uint8_t *p;
  uint64_t size, hlen = 0;
  int rv, k;

  if (!out || !path)
    return HR_ERR_INVALID_ARGUMENT;
  if (!mem)
    mem = hr_mem_default();
  f = hr__mem_calloc(mem, 1, sizeof *f);
  if (!f)
    return HR_ERR_NOMEM;
  f->mem = *mem;
  rv = hr__mapfile_open(&f->map, path, mem, why, why_len);
  if (rv) {
    hr__mem_free(mem, f);
    return rv;
  }
  p = hr__mapfile_data(f->map);
  size = hr__mapfile_size(f->map);
  if (size < 8) {
    hr__files_why(why, why_len, "%s: too short for a safetensors file", path);
    rv = HR_ERR_INVALID_ARGUMENT;
    goto fail;
  }
  for (k = 7; k >= 0; k--)
    hlen = hlen << 8 | p[k];
  if (hlen > HEADER_MAX || hlen > size - 8) {
    hr__files_why(why, why_len, "%s: bad safetensors header length %llu", path,
                  (unsigned long long)hlen);
    rv = HR_ERR_INVALID_ARGUMENT;
    goto fail;
  }
  f->data_start = 8 + hlen;
  rv = parse_header(f, (const char *)p + 8, (size_t)hlen, size - f->data_start,
                    why, why_len);
  if (rv)
    goto fail;
  *out = f;
  return 0;
fail:
  hr__mapfile_unref(f->map);
  hr__mem_free(mem, f);
  return rv;
}

size_t hr_safetensors_count(const hr_safetensors *f) {
  return f ? f->n : 0;
}

const char *hr_safetensors_name(const hr_safetensors *f, size_t i) {
  return f && i < f->n ? f->v[i].name : NULL;
}

int hr_safetensors_tensor(hr_safetensors *f, size_t i, hr_tensor **out) {
  hr_descriptor d;
  const uint8_t *data;
  uintptr_t a;
  unsigned k = 0;

  if (!f || !out)
    return HR_ERR_INVALID_ARGUMENT;
  if (i >= f->n)
    return HR_ERR_NOT_FOUND;
  d = f->v[i].desc;
  data = hr__mapfile_data(f->map) + f->data_start + f->v[i].begin;
  a = (uintptr_t)data;
  while (k < 6 && a && !(a & ((uintptr_t)1 << k)))
    k++;
  d.buffers[0].alignment_log2 = (uint8_t)k;
  return hr__mapfile_wrap(f->map, &d, data, out);
}

void hr_safetensors_close(hr_safetensors *f) {
  if (!f)
    return;
  free_tensors(f);
  hr__mapfile_unref(f->map);
  hr__mem_free(&f->mem, f);
}
