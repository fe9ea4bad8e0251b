#!/usr/bin/env python3
"""The engine's step with each K/V cache inside, side by side (issue 37; docs/cuda.md,
docs/performance.md).

A model of Self-Forcing's shapes (Wan 1.3B: 30 blocks, 12 heads of 128, chunks of 3
latent frames of 1,560 tokens, a 21-frame K/V window) driven as the engine's causal
DMD stage drives its DiT: per chunk, every denoising step (4, the first an advance of
the cache, the others rewrites of the chunk) and then the cache-writing pass on the
clean chunk; chunks until the window is full and has rolled. The model is a stack of
transformer blocks written with PyTorch ops (LayerNorm, a fused QKV projection with
RMS norms on q and k, attention through ``scaled_dot_product_attention`` over the
cache's view, output projection, GELU MLP of 8,960), random weights, bf16: the engine's
own ``CausalWanTransformer3DModel`` needs the whole SGLang serving stack, which the
device image lacks (RoPE, the time modulation and cross-attention are left out: they do
not touch the cache). The output says so (``model``).

Configurations, on the same weights and inputs, each with caches built fresh:
  dense_engine     the engine's CausalSelfAttentionKVCache (python/gpu/engineload.py)
  dense_qvg        qvg.torch.CausalSelfAttentionKVCache (must equal dense_engine bit for bit)
  engine_packed    the engine's QVGPackedCausalKVCache: quant-videogen's Triton kernels on a
                   GPU (python/gpu/refload.py); on the CPU the compat suite's interpreter
                   path (python/tests/reference_cpu.py) — the rehearsal only
  qvg_engine       qvg.torch.QVGPackedCausalKVCache with the engine's settings
  qvg_recommended  qvg's recommended profile
(the packed ones at ``--bits``, default 2). Per configuration: the median time per chunk
(all its steps and the cache-writing pass; chunks after the first), the median time of
one layer's cache call, torch.cuda.max_memory_allocated over the run (None on the CPU),
the K/V bytes resident at the end (every layer), and the final latents' relative L2
deviation from dense_engine. Timings are ratios to dense measured in the same run.

Usage: bench/step_bench.py [--device cuda|cpu] [--size full|tiny] [--bits 2] [--chunks N]
       [--configs a,b,...] [--budget-s 150] [--out FILE]
The test command runs ``--device cpu --size tiny`` (python/tests/test_step_bench.py);
scripts/gpu-check's part 2 runs ``--device cuda --size full`` within its budget.
Writes the JSON after every configuration (``"complete": false`` until the end); a
configuration that raises is listed under ``failed`` with its error and the others run;
exit status 1 unless every configuration ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "gpu"))

SIZES = {
    # Self-Forcing (Wan 1.3B): 30 blocks, 12 x 128, 1,560 tokens a latent frame, chunks of 3
    # frames, the 21-frame window of its cache (kv_cache_size 32,760), no sink.
    "full": dict(layers=30, heads=12, head_dim=128, ffn=8960, tokens_per_frame=1560, chunk_frames=3,
                 window_frames=21, sink_frames=0, chunks=9, centroids=None),
    # The rehearsal: every code path at a size the CPU runs in seconds; 16 centroids for
    # every packed configuration (the defaults' 128 would hold a 96-token chunk exactly).
    "tiny": dict(layers=2, heads=2, head_dim=64, ffn=256, tokens_per_frame=32, chunk_frames=3, window_frames=9,
                 sink_frames=0, chunks=5, centroids=16),
}
DENOISING_TIMESTEPS = (1000, 750, 500, 250)  # Self-Forcing's dmd_denoising_steps
SHIFT = 5.0
CONFIGS = ("dense_engine", "dense_qvg", "engine_packed", "qvg_engine", "qvg_recommended")


def sigma_of(t: float) -> float:
    s = t / 1000.0
    return SHIFT * s / (1 + (SHIFT - 1) * s)


# ---------------------------------------------------------------------------
# The model: blocks of Wan's shapes, attention over the cache's view
# ---------------------------------------------------------------------------


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.q_norm = torch.nn.RMSNorm(dim, eps=1e-6)
        self.k_norm = torch.nn.RMSNorm(dim, eps=1e-6)
        self.out = torch.nn.Linear(dim, dim)
        self.ffn1 = torch.nn.Linear(dim, ffn)
        self.ffn2 = torch.nn.Linear(ffn, dim)

    def forward(self, x: torch.Tensor, cache: Any, start: int) -> torch.Tensor:
        b, n, c = x.shape
        h = F.layer_norm(x, (c,), eps=1e-6)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        q = self.q_norm(q).view(b, n, self.heads, -1)
        k = self.k_norm(k).view(b, n, self.heads, -1)
        v = v.reshape(b, n, self.heads, -1)
        view = cache.update_and_get_attention_kv(key=k, value=v, current_chunk_start=start)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), view.k.transpose(1, 2), view.v.transpose(1, 2))
        x = x + self.out(a.transpose(1, 2).reshape(b, n, c))
        return x + self.ffn2(F.gelu(self.ffn1(F.layer_norm(x, (c,), eps=1e-6)), approximate="tanh"))


class Model(torch.nn.Module):
    def __init__(self, s: dict) -> None:
        super().__init__()
        dim = s["heads"] * s["head_dim"]
        self.dim = dim
        self.time = torch.nn.Linear(1, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, s["heads"], s["ffn"]) for _ in range(s["layers"]))
        self.head = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, sigma: float, caches: list, start: int) -> torch.Tensor:
        x = x + self.time(torch.full((1, 1, 1), sigma, dtype=x.dtype, device=x.device))
        for block, cache in zip(self.blocks, caches):
            x = block(x, cache, start)
        return self.head(x)


def random_model(s: dict, device: torch.device) -> Model:
    """The model's random weights, drawn on `device` (1.1 G parameters at full size)."""
    torch.manual_seed(20261206)
    with torch.device(device):
        model = Model(s)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 1 / math.sqrt(p.shape[1]))
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02)
    return model.to(device=device, dtype=torch.bfloat16).eval()


# ---------------------------------------------------------------------------
# The caches
# ---------------------------------------------------------------------------


class Timed:
    """A cache whose update_and_get_attention_kv is timed (CUDA events on a GPU), into a
    record the layers' caches share."""

    def __init__(self, cache: Any, device: torch.device, record: list) -> None:
        self.cache, self.device, self.record = cache, device, record

    def update_and_get_attention_kv(self, **kw: Any) -> Any:
        if self.device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            view = self.cache.update_and_get_attention_kv(**kw)
            b.record()
            self.record.append((a, b))
        else:
            t0 = time.perf_counter()
            view = self.cache.update_and_get_attention_kv(**kw)
            self.record.append(time.perf_counter() - t0)
        return view

    def seconds(self) -> list[float]:
        return [x if isinstance(x, float) else x[0].elapsed_time(x[1]) / 1000 for x in self.record]


def qvg_quant(profile: str | None, bits: int, centroids: int | None) -> Any:
    import qvg.torch as qt

    flags = {"kv_cache_quant": f"int{bits}"}
    if profile:
        flags["kv_cache_quant_profile"] = profile
    if centroids:
        flags["kv_cache_quant_centroids"] = centroids
    return qt.QVGKVQuantArgs.from_dict(flags)


def make_caches(config: str, s: dict, device: torch.device, engine: Any, bits: int) -> list:
    import qvg.torch as qt

    cache_tokens = s["window_frames"] * s["tokens_per_frame"]
    sink = s["sink_frames"] * s["tokens_per_frame"]
    shape = (1, cache_tokens, s["heads"], s["head_dim"])
    out = []
    for _ in range(s["layers"]):
        idx = dict(global_end_index=torch.zeros(1, dtype=torch.long, device=device),
                   local_end_index=torch.zeros(1, dtype=torch.long, device=device))
        if config in ("dense_engine", "dense_qvg"):
            cls = engine.CausalSelfAttentionKVCache if config == "dense_engine" else qt.CausalSelfAttentionKVCache
            k = torch.zeros(shape, dtype=torch.bfloat16, device=device)
            out.append(cls(k=k, v=torch.zeros_like(k), sink_tokens=sink, **idx))
        elif config == "engine_packed":
            q = engine.QVGKVQuantArgs(bits=bits, **({"centroids": s["centroids"]} if s["centroids"] else {}))
            out.append(engine.QVGPackedCausalKVCache(batch_size=1, cache_size=cache_tokens, num_heads=s["heads"],
                                                     head_dim=s["head_dim"], dtype=torch.bfloat16, device=device,
                                                     sink_tokens=sink, quant_args=q, **idx))
        else:
            q = qvg_quant(None if config == "qvg_engine" else "recommended", bits, s["centroids"])
            out.append(qt.QVGPackedCausalKVCache(batch_size=1, cache_size=cache_tokens, num_heads=s["heads"],
                                                 head_dim=s["head_dim"], dtype=torch.bfloat16, device=device,
                                                 sink_tokens=sink, quant_args=q, **idx))
    return out


@contextlib.contextmanager
def engine_codec(engine: Any, device: torch.device):
    """The engine's packed cache's codec: quant-videogen's Triton kernels (the shipped
    wheel, python/gpu/refload.py) on a GPU; on the CPU the compat suite's interpreter
    path (python/tests/reference_cpu.py, the quantizer on float32 copies)."""
    if device.type == "cuda":
        import refload

        refload.load_reference()
        yield "quant-videogen Triton kernels"
        return
    sys.path.insert(0, str(ROOT / "python" / "tests"))
    import reference_cpu

    quantize, dequantize, how = reference_cpu.load()
    original = engine.packed_module._qvg_functions
    engine.packed_module._qvg_functions = lambda: (lambda x, **kw: quantize(x.float(), **kw), dequantize)
    try:
        yield f"quant-videogen under Triton's interpreter ({how})"
    finally:
        engine.packed_module._qvg_functions = original


def resident(caches: list) -> int:
    """K/V bytes the caches hold (the engine's dense cache has no resident_nbytes: its
    two buffers; a packed branch's shared bytes counted too)."""
    n = 0
    for c in caches:
        if not hasattr(c, "resident_nbytes"):
            n += c.k.nbytes + c.v.nbytes
            continue
        n += c.resident_nbytes()
        shared = getattr(c, "shared_nbytes", None)
        n += shared() if shared is not None else 0
    return n


# ---------------------------------------------------------------------------
# One configuration: the rollout
# ---------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rollout(model: Model, caches: list, s: dict, chunks: int, device: torch.device) -> tuple[list, list]:
    """The engine's loop: per chunk, the denoising steps then the cache-writing pass.
    Returns (final latents per chunk, seconds per chunk)."""
    n = s["tokens_per_frame"] * s["chunk_frames"]
    sigmas = [sigma_of(t) for t in DENOISING_TIMESTEPS]
    latents, times = [], []
    for c in range(chunks):
        g = torch.Generator().manual_seed(1000 + c)
        noise = [torch.randn(1, n, model.dim, generator=g).to(device=device, dtype=torch.bfloat16)
                 for _ in range(len(sigmas))]
        sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            x = noise[0]
            for j, sigma in enumerate(sigmas):
                pred = model(x, sigma, caches, c * n)
                if j + 1 < len(sigmas):
                    x = (1 - sigmas[j + 1]) * pred + sigmas[j + 1] * noise[j + 1]
            model(pred, 0.0, caches, c * n)  # the cache-writing pass (context noise 0)
        sync(device)
        times.append(time.perf_counter() - t0)
        latents.append(pred.float().cpu())
    return latents, times


def rel_l2(a: list, b: list) -> float:
    num = sum(float((x.double() - y.double()).pow(2).sum()) for x, y in zip(a, b))
    den = sum(float(y.double().pow(2).sum()) for y in b)
    return math.sqrt(num / den) if den else 0.0


def run_config(config: str, model: Model, s: dict, chunks: int, device: torch.device, engine: Any,
               bits: int) -> dict:
    record: list = []
    raw = make_caches(config, s, device, engine, bits)
    caches = [Timed(c, device, record) for c in raw]
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    ctx = engine_codec(engine, device) if config == "engine_packed" else contextlib.nullcontext("")
    with ctx as codec:
        latents, times = rollout(model, caches, s, chunks, device)
    calls = caches[0].seconds()  # every layer's calls: the caches share one record
    return dict(name=config, cache=f"{type(raw[0]).__module__}.{type(raw[0]).__name__}", codec=codec or None,
                time_per_chunk_s=statistics.median(times[1:] if len(times) > 1 else times),
                times_per_chunk_s=times, cache_call_median_s=statistics.median(calls), cache_calls=len(calls),
                cache_time_per_chunk_s=sum(calls) / len(times),
                max_memory_allocated=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
                kv_resident_bytes=resident(raw), _latents=latents)


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def write(out: Path | None, doc: dict) -> None:
    if out is None:
        return
    clean = dict(doc, configs=[{k: v for k, v in c.items() if not k.startswith("_")} for c in doc["configs"]])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(clean, indent=2) + "\n")
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--size", default="full", choices=sorted(SIZES))
    ap.add_argument("--bits", type=int, default=2, choices=[2, 4])
    ap.add_argument("--chunks", type=int, default=None, help="chunks per configuration (default: the size's)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="stop before a configuration that would end past this many seconds (its estimate: the "
                         "slowest one so far)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("step_bench: --device cuda but torch.cuda.is_available() is False")
    s = SIZES[a.size]
    chunks = a.chunks or s["chunks"]
    configs = [c for c in a.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"step_bench: unknown configuration(s) {unknown}; known: {list(CONFIGS)}")
    import engineload
    import qvg.torch  # noqa: F401  (the extension, before any timing)

    engine = engineload.load_engine_caches()
    model = random_model(s, device)
    doc: dict[str, Any] = dict(
        schema=1, complete=False, device=str(device),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        model=("a stack of transformer blocks of Self-Forcing's shapes written with PyTorch ops, attention "
               "through scaled_dot_product_attention over the cache's view (not the engine's own DiT: it needs "
               "the SGLang serving stack)"),
        size=a.size, shapes=dict(s, chunks=chunks), bits=a.bits, denoising_timesteps=list(DENOISING_TIMESTEPS),
        engine_caches=engine.source, torch=torch.__version__, budget_s=a.budget_s, configs=[], skipped=[],
        failed=[])
    # Warm-up (not timed, inside the budget): CUDA context, cuBLAS and SDPA kernels, on one
    # dense chunk; the engine's Triton kernels compiled and autotuned on the chunk's shape
    # (one layer's engine cache, three advances: one encode).
    warm = make_caches("dense_qvg", s, device, engine, a.bits)
    rollout(model, warm, s, 1, device)
    del warm
    if "engine_packed" in configs:
        t0 = time.perf_counter()
        one = dict(s, layers=1)
        n = s["tokens_per_frame"] * s["chunk_frames"]
        with engine_codec(engine, device):
            cache = make_caches("engine_packed", one, device, engine, a.bits)[0]
            for c in range(3):
                kv = torch.randn(2, 1, n, s["heads"], s["head_dim"], device=device).to(torch.bfloat16)
                cache.update_and_get_attention_kv(key=kv[0], value=kv[1], current_chunk_start=c * n)
            sync(device)
        doc["engine_codec_warmup_s"] = time.perf_counter() - t0
    slowest = 0.0
    for config in configs:
        spent = time.perf_counter() - t_start
        if doc["configs"] and spent + slowest > a.budget_s:
            doc["skipped"].append(dict(name=config, reason=f"budget: {spent:.0f} s spent, the slowest configuration "
                                       f"took {slowest:.0f} s, budget {a.budget_s:.0f} s"))
            continue
        t0 = time.perf_counter()
        try:
            doc["configs"].append(run_config(config, model, s, chunks, device, engine, a.bits))
        except Exception as e:  # noqa: BLE001 - one configuration's failure is reported, the others run
            doc["failed"].append(dict(name=config, error=f"{type(e).__name__}: {e}"))
            if device.type == "cuda":
                torch.cuda.empty_cache()
        slowest = max(slowest, time.perf_counter() - t0)
        write(a.out, doc)
    by = {c["name"]: c for c in doc["configs"]}
    ref = by.get("dense_engine") or by.get("dense_qvg")
    for c in doc["configs"]:
        if ref is not None:
            c["latent_rel_l2_vs_dense"] = rel_l2(c["_latents"], ref["_latents"])
            c["time_ratio_vs_dense"] = c["time_per_chunk_s"] / ref["time_per_chunk_s"]
            if ref["max_memory_allocated"]:
                c["peak_ratio_vs_dense"] = c["max_memory_allocated"] / ref["max_memory_allocated"]
    checks: dict[str, Any] = {}
    if "dense_engine" in by and "dense_qvg" in by:
        checks["dense_qvg_equals_dense_engine"] = all(
            torch.equal(x, y) for x, y in zip(by["dense_qvg"]["_latents"], by["dense_engine"]["_latents"]))
    ep, qr = by.get("engine_packed"), by.get("qvg_recommended")
    if ep and qr:
        checks["qvg_recommended_time_vs_engine_packed"] = qr["time_per_chunk_s"] / ep["time_per_chunk_s"]
        checks["qvg_recommended_deviation_vs_engine_packed"] = (
            qr["latent_rel_l2_vs_dense"] / ep["latent_rel_l2_vs_dense"] if ep.get("latent_rel_l2_vs_dense") else None)
        if ep["max_memory_allocated"]:
            checks["qvg_recommended_peak_vs_engine_packed"] = qr["max_memory_allocated"] / ep["max_memory_allocated"]
    doc["checks"] = checks
    doc["elapsed_s"] = time.perf_counter() - t_start
    doc["complete"] = not doc["skipped"] and not doc["failed"]
    write(a.out, doc)
    return doc


def table(doc: dict) -> str:
    rows = [f"step_bench on {doc['device_name']} ({doc['size']}), {doc['model'].split(',')[0]}"]
    rows.append(f"{'configuration':<17} {'s/chunk':>9} {'x dense':>8} {'cache call':>11} {'peak MiB':>9} "
                f"{'K/V MiB':>8} {'latent dev':>10}")
    for c in doc["configs"]:
        peak = c["max_memory_allocated"]
        rows.append(f"{c['name']:<17} {c['time_per_chunk_s']:>9.4f} {c.get('time_ratio_vs_dense', float('nan')):>8.3f} "
                    f"{c['cache_call_median_s'] * 1e3:>9.3f}ms {peak / 2**20 if peak else float('nan'):>9.1f} "
                    f"{c['kv_resident_bytes'] / 2**20:>8.2f} {c.get('latent_rel_l2_vs_dense', float('nan')):>10.5f}")
    for sk in doc["skipped"]:
        rows.append(f"{sk['name']:<17} skipped: {sk['reason']}")
    for f in doc["failed"]:
        rows.append(f"{f['name']:<17} FAILED: {f['error']}")
    rows.append(f"checks: {json.dumps(doc['checks'])}; {doc['elapsed_s']:.1f} s")
    return "\n".join(rows)


if __name__ == "__main__":
    result = main()
    print(table(result))
    sys.exit(0 if result["complete"] else 1)
