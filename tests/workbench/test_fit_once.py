"""allocate → check → export of one plan with GPTQ fits GPTQ once: `allocate` fits the chosen
tensors on the whole calibration text and keeps the fits (workbench.running.method_fits, keyed
by the model's, the plan's and the calibration text's content, not by the Hessian), so `check`
and `export` run neither the calibration pass nor a fit. Counted, not timed."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.core import cache as C
from workbench.quant.methods.gptq import GPTQ
from workbench.running import methods_apply

from tests.workbench.test_allocate_methods import calib_small  # noqa: F401 - a fixture


@pytest.fixture(autouse=True)
def caches(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    C._MEMO.clear()


@pytest.fixture
def counts(monkeypatch):
    """{"passes": calibration passes (collect_stats), "fits": GPTQ fits}, counted."""
    n = {"passes": 0, "fits": 0}
    real_stats, real_fit = methods_apply.collect_stats, GPTQ._quantize

    def stats(*a, **k):
        n["passes"] += 1
        return (yield from real_stats(*a, **k))

    def fit(self, *a, **k):
        n["fits"] += 1
        return real_fit(self, *a, **k)
    monkeypatch.setattr(methods_apply, "collect_stats", stats)
    monkeypatch.setattr(GPTQ, "_quantize", fit)
    return n


@pytest.fixture
def calib(calib_small):
    return calib_small


def _check(capsys, folder, plan, calib, *more):
    capsys.readouterr()
    assert main(["check", str(folder), "--plan", str(plan), "--target", "llama.cpp",
                 "--calib", str(calib), "--json", *more]) == 0
    d = json.loads(capsys.readouterr().out)
    d.pop("seconds", None)
    for k in ("cache", "seconds"):          # the KLD cache's state, its wall time
        d.get("kld", {}).pop(k, None)
    return d


def test_allocate_check_export_fit_gptq_once(tiny_arch, calib, tmp_path, capsys, counts):
    folder = tiny_arch("llama")
    plan = tmp_path / "plan.json"
    assert main(["allocate", str(folder), "--target", "llama.cpp", "--budget-bpw", "5.0",
                 "--schemes", "q4_0,q5_0,q8_0", "--calib", str(calib), "--samples", "16",
                 "--methods", "rtn,gptq", "-o", str(plan)]) == 0
    err = capsys.readouterr().err
    gptq = [r for r in json.loads(plan.read_text())["rules"] if r.get("method") == "gptq"]
    assert gptq, "the allocation chose gptq nowhere"
    # allocate: the two fold passes (weighing) and the whole text's (the kept fits)
    assert counts["passes"] == 3
    assert "`check` and `export` of this plan read them" in err
    after_allocate = dict(counts)

    kept = _check(capsys, folder, plan, calib)
    assert counts == after_allocate                    # check: no pass, no fit
    assert main(["export", str(folder), "--plan", str(plan), "--format", "gguf",
                 "--target", "llama.cpp", "--calib", str(calib),
                 "-o", str(tmp_path / "a.gguf")]) == 0
    assert counts == after_allocate                    # export: no pass, no fit
    assert "read from the cache" in capsys.readouterr().err

    # the kept fits are the fits: a check that fits afresh gives the same figures
    assert _check(capsys, folder, plan, calib, "--no-cache") == kept
    assert counts["passes"] == after_allocate["passes"] + 1
    assert counts["fits"] >= after_allocate["fits"] + len(gptq)


def test_another_calibration_text_misses(tiny_arch, calib, tmp_path, capsys, counts):
    """The key holds the calibration text's content: another text runs the pass and fits."""
    folder = tiny_arch("llama")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "default": "keep", "rules": [
        {"match": "model.layers.0.mlp.down_proj.weight", "scheme": "q4_0", "method": "gptq"}]}))
    _check(capsys, folder, plan, calib)
    assert counts == {"passes": 1, "fits": 1}
    _check(capsys, folder, plan, calib)
    assert counts == {"passes": 1, "fits": 1}          # kept: no pass
    other = tmp_path / "other.txt"
    other.write_text(calib.read_text().replace("the", "a"))
    _check(capsys, folder, plan, other)
    assert counts == {"passes": 2, "fits": 2}
