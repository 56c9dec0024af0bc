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
``convert_hf_to_gguf.py`` writes with the `gguf` package's own tensor-name map
(``gguf.get_tensor_name_map``), for Llama / Mistral / Qwen (``model.layers.N...``), GPT-2
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

from workbench.core.atomic import write_text_atomic
from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP
from workbench.core.progress import Progress
from workbench.schemes import get_scheme
from workbench.schemes.registry import block_sizes, llama_type_names, llama_types_text
from workbench.formats.llama_names import (CONV1D, DROPPED, FAMILY_LABELS, _n_blocks_of,
                                           detect_family, llama_cpp_name)
from workbench.export import register_exporter

# scheme -> ggml type name as llama.cpp spells it (ggml_type_name), and GGML scheme -> weights
# per block: the scheme registry's (each scheme class declares its type)
GGML_TYPE_NAMES = llama_type_names()
BLOCK = block_sizes()
# source dtype kept unchanged -> ggml type
KEEP_TYPE_NAMES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}

def _row_length(name: str, shape: tuple, family: str) -> int:
    if family == "gpt2" and CONV1D.search(name) and len(shape) == 2:
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
    the fallback `workbench.quant.runtimes` decides (llama-quantize's own, or the plan's)."""
    from workbench.quant.runtimes import check_strict, decide
    from workbench.quant.runtimes import get_runtime
    family = detect_family(model)
    llama = get_runtime("llama.cpp")
    n_blocks = _n_blocks_of(model.tensors)
    assignment = plan.resolve(model)
    lines: dict = {}      # llama.cpp name -> (ggml type, first source name)
    left_out, dropped, unmapped, untyped, ineligible, not_retyped = [], [], [], [], [], []
    decisions, conflicts = [], []
    for name, info in model.tensors.items():
        scheme = assignment[name]
        if info.ndim < 2 or not info.is_float:
            left_out.append(name)
            continue
        if family != "gguf" and DROPPED.search(name):
            dropped.append(name)
            continue
        target = llama_cpp_name(name, family, n_blocks)
        if target is None:
            unmapped.append(name)
            continue
        if family == "deepseek2" and target.endswith("attn_kv_b.weight"):
            # convert_hf_to_gguf splits kv_b_proj into attn_k_b (rows of qk_nope_head_dim
            # values) and attn_v_b (rows of kv_lora_rank): one line each, decided per row length
            for sub, row in _mla_parts(model, target, info):
                line, d = _line(info, scheme, sub, row, plan, untyped, ineligible)
                if d is not None:
                    decisions.append(d)
                if line is not None:
                    _add_line(lines, line, name, conflicts)
            continue
        if llama.never_retyped(info, target):
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
        _add_line(lines, (target, ggml), name, conflicts)
    problems = []
    if conflicts:
        problems.append(f"llama.cpp stores a layer's experts of one projection as one tensor of "
                        f"one type, but the plan gives them different types: {conflicts[0]}"
                        + (f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""))
    if unmapped:
        problems.append(f"no llama.cpp name for {len(unmapped)} tensor(s) of this "
                        f"{FAMILY_LABELS[family]} model: {', '.join(unmapped[:6])}"
                        + (" ..." if len(unmapped) > 6 else ""))
    if untyped:
        problems.append(f"no llama.cpp tensor type for {len(untyped)} tensor(s): "
                        f"{', '.join(untyped[:6])}"
                        + (" ..." if len(untyped) > 6 else "")
                        + f" (llama.cpp types: {llama_types_text()})")
    if ineligible:
        problems.append(f"llama.cpp cannot use {len(ineligible)} assignment(s): "
                        + "; ".join(ineligible[:6])
                        + (" ..." if len(ineligible) > 6 else ""))
    if problems:
        raise WorkbenchError("cannot write a llama-quantize tensor-type file: "
                             + " | ".join(problems), path=model.path)
    if strict:
        check_strict(decisions, path=model.path)
    from workbench.quant.runtimes import summarize
    lines = [f"^{re.escape(t)}$={g}" for t, (g, _src) in lines.items()]
    report = {"family": FAMILY_LABELS[family], "assignments": len(lines),
              "fallbacks": summarize(decisions).to_dict(),
              "notes": {d.name: d.note for d in decisions if d.note},
              "left_out_1d_or_int": len(left_out), "dropped_by_converter": dropped,
              "never_retyped_by_llama_quantize": not_retyped}
    return lines, report


def _add_line(lines: dict, line: tuple, name: str, conflicts: list) -> None:
    """One line per llama.cpp tensor: the experts of a merged tensor must agree."""
    target, ggml = line
    if target in lines and lines[target][0] != ggml:
        conflicts.append(f"{target}: {lines[target][1]} {lines[target][0]}, {name} {ggml}")
        return
    lines.setdefault(target, (ggml, name))


def _mla_parts(model, target: str, info):
    """(llama.cpp name, row length) of the two tensors a DeepSeek kv_b_proj becomes."""
    from workbench.formats.llama_names import read_config
    cfg = read_config(model) or {}
    nope = cfg.get("qk_nope_head_dim")
    if not isinstance(nope, int):
        raise WorkbenchError("DeepSeek kv_b_proj without qk_nope_head_dim in config.json",
                             path=model.path)
    return [(target.replace("attn_kv_b", "attn_k_b"), nope),
            (target.replace("attn_kv_b", "attn_v_b"), int(info.shape[-1]))]


def _line(info, scheme, target, row, plan, untyped, ineligible):
    """((llama.cpp name, ggml type) or None, decision or None) for one split tensor."""
    from workbench.quant.runtimes import decide
    if scheme == KEEP:
        ggml = _keep_type(info)
        if ggml is None:
            untyped.append(f"{info.name} (keep of {info.display_dtype})")
            return None, None
        return (target, ggml), None
    key = get_scheme(scheme).name
    if key not in GGML_TYPE_NAMES:
        untyped.append(f"{info.name} ({key})")
        return None, None
    d = decide(info, key, "llama.cpp", fallback=plan.fallback_for(info.name),
               gguf_name=target, shape=(math.prod(info.shape) // max(row, 1), row))
    if d.applied == KEEP:
        ggml = _keep_type(info)
        if ggml is None:
            ineligible.append(f"{info.name} ({d.note})")
            return None, d
        return (target, ggml), d
    return (target, GGML_TYPE_NAMES[get_scheme(d.applied).name]), d


@register_exporter("llama-tensor-types", ".txt",
                   "the plan as llama-quantize --tensor-type-file (llama.cpp tensor names)")
def export_llama_tensor_types(model, plan, out_path, strict: bool = False):
    yield Progress(0, 1, "mapping tensor names")
    lines, report = tensor_type_lines(model, plan, strict)
    write_text_atomic(out_path, "\n".join(lines) + ("\n" if lines else ""))
    yield Progress(1, 1, "done")
    return {"path": str(out_path), "format": "llama-tensor-types", **report}
