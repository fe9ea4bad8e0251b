"""Ulysses sequence parallelism with qvg's packed cache: a toy attention layer over N ranks.

Run with torchrun (gloo on the CPU, NCCL with --device cuda, one GPU per rank):

    torchrun --standalone --nproc-per-node 2 python/examples/ulysses.py
    torchrun --standalone --nproc-per-node 4 python/examples/ulysses.py --device cuda --chunks 8

Each rank holds a sequence shard of every chunk's q/k/v (CHUNK / N tokens), as a
sequence-parallel transformer block would. ulysses_attention exchanges them into
head shards, writes k/v into this rank's head shard of the layer's int2 cache
(head_offset = rank * H / N) and attends over the cache's view; rank 0 then checks
the gathered output against a single cache of all heads and prints the memory.
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist

from qvg.distributed import UlyssesKVCache, ulysses_attention
from qvg.torch import QVGKVQuantArgs, QVGPackedCausalKVCache


def per_head_attention(q, k, v):
    """Attention per head (fp32 inside): its result for a head depends on that head only."""
    out = []
    for h in range(q.shape[2]):
        qh, kh, vh = (t[:, :, h].float() for t in (q, k, v))
        p = torch.softmax(qh @ kh.transpose(1, 2) / qh.shape[-1] ** 0.5, dim=-1)
        out.append((p @ vh).to(q.dtype))
    return torch.stack(out, dim=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=48, help="tokens per chunk (a multiple of the number of ranks)")
    args = ap.parse_args()

    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0))) if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(device)
    B, H, D, chunk = 1, args.heads, 64, args.chunk
    quant = QVGKVQuantArgs(bits=2, centroids=16, block_size=32)
    cache = UlyssesKVCache(batch_size=B, cache_size=4 * chunk, num_heads=H, head_dim=D, dtype=torch.bfloat16,
                           device=device, quant_args=quant, sink_tokens=chunk)
    reference = None
    if rank == 0:  # one cache of all heads, to compare with
        reference = QVGPackedCausalKVCache(
            batch_size=B, cache_size=4 * chunk, num_heads=H, head_dim=D, dtype=torch.bfloat16, device=device,
            global_end_index=torch.zeros(1, dtype=torch.long), local_end_index=torch.zeros(1, dtype=torch.long),
            sink_tokens=chunk, quant_args=quant)
    n = chunk // world
    equal = True
    for c in range(args.chunks):
        g = torch.Generator().manual_seed(c)
        q, k, v = (t.to(torch.bfloat16).to(device) for t in torch.randn(3, B, chunk, H, D, generator=g))
        mine = slice(rank * n, (rank + 1) * n)
        out = ulysses_attention(q[:, mine], k[:, mine], v[:, mine], cache, current_chunk_start=c * chunk,
                                attention=per_head_attention)
        gathered = [torch.empty_like(out) for _ in range(world)]
        dist.all_gather(gathered, out)
        if reference is not None:
            view = reference.update_and_get_attention_kv(key=k, value=v, current_chunk_start=c * chunk)
            equal &= torch.equal(torch.cat(gathered, dim=1), per_head_attention(q, view.k, view.v))
    resident = torch.tensor([cache.resident_nbytes()], device=device if backend == "nccl" else "cpu")
    all_resident = [torch.empty_like(resident) for _ in range(world)]
    dist.all_gather(all_resident, resident)
    if rank == 0:
        print(f"{world} ranks, {H} heads ({H // world} per rank), {args.chunks} chunks of {chunk} tokens, int2: "
              f"gathered output equals one cache of all heads bit for bit: {equal}; resident bytes per rank "
              f"{[int(x) for x in all_resident]}, one cache {reference.resident_nbytes()}")
    dist.destroy_process_group()
    if rank == 0 and not equal:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
