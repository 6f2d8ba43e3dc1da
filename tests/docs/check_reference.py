#!/usr/bin/env python3
"""docs/reference/ against the sources (ctest docs_reference): every outcome and reason
(policies/problem.c), every metric family with its type (obs/metrics.c, obs/process.c,
proxy/admin.c), every admin endpoint (proxy/admin.c), every access-log field (obs/log.c) and
every header name sluice reads or writes (proxy/ and its folders, policies/) must appear in its reference page,
and every relative link of README.md, deploy/README.md and the pages of docs/ must name a file
that exists, and README.md must link every page of docs/. So a new reason, metric or header cannot ship undocumented.

Usage: check_reference.py REPO_ROOT. Exit 0 when all is documented, 1 with one line per gap."""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
REF = os.path.join(ROOT, "docs", "reference")
# Headers the sources name that are no part of the contract: a fault-injection hook compiled
# only into test builds (-DSLUICE_FAILALLOC).
NOT_CONTRACT = {"X-Sluice-Failalloc"}

problems = []


def read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def ticked(doc):
    """Every `code span` of a page."""
    return set(re.findall(r"`([^`\n]+)`", doc))


def c_array(src, name):
    """The string literals of `static const char *const NAME[...] = {...};`."""
    m = re.search(name + r"\[[^\]]*\]\s*=\s*\{(.*?)\};", src, re.S)
    if not m:
        problems.append(f"cannot find the array {name}")
        return []
    return re.findall(r'"([^"]*)"', m.group(1))


def check_outcomes():
    src = read("policies", "problem.c")
    doc = read("docs", "reference", "outcomes.md")
    spans = ticked(doc)
    for kind in ("outcome_names", "reason_names"):
        for v in c_array(src, kind):
            if v not in spans:
                problems.append(f"outcomes.md: {kind[:-6]} `{v}` is not documented")


def metric_families():
    """name -> type, from the three places that write families."""
    fam = {}
    for name, typ in re.findall(r'\{"(sluice_[a-z_]+)",\s*"(counter|gauge|histogram)"',
                                read("obs", "metrics.c")):
        fam[name] = typ
    for name in re.findall(r'gauge_head\(f,\s*"([a-z_]+)"', read("proxy", "admin.c")):
        fam[name] = "gauge"
    for name, typ in re.findall(r'family\(f,\s*"([a-z_]+)",\s*"[^"]*",\s*"(counter|gauge)"',
                                read("obs", "process.c")):
        fam[name] = typ
    return fam


def check_metrics():
    doc = read("docs", "reference", "metrics.md")
    fam = metric_families()
    if len(fam) < 20:
        problems.append(f"found only {len(fam)} metric families in the sources: the parser is stale")
    rows = {}
    for line in doc.splitlines():
        m = re.match(r"\|\s*`([a-z_]+)`\s*\|\s*([^|]+?)\s*\|", line)
        if m:
            rows.setdefault(m.group(1), m.group(2))  # the first row: the type table
    for name, typ in sorted(fam.items()):
        if name not in rows:
            problems.append(f"metrics.md: `{name}` has no row")
        elif not rows[name].startswith(typ):
            problems.append(f"metrics.md: `{name}` is a {typ}, its row says {rows[name]}")


def check_admin():
    src = read("proxy", "admin.c")
    doc = read("docs", "reference", "admin.md")
    spans = ticked(doc)
    rows = re.findall(r'\{M_(GET|POST|DELETE),\s*"[^"]*",\s*"([^"]+)"', src)
    if len(rows) < 8:
        problems.append(f"found only {len(rows)} admin endpoints in proxy/admin.c: the parser is stale")
    for method, usage in rows:
        if f"{method} {usage}" not in spans:
            problems.append(f"admin.md: endpoint `{method} {usage}` is not documented")


def check_access_log():
    src = read("obs", "log.c")
    body = src[src.index("void log_access"):]
    fields = set(re.findall(r'put_str_field\([^"]*"([a-z_]+)"', body))
    fields |= set(re.findall(r'\\"([a-z_]+)\\":', body))
    if len(fields) < 12:
        problems.append(f"found only {len(fields)} access-log fields in obs/log.c: the parser is stale")
    rows = set(re.findall(r"^\|\s*`([a-z_]+)`\s*\|", read("docs", "reference", "access-log.md"), re.M))
    for f in sorted(fields - rows):
        problems.append(f"access-log.md: field `{f}` has no row")


def check_headers():
    doc = read("docs", "reference", "headers.md")
    spans = {s.lower() for s in ticked(doc)}
    names = set()
    for d in ("proxy", "policies"):
        for top, _, files in os.walk(os.path.join(ROOT, d)):
            for fn in files:
                if fn.endswith(".c") or fn.endswith(".h"):
                    src = read(os.path.relpath(top, ROOT), fn)
                    names |= set(re.findall(r'"((?:Sluice|X|Idempot|Retry|RateLimit)[A-Za-z-]*)"', src))
    names = {n for n in names if n not in NOT_CONTRACT and n != "Sluice-" and "-" in n}
    if len(names) < 8:
        problems.append(f"found only {len(names)} header names in the sources: the parser is stale")
    for n in sorted(names):
        if n.lower() not in spans:
            problems.append(f"headers.md: header `{n}` is not documented")


def check_links():
    docs = os.path.join(ROOT, "docs")
    pages = ["README.md", os.path.join("deploy", "README.md")]
    pages += [os.path.join("docs", f) for f in sorted(os.listdir(docs)) if f.endswith(".md")]
    pages += [os.path.join("docs", "reference", f) for f in sorted(os.listdir(REF)) if f.endswith(".md")]
    # Every page of docs/ is reachable from the README: none is written and then lost.
    readme_links = {os.path.normpath(t.split("#")[0])
                    for t in re.findall(r"\]\(([^)\s]+)\)", read("README.md"))}
    for page in pages[2:]:
        if page not in readme_links:
            problems.append(f"README.md: no link to {page}")
    for page in pages:
        base = os.path.dirname(os.path.join(ROOT, page))
        for target in re.findall(r"\]\(([^)\s]+)\)", read(page)):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if not os.path.exists(os.path.normpath(os.path.join(base, path))):
                problems.append(f"{page}: link to {target}: no such file")


for check in (check_outcomes, check_metrics, check_admin, check_access_log, check_headers,
              check_links):
    check()
for p in problems:
    print(p)
print("docs/reference: " + ("ok" if not problems else f"{len(problems)} gaps"))
sys.exit(1 if problems else 0)
