"""The engine drop-ins' one contract (qvg.dropin; docs/engines.md, "Writing a drop-in"),
one test run against each of qvg.sglang, qvg.flashdreams and
qvg.vllm_omni over the pinned engines (the compat requirements; sglang's stages and
vLLM-Omni's transformer through their test shims):

* all-or-nothing: an engine name missing (the engines' version drifts: a stage
  method inherited instead of defined, a module attribute gone) is EngineNameError, an
  ImportError naming it, and every engine name is as before; a failure at any step of
  an install (each binding in turn) puts back every name already changed, and an
  install of new settings that fails leaves the old ones installed;
* idempotent: installing the installed settings changes no name;
* nested: installed() restores exactly the names in place at its entry, also when
  the block raises, under a plain install() or another block with other settings;
* two threads: concurrent installs install once without error, and overlapping
  installed() blocks of two threads keep qvg installed until the last one exits;
* settings one way: a dict of the engine's flags is read by qvg.torch.as_quant_args
  (a misspelt flag is refused naming the nearest setting, nothing changed).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import qvg.dropin
import qvg.flashdreams
import qvg.sglang
import qvg.torch as qt
import qvg.vllm_omni
from compat_common import ENGINE_KVCACHE, ENGINE_PACKED, import_engine

INT2 = {"kv_cache_quant": "int2", "kv_cache_quant_block_size": 8}
INT4 = {"kv_cache_quant": "int4", "kv_cache_quant_block_size": 8}


@dataclass
class Engine:
    """One drop-in and its engine, as the contract test sees them."""

    dropin: Any  # the drop-in module
    names: Callable[[], tuple]  # every engine name the drop-in replaces, as bound now
    missing: Callable[[pytest.MonkeyPatch], str]  # removes one engine name; returns its dotted name


def _sglang() -> Engine:
    import sglang_shim

    dense, packed = import_engine(ENGINE_KVCACHE), import_engine(ENGINE_PACKED)
    package = importlib.import_module("sglang.multimodal_gen.runtime.layers.kvcache")
    causal, lingbot = sglang_shim.load_stage_modules()
    methods = ("_supports_qvg_kv_cache_quantization", "_allocate_causal_kv_cache")

    def names() -> tuple:
        stage = causal.CausalDMDDenoisingStage
        return (dense.CausalSelfAttentionKVCache, packed.QVGPackedCausalKVCache, package.CausalSelfAttentionKVCache,
                causal.CausalSelfAttentionKVCache, causal.QVGPackedCausalKVCache, lingbot.QVGPackedCausalKVCache,
                getattr(causal, "CausalKVCache", None), stage, *(stage.__dict__.get(m) for m in methods))

    def missing(mp: pytest.MonkeyPatch) -> str:
        # A version drift: a stage class that defines
        # _supports_qvg_kv_cache_quantization but inherits _allocate_causal_kv_cache.
        stage = causal.CausalDMDDenoisingStage
        drifted = type("CausalDMDDenoisingStage", (stage,), {"__module__": stage.__module__, methods[0]:
                                                             stage.__dict__[methods[0]]})
        mp.setattr(causal, "CausalDMDDenoisingStage", drifted)
        return f"{stage.__module__}.CausalDMDDenoisingStage._allocate_causal_kv_cache"

    return Engine(qvg.sglang, names, missing)


def _flashdreams() -> Engine:
    kvcache = import_engine(qvg.flashdreams.ENGINE_MODULE)
    attention = importlib.import_module("flashdreams.core.attention")

    def names() -> tuple:
        return kvcache.BlockKVCache, attention.BlockKVCache

    def missing(mp: pytest.MonkeyPatch) -> str:
        mp.delattr(kvcache, "BlockKVCache")
        return "BlockKVCache"  # the module's own attribute (the message names the module and it)

    return Engine(qvg.flashdreams, names, missing)


def _vllm_omni() -> Engine:
    import vllm_omni_shim

    eng = vllm_omni_shim.load()

    def names() -> tuple:
        return eng.allocate_lingbot_cache, eng.LingBotSelfAttention.__dict__.get("_update_cache")

    def missing(mp: pytest.MonkeyPatch) -> str:
        mp.delattr(eng, "LingBotTransformerCache")
        return "LingBotTransformerCache"

    return Engine(qvg.vllm_omni, names, missing)


@pytest.fixture(params=["sglang", "flashdreams", "vllm_omni"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    e = {"sglang": _sglang, "flashdreams": _flashdreams, "vllm_omni": _vllm_omni}[request.param]()
    e.dropin.uninstall()
    before = e.names()
    yield e
    e.dropin.uninstall()
    assert e.names() == before  # every test leaves the engine as it found it


def test_a_missing_engine_name_changes_nothing(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    name = engine.missing(monkeypatch)
    before = engine.names() if engine.dropin is not qvg.flashdreams else None
    with pytest.raises(qvg.dropin.EngineNameError, match=name) as e:
        engine.dropin.install()
    assert isinstance(e.value, ImportError) and name in e.value.name
    assert not engine.dropin.is_installed()
    if before is not None:
        assert engine.names() == before
    with pytest.raises(qvg.dropin.EngineNameError, match=name):
        with engine.dropin.installed():
            pytest.fail("the block must not run")
    engine.dropin.uninstall()  # a no-op
    monkeypatch.undo()
    engine.dropin.install()  # the engine whole again: installs
    assert engine.dropin.is_installed()


@pytest.mark.parametrize("step", range(4))
def test_a_failure_at_any_step_puts_back_every_name(engine: Engine, monkeypatch: pytest.MonkeyPatch,
                                                    step: int) -> None:
    """The step-th name change of an install raises: the names already changed are
    put back (from nothing installed, and over other settings)."""
    for first in (None, INT4):
        if first is not None:
            engine.dropin.install(first)
        before = engine.names()
        calls = {"n": 0}
        swaps = {cls: cls.swap for cls in (qvg.dropin.Rebind, qvg.dropin.Attribute)}

        def failing(self: Any, old: Any, new: Any, _swap: Any = None) -> bool:
            calls["n"] += 1
            if calls["n"] == step + 1:
                raise RuntimeError("planted failure")
            return swaps[type(self)](self, old, new)

        with monkeypatch.context() as mp:
            for cls in swaps:
                mp.setattr(cls, "swap", failing)
            try:
                engine.dropin.install(INT2)
                failed = False
            except RuntimeError as e:
                assert "planted failure" in str(e)
                failed = True
        n_bindings = len(engine.dropin._DROPIN.found.bindings) if engine.dropin.is_installed() else None
        if failed:
            assert engine.names() == before
            assert engine.dropin.is_installed() == (first is not None)
            if first is not None:
                assert engine.dropin._DROPIN.settings == qt.as_quant_args(first)
        else:  # fewer bindings than step + 1: nothing failed
            assert n_bindings is not None and n_bindings <= step
        engine.dropin.uninstall()


def test_install_is_idempotent(engine: Engine) -> None:
    engine.dropin.install()
    once = engine.names()
    engine.dropin.install()
    engine.dropin.install(None)
    assert engine.names() == once
    engine.dropin.install(INT2)
    packed = engine.names()
    engine.dropin.install(dict(INT2))  # equal settings, another object
    engine.dropin.install(qt.QVGKVQuantArgs.from_dict(INT2))
    assert engine.names() == packed
    engine.dropin.uninstall()
    engine.dropin.uninstall()
    assert not engine.dropin.is_installed()


def test_installed_blocks_nest(engine: Engine) -> None:
    original = engine.names()
    with engine.dropin.installed():
        dense = engine.names()
        assert dense != original
        with engine.dropin.installed(INT2):
            assert engine.names() != dense
            with engine.dropin.installed(INT2):
                pass
            assert engine.dropin.is_installed()
        assert engine.names() == dense  # the outer block's names, the very objects
        with pytest.raises(KeyError):
            with engine.dropin.installed(INT4):
                raise KeyError("boom")
        assert engine.names() == dense
        with engine.dropin.installed():  # the same settings: nothing changes on exit
            pass
        assert engine.names() == dense
    assert engine.names() == original and not engine.dropin.is_installed()
    engine.dropin.install(INT4)  # under a plain install a block restores it
    plain = engine.names()
    with engine.dropin.installed():
        assert engine.names() != plain
    assert engine.names() == plain and engine.dropin.is_installed()


def test_two_threads(engine: Engine) -> None:
    """Concurrent installs: no error, installed once (the names are those of a single
    install). Overlapping installed() blocks of two threads: qvg stays installed in each
    block until it exits, and nothing stays installed after both."""
    original = engine.names()
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(fn: Callable[[], None]) -> None:
        threads = [threading.Thread(target=guard(fn)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)

    def guard(fn: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
        return body

    def both_install() -> None:
        barrier.wait()
        engine.dropin.install(INT2)

    for _ in range(5):
        run(both_install)
        assert not errors, errors
        once = engine.names()
        assert once != original and engine.dropin.is_installed()
        engine.dropin.install(INT2)  # the state the two threads left is one install's
        assert engine.names() == once
        engine.dropin.uninstall()
        assert engine.names() == original and not engine.dropin.is_installed()

    def blocks() -> None:
        for i in range(10):
            barrier.wait()
            with engine.dropin.installed():
                assert engine.dropin.is_installed() and engine.names() != original
                if i % 2:
                    barrier.wait()  # the other thread's block is open too: they overlap
                    barrier.wait()
            barrier.wait()

    def other() -> None:
        for i in range(10):
            barrier.wait()
            with engine.dropin.installed():
                if i % 2:
                    barrier.wait()
                assert engine.dropin.is_installed() and engine.names() != original
                if i % 2:
                    barrier.wait()
            barrier.wait()

    threads = [threading.Thread(target=guard(blocks)), threading.Thread(target=guard(other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert engine.names() == original and not engine.dropin.is_installed()


def test_settings_one_way(engine: Engine) -> None:
    """install(quant_args=...) reads its settings with qvg.torch.as_quant_args:
    refused settings change nothing."""
    original = engine.names()
    for bad, match in (({"kv_cache_quant": "int2", "kv_cache_quant_centriods": 64}, "kv_cache_quant_centroids"),
                       ({"kv_cache_quant": "int3x"}, "kv_cache_quant must be"), ("int2", "quant_args must be")):
        with pytest.raises(ValueError, match=match):
            engine.dropin.install(bad)
        with pytest.raises(ValueError, match=match):
            with engine.dropin.installed(quant_args=bad):
                pytest.fail("the block must not run")
        assert engine.names() == original and not engine.dropin.is_installed()
    engine.dropin.install(quant_args=INT2)
    assert engine.dropin._DROPIN.settings == qt.QVGKVQuantArgs.from_dict(INT2)
