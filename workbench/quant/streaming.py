"""Weight work on tensors bigger than a bounded chunk: row chunks, merged sums.

A 128256 x 4096 embedding is 2.1 GB as float32, and quantizing it whole holds the weights,
the codes, the dequantized copy and the float64 error at once (several times that). Every
scheme whose rows are quantized independently (``Scheme.row_local``: per-row or per-block
scales) gives the same codes when the tensor is quantized a block of rows at a time, so a
tensor above STREAM_ELEMENTS is measured chunk by chunk: the peak is one chunk, whatever the
tensor's size (a large tensor's rows are read a chunk at a time: `Model.iter_rows`). Smaller tensors take the whole-tensor path unchanged. Sums merged from
chunks equal the whole-tensor sums up to float64 summation order; per-row values, maxima and
byte counts are identical.
"""

from __future__ import annotations

import numpy as np

from workbench.quant.metrics import ErrorSums
from workbench.quant.plan import KEEP
from workbench.schemes import get_scheme

STREAM_ELEMENTS = 1 << 26      # 64 M elements (256 MB float32): above this, row chunks
CHUNK_ELEMENTS = 1 << 24       # elements per chunk (~64 MB float32)


def streamed(info, scheme_name: str) -> bool:
    """Whether `info`'s tensor is processed in row chunks under `scheme_name`."""
    if scheme_name == KEEP:
        # a kept tensor's sums are float64 copies of it (4x its float32 size): chunked from
        # one chunk's size on
        return info.numel > min(STREAM_ELEMENTS, CHUNK_ELEMENTS) and info.rows >= 2
    if info.numel <= STREAM_ELEMENTS or info.rows < 2:
        return False
    from workbench.schemes import get_scheme
    return bool(get_scheme(scheme_name).row_local)


def tensor_scale_chunked(info, scheme_name: str) -> bool:
    """Whether `dequantized_rows` gives a big tensor under a scheme with one scale for the
    whole tensor in row chunks too: the scale found from the chunks first
    (``IntAffine.tensor_qparams``: two passes), then each chunk quantized with it."""
    if scheme_name == KEEP or info.numel <= STREAM_ELEMENTS or info.rows < 2:
        return False
    scheme = get_scheme(scheme_name)
    return not scheme.row_local and bool(getattr(scheme, "chunked_qparams", False)) \
        and not scheme.ineligible_reason(info.shape)


def dequantized_in_chunks(info, scheme_name: str) -> bool:
    """Whether `dequantized_rows` never holds the whole tensor under `scheme_name`."""
    return streamed(info, scheme_name) or tensor_scale_chunked(info, scheme_name)


def chunks(model, name: str):
    """(row_start, float32 rows) of a tensor in chunks of about CHUNK_ELEMENTS."""
    yield from model.iter_rows(name, CHUNK_ELEMENTS)


def merge_sums(parts: list[ErrorSums]) -> ErrorSums:
    """The sums of a tensor from the sums of its row chunks, in row order."""
    if len(parts) == 1:
        return parts[0]
    return ErrorSums(n=sum(p.n for p in parts), sse=float(sum(p.sse for p in parts)),
                     sig=float(sum(p.sig for p in parts)), deq=float(sum(p.deq for p in parts)),
                     dot=float(sum(p.dot for p in parts)),
                     max_abs_err=max(p.max_abs_err for p in parts),
                     ch_sse=np.concatenate([np.asarray(p.ch_sse) for p in parts]),
                     ch_sig=np.concatenate([np.asarray(p.ch_sig) for p in parts]))


def keep_sums(model, name: str) -> ErrorSums:
    """ErrorSums of a float tensor kept unchanged (no error), chunk by chunk."""
    parts = []
    for _r0, w in chunks(model, name):
        parts.append(ErrorSums.zero(np.where(np.isfinite(w), w, 0)))
    return merge_sums(parts)


def measure_rows(model, name: str, scheme_name: str):
    """(bytes, ErrorSums) of `name` quantized with a row-local scheme, chunk by chunk: the
    figures `evaluate.measure` gives for the whole tensor."""
    from workbench.core.errors import WorkbenchError
    from workbench.quant.evaluate import measure
    from workbench.schemes import get_scheme
    info = model.info(name)
    parts = []
    for _r0, w in chunks(model, name):
        _nb, sums = measure(w, scheme_name, tensor=name)
        if not (np.isfinite(sums.sse) and np.isfinite(sums.max_abs_err)) and np.isfinite(w).all():
            raise WorkbenchError(
                f"{scheme_name} cannot represent these weights (max |w| = "
                f"{float(np.abs(w).max()):.3g}): their dequantized values overflow float32; "
                "keep this tensor or use fp32", tensor=name)
        parts.append(sums)
    return get_scheme(scheme_name).nbytes(info.shape), merge_sums(parts)


def method_streamed(model, info, name: str, scheme_name: str) -> bool:
    """Whether a tensor of a model seen through a plan's methods
    (workbench.running.methods_apply.MethodModel) is quantized in row chunks: big, the scheme
    row-local, not folded (AWQ's scales), and its method treating rows independently."""
    if scheme_name == KEEP or not streamed(info, scheme_name) \
            or name in getattr(model, "folded_names", ()):
        return False
    from workbench.quant.methods.base import get_method
    return bool(get_method(model.method_of(name)).row_local)


def measure_rows_method(model, name: str, scheme_name: str):
    """(bytes, ErrorSums) of `name` quantized by its method (``model.quantize_tensor``) a row
    chunk at a time (`method_streamed`): the figures of the whole-tensor path."""
    from workbench.quant.accel import dequantize
    from workbench.schemes import get_scheme
    scheme = get_scheme(scheme_name)
    parts = []
    for _r0, w in chunks(model, name):
        qt = model.quantize_tensor(name, w, scheme_name)
        wq = dequantize(qt).reshape(w.shape)
        parts.append(ErrorSums.from_arrays(w, wq))
    return scheme.nbytes(model.info(name).shape), merge_sums(parts)


def dequantized_rows(model, name: str, scheme_name: str):
    """(row_start, original float32 rows, the same rows as the scheme stores them,
    dequantized) in chunks; a scheme that is not row-local gets one chunk, the whole tensor.
    `scheme_name` is the scheme applied (after the runtime's fallbacks); KEEP gives the rows
    twice."""
    from workbench.quant.accel import dequantize
    from workbench.quant.evaluate import quantize
    from workbench.schemes import get_scheme
    info = model.info(name)
    if scheme_name == KEEP or not info.is_float:
        for r0, w in (chunks(model, name) if streamed(info, KEEP) else [(0, model.read_matrix(name))]):
            yield r0, w, w
        return
    scheme = get_scheme(scheme_name)
    if scheme.ineligible_reason(info.shape):
        for r0, w in chunks(model, name):
            yield r0, w, w
        return
    if tensor_scale_chunked(info, scheme_name):        # one scale: found first, then applied
        qp = scheme.tensor_qparams(lambda: (w for _r0, w in chunks(model, name)))
        for r0, w in chunks(model, name):
            yield r0, w, scheme.fake_quantize(w, qp)
        return
    it = chunks(model, name) if streamed(info, scheme_name) else [(0, model.read_matrix(name))]
    for r0, w in it:
        qt = quantize(w, scheme_name, tensor=name)
        yield r0, w, dequantize(qt).reshape(w.shape)


def quantized_row_blocks(model, name: str, scheme_name: str, convert=None):
    """Stream `name` quantized with a row-local scheme for an exporter that writes arrays one
    after another: returns (first key, an iterator of that array's row blocks, spool) where
    `spool` fills with the other arrays' blocks (small: scales, zero points) as the iterator
    runs. `convert(qt, rows, cols)` maps a chunk's QuantizedTensor to the exporter's arrays
    (default: ``qt.arrays``). Every array must be row-major in the tensor's rows (2-D with
    the chunk's rows first, or 1-D flattened in row order) so blocks concatenate to the
    whole tensor's array."""
    from workbench.quant.evaluate import quantize
    convert = convert or (lambda qt, r, c: qt.arrays)
    it = chunks(model, name)
    r0, w = next(it)
    first = convert(quantize(w, scheme_name, tensor=name), *w.shape)
    key = next(iter(first))
    spool: dict[str, list] = {k: [v] for k, v in first.items() if k != key}

    def blocks():
        yield first[key]
        for _r0, w in it:
            arrays = convert(quantize(w, scheme_name, tensor=name), *w.shape)
            for k, v in arrays.items():
                if k != key:
                    spool[k].append(v)
            yield arrays[key]
    return key, blocks(), spool


def export_streamed(model, info, scheme_name: str) -> bool:
    """Exporters stream a tensor when it is big, the scheme row-local and each row a whole
    number of bytes in every packing (cols a multiple of 8)."""
    return streamed(info, scheme_name) and scheme_name != KEEP and info.cols % 8 == 0 \
        and getattr(model, "quantize_tensor", None) is None


def activation_error(model, name: str, scheme: str, ex2: np.ndarray, rows: bool = False) -> float:
    """sum_j ex2[j] * ||dW[:, j]||^2 (columns: a Linear's inputs); `rows`: sum_t ex2[t] *
    ||dW[t, :]||^2 (an embedding table's rows)."""
    row_sq, col_sq = [], None
    for _r0, w, wq in dequantized_rows(model, name, scheme):   # row chunks for big tensors
        dw = (wq - w).astype(np.float64)
        dw = dw.reshape(dw.shape[0], -1)
        sq = dw ** 2
        row_sq.append(sq.sum(1))
        col_sq = sq.sum(0) if col_sq is None else col_sq + sq.sum(0)
    row_sq = np.concatenate(row_sq)
    if rows:
        return float(row_sq @ ex2)
    if len(col_sq) != len(ex2) and len(row_sq) == len(ex2):   # GPT-2 Conv1D stores (in, out)
        return float(row_sq @ ex2)
    return float(col_sq @ ex2)


def dequantized(model, name: str, scheme_name: str, matrix: np.ndarray | None = None) -> np.ndarray:
    """The tensor `name` as the scheme would store it, dequantized (float32, original shape).
    A shape the scheme cannot take gets the scheme `evaluate` counts for it (the ``any``
    runtime's fallback, workbench.quant.runtimes.decide); tensors kept come back unchanged.
    `matrix`: the tensor as `model.read_matrix(name)` gives it, when the caller holds it
    (read once for several schemes)."""
    from workbench.quant import streaming
    from workbench.quant.evaluate import quantize
    from workbench.quant.runtimes import decide
    info = model.info(name)
    applied = KEEP
    if scheme_name != KEEP and info.is_float:
        applied = decide(info, scheme_name, "any").applied
    scheme = None if applied == KEEP else get_scheme(applied)
    if scheme is not None and scheme.ineligible_reason(
            info.matrix_shape if info.merged_experts else info.shape):
        scheme = None
    if scheme is None:
        return (model.read_matrix(name) if matrix is None else matrix).reshape(info.shape)
    if matrix is None and streaming.streamed(info, applied):
        # a big tensor (an 8 B model's 2.1 GB head): quantized a row chunk at a time into the
        # output, so the float32 copy, the codes and the quantizer's temporaries of the whole
        # tensor are never held at once
        out = np.empty(info.shape, np.float32)
        for r0, _w0, dq in streaming.dequantized_rows(model, name, applied):
            out.reshape(-1, dq.shape[1])[r0:r0 + dq.shape[0]] = dq
        return out
    qt = quantize(model.read_matrix(name) if matrix is None else matrix, applied, tensor=name)
    from workbench.quant.accel import dequantize
    return dequantize(qt).reshape(info.shape)
