"""GGML block kernels against the gguf package's numpy reference, on random valid blocks."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.quant import accel
from workbench.schemes.registry import ggml_schemes

from kernel_testutil import same_bits

gguf = pytest.importorskip("gguf")

#: every registered GGML type, by its GGML name
TYPES = [s.ggml_name for s in ggml_schemes().values()]
#: the types whose quantize kernel is bit-identical to gguf-py's reference (its fixed rules)
GGUF_RULES = [s.ggml_name for s in ggml_schemes().values()
              if s.quant_kernel in ("block32", "legacy")]


def sizes(name):
    qk, bpb = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    return qk, bpb


def random_blocks(name, rows, nblocks, seed):
    """Random bytes with finite float16 scales (|d| < 2) in every block's scale fields."""
    qk, bpb = sizes(name)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, nblocks, bpb), dtype=np.uint8)
    fields = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "IQ4_NL": [0], "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2],
              "Q6_K": [208], "TQ1_0": [52], "TQ2_0": [64], "IQ4_XS": [0], "MXFP4": [],
              "IQ3_XXS": [0], "IQ3_S": [0], "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "NVFP4": [],
              "IQ1_S": [0], "IQ1_M": []}[name]
    for off in fields:
        d = (rng.standard_normal((rows, nblocks)) * 0.5).astype(np.float16)
        raw[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, nblocks, 2)
    if name == "IQ1_M":             # its float16 d: the top nibbles of the 4 uint16 scales
        d = (rng.standard_normal((rows, nblocks)) * 0.5).astype(np.float16).view(np.uint16)
        for i in range(4):
            hi = (((d >> (4 * i)) & 15) << 4).astype(np.uint8)
            raw[:, :, 49 + 2 * i] = (raw[:, :, 49 + 2 * i] & 15) | hi
    if name == "MXFP4":             # its E8M0 scale byte: 2^(e - 127), kept near 1
        raw[:, :, 0] = rng.integers(110, 140, (rows, nblocks), dtype=np.uint8)
    return raw.reshape(rows, nblocks * bpb)


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_matches_gguf(name):
    from workbench.schemes.base import QuantizedTensor
    qk, bpb = sizes(name)
    qtype = gguf.GGMLQuantizationType[name]
    for seed, (rows, nb) in enumerate([(5, 3), (1, 1), (8, 4)]):
        raw = random_blocks(name, rows, nb, seed)
        ref = np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).reshape(rows, nb * qk)
        # through the CPU kernel directly, keyed by gguf's type number alone ...
        from kernels import cpu_ops
        from kernels.spec import make_spec
        spec = make_spec({"family": "ggml", "ggml_name": name, "qk": qk, "bpb": bpb,
                          "ggml_type": int(qtype)})
        out = np.empty((rows, nb * qk), np.float32)
        cpu_ops.dequantize(spec, {"blocks": raw}, out)
        assert same_bits(out, ref), name
        # ... and through the public API
        scheme = ggml_schemes()[name.lower()]
        qt = QuantizedTensor(scheme.name, (rows, nb * qk), {"blocks": raw})
        assert same_bits(accel.dequantize(qt, backend="cpu"), ref)
        assert same_bits(scheme.dequantize(qt), ref)


@pytest.mark.parametrize("name", GGUF_RULES)
def test_quantize_matches_gguf(name):
    from workbench.schemes import get_scheme
    qtype = gguf.GGMLQuantizationType[name]
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((12, 512)) * rng.uniform(0.01, 4, (12, 1))).astype(np.float32)
    w[0, :32] = 0.0
    w[1, :32] = -0.0
    w[2, 5], w[2, 6] = -7.0, 7.0              # |max| tie: the first one wins
    w[3, :32] = np.linspace(-1, 1, 32)        # exact .5 cases
    ref = gguf.quants.quantize(w, qtype)
    qt = accel.quantize(get_scheme(name.lower()), w, backend="cpu")
    assert same_bits(qt.arrays["blocks"], ref)
