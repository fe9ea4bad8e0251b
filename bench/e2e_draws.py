"""The packed comparison of python/tests/test_e2e_sglang.py over draws and codec seeds.

The test suite compares the final latents' deviation from the dense rollout for the
engine's packed cache, qvg's with the engine's settings and qvg's `hq` profile on one
draw of the random inputs (the tiny models' weights, the latents, the text and the
noise) and one realization of each codec's random k-means seeds. Both move one
rollout's ratio (LongLive2 int4, hq, 12 frames: 0.66-0.75 over four draws, 0.68-0.79
over eight qvg seeds), so this benchmark repeats the comparison on draws 0..D-1 and,
within each draw, on codec seeds 0..S-1 (seed s: the engine's k-means seeds drawn from
torch seeded with s per quantization, sglang_e2e.engine_codec_on_cpu; qvg's `seed`
1234 + s; draw 0 with seed 0 is the suite's rollout but for the engine's seeds), and
reports per model and width the ratio of the means over all of them (docs/compat.md).

Run (the Python environment of scripts/python.sh, the engine and its e2e wheels):
    PYTHONPATH=python/tests build/venv/bin/python bench/e2e_draws.py [--draws 2] [--seeds 2] [--frames 24]
About 10 s per rollout of the engine's packed cache (Self-Forcing at 24 frames: 45 s)
on a 2-core machine; qvg's rollouts take a second.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import sglang_e2e as e2e
import test_e2e_sglang as suite


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=2, help="codec seeds per draw")
    ap.add_argument("--frames", type=int, default=suite.PACKED_FRAMES, help="latent frames of every rollout")
    ap.add_argument("--models", default=",".join(sorted(suite.CASES)))
    ap.add_argument("--bits", default="2,4")
    a = ap.parse_args()
    print(f"{a.frames} frames; model bits draw seed | latents qvg/engine hq/engine | views qvg/engine hq/engine")
    for name in a.models.split(","):
        for bits in (int(b) for b in a.bits.split(",")):
            rows = []
            for d in range(a.draws):
                e2e.DRAW["index"] = d
                for s in range(a.seeds):
                    f = suite.packed_comparison(name, bits, a.frames, engine_seed=s, qvg_seed=1234 + s)
                    m, v = f["mean"], f["views"]
                    rows.append(f)
                    print(f"{name} int{bits} {d} {s} | {m['qvg'] / m['engine']:.3f} {m['hq'] / m['engine']:.3f} | "
                          f"{v['qvg'] / v['engine']:.3f} {v['hq'] / v['engine']:.3f}", flush=True)
            e2e.DRAW["index"] = 0
            mean = {k: {w: statistics.mean(r[k][w] for r in rows) for w in ("engine", "qvg", "hq")}
                    for k in ("mean", "views")}
            hq = [r["mean"]["hq"] / r["mean"]["engine"] for r in rows]
            print(f"{name} int{bits} mean of {len(rows)} | {mean['mean']['qvg'] / mean['mean']['engine']:.3f} "
                  f"{mean['mean']['hq'] / mean['mean']['engine']:.3f} (hq per run {min(hq):.3f}-{max(hq):.3f}) | "
                  f"{mean['views']['qvg'] / mean['views']['engine']:.3f} "
                  f"{mean['views']['hq'] / mean['views']['engine']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
