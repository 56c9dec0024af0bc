"""Export the plan as a ``--tensor-type-file`` for llama.cpp's ``llama-quantize``.

File format (llama.cpp ``tools/quantize/quantize.cpp``, ``parse_tensor_type_file``): tokens
separated by spaces or newlines, each ``PATTERN=TYPE``. PATTERN is lower-cased and used as a
``std::regex`` searched in each GGUF tensor name; TYPE is a ggml type name (case-insensitive:
q4_0, q8_0, q4_K, iq4_nl, f16, bf16, f32 ...). There is no comment syntax, so the file holds
only assignments. We write one line per weight matrix with the exact, anchored, escaped
llama.cpp name, e.g. ``^blk\\.0\\.attn_q\\.weight$=q4_K``.

Usage::

    quant-workbench export MODEL --plan plan.json --format llama-tensor-types -o types.txt
    llama-quantize --tensor-type-file types.txt model-f16.gguf model-mixed.gguf Q4_K_M

Names are mapped from Hugging Face names to the GGUF names that llama.cpp's
``convert_hf_to_gguf.py`` writes, for Llama / Mistral / Qwen (``model.layers.N...``), GPT-2
(``h.N...``) and BERT (``encoder.layer.N...``); a GGUF source already has llama.cpp names.
llama-quantize only re-types weight matrices, so 1-D tensors (norms, biases) are left out, as
are tensors convert_hf_to_gguf drops (``position_ids``, BERT's pooler, rotary ``inv_freq``,
GPT-2's attention-mask buffers) and those llama-quantize never re-types (norms, BERT's
position and token-type embeddings); the exporter's result lists them. A tensor that cannot be mapped, a scheme llama.cpp has no
type for, or a row length (ggml's ne[0]) that the type's block does not divide is a
WorkbenchError naming the tensors, since the file would not reproduce the plan.
"""

from __future__ import annotations

import math
import re

from ..atomic import write_text_atomic
from ..errors import WorkbenchError
from ..plan import KEEP
from ..progress import Progress
from ..schemes import get_scheme
from . import register_exporter

# scheme -> ggml type name as llama.cpp spells it (ggml_type_name)
GGML_TYPE_NAMES = {"q4_0": "q4_0", "q4_1": "q4_1", "q5_0": "q5_0", "q5_1": "q5_1", "q8_0": "q8_0",
                   "q2_k": "q2_K", "q3_k": "q3_K", "q4_k": "q4_K", "q5_k": "q5_K", "q6_k": "q6_K",
                   "iq4_nl": "iq4_nl", "fp32": "f32", "fp16": "f16", "bf16": "bf16"}
BLOCK = {"q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q8_0": 32, "iq4_nl": 32, "q2_k": 256,
         "q3_k": 256, "q4_k": 256, "q5_k": 256, "q6_k": 256}
# source dtype kept unchanged -> ggml type
KEEP_TYPE_NAMES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}

_N = r"(\d+)"
# (family, pattern on the HF name, llama.cpp name template; {0} = block index)
_LLAMA = [
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.weight", "output_norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (rf"model\.layers\.{_N}\.self_attn\.q_proj\.(weight|bias)", "blk.{0}.attn_q.{1}"),
    (rf"model\.layers\.{_N}\.self_attn\.k_proj\.(weight|bias)", "blk.{0}.attn_k.{1}"),
    (rf"model\.layers\.{_N}\.self_attn\.v_proj\.(weight|bias)", "blk.{0}.attn_v.{1}"),
    (rf"model\.layers\.{_N}\.self_attn\.o_proj\.(weight|bias)", "blk.{0}.attn_output.{1}"),
    (rf"model\.layers\.{_N}\.self_attn\.q_norm\.weight", "blk.{0}.attn_q_norm.weight"),
    (rf"model\.layers\.{_N}\.self_attn\.k_norm\.weight", "blk.{0}.attn_k_norm.weight"),
    (rf"model\.layers\.{_N}\.mlp\.gate_proj\.(weight|bias)", "blk.{0}.ffn_gate.{1}"),
    (rf"model\.layers\.{_N}\.mlp\.up_proj\.(weight|bias)", "blk.{0}.ffn_up.{1}"),
    (rf"model\.layers\.{_N}\.mlp\.down_proj\.(weight|bias)", "blk.{0}.ffn_down.{1}"),
    (rf"model\.layers\.{_N}\.input_layernorm\.weight", "blk.{0}.attn_norm.weight"),
    (rf"model\.layers\.{_N}\.post_attention_layernorm\.weight", "blk.{0}.ffn_norm.weight"),
]
_GPT2 = [
    (r"(?:transformer\.)?wte\.weight", "token_embd.weight"),
    (r"(?:transformer\.)?wpe\.weight", "position_embd.weight"),
    (r"(?:transformer\.)?ln_f\.(weight|bias)", "output_norm.{0}"),
    (r"lm_head\.weight", "output.weight"),
    (rf"(?:transformer\.)?h\.{_N}\.ln_1\.(weight|bias)", "blk.{0}.attn_norm.{1}"),
    (rf"(?:transformer\.)?h\.{_N}\.attn\.c_attn\.(weight|bias)", "blk.{0}.attn_qkv.{1}"),
    (rf"(?:transformer\.)?h\.{_N}\.attn\.c_proj\.(weight|bias)", "blk.{0}.attn_output.{1}"),
    (rf"(?:transformer\.)?h\.{_N}\.ln_2\.(weight|bias)", "blk.{0}.ffn_norm.{1}"),
    (rf"(?:transformer\.)?h\.{_N}\.mlp\.c_fc\.(weight|bias)", "blk.{0}.ffn_up.{1}"),
    (rf"(?:transformer\.)?h\.{_N}\.mlp\.c_proj\.(weight|bias)", "blk.{0}.ffn_down.{1}"),
]
_BERT = [
    (r"(?:bert\.)?embeddings\.word_embeddings\.weight", "token_embd.weight"),
    (r"(?:bert\.)?embeddings\.position_embeddings\.weight", "position_embd.weight"),
    (r"(?:bert\.)?embeddings\.token_type_embeddings\.weight", "token_types.weight"),
    (r"(?:bert\.)?embeddings\.LayerNorm\.(weight|bias)", "token_embd_norm.{0}"),
    (rf"(?:bert\.)?encoder\.layer\.{_N}\.attention\.self\.query\.(weight|bias)", "blk.{0}.attn_q.{1}"),
    (rf"(?:bert\.)?encoder\.layer\.{_N}\.attention\.self\.key\.(weight|bias)", "blk.{0}.attn_k.{1}"),
    (rf"(?:bert\.)?encoder\.layer\.{_N}\.attention\.self\.value\.(weight|bias)", "blk.{0}.attn_v.{1}"),
    (rf"(?:bert\.)?encoder\.layer\.{_N}\.attention\.output\.dense\.(weight|bias)",
     "blk.{0}.attn_output.{1}"),
    (rf"(?:bert\.)?encoder\.layer\.{_N}\.attention\.output\.LayerNorm\.(weight|bias)",
     "blk.{0}.attn_output_norm.{1}"),
    (rf"(?:bert\.)?encoder\.layer\.{_N}\.intermediate\.dense\.(weight|bias)", "blk.{0}.ffn_up.{1}"),
    (rf"(?:bert\.)?encoder\.layer\.{_N}\.output\.dense\.(weight|bias)", "blk.{0}.ffn_down.{1}"),
    (rf"(?:bert\.)?encoder\.layer\.{_N}\.output\.LayerNorm\.(weight|bias)",
     "blk.{0}.layer_output_norm.{1}"),
]
FAMILIES = {"llama": _LLAMA, "gpt2": _GPT2, "bert": _BERT}
FAMILY_LABELS = {"llama": "Llama/Mistral/Qwen", "gpt2": "GPT-2", "bert": "BERT", "gguf": "GGUF"}
# tensors llama.cpp's converter drops (no GGUF tensor to re-type)
_DROPPED = re.compile(r"(position_ids$|(^|\.)pooler\.|rotary_emb\.inv_freq$|\.attn\.(masked_)?bias$)")
# GPT-2 Conv1D weights are stored (in, out) by Hugging Face and transposed by the converter
_CONV1D = re.compile(r"(?:^|\.)h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
# llama.cpp names llama-quantize never re-types (tensor_allows_quantization)
_NOT_QUANTIZED = re.compile(r"(_norm\.weight$|^position_embd\.weight$|^token_types\.weight$"
                            r"|ffn_gate_inp\.weight$|attn_rel_b\.weight$|ssm_conv1d)")
_COMPILED = {fam: [(re.compile(p + "$"), t) for p, t in rules] for fam, rules in FAMILIES.items()}


def detect_family(model) -> str:
    """'gguf', 'llama', 'gpt2' or 'bert' from the tensor names (WorkbenchError if none fits)."""
    # llama.cpp names (a GGUF from convert_hf_to_gguf); a GGUF this workbench wrote from a
    # safetensors checkpoint keeps Hugging Face names and is mapped like its source
    if any(n.startswith("blk.") or n in ("token_embd.weight", "output.weight")
           for n in model.tensors):
        return "gguf"
    scores = {fam: sum(1 for n in model.tensors if any(p.match(n) for p, _ in rules))
              for fam, rules in _COMPILED.items()}
    best = max(scores, key=lambda f: scores[f])
    if scores[best] == 0:
        raise WorkbenchError("cannot map this model's tensor names to llama.cpp names (known "
                             "families: Llama/Mistral/Qwen, GPT-2, BERT, or a GGUF source)",
                             path=model.path)
    return best


def llama_cpp_name(name: str, family: str) -> str | None:
    """The GGUF name llama.cpp gives the tensor `name` of a model of `family` (None: unknown)."""
    if family == "gguf":
        return name
    for pat, template in _COMPILED[family]:
        m = pat.match(name)
        if m:
            return template.format(*m.groups())
    return None


def _row_length(name: str, shape: tuple, family: str) -> int:
    if family == "gpt2" and _CONV1D.search(name) and len(shape) == 2:
        return int(shape[0])
    return int(shape[-1])


def _keep_type(info) -> str | None:
    if info.quant:
        return None
    t = KEEP_TYPE_NAMES.get(info.dtype)
    if t is None and info.dtype not in ("F64",) and info.is_float:
        t = info.dtype.lower().replace("_k", "_K")  # a GGML type kept from a GGUF source
    return t


def tensor_type_lines(model, plan, strict: bool = False) -> tuple[list[str], dict]:
    """The file's lines and a report of what was left out. Shapes a scheme cannot take get
    the fallback `workbench.runtimes` decides (llama-quantize's own, or the plan's)."""
    from ..runtimes import check_strict, decide
    family = detect_family(model)
    assignment = plan.resolve(model)
    lines, left_out, dropped, unmapped, untyped, ineligible, not_retyped = [], [], [], [], [], [], []
    decisions = []
    for name, info in model.tensors.items():
        scheme = assignment[name]
        if info.ndim < 2 or not info.is_float:
            left_out.append(name)
            continue
        if family != "gguf" and _DROPPED.search(name):
            dropped.append(name)
            continue
        target = llama_cpp_name(name, family)
        if target is None:
            unmapped.append(name)
            continue
        if _NOT_QUANTIZED.search(target):
            not_retyped.append(name)
            continue
        if scheme == KEEP:
            ggml = _keep_type(info)
            if ggml is None:
                untyped.append(f"{name} (keep of {info.display_dtype})")
                continue
        else:
            key = get_scheme(scheme).name
            ggml = GGML_TYPE_NAMES.get(key)
            if ggml is None:
                untyped.append(f"{name} ({key})")
                continue
            row = _row_length(name, info.shape, family)
            d = decide(info, key, "llama.cpp", fallback=plan.fallback_for(name),
                       shape=(math.prod(info.shape) // max(row, 1), row))
            decisions.append(d)
            if d.applied == KEEP:
                ggml = _keep_type(info)
                if ggml is None:
                    ineligible.append(f"{name} ({d.note})")
                    continue
            else:
                ggml = GGML_TYPE_NAMES[get_scheme(d.applied).name]
        lines.append(f"^{re.escape(target)}$={ggml}")
    problems = []
    if unmapped:
        problems.append(f"no llama.cpp name for {len(unmapped)} tensor(s) of this "
                        f"{FAMILY_LABELS[family]} model: {', '.join(unmapped[:6])}"
                        + (" ..." if len(unmapped) > 6 else ""))
    if untyped:
        problems.append(f"no llama.cpp tensor type for {len(untyped)} tensor(s): "
                        f"{', '.join(untyped[:6])}"
                        + (" ..." if len(untyped) > 6 else "")
                        + " (llama.cpp types: f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K "
                          "q4_K q5_K q6_K iq4_nl)")
    if ineligible:
        problems.append(f"llama.cpp cannot use {len(ineligible)} assignment(s): "
                        + "; ".join(ineligible[:6])
                        + (" ..." if len(ineligible) > 6 else ""))
    if problems:
        raise WorkbenchError("cannot write a llama-quantize tensor-type file: "
                             + " | ".join(problems), path=model.path)
    if strict:
        check_strict(decisions, path=model.path)
    from ..runtimes import summarize
    report = {"family": FAMILY_LABELS[family], "assignments": len(lines),
              "fallbacks": summarize(decisions).to_dict(),
              "notes": {d.name: d.note for d in decisions if d.note},
              "left_out_1d_or_int": len(left_out), "dropped_by_converter": dropped,
              "never_retyped_by_llama_quantize": not_retyped}
    return lines, report


@register_exporter("llama-tensor-types", ".txt",
                   "the plan as llama-quantize --tensor-type-file (llama.cpp tensor names)")
def export_llama_tensor_types(model, plan, out_path, strict: bool = False):
    yield Progress(0, 1, "mapping tensor names")
    lines, report = tensor_type_lines(model, plan, strict)
    write_text_atomic(out_path, "\n".join(lines) + ("\n" if lines else ""))
    yield Progress(1, 1, "done")
    return {"path": str(out_path), "format": "llama-tensor-types", **report}
