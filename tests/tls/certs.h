/*
 * Throwaway certificates for the TLS tests and benchmark, made with the
 * OpenSSL API at run time (no private key is ever committed): a CA, a
 * server certificate for localhost and 127.0.0.1, a client certificate,
 * and a second, unrelated CA with its own client certificate.  Keys are
 * EC P-256.
 */
#ifndef HR_TEST_CERTS_H
#define HR_TEST_CERTS_H

#include <stddef.h>

typedef struct certs {
  char dir[64];
  char ca[128];          /* CA certificate */
  char server_cert[128]; /* CN hurray-test-server, SAN localhost, 127.0.0.1 */
  char server_key[128];
  char client_cert[128]; /* CN hurray-test-client, issued by ca */
  char client_key[128];
  char other_ca[128];          /* an unrelated CA */
  char other_client_cert[128]; /* issued by other_ca */
  char other_client_key[128];
} certs;

/* Makes the files in a new directory under /tmp.  Returns 0 or -1. */
int certs_make(certs *c);
/* Removes them. */
void certs_remove(certs *c);

#endif /* HR_TEST_CERTS_H */
