"""CUDA kernels through numba's simulator, against the numpy references.

Run in a fresh process (``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is imported);
``test_cuda_simulator.py`` does that. Small arrays: a simulated thread runs the kernel's
Python code; each is a greenlet (cudasim_blocks.py), not an OS thread polled at every barrier.
Covers every base scheme family of the registry: dequantize, fused error, and quantize for
the integer, NF4 and FP8 schemes; plus every GGML format against gguf on random blocks.
Prints one line per failure and exits non-zero if any.

``--real`` runs the same checks on a real GPU (``test_cuda_device.py``, skipped without
one): every base scheme rather than one per kernel configuration, on matrices large enough to
fill many thread blocks (and ragged ones), still bit for bit against the references.
"""

from __future__ import annotations

import math
import os
import sys

REAL = "--real" in sys.argv
assert REAL or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1 first"
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import numpy as np  # noqa: E402

if not REAL:                # greenlet thread blocks: the stock simulator's OS threads poll
    import cudasim_blocks  # noqa: E402
    BLOCKS = cudasim_blocks.install()
import kernels  # noqa: E402
from workbench.quant import accel  # noqa: E402
from kernel_testutil import same_bits, same_qt, weights  # noqa: E402
from workbench.quant.metrics import ErrorSums  # noqa: E402
from workbench.schemes import get_scheme, list_schemes  # noqa: E402


def pick_schemes():
    """One scheme per distinct kernel configuration (family, bits, granularity, asym, clip),
    so the simulator run stays short while covering every code path of the registry."""
    from workbench.quant.accel import spec_for
    seen, out = set(), []
    for name in list_schemes() + ["int4-g32@mse", "int3-channel-asym@pot", "int5-tensor@p99.9"]:
        s = get_scheme(name)
        sp = spec_for(s)
        key = (sp.family, sp.quant, sp.bits if sp.quant != "int" else sp.bits in (8, 4, 3),
               str(sp.gran) if not isinstance(sp.gran, int) else sp.gran == 32, sp.zero_key,
               sp.ggml_name, getattr(s, "clip", None), getattr(s, "pot", None), sp.table)
        if key not in seen:
            seen.add(key)
            out.append(name)
    return out


def main() -> int:
    failures = []
    assert kernels.backend_name() == "cuda", kernels.backend_name()
    if REAL:
        assert kernels.device_name() != "CUDA simulator", "--real needs a GPU, not the simulator"
        print("device:", kernels.device_name())
    else:
        assert kernels.device_name() == "CUDA simulator"
    names = sorted(set(list_schemes() + pick_schemes())) if REAL else pick_schemes()
    for name in names:
        s = get_scheme(name)
        ggml = getattr(s, "ggml_type", None) is not None
        if REAL:
            shapes = [(300, 4096), (7, 768)] if ggml else [(300, 4096), (37, 1000), (3, 5)]
        else:
            shapes = [(2, 256)] if ggml else [(2, 64), (3, 5)]
        for shape in shapes:
            if not s.can_take(shape):
                continue
            w = weights(shape, seed=1)
            qt = s.quantize(w)
            ref = s.dequantize(qt)
            if not same_bits(accel.dequantize(qt, backend="cuda"), ref):
                failures.append(f"dequantize {name} {shape}")
            dev = accel.dequantize(qt, backend="cuda", device_array=True)
            if not same_bits(dev.copy_to_host().reshape(ref.shape), ref):
                failures.append(f"device_array {name} {shape}")
            got = accel.dequant_error(w, qt, backend="cuda")
            r = ErrorSums.from_arrays(w.reshape(shape[0], -1), ref.reshape(shape[0], -1))
            if got.max_abs_err != r.max_abs_err or not all(
                    math.isclose(getattr(got, f), getattr(r, f), rel_tol=1e-12, abs_tol=1e-300)
                    for f in ("sse", "sig", "deq", "dot")):
                failures.append(f"error sums {name} {shape}")
            if accel.has_kernel(s, "quantize", "cuda"):
                if not same_qt(accel.quantize(s, w, backend="cuda"), qt):
                    failures.append(f"quantize {name} {shape}")
    # the MLX schemes of float16 / bfloat16 exports (their own rounding of each step)
    for name in [n for n in list_schemes() if n.startswith("mlx-")][::4] + ["mlx-nvfp4"]:
        for dtype in ("F16", "BF16"):
            s = get_scheme(name).for_dtype(dtype)
            qt = s.quantize(weights((2, 128), seed=3))
            if not same_bits(accel.dequantize(qt, backend="cuda"), s.dequantize(qt)):
                failures.append(f"dequantize {s.name}")
    # FP8 rounding edge values on the device
    for name in ("fp8-e4m3", "fp8-e5m2"):
        s = get_scheme(name)
        grid = np.unique(np.abs(s.table[np.isfinite(s.table)])).astype(np.float64)
        vals = ((grid[1:] + grid[:-1]) / 2)[::3].astype(np.float32)
        w = np.zeros((2, 64), np.float32)
        w.reshape(-1)[: min(vals.size, 128)] = vals[:128]
        w[:, 0] = s.fmax
        w[1] *= -1
        if not same_qt(accel.quantize(s, w, backend="cuda"), s.quantize(w)):
            failures.append(f"fp8 ties {name}")
    # every GGML format against gguf on random blocks (independent of the registry)
    import gguf
    from kernels import cuda_ops
    from kernels.spec import make_spec
    from workbench.schemes.base import QuantizedTensor
    from workbench.schemes.registry import ggml_schemes
    for tname in [s.ggml_name for s in ggml_schemes().values()]:
        tid = int(gguf.GGMLQuantizationType[tname])
        qk, bpb = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[tname]]
        rng = np.random.default_rng(tid)
        raw = rng.integers(0, 256, (1, bpb), dtype=np.uint8)
        raw[0, {"Q2_K": 80, "Q3_K": 108, "Q6_K": 208}.get(tname, 0):][:2] = \
            np.array([0.37], np.float16).view(np.uint8)
        if tname in ("Q2_K", "Q4_1", "Q5_1", "Q4_K", "Q5_K"):
            off = 82 if tname == "Q2_K" else 2
            raw[0, off:off + 2] = np.array([0.11], np.float16).view(np.uint8)
        if tname == "IQ1_M":             # its d: the top nibbles of the 4 uint16 scales
            h = int(np.array([0.37], np.float16).view(np.uint16)[0])
            for i in range(4):
                raw[0, 49 + 2 * i] = (raw[0, 49 + 2 * i] & 15) | (((h >> (4 * i)) & 15) << 4)
        ref = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[tname]), np.float32)
        spec = make_spec({"family": "ggml", "ggml_name": tname, "ggml_type": tid, "qk": qk,
                          "bpb": bpb})
        qt = QuantizedTensor("-", (1, qk), {"blocks": raw})
        got = cuda_ops.dequantize(spec, qt.arrays, 1, qk).copy_to_host()
        if not same_bits(got, ref.reshape(1, qk)):
            failures.append(f"gguf {tname}")
    for f in failures:
        print("FAIL", f)
    if not REAL:
        print(f"simulator thread blocks: {BLOCKS or 'stock (cudasim_blocks.py does not know this numba)'}")
    print(f"{'cuda' if REAL else 'cudasim'}: {len(names)} schemes checked, "
          f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
