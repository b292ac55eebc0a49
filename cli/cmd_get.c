/*
 * `hurray get [--layout NAME]... [--allow-transcode] [--device NAME]
 *             [--parallel N] [--connections C]
 *             [--region OFF,...:SHAPE,... | --slice DIM:RANK/COUNT]
 *             [-o OUT.npy] [--stats] [--no-shm] [--dump-wire FILE] [--timeout S]
 *             [--tls-ca F] [--tls-cert F --tls-key F] [--fabric PROVIDER]
 *             URL KEY`
 *
 * URL is hurray://HOST:PORT, hurrays://HOST:PORT (TLS: --tls-ca names the
 * CA that issued the server's certificate, the system's store otherwise;
 * --tls-cert/--tls-key the client certificate a mutual-TLS server asks
 * for) or unix:PATH.
 *
 * --connections opens one session over C connections (its lanes): the
 * shards of a --parallel GET travel over all of them.  --slice fetches
 * the slice rank RANK of COUNT holds when the tensor is cut along DIM
 * (tensor-parallel loading; the shape comes from LIST).
 *
 * Fetches one tensor.  With -o the result is always a valid .npy: a
 * ROW_MAJOR answer is written in C order, a COLUMN_MAJOR one in Fortran
 * order, and any other layout is converted here to C order with the
 * transcode kernels.  A composite is written member by member as
 * OUT.0.npy, OUT.1.npy, ... (nested members as OUT.1.0.npy).  Without -o
 * a one-line summary is printed.  --stats prints one JSON line on stderr
 * at the end: "data_plane" says what carried the bytes ("rdma" or
 * "frames") and "fallback" why the RDMA data plane was not used or
 * failed.  --fabric PROVIDER (or "auto") opens a libfabric endpoint, so
 * that a server started with --fabric sends over the RDMA data plane.
 *
 * --device cuda|rocm|level_zero|vulkan|sim receives into that device's
 * memory (through pinned staging, copied as the frames arrive: backends
 * cuda, hip, ze, vulkan, sim), asking the server for that placement and
 * advertising the device and the CPU; -o then copies the result back to
 * the host to write it.  --device cpu (the default) receives in host
 * memory.
 *
 * Over a Unix socket (unix:PATH) the tensor comes over the shared-memory
 * plane ("shm") when the server offers it (mapped, not copied); --no-shm
 * asks for frames.  A segment that cannot be mapped fails the first try,
 * and the GET is retried once over frames.  With --device, a server
 * whose tensor lives in shareable memory of that device hands over the
 * device memory itself (imported, no staging: --stats says "shm" with the
 * device); a host segment is copied to the device.
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hurray/files.h>
#include <hurray/gpu.h>
#include <hurray/transcode.h>

#include "cli.h"

#define SYNOPSIS                                                               \
  "[--layout NAME]... [--allow-transcode] [--device NAME] [--parallel N] "     \
  "[--connections C] [--region OFF,...:SHAPE,... | --slice DIM:RANK/COUNT] "   \
  "[-o OUT.npy] [--stats] [--no-shm] [--dump-wire FILE] "                      \
  CLI_TLS_SYNOPSIS " [--fabric PROVIDER] [--auth-token-file F] URL KEY"

#define EXT_MAX (1 + 4 * HR_MAX_RANK)

typedef struct get_args {
  hr_layout_entry layouts[HR_MAX_LAYOUTS];
  uint8_t ext[HR_MAX_LAYOUTS][EXT_MAX];
  uint16_t nlayouts;
  int allow_transcode;
  int device;
  uint64_t parallel;
  int region;
  uint8_t region_rank;
  uint64_t region_offset[HR_MAX_RANK];
  uint64_t region_shape[HR_MAX_RANK];
  uint64_t connections;
  const char *token_file; /* --auth-token-file */
  int slice;
  uint64_t slice_dim, slice_rank, slice_count;
  const char *out;
  int stats;
  const char *fabric; /* --fabric PROVIDER */
  const char *dump;
  int64_t timeout_ms;
  const char *url;
  const char *key;
} get_args;

/* Layout names of the command line. */
static int parse_layout(get_args *a, const char *name) {
  hr_layout_entry *e;
  hr_layout_profile pr;
  uint64_t v[HR_MAX_RANK];
  int n, k, len;

  if (a->nlayouts >= HR_MAX_LAYOUTS)
    return -1;
  e = &a->layouts[a->nlayouts];
  memset(e, 0, sizeof *e);
  memset(&pr, 0, sizeof pr);
  if (!strcmp(name, "row-major"))
    e->tag = HR_LAYOUT_ROW_MAJOR;
  else if (!strcmp(name, "column-major"))
    e->tag = HR_LAYOUT_COLUMN_MAJOR;
  else if (!strcmp(name, "strided"))
    e->tag = HR_LAYOUT_STRIDED;
  else if (!strcmp(name, "permuted"))
    e->tag = HR_LAYOUT_PERMUTED;
  else if (!strcmp(name, "tiled"))
    e->tag = HR_LAYOUT_TILED;
  else if (!strcmp(name, "sparse-coo"))
    e->tag = HR_LAYOUT_SPARSE_COO;
  else if (!strcmp(name, "sparse-csr"))
    e->tag = HR_LAYOUT_SPARSE_CSR;
  else if (!strcmp(name, "sparse-csc"))
    e->tag = HR_LAYOUT_SPARSE_CSC;
  else if (!strncmp(name, "panel:", 6)) {
    if (cli_parse_list(name + 6, v, 1) != 1 || v[0] < 1 || v[0] > UINT32_MAX)
      return -1;
    pr.tag = HR_LAYOUT_PANEL;
    pr.mr = (uint32_t)v[0];
  } else if (!strncmp(name, "tiled:", 6)) {
    n = cli_parse_list(name + 6, v, HR_MAX_RANK);
    if (n < 1)
      return -1;
    pr.tag = HR_LAYOUT_TILED_EXACT;
    pr.rank = (uint8_t)n;
    for (k = 0; k < n; k++) {
      if (v[k] < 1 || v[k] > UINT32_MAX)
        return -1;
      pr.tile[k] = (uint32_t)v[k];
    }
  } else if (!strncmp(name, "permuted:", 9)) {
    n = cli_parse_list(name + 9, v, HR_MAX_RANK);
    if (n < 1)
      return -1;
    pr.tag = HR_LAYOUT_PERMUTED_EXACT;
    pr.rank = (uint8_t)n;
    for (k = 0; k < n; k++) {
      if (v[k] >= (uint64_t)n)
        return -1;
      pr.order[k] = (uint8_t)v[k];
    }
  } else {
    return -1;
  }
  if (pr.tag) {
    len = hr_layout_profile_encode(&pr, a->ext[a->nlayouts], EXT_MAX);
    if (len < 0)
      return -1;
    e->tag = pr.tag;
    e->ext = a->ext[a->nlayouts];
    e->ext_len = (uint16_t)len;
  }
  a->nlayouts++;
  return 0;
}

/* The device backend that lands a --device tag (NULL: none). */
static const char *device_backend(int tag) {
  switch (tag) {
  case HR_DEV_CUDA:
    return "cuda";
  case HR_DEV_ROCM:
    return "hip";
  case HR_DEV_LEVEL_ZERO:
    return "ze";
  case HR_DEV_VULKAN:
    return "vulkan";
  case HR_GPU_DEV_SIM:
    return "sim";
  default:
    return NULL;
  }
}

static int parse_device(const char *name) {
  int t;

  if (!strcmp(name, "sim"))
    return HR_GPU_DEV_SIM;
  for (t = 0; t <= HR_DEV_LAST; t++) {
    const char *n = hr_device_name((uint8_t)t);
    size_t i;
    for (i = 0; n[i] && name[i]; i++)
      if (tolower((unsigned char)n[i]) != tolower((unsigned char)name[i]))
        break;
    if (!n[i] && !name[i])
      return t;
  }
  return -1;
}

int cli_parse_device(const char *name) {
  return parse_device(name);
}

const char *cli_device_backend(int tag) {
  return device_backend(tag);
}

static int parse_region(get_args *a, const char *s) {
  const char *colon = strchr(s, ':');
  char off[1024];
  int n, m;

  if (!colon || (size_t)(colon - s) >= sizeof off)
    return -1;
  memcpy(off, s, (size_t)(colon - s));
  off[colon - s] = '\0';
  n = cli_parse_list(off, a->region_offset, HR_MAX_RANK);
  m = cli_parse_list(colon + 1, a->region_shape, HR_MAX_RANK);
  if (n < 1 || n != m)
    return -1;
  a->region = 1;
  a->region_rank = (uint8_t)n;
  return 0;
}

/* "DIM:RANK/COUNT". */
static int parse_slice(get_args *a, const char *s) {
  char buf[96];
  char *colon, *slash;

  if (strlen(s) >= sizeof buf)
    return -1;
  strcpy(buf, s);
  colon = strchr(buf, ':');
  slash = colon ? strchr(colon + 1, '/') : NULL;
  if (!colon || !slash)
    return -1;
  *colon = *slash = '\0';
  if (cli_parse_u64(buf, &a->slice_dim) ||
      cli_parse_u64(colon + 1, &a->slice_rank) ||
      cli_parse_u64(slash + 1, &a->slice_count) ||
      a->slice_dim >= HR_MAX_RANK || a->slice_count < 1 ||
      a->slice_count > UINT32_MAX || a->slice_rank >= a->slice_count)
    return -1;
  a->slice = 1;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */
/* ------------------------------------------------------------------------ */

/* Converts a dense non-C/F tensor to ROW_MAJOR with the transcode kernels
 * and writes it.  Returns 0 or 1 (reported). */
static int write_converted(const char *path, hr_tensor *t) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  hr_xc_tensor src;
  hr_xc_target dst;
  hr_xc_plan *plan = NULL;
  hr_wire_status st;
  hr_descriptor out;
  char why[256];
  void *buf = NULL;
  uint64_t size;
  unsigned k;
  int rv;

  memset(&src, 0, sizeof src);
  src.desc = d;
  for (k = 0; k < d->buffer_count && k < HR_MAX_BUFFERS; k++) {
    src.buffers[k] = hr_tensor_buffer(t, k);
    src.sizes[k] = d->buffers[k].size_bytes;
  }
  memset(&dst, 0, sizeof dst);
  dst.layout = HR_LAYOUT_ROW_MAJOR;
  memset(&st, 0, sizeof st);
  rv = hr_xc_plan_new(&plan, &src, &dst, NULL, NULL, NULL, &st);
  if (rv) {
    cli_err("get",
            "cannot convert the %s answer to C order: %s%s%s (ask "
            "for --layout row-major --allow-transcode)",
            hr_layout_name(d->layout.tag), hr_strerror(rv),
            rv == HR_ERR_PROTO ? ": " : "",
            rv == HR_ERR_PROTO ? st.reason : "");
    return CLI_EXIT_FAIL;
  }
  size = hr_xc_plan_out_size(plan);
  buf = malloc(size ? (size_t)size : 1);
  if (!buf) {
    hr_xc_plan_del(plan);
    cli_err("get", "out of memory converting %llu bytes to C order",
            (unsigned long long)size);
    return CLI_EXIT_FAIL;
  }
  rv = hr_xc_run(plan, 0, size, buf);
  if (rv == 0)
    rv = hr_xc_plan_describe(plan, &out);
  hr_xc_plan_del(plan);
  if (rv) {
    free(buf);
    cli_err("get", "conversion to C order failed: %s", hr_strerror(rv));
    return CLI_EXIT_FAIL;
  }
  out.buffers[0].device_tag = HR_DEV_CPU;
  rv = hr_npy_save(path, &out, buf, why, sizeof why);
  free(buf);
  if (rv) {
    cli_err("get", "%s (check the directory and free space)", why);
    return CLI_EXIT_FAIL;
  }
  return 0;
}

/* Writes `t` to `path` (composites: one file per member, see above).
 * *converted is set when a local conversion ran. */
static int write_tensor(const char *path, hr_tensor *t, int *converted) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  char why[256];
  size_t i, n;
  int rv;

  if (d->layout.tag == HR_LAYOUT_COMPOSITE) {
    size_t len = strlen(path);
    int stem =
        (int)(len >= 4 && !strcmp(path + len - 4, ".npy") ? len - 4 : len);
    n = hr_tensor_member_count(t);
    for (i = 0; i < n; i++) {
      char sub[4096];
      if (snprintf(sub, sizeof sub, "%.*s.%zu.npy", stem, path, i) >=
          (int)sizeof sub) {
        cli_err("get", "output path too long");
        return CLI_EXIT_FAIL;
      }
      rv = write_tensor(sub, hr_tensor_member(t, i), converted);
      if (rv)
        return rv;
      if (hr_tensor_descriptor(hr_tensor_member(t, i))->layout.tag !=
          HR_LAYOUT_COMPOSITE)
        printf("wrote %s\n", sub);
    }
    return 0;
  }
  if ((d->layout.tag == HR_LAYOUT_ROW_MAJOR ||
       d->layout.tag == HR_LAYOUT_COLUMN_MAJOR) &&
      d->buffer_count == 1) {
    rv = hr_npy_save(path, d, hr_tensor_buffer(t, 0), why, sizeof why);
    if (rv) {
      cli_err("get", "%s (check the directory and free space)", why);
      return CLI_EXIT_FAIL;
    }
    return 0;
  }
  *converted = 1;
  return write_converted(path, t);
}

/* What LIST says about the key: its size (for the progress bar) and its
 * stored layout (the wire does not say whether the server transcoded; the
 * stored layout against the delivered one does). */
typedef struct probe {
  const char *key;
  int found;
  uint64_t bytes;
  uint8_t layout;
} probe;

static int probe_entry(const hr_list_entry *e, void *ud) {
  probe *p = ud;

  if (e->key_len == strlen(p->key) && !memcmp(e->key, p->key, e->key_len)) {
    p->found = 1;
    p->bytes = e->total_data_bytes;
    p->layout = e->layout_tag;
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* --stats                                                                   */
/* ------------------------------------------------------------------------ */

static void lower(char *dst, const char *src, size_t cap) {
  size_t i;

  for (i = 0; src[i] && i + 1 < cap; i++)
    dst[i] = (char)tolower((unsigned char)src[i]);
  dst[i] = '\0';
}

/* 1/0 when known, -1 when not: the server's own record when it says,
 * else the stored layout (from LIST) against the delivered one. */
static int transcoded_of(const hr_transfer_record *rec, const probe *pr) {
  if (rec->transcoded >= 0)
    return rec->transcoded != 0;
  if (!pr || !pr->found)
    return -1;
  return pr->layout != rec->layout;
}

/* "tls": what the connection negotiated, or null on a plain one. */
static void add_tls(cJSON *o, const hr_client *cl) {
  hr_tls_info ti;
  cJSON *j;

  if (!cl || hr_client_tls_info(cl, &ti) != 0) {
    cJSON_AddNullToObject(o, "tls");
    return;
  }
  j = cJSON_AddObjectToObject(o, "tls");
  if (!j)
    return;
  cJSON_AddStringToObject(j, "version", ti.version);
  cJSON_AddStringToObject(j, "cipher", ti.cipher);
  cJSON_AddBoolToObject(j, "ktls_tx", ti.ktls_tx);
  cJSON_AddBoolToObject(j, "ktls_rx", ti.ktls_rx);
}

static void print_stats(const get_args *a, const hr_transfer_record *rec,
                        hr_tensor *t, int converted, const probe *pr,
                        unsigned connections, const hr_client *cl) {
  cJSON *o = cJSON_CreateObject(), *shape;
  const hr_descriptor *d = t ? hr_tensor_descriptor(t) : NULL;
  double secs = rec->finished > rec->started
                    ? (double)(rec->finished - rec->started) / 1e9
                    : 0.0;
  char dev[32];
  char *line;
  unsigned k;

  if (!o)
    return;
  cJSON_AddStringToObject(o, "key", a->key);
  cJSON_AddStringToObject(o, "data_plane",
                          rec->data_plane == HR_PLANE_RDMA  ? "rdma"
                          : rec->data_plane == HR_PLANE_SHM ? "shm"
                                                            : "frames");
  cJSON_AddStringToObject(o, "layout", hr_layout_name(rec->layout));
  if (transcoded_of(rec, pr) < 0)
    cJSON_AddNullToObject(o, "transcoded");
  else
    cJSON_AddBoolToObject(o, "transcoded", transcoded_of(rec, pr));
  cJSON_AddBoolToObject(o, "converted_locally", converted);
  lower(dev, hr_device_name(rec->device), sizeof dev);
  cJSON_AddStringToObject(o, "device", dev);
  if (rec->fallback[0])
    cJSON_AddStringToObject(o, "fallback", rec->fallback);
  else
    cJSON_AddNullToObject(o, "fallback");
  cJSON_AddNumberToObject(o, "shards", rec->shards);
  /* lanes: connections the shards came over; connections: those of the
   * session. */
  cJSON_AddNumberToObject(o, "lanes", rec->lanes);
  cJSON_AddNumberToObject(o, "connections", connections);
  cJSON_AddNumberToObject(o, "bytes", (double)rec->bytes);
  cJSON_AddNumberToObject(o, "seconds", secs);
  cJSON_AddNumberToObject(o, "gb_per_s",
                          secs > 0 ? (double)rec->bytes / secs / 1e9 : 0.0);
  if (d) {
    cJSON_AddStringToObject(o, "element_type",
                            hr_elem_type_name(d->element_type));
    shape = cJSON_AddArrayToObject(o, "shape");
    for (k = 0; shape && k < d->rank; k++)
      cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)d->shape[k]));
  }
  add_tls(o, cl);
  if (rec->status) {
    cJSON_AddStringToObject(o, "error", hr_wire_error_name(rec->wire_error));
  }
  line = cJSON_PrintUnformatted(o);
  if (line) {
    fprintf(stderr, "%s\n", line);
    free(line);
  }
  cJSON_Delete(o);
}

/* Copies a device tensor back to host memory (D2H) for writing. */
static int device_to_host(hr_gpu *g, hr_tensor *dt, hr_tensor **out) {
  hr_descriptor d = *hr_tensor_descriptor(dt);
  hr_gpu_stream *s = NULL;
  unsigned k;
  int rv;

  for (k = 0; k < d.buffer_count; k++) {
    d.buffers[k].device_tag = HR_DEV_CPU;
    d.buffers[k].sync_mode = HR_SYNC_PRODUCER_SYNCED;
  }
  rv = hr_tensor_alloc(out, &d, 6, NULL);
  if (rv == 0)
    rv = hr_gpu_stream_new(g, &s);
  if (rv == 0 && hr_tensor_gpu_event(dt))
    rv = hr_gpu_stream_wait_event(s, hr_tensor_gpu_event(dt));
  for (k = 0; k < d.buffer_count && rv == 0; k++) {
    hr_gpu_buf *h = NULL;
    uint64_t n = d.buffers[k].size_bytes;
    if (n == 0)
      continue;
    rv = hr_gpu_buf_wrap_host(g, hr_tensor_buffer(*out, k), n, &h);
    if (rv == 0)
      rv = hr_gpu_copy_async(s, h, 0, hr_tensor_gpu_buf(dt, k), 0, n);
    if (rv == 0)
      rv = hr_gpu_stream_sync(s);
    hr_gpu_buf_del(h);
  }
  hr_gpu_stream_del(s);
  if (rv) {
    hr_tensor_unref(*out);
    *out = NULL;
  }
  return rv;
}

/* ------------------------------------------------------------------------ */

int cli_get(int argc, char **argv) {
  get_args a;
  hr_get_opts go;
  hr_transfer_record rec;
  hr_tensor *t = NULL;
  cli_conn cc;
  cli_conn_opts co;
  probe pr;
  int i, rv, status = 0, converted = 0, npos = 0;
  size_t key_len;
  hr_gpu *gpu = NULL;
  uint8_t devs[2];

  memset(&a, 0, sizeof a);
  memset(&co, 0, sizeof co);
  a.device = HR_DEV_CPU;
  for (i = 1; i < argc; i++) {
    const char *s = argv[i];
    int more = i + 1 < argc;
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
      printf("usage: hurray get " SYNOPSIS "\n");
      return 0;
    } else if (!strcmp(s, "--layout") && more) {
      if (parse_layout(&a, argv[++i]))
        return cli_usage("get", SYNOPSIS,
                         "unknown layout \"%s\" (row-major, column-major, "
                         "strided, permuted, tiled, panel:MR, tiled:T0,T1,.., "
                         "permuted:P0,P1,..)",
                         argv[i]);
    } else if (!strcmp(s, "--allow-transcode")) {
      a.allow_transcode = 1;
    } else if (!strcmp(s, "--device") && more) {
      a.device = parse_device(argv[++i]);
      if (a.device < 0)
        return cli_usage("get", SYNOPSIS,
                         "unknown device \"%s\" (cpu, cuda, "
                         "rocm, level_zero, vulkan, sim)",
                         argv[i]);
      if (a.device != HR_DEV_CPU && !device_backend(a.device))
        return cli_usage("get", SYNOPSIS,
                         "no backend receives on %s (cpu, cuda, rocm, "
                         "level_zero, vulkan, sim)",
                         argv[i]);
    } else if (!strcmp(s, "--parallel") && more) {
      if (cli_parse_u64(argv[++i], &a.parallel) || a.parallel < 1 ||
          a.parallel > 65535)
        return cli_usage("get", SYNOPSIS,
                         "--parallel takes a number from 1 to 65535");
    } else if (!strcmp(s, "--connections") && more) {
      if (cli_parse_u64(argv[++i], &a.connections) || a.connections < 1 ||
          a.connections > HR_MAX_LANES)
        return cli_usage("get", SYNOPSIS,
                         "--connections takes a number from 1 to %d",
                         HR_MAX_LANES);
    } else if (!strcmp(s, "--slice") && more) {
      if (parse_slice(&a, argv[++i]))
        return cli_usage("get", SYNOPSIS,
                         "--slice wants DIM:RANK/COUNT with RANK < COUNT, "
                         "e.g. 0:1/4");
    } else if (!strcmp(s, "--region") && more) {
      if (parse_region(&a, argv[++i]))
        return cli_usage("get", SYNOPSIS,
                         "--region wants OFF,...:SHAPE,... of equal ranks, "
                         "e.g. 0,2:4,4");
    } else if (!strcmp(s, "-o") && more) {
      a.out = argv[++i];
    } else if (!strcmp(s, "--stats")) {
      a.stats = 1;
    } else if (!strcmp(s, "--no-shm")) {
      co.no_shm = 1;
    } else if (!strcmp(s, "--fabric") && more) {
      a.fabric = argv[++i];
    } else if (!strcmp(s, "--dump-wire") && more) {
      a.dump = argv[++i];
    } else if (!strcmp(s, "--auth-token-file") && more) {
      a.token_file = argv[++i];
    } else if (!strcmp(s, "--timeout") && more) {
      uint64_t secs;
      if (cli_parse_u64(argv[++i], &secs) || secs > 86400)
        return cli_usage("get", SYNOPSIS, "--timeout takes seconds");
      a.timeout_ms = secs ? (int64_t)secs * 1000 : -1;
    } else if (cli_tls_opt(argc, argv, &i, &co)) {
      continue;
    } else if (s[0] == '-' && s[1]) {
      return cli_usage("get", SYNOPSIS, "unknown or incomplete option %s", s);
    } else if (npos == 0) {
      a.url = s;
      npos++;
    } else if (npos == 1) {
      a.key = s;
      npos++;
    } else {
      return cli_usage("get", SYNOPSIS, "unexpected argument \"%s\"", s);
    }
  }
  if (npos != 2)
    return cli_usage("get", SYNOPSIS, "give a URL and a KEY");
  if (a.slice && a.region)
    return cli_usage("get", SYNOPSIS, "give --region or --slice, not both");
  key_len = strlen(a.key);
  if (key_len < 1 || key_len > HR_MAX_KEY)
    return cli_usage("get", SYNOPSIS, "keys are 1 to 1024 bytes");

  co.cmd = "get";
  co.url = a.url;
  co.dump_wire = a.dump;
  co.progress = isatty(STDERR_FILENO);
  co.timeout_ms = a.timeout_ms;
  co.lanes = (unsigned)a.connections;
  if (a.device != HR_DEV_CPU) {
    hr_gpu_config gc;
    hr_gpu_probe_info why;
    hr_gpu_config_default(&gc);
    gc.backend = device_backend(a.device);
    rv = hr_gpu_open(&gpu, &gc, NULL, &why);
    if (rv) {
      cli_err("get", "cannot open the %s device: %s (%s)", gc.backend,
              why.reason[0] ? why.reason : hr_strerror(rv),
              "receive on the host with --device cpu");
      return CLI_EXIT_FAIL;
    }
    if (a.parallel) {
      hr_gpu_del(gpu);
      return cli_usage("get", SYNOPSIS,
                       "--device receives one stream: drop --parallel");
    }
    devs[0] = (uint8_t)a.device;
    devs[1] = HR_DEV_CPU;
    co.devices = devs;
    co.device_count = 2;
  }
  co.fabric = a.fabric;
  co.auth_token_file = a.token_file;
  if (cli_connect(&cc, &co)) {
    hr_gpu_del(gpu);
    return CLI_EXIT_FAIL;
  }

  /* The progress bar wants the size, --stats the stored layout: ask
   * LIST when the server has it. */
  memset(&pr, 0, sizeof pr);
  pr.key = a.key;
  if (co.progress || a.stats) {
    const hr_hello *h = hr_client_server_hello(cc.client);
    if (h && (h->capability_flags & HR_CAP_LIST))
      hr_client_list(cc.client, (const uint8_t *)a.key, (uint16_t)key_len, NULL,
                     0, 1, probe_entry, &pr, NULL, NULL);
    cli_progress_total(&cc, a.region || a.slice ? 0 : pr.bytes, 0);
  }

  memset(&go, 0, sizeof go);
  go.key = (const uint8_t *)a.key;
  go.key_len = (uint16_t)key_len;
  go.layouts = a.layouts;
  go.layout_count = a.nlayouts;
  go.preferred_device = (uint8_t)a.device;
  go.max_shards = 1;
  if (a.allow_transcode)
    go.flags |= HR_REQ_ALLOW_TRANSCODE;
  if (a.parallel) {
    go.flags |= HR_REQ_PARALLEL_OK;
    go.max_shards = (uint16_t)a.parallel;
  }
  if (a.region) {
    go.flags |= HR_REQ_REGION;
    go.region_rank = a.region_rank;
    go.region_offset = a.region_offset;
    go.region_shape = a.region_shape;
  }
  go.device = gpu;
  go.device_sync = HR_SYNC_PRODUCER_SYNCED;
  if (gpu) {
    /* The bytes come in host frames either way: ask for the device's
     * placement only from a server that has it (rule 3 would refuse it
     * otherwise), else for the CPU's, and land on the device here. */
    const hr_hello *h = hr_client_server_hello(cc.client);
    uint16_t k;
    go.preferred_device = HR_DEV_CPU;
    for (k = 0; h && k < h->device_count; k++)
      if (h->devices[k] == a.device)
        go.preferred_device = (uint8_t)a.device;
  }
  memset(&rec, 0, sizeof rec);
  if (a.slice)
    rv = hr_client_get_slice(cc.client, go.key, go.key_len,
                             (unsigned)a.slice_dim, (uint32_t)a.slice_rank,
                             (uint32_t)a.slice_count, &go, &t, &rec);
  else
    rv = hr_client_get(cc.client, &go, &t, &rec);
  if (rv && !strncmp(rec.fallback, "shm:", 4) && !a.slice) {
    /* We could not map the server's segment; it answers with frames
     * from now on (wire-v1 § 14). */
    memset(&rec, 0, sizeof rec);
    rv = hr_client_get(cc.client, &go, &t, &rec);
  }
  cli_progress_done(&cc);
  if (rv) {
    char action[1100];
    snprintf(action, sizeof action, "cannot fetch \"%s\"", a.key);
    status =
        cli_client_fail("get", action, a.url, hr_client_last_error(cc.client));
    if (a.stats)
      print_stats(&a, &rec, NULL, 0, &pr, hr_client_lanes(cc.client),
                  cc.client);
    cli_disconnect(&cc, "get");
    hr_gpu_del(gpu);
    return status;
  }
  if (gpu && hr_tensor_on_device(t)) {
    hr_tensor *h = NULL;
    rv = device_to_host(gpu, t, &h);
    hr_tensor_unref(t);
    t = h;
    if (rv) {
      cli_err("get", "cannot copy the result back from the device: %s",
              hr_strerror(rv));
      cli_disconnect(&cc, "get");
      hr_gpu_del(gpu);
      return CLI_EXIT_FAIL;
    }
  }
  if (a.out) {
    status = write_tensor(a.out, t, &converted);
    if (!status && hr_tensor_descriptor(t)->layout.tag != HR_LAYOUT_COMPOSITE)
      printf("wrote %s\n", a.out);
  } else {
    const hr_descriptor *d = hr_tensor_descriptor(t);
    unsigned k;
    printf("%s: %s [", a.key, hr_elem_type_name(d->element_type));
    for (k = 0; k < d->rank; k++)
      printf("%s%llu", k ? ", " : "", (unsigned long long)d->shape[k]);
    printf("] %s, %llu bytes%s\n", hr_layout_name(d->layout.tag),
           (unsigned long long)rec.bytes,
           transcoded_of(&rec, &pr) == 1 ? " (transcoded by the server)" : "");
  }
  fflush(stdout);
  if (a.stats)
    print_stats(&a, &rec, t, converted, &pr, hr_client_lanes(cc.client),
                cc.client);
  hr_tensor_unref(t);
  rv = cli_disconnect(&cc, "get");
  hr_gpu_del(gpu);
  return status ? status : rv;
}
