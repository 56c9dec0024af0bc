"""What `allocate` is about to cost, said before it starts (issue 33), and the options that
cut it.

The estimate is the sum of its stages, each the model's weights times what the stage repeats
(calibration samples, candidate schemes) times a rate measured on the shared 2-core machine
when quiet (SmolLM2-135M: 134.5 M weights; with llama.cpp's 12 candidates and 32 samples
24 s, with 43 candidates and 64 samples 86 s at load 4, 27 Nov 2026 evening; the methods from
MiniLM's README tour and SmolLM2 with --methods rtn,imatrix,gptq, 27 Nov 2026):

- building the network (import transformers, the model's modules): BUILD seconds, when the
  measure or a method runs the model;
- the measure's pass over the calibration samples: fisher (forward and backward) or the
  inputs of every weight (activation, --calib);
- the per-scheme errors: every weight quantized and measured (weight, activation) or a
  sample of rows weighed by the fisher diagonal (fisher); output runs the network again for
  every tensor and scheme;
- the methods (imatrix, gptq): a statistics pass over every sample, then both weighed on the
  pairs near the allocation (a few schemes a tensor, whatever the candidates);
- the allocated plan's evaluation (every weight quantized once more);
- the kept fits (GPTQ's; imatrix's on the MLX schemes: workbench.running.method_fits): a
  statistics pass over the whole calibration text (whatever --samples), then each kept
  method fitted once on the plan's tensors, so that `check` and `export` read them.

Cached errors (workbench.quant.evaluate's cache) make a second run faster; a busy machine slower.
It is an order of magnitude, not a promise: the progress lines' ETA follows the real rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.planning.measures import get_measure

#: seconds to import transformers and build the network (a model-level measure or method)
BUILD = 6.0
#: seconds per weight and calibration sample: fisher's forward and backward pass (SmolLM2,
#: 27 Nov 2026 evening, after the small-model pass kept its weights: 10.5 s for 32 samples,
#: 19.5 s for 64; it was 8.7e-9 before)
PASS_FISHER = 2.4e-9
#: share of the fisher pass's time during which its errors are measured alongside (a worker
#: thread takes each block's tensors as the pass finishes them): that much of the errors'
#: time is hidden; at least a quarter of it is always left after the pass
ERRORS_OVERLAP = 0.6
#: seconds per weight and calibration sample: a forward pass collecting the weights' inputs
PASS_FORWARD = 3.0e-9
#: seconds per weight and candidate scheme: fisher's errors (rows sampled)
ERRORS_SAMPLED = 1.0e-8
#: seconds per weight and candidate scheme: every weight quantized and measured
ERRORS_FULL = 3.3e-8
#: seconds per weight: the allocated plan's evaluation (one scheme a tensor; SmolLM2 1.1 s
#: with llama.cpp's candidates, 5.3 s with every scheme's)
EVALUATE = 1.5e-8
#: seconds per Linear weight and calibration sample: the methods' statistics pass (inputs and
#: Hessians of every Linear weight, on both halves of the samples). Quiet, 27 Nov 2026, 64
#: samples: MiniLM (10.6 M Linear weights) 14.6 s, SmolLM2 (106 M) 80 s
METHODS_PASS = 1.6e-8
#: seconds per Linear weight: imatrix and GPTQ on the pairs near the allocation (a few schemes
#: a tensor whatever the candidates): MiniLM 12 s, SmolLM2 35 s
METHODS = 6.0e-7
#: the kept fits (allocate's last stage; 2 Dec 2026, 2 cores, fresh caches): the pass over the
#: whole calibration text (298 samples) and the fits. Gemma 3 270M (100 M Linear weights),
#: imatrix under the MLX schemes, 126 tensors, nothing else running: the inputs' E[x²] 16 s,
#: the fits in the numba kernel 18 s. MiniLM (10.6 M), GPTQ on 36 tensors, beside another
#: job of 2 threads (so about twice the quiet time): the pass with Hessians 23 s, the fits 11 s.
#: Seconds per Linear weight and sample of that pass: E[x²] only, and with Hessians (GPTQ)
KEPT_PASS = 5.4e-10
KEPT_PASS_HESSIAN = 4.0e-9
#: seconds per Linear weight of each kept method's fits (an upper bound: only the plan's
#: tensors that chose the method are fitted)
FIT_KEPT = {"imatrix": 1.8e-7, "gptq": 5.0e-7}
#: candidate schemes the `faster` line offers (those of them the target allows)
FEW_SCHEMES = ("q3_k", "q4_0", "q4_k", "q5_0", "q5_k", "q6_k", "q8_0")
#: calibration samples the `faster` line offers
FEW_SAMPLES = 16


@dataclass
class Cost:
    stages: dict = field(default_factory=dict)     # {stage text: seconds}

    @property
    def seconds(self) -> float:
        return sum(self.stages.values())


def estimate(params: int, linear_params: int, tensors: int, schemes: int, measure: str,
             samples: int, methods, kept=(), whole: int = 0) -> Cost:
    """The stages of an allocation of a model of `params` weights (`linear_params` of them in
    Linear weights, `tensors` tensors measured) over `schemes` candidates, measured by
    `measure` on `samples` calibration samples, weighing `methods`, `kept` of them fitted
    again at the end and kept, after a pass over the `whole` calibration text's samples."""
    c = Cost()
    costly = [m for m in methods if m != "rtn"]
    if get_measure(measure).reads_calibration or costly:
        c.stages["building the network"] = BUILD
    c.stages.update(get_measure(measure).stages(params, tensors, schemes, samples))
    if costly:
        c.stages[f"methods {','.join(costly)}"] = \
            METHODS_PASS * linear_params * samples + METHODS * linear_params
    c.stages["the plan's evaluation"] = EVALUATE * params
    kept = [m for m in kept if m in costly]
    if kept:
        rate = KEPT_PASS_HESSIAN if "gptq" in kept else KEPT_PASS
        c.stages[f"kept fits {','.join(kept)}"] = \
            linear_params * (rate * whole + sum(FIT_KEPT[m] for m in kept))
    return c


def clock(s: float) -> str:
    """'40 s', '2 min 30 s', '1 h 05 min'."""
    if s < 0.5:
        return "<1 s"
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s" if s < 600 else f"{round(s / 60)} min"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def count_samples(calib=None) -> int | None:
    """The calibration samples in `calib` (text or JSONL; the default text when None), None
    when they cannot be counted cheaply (token-id files, an unreadable file)."""
    from pathlib import Path

    from workbench.running.calibration import DEFAULT_CALIB, read_texts
    path = Path(calib) if calib else DEFAULT_CALIB
    if path.suffix.lower() in (".npy", ".safetensors"):
        return None
    try:
        return len(read_texts(path))
    except Exception:   # noqa: BLE001 - the command itself says what is wrong with the file
        return None


def allocation_cost(model, schemes: list[str], measure: str, samples: int | None,
                    methods_text: str, calib=None, imatrix=None,
                    target: str = "any") -> tuple[Cost, list]:
    """(Cost, [(options, Cost)]) of an allocation, and of the faster ones the options make:
    `measure` and `samples` as resolved (workbench.api.resolve_measure), `methods_text` the
    --methods value."""
    from workbench.planning.allocate_methods import _kind, _runnable, default_methods, parse_methods
    from workbench.planning.budget import is_linear
    infos = [model.info(n) for n in model.tensors]
    measured = [i for i in infos if i.ndim >= 2 and i.is_float]
    params = sum(i.numel for i in measured)
    linear = sum(i.numel for i in measured if is_linear(i))
    methods = parse_methods(methods_text)
    if methods is None:
        methods = default_methods(measure, not imatrix and _runnable(model), _kind(model),
                                  target)
    total = count_samples(calib) or 64
    n = min(samples, total) if samples else total
    if imatrix and get_measure(measure).takes_imatrix:
        n = 0                                   # the imatrix replaces the pass

    from workbench.running.method_fits import keeps_fit
    kept = [m for m in methods if any(keeps_fit(m, s) for s in schemes)]

    def cost(schemes_n, samples_n, meths):
        return estimate(params, linear, len(measured), schemes_n, measure, samples_n, meths,
                        kept, 0 if imatrix else total)      # an imatrix file: no pass
    now = cost(len(schemes), n, methods)
    few = [s for s in FEW_SCHEMES if s in schemes]
    cut = {}           # option -> (schemes, samples, methods) it changes
    if any(m != "rtn" for m in methods):
        cut["methods"] = (["--methods", "rtn"], {"meths": ["rtn"]})
    if get_measure(measure).reads_calibration and n > FEW_SAMPLES:
        cut["samples"] = (["--samples", str(FEW_SAMPLES)], {"samples_n": FEW_SAMPLES})
    if few and len(few) < len(schemes):
        cut["schemes"] = (["--schemes", ",".join(few)], {"schemes_n": len(few)})
    base = {"schemes_n": len(schemes), "samples_n": n, "meths": methods}
    options, useful = [], {}
    for key, (argv, change) in cut.items():
        c = cost(**{**base, **change})
        if c.seconds < 0.8 * now.seconds:       # worth saying: a fifth or more saved
            options.append((argv, c))
            useful[key] = (argv, change)
    if len(useful) > 1:
        argv = [a for a_, _ in useful.values() for a in a_]
        change = {k: v for _, ch in useful.values() for k, v in ch.items()}
        options.append((argv, cost(**{**base, **change})))
    return now, options


#: the rates above were measured on this many otherwise idle cores
QUIET_CORES = 2


def busy_factor(load: tuple[float, int] | None) -> float:
    """How much longer than on QUIET_CORES quiet cores the work takes on a machine whose
    1-minute load average (the other work, as this job starts) and core count are `load`: its
    QUIET_CORES threads share the cores with that load, (load + QUIET_CORES) / cores, at
    least 1 (MiniLM's allocate, expected 35 s quiet, took 197 s at load 9 on 2 cores: 5.6x;
    this gives 5.5x)."""
    if not load:
        return 1.0
    avg, cores = load
    return max(1.0, (max(float(avg), 0.0) + QUIET_CORES) / max(int(cores or 1), 1))


def busy_line(now: Cost, load: tuple[float, int] | None) -> str | None:
    """On a busy machine (:func:`busy_factor` 1.5 or more), the line said as the work starts,
    in the form of a progress line (its ETA the expected time corrected for the load), else
    None. A progress line, so the README tour (which leaves those out) reads the same at any
    load."""
    f = busy_factor(load)
    if f < 1.5:
        return None
    eta = int(round(f * now.seconds))
    return (f"  0.0% this machine is busy now (load {load[0]:.1f} on {load[1]} cores): about "
            f"{clock(eta)}, not {clock(now.seconds)} (0m00s elapsed, ETA {eta // 60}m{eta % 60:02d}s)")


def machine_load() -> tuple[float, int] | None:
    """(1-minute load average, cores) of this machine, None where it cannot say."""
    import os
    try:
        return os.getloadavg()[0], os.cpu_count() or 1
    except (OSError, AttributeError):       # pragma: no cover - not on Linux / macOS
        return None


def lines(now: Cost, options) -> list[str]:
    """The two lines allocate prints: the expected cost, and the faster options (when it is
    worth a minute)."""
    parts = ", ".join(f"{k} {clock(v)}" for k, v in now.stages.items() if v >= 0.5)
    out = [f"expected: about {clock(now.seconds)} on {QUIET_CORES} quiet cores"
           + (f" ({parts})" if parts else "") + "; a busy machine takes longer"]
    if options and now.seconds >= 60:
        out.append("faster: " + "; ".join(f"{' '.join(o)} (about {clock(c.seconds)})"
                                          for o, c in options))
    return out
