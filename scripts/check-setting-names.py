#!/usr/bin/env python3
"""Checks that each setting of the settings table is named in few source files.

The rule (docs/design.md, "One home for each rule"): the settings of QuantArgs are one
table (include/qvg/settings.h, src/core/settings.cpp); the reports, the CLI, the memory
model, the snapshot's config record, the binding and the Python dataclass walk it
instead of naming the fields, so that adding a setting is one row plus its use. This script keeps it so:
for every row name of the table (the shared rows and the k_/v_ per-role rows) it
counts the source files outside tests, docs and fuzz that contain the name as a
word (as `grep -rlw NAME src include python/qvg python/src tools` does, comments and
strings included) and fails when a name is in more than LIMIT files, unless the
name is listed in ALLOWED below with the most files it may be in and why.

An ALLOWED entry is a ceiling, not a licence: it fails when the count grows past
it, and says so (without failing) when the count falls below it, to be lowered. The codec's
own parameter names and "sink" (WORDS) are counted and shown but never fail: they
are ordinary words of the codec and of every cache (CodecConfig, EncodingLayout, the
kernels, the engines' drop-ins), so a word count cannot tell the setting from them,
and a ceiling on them would fail every new file that quantizes or keeps sinks.
The codec's are members of CodecConfig alone (QuantArgs holds one for the
shared codec, RoleCodec one for each role's overrides, and the table reads them through
member pointers); "sink", a member of QuantArgs, is held to LIMIT files by
scripts/setting-member-uses.py, which asks the compiler (a build of a renamed copy,
about 4 minutes on 2 cores, so not here).

Usage: check-setting-names.py [--report]   (--report: every name's files)
Exit status 1 and one line per violation when anything is wrong.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIMIT = 4
ROOTS = ("src", "include", "python/qvg", "python/src", "tools")
SUFFIXES = {".h", ".cpp", ".cu", ".cuh", ".py", ".pyi", ".in"}
# The CUDA backend's files (counted, and shown apart with --report).
CUDA = ("src/cache/cuda/", "src/kernels/cuda/", "python/src/cuda_", "include/qvg/cuda")

# name -> (the most files it may be in, why more than LIMIT).
CODEC = ("a codec parameter (CodecConfig, EncodingLayout, kernels) as well as a setting; a member of "
         "CodecConfig alone (QuantArgs::codec, RoleCodec::values), read through the table's member pointers")
SINK = ("also the word of the sink tokens every cache keeps (spec 3), in prose and code; as a QuantArgs member "
        "at most 4 files: scripts/setting-member-uses.py")
WORDS: dict[str, str] = {
    "bits": CODEC, "centroids": CODEC, "block_size": CODEC, "stages": CODEC, "kmeans_iters": CODEC,
    "asymmetric": CODEC, "scaling": CODEC, "scale_dtype": CODEC, "init": CODEC + "; also k-means' init in prose",
    "seed": CODEC + "; also the workloads' and PRNGs'", "sink": SINK, "scale_search": CODEC,
}
# Ceilings above LIMIT, with why (none today: every policy setting is named by its row
# (settings.cpp), its member (config.h), the policy's rules (cache_policy.h) and at
# most one more file: the memory model, the model presets or the memory report's list).
ALLOWED: dict[str, tuple[int, str]] = {}


def table_names() -> list[str]:
    """The row names of the settings table, in its order (src/core/settings.cpp)."""
    text = (ROOT / "src/core/settings.cpp").read_text()
    rows = text[text.index("const Setting kSettings[]"):]
    # Policy rows {"name", ...}, shared codec rows QVG_CODEC_ROW("name", ...), and the
    # per-role rows QVG_ROLE_ROW(P, R, "name", ...) of each QVG_ROLE_ROWS("k_", ...).
    shared = re.findall(r'^\s*(?:\{|QVG_CODEC_ROW\()"(\w+)", "', rows, re.M)
    role = re.findall(r'QVG_ROLE_ROW\(P, R, "(\w+)"', text)
    prefixes = re.findall(r'QVG_ROLE_ROWS\("(\w+)", CacheRole::\w+\)', rows)
    if not shared or not role or not prefixes:
        sys.exit("check-setting-names: cannot read the settings table of src/core/settings.cpp")
    return shared + [p + r for p in prefixes for r in role]


def source_files() -> list[str]:
    """The files git lists (tracked or not ignored) under ROOTS; every file there outside git."""
    git = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *ROOTS], cwd=ROOT,
                         capture_output=True, text=True)
    if git.returncode == 0:
        out = git.stdout.split()
    else:
        out = [str(f.relative_to(ROOT)) for r in ROOTS for f in (ROOT / r).rglob("*") if f.is_file()]
    return sorted(f for f in out if pathlib.Path(f).suffix in SUFFIXES and "/tests/" not in f
                  and "fuzz/" not in f and (ROOT / f).is_file())


def main() -> int:
    report = "--report" in sys.argv[1:]
    names = table_names()
    texts = {f: (ROOT / f).read_text(errors="replace") for f in source_files()}
    problems, notes = [], []
    over = 0
    for n in names:
        word = re.compile(r"\b" + re.escape(n) + r"\b")
        files = [f for f, t in texts.items() if word.search(t)]
        cuda = [f for f in files if f.startswith(CUDA)]
        ceiling, why = ALLOWED.get(n, (LIMIT, ""))
        if len(files) > LIMIT:
            over += 1
        if n in WORDS:
            notes.append(f"{n}: named in {len(files)} files (not limited: {WORDS[n]})")
        elif len(files) > ceiling:
            problems.append(f"{n}: named in {len(files)} source files, at most {ceiling} allowed"
                            f"{' (' + why + ')' if why else ''}: {' '.join(files)}")
        elif n in ALLOWED and len(files) < ceiling:
            notes.append(f"{n}: named in {len(files)} files now; its ALLOWED ceiling {ceiling} can be lowered")
        if report:
            print(f"{n:20} {len(files):3} files ({len(files) - len(cuda)} without the CUDA backend's): "
                  + " ".join(files))
    for p in notes + problems:
        print("check-setting-names: " + p)
    if not problems:
        print(f"check-setting-names: {len(names)} settings; {len(names) - over} named in at most {LIMIT} source "
              f"files, {over} more widely ({len(WORDS)} ordinary words, the rest within recorded ceilings)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
