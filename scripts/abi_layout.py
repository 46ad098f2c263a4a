#!/usr/bin/env python3
"""The ABI's layout facts, generated from include/skv.h and checked against ctests/abi_layout.txt.

Every `typedef struct ... { ... } name;` gives its sizeof, alignof and each field's offsetof;
every enum its values; every `#define SKV_*` integer constant its value. A C program generated
from the header prints them (so the compiler, not this script, computes every number), and the
output must equal the committed file: a change to the ABI shows as a diff to review, once, in
the commit that makes it.

  scripts/abi_layout.py check CC_ARGS...   compare (exit 1 on a difference)
  scripts/abi_layout.py write CC_ARGS...   rewrite ctests/abi_layout.txt
CC_ARGS are added to the compile line (e.g. -Iinclude).
"""

import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "include", "skv.h")
GOLDEN = os.path.join(ROOT, "ctests", "abi_layout.txt")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def program(text):
    text = strip_comments(text)
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "skv.h"', "int main(void) {"]
    for m in re.finditer(r"typedef struct \w+ \{(.*?)\} (\w+);", text, flags=re.S):
        body, name = m.groups()
        lines.append(f'  printf("struct {name} size %zu align %zu\\n", sizeof({name}), _Alignof({name}));')
        for decl in body.split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            # the field name: a function pointer's (*name), else the last identifier before any [N]
            m = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl) or re.search(r"(\w+)\s*(?:\[[^\]]*\])*$", decl)
            field = m.group(1)
            lines.append(f'  printf("  {field} offset %zu size %zu\\n", offsetof({name}, {field}), sizeof((({name} *)0)->{field}));')
    for m in re.finditer(r"typedef enum \w+ \{(.*?)\} (\w+);", text, flags=re.S):
        lines.append(f'  printf("enum {m.group(2)} size %zu\\n", sizeof({m.group(2)}));')
        for item in m.group(1).split(","):
            name = item.split("=")[0].strip()
            if name:
                lines.append(f'  printf("  {name} = %lld\\n", (long long){name});')
    for name, value in re.findall(r"^#define (SKV_\w+) (.*)$", text, flags=re.M):
        if value.strip().startswith('"'):
            lines.append(f'  printf("define {name} = \\"%s\\"\\n", {name});')
        else:
            lines.append(f'  printf("define {name} = %lld\\n", (long long)({name}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def facts(cc_args):
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
        with open(src, "w") as f:
            f.write(program(open(HEADER).read()))
        subprocess.run(["gcc", "-std=c11", "-I" + os.path.join(ROOT, "include"), *cc_args, src, "-o", exe], check=True)
        return subprocess.run([exe], check=True, capture_output=True, text=True).stdout


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("check", "write"):
        sys.exit(__doc__)
    out = facts(sys.argv[2:])
    if sys.argv[1] == "write":
        with open(GOLDEN, "w") as f:
            f.write(out)
        print(f"abi_layout: wrote {os.path.relpath(GOLDEN, ROOT)}")
        return
    want = open(GOLDEN).read() if os.path.exists(GOLDEN) else ""
    if out != want:
        import difflib

        sys.stdout.writelines(difflib.unified_diff(want.splitlines(True), out.splitlines(True), "committed", "header"))
        sys.exit("abi_layout: the header's layout differs from ctests/abi_layout.txt: an ABI change "
                 "(run scripts/abi_layout.py write, and say so in CHANGELOG.md)")
    print(f"abi_layout: {out.count(chr(10))} layout facts as committed")


if __name__ == "__main__":
    main()
