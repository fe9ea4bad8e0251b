"""The engine's own causal DiTs at a tiny size, run on the CPU through its own
denoising stages (python/tests/test_e2e_sglang.py; docs/compat.md section 5).

What is the engine's, unchanged: the models (``CausalWanTransformer3DModel`` of
Self-Forcing, ``LongLive2Transformer3DModel``, ``CausalLingBotWorldTransformer3DModel``),
the stages (``CausalDMDDenoisingStage``, ``LongLive2CausalDenoisingStage``,
``LingBotWorldCausalDMDDenoisingStage`` with its realtime session and interactive K/V
window), the scheduler (``SelfForcingFlowMatchScheduler``), its caches and its
packed cache's codec calls. How it runs on the CPU is the engine's own unit-test
recipe (``tiny_dit_runtime`` of ``sglang/multimodal_gen/test/unit/host_sync_guard.py``
under the ``single_process_model_parallel`` fixture of its ``conftest.py``): SDPA
attention, the reference ``CustomOp`` paths, a single-rank gloo group.

The shims of engine internals (each listed in :data:`SHIMS` and docs/compat.md):

* ``layernorm.fuse_scale_shift_kernel`` -> the engine's own torch fallback
  ``fuse_scale_shift_kernel_native``: the bound kernel imports sgl-kernel, which
  PyPI does not ship for the CPU;
* the engine defect of 0.5.23: ``CausalWanTransformerBlock.forward`` calls
  ``self.attn2(..., crossattn_cache=...)``, which ``WanT2VCrossAttention.forward``
  does not take (TypeError at Self-Forcing's first forward). Each causal Wan
  block's ``attn2`` forwards to the block's own ``_cross_attn_with_cache`` (the
  engine's method that LongLive2's block calls for the same step);
* the engine's packed cache's codec (``qvg_packed_cache._qvg_functions``) ->
  quant-videogen's own quantizer and dequantizer from its source files under
  Triton's interpreter (reference_cpu.py, as the conformance suite runs them),
  the quantizer on the float32 copy of the bf16 segment (the interpreter's bf16
  arithmetic works on raw bit patterns); a segment's dequantization is memoized
  (a pure function of its packed dict: speed only);
* for the packed comparison's float32 rollouts only (``rollout(dtype=float32)``):
  ``CausalDMDDenoisingStage._target_dtype`` (bf16, hard-coded; the LongLive2 and
  LingBot stages inherit it) -> float32, with the model and the compute dtype of
  ``tiny_dit_runtime`` in float32. In bf16 any perturbation of the views moves these
  tiny random-weight models' latents by about 0.0046 (the DiT's roundings
  decorrelate), which hides the codec's share of the deviation.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import torch

SHIMS = (
    "sglang.multimodal_gen.runtime.layers.layernorm.fuse_scale_shift_kernel -> the engine's torch fallback "
    "fuse_scale_shift_kernel_native (the bound kernel needs sgl-kernel, not on PyPI for the CPU)",
    "CausalWanTransformerBlock.attn2 -> the block's own _cross_attn_with_cache (engine defect: attn2 is called "
    "with crossattn_cache=, which WanT2VCrossAttention.forward does not take)",
    "qvg_packed_cache._qvg_functions -> quant-videogen's quantizer/dequantizer under Triton's interpreter "
    "(float32 input, dequantization memoized)",
    "CausalDMDDenoisingStage._target_dtype -> float32 for the packed comparison's float32 rollouts only (the engine "
    "hard-codes bf16; in bf16 these tiny models' latents have a rounding floor of about 0.0046)",
)

H, D, LAYERS = 2, 64, 2  # heads, head_dim, transformer blocks
TEXT_DIM, TEXT_LEN = 32, 8
LATENT_HW = 16  # latent height and width: 8 x 8 patches of (1, 2, 2), 64 tokens a frame
TOKENS_PER_FRAME = (LATENT_HW // 2) ** 2


def _import(name: str):
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


# ---------------------------------------------------------------------------
# The runtime: distributed group, server args, CPU paths
# ---------------------------------------------------------------------------

_RUNTIME: dict[str, Any] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_runtime() -> None:
    """Once per process: the single-rank gloo group of the engine's unit tests."""
    if _RUNTIME:
        return
    ps = _import("sglang.multimodal_gen.runtime.distributed.parallel_state")
    if not ps.model_parallel_is_initialized():
        for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0",
                               WORLD_SIZE="1").items():
            os.environ.setdefault(key, value)
        ps.maybe_init_distributed_environment_and_model_parallel(tp_size=1, sp_size=1)
    _RUNTIME["ok"] = True


#: The precision of the rollout in progress (rollout()'s ``dtype``): the engine's bf16,
#: or float32 for the packed comparison's measurement (module docstring).
_DTYPE = {"now": torch.bfloat16}
#: Which draw of the random inputs (weights, latents, text, noise) a rollout uses: 0 is
#: the test suite's (its seeds unchanged); bench/e2e_draws.py averages the packed
#: comparison over draws 0..N-1, each a different random model and input.
DRAW = {"index": 0}


def draw_seed(base: int) -> int:
    """The seed `base` of the current draw (`base` itself for draw 0)."""
    return base + 1_000_003 * DRAW["index"]


@contextlib.contextmanager
def cpu_paths() -> Iterator[None]:
    """The engine's tiny-DiT recipe plus the torch fallback of fuse_scale_shift_kernel;
    with float32, the causal stages' target dtype too (CausalDMDDenoisingStage hard-codes
    bf16 in ``_target_dtype``; the LongLive2 and LingBot stages inherit it)."""
    from unittest.mock import patch

    guard = _import("sglang.multimodal_gen.test.unit.host_sync_guard")
    layernorm = _import("sglang.multimodal_gen.runtime.layers.layernorm")
    fallback = _import("sglang.kernels.ops.diffusion.common.fallback_torch")
    dtype = _DTYPE["now"]
    with contextlib.ExitStack() as stack:
        stack.enter_context(guard.tiny_dit_runtime(dtype))
        stack.enter_context(patch.object(layernorm, "fuse_scale_shift_kernel", fallback.fuse_scale_shift_kernel_native))
        if dtype != torch.bfloat16:
            causal = _import("sglang.multimodal_gen.runtime.pipelines_core.stages.causal_denoising")
            stack.enter_context(patch.object(causal.CausalDMDDenoisingStage, "_target_dtype", lambda self: dtype))
        yield


@contextlib.contextmanager
def server_args(pipeline_config: Any, quant: Any) -> Iterator[Any]:
    """Global server args for the stages: torch SDPA, the given pipeline config and
    K/V quantization settings (``kv_cache_quant_config``)."""
    sa_mod = _import("sglang.multimodal_gen.runtime.server_args")
    args = SimpleNamespace(
        attention_backend="torch_sdpa", attention_backend_config=None, comfyui_mode=False, disable_autocast=False,
        enable_cfg_parallel=False, enable_breakable_cuda_graph=False, enable_layerwise_nvtx_marker=False,
        enable_torch_compile=False, kv_gather_degree=1, sp_split_auto=False, model_loaded={}, model_paths={},
        pipeline_config=pipeline_config, kv_cache_quant_config=quant)
    previous = sa_mod._global_server_args
    sa_mod.set_global_server_args(args)
    try:
        yield args
    finally:
        sa_mod.set_global_server_args(previous)


def _fix_cross_attention(model: torch.nn.Module) -> None:
    """The engine defect's workaround (module docstring): each causal Wan block's
    attn2 forwards to the block's own _cross_attn_with_cache."""
    causal_wan = _import("sglang.multimodal_gen.runtime.models.dits.causal_wanvideo")

    def attn2_forward(block, hidden_states, context, context_lens=None, crossattn_cache=None):
        return block._cross_attn_with_cache(hidden_states, context, crossattn_cache)

    for block in model.blocks:
        if type(block) is causal_wan.CausalWanTransformerBlock:
            block.attn2.forward = functools.partial(attn2_forward, block)


def engine_defect_reproduces() -> bool:
    """True when WanT2VCrossAttention.forward still lacks ``crossattn_cache`` while
    CausalWanTransformerBlock.forward passes it (the defect the shim works around)."""
    import inspect

    wan = _import("sglang.multimodal_gen.runtime.models.dits.wanvideo")
    causal_wan = _import("sglang.multimodal_gen.runtime.models.dits.causal_wanvideo")
    takes = "crossattn_cache" in inspect.signature(wan.WanT2VCrossAttention.forward).parameters
    passes = "crossattn_cache=crossattn_cache" in inspect.getsource(causal_wan.CausalWanTransformerBlock.forward)
    return passes and not takes


# ---------------------------------------------------------------------------
# The engine's packed cache's codec on the CPU
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def engine_codec_on_cpu(seed: int | None = None) -> Iterator[str]:
    """The engine's packed cache quantizes with quant-videogen (module docstring).

    The reference draws its k-means seeds (``torch.randint``) from torch's global
    generator, in whatever state the stage leaves it. With ``seed``, the i-th
    quantization of the rollout draws them from the global generator seeded with
    ``seed * 1_000_003 + i`` instead, restored afterwards (``torch.random.fork_rng``:
    the stage's own random stream is untouched): one realization of the engine's
    codec per seed, as qvg's ``seed`` setting gives one of qvg's."""
    import reference_cpu

    packed = _import("sglang.multimodal_gen.runtime.layers.kvcache.qvg_packed_cache")
    quantize, dequantize, how = reference_cpu.load()
    memo: dict[int, tuple[dict, torch.Tensor]] = {}
    calls = [0]

    def quantize_f32(x: torch.Tensor, **kwargs: Any) -> dict:
        if seed is None:
            return quantize(x.float(), **kwargs)
        calls[0] += 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1_000_003 + calls[0] - 1)
            return quantize(x.float(), **kwargs)

    def dequantize_memo(p: dict, block_size: int, num_bits: int, output_dtype: Any = torch.bfloat16) -> torch.Tensor:
        hit = memo.get(id(p))
        if hit is None or hit[0] is not p:
            hit = (p, dequantize(p, block_size, num_bits, output_dtype=output_dtype))
            memo[id(p)] = hit
        return hit[1].clone()

    original = packed._qvg_functions
    packed._qvg_functions = lambda: (quantize_f32, dequantize_memo)
    try:
        yield how
    finally:
        packed._qvg_functions = original
        memo.clear()


# ---------------------------------------------------------------------------
# Recording a rollout
# ---------------------------------------------------------------------------


@dataclass
class Rollout:
    """What one rollout produced: the DiT's outputs (every forward), the views the
    caches returned (every call, per layer), the final latents of every chunk, and
    the caches at the end."""

    outputs: list[torch.Tensor] = field(default_factory=list)
    views: list[tuple] = field(default_factory=list)  # (layer, k, v, indices)
    chunks: list[torch.Tensor] = field(default_factory=list)
    caches: list[Any] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)  # (layer, current_chunk_start, n, recent_window_tokens)


def _record_caches(stage: Any, rollout: Rollout) -> Callable[[], None]:
    """Wraps the stage's cache allocation so that the caches it builds record every
    view they return (the cache classes' method is wrapped while the rollout runs:
    the engine's caches have slots). Returns the undo."""
    allocate = stage._allocate_causal_kv_cache
    wrapped: dict[type, Any] = {}
    layers: dict[int, int] = {}

    def wrap(cls: type) -> None:
        if cls in wrapped:
            return
        update = getattr(cls, "update_and_get_attention_kv")
        wrapped[cls] = cls.__dict__.get("update_and_get_attention_kv")

        def recording(self: Any, **kw: Any) -> Any:
            view = update(self, **kw)
            layer = layers.get(id(self))
            if layer is not None:
                rollout.calls.append(dict(layer=layer, start=kw["current_chunk_start"], n=kw["key"].shape[1],
                                          recent=kw.get("recent_window_tokens")))
                rollout.views.append((layer, view.k.clone(), view.v.clone(),
                                      (view.local_start_index, view.local_end_index, view.visible_local_end,
                                       view.visible_global_end)))
            return view

        setattr(cls, "update_and_get_attention_kv", recording)

    def allocating(**kwargs: Any) -> list:
        caches = allocate(**kwargs)
        layers.clear()
        for layer, cache in enumerate(caches):
            layers[id(cache)] = layer
            wrap(type(cache))
        rollout.caches = caches
        return caches

    stage._allocate_causal_kv_cache = allocating

    def undo() -> None:
        stage.__dict__.pop("_allocate_causal_kv_cache", None)
        for cls, own in wrapped.items():
            if own is None:
                delattr(cls, "update_and_get_attention_kv")
            else:
                setattr(cls, "update_and_get_attention_kv", own)

    return undo


def _record_outputs(model: torch.nn.Module, rollout: Rollout) -> Callable[[], None]:
    handle = model.register_forward_hook(lambda _m, _a, out: rollout.outputs.append(out.detach().clone()))
    return handle.remove


# ---------------------------------------------------------------------------
# The three models
# ---------------------------------------------------------------------------


@dataclass
class Case:
    """One model through its stage: how to build it and how to roll it out."""

    name: str
    build_model: Callable[[], torch.nn.Module]
    pipeline_config: Callable[[], Any]
    run: Callable[[Any, Any, Any], list[torch.Tensor]]  # (stage, args, latents) -> chunk latents
    stage_cls: Callable[[], type]
    scheduler: Callable[[], Any]
    frames: int
    chunk_frames: int
    cache_frames: int
    sink_frames: int
    notes: str = ""
    _models: dict = field(default_factory=dict)

    def model(self) -> torch.nn.Module:
        """The model with the fixed random weights, in the rollout's precision (the same
        fp32 draws for both precisions)."""
        dtype = _DTYPE["now"]
        if (dtype, DRAW["index"]) not in self._models:
            with cpu_paths():
                model = self.build_model()
            _random_weights(model, seed=draw_seed(20261204))
            key = (dtype, DRAW["index"])
            self._models[key] = model.to(dtype).eval()
            _fix_cross_attention(self._models[key])
        return self._models[(dtype, DRAW["index"])]


def _random_weights(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn (the engine's parallel linears leave theirs uninitialized:
    torch.empty): matrices normal with std 1/sqrt(fan_in), 1-D weights 1 + N(0, 0.1),
    biases N(0, 0.02), the modulation tables N(0, 1/dim) as the engine draws them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "scale_shift_table" in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            else:
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.1)


def _wan_arch(arch_cls: type, **kw: Any) -> Any:
    return arch_cls(num_attention_heads=H, attention_head_dim=D, out_channels=16, text_dim=TEXT_DIM, freq_dim=32,
                    ffn_dim=256, num_layers=LAYERS, **kw)


def _text_pipeline_config(steps: list[int]) -> Any:
    return SimpleNamespace(
        dit_config=SimpleNamespace(hidden_size=H * D, num_attention_heads=H, attention_head_dim=D, patch_size=(1, 2, 2)),
        dmd_denoising_steps=steps, warp_denoising_step=True, context_noise=0, dit_precision="bfloat16", flow_shift=5.0,
        text_encoder_configs=[SimpleNamespace(arch_config=SimpleNamespace(text_len=TEXT_LEN))])


def _self_forcing_scheduler() -> Any:
    sched = _import("sglang.multimodal_gen.runtime.models.schedulers.scheduling_self_forcing_flow_match")
    return sched.SelfForcingFlowMatchScheduler(num_inference_steps=1000, shift=5.0, sigma_min=0.0,
                                               extra_one_step=True)


def _longlive2_scheduler() -> Any:
    """LongLive2Pipeline.initialize_pipeline's scheduler."""
    sched = _import("sglang.multimodal_gen.runtime.models.schedulers.scheduling_flow_unipc_multistep")
    return sched.FlowUniPCMultistepScheduler(num_train_timesteps=1000, shift=1, use_dynamic_shifting=False)


def _request(**kw: Any) -> Any:
    req_mod = _import("sglang.multimodal_gen.runtime.pipelines_core.schedule_batch")
    sp_mod = _import("sglang.multimodal_gen.configs.sample.sampling_params")
    req = req_mod.Req(sampling_params=sp_mod.SamplingParams(prompt="qvg", guidance_scale=1.0))
    for key, value in kw.items():
        setattr(req, key, value)
    return req


def _run_text_to_video(stage: Any, args: Any, latents: torch.Tensor, chunk_frames: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(draw_seed(7))
    req = _request(latents=latents.clone(), prompt_embeds=[torch.randn(1, TEXT_LEN, TEXT_DIM, generator=g).to(
        _DTYPE["now"])], generator=torch.Generator().manual_seed(draw_seed(11)), negative_prompt_embeds=[],
                   num_inference_steps=4)
    out = stage.forward(req, args).latents
    return [c.clone() for c in out.split(chunk_frames, dim=2)]


def self_forcing() -> Case:
    wan = _import("sglang.multimodal_gen.configs.models.dits.wanvideo")
    model_mod = _import("sglang.multimodal_gen.runtime.models.dits.causal_wanvideo")

    def build() -> torch.nn.Module:
        arch = _wan_arch(wan.WanVideoArchConfig, in_channels=16, num_frames_per_block=3, sliding_window_num_frames=9,
                         local_attn_size=-1, sink_size=0)
        return model_mod.CausalWanTransformer3DModel(wan.WanVideoConfig(arch_config=arch), hf_config={})

    def stage_cls() -> type:
        return _import("sglang.multimodal_gen.runtime.pipelines_core.stages.causal_denoising").CausalDMDDenoisingStage

    return Case("self_forcing", build, lambda: _text_pipeline_config([1000, 750, 500, 250]),
                lambda stage, args, latents: _run_text_to_video(stage, args, latents, 3), stage_cls,
                _self_forcing_scheduler,
                frames=12, chunk_frames=3, cache_frames=9, sink_frames=0,
                notes="CausalWanTransformer3DModel through CausalDMDDenoisingStage (Self-Forcing's)")


def longlive2() -> Case:
    ll2 = _import("sglang.multimodal_gen.configs.models.dits.longlive2")
    model_mod = _import("sglang.multimodal_gen.runtime.models.dits.longlive2")

    def build() -> torch.nn.Module:
        arch = _wan_arch(ll2.LongLive2ArchConfig, in_channels=16, num_frames_per_block=3, sliding_window_num_frames=9,
                         local_attn_size=9, sink_size=3)
        return model_mod.LongLive2Transformer3DModel(ll2.LongLive2VideoConfig(arch_config=arch), hf_config={})

    def stage_cls() -> type:
        return _import("sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages.longlive2"
                       ).LongLive2CausalDenoisingStage

    return Case("longlive2", build, lambda: _text_pipeline_config([1000, 750, 500, 250]),
                lambda stage, args, latents: _run_text_to_video(stage, args, latents, 3), stage_cls,
                _longlive2_scheduler,
                frames=12, chunk_frames=3, cache_frames=9, sink_frames=3,
                notes="LongLive2Transformer3DModel through LongLive2CausalDenoisingStage (single shot: no pinned sink)")


# ---------------------------------------------------------------------------
# Rollouts and their comparison
# ---------------------------------------------------------------------------


def rollout(case: Case, quant: Any, pipeline_config: Any = None, dtype: torch.dtype = torch.bfloat16) -> Rollout:
    """One rollout of ``case`` through its stage with ``kv_cache_quant_config=quant``
    (whatever cache classes the engine's modules hold now), from fixed latents, text
    and noise; ``dtype`` float32 runs the model, its activations and the K/V caches in
    float32 (the stage's target dtype patched, cpu_paths)."""
    init_runtime()
    previous, _DTYPE["now"] = _DTYPE["now"], dtype
    try:
        model = case.model()
        out = Rollout()
        g = torch.Generator().manual_seed(draw_seed(3))
        latents = torch.randn(1, 16, case.frames, LATENT_HW, LATENT_HW, generator=g)
        with cpu_paths(), server_args(pipeline_config or case.pipeline_config(), quant) as args:
            stage = case.stage_cls()(model, case.scheduler())
            undo_caches = _record_caches(stage, out)
            undo_outputs = _record_outputs(model, out)
            try:
                with torch.no_grad():
                    out.chunks = case.run(stage, args, latents)
            finally:
                undo_outputs()
                undo_caches()
    finally:
        _DTYPE["now"] = previous
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    iv = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype]
    return t.contiguous().view(iv)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def first_difference(a: Rollout, b: Rollout) -> str | None:
    """None when the two rollouts are bit-identical (DiT outputs, views with their
    indices, chunk latents, final cache buffers and cursors); else what differs first."""
    if len(a.outputs) != len(b.outputs):
        return f"{len(a.outputs)} vs {len(b.outputs)} DiT forwards"
    for i, (x, y) in enumerate(zip(a.outputs, b.outputs)):
        if not same_bits(x, y):
            return f"DiT output {i}"
    if len(a.views) != len(b.views):
        return f"{len(a.views)} vs {len(b.views)} cache calls"
    for i, (x, y) in enumerate(zip(a.views, b.views)):
        if x[0] != y[0] or not same_bits(x[1], y[1]) or not same_bits(x[2], y[2]) or x[3] != y[3]:
            return f"view {i} (layer {x[0]}, indices {x[3]} vs {y[3]})"
    for i, (x, y) in enumerate(zip(a.chunks, b.chunks)):
        if not same_bits(x, y):
            return f"chunk latents {i}"
    for i, (x, y) in enumerate(zip(a.caches, b.caches)):
        if not (same_bits(x.k, y.k) and same_bits(x.v, y.v)):
            return f"final cache buffers of layer {i}"
        if (x.global_end_index_int, x.local_end_index_int) != (y.global_end_index_int, y.local_end_index_int) or not (
                torch.equal(x.global_end_index, y.global_end_index) and torch.equal(x.local_end_index,
                                                                                     y.local_end_index)):
            return f"final cursors of layer {i}"
    return None


def relative_l2_per_chunk(a: Rollout, reference: Rollout) -> list[float]:
    """||a - ref|| / ||ref|| of each chunk's final latents (float64)."""
    out = []
    for x, r in zip(a.chunks, reference.chunks):
        x, r = x.double(), r.double()
        out.append(float((x - r).norm() / r.norm()))
    return out


def view_error(a: Rollout, reference: Rollout) -> float:
    """Relative L2 error of all of ``a``'s views (K and V together) against the
    reference rollout's views of the same calls, where their shapes agree."""
    num = den = 0.0
    for x, r in zip(a.views, reference.views):
        for i in (1, 2):
            if x[i].shape == r[i].shape:
                num += float((x[i].double() - r[i].double()).pow(2).sum())
                den += float(r[i].double().pow(2).sum())
    return (num / den) ** 0.5 if den else 0.0


# ---------------------------------------------------------------------------
# LingBot-World: realtime chunks with the interactive K/V window
# ---------------------------------------------------------------------------

#: Camera actions per chunk (a chunk with any action moves the camera): two moving
#: chunks, then still ones; after ``interactive_kv_still_chunks`` still chunks the stage
#: narrows recent_window_tokens from the moving window to the still window.
LINGBOT_ACTIONS = ([["w"], ["w"], []], [["a"], [], []], [[], [], []], [[], [], []])


LINGBOT_WINDOWS = dict(sink=3, cache=6, moving=3, still=1, still_chunks=1)  # frames


def lingbot_actions(chunk: int) -> list:
    """The camera actions of a chunk: LINGBOT_ACTIONS, then still ones (longer rollouts)."""
    return LINGBOT_ACTIONS[chunk] if chunk < len(LINGBOT_ACTIONS) else [[], [], []]


def _lingbot_pipeline_config() -> Any:
    """The engine's LingBotWorldCausalDMDConfig with the interactive K/V window on, at
    the tiny model's size."""
    pc_mod = _import("sglang.multimodal_gen.configs.pipeline_configs.lingbot_world")
    dit = _import("sglang.multimodal_gen.configs.models.dits.lingbot_world")
    w = LINGBOT_WINDOWS
    pc = pc_mod.LingBotWorldCausalDMDConfig()
    pc.dit_config = dit.LingBotWorldVideoConfig(arch_config=_lingbot_arch())
    pc.interactive_kv_window_enable = True
    pc.interactive_kv_moving_window = w["moving"]
    pc.interactive_kv_still_window = w["still"]
    pc.interactive_kv_still_chunks = w["still_chunks"]
    pc.text_encoder_configs[0].arch_config.text_len = TEXT_LEN
    return pc


def _lingbot_arch() -> Any:
    dit = _import("sglang.multimodal_gen.configs.models.dits.lingbot_world")
    w = LINGBOT_WINDOWS
    return _wan_arch(dit.LingBotWorldArchConfig, in_channels=36, num_frames_per_block=3,
                     sliding_window_num_frames=w["cache"], local_attn_size=-1, sink_size=w["sink"])


def _lingbot_run(stage: Any, args: Any, latents: torch.Tensor) -> list[torch.Tensor]:
    """The realtime path: one stage call per chunk in one session, each chunk's
    timesteps prepared by the engine's DMDTimestepPreparationStage."""
    ts_mod = _import("sglang.multimodal_gen.runtime.pipelines_core.stages.timestep_preparation")
    session_mod = _import("sglang.multimodal_gen.runtime.realtime.session")
    session = session_mod.RealtimeSession()
    g = torch.Generator().manual_seed(draw_seed(7))
    prompt = torch.randn(1, TEXT_LEN, TEXT_DIM, generator=g).to(_DTYPE["now"])
    condition = torch.randn(1, 20, latents.shape[2], LATENT_HW, LATENT_HW, generator=g)
    noise = torch.Generator().manual_seed(draw_seed(11))
    timesteps = ts_mod.DMDTimestepPreparationStage(_lingbot_scheduler(args))
    out = []
    for i, chunk in enumerate(latents.split(3, dim=2)):
        req = _request(latents=chunk.clone(), image_latent=condition, prompt_embeds=[prompt], image_embeds=[],
                       session=session, block_idx=i, condition_inputs={"camera_actions": lingbot_actions(i)},
                       generator=noise, negative_prompt_embeds=[])
        req = timesteps.forward(req, args)
        out.append(stage.forward(req, args).latents.clone())
    session.dispose()
    return out


def _lingbot_scheduler(args: Any = None) -> Any:
    """LingBotWorldCausalDMDPipeline.initialize_pipeline's scheduler."""
    sched = _import("sglang.multimodal_gen.runtime.models.schedulers.scheduling_self_forcing_flow_match")
    shift = args.pipeline_config.flow_shift if args is not None else 10.0
    return sched.SelfForcingFlowMatchScheduler(num_inference_steps=1000, shift=shift, sigma_min=0.0,
                                               extra_one_step=True)


def lingbot_world() -> Case:
    dit = _import("sglang.multimodal_gen.configs.models.dits.lingbot_world")
    model_mod = _import("sglang.multimodal_gen.runtime.models.dits.lingbot_world")

    def build() -> torch.nn.Module:
        model = model_mod.CausalLingBotWorldTransformer3DModel(dit.LingBotWorldVideoConfig(arch_config=_lingbot_arch()),
                                                               hf_config={})
        return model

    def stage_cls() -> type:
        return _import("sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages.lingbot_world."
                       "lingbot_world_causal_denoising").LingBotWorldCausalDMDDenoisingStage

    w = LINGBOT_WINDOWS
    cache = max(w["cache"], w["sink"] + max(w["moving"], w["still"]) + 3)  # the stage's effective window
    return Case("lingbot_world", build, _lingbot_pipeline_config, _lingbot_run, stage_cls, _lingbot_scheduler,
                frames=12, chunk_frames=3, cache_frames=cache, sink_frames=w["sink"],
                notes="CausalLingBotWorldTransformer3DModel through LingBotWorldCausalDMDDenoisingStage's realtime path "
                      "with the interactive K/V window")
