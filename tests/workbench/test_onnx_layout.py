"""MatMulNBits layout: the workbench's quantized weights, run through onnxruntime's own
MatMulNBits kernel with an identity input, come back bit-identical to the scheme's dequantize."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from workbench.quant.evaluate import quantize  # noqa: E402
from workbench.export.onnx_layout import (  # noqa: E402
    dequantize_nbits, matmulnbits_arrays, pack_codes, unpack_codes, unsupported_reason)
from workbench.schemes import get_scheme  # noqa: E402


def ort_weight(nb, accuracy_level=0) -> np.ndarray:
    """dequant(B) [N, K] as onnxruntime computes it: Y = I · dequant(B)ᵀ."""
    inits = [numpy_helper.from_array(np.ascontiguousarray(nb.B), "B"),
             numpy_helper.from_array(nb.scales, "S")]
    ins = ["A", "B", "S"]
    if nb.zero_points is not None:
        inits.append(numpy_helper.from_array(nb.zero_points, "Z"))
        ins.append("Z")
    node = helper.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=nb.K, N=nb.N,
                            bits=nb.bits, block_size=nb.block_size,
                            accuracy_level=accuracy_level)
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, nb.K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, nb.N])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, {"A": np.eye(nb.K, dtype=np.float32)})[0].T


def same_values(got, ref) -> bool:
    """Equal values, bit for bit except the sign of zero: ggml's q4_0 has negative scales and
    dequantizes a zero code to -0.0, and a matmul with an identity input (a sum with +0 terms)
    cannot show that sign; the numpy model of the kernel (dequantize_nbits) is compared bitwise."""
    return np.array_equal(got, ref) and np.array_equal(
        got[got != 0].view(np.uint32), ref[ref != 0].view(np.uint32))


def _weights(n, k, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    w[:, :3] += 0.3          # a skewed column range, so asymmetric zero points are not trivial
    w[1] = 0.0               # an all-zero row (scale 0)
    return w


INT_SCHEMES = [f"int{b}-{g}{a}" for b in (2, 4, 8)
               for g in ("g32", "g64", "g128", "g256", "channel", "tensor") for a in ("", "-asym")
               if not (b == 2 and g in ("channel", "tensor"))]


@pytest.mark.parametrize("scheme_name", INT_SCHEMES + ["q4_0", "q8_0", "int4-g128@mse",
                                                       "int2-channel"])
def test_matmulnbits_weight_is_bit_identical(scheme_name):
    shape = (24, 256) if scheme_name != "int2-channel" else (24, 128)
    w = _weights(*shape)
    scheme = get_scheme(scheme_name)
    qt = quantize(w, scheme_name)
    ref = np.asarray(scheme.dequantize(qt), np.float32).reshape(w.shape)
    nb = matmulnbits_arrays(scheme, qt)
    got = ort_weight(nb)
    assert got.shape == ref.shape
    assert same_values(got, ref), scheme_name
    assert np.array_equal(dequantize_nbits(nb).view(np.uint32), ref.view(np.uint32))
    # the weight is really quantized (not the float weight passed through)
    assert not np.array_equal(got, w)


@pytest.mark.parametrize("scheme_name", ["int4-channel", "int8-channel-asym", "int4-tensor-asym"])
def test_per_row_block_pads_a_row_that_is_not_a_power_of_two(scheme_name):
    w = _weights(16, 384, seed=3)        # MiniLM's width: one block of 512 per row, 128 padding
    scheme = get_scheme(scheme_name)
    qt = quantize(w, scheme_name)
    nb = matmulnbits_arrays(scheme, qt)
    assert nb.block_size == 512 and nb.n_blocks == 1
    ref = np.asarray(scheme.dequantize(qt), np.float32).reshape(w.shape)
    assert same_values(ort_weight(nb), ref)


def test_q4_1_float_zero_points():
    w = _weights(32, 256, seed=5)
    scheme = get_scheme("q4_1")
    qt = quantize(w, "q4_1")
    ref = np.asarray(scheme.dequantize(qt), np.float32).reshape(w.shape)
    nb = matmulnbits_arrays(scheme, qt)
    assert nb.zero_points.dtype == np.float32
    got = ort_weight(nb)
    assert same_values(got, dequantize_nbits(nb))
    blocks = np.ascontiguousarray(qt.arrays["blocks"]).reshape(-1).view(scheme.block_dtype)
    m = blocks["m"].astype(np.float32).reshape(32, 8)
    exact = (nb.zero_points.reshape(32, 8) * nb.scales.reshape(32, 8)).astype(np.float32) == -m
    same = (got == ref).reshape(32, 8, 32).all(axis=2)
    assert same[exact].all()            # an exact zero point: every weight bit-identical
    assert exact.mean() > 0.8
    assert len(nb.notes) == int((~exact).sum() > 0)
    # where no exact float32 zero point exists: one rounding of m at most
    ulp = np.spacing(np.abs(np.repeat(m, 32, axis=1)) + np.abs(ref)).astype(np.float32)
    assert (np.abs(got - ref) <= 2 * ulp).all()


def test_q4_0_repacks_ggml_nibble_order():
    w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    qt = quantize(w, "q4_0")
    nb = matmulnbits_arrays(get_scheme("q4_0"), qt)
    codes = unpack_codes(nb.B.reshape(1, -1), 4, 64)[0]
    # a rising row gives rising codes in MatMulNBits' consecutive order (ggml's would jump at 16)
    assert (np.diff(codes[:32].astype(int)) >= 0).all()
    assert codes[0] == 0 and codes[31] > codes[15] > codes[0]


def test_pack_codes_order():
    c = np.array([[1, 2, 3, 0, 3, 3, 3, 3]], np.uint8)
    assert pack_codes(c, 2).tolist() == [[1 | 2 << 2 | 3 << 4, 0xFF]]
    assert pack_codes(np.array([[0xA, 0x5]], np.uint8), 4).tolist() == [[0x5A]]
    assert np.array_equal(unpack_codes(pack_codes(c, 2), 2, 8), c)


@pytest.mark.parametrize("name,expressible", [
    ("int4-g32", True), ("int8-channel-asym", True), ("q4_0", True), ("q4_1", True),
    ("q8_0", True), ("int3-g64", False), ("int5-g32", False), ("q4_k", False),
    ("nf4-g64", False), ("fp8-e4m3", False), ("fp16", False)])
def test_unsupported_reason(name, expressible):
    assert (unsupported_reason(name) is None) == expressible
    assert unsupported_reason("int2-channel", (64, 384)) is not None   # 2-bit block > 256
    assert unsupported_reason("int4-channel", (64, 384)) is None


def test_session_threads_follow_omp_num_threads(tmp_path, monkeypatch):
    """onnxruntime reads no thread variable and takes every core; the workbench's sessions take
    $OMP_NUM_THREADS as torch and numpy do, an explicit `threads` first."""
    from onnx import TensorProto, helper

    from workbench.export.onnx_check import session
    node = helper.make_node("Relu", ["A"], ["Y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])])
    path = tmp_path / "relu.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())

    def threads(**kw):
        return session(path, **kw).get_session_options().intra_op_num_threads
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads() == 1 and threads(threads=3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    assert threads() == 0                               # onnxruntime's own default: every core
    out = session(path).run(None, {"A": np.array([-1.0, 2.0], np.float32)})[0]
    assert out.tolist() == [0.0, 2.0]
