/*
 * The `hurray` command: shared helpers of the sub-commands.
 *
 * Every failure is reported as one line on stderr, "hurray CMD: what:
 * why (what to do)", and a non-zero exit: 1 for a failed operation, 2 for
 * a usage error.
 */
#ifndef HR_CLI_H
#define HR_CLI_H

#include <stddef.h>
#include <stdint.h>

#include <hurray/client.h>
#include <hurray/wire.h>

#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

int cli_serve(int argc, char **argv);
int cli_get(int argc, char **argv);
int cli_put(int argc, char **argv);
/* --device NAME (cmd_get.c): the device tag of a name (cpu, cuda, rocm,
 * level_zero, vulkan, sim; -1: unknown) and the backend that opens it
 * (NULL: none, e.g. cpu). */
int cli_parse_device(const char *name);
const char *cli_device_backend(int tag);
int cli_ls(int argc, char **argv);
int cli_inspect(int argc, char **argv);

/* Prints "hurray CMD: MESSAGE" and a newline on stderr. */
void cli_err(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Usage error: prints the line and the command's synopsis; returns 2. */
int cli_usage(const char *cmd, const char *synopsis, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reports a failed client call (connect, get, put, list) in one line:
 * `action` says what was attempted ("cannot fetch \"k\""); the error's
 * wire code, message and a hint follow.  Returns 1. */
int cli_client_fail(const char *cmd, const char *action, const char *url,
                    const hr_client_error *e);

/* Parses an unsigned decimal (whole string).  Returns 0 or -1. */
int cli_parse_u64(const char *s, uint64_t *out);

/* Parses a byte count: decimal with an optional K, M, G or T suffix
 * (powers of 1024, either case).  Returns 0 or -1. */
int cli_parse_size(const char *s, uint64_t *out);

/* Parses a duration into ns: decimal seconds ("30"), or with a unit
 * ("250ms", "30s", "5m").  Returns 0 or -1. */
int cli_parse_duration(const char *s, uint64_t *ns);

/* The client's AUTH_TOKEN: the first field of the first line of `file`
 * that is neither blank nor a comment (so a server's token file works),
 * or, with `file` NULL, $HURRAY_AUTH_TOKEN.  *out receives a malloc'd
 * copy (NULL when there is no token; free it).  Reports a failure and
 * returns -1. */
int cli_auth_token(const char *cmd, const char *file, char **out,
                   size_t *len);

/* Parses "A,B,C" into at most `max` values; returns the count or -1. */
int cli_parse_list(const char *s, uint64_t *out, int max);

/* Connects with the command's options (progress bar when stderr is a
 * terminal, --dump-wire tap).  On failure reports it and returns NULL. */
typedef struct cli_conn_opts {
  const char *cmd;
  const char *url;
  const char *dump_wire; /* file for the raw received bytes, or NULL */
  uint64_t expect_bytes; /* for the progress bar's percentage (0: ?) */
  int progress;          /* draw a progress bar (stderr is a tty) */
  int64_t timeout_ms;
  unsigned lanes;          /* connections of the session (0: one) */
  const uint8_t *devices;  /* CLIENT_HELLO devices (NULL: CPU only) */
  uint16_t device_count;
  /* --tls-ca, --tls-cert, --tls-key (NULL: not given); only for
   * hurrays:// URLs. */
  const char *tls_ca, *tls_cert, *tls_key;
  const char *fabric;      /* --fabric PROVIDER ("auto"), or NULL */
  int no_shm;              /* never use the SHM data plane (--no-shm) */
  const char *auth_token_file; /* --auth-token-file (NULL: the
                                  HURRAY_AUTH_TOKEN variable, if set) */
  int stage_budget_set;  /* --rdma-stage-budget given (put) ... */
  uint64_t stage_budget; /* ... hr_settings.rdma_stage_budget */
} cli_conn_opts;

typedef struct cli_conn {
  hr_client *client;
  void *dump; /* FILE * of --dump-wire */
  struct cli_progress *bar;
  int dump_failed; /* a write to the dump file failed */
  char *auth_token; /* AUTH_TOKEN sent (malloc'd), or NULL */
} cli_conn;

int cli_connect(cli_conn *cc, const cli_conn_opts *o);
/* The client options --tls-ca F, --tls-cert F and --tls-key F of get, put
 * and ls: when argv[*i] is one of them (with its value) stores it in `o`,
 * advances *i and returns 1; else 0. */
int cli_tls_opt(int argc, char **argv, int *i, cli_conn_opts *o);
/* The usage text of those options. */
#define CLI_TLS_SYNOPSIS "[--tls-ca F] [--tls-cert F --tls-key F]"
/* Closes the client and the dump file.  Returns 0, or 1 when the dump
 * file could not be written completely (reported). */
int cli_disconnect(cli_conn *cc, const char *cmd);
/* Sets the total the progress bar counts towards. */
void cli_progress_total(cli_conn *cc, uint64_t total, int upload);
/* Clears the progress bar line if one was drawn. */
void cli_progress_done(cli_conn *cc);

/* The local address a fabric endpoint should use to reach `url`'s host:
 * "127.0.0.1" for a loopback host, else NULL (the provider's default). */
const char *cli_fabric_node(const char *url);

/* "1.5 GiB" etc. */
void cli_human_bytes(uint64_t n, char *out, size_t cap);

#endif /* HR_CLI_H */
