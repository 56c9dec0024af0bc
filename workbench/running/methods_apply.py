"""A plan's methods applied to a whole model: calibration statistics, the AWQ fold, and a model
view the evaluator, the exporters and ``check`` read through.

    mm = yield from prepare(model, plan, calib=None, imatrix=None, runtime="any")
    # mm is a MethodModel: the same tensors; read_matrix() gives the folded float weights,
    # quantize_tensor(name, w, scheme) the method's QuantizedTensor (the scheme's own bytes)

Statistics: with ``calib`` (text / JSONL / token ids) the model runs through transformers
(``workbench.running.runner``) with forward pre-hooks on every Linear, over the real (unpadded) tokens
only, accumulating :class:`~workbench.quant.methods.stats.LayerStats` (E[x²], H = 2XᵀX/N, E|x|, a
sample of ≤ 4096 rows). With ``imatrix`` (a llama.cpp imatrix GGUF / legacy .dat) only E[x²]
is known: enough for ``imatrix``; ``gptq`` / ``awq`` then need ``--calib``. A method that needs
statistics and gets neither uses the shipped ``resources/calibration.txt`` when the model is
runnable (config.json beside it) and says so in ``MethodModel.notes``; otherwise it is an error.

The AWQ fold (exact in float arithmetic): the tensors reading one input (``awq.fold_target``:
q/k/v after a LayerNorm/RMSNorm, gate/up after the post-attention norm, BERT's attention.output
after value, intermediate after attention.output.LayerNorm, Llama's down after up, o after v)
share one scale s, searched on their summed output error (each under its own scheme). Folded:
each consumer's columns W·diag(s); the producer divides by s — a norm's weight (and bias)
γ/s, β/s, or a linear producer's rows (and bias) W_p/s. A group is folded only when every
consumer in it uses ``awq``, the producer exists in the file and its shape fits; otherwise its
AWQ tensors get the clip search only (s = 1). The exported files hold the folded float model's
tensors, so every format (GGUF, compressed-tensors, quantized safetensors) carries the fold.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP
from workbench.core.progress import Progress
from workbench.quant.methods.stats import Accumulator, LayerStats


# -- statistics -----------------------------------------------------------------------------------

def collect_stats(model, calib=None, names=None, samples: int | None = None,
                  max_len: int = 128, want_h: bool = True, keep_rows: int = 4096,
                  subset: slice | None = None):
    """Job: {workbench name: LayerStats} of every Linear input (or only `names`), experts'
    from the tokens routed to each (workbench.running.runner_jobs.input_pass, block by block); `subset`:
    of these calibration samples only (a fold)."""
    from workbench.running.runner_jobs import input_pass
    acc: dict[str, Accumulator] = {}
    out: dict = {}

    def observe(name, x):
        a = acc.get(name)
        if a is None:
            a = acc[name] = Accumulator(x.shape[-1], want_h=want_h, keep_rows=keep_rows)
        a.add(x.cpu().numpy())

    def done(names):
        # a block's statistics are final: their Hessians (in x in float64, 1.6 GB for an 8 B
        # model's down projection) go to memory-mapped files, so a model's worth of them is
        # never in RAM
        for n in names:
            a = acc.pop(n, None)
            if a is not None:
                out[n] = a.finish().spilled()

    yield from input_pass(model, calib, samples, max_len, names=names, observe=observe,
                          done=done, subset=subset)
    done(list(acc))
    yield Progress(100, 100, "statistics collected")
    return out


def stats_from_imatrix(model, path):
    """Job: {workbench name: LayerStats(d only)} from a llama.cpp imatrix file."""
    from workbench.running.imatrix import second_moments
    d = yield from second_moments(model, imatrix=path)
    return {n: LayerStats.from_imatrix(v) for n, v in d.items()}


def round_to_storage(w: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as a tensor stored in `dtype` holds them (F16 / BF16 round to nearest
    even; others unchanged)."""
    w = np.ascontiguousarray(w, np.float32)
    if dtype == "F16":
        return w.astype(np.float16).astype(np.float32)
    if dtype == "BF16":
        return (_bf16_bits(w).astype(np.uint32) << 16).view(np.float32)
    return w


def _bf16_bits(w: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(w, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


# -- the fold -------------------------------------------------------------------------------------

def _strip(name: str) -> str:
    return name[:-len(".weight")] if name.endswith(".weight") else name


def search_group_scale(weights: list, schemes: list, X, mean_abs):
    """(s, alpha): AWQ's grid search of s = s_x^α over the summed output error of every consumer
    (each quantized with its own scheme)."""
    from workbench.quant.methods.awq import ALPHAS, MAX_ROWS, _out_err, _rtn
    X = np.asarray(X, np.float32)[:MAX_ROWS]
    sx = np.maximum(np.asarray(mean_abs, np.float64), 1e-8)
    best = (np.inf, None, 0.0)
    for a in ALPHAS:
        s = sx ** a
        s = (s / np.sqrt(s.max() * s.min())).astype(np.float32)
        err = 0.0
        for W, sc in zip(weights, schemes):
            qt = _rtn(sc, W * s[None, :])
            err += _out_err(X, W, sc.dequantize(qt).reshape(W.shape) / s[None, :])
        if err < best[0]:
            best = (err, s, float(a))
    return best[1], best[2]


def awq_fold(model, groups: dict, stats: dict, scheme_of: dict):
    """Search and fold. `groups`: {producer prefix: [consumer weight names]}. Returns
    (col_scale {consumer: s}, row_scale {linear producer weight: s}, vec_scale {norm/bias
    tensor: s}, alphas {producer: α})."""
    from workbench.schemes import get_scheme
    col, row, vec, alphas = {}, {}, {}, {}
    for prod, cons in groups.items():
        ws = [model.read_matrix(n) for n in cons]
        st = stats[cons[0]]
        s, a = search_group_scale(ws, [get_scheme(scheme_of[n]) for n in cons], st.X, st.mean_abs)
        if s is None or np.all(s == 1):
            continue
        pw = prod + ".weight"
        info = model.info(pw)
        if info.ndim < 2 and info.dtype in ("F16", "BF16"):
            # a half-precision norm stores γ/s rounded: take s = γ / stored(γ/s), so the fold
            # stays exact for the weight (a bias, if any, rounds on its own)
            g = model.read_matrix(pw).reshape(-1)
            stored = round_to_storage(g / s, info.dtype)
            s = np.where(stored != 0, g / np.where(stored != 0, stored, 1), s).astype(np.float32)
        for n in cons:
            col[n] = s
        alphas[prod] = a
        if model.info(pw).ndim == 2:
            row[pw] = s
        else:
            vec[pw] = s
        if prod + ".bias" in model.tensors:
            vec[prod + ".bias"] = s
    return col, row, vec, alphas


def fold_groups(model, plan, candidates) -> tuple[dict, list]:
    """({producer: consumers}, notes): the AWQ groups that can be folded in this model."""
    from workbench.quant.methods.awq import fold_target
    by_target: dict[str, list] = {}
    for n in model.tensors:
        t = fold_target(n)
        if t is not None and model.info(n).ndim == 2:
            by_target.setdefault(t, []).append(n)
    groups, notes = {}, []
    for t, cons in by_target.items():
        awq = [n for n in cons if n in candidates]
        if not awq:
            continue
        if len(awq) != len(cons):
            notes.append(f"{t}: not folded (its consumers {', '.join(sorted(set(cons) - set(awq)))}"
                         " do not use awq); their awq tensors get the clip search only")
            continue
        pw = t + ".weight"
        if pw not in model.tensors:
            notes.append(f"{t}: not folded (no {pw} in the file)")
            continue
        cols = model.info(cons[0]).matrix_shape[1]
        pshape = model.info(pw).shape
        if (len(pshape) == 1 and pshape[0] != cols) or (len(pshape) == 2 and pshape[0] != cols):
            notes.append(f"{t}: not folded ({pw} has shape {tuple(pshape)}, the input has {cols})")
            continue
        groups[t] = sorted(cons)
    return groups, notes


# -- the model view -------------------------------------------------------------------------------

class MethodModel:
    """A model seen through a plan's methods: read_matrix() gives the folded float tensors,
    quantize_tensor() the method's QuantizedTensor. Everything else is the base model's."""

    def __init__(self, base, plan, stats: dict, col=None, row=None, vec=None, notes=None,
                 alphas=None, use_cache: bool = True, source=None):
        self.base = base
        # the fit cache (workbench.running.method_fits): read and written unless use_cache is
        # False; `source`: what the statistics came from (model, calibration), for its keys
        self.use_cache = use_cache
        self.source = source
        self.plan = plan
        self.stats = stats
        self.col = col or {}
        self.row = row or {}
        self.vec = vec or {}
        self.alphas = alphas or {}
        self.notes = list(notes or [])
        self._folded: dict[str, np.ndarray] = {}

    def __getattr__(self, k):
        return getattr(self.base, k)

    def __contains__(self, name):
        return name in self.base.tensors

    def __len__(self):
        return len(self.base.tensors)

    # -- float tensors -----------------------------------------------------------------------
    @property
    def folded_names(self) -> list[str]:
        return sorted({*self.col, *self.row, *self.vec})

    def _fold(self, name):
        got = self._folded.get(name)
        if got is None:
            w = np.array(self.base.read_matrix(name), np.float32)
            if name in self.col:
                w = w * self.col[name][None, :]
            if name in self.row:
                w = w / self.row[name][:, None]
            if name in self.vec:
                w = (w.reshape(-1) / self.vec[name]).reshape(w.shape)
            info = self.base.info(name)
            if info.ndim < 2:   # kept as stored: in its own dtype
                w = round_to_storage(w, info.dtype)
            got = self._folded[name] = np.ascontiguousarray(w, np.float32)
        return got

    def read_matrix(self, name):
        if name in self.col or name in self.row or name in self.vec:
            return self._fold(name).copy()
        return self.base.read_matrix(name)

    def read(self, name):
        return self.read_matrix(name).reshape(self.base.info(name).shape)

    def iter_rows(self, name, max_elements: int = 1 << 22):
        if name not in self.folded_names:
            yield from self.base.iter_rows(name, max_elements)
            return
        w = self._fold(name)
        step = max(1, max_elements // max(w.shape[1], 1))
        for r0 in range(0, w.shape[0], step):
            yield r0, w[r0:r0 + step].copy()

    def raw(self, name):
        if name not in self.folded_names:
            return self.base.raw(name)
        w = self._fold(name)
        dt = self.base.info(name).dtype
        if dt == "F16":
            return w.astype(np.float16)
        if dt == "BF16":
            return _bf16_bits(w)
        return w

    # -- methods -----------------------------------------------------------------------------
    def method_of(self, name: str) -> str:
        return self.plan.method_for(name)

    def layer_stats(self, name):
        st = self.stats.get(name)
        s = self.col.get(name)
        if st is None or s is None:
            return st
        s64 = s.astype(np.float64)
        return LayerStats(d=None if st.d is None else st.d / s64 ** 2,
                          H=None if st.H is None else st.H / np.outer(s64, s64),
                          mean_abs=None if st.mean_abs is None else st.mean_abs / s64,
                          X=None if st.X is None else st.X / s[None, :], n=st.n)

    def quantize_tensor(self, name: str, w, scheme_name: str):
        """The QuantizedTensor of `w` (this tensor's folded weights, possibly row-permuted by an
        exporter) under `scheme_name` with the tensor's method."""
        method = self.method_of(name)
        if method == "rtn":
            from workbench.quant.evaluate import quantize
            return quantize(w, scheme_name, tensor=name)
        opts = {"fold": False} if method == "awq" else {}
        from workbench.quant.evaluate import check_representable
        from workbench.running.method_fits import NOT_FITTED, remember_unfitted
        if isinstance(self.stats, LazyStats) and not self.stats.ready and self.use_cache:
            from workbench.running.method_fits import kept_fit
            qt = kept_fit(method, w, scheme_name, tensor=name, source=self.source, **opts)
            if qt is NOT_FITTED:
                from workbench.quant.evaluate import quantize
                return quantize(w, scheme_name, tensor=name)
            if qt is not None:      # kept: no statistics needed
                check_representable(qt, w, name)
                return qt
        st = self.layer_stats(name)     # (a lazy MethodModel's pass runs here, on a miss)
        if st is None:   # not a Linear input (embeddings) or absent from the imatrix: rtn
            from workbench.quant.evaluate import quantize
            if self.use_cache and self.source is not None:
                remember_unfitted(method, w, scheme_name, tensor=name, source=self.source,
                                  **opts)
            return quantize(w, scheme_name, tensor=name)
        from workbench.running.method_fits import fitted
        qt = fitted(method, w, scheme_name, st, tensor=name, source=self.source,
                    use_cache=self.use_cache, **opts)
        check_representable(qt, w, name)
        return qt

    def unfold(self, name: str, w: np.ndarray) -> np.ndarray:
        """A weight of the folded model mapped back to the original model's (eff = folded with
        the scales undone), so errors compare with the original weights."""
        w = np.asarray(w, np.float32)
        if name in self.col:
            w = w / self.col[name][None, :]
        if name in self.row:
            w = w * self.row[name][:, None]
        return w


#: the GGML types llama.cpp quantizes only with an importance matrix ("the result will be
#: garbage, so bailing out": llama-quant.cpp's tensor_requires_imatrix; IQ3_S and the K-quants
#: go without)
NEEDS_IMPORTANCE = ("iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs")


def importance_for_lattice(model, plan, runtime: str = "any", imatrix=None, say=None,
                           switch: bool = True):
    """`plan` with --method imatrix on the tensors it puts in a NEEDS_IMPORTANCE type with
    plain rounding, when an importance can be had (an `imatrix` file, or calibration: the
    model runs) and `switch` (False: the user asked for rtn); said in one `say` line.
    Otherwise the plan as it is and a warning line naming the types, the count and the way
    out (--imatrix FILE)."""
    from workbench.quant.methods.ggml_weighted import SUPPORTED
    from workbench.quant.runtimes import plan_decisions
    found: dict = {}
    for n, d in plan_decisions(model, plan, runtime).items():
        if d.applied in NEEDS_IMPORTANCE and plan.method_for(n) == "rtn":
            found.setdefault(d.applied, []).append(n)
    if not found:
        return plan
    say = say or (lambda line: None)
    what = ", ".join(f"{s} on {len(v)} tensor{'s' * (len(v) > 1)}" for s, v in found.items())
    weighed = [n for s, v in found.items() if s in SUPPORTED for n in v]
    from workbench.formats.llama_names import has_config
    runs = has_config(model)
    if weighed and switch and (imatrix or runs):
        src = f"the importance matrix {imatrix}" if imatrix else \
            "calibration (--calib; default the shipped text)"
        say(f"note: {what}: llama.cpp quantizes these types only with an importance matrix, "
            f"so they use --method imatrix, from {src}")
        return plan.with_method("imatrix", weighed)
    how = ("as --method rtn asks" if weighed and not switch else
           "pass --imatrix FILE (llama-imatrix's), or export a model folder that runs "
           "(config.json beside it) to calibrate one" if weighed else
           "the workbench has no importance-weighted encoder for them yet")
    say(f"warning: {what} without an importance matrix: llama.cpp refuses these types without "
        f"one (\"the result will be garbage\"); {how}")
    return plan


def needs_stats(plan, names) -> set[str]:
    return {n for n in names if plan.method_for(n) != "rtn"}


def drop_transposed(model, stats: dict) -> list[str]:
    """GPT-2's Conv1D stores its weight as (in, out): the methods work on (out, in) matrices
    whose columns are the layer's inputs, so those tensors' statistics are dropped (they are
    rounded to nearest). Returns their names."""
    conv = sorted(n for n, st in stats.items() if getattr(st, "d", None) is not None
                  and model.info(n).ndim == 2 and len(st.d) != model.info(n).shape[-1]
                  and len(st.d) == model.info(n).shape[0])
    for n in conv:
        del stats[n]
    return conv


class LazyStats(Mapping):
    """{name: LayerStats} of a MethodModel whose fits were all kept: the calibration pass runs
    on the first look-up (a fit that went missing since, or a tensor an exporter hands over
    in another row order), never before."""

    def __init__(self, model, calib, names, samples):
        self._args = (model, calib, set(names), samples)
        self._stats: dict | None = None

    @property
    def ready(self) -> bool:
        return self._stats is not None

    def _get(self) -> dict:
        if self._stats is None:
            from workbench.core.progress import run
            model, calib, names, samples = self._args
            got = run(collect_stats(model, calib, names=names, samples=samples, want_h=True,
                                    keep_rows=0))
            drop_transposed(model, got)
            self._stats = got
        return self._stats

    def __getitem__(self, name):
        return self._get()[name]

    def __iter__(self):
        return iter(self._get())

    def __len__(self):
        return len(self._get())


def prepare(model, plan, calib=None, imatrix=None, runtime: str = "any", samples=None,
            stats: dict | None = None, use_cache: bool = True):
    """Job: the MethodModel of `model` under `plan` (the model itself when every tensor is rtn).
    `stats`: {name: LayerStats} already collected (``collect_stats``) — used as they are, no
    calibration run; a tensor missing from them uses rtn (as one that is not a Linear input).
    `use_cache` False: the fit cache (workbench.running.method_fits) is neither read nor
    written."""
    from workbench.quant.runtimes import plan_decisions
    decisions = plan_decisions(model, plan, runtime)
    todo = {n for n, d in decisions.items() if d.applied != KEEP and model.info(n).ndim >= 2
            and plan.method_for(n) != "rtn"}
    if not todo:
        return model
    methods = {plan.method_for(n) for n in todo}
    notes = []
    given = stats is not None
    stats = {n: st for n, st in (stats or {}).items() if n in todo}
    heavy = sorted(methods - {"imatrix"})
    if imatrix and not given and heavy and not calib:
        raise WorkbenchError(f"method {heavy[0]} needs calibration inputs (calib=FILE); an "
                             "imatrix holds only E[x^2], enough for method='imatrix'",
                             path=str(imatrix), params=("calib", "method"))
    calibrates = not given and bool(calib or heavy or not imatrix)
    if calibrates and calib is None:
        from workbench.running.calibration import DEFAULT_CALIB
        from workbench.formats.llama_names import model_folder
        if not (model_folder(model) / "config.json").is_file():
            raise WorkbenchError(f"method {sorted(methods)[0]} needs calibration data: give "
                                 "calib=FILE (text/JSONL/token ids; the model must be "
                                 "runnable) or imatrix=FILE (imatrix only)",
                                 path=str(model.path), params=("calib", "imatrix"))
        notes.append(f"calibration: the shipped {Path(DEFAULT_CALIB).name} (no --calib given)")
    source = None
    from workbench.running.method_fits import calib_source, keeps_fit, kept_fit
    kept = {n for n in todo if keeps_fit(plan.method_for(n), decisions[n].applied)}
    if use_cache and not given and kept:
        from workbench.core.cache import file_key, model_key
        source = [model_key(model), calib_source(calib, samples, 128),
                  file_key(imatrix) if imatrix else None]
    if source is not None and not imatrix and kept == todo:
        # every fit kept (probed by key, which needs no statistics): no calibration pass
        yield Progress(0, 1, "looking for kept fits")
        if all(kept_fit(plan.method_for(n), model.read_matrix(n), decisions[n].applied,
                        tensor=n, source=source) is not None for n in sorted(todo)):
            notes.append(f"{', '.join(sorted(methods))}: {len(todo)} fit(s) read from the "
                         "cache (fitted before for this model, plan and calibration text; no "
                         "calibration pass)")
            yield Progress(1, 1, "methods prepared")
            lazy = LazyStats(model, calib, todo, samples)
            return MethodModel(model, plan, lazy, notes=notes, use_cache=use_cache,
                               source=source)
    if imatrix and not given:
        stats = yield from stats_from_imatrix(model, imatrix)
    if calibrates:
        got = yield from collect_stats(model, calib, names=todo, samples=samples,
                                       want_h="gptq" in methods,
                                       keep_rows=4096 if "awq" in methods else 0)
        for n, st in got.items():
            if n in stats and st.d is not None:
                st.d = stats[n].d if "imatrix" == plan.method_for(n) else st.d
            stats[n] = st
    conv = drop_transposed(model, stats)
    if conv:
        notes.append(f"{len(conv)} tensor(s) store their weight transposed (GPT-2's Conv1D, "
                     f"(in, out)) and use rtn: {', '.join(conv[:3])}"
                     f"{' ...' if len(conv) > 3 else ''}")
    plain = sorted(n for n in todo if n not in stats and n not in conv)
    if plain:
        notes.append(f"{len(plain)} tensor(s) are not the input of a Linear (or lack imatrix "
                     f"data) and use rtn: {', '.join(plain[:3])}{' ...' if len(plain) > 3 else ''}")
    col = row = vec = alphas = None
    awq_names = {n for n in todo if plan.method_for(n) == "awq"}
    if awq_names:
        yield Progress(0, 1, "AWQ: searching the scales to fold")
        groups, fold_notes = fold_groups(model, plan, awq_names)
        notes += fold_notes
        groups = {t: c for t, c in groups.items() if all(n in stats for n in c)}
        scheme_of = {n: decisions[n].applied for g in groups.values() for n in g}
        col, row, vec, alphas = awq_fold(model, groups, stats, scheme_of)
    yield Progress(1, 1, "methods prepared")
    return MethodModel(model, plan, stats, col, row, vec, notes, alphas, use_cache=use_cache,
                       source=source)


def kept_tensors(model, plan, runtime: str = "any") -> list[tuple[str, str]]:
    """[(tensor, applied scheme)] of `plan` whose fits are kept (method_fits.keeps_fit)."""
    from workbench.quant.runtimes import plan_decisions
    from workbench.running.method_fits import keeps_fit
    return [(n, d.applied) for n, d in sorted(plan_decisions(model, plan, runtime).items())
            if d.applied != KEEP and model.info(n).ndim >= 2
            and keeps_fit(plan.method_for(n), d.applied)]


def fit_kept(mm, plan, runtime: str = "any"):
    """Job: fit every tensor of `mm` (a MethodModel) whose method's fits are kept
    (method_fits.CACHED_METHODS), so a later `check` / `export` of `plan` reads them. Returns
    the number of tensors."""
    if not hasattr(mm, "quantize_tensor"):
        return 0
    todo = kept_tensors(mm, plan, runtime)
    for i, (n, applied) in enumerate(todo):
        yield Progress(i, len(todo), f"fitting {plan.method_for(n)} {i + 1}/{len(todo)} {n}")
        mm.quantize_tensor(n, mm.read_matrix(n), applied)
    yield Progress(1, 1, "fits kept")
    return len(todo)


class RunnerWeights(Mapping):
    """{name: float array} to load into a Runner for the plan-quantized (and folded) model:
    each quantized tensor's dequantized stored weights, each folded float tensor as folded.
    Lazy: a tensor is quantized when the layer-by-layer runner materializes its block, so the
    whole model is never held at once."""

    def __init__(self, mm, plan, runtime: str = "any"):
        from workbench.quant.runtimes import plan_decisions
        self.mm = mm
        fold = set(getattr(mm, "folded_names", []))
        self.decisions = {}
        for n, d in plan_decisions(mm, plan, runtime).items():
            info = mm.info(n)
            if (d.applied != KEEP and info.is_float) or n in fold:
                self.decisions[n] = d

    def __getitem__(self, n):
        from workbench.schemes import get_scheme
        d = self.decisions[n]
        mm = self.mm
        info = mm.info(n)
        if d.applied == KEEP or not info.is_float:
            return mm.read(n)
        w = mm.read_matrix(n)
        if hasattr(mm, "quantize_tensor"):
            qt = mm.quantize_tensor(n, w, d.applied)
        else:
            from workbench.quant.evaluate import quantize
            qt = quantize(w, d.applied, tensor=n)
        return np.asarray(get_scheme(d.applied).dequantize(qt), np.float32).reshape(info.shape)

    def __iter__(self):
        return iter(self.decisions)

    def __len__(self):
        return len(self.decisions)

    def __contains__(self, n):
        return n in self.decisions


def runner_weights(mm, plan, runtime: str = "any") -> RunnerWeights:
    """{name: float array} (lazy, see RunnerWeights) for ``runner.check(weights=...)``."""
    return RunnerWeights(mm, plan, runtime)


def activation_ranges(model, names=None, calib=None, method: str = "minmax", bits: int = 8,
                      kind: str = "int", samples=None):
    """Job: {linear weight name: activation entry} — each Linear input's static clipping range
    (workbench.quant.methods.activations: minmax over every token seen; percentile / mse / kl from a
    2048-bin histogram of |x| over a sample of ≤ 4096 token rows, range up to the true max)."""
    from workbench.quant.methods.activations import METHODS, activation_entry, calibrate_range
    if method not in METHODS:
        raise WorkbenchError(f"unknown activation calibration '{method}' (choose from "
                             f"{', '.join(METHODS)})")
    if kind not in ("int", "float") or not (2 <= int(bits) <= 16):
        raise WorkbenchError(f"activation quantization {kind}{bits} is not supported "
                             "(int 2..16 bits, or float 8)")
    stats = yield from collect_stats(model, calib, names, samples, want_h=False)
    out = {}
    for n, st in sorted(stats.items()):
        top = float(st.absmax or 0.0)
        if method == "minmax" or top <= 0 or st.X is None:
            amax = top
        else:
            hist, edges = np.histogram(np.abs(st.X).ravel(), bins=2048, range=(0.0, top))
            amax = calibrate_range(hist, edges, method, int(bits), kind)
        out[n] = activation_entry(amax, int(bits), kind, method)
    return out
