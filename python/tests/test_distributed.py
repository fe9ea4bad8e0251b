"""qvg.distributed on the CPU with gloo, 2 and 4 processes (docs/python.md, "Multi-rank").

Each world runs once (dist_worker.py, one process per rank, a file store and a
30 s gloo timeout; the whole world is killed after WORLD_TIMEOUT seconds) and the
tests below check what it saw against the single-process reference of dist_common:

* the gathered attention output equals one process with one cache of all heads,
  bit for bit, at every call, with quantization off and at int2;
* each rank's resident_nbytes() is 1/N of the single cache's;
* bad layouts (heads not divisible by the ranks, ranks disagreeing on the dtype or
  on current_chunk_start) raise the same ValueError on every rank, no hang, and the
  group keeps working after the disagreement.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dist_common as dc

WORLD_TIMEOUT = 150  # seconds for one world: start-up of N processes, the scenario, the error cases
HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.multirank


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def world(request, tmp_path_factory):
    """Runs the N ranks and returns (N, [rank results])."""
    n = request.param
    tmp = tmp_path_factory.mktemp(f"world{n}")
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONPATH=str(HERE))
    procs = [subprocess.Popen([sys.executable, str(HERE / "dist_worker.py"), str(r), str(n), str(tmp / "store"),
                               str(tmp)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(n)]
    deadline = time.monotonic() + WORLD_TIMEOUT
    logs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            logs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the {n}-rank world did not finish within {WORLD_TIMEOUT} s (a hang)")
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r]}"
    return n, [torch.load(tmp / f"rank{r}.pt") for r in range(n)]


@pytest.fixture(scope="module")
def reference():
    """The single-process outputs and resident bytes (one thread, as the ranks)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {quant: dc.single_process(quant) for quant in dc.QUANTS}
    finally:
        torch.set_num_threads(threads)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("quant", list(dc.QUANTS))
def test_gathered_output_equals_single_process(world, reference, quant):
    n, ranks = world
    ref_outs, _ = reference[quant]
    for i, ref in enumerate(ref_outs):
        gathered = torch.cat([r[quant]["outs"][i] for r in ranks], dim=1)  # sequence shards in rank order
        assert gathered.shape == ref.shape == (dc.B, dc.CHUNK, dc.H, dc.D)
        assert torch.equal(bits(gathered), bits(ref)), f"call {i} ({dc.steps()[i]}): output differs"


@pytest.mark.parametrize("quant", list(dc.QUANTS))
def test_each_rank_holds_a_head_shard(world, reference, quant):
    n, ranks = world
    _, ref_resident = reference[quant]
    assert ref_resident % n == 0
    for r, res in enumerate(ranks):
        assert res[quant]["head_start"] == r * dc.H // n
        assert res[quant]["resident"] * n == ref_resident, f"rank {r}"


def test_quantization_changes_the_output(reference):
    """Control: int2 really encodes (its outputs differ from quantization off)."""
    off, _ = reference["off"]
    int2, res2 = reference["int2"]
    assert not all(torch.equal(a, b) for a, b in zip(off, int2))
    assert res2 < reference["off"][1]


def test_heads_not_divisible_raise_on_every_rank(world):
    n, ranks = world
    for r, res in enumerate(ranks):
        heads, err = res["bad_heads"]
        assert err == ("ValueError", f"num_heads must be a positive multiple of the number of ranks {n} (each rank "
                                     f"holds num_heads / {n} heads), got {heads}"), f"rank {r}"


def test_layout_disagreement_raises_on_every_rank(world):
    n, ranks = world
    per_rank = ", ".join(f"rank {r}: {0 if r == n - 1 else 1}" for r in range(n))
    for r, res in enumerate(ranks):
        assert res["bad_dtype_rank"] == (
            "ValueError", f"qvg.distributed: the ranks disagree on the cache layout: dtype ({per_rank}); every rank "
                          "must pass the same values"), f"rank {r}"


def test_chunk_start_disagreement_raises_on_every_rank_and_changes_nothing(world, reference):
    n, ranks = world
    per_rank = ", ".join(f"rank {r}: {0 if r == 0 else dc.CHUNK}" for r in range(n))
    expected = ("ValueError", f"qvg.distributed: the ranks disagree on the chunk: current_chunk_start ({per_rank}); "
                              "every rank must pass the same values")
    for r, res in enumerate(ranks):
        assert res["bad_chunk_start"] == expected, f"rank {r}"
        assert res["resident_after_error"] == 0, f"rank {r}: the failed call changed the cache"
    # The next (agreeing) call works, and equals the single process's first call.
    ref, _ = reference["off"]
    gathered = torch.cat([res["after_error"] for res in ranks], dim=1)
    assert torch.equal(bits(gathered), bits(ref[0]))


def test_example_runs_under_torchrun():
    """python/examples/ulysses.py, 2 ranks under torchrun (gloo): it checks itself."""
    example = HERE.parent / "examples" / "ulysses.py"
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(example), "--chunks", "4"], env=env, capture_output=True, text=True,
                       timeout=WORLD_TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gathered output equals one cache of all heads bit for bit: True" in r.stdout
    assert "resident bytes per rank [145728, 145728], one cache 291456" in r.stdout
