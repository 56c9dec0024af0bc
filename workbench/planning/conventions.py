"""What a uniform plan (``--scheme S``) leaves to the target runtime's own conventions: the
embeddings and the output head, typed as that runtime's own quantizer types them.

* ``llama.cpp`` (``src/llama-quant.cpp``, ``llama_tensor_get_type_impl``; llama-cpp-python
  0.3.36): for a quantized file type, ``output.weight`` (and ``token_embd.weight`` when the
  model has no ``output.weight``: tied embeddings, e.g. BERT, MiniLM) becomes Q8_0 when its row
  length is not a multiple of the default type's block, else Q6_K unless the default is Q8_0;
  then ``tensor_type_fallback`` (Q6_K -> Q8_0 when the row length is not a multiple of 256).
  An untied ``token_embd.weight`` takes the default type (llama-quantize's standard ftypes).
  ``--scheme fp16/bf16/fp32`` is not a quantized type: nothing changes.
* ``vllm`` (compressed-tensors, llm-compressor's recipes: ``targets: Linear``,
  ``ignore: [lm_head]``): the embeddings and the LM head stay float. The runtime rules already
  keep them (workbench.quant.runtimes: vLLM quantizes only the projections), so no rule is added.
* ``onnxruntime`` (``MatMulNBitsQuantizer``: ``op_types_to_quantize`` defaults to MatMul): the
  embeddings (Gather) stay float, the LM head (a MatMul) is quantized: the runtime rules already
  do so.
* ``any`` (the workbench's own safetensors, the default of evaluate / check): no convention,
  every float matrix takes the scheme, as before.

Only for a uniform scheme: a ``--rule`` (or an allocation's ``--pin``) naming those tensors wins,
and ``--quantize-all`` turns the convention off (llama-quantize's ``--pure``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP
from workbench.schemes.registry import block_sizes

# GGML block of each llama.cpp quantized type (ggml_blck_size): the scheme registry's
GGML_BLOCK = block_sizes()


def llama_output_type(default: str, ncols: int) -> str:
    """The type llama-quantize gives output.weight (or tied token_embd.weight) in a file whose
    default type is `default` (a GGML quantized type), fallback included."""
    t = "q8_0" if ncols % GGML_BLOCK[default] else (default if default == "q8_0" else "q6_k")
    if ncols % GGML_BLOCK[t]:            # tensor_type_fallback: Q6_K -> Q8_0
        t = "q8_0"
    return t


@dataclass
class Convention:
    runtime: str
    scheme: str
    #: rules added ahead of the default: {workbench name: scheme}
    rules: dict = field(default_factory=dict)
    #: {workbench name: why} for every tensor the convention types or keeps
    why: dict = field(default_factory=dict)

    def line(self) -> str:
        """One line: which tensors the convention typed or kept, and why."""
        if not self.why:
            return ""
        groups: dict[str, list[str]] = {}
        for n, w in self.why.items():
            groups.setdefault(w, []).append(n)
        parts = []
        for w, names in groups.items():
            t = self.rules.get(names[0])
            what = names[0] if len(names) == 1 else \
                f"{len(names)} tensors ({names[0]}, ...)"
            parts.append(f"{what} {'at ' + t.upper() if t else 'kept float'}: {w}")
        off = f"; --quantize-all gives them {self.scheme}" if self.rules else ""
        return f"{self.runtime} convention for --scheme {self.scheme}: " + "; ".join(parts) + off

    def to_dict(self) -> dict:
        return {"runtime": self.runtime, "scheme": self.scheme, "rules": dict(self.rules),
                "tensors": dict(self.why), "line": self.line()}


def convention(model, scheme: str, runtime: str) -> Convention:
    """The convention of `runtime` for a uniform plan of `scheme` on `model`."""
    from workbench.quant.runtimes import decide, get_runtime
    from workbench.schemes import get_scheme
    rt = get_runtime(runtime)
    s = get_scheme(scheme).name
    conv = Convention(rt.name, s)
    if rt.name == "llama.cpp":
        if s not in GGML_BLOCK:
            return conv
        from workbench.formats.llama_names import gguf_names
        try:
            gn = gguf_names(model)
        except WorkbenchError:
            return conv
        by_g = {g: n for n, g in gn.items() if g}
        out = by_g.get("output.weight")
        tied = out is None
        heads = [out] if out is not None else []
        if tied and by_g.get("token_embd.weight") is not None:
            heads.append(by_g["token_embd.weight"])
        for n in heads:
            info = model.info(n)
            if info.ndim < 2 or not info.is_float:
                continue
            ncols = int(info.shape[-1])
            t = llama_output_type(s, ncols)
            if t == s:
                continue
            g = gn[n]
            what = "" if g == "output.weight" else ", tied to the output (no output.weight)"
            why = (f"; row {ncols} not a multiple of {s}'s block {GGML_BLOCK[s]}"
                   if ncols % GGML_BLOCK[s] else
                   f"; row {ncols} not a multiple of 256" if t == "q8_0" and s != "q8_0"
                   else "")
            conv.rules[n] = t
            conv.why[n] = f"as llama-quantize types {g}{what}{why}"
        return conv
    if rt.name in ("vllm", "onnxruntime"):
        for n in model.tensors:
            info = model.info(n)
            if info.ndim < 2 or not info.is_float or info.role not in ("embedding", "lm_head"):
                continue
            d = decide(info, s, rt, explicit=False)
            if d.applied == KEEP:
                conv.why[n] = "llm-compressor quantizes Linear layers and ignores lm_head" \
                    if rt.name == "vllm" else "onnxruntime's MatMulNBits quantizer quantizes " \
                                              "MatMul weights, not Gather (embedding) tables"
    return conv


def apply(plan, model, scheme: str, runtime: str):
    """(plan with the convention's rules after its own rules, the Convention)."""
    from workbench.quant.plan import Rule
    conv = convention(model, scheme, runtime)
    for n in list(conv.why):      # a rule of the plan (--rule) naming the tensor wins
        info = model.info(n)
        if plan.scheme_and_source(n, info.ndim, info.is_float)[1]:
            conv.why.pop(n)
            conv.rules.pop(n, None)
    if conv.rules:
        plan = plan._copy(rules=list(plan.rules) + [Rule(n, t) for n, t in conv.rules.items()])
    return plan, conv
