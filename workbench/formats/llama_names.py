"""Hugging Face architectures and tensor names as llama.cpp knows them.

The name map is the `gguf` package's own (``gguf.get_tensor_name_map``: the table llama.cpp's
``convert_hf_to_gguf.py`` uses), so a name mapped here is the name llama.cpp's converter
would write. The architecture comes from the model folder's ``config.json``
(``architectures[0]``), or from the tensor names when there is no config.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from workbench.core.errors import WorkbenchError

# config.json "architectures" -> gguf MODEL_ARCH member name (the class llama.cpp's
# convert_hf_to_gguf.py registers for it); workbench/export/gguf_arch.py ARCH_SPECS holds what
# each of them needs beyond the name map (hyper-parameters, layout changes, merged experts)
HF_ARCHES = {
    "LlamaForCausalLM": "LLAMA", "LlamaModel": "LLAMA",
    "MistralForCausalLM": "LLAMA", "MistralModel": "LLAMA",
    "MixtralForCausalLM": "LLAMA",
    "Qwen2ForCausalLM": "QWEN2", "Qwen2Model": "QWEN2",
    "Qwen3ForCausalLM": "QWEN3", "Qwen3Model": "QWEN3",
    "Qwen3MoeForCausalLM": "QWEN3MOE",
    "Gemma2ForCausalLM": "GEMMA2",
    "Gemma3ForCausalLM": "GEMMA3",
    "Phi3ForCausalLM": "PHI3",
    "DeepseekV3ForCausalLM": "DEEPSEEK2",
    "GPT2LMHeadModel": "GPT2", "GPT2Model": "GPT2",
    "BertModel": "BERT", "BertForMaskedLM": "BERT", "BertForSequenceClassification": "BERT",
}
SUPPORTED_LABEL = ("Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, Gemma 2, Gemma 3 (text), "
                   "Phi-3, DeepSeek-V3, GPT-2, BERT")
# config.json model_type -> gguf arch, when "architectures" is missing
MODEL_TYPES = {"llama": "LLAMA", "mistral": "LLAMA", "mixtral": "LLAMA", "qwen2": "QWEN2",
               "qwen3": "QWEN3", "qwen3_moe": "QWEN3MOE", "gemma2": "GEMMA2",
               "gemma3_text": "GEMMA3", "phi3": "PHI3", "deepseek_v3": "DEEPSEEK2",
               "gpt2": "GPT2", "bert": "BERT"}
# tensors convert_hf_to_gguf drops (no GGUF tensor)
DROPPED = re.compile(r"(position_ids$|(^|\.)pooler\.|rotary_emb\.inv_freq$|\.attn\.(masked_)?bias$"
                     r"|^cls\.)")
# GPT-2 Conv1D weights are stored (in, out) by Hugging Face and transposed by the converter
CONV1D = re.compile(r"(?:^|\.)h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
# one expert's projection in the Hugging Face checkpoint layout (Qwen-MoE / DeepSeek
# "mlp.experts.N.gate_proj", Mixtral "block_sparse_moe.experts.N.w1"): llama.cpp stores a
# layer's experts of one projection as one 3-D tensor (convert_hf_to_gguf stacks them)
EXPERT = re.compile(r"^(?P<pre>.*?\.(?P<bid>\d+)\.(?:mlp|block_sparse_moe))\.experts\.(?P<x>\d+)\."
                    r"(?P<w>gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
# experts already fused into 3-D tensors (transformers 5's in-memory layout, some checkpoints):
# gate_up_proj (E, 2I, H) is split into llama.cpp's gate and up tensors, down_proj (E, H, I) kept
FUSED_EXPERTS = re.compile(r"^(?P<pre>.*?\.(?P<bid>\d+)\.mlp)\.experts\.(?P<w>gate_up_proj|down_proj)"
                           r"(?:\.weight)?$")


def model_folder(model) -> Path:
    """The folder of the model's config.json and tokenizer files: beside its weights, or the
    companion folder of a GGUF read as a Hugging Face model (Model.folder)."""
    if getattr(model, "folder", None):
        return Path(model.folder)
    p = Path(model.path)
    return p if p.is_dir() else p.parent


def has_config(model) -> bool:
    """Whether a config.json sits in the model's folder (the model can run: calibration,
    methods), False for a file that cannot say."""
    try:
        return (model_folder(model) / "config.json").is_file()
    except Exception:   # noqa: BLE001 - not runnable is the answer
        return False


def read_config(model) -> dict | None:
    """The model folder's config.json (None when absent or not a JSON object)."""
    path = model_folder(model) / "config.json"
    if not path.is_file():
        return None
    from workbench.core.limits import load_sidecar_json
    data = load_sidecar_json(path, "config.json")   # over its size limit: refused, not absent
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Arch:
    gguf_arch: str          # gguf.MODEL_ARCH member name (LLAMA, QWEN2, GPT2, BERT)
    hf_name: str            # what config.json says (or what the names suggest)
    n_blocks: int

    @property
    def arch_name(self) -> str:
        import gguf
        return gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[self.gguf_arch]]


def _n_blocks(names) -> int:
    idx = [int(m.group(1)) for n in names
           for m in [re.search(r"(?:layers|layer|h|blk)\.(\d+)\.", n)] if m]
    return max(idx) + 1 if idx else 0


def _guess_from_names(names) -> str | None:
    names = list(names)
    if any(n.startswith("blk.") or n == "token_embd.weight" for n in names):
        return None  # already llama.cpp names
    if any(".attention.self.query." in n for n in names):
        return "BERT"
    if any(re.search(r"(^|\.)h\.\d+\.attn\.c_attn\.", n) for n in names):
        return "GPT2"
    if any(re.search(r"model\.layers\.\d+\.self_attn\.q_proj\.", n) for n in names):
        # Qwen2 has q/k/v biases, Llama/Mistral do not
        return "QWEN2" if any(n.endswith("self_attn.q_proj.bias") for n in names) else "LLAMA"
    return None


def detect_arch(model, config: dict | None = None) -> Arch | None:
    """The llama.cpp architecture of a Hugging Face model (None: a GGUF with llama.cpp names,
    or names of no known family)."""
    if model.format == "gguf":
        return None
    config = read_config(model) if config is None else config
    hf = None
    if config:
        archs = config.get("architectures")
        if isinstance(archs, list) and archs and isinstance(archs[0], str):
            hf = archs[0]
        # "architectures" names the class (Gemma3TextModel is another llama.cpp architecture
        # than Gemma3ForCausalLM); model_type only when it is missing
        gg = HF_ARCHES.get(hf) if hf is not None else MODEL_TYPES.get(
            str(config.get("model_type", "")))
        if gg is None and (hf is not None or config.get("model_type")):
            return Arch("UNSUPPORTED", hf or str(config.get("model_type")), 0)
    else:
        gg = None
    if gg is None:
        gg = _guess_from_names(model.tensors)
        if gg is None:
            return None
        hf = hf or gg.lower()
    n = config.get("num_hidden_layers", config.get("n_layer")) if config else None
    n = int(n) if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 100_000 \
        else _n_blocks(model.tensors)
    return Arch(gg, hf or gg, n)


def merged_expert_name(name: str) -> str | None:
    """The Hugging Face name of the merged tensor that holds expert projection `name`
    (``model.layers.1.mlp.experts.3.up_proj.weight`` -> ``model.layers.1.mlp.experts.up_proj
    .weight``), None when `name` is not one expert's projection."""
    m = EXPERT.match(name)
    if m is None:
        return None
    return f"{m.group('pre')}.experts.{m.group('w')}.weight"


def _hf_key(name: str, arch: Arch) -> str:
    """The name to look up in the gguf package's map (what convert_hf_to_gguf looks up)."""
    if arch.gguf_arch == "BERT" and name.startswith("bert."):
        return name[len("bert."):]
    if name.endswith("e_score_correction_bias"):     # DeepSeek-V3's router bias
        return name[:-len("_bias")] + ".bias"
    if (merged := merged_expert_name(name)) is not None:
        return merged
    m = FUSED_EXPERTS.match(name)
    if m is not None:   # gate_up_proj: named by its gate half (both halves share the rules)
        w = "gate_proj" if m.group("w") == "gate_up_proj" else "down_proj"
        return f"{m.group('pre')}.experts.{w}.weight"
    return name


def gguf_names(model, arch: Arch | None = None) -> dict[str, str | None]:
    """HF name -> llama.cpp name for every tensor (None: dropped by the converter or unknown).
    A GGUF source maps to itself. The experts of one projection of a layer all map to the one
    merged tensor llama.cpp stores them in (``blk.N.ffn_up_exps.weight``)."""
    if model.format == "gguf":
        return {n: n for n in model.tensors}
    arch = detect_arch(model) if arch is None else arch
    if arch is None or arch.gguf_arch == "UNSUPPORTED":
        return {n: None for n in model.tensors}
    import gguf
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.gguf_arch], max(arch.n_blocks, 1))
    out = {}
    for n in model.tensors:
        if DROPPED.search(n):
            out[n] = None
            continue
        m = re.search(r"(?:^|\.)layers\.(\d+)\.", n)
        if m and arch.n_blocks and int(m.group(1)) >= arch.n_blocks:
            out[n] = None   # multi-token-prediction layers past num_hidden_layers (DeepSeek-V3)
            continue
        out[n] = tmap.get_name(_hf_key(n, arch), try_suffixes=(".weight", ".bias"))
    return out


# Families: the name maps of the llama.cpp exporters, the imatrix and the runner
FAMILY_LABELS = {"llama": "Llama/Mistral/Qwen", "gpt2": "GPT-2", "bert": "BERT",
                 "gguf": "GGUF", "qwen3": "Qwen3", "qwen3moe": "Qwen3-MoE", "gemma2": "Gemma 2",
                 "gemma3": "Gemma 3", "phi3": "Phi-3", "deepseek2": "DeepSeek-V3"}
# family -> the gguf package's architecture whose tensor-name map applies (Llama, Mistral and
# Qwen2 share the names llama.cpp gives their tensors)
FAMILY_ARCH = {"llama": "LLAMA", "gpt2": "GPT2", "bert": "BERT", "qwen3": "QWEN3",
               "qwen3moe": "QWEN3MOE", "gemma2": "GEMMA2", "gemma3": "GEMMA3", "phi3": "PHI3",
               "deepseek2": "DEEPSEEK2"}
ARCH_FAMILY = {"LLAMA": "llama", "QWEN2": "llama", "GPT2": "gpt2", "BERT": "bert",
               "QWEN3": "qwen3", "QWEN3MOE": "qwen3moe", "GEMMA2": "gemma2", "GEMMA3": "gemma3",
               "PHI3": "phi3", "DEEPSEEK2": "deepseek2"}


def detect_family(model) -> str:
    """'gguf', 'llama', 'gpt2' or 'bert' (config.json's architecture, else the tensor names;
    WorkbenchError if none fits)."""
    # llama.cpp names (a GGUF from convert_hf_to_gguf); a GGUF this workbench wrote from a
    # checkpoint without config.json keeps Hugging Face names and is mapped like its source
    if any(n.startswith("blk.") or n in ("token_embd.weight", "output.weight")
           for n in model.tensors):
        return "gguf"
    arch = detect_arch(model) if model.format != "gguf" else None
    if arch is not None and arch.gguf_arch == "UNSUPPORTED":
        raise WorkbenchError(f"architecture {arch.hf_name} has no llama.cpp name map here "
                             f"({SUPPORTED_LABEL}): convert it with llama.cpp's "
                             "convert_hf_to_gguf.py and export from that GGUF", path=model.path)
    guessed = arch.gguf_arch if arch is not None else _guess_from_names(model.tensors)
    if guessed not in ARCH_FAMILY:
        raise WorkbenchError("cannot map this model's tensor names to llama.cpp names (known "
                             "families: Llama/Mistral/Qwen, GPT-2, BERT, or a GGUF source)",
                             path=model.path)
    return ARCH_FAMILY[guessed]


@functools.lru_cache(maxsize=16)
def _name_map(family: str, n_blocks: int):
    import gguf
    return gguf.get_tensor_name_map(gguf.MODEL_ARCH[FAMILY_ARCH[family]], n_blocks)


def _n_blocks_of(names) -> int:
    idx = [int(m.group(1)) for n in names
           for m in [re.search(r"(?:layers|layer|h)\.(\d+)\.", n)] if m]
    return max(idx) + 1 if idx else 1


def llama_cpp_name(name: str, family: str, n_blocks: int | None = None) -> str | None:
    """The GGUF name llama.cpp gives the tensor `name` of a model of `family` (None: unknown),
    from the `gguf` package's tensor-name map (the one convert_hf_to_gguf.py uses)."""
    if family == "gguf":
        return name
    if family == "bert" and name.startswith("bert."):
        name = name[len("bert."):]           # convert_hf_to_gguf strips it too
    name = _hf_key(name, Arch(FAMILY_ARCH[family], "", 0))   # experts: the merged tensor
    n = n_blocks if n_blocks is not None else _n_blocks_of([name])
    # round up so models of similar depth share one (cached) map
    n = max(8, 1 << (max(n, 1) - 1).bit_length())
    return _name_map(family, n).get_name(name, try_suffixes=(".weight", ".bias"))
