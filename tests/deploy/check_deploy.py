#!/usr/bin/python3
"""Checks deploy/ against what deploy/README.md promises, without a cluster or a
container engine (neither runs on these machines).

    check_deploy.py SLUICE_BINARY

- deploy/kubernetes/*.yaml: parsed; sluice is a native sidecar (an init
  container with restartPolicy Always) with startup/readiness probes on /readyz
  and liveness on /healthz at the admin port; that port, the store volume, the
  worker's SLUICE_URL, the reloader's webhook and terminationGracePeriodSeconds
  agree with the sluice config embedded in the ConfigMap, and that config passes
  `sluice --check-config`; in fleet mode the store is a managed Redis over TLS
  (rediss://, a store.tls that verifies) with an ACL user and password from a
  Secret through ${ENV:?}, and the config with `cluster: true` passes too.
- deploy/Dockerfile: two Debian 12 stages; the builder installs the -dev
  packages of `scripts/deps.sh build`; every shared library that `ldd SLUICE_BINARY`
  lists comes from a package the runtime stage installs (or one they depend on).
- deploy/systemd/sluice.service: `systemd-analyze verify` says nothing, the
  offline security review stays under a threshold, and the promised settings
  are there.

Exit 0 when all hold, 1 on any failure (each printed), 77 (skip) only when
systemd-analyze is missing and everything else held. Uses the standard library
and PyYAML (Debian python3-yaml) only.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    sys.exit("check_deploy.py needs PyYAML: apt-get install python3-yaml")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
UNIT_BINARY = "/usr/local/bin/sluice"
SECURITY_THRESHOLD = 20   # systemd-analyze security --threshold: tenths of its 0..10 exposure level

failures = []
skips = []


def ok(what):
    print("ok    " + what)


def fail(what):
    print("FAIL  " + what)
    failures.append(what)


def check(cond, what):
    (ok if cond else fail)(what)
    return cond


def run(cmd, env=None):
    """(exit status, stdout + stderr) of cmd; 127 when it cannot be started."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           env=env, timeout=30, text=True)
    except OSError as e:
        return 127, str(e)
    return p.returncode, p.stdout


# ---- units of the sluice config (docs/contract.md §2) ---------------------------

DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(text):
    """Seconds of a sluice duration such as 250ms, 10s, 5m."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", str(text).strip())
    if not m:
        raise ValueError("not a duration: %r" % text)
    return float(m.group(1)) * DURATION_UNITS[m.group(2)]


def hostport(text):
    host, _, port = str(text).rpartition(":")
    return host.strip("[]"), int(port)


# ---- Kubernetes ------------------------------------------------------------

def load_manifests():
    """{file name: [documents]} for every YAML file of deploy/kubernetes."""
    kdir = os.path.join(DEPLOY, "kubernetes")
    out = {}
    for name in sorted(os.listdir(kdir)):
        if not name.endswith((".yaml", ".yml")):
            continue
        try:
            with open(os.path.join(kdir, name)) as f:
                out[name] = [d for d in yaml.safe_load_all(f) if d]
            ok("%s parses (%d objects: %s)" % (name, len(out[name]),
                                                ", ".join(d.get("kind", "?") for d in out[name])))
        except yaml.YAMLError as e:
            fail("%s does not parse: %s" % (name, e))
    return out


def by_name(items, name):
    return next((i for i in items or [] if i.get("name") == name), None)


def probe_target(container, kind):
    get = ((container.get(kind) or {}).get("httpGet") or {})
    return get.get("path"), get.get("port")


def port_matches(port, container, number):
    """A probe's port (name or number) resolves to number in container."""
    if isinstance(port, int):
        return port == number
    p = by_name(container.get("ports"), port)
    return p is not None and p.get("containerPort") == number


def secure(ctx, pod_ctx):
    ctx = ctx or {}
    caps = (ctx.get("capabilities") or {}).get("drop") or []
    non_root = ctx.get("runAsNonRoot", (pod_ctx or {}).get("runAsNonRoot"))
    return (ctx.get("allowPrivilegeEscalation") is False and
            ctx.get("readOnlyRootFilesystem") is True and
            "ALL" in caps and non_root is True)


def mount_of(container, volume):
    return next((m for m in container.get("volumeMounts") or [] if m.get("name") == volume), None)


def config_of(docs, spec, sluice, where):
    """(config dict, config text, mount path) of the ConfigMap sluice runs on."""
    vol = next((v for v in spec.get("volumes") or [] if "configMap" in v), None)
    if not check(vol is not None, "%s: a configMap volume" % where):
        return None, None, None
    m = mount_of(sluice, vol["name"])
    if not check(m is not None and "subPath" not in m,
                 "%s: sluice mounts ConfigMap %s as a directory (no subPath: the kubelet updates it)"
                 % (where, vol["configMap"]["name"])):
        return None, None, None
    args = sluice.get("args") or []
    cfile = args[args.index("-c") + 1] if "-c" in args[:-1] else None
    check(cfile is not None and os.path.dirname(cfile) == m["mountPath"].rstrip("/"),
          "%s: sluice runs on a file of that mount (-c %s)" % (where, cfile))
    cm = next((d for d in docs if d.get("kind") == "ConfigMap" and
               d["metadata"]["name"] == vol["configMap"]["name"]), None)
    key = os.path.basename(cfile or "")
    if not check(cm is not None and key in (cm.get("data") or {}),
                 "%s: ConfigMap %s is in the same file and holds %s"
                 % (where, vol["configMap"]["name"], key)):
        return None, None, None
    text = cm["data"][key]
    return yaml.safe_load(text), text, m["mountPath"]


def check_config_passes(sluice_bin, text, env_names, where):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "sidecar.yaml")
        with open(path, "w") as f:
            f.write(text)
        env = dict(os.environ, **{n: "check-deploy-dummy" for n in env_names})
        rc, out = run([sluice_bin, "--check-config", path], env=env)
    check(rc == 0, "%s: the ConfigMap's sidecar.yaml passes sluice --check-config (%s)"
          % (where, out.strip().replace(d, "...")))


def check_store(spec, workload, sluice, cfg, where):
    """The store path lies on a volume: returns 'emptyDir', 'claim' or None;
    'redis' in fleet mode, which keeps nothing on disk."""
    if (cfg.get("store") or {}).get("backend") == "redis":
        check(not any(m.get("name") == "state" for m in sluice.get("volumeMounts") or []),
              "%s: fleet mode mounts no state volume" % where)
        return "redis"
    store = (cfg.get("store") or {}).get("path", "./data")
    for m in sluice.get("volumeMounts") or []:
        root = m["mountPath"].rstrip("/")
        if store == root or store.startswith(root + "/"):
            vol = by_name(spec.get("volumes"), m["name"])
            claims = workload["spec"].get("volumeClaimTemplates") or []
            kind = ("emptyDir" if vol and "emptyDir" in vol else
                    "claim" if by_name([c["metadata"] for c in claims], m["name"]) else None)
            check(kind is not None and not m.get("readOnly") and "subPath" not in m,
                  "%s: store.path %s is on volume %s (%s), mounted writable at %s"
                  % (where, store, m["name"], kind, root))
            return kind
    fail("%s: store.path %s is on no volume of the sluice container" % (where, store))
    return None


def check_reloader(spec, sluice, cmount, admin_port, where):
    inits = spec.get("initContainers") or []
    rel = next((c for c in inits if any(str(a).startswith("--webhook-url") for a in c.get("args") or [])), None)
    if not check(rel is not None, "%s: a config reloader sidecar" % where):
        return
    args = rel.get("args") or []
    image = rel.get("image", "")
    check(re.search(r":v?\d+\.\d+\.\d+$", image) is not None,
          "%s: reloader image pinned to a version (%s)" % (where, image))
    check(rel.get("restartPolicy") == "Always", "%s: reloader is a native sidecar" % where)
    check(inits.index(rel) > inits.index(sluice),
          "%s: reloader listed after sluice (starts after it is ready, stops before it)" % where)
    check("--volume-dir=" + cmount in args, "%s: reloader watches %s" % (where, cmount))
    rm = next((m for m in rel.get("volumeMounts") or [] if m["mountPath"] == cmount), None)
    check(rm is not None and "subPath" not in rm, "%s: reloader mounts the ConfigMap directory" % where)
    url = "http://127.0.0.1:%d/reload" % admin_port
    check("--webhook-url=" + url in args and "--webhook-method=POST" in args,
          "%s: reloader POSTs to %s" % (where, url))
    check(secure(rel.get("securityContext"), spec.get("securityContext")),
          "%s: reloader securityContext (non-root, read-only root, no privilege escalation, drop ALL)" % where)


def check_sluice_container(spec, sluice, cfg, where):
    admin_host, admin_port = hostport(cfg.get("admin", "127.0.0.1:9901"))
    check(admin_host in ("0.0.0.0", "::", ""),
          "%s: admin listens on all addresses (%s): kubelet probes come in on the pod IP"
          % (where, cfg.get("admin")))
    port = by_name(sluice.get("ports"), "admin")
    check(port is not None and port.get("containerPort") == admin_port,
          "%s: port 'admin' is %d, the config's admin port" % (where, admin_port))
    for kind, path in (("startupProbe", "/readyz"), ("readinessProbe", "/readyz"),
                       ("livenessProbe", "/healthz")):
        p, prt = probe_target(sluice, kind)
        check(p == path and port_matches(prt, sluice, admin_port),
              "%s: %s GET %s on the admin port" % (where, kind, path))
    check(secure(sluice.get("securityContext"), spec.get("securityContext")),
          "%s: sluice securityContext (non-root, read-only root, no privilege escalation, drop ALL)" % where)
    res = sluice.get("resources") or {}
    check(res.get("requests") and (res.get("limits") or {}).get("memory"),
          "%s: sluice has resource requests and a memory limit" % where)
    return admin_port


def check_env(sluice, text, where):
    """Every ${NAME} of the config is set in sluice's env; tokens come from a Secret."""
    names = sorted(set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::\?[^}]*)?\}", text)))
    env = {e["name"]: e for e in sluice.get("env") or []}
    for n in names:
        src = (env.get(n) or {}).get("valueFrom") or {}
        check(n in env, "%s: ${%s} of the config is in sluice's env" % (where, n))
        if "TOKEN" in n or "SECRET" in n or "PASSWORD" in n:
            check("secretKeyRef" in src, "%s: %s comes from a Secret" % (where, n))
            # A Secret with an empty key would send "Bearer " to the partner.
            check(re.search(r"\$\{%s:\?[^}]*\}" % n, text) is not None,
                  "%s: ${%s:?} refuses an empty secret" % (where, n))
    return names


def check_managed_redis(sluice_bin, sluice, cfg, text, where):
    """Fleet mode on a managed Redis: TLS (rediss:// and a store.tls block that verifies), an ACL
    user whose name and password come from a Secret through ${ENV} (never written in the file),
    and the config with `cluster: true` added (as the manifest's comment offers) passes too."""
    store = cfg.get("store") or {}
    url = str(store.get("url", ""))
    check(url.startswith("rediss://"), "%s: the store url is rediss:// (TLS)" % where)
    tls = store.get("tls")
    check(isinstance(tls, dict) and tls.get("verify", True) is True,
          "%s: store.tls is set and verifies the server's certificate" % where)
    ref = r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?[^}]*\}"
    m = re.match(r"rediss?://%s:%s@" % (ref, ref), url)
    if not check(m is not None,
                 "%s: the url's user and password are ${ENV:?} references, not literals" % where):
        return
    env = {e["name"]: e for e in sluice.get("env") or []}
    for what, name in zip(("user", "password"), m.groups()):
        src = ((env.get(name) or {}).get("valueFrom") or {}).get("secretKeyRef")
        check(src is not None and bool(src.get("name")) and bool(src.get("key")),
              "%s: the Redis %s (${%s}) comes from a Secret" % (where, what, name))
    clustered, n = re.subn(r"(\n(\s+)backend: redis[^\n]*\n)", r"\1\2cluster: true\n", text, count=1)
    if check(n == 1, "%s: the store block takes `cluster: true`" % where):
        names = re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text)
        check_config_passes(sluice_bin, clustered, names, where + " with cluster: true")


def check_workload(sluice_bin, docs, workload, where):
    """Checks one Deployment / StatefulSet / Pod: (store kind, app label, admin port), or None."""
    tmpl = workload["spec"]["template"] if "template" in workload["spec"] else workload
    spec = tmpl["spec"]
    sluice = by_name(spec.get("initContainers"), "sluice")
    if not check(sluice is not None and sluice.get("restartPolicy") == "Always",
                 "%s: sluice is an init container with restartPolicy Always (native sidecar)" % where):
        return None
    check(by_name(spec.get("containers"), "sluice") is None,
          "%s: sluice is not also a regular container" % where)
    cfg, text, cmount = config_of(docs, spec, sluice, where)
    if cfg is None:
        return None
    check_config_passes(sluice_bin, text, check_env(sluice, text, where), where)
    admin_port = check_sluice_container(spec, sluice, cfg, where)
    drain = seconds((cfg.get("limits") or {}).get("drain_timeout", "10s"))
    grace = spec.get("terminationGracePeriodSeconds", 30)
    check(grace > drain, "%s: terminationGracePeriodSeconds %s > limits.drain_timeout %gs"
          % (where, grace, drain))
    kind = check_store(spec, workload, sluice, cfg, where)
    if kind == "redis":
        check_managed_redis(sluice_bin, sluice, cfg, text, where)
    check_reloader(spec, sluice, cmount, admin_port, where)
    listen = "http://%s:%d" % hostport(cfg.get("listen", "127.0.0.1:8080"))
    urls = [e.get("value") for c in spec.get("containers") or [] for e in c.get("env") or []
            if e.get("name") == "SLUICE_URL"]
    check(listen == "http://127.0.0.1:8080" and urls and all(u == listen for u in urls),
          "%s: the worker's SLUICE_URL is %s, the config's listen" % (where, listen))
    ann = (tmpl.get("metadata") or {}).get("annotations") or {}
    if "prometheus.io/port" in ann:
        check(ann["prometheus.io/port"] == str(admin_port),
              "%s: prometheus.io/port annotation is the admin port" % where)
    return kind, (tmpl.get("metadata") or {}).get("labels", {}).get("app"), admin_port


def check_network_policy(docs, apps, admin_ports, where):
    for np in (d for d in docs if d.get("kind") == "NetworkPolicy"):
        sel = np["spec"].get("podSelector") or {}
        values = {v for e in sel.get("matchExpressions") or [] for v in e.get("values") or []}
        values |= set((sel.get("matchLabels") or {}).values())
        check(apps <= values, "%s: NetworkPolicy selects the workloads' pods (%s)"
              % (where, ", ".join(sorted(apps))))
        ports = {p.get("port") for r in np["spec"].get("ingress") or [] for p in r.get("ports") or []}
        check(ports and ports <= admin_ports, "%s: NetworkPolicy opens only the admin port" % where)


def check_pod_monitor(docs, apps, where):
    for pm in (d for d in docs if d.get("kind") == "PodMonitor"):
        spec = pm.get("spec") or {}
        sel = spec.get("selector") or {}
        values = {v for e in sel.get("matchExpressions") or [] for v in e.get("values") or []}
        values |= set((sel.get("matchLabels") or {}).values())
        check(apps <= values, "%s: PodMonitor selects the workloads' pods (%s)"
              % (where, ", ".join(sorted(apps))))
        eps = spec.get("podMetricsEndpoints") or []
        check(eps and all(e.get("port") == "admin" and e.get("path") == "/metrics" for e in eps),
              "%s: PodMonitor scrapes /metrics on the port named admin" % where)


def check_admin_guard_described(manifests):
    """The admin port's write endpoints are guarded (loopback or admin_token):
    the NetworkPolicy's comment must say so, not that the port is open to all."""
    path = os.path.join(DEPLOY, "kubernetes", "networkpolicy.yaml")
    with open(path) as f:
        text = f.read()
    check("admin_token" in text and "loopback" in text and "no authentication" not in text,
          "networkpolicy.yaml: its comment says writes need loopback or admin_token")


def check_kubernetes(sluice_bin):
    print("== deploy/kubernetes")
    manifests = load_manifests()
    kinds, apps, admin_ports = set(), set(), set()
    for name, docs in manifests.items():
        for w in docs:
            if w.get("kind") in ("Deployment", "StatefulSet", "Pod"):
                r = check_workload(sluice_bin, docs, w, "%s %s/%s" % (name, w["kind"], w["metadata"]["name"]))
                if r:
                    kinds.add((w["kind"], r[0]))
                    apps.add(r[1])
                    admin_ports.add(r[2])
    check(("Deployment", "emptyDir") in kinds, "an emptyDir variant (Deployment)")
    check(("StatefulSet", "claim") in kinds, "a persistent variant (StatefulSet with a volumeClaimTemplate)")
    for name, docs in manifests.items():
        check_network_policy(docs, apps, admin_ports, name)
        check_pod_monitor(docs, apps, name)
    check(any(d.get("kind") == "PodMonitor" for docs in manifests.values() for d in docs),
          "a PodMonitor beside the prometheus.io annotations")
    check_admin_guard_described(manifests)
    with open(os.path.join(DEPLOY, "README.md")) as f:
        readme = f.read()
    for name in manifests:
        check("kubernetes/" + name in readme, "deploy/README.md describes kubernetes/%s" % name)


# ---- Dockerfile ------------------------------------------------------------

def dockerfile_stages():
    """[(FROM image, [(instruction, argument)])], continuation lines joined."""
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        text = re.sub(r"\\\n", " ", "".join(l for l in f if not l.lstrip().startswith("#")))
    stages = []
    for line in text.splitlines():
        if not line.strip():
            continue
        instr, _, arg = line.strip().partition(" ")
        if instr.upper() == "FROM":
            stages.append((arg.split()[0], []))
        elif stages:
            stages[-1][1].append((instr.upper(), arg.strip()))
    return stages


def apt_packages(steps):
    pkgs = set()
    for instr, arg in steps:
        if instr != "RUN":
            continue
        for cmd in re.split(r"&&|;", arg):
            words = cmd.split()
            if "apt-get" in words and "install" in words:
                pkgs |= {w for w in words[words.index("install") + 1:] if not w.startswith("-")}
    return pkgs


def deps_sh_build_packages():
    """The packages `scripts/deps.sh build` installs (its BUILD_PKGS line)."""
    with open(os.path.join(ROOT, "scripts", "deps.sh")) as f:
        m = re.search(r'^BUILD_PKGS="([^"]*)"', f.read(), re.M)
    return set(m.group(1).split()) if m else set()


def lib_packages(paths):
    """{library path: owning Debian package} for the paths dpkg knows."""
    def variants(p):
        real = os.path.realpath(p)
        alt = [x[4:] if x.startswith("/usr/") else "/usr" + x for x in (p, real)]
        return [p, real] + alt
    cands = sorted({v for p in paths for v in variants(p)})
    _, out = run(["dpkg", "-S"] + cands)
    owner = {}
    for line in out.splitlines():
        pkg, sep, path = line.partition(": ")
        if sep and not pkg.startswith("dpkg-query"):
            owner[path.strip()] = pkg.split(":")[0].split(",")[0].strip()
    return {p: next((owner[v] for v in variants(p) if v in owner), None) for p in paths}


def installed_depends():
    """{package: set of packages it Depends / Pre-Depends on}, from the local dpkg database."""
    _, out = run(["dpkg-query", "-W", "-f", "${Package}\t${Pre-Depends}, ${Depends}\n"])
    deps = {}
    for line in out.splitlines():
        pkg, _, rest = line.partition("\t")
        names = set()
        for alt in re.split(r"[,|]", rest):
            n = alt.strip().split(" ")[0].split(":")[0]
            if n:
                names.add(n)
        deps[pkg] = names
    return deps


def closure(roots, deps):
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(deps.get(p, ()))
    return seen


def check_runtime_libraries(sluice_bin, runtime):
    rc, out = run(["ldd", sluice_bin])
    if not check(rc == 0, "ldd %s" % sluice_bin):
        return
    libs = re.findall(r"=>\s+(/\S+)", out)
    rc, dyn = run(["readelf", "-d", sluice_bin])
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)) if rc == 0 else None
    # The sanitizer runtimes of an SLUICE_SANITIZE build: the image builds without them.
    sanitizers = [l for l in libs if re.match(r"lib(asan|ubsan|lsan|tsan)\.so", os.path.basename(l))]
    for lib in sanitizers:
        ok("%s: sanitizer runtime of this build, not of the image (skipped)" % os.path.basename(lib))
    libs = [l for l in libs if l not in sanitizers]
    owner = lib_packages(libs)
    base = {"libc6"}   # in debian:bookworm-slim itself
    reach = closure(runtime | base, installed_depends())
    for lib in libs:
        pkg = owner[lib]
        if not check(pkg is not None, "%s belongs to a Debian package" % lib):
            continue
        direct = needed is None or os.path.basename(lib) in needed
        if pkg in base:
            ok("%s: %s (in the base image)" % (os.path.basename(lib), pkg))
        elif direct:
            check(pkg in runtime, "%s (linked directly): %s is installed in the runtime stage"
                  % (os.path.basename(lib), pkg))
        else:
            check(pkg in reach, "%s (indirect): %s comes with the runtime packages"
                  % (os.path.basename(lib), pkg))


def check_dockerignore():
    """The build context leaves out what a working tree accumulates: build
    trees, stores, VCS data, caches. Patterns as Docker reads them, one a line."""
    path = os.path.join(ROOT, ".dockerignore")
    check(os.path.exists(path), ".dockerignore exists")
    if not os.path.exists(path):
        return
    with open(path) as f:
        pats = {l.strip() for l in f if l.strip() and not l.startswith("#")}
    for want in (".git", "build*", "data/", "**/__pycache__/", "**/node_modules/"):
        check(want in pats, ".dockerignore excludes %s" % want)


def check_dockerfile(sluice_bin):
    print("== deploy/Dockerfile")
    stages = dockerfile_stages()
    check(len(stages) >= 2, "multi-stage (%d FROM lines)" % len(stages))
    for image, _ in stages:
        check(re.fullmatch(r"debian:(bookworm|12)([-.][\w.-]*)?", image) is not None,
              "FROM %s is Debian 12 (bookworm)" % image)
    build, runtime = apt_packages(stages[0][1]), apt_packages(stages[-1][1])
    # deps.sh keeps test-only packages (Criterion, clang's libFuzzer runtime) out of
    # its build list, so every -dev package there is one the image needs.
    build_pkgs = deps_sh_build_packages()
    check(len(build_pkgs) > 0, "scripts/deps.sh has a BUILD_PKGS line")
    wanted = {p for p in build_pkgs if p.endswith("-dev")}
    wanted |= {"build-essential", "cmake", "pkg-config"}
    check(wanted <= build, "the build stage installs scripts/deps.sh's build packages (missing: %s)"
          % (", ".join(sorted(wanted - build)) or "none"))
    check(not any(p.endswith("-dev") for p in runtime) and not {"build-essential", "cmake"} & runtime,
          "the runtime stage installs no build packages")
    for instr, arg in (s for _, steps in stages for s in steps):
        if instr == "COPY" and not arg.startswith("--from"):
            for src in arg.split()[:-1]:
                check(os.path.exists(os.path.join(ROOT, src)), "COPY source %s exists" % src)
    last = dict(stages[-1][1])
    user = last.get("USER", "0").split(":")[0]
    check(user.isdigit() and user != "0", "the image runs as a numeric non-root user (%s)" % user)
    check({"8080", "9901"} <= set(last.get("EXPOSE", "").split()), "EXPOSE 8080 9901")
    check("--target sluice" in " ".join(a for _, a in stages[0][1]), "the build stage builds target sluice")
    check_dockerignore()
    if shutil.which("dpkg") is None or shutil.which("ldd") is None:
        print("skip  runtime libraries: dpkg or ldd missing")
        return
    check_runtime_libraries(sluice_bin, runtime)


# ---- systemd ---------------------------------------------------------------

def unit_settings(text):
    """{key: [values]} of a unit file."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            k, _, v = line.partition("=")
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def timespan(text):
    m = re.fullmatch(r"(\d+)\s*(s|sec|min|m)?", text)
    return int(m.group(1)) * (60 if m.group(2) in ("min", "m") else 1) if m else 0


HARDENING = {
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
    "PrivateTmp": "yes", "PrivateDevices": "yes", "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "RestrictNamespaces": "yes",
    "LockPersonality": "yes", "MemoryDenyWriteExecute": "yes", "RestrictRealtime": "yes",
    "SystemCallArchitectures": "native", "CapabilityBoundingSet": "",
    "StateDirectory": "sluice", "DynamicUser": "yes", "Restart": "on-failure",
}


def check_unit_settings(s):
    for key, want in HARDENING.items():
        check(want in s.get(key, []), "sluice.service: %s=%s" % (key, want))
    check("@system-service" in s.get("SystemCallFilter", []), "sluice.service: SystemCallFilter=@system-service")
    check(any("--check-config" in v for v in s.get("ExecStartPre", [])),
          "sluice.service: ExecStartPre runs --check-config")
    check(any(re.search(r"kill -HUP \$MAINPID", v) for v in s.get("ExecReload", [])),
          "sluice.service: ExecReload sends SIGHUP")
    with open(os.path.join(ROOT, "sidecar.yaml")) as f:
        cfg = yaml.safe_load(f)
    limits = cfg.get("limits") or {}
    drain = seconds(limits.get("drain_timeout", "10s"))
    stop = timespan(s.get("TimeoutStopSec", ["90"])[-1])
    check(stop > drain, "sluice.service: TimeoutStopSec %ds > drain_timeout %gs of sidecar.yaml" % (stop, drain))
    nofile = int(s.get("LimitNOFILE", ["1024"])[-1].split(":")[0])
    conns = int(limits.get("max_connections", 4096))
    check(nofile > conns + 256, "sluice.service: LimitNOFILE %d > max_connections %d + store files"
          % (nofile, conns))
    check(not s.get("ReadWritePaths"), "sluice.service: no ReadWritePaths (the state directory suffices)")
    # sluice speaks sd_notify: readiness, reload, stop and the watchdog.
    check(s.get("Type", [""])[-1] == "notify", "sluice.service: Type=notify")
    check(timespan(s.get("WatchdogSec", ["0"])[-1]) > 0, "sluice.service: WatchdogSec= set")
    check("AF_UNIX" in s.get("RestrictAddressFamilies", [""])[-1].split(),
          "sluice.service: AF_UNIX allowed (the notification socket)")


def check_systemd(sluice_bin):
    print("== deploy/systemd")
    path = os.path.join(DEPLOY, "systemd", "sluice.service")
    with open(path) as f:
        text = f.read()
    check_unit_settings(unit_settings(text))
    if shutil.which("systemd-analyze") is None:
        print("skip  systemd-analyze not found: the unit was not verified")
        skips.append("systemd-analyze")
        return
    # verify insists that ExecStart's binary exists: point it at the one under test.
    with tempfile.TemporaryDirectory() as d:
        unit = os.path.join(d, "sluice.service")
        with open(unit, "w") as f:
            f.write(text.replace(UNIT_BINARY, os.path.abspath(sluice_bin)))
        rc, out = run(["systemd-analyze", "verify", "--man=no", "--generators=no", unit])
        check(rc == 0 and not out.strip(),
              "systemd-analyze verify: no errors or warnings%s" % (("\n" + out) if out.strip() else ""))
        rc, out = run(["systemd-analyze", "security", "--offline=yes",
                       "--threshold=%d" % SECURITY_THRESHOLD, unit])
        level = re.search(r"Overall exposure level for \S+: ([\d.]+ \S+)", out)
        check(rc == 0 and level is not None,
              "systemd-analyze security --offline: exposure %s, at most %.1f%s"
              % (level.group(1) if level else "?", SECURITY_THRESHOLD / 10,
                 "" if rc == 0 and level else "\n" + out[-2000:]))


def main():
    if len(sys.argv) != 2 or not os.access(sys.argv[1], os.X_OK):
        print("usage: check_deploy.py SLUICE_BINARY (an executable sluice)", file=sys.stderr)
        return 2
    sluice_bin = os.path.abspath(sys.argv[1])
    check_kubernetes(sluice_bin)
    check_dockerfile(sluice_bin)
    check_systemd(sluice_bin)
    print()
    if failures:
        print("%d check(s) failed:" % len(failures))
        for f in failures:
            print("  - " + f.splitlines()[0])
        return 1
    if skips:
        print("all checks passed, but skipped: %s" % ", ".join(skips))
        return 77
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
