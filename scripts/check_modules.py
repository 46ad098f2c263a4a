#!/usr/bin/env python3
"""Fails when the files under src/ import each other in a circle.

A file depends on another when it names one of its items through a path (`use super::x::..`,
`crate::core::x::..`, `super::x::f(..)`). A module's own submodules are part of it: the edges
from a `mod.rs` (or `lib.rs`) to the modules it declares are not counted, the edges back are.

  scripts/check_modules.py [src]
"""

import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE = re.compile(r"\buse\s+([^;]+);", re.S)


def modules(src):
    """Module path (tuple) -> file, for every .rs file under src."""
    found = {}
    for dirpath, _, names in os.walk(src):
        for name in names:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib"):
                rel = rel[:-1]
            found[tuple(rel)] = os.path.join(dirpath, name)
    return found


def strip_comments(text):
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def expand_use(tree):
    """`a::{b, c::{d}}` -> ["a::b", "a::c::d"] (enough for module resolution)."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)::\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.groups()
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    return [p2 for p in parts if p for p2 in expand_use(prefix + "::" + p)]


def edges(mods):
    out = {}
    for mod, path in mods.items():
        text = strip_comments(open(path, encoding="utf-8").read())
        # The item's own module: a file `x.rs` or `x/mod.rs` is module x; its `super` is x's parent.
        paths = [p for u in USE.findall(text) for p in expand_use(u)]
        paths += [m.group(0) for m in PATH.finditer(text)]
        deps = set()
        for p in paths:
            segs = p.split("::")
            if segs[0] == "crate":
                base, rest = (), segs[1:]
            elif segs[0] == "super":
                base, rest = mod[:-1], segs[1:]
                while rest and rest[0] == "super":
                    base, rest = base[:-1], rest[1:]
            elif segs[0] == "self":
                base, rest = mod, segs[1:]
            else:
                base, rest = mod, segs
            # the longest prefix that is a module file
            target = None
            for k in range(len(rest), -1, -1):
                cand = base + tuple(rest[:k])
                if cand in mods:
                    target = cand
                    break
            if target is None or target == mod or target[: len(mod)] == mod:
                continue  # itself, or one of its own submodules
            deps.add(target)
        out[mod] = deps
    return out


def cycles(graph):
    found, state, stack = [], {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return found


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "src"
    mods = modules(src)
    found = cycles(edges(mods))
    for c in found:
        print("import circle: " + " -> ".join(mods[m] for m in c), file=sys.stderr)
    if found:
        sys.exit(1)
    print(f"check_modules: {len(mods)} files under {src}/, no import circle")


if __name__ == "__main__":
    main()
