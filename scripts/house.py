#!/usr/bin/env python3
"""house.py OBJDIR: the house's rules, checked on the tree and its objects.

Reads every .c and .h of the compiler and the runtime (not tests/, bench/,
build/) and the objects the build made of them (OBJDIR, e.g. build/obj);
the tests' and benchmarks' .c files for their sizes. Checks:

  names   no two source files (.c or .h) share a name;
  size    no .c file over MAX_FILE lines (tests and benchmarks too);
  length  no function over MAX_FUNC lines (a function is a signature at
          column 0 and a body from '{' to '}' at column 0: the house style;
          tests and benchmarks too);
  floors  no folder includes a header of a folder on a floor above it, and
          no object calls a function defined in a folder above it;
  circles no two .c files need each other, directly or through a chain:
          "A needs B" when A's object uses a symbol B's object defines
          (nm); and no two headers include each other. runtime/gpu is the
          one room where a circle is allowed (the CUDA device and NCCL
          share their streams).

Prints one line per breach and exits 1 when there is any.
"""
import os
import re
import subprocess
import sys

MAX_FILE = 1200
MAX_FUNC = 120
# Floors: a folder may need its own floor and those below. runtime/ is a
# house of its own over plan/ (the plan format) and nothing else of the
# compiler; tools/ are the runtime's commands.
FLOORS = {
    "common": 0, "plan": 0,
    "ir": 1,
    "frontend": 2, "passes": 2,
    "model": 3, "codegen": 3,
    "driver": 4,
    "planner": 5, "explain": 5,
    ".": 6,  # tcc.c
}
RUNTIME_MAY = {"runtime", "plan"}
CIRCLE_OK = "runtime/gpu/"
SKIP_DIRS = {"tests", "bench", "build", "samples", "docs", "scripts", ".git", ".ci"}


def sources(root):
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        top = rel.split(os.sep)[0]
        if top in SKIP_DIRS or top.startswith("."):
            if rel != ".":
                dirs[:] = []
                continue
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith(".")]
        for f in files:
            if f.endswith((".c", ".h")):
                yield os.path.normpath(os.path.join(rel, f))


def folder(path):
    d = os.path.dirname(path)
    return d.split(os.sep)[0] if d else "."


def floor_breach(src, dst):
    """Whether a file of folder src may not need one of folder dst."""
    if src == dst:
        return False
    if src == "runtime" or src == "tools":
        return dst not in RUNTIME_MAY | {"runtime"}
    if dst in ("runtime", "tools"):
        # The compiler runs plans for --verify: only the driver and above.
        return FLOORS.get(src, 0) < FLOORS["driver"]
    return FLOORS.get(dst, 0) > FLOORS.get(src, 0)


def long_functions(path, lines):
    out = []
    for i, line in enumerate(lines):
        if not line.startswith("{"):
            continue
        # The signature: lines above, up to a blank line, a '}' or a comment end.
        j = i - 1
        while j > 0 and lines[j - 1].strip() and not lines[j - 1].startswith("}") \
                and not lines[j - 1].rstrip().endswith(("*/", ";")) \
                and not lines[j - 1].startswith("#"):
            j -= 1
        sig = " ".join(lines[j:i])
        if "(" not in sig or "=" in sig.split("(")[0]:
            continue
        k = i + 1
        while k < len(lines) and not lines[k].startswith("}"):
            k += 1
        n = k - j + 1
        if n > MAX_FUNC:
            name = re.findall(r"(\w+)\s*\(", sig)
            out.append("%s:%d: function %s is %d lines (at most %d)"
                       % (path, j + 1, name[0] if name else "?", n, MAX_FUNC))
    return out


def includes(path, text):
    base = os.path.dirname(path)
    out = []
    for m in re.finditer(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
        inc = m.group(1)
        cand = os.path.normpath(os.path.join(base, inc))
        if not os.path.exists(cand):
            cand = os.path.normpath(inc)
        out.append(cand)
    return out


def symbols(objdir, cfile):
    obj = os.path.join(objdir, cfile[:-2] + ".o")
    if not os.path.exists(obj):
        return None
    r = subprocess.run(["nm", obj], capture_output=True, text=True, check=True)
    defs, uses = set(), set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBRCG":
            defs.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            uses.add(parts[1])
    return defs, uses


def circles(graph):
    """Tarjan's strongly connected components with more than one file."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = os.getcwd()
    objdir = sys.argv[1] if len(sys.argv) > 1 else "build/obj"
    files = sorted(sources(root))
    breaches = []
    graph = {f: set() for f in files if f.endswith(".c")}
    headers = {f: set() for f in files if f.endswith(".h")}
    definer = {}
    uses = {}
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        lines = text.split("\n")
        if f.endswith(".c"):
            if len(lines) - 1 > MAX_FILE:
                breaches.append("%s: %d lines (at most %d)" % (f, len(lines) - 1, MAX_FILE))
            breaches += long_functions(f, lines)
        for inc in includes(f, text):
            if floor_breach(folder(f), folder(inc)):
                breaches.append("%s: includes %s, a floor above" % (f, inc))
            if f in headers and inc in headers:
                headers[f].add(inc)
        if f.endswith(".c"):
            s = symbols(objdir, f)
            if s is not None:
                for d in s[0]:
                    definer.setdefault(d, f)
                uses[f] = s[1]
    for d in ("tests", "bench"):
        for top, _, names in os.walk(d):
            for name in sorted(names):
                if name.endswith(".c"):
                    f = os.path.join(top, name)
                    with open(f, encoding="utf-8", errors="replace") as fh:
                        lines = fh.read().split("\n")
                    if len(lines) - 1 > MAX_FILE:
                        breaches.append("%s: %d lines (at most %d)" % (f, len(lines) - 1, MAX_FILE))
                    breaches += long_functions(f, lines)
    for f, used in uses.items():
        for u in used:
            g = definer.get(u)
            if g and g != f:
                graph[f].add(g)
                if floor_breach(folder(f), folder(g)):
                    breaches.append("%s: calls %s of %s, a floor above" % (f, u, g))
    seen = {}
    for f in files:
        seen.setdefault(os.path.basename(f), []).append(f)
    for name, where in sorted(seen.items()):
        if len(where) > 1:
            breaches.append("%s: one name for %d files (%s)" % (name, len(where), ", ".join(where)))
    for comp in circles(graph) + circles(headers):
        if all(c.startswith(CIRCLE_OK) for c in comp):
            continue
        breaches.append("circle: " + " <-> ".join(comp))
    if len(uses) < len(graph) // 2:
        breaches.append("%s: objects missing (build first)" % objdir)
    for b in breaches:
        print(b)
    print("house: %d files, %d breaches" % (len(files), len(breaches)))
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
