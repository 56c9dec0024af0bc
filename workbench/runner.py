"""A runnable model through `transformers` (optional extra `.[model]`).

The network is built from the folder's ``config.json`` (``from_config``: nothing downloaded, no
code from the folder executed) and its weights come from the workbench's own loaders (any of
them, GGUF included, dequantized to float32). A plan's dequantized weights are swapped in place
(``param.data.copy_``) and the originals restored, so one runner serves any number of plans.

Encoders (BERT / MiniLM) give the attention-masked mean-pooled final hidden state per sample;
causal LMs (Llama / Qwen2 / Mistral / GPT-2) give next-token log-probabilities.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .errors import WorkbenchError
from .plan import KEEP
from .schemes import get_scheme

ENCODER_TYPES = {"bert", "roberta", "distilbert", "xlm-roberta", "mpnet"}
CAUSAL_TYPES = {"llama", "qwen2", "mistral", "gpt2"}


def model_folder(model) -> Path:
    p = Path(model.path)
    return p if p.is_dir() else p.parent


def read_config(model) -> dict:
    cfg_path = model_folder(model) / "config.json"
    if not cfg_path.is_file():
        raise WorkbenchError("not runnable: no config.json beside the weights (weight-only "
                             "features still work)", path=str(model.path))
    from .limits import loads
    try:
        cfg = loads(cfg_path.read_bytes(), str(cfg_path), "config.json")
    except OSError as exc:
        raise WorkbenchError(f"not runnable: config.json unreadable ({exc.strerror})",
                             path=str(cfg_path)) from None
    if not isinstance(cfg, dict):
        raise WorkbenchError("not runnable: config.json is not a JSON object", path=str(cfg_path))
    return cfg


def model_kind(cfg: dict) -> str:
    mt = cfg.get("model_type", "")
    if mt in ENCODER_TYPES:
        return "encoder"
    if mt in CAUSAL_TYPES:
        return "causal-lm"
    raise WorkbenchError(f"not runnable: model_type {mt!r} is not supported (encoders: "
                         f"{', '.join(sorted(ENCODER_TYPES))}; causal LMs: "
                         f"{', '.join(sorted(CAUSAL_TYPES))}); weight-only features still work")


def _import_transformers():
    from .optional import require
    return require("transformers", "model")


def dequantized(model, name: str, scheme_name: str) -> np.ndarray:
    """The tensor `name` as the scheme would store it, dequantized (float32, original shape).
    A shape the scheme cannot take gets the scheme `evaluate` counts for it (the ``any``
    runtime's fallback, workbench.runtimes.decide); tensors kept come back unchanged."""
    from .evaluate import quantize
    from .runtimes import decide
    info = model.info(name)
    w = model.read_matrix(name)
    if scheme_name == KEEP or not info.is_float:
        return w.reshape(info.shape)
    scheme_name = decide(info, scheme_name, "any").applied
    if scheme_name == KEEP:
        return w.reshape(info.shape)
    scheme = get_scheme(scheme_name)
    if scheme.ineligible_reason(info.shape):
        return w.reshape(info.shape)
    qt = quantize(w, scheme_name, tensor=name)
    return np.asarray(scheme.dequantize(qt), dtype=np.float32).reshape(info.shape)


class Runner:
    """A transformers module holding the model's original weights, with in-place swaps."""

    def __init__(self, model, dtype: str = "float32"):
        transformers = _import_transformers()
        import torch
        self.model = model
        self.cfg = read_config(model)
        self.kind = model_kind(self.cfg)
        mt = self.cfg["model_type"]
        config_cls = transformers.CONFIG_MAPPING[mt]
        kwargs = {k: v for k, v in self.cfg.items() if not k.startswith("_")}
        config = config_cls(**kwargs)
        torch.manual_seed(0)
        if self.kind == "encoder":
            net = transformers.AutoModel.from_config(config, attn_implementation="eager")
        else:
            net = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        self.net = net.to(getattr(torch, dtype)).eval()
        self.param_for: dict[str, "torch.nn.Parameter"] = {}   # workbench name -> parameter
        self.module_for: dict[str, "torch.nn.Module"] = {}     # workbench name -> module
        self._originals: dict[str, "torch.Tensor"] = {}
        self._load_weights()

    # -- names -----------------------------------------------------------------------------------
    def _candidates(self, hf: str) -> list[str]:
        prefix = getattr(self.net, "base_model_prefix", "") or ""
        c = [hf]
        if prefix and hf.startswith(prefix + "."):
            c.append(hf[len(prefix) + 1:])
        elif prefix:
            c.append(f"{prefix}.{hf}")
        return c

    def _load_weights(self) -> None:
        import torch
        names = set(self.model.tensors)
        family = None
        if any(n.startswith("blk.") or n == "token_embd.weight" for n in names):
            from .export.llama_tensor_types import llama_cpp_name
            family = {"bert": "bert", "gpt2": "gpt2"}.get(self.cfg["model_type"], "llama")
        modules = dict(self.net.named_modules())
        missing = []
        seen_ptrs = set()
        for hf, param in self.net.named_parameters(remove_duplicate=False):
            found = None
            for c in self._candidates(hf):
                if c in names:
                    found = c
                    break
                if family is not None:
                    g = llama_cpp_name(c, family)
                    if g in names:
                        found = g
                        break
            if found is None:
                if param.data_ptr() in seen_ptrs:
                    continue  # tied (e.g. lm_head = embeddings), already loaded
                missing.append(hf)
                continue
            seen_ptrs.add(param.data_ptr())
            w = self.model.read_matrix(found).reshape(self.model.info(found).shape)
            if tuple(w.shape) != tuple(param.shape):
                if w.ndim == 2 and tuple(w.T.shape) == tuple(param.shape):  # GPT-2 Conv1D
                    w = w.T
                else:
                    raise WorkbenchError(f"shape {tuple(w.shape)} does not fit the network's "
                                         f"{tuple(param.shape)}", path=str(self.model.path),
                                         tensor=found)
            with torch.no_grad():
                param.data.copy_(torch.from_numpy(np.array(w, dtype=np.float32)))
            if found not in self.param_for:
                self.param_for[found] = param
                self._originals[found] = param.data.clone()
                mod_name = hf.rsplit(".", 1)[0]
                if mod_name in modules:
                    self.module_for[found] = modules[mod_name]
        if missing:
            raise WorkbenchError(f"not runnable: {len(missing)} parameters of the network have no "
                                 f"tensor in the file (first: {missing[0]})",
                                 path=str(self.model.path))

    # -- swaps -------------------------------------------------------------------------------------
    def set_weight(self, name: str, w: np.ndarray) -> None:
        import torch
        p = self.param_for[name]
        t = torch.from_numpy(np.array(w, dtype=np.float32))
        if tuple(t.shape) != tuple(p.shape):
            t = t.T
        with torch.no_grad():
            p.data.copy_(t)

    def restore(self, names=None) -> None:
        with __import__("torch").no_grad():
            for n in (self._originals if names is None else names):
                self.param_for[n].data.copy_(self._originals[n])

    def apply_assignment(self, assignment: dict[str, str], cache: dict | None = None) -> list[str]:
        """Swap in every tensor's dequantized weights for `assignment` (name -> scheme). Returns
        the names changed. `cache` maps (name, scheme) -> array to reuse dequantized weights."""
        self.restore()
        changed = []
        for n, s in assignment.items():
            if n not in self.param_for or s == KEEP:
                continue
            key = (n, s)
            w = cache.get(key) if cache is not None else None
            if w is None:
                w = dequantized(self.model, n, s)
                if cache is not None:
                    cache[key] = w
            self.set_weight(n, w)
            changed.append(n)
        return changed

    # -- forward -----------------------------------------------------------------------------------
    def forward(self, batch):
        """Encoder: (n, hidden) mean-pooled states. Causal LM: list of (len-1, vocab) log-probs
        of the next token (position t predicts token t+1), one array per sample."""
        import torch
        ids, mask = batch
        with torch.no_grad():
            ids_t = torch.from_numpy(ids)
            mask_t = torch.from_numpy(mask)
            if self.kind == "encoder":
                out = self.net(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
                m = mask_t.unsqueeze(-1).to(out.dtype)
                pooled = (out * m).sum(1) / m.sum(1).clamp(min=1)
                return pooled.float().numpy()
            logits = self.net(input_ids=ids_t, attention_mask=mask_t).logits.float()
            lp = torch.log_softmax(logits, dim=-1)
            res = []
            for i in range(ids.shape[0]):
                n = int(mask[i].sum())
                res.append(lp[i, : max(n - 1, 0)].numpy())
            return res

    def linear_names(self) -> list[str]:
        """Workbench names of 2-D weights read by a Linear/Conv1D module (hookable)."""
        out = []
        for n, mod in self.module_for.items():
            if type(mod).__name__ in ("Linear", "Conv1D") and n.endswith("weight"):
                out.append(n)
        return out


# -- end-to-end check ------------------------------------------------------------------------------

_RUNNERS: dict[tuple, Runner] = {}


def get_runner(model) -> Runner:
    """One cached Runner per (model path, file signature)."""
    from .stats import file_signature
    key = (str(model.path), file_signature(str(model.path)))
    r = _RUNNERS.get(key)
    if r is None:
        r = _RUNNERS[key] = Runner(model)
    return r


def run_outputs(runner: Runner, samples, batch_size: int = 16, label: str = "running"):
    """Job: the runner's outputs for every sample (see Runner.forward), concatenated."""
    from .calibration import batches
    from .progress import Progress
    outs = []
    n = len(samples)
    done = 0
    for b in batches(samples, batch_size):
        yield Progress(done, n, label)
        o = runner.forward(b)
        if isinstance(o, list):
            outs.extend(o)
        else:
            outs.extend(list(o))
        done += b[0].shape[0]
    yield Progress(n, n, label)
    return outs


def compare_outputs(kind: str, base, quant, samples) -> dict:
    """Figures of quantized vs original outputs (see `check`)."""
    if kind == "encoder":
        cos = []
        for a, b in zip(base, quant):
            na, nb = np.linalg.norm(a), np.linalg.norm(b)
            cos.append(float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0)
        cos = np.asarray(cos)
        return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min())}
    kls, agree, nll_b, nll_q = [], [], [], []
    for lb, lq, ids in zip(base, quant, samples):
        if len(lb) == 0:
            continue
        pb = np.exp(lb)
        kls.append((pb * (lb - lq)).sum(-1))
        agree.append(lb.argmax(-1) == lq.argmax(-1))
        nxt = ids[1:len(lb) + 1]
        r = np.arange(len(nxt))
        nll_b.append(-lb[r, nxt])
        nll_q.append(-lq[r, nxt])
    kl = np.concatenate(kls)
    return {"kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
            "kl_max": float(kl.max()), "top1_agree": float(np.concatenate(agree).mean()),
            "ppl_base": float(np.exp(np.concatenate(nll_b).mean())),
            "ppl": float(np.exp(np.concatenate(nll_q).mean()))}


_BASE_CACHE: dict[tuple, list] = {}


def check(model, plan, calib=None, samples: int | None = None, max_len: int = 128,
          weights: dict | None = None):
    """Job: run the calibration inputs through the original and the plan-quantized model
    (`weights`: {name: float array} to load instead of the plan's own dequantized tensors —
    a method's output, workbench.methods.apply.runner_weights).
    Returns {"model_kind", "samples", "tokens", ...figures}: encoders cosine_mean/cosine_min of
    mean-pooled final hidden states; causal LMs kl_mean/kl_p99/kl_max (nats), top1_agree,
    ppl_base, ppl."""
    from .calibration import calibration_samples
    from .progress import subjob
    runner = get_runner(model)
    data = yield from subjob(calibration_samples(model, calib, samples, max_len), 0, 5, 100)
    key = (str(model.path), id(data))
    base = _BASE_CACHE.get(key)
    runner.restore()
    if base is None:
        base = yield from subjob(run_outputs(runner, data, label="original model"), 5, 40, 100)
        _BASE_CACHE[key] = base
    if weights is None:
        runner.apply_assignment(plan.resolve(model))
    else:
        runner.restore()
        for n, w in weights.items():
            if n in runner.param_for:
                runner.set_weight(n, w)
    try:
        quant = yield from subjob(run_outputs(runner, data, label="quantized model"), 45, 55, 100)
    finally:
        runner.restore()
    n_tok = int(sum(len(s) for s in data))
    return {"model_kind": runner.kind, "samples": len(data), "tokens": n_tok,
            **compare_outputs(runner.kind, base, quant, data)}
