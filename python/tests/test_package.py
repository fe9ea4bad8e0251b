"""The package as pip builds and installs it (docs/python.md, "Install"): the build's
checks, the one version, the guard against another torch, typing files, torch.compile,
and the device choice on a machine without a GPU."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import qvg
import qvg._build
import qvg.torch as qt
from conftest import bits_equal, chunk, make_packed

ROOT = Path(__file__).resolve().parents[2]


def test_build_without_torch_stops_with_one_line():
    """The build backend (pyproject.toml) in an environment without torch: one line on
    stderr, before CMake runs (python -S: no site-packages, so no torch)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import qvg_build; "
            "qvg_build.build_wheel(sys.argv[2])")
    r = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT / "python" / "build_backend"), "/nonexistent"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr == (f"qvg: torch is not installed for {sys.executable}: install torch first (pip install torch), "
                        "then build qvg with pip install --no-build-isolation . (docs/python.md)\n")


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_missing_debian_package_is_named(tmp_path):
    """CMake stops with a line naming the Debian package of a missing dependency."""
    r = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path), "-DQVG_BUILD_TESTS=OFF", "-DQVG_BUILD_CLI=OFF",
                        "-DQVG_ENABLE_CUDA=OFF", "-DCMAKE_DISABLE_FIND_PACKAGE_hwy=ON"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = [ln.strip() for ln in r.stderr.splitlines() if "qvg:" in ln]
    assert lines == ["qvg: hwy not found: install the Debian package libhwy-dev (apt-get install libhwy-dev, or "
                     "scripts/deps.sh for every package qvg needs)"]


def test_one_version_everywhere():
    """The wheel's metadata, qvg.__version__ and qvg._C.__version__ are CMake's project(VERSION)."""
    declared = re.search(r"project\(qvg VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
    assert importlib.metadata.version("qvg") == qvg.__version__ == qt._C.__version__ == declared


def test_built_for_this_torch():
    assert qvg._build.TORCH_VERSION == torch.__version__
    assert qvg._build.CUDA == qt.HAS_CUDA
    if qt.HAS_CUDA:  # the CUDA rule: nvcc's major version is torch's CUDA major version
        assert qvg._build.NVCC_VERSION.split(".")[0] == torch.version.cuda.split(".")[0]


def test_another_torch_is_refused_naming_both_versions():
    """Loaded into a torch other than the one it was built against, qvg.torch raises
    ImportError naming both versions before the extension is loaded."""
    code = "import torch; torch.__version__ = '2.99.1+cu999'; import qvg.torch"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert (f"ImportError: qvg._C was built against torch {qvg._build.TORCH_VERSION}, but this environment has torch "
            "2.99.1+cu999: rebuild qvg for it: pip install --no-build-isolation --force-reinstall --no-deps . "
            "(docs/python.md)") in r.stderr
    assert "undefined symbol" not in r.stderr


def test_typing_files_are_installed():
    pkg = Path(qvg.__file__).parent
    assert (pkg / "py.typed").is_file()
    stub = (pkg / "_C.pyi").read_text()
    for name in ("class DenseCache", "class PackedCache", "class QuantArgs", "class CudaDenseCache",
                 "class CudaPackedCache", "HAS_CUDA", "def quant_args_from_flags"):
        assert name in stub, name


def test_stub_lists_what_the_extension_defines():
    """Every public name of qvg._C (and of its classes) is in the stub."""
    stub = (Path(qvg.__file__).parent / "_C.pyi").read_text()
    for name, obj in vars(qt._C).items():
        if name.startswith("_"):
            continue
        assert re.search(rf"\b{name}\b", stub), name
        if isinstance(obj, type):
            for member in vars(obj):
                if not member.startswith("_"):
                    assert re.search(rf"\b{member}\b", stub), f"{name}.{member}"


def test_torch_compile_graph_breaks_at_the_cache(gen):
    """Under torch.compile a cache call is a graph break: results equal eager ones
    (fullgraph=True cannot trace it)."""
    eager, compiled_cache = make_packed(1, 32, 2, 8, sink=8), make_packed(1, 32, 2, 8, sink=8)

    def step(cache, q, k, v, c):
        view = cache.update_and_get_attention_kv(key=k, value=v, current_chunk_start=c)
        return (q.sum(dim=1, keepdim=True) * view.k).sum(dim=1) + view.v.mean()

    compiled = torch.compile(step, backend="eager")
    for c in range(0, 24, 8):
        q, k, v = (chunk(gen, 1, 8, 2, 8) for _ in range(3))
        assert bits_equal(step(eager, q, k, v, c), compiled(compiled_cache, q, k, v, c))

    def step_full(cache, k, v):  # another code object: dynamo caches compiled frames per code object
        return cache.update_and_get_attention_kv(key=k, value=v, current_chunk_start=0).k.sum()

    full = torch.compile(step_full, backend="eager", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="update"):
        full(make_packed(1, 32, 2, 8), k, v)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_cuda_device_without_a_gpu():
    base = dict(batch_size=1, cache_size=16, num_heads=2, head_dim=8, dtype=torch.float32,
                global_end_index=torch.zeros(1, dtype=torch.long), local_end_index=torch.zeros(1, dtype=torch.long),
                quant_args=None)
    if qt.HAS_CUDA:
        with pytest.raises(RuntimeError, match=r"^QVGPackedCausalKVCache: device 'cuda' is not available "
                                               r"\(torch.cuda.is_available\(\) is False\)$"):
            qt.QVGPackedCausalKVCache(device="cuda", **base)
        with pytest.raises(ValueError, match=r"^device cuda:0 does not exist: 0 CUDA device\(s\) visible$"):
            qt._C.CudaPackedCache(1, 16, 2, 8, "f32", 0, None, False, qt._quant_to_c(qt.QVGKVQuantArgs()), 0,
                                  "cuda:0")
        assert qt._C.cuda_device_count() == 0
    else:
        with pytest.raises(NotImplementedError, match=r"runs on the CPU in this build, device must be 'cpu', "
                                                      r"got 'cuda'$"):
            qt.QVGPackedCausalKVCache(device="cuda", **base)


def test_head_offset_is_validated():
    with pytest.raises(ValueError, match=r"^head_offset must be in \[0, 2\^40\], got -1$"):
        qt.QVGPackedCausalKVCache(batch_size=1, cache_size=16, num_heads=2, head_dim=8, dtype=torch.float32,
                                  device="cpu", global_end_index=torch.zeros(1, dtype=torch.long),
                                  local_end_index=torch.zeros(1, dtype=torch.long), quant_args=None, head_offset=-1)
    with pytest.raises(ValueError, match=r"^head_offset must be an integer in \[0, 2\^40\], got 1.5$"):
        qt.QVGPackedCausalKVCache(batch_size=1, cache_size=16, num_heads=2, head_dim=8, dtype=torch.float32,
                                  device="cpu", global_end_index=torch.zeros(1, dtype=torch.long),
                                  local_end_index=torch.zeros(1, dtype=torch.long), quant_args=None, head_offset=1.5)


def test_head_offset_shards_equal_the_wide_cache(gen):
    """Two packed caches of 2 heads with head offsets 0 and 2 show, bit for bit, what
    one cache of 4 heads shows for those heads, at int2."""
    quant = qt.QVGKVQuantArgs(bits=2, centroids=8, block_size=8)

    def make(H, off):
        return qt.QVGPackedCausalKVCache(
            batch_size=1, cache_size=64, num_heads=H, head_dim=16, dtype=torch.bfloat16, device="cpu",
            global_end_index=torch.zeros(1, dtype=torch.long), local_end_index=torch.zeros(1, dtype=torch.long),
            sink_tokens=16, quant_args=quant, head_offset=off)

    wide, shards = make(4, 0), [make(2, 0), make(2, 2)]
    for c in range(0, 128, 16):
        k, v = chunk(gen, 1, 16, 4, 16, torch.bfloat16, 3.0), chunk(gen, 1, 16, 4, 16, torch.bfloat16)
        wv = wide.update_and_get_attention_kv(key=k, value=v, current_chunk_start=c)
        for r, s in enumerate(shards):
            sv = s.update_and_get_attention_kv(key=k[:, :, 2 * r:2 * r + 2], value=v[:, :, 2 * r:2 * r + 2],
                                               current_chunk_start=c)
            assert bits_equal(sv.k, wv.k[:, :, 2 * r:2 * r + 2]) and bits_equal(sv.v, wv.v[:, :, 2 * r:2 * r + 2])
    assert sum(s["packed"] for s in wide._segments()) > 0
    assert sum(s.resident_nbytes() for s in shards) == wide.resident_nbytes()
    # Control: heads 2..3 in a cache without the offset (the same data again: the
    # fixture's generator is seeded 1234) are encoded differently.
    plain = make(2, 0)
    gen2 = torch.Generator().manual_seed(1234)
    for c in range(0, 128, 16):
        k, v = chunk(gen2, 1, 16, 4, 16, torch.bfloat16, 3.0), chunk(gen2, 1, 16, 4, 16, torch.bfloat16)
        pv = plain.update_and_get_attention_kv(key=k[:, :, 2:], value=v[:, :, 2:], current_chunk_start=c)
    assert not bits_equal(pv.k, wv.k[:, :, 2:4])


def readme_python_example() -> str:
    """The README's Python example: its fenced ``python`` block that builds a cache."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    examples = [b for b in blocks if "QVGPackedCausalKVCache(" in b]
    assert len(examples) == 1, f"expected one README example building a cache, found {len(examples)}"
    return examples[0]


def test_readme_python_example_runs_as_written_on_the_cpu(tmp_path):
    """The README's example runs unchanged on a CPU-only machine (no
    GPU visible: CUDA_VISIBLE_DEVICES empty), builds the packed cache, streams its chunks,
    saves a snapshot and loads it back without keyword arguments."""
    import os
    code = readme_python_example()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"2048 tokens visible, [0-9.]+ MiB resident\n", r.stdout), r.stdout
    assert (tmp_path / "layer0.qvgs").is_file()
