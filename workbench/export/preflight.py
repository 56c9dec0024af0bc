"""Can the current plan be written in a format, and if not, why — before anything is written.

Each check runs the same decision code its exporter runs first (``workbench.quant.runtimes``
decisions for the exporter's target runtime, the exporter's own refusals: vLLM's fused
groups, llama-quantize's tensor-type mapping), without quantizing or writing. The GUI's
Export dialog shows these per format and defaults to one the plan can produce; the CLI has
`export --check`.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP

#: when several formats can write the plan as asked, the dialog's default is the first here
PREFERENCE = ("gguf", "compressed-tensors", "mlx", "safetensors", "onnx", "llama-tensor-types",
              "plan")


@dataclass(frozen=True)
class Preflight:
    format: str
    ok: bool                  # the exporter would write a file
    reason: str | None        # why not (ok False), one line
    summary: str | None       # the fallback summary line (ok True), when decisions apply
    changed: int = 0          # tensors that would not get the scheme the plan asks for
    quantized: int = 0        # tensors written quantized
    unmet_share: float = 0.0  # share of the model's parameters among the `changed` tensors
    #: the export writes, but not what the plan asks (nothing quantized, tensors falling back):
    #: a warning to show as such, never as a plain success
    warning: str | None = None

    @property
    def level(self) -> str:
        """"ok", "warning" (writes, but not all the plan asks) or "no" (cannot write)."""
        return "no" if not self.ok else "warning" if self.warning else "ok"

    def text(self) -> str:
        if not self.ok:
            return f"cannot write: {self.reason}"
        if self.summary:
            return f"can write; {self.summary}"
        return "can write"

    def to_dict(self) -> dict:
        return {"format": self.format, "ok": self.ok, "reason": self.reason,
                "summary": self.summary, "changed": self.changed, "quantized": self.quantized,
                "unmet_share": self.unmet_share, "warning": self.warning}


def _unmet(decisions) -> list:
    """Decisions that do not apply the scheme the plan asks for: fallbacks, skipped rules,
    schemes the runtime cannot store (not the tensors the plan's default reaches that the
    runtime never re-types: its own converter keeps those too)."""
    return [d for d in decisions if d.kind in ("fallback", "skipped")
            or (d.kind == "kept" and d.requested != KEEP and d.note and ": kept in " in d.note)]


def _one_line(exc: WorkbenchError) -> str:
    """The problem with its tensor, without the model's path (the dialog shows the model)."""
    text = exc.problem if exc.tensor is None else f"{exc.tensor}: {exc.problem}"
    return text.split("\n")[0]


def _from_decisions(fmt, decisions, total_params: int) -> Preflight:
    from workbench.quant.runtimes import summarize
    ds = list(decisions.values())
    s = summarize(ds)
    unmet = _unmet(ds)
    share = sum(d.params for d in unmet) / total_params if total_params else 0.0
    return Preflight(fmt, True, None, s.line(), len(unmet),
                     sum(1 for d in ds if d.applied != KEEP), share,
                     f"{len(unmet)} tensor{'s' if len(unmet) != 1 else ''} will not get the "
                     f"scheme the plan asks for ({share:.1%} of parameters)" if unmet else None)


def _fused_differ(decisions) -> bool:
    """Whether any group vLLM fuses (q/k/v, gate/up) has parts with different schemes."""
    from workbench.export.compressed_tensors import FUSED
    for name in decisions:
        for group in FUSED:
            if f".{group[0]}.weight" in name:
                sibs = [name.replace(f".{group[0]}.", f".{g}.") for g in group]
                applied = {decisions[s].applied for s in sibs if s in decisions}
                if len(applied) > 1:
                    return True
    from workbench.export.compressed_tensors import EXPERT
    experts: dict[str, set] = {}
    for name, d in decisions.items():
        m = EXPERT.match(name)
        if m is not None:
            experts.setdefault(m.group("layer"), set()).add(d.applied)
    return any(len(v) > 1 for v in experts.values())


def check(model, plan, fmt: str) -> Preflight:
    """Whether `fmt`'s exporter can write `plan` for `model` (never raises WorkbenchError)."""
    from workbench.quant.runtimes import plan_decisions
    total = getattr(model, "total_params", 0) or sum(i.numel for i in model.tensors.values())
    try:
        if fmt == "plan":
            return Preflight(fmt, True, None, None, 0, 0)
        if fmt == "safetensors":
            return _from_decisions(fmt, plan_decisions(model, plan, "any"), total)
        if fmt == "gguf":
            from workbench.export.gguf_target import hf_target, refuses
            from workbench.export.gguf_items import _plan_items
            decisions = plan_decisions(model, plan, "llama.cpp")
            from_gguf = model.format == "gguf" and model.source is not None
            hf, not_runnable = (None, None) if from_gguf else hf_target(model)
            if not_runnable and refuses(model):
                return Preflight(fmt, False, f"not written: {not_runnable}", None)
            _plan_items(model, decisions, from_gguf, hf, plan)
            p = _from_decisions(fmt, decisions, total)
            if not_runnable:
                return Preflight(fmt, True, None, f"{p.summary}; {not_runnable}", p.changed,
                                 p.quantized, p.unmet_share, p.warning or not_runnable)
            return p
        if fmt == "compressed-tensors":
            from workbench.export.compressed_tensors import _fused_conflicts
            decisions = plan_decisions(model, plan, "vllm")
            # the exporter's own check (it imports compressed-tensors and torch: seconds),
            # only where a fused group's parts differ at all
            conflicts = _fused_conflicts(decisions) if _fused_differ(decisions) else []
            if conflicts:
                return Preflight(fmt, False, f"vLLM fuses q/k/v and gate/up and needs one scheme "
                                 f"for all their parts; {len(conflicts)} fused group(s) differ: "
                                 f"{conflicts[0]}", None)
            p = _from_decisions(fmt, decisions, total)
            if not p.quantized:
                why = "no tensor can be quantized as the plan asks (written dense)"
                return Preflight(fmt, True, None, f"{why}; {p.summary}", p.changed, 0,
                                 p.unmet_share, why)
            return p
        if fmt == "onnx":
            from workbench.running.onnx_graph import import_onnx
            from workbench.running.runner_config import model_kind, read_config
            model_kind(read_config(model))      # a network to trace: config.json, known type
            import_onnx()
            return _from_decisions(fmt, plan_decisions(model, plan, "onnxruntime"), total)
        if fmt == "mlx":
            from workbench.export.mlx_layout import modules
            from workbench.formats.llama_names import read_config
            config = read_config(model)
            if config is None:
                return Preflight(fmt, False, "not written: the MLX export needs the model's "
                                 "config.json (mlx-lm builds the network from it)", None)
            decisions = plan_decisions(model, plan, "mlx")
            modules(model, decisions, config)     # experts of a projection: one scheme
            return _from_decisions(fmt, decisions, total)
        if fmt == "llama-tensor-types":
            from workbench.export.llama_tensor_types import tensor_type_lines
            from workbench.quant.runtimes import Summary
            lines, report = tensor_type_lines(model, plan)
            fb = report.get("fallbacks", {})
            t, p = fb.get("tensors", {}), fb.get("params", {})
            changed = t.get("fallback", 0) + t.get("skipped", 0)
            unmet = (p.get("fallback", 0) + p.get("skipped", 0)) / total if total else 0.0
            return Preflight(fmt, True, None, f"{len(lines)} assignments; "
                             + (fb.get("line") or Summary().line()), changed, len(lines), unmet)
    except WorkbenchError as exc:
        return Preflight(fmt, False, _one_line(exc), None)
    return Preflight(fmt, True, None, None)


def check_all(model, plan, formats=None) -> dict[str, Preflight]:
    from workbench.export import list_exporters
    names = formats or [e.name for e in list_exporters()]
    return {f: check(model, plan, f) for f in names}


def best_format(results: dict[str, Preflight], preferred: str | None = None) -> str | None:
    """The format to offer first: `preferred` (the user's last) when it can write the plan as
    asked, else, among writable formats that quantize something, the one that leaves the smallest share of parameters without
    the scheme the plan asks (PREFERENCE breaks ties; the plan file only when nothing else can
    be written)."""
    ok = {f: p for f, p in results.items() if p.ok}
    if preferred in ok and not ok[preferred].changed:
        return preferred
    models = {f: p for f, p in ok.items() if f != "plan"}
    if not models:
        return "plan" if "plan" in ok else preferred
    rank = {f: i for i, f in enumerate(PREFERENCE)}
    return min(models, key=lambda f: (not models[f].quantized, round(models[f].unmet_share, 2),
                                      rank.get(f, len(rank))))
