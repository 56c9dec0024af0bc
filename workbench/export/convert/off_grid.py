"""An exact reparametrisation that takes a quantized model's weights off their grid.

A GGUF dequantized to float still holds the values of its quantization grid: every block of
a Q4_1 tensor is d·q + m for 4-bit q. A quantizer that finds that grid again scores far better
than it would on a real float model, so comparisons on such a source are unfair. This module
changes the weights without changing the function the network computes (in exact arithmetic;
float32 rounding aside), in llama.cpp's tensor names (the GGUF's own; a norm there always holds
the multiplier the runtime applies, Gemma's ``1 + w`` included, so identity is 1 for every
architecture):

* each pre-attention RMSNorm's gain g (``blk.N.attn_norm``) is folded into the columns of the
  Linear layers it feeds, ``attn_q``/``attn_k``/``attn_v`` (W·diag(g)), and the norm becomes
  the identity; the pre-MLP norm (``blk.N.ffn_norm``: Llama's post_attention_layernorm, Gemma
  3's pre_feedforward_layernorm) likewise into ``ffn_gate``/``ffn_up``. For Gemma 3, whose
  gains reach the hundreds, only a random factor r per channel moves (W·diag(r), the norm
  g / r): see ARCHS;
* the final norm into an untied output head (never into a head tied to the embeddings: that
  would change the embeddings too);
* v's rows are scaled by random factors s (exp(U(-0.5, 0.5)), seeded) and the attention
  output's matching columns by 1/s: attention mixes v linearly per kv head, and with grouped
  query attention o's column block of query head h belongs to kv head h // (n_head / n_kv);
* up's rows by t and down's matching columns by 1/t (the MLP is act(gate)·up, linear in up).

What is not folded, because folding would not be exact: Gemma 3's post-attention and
post-feed-forward norms (they normalize a Linear's output: no Linear follows before the
residual add), its per-head q/k norms (the rotary embedding after them mixes channel pairs)
and a final norm in front of a tied head. Tensors no change reaches (the token embeddings)
stay on their source grid; :func:`off_grid` lists them so a comparison can leave them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.export.convert.source import Change, decode

#: llama.cpp architectures whose block structure this module knows (pre-norm decoder: attn_norm
#: feeds q/k/v only, ffn_norm feeds gate/up only, RMSNorm without bias). Others are refused.
#: "norms": "fold" moves a norm's whole gain into the Linear layers it feeds; "factor" moves only
#: a bounded random factor per channel (the norm keeps g / r, the columns take r). Gemma 3's norm
#: multipliers (1 + w) reach the hundreds: folded, they leave columns whose scales differ by
#: orders of magnitude, a source no quantizer meets fairly (llama.cpp's own Q8_0 of the folded
#: Gemma 3 270M scored a mean KLD of 1.08 against 0.003 for the unfolded one).
ARCHS = {
    "llama": {"norms": "fold"},
    "gemma3": {"attn_post_norm": "post_attention_norm", "ffn_post_norm": "post_ffw_norm",
               "norms": "factor"},
}
KEPT_REASONS = {
    "post_attention_norm": "normalizes the attention output before the residual add: no "
                           "Linear follows to fold its gain into",
    "post_ffw_norm": "normalizes the MLP output before the residual add: no Linear follows to "
                     "fold its gain into",
    "attn_q_norm": "per-head norm ahead of the rotary embedding, which mixes channel pairs: a "
                   "gain folded across it is not exact",
    "attn_k_norm": "per-head norm ahead of the rotary embedding, which mixes channel pairs: a "
                   "gain folded across it is not exact",
}
FACTOR_RANGE = 0.5     # factors exp(U(-0.5, 0.5)): 0.61 ... 1.65


@dataclass
class OffGrid:
    seed: int
    changes: dict = field(default_factory=dict)        # tensor name -> Change
    folded_norms: list = field(default_factory=list)   # norms folded (now identity)
    factored_norms: list = field(default_factory=list)  # norms that passed a factor r on
    scaled_pairs: list = field(default_factory=list)   # [rows-scaled, columns-scaled by 1/s]
    not_folded: dict = field(default_factory=dict)     # norm name -> why it is kept

    def to_dict(self) -> dict:
        return {"seed": self.seed, "changed": sorted(self.changes),
                "folded_norms": self.folded_norms, "factored_norms": self.factored_norms,
                "scaled_pairs": self.scaled_pairs, "not_folded": self.not_folded}


def factors(seed: int, layer: int, kind: int, n: int) -> np.ndarray:
    """n factors exp(U(-0.5, 0.5)) of one layer's v (kind 0) or up (kind 1) rows, or of the
    channels of its attention (2) or MLP (3) norm (the output norm: layer = block count, kind
    2), from their own stream of the seed (independent of the order tensors are read in)."""
    rng = np.random.default_rng([int(seed), int(layer), int(kind)])
    return np.exp(rng.uniform(-FACTOR_RANGE, FACTOR_RANGE, n)).astype(np.float32)


def _meta_int(md: dict, key: str, layer: int, path: str):
    v = md.get(key)
    if isinstance(v, list):
        v = v[layer] if layer < len(v) else None
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
        raise WorkbenchError(f"off_grid=: metadata {key} missing or not a positive integer",
                             path=path, params=("off_grid",))
    return int(v)


def off_grid(model, seed: int = 0) -> OffGrid:
    """The changes that take `model`'s (a GGUF) Linear weights off their grid, exactly."""
    md, path = model.metadata, model.path
    arch = md.get("general.architecture")
    if arch not in ARCHS:
        raise WorkbenchError(f"off_grid= knows the block structure of {', '.join(sorted(ARCHS))} "
                             f"GGUFs, not {arch!r}: convert without off_grid=", path=path,
                             params=("off_grid",))
    if seed < 0:
        raise WorkbenchError(f"off_grid={seed}: the seed must be a non-negative integer",
                             params=("off_grid",))
    names = set(model.tensors)
    n_layers = _meta_int(md, f"{arch}.block_count", 0, path)
    og = OffGrid(seed)
    acc: dict[str, dict] = {}

    def scale(name: str, key: str, vec: np.ndarray) -> None:
        info = model.info(name)
        n = info.rows if key == "rows" else info.cols
        if vec.shape != (n,):
            raise WorkbenchError(f"off_grid=: {len(vec)} factors for {key} of a "
                                 f"{info.rows}x{info.cols} tensor", path=path, tensor=name,
                                 params=("off_grid",))
        d = acc.setdefault(name, {})
        d[key] = vec if key not in d else d[key] * vec

    def gain(name: str) -> np.ndarray:
        return decode(model, name, 0, 1).reshape(-1).astype(np.float32)

    mode = ARCHS[arch]["norms"]

    def fold(norm: str, into: list[str], layer: int, kind: int) -> None:
        if norm + ".bias" in names:
            raise WorkbenchError("off_grid=: a norm with a bias (LayerNorm) cannot be folded "
                                 "into the layers it feeds", path=path, tensor=norm + ".weight",
                                 params=("off_grid",))
        if mode == "factor":          # diag(g) = diag(g / r) diag(r)
            r = factors(seed, layer, kind, model.info(norm + ".weight").numel)
            for t in into:
                scale(t + ".weight", "cols", r)
            scale(norm + ".weight", "cols", (1.0 / r).astype(np.float32))
            og.factored_norms.append(norm + ".weight")
            return
        g = gain(norm + ".weight")
        for t in into:
            scale(t + ".weight", "cols", g)
        acc[norm + ".weight"] = {"fill": 1.0}
        og.folded_norms.append(norm + ".weight")

    for i in range(n_layers):
        b = f"blk.{i}."
        need = [b + t + ".weight" for t in ("attn_norm", "attn_q", "attn_k", "attn_v",
                                            "attn_output", "ffn_norm", "ffn_up", "ffn_down")]
        missing = [t for t in need if t not in names]
        if missing:
            raise WorkbenchError(f"off_grid=: block {i} has no {missing[0]} (fused or "
                                 "mixture-of-experts layers are not supported)", path=path,
                                 params=("off_grid",))
        fold(b + "attn_norm", [b + "attn_q", b + "attn_k", b + "attn_v"], i, 2)
        gate = [b + "ffn_gate"] if b + "ffn_gate.weight" in names else []
        fold(b + "ffn_norm", gate + [b + "ffn_up"], i, 3)
        # v rows by s, o columns by 1/s (grouped-query attention: query head h reads kv head
        # h // (n_head / n_kv))
        n_head = _meta_int(md, f"{arch}.attention.head_count", i, path)
        n_kv = n_head if md.get(f"{arch}.attention.head_count_kv") is None else \
            _meta_int(md, f"{arch}.attention.head_count_kv", i, path)
        v, o = b + "attn_v.weight", b + "attn_output.weight"
        v_rows, o_cols = model.info(v).rows, model.info(o).cols
        if n_head % n_kv or v_rows % n_kv or o_cols != n_head * (v_rows // n_kv):
            raise WorkbenchError(f"off_grid=: block {i}: attn_v ({v_rows} rows) and attn_output "
                                 f"({o_cols} columns) do not fit {n_head} heads over {n_kv} kv "
                                 "heads", path=path, params=("off_grid",))
        hd, group = v_rows // n_kv, n_head // n_kv
        s = factors(seed, i, 0, v_rows)
        scale(v, "rows", s)
        if b + "attn_v.bias" in names:
            scale(b + "attn_v.bias", "cols", s)     # a 1-D bias is one row of v_rows values
        inv = (1.0 / s).reshape(n_kv, hd)
        scale(o, "cols", np.ascontiguousarray(np.repeat(inv, group, axis=0).reshape(-1)))
        og.scaled_pairs.append([v, o])
        up, down = b + "ffn_up.weight", b + "ffn_down.weight"
        t = factors(seed, i, 1, model.info(up).rows)
        scale(up, "rows", t)
        if b + "ffn_up.bias" in names:
            scale(b + "ffn_up.bias", "cols", t)
        scale(down, "cols", (1.0 / t).astype(np.float32))
        og.scaled_pairs.append([up, down])
        for n in sorted(names):
            if n.startswith(b):
                kind = n[len(b):].rsplit(".", 1)[0]
                if kind in KEPT_REASONS:
                    og.not_folded[n] = KEPT_REASONS[kind]
    if "output.weight" in names and "output_norm.weight" in names:
        fold("output_norm", ["output"], n_layers, 2)
    elif "output_norm.weight" in names:
        og.not_folded["output_norm.weight"] = ("the output head is tied to the token "
                                               "embeddings: folding would change them too")
    og.changes = {n: Change(rows=d.get("rows"), cols=d.get("cols"), fill=d.get("fill"))
                  for n, d in acc.items()}
    return og


def on_source_grid(model, changes: dict) -> list[str]:
    """The tensors stored quantized in the source that no change reaches: their values are
    still the source grid's (e.g. the token embeddings)."""
    from workbench.formats.dtypes import STORAGE
    return [n for n, i in model.tensors.items() if n not in changes and i.dtype not in STORAGE]
