"""A small GGUF with llama.cpp's merged 3-D expert tensors, written with gguf's GGUFWriter.

``write_moe_gguf(path)``: architecture ``qwen3moe``, `n_layer` blocks of `n_expert` experts:
router ``blk.N.ffn_gate_inp.weight`` (F32), merged experts ``blk.N.ffn_{gate,up,down}_exps.weight``
(numpy shape (n_expert, rows, cols); gate/up F16, down Q8_0 through gguf's own quantizer), a
shared expert ``ffn_{gate,up,down}_shexp`` and its gate ``ffn_gate_inp_shexp``. Expert e's weights
are scaled by (1 + e), so per-expert statistics have a known order.
"""

from __future__ import annotations

import numpy as np


def expert_weights(n_layer=2, n_expert=4, hidden=256, inter=256, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    t = {"token_embd.weight": rng.normal(0, 0.02, (64, hidden)).astype(np.float32),
         "output_norm.weight": np.ones(hidden, np.float32),
         "output.weight": rng.normal(0, 0.02, (64, hidden)).astype(np.float32)}
    scale = (1.0 + np.arange(n_expert, dtype=np.float32))[:, None, None]
    for b in range(n_layer):
        p = f"blk.{b}."
        t[p + "attn_norm.weight"] = np.ones(hidden, np.float32)
        t[p + "attn_q.weight"] = rng.normal(0, 0.02, (hidden, hidden)).astype(np.float32)
        t[p + "ffn_norm.weight"] = np.ones(hidden, np.float32)
        t[p + "ffn_gate_inp.weight"] = rng.normal(0, 0.02, (n_expert, hidden)).astype(np.float32)
        t[p + "ffn_gate_exps.weight"] = (rng.normal(0, 0.02, (n_expert, inter, hidden))
                                         * scale).astype(np.float32)
        t[p + "ffn_up_exps.weight"] = (rng.normal(0, 0.02, (n_expert, inter, hidden))
                                       * scale).astype(np.float32)
        t[p + "ffn_down_exps.weight"] = (rng.normal(0, 0.02, (n_expert, hidden, inter))
                                         * scale).astype(np.float32)
        t[p + "ffn_gate_shexp.weight"] = rng.normal(0, 0.02, (inter, hidden)).astype(np.float32)
        t[p + "ffn_up_shexp.weight"] = rng.normal(0, 0.02, (inter, hidden)).astype(np.float32)
        t[p + "ffn_down_shexp.weight"] = rng.normal(0, 0.02, (hidden, inter)).astype(np.float32)
        t[p + "ffn_gate_inp_shexp.weight"] = rng.normal(0, 0.02, (1, hidden)).astype(np.float32)
    return t


def write_moe_gguf(path, n_layer=2, n_expert=4, hidden=256, inter=256, seed=0) -> dict:
    """Write the GGUF; returns the float32 weights written (before F16 / Q8_0 storage)."""
    import gguf
    weights = expert_weights(n_layer, n_expert, hidden, inter, seed)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(n_layer)
    w.add_embedding_length(hidden)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(inter)
    for name, arr in weights.items():
        if name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
            w.add_tensor(name, arr.astype(np.float16))
        elif name.endswith("ffn_down_exps.weight"):
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights
