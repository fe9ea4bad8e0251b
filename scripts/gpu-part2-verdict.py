#!/usr/bin/env python3
"""Brings the exit statuses of gpu-check's second part into its verdict: a part-2 test
that failed or did not run is an unmet acceptance and fails the run.

    gpu-part2-verdict.py OUT/gpu-check.json STATUS_FILE

STATUS_FILE holds one line per step of part 2, "NAME RC TEST" (TEST 1 for a test, 0 for
a measurement whose status is recorded only; RC "null" for a step that did not run).
gpu-check.json (python/gpu/summary.py's verdict, written before part 2 starts) gets
"part2": {"steps": {NAME: RC}, "tests_passed": bool} and one acceptance per test,
"part 2: NAME exits 0" (met: RC == 0; null when it did not run), and all_met is
recomputed over every acceptance. The file is replaced atomically. Exit status 1 when a
test failed or did not run (one line each), 2 when the inputs cannot be read, else 0.
Standard library only.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: gpu-part2-verdict.py OUT/gpu-check.json STATUS_FILE", file=sys.stderr)
        return 2
    verdict_path, status_path = argv[1], argv[2]
    try:
        with open(verdict_path, encoding="utf-8") as f:
            verdict = json.load(f)
        with open(status_path, encoding="utf-8") as f:
            lines = [line.split() for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print(f"gpu-check: part 2's verdict: cannot read the inputs: {e}", file=sys.stderr)
        return 2
    steps: dict[str, int | None] = {}
    tests: list[str] = []
    for parts in lines:
        if len(parts) != 3 or parts[2] not in ("0", "1") or not (parts[1] == "null" or parts[1].lstrip("-").isdigit()):
            print(f"gpu-check: part 2's verdict: bad status line {' '.join(parts)!r} (NAME RC TEST)", file=sys.stderr)
            return 2
        steps[parts[0]] = None if parts[1] == "null" else int(parts[1])
        if parts[2] == "1":
            tests.append(parts[0])
    acceptances = [a for a in verdict.get("acceptances", []) if not a.get("acceptance", "").startswith("part 2: ")]
    failed = []
    for name in tests:
        rc = steps[name]
        met = None if rc is None else rc == 0
        acceptances.append({"acceptance": f"part 2: {name} exits 0", "value": rc, "limit": "exit status 0", "met": met})
        if met is not True:
            failed.append(f"gpu-check: part 2: {name} " + ("did not run" if rc is None else f"exited {rc}"))
    verdict["acceptances"] = acceptances
    verdict["part2"] = {"steps": steps, "tests_passed": not failed}
    verdict["all_met"] = bool(acceptances) and all(a.get("met") is True for a in acceptances)
    tmp = f"{verdict_path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(verdict, f, indent=2)
        f.write("\n")
    os.replace(tmp, verdict_path)
    for line in failed:
        print(line)
    print(f"gpu-check: part 2: {len(tests) - len(failed)} of {len(tests)} tests passed; all_met = {verdict['all_met']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
