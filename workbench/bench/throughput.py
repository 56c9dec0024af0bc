"""Throughput benchmark of the kernels (no Qt; the CLI `bench` command and the app use it).

Per scheme and backend: dequantize GB/s (bytes of float32 written) and quantize GB/s (bytes
of float32 read), each the median of several timed runs after a warm-up run, and in the same
run the baselines on the same matrix:

* ``copy``: ``np.copyto`` of the float32 matrix (the memory-bandwidth limit);
* ``numpy``: the scheme's own numpy reference (``scheme.dequantize`` / ``scheme.quantize``);
* ``gguf``: for GGML types, ``gguf.quants.dequantize`` / ``quantize`` (numpy);
* ``d2d_copy``: on a GPU, a device-to-device copy of the float32 matrix.

On the CPU also the evaluation of the tensor (its quantized bytes and error sums, what the app
computes after an edit): ``evaluate_gbps`` (``evaluate.measure``, one pass over the weights
where ``accel.quantize_error`` applies: ``evaluate_one_pass``) against
``evaluate_two_pass_gbps`` (``quantize`` then ``dequant_error``), ``evaluate_vs_two_pass``.

On CUDA, dequantize times the kernel alone (inputs already on the device); quantize times the
whole call (upload, kernels, download). Schemes without a kernel for an operation are timed
through the numpy fallback and marked ``*_kernel: false``.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np

from workbench.schemes.registry import ggml_by_number

DEFAULT_SCHEMES = ["int8-channel", "int4-g128", "int4-g128-asym", "int3-g64", "int2-g32",
                   "nf4-g64", "ternary-g64", "fp8-e4m3", "fp8-e5m2", "fp16", "bf16"]
GGML_ORDER = list(ggml_by_number())     # the GGML types, by GGML type number
SLOW_BUDGET_S = 4.0        # a baseline slower than this per run is timed fewer times
TARGETS = {"dequant_vs_copy": 0.7, "dequant_vs_gguf": 10.0, "quant_vs_gguf": 10.0,
           "quant_vs_numpy": 10.0, "dequant_vs_d2d_copy": 0.7}


def default_schemes() -> list[str]:
    from workbench.schemes import list_schemes
    present = set(list_schemes())
    return [n for n in DEFAULT_SCHEMES if n in present] + [n for n in GGML_ORDER if n in present]


def all_schemes() -> list[str]:
    from workbench.schemes import list_schemes
    return list_schemes()


def timed(fn: Callable[[], object], repeats: int, budget_s: float = SLOW_BUDGET_S) -> dict:
    """Median seconds of `repeats` runs after one warm-up run (fewer runs if one is slow)."""
    t0 = time.perf_counter()
    fn()
    warm = time.perf_counter() - t0
    n = repeats if warm * repeats <= budget_s else max(1, min(repeats, int(budget_s / max(warm, 1e-9))))
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(ts), "runs": n}


def _gbps(nbytes: int, t: dict | None) -> float | None:
    return None if t is None or t["seconds"] <= 0 else nbytes / t["seconds"] / 1e9


def _ratio(a, b):
    return None if a is None or not b else a / b


def run_bench(schemes: list[str] | None = None, size: tuple[int, int] = (4096, 4096),
              backends: list[str] | None = None, repeats: int = 5, seed: int = 0,
              baselines: bool = True, progress: Callable[[str], None] | None = None) -> dict:
    """Measure and return every figure as a JSON-ready dict (see the module docstring)."""
    from workbench.core.checks import check_int
    check_int("repeats", repeats, 1, 1000)
    from workbench.quant import accel
    from kernels import backend as kb
    from workbench.quant.accel import spec_for
    from workbench.schemes import get_scheme

    say = progress or (lambda msg: None)
    rows, cols = size
    schemes = list(schemes) if schemes else default_schemes()
    backends = [kb.resolve(b) for b in (backends or ["auto"])]
    backends = list(dict.fromkeys(backends))
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
    nbytes = w.nbytes
    out = np.empty_like(w)

    say("baseline: float32 copy")
    copy_t = timed(lambda: np.copyto(out, w), max(repeats, 5))
    base = {"copy_gbps": _gbps(nbytes, copy_t), "copy_runs": copy_t["runs"]}
    if "cuda" in backends:
        from numba import cuda
        d_src = cuda.to_device(w)
        d_dst = cuda.device_array_like(d_src)

        def d2d():
            d_dst.copy_to_device(d_src)
            cuda.synchronize()
        t = timed(d2d, max(repeats, 5))
        base["d2d_copy_gbps"] = _gbps(nbytes, t)

    results = []
    for name in schemes:
        scheme = get_scheme(name)
        if not scheme.can_take((rows, cols)):
            results.append({"scheme": scheme.name, "skipped": scheme.ineligible_reason((rows, cols))})
            continue
        spec = spec_for(scheme)
        qt = accel.quantize(scheme, w, backend="cpu")
        ref = {}
        if baselines:
            say(f"{scheme.name}: numpy reference")
            ref["numpy_dequant"] = timed(lambda: scheme.dequantize(qt), repeats)
            ref["numpy_quant"] = timed(lambda: scheme.quantize(w), repeats)
            ggml_type = getattr(scheme, "ggml_type", None)
            if ggml_type is not None:
                import gguf
                qtype = gguf.GGMLQuantizationType(int(ggml_type))
                blocks = qt.arrays["blocks"]
                say(f"{scheme.name}: gguf reference")
                try:
                    ref["gguf_dequant"] = timed(lambda: gguf.quants.dequantize(blocks, qtype), repeats)
                except NotImplementedError:
                    pass
                try:
                    ref["gguf_quant"] = timed(lambda: gguf.quants.quantize(w, qtype), repeats)
                except NotImplementedError:
                    pass
        for b in backends:
            say(f"{scheme.name}: {b}")
            rec = {"scheme": scheme.name, "backend": b,
                   "bits_per_weight": scheme.bits_per_weight((rows, cols)),
                   "dequant_kernel": accel.has_kernel(scheme, "dequantize", b),
                   "quant_kernel": accel.has_kernel(scheme, "quantize", b)}
            if b == "cuda" and spec is not None:
                from kernels import cuda_ops
                launch, _ = cuda_ops.prepare_dequant(spec, qt.arrays, rows, cols)
                dq = timed(launch, repeats)
            else:
                dq = timed(lambda: accel.dequantize(qt, backend=b, out=out), repeats)
            if b == "numpy" and baselines:
                qq = ref["numpy_quant"]
            else:
                qq = timed(lambda: accel.quantize(scheme, w, backend=b), repeats)
            rec["dequant_gbps"] = _gbps(nbytes, dq)
            rec["quant_gbps"] = _gbps(nbytes, qq)
            if b == "cpu":
                # evaluating one tensor (its bytes and error sums, what the app computes
                # after an edit): evaluate.measure against quantize + dequant_error
                from workbench.quant.evaluate import measure, quantize_measure
                rec["evaluate_one_pass"] = accel.quantize_error(scheme, w, backend=b) is not None
                ev1 = timed(lambda: measure(w, scheme.name), repeats)
                ev2 = timed(lambda: quantize_measure(w, scheme.name), repeats)
                rec["evaluate_gbps"] = _gbps(nbytes, ev1)
                rec["evaluate_two_pass_gbps"] = _gbps(nbytes, ev2)
                rec["evaluate_vs_two_pass"] = _ratio(rec["evaluate_gbps"],
                                                     rec["evaluate_two_pass_gbps"])
            rec["dequant_runs"], rec["quant_runs"] = dq["runs"], qq["runs"]
            for k, t in ref.items():
                rec[f"{k}_gbps"] = _gbps(nbytes, t)
            rec["dequant_vs_copy"] = _ratio(rec["dequant_gbps"], base["copy_gbps"])
            if "d2d_copy_gbps" in base and b == "cuda":
                rec["dequant_vs_d2d_copy"] = _ratio(rec["dequant_gbps"], base["d2d_copy_gbps"])
            rec["dequant_vs_numpy"] = _ratio(rec["dequant_gbps"], rec.get("numpy_dequant_gbps"))
            rec["quant_vs_numpy"] = _ratio(rec["quant_gbps"], rec.get("numpy_quant_gbps"))
            if "gguf_dequant_gbps" in rec:
                rec["dequant_vs_gguf"] = _ratio(rec["dequant_gbps"], rec["gguf_dequant_gbps"])
            if "gguf_quant_gbps" in rec:
                rec["quant_vs_gguf"] = _ratio(rec["quant_gbps"], rec["gguf_quant_gbps"])
            rec["targets"] = _targets(rec, spec)
            results.append(rec)
            say(row_summary(rec))       # the figures as each row is done: a cut-short run keeps them
    return {"size": [rows, cols], "float32_bytes": nbytes, "repeats": repeats,
            "backends": backends, "device": kb.device_name(), "auto_backend": kb.backend_name(),
            "baselines": base, "results": results}


def row_summary(rec: dict) -> str:
    """One line of a finished record's main figures (the progress line after each scheme)."""
    def f(v, spec=".2f"):
        return "-" if v is None else format(v, spec)
    copy = (f"{f(rec.get('dequant_vs_d2d_copy'))}x device copy"
            if rec.get("dequant_vs_d2d_copy") is not None
            else f"{f(rec.get('dequant_vs_copy'))}x copy")
    line = (f"{rec['scheme']} {rec['backend']}: dequantize {f(rec['dequant_gbps'])} GB/s "
            f"({copy}), quantize {f(rec['quant_gbps'], '.3f')} GB/s")
    if rec.get("evaluate_gbps") is not None:
        line += f", evaluate {f(rec['evaluate_gbps'])} GB/s"
    return line


def _targets(rec: dict, spec) -> dict:
    """Which design targets apply to this record and whether they are met."""
    out = {}
    b = rec["backend"]
    if b == "cpu":
        out["dequant_vs_copy"] = rec.get("dequant_vs_copy")
        if rec.get("dequant_vs_gguf") is not None:
            out["dequant_vs_gguf"] = rec["dequant_vs_gguf"]
        if spec is not None and spec.family == "ggml" and spec.quant and rec.get("quant_vs_gguf"):
            out["quant_vs_gguf"] = rec["quant_vs_gguf"]
        if spec is not None and spec.quant in ("int", "nf4", "fp8"):
            out["quant_vs_numpy"] = rec.get("quant_vs_numpy")
    elif b == "cuda" and rec.get("dequant_vs_d2d_copy") is not None:
        out["dequant_vs_d2d_copy"] = rec["dequant_vs_d2d_copy"]
    return {k: {"value": v, "target": TARGETS[k], "met": v is not None and v >= TARGETS[k]}
            for k, v in out.items()}


def format_table(report: dict) -> str:
    """A plain-text table of a run_bench report."""
    base = report["baselines"]
    lines = [f"matrix {report['size'][0]}x{report['size'][1]} float32 "
             f"({report['float32_bytes'] / 2**20:.0f} MiB), device: {report['device']}, "
             f"median of up to {report['repeats']} runs after warm-up",
             f"baseline np.copyto float32: {base['copy_gbps']:.2f} GB/s"]
    if base.get("d2d_copy_gbps"):
        lines.append(f"baseline device-to-device copy: {base['d2d_copy_gbps']:.2f} GB/s")
    hdr = (f"{'scheme':<16}{'backend':>8}{'deq GB/s':>10}{'x copy':>8}{'x numpy':>9}{'x gguf':>8}"
           f"{'quant GB/s':>12}{'x numpy':>9}{'x gguf':>8}{'eval GB/s':>11}{'x 2-pass':>9}"
           f"  notes")
    lines += ["", hdr, "-" * len(hdr)]

    def f(v, spec=".2f"):
        return "-" if v is None else format(v, spec)
    for r in report["results"]:
        if "skipped" in r:
            lines.append(f"{r['scheme']:<16} skipped: {r['skipped']}")
            continue
        notes = []
        if not r["dequant_kernel"]:
            notes.append("dequant=numpy")
        if not r["quant_kernel"]:
            notes.append("quant=numpy")
        if r.get("evaluate_one_pass"):
            notes.append("eval one-pass")
        missed = [k for k, t in r.get("targets", {}).items() if not t["met"]]
        if missed:
            notes.append("below target: " + ",".join(missed))
        lines.append(f"{r['scheme']:<16}{r['backend']:>8}{f(r['dequant_gbps']):>10}"
                     f"{f(r.get('dequant_vs_copy')):>8}{f(r.get('dequant_vs_numpy'), '.1f'):>9}"
                     f"{f(r.get('dequant_vs_gguf'), '.1f'):>8}{f(r['quant_gbps'], '.3f'):>12}"
                     f"{f(r.get('quant_vs_numpy'), '.1f'):>9}{f(r.get('quant_vs_gguf'), '.1f'):>8}"
                     f"{f(r.get('evaluate_gbps')):>11}{f(r.get('evaluate_vs_two_pass')):>9}"
                     f"  {'; '.join(notes)}")
    return "\n".join(lines)
