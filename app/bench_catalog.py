"""A generated catalog of many tensors for `bench-gui --tensors N` (issue 23): a
mixture-of-experts model laid out like DeepSeek-V3 in Hugging Face form (per-expert tensors),
held in memory — only the header (names, shapes, dtypes) is real; a tensor's values are made
when they are read (seeded by its index, so every run reads the same numbers)."""

from __future__ import annotations

import numpy as np

from workbench.api.models import Model, TensorInfo

HIDDEN, EXPERT_ROWS, ATTN = 64, 32, 64


def _layer_names(i: int, n_experts: int) -> list[tuple[str, tuple]]:
    p = f"model.layers.{i}."
    out = [(p + "input_layernorm.weight", (HIDDEN,)),
           (p + "self_attn.q_proj.weight", (ATTN, HIDDEN)),
           (p + "self_attn.k_proj.weight", (ATTN, HIDDEN)),
           (p + "self_attn.v_proj.weight", (ATTN, HIDDEN)),
           (p + "self_attn.o_proj.weight", (HIDDEN, ATTN)),
           (p + "post_attention_layernorm.weight", (HIDDEN,)),
           (p + "mlp.gate.weight", (n_experts, HIDDEN))]
    for e in range(n_experts):
        q = f"{p}mlp.experts.{e}."
        out += [(q + "gate_proj.weight", (EXPERT_ROWS, HIDDEN)),
                (q + "up_proj.weight", (EXPERT_ROWS, HIDDEN)),
                (q + "down_proj.weight", (HIDDEN, EXPERT_ROWS))]
    return out


def make_catalog(n_tensors: int, n_layers: int | None = None, path: str = "generated-moe") -> Model:
    """A Model of exactly `n_tensors` tensors: embeddings, `n_layers` MoE blocks (default 61, as
    DeepSeek-V3, fewer for small catalogs) with as many experts as fit, final norm and head."""
    if n_layers is None:
        n_layers = max(1, min(61, (n_tensors - 3) // 13))
    head = [("model.embed_tokens.weight", (1024, HIDDEN)), ("model.norm.weight", (HIDDEN,)),
            ("lm_head.weight", (1024, HIDDEN))]
    per_layer_fixed = 7
    left = n_tensors - len(head) - n_layers * per_layer_fixed
    if left < 0:
        raise ValueError(f"{n_tensors} tensors cannot hold {n_layers} layers")
    experts = left // (3 * n_layers)
    extra = left - experts * 3 * n_layers      # < 3 * n_layers: one more expert on some layers
    names = [head[0]]
    for i in range(n_layers):
        more = 1 if extra >= 3 else 0
        extra -= 3 * more
        names += _layer_names(i, experts + more)
    names += head[1:]
    # what is left (0..2 tensors): biases of the last layer's attention
    for k in range(extra):
        names.append((f"model.layers.{n_layers - 1}.self_attn.{'qk'[k]}_proj.bias", (ATTN,)))
    assert len(names) == n_tensors, (len(names), n_tensors)
    tensors = {n: TensorInfo(n, shape, "F32", 4 * int(np.prod(shape)), path)
               for n, shape in names}
    index = {n: k for k, (n, _) in enumerate(names)}

    def raw(name: str) -> np.ndarray:
        info = tensors[name]
        rng = np.random.default_rng(index[name])
        if info.ndim == 1:
            return (1.0 + 0.05 * rng.standard_normal((1, info.numel))).astype(np.float32)
        return (rng.standard_normal(info.matrix_shape) * 0.02).astype(np.float32)

    return Model(path, "safetensors", tensors, raw, {})
