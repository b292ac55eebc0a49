/*
 * .npy reading and writing.
 *
 * The header is a Python dict literal; only the subset numpy writes is
 * accepted: string, True/False and tuple-of-int values, and for 'descr' a
 * dtype string or a one-field structured list.  Everything is bounded by
 * the header length read from the file.
 */
#include <hurray/files.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hr_internal.h"
#include "hr_mapfile.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_ALIGN 64
#define DTYPE_MAX 64

/* ------------------------------------------------------------------------ */
/* dtypes                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct ext_name {
  const char *name;
  uint8_t elem;
  const char *field_type; /* the structured field's dtype when written */
} ext_name;

static const ext_name ext_names[] = {
    {"bfloat16", HR_ELEM_BFLOAT16, "<u2"},
    {"float8_e4m3fn", HR_ELEM_FLOAT8_E4M3FN, "|u1"},
    {"float8_e5m2", HR_ELEM_FLOAT8_E5M2, "|u1"},
};

const char *hr_npy_dtype(uint8_t e) {
  switch (e) {
  case HR_ELEM_BOOL: return "|b1";
  case HR_ELEM_INT8: return "|i1";
  case HR_ELEM_UINT8: return "|u1";
  case HR_ELEM_INT16: return "<i2";
  case HR_ELEM_UINT16: return "<u2";
  case HR_ELEM_INT32: return "<i4";
  case HR_ELEM_UINT32: return "<u4";
  case HR_ELEM_INT64: return "<i8";
  case HR_ELEM_UINT64: return "<u8";
  case HR_ELEM_FLOAT16: return "<f2";
  case HR_ELEM_FLOAT32: return "<f4";
  case HR_ELEM_FLOAT64: return "<f8";
  case HR_ELEM_COMPLEX64: return "<c8";
  case HR_ELEM_COMPLEX128: return "<c16";
  default: return NULL;
  }
}

/* Maps a dtype string ("<f4", "|b1", "bfloat16", "<V2") to an element
 * type.  Returns 0, or HR_ERR_UNSUPPORTED. */
static int dtype_parse(const char *s, uint8_t *elem, int *big) {
  char order = '=';
  char kind;
  unsigned long size;
  char *end;
  size_t i;

  *big = 0;
  if (*s == '<' || *s == '>' || *s == '|' || *s == '=') {
    order = *s;
    s++;
  }
  for (i = 0; i < sizeof ext_names / sizeof *ext_names; i++) {
    if (strcmp(s, ext_names[i].name) == 0) {
      *elem = ext_names[i].elem;
      *big = order == '>' && hr_elem_bits(*elem) > 8;
      return 0;
    }
  }
  /* An empty kind ("" or a bare "<") must not step past the NUL. */
  if (*s == '\0')
    return HR_ERR_UNSUPPORTED;
  kind = *s++;
  if (*s < '1' || *s > '9')
    return HR_ERR_UNSUPPORTED;
  size = strtoul(s, &end, 10);
  if (*end)
    return HR_ERR_UNSUPPORTED;
  *elem = HR_ELEM_NONE;
  switch (kind) {
  case 'b':
    if (size == 1)
      *elem = HR_ELEM_BOOL;
    break;
  case 'i':
    *elem = size == 1   ? HR_ELEM_INT8
            : size == 2 ? HR_ELEM_INT16
            : size == 4 ? HR_ELEM_INT32
            : size == 8 ? HR_ELEM_INT64
                        : HR_ELEM_NONE;
    break;
  case 'u':
    *elem = size == 1   ? HR_ELEM_UINT8
            : size == 2 ? HR_ELEM_UINT16
            : size == 4 ? HR_ELEM_UINT32
            : size == 8 ? HR_ELEM_UINT64
                        : HR_ELEM_NONE;
    break;
  case 'f':
    *elem = size == 2   ? HR_ELEM_FLOAT16
            : size == 4 ? HR_ELEM_FLOAT32
            : size == 8 ? HR_ELEM_FLOAT64
                        : HR_ELEM_NONE;
    break;
  case 'c':
    *elem = size == 8    ? HR_ELEM_COMPLEX64
            : size == 16 ? HR_ELEM_COMPLEX128
                         : HR_ELEM_NONE;
    break;
  case 'V':
    /* ml_dtypes saves bfloat16 arrays as a 2-byte void; it is the only
     * 2-byte type numpy lacks.  1-byte voids (float8) are ambiguous. */
    if (size == 2)
      *elem = HR_ELEM_BFLOAT16;
    break;
  default: break;
  }
  if (*elem == HR_ELEM_NONE)
    return HR_ERR_UNSUPPORTED;
  *big = order == '>' && size > 1;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The header dict                                                           */
/* ------------------------------------------------------------------------ */

typedef struct pcur {
  const char *p, *end;
} pcur;

static void skip_ws(pcur *c) {
  while (c->p < c->end &&
         (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
    c->p++;
}

static int eat(pcur *c, char ch) {
  skip_ws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return 1;
  }
  return 0;
}

static int parse_str(pcur *c, char *out, size_t cap) {
  char q;
  size_t n = 0;

  skip_ws(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
    return -1;
  q = *c->p++;
  while (c->p < c->end && *c->p != q) {
    if (*c->p == '\\' || n + 1 >= cap)
      return -1;
    out[n++] = *c->p++;
  }
  if (c->p >= c->end)
    return -1;
  c->p++;
  out[n] = '\0';
  return 0;
}

static int parse_word(pcur *c, const char *w) {
  size_t n = strlen(w);

  skip_ws(c);
  if ((size_t)(c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
    c->p += n;
    return 1;
  }
  return 0;
}

static int parse_shape(pcur *c, uint64_t *shape, unsigned *rank) {
  *rank = 0;
  if (!eat(c, '('))
    return -1;
  for (;;) {
    uint64_t v = 0;
    int digits = 0;

    if (eat(c, ')'))
      return 0;
    skip_ws(c);
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) ||
          __builtin_add_overflow(v, (uint64_t)(*c->p - '0'), &v))
        return -1;
      c->p++;
      digits++;
    }
    if (!digits)
      return -1;
    if (c->p < c->end && *c->p == 'L') /* Python 2 longs */
      c->p++;
    if (*rank >= HR_MAX_RANK)
      return -2;
    shape[(*rank)++] = v;
    if (eat(c, ','))
      continue;
    if (eat(c, ')'))
      return 0;
    return -1;
  }
}

/* descr: a dtype string, or [('name', 'type')] for the extended types. */
static int parse_descr(pcur *c, uint8_t *elem, int *big, char *why,
                       size_t why_len) {
  char a[DTYPE_MAX], b[DTYPE_MAX];
  size_t i;

  skip_ws(c);
  if (c->p < c->end && *c->p == '[') {
    c->p++;
    if (!eat(c, '(') || parse_str(c, a, sizeof a) || !eat(c, ',') ||
        parse_str(c, b, sizeof b) || !eat(c, ')')) {
      hr__files_why(why, why_len, "unsupported structured dtype");
      return HR_ERR_UNSUPPORTED;
    }
    eat(c, ',');
    if (!eat(c, ']')) {
      hr__files_why(why, why_len,
                    "structured dtypes of several fields are not tensors");
      return HR_ERR_UNSUPPORTED;
    }
    for (i = 0; i < sizeof ext_names / sizeof *ext_names; i++) {
      uint8_t e2;
      int big2;
      if (strcmp(a, ext_names[i].name) != 0)
        continue;
      if (dtype_parse(b, &e2, &big2) != 0 ||
          hr_elem_bits(e2) != hr_elem_bits(ext_names[i].elem))
        break;
      *elem = ext_names[i].elem;
      *big = big2;
      return 0;
    }
    hr__files_why(why, why_len, "unsupported structured dtype [('%s', '%s')]",
                  a, b);
    return HR_ERR_UNSUPPORTED;
  }
  if (parse_str(c, a, sizeof a)) {
    hr__files_why(why, why_len, "malformed descr in the .npy header");
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (dtype_parse(a, elem, big) != 0) {
    hr__files_why(why, why_len,
                  "dtype '%s' has no Hurray element type (object, string "
                  "and 1-byte void dtypes cannot be served)",
                  a);
    return HR_ERR_UNSUPPORTED;
  }
  return 0;
}

static unsigned align_log2_of(const void *p) {
  uintptr_t v = (uintptr_t)p;
  unsigned k = 0;

  if (!v)
    return 0;
  while (k < 6 && !(v & ((uintptr_t)1 << k)))
    k++;
  return k;
}

int hr_npy_parse(const void *data, size_t len, uint64_t file_size,
                 hr_npy_info *out, char *why, size_t why_len) {
  const uint8_t *b = data;
  uint64_t hlen, start, shape[HR_MAX_RANK], bytes;
  unsigned rank = 0;
  uint8_t elem = HR_ELEM_NONE;
  int big = 0, fortran = -1, have_descr = 0, have_shape = 0, rv;
  pcur c;

  if (!data || !out)
    return HR_ERR_INVALID_ARGUMENT;
  memset(out, 0, sizeof *out);
  if (len < 10 || memcmp(b, NPY_MAGIC, 6) != 0) {
    hr__files_why(why, why_len, "not a .npy file (bad magic)");
    return HR_ERR_INVALID_ARGUMENT;
  }
  out->major = b[6];
  out->minor = b[7];
  if (b[6] == 1) {
    hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8;
    start = 10;
  } else if (b[6] == 2 || b[6] == 3) {
    if (len < 12) {
      hr__files_why(why, why_len, "truncated .npy header");
      return HR_ERR_INVALID_ARGUMENT;
    }
    hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8 | (uint64_t)b[10] << 16 |
           (uint64_t)b[11] << 24;
    start = 12;
  } else {
    hr__files_why(why, why_len, ".npy format version %u.%u not supported", b[6],
                  b[7]);
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (hlen > len - start) {
    hr__files_why(why, why_len, "truncated .npy header");
    return HR_ERR_INVALID_ARGUMENT;
  }
  c.p = (const char *)b + start;
  c.end = c.p + hlen;
  if (!eat(&c, '{'))
    goto malformed;
  for (;;) {
    char key[32];

    if (eat(&c, '}'))
      break;
    if (parse_str(&c, key, sizeof key) || !eat(&c, ':'))
      goto malformed;
    if (strcmp(key, "descr") == 0 && !have_descr) {
      rv = parse_descr(&c, &elem, &big, why, why_len);
      if (rv)
        return rv;
      have_descr = 1;
    } else if (strcmp(key, "fortran_order") == 0 && fortran < 0) {
      if (parse_word(&c, "True"))
        fortran = 1;
      else if (parse_word(&c, "False"))
        fortran = 0;
      else
        goto malformed;
    } else if (strcmp(key, "shape") == 0 && !have_shape) {
      rv = parse_shape(&c, shape, &rank);
      if (rv == -2) {
        hr__files_why(why, why_len, "rank above %u", HR_MAX_RANK);
        return HR_ERR_INVALID_ARGUMENT;
      }
      if (rv)
        goto malformed;
      have_shape = 1;
    } else {
      goto malformed;
    }
    if (eat(&c, ','))
      continue;
    if (eat(&c, '}'))
      break;
    goto malformed;
  }
  if (!have_descr || fortran < 0 || !have_shape)
    goto malformed;
  skip_ws(&c);
  if (c.p != c.end)
    goto malformed;
  /* Fortran order of rank < 2 is the same bytes as C order. */
  if (hr__files_dense_desc(&out->desc, elem,
                           fortran && rank >= 2 ? HR_LAYOUT_COLUMN_MAJOR
                                                : HR_LAYOUT_ROW_MAJOR,
                           rank, shape, &bytes) != 0) {
    hr__files_why(why, why_len, "array size overflows 64 bits");
    return HR_ERR_INVALID_ARGUMENT;
  }
  out->data_offset = start + hlen;
  out->big_endian = big;
  if (file_size != UINT64_MAX &&
      (file_size < out->data_offset || file_size - out->data_offset < bytes)) {
    hr__files_why(why, why_len,
                  "truncated .npy: the header promises %llu data bytes",
                  (unsigned long long)bytes);
    return HR_ERR_INVALID_ARGUMENT;
  }
  return 0;
malformed:
  hr__files_why(why, why_len, "malformed .npy header");
  return HR_ERR_INVALID_ARGUMENT;
}

/* Byte-swaps `n` bytes of elements of `width` bytes (complex: per part). */
static void swap_copy(uint8_t *dst, const uint8_t *src, uint64_t n,
                      unsigned width) {
  uint64_t i;
  unsigned k;

  for (i = 0; i + width <= n; i += width)
    for (k = 0; k < width; k++)
      dst[i + k] = src[i + width - 1 - k];
}

int hr_npy_load(hr_tensor **out, const char *path, const hr_mem *mem, char *why,
                size_t why_len) {
  hr__mapfile *m;
  hr_npy_info info;
  const uint8_t *data;
  int rv;

  if (!out || !path)
    return HR_ERR_INVALID_ARGUMENT;
  rv = hr__mapfile_open(&m, path, mem, why, why_len);
  if (rv)
    return rv;
  rv = hr_npy_parse(hr__mapfile_data(m), (size_t)hr__mapfile_size(m),
                    hr__mapfile_size(m), &info, why, why_len);
  if (rv) {
    hr__mapfile_unref(m);
    return rv;
  }
  data = hr__mapfile_data(m) + info.data_offset;
  if (info.big_endian) {
    unsigned width = hr_elem_bits(info.desc.element_type) / 8;
    hr_tensor *t;
    if (info.desc.element_type == HR_ELEM_COMPLEX64 ||
        info.desc.element_type == HR_ELEM_COMPLEX128)
      width /= 2;
    info.desc.buffers[0].alignment_log2 = 6;
    rv = hr_tensor_alloc(&t, &info.desc, 6, mem);
    if (rv == 0) {
      swap_copy(hr_tensor_buffer(t, 0), data, info.desc.buffers[0].size_bytes,
                width);
      *out = t;
    }
    hr__mapfile_unref(m);
    return rv;
  }
  info.desc.buffers[0].alignment_log2 = (uint8_t)align_log2_of(data);
  rv = hr__mapfile_wrap(m, &info.desc, data, out);
  hr__mapfile_unref(m);
  return rv;
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */
/* ------------------------------------------------------------------------ */

static int descr_of(uint8_t elem, char *out, size_t cap) {
  const char *s = hr_npy_dtype(elem);
  size_t i;

  if (s)
    return snprintf(out, cap, "'%s'", s);
  if (elem == HR_ELEM_INT4)
    return snprintf(out, cap, "'|i1'");
  if (elem == HR_ELEM_UINT4)
    return snprintf(out, cap, "'|u1'");
  for (i = 0; i < sizeof ext_names / sizeof *ext_names; i++)
    if (ext_names[i].elem == elem)
      return snprintf(out, cap, "[('%s', '%s')]", ext_names[i].name,
                      ext_names[i].field_type);
  return -1;
}

int64_t hr_npy_header(const hr_descriptor *d, char *out, size_t cap) {
  char dict[64 + HR_MAX_RANK * 22 + DTYPE_MAX], descr[DTYPE_MAX];
  size_t n, total, pad, hlen;
  unsigned k;
  int major;

  if (!d || d->buffer_count != 1 ||
      (d->layout.tag != HR_LAYOUT_ROW_MAJOR &&
       d->layout.tag != HR_LAYOUT_COLUMN_MAJOR) ||
      descr_of(d->element_type, descr, sizeof descr) < 0)
    return HR_ERR_UNSUPPORTED;
  n = (size_t)snprintf(
      dict, sizeof dict, "{'descr': %s, 'fortran_order': %s, 'shape': (", descr,
      d->layout.tag == HR_LAYOUT_COLUMN_MAJOR ? "True" : "False");
  for (k = 0; k < d->rank; k++)
    n += (size_t)snprintf(dict + n, sizeof dict - n, "%s%llu", k ? ", " : "",
                          (unsigned long long)d->shape[k]);
  n += (size_t)snprintf(dict + n, sizeof dict - n, "%s), }",
                        d->rank == 1 ? "," : "");
  /* magic(6) + version(2) + length(2 or 4) + dict + padding + '\n' */
  major = n + 1 + NPY_ALIGN > 65535 ? 2 : 1;
  total = (major == 1 ? 10 : 12) + n + 1;
  pad = (NPY_ALIGN - total % NPY_ALIGN) % NPY_ALIGN;
  total += pad;
  hlen = n + pad + 1;
  if (total > cap)
    return HR_ERR_BUFFER_TOO_SMALL;
  memcpy(out, NPY_MAGIC, 6);
  out[6] = (char)major;
  out[7] = 0;
  if (major == 1) {
    out[8] = (char)(hlen & 0xff);
    out[9] = (char)(hlen >> 8);
    k = 10;
  } else {
    out[8] = (char)(hlen & 0xff);
    out[9] = (char)((hlen >> 8) & 0xff);
    out[10] = (char)((hlen >> 16) & 0xff);
    out[11] = (char)(hlen >> 24);
    k = 12;
  }
  memcpy(out + k, dict, n);
  memset(out + k + n, ' ', pad);
  out[total - 1] = '\n';
  return (int64_t)total;
}

static int write_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;

  while (n) {
    ssize_t w = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

/* INT4/UINT4: two elements per byte, element 2k in the low nibble; the
 * .npy gets one (sign-extended) byte per element. */
static int write_widened(int fd, const uint8_t *src, uint64_t elems,
                         int is_signed) {
  uint8_t buf[65536];
  uint64_t i = 0;
  size_t n = 0;

  for (i = 0; i < elems; i++) {
    uint8_t v = (uint8_t)((src[i / 2] >> ((i & 1) * 4)) & 0x0f);
    if (is_signed && (v & 0x08))
      v |= 0xf0;
    buf[n++] = v;
    if (n == sizeof buf) {
      if (write_all(fd, buf, n))
        return -1;
      n = 0;
    }
  }
  return n ? write_all(fd, buf, n) : 0;
}

int hr_npy_save(const char *path, const hr_descriptor *d, const void *data,
                char *why, size_t why_len) {
  char hdr[1024];
  int64_t hlen;
  uint64_t elems = 1;
  unsigned k;
  int fd, rv = 0, err;

  if (!path || !d ||
      (!data && d->buffer_count == 1 && d->buffers[0].size_bytes))
    return HR_ERR_INVALID_ARGUMENT;
  hlen = hr_npy_header(d, hdr, sizeof hdr);
  if (hlen < 0) {
    hr__files_why(why, why_len, "a %s tensor of %s cannot be written as .npy",
                  hr_layout_name(d->layout.tag),
                  hr_elem_type_name(d->element_type));
    return (int)hlen;
  }
  for (k = 0; k < d->rank; k++)
    elems *= d->shape[k];
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    hr__files_why(why, why_len, "cannot create %s: %s", path, strerror(errno));
    return HR_ERR_IO;
  }
  if (write_all(fd, hdr, (size_t)hlen))
    rv = HR_ERR_IO;
  else if (d->element_type == HR_ELEM_INT4 || d->element_type == HR_ELEM_UINT4)
    rv = write_widened(fd, data, elems, d->element_type == HR_ELEM_INT4)
             ? HR_ERR_IO
             : 0;
  else if (d->buffers[0].size_bytes &&
           write_all(fd, data, (size_t)d->buffers[0].size_bytes))
    rv = HR_ERR_IO;
  err = errno;
  if (close(fd) != 0 && !rv) {
    err = errno;
    rv = HR_ERR_IO;
  }
  if (rv)
    hr__files_why(why, why_len, "cannot write %s: %s", path, strerror(err));
  return rv;
}
