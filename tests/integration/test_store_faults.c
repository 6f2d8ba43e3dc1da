/* Store faults (docs/contract.md §6): when the idempotency store cannot be
 * written, sluice answers requeue / store_unavailable and forwards nothing;
 * other policies keep working. The store lives on a 128 MiB tmpfs that the
 * test fills with incompressible answers until the store refuses to write
 * (it keeps 64 MiB for RocksDB, whose writer must never meet a full disk).
 * Mounting needs root, which the test command and CI have. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <signal.h>
#include <sys/stat.h>

#include "integration/harness.h"
#include "support/testutil.h"

static struct h_stub stub;
static struct h_sluice sl;
static char *mnt;

static void start(void)
{
    char *cfg;

    sl.dir = tu_mkdtemp("faults");
    cr_assert(asprintf(&mnt, "%s/data", sl.dir) > 0);
    cr_assert_eq(mkdir(mnt, 0755), 0);
    cr_assert_eq(mount("tmpfs", mnt, "tmpfs", 0, "size=128m"), 0,
                 "mounting a tmpfs needs root (the test command runs as root)");
    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
        "policies:\n  p: {idempotency: {max_stored_body: 4MiB}}\n"
        "routes:\n"
        "  - {prefix: /p, upstream: stub, policy: p}\n"
        "  - {prefix: /free, upstream: stub}\n", stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
}

static void stop(void)
{
    h_sluice_stop(&sl, 10);
    h_stub_stop(&stub);
    if (mnt)
        umount2(mnt, MNT_DETACH);
    free(mnt);
    mnt = NULL;
    h_sluice_cleanup(&sl);
}

TestSuite(store_faults, .init = start, .fini = stop, .timeout = 120);

Test(store_faults, a_full_store_refuses_to_forward)
{
    size_t big = 256 * 1024;
    char *body = malloc(big), hdr[64];
    bool refused = false;

    /* Each completed record stores a 256 KiB answer (the stub echoes the
     * body), random so that compression cannot shrink it: the tmpfs fills. */
    srand(42);
    for (int i = 0; i < 600 && !refused; i++) {
        struct h_resp r;
        long long before = h_stub_stat(&stub, "requests");

        for (size_t b = 0; b < big; b++)
            body[b] = (char)(rand() & 0xff);
        snprintf(hdr, sizeof hdr, "Idempotency-Key: fill-%d\r\n", i);
        cr_assert_eq(h_http(sl.port, "POST", "/p", hdr, body, big, &r), 0);
        if (r.status == 503 && r.body && strstr(r.body, "\"store_unavailable\"")) {
            char *o = h_header(&r, "Sluice-Outcome");
            refused = true;
            cr_expect_str_eq(o, "requeue");
            free(o);
            cr_expect_eq(h_stub_stat(&stub, "requests"), before, "nothing was forwarded");
        }
        h_resp_free(&r);
    }
    free(body);
    cr_expect(refused, "the store never failed (is the tmpfs there?)");
    {
        struct h_resp r;
        cr_assert_eq(h_http(sl.port, "GET", "/free/x", NULL, NULL, 0, &r), 0);
        cr_expect_eq(r.status, 200, "a policy without idempotency keeps working");
        h_resp_free(&r);
        cr_assert_eq(h_http(sl.admin_port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
        cr_expect(strstr(r.body, "sluice_store_errors_total 0") == NULL, "counted");
        h_resp_free(&r);
    }
    cr_expect(h_file_contains(sl.log_path, "idempotency store"), "logged");
    /* the access log says the attempt the instruction's body said (0) */
    cr_expect(h_file_contains(sl.log_path, "\"reason\":\"store_unavailable\",\"attempt\":0,"),
              "the access log's attempt differs from the body's");
    cr_expect(sl.pid > 0 && kill(sl.pid, 0) == 0, "sluice is still running");
}
