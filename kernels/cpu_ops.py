"""The CPU backend: prepares arguments (``host.py``) and calls the numba kernels (``cpu.py``)."""

from __future__ import annotations

import numpy as np

from . import host, tables
from .spec import Spec


SERIAL_BELOW = 1 << 16          # elements: smaller tensors run on the calling thread only

#: GGML type number -> the branch of the numba block decoders / encoders (cpu_ggml._ggml_row,
#: ggml_encode, ggml_legacy_quant, ggml_f16_quant) for the types whose kernels predate keying by
#: GGML's numbers: renumbering those branches would discard their compiled on-disk cache.
#: Every other type's branch is its GGML type number (cpu_ggml.IQ_TIDS, NVFP4's 40), and so is
#: a new one's.
_EARLY_BRANCH = {2: 0, 3: 1, 6: 2, 7: 3, 8: 4, 10: 5, 11: 6, 12: 7, 13: 8, 14: 9, 20: 10, 39: 11,
                 34: 12, 35: 13, 23: 14}


def _branch(spec: Spec) -> int:
    """The numba kernels' branch for a GGML spec (keyed by its GGML type number)."""
    return _EARLY_BRANCH.get(spec.ggml_id, spec.ggml_id)


def _k():
    from . import cpu          # numba import + kernel load happen here, on first use
    return cpu


class _threads:
    """Run small tensors single-threaded: a parallel region costs a thread wake-up, which on
    a busy machine (the GUI, other processes) is worth more than the work itself."""

    def __init__(self, n_elements: int):
        self.small = n_elements < SERIAL_BELOW

    def __enter__(self):
        if self.small:
            import numba
            self.prev = numba.get_num_threads()
            numba.set_num_threads(1)

    def __exit__(self, *exc):
        if self.small:
            import numba
            numba.set_num_threads(self.prev)


def dequantize(spec: Spec, arrays, out2d: np.ndarray) -> None:
    with _threads(out2d.size):
        _dequantize(spec, arrays, out2d)


def _dequantize(spec: Spec, arrays, out2d: np.ndarray) -> None:
    k = _k()
    rows, cols = out2d.shape
    if spec.family == "affine":
        k.affine_dequant(*host.affine_args(spec, arrays, rows, cols), out2d)
    elif spec.family == "u16":
        k.u16_dequant(*host.u16_args(spec, arrays, rows, cols), out2d)
    elif spec.family == "f32":
        k.f32_copy(_f32_data(arrays, rows, cols), out2d)
    elif spec.family == "ggml":
        k.ggml_dequant(host.ggml_blocks(spec, arrays, rows, cols), _branch(spec), spec.qk, spec.bpb,
                       tables.f16_table(), tables.IQ4NL_VALUES, out2d)
    elif spec.family == "mlx":
        from . import mlx_host
        k.mlx_dequant(*mlx_host.dequant_args(spec, arrays), out2d)
    else:
        raise ValueError(spec.family)


def _f32_data(arrays, rows: int, cols: int) -> np.ndarray:
    return host.readonly(np.ascontiguousarray(arrays["data"], dtype=np.float32).reshape(rows, cols))


def error_sums(spec: Spec, arrays, w2d: np.ndarray) -> np.ndarray:
    """(rows, 5) float64: per row sse, sig, deq, dot, max|err|."""
    w2d = host.readonly(w2d)
    acc = np.zeros((w2d.shape[0], 5), np.float64)
    with _threads(w2d.size):
        _error_sums(spec, arrays, w2d, acc)
    return acc


def _error_sums(spec: Spec, arrays, w2d: np.ndarray, acc: np.ndarray) -> None:
    k = _k()
    rows, cols = w2d.shape
    if spec.family == "affine":
        k.affine_error(*host.affine_args(spec, arrays, rows, cols), w2d, acc)
    elif spec.family == "u16":
        k.u16_error(*host.u16_args(spec, arrays, rows, cols), w2d, acc)
    elif spec.family == "f32":
        k.f32_error(_f32_data(arrays, rows, cols), w2d, acc)
    elif spec.family == "ggml":
        k.ggml_error(host.ggml_blocks(spec, arrays, rows, cols), _branch(spec), spec.qk, spec.bpb,
                     tables.f16_table(), tables.IQ4NL_VALUES, w2d, acc)
    elif spec.family == "mlx":
        from . import mlx_host
        k.mlx_error(*mlx_host.dequant_args(spec, arrays), w2d, acc)
    else:
        raise ValueError(spec.family)


# ------------------------------------------------------------------ quantize
_NO_MIDS = np.zeros(1, np.float32)


def _stats(w2d, gs, bpr, mode):
    rows, _ = w2d.shape
    n = rows * bpr
    o1 = np.empty(n, np.float64 if mode == 2 else np.float32)
    o2 = np.empty(n if mode == 1 else 1, np.float32)
    _k().block_stats(w2d, gs, bpr, mode, o1, o2)
    return o1, o2


def _encode(w2d, mode, bits, a, zf, has_zero, qmin, qmax, offset, gs, bpr,
            mids=_NO_MIDS, fp8=(0, 0, 0)):
    """Codes of w2d: the packed bit stream (as pack_bits would give) and the flat codes when
    cols % 8 != 0 (then packed with the reference packer)."""
    rows, cols = w2d.shape
    n = rows * cols
    packed = cols % 8 == 0
    out = np.empty((n * bits + 7) // 8 if packed else n, np.uint8)
    _k().encode(w2d, mode, bits, a, zf, has_zero, qmin, qmax, offset, mids,
                fp8[0], fp8[1], fp8[2], gs, bpr, packed, out)
    if packed or bits == 8:
        return out
    from .packing import pack_bits
    return pack_bits(out, bits)


class NonFinite(Exception):
    """The weights hold NaN/Inf (args[0]: how many); raised before anything is returned."""


def count_nonfinite(w2d) -> int:
    w2d = host.readonly(w2d)
    with _threads(w2d.size):
        return int(_k().count_nonfinite(w2d))


def quantize(spec: Spec, w2d: np.ndarray, check_finite: bool = True,
             choose_qparams=None) -> dict | None:
    """The arrays of the scheme's QuantizedTensor (None: the kernel declines, use numpy).
    check_finite: raise NonFinite(count) when w2d holds NaN/Inf (tested inside the fused
    kernels, else by a separate pass first). choose_qparams: the scheme's reference qparams,
    for the integer schemes the kernels do not size themselves (see host.int_qparams)."""
    w2d = host.readonly(w2d)
    with _threads(w2d.size):
        if spec.quant == "ggml":
            return _quantize(spec, w2d, check_finite)
        if _fused_mode(spec, *w2d.shape) >= 0:
            return _quantize_fused(spec, w2d, check_finite)
        if check_finite:
            bad = int(_k().count_nonfinite(w2d))
            if bad:
                raise NonFinite(bad)
        return _quantize(spec, w2d, choose_qparams=choose_qparams)


def _fused_mode(spec: Spec, rows: int, cols: int) -> int:
    """quant_fused's mode for this scheme and shape, -1 when it does not apply."""
    if cols % 8 or rows * cols == 0 or spec.geometry(rows, cols)[0] % 8:
        return -1
    if spec.quant == "int":
        if spec.gran == "tensor" or spec.clip != "minmax" or spec.pot:
            return -1
        return 0
    if spec.quant == "ternary" and host.block_view_ok_for_mean(spec.geometry(rows, cols)[0]):
        return 1
    return -1


def _nonfinite_found(w2d, check_finite: bool):
    n = int(_k().count_nonfinite(w2d))
    if check_finite and n:
        raise NonFinite(n)
    return None                              # NaN/Inf allowed: the generic path decides


def _quantize_fused(spec: Spec, w2d: np.ndarray, check_finite: bool) -> dict | None:
    """The one-pass kernels that test for NaN/Inf themselves (None: not applicable)."""
    rows, cols = w2d.shape
    p = _FusedParams(spec, rows, cols, _fused_mode(spec, rows, cols))
    out = np.empty(rows * cols * spec.bits // 8, np.uint8)
    _k().quant_fused(w2d, w2d.view(np.int32), p.mode, spec.bits, p.gs, p.asym, p.qmin, p.qmax,
                     p.offset, p.f16, tables.f16_table(), p.scale32, p.scale16, p.zero, out,
                     p.bad, p.divs)
    if p.bad.any():
        return _nonfinite_found(w2d, check_finite)
    return {"codes": out, **p.arrays()}


class _FusedParams:
    """What quant_fused and quant_error_fused take besides the weights: the integer range
    and layout of mode 0 (integer min/max) or 1 (ternary), and the per-block outputs."""

    def __init__(self, spec: Spec, rows: int, cols: int, mode: int):
        self.mode = mode
        self.divs = np.array(spec.divs or (0.0,), np.float32)
        self.gs, bpr = spec.geometry(rows, cols)
        nb = rows * bpr
        if mode == 0:
            self.f16, self.asym = spec.scale_f16, spec.asym
            self.qmin, self.qmax, self.offset = spec.qmin, spec.qmax, spec.offset
        else:
            self.f16, self.asym, self.qmin, self.qmax, self.offset = True, False, -1, 1, 1
        self.scale32 = np.empty(1 if self.f16 else nb, np.float32)
        self.scale16 = np.empty(nb if self.f16 else 1, np.uint16)
        self.zero = np.empty(nb if self.asym else 1, np.uint8)
        self.bad = np.zeros(rows, np.uint8)

    def arrays(self) -> dict:
        """The QuantizedTensor's scales (and zero points) as the scheme stores them."""
        res = {"scales": self.scale16.view(np.float16) if self.f16 else self.scale32}
        if self.asym:
            res["zeros"] = self.zero
        return res


def quantize_error(spec: Spec, w2d: np.ndarray):
    """(the quantized tensor's arrays less its codes, (rows, 5) error sums as error_sums
    gives them) in one pass over w2d, for the schemes quant_fused quantizes; None when that
    kernel does not apply or w2d holds NaN/Inf (the caller takes the two-pass path, which
    decides what those mean). The arrays are quantize()'s: the caller checks their range."""
    w2d = host.readonly(w2d)
    rows, cols = w2d.shape
    mode = _fused_mode(spec, rows, cols)
    if mode < 0:
        return None
    p = _FusedParams(spec, rows, cols, mode)
    acc = np.zeros((rows, 5), np.float64)
    with _threads(w2d.size):
        _k().quant_error_fused(w2d, w2d.view(np.int32), mode, spec.bits, p.gs, p.asym, p.qmin,
                               p.qmax, p.offset, p.f16, tables.f16_table(), p.scale32,
                               p.scale16, p.zero, p.bad, acc, p.divs)
    if p.bad.any():
        return None
    return p.arrays(), acc


def _int_qparams_kernel(spec: Spec, w2d: np.ndarray):
    """Min/max qparams fully in kernels (same values as scheme.choose_qparams)."""
    rows, cols = w2d.shape
    if spec.gran == "tensor":
        lo, hi = _stats(w2d, cols, 1, 1)
        lo, hi = np.array([lo.min()], np.float32), np.array([hi.max()], np.float32)
    else:
        lo, hi = _stats(w2d, *spec.geometry(rows, cols), 1)
    nb = lo.shape[0]
    f16 = spec.scale_f16
    scale32 = np.empty(nb, np.float32)
    scale16 = np.empty(nb if f16 else 1, np.uint16)
    inv = np.empty(nb, np.float32)
    asym = spec.asym
    zf = np.empty(nb if asym else 1, np.float32)
    zero = np.empty(nb if asym else 1, np.uint8)
    _k().int_qparams(lo, hi, asym, spec.qmax, f16, tables.f16_table(), scale32, scale16,
                     inv, zf, zero)
    scale = scale16.view(np.float16) if f16 else scale32
    return scale, (zero if asym else None), inv, (zf if asym else host.DUMMY_F32)


def searched_sym(spec: Spec) -> bool:
    """True for the symmetric integer schemes whose per-block scale is searched over every
    value of the block (`_sym_qparams_kernel` computes it)."""
    return spec.clip == "minmax" and not spec.pot and not spec.asym and spec.gran != "tensor"


def _sym_qparams_kernel(spec: Spec, w2d: np.ndarray):
    """Symmetric searched qparams in a kernel (same values as scheme.choose_qparams); None
    when a block holds NaN/Inf or a float32 scale whose inverse overflows."""
    w2d = host.readonly(w2d)
    rows, cols = w2d.shape
    gs, bpr = spec.geometry(rows, cols)
    nb = rows * bpr
    f16 = spec.scale_f16
    scale32 = np.empty(nb, np.float32)
    scale16 = np.empty(nb if f16 else 1, np.uint16)
    inv = np.empty(nb, np.float32)
    flags = np.empty(nb, np.uint8)
    _k().sym_qparams(w2d, gs, bpr, np.array(spec.divs, np.float32), spec.qmin, spec.qmax, f16,
                     tables.f16_table(), scale32, scale16, inv, flags)
    if nb and flags.any():
        return None
    scale = scale16.view(np.float16) if f16 else scale32
    return scale, None, inv, host.DUMMY_F32


def _quantize(spec: Spec, w2d: np.ndarray, check_finite: bool = True,
              choose_qparams=None) -> dict | None:
    rows, cols = w2d.shape
    q = spec.quant
    if q == "int":
        def minmax(gs, bpr):
            return _stats(w2d, gs, bpr, 1)
        if searched_sym(spec):
            got = _sym_qparams_kernel(spec, w2d)
            if got is None:
                return None                  # NaN/Inf or a scale the reference decides
            scale, zero, inv, zf = got
        elif spec.clip == "minmax" and not spec.pot and spec.asym:
            scale, zero, inv, zf = _int_qparams_kernel(spec, w2d)
        else:
            scale, zero, inv, zf = host.int_qparams(spec, w2d, minmax, choose_qparams)
        gs, bpr = spec.geometry(rows, cols)
        codes = _encode(w2d, 0, spec.bits, inv, zf, zero is not None, spec.qmin, spec.qmax,
                        spec.offset, gs, bpr)
        out = {"codes": codes, "scales": scale}
        if zero is not None:
            out["zeros"] = zero
        return out
    if q == "nf4":
        gs, bpr = spec.geometry(rows, cols)
        absmax, _ = _stats(w2d, gs, bpr, 0)
        codes = _encode(w2d, 1, 4, host.nf4_inv(absmax), host.DUMMY_F32, False, 0, 0, 0, gs, bpr,
                        mids=spec.mids)
        return {"codes": codes, "absmax": absmax}
    if q == "ternary":
        gs, bpr = spec.geometry(rows, cols)
        mean, _ = _stats(w2d, gs, bpr, 2)
        scale, inv = host.ternary_scale(mean)
        codes = _encode(w2d, 0, 2, inv, host.DUMMY_F32, False, -1, 1, 1, gs, bpr)
        return {"codes": codes, "scales": scale}
    if q == "fp8":
        amax, _ = _stats(w2d, max(cols, 1), 1, 0)
        scale, safe = host.fp8_scale(amax, spec.fmax)
        fmt = host.fp8_format(np.asarray(spec.fp8_table, np.float32).tobytes())
        codes = _encode(w2d, 2, 8, safe, host.DUMMY_F32, False, 0, 0, 0, max(cols, 1), 1, fp8=fmt)
        return {"codes": codes.reshape(rows, cols), "scales": scale}
    if q == "ggml":
        return GGML_ENCODERS[spec.kernel](spec, w2d, check_finite)
    if q == "mlx":
        from . import mlx_host
        return mlx_host.quantize(spec, w2d, _k())
    raise ValueError(f"no quantize kernel for {spec.name}")


def quantize_ggml_f16(spec: Spec, h2d: np.ndarray, bf16: bool) -> dict | None:
    """Q4_0 / Q8_0 blocks of float16 (bf16 False) or bfloat16 bits h2d (rows, cols; uint16),
    widened row by row inside the kernel (kernels/ggml_f16_quant.py): the bytes ``quantize``
    gives on the widened float32 tensor. None when no such kernel covers the spec, or when a
    row holds NaN/Inf or a block scale overflows float16 (the caller then widens and takes the
    float32 path, which raises or decides as it always does)."""
    if spec.quant != "ggml" or spec.kernel != "block32" or h2d.ndim != 2:
        return None
    rows, cols = h2d.shape
    if cols % spec.qk:
        return None
    from . import ggml_f16_quant
    h2d = host.readonly(np.ascontiguousarray(h2d).view(np.uint16))
    blocks = np.empty((rows, cols // spec.qk * spec.bpb), np.uint8)
    flags = np.empty(rows, np.uint8)
    with _threads(h2d.size):
        ggml_f16_quant.ggml_encode_f16(h2d, bool(bf16), _branch(spec), spec.bpb, blocks, flags)
    if rows and int(np.bitwise_or.reduce(flags)):
        return None
    return {"blocks": blocks}


def _blocks_or_decline(blocks, flags, w2d, check_finite: bool) -> dict | None:
    """The GGML kernels' per-row flags read: 2, a NaN/Inf (NonFinite when check_finite,
    else None); 1 or 4, a float16 field that overflows or a block the reference decides
    (None: the reference quantizes); else the blocks."""
    f = int(np.bitwise_or.reduce(flags)) if flags.size else 0
    if f & 2:
        return _nonfinite_found(w2d, check_finite)
    if f & 5:
        return None
    return {"blocks": blocks}


def _searched_k_blocks(encode, kinds, spec: Spec, w2d, qw, check_finite) -> dict | None:
    """Blocks of w2d (rows, cols % 256 == 0) by a searched K-quant kernel `encode`; qw: optional
    importance (rows or 1, cols), finite and >= 0. None: the kernel declines (the reference
    decides); NonFinite when w2d holds NaN/Inf and check_finite."""
    w2d = host.readonly(np.ascontiguousarray(w2d, np.float32))
    rows, cols = w2d.shape
    cands, divs, iters, rounds = spec.search
    blocks = np.empty((rows, (cols // 256) * spec.bpb), np.uint8)
    flags = np.empty(rows, np.uint8)
    weighted = qw is not None
    q = host.readonly(np.ascontiguousarray(qw, np.float32).reshape(-1, cols) if weighted
                      else np.ones((1, 1), np.float32))
    with _threads(w2d.size):
        encode(w2d, q, weighted, kinds[spec.ggml_name], np.array(cands, np.float32),
               np.array(divs, np.float32), iters, rounds, blocks, flags)
    return _blocks_or_decline(blocks, flags, w2d, check_finite)


def sym_k_blocks(spec: Spec, w2d: np.ndarray, qw: np.ndarray | None = None,
                 check_finite: bool = True) -> dict | None:
    """Q3_K/Q6_K blocks by kernels/kquant_sym.py (see _searched_k_blocks)."""
    from . import kquant_sym as ks
    return _searched_k_blocks(ks.sym_k_encode, ks.KINDS, spec, w2d, qw, check_finite)


def affine_k_blocks(spec: Spec, w2d: np.ndarray, qw: np.ndarray | None = None,
                    check_finite: bool = True) -> dict | None:
    """Q2_K/Q4_K/Q5_K blocks by kernels/kquant_affine.py (see _searched_k_blocks)."""
    from . import kquant_affine as kq
    return _searched_k_blocks(kq.affine_k_encode, kq.KINDS, spec, w2d, qw, check_finite)


def _codebook_blocks(module, qk: int, spec: Spec, w2d, qw, check_finite) -> dict | None:
    """Blocks of `qk` weights by `module.encode_blocks` (an IQ4 kernel); see iq4nl_blocks."""
    w2d = host.readonly(np.ascontiguousarray(w2d, np.float32))
    rows, cols = w2d.shape
    blocks = np.empty((rows, (cols // qk) * spec.bpb), np.uint8)
    flags = np.empty(rows, np.uint8)
    with _threads(w2d.size):
        module.encode_blocks(w2d, blocks, flags, qw)
    return _blocks_or_decline(blocks, flags, w2d, check_finite)


def iq4nl_blocks(spec: Spec, w2d: np.ndarray, qw: np.ndarray | None = None,
                 check_finite: bool = True) -> dict | None:
    """IQ4_NL blocks by kernels/iq4nl_quant.py; qw: optional importance (rows or 1, cols),
    finite and >= 0. None: the kernel declines (the reference decides); NonFinite when w2d
    holds NaN/Inf and check_finite."""
    from . import iq4nl_quant
    return _codebook_blocks(iq4nl_quant, 32, spec, w2d, qw, check_finite)


def iq4xs_blocks(spec: Spec, w2d: np.ndarray, qw: np.ndarray | None = None,
                 check_finite: bool = True) -> dict | None:
    """IQ4_XS blocks by kernels/iq4xs_quant.py (see iq4nl_blocks)."""
    from . import iq4xs_quant
    return _codebook_blocks(iq4xs_quant, 256, spec, w2d, qw, check_finite)


def _lattice_blocks(encode, spec: Spec, w2d, qw, check_finite) -> dict | None:
    """Blocks of 256 weights by a lattice i-quant kernel, `encode(w2d, blocks, flags, qw)`."""
    w2d = host.readonly(np.ascontiguousarray(w2d, np.float32))
    rows, cols = w2d.shape
    blocks = np.empty((rows, (cols // 256) * spec.bpb), np.uint8)
    flags = np.empty(rows, np.uint8)
    with _threads(w2d.size):
        encode(w2d, blocks, flags, qw)
    return _blocks_or_decline(blocks, flags, w2d, check_finite)


def iq3_blocks(spec: Spec, w2d: np.ndarray, qw: np.ndarray | None = None,
               check_finite: bool = True) -> dict | None:
    """IQ3_XXS / IQ3_S blocks by kernels/iq3_quant.py (see iq4nl_blocks)."""
    from . import iq3_quant
    return _lattice_blocks(lambda w, b, f, q: iq3_quant.encode_blocks(spec.ggml_name, w, b, f, q),
                           spec, w2d, qw, check_finite)


def iq2_blocks(spec: Spec, w2d: np.ndarray, qw: np.ndarray | None = None,
               check_finite: bool = True) -> dict | None:
    """IQ2_XXS / IQ2_XS / IQ2_S blocks by kernels/iq2_quant.py (see iq4nl_blocks)."""
    from . import iq2_quant
    return _lattice_blocks(lambda w, b, f, q: iq2_quant.encode_blocks(w, b, f, q, spec.ggml_name),
                           spec, w2d, qw, check_finite)


def iq1_blocks(spec: Spec, w2d: np.ndarray, qw: np.ndarray | None = None,
               check_finite: bool = True) -> dict | None:
    """IQ1_S / IQ1_M blocks by kernels/iq1_quant.py (see iq4nl_blocks)."""
    from . import iq1_quant
    return _lattice_blocks(lambda w, b, f, q: iq1_quant.encode_blocks(spec.ggml_name, w, b, f, q),
                           spec, w2d, qw, check_finite)


def _rounded_blocks(encode):
    """A GGML_ENCODERS entry for a kernel that fills (blocks, flags) by a fixed rule."""
    def run(spec, w2d, check_finite):
        rows, cols = w2d.shape
        blocks = np.empty((rows, cols // spec.qk * spec.bpb), np.uint8)
        flags = np.empty(rows, np.uint8)
        encode(spec, w2d, blocks, flags)
        return _blocks_or_decline(blocks, flags, w2d, check_finite)
    return run


def _block32(spec, w2d, blocks, flags):
    _k().ggml_encode(w2d, w2d.view(np.int32), _branch(spec), spec.bpb, blocks, flags)


def _legacy(spec, w2d, blocks, flags):
    from . import ggml_legacy_quant
    ggml_legacy_quant.legacy_encode(w2d, w2d.view(np.int32), _branch(spec), spec.bpb, blocks,
                                    flags)


def _rtn(spec, w2d, blocks, flags):
    from . import ggml_rtn_quant
    ggml_rtn_quant.encode_blocks(spec.ggml_name, w2d, blocks, flags)


#: the GGML quantize kernels by entry name (a scheme's ``quant_kernel``): each takes
#: (spec, float32 rows, check_finite) and returns {"blocks"} or None (the reference decides).
#: Each is bit-identical to the scheme's numpy reference; block32 / legacy / rtn also to
#: gguf-py and llama.cpp (their fixed rounding rules)
GGML_ENCODERS = {
    "block32": _rounded_blocks(_block32),      # Q4_0 / Q8_0 (cpu_ggml.ggml_encode)
    "legacy": _rounded_blocks(_legacy),        # Q4_1 / Q5_0 / Q5_1 (ggml_legacy_quant)
    "rtn": _rounded_blocks(_rtn),              # MXFP4 / NVFP4 / TQ1_0 / TQ2_0 (ggml_rtn_quant)
    # the searching quantizers (the layout carries the search parameters: spec.SEARCH_KERNELS)
    "affine_k": lambda spec, w2d, cf: affine_k_blocks(spec, w2d, None, cf),  # kquant_affine
    "sym_k": lambda spec, w2d, cf: sym_k_blocks(spec, w2d, None, cf),        # kquant_sym
    "iq4_nl": lambda spec, w2d, cf: iq4nl_blocks(spec, w2d, None, cf),       # iq4nl_quant
    "iq4_xs": lambda spec, w2d, cf: iq4xs_blocks(spec, w2d, None, cf),       # llama.cpp's search
    "iq3": lambda spec, w2d, cf: iq3_blocks(spec, w2d, None, cf),            # iq3_quant
    "iq2": lambda spec, w2d, cf: iq2_blocks(spec, w2d, None, cf),            # ggml's (iq2_quant)
    "iq1": lambda spec, w2d, cf: iq1_blocks(spec, w2d, None, cf),            # iq1_quant
}
