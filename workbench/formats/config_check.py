"""config.json (or a GGUF's own metadata) against the tensors it describes.

A model folder's ``config.json`` says how many layers, heads and experts the network has and how
wide it is; the weights say what is really there. Every model-level command (check, calibrate,
sensitivity / fisher, allocate, the GUI's runner, the GGUF, ONNX and compressed-tensors
exports) reads the config through one of two doors (``runner.read_config``,
``gguf_target.hf_target`` / ``compressed_tensors``), and both call :func:`check_config` before any
work. A GGUF→GGUF export calls :func:`check_gguf_metadata` for the copied key/values
(workbench.formats.config_gguf). What the tensors hold: workbench.formats.config_facts.

What is checked (each refusal is one line naming config.json, the key and both values):

* every count and size the workbench or transformers reads is an integer (not a bool, a float,
  a string, NaN), within its range (heads ≥ 1, ...) and below 2^31; every float hyper-parameter
  is a finite number in its range; rope settings are a JSON object of finite numbers;
* counts agree with the tensors: ``num_hidden_layers`` with the layers the weights hold
  (DeepSeek's ``num_nextn_predict_layers`` extra layers allowed), ``hidden_size`` with the
  embedding's columns, ``vocab_size`` with the embedding's and the head's rows, head counts ×
  head size with the q/k/v rows, ``intermediate_size`` with the MLP's rows, the expert count
  with the experts (per-expert indices, fused 3-D tensors, router rows), experts-per-token with
  the expert count; a layer holding both fused and per-expert tensors is refused.
* a nested ``text_config`` (Gemma 3, multimodal wrappers) the same way, against the language
  model's tensors (workbench.formats.config_nested), each key named ``text_config.<key>``;
* an explicit null where the network needs a number (transformers takes a null over its
  config class's default); and, once transformers has built the config (the runner's
  :func:`check_effective`), the same checks on the defaults it fills in for left-out keys.

So no count from a config can drive work the weights do not bound (a ``num_hidden_layers`` of
10^6 builds no network of 10^6 blocks, a ``vocab_size`` of 10^12 writes no vocabulary of that
size), and no export writes metadata its tensors contradict.
"""

from __future__ import annotations

import math
from pathlib import Path

from workbench.core.errors import WorkbenchError
from workbench.formats.config_facts import Facts, facts
from workbench.formats.config_nested import NESTED, text_part

#: the largest count or size a config may state (GGUF stores them as uint32; nothing real is
#: near it)
MAX_COUNT = (1 << 31) - 1

#: the largest magnitude of a float hyper-parameter (softcapping, rope theta, ...)
FLOAT_MAX = 1e30

# key aliases: the first one present (not null) is the config's value
LAYERS = ("num_hidden_layers", "n_layer")
HIDDEN = ("hidden_size", "n_embd", "d_model")
HEADS = ("num_attention_heads", "n_head")
KV_HEADS = ("num_key_value_heads",)
VOCAB = ("vocab_size",)
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
TOPK = ("num_experts_per_tok", "num_experts_per_token")
FF = ("intermediate_size", "n_inner")
POSITIONS = ("max_position_embeddings", "n_positions")

# integer keys: (key, smallest value allowed)
INT_KEYS = {
    **{k: 1 for k in ("num_hidden_layers", "n_layer", "hidden_size", "n_embd", "d_model",
                      "num_attention_heads", "n_head", "num_key_value_heads", "head_dim",
                      "vocab_size", "intermediate_size", "n_inner", "moe_intermediate_size",
                      "shared_expert_intermediate_size", "max_position_embeddings",
                      "n_positions", "n_ctx", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
                      "qk_nope_head_dim", "v_head_dim", "n_group", "topk_group",
                      "original_max_position_embeddings", "sliding_window_pattern",
                      "_sliding_window_pattern", "embedding_size")},
    **{k: 0 for k in ("num_local_experts", "num_experts", "n_routed_experts", "n_shared_experts",
                      "first_k_dense_replace", "num_nextn_predict_layers", "decoder_sparse_step",
                      "num_experts_per_tok", "num_experts_per_token", "type_vocab_size",
                      "sliding_window")},
}
# float keys: (key, (low, low inclusive, high)); null is always allowed
FLOAT_KEYS = {
    "rope_theta": (0.0, False, math.inf), "rope_local_base_freq": (0.0, False, math.inf),
    "local_rope_theta": (0.0, False, math.inf), "rms_norm_eps": (0.0, True, 1.0),
    "layer_norm_eps": (0.0, True, 1.0), "layer_norm_epsilon": (0.0, True, 1.0),
    "attn_logit_softcapping": (0.0, True, math.inf),
    "final_logit_softcapping": (0.0, True, math.inf),
    "query_pre_attn_scalar": (0.0, False, math.inf),
    "routed_scaling_factor": (0.0, False, math.inf),
    "partial_rotary_factor": (0.0, False, 1.0), "logit_scale": (0.0, False, math.inf),
    "logits_scaling": (0.0, False, math.inf),
}
# rope settings (rope_scaling / rope_parameters, possibly one object per layer type)
ROPE_INTS = ("original_max_position_embeddings",)
ROPE_FLOATS = ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
               "extrapolation_factor", "attention_factor", "attn_factor", "mscale",
               "mscale_all_dim", "rope_theta", "partial_rotary_factor")


def _fmt(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        return str(int(v))
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**6:
        return f"{v:,}"
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


# ---- the checks ------------------------------------------------------------------------------
class _Checker:
    def __init__(self, cfg: dict, path, label=None, what="config.json"):
        self.cfg, self.path, self.what = cfg, str(path), what
        self.label = label or (lambda k: k)

    def fail(self, msg: str):
        raise WorkbenchError(f"{msg}: {self.what} and the weights disagree; nothing was done",
                             path=self.path)

    def bad(self, key: str, value, why: str):
        raise WorkbenchError(f"{self.label(key)} is {_fmt(value)}: {why}", path=self.path)

    def get(self, keys) -> tuple[str | None, int | None]:
        for k in keys:
            v = self.cfg.get(k)
            if v is not None:
                return k, v
        return None, None

    # types and ranges
    def types(self) -> None:
        for key, low in INT_KEYS.items():
            v = self.cfg.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                self.bad(key, v, "not an integer")
            if v < low:
                self.bad(key, v, f"must be at least {low}")
            if v > MAX_COUNT:
                self.bad(key, v, f"larger than the {MAX_COUNT:,} allowed")
        for key, (low, incl, high) in FLOAT_KEYS.items():
            v = self.cfg.get(key)
            if v is None:
                continue
            self._float(key, v, low, incl, high)
        for key in ("rope_scaling", "rope_parameters"):
            r = self.cfg.get(key)
            if r is None:
                continue
            if not isinstance(r, dict):
                self.bad(key, r, "not a JSON object")
            subs = [(f"{key}.{k}", v) for k, v in r.items() if isinstance(v, dict)]
            for label, d in [(key, r)] + subs:
                self._rope(label, d)
        arch = self.cfg.get("architectures")
        if arch is not None and (not isinstance(arch, list)
                                 or not all(isinstance(x, str) for x in arch)):
            self.bad("architectures", arch, "not a list of class names")
        mt = self.cfg.get("model_type")
        if mt is not None and not isinstance(mt, str):
            self.bad("model_type", mt, "not a string")
        lt = self.cfg.get("layer_types")
        if lt is not None:
            if not isinstance(lt, list) or not all(isinstance(x, str) for x in lt):
                self.bad("layer_types", lt, "not a list of strings")

    def _float(self, key, v, low, incl, high):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.bad(key, v, "not a number")
        if not math.isfinite(float(v)):
            self.bad(key, v, "not a finite number")
        if abs(v) > FLOAT_MAX:
            self.bad(key, v, f"beyond the {FLOAT_MAX:g} allowed (the network computes in "
                     "float32, whose range ends at 3.4e38)")
        if v < low or (v == low and not incl) or v > high:
            rng = f"{'[' if incl else '('}{_fmt(low)}, {_fmt(high) if high < math.inf else '∞'}"
            self.bad(key, v, f"outside {rng}{']' if high < math.inf else ')'}")

    def _rope(self, label: str, r: dict) -> None:
        t = r.get("rope_type", r.get("type"))
        if t is not None and not isinstance(t, str):
            self.bad(f"{label}.rope_type", t, "not a string")
        for k in ROPE_INTS:
            v = r.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                                  or not 1 <= v <= MAX_COUNT):
                self.bad(f"{label}.{k}", v, f"not an integer in [1, {MAX_COUNT:,}]")
        for k in ROPE_FLOATS:
            v = r.get(k)
            if v is not None:
                lo = 0.0 if k in ("factor", "rope_theta", "partial_rotary_factor") else -math.inf
                self._float(f"{label}.{k}", v, lo, k not in ("factor", "rope_theta"), math.inf)
        if str(t).lower() == "llama3":
            lo, hi = r.get("low_freq_factor", 1.0), r.get("high_freq_factor", 4.0)
            if hi <= lo:
                self.bad(f"{label}.high_freq_factor", hi,
                         f"must be above low_freq_factor ({_fmt(lo)}) for llama3 rope")

    # an explicit null is not an absent key: transformers' config classes take the null over
    # their default (DeepSeek-V3's head_dim becomes None, not qk_rope_head_dim), so a null
    # where the network needs a number builds a wrong network or fails inside it
    def nulls(self, f: Facts) -> None:
        c = self.cfg

        def refuse(key, why):
            if key in c and c[key] is None:
                self.bad(key, None, f"{why}; give a number or leave the key out")

        for keys in (LAYERS, HIDDEN, HEADS, VOCAB):
            if self.get(keys)[1] is None:
                for k in keys:
                    refuse(k, "the network's size needs it")
        held = bool(f.experts or f.fused)
        if held and self.get(TOPK)[1] is None:
            for k in TOPK:
                refuse(k, "the weights hold experts, and routing needs the experts per token")
        mt = c.get("model_type")
        if held and mt == "deepseek_v3":
            for k in ("n_group", "topk_group"):
                refuse(k, "DeepSeek-V3 routes over groups of experts")
            ng, tg, n = c.get("n_group"), c.get("topk_group"), self.get(EXPERTS)[1]
            if ng is not None and n is not None and n % ng:
                self.bad("n_group", ng, f"DeepSeek-V3 routes over n_group equal groups of the "
                         f"{_fmt(n)} experts")
            if ng is not None and tg is not None and tg > ng:
                self.bad("topk_group", tg, f"more groups than n_group ({_fmt(ng)})")
        if f.mla_kv:
            rope = c.get("qk_rope_head_dim")
            refuse("head_dim", "multi-head latent attention's head_dim is its qk_rope_head_dim"
                   + (f" ({_fmt(rope)})" if rope is not None else ""))
        lt = c.get("layer_types")
        if (isinstance(lt, list) and "sliding_attention" in lt) or \
                mt in ("gemma2", "gemma3", "gemma3_text", "cohere2"):
            refuse("sliding_window", "the model has sliding-window attention layers")

    # against the tensors
    def tensors(self, f: Facts) -> None:
        c = self.cfg
        lk, layers = self.get(LAYERS)
        if lk is not None:
            extra = c.get("num_nextn_predict_layers") or 0
            if f.n_layers == 0:
                self.fail(f"{self.label(lk)} is {_fmt(layers)}, but the weights hold no layer")
            # layers past the count only as DeepSeek's multi-token-prediction layers
            mtp_ok = all(i in f.mtp for i in range(layers, f.n_layers))
            if not layers <= f.n_layers <= layers + extra or not mtp_ok:
                held = f"{f.n_layers} layers (up to {f.last_layer})"
                self.fail(f"{self.label(lk)} is {_fmt(layers)}, but the weights hold {held}")
        fk = c.get("first_k_dense_replace")
        if fk is not None and lk is not None and fk > layers:
            self.bad("first_k_dense_replace", fk, f"more dense layers than {self.label(lk)} "
                     f"({_fmt(layers)})")
        lt = c.get("layer_types")
        if isinstance(lt, list) and lk is not None and len(lt) != layers:
            raise WorkbenchError(f"layer_types lists {len(lt)} layers, but {self.label(lk)} is "
                                 f"{_fmt(layers)}", path=self.path)
        hk, hidden = self.get(HIDDEN)
        vk, vocab = self.get(VOCAB)
        emb_cols_key = "embedding_size" if c.get("embedding_size") is not None else hk
        emb_cols = c.get("embedding_size") if c.get("embedding_size") is not None else hidden
        if f.embed is not None:
            name, rows, cols = f.embed
            if emb_cols is not None and cols != emb_cols:
                self.fail(f"{self.label(emb_cols_key)} is {_fmt(emb_cols)}, but {name} has "
                          f"{cols:,} columns")
            if vocab is not None and rows != vocab:
                self.fail(f"{self.label(vk)} is {_fmt(vocab)}, but {name} has {rows:,} rows")
        if f.head is not None and vocab is not None and f.head[1] != vocab:
            self.fail(f"{self.label(vk)} is {_fmt(vocab)}, but {f.head[0]} has {f.head[1]:,} "
                      "rows")
        pk, pos = self.get(POSITIONS)
        if f.positions is not None and pos is not None and f.positions[1] != pos:
            self.fail(f"{self.label(pk)} is {_fmt(pos)}, but {f.positions[0]} has "
                      f"{f.positions[1]:,} rows")
        tv = c.get("type_vocab_size")
        if f.type_vocab is not None and tv is not None and f.type_vocab[1] != tv:
            self.fail(f"type_vocab_size is {_fmt(tv)}, but {f.type_vocab[0]} has "
                      f"{f.type_vocab[1]:,} rows")
        self._attention(f, hk, hidden)
        self._mlp(f)
        self._experts(f, hidden)

    def _attention(self, f: Facts, hk, hidden) -> None:
        c = self.cfg
        nk, heads = self.get(HEADS)
        if heads is None:
            return
        kk, kv = self.get(KV_HEADS)
        if kv is None:
            kk, kv = nk, heads
        if kv > heads:
            self.bad(self.label(kk), kv, f"more key/value heads than {self.label(nk)} ({heads})")
        hd = c.get("head_dim")
        hd_label = self.label("head_dim")
        if hd is None and hidden is not None:
            if hidden % heads:
                self.bad(self.label(nk), heads, f"does not divide {self.label(hk)} "
                         f"({_fmt(hidden)}) and {self.what} has no head_dim")
            hd = hidden // heads
            hd_label = f"{self.label(hk)} / {self.label(nk)}"
        if hd is not None and not f.mla_kv:
            # each check compares rows with heads × head size
            for rows_list, n, key in ((f.q, heads, nk), (f.k, kv, kk), (f.v, kv, kk)):
                for name, rows in rows_list:
                    if rows != n * hd:
                        self.fail(f"{self.label(key)} × {hd_label} is {_fmt(n)} × {_fmt(hd)} = "
                                  f"{n * hd:,} rows, but {name} has {rows:,} rows")
            for name, rows in f.qkv:
                if rows != (heads + 2 * kv) * hd:
                    self.fail(f"({self.label(nk)} + 2 × {self.label(kk)}) × {hd_label} is "
                              f"({heads} + 2 × {kv}) × {_fmt(hd)} = {(heads + 2 * kv) * hd:,} "
                              f"rows, but {name} has {rows:,} rows")
        for name, cols in f.c_attn:
            if hidden is not None and cols != 3 * hidden:
                self.fail(f"{self.label(hk)} is {_fmt(hidden)} (q/k/v {3 * hidden:,} columns), "
                          f"but {name} has {cols:,} columns")
        nope, rope, vdim = c.get("qk_nope_head_dim"), c.get("qk_rope_head_dim"), \
            c.get("v_head_dim")
        if f.mla_kv and nope is not None and vdim is not None:
            for name, rows in f.mla_kv:
                if rows != heads * (nope + vdim):
                    self.fail(f"{self.label(nk)} is {heads} (× (qk_nope_head_dim + v_head_dim) = "
                              f"{heads * (nope + vdim):,} rows), but {name} has {rows:,} rows")
            hd = c.get("head_dim")
            if hd is not None and rope is not None and hd != rope:
                self.bad("head_dim", hd, f"multi-head latent attention's head_dim is its "
                         f"qk_rope_head_dim ({_fmt(rope)})")
            lora, qlora = c.get("kv_lora_rank"), c.get("q_lora_rank")
            if lora is not None and rope is not None:
                for name, rows in f.mla_kv_a:
                    if rows != lora + rope:
                        self.fail(f"kv_lora_rank + qk_rope_head_dim is {_fmt(lora)} + "
                                  f"{_fmt(rope)} = {lora + rope:,} rows, but {name} has "
                                  f"{rows:,} rows")
            if qlora is not None:
                for name, rows in f.mla_q_a:
                    if rows != qlora:
                        self.fail(f"q_lora_rank is {_fmt(qlora)}, but {name} has {rows:,} rows")
            if rope is not None:
                for name, rows in f.q + f.mla_q:
                    if rows != heads * (nope + rope):
                        self.fail(f"{self.label(nk)} is {heads} (× (qk_nope_head_dim + "
                                  f"qk_rope_head_dim) = {heads * (nope + rope):,} rows), but "
                                  f"{name} has {rows:,} rows")

    def _mlp(self, f: Facts) -> None:
        fk, ff = self.get(FF)
        if ff is not None:
            for name, rows in f.up:
                if rows != ff:
                    self.fail(f"{self.label(fk)} is {_fmt(ff)}, but {name} has {rows:,} rows")
            for name, rows in f.gate_up:
                if rows != 2 * ff:
                    self.fail(f"{self.label(fk)} is {_fmt(ff)} (gate and up: {2 * ff:,} rows), "
                              f"but {name} has {rows:,} rows")
        if f.c_fc:      # GPT-2: n_inner, or 4 x n_embd when null
            hk, hidden = self.get(HIDDEN)
            want, key = (ff, fk) if ff is not None else \
                ((4 * hidden, f"4 × {self.label(hk)}") if hidden is not None else (None, None))
            for name, cols in f.c_fc:
                if want is not None and cols != want:
                    self.fail(f"{key} is {_fmt(want)}, but {name} has {cols:,} columns")
        mk = "moe_intermediate_size" if self.cfg.get("moe_intermediate_size") is not None else fk
        mff = self.cfg.get(mk) if mk else None
        if mff is not None:
            for name, rows in f.expert_up:
                if rows != mff:
                    self.fail(f"{self.label(mk)} is {_fmt(mff)}, but expert tensor {name} has "
                              f"{rows:,} rows")

    def _experts(self, f: Facts, hidden) -> None:
        for i in set(f.experts) & set(f.fused):
            self.fail(f"layer {i} holds both fused expert tensors ({f.fused[i][0][0]}) and "
                      f"per-expert ones ({f.per_expert_name[i]}): which are the model's is "
                      "ambiguous")
        ek, n = self.get(EXPERTS)
        held = {}     # layer -> (count, a tensor naming it)
        for i, idx in f.experts.items():
            if sorted(idx) != list(range(len(idx))):
                missing = sorted(set(range(max(idx) + 1)) - idx)[:4]
                self.fail(f"layer {i}'s experts are numbered {min(idx)}..{max(idx)} with "
                          f"{len(idx)} present (missing {missing})")
            held[i] = (len(idx), f.per_expert_name[i])
        for i, lst in f.fused.items():
            for name, k in lst:
                held.setdefault(i, (k, name))
                if k != held[i][0]:
                    self.fail(f"layer {i}'s expert tensors disagree on the expert count "
                              f"({held[i][1]}: {held[i][0]}, {name}: {k})")
        routers = list(f.routers)
        if n is None:
            if held:
                i, (k, name) = next(iter(held.items()))
                self.fail(f"the weights hold {k} experts per layer ({name}) but there is no "
                          f"expert count ({self.label(EXPERTS[0])})")
            return
        for i, (k, name) in held.items():
            if k != n:
                self.fail(f"{self.label(ek)} is {_fmt(n)}, but layer {i} holds {k} experts "
                          f"({name})")
        for name, rows, cols in routers:
            if rows != n:
                self.fail(f"{self.label(ek)} is {_fmt(n)}, but the router {name} has {rows:,} "
                          "rows")
            if hidden is not None and cols != hidden:
                self.fail(f"the router {name} has {cols:,} columns, but hidden size is "
                          f"{_fmt(hidden)}")
        if n > 1 and not held:
            self.fail(f"{self.label(ek)} is {_fmt(n)}, but the weights hold no expert tensors")
        tk, topk = self.get(TOPK)
        if topk is not None and held and not 1 <= topk <= n:
            self.bad(self.label(tk), topk, f"must be in [1, {self.label(ek)} = {_fmt(n)}]")


def check_config(model, cfg: dict, path) -> None:
    """Refuse (WorkbenchError naming `path`) a config whose values are malformed or contradict
    the tensors of `model`."""
    if not isinstance(cfg, dict):
        return
    _run(_Checker(cfg, path), model)


def _run(ch: _Checker, model) -> None:
    ch.types()
    f = facts(model)
    ch.nulls(f)
    ch.tensors(f)
    # a nested text config (Gemma 3, multimodal wrappers) describes the language model's
    # tensors as the top level does a plain model's: checked the same way against them
    for key in NESTED:
        sub = ch.cfg.get(key)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            ch.bad(key, sub, "not a JSON object")
        label = ch.label
        _run(_Checker(sub, ch.path, lambda k, key=key: label(f"{key}.{k}"), ch.what),
             text_part(model))


def check_effective(model, cfg: dict, config, path, prefix: str = "") -> None:
    """The same checks on what transformers will build: config.json with the values its config
    class fills in for keys the file leaves out (Qwen3-MoE's 8 experts per token, DeepSeek-V3's
    128 key/value heads and 8 expert groups), each named as such in a refusal."""
    filled = {}
    for k in (*INT_KEYS, *FLOAT_KEYS, "layer_types"):
        if k not in cfg:
            v = getattr(config, k, None)
            if isinstance(v, tuple):
                v = list(v)
            if v is not None:
                filled[k] = v
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in NESTED:      # the defaults transformers fills into a nested text config
        sub = cfg.get(key)
        if isinstance(sub, dict) and text is not config and text is not None:
            check_effective(text_part(model), sub, text, path, prefix=f"{key}.")
    if not filled:
        return
    _run(_Checker({**cfg, **filled}, path, lambda k: f"{prefix}{k} (transformers' default: "
                  f"config.json leaves it out)" if k in filled else f"{prefix}{k}"), model)


def check_gguf_metadata(model) -> None:
    """A GGUF's hyper-parameters against its tensors (workbench.formats.config_gguf)."""
    from workbench.formats.config_gguf import check_gguf_metadata as check
    check(model)


def config_path(model) -> Path:
    """The config.json of `model`: beside its weights, or in the companion folder of a GGUF
    read as a Hugging Face model (Model.folder)."""
    from workbench.formats.llama_names import model_folder
    return model_folder(model) / "config.json"


def check_model_config(model) -> None:
    """check_config on the config.json beside `model`, where there is one that reads as a JSON
    object (a command that also works without a runnable model, e.g. allocate falling back to
    the weight measure, still refuses a config its weights contradict)."""
    path = config_path(model)
    if not path.is_file():
        return        # absent: the commands that need it say so
    from workbench.core.limits import load_sidecar_json
    # too large, nested too deeply or malformed: refused here too (never read as "absent")
    cfg = load_sidecar_json(path, "config.json")
    check_config(model, cfg, path)
