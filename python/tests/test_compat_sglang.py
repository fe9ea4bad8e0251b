"""qvg.sglang.install() / uninstall() / installed() against the installed engine.

The engine's stage modules are its own where its serving stack is installed
(python/requirements-e2e.txt), else the shim's (sglang_shim.py: the engine's own
allocation methods, with the real modules' imports); the cache modules are the
engine's own.
"""

from __future__ import annotations

import importlib
import types

import pytest
import torch

import qvg.sglang
import qvg.torch as qt
from compat_common import ENGINE_KVCACHE, ENGINE_PACKED, ENGINE_QUANT, import_engine

eng_dense_mod = import_engine(ENGINE_KVCACHE)
eng_packed_mod = import_engine(ENGINE_PACKED)
eng_quant_mod = import_engine(ENGINE_QUANT)
eng_pkg = importlib.import_module("sglang.multimodal_gen.runtime.layers.kvcache")

import sglang_shim  # noqa: E402

causal_stage, lingbot_stage = sglang_shim.load_stage_modules()
ENGINE_DENSE = eng_dense_mod.CausalSelfAttentionKVCache
ENGINE_PACKED_CLS = eng_packed_mod.QVGPackedCausalKVCache


@pytest.fixture(autouse=True)
def _clean() -> None:
    qvg.sglang.uninstall()
    yield
    qvg.sglang.uninstall()


def allocate(bits: int | None, head_dim: int = 64, stage_cls=None) -> list:
    """Caches allocated by the engine's own LingBot allocation path."""
    stage_cls = stage_cls or lingbot_stage.LingBotWorldCausalDMDDenoisingStage
    stage = stage_cls.__new__(stage_cls)
    stage._kv_quant_args = eng_quant_mod.QVGKVQuantArgs(bits=bits)
    stage.num_transformer_blocks = 2
    return stage._allocate_causal_kv_cache(batch_size=1, kv_cache_size=16, num_attention_heads=2,
                                           attention_head_dim=head_dim, dtype=torch.bfloat16,
                                           device=torch.device("cpu"), sink_tokens=4)


def originals_in_place() -> bool:
    return (eng_dense_mod.CausalSelfAttentionKVCache is ENGINE_DENSE
            and eng_packed_mod.QVGPackedCausalKVCache is ENGINE_PACKED_CLS
            and eng_pkg.CausalSelfAttentionKVCache is ENGINE_DENSE
            and causal_stage.CausalSelfAttentionKVCache is ENGINE_DENSE
            and causal_stage.QVGPackedCausalKVCache is ENGINE_PACKED_CLS
            and lingbot_stage.QVGPackedCausalKVCache is ENGINE_PACKED_CLS)


def test_install_rebinds_the_engine_names():
    assert originals_in_place()
    qvg.sglang.install()
    assert qvg.sglang.is_installed()
    assert eng_dense_mod.CausalSelfAttentionKVCache is qt.CausalSelfAttentionKVCache
    assert eng_packed_mod.QVGPackedCausalKVCache is qt.QVGPackedCausalKVCache
    assert eng_pkg.CausalSelfAttentionKVCache is qt.CausalSelfAttentionKVCache
    assert lingbot_stage.QVGPackedCausalKVCache is qt.QVGPackedCausalKVCache
    assert causal_stage.CausalSelfAttentionKVCache is qt.CausalSelfAttentionKVCache
    assert set(causal_stage.CausalKVCache.__args__) == {qt.CausalSelfAttentionKVCache, qt.QVGPackedCausalKVCache}
    # the engine's settings class is left alone
    assert eng_quant_mod.QVGKVQuantArgs is not qt.QVGKVQuantArgs
    # a fresh from-import of an engine name gets qvg's
    from sglang.multimodal_gen.runtime.layers.kvcache.causal_attention_cache import CausalSelfAttentionKVCache
    assert CausalSelfAttentionKVCache is qt.CausalSelfAttentionKVCache
    qvg.sglang.uninstall()
    assert originals_in_place() and not qvg.sglang.is_installed()
    assert set(causal_stage.CausalKVCache.__args__) == {ENGINE_DENSE, ENGINE_PACKED_CLS}


@pytest.mark.parametrize("bits", [None, 4])
def test_engine_allocation_path_builds_qvg_caches(bits):
    """The engine's LingBot stage allocates (quantization off: through its base stage's
    dense path; int4: its packed path) qvg caches once installed, its own after."""
    expected = qt.QVGPackedCausalKVCache if bits else qt.CausalSelfAttentionKVCache
    with qvg.sglang.installed():
        caches = allocate(bits)
        assert len(caches) == 2 and all(type(c) is expected for c in caches)
        assert all(isinstance(c, causal_stage.CausalKVCache) for c in caches)
        g = torch.Generator().manual_seed(0)
        key = torch.randn(1, 4, 2, 64, generator=g).to(torch.bfloat16)
        view = caches[0].update_and_get_attention_kv(key=key, value=key, current_chunk_start=0)
        assert torch.equal(view.k, key)
    caches = allocate(bits)
    assert all(type(c) is (ENGINE_PACKED_CLS if bits else ENGINE_DENSE) for c in caches)


def test_modules_imported_while_installed_are_restored():
    """A module importing the engine names while installed holds qvg's; uninstall puts
    the engine's back there too."""
    qvg.sglang.install()
    late = types.ModuleType("sglang._qvg_test_late")
    exec(f"from {ENGINE_KVCACHE} import CausalSelfAttentionKVCache", late.__dict__)
    import sys
    sys.modules[late.__name__] = late
    try:
        assert late.CausalSelfAttentionKVCache is qt.CausalSelfAttentionKVCache
        qvg.sglang.uninstall()
        assert late.CausalSelfAttentionKVCache is ENGINE_DENSE
    finally:
        del sys.modules[late.__name__]


def test_context_manager_restores_on_error_and_install_is_idempotent():
    with pytest.raises(KeyError):
        with qvg.sglang.installed():
            qvg.sglang.install()  # idempotent
            assert eng_dense_mod.CausalSelfAttentionKVCache is qt.CausalSelfAttentionKVCache
            raise KeyError("boom")
    assert originals_in_place()
    qvg.sglang.uninstall()  # a no-op when not installed
    assert originals_in_place()
    qvg.sglang.install()
    with qvg.sglang.installed():  # nested: stays installed on exit
        pass
    assert qvg.sglang.is_installed()


@pytest.mark.parametrize("bits", [None, 2])
def test_install_lets_the_base_causal_stage_allocate_the_packed_cache(bits):
    """The engine's base causal stage (Self-Forcing's, LongLive2's) refuses
    quantization and always allocates dense caches; installed, it allocates qvg's
    packed cache when its settings are enabled, its dense path otherwise."""
    from types import SimpleNamespace

    stage_cls = causal_stage.CausalDMDDenoisingStage
    stage = stage_cls.__new__(stage_cls)
    stage.num_transformer_blocks = 2
    stage.server_args = SimpleNamespace(kv_cache_quant_config=eng_quant_mod.QVGKVQuantArgs(bits=bits))
    kw = dict(batch_size=1, kv_cache_size=16, num_attention_heads=2, attention_head_dim=64, dtype=torch.bfloat16,
              device=torch.device("cpu"), sink_tokens=4)
    assert not stage._supports_qvg_kv_cache_quantization()
    assert all(type(c) is ENGINE_DENSE for c in stage._allocate_causal_kv_cache(**kw))
    with qvg.sglang.installed():
        assert qvg.sglang.stage_patched() and stage._supports_qvg_kv_cache_quantization()
        caches = stage._allocate_causal_kv_cache(**kw)
        expected = qt.QVGPackedCausalKVCache if bits else qt.CausalSelfAttentionKVCache
        assert len(caches) == 2 and all(type(c) is expected for c in caches)
        if bits:
            assert caches[0].quant_args.bits == 2 and caches[0].sink_tokens == 4
            with pytest.raises(NotImplementedError, match="global_sink_tokens=4"):
                stage._allocate_causal_kv_cache(**kw, global_sink_tokens=4)
        # the LingBot stage keeps its own methods
        assert lingbot_stage.LingBotWorldCausalDMDDenoisingStage._allocate_causal_kv_cache is not (
            stage_cls._allocate_causal_kv_cache)
    assert not qvg.sglang.stage_patched() and not stage._supports_qvg_kv_cache_quantization()
    assert all(type(c) is ENGINE_DENSE for c in stage._allocate_causal_kv_cache(**kw))
