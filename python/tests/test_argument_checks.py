"""Argument checks of the Python drop-ins (spec 5.1; docs/reliability.md, "Reliability
III: the Python drop-ins"). Each test failed before its fix:

* a call refused by its shapes takes no memory first, whatever
  the key's strides (a stride-0 expanded key of 16M tokens over 8 bytes of storage
  used to be copied to contiguous memory before "longer than the cache"): a property
  test over random expanded, strided and huge-shaped keys and values, refused calls
  of the dense and packed caches (CPU, and CUDA where the build and a device allow)
  and of encode, measuring the memory each refusal took (the process's peak RSS on
  the CPU, torch's peak allocation on a device);
* the LingBot-World dense repeat probe (update_cache=False at the last
  committed start) checks its chunk as a write would;
* the dense integer cursors are type-checked when set;
* a dense buffer reinterpreted in place is noticed;
* a misspelt setting key with the settings' prefix is refused naming the
  nearest known setting.
"""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch

import qvg.torch as qt
import qvg.vllm_omni as qv
from conftest import index_tensor, make_dense

# ---------------------------------------------------------------------------
# Item 2: shape checks before any copy (a property test over the class)
# ---------------------------------------------------------------------------

MIB = 1 << 20
#: What a refused call may take at most; every case below would copy >= 256 MiB.
REFUSAL_BUDGET = 32 * MIB
CASE_BYTES = 256 * MIB


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


def _reset_peak_rss() -> bool:
    """Resets the process's peak RSS (VmHWM) to its RSS (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status("VmHWM") <= _status("VmRSS") + MIB
    except OSError:
        return False


class _Peak:
    """Memory a block took at its peak beyond what it started with: peak RSS (CPU) or
    torch's peak allocation (CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __enter__(self) -> _Peak:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        else:
            assert _reset_peak_rss()
            self.start = _status("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.taken = torch.cuda.max_memory_allocated(self.device) - self.start
        else:
            self.taken = _status("VmHWM") - self.start


def _devices() -> list:
    out = [pytest.param(torch.device("cpu"), id="cpu")]
    cuda = qt.HAS_CUDA and torch.cuda.is_available()
    out.append(pytest.param(torch.device("cuda"), id="cuda",
                            marks=pytest.mark.skipif(not cuda, reason="no CUDA path or device")))
    return out


def _huge(rng: random.Random, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of `shape` over almost no storage: expanded (stride 0) from one
    element or one token, or strided over one row (as_strided with zero strides)."""
    b, n, h, d = shape
    kind = rng.choice(("expand_one", "expand_token", "as_strided", "transposed_expand"))
    if kind == "expand_one":
        return torch.ones(1, 1, 1, 1, dtype=dtype, device=device).expand(b, n, h, d)
    if kind == "expand_token":
        return torch.randn(1, 1, h, d, device=device).to(dtype).expand(b, n, h, d)
    if kind == "as_strided":
        row = torch.randn(h * d + 1, device=device).to(dtype)
        return row.as_strided((b, n, h, d), (0, 0, d, 1), 1)
    # a permuted view of an expanded tensor: non-contiguous in another way
    return torch.ones(1, 1, 1, 1, dtype=dtype, device=device).expand(b, d, h, n).transpose(1, 3)


def _refused_call(rng: random.Random, device: torch.device) -> tuple:
    """(make cache, kwargs of a call it refuses by its shapes, expected error type, the
    words its message must hold, bytes copying key would take)."""
    dtype = rng.choice((torch.float32, torch.bfloat16, torch.float16))
    esz = torch.tensor([], dtype=dtype).element_size()
    B, S, H, D = rng.choice((1, 2)), rng.choice((16, 64)), rng.choice((1, 2, 4)), rng.choice((8, 16))
    packed = rng.random() < 0.5
    growth = not packed and rng.random() < 0.2

    def make():
        if packed:
            return qt.QVGPackedCausalKVCache(
                batch_size=B, cache_size=S, num_heads=H, head_dim=D, dtype=dtype, device=device,
                global_end_index=index_tensor(), local_end_index=index_tensor(),
                quant_args=qt.QVGKVQuantArgs(bits=rng.choice((None, 2, 4)), block_size=8))
        k = torch.zeros(B, S, H, D, dtype=dtype, device=device)
        return qt.CausalSelfAttentionKVCache(k=k, v=torch.zeros_like(k), global_end_index=index_tensor(),
                                             local_end_index=index_tensor(), allow_growth=growth)

    tokens = max(2 * S, CASE_BYTES // (B * H * D * 2) + 1)  # the key alone is >= CASE_BYTES in any dtype
    small = lambda n=1, h=H, d=D, b=B: torch.zeros(b, n, h, d, dtype=dtype, device=device)  # noqa: E731
    kinds = ["longer", "value_shape", "batch", "head_dim", "heads", "no_head_start", "head_start", "neg_rw",
             "neg_start", "dtype", "value_dtype"]
    if growth:
        kinds = ["grown_too_large", "value_shape", "batch", "neg_rw", "dtype"]
    kind = rng.choice(kinds)
    key_shape = (B, tokens, H, D)
    call = dict(current_chunk_start=0)
    value = None
    if kind == "longer":
        err, words = RuntimeError, ("longer than the cache",)
    elif kind == "grown_too_large":
        key_shape = (B, (1 << 41) // (B * H * D * esz) + 1, H, D)  # its K alone passes 2^40 bytes
        err, words = ValueError, ("cache",)
    elif kind == "value_shape":
        value = small()
        err, words = ValueError, ("value shape must equal key shape",)
    elif kind == "batch":
        key_shape = (B + 1 + rng.randrange(1 << 10), tokens, H, D)
        err, words = ValueError, ("key batch",)
    elif kind == "head_dim":
        key_shape = (B, S, H, CASE_BYTES // (B * S * H * 2) + 8)
        err, words = ValueError, ("key head_dim",)
    elif kind == "heads":
        key_shape = (B, S, CASE_BYTES // (B * S * D * 2) + H + 1, D)
        err, words = ValueError, ("key heads",)
    elif kind == "no_head_start":
        key_shape = (B, CASE_BYTES // (B * D * 2) + 1, 1, D) if H > 1 else key_shape
        err, words = (ValueError, ("cache_head_start",)) if H > 1 else (RuntimeError, ("longer than the cache",))
    elif kind == "head_start":
        call["cache_head_start"] = H + rng.randrange(1, 5)
        err, words = ValueError, ("cache_head_start",)
    elif kind == "neg_rw":
        call["recent_window_tokens"] = -rng.randrange(1, 1 << 20)
        err, words = ValueError, ("recent_window_tokens",)
    elif kind == "neg_start":
        call["current_chunk_start"] = -rng.randrange(1, 1 << 20)
        err, words = ValueError, ("current_chunk_start",)
    elif kind == "dtype":
        other = rng.choice([t for t in (torch.float32, torch.bfloat16, torch.float16) if t != dtype])
        key = _huge(rng, key_shape, other, device)
        return make, dict(call, key=key, value=_huge(rng, key_shape, other, device)), ValueError, \
            ("key dtype",), key.numel() * key.element_size()
    else:  # value_dtype
        other = rng.choice([t for t in (torch.float32, torch.bfloat16, torch.float16) if t != dtype])
        value = _huge(rng, key_shape, other, device)
        err, words = ValueError, ("value dtype",)
    key = _huge(rng, key_shape, dtype, device)
    if value is None:
        value = key if rng.random() < 0.5 else _huge(rng, key_shape, dtype, device)
    return make, dict(call, key=key, value=value), err, words, key.numel() * key.element_size()


@pytest.mark.parametrize("device", _devices())
def test_a_call_refused_by_its_shapes_takes_no_memory(device):
    """The class of refusals by shape, searched: 120 random calls each refused by its shapes (the
    chunk longer than the cache, a grown cache past the limits, batch, heads, head_dim,
    value's shape or dtype, the head slice, recent_window_tokens, the chunk start), with
    keys (and values) of >= 256 MiB over almost no storage, on dense and packed caches:
    each is the spec's typed error naming what is wrong, takes less than 32 MiB, and
    leaves the cache as it was (it then takes a valid chunk)."""
    if device.type == "cpu" and not _reset_peak_rss():
        pytest.skip("/proc/self/clear_refs cannot reset the peak RSS here")
    rng = random.Random(42)
    kinds = set()
    for case in range(120):
        make, call, err, words, would_copy = _refused_call(rng, device)
        assert would_copy >= CASE_BYTES
        cache = make()
        with _Peak(device) as peak:
            with pytest.raises(err) as e:
                cache.update_and_get_attention_kv(**call)
        ctx = (case, tuple(call["key"].shape), call["key"].stride(), str(e.value)[:200])
        assert all(w in str(e.value) for w in words), ctx
        assert peak.taken < REFUSAL_BUDGET, (peak.taken, ctx)
        kinds.add(words[0])
        b, _, h, d = cache.k.shape if isinstance(cache, qt.CausalSelfAttentionKVCache) else (
            cache.batch_size, 0, cache.num_heads, cache.head_dim)
        dtype = cache.k.dtype if isinstance(cache, qt.CausalSelfAttentionKVCache) else cache.dtype
        ok = torch.ones(b, 4, h, d, dtype=dtype, device=device)
        view = cache.update_and_get_attention_kv(key=ok, value=ok, current_chunk_start=0)
        assert view.visible_global_end == 4 and torch.equal(view.k[:, -4:], ok)
    assert len(kinds) >= 10, kinds


def test_an_expanded_key_of_16m_tokens_is_refused_taking_no_memory():
    """Item 2 as reported: an expanded key of 16M tokens over 8 bytes of storage."""
    assert _reset_peak_rss() or pytest.skip("/proc/self/clear_refs cannot reset the peak RSS here")
    cache = make_dense(B=1, S=64, H=1, D=8, dtype=torch.float32)
    key = torch.ones(2).as_strided((1, 1 << 24, 1, 8), (0, 0, 0, 0))  # 16M tokens over two floats
    assert key.untyped_storage().nbytes() == 8
    with _Peak(torch.device("cpu")) as peak:
        with pytest.raises(RuntimeError, match="longer than the cache"):
            cache.update_and_get_attention_kv(key=key, value=key, current_chunk_start=0)
    assert peak.taken < REFUSAL_BUDGET, peak.taken
    key = torch.ones(1, 1, 1, 1).expand(1, 1 << 26, 1, 8)  # where torch's allocator failure named no argument
    with pytest.raises(RuntimeError, match="longer than the cache"):
        cache.update_and_get_attention_kv(key=key, value=key, current_chunk_start=0)


def test_encode_refuses_by_shape_before_copying():
    """encode's shape refusals (head_dim not a multiple of block_size, more than 2^31
    tokens) come before x is copied."""
    assert _reset_peak_rss() or pytest.skip("/proc/self/clear_refs cannot reset the peak RSS here")
    q = qt.QVGKVQuantArgs(bits=4, block_size=64)
    for x, match in ((torch.ones(1, 1, 1, 1).expand(1, 1 << 24, 2, 48), "block_size"),
                     (torch.ones(1, 1, 1, 1).expand(1, (1 << 31) + 1, 1, 64), "too large")):
        with _Peak(torch.device("cpu")) as peak:
            with pytest.raises(ValueError, match=match):
                qt.encode(x, q)
        assert peak.taken < REFUSAL_BUDGET, (peak.taken, match)


# ---------------------------------------------------------------------------
# Item 8: the LingBot-World dense repeat probe checks its chunk
# ---------------------------------------------------------------------------


def _lingbot(quant_args=None, dtype=torch.bfloat16):
    cache = qv.LingBotQVGCache(batch_size=1, max_tokens=12, num_local_heads=2, head_dim=8, device="cpu",
                               dtype=dtype, quant_args=quant_args)
    g = torch.Generator().manual_seed(8)
    for start in (0, 4):  # two committed chunks; the last starts at 4
        k, v = torch.randn(1, 4, 2, 8, generator=g).to(dtype), torch.randn(1, 4, 2, 8, generator=g).to(dtype)
        cache.update(k, v, start, sink_tokens=0, update_cache=True)
    return cache


def _cursors(c):
    return c.end, c.absolute_end, c.last_start, c.sink_end, c._pending


@pytest.mark.parametrize("packed", [False, True])
def test_lingbot_repeat_probe_checks_its_chunk(packed):
    quant = qt.QVGKVQuantArgs(bits=4, block_size=8) if packed else None
    cache = _lingbot(quant)
    before = _cursors(cache)
    good = torch.randn(1, 4, 2, 8).to(torch.bfloat16)
    nan = good.clone()
    nan[0, 1, 1, 3] = float("nan")
    big = good.float()
    big[0, 2, 0, 0] = 3e16
    bad = [
        (nan, good, "key must hold finite values"),
        (good, nan, "value must hold finite values"),
        (big, big, "key dtype"),
        (big.to(torch.bfloat16), good, "key must hold finite values"),
        (good, good[:, :3], "value must have shape"),  # K and V views of different lengths
        (good, good.float(), "value dtype"),
        (good, good.half(), "value dtype"),
        (torch.randn(1, 4, 3, 8).to(torch.bfloat16), torch.randn(1, 4, 3, 8).to(torch.bfloat16), "key must have shape"),
        (torch.randn(2, 4, 2, 8).to(torch.bfloat16), torch.randn(2, 4, 2, 8).to(torch.bfloat16), "key must have shape"),
        (good, "v", "value must be a tensor"),
    ]
    for key, value, match in bad:
        with pytest.raises(ValueError, match=match):
            cache.update(key, value, 4, sink_tokens=0, update_cache=False)
        assert _cursors(cache) == before
    if packed:  # a valid probe there stays the documented refusal
        with pytest.raises(NotImplementedError, match="repeating the last committed start"):
            cache.update(good, good, 4, sink_tokens=0, update_cache=False)
        return
    k, v = cache.update(good, good, 4, sink_tokens=0, update_cache=False)
    assert torch.equal(k[:, -4:], good) and k.shape == v.shape == (1, 8, 2, 8) and _cursors(cache) == before


# ---------------------------------------------------------------------------
# Item 10: dense integer cursors type-checked when set (spec 5.1)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.5, "3", 2**63, -1, True, [1], np.float32(2.0)])
@pytest.mark.parametrize("how", ["attribute", "item"])
def test_dense_int_cursors_are_type_checked(bad, how):
    gen = torch.Generator().manual_seed(10)
    cache = make_dense(S=16, ints=True)
    k = torch.randn(1, 4, 2, 8, generator=gen)
    cache.update_and_get_attention_kv(key=k, value=k, current_chunk_start=0)
    for name in ("global_end_index_int", "local_end_index_int"):
        with pytest.raises(ValueError, match=name):
            if how == "attribute":
                setattr(cache, name, bad)
            else:
                cache[name] = bad
        assert (cache.global_end_index_int, cache.local_end_index_int) == (4, 4)
    cache.global_end_index_int = np.int64(4)  # numpy integers are integers
    out = cache.update_and_get_attention_kv(key=k, value=k, current_chunk_start=4)
    assert out.visible_global_end == 8 and type(cache.global_end_index_int) is int


# ---------------------------------------------------------------------------
# Item 11: a dense buffer reinterpreted in place is noticed
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["k", "v"])
def test_a_buffer_reinterpreted_in_place_is_refused(which):
    k = torch.zeros(1, 16, 2, 8, dtype=torch.bfloat16)
    v = torch.zeros(1, 16, 2, 8, dtype=torch.bfloat16)
    cache = qt.CausalSelfAttentionKVCache(k=k, v=v, global_end_index=index_tensor(), local_end_index=index_tensor())
    x = torch.randn(1, 4, 2, 8).to(torch.bfloat16)
    cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=0)
    buf = k if which == "k" else v
    buf.data = buf.view(torch.float16)  # same storage, same shape, another dtype
    for call in (lambda: cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=4),
                 lambda: cache.update_and_get_attention_kv(key=x.half(), value=x.half(), current_chunk_start=4),
                 lambda: cache.snapshot_bytes()):
        with pytest.raises(ValueError, match="must keep their dtype torch.bfloat16"):
            call()
    buf.data = buf.view(torch.bfloat16)  # put back: the cache works again, nothing changed meanwhile
    out = cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=4)
    assert out.k.dtype == torch.bfloat16 and out.visible_global_end == 8 and torch.equal(out.k[:, 4:], x)


# ---------------------------------------------------------------------------
# Item 15: a misspelt setting is refused naming the nearest one
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("key,nearest", [
    ("kv_cache_quant_centriods", "kv_cache_quant_centroids"),
    ("kv_cache_quant_blocksize", "kv_cache_quant_block_size"),
    ("kv_cache_quant_k_centriods", "kv_cache_quant_k_centroids"),
    ("kv_cache_quant_profiel", "kv_cache_quant_profile"),
    ("kv_cache_quant_seeds", "kv_cache_quant_seed"),
    ("kv_cache_quantization", None),
])
def test_a_misspelt_setting_names_the_nearest(key, nearest):
    with pytest.raises(ValueError, match=f"unknown flag '{key}'") as e:
        qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2", key: "64"})
    if nearest:
        assert f"nearest known setting: {nearest})" in str(e.value)
    # keys outside the prefix, and the engine's own key, stay ignored
    q = qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2", "kv_cache_quant_centroids": "64",
                                     "kv_cache_quant_config": object(), "other_centriods": 3, "num_gpus": 8})
    assert (q.bits, q.centroids) == (2, 64)
    with pytest.raises(ValueError, match="unknown flag"):  # the drop-ins' settings, read the same way
        qt.as_quant_args({"kv_cache_quant": "int2", key: "64"})
