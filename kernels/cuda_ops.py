"""The CUDA backend: host side of ``cuda_kernels.py`` (uploads, launch shapes, qparams)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import host, tables
from .spec import Spec

THREADS = 256
_I64_0 = np.zeros(1, np.int64)


def _ck():
    from . import cuda_kernels
    return cuda_kernels


def _cuda():
    from numba import cuda
    return cuda


def _grid(n: int) -> int:
    return max(1, min((n + THREADS - 1) // THREADS, 65535))


@lru_cache(maxsize=None)
def _dev_table(name: str):
    cuda = _cuda()
    if name == "f16":
        return cuda.to_device(tables.f16_table())
    if name == "bf16":
        return cuda.to_device(tables.bf16_table())
    if name == "ggml":
        return cuda.to_device(tables.ggml_lut())
    raise KeyError(name)


def _args(spec: Spec, arrays, rows: int, cols: int):
    """(device function, q, s, z, lut, prm) for a spec: all device arrays."""
    cuda = _cuda()
    ck = _ck()
    if spec.family == "affine":
        codes, bits, lut, scales, zeros, hz, gs, bpr = host.affine_args(spec, arrays, rows, cols)
        prm = np.array([bits, gs, bpr, int(hz)], np.int64)
        return (ck.d_affine, cuda.to_device(codes), cuda.to_device(scales), cuda.to_device(zeros),
                cuda.to_device(np.ascontiguousarray(lut)), cuda.to_device(prm))
    if spec.family == "u16":
        data, _ = host.u16_args(spec, arrays, rows, cols)
        return (ck.d_u16, cuda.to_device(data.reshape(-1).view(np.uint8)),
                cuda.to_device(host.DUMMY_F32), cuda.to_device(host.DUMMY_U8), _dev_table(spec.table),
                cuda.to_device(_I64_0))
    if spec.family == "f32":
        data = np.ascontiguousarray(arrays["data"], dtype=np.float32).reshape(-1)
        return (ck.d_f32, cuda.to_device(host.DUMMY_U8), cuda.to_device(data),
                cuda.to_device(host.DUMMY_U8), cuda.to_device(host.DUMMY_F32), cuda.to_device(_I64_0))
    if spec.family == "ggml":
        blocks = host.ggml_blocks(spec, arrays, rows, cols)
        prm = np.array([blocks.shape[1]], np.int64)
        return (ck.GGML_DEVICE[spec.ggml_name], cuda.to_device(blocks.reshape(-1)),
                cuda.to_device(host.DUMMY_F32), cuda.to_device(host.DUMMY_U8), _dev_table("ggml"),
                cuda.to_device(prm))
    if spec.family == "mlx":
        from . import cuda_mlx, mlx_host
        codes, sv, bv, mode, bits, gs, dt, _, lut = mlx_host.dequant_args(spec, arrays)
        prm = np.array([bits, gs, mode, dt, sv.size], np.int64)
        return (cuda_mlx.d_mlx, cuda.to_device(codes),
                cuda.to_device(np.concatenate([sv, bv]) if mode == 0 else sv),
                cuda.to_device(host.DUMMY_U8),
                _dev_table("f16") if mode == 0 else cuda.to_device(np.ascontiguousarray(lut)),
                cuda.to_device(prm))
    raise ValueError(spec.family)


def dequantize(spec: Spec, arrays, rows: int, cols: int):
    """A (rows, cols) float32 device array."""
    cuda = _cuda()
    if spec.family == "f32":
        return cuda.to_device(np.ascontiguousarray(arrays["data"], dtype=np.float32).reshape(rows, cols))
    dev, q, s, z, lut, prm = _args(spec, arrays, rows, cols)
    out = cuda.device_array((rows, cols), np.float32)
    _ck().dequant_kernel(dev)[_grid(rows * cols), THREADS](q, s, z, lut, prm, out)
    return out


def error_sums(spec: Spec, arrays, w2d: np.ndarray) -> np.ndarray:
    cuda = _cuda()
    ck = _ck()
    rows, cols = w2d.shape
    dev, q, s, z, lut, prm = _args(spec, arrays, rows, cols)
    acc = cuda.device_array((rows, 5), np.float64)
    ck.error_kernel(dev)[max(1, min(rows, 65535)), ck.ROW_THREADS](q, s, z, lut, prm, cuda.to_device(w2d), acc)
    return acc.copy_to_host()


# ------------------------------------------------------------------ quantize
def _ranges(dw, rows, cols, gs, bpr):
    cuda = _cuda()
    nb = rows * bpr
    lo = cuda.to_device(np.full(nb, np.inf, np.float32))
    hi = cuda.to_device(np.full(nb, -np.inf, np.float32))
    am = cuda.to_device(np.zeros(nb, np.float32))
    chunk = min(gs, 256)
    total = nb * ((gs + chunk - 1) // chunk)
    _ck().k_block_range[_grid(total), THREADS](dw, gs, bpr, chunk, lo, hi, am)
    return lo.copy_to_host(), hi.copy_to_host(), am.copy_to_host()


def _encode(dw, rows, cols, mode, bits, a, zf, hz, qmin, qmax, offset, gs, bpr,
            mids=host.DUMMY_F32, fp8=(0, 0, 0)):
    cuda = _cuda()
    n = rows * cols
    out = cuda.device_array((n * bits + 7) // 8, np.uint8)
    prm = np.array([mode, bits, gs, bpr, int(hz), qmin, qmax, offset, *fp8], np.int64)
    _ck().k_encode[_grid((n + 7) // 8), THREADS](
        dw, cuda.to_device(np.ascontiguousarray(a, np.float32)),
        cuda.to_device(np.ascontiguousarray(zf, np.float32)),
        cuda.to_device(np.ascontiguousarray(mids, np.float32)), cuda.to_device(prm), out)
    return out.copy_to_host()


def quantize(spec: Spec, w2d: np.ndarray, choose_qparams=None) -> dict:
    cuda = _cuda()
    rows, cols = w2d.shape
    dw = cuda.to_device(w2d)
    q = spec.quant
    if q == "int":
        def minmax(gs, bpr):
            lo, hi, _ = _ranges(dw, rows, cols, gs, bpr)
            return lo, hi
        from .cpu_ops import _sym_qparams_kernel, searched_sym
        # the symmetric scale search needs every value of a block: the CPU kernel's
        # (bit-identical to the reference), not the reference's numpy on the host (an H100
        # quantized int4-g128 at 0.04 GB/s that way)
        got = _sym_qparams_kernel(spec, w2d) if searched_sym(spec) else None
        if got is None:
            got = host.int_qparams(spec, w2d, minmax, choose_qparams)
        scale, zero, inv, zf = got
        gs, bpr = spec.geometry(rows, cols)
        codes = _encode(dw, rows, cols, 0, spec.bits, inv, zf, zero is not None, spec.qmin,
                        spec.qmax, spec.offset, gs, bpr)
        out = {"codes": codes, "scales": scale}
        if zero is not None:
            out["zeros"] = zero
        return out
    if q == "nf4":
        gs, bpr = spec.geometry(rows, cols)
        _, _, absmax = _ranges(dw, rows, cols, gs, bpr)
        codes = _encode(dw, rows, cols, 1, 4, host.nf4_inv(absmax), host.DUMMY_F32, False, 0, 0, 0,
                        gs, bpr, mids=spec.mids)
        return {"codes": codes, "absmax": absmax}
    if q == "fp8":
        _, _, amax = _ranges(dw, rows, cols, max(cols, 1), 1)
        scale, safe = host.fp8_scale(amax, spec.fmax)
        fmt = host.fp8_format(np.asarray(spec.fp8_table, np.float32).tobytes())
        codes = _encode(dw, rows, cols, 2, 8, safe, host.DUMMY_F32, False, 0, 0, 0, max(cols, 1), 1,
                        fp8=fmt)
        return {"codes": codes.reshape(rows, cols), "scales": scale}
    raise ValueError(f"no CUDA quantize kernel for {spec.name}")


def prepare_dequant(spec: Spec, arrays, rows: int, cols: int):
    """(launch, out): `launch()` runs the dequantize kernel on device-resident inputs into the
    device array `out` and waits for it (what the benchmark times: kernel only)."""
    cuda = _cuda()
    out = cuda.device_array((rows, cols), np.float32)
    if spec.family == "f32":
        src = cuda.to_device(np.ascontiguousarray(arrays["data"], dtype=np.float32).reshape(rows, cols))

        def launch():
            out.copy_to_device(src)
            cuda.synchronize()
        return launch, out
    dev, q, s, z, lut, prm = _args(spec, arrays, rows, cols)
    k = _ck().dequant_kernel(dev)
    grid = _grid(rows * cols)

    def launch():
        k[grid, THREADS](q, s, z, lut, prm, out)
        cuda.synchronize()
    return launch, out
