"""Every method's output is a tensor of its scheme's format: the scheme's dequantize decodes it,
its size is the scheme's, GGML results survive a GGUF file written and read back, and each
method beats RTN on the layer output error of held-out inputs (correlated, heavy-tailed
inputs with outlier channels, as real activations are)."""

import numpy as np
import pytest

from workbench.quant.methods import LayerStats, get_method, list_methods
from workbench.quant.methods.awq import fold_target
from workbench.bench.synthetic_figures import synthetic_data
from workbench.schemes import get_scheme

SCHEMES = ["int4-g128", "int3-g64", "int4-g32-asym", "int8-channel", "q4_0", "q5_0", "q4_1",
           "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]


@pytest.fixture(scope="module")
def data():
    W, X = synthetic_data()   # python -m workbench.bench.synthetic_figures: the table in docs/methods.md
    return W, LayerStats.from_inputs(X[:4000]), X[4000:]


@pytest.mark.parametrize("scheme_name", SCHEMES)
def test_methods_valid_and_beat_rtn(data, scheme_name):
    W, st, Xh = data
    scheme = get_scheme(scheme_name)
    errs = {}
    for m in list_methods():
        meth = get_method(m)
        qt = meth.quantize(W, scheme, st, fold=True) if m == "awq" else meth.quantize(W, scheme, st)
        assert qt.scheme == scheme.name and qt.nbytes == scheme.nbytes(W.shape)
        assert set(qt.arrays) == set(scheme.quantize(W).arrays)
        wq = meth.effective_weight(qt, scheme)
        assert np.isfinite(wq).all()
        errs[m] = float(np.sum((Xh @ (W - wq).T) ** 2))
    for m in ("imatrix", "gptq", "awq"):
        assert errs[m] < errs["rtn"], (scheme_name, errs)


def test_ggml_results_roundtrip_through_gguf(data, tmp_path):
    import gguf
    W, st, _ = data
    path = tmp_path / "m.gguf"
    wr = gguf.GGUFWriter(str(path), "quant_workbench")
    expect = {}
    for sname in ("q4_0", "q3_k", "q4_k", "q2_k"):
        scheme = get_scheme(sname)
        for m in ("imatrix", "gptq", "awq"):
            qt = get_method(m).quantize(W, scheme, st, fold=True) if m == "awq" else \
                get_method(m).quantize(W, scheme, st)
            name = f"{m}.{sname}"
            raw = qt.arrays["blocks"]
            wr.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=scheme.ggml_type)
            expect[name] = (scheme, qt)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    r = gguf.GGUFReader(str(path))
    for t in r.tensors:
        scheme, qt = expect[t.name]
        assert t.tensor_type == scheme.ggml_type
        assert np.array_equal(np.asarray(t.data).reshape(qt.arrays["blocks"].shape),
                              qt.arrays["blocks"])
        ref = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(W.shape)
        np.testing.assert_array_equal(ref, scheme.dequantize(qt))


def test_stats_errors_and_fold_targets():
    from workbench.core.errors import WorkbenchError
    W, X = synthetic_data(8, 64, 200)
    with pytest.raises(WorkbenchError, match="needs calibration"):
        get_method("gptq").quantize(W, get_scheme("int4-g32"), None)
    with pytest.raises(WorkbenchError, match="lack 'H'"):
        get_method("gptq").quantize(W, get_scheme("int4-g32"), LayerStats.from_imatrix(np.ones(64)))
    with pytest.raises(WorkbenchError, match="unknown method"):
        get_method("nope")
    # BERT is post-LN (the LayerNorm output is also the residual): no fold into it
    assert fold_target("encoder.layer.0.attention.self.query.weight") is None
    assert fold_target("encoder.layer.2.attention.self.key.weight") is None
    assert fold_target("encoder.layer.2.intermediate.dense.weight") is None
    assert fold_target("encoder.layer.2.attention.output.dense.weight") == "encoder.layer.2.attention.self.value"
    assert fold_target("encoder.layer.2.output.dense.weight") is None
    assert fold_target("model.layers.3.mlp.down_proj.weight") == "model.layers.3.mlp.up_proj"
