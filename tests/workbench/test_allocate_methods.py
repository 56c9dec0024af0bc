"""(scheme, method) pairs in the allocation (workbench.allocate_methods, `allocate --methods`)."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from workbench.allocate_methods import output_error, pair_errors, parse_methods
from workbench.errors import WorkbenchError
from workbench.methods.stats import LayerStats


def _correlated_stats(rows=4000, cols=64, seed=0):
    """Inputs whose channels are strongly correlated (a few latent factors), the case where
    GPTQ's compensation cancels through C and a diagonal measure cannot see it."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((rows, 8))
    X = z @ rng.standard_normal((8, cols)) + 0.1 * rng.standard_normal((rows, cols))
    H = 2.0 * X.T @ X / rows
    return LayerStats(d=np.diag(H) / 2.0, H=H, n=rows), X


def test_pair_errors_rank_gptq_by_the_full_output_error():
    st, X = _correlated_stats()
    w = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    e = pair_errors(w, "q4_0", st, ["rtn", "imatrix", "gptq"])
    assert set(e) == {"rtn", "imatrix", "gptq"}
    # e_m is the layer output error on the calibration inputs: check it against X directly
    from workbench.evaluate import quantize
    from workbench.schemes import get_scheme
    wq = get_scheme("q4_0").dequantize(quantize(w, "q4_0")).reshape(w.shape)
    direct = float((((X @ (wq - w).T.astype(np.float64)) ** 2).sum()) / len(X))
    assert e["rtn"] == pytest.approx(direct, rel=1e-6)
    assert e["gptq"] < 0.7 * e["rtn"]   # 62.8 against 122.5 here
    assert e["imatrix"] < e["rtn"]
    # the diagonal measure ranks them the other way: why the pairs use the full C
    from workbench.methods.base import get_method
    dg = get_method("gptq").quantize(w, "q4_0", st)
    dwg = get_scheme("q4_0").dequantize(dg).reshape(w.shape) - w
    assert float((dwg.astype(np.float64) ** 2 * st.d).sum()) > \
        float(((wq - w).astype(np.float64) ** 2 * st.d).sum())
    # row weights: a row weighted 0 does not count
    a = np.zeros(32)
    a[0] = 1.0
    assert output_error(wq - w, st.H / 2, a) == pytest.approx(
        float((X @ (wq - w)[0].astype(np.float64)) @ (X @ (wq - w)[0].astype(np.float64)))
        / len(X), rel=1e-6)


def test_parse_methods():
    assert parse_methods("auto") is None
    assert parse_methods("gptq") == ["rtn", "gptq"]
    assert parse_methods("rtn") == ["rtn"]
    with pytest.raises(WorkbenchError, match="awq"):
        parse_methods("rtn,awq")


@pytest.fixture(scope="module")
def calib_small(tmp_path_factory):
    from workbench.calibration import DEFAULT_CALIB
    lines = [s for s in open(DEFAULT_CALIB).read().splitlines() if s.strip()][:16]
    p = tmp_path_factory.mktemp("calib") / "calib.txt"
    p.write_text("\n".join(lines) + "\n")
    return p


def _allocate(capsys, folder, calib, out, *more):
    from workbench.cli import main
    rc = main(["allocate", str(folder), "--target", "llama.cpp", "--budget-bpw", "5.0",
               "--schemes", "q4_0,q5_0,q8_0", "--calib", str(calib), "--samples", "16",
               "-o", str(out), "--json", *more])
    o, _ = capsys.readouterr()
    assert rc == 0
    return json.loads(o)


@pytest.mark.slow   # three fisher passes, a statistics pass and an export: ~30 s idle
def test_allocate_pairs_pick_methods_and_export_applies_them(tiny_arch, calib_small, tmp_path,
                                                              capsys):
    folder = tiny_arch("llama")
    res = _allocate(capsys, folder, calib_small, tmp_path / "pairs.json")
    assert res["methods_weighed"] == ["rtn", "imatrix", "gptq"]
    assert res["bytes"] <= res["budget_bytes"]
    plan = json.loads((tmp_path / "pairs.json").read_text())
    by = {r["match"]: r for r in plan["rules"]}
    chosen = {r.get("method", "rtn") for r in plan["rules"]}
    assert res["methods"].get("gptq", 0) > 0 and "gptq" in chosen
    assert sum(res["methods"].values()) == len([n for n in by if n.endswith("proj.weight")]) + 2

    # --methods rtn: the scheme-only plan, exactly what the table's solver gives without methods
    rtn = _allocate(capsys, folder, calib_small, tmp_path / "rtn.json", "--methods", "rtn")
    assert rtn["methods"] == {"rtn": len(by)} and rtn["methods_weighed"] == ["rtn"]
    from workbench.loaders import open_model
    from workbench.progress import run
    from workbench.sensitivity import sensitivity_table_job
    model = open_model(folder)
    table = run(sensitivity_table_job(model, ["q4_0", "q5_0", "q8_0"], "fisher",
                                      str(calib_small), None, 16, "llama.cpp"))
    ref, _ = table.solve(table.budget_bytes(None, 5.0))
    assert json.loads((tmp_path / "rtn.json").read_text()) == ref.to_dict()
    # the pairs changed the allocation's objective: a lower predicted error at the same budget
    assert res["predicted"] < rtn["predicted"]

    # the exported GGUF holds each tensor's method's codes
    from workbench.cli import main
    gg = tmp_path / "pairs.gguf"
    assert main(["export", str(folder), "--plan", str(tmp_path / "pairs.json"), "--format",
                 "gguf", "--target", "llama.cpp", "--calib", str(calib_small), "-o",
                 str(gg)]) == 0
    capsys.readouterr()
    name = next(n for n, r in by.items() if r.get("method") == "gptq" and "mlp" in n)
    from workbench.evaluate import quantize
    from workbench.export.llama_tensor_types import detect_family, llama_cpp_name
    from workbench.methods.apply import prepare
    from workbench.plan import Plan
    p = Plan.load(str(tmp_path / "pairs.json"))
    mm = run(prepare(model, p, calib=str(calib_small), runtime="llama.cpp"))
    scheme = by[name]["scheme"]
    w = model.read_matrix(name)
    want = np.ascontiguousarray(mm.quantize_tensor(name, w, scheme).arrays["blocks"]).tobytes()
    plain = np.ascontiguousarray(quantize(w, scheme).arrays["blocks"]).tobytes()
    assert want != plain
    g = llama_cpp_name(name, detect_family(model))
    t = next(t for t in gguf.GGUFReader(str(gg)).tensors if t.name == g)
    assert np.asarray(t.data).tobytes() == want
