#!/usr/bin/env python3
"""Every command sample the README and docs/ show, run, and what it prints compared with what
the page says it prints (ctest docs_samples). tests/e2e/tour.sh does the same for the tour.

A sample is a fenced block right after a marker line, in README.md or any .md under docs/
and deploy/:

    <!-- sample -->          run offline: no server needed (sluice -t, sluice -V, ...)
    <!-- sample: live -->    run against the demo: sluice on a copy of sidecar.yaml and the
                             stub, on free ports (127.0.0.1:8080, :9901 and :9000 in the
                             commands are rewritten to them), one pair for the whole run

Inside the block, a line starting with "$ " is a command (a line ending in a backslash goes
on); the lines up to the next command are what it prints, stdout and stderr together, as a
terminal shows them. In the expected lines, "[...]" stands for any text within a line (a
time, a revision), and a line "..." for any number of lines.

Before a sample, lines `<!-- sample-setup: COMMAND -->` run COMMAND first (same rewriting,
output dropped, must succeed): the state a live sample shows, made the way a reader would.
`<!-- sample-file: NAME -->` before a fenced block writes the block to NAME in the samples'
directory, so a later sample can run it (the README's worker client).

Commands run with sh, in a temporary directory holding copies of sidecar.yaml and docs/examples/,
with the tested sluice first on PATH and a clean environment (no SLUICE_CONFIG, no tokens;
SLUICE_URL, as the example workers read it, names the demo's sluice once it runs).
Every fenced block of those pages that holds a "$ " line must be a sample, so none goes
unchecked; one that cannot be run says why in `<!-- not a sample: REASON -->`.

Usage: samples.py REPO_ROOT (SLUICE_BIN, SLUICE_STUB: the binaries). Exit 0 when every sample
prints what its page says, 1 otherwise."""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
SLUICE = os.path.abspath(os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice")))
STUB = os.path.abspath(os.environ.get("SLUICE_STUB", os.path.join(ROOT, "build", "sluice-stub")))
MARK = re.compile(r"^<!-- sample(?::\s*(live))?\s*-->\s*$")
SETUP = re.compile(r"^<!-- sample-setup:\s*(.*?)\s*-->\s*$")
FILE = re.compile(r"^<!-- sample-file:\s*([A-Za-z0-9_.-]+)\s*-->\s*$")
EXEMPT = re.compile(r"^<!-- not a sample:\s*\S.*-->\s*$")
FENCE = re.compile(r"^(```+|~~~+)")

failures = []


def pages():
    out = [os.path.join(ROOT, "README.md")]
    for top in ("docs", "deploy"):
        for d, _, files in sorted(os.walk(os.path.join(ROOT, top))):
            out += [os.path.join(d, f) for f in sorted(files) if f.endswith(".md")]
    return out


def blocks(path):
    """[(line number, marker kind or None, setups, file name, exempt, body lines)]."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i, pending = [], 0, {"kind": None, "setups": [], "file": None, "exempt": False}
    while i < len(lines):
        line = lines[i]
        m = MARK.match(line)
        if m:
            pending["kind"] = m.group(1) or "offline"
        elif SETUP.match(line):
            pending["setups"].append(SETUP.match(line).group(1))
        elif FILE.match(line):
            pending["file"] = FILE.match(line).group(1)
        elif EXEMPT.match(line):
            pending["exempt"] = True
        elif FENCE.match(line):
            fence = FENCE.match(line).group(1)
            start, body, i = i + 1, [], i + 1
            while i < len(lines) and not lines[i].startswith(fence):
                body.append(lines[i])
                i += 1
            out.append((start, pending["kind"], pending["setups"], pending["file"],
                        pending["exempt"], body))
            pending = {"kind": None, "setups": [], "file": None, "exempt": False}
        elif line.strip():
            if pending["kind"] or pending["setups"] or pending["file"]:
                failures.append("%s:%d: a sample marker not followed by a fenced block"
                                % (os.path.relpath(path, ROOT), i + 1))
            pending = {"kind": None, "setups": [], "file": None, "exempt": False}
        i += 1
    return out


def commands(body):
    """[(command, [expected lines])] of a sample block."""
    out, cmd = [], None
    for line in body:
        if cmd is not None and cmd.endswith("\\"):
            cmd = cmd + "\n" + line
            continue
        if line.startswith("$ "):
            if cmd is not None:
                out.append((cmd, expected))
            cmd, expected = line[2:], []
        elif cmd is not None:
            expected.append(line)
    if cmd is not None:
        out.append((cmd, expected))
    # A blank line before the next command is the page's layout, not output.
    return [(c, e[:len(e) - next((i for i, l in enumerate(reversed(e)) if l), len(e))])
            for c, e in out]


def line_matches(want, got):
    parts = [re.escape(p) for p in want.split("[...]")]
    return re.fullmatch(".*?".join(parts), got) is not None


def output_matches(want, got):
    """want's lines against got's, "..." standing for any number of lines."""
    if not want:
        return not got
    if want[0] == "...":
        return any(output_matches(want[1:], got[k:]) for k in range(len(got) + 1))
    return bool(got) and line_matches(want[0], got[0]) and output_matches(want[1:], got[1:])


class Demo:
    """The demo's sluice and stub on free ports, started at the first live sample."""

    def __init__(self, tmp):
        self.tmp, self.stub, self.sluice, self.ports = tmp, None, None, None

    def rewrite(self, cmd):
        if not self.ports:
            return cmd
        w, a, s = self.ports
        return (cmd.replace("127.0.0.1:8080", "127.0.0.1:%d" % w)
                   .replace("127.0.0.1:9901", "127.0.0.1:%d" % a)
                   .replace("127.0.0.1:9000", "127.0.0.1:%d" % s))

    def start(self):
        if self.ports:
            return
        out = open(os.path.join(self.tmp, "stub.out"), "w+")
        self.stub = subprocess.Popen([STUB, "--listen", "127.0.0.1:0"], stdout=out,
                                     stderr=subprocess.DEVNULL)
        sport = None
        for _ in range(100):
            out.seek(0)
            m = re.search(r"^listening 127\.0\.0\.1:(\d+)$", out.read(), re.M)
            if m:
                sport = int(m.group(1))
                break
            time.sleep(0.05)
        if not sport:
            sys.exit("the stub did not start")
        # Ports below the ephemeral range, so an outgoing connection never holds one.
        for _ in range(5):
            w, a = random.sample(range(20000, 32000), 2)
            text = open(os.path.join(ROOT, "sidecar.yaml")).read()
            text = (text.replace("listen: 127.0.0.1:8080 ", "listen: 127.0.0.1:%d " % w)
                        .replace("admin: 127.0.0.1:9901 ", "admin: 127.0.0.1:%d " % a)
                        .replace("url: http://127.0.0.1:9000 ", "url: http://127.0.0.1:%d " % sport))
            run_dir = os.path.join(self.tmp, "demo")
            shutil.rmtree(run_dir, ignore_errors=True)
            os.makedirs(run_dir)
            open(os.path.join(run_dir, "sidecar.yaml"), "w").write(text)
            self.sluice = subprocess.Popen([SLUICE, "-c", "sidecar.yaml"], cwd=run_dir,
                                           stdout=subprocess.DEVNULL,
                                           stderr=open(os.path.join(run_dir, "log"), "w"))
            for _ in range(100):
                try:
                    urllib.request.urlopen("http://127.0.0.1:%d/readyz" % a, timeout=1)
                    self.ports = (w, a, sport)
                    return
                except OSError:
                    if self.sluice.poll() is not None:
                        break
                    time.sleep(0.1)
            self.stop_sluice()
        sys.exit("sluice on the demo config did not become ready in 5 tries")

    def stop_sluice(self):
        if self.sluice and self.sluice.poll() is None:
            self.sluice.send_signal(signal.SIGTERM)
            try:
                self.sluice.wait(15)
            except subprocess.TimeoutExpired:
                self.sluice.kill()
                self.sluice.wait()
        self.sluice = None

    def stop(self):
        self.stop_sluice()
        if self.stub and self.stub.poll() is None:
            self.stub.terminate()
            self.stub.wait()


def shell(cmd, cwd, env):
    p = subprocess.run(["sh", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=30)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def main():
    tmp = tempfile.mkdtemp(prefix="sluice-samples-")
    work = os.path.join(tmp, "work")
    bindir = os.path.join(tmp, "bin")
    os.makedirs(bindir)
    os.symlink(SLUICE, os.path.join(bindir, "sluice"))
    shutil.copytree(os.path.join(ROOT, "docs", "examples"), os.path.join(work, "docs", "examples"))
    shutil.copy(os.path.join(ROOT, "sidecar.yaml"), work)
    env = {"PATH": bindir + ":/usr/local/bin:/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8",
           "TMPDIR": tmp}
    demo, n = Demo(tmp), 0
    try:
        for page in pages():
            rel = os.path.relpath(page, ROOT)
            for start, kind, setups, fname, exempt, body in blocks(page):
                where = "%s:%d" % (rel, start)
                if fname:
                    open(os.path.join(work, fname), "w").write("\n".join(body) + "\n")
                has_cmd = any(l.startswith("$ ") for l in body)
                if not kind:
                    if has_cmd and not exempt and not fname:
                        failures.append("%s: a command sample that is not marked <!-- sample -->"
                                        % where)
                    continue
                if kind == "live":
                    demo.start()
                    # as the examples' workers take it (deploy/examples/README.md)
                    env["SLUICE_URL"] = demo.rewrite("http://127.0.0.1:8080")
                for s in setups:
                    rc, out = shell(demo.rewrite(s), work, env)
                    if rc != 0:
                        failures.append("%s: setup `%s` exited %d:\n%s" % (where, s, rc, out))
                for cmd, want in commands(body):
                    rc, out = shell(demo.rewrite(cmd), work, env)
                    got = out.split("\n")
                    if got and got[-1] == "":
                        got.pop()
                    n += 1
                    if output_matches(want, got):
                        print("ok    %s: $ %s" % (where, cmd.split("\n")[0]))
                        continue
                    failures.append("%s: $ %s\n      the page says:\n%s\n      it prints:\n%s"
                                    % (where, cmd, "\n".join("        " + l for l in want),
                                       "\n".join("        " + l for l in got)))
    finally:
        demo.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("FAIL  " + f)
    if n < 5:
        print("FAIL  only %d command samples found: the markers are gone?" % n)
        return 1
    print("samples: %d commands, %d problems" % (n, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
