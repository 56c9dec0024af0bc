"""`allocate --target mlx` (workbench.quant.runtimes "mlx", workbench.planning.budget): the
candidates are the MLX schemes, MLX's conventions decide what is quantized (Linear, Embedding
and expert weights; norms stay float), the experts of a projection share a scheme, and the
predicted file size is the size of the safetensors `export --format mlx` writes, to the byte."""

from __future__ import annotations

import pytest

import workbench as qw
from workbench.planning.budget import Budget
from workbench.quant.plan import KEEP, Plan
from workbench.quant.runtimes import candidate_schemes, plan_decisions

pytest.importorskip("mlx.core")


def test_candidates_are_the_mlx_schemes_and_only_theirs():
    mlx = candidate_schemes("mlx")
    assert mlx == [f"mlx-q{b}-g{g}" for b in (2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] + [
        "mlx-mxfp4", "mlx-nvfp4", "mlx-mxfp8"]
    # the MLX schemes are written by the MLX export only: not candidates of "any"
    assert not [s for s in candidate_schemes("any") if s.startswith("mlx-")]


def test_conventions_what_is_quantized(tiny_arch):
    model = qw.open_model(str(tiny_arch("qwen3_moe")))
    d = plan_decisions(model, Plan(default="mlx-q4-g128"), "mlx")
    for n, dec in d.items():
        info = model.info(n)
        if info.ndim == 1:
            assert dec.applied == KEEP, n                 # norms and biases stay float
        elif info.role in ("embedding", "lm_head", "expert", "attn_q", "mlp_down"):
            # float32 model: the registered scheme (float16 scales)
            assert dec.applied.startswith("mlx-q4-g"), (n, dec)
    with pytest.raises(qw.WorkbenchError, match="MLX has no mode for int4-g128"):
        plan_decisions(model, Plan(default="int4-g128"), "mlx")


def test_a_group_that_does_not_divide_falls_back_to_a_smaller_one():
    model = qw.open_model()                     # bfloat16: the bfloat16 export's schemes
    d = plan_decisions(model, Plan(default="mlx-q4-g128"), "mlx")
    assert {x.applied for x in d.values()} == {"mlx-q4-g128@bf16", KEEP}
    from workbench.quant.runtimes import get_runtime
    assert get_runtime("mlx").shape_fallback("mlx-q4-g128") == "mlx-q4-g64"
    assert get_runtime("mlx").shape_fallback("mlx-q4-g32") is None


@pytest.mark.parametrize("which", ["demo", "qwen3_moe"])
def test_predicted_size_is_the_written_safetensors(which, tiny_arch, tmp_path):
    model = qw.open_model() if which == "demo" else qw.open_model(str(tiny_arch(which)))
    a = qw.allocate_plan(model, Budget.bits_per_weight(4.5), target="mlx", measure="weight",
                         progress=None)
    assert a.target == "mlx"
    chosen = {r.scheme for r in a.plan.rules} | {a.plan.default}
    assert chosen <= set(candidate_schemes("mlx")) | {KEEP}
    predicted = a.accounting["file_bytes"]
    assert predicted["format"] == "mlx"
    out = tmp_path / "mlx"
    info = qw.export_plan(model, a.plan, "mlx", out, progress=None)
    written = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    assert predicted["bytes"] == written == info["safetensors_bytes"]
    if which != "demo":
        return
    # a file budget of that size solves for the MLX folder and fits it
    b = qw.allocate_plan(model, Budget.file_bytes(written), target="mlx", measure="weight",
                         progress=None)
    assert b.budget.format == "mlx" and b.accounting["file_bytes"]["bytes"] <= written


def test_frontier_for_mlx_has_the_mlx_uniform_plans_and_no_llama_recipes():
    notes = []
    f = qw.compute_frontier(qw.open_model(), target="mlx", measure="weight", points=2,
                            progress=None, say=notes.append)
    assert f.table.runtime == "mlx" and not f.recipes
    assert {p.label for p in f.uniform} <= set(candidate_schemes("mlx"))
    assert any("recipes are left out" in n for n in notes)
    assert all(p.bits_per_weight > 2 for p in f.allocated)


def test_allocations_scheme_counts_count_the_dtype_variants():
    """The demo model is bfloat16, so its tensors get the @bf16 variants of the MLX schemes;
    the allocation's scheme counts (allocate's summary line) still count them by scheme (they
    printed an empty line)."""
    model = qw.open_model()
    a = qw.allocate_plan(model, Budget.bits_per_weight(4.5), target="mlx", measure="weight",
                         progress=False)
    counts = a.to_dict()["schemes"]
    quantized = [r for r in a.evaluation.tensors.values() if r.scheme and r.scheme != KEEP
                 and r.scheme.startswith("mlx-")]
    assert quantized and any("@" in r.scheme for r in quantized)
    assert sum(counts.values()) == len(quantized) and all(s.startswith("mlx-") for s in counts)
