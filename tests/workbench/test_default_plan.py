"""The plan a newly opened model starts from (workbench.quant.plan.default_plan): a float
model's is int8-channel for every weight matrix; a quantized source's keeps each tensor at no
more bits than it has (a published GGUF's default plan must not make the model bigger)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.core.progress import run
from workbench.formats.loaders import open_model
from workbench.quant.evaluate import evaluate
from workbench.quant.plan import KEEP, Plan, default_plan


def test_a_float_model_starts_at_int8_channel(tiny_arch):
    m = open_model(str(tiny_arch("llama")))
    assert default_plan(m) == Plan()


@pytest.mark.parametrize("scheme", ["q4_0", "q8_0"])
def test_a_quantized_gguf_keeps_its_tensors_as_stored(tiny_arch, tmp_path, scheme):
    from tests.tiny_gguf import write_llama_gguf
    m = open_model(str(write_llama_gguf(tiny_arch("llama"), tmp_path, scheme)))
    matrices = [n for n, i in m.tensors.items() if i.ndim >= 2]
    assert matrices and all(m.info(n).dtype == scheme.upper() for n in matrices)
    plan = default_plan(m)
    assert set(plan.resolve(m).values()) == {KEEP}
    t = run(evaluate(m, plan)).totals
    assert t.bytes_after == t.bytes_before          # not one byte more than the file holds
    # the old default (int8-channel everywhere) re-quantized them: bigger for q4_0
    old = run(evaluate(m, Plan())).totals
    if scheme == "q4_0":
        assert old.bytes_after > 1.5 * t.bytes_after


def test_a_mixed_source_requantizes_only_what_gets_fewer_bits(tmp_path):
    """F16 matrices get int8-channel (fewer bits); the quantized one and the norm are kept."""
    import gguf
    path = tmp_path / "mixed.gguf"
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((64, 64)).astype(np.float16))
    w.add_tensor("blk.0.ffn_down.weight", rng.standard_normal((64, 64)).astype(np.float16))
    q = gguf.quants.quantize(rng.standard_normal((64, 64)).astype(np.float32),
                             gguf.GGMLQuantizationType.Q4_0)
    w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = open_model(str(path))
    a = default_plan(m).resolve(m)
    assert a == {"blk.0.ffn_up.weight": "int8-channel", "blk.0.ffn_down.weight": "int8-channel",
                 "blk.0.attn_q.weight": KEEP, "blk.0.attn_norm.weight": KEEP}
    t = run(evaluate(m, default_plan(m))).totals
    assert t.bytes_after < t.bytes_before
