/*
 * Harness of the tests that run the `hurray` command as a user would
 * (tests/engine_io/test_cli.c, tests/tls/test_tls_cli.c,
 * tests/attack/test_cli_policy.c, tests/metrics/test_cli_metrics.c,
 * tests/engine_io/test_examples.c):
 * a temporary directory, commands run to completion with their output
 * captured, and servers started in the background with the port they
 * print.
 *
 * Failures are cmocka assertions (the calling test fails).  A test
 * program drives one ch_cli, on one thread.
 */
#ifndef HR_TESTS_CLI_HARNESS_H
#define HR_TESTS_CLI_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

/* A test program's command runner. */
typedef struct ch_cli {
  const char *bin; /* the program ch_run() runs: the `hurray` binary */
  char dir[256];   /* where the captured output and server logs go */
  char *out, *err; /* the last ch_run()'s stdout and stderr (NUL-ended);
                      `out` NULL: stdout goes to /dev/null */
  size_t out_cap, err_cap;
} ch_cli;

/* Defines this program's runner `H`, running `prog`, with the buffers
 * `out` and `err` (64 KiB each) holding the last command's output. */
#define CH_CLI_DEFINE(prog)                                                    \
  static char out[1 << 16], err[1 << 16];                                      \
  static ch_cli H = {.bin = (prog),                                            \
                     .out = out,                                               \
                     .out_cap = sizeof out,                                    \
                     .err = err,                                               \
                     .err_cap = sizeof err}

/* Creates a fresh directory "/tmp/STEM_XXXXXX" into c->dir and ignores
 * SIGPIPE (a server may go while we write to it).  Returns 0 or -1. */
int ch_tmpdir(ch_cli *c, const char *stem);

/* Removes c->dir and everything in it.  Returns 0 or -1. */
int ch_rmdir(ch_cli *c);

/* "DIR/NAME" in c->dir; eight calls may be live at once (a rotating set
 * of buffers), enough for one command line. */
const char *ch_path(const ch_cli *c, const char *name);

/* Reads at most cap-1 bytes of `path` into buf, NUL-terminated (empty
 * when it does not open).  Returns the length. */
size_t ch_slurp(const char *path, char *buf, size_t cap);

/* Writes `text` to `path` (replacing it). */
void ch_write_file(const char *path, const char *text);

/* Runs `c->bin ARGS...` (`args` NULL-terminated, at most 38) with `env`
 * (NULL: ours), waits for it, and leaves its stdout and stderr in c->out
 * and c->err.  Returns the exit status, or 128 + the signal. */
int ch_runv(ch_cli *c, char *const *env, const char *const *args);

/* ch_runv(c, NULL, {ARGS..., NULL}); a NULL among ARGS ends them early. */
#define CH_RUN(c, ...)                                                         \
  ch_runv((c), NULL, (const char *const[]){__VA_ARGS__, NULL})

/* Starts `argv[0] argv[1]...` in the background (NULL-terminated), its
 * stdout a pipe (*out_fd receives the read end) and its stderr the file
 * `log` (NULL: ours).  Returns the pid. */
pid_t ch_spawn_piped(const char *const *argv, const char *log, int *out_fd);

/* Reads one line from fd, byte by byte (what follows stays unread),
 * without its newline. */
void ch_read_line(int fd, char *line, size_t cap);

/* Reads the line "... listening on 127.0.0.1:PORT" from fd; returns
 * PORT (> 0). */
int ch_listen_port(int fd);

/* Starts `c->bin serve --listen 127.0.0.1:0 ARGS...` (`args`
 * NULL-terminated, at most 34), stderr in ch_path(c, "server.log"), and
 * reads its port from the first line.  `out_fd` NULL: the pipe is closed;
 * otherwise its read end is left there for further lines.  Returns the
 * pid. */
pid_t ch_serve(ch_cli *c, const char *const *args, int *port, int *out_fd);

/* SIGTERM to `pid`, then waits for it.  Returns its exit status, or 128 +
 * the signal. */
int ch_stop(pid_t pid);

/* Asserts that `s` is exactly one newline-terminated line. */
void ch_single_line(const char *s);

/* Asserts that `s` is one line naming the command ("hurray ..."): how
 * every failure is reported. */
void ch_one_line(const char *s);

#endif /* HR_TESTS_CLI_HARNESS_H */
