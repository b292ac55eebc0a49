/*
 * `hurray put [--replace] [--stats] [--fabric PROVIDER] [--timeout S]
 * [--tls-ca F] [--tls-cert F --tls-key F] URL KEY FILE.npy`: sends a .npy
 * (mapped, not copied) as TENSOR_PUT; --replace overwrites an existing key.
 * The --tls-* options go with hurrays:// URLs (see cmd_get.c).  --device
 * cuda|rocm|level_zero|vulkan|sim copies the array into that device's
 * memory first (synced: ADR-018 P1) and PUTs it from there, as an
 * application holding a device tensor would (staged after the copy, or
 * GPUDirect with --fabric where the fabric registers device memory); the
 * server stores it in host memory.  --fabric
 * sends over the RDMA data plane when the server has one too (a device
 * tensor from a pinned host copy unless GPUDirect applies; at most
 * --rdma-stage-budget SIZE bytes of such copies, 0: frames instead,
 * decision 76); --stats
 * prints one JSON line on stderr (data_plane, fallback, bytes, seconds). The
 * AUTH_TOKEN comes from --auth-token-file F or $HURRAY_AUTH_TOKEN
 * (cli_auth_token()).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hurray/files.h>
#include <hurray/gpu.h>

#include "cli.h"

#define SYNOPSIS                                                               \
  "[--replace] [--stats] [--device NAME] [--fabric "                           \
  "PROVIDER] [--rdma-stage-budget SIZE] " CLI_TLS_SYNOPSIS                     \
  " [--auth-token-file F] URL KEY FILE.npy"

static void print_stats(const char *key, const hr_transfer_record *rec) {
  cJSON *o = cJSON_CreateObject();
  double secs = rec->finished > rec->started
                    ? (double)(rec->finished - rec->started) / 1e9
                    : 0.0;
  char *line;

  if (!o)
    return;
  cJSON_AddStringToObject(o, "key", key);
  cJSON_AddStringToObject(o, "data_plane",
                          rec->data_plane == HR_PLANE_RDMA  ? "rdma"
                          : rec->data_plane == HR_PLANE_SHM ? "shm"
                                                            : "frames");
  if (rec->fallback[0])
    cJSON_AddStringToObject(o, "fallback", rec->fallback);
  else
    cJSON_AddNullToObject(o, "fallback");
  cJSON_AddNumberToObject(o, "bytes", (double)rec->bytes);
  cJSON_AddNumberToObject(o, "seconds", secs);
  cJSON_AddNumberToObject(o, "gb_per_s",
                          secs > 0 ? (double)rec->bytes / secs / 1e9 : 0.0);
  if (rec->status)
    cJSON_AddStringToObject(o, "error", hr_wire_error_name(rec->wire_error));
  line = cJSON_PrintUnformatted(o);
  if (line) {
    fprintf(stderr, "%s\n", line);
    free(line);
  }
  cJSON_Delete(o);
}

/* The device copy of the array: its buffers, freed by its release. */
typedef struct dev_copy {
  hr_gpu_buf *bufs[HR_MAX_BUFFERS];
  unsigned n;
} dev_copy;

static void dev_copy_free(void *ctx) {
  dev_copy *dc = ctx;
  for (unsigned k = 0; k < dc->n; k++)
    hr_gpu_buf_del(dc->bufs[k]);
  free(dc);
}

/* Copies host tensor `t` into new memory of device g (H2D, then a sync:
 * the tensor is producer-synced, P1) and wraps it as a device tensor. */
static int to_device(hr_gpu *g, hr_tensor *t, hr_tensor **out) {
  const hr_descriptor *hd = hr_tensor_descriptor(t);
  hr_descriptor d = *hd;
  hr_gpu_caps caps;
  hr_gpu_stream *st = NULL;
  dev_copy *dc = calloc(1, sizeof *dc);
  int rv = dc ? hr_gpu_query(g, &caps) : HR_ERR_NOMEM;
  if (rv == 0)
    rv = hr_gpu_stream_new(g, &st);
  for (unsigned k = 0; rv == 0 && k < hd->buffer_count; k++) {
    uint64_t n = hd->buffers[k].size_bytes;
    hr_gpu_buf *host = NULL;
    rv = hr_gpu_buf_alloc(g, HR_GPU_MEM_DEVICE, n ? n : 1, &dc->bufs[k]);
    if (rv)
      break;
    dc->n = k + 1;
    d.buffers[k].device_tag = caps.device_tag;
    if (!n)
      continue;
    rv = hr_gpu_buf_wrap_host(g, hr_tensor_buffer(t, k), n, &host);
    if (rv == 0)
      rv = hr_gpu_copy_async(st, dc->bufs[k], 0, host, 0, n);
    if (rv == 0)
      rv = hr_gpu_stream_sync(st);
    hr_gpu_buf_del(host);
  }
  hr_gpu_stream_del(st);
  if (rv == 0)
    rv =
        hr_tensor_wrap_device(out, &d, dc->bufs, NULL, dev_copy_free, dc, NULL);
  if (rv && dc)
    dev_copy_free(dc);
  return rv;
}

int cli_put(int argc, char **argv) {
  const char *pos[3], *fabric = NULL;
  int i, npos = 0, replace = 0, stats = 0, rv, status;
  int64_t timeout_ms = 0;
  hr_transfer_record rec;
  hr_tensor *t;
  cli_conn cc;
  cli_conn_opts co;
  char why[256], action[1100];
  size_t key_len;
  const char *token_file = NULL;
  int device = HR_DEV_CPU;
  hr_gpu *gpu = NULL;

  memset(&co, 0, sizeof co);
  for (i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
      printf("usage: hurray put " SYNOPSIS "\n");
      return 0;
    } else if (!strcmp(s, "--replace")) {
      replace = 1;
    } else if (!strcmp(s, "--stats")) {
      stats = 1;
    } else if (!strcmp(s, "--fabric") && i + 1 < argc) {
      fabric = argv[++i];
    } else if (!strcmp(s, "--rdma-stage-budget") && i + 1 < argc) {
      if (cli_parse_size(argv[++i], &co.stage_budget))
        return cli_usage("put", SYNOPSIS,
                         "--rdma-stage-budget takes a size (0: none)");
      co.stage_budget_set = 1;
    } else if (!strcmp(s, "--device") && i + 1 < argc) {
      device = cli_parse_device(argv[++i]);
      if (device < 0 || (device != HR_DEV_CPU && !cli_device_backend(device)))
        return cli_usage("put", SYNOPSIS,
                         "--device takes cpu, cuda, rocm, level_zero, "
                         "vulkan or sim");
    } else if (!strcmp(s, "--auth-token-file") && i + 1 < argc) {
      token_file = argv[++i];
    } else if (!strcmp(s, "--timeout") && i + 1 < argc) {
      uint64_t secs;
      if (cli_parse_u64(argv[++i], &secs) || secs > 86400)
        return cli_usage("put", SYNOPSIS, "--timeout takes seconds");
      timeout_ms = secs ? (int64_t)secs * 1000 : -1;
    } else if (cli_tls_opt(argc, argv, &i, &co)) {
      continue;
    } else if (s[0] == '-' && s[1]) {
      return cli_usage("put", SYNOPSIS, "unknown or incomplete option %s", s);
    } else if (npos < 3) {
      pos[npos++] = s;
    } else {
      return cli_usage("put", SYNOPSIS, "unexpected argument \"%s\"", s);
    }
  }
  if (npos != 3)
    return cli_usage("put", SYNOPSIS, "give a URL, a KEY and a FILE.npy");
  key_len = strlen(pos[1]);
  if (key_len < 1 || key_len > HR_MAX_KEY)
    return cli_usage("put", SYNOPSIS, "keys are 1 to 1024 bytes");
  rv = hr_npy_load(&t, pos[2], NULL, why, sizeof why);
  if (rv) {
    cli_err("put", "cannot read %s: %s (give a .npy file)", pos[2], why);
    return CLI_EXIT_FAIL;
  }
  if (device != HR_DEV_CPU) {
    hr_gpu_config gc;
    hr_gpu_probe_info gw;
    memset(&gw, 0, sizeof gw);
    hr_tensor *dt = NULL;
    hr_gpu_config_default(&gc);
    gc.backend = cli_device_backend(device);
    rv = hr_gpu_open(&gpu, &gc, NULL, &gw);
    if (rv == 0 && (rv = to_device(gpu, t, &dt)) != 0)
      snprintf(gw.reason, sizeof gw.reason, "copying to it: %s",
               hr_strerror(rv));
    if (rv) {
      cli_err("put", "cannot use the %s device: %s (%s)", gc.backend,
              gw.reason[0] ? gw.reason : hr_strerror(rv),
              "send from the host with --device cpu");
      hr_gpu_del(gpu);
      hr_tensor_unref(t);
      return CLI_EXIT_FAIL;
    }
    hr_tensor_unref(t);
    t = dt;
  }
  co.cmd = "put";
  co.url = pos[0];
  co.progress = isatty(STDERR_FILENO);
  co.expect_bytes = hr_tensor_bytes(t);
  co.timeout_ms = timeout_ms;
  co.fabric = fabric;
  co.auth_token_file = token_file;
  if (cli_connect(&cc, &co)) {
    hr_tensor_unref(t);
    hr_gpu_del(gpu);
    return CLI_EXIT_FAIL;
  }
  cli_progress_total(&cc, hr_tensor_bytes(t), 1);
  {
    const hr_hello *h = hr_client_server_hello(cc.client);
    if (h && !(h->capability_flags & HR_CAP_TENSOR_PUT)) {
      cli_err("put",
              "cannot store \"%s\": the server does not accept PUT "
              "(start it with `hurray serve --allow-put`)",
              pos[1]);
      hr_tensor_unref(t);
      cli_disconnect(&cc, "put");
      hr_gpu_del(gpu);
      return CLI_EXIT_FAIL;
    }
  }
  memset(&rec, 0, sizeof rec);
  rv = hr_client_put(cc.client, (const uint8_t *)pos[1], (uint16_t)key_len,
                     replace ? HR_PUT_REPLACE : 0, t, &rec);
  cli_progress_done(&cc);
  if (rv) {
    snprintf(action, sizeof action, "cannot store \"%s\"", pos[1]);
    status =
        cli_client_fail("put", action, pos[0], hr_client_last_error(cc.client));
  } else {
    printf("stored %s as \"%s\" (%llu bytes)\n", pos[2], pos[1],
           (unsigned long long)hr_tensor_bytes(t));
    status = 0;
  }
  if (stats)
    print_stats(pos[1], &rec);
  hr_tensor_unref(t);
  rv = cli_disconnect(&cc, "put");
  /* After the session: its staging stream is on this device. */
  hr_gpu_del(gpu);
  return status ? status : rv;
}
