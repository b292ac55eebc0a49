/* The `hurray` command tests' harness: see cli_harness.h. */
#include "cli_harness.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

extern char **environ;

int ch_tmpdir(ch_cli *c, const char *stem) {
  snprintf(c->dir, sizeof c->dir, "/tmp/%s_XXXXXX", stem);
  if (!mkdtemp(c->dir))
    return -1;
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

int ch_rmdir(ch_cli *c) {
  char cmd[sizeof c->dir + 16];

  snprintf(cmd, sizeof cmd, "rm -rf %s", c->dir);
  return system(cmd) == 0 ? 0 : -1;
}

const char *ch_path(const ch_cli *c, const char *name) {
  static char p[8][512];
  static int k;

  k = (k + 1) % 8;
  snprintf(p[k], sizeof p[k], "%s/%s", c->dir, name);
  return p[k];
}

size_t ch_slurp(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(buf, 1, cap - 1, f) : 0;

  buf[n] = '\0';
  if (f)
    fclose(f);
  return n;
}

void ch_write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");

  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* The exit status of a waited-for child, or 128 + its signal. */
static int exit_status(int st) {
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int ch_runv(ch_cli *c, char *const *env, const char *const *args) {
  const char *argv[40];
  posix_spawn_file_actions_t fa;
  pid_t pid;
  int n = 0, st;

  argv[n++] = c->bin;
  while (n < 39 && (argv[n] = args[n - 1]))
    n++;
  argv[n] = NULL;
  posix_spawn_file_actions_init(&fa);
  if (c->out)
    posix_spawn_file_actions_addopen(&fa, 1, ch_path(c, "stdout"),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  else
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, ch_path(c, "stderr"),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_int_equal(posix_spawn(&pid, c->bin, &fa, NULL, (char *const *)argv,
                               env ? env : environ),
                   0);
  posix_spawn_file_actions_destroy(&fa);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  if (c->out)
    ch_slurp(ch_path(c, "stdout"), c->out, c->out_cap);
  ch_slurp(ch_path(c, "stderr"), c->err, c->err_cap);
  return exit_status(st);
}

pid_t ch_spawn_piped(const char *const *argv, const char *log, int *out_fd) {
  posix_spawn_file_actions_t fa;
  int pipefd[2];
  pid_t pid;

  assert_int_equal(pipe(pipefd), 0);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
  posix_spawn_file_actions_addclose(&fa, pipefd[0]);
  if (log)
    posix_spawn_file_actions_addopen(&fa, 2, log,
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_int_equal(
      posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  close(pipefd[1]);
  *out_fd = pipefd[0];
  return pid;
}

void ch_read_line(int fd, char *line, size_t cap) {
  size_t n = 0;

  while (n < cap - 1) {
    ssize_t k = read(fd, line + n, 1);
    if (k <= 0 || line[n] == '\n')
      break;
    n++;
  }
  line[n] = '\0';
}

int ch_listen_port(int fd) {
  char line[256];
  int port;

  ch_read_line(fd, line, sizeof line);
  assert_non_null(strstr(line, "listening on 127.0.0.1:"));
  port = atoi(strrchr(line, ':') + 1);
  assert_true(port > 0);
  return port;
}

pid_t ch_serve(ch_cli *c, const char *const *args, int *port, int *out_fd) {
  const char *argv[40] = {c->bin, "serve", "--listen", "127.0.0.1:0"};
  int n = 4, fd;
  pid_t pid;

  while (n < 39 && (argv[n] = args[n - 4]))
    n++;
  argv[n] = NULL;
  pid = ch_spawn_piped(argv, ch_path(c, "server.log"), &fd);
  *port = ch_listen_port(fd);
  if (out_fd)
    *out_fd = fd;
  else
    close(fd);
  return pid;
}

int ch_stop(pid_t pid) {
  int st;

  assert_int_equal(kill(pid, SIGTERM), 0);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return exit_status(st);
}

void ch_single_line(const char *s) {
  const char *nl = strchr(s, '\n');

  assert_non_null(nl);
  assert_int_equal(nl[1], '\0');
}

void ch_one_line(const char *s) {
  ch_single_line(s);
  assert_int_equal(strncmp(s, "hurray ", 7), 0);
}
