"""Per-tensor statistics, streamed in bounded memory and cached per tensor.

For every tensor: min, max, mean, std, absmax, (excess) kurtosis, NaN/Inf counts, the
fraction of outliers (|w - mean| > 6 std), a histogram with a fixed bin count (with its
edges) and per-output-channel min / max / absmax. NaN and Inf are counted and excluded from
everything else. Rows are the output channels (dim 0); 0-d/1-d tensors are one row.

Two passes over the data (range and moments, then histogram and central moments), run by
numba kernels (kernels/stats_kernels.py) on row chunks of the memory-mapped storage, so a
tensor is never fully converted to float32 in memory. :func:`reference_stats` is the plain
numpy definition the kernels are tested against.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from workbench.core.errors import context
from workbench.core.pages import release

from workbench.core.progress import Progress

BINS = 256
OUTLIER_SIGMA = 6.0
CHUNK_ELEMENTS = 1 << 23


@dataclass
class TensorStats:
    name: str
    count: int                      # finite values
    nan: int
    inf: int
    min: float
    max: float
    mean: float
    std: float
    absmax: float
    kurtosis: float                 # excess kurtosis (0 for a normal distribution)
    outlier_frac: float
    hist_counts: np.ndarray = field(repr=False)
    hist_edges: np.ndarray = field(repr=False)
    ch_min: np.ndarray = field(repr=False)
    ch_max: np.ndarray = field(repr=False)
    ch_absmax: np.ndarray = field(repr=False)

    def to_dict(self, arrays: bool = False) -> dict:
        if self.count == 0:   # many empty tensors: no per-field conversion
            d = {"count": 0, "nan": int(self.nan), "inf": int(self.inf), **_NAN_FIELDS,
                 "outlier_frac": float(self.outlier_frac)}
        else:
            d = {k: _num(getattr(self, k)) for k in _FIELDS}
        if arrays:
            d["histogram"] = {"counts": self.hist_counts.tolist(), "edges": self.hist_edges.tolist()}
            d["channels"] = {"min": self.ch_min.tolist(), "max": self.ch_max.tolist(),
                             "absmax": self.ch_absmax.tolist()}
        return d


_FIELDS = ("count", "nan", "inf", "min", "max", "mean", "std", "absmax", "kurtosis",
           "outlier_frac")
_NAN_FIELDS = {k: float("nan") for k in ("min", "max", "mean", "std", "absmax", "kurtosis")}


def _num(v):
    return int(v) if isinstance(v, (int, np.integer)) else float(v)


# storage dtypes the kernels read directly by casting each element to float64
_CAST_DTYPES = ("F64", "F32", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8")


def _storage_kind(raw: np.ndarray, dtype: str) -> tuple[np.ndarray, int]:
    """(array the kernel reads, kind): kind 1 = bfloat16 bits, 0 = cast; None = decode chunks.

    Decided by the storage dtype name, not the numpy dtype: FP8 codes and GGML blocks are
    uint8 arrays that must be decoded, not cast; numba has no float16 or bool arithmetic.
    """
    if dtype == "BF16" and raw.dtype == np.uint16:
        return raw, 1
    if dtype in _CAST_DTYPES and raw.dtype.kind in "fiu":
        return raw, 0
    return None, 0


def _chunks(model, name: str):
    """Yield (row_start, 2-D array for the kernel, kind) in bounded chunks, read-only as every
    kernel takes its inputs (kernels.host.readonly: numba compiles a writable array's variant
    apart, and a decoded chunk, an FP8 tensor's rows widened to float32, had compiled the
    statistics kernels again on first use)."""
    from kernels.host import readonly
    info = model.info(name)
    rows, cols = info.matrix_shape
    raw = model.raw(name)
    arr, kind = _storage_kind(raw, info.dtype)
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    for r0 in range(0, rows, step):
        part = raw[r0:r0 + step]   # read here when raw is a loaders.region.Region
        if arr is not None:
            yield r0, readonly(np.ascontiguousarray(part)), kind
        else:
            from workbench.formats.dtypes import decode_rows
            yield r0, readonly(decode_rows(part, info)), 0
        release(part)


_LUT16: dict[str, np.ndarray] = {}


def _lut16(dtype: str) -> np.ndarray:
    """float32 value of every 16-bit pattern of bf16 / f16."""
    if dtype not in _LUT16:
        codes = np.arange(1 << 16, dtype=np.uint32)
        if dtype == "BF16":
            _LUT16[dtype] = (codes << 16).view(np.float32)
        else:
            _LUT16[dtype] = codes.astype(np.uint16).view(np.float16).astype(np.float32)
    return _LUT16[dtype]


def _stats_from_values(name, values, counts, rmin, rmax, bins) -> TensorStats:
    """Exact statistics from a table of distinct values and their counts (+ row ranges)."""
    with np.errstate(invalid="ignore"):  # signalling-NaN bit patterns in the table
        vals = values.astype(np.float64)
    nan = int(counts[np.isnan(vals)].sum())
    inf = int(counts[np.isinf(vals)].sum())
    keep = np.isfinite(vals) & (counts > 0)
    v, c = vals[keep], counts[keep].astype(np.float64)
    rows = rmin.shape[0]
    n = int(c.sum())
    if n == 0:
        return _empty_stats(name, rows, nan, inf, bins)
    lo, hi = float(v.min()), float(v.max())
    mean = float((c * v).sum() / n)
    var_est = max(float((c * v * v).sum() / n) - mean * mean, 0.0)
    d = v - mean
    m2, m3, m4 = (float((c * d ** k).sum() / n) for k in (2, 3, 4))
    outl = int(c[np.abs(d) > OUTLIER_SIGMA * math.sqrt(var_est)].sum())
    scale = bins / (hi - lo) if hi > lo else 0.0
    idx = np.clip(((v - lo) * scale).astype(np.int64), 0, bins - 1)
    hist = np.bincount(idx, weights=c, minlength=bins).astype(np.int64)
    edges = np.linspace(lo, hi, bins + 1) if hi > lo else np.linspace(lo - 0.5, hi + 0.5, bins + 1)
    return TensorStats(name, n, nan, inf, lo, hi, mean, math.sqrt(m2), max(abs(lo), abs(hi)),
                       m4 / (m2 * m2) - 3.0 if m2 > 0 else 0.0, outl / n, hist, edges,
                       *_channel_arrays(rmin, rmax))


def _channel_arrays(rmin, rmax):
    ok = rmin <= rmax
    ch_min = np.where(ok, rmin, np.nan).astype(np.float32)
    ch_max = np.where(ok, rmax, np.nan).astype(np.float32)
    ch_abs = np.where(ok, np.maximum(np.abs(rmin), np.abs(rmax)), np.nan).astype(np.float32)
    return ch_min, ch_max, ch_abs


def _tensor_stats_16bit(model, name: str, bins: int):
    """One pass over bf16/f16 storage: bit-pattern counts + per-row ranges."""
    from kernels.stats_kernels import code_counts
    import numba

    info = model.info(name)
    rows, cols = info.matrix_shape
    lut = _lut16(info.dtype)
    rmin = np.full(rows, np.inf, np.float32)
    rmax = np.full(rows, -np.inf, np.float32)
    counts = np.zeros((numba.get_num_threads(), 1 << 16), np.int64)
    raw = model.raw(name)
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    for r0 in range(0, rows, step):
        part = raw[r0:r0 + step]
        chunk = np.ascontiguousarray(part).view(np.uint16)
        r1 = r0 + chunk.shape[0]
        code_counts(chunk, lut, rmin[r0:r1], rmax[r0:r1], counts)
        release(part)
        yield Progress(r1, rows, name)
    return _stats_from_values(name, lut, counts.sum(axis=0), rmin.astype(np.float64),
                              rmax.astype(np.float64), bins)


# storage dtypes whose values float32 cannot hold exactly (the numba kernels decode rows to
# float32): their statistics are computed in float64 by the chunked numpy path
_WIDE_DTYPES = ("F64", "I64", "I32", "U64", "U32")


def tensor_stats(model, name: str, bins: int = BINS):
    """Job: statistics of one tensor (yields Progress, returns TensorStats)."""
    info = model.info(name)
    if info.numel == 0:
        yield Progress(1, 1, name)
        return _empty_stats(name, info.rows, 0, 0, bins)
    if info.dtype in ("BF16", "F16") and not info.quant and info.numel:
        return (yield from _tensor_stats_16bit(model, name, bins))
    if info.dtype in _WIDE_DTYPES and not info.quant:
        return (yield from _tensor_stats_float64(model, name, bins))
    return (yield from _tensor_stats_two_pass(model, name, bins))


def _f64_chunks(model, name: str):
    info = model.info(name)
    rows, cols = info.matrix_shape
    raw = model.raw(name)
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)            # explicit rows: -1 is ambiguous when cols == 0
        part = raw[r0:r0 + step]
        yield r0, np.asarray(part, dtype=np.float64).reshape(n, cols)
        release(part)


def _tensor_stats_float64(model, name: str, bins: int):
    """Two chunked numpy passes in float64: the reference definition, in bounded memory."""
    info = model.info(name)
    rows, cols = info.matrix_shape
    rmin = np.full(rows, np.inf)
    rmax = np.full(rows, -np.inf)
    nan = inf = 0
    s = q = 0.0
    for r0, x in _f64_chunks(model, name):
        fin = np.isfinite(x)
        nan += int(np.isnan(x).sum())
        inf += int(np.isinf(x).sum())
        rmin[r0:r0 + len(x)] = np.where(fin, x, np.inf).min(axis=1, initial=np.inf)
        rmax[r0:r0 + len(x)] = np.where(fin, x, -np.inf).max(axis=1, initial=-np.inf)
        v = x[fin]
        s += float(v.sum())
        q += float((v * v).sum())
        yield Progress(r0 + len(x), 2 * rows, name)
    count = info.numel - nan - inf
    if count == 0:
        return _empty_stats(name, rows, nan, inf, bins)
    lo, hi = float(rmin.min()), float(rmax.max())
    mean = s / count
    thresh = OUTLIER_SIGMA * math.sqrt(max(q / count - mean * mean, 0.0))
    scale = bins / (hi - lo) if hi > lo else 0.0
    hist = np.zeros(bins, np.int64)
    m = np.zeros(3)
    outl = 0
    for r0, x in _f64_chunks(model, name):
        v = x[np.isfinite(x)]
        hist += np.bincount(np.clip(((v - lo) * scale).astype(np.int64), 0, bins - 1),
                            minlength=bins)
        d = v - mean
        m += [float((d ** 2).sum()), float((d ** 3).sum()), float((d ** 4).sum())]
        outl += int((np.abs(d) > thresh).sum())
        yield Progress(rows + r0 + len(x), 2 * rows, name)
    m2, m3, m4 = m / count
    edges = np.linspace(lo, hi, bins + 1) if hi > lo else np.linspace(lo - 0.5, hi + 0.5, bins + 1)
    return TensorStats(name, count, nan, inf, lo, hi, mean, math.sqrt(m2), max(abs(lo), abs(hi)),
                       m4 / (m2 * m2) - 3.0 if m2 > 0 else 0.0, outl / count, hist, edges,
                       *_channel_arrays(rmin, rmax))


def _tensor_stats_two_pass(model, name: str, bins: int):
    from kernels.stats_kernels import hist_central, row_moments
    import numba

    info = model.info(name)
    rows, cols = info.matrix_shape
    rmin = np.empty(rows, np.float64)
    rmax = np.empty(rows, np.float64)
    rabs = np.empty(rows, np.float64)
    rsum = np.empty(rows, np.float64)
    rsq = np.empty(rows, np.float64)
    rnan = np.empty(rows, np.int64)
    rinf = np.empty(rows, np.int64)
    total_steps = 2 * rows
    if info.numel:
        for r0, chunk, kind in _chunks(model, name):
            r1 = r0 + chunk.shape[0]
            row_moments(chunk, kind, rmin[r0:r1], rmax[r0:r1], rabs[r0:r1], rsum[r0:r1],
                        rsq[r0:r1], rnan[r0:r1], rinf[r0:r1])
            yield Progress(r1, total_steps, name)
    else:
        rmin[:] = np.inf
        rmax[:] = -np.inf
        rabs[:] = -np.inf
        rsum[:] = rsq[:] = 0
        rnan[:] = rinf[:] = 0
    nan, inf = int(rnan.sum()), int(rinf.sum())
    count = info.numel - nan - inf
    if count == 0:
        return _empty_stats(name, rows, nan, inf, bins)
    lo, hi = float(rmin.min()), float(rmax.max())
    mean = float(rsum.sum()) / count
    var_est = max(float(rsq.sum()) / count - mean * mean, 0.0)
    thresh = OUTLIER_SIGMA * math.sqrt(var_est)
    nthreads = numba.get_num_threads()
    hist = np.zeros((nthreads, bins), np.int64)
    moments = np.zeros(3, np.float64)
    outliers = 0
    for r0, chunk, kind in _chunks(model, name):
        hist_t = np.zeros((nthreads, bins), np.int64)
        mom_t = np.zeros((nthreads, 3), np.float64)
        out_t = np.zeros(nthreads, np.int64)
        bad = (rnan[r0:r0 + chunk.shape[0]] + rinf[r0:r0 + chunk.shape[0]]) > 0
        hist_central(chunk, kind, lo, hi, mean, thresh, bad, hist_t, mom_t, out_t)
        hist += hist_t
        moments += mom_t.sum(axis=0)
        outliers += int(out_t.sum())
        yield Progress(rows + r0 + chunk.shape[0], total_steps, name)
    m2, m3, m4 = moments / count
    std = math.sqrt(m2)
    kurt = (m4 / (m2 * m2) - 3.0) if m2 > 0 else 0.0
    edges = np.linspace(lo, hi, bins + 1) if hi > lo else np.linspace(lo - 0.5, hi + 0.5, bins + 1)
    return TensorStats(name, count, nan, inf, lo, hi, mean, std, max(abs(lo), abs(hi)), kurt,
                       outliers / count, hist.sum(axis=0), edges, *_channel_arrays(rmin, rmax))


_NAN32 = np.full(1, np.nan, np.float32)
_NAN32.flags.writeable = False


def _empty_stats(name, rows, nan, inf, bins) -> TensorStats:
    """Statistics of a tensor without finite values. The arrays are shared and read-only (the
    per-channel ones a zero-copy broadcast), so a header of many empty tensors costs next to
    nothing, whatever rows they claim."""
    nanv = float("nan")
    counts, edges = _empty_hist(bins)
    ch = np.ndarray((rows,), np.float32, buffer=_NAN32, strides=(0,))   # read-only, no memory
    return TensorStats(name, 0, nan, inf, nanv, nanv, nanv, nanv, nanv, nanv, 0.0,
                       counts, edges, ch, ch, ch)


def empty_stats(name: str, rows: int, bins: int = BINS) -> TensorStats:
    """The statistics of a tensor with no elements (what tensor_stats returns for it)."""
    return _empty_stats(name, rows, 0, 0, bins)


def empty_stats_dict() -> dict:
    """``empty_stats(...).to_dict()``: the same for every empty tensor."""
    return empty_stats("", 0).to_dict()


@lru_cache(maxsize=16)
def _empty_hist(bins: int):
    counts, edges = np.zeros(bins, np.int64), np.linspace(0, 1, bins + 1)
    counts.flags.writeable = edges.flags.writeable = False
    return counts, edges


def reference_stats(w: np.ndarray, name: str = "", bins: int = BINS) -> TensorStats:
    """The numpy definition of every statistic (used by tests; loads the whole tensor)."""
    w = np.asarray(w, dtype=np.float64)
    w2 = w.reshape(w.shape[0], math.prod(w.shape[1:])) if w.ndim >= 2 else w.reshape(1, -1)
    fin = np.isfinite(w2)
    nan = int(np.isnan(w2).sum())
    inf = int(np.isinf(w2).sum())
    v = w2[fin]
    if v.size == 0:
        return _empty_stats(name, w2.shape[0], nan, inf, bins)
    lo, hi = float(v.min()), float(v.max())
    mean = float(v.mean())
    d = v - mean
    m2, m4 = float((d ** 2).mean()), float((d ** 4).mean())
    var_est = max(float((v * v).mean()) - mean * mean, 0.0)
    outl = int((np.abs(d) > OUTLIER_SIGMA * math.sqrt(var_est)).sum())
    edges = np.linspace(lo, hi, bins + 1) if hi > lo else np.linspace(lo - 0.5, hi + 0.5, bins + 1)
    scale = bins / (hi - lo) if hi > lo else 0.0
    idx = np.clip(((v - lo) * scale).astype(np.int64), 0, bins - 1)
    counts = np.bincount(idx, minlength=bins)
    masked_lo = np.where(fin, w2, np.inf).min(axis=1)
    masked_hi = np.where(fin, w2, -np.inf).max(axis=1)
    return TensorStats(name, int(v.size), nan, inf, lo, hi, mean, math.sqrt(m2),
                       max(abs(lo), abs(hi)), m4 / (m2 * m2) - 3.0 if m2 > 0 else 0.0,
                       outl / v.size, counts, edges, *_channel_arrays(masked_lo, masked_hi))


def file_signature(path) -> tuple | None:
    """(mtime_ns, size, ctime_ns, inode) of a file, so the in-process caches never serve results
    of a file since rewritten: an edit that keeps the size and puts the mtime back (os.utime)
    still moves the ctime, and a file replaced by another has another inode. (The first two
    are what jobs.cluster compares across machines.)"""
    try:
        st = os.stat(path)
    except (OSError, ValueError, TypeError):
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino)


class StatsCache:
    """Thread-safe per-tensor cache keyed by (model path, tensor name, file signature)."""

    def __init__(self):
        self._data: dict[tuple, TensorStats] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(model, name: str) -> tuple:
        info = model.tensors.get(name)
        return (model.path, name, file_signature((info.file if info else "") or model.path))

    def get(self, model, name: str) -> TensorStats | None:
        key = self._key(model, name)
        with self._lock:
            return self._data.get(key)

    def put(self, model, stats: TensorStats) -> None:
        key = self._key(model, stats.name)
        with self._lock:
            self._data[key] = stats

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


DEFAULT_CACHE = StatsCache()


def model_stats(model, names=None, cache: StatsCache | None = DEFAULT_CACHE, bins: int = BINS,
                executor=None):
    """Job: statistics of many tensors (default: all), using and filling the cache.

    Progress is measured in bytes so big tensors count for what they cost. `executor`
    (workbench.jobs.cluster.ClusterExecutor, passed in): the tensors not cached are computed on its workers, one task each.
    """
    names = list(model.tensors) if names is None else list(names)
    if executor is not None and executor.takes(model):
        cache = cache if cache is not None else StatsCache()
        todo = [n for n in names if model.info(n).numel and cache.get(model, n) is None]
        for st in (yield from executor.tensor_stats(model, todo, bins)):
            cache.put(model, st)
    infos = [model.info(n) for n in names]
    total = sum(max(i.nbytes, 1) for i in infos) or 1
    done = 0
    out: dict[str, TensorStats] = {}
    for k, (n, info) in enumerate(zip(names, infos), 1):
        size = max(info.nbytes, 1)
        if info.numel == 0:   # nothing to read or cache: linear in the header, small constant
            out[n] = _empty_stats(n, info.rows, 0, 0, bins)
            done += size
            if len(out) % 4096 == 0:
                yield Progress(done, total, f"statistics {k}/{len(names)}: {n}")
            continue
        what = f"statistics {k}/{len(names)}: {n}"
        st = cache.get(model, n) if cache is not None else None
        if st is None:
            job = tensor_stats(model, n, bins)
            while True:
                try:
                    with context(model.info(n).file or model.path, n):
                        ev = next(job)
                except StopIteration as stop:
                    st = stop.value
                    break
                yield Progress(done + size * ev.fraction, total, what)
            if cache is not None:
                cache.put(model, st)
        out[n] = st
        done += size
        yield Progress(done, total, what)
    return out
