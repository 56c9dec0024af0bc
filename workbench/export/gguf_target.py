"""The runnable GGUF layout of a Hugging Face model (`hf_target`): whether the folder can become
a GGUF llama.cpp runs, and if so its output tensors in file order: llama.cpp's names, the experts
of a projection merged into one 3-D tensor, fused gate_up experts split, DeepSeek's kv_b_proj
split per head, and the tensors computed from config.json (Llama 3's ``rope_freqs``).
"""

from __future__ import annotations

import re

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.export.gguf_arch import ARCH_SPECS, CONVERTER_HINT, HFTarget, OutTensor, Part, \
    _config_values, _hp, _n_experts, _rope
from workbench.export.gguf_transform import transformed_shape
from workbench.formats.llama_names import DROPPED, EXPERT, FUSED_EXPERTS, SUPPORTED_LABEL, \
    detect_arch, gguf_names, model_folder, read_config


def hf_target(model) -> tuple[HFTarget | None, str | None]:
    """(target, None) when `model` can become a runnable GGUF, else (None, why not).
    Raises WorkbenchError for a covered architecture whose tensors do not fit its layout."""
    if model.format == "gguf":
        return None, None
    try:
        config = read_config(model)
    except WorkbenchError as exc:
        return None, str(exc)
    if not config:
        return None, ("no config.json beside the weights, so the architecture and its "
                      "hyper-parameters are unknown: llama.cpp cannot run this GGUF (arch "
                      f"quant_workbench, Hugging Face names); {CONVERTER_HINT}")
    from workbench.formats.config_check import check_config
    cfg_path = model_folder(model) / "config.json"
    try:
        arch = detect_arch(model, config)
    except Exception:           # a malformed config.json: config_check names the key
        check_config(model, config, cfg_path)
        raise
    if arch is None or arch.gguf_arch not in ARCH_SPECS:
        # an architecture this exporter does not write is the reason, whatever its config holds
        hf = arch.hf_name if arch else config.get("model_type", "unknown")
        return None, (f"architecture {hf} is not one this exporter converts to a GGUF llama.cpp "
                      f"runs ({SUPPORTED_LABEL}); {CONVERTER_HINT}")
    check_config(model, config, cfg_path)   # against the tensors, before any work
    from workbench.formats.config_check import HEADS, HIDDEN
    for keys, what in ((HIDDEN, "embedding length"), (HEADS, "attention head count")):
        if all(config.get(k) is None for k in keys):
            raise WorkbenchError(f"no {keys[0]}: a GGUF states the model's {what} and "
                                 "llama.cpp needs it; nothing was written", path=str(cfg_path))
    if not (model_folder(model) / "tokenizer.json").is_file():
        return None, ("no tokenizer.json in the model folder: llama.cpp needs the vocabulary; "
                      f"{CONVERTER_HINT}")
    names = gguf_names(model, arch)
    # a tensor without a llama.cpp name is never left out silently: only what llama.cpp's
    # converter drops (DROPPED) and DeepSeek's multi-token-prediction layers past
    # num_hidden_layers (config_check allows num_nextn_predict_layers of them) may be
    unnamed = [n for n, g in names.items() if g is None and not DROPPED.search(n)
               and not _past_blocks(n, arch.n_blocks)]
    if unnamed:
        raise WorkbenchError(f"{len(unnamed)} tensor(s) have no llama.cpp name in architecture "
                             f"{arch.arch_name} (first: {unnamed[0]}); llama.cpp's converter "
                             "refuses them too; nothing was written", path=str(model.path))
    t = HFTarget(arch, config, model_folder(model), names)
    with _config_values(t.folder / "config.json"):
        t.layout = _layout(model, t)
    if not t.layout:       # never a GGUF of metadata alone
        raise WorkbenchError(f"no tensor of the model is one of architecture {arch.arch_name}'s "
                             "(config.json names an architecture its weights do not hold); "
                             "nothing was written", path=str(model.path))
    return t, None


def _past_blocks(name: str, n_blocks: int) -> bool:
    m = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
    return bool(m and n_blocks and int(m.group(1)) >= n_blocks)


def refuses(model) -> bool:
    """Whether a GGUF export of this non-runnable Hugging Face model is refused rather than
    written as a container llama.cpp cannot run: it is, whenever the folder has a config.json
    (a model with an architecture; writing arch ``quant_workbench`` for it would silently give
    a file llama.cpp refuses). A bare weights file without config.json has no architecture to
    convert: it is written as the workbench's own GGUF container (arch ``quant_workbench``,
    Hugging Face names), which the export reports as not runnable."""
    if model.format == "gguf":
        return False
    return (model_folder(model) / "config.json").is_file()


def _layout(model, t: HFTarget) -> list[OutTensor]:
    """Every output tensor in file order (the source's order; a merged expert tensor where its
    first expert is)."""
    out: list[OutTensor] = []
    groups: dict[str, list] = {}      # merged GGUF name -> [(expert index, HF name)]
    pos: dict[str, int] = {}
    cfg = t.config
    for name, info in model.tensors.items():
        g = t.names.get(name)
        if g is None:
            continue
        shape = tuple(int(s) for s in info.shape) or (1,)
        m = EXPERT.match(name)
        if m is not None:
            if g not in groups:
                groups[g] = []
                pos[g] = len(out)
                out.append(OutTensor(g, (), ()))
            groups[g].append((int(m.group("x")), name))
            continue
        fm = FUSED_EXPERTS.match(name)
        if fm is not None and len(shape) == 3:
            n_e, rows, cols = shape
            # the loader reads a merged expert tensor as (n_e * rows, cols) rows; another
            # 3-D tensor as (n_e, rows * cols): expert e's rows differ between the two
            by_rows = getattr(info, "rows", n_e) == n_e * rows
            if fm.group("w") == "down_proj":
                out.append(OutTensor(g, (name,), shape,
                                     [Part(name, 0, n_e * rows if by_rows else n_e)]))
                continue
            if rows % 2:
                raise WorkbenchError(f"fused gate_up_proj of shape {shape}: odd rows",
                                     tensor=name)
            half = rows // 2
            for k, gname in enumerate((g, g.replace("ffn_gate_exps", "ffn_up_exps"))):
                sub = (k * half, (k + 1) * half)
                parts = [Part(name, e * rows, (e + 1) * rows, None, sub) if by_rows
                         else Part(name, e, e + 1, rows, sub) for e in range(n_e)]
                out.append(OutTensor(gname, (name,), (n_e, half, cols), parts, resplit=True))
            continue
        if t.spec.mla and name.endswith("self_attn.kv_b_proj.weight"):
            out.extend(_mla_split(t, name, g, shape))
            continue
        out.append(OutTensor(g, (name,), transformed_shape(t, name, shape)))
    n_e = _n_experts(cfg)
    for g, members in groups.items():
        members.sort()
        idx = [x for x, _ in members]
        if n_e is None or idx != list(range(n_e)):
            raise WorkbenchError(
                f"the experts of {g} are {idx[:8]}{' ...' if len(idx) > 8 else ''}, config.json "
                f"says {n_e} experts: cannot merge them into llama.cpp's 3-D tensor",
                path=str(t.folder))
        shapes = {tuple(model.info(n).shape) for _, n in members}
        dtypes = {model.info(n).dtype for _, n in members}
        if len(shapes) != 1 or len(dtypes) != 1:
            raise WorkbenchError(f"the experts of {g} differ in shape or dtype "
                                 f"({sorted(shapes)}, {sorted(dtypes)})", path=str(t.folder))
        rows, cols = next(iter(shapes))
        srcs = tuple(n for _, n in members)
        out[pos[g]] = OutTensor(g, srcs, (len(srcs), rows, cols),
                                [Part(n, 0, rows) for n in srcs])
    return out


def _mla_split(t: HFTarget, name: str, g: str, shape: tuple) -> list[OutTensor]:
    """DeepSeek MLA: kv_b_proj (n_head * (nope + v), kv_lora) -> per head attn_k_b (kv_lora x
    nope, i.e. k_b transposed) and attn_v_b (v x kv_lora) (convert_hf_to_gguf DeepseekV2Model:
    "MLA with the absorption optimization"). The head count is the tensor's: transformers'
    DeepSeek attention decompresses to num_attention_heads heads."""
    c = t.config
    nope, v = int(c["qk_nope_head_dim"]), int(c["v_head_dim"])
    rows, lora = shape
    if rows % (nope + v):
        raise WorkbenchError(f"kv_b_proj has {rows} rows, not a multiple of qk_nope_head_dim + "
                             f"v_head_dim = {nope + v}", tensor=name)
    n_head = rows // (nope + v)
    step = nope + v
    k_parts = [Part(name, h * step, h * step + nope, transpose=True) for h in range(n_head)]
    v_parts = [Part(name, h * step + nope, (h + 1) * step) for h in range(n_head)]
    return [OutTensor(g.replace("attn_kv_b", "attn_k_b"), (name,), (n_head, lora, nope), k_parts,
                      resplit=True),
            OutTensor(g.replace("attn_kv_b", "attn_v_b"), (name,), (n_head, v, lora), v_parts,
                      resplit=True)]


def extra_tensors(t: HFTarget) -> list[tuple[str, np.ndarray]]:
    """Tensors the converter computes from config.json (float32): Llama 3's ``rope_freqs``."""
    with _config_values(t.folder / "config.json"):
        return _extra_tensors(t)


def _extra_tensors(t: HFTarget) -> list[tuple[str, np.ndarray]]:
    out = []
    if "llama3_rope" in t.spec.extra:
        r = _rope(t.config)
        if str(r.get("rope_type", "")).lower() == "llama3":
            out.append(("rope_freqs.weight", _llama3_rope_factors(t.config, r)))
    return out


def _llama3_rope_factors(c: dict, r: dict) -> np.ndarray:
    """Llama 3.1's per-frequency rope scaling (the formula in transformers'
    ``_compute_llama3_parameters`` and convert_hf_to_gguf's LlamaModel.generate_extra_tensors),
    as the factors llama.cpp divides each frequency by."""
    import math
    base = float(r.get("rope_theta", c.get("rope_theta", 10000.0)))
    dim = int(_hp(c, "head_dim") or int(c["hidden_size"]) // int(c["num_attention_heads"]))
    factor = float(r.get("factor", 8.0))
    low, high = float(r.get("low_freq_factor", 1.0)), float(r.get("high_freq_factor", 4.0))
    old = float(r.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / float(f)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)
