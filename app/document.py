"""The open document: model, plan, tier setup, and what has been computed about them.

A QObject with signals, so views stay in sync; it holds `workbench` objects and results
delivered by :mod:`app.analyzer` — it never computes over tensor data itself. Commands
(:mod:`app.commands`) change it only through :meth:`Document.set_state`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from workbench.core.errors import WorkbenchError
from workbench.api.tensors import totals_of
from workbench.api.tensors import sqnr_db
from workbench.api.plans import KEEP, Plan, default_plan
from workbench.api.plans import get_scheme

from .tiers import DEFAULT_TIERS


@dataclass
class Totals:
    params: int
    bytes_before: int
    bytes_after: int
    bits_per_weight: float
    compression: float
    sqnr_db: float | None      # None until every tensor is evaluated
    pending: int               # tensors whose error is not known yet
    throughput_gbs: float | None
    measured: int
    # while the only pending tensors are large ones with a sampled-rows estimate
    # (workbench.planning.estimate): the model SQNR with their estimates; else None
    sqnr_estimate_db: float | None = None
    estimated: int = 0         # pending tensors whose error is estimated


class Document(QObject):
    modelChanged = Signal()
    stateChanged = Signal(list)        # tensor names whose assigned scheme changed
    tiersChanged = Signal()
    resultsChanged = Signal(list)      # names whose TensorResult (current scheme) arrived
    statsChanged = Signal(list)
    detailChanged = Signal(str)
    throughputChanged = Signal(list)
    currentChanged = Signal(str)
    #: right after currentChanged has reached every receiver (the views have all taken the
    #: new current tensor): for work that should see them all, such as one repaint
    currentSettled = Signal(str)
    resultAdded = Signal(str, str)     # (name, scheme) of any new result (comparison)
    backendChanged = Signal(str)
    estimatesChanged = Signal(list)    # names with a new sampled-rows error estimate

    def __init__(self, parent=None):
        super().__init__(parent)
        self.model = None
        self.plan = Plan()
        self.tiers = DEFAULT_TIERS
        self.assignment: dict[str, str] = {}
        self.current: str | None = None
        self.stats: dict = {}
        self._results: dict[tuple[str, str], object] = {}
        self.details: dict[tuple[str, str], object] = {}
        self.throughput: dict[tuple[str, str], float | None] = {}
        self._est: dict[tuple[str, str], int] = {}
        self.estimates: dict[tuple[str, str], object] = {}   # workbench.planning.estimate.Estimate
        self.decisions: dict = {}          # name -> workbench.quant.runtimes.Decision ("any")
        self._summary = None               # running FallbackSummary of `decisions`
        self._totals = None                # cached Totals, dropped by every change below
        self._pos: dict[str, int] = {}     # tensor name -> its position in the catalog
        self._run = _RunningTotals()       # the totals, kept by per-tensor deltas (FAST)
        self._size_memo: dict = {}         # (scheme, shape, dtype, nbytes) -> stored bytes
        self._matrices: int | None = None
        self.backend = "…"

    # ---- state --------------------------------------------------------------------------
    def set_model(self, model, plan: Plan | None = None, tiers=None) -> None:
        if self.model is not None and self.model is not model:
            self.model.close()
        self._totals = None
        self.model = model
        # no plan given: the model's default (no tensor gets more bits than it has: a GGUF's
        # quantized tensors are kept as stored; workbench.quant.plan.default_plan)
        self.plan = plan or (default_plan(model) if model is not None else Plan())
        self.tiers = tuple(tiers) if tiers else DEFAULT_TIERS
        self.stats, self._results, self.details, self.throughput = {}, {}, {}, {}
        self._est = {}
        self._size_memo = {}
        self.estimates = {}
        self.decisions = {}
        self._summary = None
        self._run = _RunningTotals()
        self.assignment = {}
        self._pos = {}
        self._matrices = None
        if model is not None:
            self._open_pass(model)
        self.current = None
        self.modelChanged.emit()

    def _open_pass(self, model) -> None:
        """One pass over the catalog when it opens: each tensor's scheme, its decision (what is
        applied: workbench.quant.runtimes for the workbench's own runtime) and its stored size (from
        the scheme's size formula: nothing is measured yet), the running totals from them."""
        from workbench.api.plans import Decider, get_runtime, summarize
        decide = Decider(self.plan, get_runtime("any"))
        assignment, decisions, sizes = self.assignment, self.decisions, {}
        size_memo, pos = self._size_memo, self._pos
        floats: dict[str, bool] = {}
        matrices = 0
        try:
            for k, (name, info, scheme, explicit, rule) in enumerate(self.plan.sources(model)):
                assignment[name] = scheme
                pos[name] = k
                if len(info.shape) >= 2:
                    f = floats.get(info.dtype)
                    if f is None:
                        f = floats[info.dtype] = info.is_float
                    matrices += f
                decisions[name] = decide(name, info, scheme, explicit, rule)
                skey = (scheme, info.shape, info.dtype, info.nbytes)
                b = size_memo.get(skey)
                if b is None:
                    b = self.estimated_bytes(name, scheme)
                sizes[name] = b
        except WorkbenchError:
            # the "any" runtime has a type for every scheme: not expected; as before, the
            # decisions are left out and the rest resolved tensor by tensor
            self.assignment = self.plan.resolve(model)
            self._pos = {n: i for i, n in enumerate(model.tensors)}
            self.decisions = {}
            sizes = {n: self.estimated_bytes(n) for n in model.tensors}
        self._summary = summarize(self.decisions.values())
        self._run.open(model.tensors, sizes)
        self._matrices = matrices

    def matrix_count(self) -> int:
        """Float tensors of 2 or more dimensions (the weight matrices), counted at open."""
        if self.model is None:
            return 0
        if self._matrices is None:
            self._matrices = sum(1 for i in self.model.tensors.values()
                                 if i.ndim >= 2 and i.is_float)
        return self._matrices

    def set_state(self, plan: Plan, tiers=None) -> None:
        """Replace the plan (and tier setup); emits what changed."""
        tiers = self.tiers if tiers is None else tuple(tiers)
        tiers_changed = tiers != self.tiers
        old_plan = self.plan
        self._totals = None
        self.plan, self.tiers = plan, tiers
        old = self.assignment
        from . import perf
        touched = old_plan.exact_changes(plan) if perf.FAST and self.model is not None else None
        if touched is None:
            # anything but exact-name rules changed: every tensor re-resolved
            self.assignment = plan.resolve(self.model) if self.model is not None else {}
            changed = [n for n, s in self.assignment.items()
                       if old.get(n) != s or old_plan.method_for(n) != plan.method_for(n)]
            names = changed
        else:
            # an assignment (exact-name rules added, removed or changed): only those tensors
            # can resolve differently; the rest of the plan resolves as before
            names = sorted((n for n in touched if n in self._pos), key=self._pos.__getitem__)
            new = plan.resolve(self.model, names)
            self.assignment = dict(old)
            self.assignment.update(new)
            changed = [n for n in names
                       if old.get(n) != new[n] or old_plan.method_for(n) != plan.method_for(n)]
        # the decisions of the touched tensors (their rules' fallbacks included); a plan whose
        # other fallbacks changed: every tensor's
        self._update_decisions(names if touched is not None
                               else None if _fallbacks(old_plan) != _fallbacks(plan) else names)
        if self.model is not None:
            self._run.update(self, changed)
        if tiers_changed:
            self.tiersChanged.emit()
        self.stateChanged.emit(changed)

    def set_current(self, name: str | None) -> None:
        if name == self.current or (name is not None and self.model is not None
                                    and name not in self.model.tensors):
            return
        self.current = name
        self.currentChanged.emit(name or "")
        self.currentSettled.emit(name or "")

    def _update_decisions(self, names) -> None:
        """What the workbench applies to each tensor (workbench.quant.runtimes.decide for the
        workbench's own runtime, as `evaluate` without --runtime): only `names` (None: all)."""
        if self.model is None:
            self.decisions = {}
            return
        from workbench.api.plans import plan_decisions, summarize
        try:
            new = plan_decisions(self.model, self.plan, "any", names)
        except WorkbenchError:
            return  # the "any" runtime has a type for every scheme: not expected
        if names is None or self._summary is None:
            self.decisions.update(new)
            self._summary = summarize(self.decisions.values())
            return
        for n, d in new.items():     # the running summary: each changed decision's delta
            was = self.decisions.get(n)
            if was is not None:
                self._summary.remove(was)
            self._summary.add(d)
            self.decisions[n] = d

    def fallback_summary(self):
        """workbench.quant.runtimes.FallbackSummary of the plan (as `evaluate` prints it), kept up to
        date by each edit's changed decisions."""
        from workbench.api.plans import summarize
        from . import perf
        if not perf.FAST or self._summary is None:
            return summarize(self.decisions.values())
        s = self._summary
        return type(s)(dict(s.tensors), dict(s.params), dict(s.moves), s.total_params)

    def decision(self, name: str):
        return self.decisions.get(name)

    # ---- results delivered by the analyzer ------------------------------------------------
    def add_result(self, result) -> None:
        self._results[(result.name, result.requested)] = result
        self._totals = None
        current = self.assignment.get(result.name) == result.requested
        if current:
            self._run.update(self, (result.name,))
        self.resultAdded.emit(result.name, result.requested)
        if current:
            self.resultsChanged.emit([result.name])

    def add_estimate(self, est) -> None:
        """A sampled-rows estimate of a tensor's error (shown until the exact result arrives)."""
        self.estimates[(est.name, est.requested)] = est
        if self.assignment.get(est.name) == est.requested and self.result(est.name) is None:
            self._totals = None
            self._run.update(self, (est.name,))
            self.estimatesChanged.emit([est.name])

    def estimate(self, name: str, scheme: str | None = None):
        return self.estimates.get((name, scheme or self.scheme_of(name)))

    def add_stats(self, stats_by_name: dict) -> None:
        self.stats.update(stats_by_name)
        self.statsChanged.emit(list(stats_by_name))

    def add_detail(self, name: str, scheme: str, detail) -> None:
        self.details[(name, scheme)] = detail
        self.detailChanged.emit(name)

    def add_throughput(self, name: str, scheme: str, gbs: float | None) -> None:
        self.throughput[(name, scheme)] = gbs
        self._totals = None
        if self.model is not None and name in self._pos:
            self._run.update(self, (name,))
        self.throughputChanged.emit([name])

    def set_backend(self, name: str) -> None:
        self.backend = name
        self.backendChanged.emit(name)

    # ---- queries ------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self.model.tensors) if self.model is not None else []

    def scheme_of(self, name: str) -> str:
        return self.assignment.get(name, KEEP)

    def method_of(self, name: str) -> str:
        """The plan's quantization method for a tensor (workbench.quant.methods; rtn by default)."""
        return self.plan.method_for(name)

    def result(self, name: str, scheme: str | None = None):
        return self._results.get((name, scheme or self.scheme_of(name)))

    def result_for(self, name: str, scheme: str):
        return self._results.get((name, scheme))

    def gbs(self, name: str, scheme: str | None = None) -> float | None:
        return self.throughput.get((name, scheme or self.scheme_of(name)))

    def estimated_bytes(self, name: str, scheme: str | None = None) -> int:
        """Stored bytes under a scheme, from the scheme's size formula (no data read)."""
        scheme = scheme or self.scheme_of(name)
        key = (name, scheme)
        n = self._est.get(key)
        if n is None:
            info = self.model.tensors.get(name) or self.model.info(name)
            # the size formula depends on the scheme, the shape and the dtype only: worked out
            # once per distinct shape (a MoE catalog has a few dozen)
            skey = (scheme, info.shape, info.dtype, info.nbytes)
            n = self._size_memo.get(skey)
            if n is None:
                n = info.nbytes
                if scheme != KEEP and info.is_float:
                    try:
                        s = get_scheme(scheme)
                        if s.ineligible_reason(info.shape) is None:
                            n = int(s.nbytes(info.shape))
                    except (WorkbenchError, NotImplementedError):
                        pass
                self._size_memo[skey] = n
            self._est[key] = n
        return n

    def bytes_of(self, name: str) -> int:
        p = self._run.parts.get(name)     # the running totals hold it (kept per change)
        if p is not None:
            return p[0]
        r = self.result(name)
        return r.bytes if r is not None else self.estimated_bytes(name)

    def sizes(self, names) -> list[int]:
        """bytes_of of many tensors at once (the model map's first draw: 100,000 of them)."""
        parts = self._run.parts
        try:
            return [parts[n][0] for n in names]
        except KeyError:
            return [self.bytes_of(n) for n in names]

    def pending(self) -> list[str]:
        return [n for n in self.names() if self.result(n) is None]

    def totals(self) -> Totals:
        """The model totals; cached until the plan, a result or a throughput changes (the
        totals bar asks once per signal, several times per edit)."""
        from . import perf
        if perf.FAST and self._totals is not None:
            return self._totals
        self._totals = self._run.totals(self) if perf.FAST and self.model is not None \
            else self._compute_totals()
        return self._totals

    def _compute_totals(self) -> Totals:
        """The totals summed over every tensor (the reference the running totals must equal;
        the path with app.perf.FAST off)."""
        if self.model is None:
            return Totals(0, 0, 0, 0.0, 0.0, None, 0, None, 0)
        results, pending, before, after, params = [], 0, 0, 0, 0
        estimates = []
        for name, info in self.model.tensors.items():
            r = self.result(name)
            params += info.numel
            before += info.nbytes
            if r is None:
                pending += 1
                after += self.estimated_bytes(name)
                e = self.estimate(name)
                if e is not None:
                    estimates.append(e)
            else:
                results.append(r)
                after += r.bytes
        sqnr = sqnr_est = None
        if not pending:
            t = totals_of(results)
            before, after, sqnr = t.bytes_before, t.bytes_after, t.sqnr_db
            sqnr_est = sqnr
        elif len(estimates) == pending:
            t = totals_of(results)
            for e in estimates:
                t.add(0, 0, 0, e.sig, e.sse)
            sqnr_est = t.sqnr_db
        floats, secs, measured = 0.0, 0.0, 0
        for name, info in self.model.tensors.items():
            g = self.gbs(name)
            if g:
                floats += info.numel * 4
                secs += info.numel * 4 / (g * 1e9)
                measured += 1
        return Totals(params, before, after, 8.0 * after / params if params else 0.0,
                      before / after if after else 0.0, sqnr, pending,
                      floats / secs / 1e9 if secs > 0 else None, measured, sqnr_est,
                      len(estimates) if pending else 0)

    def sqnr(self, name: str) -> float | None:
        r = self.result(name)
        return None if r is None else r.error.sqnr_db

    @staticmethod
    def finite(v: float | None) -> bool:
        return v is not None and math.isfinite(v)


class _RunningTotals:
    """The document's totals as sums of per-tensor parts, each tensor's part replaced when its
    scheme, result, estimate or throughput changes: an edit updates the totals in time
    proportional to the tensors it changed, not to the model (issue 23).

    A part is (bytes after, result (sig, sse, bytes before, bytes) or None, estimate (sig, sse)
    or None, throughput (float bytes, seconds) or None). Sums of floats are re-added from the
    parts every REFRESH updates, so rounding from subtracting cannot build up; non-finite error
    sums (a NaN tensor) are kept aside and added when the totals are read."""

    REFRESH = 20000

    def __init__(self):
        self.parts: dict[str, tuple] = {}
        self.params = self.before = 0
        self._zero()

    def _zero(self) -> None:
        self.after = self.pending = self.r_before = self.r_after = 0
        self.r_sig = self.r_sse = self.e_sig = self.e_sse = 0.0
        self.estimated = 0
        self.floats = self.secs = 0.0
        self.measured = 0
        self.odd_r: dict[str, tuple] = {}    # non-finite result sums, by tensor
        self.odd_e: dict[str, tuple] = {}
        self.updates = 0

    @staticmethod
    def part(doc, name: str, info) -> tuple:
        r = doc.result(name)
        res = est = gbs = None
        if r is None:
            after = doc.estimated_bytes(name)
            e = doc.estimate(name)
            if e is not None:
                est = (e.sig, e.sse)
        else:
            after = r.bytes
            res = (r.error.sig, r.error.sse, r.bytes_before, r.bytes)
        g = doc.gbs(name)
        if g:
            fl = info.numel * 4
            gbs = (float(fl), fl / (g * 1e9))
        return (after, res, est, gbs)

    def _apply(self, name: str, p: tuple, sign: int) -> None:
        after, res, est, gbs = p
        self.after += sign * after
        if res is None:
            self.pending += sign
            if est is not None:
                self.estimated += sign
                if math.isfinite(est[0]) and math.isfinite(est[1]):
                    self.e_sig += sign * est[0]
                    self.e_sse += sign * est[1]
                elif sign > 0:
                    self.odd_e[name] = est
                else:
                    self.odd_e.pop(name, None)
        else:
            self.r_before += sign * res[2]
            self.r_after += sign * res[3]
            if math.isfinite(res[0]) and math.isfinite(res[1]):
                self.r_sig += sign * res[0]
                self.r_sse += sign * res[1]
            elif sign > 0:
                self.odd_r[name] = res
            else:
                self.odd_r.pop(name, None)
        if gbs is not None:
            self.floats += sign * gbs[0]
            self.secs += sign * gbs[1]
            self.measured += sign

    def rebuild(self, doc, tensors) -> None:
        self.parts = {}
        self._zero()
        self.params = sum(i.numel for i in tensors.values())
        self.before = sum(i.nbytes for i in tensors.values())
        for name, info in tensors.items():
            p = self.parts[name] = self.part(doc, name, info)
            self._apply(name, p, 1)

    def open(self, tensors, sizes: dict) -> None:
        """A catalog just opened: nothing measured, every tensor at its formula size."""
        self.parts = {n: (b, None, None, None) for n, b in sizes.items()}
        self._zero()
        self.params = sum(i.numel for i in tensors.values())
        self.before = sum(i.nbytes for i in tensors.values())
        self.after = sum(sizes.values())
        self.pending = len(sizes)

    def update(self, doc, names) -> None:
        tensors = doc.model.tensors
        for name in names:
            old = self.parts.get(name)
            if old is not None:
                self._apply(name, old, -1)
            p = self.parts[name] = self.part(doc, name, tensors[name])
            self._apply(name, p, 1)
            self.updates += 1
        if self.updates >= self.REFRESH:
            parts = self.parts
            self._zero()
            for name, p in parts.items():
                self._apply(name, p, 1)

    def totals(self, doc) -> Totals:
        sig, sse = self.r_sig, self.r_sse
        for res in self.odd_r.values():
            sig, sse = sig + res[0], sse + res[1]
        sqnr = sqnr_est = None
        before, after = self.before, self.after
        if not self.pending:
            before, after = self.r_before, self.r_after
            sqnr = sqnr_est = sqnr_db(sig, sse)
        elif self.estimated == self.pending:
            esig, esse = sig + self.e_sig, sse + self.e_sse
            for e in self.odd_e.values():
                esig, esse = esig + e[0], esse + e[1]
            sqnr_est = sqnr_db(esig, esse)
        params = self.params
        return Totals(params, before, after, 8.0 * after / params if params else 0.0,
                      before / after if after else 0.0, sqnr, self.pending,
                      self.floats / self.secs / 1e9 if self.secs > 0 else None, self.measured,
                      sqnr_est, self.estimated if self.pending else 0)


def _fallbacks(plan) -> tuple:
    return (plan.fallback, tuple(getattr(r, "fallback", None) for r in plan.rules))
