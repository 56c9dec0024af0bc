"""(scheme, method) pairs in the allocation (workbench.planning.allocate_methods, `allocate --methods`)."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from workbench.planning.allocate_methods import output_error, pair_errors, parse_methods
from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP
from workbench.quant.methods.stats import LayerStats


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
    from workbench.quant.evaluate import quantize
    from workbench.schemes import get_scheme
    wq = get_scheme("q4_0").dequantize(quantize(w, "q4_0")).reshape(w.shape)
    direct = float((((X @ (wq - w).T.astype(np.float64)) ** 2).sum()) / len(X))
    assert e["rtn"] == pytest.approx(direct, rel=1e-6)
    assert e["gptq"] < 0.7 * e["rtn"]   # 62.8 against 122.5 here
    assert e["imatrix"] < e["rtn"]
    # the diagonal measure ranks them the other way: why the pairs use the full C
    from workbench.quant.methods.base import get_method
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


def test_pair_errors_on_a_held_out_fold_expose_gptq_overfitting():
    """GPTQ fitted on fewer tokens than input channels compensates along directions that only
    its own calibration rows have: scored on those rows it beats rtn, scored on held-out rows
    of the same distribution it loses. The allocator scores on the held-out fold."""
    rng = np.random.default_rng(3)
    cols = 64
    mix = rng.standard_normal((cols, cols)) / np.sqrt(cols) + np.eye(cols)

    def stats(rows):
        X = rng.standard_normal((rows, cols)) @ mix
        H = 2.0 * X.T @ X / rows
        return LayerStats(d=np.diag(H) / 2.0, H=H, n=rows)
    fit, held = stats(24), stats(20000)
    w = rng.standard_normal((48, cols)).astype(np.float32)
    own = pair_errors(w, "q4_0", fit, ["rtn", "gptq"])
    out = pair_errors(w, "q4_0", fit, ["rtn", "gptq"], held=held)
    assert own["gptq"] < 0.6 * own["rtn"]          # on its own 24 rows: 24.4 against 47.5
    assert out["gptq"] > 1.3 * out["rtn"]          # on held-out rows: 80.3 against 46.6
    # rtn's codes do not depend on the statistics: only the scoring C changed
    assert out["rtn"] == pytest.approx(output_error(
        get_dw(w, "q4_0"), held.H / 2.0, None), rel=1e-6)   # ΔW C in float32: ~5e-9 here


def test_method_ratio_from_sampled_rows_estimates_the_whole_tensor():
    """The allocator weighs the methods on METHOD_ROWS rows of a larger tensor, drawn in
    proportion to their share of the error with Horvitz-Thompson weights: rtn, imatrix and
    GPTQ quantize every row on its own, so the weighted sums over the sample estimate the
    whole tensor's, and the ratio of two methods' more closely still."""
    from workbench.planning.allocate_methods import METHOD_ROWS, row_local, sample_rows
    from workbench.quant.methods.gptq import hessian_factor
    assert row_local("q4_k") and row_local("int4-g128") and row_local("int8-channel")
    assert not row_local("int2-tensor")
    idx, wt = sample_rows(np.ones(100))
    assert list(idx) == list(range(100)) and np.all(wt == 1)
    big = np.ones(2048)
    big[7] = 1e6                      # one row worth more than a draw: taken with weight 1
    idx, wt = sample_rows(big)
    assert len(idx) == METHOD_ROWS and 7 in idx and wt[list(idx).index(7)] == 1.0
    assert float(wt.sum()) == pytest.approx(2048, rel=0.01)

    rng = np.random.default_rng(4)
    cols = 256
    z = rng.standard_normal((4000, 16))
    X = z @ rng.standard_normal((16, cols)) + 0.3 * rng.standard_normal((4000, cols))
    H = 2.0 * X.T @ X / len(X)
    st = LayerStats(d=np.diag(H) / 2.0, H=H, n=len(X))
    # rows of very different scales: a few rows carry most of the error
    w = (rng.standard_normal((2048, cols))
         * np.exp(0.5 * rng.standard_normal((2048, 1)))).astype(np.float32)
    full = pair_errors(w, "q4_0", st, ["rtn", "imatrix", "gptq"])
    idx, wt = sample_rows(np.einsum("ij,ij->i", w, w, dtype=np.float64))
    f = hessian_factor(st.H, w)
    sub = pair_errors(np.ascontiguousarray(w[idx]), "q4_0", st, ["rtn", "imatrix", "gptq"],
                      a=wt, factor=(f[0][idx],) + tuple(f[1:]))
    assert sub["rtn"] == pytest.approx(full["rtn"], rel=0.1)      # 6% apart when measured
    for m in ("imatrix", "gptq"):                                 # 3-5% apart when measured
        assert sub[m] / sub["rtn"] == pytest.approx(full[m] / full["rtn"], rel=0.08)


def get_dw(w, scheme):
    from workbench.quant.evaluate import quantize
    from workbench.schemes import get_scheme
    return get_scheme(scheme).dequantize(quantize(w, scheme)).reshape(w.shape) - w


def test_auto_methods_by_measure_and_model_kind():
    """--methods auto: every method for an encoder run on calibration text (MiniLM: gptq on 35
    tensors, held-out cosine 0.9953); rtn for a causal LM, whose one-line calibration samples
    chose methods that raised the held-out KL divergence (SmolLM2: 0.0871 against 0.0635)."""
    from workbench.planning.allocate_methods import DEFAULT_METHODS, default_methods
    assert default_methods("fisher", True, "encoder") == list(DEFAULT_METHODS)
    assert default_methods("fisher", True, None) == list(DEFAULT_METHODS)
    assert default_methods("fisher", True, "causal-lm") == ["rtn"]
    assert default_methods("weight", True, "encoder") == ["rtn"]
    assert default_methods("fisher", False, "encoder") == ["rtn"]
    # the mlx target: its rtn is mlx's min-max rounding, which the methods cut on a causal LM
    assert default_methods("fisher", True, "causal-lm", "mlx") == ["rtn", "imatrix"]
    assert default_methods("fisher", True, "encoder", "mlx") == list(DEFAULT_METHODS)
    assert default_methods("fisher", True, "causal-lm", "llama.cpp") == ["rtn"]
    assert default_methods("weight", True, "causal-lm", "mlx") == ["rtn"]


def test_mlx_schemes_are_row_local():
    from workbench.planning.allocate_methods import row_local
    assert row_local("mlx-q3-g64") and row_local("mlx-nvfp4@bf16")


def test_parse_methods():
    assert parse_methods("auto") is None
    assert parse_methods("gptq") == ["rtn", "gptq"]
    assert parse_methods("rtn") == ["rtn"]
    with pytest.raises(WorkbenchError, match="awq"):
        parse_methods("rtn,awq")


@pytest.fixture(scope="module")
def calib_small(tmp_path_factory):
    from workbench.running.calibration import DEFAULT_CALIB
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
    res = _allocate(capsys, folder, calib_small, tmp_path / "pairs.json", "--methods",
                    "rtn,imatrix,gptq")
    assert res["methods_weighed"] == ["rtn", "imatrix", "gptq"]
    assert res["bytes"] <= res["budget_bytes"]
    plan = json.loads((tmp_path / "pairs.json").read_text())
    by = {r["match"]: r for r in plan["rules"]}
    chosen = {r.get("method", "rtn") for r in plan["rules"]}
    won = {m: c for m, c in res["methods"].items() if m != "rtn"}
    assert won and set(won) <= chosen      # a method won on the held-out fold somewhere
    assert sum(res["methods"].values()) == len([n for n in by if n.endswith("proj.weight")]) + 2

    # --methods rtn: the scheme-only plan, exactly what the table's solver gives without methods
    rtn = _allocate(capsys, folder, calib_small, tmp_path / "rtn.json", "--methods", "rtn")
    assert rtn["methods"] == {"rtn": len(by)} and rtn["methods_weighed"] == ["rtn"]
    from workbench.formats.loaders import open_model
    from workbench.core.progress import run
    from workbench.planning.sensitivity import sensitivity_table_job
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
    name = next(n for n, r in by.items() if r.get("method", "rtn") != "rtn")
    from workbench.quant.evaluate import quantize
    from workbench.formats.llama_names import detect_family, llama_cpp_name
    from workbench.running.methods_apply import prepare
    from workbench.quant.plan import Plan
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


def test_near_choices_are_the_chosen_scheme_and_the_next_smaller():
    """The second stage weighs GPTQ where it can still move the allocation: the scheme the
    first solve chose and the next smaller candidate; a kept tensor gets the largest
    quantized candidate at or below its size."""
    from types import SimpleNamespace

    from workbench.planning.allocate_methods import near_choices
    schemes = ["q8_0", "q4_0", "q5_0", "fp16"]
    size = {"q4_0": 18, "q5_0": 22, "q8_0": 34, "fp16": 64, KEEP: 128}
    names = ["a", "b", "c"]
    values = {(n, s): 1.0 for n in names for s in schemes + [KEEP]}
    t = SimpleNamespace(names=names, schemes=schemes, values=values,
                        bytes={(n, s): size[s] for n, s in values},
                        applied={(n, s): s for n, s in values})
    near = near_choices(t, {"a": "q5_0", "b": "q4_0", "c": KEEP})
    assert near == {"a": {"q5_0", "q4_0"}, "b": {"q4_0"}, "c": {"q8_0"}}


def test_methods_are_weighed_again_where_the_solution_moves(monkeypatch):
    """After the rtn solve, imatrix/gptq are weighed near the solution; a lowered value that
    moves the solution onto a pair not weighed yet gets that pair weighed in the next round,
    and a pair is never weighed twice."""
    from types import SimpleNamespace

    import workbench.planning.allocate_methods as am
    from workbench.core.progress import run
    schemes = ["q4_0", "q5_0", "q8_0"]
    size = {"q4_0": 18, "q5_0": 22, "q8_0": 34}
    values = {("a", "q4_0"): 9.0, ("a", "q5_0"): 4.0, ("a", "q8_0"): 0.1,
              ("b", "q4_0"): 9.0, ("b", "q5_0"): 4.0, ("b", "q8_0"): 1.0}
    t = SimpleNamespace(names=["a", "b"], schemes=schemes, values=values,
                        bytes={(n, s): size[s] for n, s in values},
                        applied={(n, s): s for n, s in values}, methods={})
    calls = []

    def fake_pairs(model, table, methods, calib=None, rw=None, target="any", only=None,
                   stats=None, want_h=None, diagonal=False):
        calls.append((tuple(methods), None if only is None else
                      {n: set(v) for n, v in only.items()}))
        yield from ()
        if only is None:
            return {"tensors": 2, "pairs": 0, "stats": ("fit", "held")}
        for n, ss in only.items():
            for s in ss:
                if s == "q4_0":                   # the methods win at 4 bits only
                    table.values[(n, s)] *= 0.1
        return {"tensors": len(only), "pairs": sum(len(v) for v in only.values())}

    def solve(table):                             # 52 bytes for the two, least total value
        best = min(((x, y) for x in schemes for y in schemes if size[x] + size[y] <= 52),
                   key=lambda p: table.values[("a", p[0])] + table.values[("b", p[1])])
        return dict(zip(table.names, best))

    monkeypatch.setattr(am, "method_pairs", fake_pairs)
    monkeypatch.setattr(am, "_runnable", lambda m: True)
    monkeypatch.setattr(am, "_kind", lambda m: "encoder")
    res = am.weigh_methods(object(), t, "auto", "activation", solve=solve, drive=run,
                           say=lambda line: None)
    # statistics only, then the pairs near the rtn solve (q5_0 for both: 4 + 4)
    assert calls[0] == (("rtn",), None)
    assert calls[1] == (("rtn", "imatrix", "gptq"), {"a": {"q5_0", "q4_0"},
                                                    "b": {"q5_0", "q4_0"}})
    # b's q4_0 now reads 0.9: a takes q8_0 (0.1 + 0.9), a pair not weighed yet: round two
    assert calls[2] == (("rtn", "imatrix", "gptq"), {"a": {"q8_0"}})
    assert len(calls) == 3 and res["near_pairs"] == 5
    assert solve(t) == {"a": "q8_0", "b": "q4_0"}


def test_diagonal_held_out_error_is_the_full_one_with_a_diagonal_c():
    """The mlx target's methods without gptq are judged on the held-out fold's E[x²] alone
    (`method_pairs(diagonal=True)`: no Hessian passes): Σ_i a_i Σ_j ΔW_ij² d_j, the full
    error with C = diag(d)."""
    from workbench.planning.allocate_methods import held_c
    rng = np.random.default_rng(5)
    dw = rng.standard_normal((7, 12)).astype(np.float32)
    d = rng.random(12) + 0.1
    a = rng.random(7)
    full = output_error(dw, np.diag(d).astype(np.float32), a)
    assert output_error(dw, d, a) == pytest.approx(full, rel=1e-6)
    assert output_error(dw, d, None) == pytest.approx(float((dw.astype(np.float64) ** 2 @ d).sum()))
    np.testing.assert_array_equal(held_c(LayerStats.from_imatrix(d)), d)
