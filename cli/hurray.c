/*
 * The `hurray` command: serve tensors, fetch and store them, list keys,
 * decode captures.  See `hurray help`.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <hurray/common.h>

#include "cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hurray COMMAND [ARGS]\n"
          "\n"
          "  serve [--listen HOST:PORT] [--unix PATH] [--allow-put] "
          "[--max-shards N]\n"
          "        [--metrics-listen HOST:PORT] [--log-level LEVEL] [-v] "
          "PATH...\n"
          "        serve every .npy and .safetensors under PATH "
          "(default 127.0.0.1:7474);\n"
          "        JSON log lines on stderr, Prometheus metrics at "
          "http://HOST:PORT/metrics\n"
          "  get [--layout NAME]... [--allow-transcode] [--device NAME] "
          "[--parallel N]\n"
          "      [--region OFF,...:SHAPE,...] [-o OUT.npy] [--stats] "
          "[--dump-wire FILE] URL KEY\n"
          "        fetch a tensor (layouts: row-major, column-major, strided, "
          "permuted,\n"
          "        tiled, panel:MR, tiled:T0,T1,.., permuted:P0,P1,..)\n"
          "  put [--replace] URL KEY FILE.npy\n"
          "        store a .npy on a server started with --allow-put\n"
          "  ls URL [PREFIX]\n"
          "        list the keys a server holds\n"
          "  inspect FILE\n"
          "        decode a raw capture (e.g. from get --dump-wire)\n"
          "  version\n"
          "\n"
          "URLs look like hurray://127.0.0.1:7474 or unix:/run/hurray.sock."
          "\n");
}

int main(int argc, char **argv) {
  const char *cmd;

  /* A peer closing mid-write must not kill the process. */
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  cmd = argv[1];
  if (!strcmp(cmd, "serve"))
    return cli_serve(argc - 1, argv + 1);
  if (!strcmp(cmd, "get"))
    return cli_get(argc - 1, argv + 1);
  if (!strcmp(cmd, "put"))
    return cli_put(argc - 1, argv + 1);
  if (!strcmp(cmd, "ls"))
    return cli_ls(argc - 1, argv + 1);
  if (!strcmp(cmd, "inspect"))
    return cli_inspect(argc - 1, argv + 1);
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
    const hr_info *i = hr_version(0);
    printf("hurray %s (%s)\n", i->version, i->proto);
    return 0;
  }
  if (!strcmp(cmd, "help") || !strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "hurray: unknown command \"%s\" (see `hurray help`)\n", cmd);
  return CLI_EXIT_USAGE;
}
