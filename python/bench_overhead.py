"""Python-side overhead of one update_and_get_attention_kv call (a benchmark, not a test).

On a tiny cache (batch 1, 1 head, head_dim 8, cache of 64 tokens, chunks of 4
tokens) the C++ work is a few hundred nanoseconds, so the time of a call is the
overhead the Python layer adds: argument conversion, the binding, building the
view's tensors, the cursor bookkeeping and the view object. Target: median under
50 microseconds.

    PYTHONPATH=build/python/python /usr/bin/python3 python/bench_overhead.py [--calls N] [--json]

Each scenario times N calls one by one (time.perf_counter_ns) and reports the
median and the 90th percentile in microseconds, for the full call and for the
bare binding call (qvg._C) underneath it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# Run as a script, Python puts python/ first on sys.path, where the source package
# qvg/ lacks the compiled _C: use the built package from PYTHONPATH instead.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import torch  # noqa: E402

import qvg.torch as qt  # noqa: E402

B, S, H, D, N = 1, 64, 1, 8, 4


def _index() -> torch.Tensor:
    return torch.zeros(1, dtype=torch.long)


def make(kind: str, ints: bool):
    if kind == "dense":
        k = torch.zeros(B, S, H, D)
        return qt.CausalSelfAttentionKVCache(
            k=k, v=torch.zeros_like(k), global_end_index=_index(), local_end_index=_index(),
            global_end_index_int=0 if ints else None, local_end_index_int=0 if ints else None)
    return qt.QVGPackedCausalKVCache(
        batch_size=B, cache_size=S, num_heads=H, head_dim=D, dtype=torch.float32, device="cpu",
        global_end_index=_index(), local_end_index=_index(), use_int_indices=ints, quant_args=qt.QVGKVQuantArgs())


def time_calls(fn, calls: int) -> list[float]:
    out = []
    clock = time.perf_counter_ns
    for i in range(calls):
        t0 = clock()
        fn(i)
        out.append((clock() - t0) / 1000.0)
    return out


def scenario(kind: str, ints: bool, advance: bool, calls: int) -> dict:
    cache = make(kind, ints)
    key = torch.randn(B, N, H, D)
    value = torch.randn(B, N, H, D)
    cache.update_and_get_attention_kv(key=key, value=value, current_chunk_start=0)

    if advance:  # every call starts a new chunk (cursors move, eviction after 16 chunks)
        def full(i):
            cache.update_and_get_attention_kv(key=key, value=value, current_chunk_start=N * (i + 1))
    else:  # every call is a denoising step of the current chunk
        def full(i):
            cache.update_and_get_attention_kv(key=key, value=value, current_chunk_start=0)

    for i in range(200):  # warm-up
        full(i)
    cache.reset_indices()
    cache.update_and_get_attention_kv(key=key, value=value, current_chunk_start=0)
    t_full = time_calls(full, calls)

    bare = make(kind, True)._c  # the binding alone: positional arguments, tuple result
    if kind == "dense":
        bare.update(key, value, 0, None, None, 0, 0)
        cursors = [N, N]  # the dense binding takes the caller's cursors (global_end, local_end)

        def raw(i):
            r = bare.update(key, value, N * (i + 1) if advance else 0, None, None, cursors[0], cursors[1])
            cursors[0], cursors[1] = r[5], r[4]
    else:
        bare.update(key, value, 0, None, None)

        def raw(i):
            bare.update(key, value, N * (i + 1) if advance else 0, None, None)
    t_raw = time_calls(raw, calls)

    def stats(t):
        t = sorted(t)
        return {"median_us": statistics.median(t), "p90_us": t[int(0.9 * len(t))]}

    return {"cache": kind, "int_cursors": ints, "call": "advance" if advance else "rewrite",
            "full": stats(t_full), "binding": stats(t_raw)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [scenario(kind, ints, adv, args.calls)
            for kind in ("dense", "packed") for ints in (False, True) for adv in (False, True)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"torch {torch.__version__}; tiny cache B={B} S={S} H={H} D={D}, chunk {N}; {args.calls} calls each")
    print(f"{'cache':7} {'cursors':8} {'call':8} {'full median':>12} {'p90':>8} {'binding median':>15} {'p90':>8}")
    worst = 0.0
    for r in rows:
        worst = max(worst, r["full"]["median_us"])
        print(f"{r['cache']:7} {'int' if r['int_cursors'] else 'tensor':8} {r['call']:8} "
              f"{r['full']['median_us']:10.1f}us {r['full']['p90_us']:6.1f}us "
              f"{r['binding']['median_us']:13.1f}us {r['binding']['p90_us']:6.1f}us")
    print(f"worst median {worst:.1f}us (target < 50us): {'OK' if worst < 50 else 'OVER'}")


if __name__ == "__main__":
    main()
