import pytest

pytest.importorskip("transformers")

from workbench.formats.loaders import open_model  # noqa: E402
from workbench.quant.plan import KEEP, Plan  # noqa: E402
from workbench.core.progress import run  # noqa: E402
from workbench.running.runner_jobs import check  # noqa: E402
from workbench.cli.common import default_model_path  # noqa: E402


def test_check_demo_model_keep_is_exact_and_q4_0_is_worse_than_q8_0():
    m = open_model(str(default_model_path()))
    keep = run(check(m, Plan(default=KEEP), samples=8))
    assert keep["model_kind"] == "causal-lm" and keep["samples"] == 8
    assert keep["kl_max"] < 1e-6 and keep["top1_agree"] == 1.0
    assert keep["ppl"] == pytest.approx(keep["ppl_base"], rel=1e-6)
    q8 = run(check(m, Plan(default="q8_0"), samples=8))
    q4 = run(check(m, Plan(default="q4_0"), samples=8))
    assert 0 < q8["kl_mean"] < q4["kl_mean"]
    assert q8["top1_agree"] >= q4["top1_agree"]
    # the original weights are restored after each check
    again = run(check(m, Plan(default=KEEP), samples=8))
    assert again["kl_max"] < 1e-6
