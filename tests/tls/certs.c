/*
 * Throwaway certificates (certs.h).
 */
#include "certs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

static int add_ext(X509 *x, X509 *issuer, int nid, const char *value) {
  X509V3_CTX ctx;
  X509_EXTENSION *ext;
  int ok;

  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
  ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
  if (!ext)
    return 0;
  ok = X509_add_ext(x, ext, -1);
  X509_EXTENSION_free(ext);
  return ok;
}

/* A certificate for `key` named `cn`, issued by (issuer, issuer_key), or
 * self-signed when issuer is NULL (a CA). */
static X509 *make_cert(EVP_PKEY *key, const char *cn, X509 *issuer,
                       EVP_PKEY *issuer_key, const char *san, long serial) {
  X509 *x = X509_new();
  X509_NAME *name;
  int ok;

  if (!x)
    return NULL;
  name = X509_get_subject_name(x);
  ok = X509_set_version(x, 2) &&
       ASN1_INTEGER_set(X509_get_serialNumber(x), serial) &&
       X509_gmtime_adj(X509_getm_notBefore(x), -3600) &&
       X509_gmtime_adj(X509_getm_notAfter(x), 86400) &&
       X509_set_pubkey(x, key) &&
       X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                  (const unsigned char *)cn, -1, -1, 0) &&
       X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name);
  if (ok && !issuer)
    ok = add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE") &&
         add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign") &&
         add_ext(x, x, NID_subject_key_identifier, "hash");
  else if (ok)
    ok = add_ext(x, issuer, NID_basic_constraints, "CA:FALSE") &&
         add_ext(x, issuer, NID_authority_key_identifier, "keyid:always") &&
         (!san || add_ext(x, issuer, NID_subject_alt_name, san));
  if (ok)
    ok = X509_sign(x, issuer_key ? issuer_key : key, EVP_sha256()) > 0;
  if (!ok) {
    X509_free(x);
    return NULL;
  }
  return x;
}

static int write_cert(const char *path, X509 *x) {
  FILE *f = fopen(path, "w");
  int ok = f && PEM_write_X509(f, x);

  if (f && fclose(f) != 0)
    ok = 0;
  return ok ? 0 : -1;
}

static int write_key(const char *path, EVP_PKEY *k) {
  FILE *f = fopen(path, "w");
  int ok = f && PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL);

  if (f && fclose(f) != 0)
    ok = 0;
  return ok ? 0 : -1;
}

static void path_of(char *out, const certs *c, const char *name) {
  snprintf(out, 128, "%s/%s", c->dir, name);
}

int certs_make(certs *c) {
  EVP_PKEY *ca_k, *srv_k, *cli_k, *oca_k, *ocli_k;
  X509 *ca = NULL, *srv = NULL, *cli = NULL, *oca = NULL, *ocli = NULL;
  int rv = -1;

  memset(c, 0, sizeof *c);
  strcpy(c->dir, "/tmp/hr_tls_XXXXXX");
  if (!mkdtemp(c->dir))
    return -1;
  path_of(c->ca, c, "ca.pem");
  path_of(c->server_cert, c, "server.pem");
  path_of(c->server_key, c, "server.key");
  path_of(c->client_cert, c, "client.pem");
  path_of(c->client_key, c, "client.key");
  path_of(c->other_ca, c, "other_ca.pem");
  path_of(c->other_client_cert, c, "other_client.pem");
  path_of(c->other_client_key, c, "other_client.key");
  ca_k = EVP_EC_gen("P-256");
  srv_k = EVP_EC_gen("P-256");
  cli_k = EVP_EC_gen("P-256");
  oca_k = EVP_EC_gen("P-256");
  ocli_k = EVP_EC_gen("P-256");
  if (!ca_k || !srv_k || !cli_k || !oca_k || !ocli_k)
    goto out;
  ca = make_cert(ca_k, "hurray test CA", NULL, NULL, NULL, 1);
  oca = make_cert(oca_k, "hurray other CA", NULL, NULL, NULL, 2);
  if (!ca || !oca)
    goto out;
  srv = make_cert(srv_k, "hurray-test-server", ca, ca_k,
                  "DNS:localhost,IP:127.0.0.1", 3);
  cli = make_cert(cli_k, "hurray-test-client", ca, ca_k, NULL, 4);
  ocli = make_cert(ocli_k, "hurray-other-client", oca, oca_k, NULL, 5);
  if (!srv || !cli || !ocli)
    goto out;
  if (write_cert(c->ca, ca) || write_cert(c->other_ca, oca) ||
      write_cert(c->server_cert, srv) || write_key(c->server_key, srv_k) ||
      write_cert(c->client_cert, cli) || write_key(c->client_key, cli_k) ||
      write_cert(c->other_client_cert, ocli) ||
      write_key(c->other_client_key, ocli_k))
    goto out;
  rv = 0;
out:
  X509_free(ca);
  X509_free(srv);
  X509_free(cli);
  X509_free(oca);
  X509_free(ocli);
  EVP_PKEY_free(ca_k);
  EVP_PKEY_free(srv_k);
  EVP_PKEY_free(cli_k);
  EVP_PKEY_free(oca_k);
  EVP_PKEY_free(ocli_k);
  if (rv)
    certs_remove(c);
  return rv;
}

void certs_remove(certs *c) {
  const char *files[] = {c->ca,          c->server_cert,       c->server_key,
                         c->client_cert, c->client_key,        c->other_ca,
                         c->other_client_cert, c->other_client_key};
  size_t i;

  for (i = 0; i < sizeof files / sizeof files[0]; i++)
    if (files[i][0])
      unlink(files[i]);
  if (c->dir[0])
    rmdir(c->dir);
}
