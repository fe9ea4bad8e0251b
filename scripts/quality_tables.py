#!/usr/bin/env python3
"""Markdown tables of docs/quality.md from the frontier reports.

Usage: python3 scripts/quality_tables.py docs/quality   (reads <dir>/<preset>/frontier.json)
"""
import json
import pathlib
import sys

PRESETS = ["self-forcing-1.3b", "lingbot-world-14b", "longcat-video-13.6b", "hy-worldplay-8b"]


def main() -> None:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "docs/quality")
    reports = {p: json.load(open(root / p / "frontier.json")) for p in PRESETS if (root / p / "frontier.json").exists()}
    print("| preset | context tokens | points | search time | reference bpe | reference attn err | hq bpe | hq attn err "
          "| hq gain | descent best (bpe, err) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p, d in reports.items():
        s = d["summary"]
        r, h, b = s["reference"], s["hq"], s["best"]
        print(f"| {p} | {d['workload']['context_tokens']:,} | {len(d['points'])} | {d['search']['wall_s']:.0f} s "
              f"| {r['bits_per_element']:.3f} | {r['attention_rel_l2']:.5f} | {h['bits_per_element']:.3f} "
              f"| {h['attention_rel_l2']:.5f} | **{s['hq_vs_reference']['attention_error_ratio']:.2f}x** "
              f"(+{s['hq_vs_reference']['bpe_delta']:.3f} bpe) | {b['bits_per_element']:.3f}, "
              f"{b['attention_rel_l2']:.5f} ({b['config']}) |")
    print()
    print("| preset | " + " | ".join(f"{m} g{g}" for m in ("rtn", "kivi", "quarot") for g in (32, 64)) + " |")
    print("|---|" + "---|" * 6)
    for p, d in reports.items():
        cells = []
        for m in ("rtn", "kivi", "quarot"):
            for g in (32, 64):
                c = next(c for c in d["summary"]["baseline_curves_at_hq_bpe"] if c["method"] == m and c["group"] == g)
                cells.append(f"{c['ratio_to_hq']:.2f}x{' *' if c['clamped'] else ''}")
        print(f"| {p} | " + " | ".join(cells) + " |")
    print()
    print("| preset | reference encode (Melem/s) | hq encode | ratio | reference decode (Melem/s) | hq decode | ratio |")
    print("|---|---|---|---|---|---|---|")
    for p, d in reports.items():
        t = d["summary"]["hq_vs_reference"]
        print(f"| {p} | {t['reference_encode_elements_per_s'] / 1e6:.0f} | {t['hq_encode_elements_per_s'] / 1e6:.0f} "
              f"| {t['encode_throughput_ratio']:.2f}x | {t['reference_decode_elements_per_s'] / 1e6:.0f} "
              f"| {t['hq_decode_elements_per_s'] / 1e6:.0f} | {t['decode_throughput_ratio']:.2f}x |")
    print()
    for p, d in reports.items():
        print(f"{p}: " + "; ".join(d["search"]["trace"]))
        print()


if __name__ == "__main__":
    main()
