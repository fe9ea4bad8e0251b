"""qvg.distributed — qvg caches under Ulysses sequence parallelism (``torch.distributed``).

With Ulysses sequence parallelism each of N ranks holds a sequence shard of every
layer's q/k/v; an all-to-all turns the sequence shards into head shards before
attention (each rank then sees the whole sequence for H/N heads), and another one
turns the attention output back into sequence shards. Each rank therefore owns a
head shard of every layer's K/V cache: :class:`UlyssesKVCache` is that shard, a
qvg cache of H/N heads whose ``head_offset`` is its first global head, so its
encodings (the codec's random streams are keyed by head) equal those of one cache
holding all H heads, bit for bit. :func:`ulysses_attention` is one layer's step::

    import torch.distributed as dist
    from qvg.distributed import UlyssesKVCache, ulysses_attention

    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60))  # gloo on the CPU
    cache = UlyssesKVCache(batch_size=1, cache_size=8 * chunk, num_heads=H, head_dim=D,
                           dtype=torch.bfloat16, device="cuda", quant_args=QVGKVQuantArgs(bits=2))
    # per layer and denoising step; q, k, v: this rank's sequence shard [B, chunk / N, H, D]
    out = ulysses_attention(q, k, v, cache, current_chunk_start=c)   # [B, chunk / N, H, D]

Collectives are ``torch.distributed``'s (``all_to_all_single``, ``all_gather``) on
the given process group (default: the world): gloo for CPU tensors, NCCL for CUDA
tensors. Tensors travel as their bytes, so the exchange is exact for every dtype.

Agreement and errors: every call first exchanges a few integers (an all-gather)
and checks that the ranks agree on the layout (batch, heads, head_dim, dtype,
sequence shard length) and on ``current_chunk_start``; when they do not, every
rank raises the same ValueError naming each rank's value, instead of entering an
all-to-all with mismatched sizes (a hang or garbage). Heads not divisible by the
number of ranks raise ValueError on every rank at construction. A rank that never
arrives (crashed, or stuck elsewhere) makes the others fail after the process
group's timeout: create it with a timeout (``init_process_group(timeout=...)``).
The check costs one small all-gather per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .torch import CausalAttentionKVView, QVGKVQuantArgs, QVGPackedCausalKVCache

__all__ = ["UlyssesKVCache", "head_shard", "heads_to_seq", "seq_to_heads", "sdpa_attention", "ulysses_attention"]

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _world(group: Any) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("qvg.distributed needs an initialized torch.distributed process group "
                           "(torch.distributed.init_process_group)")
    return dist.get_rank(group), dist.get_world_size(group)


def _collective_device(group: Any, device: torch.device) -> torch.device:
    """Where the agreement check's small tensors go: the CPU for gloo, `device` for NCCL."""
    return device if dist.get_backend(group) == "nccl" else torch.device("cpu")


def _agree(fields: dict[str, int], group: Any, device: torch.device, what: str) -> None:
    """All ranks exchange `fields`; unless every field is equal on every rank, every
    rank raises ValueError naming the fields that differ and each rank's value."""
    _, world = _world(group)
    mine = torch.tensor(list(fields.values()), dtype=torch.int64, device=_collective_device(group, device))
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=group)
    values = [t.tolist() for t in everyone]
    differ = []
    for i, name in enumerate(fields):
        per_rank = [v[i] for v in values]
        if any(x != per_rank[0] for x in per_rank):
            differ.append(f"{name} ({', '.join(f'rank {r}: {x}' for r, x in enumerate(per_rank))})")
    if differ:
        raise ValueError(f"qvg.distributed: the ranks disagree on {what}: {'; '.join(differ)}; every rank must pass "
                         "the same values")


def head_shard(num_heads: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(first_head, heads)`` of rank ``rank``'s shard: heads ``[rank * H / N, (rank + 1) * H / N)``.
    Raises ValueError unless ``world_size`` divides ``num_heads``."""
    if num_heads < 1 or world_size < 1 or num_heads % world_size != 0:
        raise ValueError(f"num_heads must be a positive multiple of the number of ranks {world_size} (each rank "
                         f"holds num_heads / {world_size} heads), got {num_heads}")
    heads = num_heads // world_size
    return rank * heads, heads


def _exchange(x: torch.Tensor, group: Any) -> torch.Tensor:
    """all_to_all_single over dim 0 of a contiguous tensor, moving its bytes."""
    out = torch.empty_like(x)
    dist.all_to_all_single(out.view(torch.uint8), x.view(torch.uint8), group=group)
    return out


def seq_to_heads(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """All-to-all from a sequence shard ``[B, n, H, D]`` (rank r holds tokens
    ``[r * n, (r + 1) * n)`` of the chunk) to this rank's head shard of the whole
    chunk, ``[B, N * n, H / N, D]`` (tokens in global order)."""
    rank, world = _world(group)
    B, n, H, D = x.shape
    _, hs = head_shard(H, world, rank)
    parts = x.reshape(B, n, world, hs, D).permute(2, 0, 1, 3, 4).contiguous()  # [N, B, n, H/N, D]
    got = _exchange(parts, group)  # got[j]: rank j's tokens, this rank's heads
    return got.permute(1, 0, 2, 3, 4).reshape(B, world * n, hs, D)


def heads_to_seq(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The inverse of :func:`seq_to_heads`: ``[B, N * n, H / N, D]`` -> ``[B, n, H, D]``."""
    _, world = _world(group)
    B, T, hs, D = x.shape
    if T % world:
        raise ValueError(f"x tokens (dim 1) must be a multiple of the number of ranks {world}, got {T}")
    n = T // world
    parts = x.reshape(B, world, n, hs, D).permute(1, 0, 2, 3, 4).contiguous()  # [N, B, n, H/N, D]
    got = _exchange(parts, group)  # got[j]: this rank's tokens, rank j's heads
    return got.permute(1, 2, 0, 3, 4).reshape(B, n, world * hs, D)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of q ``[B, n, h, D]`` over the view's k, v ``[B, T, h, D]`` (no mask:
    the view holds exactly the tokens the chunk sees), with
    ``torch.nn.functional.scaled_dot_product_attention``; returns ``[B, n, h, D]``."""
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)


class UlyssesKVCache:
    """This rank's head shard of one layer's K/V cache under Ulysses sequence parallelism.

    Arguments are those of :class:`qvg.torch.QVGPackedCausalKVCache` for the whole
    layer (``num_heads`` = all H heads); the shard holds heads ``[rank * H / N, (rank
    + 1) * H / N)`` of the process group ``group`` (default: the world) with
    ``head_offset`` set accordingly, so that its encodings and views equal those heads
    of a single cache of H heads, bit for bit. The constructor is a collective (every
    rank of the group must call it): the ranks check that they agree on the layout.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        cache_size: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        quant_args: QVGKVQuantArgs | None = None,
        sink_tokens: int = 0,
        attention_window_size: int | None = None,
        group: Any = None,
    ) -> None:
        rank, world = _world(group)
        self.group = group
        self.device = torch.device(device)
        # Agreement first, so that a bad value raises on every rank (never in front of a collective).
        _agree({"batch_size": batch_size, "cache_size": cache_size, "num_heads": num_heads, "head_dim": head_dim,
                "dtype": _DTYPE_CODES.get(dtype, -1), "sink_tokens": sink_tokens,
                "attention_window_size": attention_window_size or 0},
               group, self.device, "the cache layout")
        if dtype not in _DTYPE_CODES:
            raise ValueError(f"dtype must be one of torch.float32, torch.bfloat16, torch.float16, got {dtype}")
        self.head_start, self.local_heads = head_shard(num_heads, world, rank)
        self.num_heads = num_heads
        self.world_size = world
        self.rank = rank
        self.cache = QVGPackedCausalKVCache(
            batch_size=batch_size, cache_size=cache_size, num_heads=self.local_heads, head_dim=head_dim, dtype=dtype,
            device=self.device, global_end_index=torch.zeros(1, dtype=torch.long),
            local_end_index=torch.zeros(1, dtype=torch.long), use_int_indices=True, sink_tokens=sink_tokens,
            attention_window_size=attention_window_size, quant_args=quant_args, head_offset=self.head_start,
        )

    def resident_nbytes(self) -> int:
        """This shard's resident bytes: 1/N of the single cache's (every encoded array is per head)."""
        return self.cache.resident_nbytes()

    def reset_indices(self) -> None:
        self.cache.reset_indices()

    def check_chunk(self, current_chunk_start: int, shard_tokens: int, shape: tuple[int, ...],
                    dtype: torch.dtype) -> None:
        """The collective agreement check of one step (see the module docstring)."""
        B, _, H, D = shape
        _agree({"current_chunk_start": current_chunk_start, "sequence shard tokens": shard_tokens, "batch": B,
                "heads": H, "head_dim": D, "dtype": _DTYPE_CODES.get(dtype, -1)},
               self.group, self.device, "the chunk")
        if H != self.num_heads:
            raise ValueError(f"q/k/v heads (dim 2 of [B, n, H, D]) must be the cache's num_heads {self.num_heads}, "
                             f"got {H}")

    def update_and_get_attention_kv(self, *, key: torch.Tensor, value: torch.Tensor,
                                    current_chunk_start: int) -> CausalAttentionKVView:
        """Writes this rank's head shard of the chunk (``[B, n, H / N, D]``, every token
        of the chunk, e.g. from :func:`seq_to_heads`) and returns the shard's view."""
        return self.cache.update_and_get_attention_kv(key=key, value=value, current_chunk_start=current_chunk_start)


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: UlyssesKVCache,
    *,
    current_chunk_start: int,
    attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = sdpa_attention,
) -> torch.Tensor:
    """One layer's attention step under Ulysses sequence parallelism.

    ``q``, ``k``, ``v``: this rank's sequence shard of the chunk, ``[B, n, H, D]`` (rank r
    holds tokens ``[r * n, (r + 1) * n)`` of the chunk that starts at
    ``current_chunk_start``). Checks that the ranks agree (ValueError on every rank
    otherwise), exchanges q/k/v into head shards, writes k/v into the cache shard,
    runs ``attention(q_heads, view.k, view.v)`` on this rank's heads and exchanges
    the result back: returns ``[B, n, H, D]``. With an ``attention`` whose per-head
    result does not depend on how many heads it is given (a per-head kernel; the
    tests use one), the gathered output equals a single process's with one cache of
    all heads bit for bit: the caches' views are equal bit for bit, the exchanges
    move bytes. (:func:`sdpa_attention` behaved so on the CPU with torch 2.15 in our
    checks, but PyTorch does not promise it.)
    """
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v must have one shape [B, n, H, D], got {list(q.shape)}, {list(k.shape)}, "
                         f"{list(v.shape)}")
    if q.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D [B, n, H, D], got shape {list(q.shape)}")
    cache.check_chunk(current_chunk_start, q.shape[1], tuple(q.shape), q.dtype)
    qh, kh, vh = (seq_to_heads(x, cache.group) for x in (q, k, v))
    view = cache.update_and_get_attention_kv(key=kh, value=vh, current_chunk_start=current_chunk_start)
    return heads_to_seq(attention(qh, view.k, view.v), cache.group)
