/* Idempotency keys and request fingerprints (docs/contract.md §6). */
#ifndef SLUICE_POLICIES_IDEMKEY_H
#define SLUICE_POLICIES_IDEMKEY_H

#include <stddef.h>
#include <stdint.h>

#define IDEM_KEY_MAX 255

/* Validates a key header value and writes the key to out (NUL-terminated):
 * 1 to 255 visible ASCII characters; a value that starts with '"' must be a
 * valid Structured-Field string (RFC 8941) and is unquoted. 0, or -EINVAL
 * with the reason in why. */
int idem_key_parse(const char *raw, char out[IDEM_KEY_MAX + 1], char *why,
                   size_t wlen);

/* SHA-256 over the parts (SC_FP_* bits): each part is hashed as its length
 * (8 bytes, big-endian) then its bytes, so parts cannot run into each other. */
void idem_fingerprint(unsigned parts, const char *method, const char *target,
                      const void *body, size_t body_len, uint8_t out[32]);

#endif
