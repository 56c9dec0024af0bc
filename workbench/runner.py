"""A runnable model through `transformers` (optional extra `.[model]`), run one block at a time.

The network is built from the folder's ``config.json`` with transformers' Auto classes
(``AutoConfig.for_model`` + ``AutoModelForCausalLM`` / ``AutoModel``, chosen from the config's
``architectures`` and transformers' model mappings: nothing downloaded, no code from the folder
executed) as a skeleton whose parameters live on the ``meta`` device (no memory). Weights come
from the workbench's own loaders (memory-mapped; GGUF dequantized) one block at a time:

1. the embeddings are materialized and every calibration batch runs up to the first block; the
   arguments each block receives (hidden states, masks, rotary position embeddings, …) are
   captured for every block, so per-layer masks (sliding-window layers) come out right;
2. per block: its weights are materialized (dequantized under a plan where asked), the cached
   activations of every batch run through it and replace the block's inputs (an
   ``ActivationStore`` spills to disk beyond ``QUANT_WORKBENCH_ACTIVATION_MB``, default 2048),
   the block is freed;
3. the final norm and the head run in token chunks (a 128k vocabulary is never materialized for
   every token at once).

Peak memory is one block (or the embedding / head table) plus the activations, not the model.
The mapping from checkpoint tensors to network parameters (``Slot``) covers transformers 5's
fused mixture-of-experts parameters (per-expert ``experts.N.gate_proj`` / ``w1`` … → slices of
``experts.gate_up_proj`` / ``experts.down_proj``, from transformers' own conversion mapping),
GGUF names (``blk.*``, merged 3-D ``ffn_*_exps``), tied embeddings and GPT-2's Conv1D.

Encoders give the attention-masked mean-pooled final hidden state per sample; causal LMs
next-token log-probabilities. Compute dtype: float32 on CPU; on CUDA the checkpoint's
bf16 / fp16 (statistics and the head's softmax accumulate in float32).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import WorkbenchError
from .plan import KEEP
from .schemes import get_scheme

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


def model_folder(model) -> Path:
    """The folder of the model's config.json and tokenizer files: beside its weights, or the
    companion folder of a GGUF read as a Hugging Face model (Model.folder)."""
    if getattr(model, "folder", None):
        return Path(model.folder)
    p = Path(model.path)
    return p if p.is_dir() else p.parent


def read_config(model) -> dict:
    cfg_path = model_folder(model) / "config.json"
    if not cfg_path.is_file():
        if getattr(model, "format", None) == "gguf":    # the CLI reads it through convert.live
            from .convert.live import unsupported_message
            raise WorkbenchError(unsupported_message(model.metadata), path=str(model.path))
        raise WorkbenchError("not runnable: no config.json beside the weights (weight-only "
                             "features still work)", path=str(model.path))
    from .limits import load_sidecar_json
    cfg = load_sidecar_json(cfg_path, "config.json")
    if not isinstance(cfg, dict):
        raise WorkbenchError("not runnable: config.json is not a JSON object", path=str(cfg_path))
    from .config_check import check_config
    check_config(model, cfg, cfg_path)      # against the tensors, before any work
    return cfg


def _import_transformers():
    from .optional import require
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


def dequantized(model, name: str, scheme_name: str, matrix: np.ndarray | None = None) -> np.ndarray:
    """The tensor `name` as the scheme would store it, dequantized (float32, original shape).
    A shape the scheme cannot take gets the scheme `evaluate` counts for it (the ``any``
    runtime's fallback, workbench.runtimes.decide); tensors kept come back unchanged.
    `matrix`: the tensor as `model.read_matrix(name)` gives it, when the caller holds it
    (read once for several schemes)."""
    from . import streaming
    from .evaluate import quantize
    from .runtimes import decide
    info = model.info(name)
    applied = KEEP
    if scheme_name != KEEP and info.is_float:
        applied = decide(info, scheme_name, "any").applied
    scheme = None if applied == KEEP else get_scheme(applied)
    if scheme is not None and scheme.ineligible_reason(
            info.matrix_shape if info.merged_experts else info.shape):
        scheme = None
    if scheme is None:
        return (model.read_matrix(name) if matrix is None else matrix).reshape(info.shape)
    if matrix is None and streaming.streamed(info, applied):
        # a big tensor (an 8 B model's 2.1 GB head): quantized a row chunk at a time into the
        # output, so the float32 copy, the codes and the quantizer's temporaries of the whole
        # tensor are never held at once
        out = np.empty(info.shape, np.float32)
        for r0, _w0, dq in streaming.dequantized_rows(model, name, applied):
            out.reshape(-1, dq.shape[1])[r0:r0 + dq.shape[0]] = dq
        return out
    qt = quantize(model.read_matrix(name) if matrix is None else matrix, applied, tensor=name)
    from .accel import dequantize
    return dequantize(qt).reshape(info.shape)


# ---- device ------------------------------------------------------------------------------------
_DEVICE: list = [None]


def set_device(name: str | None) -> str:
    """Select the device model-level work runs on ("cpu", "cuda"; None: cuda when torch sees a
    GPU). A CUDA request without a GPU is a WorkbenchError."""
    import torch
    if name in (None, "", "auto"):
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise WorkbenchError(f"--device {name}: choose cpu or cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise WorkbenchError("--device cuda: torch sees no CUDA GPU (torch "
                             f"{torch.__version__}); use --device cpu")
    _DEVICE[0] = name
    return name


def current_device() -> str:
    if _DEVICE[0] is None:
        set_device(None)
    return _DEVICE[0]


# ---- where a checkpoint tensor goes in the network ---------------------------------------------
@dataclass(frozen=True)
class Slot:
    """The region of a network parameter one workbench tensor fills: ``param[expert]`` (fused
    experts; None: all of dim 0), then part `part` of `parts` equal chunks of the next dim."""
    param: str
    expert: int | None = None
    part: int = 0
    parts: int = 1

    def region(self, t):
        if self.expert is not None:
            t = t[self.expert]
            dim = 0
        else:
            dim = 1 if (self.parts > 1 or t.ndim == 3) else 0
        if self.parts > 1:
            n = t.shape[dim] // self.parts
            # plain slicing: a view of a torch tensor or of a numpy array alike
            t = t[(slice(None),) * dim + (slice(self.part * n, (self.part + 1) * n),)]
        return t


def _star_regex(pattern: str):
    return re.compile(re.escape(pattern).replace(r"\*", r"(\d+)"))


_SUPPORTED_OPS = {"MergeModulelist", "Concatenate"}


def _conversions(model_type: str) -> list:
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        return list(get_checkpoint_conversion_mapping(model_type) or [])
    except Exception:        # an older transformers without conversion mappings: none needed
        return []


@contextmanager
def _params_on_meta():
    """Construct modules with every parameter on the meta device (buffers stay real: rotary
    frequencies, position ids)."""
    import torch
    orig = torch.nn.Module.register_parameter

    def register(self, name, param):
        orig(self, name, param)
        p = self._parameters.get(name)
        if p is not None and p.device.type != "meta":
            self._parameters[name] = torch.nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = orig


class _Stop(Exception):
    pass


@dataclass
class Batch:
    ids: np.ndarray
    mask: np.ndarray
    calls: list = field(default_factory=list)   # per block: (positional?, args, kwargs)

    @property
    def keep(self):
        import torch
        return torch.from_numpy(self.mask.reshape(-1) > 0)


class ActivationStore:
    """Per-batch activations (tensors) kept in RAM up to a shared byte budget, spilled to a
    temporary folder (safetensors files) beyond it."""

    def __init__(self, budget: dict | None = None):
        self.budget = budget if budget is not None else new_budget()
        self.items: dict = {}
        self.dir = None

    def put(self, key, t) -> None:
        self.drop(key)
        t = t.detach()
        nbytes = t.numel() * t.element_size()
        if self.budget["used"] + nbytes <= self.budget["limit"]:
            self.items[key] = ("ram", t, nbytes)
            self.budget["used"] += nbytes
            return
        from safetensors.torch import save_file
        if self.dir is None:
            self.dir = tempfile.TemporaryDirectory(prefix="qw-activations-")
        path = os.path.join(self.dir.name, f"{abs(hash(key))}-{len(self.items)}.safetensors")
        save_file({"x": t.to("cpu").contiguous()}, path)
        self.items[key] = ("disk", (path, t.device), nbytes)

    def get(self, key):
        kind, v, _ = self.items[key]
        if kind == "ram":
            return v
        from safetensors.torch import load_file
        path, dev = v
        return load_file(path)["x"].to(dev)

    def drop(self, key) -> None:
        old = self.items.pop(key, None)
        if old is None:
            return
        if old[0] == "ram":
            self.budget["used"] -= old[2]
        else:
            try:
                os.remove(old[1][0])
            except OSError:
                pass

    def close(self) -> None:
        for k in list(self.items):
            self.drop(k)
        if self.dir is not None:
            self.dir.cleanup()
            self.dir = None

    @property
    def spilled(self) -> int:
        return sum(1 for v in self.items.values() if v[0] == "disk")


def new_budget() -> dict:
    mb = float(os.environ.get("QUANT_WORKBENCH_ACTIVATION_MB", "2048"))
    return {"limit": int(mb * (1 << 20)), "used": 0}


# ---- the runner --------------------------------------------------------------------------------
class Runner:
    """A meta-device transformers skeleton of the model, run one block at a time."""

    def __init__(self, model, device: str | None = None):
        transformers = _import_transformers()
        import torch
        self.model = model
        self.cfg = read_config(model)
        self.kind = model_kind(self.cfg)
        self.device = torch.device(device or current_device())
        mt = self.cfg["model_type"]
        kwargs = {k: v for k, v in self.cfg.items()
                  if not k.startswith("_") and k not in ("auto_map", "model_type")}
        try:
            import warnings
            with warnings.catch_warnings():
                # transformers' notes on a config's deprecated keys (rope_scaling ...) are not
                # the user's to act on, and would break the CLI's one-line errors
                warnings.simplefilter("ignore")
                config = transformers.AutoConfig.for_model(mt, **kwargs)
                config._attn_implementation = "eager"
                cls = transformers.AutoModel if self.kind == "encoder" \
                    else transformers.AutoModelForCausalLM
                with _params_on_meta():
                    net = cls.from_config(config, attn_implementation="eager")
        except WorkbenchError:
            raise
        except Exception as exc:
            from .optional import missing_from
            missing = missing_from(exc)     # transformers needs one of its own optional packages
            if missing:
                raise WorkbenchError(missing, path=str(model.path)) from None
            raise WorkbenchError(f"not runnable: transformers cannot build model_type {mt!r} "
                                 f"from config.json ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}); "
                                 "weight-only features still work", path=str(model.path)) from None
        self.config = config
        self.net = net.eval()
        self.dtype = self._compute_dtype()
        self._structure()
        self._map_tensors()
        self._load_buffers()

    # -- structure ---------------------------------------------------------------------------------
    def _compute_dtype(self):
        import torch
        if self.device.type != "cuda":
            return torch.float32
        dts = {self.model.info(n).dtype for n in self.model.tensors}
        if "BF16" in dts and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        if "F16" in dts:
            return torch.float16
        return torch.float32

    def _structure(self) -> None:
        import torch
        n_layers = getattr(self.config, "num_hidden_layers", None)
        if n_layers is None and hasattr(self.config, "get_text_config"):
            n_layers = getattr(self.config.get_text_config(), "num_hidden_layers", None)
        self.base = self.net.base_model
        best = None
        for name, mod in self.base.named_modules():
            if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0:
                if n_layers is not None and len(mod) != n_layers:
                    continue
                if best is None or name.count(".") < best[0].count("."):
                    best = (name, mod)
        if best is None:
            raise WorkbenchError("not runnable: no list of blocks found in the network "
                                 f"({type(self.net).__name__})", path=str(self.model.path))
        base_path = self._module_path(self.base)
        lname = best[0]
        self.layers = best[1]
        self.layers_path = (base_path + "." if base_path else "") + lname
        top = lname.split(".")[0]
        children = [n for n, _ in self.base.named_children()]
        idx = children.index(top)
        pre_children, post_children = children[:idx], children[idx + 1:]
        norm = None
        for c in post_children:
            m = getattr(self.base, c)
            if "norm" in type(m).__name__.lower() or "norm" in c.lower():
                norm = c
                break
        if norm is None and "." in lname:   # e.g. a norm inside the blocks' container
            parent = self.base.get_submodule(lname.rsplit(".", 1)[0])
            kids = [n for n, _ in parent.named_children()]
            for c in kids[kids.index(lname.rsplit(".", 1)[1]) + 1:]:
                if "norm" in type(getattr(parent, c)).__name__.lower():
                    norm = lname.rsplit(".", 1)[0] + "." + c
                    break
        pre = (base_path + "." if base_path else "")
        self.final_norm = self.base.get_submodule(norm) if norm else None
        self.head = self.net.get_output_embeddings() if self.kind == "causal-lm" else None
        names = [n for n, _ in self.net.named_parameters(remove_duplicate=False)]
        self.layer_params = [[] for _ in range(len(self.layers))]
        self.pre_params, self.norm_params, self.head_params = [], [], []
        head_path = self._module_path(self.head) if self.head is not None else None
        norm_path = pre + norm if norm else None
        for n in names:
            if n.startswith(self.layers_path + "."):
                i = int(n[len(self.layers_path) + 1:].split(".")[0])
                self.layer_params[i].append(n)
            elif norm_path and n.startswith(norm_path + "."):
                self.norm_params.append(n)
            elif head_path is not None and n.startswith(head_path + "."):
                self.head_params.append(n)
            elif any(n.startswith(pre + c + ".") for c in pre_children):
                self.pre_params.append(n)
        self._meta = {n: p for n, p in self.net.named_parameters(remove_duplicate=False)}
        self._owner = {}
        for mname, mod in self.net.named_modules(remove_duplicate=False):
            for pname in mod._parameters:
                self._owner[(mname + "." if mname else "") + pname] = (mod, pname)
        self.tied = bool(self.head is not None and self.head.weight is
                         self.net.get_input_embeddings().weight)

    def _module_path(self, module) -> str:
        for n, m in self.net.named_modules():
            if m is module:
                return n
        return ""

    # -- checkpoint <-> network --------------------------------------------------------------------
    def _candidates(self, hf: str) -> list[str]:
        prefix = getattr(self.net, "base_model_prefix", "") or ""
        c = [hf]
        if prefix and hf.startswith(prefix + "."):
            c.append(hf[len(prefix) + 1:])
        elif prefix:
            c.append(f"{prefix}.{hf}")
        return c

    def _map_tensors(self) -> None:
        names = list(self.model.tensors)
        params = set(self._meta)
        self.slots: dict[str, Slot] = {}
        self.buffer_for: dict[str, str] = {}
        buffers = {n for n, _ in self.net.named_buffers()}
        convs = _conversions(self.cfg["model_type"])
        gguf = any(n.startswith("blk.") or n == "token_embd.weight" for n in names)
        if gguf:
            self._map_gguf(names, params)
        else:
            for n in names:
                key, slot = n, None
                for t in convs:
                    new, matched = t.rename_source_key(key)
                    if matched is None:
                        continue
                    ops = [type(o).__name__ for o in getattr(t, "operations", [])]
                    if ops:
                        if not set(ops) <= _SUPPORTED_OPS:
                            raise WorkbenchError(
                                f"not runnable: checkpoint conversion {ops} of {n} is not "
                                "supported by the workbench runner", path=str(self.model.path))
                        srcs = t._original_source_patterns
                        part, expert = 0, None
                        for k, s in enumerate(srcs):
                            m = _star_regex(s).search(n)
                            if m:
                                part = k
                                expert = int(m.group(1)) if m.groups() else None
                                break
                        slot = (part, len(srcs) if "Concatenate" in ops else 1, expert)
                    key = new
                for c in self._candidates(key):
                    if c in params:
                        if slot is None:
                            self.slots[n] = Slot(c)
                        else:
                            self.slots[n] = Slot(c, slot[2], slot[0], slot[1])
                        break
                    if c in buffers:
                        self.buffer_for[n] = c
                        break
        # every parameter the run materializes must have its tensor(s)
        covered = {s.param for s in self.slots.values()}
        needed = [p for group in (self.pre_params, self.norm_params, self.head_params,
                                  *self.layer_params) for p in group]
        missing = [p for p in needed if p not in covered and not self._is_tied_copy(p)]
        if missing:
            raise WorkbenchError(f"not runnable: {len(missing)} parameters of the network have no "
                                 f"tensor in the file (first: {missing[0]})",
                                 path=str(self.model.path))
        self.by_param: dict[str, list[str]] = {}
        for n, s in self.slots.items():
            self.by_param.setdefault(s.param, []).append(n)

    def _is_tied_copy(self, pname: str) -> bool:
        p = self._meta[pname]
        return any(q is p and o in {s.param for s in self.slots.values()}
                   for o, q in self._meta.items() if o != pname)

    def _map_gguf(self, names, params) -> None:
        """llama.cpp names: the file's own `general.architecture` picks gguf-py's tensor-name
        map (else the model type's family in ARCH["gguf_family"])."""
        import gguf
        from .export.llama_tensor_types import llama_cpp_name
        have = set(names)
        arch = self.model.metadata.get("general.architecture")
        self.unpermute = arch in ARCH["gguf_rope_permuted"]
        name_map = None
        if isinstance(arch, str):
            key = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(arch)
            if key is not None:
                name_map = gguf.get_tensor_name_map(key, max(len(self.layers), 1))
        family = ARCH["gguf_family"].get(self.cfg["model_type"], "llama")
        for pname in params:
            leaf = pname.rsplit(".", 1)[-1]
            m = re.search(r"\.(\d+)\.", pname)
            if leaf in ARCH["gguf_experts"] and m:
                parts = ARCH["gguf_experts"][leaf]
                for k, g in enumerate(parts):
                    g = f"blk.{m.group(1)}.{g}.weight"
                    if g in have:
                        self.slots[g] = Slot(pname, None, k, len(parts))
                continue
            for c in self._candidates(pname):
                if c in have:
                    g = c
                elif name_map is not None:
                    g = name_map.get_name(c, try_suffixes=(".weight", ".bias"))
                else:
                    g = llama_cpp_name(c, family)
                if g in have and g not in self.slots:
                    self.slots[g] = Slot(pname)
                    break

    def _load_buffers(self) -> None:
        import torch
        for n, b in self.buffer_for.items():
            buf = self.net.get_buffer(b)
            w = torch.from_numpy(np.array(self.model.read(n)))
            if tuple(w.shape) == tuple(buf.shape):
                buf.data = w.to(buf.dtype)

    # -- weights -----------------------------------------------------------------------------------
    def _source(self, pname: str) -> list[str]:
        srcs = self.by_param.get(pname)
        if srcs:
            return srcs
        p = self._meta[pname]      # a tied copy (lm_head = embeddings)
        for o, q in self._meta.items():
            if q is p and o in self.by_param:
                return self.by_param[o]
        raise KeyError(pname)

    def param_tensor(self, pname: str, override=None):
        """The float32 (CPU) tensor of parameter `pname` from its checkpoint tensor(s);
        `override(name) -> array | None` replaces a workbench tensor (e.g. dequantized)."""
        import torch
        shape = tuple(self._meta[pname].shape)
        srcs = self._source(pname)
        single = len(srcs) == 1 and self.slots[srcs[0]].expert is None \
            and self.slots[srcs[0]].parts == 1
        out = None if single else torch.empty(shape, dtype=torch.float32)
        for n in srcs:
            w = override(n) if override is not None else None
            if w is None:
                w = self.model.read(n)
            t = torch.from_numpy(np.require(w, np.float32, ["C", "W"]))
            if getattr(self, "unpermute", False):
                t = self._rope_unpermute(pname, t)
            if single:
                return self._fit(t, shape, n)
            region = self.slots[n].region(out)
            region.copy_(self._fit(t, tuple(region.shape), n))
        return out

    def _rope_unpermute(self, pname: str, t):
        """Undo convert_hf_to_gguf's q/k row permutation (rows (head, 2, d/2) <- (head, d/2, 2))."""
        m = re.search(r"self_attn\.([qk])_proj\.(weight|bias)$", pname)
        if m is None:
            return t
        n_head = int(self.config.num_attention_heads)
        if m.group(1) == "k":
            n_head = int(getattr(self.config, "num_key_value_heads", None) or n_head)
        rows = t.shape[0]
        return (t.reshape(n_head, rows // n_head // 2, 2, *t.shape[1:]).swapaxes(1, 2)
                .reshape(t.shape).contiguous())

    def _fit(self, t, shape, name):
        if tuple(t.shape) == shape:
            return t
        if t.ndim == 2 and tuple(t.T.shape) == shape:       # GPT-2 Conv1D stores (in, out)
            return t.T.contiguous()
        if t.numel() == int(np.prod(shape)):
            return t.reshape(shape)
        raise WorkbenchError(f"shape {tuple(t.shape)} does not fit the network's {shape}",
                             path=str(self.model.path), tensor=name)

    def materialize(self, pnames, override=None, grad: bool = False) -> None:
        import torch
        for pn in pnames:
            mod, attr = self._owner[pn]
            t = self.param_tensor(pn, override).to(self.device, self.dtype)
            mod._parameters[attr] = torch.nn.Parameter(t, requires_grad=grad)

    def release(self, pnames) -> None:
        for pn in pnames:
            mod, attr = self._owner[pn]
            mod._parameters[attr] = self._meta[pn]

    def all_params(self) -> list[str]:
        return [p for g in (self.pre_params, *self.layer_params, self.norm_params,
                            self.head_params) for p in g]

    def whole_params(self) -> list[str]:
        """Every parameter of the network with a tensor in the checkpoint: the blocks' and the
        ones no pass of the runner reads (a BERT pooler), for a caller that needs the whole
        network at once (the ONNX export's tracing)."""
        have = self.all_params()
        seen = set(have)
        for pn in self._owner:
            if pn in seen:
                continue
            try:
                self._source(pn)
            except KeyError:
                continue            # no tensor in the file: left as the runner leaves it
            have.append(pn)
        return have

    def block_of(self, name: str):
        """'pre', a block index, 'norm' or 'head' for a workbench tensor (None: not read)."""
        s = self.slots.get(name)
        if s is None:
            return None
        for i, g in enumerate(self.layer_params):
            if s.param in g:
                return i
        if s.param in self.pre_params:
            return "pre"
        if s.param in self.norm_params:
            return "norm"
        if s.param in self.head_params:
            return "head"
        return None

    def module_of(self, name: str):
        s = self.slots.get(name)
        return None if s is None else self._owner[s.param][0]

    def linear_names(self) -> list[str]:
        """Workbench names of 2-D weights read by a Linear/Conv1D module (hookable), in the
        blocks and the head."""
        out = []
        for n, s in self.slots.items():
            mod, attr = self._owner[s.param]
            cname = type(mod).__name__
            if attr == "weight" and (cname in ARCH["linear_classes"]
                                     or cname.lower().endswith(ARCH["router_suffixes"])) \
                    and s.expert is None and self._meta[s.param].ndim == 2 \
                    and self.block_of(n) is not None:
                out.append(n)
        return out

    def expert_names(self) -> dict:
        """{fused experts module: {param attr: {expert index: [workbench names]}}}."""
        out: dict = {}
        for n, s in self.slots.items():
            mod, attr = self._owner[s.param]
            if s.expert is None and not (self._meta[s.param].ndim == 3
                                          and attr in ARCH["gguf_experts"]):
                continue
            out.setdefault(mod, {}).setdefault(attr, {}).setdefault(s.expert, []).append(n)
        return out

    # -- running -----------------------------------------------------------------------------------
    def _base_call(self, ids_t, mask_t):
        try:
            return self.base(input_ids=ids_t, attention_mask=mask_t, use_cache=False)
        except TypeError as exc:
            if "use_cache" not in str(exc):
                raise
            return self.base(input_ids=ids_t, attention_mask=mask_t)

    def capture(self, data, batch_size: int = 16, override=None, store=None, grad: bool = False,
                only_first: bool = False):
        """Embed every batch and capture each block's call arguments. Returns (batches, store
        of block-0 inputs). With `grad`, the embedding parameters require gradients and the
        captured first-block inputs keep their graph (`only_first` then)."""
        from .calibration import batches as make_batches
        store = store if store is not None else ActivationStore()
        out = []
        self.materialize(self.pre_params, override, grad=grad)
        try:
            for bi, (ids, mask) in enumerate(make_batches(data, batch_size)):
                b = Batch(ids, mask, [None] * len(self.layers))
                b.first = None
                self._run_capture(b, grad, only_first)
                if not grad:          # with gradients the caller keeps b.first's graph
                    store.put(bi, b.first)
                    b.first = None
                out.append(b)
        finally:
            if not grad:
                self.release(self.pre_params)
        return out, store

    def _run_capture(self, b: Batch, grad: bool, only_first: bool) -> None:
        import torch
        last = 0 if only_first else len(self.layers) - 1

        def catcher(i, layer):
            def fwd(*args, **kwargs):
                if args:
                    h, rest, pos = args[0], args[1:], True
                else:
                    h, rest, pos = kwargs.pop("hidden_states"), (), False
                kwargs.pop("hidden_states", None)
                b.calls[i] = (pos, rest, kwargs)
                if i == 0:
                    b.first = h
                if i >= last:
                    raise _Stop
                return h
            return fwd

        for i, layer in enumerate(self.layers):
            layer.forward = catcher(i, layer)
        try:
            ids_t = torch.from_numpy(b.ids).to(self.device)
            mask_t = torch.from_numpy(b.mask).to(self.device)
            with torch.set_grad_enabled(grad):
                self._base_call(ids_t, mask_t)
        except _Stop:
            pass
        finally:
            for layer in self.layers:
                del layer.forward
        if b.first is None:
            raise WorkbenchError("not runnable: the network never reached its first block",
                                 path=str(self.model.path))

    def call_block(self, i: int, b: Batch, h):
        pos, rest, kwargs = b.calls[i]
        layer = self.layers[i]
        out = layer(h, *rest, **kwargs) if pos else layer(*rest, hidden_states=h, **kwargs)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out

    def run_block(self, i: int, batches, src: ActivationStore, dst: ActivationStore,
                  on_batch=None) -> None:
        import torch
        for bi, b in enumerate(batches):
            self.current = b
            with torch.no_grad():
                dst.put(bi, self.call_block(i, b, src.get(bi)))
            if on_batch is not None:
                on_batch(bi, b)
        self.current = None

    def finish(self, h):
        """The final norm over the last block's output."""
        return self.final_norm(h) if self.final_norm is not None else h

    def head_weights(self, override):
        """{head parameter attr: tensor} under `override`, or None when it changes nothing."""
        names = [n for p in self.head_params for n in self._source(p)]
        changes = getattr(override, "changes", None)
        if override is None or not any(changes(n) if changes else override(n) is not None
                                       for n in names):
            return None
        out = {}
        for p in self.head_params:
            out[self._owner[p][1]] = self.param_tensor(p, override).to(self.device, self.dtype)
        return out

    def logits(self, x, params=None):
        """float32 logits of the head over hidden rows `x` (final-normed), with the
        architecture's logit transforms (table ARCH["logit_transforms"]); `params`: head
        parameters to use instead of the materialized ones (head_weights)."""
        import torch
        if params:
            z = torch.func.functional_call(self.head, params, (x,)).float()
        else:
            z = self.head(x).float()
        for attr, op in ARCH["logit_transforms"].items():
            v = getattr(self.config, attr, None)
            if v is None or isinstance(v, bool):
                continue
            v = float(v)
            if op == "softcap" and v > 0:
                z = torch.tanh(z / v) * v
            elif op == "scale":
                z = z * v
            elif op == "divide" and v != 0:
                z = z / v
        return z

    def token_chunk(self) -> int:
        vocab = int(self._meta[self.head_params[0]].shape[0]) if self.head_params else 1
        return max(16, int((64 << 20) // (4 * max(vocab, 1))))

    def forward(self, batch, override=None):
        """One batch through the whole network, block by block (see `run_outputs`)."""
        data = [batch[0][i, : int(batch[1][i].sum())] for i in range(batch[0].shape[0])]
        from .progress import run as run_job
        return run_job(run_outputs(self, data, batch_size=len(data), override=override))


# -- model-level passes ----------------------------------------------------------------------------

_RUNNERS: dict[tuple, Runner] = {}


def runner_job(model, device: str | None = None):
    """Job: :func:`get_runner`'s Runner, saying first that the network is being built (the
    import of transformers and the model's construction take seconds)."""
    from .progress import Progress
    yield Progress(0, 1, "building the network (transformers)")
    return get_runner(model, device)


def get_runner(model, device: str | None = None) -> Runner:
    """One cached Runner per (model path, file signature, device)."""
    from .stats import file_signature
    dev = device or current_device()
    # a GGUF read as a Hugging Face model has one companion folder per opening
    key = (str(model.path), file_signature(str(model.path)), dev, getattr(model, "folder", None))
    r = _RUNNERS.get(key)
    if r is None:
        r = _RUNNERS[key] = Runner(model, dev)
    return r


def plan_override(model, plan=None, weights=None, cache: dict | None = None):
    """override(name) -> float array | None: `weights` ({name: array}, or any mapping) where it
    has the tensor, else the plan's dequantized tensor (None: the original)."""
    assignment = plan.resolve(model) if plan is not None else {}

    def fn(n):
        if weights is not None:
            return weights[n] if n in weights else None
        s = assignment.get(n, KEEP)
        if s == KEEP:
            return None
        if cache is not None and (n, s) in cache:
            return cache[(n, s)]
        w = dequantized(model, n, s)
        if cache is not None:
            cache[(n, s)] = w
        return w

    def changes(n):
        if weights is not None:
            return n in weights
        return assignment.get(n, KEEP) != KEEP
    fn.changes = changes
    return fn


def block_pass(runner: Runner, data, batch_size: int = 16, override=None, hooks=None,
               keep_inputs: bool = False, label: str = "running", span=(0, 100), budget=None):
    """Job: run `data` through every block (weights under `override`). `hooks(i, block)`
    returns a list of hook handles to remove after block i (statistics). Returns
    (batches, store of the last block's outputs, [stores of each block's inputs] when
    `keep_inputs`)."""
    from .progress import Progress
    a, z = span
    L = len(runner.layers)
    budget = budget or new_budget()
    yield Progress(a, 100, f"{label}: embeddings")
    batches, store = runner.capture(data, batch_size, override, ActivationStore(budget))
    inputs = []
    for i in range(L):
        yield Progress(a + (z - a) * (i + 1) / (L + 1), 100, f"{label}: block {i + 1}/{L}")
        src = store
        if keep_inputs:
            inputs.append(store)
            store = ActivationStore(budget)
        runner.materialize(runner.layer_params[i], override)
        handles = hooks(i, runner.layers[i]) if hooks else []
        try:
            runner.run_block(i, batches, src, store)
        finally:
            for h in handles:
                h.remove()
            runner.release(runner.layer_params[i])
    return batches, store, inputs


def _encoder_pool(runner, h, b):
    import torch
    m = torch.from_numpy(b.mask).to(h.device).unsqueeze(-1).to(h.dtype)
    return ((h * m).sum(1) / m.sum(1).clamp(min=1)).float().cpu().numpy()


def _head_rows(b: Batch):
    """(batch index, position) of every position that predicts a real next token."""
    rows = []
    for i in range(b.ids.shape[0]):
        n = int(b.mask[i].sum())
        rows.extend((i, t) for t in range(max(n - 1, 0)))
    return rows


def head_chunks(runner, batches, stores, override=None):
    """Yield (batch index, rows [(i, t)], [float32 log-probs (n, vocab) per store]) in token
    chunks, the final norm and the head materialized once."""
    import torch
    runner.materialize(runner.norm_params + runner.head_params, override)
    try:
        step = runner.token_chunk()
        for bi, b in enumerate(batches):
            rows = _head_rows(b)
            hs = [runner.finish(s.get(bi)) for s in stores]
            for c0 in range(0, len(rows), step):
                rr = rows[c0:c0 + step]
                ii = torch.tensor([r[0] for r in rr])
                tt = torch.tensor([r[1] for r in rr])
                with torch.no_grad():
                    lps = [torch.log_softmax(runner.logits(h[ii, tt]), dim=-1) for h in hs]
                yield bi, rr, lps
    finally:
        runner.release(runner.norm_params + runner.head_params)


def final_outputs(runner, batches, store, override=None):
    """Encoder: list of pooled (hidden,) arrays; causal LM: list of (len-1, vocab) log-probs
    (small models only: the whole vocabulary for every token)."""
    import torch
    if runner.kind == "encoder":
        runner.materialize(runner.norm_params, override)
        try:
            out = []
            for bi, b in enumerate(batches):
                with torch.no_grad():
                    out.extend(list(_encoder_pool(runner, runner.finish(store.get(bi)), b)))
            return out
        finally:
            runner.release(runner.norm_params)
    per = {}
    for bi, rr, (lp,) in head_chunks(runner, batches, [store], override):
        lp = lp.float().cpu().numpy()
        for k, (i, t) in enumerate(rr):
            per.setdefault((bi, i), []).append(lp[k])
    out = []
    for bi, b in enumerate(batches):
        for i in range(b.ids.shape[0]):
            rows = per.get((bi, i))
            out.append(np.stack(rows) if rows else np.zeros((0, runner.head.out_features),
                                                             np.float32))
    return out


def run_outputs(runner: Runner, samples, batch_size: int = 16, label: str = "running",
                override=None):
    """Job: the runner's outputs for every sample, block by block: encoders (hidden,)
    mean-pooled states, causal LMs (len-1, vocab) next-token log-probs (position t predicts
    token t+1), one array per sample, in the order of `samples`."""
    from .progress import Progress, subjob
    batches, store, _ = yield from subjob(block_pass(runner, samples, batch_size, override,
                                                     label=label), 0, 95, 100)
    try:
        out = final_outputs(runner, batches, store, override)
    finally:
        store.close()
    yield Progress(100, 100, label)
    return out


# the jobs over the runner (check, the inputs of every weight, the router's choices) live in
# workbench/runner_jobs.py; `from workbench.runner import check` keeps working
_JOBS = ("check", "compare_outputs", "expert_usage", "input_pass")


def __getattr__(name):
    if name in _JOBS:
        from . import runner_jobs
        return getattr(runner_jobs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
