/*
 * `hurray ls [--tls-ca F] [--tls-cert F --tls-key F] URL [PREFIX]`: lists
 * the server's keys (every page), one line each: key, element type,
 * shape, layout, bytes.  The --tls-* options go with hurrays:// URLs.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define SYNOPSIS CLI_TLS_SYNOPSIS " URL [PREFIX]"

typedef struct ls_state {
  uint8_t last[HR_MAX_KEY];
  uint16_t last_len;
  size_t count;
} ls_state;

static int print_entry(const hr_list_entry *e, void *ud) {
  ls_state *st = ud;
  unsigned k;

  printf("%.*s\t%s\t[", (int)e->key_len, (const char *)e->key,
         hr_elem_type_name(e->element_type));
  for (k = 0; k < e->rank; k++)
    printf("%s%llu", k ? "," : "", (unsigned long long)e->shape[k]);
  printf("]\t%s\t%llu\n", hr_layout_name(e->layout_tag),
         (unsigned long long)e->total_data_bytes);
  memcpy(st->last, e->key, e->key_len);
  st->last_len = e->key_len;
  st->count++;
  return 0;
}

int cli_ls(int argc, char **argv) {
  const char *url = NULL, *prefix = "";
  cli_conn cc;
  cli_conn_opts co;
  ls_state st;
  int i, npos = 0, more = 0, rv, status = 0;

  memset(&co, 0, sizeof co);
  for (i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
      printf("usage: hurray ls " SYNOPSIS "\n");
      return 0;
    } else if (cli_tls_opt(argc, argv, &i, &co)) {
      continue;
    } else if (s[0] == '-' && s[1]) {
      return cli_usage("ls", SYNOPSIS, "unknown option %s", s);
    } else if (npos == 0) {
      url = s;
      npos++;
    } else if (npos == 1) {
      prefix = s;
      npos++;
    } else {
      return cli_usage("ls", SYNOPSIS, "unexpected argument \"%s\"", s);
    }
  }
  if (!url)
    return cli_usage("ls", SYNOPSIS, "give a URL");
  if (strlen(prefix) > HR_MAX_KEY)
    return cli_usage("ls", SYNOPSIS, "prefixes are at most 1024 bytes");
  co.cmd = "ls";
  co.url = url;
  if (cli_connect(&cc, &co))
    return CLI_EXIT_FAIL;
  {
    const hr_hello *h = hr_client_server_hello(cc.client);
    if (h && !(h->capability_flags & HR_CAP_LIST)) {
      cli_err("ls",
              "cannot list %s: the server does not answer LIST (its "
              "provider has no key listing)",
              url);
      cli_disconnect(&cc, "ls");
      return CLI_EXIT_FAIL;
    }
  }
  memset(&st, 0, sizeof st);
  do {
    size_t before = st.count;
    rv = hr_client_list(cc.client, (const uint8_t *)prefix,
                        (uint16_t)strlen(prefix), st.last, st.last_len,
                        HR_MAX_LIST_ENTRIES, print_entry, &st, &more, NULL);
    if (rv) {
      status = cli_client_fail("ls", "cannot list the keys", url,
                               hr_client_last_error(cc.client));
      break;
    }
    /* A page without entries cannot advance start_after: stop there. */
    if (st.count == before)
      break;
  } while (more);
  rv = cli_disconnect(&cc, "ls");
  return status ? status : rv;
}
