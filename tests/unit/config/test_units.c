/* policies/units.c: every value syntax of docs/contract.md §2, its malformed
 * variants and its overflows, plus the writers used by /config. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"
#include "config/units.h"

struct dur_case {
    const char *in;
    uint64_t ms;
};

Test(units_duration, accepts_every_unit)
{
    static const struct dur_case ok[] = {
        {"250ms", 250},          {"2s", 2000},         {"5m", 300000},
        {"24h", 86400000},       {"7d", 604800000},    {"0", 0},
        {"0s", 0},               {"0ms", 0},           {"1.5s", 1500},
        {"0.25s", 250},          {"1.5m", 90000},      {"0.5ms", 1},
        {"0.4ms", 0},            {"1.0000000001s", 1000},
        {"30s", 30000},          {"007s", 7000},
    };
    size_t i;

    for (i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t ms = 12345;
        char why[128] = "";
        cr_expect_eq(units_parse_duration(ok[i].in, &ms, why, sizeof why), 0,
                     "%s: %s", ok[i].in, why);
        cr_expect_eq(ms, ok[i].ms, "%s -> %llu", ok[i].in,
                     (unsigned long long)ms);
    }
}

Test(units_duration, rejects_malformed)
{
    static const char *const bad[] = {
        "", "30", "30x", "s", "ms", "-1s", "+1s", " 2s", "2s ", "2 s", "1.s",
        ".5s", "2S", "2MS", "1e3s", "2sm", "0x10s", "inf", "nan",
        "2sec", "1,5s", "1..5s", "00", "1w",
    };
    size_t i;

    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t ms = 777;
        char why[128] = "";
        cr_expect_eq(units_parse_duration(bad[i], &ms, why, sizeof why),
                     -EINVAL, "\"%s\" should be rejected", bad[i]);
        cr_expect_eq(ms, 777, "\"%s\" must not write the result", bad[i]);
        cr_expect_str_eq(why, "expected a number followed by ms, s, m, h or d",
                         "%s", bad[i]);
    }
    cr_expect_eq(units_parse_duration(NULL, &(uint64_t){0}, NULL, 0), -EINVAL);
}

Test(units_duration, accepts_compound_forms)
{
    static const struct dur_case ok[] = {
        {"1m30s", 90000},        {"1h5m", 3900000},      {"2s500ms", 2500},
        {"1h30m", 5400000},      {"1d2h3m4s5ms", 93784005},
        {"1m30.5s", 90500},      {"1h0m", 3600000},      {"0h0s", 0},
        {"7d0ms", 604800000},    {"1m0.0001s", 60000},   {"10m01s", 601000},
    };

    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t ms = 12345;
        char why[128] = "";
        cr_expect_eq(units_parse_duration(ok[i].in, &ms, why, sizeof why), 0,
                     "%s: %s", ok[i].in, why);
        cr_expect_eq(ms, ok[i].ms, "%s -> %llu", ok[i].in, (unsigned long long)ms);
    }
}

Test(units_duration, rejects_bad_compound_forms)
{
    static const struct {
        const char *in, *why;
    } bad[] = {
        {"30m1h", "units must get smaller from left to right, each at most once, as in 1h30m"},
        {"1s1s", "units must get smaller from left to right, each at most once, as in 1h30m"},
        {"1ms1s", "units must get smaller from left to right, each at most once, as in 1h30m"},
        {"1.5h30m", "only the last part may have a fraction, as in 1m30.5s"},
        {"1m30", "expected a number followed by ms, s, m, h or d"},
        {"1m 30s", "expected a number followed by ms, s, m, h or d"},
        {"1m+30s", "expected a number followed by ms, s, m, h or d"},
        {"1h-30m", "expected a number followed by ms, s, m, h or d"},
        {"1m30sx", "expected a number followed by ms, s, m, h or d"},
        {"1m.5s", "expected a number followed by ms, s, m, h or d"},
        {"0m0", "expected a number followed by ms, s, m, h or d"},
    };

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t ms = 777;
        char why[128] = "";
        cr_expect_eq(units_parse_duration(bad[i].in, &ms, why, sizeof why), -EINVAL,
                     "\"%s\" should be rejected", bad[i].in);
        cr_expect_eq(ms, 777, "\"%s\" must not write the result", bad[i].in);
        cr_expect_str_eq(why, bad[i].why, "%s", bad[i].in);
    }
}

Test(units_duration, compound_overflow_is_erange)
{
    char why[128] = "";
    uint64_t ms = 0;

    /* 213503982334d is 2^64 ms less 51951616: 14h fits, 15h does not. */
    cr_expect_eq(units_parse_duration("213503982334d14h", &ms, why, sizeof why), 0, "%s", why);
    cr_expect_eq(ms, 213503982334ull * 86400000 + 14ull * 3600000);
    cr_expect_eq(units_parse_duration("213503982334d15h", &ms, why, sizeof why), -ERANGE);
    cr_expect_str_eq(why, "too large");
    cr_expect_eq(units_parse_duration("1h99999999999999999999999s", &ms, why, sizeof why),
                 -ERANGE);
}

Test(units_duration, overflow_is_erange)
{
    static const char *const big[] = {
        "18446744073709551616ms",   /* 2^64 */
        "18446744073709551615s",    /* fits as a number, not in ms */
        "213503982334601d",         /* 2^64 ms is about 2.1e11 days */
        "99999999999999999999999999h",
    };
    char why[128];
    uint64_t ms;
    size_t i;

    for (i = 0; i < sizeof big / sizeof big[0]; i++) {
        cr_expect_eq(units_parse_duration(big[i], &ms, why, sizeof why),
                     -ERANGE, "%s", big[i]);
        cr_expect_str_eq(why, "too large");
    }
    cr_expect_eq(units_parse_duration("18446744073709551615ms", &ms, NULL, 0), 0);
    cr_expect_eq(ms, UINT64_MAX);
}

struct rate_case {
    const char *in;
    double per_sec;
};

Test(units_rate, accepts_every_unit_and_fractions)
{
    static const struct rate_case ok[] = {
        {"10/s", 10},        {"600/m", 10},    {"36000/h", 10},
        {"0.5/s", 0.5},      {"86400/d", 1},   {"1/m", 1.0 / 60},
        {"1000000000/s", 1e9}, {"0.000001/s", 1e-6}, {"2.75/s", 2.75},
    };
    size_t i;

    for (i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        double r = -1;
        char why[128] = "";
        cr_expect_eq(units_parse_rate(ok[i].in, &r, why, sizeof why), 0,
                     "%s: %s", ok[i].in, why);
        cr_expect(fabs(r - ok[i].per_sec) <= 1e-12 * ok[i].per_sec,
                  "%s -> %.17g", ok[i].in, r);
    }
}

Test(units_rate, rejects_malformed)
{
    static const char *const bad[] = {
        "", "10", "10/", "10/x", "/s", "10/ s", "10 /s", "10/S", "1e3/s",
        "10/sec", "ten/s", "10/s/s", ".5/s", "10//s", "+10/s",
    };
    size_t i;

    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        double r = 3;
        char why[128] = "";
        cr_expect_eq(units_parse_rate(bad[i], &r, why, sizeof why), -EINVAL,
                     "\"%s\" should be rejected", bad[i]);
        cr_expect_eq(r, 3);
        cr_expect_str_eq(why, "expected a number of events per s, m, h or d, "
                         "such as 10/s", "%s", bad[i]);
    }
}

Test(units_rate, non_positive_and_out_of_range)
{
    char why[128];
    double r;

    cr_expect_eq(units_parse_rate("0/s", &r, why, sizeof why), -ERANGE);
    cr_expect_str_eq(why, "must be greater than 0");
    cr_expect_eq(units_parse_rate("0.0/m", &r, why, sizeof why), -ERANGE);
    cr_expect_eq(units_parse_rate("-5/s", &r, why, sizeof why), -ERANGE);
    cr_expect_str_eq(why, "must be greater than 0");
    cr_expect_eq(units_parse_rate("2000000000/s", &r, why, sizeof why), -ERANGE);
    cr_expect(strstr(why, "too large") != NULL, "%s", why);
    cr_expect_eq(units_parse_rate("0.01/d", &r, why, sizeof why), -ERANGE);
    cr_expect(strstr(why, "too small") != NULL, "%s", why);
    cr_expect_eq(units_parse_rate("99999999999999999999999/s", &r, why,
                                  sizeof why), -ERANGE);
}

struct size_case {
    const char *in;
    uint64_t bytes;
};

Test(units_size, accepts_every_unit)
{
    static const struct size_case ok[] = {
        {"512", 512},           {"0", 0},              {"16KiB", 16384},
        {"8MiB", 8388608},      {"1GiB", 1073741824},  {"1KB", 1000},
        {"1kB", 1000},          {"1k", 1000},          {"1K", 1000},
        {"2MB", 2000000},       {"3GB", 3000000000u},  {"1.5KiB", 1536},
        {"512B", 512},          {"0.5MiB", 524288},
        {"18446744073709551615", UINT64_MAX},
    };
    size_t i;

    for (i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t b = 1;
        char why[160] = "";
        cr_expect_eq(units_parse_size(ok[i].in, &b, why, sizeof why), 0,
                     "%s: %s", ok[i].in, why);
        cr_expect_eq(b, ok[i].bytes, "%s -> %llu", ok[i].in,
                     (unsigned long long)b);
    }
}

Test(units_size, rejects_malformed)
{
    static const char *const bad[] = {
        "", "1.5", "1.5B", "16kib", "16 KiB", "KiB", "-1", "1TiB", "16kb",
        "16Kib", "0x10", "1e3", "16KiB ", " 16KiB", "16KiBs", "1..5KiB",
    };
    size_t i;

    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t b = 9;
        char why[160] = "";
        cr_expect_eq(units_parse_size(bad[i], &b, why, sizeof why), -EINVAL,
                     "\"%s\" should be rejected", bad[i]);
        cr_expect_eq(b, 9);
        cr_expect(strstr(why, "KiB") != NULL, "%s: %s", bad[i], why);
    }
}

Test(units_size, overflow_is_erange)
{
    char why[64];
    uint64_t b;

    cr_expect_eq(units_parse_size("18446744073709551616", &b, why, sizeof why),
                 -ERANGE);
    cr_expect_str_eq(why, "too large");
    cr_expect_eq(units_parse_size("17179869184GiB", &b, NULL, 0), -ERANGE);
    cr_expect_eq(units_parse_size("20000000000GB", &b, NULL, 0), -ERANGE);
    cr_expect_eq(units_parse_size("17179869183GiB", &b, NULL, 0), 0);
}

struct hp_case {
    const char *in;
    const char *host;
    uint16_t port;
};

Test(units_hostport, accepts_names_v4_v6)
{
    static const struct hp_case ok[] = {
        {"127.0.0.1:8080", "127.0.0.1", 8080},
        {"[::1]:9901", "::1", 9901},
        {"[::]:80", "::", 80},
        {"0.0.0.0:80", "0.0.0.0", 80},
        {"localhost:0", "localhost", 0},
        {"statsd.kube-system.svc:8125", "statsd.kube-system.svc", 8125},
        {"example.com:65535", "example.com", 65535},
        {"[2001:db8::1]:443", "2001:db8::1", 443},
        {"my_host:1", "my_host", 1},
    };
    size_t i;

    for (i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char *host = NULL, why[128] = "";
        uint16_t port = 1234;
        cr_expect_eq(units_parse_hostport(ok[i].in, &host, &port, why,
                                          sizeof why), 0, "%s: %s",
                     ok[i].in, why);
        cr_expect_str_eq(host ? host : "(null)", ok[i].host, "%s", ok[i].in);
        cr_expect_eq(port, ok[i].port, "%s", ok[i].in);
        free(host);
    }
}

Test(units_hostport, rejects_malformed)
{
    static const char *const bad[] = {
        "", "127.0.0.1", ":8080", "host:", "host:65536", "host:abc",
        "::1:80", "[::1]", "[::1]80", "[zz]:80", "999.1.1.1:80", "ho st:80",
        "host:-1", "host:123456", "1.2.3:80", "[::1:80", "[]:80",
        "host:80:90", "h@st:80", "[fe80::1%eth0]:80",
    };
    size_t i;

    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *host = (char *)"untouched", why[128] = "";
        uint16_t port = 7;
        int rc = units_parse_hostport(bad[i], &host, &port, why, sizeof why);
        cr_expect(rc == -EINVAL || rc == -ERANGE, "\"%s\" gave %d", bad[i], rc);
        cr_expect_str_eq(host, "untouched", "%s", bad[i]);
        cr_expect_eq(port, 7);
        cr_expect(why[0] != '\0', "%s: no reason given", bad[i]);
    }
    cr_expect_eq(units_parse_hostport(NULL, &(char *){NULL}, &(uint16_t){0},
                                      NULL, 0), -EINVAL);
}

Test(units_hostport, explains_brackets)
{
    char *host = NULL, why[128];
    uint16_t port;

    cr_expect_eq(units_parse_hostport("::1:8080", &host, &port, why,
                                      sizeof why), -EINVAL);
    cr_expect_str_eq(why, "an IPv6 address needs brackets, as in [::1]:8080");
}

Test(units_authority, port_is_optional)
{
    char *host = NULL;
    int port = 5;

    cr_assert_eq(units_parse_authority("example.com", 11, &host, &port, NULL, 0), 0);
    cr_expect_str_eq(host, "example.com");
    cr_expect_eq(port, -1);
    free(host);
    cr_assert_eq(units_parse_authority("[::1]/ignored", 5, &host, &port, NULL, 0), 0);
    cr_expect_str_eq(host, "::1");
    cr_expect_eq(port, -1);
    free(host);
    cr_expect_eq(units_parse_authority("h:", 2, &host, &port, NULL, 0), -EINVAL);
}

Test(units_token, tokens)
{
    cr_expect(units_is_token("Idempotency-Key"));
    cr_expect(units_is_token("X_Y.z~!#$%&'*+^`|"));
    cr_expect(!units_is_token(""));
    cr_expect(!units_is_token(NULL));
    cr_expect(!units_is_token("a b"));
    cr_expect(!units_is_token("a:b"));
    cr_expect(!units_is_token("a\"b"));
}

Test(units_format, duration_size_rate)
{
    static const struct dur_case durs[] = {
        {"0s", 0}, {"250ms", 250}, {"1500ms", 1500}, {"30s", 30000},
        {"1m", 60000}, {"90s", 90000}, {"6h", 21600000}, {"1d", 86400000},
        {"7d", 604800000}, {"25h", 90000000},
    };
    static const struct size_case sizes[] = {
        {"0", 0}, {"512", 512}, {"16KiB", 16384}, {"8MiB", 8388608},
        {"1GiB", 1073741824}, {"1000", 1000}, {"1536", 1536}, {"3KiB", 3072},
    };
    static const struct rate_case rates[] = {
        {"10/s", 10}, {"0.5/s", 0.5}, {"20/m", 20.0 / 60}, {"1/h", 1.0 / 3600},
        {"1000000000/s", 1e9}, {"0.000001/s", 1e-6}, {"7/d", 7.0 / 86400},
    };
    char buf[64];
    size_t i;

    for (i = 0; i < sizeof durs / sizeof durs[0]; i++) {
        units_format_duration(durs[i].ms, buf, sizeof buf);
        cr_expect_str_eq(buf, durs[i].in);
    }
    for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        units_format_size(sizes[i].bytes, buf, sizeof buf);
        cr_expect_str_eq(buf, sizes[i].in);
    }
    for (i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        double back = 0;
        units_format_rate(rates[i].per_sec, buf, sizeof buf);
        cr_expect_str_eq(buf, rates[i].in);
        /* what /config shows must load back to the same rate */
        cr_expect_eq(units_parse_rate(buf, &back, NULL, 0), 0, "%s", buf);
        cr_expect(fabs(back - rates[i].per_sec) <= 1e-12 * rates[i].per_sec);
    }
}

Test(units_format, durations_round_trip)
{
    static const uint64_t v[] = {0, 1, 999, 1000, 1001, 59999, 60000, 3599999,
                                 3600000, 86399999, 86400000, UINT64_MAX};
    char buf[64];
    uint64_t back;
    size_t i;

    for (i = 0; i < sizeof v / sizeof v[0]; i++) {
        units_format_duration(v[i], buf, sizeof buf);
        cr_expect_eq(units_parse_duration(buf, &back, NULL, 0), 0, "%s", buf);
        cr_expect_eq(back, v[i], "%s", buf);
        units_format_size(v[i], buf, sizeof buf);
        cr_expect_eq(units_parse_size(buf, &back, NULL, 0), 0, "%s", buf);
        cr_expect_eq(back, v[i], "%s", buf);
    }
}
