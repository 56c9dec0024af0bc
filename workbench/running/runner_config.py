"""What a runnable model is: its folder and config.json, the kind it runs as (encoder or causal
LM), the architecture facts the runner reads from one table, and the device model-level work
runs on.
"""

from __future__ import annotations



from workbench.core.errors import WorkbenchError
from workbench.formats.llama_names import model_folder


# ---- architecture-specific facts: data, in one table -------------------------------------------
ARCH = {
    # model types run as encoders (mean-pooled last hidden state) when config.json names no
    # architecture; otherwise `architectures` decides (a *ForCausalLM / LM-head class: causal LM)
    "encoder_types": {"bert", "roberta", "distilbert", "xlm-roberta", "mpnet", "electra",
                      "deberta", "deberta-v2", "albert", "camembert", "modernbert"},
    # transforms of the head's logits: config attribute -> operation
    "logit_transforms": {"final_logit_softcapping": "softcap",   # gemma2 / gemma3: c·tanh(z/c)
                         "logit_scale": "scale",                   # cohere: z·s
                         "logits_scaling": "divide"},              # granite: z/s
    # GGUF tensor-name family of llama.cpp per model_type (default: llama)
    "gguf_family": {"bert": "bert", "gpt2": "gpt2"},
    # fused expert parameters (transformers 5): param name -> merged GGUF tensor names of its
    # dim-1 parts (gate then up: transformers' Concatenate(dim=1) order)
    "gguf_experts": {"gate_up_proj": ("ffn_gate_exps", "ffn_up_exps"),
                     "down_proj": ("ffn_down_exps",)},
    # GGUF general.architecture values whose q/k projections convert_hf_to_gguf stores with
    # rows permuted for llama.cpp's rope (LlamaModel.permute): undone when the network loads
    "gguf_rope_permuted": {"llama"},
    # module class names whose 2-D weight is read as a Linear (hookable, statistics); and
    # class-name endings of MoE routers (their input: the hidden state of every token)
    "linear_classes": {"Linear", "Conv1D"},
    "router_suffixes": ("router",),
}


ENCODER_TYPES = ARCH["encoder_types"]


def read_config(model) -> dict:
    cfg_path = model_folder(model) / "config.json"
    if not cfg_path.is_file():
        if getattr(model, "format", None) == "gguf":    # the CLI reads it through convert.live
            from workbench.formats.gguf_runnable import unsupported_message
            raise WorkbenchError(unsupported_message(model.metadata), path=str(model.path))
        raise WorkbenchError("not runnable: no config.json beside the weights (weight-only "
                             "features still work)", path=str(model.path))
    from workbench.core.limits import load_sidecar_json
    cfg = load_sidecar_json(cfg_path, "config.json")
    if not isinstance(cfg, dict):
        raise WorkbenchError("not runnable: config.json is not a JSON object", path=str(cfg_path))
    from workbench.formats.config_check import check_config
    check_config(model, cfg, cfg_path)      # against the tensors, before any work
    return cfg


def _import_transformers():
    from workbench.core.optional import require
    return require("transformers", "model")


def model_kind(cfg: dict) -> str:
    """"causal-lm" or "encoder", from `architectures` and transformers' model mappings."""
    transformers = _import_transformers()
    from transformers.models.auto import modeling_auto as ma
    mt = cfg.get("model_type", "")
    if not isinstance(mt, str) or mt not in transformers.CONFIG_MAPPING:
        raise WorkbenchError(f"not runnable: transformers {transformers.__version__} does not know "
                             f"model_type {mt!r}; weight-only features still work")
    causal = set(ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    archs = [a for a in (cfg.get("architectures") or []) if isinstance(a, str)]
    if archs:
        if any(a in causal or a.endswith("ForCausalLM") or a.endswith("LMHeadModel")
               for a in archs):
            return "causal-lm"
        return "encoder"
    if mt in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and mt not in ENCODER_TYPES:
        return "causal-lm"
    if mt in ma.MODEL_MAPPING_NAMES:
        return "encoder"
    raise WorkbenchError(f"not runnable: transformers has no model class for model_type {mt!r}; "
                         "weight-only features still work")


# ---- device ------------------------------------------------------------------------------------
_DEVICE: list = [None]


def set_device(name: str | None) -> str:
    """Select the device model-level work runs on ("cpu", "cuda"; None: cuda when torch sees a
    GPU). A CUDA request without a GPU is a WorkbenchError."""
    import torch
    if name in (None, "", "auto"):
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise WorkbenchError(f"device={name!r}: choose cpu or cuda", params=("device",))
    if name == "cuda" and not torch.cuda.is_available():
        raise WorkbenchError("device='cuda': torch sees no CUDA GPU (torch "
                             f"{torch.__version__}); use device='cpu'", params=("device",))
    _DEVICE[0] = name
    return name


def current_device() -> str:
    if _DEVICE[0] is None:
        set_device(None)
    return _DEVICE[0]
