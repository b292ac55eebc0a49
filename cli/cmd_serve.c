/*
 * `hurray serve [--listen HOST:PORT] [--unix PATH] [--allow-put]
 *               [--max-shards N] [--tls-cert F --tls-key F
 *               [--tls-client-ca F]] [--fabric PROVIDER]
 *               [--metrics-listen HOST:PORT]
 *               [--log-level error|warn|info|debug]
 *               [--auth-token-file F] [limits] [-v] PATH...`
 *
 * --tls-cert/--tls-key make the TCP listener speak TLS 1.3 (clients use
 * hurrays://); --tls-client-ca also requires every client to present a
 * certificate issued by that CA (mutual TLS).  The Unix socket stays
 * plain.
 *
 * Serves every .npy under each PATH (key: the path relative to PATH,
 * without ".npy"; a PATH that is a file gives its own name) and every
 * tensor of each .safetensors (key: the file's relative path without
 * ".safetensors", "/", the tensor's name), mapped and sent without a copy.
 * --unix PATH also listens on a Unix domain socket at PATH; given alone
 * (without --listen) it is the only listener.  Runs on a libevent loop through the hr_ev binding.  SIGTERM or SIGINT
 * drains gracefully (active streams finish, new ones are refused) and
 * exits 0; a second signal exits at once with 1.  --fabric PROVIDER
 * ("tcp;ofi_rxm", "shm", "verbs;ofi_rxm", ... or "auto") opens a libfabric
 * endpoint on the listening interface: clients that also have one receive
 * tensors (and send PUTs) over the RDMA data plane.
 *
 * --auth-token-file F checks every client's AUTH_TOKEN against F (format
 * and rules in <hurray/auth.h>); SIGHUP reloads F, and a file that does
 * not parse leaves the tokens in force unchanged.  The limit flags
 * (--max-connections, --max-streams, --max-put-bytes, --max-store-bytes,
 * --max-inflight-bytes, --max-conn-inflight-bytes, --send-budget,
 * --max-message-size, --handshake-timeout, --idle-timeout,
 * --read-timeout, --rdma-stage-budget) set the engine's caps; README.md
 * lists their defaults.
 * --shm-arena SIZE keeps stored tensors that have no segment of their own
 * (files not page-aligned; PUTs land there directly, hr_provider's
 * on_put_alloc) in a shared memfd arena of at most SIZE bytes, served
 * over SHM by the arena's fd
 * (docs/internals/shm.md: every client allowed every key may read all of
 * it; a token bounded to prefixes gets a private copy).
 *
 * Logs: one JSON object per line on stderr (<hurray/metrics.h>): a line
 * per request at info (failures at warn), connections at debug, and the
 * server's own notices; --log-level picks the most verbose level written
 * (info; -v is debug).  --metrics-listen serves Prometheus text at
 * http://HOST:PORT/metrics (port 0 picks one; the line "metrics on
 * HOST:PORT" on stdout, after the listening lines, names it).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <hurray/auth.h>
#include <hurray/files.h>
#include <hurray/hr_event.h>
#include <hurray/metrics.h>
#include <hurray/store.h>

#include "cli.h"

#define SYNOPSIS                                                               \
  "[--listen HOST:PORT] [--unix PATH] [--allow-put] [--max-shards N] "        \
  "[--tls-cert F --tls-key F [--tls-client-ca F]] [--fabric PROVIDER] "       \
  "[--metrics-listen HOST:PORT] [--log-level error|warn|info|debug] "         \
  "[--auth-token-file F] [--max-connections N] [--max-streams N] "            \
  "[--max-put-bytes SIZE] [--max-store-bytes SIZE] "                          \
  "[--max-inflight-bytes SIZE] [--max-conn-inflight-bytes SIZE] "             \
  "[--send-budget SIZE] [--max-message-size SIZE] [--handshake-timeout T] "   \
  "[--idle-timeout T] [--read-timeout T] [--shm-arena SIZE] "                \
  "[--rdma-stage-budget SIZE] [-v] PATH..."
/* PUTs may add this much over the served files unless --max-store-bytes
 * says otherwise. */
#define DEFAULT_PUT_ROOM (4ull << 30)
#define DEFAULT_LISTEN "127.0.0.1:7474"

typedef struct serve {
  hr_store *store;
  size_t loaded, skipped;
  struct event_base *base;
  hr_engine *engine;
  int signals;
  hr_metrics *metrics;      /* counters and the logger */
  hr_auth *auth;            /* --auth-token-file, or NULL */
  const char *token_file;
} serve;

/* Log lines go to stderr, one per line. */
static void log_stderr(int level, const char *line, size_t len, void *ud) {
  (void)level;
  (void)ud;
  fwrite(line, 1, len, stderr);
  fputc('\n', stderr);
}

/* The server's own notices, through the same logger as the requests. */
static void slog(serve *sv, int level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void slog(serve *sv, int level, const char *event, const char *fmt,
                 ...) {
  char text[2048];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  hr_metrics_log(sv->metrics, level, event, "%s", text);
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void add_tensor(serve *sv, const char *key, size_t key_len, hr_tensor *t,
                       const char *path) {
  int rv;

  if (key_len < 1 || key_len > HR_MAX_KEY ||
      !hr_utf8_valid((const uint8_t *)key, key_len)) {
    slog(sv, HR_LOG_WARN, "skip",
         "skipping %s: its key is not 1-1024 bytes of UTF-8", path);
    sv->skipped++;
    return;
  }
  rv = hr_store_put(sv->store, key, key_len, t, 0);
  if (rv == HR_ERR_STATE) {
    slog(sv, HR_LOG_WARN, "skip", "skipping %s: key \"%.*s\" is already served",
         path, (int)key_len, key);
    sv->skipped++;
  } else if (rv) {
    slog(sv, HR_LOG_WARN, "skip", "skipping %s: %s", path, hr_strerror(rv));
    sv->skipped++;
  } else {
    sv->loaded++;
  }
}

/* `rel` is the path relative to the PATH argument ("" stem for a PATH
 * that is a file is handled by the caller). */
static void load_file(serve *sv, const char *path, const char *rel) {
  char why[256], key[HR_MAX_KEY + 64];
  size_t n;
  int rv;

  if (ends_with(rel, ".npy")) {
    hr_tensor *t;
    rv = hr_npy_load(&t, path, NULL, why, sizeof why);
    if (rv) {
      slog(sv, HR_LOG_WARN, "skip", "skipping %s: %s", path, why);
      sv->skipped++;
      return;
    }
    n = strlen(rel) - 4;
    add_tensor(sv, rel, n, t, path);
    hr_tensor_unref(t);
  } else if (ends_with(rel, ".safetensors")) {
    hr_safetensors *f;
    size_t i, stem = strlen(rel) - strlen(".safetensors");
    rv = hr_safetensors_open(&f, path, NULL, why, sizeof why);
    if (rv) {
      slog(sv, HR_LOG_WARN, "skip", "skipping %s: %s", path, why);
      sv->skipped++;
      return;
    }
    for (i = 0; i < hr_safetensors_count(f); i++) {
      const char *name = hr_safetensors_name(f, i);
      hr_tensor *t;
      int len = snprintf(key, sizeof key, "%.*s/%s", (int)stem, rel, name);
      if (len < 0 || (size_t)len >= sizeof key) {
        slog(sv, HR_LOG_WARN, "skip", "skipping %s in %s: the key is too long",
             name, path);
        sv->skipped++;
        continue;
      }
      if (hr_safetensors_tensor(f, i, &t) != 0) {
        slog(sv, HR_LOG_WARN, "skip", "skipping %s in %s: out of memory", name,
             path);
        sv->skipped++;
        continue;
      }
      add_tensor(sv, key, (size_t)len, t, path);
      hr_tensor_unref(t);
    }
    hr_safetensors_close(f);
  }
}

static void walk(serve *sv, const char *dir, const char *rel, int depth) {
  DIR *d;
  struct dirent *de;

  if (depth > 32) {
    slog(sv, HR_LOG_WARN, "skip", "skipping %s: directories nested too deep",
         dir);
    return;
  }
  d = opendir(dir);
  if (!d) {
    slog(sv, HR_LOG_WARN, "skip", "skipping %s: %s", dir, strerror(errno));
    return;
  }
  while ((de = readdir(d))) {
    char path[PATH_MAX], sub[PATH_MAX];
    struct stat st;
    if (de->d_name[0] == '.')
      continue; /* ., .. and hidden files */
    if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >=
            (int)sizeof path ||
        snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", de->d_name) >=
            (int)sizeof sub)
      continue;
    if (stat(path, &st) != 0)
      continue;
    if (S_ISDIR(st.st_mode))
      walk(sv, path, sub, depth + 1);
    else if (S_ISREG(st.st_mode))
      load_file(sv, path, sub);
  }
  closedir(d);
}

static void on_closed(hr_engine *e, void *ud) {
  serve *sv = ud;

  (void)e;
  event_base_loopbreak(sv->base);
}

static void on_signal(evutil_socket_t sig, short what, void *ud) {
  serve *sv = ud;

  (void)what;
  if (++sv->signals > 1) {
    slog(sv, HR_LOG_ERROR, "exit", "second signal: exiting without draining");
    exit(CLI_EXIT_FAIL);
  }
  slog(sv, HR_LOG_INFO, "drain",
       "%s: draining (active transfers finish, new ones are refused)",
       sig == SIGTERM ? "SIGTERM" : "SIGINT");
  hr_engine_close(sv->engine, on_closed, sv);
}

/* SIGHUP: reload the token file.  Connections already open are checked
 * against the new table from their next request on. */
static void on_hup(evutil_socket_t sig, short what, void *ud) {
  serve *sv = ud;
  char why[512];

  (void)sig;
  (void)what;
  if (hr_auth_load_file(sv->auth, sv->token_file, why, sizeof why) != 0) {
    slog(sv, HR_LOG_ERROR, "reload", "SIGHUP: keeping the tokens in force: "
         "%s: %s", sv->token_file, why);
    return;
  }
  slog(sv, HR_LOG_INFO, "reload", "SIGHUP: reloaded %zu token%s from %s",
       hr_auth_count(sv->auth), hr_auth_count(sv->auth) == 1 ? "" : "s",
       sv->token_file);
}

/* Why listening failed (rv): `invalid` when the address is unusable
 * (HR_ERR_INVALID_ARGUMENT), the system's reason for HR_ERR_IO (errno
 * as the call left it), else the error's name. */
static const char *listen_why(int rv, const char *invalid) {
  return rv == HR_ERR_INVALID_ARGUMENT ? invalid
         : rv == HR_ERR_IO             ? strerror(errno)
                                       : hr_strerror(rv);
}

int cli_serve(int argc, char **argv) {
  const char *listen_addr = NULL, *unix_path = NULL, *fabric = NULL,
             *metrics_addr = NULL;
  hr_metrics_config mcfg;
  hr_ev_metrics *mep = NULL;
  int log_level = HR_LOG_INFO;
  hr_tls_config tls;
  char unix_addr[128], why[512], fabric_node[64] = "";
  hr_store_config scfg;
  hr_engine_config ecfg;
  hr_provider prov;
  hr_listener *lis = NULL, *ulis = NULL;
  struct event *sigterm = NULL, *sigint = NULL, *sighup = NULL;
  serve sv;
  int i, npaths = 0, allow_put = 0, rv, status = 0;
  uint64_t max_shards = 0;
  const char **paths;
  /* Limits: UINT64_MAX means "not given" (keep the library's default). */
  enum { L_CONNS, L_STREAMS, L_PUT, L_STORE, L_INFLIGHT, L_CONN_INFLIGHT,
         L_SEND, L_MSG, L_HANDSHAKE, L_IDLE, L_READ, L_ARENA, L_STAGE,
         L_COUNT };
  static const struct {
    const char *flag;
    int kind; /* 0 count, 1 size, 2 duration */
    uint64_t lo, hi;
  } lim[L_COUNT] = {
      {"--max-connections", 0, 1, UINT32_MAX},
      {"--max-streams", 0, 1, UINT32_MAX},
      {"--max-put-bytes", 1, 1, UINT64_MAX - 1},
      {"--max-store-bytes", 1, 1, UINT64_MAX - 1},
      {"--max-inflight-bytes", 1, 1, UINT64_MAX - 1},
      {"--max-conn-inflight-bytes", 1, 1, UINT64_MAX - 1},
      {"--send-budget", 1, 65536, UINT64_MAX - 1},
      {"--max-message-size", 1, HR_MIN_MAX_MESSAGE_SIZE, UINT32_MAX},
      {"--handshake-timeout", 2, 0, UINT64_MAX - 1},
      {"--idle-timeout", 2, 0, UINT64_MAX - 1},
      {"--read-timeout", 2, 0, UINT64_MAX - 1},
      {"--shm-arena", 1, 1u << 20, (uint64_t)1 << 46},
      {"--rdma-stage-budget", 1, 0, UINT64_MAX - 1},
  };
  uint64_t lv[L_COUNT];

  memset(&sv, 0, sizeof sv);
  memset(&tls, 0, sizeof tls);
  for (i = 0; i < L_COUNT; i++)
    lv[i] = UINT64_MAX;
  paths = calloc((size_t)argc, sizeof *paths);
  if (!paths)
    return CLI_EXIT_FAIL;
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    int l;
    for (l = 0; l < L_COUNT; l++)
      if (!strcmp(a, lim[l].flag))
        break;
    if (l < L_COUNT && i + 1 < argc) {
      const char *v = argv[++i];
      uint64_t x = 0;
      int bad = lim[l].kind == 0   ? cli_parse_u64(v, &x)
                : lim[l].kind == 1 ? cli_parse_size(v, &x)
                                   : cli_parse_duration(v, &x);
      if (bad || x < lim[l].lo || x > lim[l].hi) {
        free(paths);
        return cli_usage("serve", SYNOPSIS, "%s takes %s, not \"%s\"",
                         a,
                         lim[l].kind == 0   ? "a positive number"
                         : lim[l].kind == 1 ? "a byte count (e.g. 512M, 1G)"
                                            : "a duration (e.g. 30, 500ms, "
                                              "2m; 0: none)",
                         v);
      }
      lv[l] = x;
      continue;
    }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      printf("usage: hurray serve " SYNOPSIS "\n");
      free(paths);
      return 0;
    } else if (!strcmp(a, "--listen") && i + 1 < argc) {
      listen_addr = argv[++i];
    } else if (!strcmp(a, "--unix") && i + 1 < argc) {
      unix_path = argv[++i];
    } else if (!strcmp(a, "--allow-put")) {
      allow_put = 1;
    } else if (!strcmp(a, "--fabric") && i + 1 < argc) {
      fabric = argv[++i];
    } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
      log_level = HR_LOG_DEBUG;
    } else if (!strcmp(a, "--log-level") && i + 1 < argc) {
      if (hr_log_level_parse(argv[++i], &log_level) != 0) {
        free(paths);
        return cli_usage("serve", SYNOPSIS,
                         "--log-level takes error, warn, info or debug");
      }
    } else if (!strcmp(a, "--metrics-listen") && i + 1 < argc) {
      metrics_addr = argv[++i];
    } else if (!strcmp(a, "--max-shards") && i + 1 < argc) {
      if (cli_parse_u64(argv[++i], &max_shards) || max_shards < 1 ||
          max_shards > 65535) {
        free(paths);
        return cli_usage("serve", SYNOPSIS,
                         "--max-shards takes a number from 1 to 65535");
      }
    } else if (!strcmp(a, "--tls-cert") && i + 1 < argc) {
      tls.cert_file = argv[++i];
    } else if (!strcmp(a, "--tls-key") && i + 1 < argc) {
      tls.key_file = argv[++i];
    } else if (!strcmp(a, "--tls-client-ca") && i + 1 < argc) {
      tls.ca_file = argv[++i];
    } else if (!strcmp(a, "--auth-token-file") && i + 1 < argc) {
      sv.token_file = argv[++i];
    } else if (a[0] == '-' && a[1]) {
      free(paths);
      return cli_usage("serve", SYNOPSIS, "unknown or incomplete option %s", a);
    } else {
      paths[npaths++] = a;
    }
  }
  if (npaths == 0) {
    free(paths);
    return cli_usage("serve", SYNOPSIS, "give at least one PATH to serve");
  }
  if (unix_path &&
      (!unix_path[0] || (size_t)snprintf(unix_addr, sizeof unix_addr, "unix:%s",
                                         unix_path) >= sizeof unix_addr)) {
    free(paths);
    return cli_usage("serve", SYNOPSIS,
                     "--unix takes a socket path of 1 to 107 bytes");
  }
  /* TCP is the default only when no transport was asked for. */
  if (!listen_addr && !unix_path)
    listen_addr = DEFAULT_LISTEN;
  if ((tls.cert_file || tls.key_file || tls.ca_file) &&
      (!tls.cert_file || !tls.key_file)) {
    free(paths);
    return cli_usage("serve", SYNOPSIS,
                     "TLS needs both --tls-cert and --tls-key");
  }
  if (tls.cert_file && !listen_addr) {
    free(paths);
    return cli_usage("serve", SYNOPSIS,
                     "TLS is for the TCP listener: add --listen HOST:PORT");
  }
  if (tls.cert_file && hr_tls_config_check(&tls, 1, why, sizeof why) != 0) {
    cli_err("serve", "%s (give PEM files: the certificate chain and its "
            "private key)", why);
    free(paths);
    return CLI_EXIT_FAIL;
  }
  /* Line-buffered: each log line leaves in one write(2), not two. */
  setvbuf(stderr, NULL, _IOLBF, 1 << 16);
  hr_metrics_config_default(&mcfg);
  mcfg.log = log_stderr;
  mcfg.log_level = log_level;
  if (hr_metrics_new(&sv.metrics, &mcfg, NULL) != 0) {
    free(paths);
    cli_err("serve", "out of memory");
    return CLI_EXIT_FAIL;
  }

  if (sv.token_file) {
    if (hr_auth_new(&sv.auth, NULL) != 0) {
      hr_metrics_del(sv.metrics);
      free(paths);
      return CLI_EXIT_FAIL;
    }
    rv = hr_auth_load_file(sv.auth, sv.token_file, why, sizeof why);
    if (rv) {
      cli_err("serve", "cannot use the token file %s: %s (format: TOKEN "
                       "[ro|rw] [PREFIX ...] per line)",
              sv.token_file, why);
      hr_auth_del(sv.auth);
      hr_metrics_del(sv.metrics);
      free(paths);
      return rv == HR_ERR_IO ? CLI_EXIT_FAIL : CLI_EXIT_USAGE;
    }
  }

  hr_store_config_default(&scfg);
  scfg.allow_put = allow_put;
  if (lv[L_ARENA] != UINT64_MAX)
    scfg.shm_arena_bytes = lv[L_ARENA];
  if (hr_store_new(&sv.store, &scfg, NULL) != 0) {
    hr_auth_del(sv.auth);
    hr_metrics_del(sv.metrics);
    free(paths);
    return CLI_EXIT_FAIL;
  }
  for (i = 0; i < npaths; i++) {
    struct stat st;
    const char *p = paths[i], *base;
    if (stat(p, &st) != 0) {
      cli_err("serve", "cannot read %s: %s (check the path)", p,
              strerror(errno));
      status = CLI_EXIT_FAIL;
      goto out;
    }
    if (S_ISDIR(st.st_mode)) {
      walk(&sv, p, "", 0);
    } else {
      base = strrchr(p, '/');
      base = base ? base + 1 : p;
      if (!ends_with(base, ".npy") && !ends_with(base, ".safetensors")) {
        cli_err("serve",
                "%s is neither .npy nor .safetensors (give those "
                "files or a directory holding them)",
                p);
        status = CLI_EXIT_FAIL;
        goto out;
      }
      load_file(&sv, p, base);
    }
  }

  sv.base = event_base_new();
  if (!sv.base) {
    cli_err("serve", "cannot create the event loop");
    status = CLI_EXIT_FAIL;
    goto out;
  }
  /* The store cap counts the served files too: PUTs may add
   * DEFAULT_PUT_ROOM over them unless --max-store-bytes sets the total. */
  {
    uint64_t loaded = hr_store_bytes(sv.store);
    hr_store_set_max_bytes(sv.store,
                           lv[L_STORE] != UINT64_MAX ? lv[L_STORE]
                           : loaded > UINT64_MAX - DEFAULT_PUT_ROOM
                               ? 0
                               : loaded + DEFAULT_PUT_ROOM);
  }
  hr_engine_config_default(&ecfg);
  if (max_shards)
    ecfg.session.max_shards = (uint16_t)max_shards;
  if (lv[L_CONNS] != UINT64_MAX)
    ecfg.max_connections = (uint32_t)lv[L_CONNS];
  if (lv[L_STREAMS] != UINT64_MAX)
    ecfg.session.max_streams = (uint32_t)lv[L_STREAMS];
  if (lv[L_PUT] != UINT64_MAX)
    ecfg.max_put_bytes = lv[L_PUT];
  if (lv[L_INFLIGHT] != UINT64_MAX)
    ecfg.max_inflight_bytes = lv[L_INFLIGHT];
  if (lv[L_CONN_INFLIGHT] != UINT64_MAX)
    ecfg.max_conn_inflight_bytes = lv[L_CONN_INFLIGHT];
  if (lv[L_SEND] != UINT64_MAX)
    ecfg.session.send_budget = lv[L_SEND];
  if (lv[L_MSG] != UINT64_MAX)
    ecfg.session.max_message_size = (uint32_t)lv[L_MSG];
  if (lv[L_HANDSHAKE] != UINT64_MAX)
    ecfg.session.handshake_timeout = lv[L_HANDSHAKE];
  if (lv[L_IDLE] != UINT64_MAX)
    ecfg.session.idle_timeout = lv[L_IDLE];
  if (lv[L_READ] != UINT64_MAX)
    ecfg.session.read_timeout = lv[L_READ];
  if (lv[L_STAGE] != UINT64_MAX)
    ecfg.session.rdma_stage_budget = lv[L_STAGE];
  if (tls.cert_file)
    ecfg.tls_server = &tls;
  if (fabric) {
    /* The fabric endpoint on the listening interface (a wildcard address
     * leaves the choice to the provider). */
    const char *colon = listen_addr ? strrchr(listen_addr, ':') : NULL;
    size_t hl = colon ? (size_t)(colon - listen_addr) : 0;
    if (hl && hl < sizeof fabric_node && listen_addr[0] != '[') {
      memcpy(fabric_node, listen_addr, hl);
      fabric_node[hl] = 0;
    }
    ecfg.fabric_provider = fabric;
    ecfg.fabric_node = fabric_node[0] && strcmp(fabric_node, "0.0.0.0")
                           ? fabric_node
                           : NULL;
  }
  hr_metrics_attach(sv.metrics, &ecfg);
  rv = hr_ev_attach(&sv.engine, sv.base, &ecfg, NULL);
  if (rv) {
    cli_err("serve", "cannot start the engine: %s%s", hr_strerror(rv),
            fabric ? " (is the --fabric provider available? see "
                     "`fi_info -l`)"
                   : "");
    status = CLI_EXIT_FAIL;
    goto out;
  }
  hr_store_provider(sv.store, &prov);
  if (sv.auth && hr_auth_wrap(sv.auth, &prov, &prov) != 0) {
    cli_err("serve", "out of memory");
    status = CLI_EXIT_FAIL;
    goto out;
  }
  rv = listen_addr ? hr_engine_listen(sv.engine, listen_addr, &prov, &lis)
                   : 0;
  if (rv) {
    cli_err("serve",
            "cannot listen on %s: %s (is the port in use? try "
            "--listen 127.0.0.1:0)",
            listen_addr,
            listen_why(rv, "not a usable HOST:PORT address"));
    status = CLI_EXIT_FAIL;
    goto out;
  }
  rv = unix_path ? hr_engine_listen(sv.engine, unix_addr, &prov, &ulis) : 0;
  if (rv) {
    cli_err("serve",
            "cannot listen on unix:%s: %s (is another server using it, or "
            "is the directory missing?)",
            unix_path,
            listen_why(rv, "not a usable socket path"));
    status = CLI_EXIT_FAIL;
    goto out;
  }
  signal(SIGPIPE, SIG_IGN);
  sigterm = evsignal_new(sv.base, SIGTERM, on_signal, &sv);
  sigint = evsignal_new(sv.base, SIGINT, on_signal, &sv);
  if (sv.auth)
    sighup = evsignal_new(sv.base, SIGHUP, on_hup, &sv);
  if (!sigterm || !sigint || evsignal_add(sigterm, NULL) ||
      evsignal_add(sigint, NULL) ||
      (sv.auth && (!sighup || evsignal_add(sighup, NULL)))) {
    cli_err("serve", "cannot install the signal handlers");
    status = CLI_EXIT_FAIL;
    goto out;
  }
  if (lis) {
    /* The port line is what scripts parse (--listen HOST:0). */
    const char *colon = strrchr(listen_addr, ':');
    int hl = colon ? (int)(colon - listen_addr) : (int)strlen(listen_addr);
    printf("listening on %.*s:%d\n", hl, listen_addr, hr_listener_port(lis));
  }
  if (ulis)
    printf("listening on %s\n", unix_addr);
  rv = metrics_addr ? hr_ev_metrics_listen(&mep, sv.base, sv.metrics, sv.engine,
                                           metrics_addr, NULL)
                    : 0;
  if (rv) {
    cli_err("serve",
            "cannot serve metrics on %s: %s (give HOST:PORT, e.g. "
            "127.0.0.1:9464, on a free port)",
            metrics_addr,
            listen_why(rv, "not a usable HOST:PORT address"));
    status = CLI_EXIT_FAIL;
    goto out;
  }
  if (mep) {
    const char *colon = strrchr(metrics_addr, ':');
    printf("metrics on %.*s:%d\n", (int)(colon - metrics_addr), metrics_addr,
           hr_ev_metrics_port(mep));
  }
  fflush(stdout);
  slog(&sv, HR_LOG_INFO, "start", "%zu tensor%s%s%s, PUT %s%s%s", sv.loaded,
       sv.loaded == 1 ? "" : "s", sv.skipped ? ", skipped " : "",
       sv.skipped ? "some files" : "", allow_put ? "allowed" : "refused",
       !tls.cert_file ? ""
       : tls.ca_file  ? ", TLS with client certificates"
                      : ", TLS",
       sv.auth ? ", AUTH_TOKEN required" : "");
  event_base_dispatch(sv.base);
out:
  hr_ev_metrics_close(mep);
  if (sigterm)
    event_free(sigterm);
  if (sigint)
    event_free(sigint);
  if (sighup)
    event_free(sighup);
  if (sv.engine && hr_engine_del(sv.engine) != 0) {
    slog(&sv, HR_LOG_ERROR, "exit", "connections still open at exit");
    status = CLI_EXIT_FAIL;
  }
  if (sv.base)
    event_base_free(sv.base);
  hr_store_del(sv.store);
  hr_auth_del(sv.auth);
  hr_metrics_del(sv.metrics);
  free(paths);
  return status;
}
