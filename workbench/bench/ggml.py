"""The workbench's GGML quantizers against ggml's own C code, measured in one run.

    quant-workbench bench --vs-ggml [MODEL] [--types q2_k,...] [--imatrix F | --calib F]

For every 2-D tensor of MODEL (default: the real MiniLM) whose rows are a multiple of the
type's block, per GGML type:

* quality: relative RMSE sqrt(sum (w - w')^2 / sum w^2) over all those tensors, for ggml's
  ``ggml_quantize_chunk`` and for the workbench's quantizer, and their ratio (< 1: ours is
  better). With importance weights (an imatrix, or E[x^2] collected from calibration text),
  the weighted error sqrt(sum_j qw_j (w - w')^2 / sum_j qw_j w^2) of both quantizers given
  the same qw (ggml: its imatrix argument; ours: workbench.quant.methods.ggml_weighted).
* quantize speed, one thread for both: MB/s of float32 input (best of `repeats`), and the
  ratio of the process CPU times (``quant_ratio_1t_cpu``, "cpu x"; steadier than the wall
  time on a shared machine).
* dequantize speed: ggml's to_float (one thread) and the workbench's kernel on one thread
  and on `threads` threads, GB/s of float32 output, each writing into float32 arrays
  allocated once before the timing (the decoders' speed). Into a fresh array per call
  (``*_fresh``, one thread each) the first touch of the new pages costs both sides the same
  and, on MiniLM's 2.4 MB matrices, most of the time: that ratio stays near 1 whatever the
  decoders do.

ggml is called through ``kernels.ggml_ref`` (ctypes over libggml-base from ``.ci/llama-cpp``).
"""

from __future__ import annotations

import time

import numpy as np

from workbench.schemes.registry import ggml_by_number

DEFAULT_TYPES = ggml_by_number()        # every registered GGML type, by GGML type number


def _best(fn, repeats: int) -> float:
    return _best2(fn, repeats)[0]


def _best2(fn, repeats: int) -> tuple[float, float]:
    """(least wall time, least process CPU time) of `repeats` calls. On a loaded machine the
    CPU time of a one-thread run leaves out the time the thread waited for a core."""
    best = cpu = float("inf")
    for _ in range(repeats):
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return best, cpu


def _err(w: np.ndarray, y: np.ndarray, qw: np.ndarray | None):
    """(sum of squared error, sum of squared weights), each weighted by qw when given."""
    d = (w.astype(np.float64) - y) ** 2
    s = w.astype(np.float64) ** 2
    if qw is not None:
        return float((d * qw).sum()), float((s * qw).sum())
    return float(d.sum()), float(s.sum())


def _unit(ty: str, w: np.ndarray):
    """Ones for a type ggml refuses to quantize without an imatrix, else None."""
    from kernels import ggml_ref
    if ggml_ref._load().ggml_quantize_requires_imatrix(ggml_ref.type_id(ty)):
        return np.ones(w.shape[1], np.float32)
    return None


def _weighted_types() -> set[str]:
    """The types the workbench's importance-weighted encoder takes."""
    from workbench.quant.methods import ggml_weighted
    return set(getattr(ggml_weighted, "WEIGHTED_TYPES", ggml_weighted.SUPPORTED))


def run_vs_ggml(model, types=DEFAULT_TYPES, importance: dict | None = None, threads: int = 2,
                repeats: int = 3, progress=None) -> dict:
    """Rows per type (see the module docstring). `importance`: {tensor name: E[x_j^2]}."""
    import numba


    from workbench.quant import accel
    from kernels import ggml_ref

    from workbench.quant.evaluate import quantize
    from workbench.schemes import get_scheme

    say = progress or (lambda m: None)
    mats = {}
    for name in model.tensors:
        info = model.info(name)
        if len(info.shape) == 2 and info.dtype in ("F32", "F16", "BF16") and min(info.shape) > 1:
            mats[name] = np.ascontiguousarray(model.read_matrix(name), np.float32).reshape(info.shape)
    prev = numba.get_num_threads()
    rows = []
    try:
        for ty in types:
            scheme = get_scheme(ty)
            bs = ggml_ref.block_size(ty)
            todo = {n: w for n, w in mats.items() if w.shape[1] % bs == 0}
            if not todo:
                continue
            say(f"{ty}: {len(todo)} tensors")
            nbytes = sum(w.nbytes for w in todo.values())
            # quality (and the bytes both produce), unweighted
            e_g = e_o = tot = 0.0
            raw_g, qts = {}, {}
            for n, w in todo.items():
                # a type ggml quantizes only with an imatrix (the lattice i-quants): unit
                # importance, as the workbench's plain encoding
                raw_g[n] = ggml_ref.quantize(ty, w, imatrix=_unit(ty, w))
                qts[n] = quantize(w, scheme.name, tensor=n)
                yg = ggml_ref.dequantize(ty, raw_g[n], w.shape[1])
                yo = accel.dequantize(qts[n], backend="cpu").reshape(w.shape)
                a, s = _err(w, yg, None)
                b, _ = _err(w, yo, None)
                e_g, e_o, tot = e_g + a, e_o + b, tot + s
            row = {"type": ty, "tensors": len(todo), "mbytes_f32": nbytes / 1e6,
                   "rel_rmse_ggml": (e_g / tot) ** 0.5, "rel_rmse_ours": (e_o / tot) ** 0.5}
            row["rmse_ratio"] = row["rel_rmse_ours"] / row["rel_rmse_ggml"] if e_g else None
            # weighted by the same importance
            imp = {n: importance[n] for n in todo if importance and n in importance}
            if imp and scheme.name in _weighted_types():
                from workbench.quant.methods.ggml_weighted import weighted_encode
                wg = wo = wt = 0.0
                for n, qv in imp.items():
                    w = todo[n]
                    qv = np.asarray(qv, np.float32).reshape(-1)
                    yg = ggml_ref.dequantize(ty, ggml_ref.quantize(ty, w, imatrix=qv), w.shape[1])
                    qwm = np.broadcast_to(qv, w.shape)
                    enc = weighted_encode(scheme, w, qwm)
                    yo = scheme.decode(enc.reshape(-1).view(scheme.block_dtype)).reshape(w.shape)
                    a, s = _err(w, yg, qwm)
                    b, _ = _err(w, yo, qwm)
                    wg, wo, wt = wg + a, wo + b, wt + s
                row.update(weighted_tensors=len(imp), wrel_rmse_ggml=(wg / wt) ** 0.5,
                           wrel_rmse_ours=(wo / wt) ** 0.5,
                           wrmse_ratio=(wo / wg) ** 0.5 if wg else None)
            # speed: quantize, one thread each
            numba.set_num_threads(1)
            for n, w in todo.items():                       # warm (JIT / cache load)
                quantize(w[:1], scheme.name)
                break
            tg, cg = _best2(lambda: [ggml_ref.quantize(ty, w, imatrix=_unit(ty, w))
                                     for w in todo.values()], repeats)
            to, co = _best2(lambda: [quantize(w, scheme.name) for w in todo.values()], repeats)
            row.update(quant_mbps_ggml=nbytes / tg / 1e6, quant_mbps_ours_1t=nbytes / to / 1e6,
                       quant_ratio_1t=tg / to, quant_ratio_1t_cpu=cg / co)
            # dequantize: ggml one thread; ours one thread and `threads`; into arrays
            # allocated once (outs), and into fresh ones
            outs = {n: np.empty(w.shape, np.float32) for n, w in todo.items()}
            for n, q in qts.items():
                accel.dequantize(q, backend="cpu", out=outs[n])
                break
            dg = _best(lambda: [ggml_ref.dequantize(ty, raw_g[n], w.shape[1], out=outs[n])
                                for n, w in todo.items()], repeats)
            d1 = _best(lambda: [accel.dequantize(q, backend="cpu", out=outs[n])
                                for n, q in qts.items()], repeats)
            fg = _best(lambda: [ggml_ref.dequantize(ty, raw_g[n], w.shape[1])
                                for n, w in todo.items()], repeats)
            f1 = _best(lambda: [accel.dequantize(q, backend="cpu") for q in qts.values()], repeats)
            numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
            dn = _best(lambda: [accel.dequantize(q, backend="cpu", out=outs[n])
                                for n, q in qts.items()], repeats)
            row.update(deq_gbps_ggml=nbytes / dg / 1e9, deq_gbps_ours_1t=nbytes / d1 / 1e9,
                       deq_gbps_ours_nt=nbytes / dn / 1e9, deq_ratio_1t=dg / d1,
                       deq_ratio_nt=dg / dn, deq_gbps_ggml_fresh=nbytes / fg / 1e9,
                       deq_gbps_ours_1t_fresh=nbytes / f1 / 1e9, deq_ratio_1t_fresh=fg / f1)
            rows.append(row)
    finally:
        numba.set_num_threads(prev)
    return {"model": str(model.path), "threads": threads, "repeats": repeats, "rows": rows,
            "ggml_library": ggml_ref.library_path(), "llama_cpp_python": ggml_ref.LLAMA_CPP_VERSION}


def format_table(rep: dict) -> str:
    n = rep["threads"]
    out = [f"{rep['model']}: ggml from llama-cpp-python {rep['llama_cpp_python']}, best of "
           f"{rep['repeats']}; quantize on 1 thread each; dequantize ggml 1 thread, ours 1 and {n}",
           f"{'type':7} {'tens':>4} {'relRMSE ggml':>12} {'ours':>9} {'x':>6} {'w-x':>6} "
           f"{'q MB/s ggml':>11} {'ours':>6} {'x':>5} {'cpu x':>5} {'dq GB/s ggml':>12} {'ours1':>6} "
           f"{'x':>5} {'ours'+str(n):>6} {'x':>5} {'fresh x':>7}"]
    for r in rep["rows"]:
        w = r.get("wrmse_ratio")
        out.append(
            f"{r['type']:7} {r['tensors']:4d} {r['rel_rmse_ggml']:12.5f} {r['rel_rmse_ours']:9.5f} "
            f"{r['rmse_ratio'] or 0:6.3f} {('%6.3f' % w) if w else '     -'} "
            f"{r['quant_mbps_ggml']:11.0f} {r['quant_mbps_ours_1t']:6.0f} {r['quant_ratio_1t']:5.2f} "
            f"{r['quant_ratio_1t_cpu']:5.2f} "
            f"{r['deq_gbps_ggml']:12.2f} {r['deq_gbps_ours_1t']:6.2f} {r['deq_ratio_1t']:5.2f} "
            f"{r['deq_gbps_ours_nt']:6.2f} {r['deq_ratio_nt']:5.2f} "
            f"{r['deq_ratio_1t_fresh']:7.2f}")
    out.append("x: relative RMSE ours/ggml (< 1: ours closer); w-x: the same weighted by the "
               "importance both were given; speed x: ours/ggml (> 1: ours faster); cpu x: the "
               "quantize ratio of process CPU times; dequantize "
               "into arrays allocated once; fresh x: one thread each into a new array per call "
               "(the first touch of its pages included).")
    return "\n".join(out)
