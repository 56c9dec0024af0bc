"""The lines scoring of `check` (workbench.running.runner_jobs.check, the window's end-to-end
check) models llama.cpp's CPU activation rounding as the chunked KLD does (emulate="llama.cpp",
workbench/running/act_emulate.py): on the quantized passes only, so the float model's figures
do not move; and check_plan turns it on for target llama.cpp in either scoring."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from workbench.cli.common import default_model_path  # noqa: E402
from workbench.core.progress import run  # noqa: E402
from workbench.formats.loaders import open_model  # noqa: E402
from workbench.quant.plan import Plan  # noqa: E402

SAMPLES = 4


@pytest.fixture(scope="module")
def demo():
    return open_model(str(default_model_path()))


def _check(model, plan, emulate=None):
    from workbench.running.runner_jobs import check
    return run(check(model, plan, None, SAMPLES, emulate=emulate))


def test_lines_scoring_rounds_the_quantized_activations(demo):
    """The demo causal LM at q4_k (rows of 256 / 512: every Linear input becomes Q8_K in
    llama.cpp): the rounding adds error, so the KL reads higher; the float model's perplexity
    is the same number to the last bit (its passes are not rounded)."""
    plan = Plan(default="q4_k")
    plain = _check(demo, plan)
    emul = _check(demo, plan, "llama.cpp")
    print(f"\nlines scoring, q4_k: kl_mean {plain['kl_mean']:.6f} plain, "
          f"{emul['kl_mean']:.6f} emulated")
    assert emul["emulate"] == "llama.cpp" and "emulate" not in plain
    assert emul["tokens"] == plain["tokens"]
    assert emul["ppl_base"] == plain["ppl_base"]
    assert emul["kl_mean"] > plain["kl_mean"]
    assert emul["ppl"] != plain["ppl"]


def test_an_fp32_plan_has_nothing_to_round(demo):
    """llama.cpp multiplies F32 weights by the row as it is: no hook, the same figures."""
    plan = Plan(default="fp32")
    plain, emul = _check(demo, plan), _check(demo, plan, "llama.cpp")
    assert {k: v for k, v in emul.items() if k != "emulate"} == plain


def test_check_plan_emulates_lines_for_target_llama_cpp(demo):
    from workbench.api import check_plan
    plan = Plan(default="q4_k")
    auto = check_plan(demo, plan, samples=SAMPLES, scoring="lines", target="llama.cpp")
    off = check_plan(demo, plan, samples=SAMPLES, scoring="lines", target="llama.cpp",
                     emulate=None)
    assert auto["emulate"] == "llama.cpp" and "emulate" not in off
    assert auto["kl_mean"] > off["kl_mean"]
    assert "emulate" not in check_plan(demo, plan, samples=SAMPLES, scoring="lines")


def test_lines_scoring_refuses_an_unknown_emulation_before_any_work(demo):
    from workbench.core.errors import WorkbenchError
    from workbench.running.runner_jobs import check
    with pytest.raises(WorkbenchError, match="the only runtime emulated is 'llama.cpp'"):
        run(check(demo, Plan(default="q4_k"), None, SAMPLES, emulate="vllm"),
            lambda *a: pytest.fail("work started"))
