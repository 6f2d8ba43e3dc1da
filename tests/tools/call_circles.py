#!/usr/bin/python3
"""No call circle of more than two source files (ctest call_circles).

A file that calls into another file which, through any chain, calls back
into the first forms a circle: neither can be read, tested or replaced
without the other. Two files calling each other are allowed (an owner and
what it owns, such as a store and its backend); three or more are the
tangle the stage plan removed, and this test keeps it from coming back.

The graph comes from the objects the build made, not from the text: file
A calls file B when A's object needs a symbol B's object defines (nm's U
and T/D/B/R/W entries). Only sluice's own libraries count (the objects
under CMakeFiles/sluice_*.dir), so tests and tools are left out.

    python3 tests/tools/call_circles.py BUILD_DIR
"""
import os
import subprocess
import sys


def objects(build):
    found = []
    root = os.path.join(build, "CMakeFiles")
    for d in sorted(os.listdir(root)):
        if not (d.startswith("sluice_") and d.endswith(".dir")):
            continue
        for top, _, files in os.walk(os.path.join(root, d)):
            found += [os.path.join(top, f) for f in files if f.endswith(".c.o")]
    return found


def source_of(obj, build):
    """CMakeFiles/sluice_store.dir/store/record.c.o -> store/record.c"""
    rel = os.path.relpath(obj, os.path.join(build, "CMakeFiles"))
    return rel.split(os.sep, 1)[1][: -len(".o")]


def symbols(obj):
    out = subprocess.run(["nm", "--defined-only", "-g", obj], capture_output=True,
                         text=True, check=True).stdout
    defined = {l.split()[-1] for l in out.splitlines() if len(l.split()) == 3}
    out = subprocess.run(["nm", "-u", obj], capture_output=True, text=True,
                         check=True).stdout
    used = {l.split()[-1] for l in out.splitlines() if l.strip()}
    return defined, used


def strongly_connected(graph):
    """Tarjan's algorithm, iterative: the components of the call graph."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    counter = [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            pushed = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    pushed = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if pushed:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    comp.append(n)
                    if n == node:
                        break
                comps.append(sorted(comp))
    return comps


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: call_circles.py BUILD_DIR")
    build = sys.argv[1]
    objs = objects(build)
    if len(objs) < 20:
        sys.exit(f"found only {len(objs)} objects under {build}/CMakeFiles: build first")
    owner, uses = {}, {}
    for o in objs:
        src = source_of(o, build)
        defined, used = symbols(o)
        uses[src] = used
        for s in defined:
            owner[s] = src
    graph = {src: {owner[s] for s in used if s in owner and owner[s] != src}
             for src, used in uses.items()}
    circles = [c for c in strongly_connected(graph) if len(c) > 2]
    for c in circles:
        print("call circle of %d files: %s" % (len(c), ", ".join(c)))
    print(f"call circles: {len(graph)} files, {len(circles)} circles of more than two")
    sys.exit(1 if circles else 0)


if __name__ == "__main__":
    main()
