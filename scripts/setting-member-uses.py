#!/usr/bin/env python3
"""Counts the source files that use `sink` (and any other ordinary word) as a member of QuantArgs.

The rule (docs/design.md, "One home for each rule": the settings table): a setting's name
is in at most 4 source files outside tests, docs and fuzz. For the policy settings
scripts/check-setting-names.py counts the word. `sink` is also every cache's word for its
sink tokens, so a word count cannot tell the setting from it. The codec settings (bits,
centroids, ...) are no members of QuantArgs or RoleCodec any more (one CodecConfig,
QuantArgs::codec and RoleCodec::values, read by the settings table through member
pointers): they are the codec's own fields. This script asks the compiler: in a copy of
the tree it renames NAMES' members of QuantArgs and RoleCodec (include/qvg/config.h),
compiles everything with `ninja -k 0` (the CPU library, the CLI, the tests' objects, and
the PyTorch binding when --python names an interpreter with torch), and lists, per
setting, the files where the compiler finds the old member name. A file in that list
reads or writes the setting itself; CodecConfig's and EncodingLayout's members of the
same name do not count.

The CUDA backend is not compiled here (nvcc and minutes); it holds no QuantArgs member
access of NAMES today (grep: it takes CodecConfig from QuantArgs::codec_for()).

Usage: setting-member-uses.py [--python PATH] [--keep DIR]
Takes about 4-5 minutes on 2 cores. Exit status 1 when a setting is used in more than 4
source files outside tests (the table row, the member, and two more).
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIMIT = 4
NAMES = ["sink"]
TAG = "_RENAMED_BY_SCRIPT"


def rename_members(header: pathlib.Path) -> None:
    """Appends TAG to NAMES' declarations inside struct RoleCodec and struct QuantArgs."""
    text = header.read_text()
    out = []
    struct = None
    for line in text.split("\n"):
        m = re.match(r"struct (RoleCodec|QuantArgs) \{", line)
        if m:
            struct = m.group(1)
        elif struct and line.startswith("};"):
            struct = None
        elif struct and not line.lstrip().startswith("//") and "(" not in line.split("//")[0]:
            code, sep, comment = line.partition("//")
            for n in NAMES:
                code = re.sub(r"(?<=[ ,])" + n + r"(?=\s*[,;=])", n + TAG, code)
            line = code + sep + comment
        out.append(line)
    header.write_text("\n".join(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", help="a Python with torch: also compile the PyTorch binding (python/src)")
    ap.add_argument("--keep", help="build in DIR and keep it (default: a temporary directory)")
    a = ap.parse_args()
    work = pathlib.Path(a.keep) if a.keep else pathlib.Path(tempfile.mkdtemp(prefix="qvg-members-"))
    src, build = work / "src", work / "build"
    try:
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.split("\n")
        for f in filter(None, files):
            if (ROOT / f).is_file():
                (src / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / f, src / f)
        rename_members(src / "include/qvg/config.h")
        cfg = ["cmake", "-G", "Ninja", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug",
               "-DCMAKE_CXX_FLAGS_DEBUG=-O0", "-DQVG_BUILD_BENCH=ON", "-DQVG_ENABLE_CUDA=OFF", "-DQVG_WITH_FAISS=OFF"]
        if a.python:
            cfg += ["-DQVG_BUILD_PYTHON=ON", f"-DPython_EXECUTABLE={a.python}"]
        subprocess.run(cfg, check=True, capture_output=True)
        log = subprocess.run(["ninja", "-C", str(build), "-k", "0", f"-j{os.cpu_count() or 2}"],
                             capture_output=True, text=True).stdout
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    uses: dict[str, set[str]] = collections.defaultdict(set)
    prefix = str(src) + "/"
    for line in log.split("\n"):
        m = re.match(r"(\S+?):\d+:\d+: error: ", line)
        if not m or not m.group(1).startswith(prefix):
            continue
        f = m.group(1)[len(prefix):]
        for n in NAMES:
            q = r"[‘']" + n + r"[’']"
            if re.search(r"no member named " + q + "|" + q + r" (is not a member of|was not declared)", line):
                uses[n].add(f)
    bad = 0
    for n in NAMES:
        outside = sorted(f for f in uses[n] | {"include/qvg/config.h"} if not f.startswith(("tests/", "fuzz/", "bench/")))
        over = len(outside) > LIMIT
        bad += over
        print(f"{n:14} {len(outside)} source files{' (over ' + str(LIMIT) + ')' if over else ''}: "
              + " ".join(outside))
    if not any(uses.values()):
        print("setting-member-uses: no renamed member was found by the compiler; the rename failed", file=sys.stderr)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
