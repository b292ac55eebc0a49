/* Shared helpers of the `hurray` command: see cli.h. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void cli_err(const char *cmd, const char *fmt, ...) {
  va_list ap;

  fprintf(stderr, "hurray %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

int cli_usage(const char *cmd, const char *synopsis, const char *fmt, ...) {
  va_list ap;

  fprintf(stderr, "hurray %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (usage: hurray %s %s)\n", cmd, synopsis);
  return CLI_EXIT_USAGE;
}

static const char *hint_for(uint32_t code, const char *url) {
  static char buf[256];

  switch (code) {
  case HR_WIRE_NOT_FOUND:
    snprintf(buf, sizeof buf, "list the keys with `hurray ls %s`", url);
    return buf;
  case HR_WIRE_ALREADY_EXISTS: return "use --replace to overwrite it";
  case HR_WIRE_PUT_REJECTED:
    return "the server refuses this PUT; is it running with --allow-put?";
  case HR_WIRE_RESOURCE_EXHAUSTED:
    return "the server is at one of its limits; retry later or ask for less";
  case HR_WIRE_INVALID_REGION:
    snprintf(buf, sizeof buf,
             "check --region against the shape `hurray ls %s` shows", url);
    return buf;
  case HR_WIRE_DEVICE_UNAVAILABLE: return "ask for --device cpu";
  case HR_WIRE_TRANSCODE_FAILED:
    return "ask for the stored layout, or drop --allow-transcode";
  case HR_WIRE_UNAUTHORIZED:
    return "the server refused the token, or the token does not allow "
           "this (give one with --auth-token-file F or HURRAY_AUTH_TOKEN)";
  case HR_WIRE_TIMEOUT: return "the connection stalled; retry";
  case HR_WIRE_UNSUPPORTED_VERSION:
    return "the server speaks another protocol version";
  default: return "see the server's log";
  }
}

int cli_client_fail(const char *cmd, const char *action, const char *url,
                    const hr_client_error *e) {
  const char *msg = e && e->message[0] ? e->message : NULL;

  if (!e) {
    cli_err(cmd, "%s: unknown error", action);
    return CLI_EXIT_FAIL;
  }
  if (e->wire_error && !e->wire_error_sent) {
    cli_err(cmd, "%s: the server answered %s%s%s (%s)", action,
            hr_wire_error_name(e->wire_error), msg ? ": " : "", msg ? msg : "",
            hint_for(e->wire_error, url));
  } else if (e->wire_error) {
    cli_err(cmd,
            "%s: the server broke the protocol (%s%s%s); capture the bytes "
            "with --dump-wire FILE and decode them with `hurray inspect "
            "FILE`",
            action, hr_wire_error_name(e->wire_error), msg ? ": " : "",
            msg ? msg : "");
  } else if (msg && strstr(msg, "TLS")) {
    /* TLS failures say what failed and what to do themselves. */
    cli_err(cmd, "%s: %s", action, msg);
  } else {
    switch (e->status) {
    case HR_ERR_IO:
      cli_err(cmd, "%s: %s (is `hurray serve` running at %s?)", action,
              msg ? msg : "I/O error", url);
      break;
    case HR_ERR_TIMEOUT:
      cli_err(cmd,
              "%s: %s (the server did not answer in time; retry or "
              "check it)",
              action, msg ? msg : "timed out");
      break;
    case HR_ERR_INVALID_ARGUMENT:
      cli_err(cmd, "%s: %s (URLs look like hurray://HOST:PORT or unix:PATH)",
              action, msg ? msg : "invalid argument");
      break;
    case HR_ERR_CLOSED:
      cli_err(cmd,
              "%s: the connection closed%s%s (retry; see the server's "
              "log)",
              action, msg ? ": " : "", msg ? msg : "");
      break;
    default:
      cli_err(cmd, "%s: %s%s%s", action, hr_strerror(e->status),
              msg ? ": " : "", msg ? msg : "");
      break;
    }
  }
  return CLI_EXIT_FAIL;
}

int cli_parse_u64(const char *s, uint64_t *out) {
  char *end;
  unsigned long long v;

  if (!s || *s < '0' || *s > '9')
    return -1;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno || *end)
    return -1;
  *out = v;
  return 0;
}

int cli_parse_size(const char *s, uint64_t *out) {
  char *end;
  unsigned long long v;
  unsigned shift = 0;

  if (!s || *s < '0' || *s > '9')
    return -1;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno)
    return -1;
  switch (*end) {
  case '\0': break;
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  case 't': case 'T': shift = 40; end++; break;
  default: return -1;
  }
  if (*end || (shift && v > (UINT64_MAX >> shift)))
    return -1;
  *out = (uint64_t)v << shift;
  return 0;
}

int cli_parse_duration(const char *s, uint64_t *ns) {
  char *end;
  double v;
  double unit = 1e9;

  if (!s || *s < '0' || *s > '9')
    return -1;
  errno = 0;
  v = strtod(s, &end);
  if (errno || v < 0)
    return -1;
  if (!strcmp(end, "ms"))
    unit = 1e6;
  else if (!strcmp(end, "m"))
    unit = 60e9;
  else if (*end && strcmp(end, "s"))
    return -1;
  v *= unit;
  if (v >= 1e18) /* about 31 years: far past any sensible timeout */
    return -1;
  *ns = (uint64_t)v;
  return 0;
}

int cli_auth_token(const char *cmd, const char *file, char **out,
                   size_t *len) {
  char line[8192];
  const char *env;
  FILE *f;

  *out = NULL;
  *len = 0;
  if (!file) {
    env = getenv("HURRAY_AUTH_TOKEN");
    if (!env || !*env)
      return 0;
    *len = strlen(env);
    *out = strdup(env);
    if (!*out) {
      cli_err(cmd, "out of memory");
      return -1;
    }
    return 0;
  }
  f = fopen(file, "r");
  if (!f) {
    cli_err(cmd, "cannot read the token file %s: %s (check the path)", file,
            strerror(errno));
    return -1;
  }
  while (fgets(line, sizeof line, f)) {
    char *p = line, *e;
    while (*p == ' ' || *p == '\t')
      p++;
    if (*p == '#' || *p == '\n' || *p == '\r' || !*p)
      continue;
    e = p;
    while (*e && *e != ' ' && *e != '\t' && *e != '\n' && *e != '\r')
      e++;
    fclose(f);
    *len = (size_t)(e - p);
    *out = strndup(p, *len);
    if (!*out) {
      cli_err(cmd, "out of memory");
      return -1;
    }
    return 0;
  }
  fclose(f);
  cli_err(cmd, "the token file %s holds no token (one token per line; "
               "'#' starts a comment)", file);
  return -1;
}

int cli_parse_list(const char *s, uint64_t *out, int max) {
  int n = 0;

  for (;;) {
    char *end;
    unsigned long long v;
    if (*s < '0' || *s > '9' || n >= max)
      return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno)
      return -1;
    out[n++] = v;
    if (*end == '\0')
      return n;
    if (*end != ',')
      return -1;
    s = end + 1;
  }
}

void cli_human_bytes(uint64_t n, char *out, size_t cap) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = 0;

  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(out, cap, "%llu B", (unsigned long long)n);
  else
    snprintf(out, cap, "%.1f %s", v, units[u]);
}

/* ------------------------------------------------------------------------ */
/* Progress bar and the wire dump                                            */
/* ------------------------------------------------------------------------ */

struct cli_progress {
  struct timespec start;
  uint64_t total;
  int upload;
  int drawn;
};

static double elapsed(const struct timespec *t0) {
  struct timespec t;

  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) +
         (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static void on_progress(uint64_t rx, uint64_t tx, void *ud) {
  cli_conn *cc = ud;
  struct cli_progress *p = cc->bar;
  double t;
  uint64_t done;
  char a[32], b[32];

  if (!p)
    return;
  t = elapsed(&p->start);
  /* Only transfers that last: short ones finish without a bar. */
  if (t < 1.0)
    return;
  done = p->upload ? tx : rx;
  cli_human_bytes(done, a, sizeof a);
  if (p->total) {
    int pct = (int)(done >= p->total ? 100 : done * 100 / p->total);
    int bars = pct / 5, i;
    char bar[21];
    for (i = 0; i < 20; i++)
      bar[i] = i < bars ? '#' : '.';
    bar[20] = '\0';
    cli_human_bytes(p->total, b, sizeof b);
    fprintf(stderr, "\r[%s] %3d%%  %s / %s  %.2f GB/s ", bar, pct, a, b,
            (double)done / t / 1e9);
  } else {
    fprintf(stderr, "\r%s  %.2f GB/s ", a, (double)done / t / 1e9);
  }
  fflush(stderr);
  p->drawn = 1;
}

void cli_progress_total(cli_conn *cc, uint64_t total, int upload) {
  if (cc->bar) {
    cc->bar->total = total;
    cc->bar->upload = upload;
    clock_gettime(CLOCK_MONOTONIC, &cc->bar->start);
  }
}

void cli_progress_done(cli_conn *cc) {
  if (cc->bar && cc->bar->drawn) {
    fprintf(stderr, "\r%*s\r", 72, "");
    fflush(stderr);
    cc->bar->drawn = 0;
  }
}

static void on_rx(const void *bytes, size_t len, void *ud) {
  cli_conn *cc = ud;

  if (cc->dump && fwrite(bytes, 1, len, cc->dump) != len)
    cc->dump_failed = 1;
}

const char *cli_fabric_node(const char *url) {
  const char *h = url;
  if (!h)
    return NULL;
  if (!strncmp(h, "hurray://", 9))
    h += 9;
  else if (!strncmp(h, "hurrays://", 10))
    h += 10;
  if (!strncmp(h, "127.", 4) || !strncmp(h, "localhost:", 10) ||
      !strncmp(h, "localhost", 10))
    return "127.0.0.1";
  return NULL;
}

int cli_tls_opt(int argc, char **argv, int *i, cli_conn_opts *o) {
  const char *a = argv[*i];

  if (*i + 1 >= argc)
    return 0;
  if (!strcmp(a, "--tls-ca"))
    o->tls_ca = argv[++*i];
  else if (!strcmp(a, "--tls-cert"))
    o->tls_cert = argv[++*i];
  else if (!strcmp(a, "--tls-key"))
    o->tls_key = argv[++*i];
  else
    return 0;
  return 1;
}

int cli_connect(cli_conn *cc, const cli_conn_opts *o) {
  hr_client_options opts;
  hr_client_error err;
  hr_tls_config tls;
  char action[300];
  size_t tlen = 0;
  int rv;

  memset(cc, 0, sizeof *cc);
  hr_client_options_default(&opts);
  if (o->tls_ca || o->tls_cert || o->tls_key) {
    if (strncmp(o->url, "hurrays://", 10) != 0) {
      cli_err(o->cmd,
              "--tls-ca, --tls-cert and --tls-key need a hurrays:// URL "
              "(%s is not TLS)",
              o->url);
      return -1;
    }
    memset(&tls, 0, sizeof tls);
    tls.ca_file = o->tls_ca;
    tls.cert_file = o->tls_cert;
    tls.key_file = o->tls_key;
    opts.tls = &tls;
  }
  if (o->timeout_ms)
    opts.timeout_ms = o->timeout_ms;
  opts.lanes = o->lanes;
  if (o->no_shm)
    opts.settings.capabilities &= ~(uint32_t)HR_CAP_SHM_DATA_PLANE;
  opts.user_data = cc;
  if (o->devices) {
    opts.settings.devices = o->devices;
    opts.settings.device_count = o->device_count;
  }
  if (o->fabric) {
    opts.fabric_provider = o->fabric;
    opts.fabric_node = cli_fabric_node(o->url);
  }
  if (o->stage_budget_set)
    opts.settings.rdma_stage_budget = o->stage_budget;
  if (o->dump_wire) {
    cc->dump = fopen(o->dump_wire, "wb");
    if (!cc->dump) {
      cli_err(o->cmd, "cannot create %s: %s (check the directory)",
              o->dump_wire, strerror(errno));
      return -1;
    }
    opts.on_rx = on_rx;
  }
  if (o->progress) {
    cc->bar = calloc(1, sizeof *cc->bar);
    if (cc->bar) {
      clock_gettime(CLOCK_MONOTONIC, &cc->bar->start);
      cc->bar->total = o->expect_bytes;
      opts.on_progress = on_progress;
    }
  }
  if (cli_auth_token(o->cmd, o->auth_token_file, &cc->auth_token, &tlen)) {
    if (cc->dump)
      fclose(cc->dump);
    free(cc->bar);
    cc->dump = NULL;
    cc->bar = NULL;
    return -1;
  }
  opts.settings.auth_token = (const uint8_t *)cc->auth_token;
  opts.settings.auth_token_len = (uint16_t)tlen;
  if (tlen > UINT16_MAX) {
    cli_err(o->cmd, "the auth token is longer than 65535 bytes");
    err.wire_error = 0;
    rv = HR_ERR_INVALID_ARGUMENT;
  } else {
    rv = hr_client_connect(&cc->client, o->url, &opts, NULL, &err);
  }
  if (rv) {
    snprintf(action, sizeof action, "cannot connect to %s", o->url);
    if (tlen <= UINT16_MAX)
      cli_client_fail(o->cmd, action, o->url, &err);
    free(cc->auth_token);
    cc->auth_token = NULL;
    if (cc->dump)
      fclose(cc->dump);
    free(cc->bar);
    cc->dump = NULL;
    cc->bar = NULL;
    return -1;
  }
  return 0;
}

int cli_disconnect(cli_conn *cc, const char *cmd) {
  int rv = 0;

  cli_progress_done(cc);
  hr_client_close(cc->client);
  cc->client = NULL;
  if (cc->dump) {
    if (fclose(cc->dump) != 0 || cc->dump_failed) {
      cli_err(cmd, "cannot write the --dump-wire file completely: %s",
              strerror(errno));
      rv = CLI_EXIT_FAIL;
    }
    cc->dump = NULL;
  }
  free(cc->bar);
  cc->bar = NULL;
  free(cc->auth_token);
  cc->auth_token = NULL;
  return rv;
}
