"""Checks that calls between files go one way.

csrc/: the layering csrc/README.md writes down — a .c file calls functions of
(and includes headers of) only the files on its own line of that list or
above it, and two files never call each other.  kernels/: no circle of calls
between files, of any length (the backends that stand in for kernels/cuda,
kernels/nocuda and kernels/sim, define the same ga_cuda_* names and are not
their owners).  Exits 1, naming each call or include that goes up a layer
and each circle."""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CSRC = os.path.join(ROOT, "csrc")
DEFINITION = re.compile(r"^(?:extern \"C\" )?(?!static)[A-Za-z_][\w \*:<>,]*?\b(ga_\w+)\s*\([^;{]*\)\s*\{", re.M)


def layers():
    """{file name: layer number} from the list under README.md's "The layers"."""
    text = open(os.path.join(CSRC, "README.md")).read().split("## The layers", 1)[1].split("\n## ", 1)[0]
    rank, layer = {}, 0
    for line in text.splitlines():
        m = re.match(r"    ((?:\w+\.[ch](?:, )?)+)\s{2,}", line)
        if m:
            for name in m.group(1).split(", "):
                rank[name] = layer
            layer += 1
    return rank


def code(path):
    text = open(path).read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def kernel_cycles():
    """The circles of calls between kernels/ files (strongly connected
    components of more than one file)."""
    files = []
    for folder, _, names in os.walk(os.path.join(ROOT, "kernels")):
        files += [os.path.join(folder, n) for n in names if n.endswith((".c", ".cu", ".cpp"))]
    texts = {os.path.relpath(f, ROOT): code(f) for f in sorted(files)}
    owner = {}
    for name, text in texts.items():
        stand_in = "/sim/" in name or "/nocuda/" in name
        for m in DEFINITION.finditer(text):
            if not (stand_in and m.group(1).startswith("ga_cuda_")):
                owner.setdefault(m.group(1), name)
    edges = {name: sorted({owner[fn] for fn in set(re.findall(r"\b(ga_\w+)\s*\(", text))
                           if fn in owner and owner[fn] != name}) for name, text in texts.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in texts:
        if v not in index:
            visit(v)
    return len(texts), cycles


def main():
    rank = layers()
    texts = {name: code(os.path.join(CSRC, name)) for name in sorted(os.listdir(CSRC)) if name.endswith(".c")}
    owner = {}
    for name, text in texts.items():
        for m in DEFINITION.finditer(text):
            owner[m.group(1)] = name
    problems = []
    calls = {}  # (caller file, callee file) -> a function called, for files of one layer
    for name, text in texts.items():
        if name not in rank:
            problems.append("csrc/%s is not in README.md's list of layers" % name)
            continue
        for fn in sorted(set(re.findall(r"\b(ga_\w+)\s*\(", text))):
            if fn not in owner or owner[fn] == name:
                continue
            if rank[owner[fn]] > rank[name]:
                problems.append("csrc/%s calls %s of csrc/%s, a layer above" % (name, fn, owner[fn]))
            elif rank[owner[fn]] == rank[name]:
                calls.setdefault((name, owner[fn]), fn)
        for header in re.findall(r'#include "(\w+)\.h"', open(os.path.join(CSRC, name)).read()):
            layer = rank.get(header + ".h", rank.get(header + ".c"))
            if layer is not None and layer > rank[name]:
                problems.append("csrc/%s includes %s.h, a layer above" % (name, header))
    # files of one layer may call each other's functions, but not both ways:
    # that would be a circle
    for (a, b), fn in sorted(calls.items()):
        if a < b and (b, a) in calls:
            problems.append("csrc/%s and csrc/%s call each other (%s, %s): a circle" % (a, b, fn, calls[(b, a)]))
    nkernels, cycles = kernel_cycles()
    for cycle in cycles:
        problems.append("kernels/: a circle of calls between %s" % ", ".join(cycle))
    for p in problems:
        print(p)
    print("csrc layering: %d files in %d layers; kernels: %d files; %d problems" % (
        len(texts), len(set(rank.values())), nkernels, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
