"""What each target runtime expects of a tensor, as data, and the one decision function that
`evaluate`, every exporter and the GUI share.

For each tensor and the scheme a plan requests, :func:`decide` says what is applied:

* ``ok``       — the requested scheme, unchanged;
* ``fallback`` — the tensor's shape cannot take the scheme (a row length that is not a multiple
  of its block); the plan's own ``fallback`` is used when it fits, else the runtime's rule;
* ``kept``     — stored unchanged in its own dtype (1-D tensors and non-float tensors by
  default, or a scheme with no fallback that fits);
* ``skipped``  — the plan asked to quantize a tensor the runtime never re-types (llama.cpp:
  norms, biases, position and token-type embeddings); the rule is ignored with a warning rather
  than obeyed into a file the runtime aborts on.

Runtimes:

* ``any`` — the workbench's own quantized safetensors: every float tensor may take every
  scheme (1-D tensors only by an explicit rule); shape fallbacks as below.
* ``llama.cpp`` — ``src/llama-quant.cpp`` (llama-cpp-python 0.3.36's vendored llama.cpp):
  ``tensor_allows_quantization`` re-types only tensors of >= 2 dimensions whose GGUF name ends
  in ``weight`` and is not a norm, ``position_embd``, ``token_types``, ``ffn_gate_inp``,
  ``attn_rel_b``, ``ssm_conv1d`` ...; ``tensor_type_fallback``: when the row length (ggml's
  ne[0]) is not a multiple of the type's block, Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
  Q6_K -> Q8_0 (IQ*_XS/XXS/S -> IQ4_NL), and F16 when the fallback does not fit either (and for
  32-block types directly). Types: F32, F16, BF16 and the GGML block types.
* ``onnxruntime`` — ONNX Runtime (workbench.export.onnx_format): only Linear weights (attention
  and MLP projections, the LM head) become ``com.microsoft.MatMulNBits``; int2/int4/int8
  block-wise, per-channel or per-tensor (sym/asym) and q4_0/q4_1/q8_0 (onnxruntime's CPU kernel
  takes bits 2, 4, 8, and 2-bit blocks of at most 256); a scheme it cannot express takes the
  plan's fallback when that is expressible, else is kept float with a note.
* ``mlx`` — Apple MLX (mlx-lm folders, workbench.export.mlx_format): mlx-lm's ``nn.quantize``
  quantizes every module with ``to_quantized`` (Linear, Embedding, the stacked experts'
  SwitchLinear) whose weight's last dimension is a multiple of the group; norms, biases,
  convolutions, 1-D tensors stay float. Schemes: the MLX modes (workbench.schemes.mlx) only; a
  row length the group does not divide takes the same bits with a smaller group (mlx-q4-g128 ->
  g64 -> g32), else stays float (mlx-lm leaves such a module float). The experts of one
  projection of one layer are one SwitchLinear: one scheme for all (``fused_groups``).
* ``vllm`` — compressed-tensors: only linear layers' weights (attention and MLP projections; not
  embeddings, the LM head, norms or biases); int4/int8 per-channel or group-wise (symmetric or
  asymmetric) and fp8-e4m3; anything else is not expressible and kept.

Integer group schemes that do not fit fall back to the per-channel scheme of the same bits
(``int4-g128`` -> ``int4-channel``), which fits every shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from workbench.core.errors import WorkbenchError
from workbench.schemes import registry as _registry

KEEP = "keep"
KINDS = ("ok", "fallback", "kept", "skipped")

# built from the scheme registry (each GGML scheme class declares its llama.cpp fallback;
# llama-quant.cpp tensor_type_fallback), never copied by hand
GGML_FALLBACK = _registry.llama_fallbacks()
LAST_RESORT = "fp16"
#: the schemes llama.cpp has a tensor type for (F32, F16, BF16 and the GGML block types)
LLAMA_TYPES = _registry.llama_schemes()
# llama-quant.cpp tensor_allows_quantization: substrings of GGUF names never re-typed
LLAMA_NEVER = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup",
               "laurel", "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight",
               "attn_rel_b.weight", "time_mix_", ".position_embd", ".rel_pos", ".patch_embd")
LLAMA_NEVER_EXACT = ("position_embd.weight", "token_types.weight")
VLLM_ROLES = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_o", "mlp_up", "mlp_gate",
              "mlp_down")
# vLLM's MoE layers: routers are unquantized ReplicatedLinear layers (quant_config=None in
# vLLM's Qwen-MoE / Mixtral / DeepSeek models), so they stay float and go to `ignore`; experts
# are per-expert Linear layers (FusedMoE); DeepSeek's MLA projections are Linear layers too
VLLM_ROUTER = re.compile(r"(?:^|\.)(?:mlp|block_sparse_moe|moe|feed_forward)\.(?:gate|router)"
                         r"\.weight$|shared_expert_gate\.weight$|ffn_gate_inp")
VLLM_EXTRA_LINEAR = re.compile(r"\.(?:q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj)\.weight$"
                               r"|\.experts\.\d+\.(?:gate_proj|up_proj|down_proj|w1|w2|w3)"
                               r"\.weight$")
VLLM_MOE_ROLES = ("expert", "shared_expert")
_VLLM_SCHEME = re.compile(r"^(int4|int8)-(channel|g\d+)(-asym)?(@[a-z0-9.]+)*$|^fp8-e4m3$"
                          r"|^fp8-e4m3-b128$|^nvfp4-g16$|^mxfp4-g32$")
_INT_GROUP = re.compile(r"^(int\d+)-g\d+(-asym)?(@.*)?$")

# mixture-of-experts projections (catalog roles) are Linear layers to vLLM too; routers are not
# (vLLM builds them unquantized): they stay float and go to compressed-tensors' `ignore`
VLLM_ROLES += ("expert", "shared_expert")


@dataclass(frozen=True)
class Decision:
    name: str
    requested: str           # what the plan asked for
    applied: str             # what is applied ("keep": stored unchanged)
    kind: str                # ok | fallback | kept | skipped
    note: str | None = None
    params: int = 0

    def to_dict(self) -> dict:
        d = {"name": self.name, "requested": self.requested, "applied": self.applied,
             "kind": self.kind}
        if self.note:
            d["note"] = self.note
        return d


@dataclass
class Summary:
    """Counts of tensors and parameters per decision kind, and the fallbacks taken."""
    tensors: dict = field(default_factory=lambda: {k: 0 for k in KINDS})
    params: dict = field(default_factory=lambda: {k: 0 for k in KINDS})
    moves: dict = field(default_factory=dict)      # "q4_k->q5_0" -> count
    total_params: int = 0

    def add(self, d: Decision) -> None:
        self.tensors[d.kind] += 1
        self.params[d.kind] += d.params
        self.total_params += d.params
        if d.kind == "fallback":
            key = f"{d.requested}->{d.applied}"
            self.moves[key] = self.moves.get(key, 0) + 1

    def remove(self, d: Decision) -> None:
        """Take back a decision added before (a running summary: the tensor's decision changed)."""
        self.tensors[d.kind] -= 1
        self.params[d.kind] -= d.params
        self.total_params -= d.params
        if d.kind == "fallback":
            key = f"{d.requested}->{d.applied}"
            left = self.moves.get(key, 0) - 1
            if left > 0:
                self.moves[key] = left
            else:
                self.moves.pop(key, None)

    def share(self, kind: str) -> float:
        return self.params[kind] / self.total_params if self.total_params else 0.0

    @property
    def changed(self) -> bool:
        return bool(self.tensors["fallback"] or self.tensors["skipped"])

    def line(self) -> str:
        parts = []
        if self.tensors["fallback"]:
            moves = ", ".join(f"{k} x{v}" for k, v in sorted(self.moves.items()))
            parts.append(f"{self.tensors['fallback']} tensors fell back "
                         f"({100 * self.share('fallback'):.1f}% of parameters: {moves})")
        if self.tensors["skipped"]:
            parts.append(f"{self.tensors['skipped']} rules skipped on tensors the runtime never "
                         f"re-types ({100 * self.share('skipped'):.1f}% of parameters)")
        parts.append(f"{self.tensors['kept']} tensors kept in their own dtype "
                     f"({100 * self.share('kept'):.1f}% of parameters)")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"tensors": dict(self.tensors), "params": dict(self.params),
                "param_share": {k: self.share(k) for k in KINDS}, "fallbacks": dict(self.moves),
                "line": self.line()}


    def __str__(self) -> str:
        return self.line()


#: the name the GUI and other helpers use for :class:`Summary`
FallbackSummary = Summary


def summarize(decisions) -> Summary:
    s = Summary()
    for d in decisions:
        s.add(d)
    return s


def note_kinds(notes: dict) -> list[tuple[str, list[str]]]:
    """Per-tensor notes ({tensor: note}) grouped by kind: (the note with tensor names taken out,
    the tensors that have it), most frequent first. Exporters report one line per kind."""
    kinds: dict[str, list[str]] = {}
    for name, note in notes.items():
        key = _TENSORISH.sub("<tensor>", str(note).replace(str(name), "<tensor>"))
        kinds.setdefault(key, []).append(name)
    return sorted(kinds.items(), key=lambda kv: -len(kv[1]))


_TENSORISH = re.compile(r"\b[\w-]+(?:\.[\w-]+)+\.(?:weight|bias)\b")


# ---- runtimes -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Runtime:
    name: str
    label: str
    #: a scheme the runtime cannot represent is kept with a note (else: an error)
    keeps_unsupported: bool = False
    #: its schemes join the candidates of "any" (MLX's do not: only its export writes them)
    in_any: bool = True

    def never_retyped(self, info, gguf_name: str | None) -> str | None:
        """Why this runtime never re-types the tensor (None: it may)."""
        return None

    def unsupported(self, scheme: str) -> str | None:
        """Why the runtime has no representation for `scheme` (None: it has)."""
        return None

    def shape_unfit(self, scheme: str, shape) -> str | None:
        """Why the runtime cannot store `scheme` for a tensor of this shape although the scheme
        itself takes it (None: it can)."""
        return None

    def shape_fallback(self, scheme: str) -> str | None:
        """The runtime's next scheme to try when `scheme` does not fit the shape."""
        if scheme in GGML_FALLBACK:
            return GGML_FALLBACK[scheme]
        m = _INT_GROUP.match(scheme)
        if m:
            return f"{m.group(1)}-channel{m.group(2) or ''}{m.group(3) or ''}"
        return LAST_RESORT if scheme != LAST_RESORT else None


class _Any(Runtime):
    pass


class _LlamaCpp(Runtime):
    def never_retyped(self, info, gguf_name):
        if info.ndim < 2:
            return "llama.cpp only re-types tensors of 2 or more dimensions"
        if gguf_name is None:
            return None
        if not gguf_name.endswith("weight"):
            return f"llama.cpp never re-types {gguf_name} (not a weight)"
        if gguf_name in LLAMA_NEVER_EXACT or any(s in gguf_name for s in LLAMA_NEVER):
            return f"llama.cpp never re-types {gguf_name}"
        return None

    def unsupported(self, scheme):
        from workbench.schemes import get_scheme
        base = get_scheme(scheme).name
        if base not in LLAMA_TYPES:
            return (f"llama.cpp has no tensor type for {base} "
                    f"(types: {_registry.llama_types_text(llama_spelling=False)})")
        return None

    def shape_fallback(self, scheme):
        if scheme in GGML_FALLBACK:
            return GGML_FALLBACK[scheme]
        return LAST_RESORT if scheme != LAST_RESORT else None


class _Vllm(Runtime):
    def never_retyped(self, info, gguf_name):
        if VLLM_ROUTER.search(info.name) or info.role == "router":
            return "vLLM keeps mixture-of-experts routers unquantized (in `ignore`)"
        if info.ndim == 2 and (VLLM_EXTRA_LINEAR.search(info.name)
                               or info.role in VLLM_MOE_ROLES):
            return None
        if info.ndim != 2 or info.role not in VLLM_ROLES:
            return f"vLLM quantizes only linear layers' weights ({info.name} is {info.role})"
        return None

    def unsupported(self, scheme):
        from workbench.schemes import get_scheme
        base = get_scheme(scheme).name
        if not _VLLM_SCHEME.match(base):
            return (f"compressed-tensors cannot express {base} (vLLM takes int4/int8 "
                    "per-channel or group-wise, symmetric or asymmetric, fp8-e4m3 (channel, "
                    "fp8-e4m3-b128), nvfp4-g16 and mxfp4-g32)")
        return None

    def shape_fallback(self, scheme):
        m = _INT_GROUP.match(scheme)
        if m:
            return f"{m.group(1)}-channel{m.group(2) or ''}"
        return None


ONNX_ROLES = VLLM_ROLES + ("lm_head",)


class _OnnxRuntime(Runtime):
    """ONNX Runtime (workbench.export.onnx_format): Linear weights only, as MatMulNBits."""

    def never_retyped(self, info, gguf_name):
        if info.ndim != 2 or info.role not in ONNX_ROLES:
            return (f"the ONNX export quantizes only Linear weights ({info.name} is "
                    f"{info.role})")
        return None

    def unsupported(self, scheme):
        from workbench.quant.onnx_capacity import unsupported_reason
        return unsupported_reason(scheme)

    def shape_unfit(self, scheme, shape):
        from workbench.quant.onnx_capacity import unsupported_reason
        return unsupported_reason(scheme, tuple(shape))

    def shape_fallback(self, scheme):
        m = _INT_GROUP.match(scheme)
        if m:
            return f"{m.group(1)}-channel{m.group(2) or ''}"
        return None


_MLX_GROUP = re.compile(r"^(mlx-q\d)-g(\d+)$")
MLX_KEPT_ROLES = ("norm", "bias", "conv", "other")


class _Mlx(Runtime):
    """Apple MLX (mlx-lm): Linear, Embedding and stacked-expert weights, in MLX's modes."""

    def never_retyped(self, info, gguf_name):
        if info.ndim < 2 or info.ndim > 3 or not info.name.endswith(".weight") \
                or info.role in MLX_KEPT_ROLES:
            return (f"MLX quantizes only Linear and Embedding weights ({info.name} is "
                    f"{info.role}, {info.ndim}-D)")
        return None

    def unsupported(self, scheme):
        from workbench.schemes import get_scheme
        from workbench.schemes.mlx import MLXScheme
        if not isinstance(get_scheme(scheme), MLXScheme):
            return (f"MLX has no mode for {get_scheme(scheme).name} (it runs mlx-q2..8-g32/64/128,"
                    " mlx-mxfp4, mlx-nvfp4, mlx-mxfp8)")
        return None

    def shape_fallback(self, scheme):
        m = _MLX_GROUP.match(scheme)
        if m and int(m.group(2)) > 32:
            return f"{m.group(1)}-g{int(m.group(2)) // 2}"
        return None


RUNTIMES: dict[str, Runtime] = {
    "any": _Any("any", "any runtime (the workbench's quantized safetensors)"),
    "llama.cpp": _LlamaCpp("llama.cpp", "llama.cpp (GGUF, llama-quantize)"),
    "vllm": _Vllm("vllm", "vLLM (compressed-tensors)", keeps_unsupported=True),
    "onnxruntime": _OnnxRuntime("onnxruntime", "ONNX Runtime (MatMulNBits)",
                                keeps_unsupported=True),
    "mlx": _Mlx("mlx", "Apple MLX (mlx-lm folders)", in_any=False),
}


#: one expert's projection (per-expert checkpoints): (the layer's MoE prefix, the projection)
_EXPERT_OF = re.compile(r"^(.*)\.experts\.\d+\.([^.]+)\.weight$")
#: vLLM fuses these sibling projections into one layer: they must share one scheme
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"),
                ("query", "key", "value"))


#: llama.cpp's lattice types (issue 34), worth a place among the default candidates only at low
#: budgets: scheme -> its bits/weight; a candidate while the budget's mean bits/weight is below
#: that + 1 (so 4+ bits/weight allocations keep their candidate count and time)
LOW_BIT_ONLY = _registry.low_bit_only()


def for_budget(names: list[str], bits_per_weight: float) -> list[str]:
    """`names` less the LOW_BIT_ONLY types that a budget of `bits_per_weight` (mean over every
    weight) is too large for."""
    return [s for s in names if s not in LOW_BIT_ONLY or bits_per_weight < LOW_BIT_ONLY[s] + 1]


def candidate_schemes(runtime: str = "any") -> list[str]:
    """The schemes an allocation for `runtime` chooses from by default: every registered scheme
    the runtime can run and its exporter can write (fp32, the same as keeping an fp32 tensor,
    left out; keeping a tensor is always a choice). ``any``: the union over the real runtimes,
    so that a plan allocated without a target still exports to one of them per tensor.
    Per tensor, shapes a scheme cannot take are handled by :func:`decide` (its fallback)."""
    from workbench.schemes import list_schemes
    rt = get_runtime(runtime)
    if rt.name == "any":
        out: list[str] = []
        for other in RUNTIMES.values():
            if other.name != "any" and other.in_any:
                out.extend(s for s in candidate_schemes(other.name) if s not in out)
        return out
    return [s for s in list_schemes() if s != "fp32" and rt.unsupported(s) is None]


def fused_groups(names, runtime: str = "any") -> list[list[str]]:
    """Tensors among `names` that `runtime` stores as one fused layer and so must share one
    scheme (vLLM: q/k/v, gate/up; MLX: the experts of one projection of a layer, stacked into
    one SwitchLinear), two or more per group; other runtimes: none."""
    if get_runtime(runtime).name == "mlx":
        by: dict = {}
        for n in names:
            m = _EXPERT_OF.match(n)
            if m:
                by.setdefault((m.group(1), m.group(2)), []).append(n)
        return [g for g in by.values() if len(g) >= 2]
    if get_runtime(runtime).name != "vllm":
        return []
    have = set(names)
    groups, seen = [], set()
    for n in names:
        for group in FUSED_GROUPS:
            tag = f".{group[0]}."
            if tag not in f".{n}" or n in seen:
                continue
            sibs = [n.replace(f"{group[0]}.", f"{g}.", 1) if n.startswith(f"{group[0]}.")
                    else n.replace(tag, f".{g}.") for g in group]
            present = [x for x in sibs if x in have]
            if len(present) >= 2:
                groups.append(present)
                seen.update(present)
    return groups


def get_runtime(name: str) -> Runtime:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise WorkbenchError(f"unknown target runtime '{name}' "
                             f"(choose from {', '.join(RUNTIMES)})") from None


# ---- the decision -------------------------------------------------------------------------
def _fits(scheme: str, shape, rt: Runtime | None = None) -> str | None:
    from workbench.schemes import get_scheme
    why = get_scheme(scheme).ineligible_reason(tuple(shape))
    if why is None and rt is not None:
        why = rt.shape_unfit(scheme, shape)
    return why


def decide(info, requested: str, runtime: str | Runtime = "any", *, fallback: str | None = None,
           explicit: bool = True, gguf_name: str | None = None, shape=None) -> Decision:
    """What is applied to tensor `info` when a plan requests `requested` for `runtime`.

    `explicit`: the scheme came from a rule naming the tensor or matching it (not from the
    plan's default), so ignoring it is worth a warning. `fallback`: the plan's own fallback.
    Raises WorkbenchError (naming the tensor) when the runtime has no type for the scheme.
    `shape`: the shape the runtime stores (when it differs from the source's)."""
    rt = get_runtime(runtime) if isinstance(runtime, str) else runtime
    if shape is None:   # a merged expert tensor is quantized as (n_expert * rows, cols)
        shape = tuple(info.matrix_shape) if getattr(info, "merged_experts", False) \
            else tuple(info.shape)
    shape = tuple(shape)
    n, params = info.name, info.numel
    if requested == KEEP:
        return Decision(n, KEEP, KEEP, "kept", None, params)
    if not info.is_float:
        return Decision(n, requested, KEEP, "kept", f"{info.dtype} tensor is not quantized", params)
    why = rt.never_retyped(info, gguf_name)
    if why and requested == "fp32" and rt.name == "llama.cpp":
        why = None  # F32 is how llama.cpp's converter stores norms and biases
    if why:
        if not explicit:  # the plan's default: keeping it is what the runtime does anyway
            return Decision(n, requested, KEEP, "kept", why if info.ndim >= 2 else None, params)
        return Decision(n, requested, KEEP, "skipped", f"{why}: rule ignored, kept", params)
    reason = rt.unsupported(requested)
    if reason:
        if rt.name == "onnxruntime" and fallback and fallback != KEEP \
                and not rt.unsupported(fallback) and _fits(fallback, shape, rt) is None:
            return Decision(n, requested, fallback, "fallback",
                            f"{reason}: the plan's fallback {fallback} instead", params)
        if rt.keeps_unsupported:
            return Decision(n, requested, KEEP, "kept", f"{reason}: kept in {info.dtype}", params)
        raise WorkbenchError(reason, tensor=n)
    reason = _fits(requested, shape, rt)
    if reason is None:
        return Decision(n, requested, requested, "ok", None, params)
    tried = []
    candidates = []
    if fallback and fallback != KEEP:
        candidates.append(fallback)
    nxt = rt.shape_fallback(requested)
    while nxt and nxt not in candidates and len(candidates) < 8:
        candidates.append(nxt)
        nxt = rt.shape_fallback(nxt)
    if fallback == KEEP:
        candidates = []
    for cand in candidates:
        if rt.unsupported(cand):
            continue
        if _fits(cand, shape, rt) is None:
            return Decision(n, requested, cand, "fallback", f"{reason}: {cand} instead", params)
        tried.append(cand)
    return Decision(n, requested, KEEP, "kept", f"{reason}: kept in {info.dtype}", params)


class Decider:
    """decide() for the tensors of one plan and runtime, fed by Plan.sources. A runtime whose
    "never re-typed" rule ignores the tensor's name decides by the scheme, the shape and the
    dtype alone: one decision per distinct (request, shape, dtype), the rest copied with the
    tensor's name (a 100,000-tensor MoE catalog has a few dozen)."""

    def __init__(self, plan, rt: Runtime, gnames=None, shapes=None):
        self.plan, self.rt, self.gnames, self.shapes = plan, rt, gnames, shapes
        self.memo: dict | None = {} if (type(rt).never_retyped is Runtime.never_retyped
                                        and not shapes) else None

    def __call__(self, name, info, requested, explicit, rule) -> Decision:
        plan = self.plan
        if not info.is_float:   # as scheme_and_source: the rule's (or default's) request
            requested, explicit = plan.scheme_and_source(name, info.ndim, False)
        fallback = rule.fallback if rule is not None and rule.fallback else plan.fallback
        key = None
        if self.memo is not None:
            shape = info.shape
            key = (requested, explicit, fallback, shape, info.dtype,
                   len(shape) == 3 and info.merged_experts)
            d = self.memo.get(key)
            if d is not None:
                return Decision(name, d.requested, d.applied, d.kind, d.note, info.numel)
        d = decide(info, requested, self.rt, fallback=fallback, explicit=explicit,
                   gguf_name=self.gnames.get(name) if self.gnames else None,
                   shape=(self.shapes or {}).get(name))
        if key is not None:
            self.memo[key] = d
        return d


def runtime_and_names(model, runtime: str):
    """(the runtime, the model's llama.cpp tensor names when the runtime is llama.cpp and its
    names are known, else None): what the decisions and the size helpers need."""
    rt = get_runtime(runtime)
    gnames = None
    if rt.name == "llama.cpp":
        from workbench.formats.llama_names import gguf_names
        try:
            gnames = gguf_names(model)
        except WorkbenchError:
            gnames = None
    return rt, gnames


def plan_decisions(model, plan, runtime: str = "any", names=None,
                   shapes: dict | None = None) -> dict[str, Decision]:
    """The decision for every tensor of `model` (or `names`) under `plan` for `runtime`
    (`shapes`: stored shapes that differ from the source's, e.g. GPT-2's transposed Conv1D)."""
    rt, gnames = runtime_and_names(model, runtime)
    if rt.name == "llama.cpp":
        if shapes is None and model.format != "gguf":
            from workbench.formats.llama_names import CONV1D, detect_arch
            arch = detect_arch(model) if gnames is not None else None
            if arch is not None and arch.gguf_arch == "GPT2":
                shapes = {n: tuple(model.info(n).shape)[::-1] for n in model.tensors
                          if CONV1D.search(n) and model.info(n).ndim == 2}
    out: dict[str, Decision] = {}
    errors = []
    decider = Decider(plan, rt, gnames, shapes)
    for name, info, requested, explicit, rule in plan.sources(model, names):
        try:
            out[name] = decider(name, info, requested, explicit, rule)
        except WorkbenchError as exc:
            errors.append((name, exc))
    if rt.name == "mlx" and not errors:   # the export's dtype (workbench.quant.mlx_target)
        from workbench.quant.mlx_target import with_export_dtype
        out = with_export_dtype(model, out)
    if errors:
        first = str(errors[0][1])
        more = f" (and {len(errors) - 1} more tensors: " + ", ".join(
            n for n, _ in errors[1:6]) + (" ..." if len(errors) > 6 else "") + ")" \
            if len(errors) > 1 else ""
        raise WorkbenchError(first + more, path=getattr(model, "path", None))
    return out


def check_strict(decisions, path=None) -> None:
    """--strict: every fallback, skipped rule, or scheme that could not be applied (kept for
    want of a fitting fallback) is an error. Tensors the runtime never re-types that the plan's
    default (not a rule) reaches are kept as llama-quantize keeps them, not an error."""
    bad = [d for d in decisions if d.kind in ("fallback", "skipped")
           or (d.kind == "kept" and d.note and d.requested != KEEP and ": kept in " in d.note)]
    if bad:
        raise WorkbenchError(
            f"strict=True: {len(bad)} tensors would not get the scheme the plan asks for: "
            + "; ".join(f"{d.name}: {d.note}" for d in bad[:4]) + (" ..." if len(bad) > 4 else ""),
            path=path, params=("strict",))
