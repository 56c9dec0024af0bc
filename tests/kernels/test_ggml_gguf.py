"""GGML block kernels against the gguf package's numpy reference, on random valid blocks."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.quant import accel
from kernels.spec import GGML_QUANT, GGML_TYPES

from kernel_testutil import same_bits

gguf = pytest.importorskip("gguf")


def random_blocks(name, rows, nblocks, seed):
    """Random bytes with finite float16 scales (|d| < 2) in every block's scale fields."""
    _, qk, bpb = GGML_TYPES[name]
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


@pytest.mark.parametrize("name", list(GGML_TYPES))
def test_dequantize_matches_gguf(name):
    from workbench.schemes.base import QuantizedTensor
    _, qk, bpb = GGML_TYPES[name]
    qtype = gguf.GGMLQuantizationType[name]
    for seed, (rows, nb) in enumerate([(5, 3), (1, 1), (8, 4)]):
        raw = random_blocks(name, rows, nb, seed)
        ref = np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).reshape(rows, nb * qk)
        # through the CPU kernel directly (independent of the registry) ...
        from kernels import cpu, tables
        tid = GGML_TYPES[name][0]
        out = np.empty((rows, nb * qk), np.float32)
        cpu.ggml_dequant(raw, tid, qk, bpb, tables.f16_table(), tables.IQ4NL_VALUES, out)
        assert same_bits(out, ref), name
        # ... and through the public API when the registry has the scheme
        try:
            from workbench.schemes import get_scheme
            scheme = get_scheme(name.lower())
        except Exception:  # noqa: BLE001 - GGML scheme not registered (yet)
            continue
        qt = QuantizedTensor(scheme.name, (rows, nb * qk), {"blocks": raw})
        assert same_bits(accel.dequantize(qt, backend="cpu"), ref)
        assert same_bits(scheme.dequantize(qt), ref)


@pytest.mark.parametrize("name", GGML_QUANT)
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
