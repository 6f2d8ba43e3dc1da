#include "proxy/admin_guard.h"

#include <netinet/in.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

bool admin_peer_loopback(const struct sockaddr *peer)
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const struct sockaddr_in6 *s6;

    if (!peer)
        return false;
    if (peer->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)peer)->sin_addr.s_addr) >> 24) == 127;
    if (peer->sa_family != AF_INET6)
        return false;
    s6 = (const struct sockaddr_in6 *)peer;
    if (IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr))
        return true;
    /* A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d. */
    return !memcmp(s6->sin6_addr.s6_addr, mapped, sizeof mapped) &&
           s6->sin6_addr.s6_addr[12] == 127;
}

/* The token after "Bearer " (scheme case-insensitive, RFC 7235), or NULL. */
static const char *bearer(const char *authorization)
{
    if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0)
        return NULL;
    authorization += 7;
    while (*authorization == ' ')
        authorization++;
    return authorization;
}

/* Digests of both sides compared with CRYPTO_memcmp: the time taken says
 * nothing of the token, not even its length. */
static bool same_secret(const char *a, const char *b)
{
    unsigned char da[EVP_MAX_MD_SIZE], db[EVP_MAX_MD_SIZE];
    unsigned int la = 0, lb = 0;

    if (!EVP_Digest(a, strlen(a), da, &la, EVP_sha256(), NULL) ||
        !EVP_Digest(b, strlen(b), db, &lb, EVP_sha256(), NULL) || la != lb)
        return false;
    return CRYPTO_memcmp(da, db, la) == 0;
}

enum admin_access admin_peer_trusted(const struct sockaddr *peer,
                                     const char *authorization,
                                     const char *token)
{
    const char *sent;

    if (!token || !*token)
        return admin_peer_loopback(peer) ? ADMIN_ALLOWED : ADMIN_NOT_LOOPBACK;
    sent = bearer(authorization);
    if (!sent)
        return ADMIN_TOKEN_MISSING;
    return same_secret(sent, token) ? ADMIN_ALLOWED : ADMIN_TOKEN_WRONG;
}

const char *admin_access_why(enum admin_access a)
{
    switch (a) {
    case ADMIN_NOT_LOOPBACK:
        return "this request is served only on loopback connections (or with "
               "Authorization: Bearer <admin_token> once admin_token is set)";
    case ADMIN_TOKEN_MISSING:
        return "admin_token is set: send Authorization: Bearer <admin_token>";
    case ADMIN_TOKEN_WRONG:
        return "wrong admin token";
    default:
        return "allowed";
    }
}
