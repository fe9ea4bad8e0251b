#!/usr/bin/env bash
# `qvg memory`: the JSON has exactly the documented keys, its figures follow from the
# packed format (spec 1.5) by hand, flags change what they should, the table marks
# assumptions, and bad flags exit non-zero with one "qvg: error: ..." line.
# Usage: bash memory.sh /path/to/qvg   (python3 standard library only)
set -euo pipefail
QVG=${1:?usage: memory.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$QVG" memory --model self-forcing-1.3b --json > "$T/sf.json"
"$QVG" memory --model self-forcing-1.3b --json --centroids 256 --span-chunks 8 > "$T/sf8.json"
"$QVG" memory --model self-forcing-1.3b --json --centroids 256 --span-chunks 8 --span-mode incremental \
  --keep-recent 0 > "$T/sf8i.json"
"$QVG" memory --model self-forcing-1.3b --json --centroids 256 --span-chunks 8 --span-mode incremental \
  --keep-recent 0 --refine-recent 4 --refine-bits 2 > "$T/sf8r.json"
"$QVG" memory --model hy-worldplay-8b --json --frames 10 > "$T/hy10.json"
"$QVG" memory --model longcat-video-13.6b --json --bits 4 --no-sink > "$T/lc4.json"
"$QVG" memory --model self-forcing-1.3b --json --bits 3 > "$T/sf3.json"  # qvg's int3 (qvg/code_format.h)
"$QVG" memory --model self-forcing-1.3b --json --bits int3 > "$T/sf3m.json"
"$QVG" memory --model lingbot-world-14b --json --scale-dtype bf16 --asymmetric --block-size 32 > "$T/lb.json"

python3 - "$T" <<'PY'
import json, sys, os
T = sys.argv[1]
MiB = 2.0 ** 20
def close(a, b, what):
    assert abs(a - b) <= 1e-9 * max(1.0, abs(b)), f"{what}: {a} != {b}"

keys = ["model", "layers", "context_frames", "bits", "centroids",
        "per_layer_bf16_mib", "per_layer_packed_mib", "total_bf16_mib", "total_packed_mib", "ratio",
        "per_layer_policy_mib", "policy_ratio", "policy_ratio_vs_dense_window", "keep_recent_chunks", "sink",
        "sink_span", "sink_keep_chunks", "span_chunks", "span_mode", "refine_recent", "refine_bits",
        "per_layer_policy_refine_mib", "per_layer_view_mib", "model_dense_mib", "model_peak_mib", "model_peak_ratio",
        "model_peak_views_per_layer_mib", "model_peak_ratio_views_per_layer", "engine_model_peak_mib",
        "engine_model_peak_ratio"]

def load(name):
    j = json.load(open(os.path.join(T, name)))
    assert list(j.keys()) == keys, (name, list(j.keys()))
    assert abs(j["ratio"] - j["per_layer_bf16_mib"] / j["per_layer_packed_mib"]) < 1e-9, name
    assert abs(j["policy_ratio"] - j["per_layer_bf16_mib"] / j["per_layer_policy_mib"]) < 1e-9, name
    # The model level: every layer's cache + one view of the window (the dense window's
    # size) shared by the layers, or one per layer; the dense caches' views need no copy.
    L = j["layers"]
    dense_window = j["per_layer_policy_mib"] * j["policy_ratio_vs_dense_window"]
    close(j["per_layer_view_mib"], dense_window, name + " view = the dense window")
    close(j["model_dense_mib"], L * dense_window, name + " model dense")
    close(j["model_peak_mib"], L * j["per_layer_policy_mib"] + j["per_layer_view_mib"], name + " model peak")
    close(j["model_peak_views_per_layer_mib"], L * (j["per_layer_policy_mib"] + j["per_layer_view_mib"]),
          name + " model peak, a view per layer")
    close(j["model_peak_ratio"], j["model_dense_mib"] / j["model_peak_mib"], name + " model ratio")
    close(j["model_peak_ratio_views_per_layer"], j["model_dense_mib"] / j["model_peak_views_per_layer_mib"],
          name + " model ratio, a view per layer")
    assert j["model_peak_ratio_views_per_layer"] < j["model_peak_ratio"] < j["policy_ratio_vs_dense_window"] + 1e-9, name
    return j

def enc(S, H, D, bits=2, K=128, block=64, stages=1, scale_bytes=1, asym=False, two_level=True):
    """Bytes of one encoded [1, S, H, D] bf16 tensor, spec 1.5 by hand."""
    n = stages * (H * K * D * 2 + H * S)          # centroids (bf16) + ids
    n += H * S * D * bits // 8                     # codes
    n += H * S * (D // block) * scale_bytes * (2 if asym else 1)  # scales (+ zeros)
    if two_level:
        n += H * 4 * (2 if asym else 1)            # per-group fp32 factors
    return n

# Self-Forcing, defaults: 56 chunks of 4680 tokens, each its own span; 12 heads x 128.
sf = load("sf.json")
assert (sf["model"], sf["layers"], sf["context_frames"], sf["bits"], sf["centroids"]) == \
    ("self-forcing-1.3b", 30, 168, 2, 128), sf
# The engine's default on Self-Forcing: this very configuration but compat scaling (no
# two-level factors: 4 bytes per head less per encoding) and the preset's sink policy
# (no sink): 55 packed one-chunk spans + kept + current raw; one view.
eng_policy = 55 * 2 * enc(4680, 12, 128, two_level=False) + 2 * 4680 * 12 * 128 * 4
close(sf["engine_model_peak_mib"], (30 * eng_policy + 57 * 4680 * 12 * 128 * 4) / MiB, "sf engine model peak")
close(sf["engine_model_peak_ratio"], 30 * 57 * 4680 * 12 * 128 * 4 / (30 * eng_policy + 57 * 4680 * 12 * 128 * 4),
      "sf engine model ratio")
close(sf["per_layer_bf16_mib"], 262080 * 12 * 128 * 2 * 2 / MiB, "sf bf16")
close(sf["per_layer_packed_mib"], 56 * 2 * enc(4680, 12, 128) / MiB, "sf packed")
close(sf["total_packed_mib"], 30 * sf["per_layer_packed_mib"], "sf total")
# Steady state: 55 packed chunks + kept + current raw; vs the dense 57-chunk window.
policy = 55 * 2 * enc(4680, 12, 128) + 2 * 4680 * 12 * 128 * 4
close(sf["per_layer_policy_mib"], policy / MiB, "sf policy")
close(sf["policy_ratio"], 56 * 4680 * 12 * 128 * 4 / policy, "sf policy ratio (bf16 context / policy)")
close(sf["policy_ratio_vs_dense_window"], 57 * 4680 * 12 * 128 * 4 / policy, "sf policy ratio vs dense window")

# int3, qvg's width: 8 codes in 3 bytes (spec 1.5), the rest as int2's.
sf3 = load("sf3.json")
assert sf3["bits"] == 3, sf3["bits"]
close(sf3["per_layer_packed_mib"], 56 * 2 * enc(4680, 12, 128, bits=3) / MiB, "sf3 packed")
assert load("sf3m.json") == sf3, "--bits int3 reads as --bits 3"

# The published Self-Forcing run: 256 centroids, spans of 8 chunks (7 spans).
sf8 = load("sf8.json")
close(sf8["per_layer_packed_mib"], 7 * 2 * enc(8 * 4680, 12, 128, K=256) / MiB, "sf8 packed")
assert sf8["ratio"] > sf["ratio"], "longer spans amortise the codebooks"
assert sf8["span_mode"] == "deferred"

# Incremental spans of 8, keep_recent 0 (docs/spans.md): every context chunk is
# encoded on its own arrays (its own fp32 factors) against its span's codebook of
# 256 slots (12 x 256 x 128 bf16, once per span). Fully encoded: 56 chunks, 7 spans.
# Policy peak: the 56 context chunks encoded, 8 spans alive (the oldest one partly
# evicted chunk by chunk), the current chunk raw.
sf8i = load("sf8i.json")
assert sf8i["span_mode"] == "incremental"
book = 12 * 256 * 128 * 2
chunk = enc(4680, 12, 128, K=256) - book
close(sf8i["per_layer_packed_mib"], 2 * (56 * chunk + 7 * book) / MiB, "sf8i packed")
close(sf8i["per_layer_policy_mib"], (2 * (56 * chunk + 8 * book) + 2 * 4680 * 12 * 128 * 2) / MiB, "sf8i policy")
assert sf8i["policy_ratio"] >= 5.0 and sf8i["policy_ratio"] > 1.7 * sf8["policy_ratio"], sf8i["policy_ratio"]
assert (sf8i["refine_recent"], sf8i["refine_bits"], sf8i["per_layer_policy_refine_mib"]) == (0, 4, 0)

# The same with refinement layers on the 4 newest chunks (2 bits): each layer an f32
# encoding of one stage with one centroid (12 x 128 fp32), ids, 2-bit codes, one fp8
# scale per 64 channels and the per-group fp32 factors, for K and V.
sf8r = load("sf8r.json")
layer = 12 * 128 * 4 + 12 * 4680 + 12 * 4680 * 128 * 2 // 8 + 12 * 4680 * 2 + 12 * 4
close(sf8r["per_layer_policy_refine_mib"], 4 * 2 * layer / MiB, "sf8r layers")
close(sf8r["per_layer_policy_mib"], sf8i["per_layer_policy_mib"] + 4 * 2 * layer / MiB, "sf8r policy")
close(sf8r["per_layer_packed_mib"], sf8i["per_layer_packed_mib"], "sf8r: the encoded context has no layers")

# HY-WorldPlay with --frames 10: 8,800 tokens = 2 spans of 3,520 + one of 1,760.
hy = load("hy10.json")
close(hy["per_layer_bf16_mib"], 8800 * 16 * 256 * 4 / MiB, "hy bf16")
close(hy["per_layer_packed_mib"], (2 * 2 * enc(3520, 16, 256) + 2 * enc(1760, 16, 256)) / MiB, "hy packed")

# LongCat, int4, sink kept raw: the whole context is sink, so nothing is packed.
lc = load("lc4.json")
close(lc["ratio"], 1.0, "lc ratio")

# LingBot with bf16 scales, asymmetric, block 32: 2 sink spans + 20 + 1 short span.
lb = load("lb.json")
e = lambda S: 2 * enc(S, 40, 128, block=32, scale_bytes=2, asym=True)
close(lb["per_layer_packed_mib"], (22 * e(4680) + e(3120)) / MiB, "lb packed")
print("memory JSON figures match the hand computation")
PY

# --branches N: n sessions forked from the state at the peak (MemoryReport::branches):
# the encoded part once + N x the raw part, beside N copies and N dense caches; the other
# keys unchanged and "branches" last. Self-Forcing, defaults: 55 one-chunk spans shared,
# the kept and the current chunk raw in each branch.
"$QVG" memory --model self-forcing-1.3b --json --branches 8 > "$T/sfb8.json"
"$QVG" memory --model self-forcing-1.3b --json --branches 1 > "$T/sfb1.json"
"$QVG" memory --model self-forcing-1.3b --json --centroids 256 --span-chunks 8 --span-mode incremental \
  --keep-recent 0 --refine-recent 4 --refine-bits 2 --branches 3 > "$T/sf8rb3.json"
python3 - "$T" <<'PY'
import json, sys, os
T = sys.argv[1]
MiB = 2.0 ** 20
def close(a, b, what):
    assert abs(a - b) <= 1e-9 * max(1.0, abs(b)), f"{what}: {a} != {b}"
bkeys = ["n", "per_layer_shared_mib", "per_layer_own_mib", "per_layer_forked_mib", "per_layer_copies_mib",
         "per_layer_dense_mib", "model_forked_mib", "model_copies_mib", "model_dense_mib", "ratio_vs_copies",
         "ratio_vs_dense"]
def check(name, plain, n):
    j = json.load(open(os.path.join(T, name)))
    p = json.load(open(os.path.join(T, plain)))
    assert list(j.keys()) == list(p.keys()) + ["branches"], (name, list(j.keys()))
    b = j.pop("branches")
    assert j == p, name + ": --branches changed the other figures"
    assert list(b.keys()) == bkeys, (name, list(b.keys()))
    assert b["n"] == n, b
    L = j["layers"]
    dense_window = j["per_layer_policy_mib"] * j["policy_ratio_vs_dense_window"]
    close(b["per_layer_shared_mib"] + b["per_layer_own_mib"], j["per_layer_policy_mib"], name + " shared + own = peak")
    close(b["per_layer_forked_mib"], b["per_layer_shared_mib"] + n * b["per_layer_own_mib"], name + " forked")
    close(b["per_layer_copies_mib"], n * j["per_layer_policy_mib"], name + " copies")
    close(b["per_layer_dense_mib"], n * dense_window, name + " dense")
    close(b["model_forked_mib"], L * b["per_layer_forked_mib"] + n * j["per_layer_view_mib"], name + " model forked")
    close(b["model_copies_mib"], n * j["model_peak_mib"], name + " model copies")
    close(b["model_dense_mib"], n * j["model_dense_mib"], name + " model dense")
    close(b["ratio_vs_copies"], b["model_copies_mib"] / b["model_forked_mib"], name + " ratio vs copies")
    close(b["ratio_vs_dense"], b["model_dense_mib"] / b["model_forked_mib"], name + " ratio vs dense")
    return b
b8 = check("sfb8.json", "sf.json", 8)
enc = 12 * 128 * 128 * 2 + 12 * 4680 + 12 * 4680 * 128 * 2 // 8 + 12 * 4680 * 2 + 12 * 4  # one int2 span, by hand
close(b8["per_layer_shared_mib"], 55 * 2 * enc / MiB, "sf shared: 55 spans")
close(b8["per_layer_own_mib"], 2 * 4680 * 12 * 128 * 4 / MiB, "sf own: 2 raw chunks")
assert b8["ratio_vs_copies"] > 1.0, b8
b1 = check("sfb1.json", "sf.json", 1)
sf = json.load(open(os.path.join(T, "sf.json")))
close(b1["per_layer_forked_mib"], sf["per_layer_policy_mib"], "one branch = the policy peak")
close(b1["model_forked_mib"], sf["model_peak_mib"], "one branch = the model peak")
# Incremental spans with refinement layers: the codebooks and the layers are shared,
# only the current chunk is raw (keep_recent 0).
b3 = check("sf8rb3.json", "sf8r.json", 3)
close(b3["per_layer_own_mib"], 4680 * 12 * 128 * 4 / MiB, "sf8r own: the current chunk")
print("memory --branches figures are consistent")
PY
"$QVG" memory --model self-forcing-1.3b --branches 8 > "$T/sfb8.txt"
for row in "8 branches from one state" "encoded part, held once" "raw part, one per branch" "8 forked branches" \
           "8 copies of the packed cache" "8 dense caches"; do
  grep -q "$row" "$T/sfb8.txt" || fail "branches table: no '$row' row"
done
"$QVG" memory --model self-forcing-1.3b > "$T/sf.txt"
! grep -q "branches from one state" "$T/sf.txt" || fail "the branches section without --branches"

# The table marks assumptions and shows the four figures.
"$QVG" memory --model hy-worldplay-8b > "$T/hy.txt"
grep -q "16 (a) heads" "$T/hy.txt" || fail "table: assumed heads not marked"
for row in "bf16 context" "fully encoded context" "dense cache" "policy peak" "one decoded view" \
           "all 30 layers at once" "packed caches + one shared view" "one view per layer" "engine's default"; do
  grep -q "$row" "$T/hy.txt" || fail "table: no '$row' row"
done
grep -q "990.00 MiB" "$T/hy.txt" || fail "table: HY-WorldPlay bf16 context is not 990 MiB"

# Errors: non-zero exit, one line on stderr.
bad=("--bits 5" "--bits 1" "--bits int8" "--bits x" "--frames 0" "--span-chunks 0" "--centroids 257" "--block-size 48"
     "--keep-recent -1" "--sink-span half" "--scale-dtype fp16" "--scaling odd" "--stages 0"
     "--refine-recent 2" "--span-mode incremental --refine-bits 5" "--span-mode incremental --refine-recent -1"
     "--branches 0" "--branches 1025" "--branches x" "--branches -2")
for flags in "${bad[@]}"; do
  # shellcheck disable=SC2086
  if "$QVG" memory --model self-forcing-1.3b $flags > /dev/null 2> "$T/err.txt"; then fail "accepted $flags"; fi
  [ "$(wc -l < "$T/err.txt")" -eq 1 ] || fail "$flags: stderr not one line: $(cat "$T/err.txt")"
  grep -q "^qvg: error: " "$T/err.txt" || fail "$flags: stderr: $(cat "$T/err.txt")"
done
if "$QVG" memory --model gpt-9 > /dev/null 2> "$T/err.txt"; then fail "accepted an unknown preset"; fi
grep -q "self-forcing-1.3b" "$T/err.txt" || fail "unknown preset: the message does not list the presets"
echo "memory.sh: OK"
