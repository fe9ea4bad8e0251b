"""Contract breaks found by a hostile user (docs/reliability.md, findings 18-27; spec
5.1) and the snapshot expectation (docs/snapshot.md), each pinned by a test that failed
before its fix:

* threads: save/snapshot_bytes racing update on one cache get RuntimeError (never a
  crash or a damaged snapshot); reset/load on one cache while another updates never
  deadlock; a bounded stress run over {update, save, snapshot_bytes, reset_indices,
  load} on shared and separate caches;
* a cache's own snapshot loads; every setting of the table is compared with the
  caller's expectation (packed) and every option (dense);
* index tensors, quant_args, argument types, overlapping buffers, negative-bit views,
  decode's size check, one option parser.

Reproducers use kw(q) of the findings: B 1, cache 128, 2 heads of 64, float32, sink 16.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest
import torch

import qvg.torch as qt
from qvg import _C

H, D = 2, 64


def kw(q, **over):
    d = dict(batch_size=1, cache_size=128, num_heads=H, head_dim=D, dtype=torch.float32, device="cpu",
             global_end_index=torch.zeros(1, dtype=torch.long), local_end_index=torch.zeros(1, dtype=torch.long),
             quant_args=q, sink_tokens=16)
    d.update(over)
    return d


def chunk(i, n=16):
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(1, n, H, D, generator=g), torch.randn(1, n, H, D, generator=g)


def feed(c, n, start=0):
    out = None
    for i in range(start, start + n):
        k, v = chunk(i)
        out = c.update_and_get_attention_kv(key=k, value=v, current_chunk_start=16 * i)
    return out


def cursors(c):
    if c.global_end_index_int is not None:
        return c.global_end_index_int, c.local_end_index_int
    return int(c.global_end_index), int(c.local_end_index)


# ---- snapshots: a cache's own snapshot loads; every setting is compared (docs/snapshot.md)

OWN = [
    qt.QVGKVQuantArgs(bits=2, centroids=16, refine_bits=2),
    qt.QVGKVQuantArgs(bits=2, centroids=16, span_mode="incremental", span_chunks=2, refine_bits=2),
    qt.QVGKVQuantArgs(bits=2, centroids=16, span_mode="incremental", refine_recent=2, refine_bits=2),
    qt.QVGKVQuantArgs(bits=4, centroids=16, scale_search="mse", k_config="bits=2", v_config="asymmetric=true"),
]


@pytest.mark.parametrize("q", OWN, ids=lambda q: q.describe())
def test_a_caches_own_snapshot_loads(q):
    c = qt.QVGPackedCausalKVCache(**kw(q))
    feed(c, 4)
    b = c.snapshot_bytes()
    d = qt.QVGPackedCausalKVCache.from_snapshot_bytes(b, **kw(q))
    assert d.snapshot_bytes() == b
    k, v = chunk(9)
    x = c.update_and_get_attention_kv(key=k, value=v, current_chunk_start=64)
    y = d.update_and_get_attention_kv(key=k, value=v, current_chunk_start=64)
    assert torch.equal(x.k, y.k) and torch.equal(x.v, y.v)


# The settings of the table (name, kind), each with two values a cache accepts with
# head_dim 64 on a base where every setting matters.
BASE = dict(bits=4, centroids=8, block_size=32, span_mode="incremental", span_chunks=2, refine_recent=1,
            refine_bits=2, keep_recent_chunks=0)
OTHER = dict(bits=2, centroids=16, block_size=16, stages=2, kmeans_iters=3, asymmetric=True, keep_recent_chunks=1,
             sink=False, sink_span="full", sink_keep_chunks=1, span_chunks=3, span_mode="deferred",
             span_break_ratio=0.5, scaling="compat", scale_dtype="bf16", init="kmeans++", seed=7,
             refine_recent=2, refine_bits=4, scale_search="mse")
ROLE_OTHER = dict(bits="2", centroids="16", block_size="16", stages="2", iters="3", asymmetric="true",
                  scale_dtype="bf16", scaling="compat", scale_search="mse")


def setting_cases():
    """(field name, quant A, quant B) differing only in that setting, for every row of
    the C++ settings table (qvg.torch reads the same table)."""
    out = []
    for name, flag, _kind, role, _default, _allowed in _C.quant_settings():
        a = dict(BASE)
        b = dict(BASE)
        if role:
            field = flag[3:]
            cfg = f"{name[0]}_config"
            b[cfg] = f"{field}={ROLE_OTHER[field]}"
        else:
            b[name] = OTHER[name]
            if name == "span_mode":  # deferred spans take no refinement layers
                a["refine_recent"] = b["refine_recent"] = 0
        out.append((name, qt.QVGKVQuantArgs(**a), qt.QVGKVQuantArgs(**b)))
    return out


def test_the_python_dataclass_is_the_settings_table():
    table = {name: default for name, _f, _k, role, default, _a in _C.quant_settings() if not role}
    fields = {f.name: f.default for f in dataclasses.fields(qt.QVGKVQuantArgs)}
    assert fields.pop("k_config") == "" and fields.pop("v_config") == ""
    assert fields == table
    assert set(OTHER) | {"bits"} >= set(table)
    # Each default is what the C++ side takes as the default: a default object is the
    # default QuantArgs, field for field.
    assert qt._quant_to_c(qt.QVGKVQuantArgs()).as_dict() == {**table, "k_config": "", "v_config": ""}
    assert "refine_bits" in qt.QVGKVQuantArgs.__doc__ and qt.QVGKVQuantArgs.__module__ == "qvg.torch"


@pytest.mark.parametrize("name,a,b", setting_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_setting_is_compared_with_the_callers_expectation(tmp_path, name, a, b):
    for saved, wanted in ((a, b), (b, a)):
        c = qt.QVGPackedCausalKVCache(**kw(saved))
        feed(c, 5)
        p = tmp_path / "s.qvgs"
        c.save(p)
        assert qt.QVGPackedCausalKVCache.load(p, **kw(saved)).snapshot_bytes() == c.snapshot_bytes()
        with pytest.raises(ValueError, match=f"the snapshot's cache has {name} = "):
            qt.QVGPackedCausalKVCache.load(p, **kw(wanted))
        with pytest.raises(ValueError, match=f"the snapshot's cache has {name} = "):
            qt.QVGPackedCausalKVCache.from_snapshot_bytes(c.snapshot_bytes(), **kw(wanted))


def dense_kw(S=32, sink=4, window=0, growth=False, dtype=torch.float32, Hh=H, Dd=D):
    return dict(k=torch.zeros(1, S, Hh, Dd, dtype=dtype), v=torch.zeros(1, S, Hh, Dd, dtype=dtype),
                global_end_index=torch.zeros(1, dtype=torch.long), local_end_index=torch.zeros(1, dtype=torch.long),
                cache_size=S, sink_tokens=sink, attention_window_size=window, allow_growth=growth)


@pytest.mark.parametrize("field,over", [
    ("cache_size", dict(S=48)), ("sink_tokens", dict(sink=0)), ("attention_window_size", dict(window=16)),
    ("allow_growth", dict(growth=True)), ("dtype", dict(dtype=torch.bfloat16)), ("num_heads", dict(Hh=4)),
    ("head_dim", dict(Dd=32)),
])
def test_the_dense_cache_compares_every_option(field, over):
    c = qt.CausalSelfAttentionKVCache(**dense_kw())
    k, v = chunk(0)
    c.update_and_get_attention_kv(key=k, value=v, current_chunk_start=0)
    b = c.snapshot_bytes()
    assert qt.CausalSelfAttentionKVCache.from_snapshot_bytes(b, **dense_kw()).snapshot_bytes() == b
    with pytest.raises(ValueError, match=f"the snapshot's cache has {field} = "):
        qt.CausalSelfAttentionKVCache.from_snapshot_bytes(b, **dense_kw(**over))


# ---- threads -----------------------------------------------------------------------------

def run_threads(fns, seconds):
    """Runs each fn(stop) in its own daemon thread for `seconds`; returns their
    exceptions. A thread still alive 10 s after the stop is a deadlock: the test fails
    (the suite does not hang)."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def wrap(fn):
        try:
            fn(stop)
        except BaseException as e:  # noqa: BLE001  (reported by the test)
            errors.append(e)

    ts = [threading.Thread(target=wrap, args=(f,), daemon=True) for f in fns]
    for t in ts:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join(10)
    alive = [t for t in ts if t.is_alive()]
    assert not alive, f"{len(alive)} thread(s) still running 10 s after the stop: a deadlock"
    return errors


BUSY = "used by another thread"


def busy_or(fn):
    """fn() -> its result, or None when it lost a race with the documented RuntimeError."""
    try:
        return fn()
    except RuntimeError as e:
        assert BUSY in str(e), e
        return None


INCR = qt.QVGKVQuantArgs(bits=2, centroids=16, span_mode="incremental", span_chunks=4, refine_recent=2)


@pytest.mark.parametrize("dense", [False, True])
def test_saving_while_another_thread_updates_is_refused_not_corrupted(tmp_path, dense):
    c = qt.CausalSelfAttentionKVCache(**dense_kw(S=128)) if dense else qt.QVGPackedCausalKVCache(**kw(INCR))
    counts = {"snap": 0, "busy": 0, "updates": 0}
    lock = threading.Lock()

    def updater(stop):
        while not stop.is_set():
            ge = cursors(c)[0]  # this thread alone moves the cursors
            if ge >= 16 * 60:
                busy_or(c.reset_indices)
                continue
            k, v = chunk(ge // 16 % 7)
            if busy_or(lambda: c.update_and_get_attention_kv(key=k, value=v, current_chunk_start=ge)) is not None:
                counts["updates"] += 1

    def saver(stop):
        n = 0
        while not stop.is_set():
            p = tmp_path / "s.qvgs"
            if n % 2:
                b = busy_or(c.snapshot_bytes)
            else:
                b = busy_or(lambda: (c.save(p), p.read_bytes())[1])
            with lock:
                counts["busy" if b is None else "snap"] += 1
            if b is not None:  # every snapshot taken loads (its checksums hold)
                type(c).from_snapshot_bytes(b, **(dense_kw(S=128) if dense else kw(INCR)))
            else:
                # A refused caller backs off, as a real one would: retrying in a tight
                # loop holds the GIL against the updater (on a loaded 2-core machine it
                # then made 11 updates in 3 s and every save found the cache busy).
                time.sleep(0.0005)
            n += 1

    errors = run_threads([updater, saver], 3.0)
    assert not errors, errors
    assert counts["snap"] > 0 and counts["updates"] > 0, counts


def test_reset_and_load_beside_updates_of_another_cache_never_deadlock(tmp_path):
    a = qt.QVGPackedCausalKVCache(**kw(INCR))
    b = qt.QVGPackedCausalKVCache(**kw(INCR))
    feed(b, 3)
    snap = b.snapshot_bytes()
    p = tmp_path / "b.qvgs"
    b.save(p)

    def updater(stop):
        i = 0
        while not stop.is_set():
            k, v = chunk(i % 5)
            a.update_and_get_attention_kv(key=k, value=v, current_chunk_start=16 * i)
            i = i + 1 if i < 40 else 0
            if i == 0:
                a.reset_indices()

    def resetter(stop):
        while not stop.is_set():
            b.reset_indices()
            qt.QVGPackedCausalKVCache.load(p, **kw(INCR))
            qt.QVGPackedCausalKVCache.from_snapshot_bytes(snap, **kw(INCR))

    assert not run_threads([updater, resetter], 3.0)


def test_stress_two_threads_per_cache_on_shared_and_separate_caches(tmp_path):
    """Bounded (about 8 s): no crash, no hang, every snapshot taken loads, the loser of
    a race gets the documented RuntimeError, and each cache works afterwards."""
    caches = [qt.QVGPackedCausalKVCache(**kw(INCR)), qt.QVGPackedCausalKVCache(**kw(INCR)),
              qt.CausalSelfAttentionKVCache(**dense_kw(S=128))]
    state = {"busy": 0, "loaded": 0, "updates": 0, "snapshots": 0}
    lock = threading.Lock()

    def worker(seed, c):
        extra = kw(INCR) if isinstance(c, qt.QVGPackedCausalKVCache) else dense_kw(S=128)

        def run(stop):
            rng = np.random.default_rng(seed)
            while not stop.is_set():
                op = int(rng.integers(0, 6))
                try:
                    if op <= 2:
                        ge = cursors(c)[0]
                        if ge >= 16 * 40:
                            c.reset_indices()
                            continue
                        k, v = chunk(int(rng.integers(0, 9)))
                        try:
                            c.update_and_get_attention_kv(key=k, value=v, current_chunk_start=ge)
                        except (ValueError, NotImplementedError):
                            continue  # the other thread moved the cursors: no longer an advance at global_end
                        except RuntimeError as e:
                            if BUSY in str(e):
                                raise
                            continue  # likewise, a typed refusal of the write
                        key = "updates"
                    elif op == 3:
                        # A snapshot taken must load; only the busy refusal
                        # of taking it is expected (a ValueError loading it is a failure).
                        snap = c.snapshot_bytes()
                        with lock:
                            state["snapshots"] += 1
                        type(c).from_snapshot_bytes(snap, **extra)
                        key = "loaded"
                    elif op == 4:
                        p = tmp_path / f"w{seed}.qvgs"
                        c.save(p)
                        with lock:
                            state["snapshots"] += 1
                        type(c).load(p, **extra)
                        key = "loaded"
                    else:
                        c.reset_indices()
                        key = "resets"
                except RuntimeError as e:
                    if BUSY not in str(e):
                        raise
                    key = "busy"
                with lock:
                    state[key] = state.get(key, 0) + 1
        return run

    fns = [worker(10 * j + i, c) for j, c in enumerate(caches) for i in range(2)]
    errors = run_threads(fns, 8.0)
    assert not errors, errors
    assert state["loaded"] > 0 and state["updates"] > 0 and state["busy"] > 0, state
    assert state["loaded"] == state["snapshots"], state  # every snapshot taken loaded
    for c in caches:  # each cache still answers as a fresh one
        c.reset_indices()
        fresh = (qt.QVGPackedCausalKVCache(**kw(INCR)) if isinstance(c, qt.QVGPackedCausalKVCache)
                 else qt.CausalSelfAttentionKVCache(**dense_kw(S=128)))
        x, y = feed(c, 3), feed(fresh, 3)
        assert torch.equal(x.k, y.k) and torch.equal(x.v, y.v)


# ---- index tensors, quant_args, argument types -------------------------------------------

Q2 = qt.QVGKVQuantArgs(bits=2, centroids=16)


@pytest.mark.parametrize("bad,match", [
    (torch.zeros(1, dtype=torch.int8), "dtype torch.int64"),
    (torch.zeros(1, dtype=torch.uint8), "dtype torch.int64"),
    (torch.zeros(1, dtype=torch.int16), "dtype torch.int64"),
    (torch.zeros(1, dtype=torch.float32), "dtype torch.int64"),
    (torch.zeros(1, dtype=torch.float16), "dtype torch.int64"),
    (torch.zeros(0, dtype=torch.long), "exactly one element"),
    (torch.zeros(2, dtype=torch.long), "exactly one element"),
    (0, "must be a torch.Tensor"),
    (None, "must be a torch.Tensor"),
    (np.zeros(1, dtype=np.int64), "must be a torch.Tensor"),
])
@pytest.mark.parametrize("which", ["global_end_index", "local_end_index"])
@pytest.mark.parametrize("dense", [False, True])
def test_index_tensors_are_checked_at_construction(bad, match, which, dense):
    args = dense_kw() if dense else kw(Q2)
    args[which] = bad
    cls = qt.CausalSelfAttentionKVCache if dense else qt.QVGPackedCausalKVCache
    with pytest.raises(ValueError, match=f"^{which} .*{match}"):
        cls(**args)


def test_an_int32_index_tensor_that_cannot_hold_the_cursor_fails_before_the_cache_changes():
    c = qt.QVGPackedCausalKVCache(**kw(Q2, global_end_index=torch.zeros(1, dtype=torch.int32),
                                       local_end_index=torch.zeros(1, dtype=torch.int32)))
    feed(c, 2)
    before = (c._c.global_end, c._c.resident_nbytes(), cursors(c))
    k, v = chunk(0)
    with pytest.raises(ValueError, match="int32 tensor and cannot hold the cursor"):
        c.update_and_get_attention_kv(key=k, value=v, current_chunk_start=2**31 - 8)
    assert (c._c.global_end, c._c.resident_nbytes(), cursors(c)) == before


@pytest.mark.parametrize("bad", [{"kv_cache_quant": "int2"}, {"bits": 2}, "int2", 2])
def test_quant_args_of_another_type_is_refused(bad):
    with pytest.raises(ValueError, match="^quant_args must be a QVGKVQuantArgs"):
        qt.QVGPackedCausalKVCache(**kw(bad))
    with pytest.raises(ValueError, match="^quant must be a QVGKVQuantArgs"):
        qt.encode(torch.zeros(1, 8, 2, 64), bad)


def test_the_engines_own_class_and_none_are_accepted():
    class QVGKVQuantArgs:  # the engine's class: its attributes, another type
        bits = 2
        centroids = 16
        block_size = 64
        stages = 1
        kmeans_iters = 2
        asymmetric = False
        keep_recent_chunks = 1
        sink = True
        sink_keep_chunks = 0

    c = qt.QVGPackedCausalKVCache(**kw(QVGKVQuantArgs()))
    feed(c, 4)
    assert any(s["packed"] for s in c._segments())
    qt.QVGPackedCausalKVCache(**kw(None))


@pytest.mark.parametrize("arg,value,match", [
    ("recent_window_tokens", 1.5, "^recent_window_tokens must be an integer"),
    ("recent_window_tokens", float("nan"), "^recent_window_tokens must be an integer"),
    ("recent_window_tokens", 2**63, "^recent_window_tokens must be an integer"),
    ("recent_window_tokens", "3", "^recent_window_tokens must be an integer"),
    ("current_chunk_start", 0.0, "^current_chunk_start must be an integer"),
    ("current_chunk_start", None, "^current_chunk_start must be an integer"),
    ("cache_head_start", "0", "^cache_head_start must be an integer"),
    ("key", None, "^key must be a torch.Tensor"),
    ("key", np.zeros((1, 16, H, D), dtype=np.float32), "^key must be a torch.Tensor"),
    ("key", [[0.0]], "^key must be a torch.Tensor"),
    ("value", None, "^value must be a torch.Tensor"),
])
@pytest.mark.parametrize("dense", [False, True])
def test_wrong_python_types_name_the_argument(arg, value, match, dense):
    c = qt.CausalSelfAttentionKVCache(**dense_kw(S=128)) if dense else qt.QVGPackedCausalKVCache(**kw(Q2))
    feed(c, 1)
    before = cursors(c)
    k, v = chunk(1)
    call = dict(key=k, value=v, current_chunk_start=16)
    call[arg] = value
    with pytest.raises(ValueError, match=match):
        c.update_and_get_attention_kv(**call)
    assert cursors(c) == before


def test_a_sparse_key_and_wrong_constructor_types_name_the_argument():
    c = qt.QVGPackedCausalKVCache(**kw(Q2))
    k, v = chunk(0)
    with pytest.raises(ValueError, match="^key must be a dense"):
        c.update_and_get_attention_kv(key=k.to_sparse(), value=v, current_chunk_start=0)
    with pytest.raises(ValueError, match="^cache_size must be an integer"):
        qt.QVGPackedCausalKVCache(**kw(Q2, cache_size=2**63))
    with pytest.raises(ValueError, match="^batch_size must be an integer"):
        qt.QVGPackedCausalKVCache(**kw(Q2, batch_size=1.0))
    with pytest.raises(ValueError, match="^kwargs must be a dict"):
        qt.QVGKVQuantArgs.from_dict(None)


# ---- buffers, views, decode --------------------------------------------------------------

def test_dense_buffers_that_share_memory_are_refused():
    t = torch.zeros(1, 32, H, D)
    args = dense_kw()
    for k, v in ((t, t), (t[:, :16], t[:, 8:24]), (t.view(-1)[: 16 * H * D].view(1, 16, H, D), t[:, :16])):
        args.update(k=k, v=v, cache_size=k.shape[1], sink_tokens=0)
        with pytest.raises(ValueError, match="^k and v must not share memory"):
            qt.CausalSelfAttentionKVCache(**args)
    args.update(k=t[:, :16], v=t[:, 16:], cache_size=16)  # disjoint halves of one tensor are fine
    qt.CausalSelfAttentionKVCache(**args)


@pytest.mark.parametrize("dense", [False, True])
def test_a_negative_view_is_read_as_its_values(dense):
    k, v = chunk(0)
    a = qt.CausalSelfAttentionKVCache(**dense_kw(S=128)) if dense else qt.QVGPackedCausalKVCache(**kw(None))
    b = qt.CausalSelfAttentionKVCache(**dense_kw(S=128)) if dense else qt.QVGPackedCausalKVCache(**kw(None))
    x = a.update_and_get_attention_kv(key=(-k)._neg_view(), value=v, current_chunk_start=0)
    y = b.update_and_get_attention_kv(key=k, value=v, current_chunk_start=0)
    assert torch.equal(x.k, y.k)
    q = qt.QVGKVQuantArgs(bits=4, centroids=4, block_size=32)
    e1, e2 = qt.encode((-k)._neg_view(), q), qt.encode(k, q)
    assert torch.equal(qt.decode(e1), qt.decode(e2))


def test_a_dense_buffer_with_the_negative_bit_is_refused():
    args = dense_kw()
    args["k"] = torch.zeros(1, 32, H, D)._neg_view()
    with pytest.raises(ValueError, match="^k must not carry torch's negative or conjugate bit"):
        qt.CausalSelfAttentionKVCache(**args)


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def test_decode_checks_the_arrays_before_allocating_the_claimed_shape():
    e = qt.encode(torch.randn(1, 16, 2, 64), qt.QVGKVQuantArgs(bits=2, centroids=16))
    before = rss_kib()
    for shape in ((2**19, 32, 2, 64), (2**31, 16, 2, 64)):
        layout = dict(e.layout, shape=shape)
        with pytest.raises(ValueError, match="must hold .* bytes for this layout"):
            qt.decode(qt.Encoding(layout, e.arrays))
    assert rss_kib() - before < 256 * 1024  # the 2.6 GiB of the claimed shape were never touched


# ---- one option parser -------------------------------------------------------------------

@pytest.mark.parametrize("cfg", ["bits=4,bits=2", "bits=4,", ",bits=4", "bits=4,,stages=2", "asymmetric=yes",
                                 "asymmetric=on"])
def test_role_configs_follow_one_rule(cfg):
    with pytest.raises(ValueError):
        qt.QVGKVQuantArgs(bits=4, k_config=cfg).validate()


@pytest.mark.parametrize("flag,value", [("kv_cache_quant_asymmetric", "yes"), ("kv_cache_quant_asymmetric", "on"),
                                        ("kv_cache_quant_span_break_ratio", "0x10"),
                                        ("kv_cache_quant_span_break_ratio", "0X1p3"),
                                        ("kv_cache_quant_profile", "")])
def test_engine_flags_follow_one_rule(flag, value):
    with pytest.raises(ValueError):
        qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2", "kv_cache_quant_span_mode": "incremental",
                                     flag: value})


def test_typed_flags_read_as_their_text():
    q = qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2", "kv_cache_quant_asymmetric": True,
                                     "kv_cache_quant_span_mode": "incremental",
                                     "kv_cache_quant_span_break_ratio": 1.5, "kv_cache_quant_k_asymmetric": False})
    assert q.asymmetric is True and q.span_break_ratio == 1.5 and q.k_config == "asymmetric=false"

