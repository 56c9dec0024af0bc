"""Size budgets and what they count (`allocate`; docs/command-line.md, "Budgets").

A budget is one number and an accounting:

* ``bpw`` over ``all``: bits per weight over every tensor of the checkpoint, as `evaluate` counts
  them (``totals.bits_per_weight``): 8 x bytes of every tensor (quantized tensors at their
  scheme's storage, all others at their own dtype, embeddings and an unused pooler included) /
  every tensor's element count. The budget is ``floor(X * params / 8)`` bytes.
* ``bpw`` over ``linear``: bits per weight over the Linear weights only (the tensors whose role is
  an attention or MLP projection, an expert, or the LM head: :func:`is_linear`), the figure
  GPTQ/AWQ-style "4-bit" labels mean. The other tensors are not part of the choice: they stay as
  they are (kept in their dtype) unless ``--pin`` names them.
* ``bytes``: the sum of every tensor's bytes as `evaluate` counts them (``totals.bytes``; no file
  header).
* ``file``: the size of the file the target's export writes (``gguf`` for llama.cpp: header,
  key/values with the tokenizer and the plan, tensor infos, every written tensor padded to the
  alignment, the tensors llama.cpp's converter drops left out), computed without quantizing
  (`workbench.export.gguf_size.layout_bytes`) and checked after solving (the plan's own JSON is
  in the header, so the budget for the tensors is tightened until the whole file fits).

``--budget-of FILE``: a ``.gguf`` file's size as a ``file`` budget (a GGUF export of the plan is
no bigger), a ``.safetensors`` file's tensor bytes (its size less its header) as a ``bytes``
budget; an mlx-lm folder's safetensors bytes (the sum of its .safetensors files' sizes) as a
``file`` budget of format ``mlx`` for the mlx target (workbench.planning.mlx_budget; the MLX
safetensors' size is predicted to the byte, workbench.export.mlx_layout).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP

#: roles of the Linear weights (a projection a matmul reads; see workbench.formats.catalog)
LINEAR_ROLES = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_o", "mlp_up", "mlp_gate",
                "mlp_down", "expert", "shared_expert", "lm_head")
OVER = ("all", "linear")
FILE_FORMATS = {"llama.cpp": "gguf", "mlx": "mlx"}
#: the runtime whose export writes each file format
FORMAT_TARGET = {v: k for k, v in FILE_FORMATS.items()}


def layout_bytes(model, plan, fmt: str = "gguf") -> dict:
    """The export's file layout without quantizing: {"file": bytes, "tensors": {name: bytes},
    "alignment": ...} of the GGUF (workbench.export.gguf_size) or of the MLX folder's
    safetensors (workbench.export.mlx_layout)."""
    if fmt == "mlx":
        from workbench.export.mlx_layout import layout_bytes as mlx_bytes
        return mlx_bytes(model, plan)
    from workbench.export.gguf_size import layout_bytes as gguf_bytes
    return gguf_bytes(model, plan)


def for_target(budget: "Budget", target: str) -> "Budget":
    """A file budget given in bytes (``budget_file_bytes``) counts the file of `target`'s
    export: the MLX folder's safetensors for mlx, else the GGUF."""
    if budget.kind == "file" and target == "mlx" and budget.source is None:
        return replace(budget, format="mlx")
    return budget


def is_linear(info) -> bool:
    """A Linear weight: a >= 2-D float tensor whose role is a projection, an expert or the LM
    head (not embeddings, norms, biases, routers, convolutions or 'other', e.g. BERT's pooler)."""
    return info.ndim >= 2 and info.is_float and info.role in LINEAR_ROLES


@dataclass(frozen=True)
class Budget:
    kind: str                    # "bpw" | "bytes" | "file"
    value: float                 # bits per weight, or bytes
    over: str = "all"            # bpw: "all" | "linear"
    format: str | None = None    # file: "gguf"
    source: str | None = None    # --budget-of FILE

    @classmethod
    def bits_per_weight(cls, value: float, over: str = "all") -> "Budget":
        """`value` bits per weight over every tensor (``over="all"``, as `evaluate` counts
        them) or over the Linear weights only (``over="linear"``)."""
        from workbench.core.checks import check_choice
        check_choice("over", over, OVER)
        return from_flags(budget_bpw=_number("value", value, "budget_bpw"), bpw_over=over)

    @classmethod
    def tensor_bytes(cls, value: int) -> "Budget":
        """`value` bytes of every tensor as `evaluate` counts them (no file header)."""
        return from_flags(budget_bytes=_number("value", value, "budget_bytes"))

    @classmethod
    def file_bytes(cls, value: int) -> "Budget":
        """`value` bytes of the whole GGUF file the llama.cpp export writes."""
        return from_flags(budget_file_bytes=_number("value", value, "budget_file_bytes"))

    @classmethod
    def of_file(cls, path) -> "Budget":
        """No bigger than an existing file: a .gguf file's size, a .safetensors file's tensor
        bytes."""
        from workbench.core.checks import check_path
        return budget_of(str(check_path("path", path)))

    def describe(self) -> str:
        if self.kind == "bpw":
            what = "every tensor" if self.over == "all" else "the Linear weights"
            s = f"{self.value:g} bits/weight over {what}"
        elif self.kind == "bytes":
            s = f"{int(self.value):,d} bytes of tensors (as evaluate counts them)"
        elif self.format == "mlx":
            s = f"{int(self.value):,d} bytes of MLX safetensors"
        else:
            s = f"{int(self.value):,d} bytes of {self.format} file"
        return s + (f", the size of {self.source}" if self.source else "")

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "value": self.value, "over": self.over
             if self.kind == "bpw" else ("file" if self.kind == "file" else "all")}
        if self.format:
            d["format"] = self.format
        if self.source:
            d["source"] = self.source
        d["text"] = self.describe()
        return d


#: the largest budget each kind takes (above it no allocation differs, and a bits-per-weight
#: of 1e308 times the parameter count is no number of bytes)
BUDGET_MAX = {"budget_bpw": 1024.0, "budget_bytes": float(1 << 62),
              "budget_file_bytes": float(1 << 62)}


def _number(name: str, v, kind: str | None = None) -> float:
    """`v` as a positive finite number within its kind's bound (an ArgumentError naming `name`:
    the parameter, which the CLI shows as its flag)."""
    from workbench.core.checks import check_float
    return check_float(name, v, 0.0, BUDGET_MAX[kind or name], lo_open=True)


def from_flags(budget_bpw: float | None = None, budget_bytes: int | None = None,
               budget_file_bytes: int | None = None, budget_of_file: str | None = None,
               bpw_over: str | None = None) -> Budget:
    """The budget `allocate`'s flags ask for (exactly one of the four budgets given; `bpw_over`
    only with `budget_bpw`)."""
    if bpw_over is not None and budget_bpw is None:
        raise WorkbenchError("bpw_over= goes with budget_bpw=", params=("bpw_over", "budget_bpw"))
    if budget_bpw is not None:
        return Budget("bpw", _number("budget_bpw", budget_bpw), bpw_over or "all")
    if budget_bytes is not None:
        return Budget("bytes", _number("budget_bytes", budget_bytes))
    if budget_file_bytes is not None:
        return Budget("file", _number("budget_file_bytes", budget_file_bytes),
                      over="file", format="gguf")
    if budget_of_file is None:
        raise WorkbenchError("no budget: give bits per weight, bytes, file bytes or a file")
    return budget_of(budget_of_file)


def budget_of(path: str) -> Budget:
    """--budget-of FILE: a .gguf file's size (a GGUF file budget) or a .safetensors file's
    tensor bytes (a bytes budget)."""
    p = Path(path)
    if p.is_dir():
        from workbench.planning.mlx_budget import folder_bytes
        return Budget("file", float(folder_bytes(p)), over="file", format="mlx", source=str(p))
    try:
        size = p.stat().st_size
        if not p.is_file():
            raise WorkbenchError("--budget-of: not a file", path=str(p))
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise WorkbenchError(f"--budget-of: cannot read it ({exc.strerror or exc})",
                             path=str(p)) from None
    if head[:4] == b"GGUF":
        _readable(p, "a GGUF")
        return Budget("file", float(size), over="file", format="gguf", source=str(p))
    if p.suffix == ".safetensors" and len(head) == 8:
        n = int.from_bytes(head, "little")
        if 0 < n <= size - 8:
            _readable(p, "a safetensors")
            return Budget("bytes", float(size - 8 - n), source=str(p))
    raise WorkbenchError("--budget-of: not a GGUF or safetensors file or an mlx-lm folder (a "
                         ".gguf file's size, a .safetensors file's tensor bytes, or an mlx-lm "
                         "folder's safetensors bytes, is matched)", path=str(p))


def _readable(p: Path, what: str) -> None:
    """The --budget-of file opened by the loader `inspect` uses: a truncated or damaged file
    gets inspect's refusal, naming this file (not the model, as a 4-byte budget would), and one
    with no tensors is no budget."""
    from workbench.formats.loaders import open_model
    try:
        m = open_model(p)
    except WorkbenchError as exc:
        tensor = f"tensor '{exc.tensor}': " if exc.tensor else ""
        raise WorkbenchError(f"--budget-of: {tensor}{exc.problem}",
                             path=exc.path or str(p)) from None
    try:
        if not m.tensors:
            raise WorkbenchError(f"--budget-of: {what} file with no tensors is no budget",
                                 path=str(p))
    finally:
        close = getattr(m, "close", None)
        if close is not None:
            close()


def file_target(budget: Budget, target: str) -> str:
    """The runtime a file budget solves for: llama.cpp for a GGUF (the rules `export --format
    gguf` applies), mlx for an MLX folder's safetensors; `target` otherwise. An explicit other
    target is an error."""
    if budget.kind != "file":
        return target
    if budget.format == "mlx" or (target == "mlx" and budget.source is None):
        if target not in ("any", "mlx"):
            raise WorkbenchError(f"an mlx file budget counts an MLX export: use target='mlx', "
                                 f"not {target}", params=("target",))
        return "mlx"
    if target not in ("any", "llama.cpp"):
        raise WorkbenchError(f"a {budget.format} file budget counts a GGUF export, which "
                             f"follows llama.cpp's rules: use target='llama.cpp', not {target}",
                             params=("target",))
    return "llama.cpp"


# ---- solving ------------------------------------------------------------------------------------
def _linear_table(model, table, pins):
    """(table counting only the Linear weights' bytes, pins with the other tensors kept)."""
    lin = {n for n in model.tensors if is_linear(model.info(n))}
    params = sum(model.info(n).numel for n in lin)
    if not params:
        raise WorkbenchError("the model has no Linear weights (attention / MLP projections, "
                             "LM head) to count bits per weight over", path=model.path)
    nbytes = {k: (v if k[0] in lin else 0) for k, v in table.bytes.items()}
    fixed = sum(model.info(n).nbytes for n in table.fixed_names if n in lin)
    pins = dict(pins)
    for n in table.names:
        if n not in lin:
            pins.setdefault(n, KEEP)
    return replace(table, bytes=nbytes, fixed_bytes=fixed, params=params), pins


def _file_table(model, table, plan, fmt: str = "gguf"):
    """(table whose bytes are each tensor's padded bytes in the file and whose fixed bytes are
    the rest of the file for `plan`, the layout). Tensors the file leaves out (llama.cpp's
    converter drops BERT's pooler, position_ids; mlx-lm a tied head) cost nothing and are not
    a choice."""
    lay = layout_bytes(model, plan, fmt)
    align = lay["alignment"]
    per = lay["tensors"]
    nbytes = {(n, s): (v + (-v % align) if n in per else 0) for (n, s), v in table.bytes.items()}
    fixed = lay["file"] - sum(per.get(n, 0) for n in table.names)
    return replace(table, bytes=nbytes, fixed_bytes=fixed), lay


def prefetch_file(model, budget: Budget) -> None:
    """For a file budget: start measuring the GGUF header on a background thread
    (`gguf_size.prefetch`), so that `solve` finds the tokenizer's part ready."""
    if budget.kind == "file" and budget.format != "mlx":
        from workbench.export.gguf_size import prefetch
        from workbench.quant.plan import Plan
        prefetch(model, Plan(default=KEEP))


def solve(model, table, budget: Budget, pins: dict | None = None, finish=None):
    """(Plan, allocate.Solution, the budget in bytes of what it counts) for `budget`.
    `finish(plan)`: the plan as it will be written (each tensor's method on its rule), applied
    before a file budget measures the file (the plan's JSON is in the GGUF header)."""
    pins = dict(pins or {})
    finish = finish or (lambda p: p)
    if budget.kind == "bytes":
        cap = int(budget.value)
        plan, sol = table.solve(cap, pins)
        return finish(plan), sol, cap
    if budget.kind == "bpw" and budget.over == "all":
        cap = table.budget_bytes(None, budget.value)
        plan, sol = table.solve(cap, pins)
        return finish(plan), sol, cap
    if budget.kind == "bpw":
        t, p = _linear_table(model, table, pins)
        cap = t.budget_bytes(None, budget.value)
        plan, sol = t.solve(cap, p)
        return finish(plan), sol, cap
    # a file: solve, measure the file the plan gives, tighten by the excess, again
    fmt = budget.format or "gguf"
    cap = int(budget.value)
    longest = max(table.schemes + [KEEP], key=len)
    guess = table.plan_for({n: pins.get(n, longest) for n in table.names})
    t, lay = _file_table(model, table, guess, fmt)
    for n in table.names:
        if n not in lay["tensors"]:
            pins.setdefault(n, KEEP)
    want = cap
    for _ in range(6):
        plan, sol = t.solve(want, pins)
        plan = finish(plan)
        size = layout_bytes(model, plan, fmt)["file"]
        if size <= cap:
            return plan, sol, cap
        want -= size - cap
    what = "MLX safetensors" if fmt == "mlx" else "GGUF file"
    raise WorkbenchError(f"no plan found whose {what} fits {cap:,d} bytes (the last was "
                         f"{size:,d})", path=model.path)


def accounting(model, ev, runtime: str, plan=None) -> dict:
    """How big the evaluated plan is in each accounting: bytes and bits per weight over every
    tensor, over the Linear weights, and the file's bytes (llama.cpp: the GGUF; mlx: the
    safetensors of the MLX folder, exactly what `export --format mlx` writes)."""
    params = sum(model.info(n).numel for n in model.tensors)
    lin = [n for n in model.tensors if is_linear(model.info(n))]
    lin_params = sum(model.info(n).numel for n in lin)
    lin_bytes = sum(int(ev.tensors[n].bytes) for n in lin if n in ev.tensors)
    out = {"bytes": int(ev.totals.bytes_after), "params": int(params),
           "bits_per_weight_all": 8.0 * ev.totals.bytes_after / params if params else 0.0,
           "linear_bytes": int(lin_bytes), "linear_params": int(lin_params),
           "bits_per_weight_linear": 8.0 * lin_bytes / lin_params if lin_params else None}
    if plan is not None and runtime in FILE_FORMATS:
        try:
            out["file_bytes"] = {"format": FILE_FORMATS[runtime], "bytes": int(
                layout_bytes(model, plan, FILE_FORMATS[runtime])["file"])}
        except WorkbenchError:
            pass   # a model the GGUF export refuses: no file size to state
    return out
