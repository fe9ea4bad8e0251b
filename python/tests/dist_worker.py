"""One rank of the multi-rank tests (test_distributed.py), started as a process:

    python dist_worker.py RANK WORLD STORE_FILE OUT_DIR

Joins a gloo process group (file store, 30 s timeout), runs the scenario of
dist_common with quantization off and at int2 through qvg.distributed, then the
bad layouts, and saves what it saw to OUT_DIR/rank<RANK>.pt."""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist

import dist_common as dc
from qvg.distributed import UlyssesKVCache, ulysses_attention


def caught(fn) -> tuple[str, str] | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test compares type and message
        return type(e).__name__, str(e)
    return None


def make_cache(quant: str, num_heads: int = dc.H) -> UlyssesKVCache:
    return UlyssesKVCache(batch_size=dc.B, cache_size=dc.CACHE, num_heads=num_heads, head_dim=dc.D, dtype=dc.DTYPE,
                          device="cpu", quant_args=dc.quant_args(quant), sink_tokens=dc.SINK)


def main() -> None:
    rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    n = dc.CHUNK // world
    mine = slice(rank * n, (rank + 1) * n)  # this rank's sequence shard of every chunk
    result: dict = {}
    for quant in dc.QUANTS:
        cache = make_cache(quant)
        outs = []
        for start, step in dc.steps():
            q, k, v = (t[:, mine] for t in dc.qkv(start, step))
            outs.append(ulysses_attention(q, k, v, cache, current_chunk_start=start, attention=dc.attention))
        result[quant] = {"outs": outs, "resident": cache.resident_nbytes(), "head_start": cache.head_start}

    # Bad layouts: an error on every rank, and the group still works afterwards.
    bad_heads = dc.H + 1  # 9: divisible by neither 2 nor 4 ranks
    result["bad_heads"] = (bad_heads, caught(lambda: make_cache("off", bad_heads)))
    result["bad_dtype_rank"] = caught(lambda: UlyssesKVCache(
        batch_size=dc.B, cache_size=dc.CACHE, num_heads=dc.H, head_dim=dc.D,
        dtype=torch.float32 if rank == world - 1 else dc.DTYPE, device="cpu", sink_tokens=dc.SINK))
    cache = make_cache("off")
    q, k, v = (t[:, mine] for t in dc.qkv(0, 0))
    start = 0 if rank == 0 else dc.CHUNK  # rank 0 disagrees with the others
    result["bad_chunk_start"] = caught(lambda: ulysses_attention(q, k, v, cache, current_chunk_start=start,
                                                                 attention=dc.attention))
    result["resident_after_error"] = cache.resident_nbytes()
    after = ulysses_attention(q, k, v, cache, current_chunk_start=0, attention=dc.attention)
    result["after_error"] = after
    dist.destroy_process_group()
    torch.save(result, f"{out}/rank{rank}.pt")


if __name__ == "__main__":
    main()
