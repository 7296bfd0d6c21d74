"""Checks csrc/'s layering, as csrc/README.md writes it down: a .c file
calls functions of (and includes headers of) only the files on its own line
of that list or above it, and two files never call each other.  Exits 1,
naming each call or include that goes up a layer and each circle."""

import os
import re
import sys

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "csrc")


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
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def main():
    rank = layers()
    texts = {name: code(os.path.join(CSRC, name)) for name in sorted(os.listdir(CSRC)) if name.endswith(".c")}
    owner = {}
    for name, text in texts.items():
        for m in re.finditer(r"^(?!static)[A-Za-z][\w \*]*?\b(ga_\w+)\([^;{]*\)\s*\{", text, re.M):
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
    for p in problems:
        print(p)
    print("csrc layering: %d files in %d layers, %d problems" % (len(texts), len(set(rank.values())),
                                                               len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
