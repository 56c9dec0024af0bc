"""What makes a GGUF from a Hugging Face folder runnable by llama.cpp: the architecture and its
hyper-parameters (from ``config.json``), llama.cpp tensor names (the `gguf` package's map), the
tensor layout changes llama.cpp's converter makes, and the tokenizer (``tokenizer.json``).

Facts from llama.cpp's ``convert_hf_to_gguf.py`` (llama-cpp-python 0.3.36's vendored copy:
``conversion/base.py`` ``TextModel``, ``llama.py``, ``qwen.py``, ``gemma.py``, ``phi.py``,
``deepseek.py``, ``gpt2.py``, ``bert.py``) and ``src/models/*.cpp``; the code is this project's.
What is architecture-specific is one table, :data:`ARCH_SPECS`: per llama.cpp architecture its
extra hyper-parameters and layout changes:

* Llama/Mistral/Mixtral: q/k rows (and biases) permuted to llama.cpp's rope layout;
  ``rope_freqs`` for Llama 3's rope scaling.
* Gemma 2/3: RMSNorm weights stored as ``1 + w`` (Hugging Face adds the 1 at run time);
  queries scaled when ``query_pre_attn_scalar`` is not the scale llama.cpp fixes; Gemma 3's
  per-layer sliding pattern written when it is not llama.cpp's every-6th-global.
* SentencePiece-style BPE tokenizers (Gemma, Llama 2, Mistral: byte fallback, spaces as
  U+2581) written as llama.cpp's ``llama`` tokenizer (tokens, scores, types), not as BPE.
* GPT-2: Conv1D weights transposed.
* DeepSeek-V3 (llama.cpp ``deepseek2``, MLA): ``kv_b_proj`` split per head into ``attn_k_b``
  (transposed) and ``attn_v_b``; the router's ``e_score_correction_bias`` is ``exp_probs_b``.
* Mixtures of experts: every layer's experts of one projection stacked into one 3-D tensor
  ``blk.N.ffn_{gate,up,down}_exps.weight`` (numpy shape (n_expert, rows, cols)), streamed one
  expert at a time; routers (``ffn_gate_inp``) stay float (runtimes.py: llama.cpp never
  re-types them); shared experts ``*_shexp``.

Other architectures are refused (see :data:`CONVERTER_HINT`).
"""

from __future__ import annotations

import re
import struct
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.formats.llama_names import CONV1D, DROPPED, EXPERT, FUSED_EXPERTS, SUPPORTED_LABEL, Arch, \
    detect_arch, gguf_names, model_folder, read_config

CONVERTER_HINT = ("the way through: convert the folder with llama.cpp's convert_hf_to_gguf.py "
                  "(python convert_hf_to_gguf.py FOLDER --outtype f16 --outfile MODEL-f16.gguf), "
                  "open that GGUF here and re-type it with a plan (`quant-workbench export "
                  "MODEL-f16.gguf --plan PLAN.json --format gguf -o OUT.gguf`): the GGUF->GGUF "
                  "path keeps llama.cpp's own names and metadata, for every architecture "
                  "llama.cpp has")
# Llama/Mistral q/k projections (weights and biases) convert_hf_to_gguf permutes for the rope
_ROPE_PERMUTED = re.compile(r"self_attn\.(q|k)_proj\.(weight|bias)$")
# the pre-tokenizer llama.cpp applies, from tokenizer.json's split regex (llama.cpp's
# convert_hf_to_gguf identifies it by a hash of known tokenizers' outputs; the regex is what
# differs between them). A byte-level pre-tokenizer with its built-in regex is GPT-2's.
_PRE_BY_REGEX = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": "gpt-2",
}


@dataclass(frozen=True)
class ArchSpec:
    """What one llama.cpp architecture needs beyond the gguf package's name map."""
    permute_qk: bool = False      # Llama-family rope layout (LlamaModel.permute)
    norm_plus_one: bool = False   # Gemma: RMSNorm weight stored as 1 + w
    rope_dim: bool = False        # write rope.dimension_count = head_dim (and vocab_size)
    mla: bool = False             # DeepSeek multi-head latent attention
    extra: tuple = ()             # names of extra hyper-parameter writers below


ARCH_SPECS: dict[str, ArchSpec] = {
    "LLAMA": ArchSpec(permute_qk=True, rope_dim=True, extra=("llama3_rope",)),
    "QWEN2": ArchSpec(),
    "QWEN3": ArchSpec(),
    "QWEN3MOE": ArchSpec(extra=("expert_ff",)),
    "GEMMA2": ArchSpec(norm_plus_one=True, extra=("gemma2",)),
    "GEMMA3": ArchSpec(norm_plus_one=True, extra=("gemma3",)),
    "PHI3": ArchSpec(extra=("phi3",)),
    "DEEPSEEK2": ArchSpec(mla=True, extra=("deepseek2",)),
    "GPT2": ArchSpec(),
    "BERT": ArchSpec(extra=("bert",)),
}


@dataclass
class Part:
    """Rows of one source tensor that make up part of an output tensor, in order: rows r0:r1 of
    the source's (rows x cols) matrix, reshaped to `reshape_rows` rows, rows `sub` of that, and
    transposed when `transpose`. The output's bytes are its parts' bytes one after the other."""
    src: str
    r0: int
    r1: int
    reshape_rows: int | None = None
    sub: tuple | None = None
    transpose: bool = False


@dataclass
class OutTensor:
    """One tensor of the runnable GGUF: the source tensor(s) it comes from and its shape."""
    out: str
    sources: tuple           # Hugging Face names (the experts of a merged tensor, in order)
    shape: tuple             # numpy order, as written
    parts: list | None = None    # None: the whole source (through `transform`)
    resplit: bool = False    # rows differ from the source's: the plan is decided again

    @property
    def matrix_shape(self) -> tuple:
        return (int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1, int(self.shape[-1]))


@dataclass
class HFTarget:
    """A runnable GGUF layout for a Hugging Face model."""
    arch: Arch
    config: dict
    folder: Path
    names: dict          # HF name -> llama.cpp name (None: dropped)
    layout: list = field(default_factory=list)   # OutTensor in file order
    tokens: list = field(default_factory=list)   # the vocabulary written (write_tokenizer)

    @property
    def arch_name(self) -> str:
        return self.arch.arch_name

    @property
    def spec(self) -> ArchSpec:
        return ARCH_SPECS[self.arch.gguf_arch]


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


@contextmanager
def _config_values(path: Path, what: str = "config.json"):
    """A value the writer reads from config.json / tokenizer.json that config_check does not
    type (a missing or malformed key the architecture needs) as one line naming the file, not
    a traceback."""
    try:
        yield
    except KeyError as exc:
        raise WorkbenchError(f"{what} lacks the key {exc.args[0]!r} the GGUF writer needs; "
                             "nothing was written", path=str(path)) from None
    except (TypeError, ValueError, OverflowError, ArithmeticError, AttributeError,
            struct.error) as exc:
        raise WorkbenchError(f"{what} holds a value the GGUF writer cannot use "
                             f"({type(exc).__name__}: {str(exc)[:200]}); nothing was written",
                             path=str(path)) from None


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


def _hp(config: dict, *keys, default=None):
    for k in keys:
        v = config.get(k)
        if v is not None and not isinstance(v, bool):
            return v
    return default


def _rope(config: dict) -> dict:
    """The rope parameters of full attention (transformers 5 ``rope_parameters``, possibly per
    layer type; older configs: ``rope_scaling`` plus ``rope_theta``)."""
    r = config.get("rope_parameters")
    if not isinstance(r, dict):
        r = config.get("rope_scaling") if isinstance(config.get("rope_scaling"), dict) else {}
        r = dict(r)
        if "rope_theta" in config:
            r.setdefault("rope_theta", config["rope_theta"])
        if "type" in r:
            r.setdefault("rope_type", r["type"])
    if isinstance(r.get("full_attention"), dict):
        return r["full_attention"]
    return r


# ---- layout: the output tensors ----------------------------------------------------------
def _n_experts(config: dict) -> int | None:
    n = _hp(config, "num_local_experts", "num_experts", "n_routed_experts")
    return int(n) if n is not None else None


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


# ---- hyper-parameters --------------------------------------------------------------------
def write_hparams(writer, t: HFTarget) -> None:
    """The keys convert_hf_to_gguf writes (TextModel.set_gguf_parameters, then the
    architecture's own)."""
    with _config_values(t.folder / "config.json"):
        _write_hparams(writer, t)


def _write_hparams(writer, t: HFTarget) -> None:
    import gguf
    c, a = t.config, t.arch.gguf_arch
    writer.add_block_count(t.arch.n_blocks)
    if (n := _hp(c, "max_position_embeddings", "n_ctx", "n_positions")) is not None:
        writer.add_context_length(int(n))
    n_embd = _hp(c, "hidden_size", "n_embd")
    if n_embd is not None:
        writer.add_embedding_length(int(n_embd))
    n_ff = _hp(c, "intermediate_size", "n_inner")
    if n_ff is None and a == "GPT2" and n_embd is not None:
        n_ff = 4 * int(n_embd)
    if n_ff is not None:
        writer.add_feed_forward_length(int(n_ff))
    n_head = _hp(c, "num_attention_heads", "n_head")
    if n_head is not None:
        writer.add_head_count(int(n_head))
    n_kv = 1 if t.spec.mla else _hp(c, "num_key_value_heads")   # MLA runs as MQA
    if n_kv is not None:
        writer.add_head_count_kv(int(n_kv))
    rope = _rope(c)
    rtype = str(rope.get("rope_type") or "default").lower()
    if rtype == "linear" and rope.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif rtype == "yarn" and rope.get("factor") is not None:
        if rope.get("original_max_position_embeddings") is None:
            raise WorkbenchError("yarn rope scaling without original_max_position_embeddings "
                                 "(the context length llama.cpp scales from); nothing was "
                                 "written", path=str(t.folder / "config.json"))
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rope["factor"]))
        writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
        for key, add in (("extrapolation_factor", writer.add_rope_scaling_yarn_ext_factor),
                         ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", writer.add_rope_scaling_yarn_beta_slow)):
            if rope.get(key) is not None:
                add(float(rope[key]))
        af = rope.get("attention_factor", rope.get("attn_factor"))
        if af is not None:
            writer.add_rope_scaling_yarn_attn_factor(float(af))
    elif rtype not in ("default", "llama3") and not (a == "PHI3" and rtype == "longrope"):
        raise WorkbenchError(f"rope type {rtype!r} is not one this exporter writes; "
                             f"{CONVERTER_HINT}", path=str(t.folder / "config.json"))
    if (theta := _hp(rope, "rope_theta") or _hp(c, "rope_theta")) is not None:
        writer.add_rope_freq_base(float(theta))
    rp = c.get("rope_parameters")
    if isinstance(rp, dict) and isinstance(rp.get("sliding_attention"), dict) and \
            rp["sliding_attention"].get("rope_theta") is not None:
        writer.add_rope_freq_base_swa(float(rp["sliding_attention"]["rope_theta"]))
    elif (local := _hp(c, "local_rope_theta", "rope_local_theta", "rope_theta_local",
                       "swa_rope_theta", "rope_local_base_freq")) is not None:
        # older configs (transformers 4: Gemma 3's rope_local_base_freq), as the converter
        writer.add_rope_freq_base_swa(float(local))
    if (eps := _hp(c, "rms_norm_eps")) is not None:
        writer.add_layer_norm_rms_eps(float(eps))
    if (eps := _hp(c, "layer_norm_eps", "layer_norm_epsilon")) is not None:
        writer.add_layer_norm_eps(float(eps))
    if (n_e := _n_experts(c)) is not None:
        writer.add_expert_count(n_e)
    if (n_used := _hp(c, "num_experts_per_tok", "num_experts_per_token")) is not None:
        writer.add_expert_used_count(int(n_used))
    if (g := _hp(c, "n_group")) is not None:
        writer.add_expert_group_count(int(g))
    if (g := _hp(c, "topk_group")) is not None:
        writer.add_expert_group_used_count(int(g))
    if (head_dim := _hp(c, "head_dim")) is not None and not t.spec.mla:
        writer.add_key_length(int(head_dim))
        writer.add_value_length(int(head_dim))
    if t.spec.rope_dim and n_embd and n_head:
        writer.add_vocab_size(int(_hp(c, "vocab_size", default=0)))
        writer.add_rope_dimension_count(int(_hp(c, "head_dim") or int(n_embd) // int(n_head)))
    for name in t.spec.extra:
        _EXTRA_HPARAMS.get(name, lambda w, t: None)(writer, t)


def _hp_expert_ff(writer, t: HFTarget) -> None:
    if (n := _hp(t.config, "moe_intermediate_size")) is not None:
        writer.add_expert_feed_forward_length(int(n))
    if (n := _hp(t.config, "shared_expert_intermediate_size")) is not None:
        writer.add_expert_shared_feed_forward_length(int(n))


def _hp_gemma2(writer, t: HFTarget) -> None:
    c = t.config
    for key, add in (("attn_logit_softcapping", writer.add_attn_logit_softcapping),
                     ("final_logit_softcapping", writer.add_final_logit_softcapping)):
        if c.get(key) is not None:
            add(float(c[key]))
    if c.get("sliding_window") is not None:
        writer.add_sliding_window(int(c["sliding_window"]))


def _hp_gemma3(writer, t: HFTarget) -> None:
    """Gemma 3's keys beyond the common ones: final logit softcapping, the sliding window and
    which layers use it. llama.cpp's gemma3 makes every 6th layer global unless the file
    carries ``attention.sliding_window_pattern`` as one bool per layer (load_swa_pattern reads
    that array first): it is written when config.json's ``layer_types`` (or, in older configs,
    ``sliding_window_pattern``) differ from every-6th, so any pattern runs as in transformers.
    No sliding window is written when no layer slides (llama.cpp then runs none)."""
    c = t.config
    if c.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(float(c["final_logit_softcapping"]))
    if c.get("attn_logit_softcapping"):
        raise WorkbenchError("Gemma 3 with attention logit softcapping: llama.cpp's gemma3 has "
                             f"none; {CONVERTER_HINT}", path=str(t.folder / "config.json"))
    n = t.arch.n_blocks
    types = c.get("layer_types")
    if not (isinstance(types, list) and len(types) == n):
        pattern = c.get("sliding_window_pattern", c.get("_sliding_window_pattern")) or 6
        types = ["sliding_attention" if (i + 1) % int(pattern) else "full_attention"
                 for i in range(n)]
    unknown = sorted({x for x in types} - {"sliding_attention", "full_attention"})
    if unknown:
        raise WorkbenchError(f"Gemma 3 layer types {unknown} are not sliding or full attention; "
                             f"{CONVERTER_HINT}", path=str(t.folder / "config.json"))
    sliding = [x == "sliding_attention" for x in types]
    if c.get("sliding_window") is None or not any(sliding):
        return
    writer.add_sliding_window(int(c["sliding_window"]))
    if sliding != [(i + 1) % 6 != 0 for i in range(n)]:
        writer.add_sliding_window_pattern(sliding)


def _hp_phi3(writer, t: HFTarget) -> None:
    c = t.config
    rope = _rope(c)
    orig = rope.get("original_max_position_embeddings", c.get("original_max_position_embeddings"))
    if orig is not None:
        writer.add_rope_scaling_orig_ctx_len(int(orig))
    if rope.get("long_factor") or rope.get("short_factor"):
        raise WorkbenchError("Phi-3 long-context rope factors (longrope) are not written by this "
                             f"exporter; {CONVERTER_HINT}", path=str(t.folder / "config.json"))
    n_embd, n_head = int(c["hidden_size"]), int(c["num_attention_heads"])
    partial = float(rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
    writer.add_rope_dimension_count(int(partial * n_embd) // n_head)
    writer.add_sliding_window(int(c.get("sliding_window") or 0))


def _hp_deepseek2(writer, t: HFTarget) -> None:
    import gguf
    c = t.config
    if c.get("rope_interleave") is False:
        raise WorkbenchError("DeepSeek with rope_interleave false: llama.cpp's deepseek2 "
                             f"applies interleaved rope; {CONVERTER_HINT}",
                             path=str(t.folder / "config.json"))
    has_moe = c.get("n_routed_experts") is not None
    lead = c.get("first_k_dense_replace")
    if lead is None:
        lead = 0 if has_moe else int(c["num_hidden_layers"])
    writer.add_leading_dense_block_count(int(lead))
    writer.add_vocab_size(int(c["vocab_size"]))
    if c.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(int(c["q_lora_rank"]))
    kv_lora, rope_dim = int(c.get("kv_lora_rank", 512)), int(c["qk_rope_head_dim"])
    writer.add_kv_lora_rank(kv_lora)
    writer.add_key_length(kv_lora + rope_dim)
    writer.add_value_length(kv_lora)
    writer.add_key_length_mla(int(c["qk_nope_head_dim"]) + rope_dim)
    writer.add_value_length_mla(int(c["v_head_dim"]))
    writer.add_expert_feed_forward_length(int(_hp(c, "moe_intermediate_size",
                                                  "intermediate_size")))
    writer.add_expert_shared_count(int(c.get("n_shared_experts") or 0))
    if c.get("routed_scaling_factor") is not None:
        writer.add_expert_weights_scale(float(c["routed_scaling_factor"]))
    if c.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    # transformers' DeepseekV3 router always scores with a sigmoid (official configs say
    # scoring_func "sigmoid"); llama.cpp defaults to softmax when the key is absent
    func = c.get("scoring_func", "sigmoid")
    if func not in ("sigmoid", "softmax"):
        raise WorkbenchError(f"DeepSeek scoring_func {func!r} is not sigmoid or softmax",
                             path=str(t.folder / "config.json"))
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if func == "sigmoid"
                                  else gguf.ExpertGatingFuncType.SOFTMAX)
    writer.add_rope_dimension_count(rope_dim)
    r = _rope(c)
    if r.get("mscale_all_dim") is not None:
        # convert_hf_to_gguf writes 0.1 * mscale_all_dim; llama.cpp divides it back by 0.1
        writer.add_rope_scaling_yarn_log_mul(0.1 * float(r["mscale_all_dim"]))


def _hp_bert(writer, t: HFTarget) -> None:
    writer.add_causal_attention(False)
    pooling = _pooling_type(t.folder)
    if pooling is not None:
        writer.add_pooling_type(pooling)


_EXTRA_HPARAMS = {"expert_ff": _hp_expert_ff, "gemma2": _hp_gemma2, "gemma3": _hp_gemma3,
                  "phi3": _hp_phi3, "deepseek2": _hp_deepseek2, "bert": _hp_bert}


def _pooling_type(folder: Path):
    """sentence-transformers' pooling (modules.json -> 1_Pooling/config.json), as convert does."""
    import gguf
    path = folder / "1_Pooling" / "config.json"
    if not path.is_file():
        return None
    from workbench.core.limits import load_sidecar_json
    cfg = load_sidecar_json(path, "1_Pooling/config.json")   # (errors name it)
    if not isinstance(cfg, dict):
        return None
    if cfg.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if cfg.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    if cfg.get("pooling_mode_lasttoken"):
        return gguf.PoolingType.LAST
    return None


def _check_vocab_sidecars(folder: Path) -> None:
    """The files the `gguf` package's SpecialVocab reads beside tokenizer.json (already read
    by _tokenizer_json), within their size limits and, for JSON, depth (its plain json.load
    of a 1,000-deep tokenizer_config.json was a RecursionError): errors name the file."""
    from workbench.core.limits import check_sidecar, load_sidecar_json
    for name in ("tokenizer_config.json", "config.json", "chat_template.json"):
        if (folder / name).is_file():
            load_sidecar_json(folder / name, name)
    for name in ("merges.txt", "chat_template.jinja"):
        if (folder / name).is_file():
            check_sidecar(folder / name, name)
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for f in sorted(extra.glob("*.jinja"))[:1000]:
            check_sidecar(f, f"additional_chat_templates/{f.name}")


def _tokenizer_json(folder: Path) -> dict:
    path = folder / "tokenizer.json"
    from workbench.core.limits import load_sidecar_json
    data = load_sidecar_json(path, "tokenizer.json")   # size, depth, duplicates: errors name it
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise WorkbenchError("not a Hugging Face tokenizer.json", path=str(path))
    return data


def write_tokenizer(writer, t: HFTarget) -> int:
    """Vocabulary, token types, merges and special token ids. Returns the vocabulary size."""
    import gguf
    tok = _tokenizer_json(t.folder)
    model = tok["model"]
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise WorkbenchError(f"tokenizer model {model.get('type')} is not supported "
                             f"(WordPiece or BPE vocabularies); {CONVERTER_HINT}",
                             path=str(t.folder / "tokenizer.json"))
    id_to_tok, added, n_vocab = _token_ids(t, tok, vocab)
    with _config_values(t.folder / "tokenizer.json", "tokenizer.json"):
        return _write_vocab(writer, t, tok, model, id_to_tok, added, n_vocab)


def _token_ids(t: HFTarget, tok: dict, vocab: dict) -> tuple[dict, dict, int]:
    """(id -> token, added tokens, the vocabulary size written): every id an integer below the
    model's vocabulary size (config.json's vocab_size, which config_check holds to the
    embedding's rows; convert_hf_to_gguf asserts the same): a hostile id (10^12) never sizes
    the vocabulary written."""
    path = t.folder / "tokenizer.json"
    limit = _hp(t.config, "vocab_size")
    if limit is None:
        limit = next((o.shape[0] for o in t.layout if o.out == "token_embd.weight"), None)
    raw_added = tok.get("added_tokens", [])
    if not isinstance(raw_added, list):
        raise WorkbenchError("added_tokens is not a list", path=str(path))
    known = limit is not None
    if limit is None:
        limit = len(vocab) + len(raw_added)
    where = "vocab_size in config.json" if _hp(t.config, "vocab_size") is not None else \
        "the embedding's rows"

    def check_id(i, what: str) -> int:
        if isinstance(i, bool) or not isinstance(i, int):
            raise WorkbenchError(f"{what}: id {str(i)[:40]!r} is not an integer", path=str(path))
        if not 0 <= i < limit:
            raise WorkbenchError(f"{what}: id {i:,} is outside the model's vocabulary "
                                 f"(0..{limit - 1:,}, {where}); llama.cpp could not load it; "
                                 "nothing was written", path=str(path))
        return i

    id_to_tok = {check_id(i, f"token {s[:40]!r}"): s for s, i in vocab.items()}
    added = {}
    for a in raw_added:
        if not (isinstance(a, dict) and "content" in a and "id" in a):
            continue
        if not isinstance(a["content"], str):
            raise WorkbenchError(f"an added token's content is {str(a['content'])[:40]!r}, not a "
                                 "string", path=str(path))
        added[a["content"]] = a
        id_to_tok[check_id(a["id"], f"added token {a['content'][:40]!r}")] = a["content"]
    if not id_to_tok:
        raise WorkbenchError("the vocabulary is empty", path=str(path))
    return id_to_tok, added, (limit if known else max(id_to_tok) + 1)


def _write_vocab(writer, t: HFTarget, tok: dict, model: dict, id_to_tok: dict, added: dict,
                 n_vocab: int) -> int:
    import gguf
    if model.get("type") == "BPE" and (space_prefix := _spm_style(tok)) is not None:
        return _write_spm(writer, t, tok, id_to_tok, added, n_vocab, space_prefix)
    tokens, types = [], []
    wpm = model.get("type") == "WordPiece"
    for i in range(n_vocab):
        s = id_to_tok.get(i)
        if s is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        if s in added:
            kind = gguf.TokenType.CONTROL if added[s].get("special") else \
                gguf.TokenType.USER_DEFINED
        else:
            kind = gguf.TokenType.NORMAL
        if wpm and kind != gguf.TokenType.CONTROL:
            # llama.cpp's WPM tokenizer: word-initial pieces carry U+2581, "##" pieces do not
            s = s[2:] if s.startswith("##") else "\u2581" + s
        tokens.append(s)
        types.append(kind)
    _check_vocab_sidecars(t.folder)   # gguf.SpecialVocab reads them with plain json.load
    if wpm:
        writer.add_tokenizer_model("bert")
        writer.add_tokenizer_pre("default")
        writer.add_token_type_count(int(_hp(t.config, "type_vocab_size", default=1)))
        special = gguf.SpecialVocab(t.folder, n_vocab=len(tokens))
    elif model.get("type") == "BPE":
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(_bpe_pre(tok, t))
        special = gguf.SpecialVocab(t.folder, load_merges=True, n_vocab=len(tokens))
        if not special.merges:
            raise WorkbenchError("BPE tokenizer without merges", path=str(t.folder / "tokenizer.json"))
    else:
        raise WorkbenchError(f"tokenizer model {model.get('type')} is not supported "
                             f"(WordPiece or BPE); {CONVERTER_HINT}",
                             path=str(t.folder / "tokenizer.json"))
    t.tokens = tokens
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special.add_to_gguf(writer, quiet=True)
    return len(tokens)


def _spm_style(tok: dict) -> bool | None:
    """Whether this BPE tokenizer.json is a SentencePiece model in disguise (Gemma, Llama 2,
    Mistral: transformers' conversion of a SentencePiece BPE model): byte fallback, spaces
    written as U+2581 by the normalizer (Replace, optionally after Prepend) or by a Metaspace
    pre-tokenizer that does not split, and no other pre-tokenizer. Returns whether a U+2581 is
    put in front of the text (llama.cpp's add_space_prefix), or None when it is not such a
    tokenizer (then it is a byte-level BPE: GPT-2, Llama 3, Qwen)."""
    m = tok["model"]
    if not m.get("byte_fallback") or m.get("ignore_merges"):
        return None
    norm, pre = tok.get("normalizer"), tok.get("pre_tokenizer")
    norms = norm.get("normalizers", []) if isinstance(norm, dict) and \
        norm.get("type") == "Sequence" else ([norm] if norm else [])
    pres = pre.get("pretokenizers", []) if isinstance(pre, dict) and \
        pre.get("type") == "Sequence" else ([pre] if pre else [])
    prefix, spaces = False, False
    for n in norms:
        kind = n.get("type") if isinstance(n, dict) else None
        if kind == "Prepend" and n.get("prepend") == "\u2581" and not spaces:
            prefix = True
        elif kind == "Replace" and n.get("pattern") == {"String": " "} and \
                n.get("content") == "\u2581":
            spaces = True
        else:
            return None
    for p in pres:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "Metaspace" and p.get("replacement", "\u2581") == "\u2581" and \
                not p.get("split", True) and not spaces:
            spaces = True
            prefix = p.get("prepend_scheme", "always") in ("always", "first") or \
                bool(p.get("add_prefix_space"))
        elif kind == "Split" and p.get("pattern") == {"String": " "} and spaces and \
                p.get("behavior") == "MergedWithPrevious" and not p.get("invert"):
            pass    # after the normalizer's Replace there is no space left to split on
        else:
            return None
    return prefix if spaces else None


def _write_spm(writer, t: HFTarget, tok: dict, id_to_tok: dict, added: dict, n_vocab: int,
               space_prefix: bool) -> int:
    """A SentencePiece-style BPE tokenizer.json as llama.cpp's ``llama`` tokenizer (what
    convert_hf_to_gguf writes for Gemma, Llama 2, Mistral from tokenizer.model): tokens,
    scores and token types, no merges. llama.cpp merges the adjacent pair whose joined text is
    the highest-scored token, so a token's score is minus the rank of the first merge that
    makes it (tokens no merge makes score below every merge, in id order). Types: added tokens
    marked special are CONTROL, other added tokens USER_DEFINED with U+2581 written as a space
    (llama.cpp matches them in the raw text), ``<0xNN>`` BYTE; score -1000 for added tokens and
    0 for bytes, as the converter writes them; ids without a token UNUSED ``[PADn]``."""
    import gguf
    rank: dict[str, int] = {}
    for r, pair in enumerate(tok["model"].get("merges") or []):
        a, b = pair.split(" ", 1) if isinstance(pair, str) else pair
        rank.setdefault(a + b, r)
    n_merges = len(rank) and max(rank.values()) + 1
    byte = re.compile(r"<0x[0-9A-F]{2}>$")
    tokens, scores, types = [], [], []
    for i in range(n_vocab):
        s = id_to_tok.get(i)
        if s is None:
            tokens.append(f"[PAD{i}]")
            scores.append(-10000.0)
            types.append(gguf.TokenType.UNUSED)
        elif s in added:
            special = bool(added[s].get("special"))
            tokens.append(s if special else s.replace("\u2581", " "))
            scores.append(-1000.0)
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        elif byte.match(s):
            tokens.append(s)
            scores.append(0.0)
            types.append(gguf.TokenType.BYTE)
        else:
            tokens.append(s)
            scores.append(-float(rank[s]) if s in rank else -float(n_merges + i))
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix(space_prefix)
    t.tokens = tokens
    special = gguf.SpecialVocab(t.folder, n_vocab=len(tokens))
    special.add_special_token.setdefault("eos", False)   # as transformers: no eos appended
    special.add_to_gguf(writer, quiet=True)
    return len(tokens)


def name_breaks_loading(name: str, t: HFTarget) -> str | None:
    """Why writing `name` as general.name would make llama.cpp refuse the file (None: it
    would not). llama.cpp's vocabulary loader (src/llama-vocab.cpp) gives a model whose name
    contains "phi-3" or "phi3" special attributes on the tokens </s>, <unk>, <s> and
    <|endoftext|>, looking each up with unordered_map::at: a vocabulary without one of them
    fails to load ("error loading model vocabulary: unordered_map::at")."""
    low = name.lower()
    if "phi-3" in low or "phi3" in low:
        missing = [s for s in ("</s>", "<unk>", "<s>", "<|endoftext|>") if s not in t.tokens]
        if missing:
            return (f"general.name {name!r} not written: llama.cpp's Phi-3 vocabulary rule for "
                    f"such names needs the tokens {', '.join(missing)}, which this tokenizer "
                    "lacks (the file would not load)")
    return None


def _bpe_pre(tok: dict, t: HFTarget) -> str:
    """llama.cpp's pre-tokenizer name for a byte-level BPE tokenizer.json: from its split regex
    (_PRE_BY_REGEX); a ByteLevel pre-tokenizer with its own regex is GPT-2's. Unknown regexes
    are refused: another pre-tokenizer would cut the text differently from transformers."""
    pre = tok.get("pre_tokenizer")
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) and \
        pre.get("type") == "Sequence" else [pre]
    for st in steps:
        if not isinstance(st, dict):
            continue
        if st.get("type") == "Split":
            pat = st.get("pattern", {})
            rx = pat.get("Regex") if isinstance(pat, dict) else None
            if rx in _PRE_BY_REGEX:
                return _PRE_BY_REGEX[rx]
            raise WorkbenchError(
                "the tokenizer's pre-tokenizer regex is not one this exporter knows "
                f"(GPT-2, Llama 3, Qwen2); {CONVERTER_HINT}", path=str(t.folder / "tokenizer.json"))
        if st.get("type") == "ByteLevel" and st.get("use_regex", True):
            return "gpt-2"
    raise WorkbenchError(f"the tokenizer has no pre-tokenizer this exporter knows; "
                         f"{CONVERTER_HINT}", path=str(t.folder / "tokenizer.json"))


def _norm_plus_one(t: HFTarget, hf_name: str) -> bool:
    return t.spec.norm_plus_one and hf_name.endswith("norm.weight")


# the tensor that carries a Gemma query scale llama.cpp cannot be told (see _query_scale)
_QUERY_SCALED = {"GEMMA3": re.compile(r"self_attn\.q_norm\.weight$"),
                 "GEMMA2": re.compile(r"self_attn\.q_proj\.(weight|bias)$")}
# llama.cpp's "27B" Gemma (by block count) scales queries by 1/sqrt(n_embd / n_head)
_GEMMA_27B_BLOCKS = {"GEMMA2": 46, "GEMMA3": 62}


def _query_scale(t: HFTarget) -> float | None:
    """The factor folded into Gemma's queries so that llama.cpp's attention scale equals
    transformers' (None: they already agree). transformers scales q.k by
    query_pre_attn_scalar^-1/2; llama.cpp's gemma2/gemma3 fix it at head_dim^-1/2 (n_embd /
    n_head for the block counts it takes for 27B) and read no key for it. A config whose
    query_pre_attn_scalar differs (e.g. a generated one) would otherwise run a different
    network at every length: the queries are multiplied by sqrt(llama's / transformers'),
    in Gemma 3's q_norm weight (applied before the rope, which is linear) or Gemma 2's q_proj
    (it has no q_norm); exact up to rounding."""
    a = t.arch.gguf_arch
    if a not in _QUERY_SCALED:
        return None
    c = t.config
    qpas = float(_hp(c, "query_pre_attn_scalar", default=256))
    n_embd, n_head = int(c["hidden_size"]), int(c["num_attention_heads"])
    head_dim = int(_hp(c, "head_dim") or n_embd // n_head)
    ours = n_embd // n_head if t.arch.n_blocks == _GEMMA_27B_BLOCKS[a] else head_dim
    if qpas <= 0 or float(ours) == qpas:
        return None
    return float(np.sqrt(ours / qpas))


def _query_scaled(t: HFTarget, hf_name: str) -> bool:
    rx = _QUERY_SCALED.get(t.arch.gguf_arch)
    return rx is not None and bool(rx.search(hf_name)) and _query_scale(t) is not None


def transform(t: HFTarget, hf_name: str, w: np.ndarray) -> np.ndarray | None:
    """The layout llama.cpp expects for this tensor (None: unchanged).

    * Llama/Mistral q_proj/k_proj rows (weights and biases) are permuted from Hugging Face's rotate-half rope layout
      to llama.cpp's interleaved one (convert_hf_to_gguf ``LlamaModel.permute``).
    * Gemma RMSNorm weights w are stored as 1 + w (Hugging Face's Gemma norms multiply by
      1 + w; llama.cpp's by the stored weight), in float32.
    * Gemma queries scaled when query_pre_attn_scalar is not llama.cpp's (_query_scale).
    * GPT-2 Conv1D weights are stored (in, out) and transposed."""
    a = t.arch.gguf_arch
    if a == "GPT2" and CONV1D.search(hf_name) and w.ndim == 2:
        return np.ascontiguousarray(w.T)
    if _norm_plus_one(t, hf_name):
        w = np.asarray(w, np.float32) + np.float32(1.0)
        return w * np.float32(_query_scale(t)) if _query_scaled(t, hf_name) else w
    if _query_scaled(t, hf_name):
        return (np.asarray(w, np.float32) * np.float32(_query_scale(t))).astype(w.dtype)
    if t.spec.permute_qk and _ROPE_PERMUTED.search(hf_name):
        n_head = int(_hp(t.config, "num_attention_heads"))
        if ".k_proj." in hf_name:
            n_head = int(_hp(t.config, "num_key_value_heads", default=n_head))
        rows = w.shape[0]
        return np.ascontiguousarray(
            w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
    return None


def transformed_shape(t: HFTarget, hf_name: str, shape: tuple) -> tuple:
    if t.arch.gguf_arch == "GPT2" and CONV1D.search(hf_name) and len(shape) == 2:
        return (shape[1], shape[0])
    return shape


def needs_transform(t: HFTarget, hf_name: str) -> bool:
    a = t.arch.gguf_arch
    return (a == "GPT2" and bool(CONV1D.search(hf_name))) or _norm_plus_one(t, hf_name) or (
        t.spec.permute_qk and bool(_ROPE_PERMUTED.search(hf_name))) or _query_scaled(t, hf_name)
