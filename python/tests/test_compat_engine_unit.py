"""The engine's own unit tests for its packed cache, with qvg inside (docs/compat.md).

SGLang ships sglang/multimodal_gen/test/unit/test_qvg_packed_kv.py. It is executed
here while qvg.sglang is installed, so its imports of CausalSelfAttentionKVCache and
QVGPackedCausalKVCache (and the stage modules' names it allocates through) resolve to
qvg.torch's classes; its unittest.TestCase classes are collected by pytest from this
module's globals and run with qvg.sglang installed (a module fixture). The
denoising-stage modules it imports are reduced by the shim (sglang_shim.py) to the
engine's own cache-allocation methods. The engine's QVGKVQuantArgs stays the engine's.
TestPackedQuantMemory needs CUDA and quant-videogen: skipped on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import qvg.sglang
import qvg.torch as qt
from compat_common import ENGINE_PACKED, import_engine

import_engine(ENGINE_PACKED)  # skips without the engine

import sglang_shim  # noqa: E402

with qvg.sglang.installed():
    _engine_tests = sglang_shim.load_engine_unit_test()

assert _engine_tests.QVGPackedCausalKVCache is qt.QVGPackedCausalKVCache
assert _engine_tests.CausalSelfAttentionKVCache is qt.CausalSelfAttentionKVCache

TestQVGKVQuantArgs = _engine_tests.TestQVGKVQuantArgs
TestPackedStorageEquivalence = _engine_tests.TestPackedStorageEquivalence
TestPackedQuantMemory = _engine_tests.TestPackedQuantMemory

# docs/compat.md row 15: qvg checks the quantization settings against head_dim when the
# cache is built (block_size 64 does not divide the test's head_dim 4); the engine only
# when it first packs, which this test never reaches. Counted as a failure of the
# engine's test, expected and pinned.
TestPackedStorageEquivalence.test_quantization_is_available_for_lingbot = pytest.mark.xfail(
    raises=ValueError, strict=True, reason="docs/compat.md row 15: block_size must divide head_dim at construction"
)(TestPackedStorageEquivalence.test_quantization_is_available_for_lingbot)

# qvg.sglang.install() lets the base causal stage (Self-Forcing's, LongLive2's)
# use the packed cache, which this engine test pins as refused. Expected, pinned.
TestPackedStorageEquivalence.test_quantization_is_rejected_by_unsupported_causal_stages = pytest.mark.xfail(
    strict=True, reason="docs/compat.md row 16: qvg.sglang.install() enables the packed cache in the base causal stage"
)(TestPackedStorageEquivalence.test_quantization_is_rejected_by_unsupported_causal_stages)


@pytest.fixture(autouse=True, scope="module")
def _qvg_installed() -> Iterator[None]:
    with qvg.sglang.installed():
        yield
