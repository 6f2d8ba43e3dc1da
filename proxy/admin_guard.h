/* Who may ask the admin listener for what. Probes and scrapes (GET of
 * health, config, metrics, records without bodies) are open to whoever
 * reaches the port, so it can listen on the pod IP; requests that change
 * state or reveal a stored body are "guarded": served to loopback peers, or,
 * once admin_token is set, to whoever sends it as a bearer token, loopback
 * included (then a local process needs the token too). */
#ifndef SLUICE_PROXY_ADMIN_GUARD_H
#define SLUICE_PROXY_ADMIN_GUARD_H

#include <stdbool.h>

struct sockaddr;

enum admin_access {
    ADMIN_ALLOWED = 0,
    ADMIN_NOT_LOOPBACK,   /* no token configured, peer not on loopback */
    ADMIN_TOKEN_MISSING,  /* a token is configured, none sent */
    ADMIN_TOKEN_WRONG,    /* a token was sent and does not match */
};

/* True for 127.0.0.0/8, ::1 and IPv4-mapped ::ffff:127.0.0.0/104. NULL or
 * another family: false. */
bool admin_peer_loopback(const struct sockaddr *peer);

/* The decision for a guarded request from peer carrying `authorization`
 * (the header's value, NULL when absent), with the configured token ("" or
 * NULL = none). The token is compared in constant time. */
enum admin_access admin_peer_trusted(const struct sockaddr *peer,
                                     const char *authorization,
                                     const char *token);

/* A one-line reason for a refusal, for the 403's body. */
const char *admin_access_why(enum admin_access a);

#endif
