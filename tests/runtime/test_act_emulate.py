"""The in-process emulation of llama.cpp's CPU activation rounding (workbench/running/act_emulate.py)
against ggml's own code: Q8_K rows bit for bit (the CPU backend's quantize_row_q8_K is the
reference one), Q8_0 rows to ggml's reference quantizer (the CPU's AVX copy differs only in
rounding ties and 127/amax against 1/d); and on the demo causal LM, the emulation moves the
in-process KLD towards llama-perplexity's by the amount llama.cpp shows."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kernels import ggml_ref
from workbench.running.act_emulate import fake_q8_0, fake_q8_K, vec_dot_of

from .conftest import ROOT

pytestmark = pytest.mark.runtime


def _rows(seed=0):
    """Activation-like rows: Gaussian, a tiny row, an all-zero block, outliers of both signs
    (a negative one sets the Q8_K scale's sign)."""
    x = np.random.default_rng(seed).standard_normal((16, 512)).astype(np.float32)
    x[2] *= 1e-4
    x[3, :256] = 0.0
    x[4, 7], x[5, 300] = -60.0, 25.0
    return x


def _ggml_round_trip(ty, x):
    """x through libggml-base's quantize_row_<ty>_ref, then dequantize_row_<ty>."""
    if not ggml_ref.available():
        pytest.skip(f"libggml-base not found under {ggml_ref.cache_dir()}")
    lib = ggml_ref._load()
    q = getattr(lib, f"quantize_row_{ty}_ref")
    dq = getattr(lib, f"dequantize_row_{ty}")
    for f in (q, dq):
        f.restype = None
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    raw = np.empty((x.shape[0], ggml_ref.row_bytes(ty, x.shape[1])), np.uint8)
    q(x.ctypes.data, raw.ctypes.data, x.size)
    out = np.empty_like(x)
    dq(raw.ctypes.data, out.ctypes.data, x.size)
    return out


def test_q8_k_rows_match_ggml_bit_for_bit(llama_bin):
    import torch
    x = _rows()
    ours = fake_q8_K(torch.from_numpy(x)).numpy()
    theirs = _ggml_round_trip("q8_K", x)
    assert np.array_equal(ours, theirs)
    assert not np.array_equal(ours, x)           # it does round


def test_q8_0_rows_match_ggml(llama_bin):
    import torch
    x = _rows(1)
    ours = fake_q8_0(torch.from_numpy(x)).numpy()
    theirs = _ggml_round_trip("q8_0", x)
    # one code step apart at most (ties, the scale's last bit), and almost never
    step = np.abs(x).reshape(16, -1, 32).max(-1, keepdims=True) / 127
    diff = np.abs(ours - theirs).reshape(16, -1, 32)
    assert (diff <= step * 1.01 + 1e-30).all()
    assert (diff > 0).mean() < 1e-3


def test_vec_dot_types_follow_ggml_cpu():
    assert vec_dot_of("q4_k") == vec_dot_of("q6_k") == vec_dot_of("iq4_xs") == "q8_K"
    assert vec_dot_of("q4_0") == vec_dot_of("q8_0") == vec_dot_of("iq4_nl") == "q8_0"
    assert vec_dot_of("q5_1") == "q8_1"
    assert vec_dot_of("fp16") == "f16" and vec_dot_of("keep", "bfloat16") == "bf16"
    assert vec_dot_of("fp32") is None and vec_dot_of("keep", "float32") is None


def test_emulation_moves_the_demo_kld_to_llama_perplexity(llama_bin, tmp_path, monkeypatch):
    """check's in-process KLD with --target llama.cpp emulates llama.cpp's activation rounding
    by default (not with the default target). The demo causal LM at q4_k (every row 256 or 512 long: every Linear input becomes
    Q8_K in llama.cpp), 37 chunks of 64 tokens. Measured when written: in process 0.07942,
    emulated 0.08120, llama-perplexity 0.08158: the emulation raises the mean KLD by 82 % of
    the gap to the runtime."""
    from workbench.api import check_plan
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    monkeypatch.setenv("QW_LLAMA_BIN", str(llama_bin))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    text = tmp_path / "held-out.txt"
    text.write_bytes((ROOT / "resources" / "calibration.txt").read_bytes()[:6000])
    model = open_model(ROOT / "resources" / "demo_model")
    plan = Plan(default="q4_k")
    kw = dict(held_out=text, ctx=64, target="llama.cpp")
    plain = check_plan(model, plan, use_cache=False, emulate=None, **kw)["kld"]
    emul = check_plan(model, plan, use_cache=False, **kw)["kld"]    # on by default here
    assert "emulate" not in check_plan(model, plan, held_out=text, ctx=64, chunks=2)["kld"]
    tool = check_plan(model, plan, runtime="llama.cpp", **kw)["kld"]
    print(f"\nin process {plain['mean']:.5f}, emulated {emul['mean']:.5f}, "
          f"llama-perplexity {tool['mean']:.5f}")
    assert plain["tokens"] == emul["tokens"] == tool["tokens"] == 37 * 31
    assert emul["emulate"] == "llama.cpp" and "emulate" not in plain
    gap = tool["mean"] - plain["mean"]
    assert gap > 0.001                     # the runtime reads higher than the plain figure
    moved = emul["mean"] - plain["mean"]   # the emulation: the same direction, most of the way
    assert 0.5 * gap < moved < 1.3 * gap
    assert abs(tool["mean"] - emul["mean"]) < 0.4 * gap
    assert emul["p999"] > plain["p999"]


def test_an_unknown_emulation_is_refused_before_any_work():
    from workbench.api import check_plan
    from workbench.core.errors import WorkbenchError
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    model = open_model(ROOT / "resources" / "demo_model")
    with pytest.raises(WorkbenchError, match=r"emulate is 'vllm': choose one of auto, llama.cpp"):
        check_plan(model, Plan(default="q4_k"), emulate="vllm",
                   progress=lambda *a: pytest.fail("work started"))
