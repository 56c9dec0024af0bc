"""Generators for issue 32's config.json classes, one kind each; every case is a JSON spec that
tests/fuzz/hostile_config.py carries out on a tiny generated architecture (tests/tiny_archs.py).

    config-tensors  2  config.json (or a GGUF's metadata) contradicting the tensors: layers,
                       hidden size, vocabulary, heads, head size, MLP width, experts,
                       experts-per-token, routers; tensors the GGUF writer cannot name (fused
                       Mixtral experts); benign edits that must still work
    config-counts   3  counts far beyond the weights: 10^6 layers, a 10^12 vocabulary or
                       added-token id, 10^9 experts, 10^12 widths and positions
    config-values   6  malformed values: zero / negative / NaN / bool / string / list / null
                       sizes, or the key left out,
                       rope settings missing keys or not numbers, hostile tokenizer.json,
                       fused and per-expert tensors both present, --budget-bpw extremes
"""

from __future__ import annotations

import json
import random

DENSE = ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "gpt2", "bert"]
MOE = ["qwen3_moe", "mixtral", "deepseek_v3"]
# the commands that read config.json (check and calibrate run the network: the slowest)
COMMANDS = ["check", "calibrate", "allocate", "export-gguf", "export-ct", "export-onnx",
            "sensitivity"]
# per architecture: (layers key, hidden key, heads key)
KEYS = {"gpt2": ("n_layer", "n_embd", "n_head")}


def _keys(arch):
    return KEYS.get(arch, ("num_hidden_layers", "hidden_size", "num_attention_heads"))


def _cmd(r: random.Random, arch: str) -> str:
    cmds = list(COMMANDS)
    if arch == "bert":          # an encoder: no causal check / GGUF of it is fine too
        cmds = [c for c in cmds if c != "sensitivity"]
    return r.choice(cmds)


def _spec(arch, ops, cmd, contradicts, **kw):
    return "case.json", json.dumps({"arch": arch, "ops": ops, "cmd": cmd,
                                    "contradicts": contradicts, **kw}).encode()


# ---- 2 config-tensors -----------------------------------------------------------------------
def config_tensors(r: random.Random):
    if r.random() < 0.12:       # a GGUF whose metadata contradicts its tensors (GGUF -> GGUF)
        m = r.randint(0, 5)
        g = [{}, {"expert_count": 8}, {"block_count": 3}, {"used": 9}, {"embd": 48},
             {"heads": 8}][m]
        return "case.json", json.dumps({"cmd": "gguf-gguf", "gguf": g, "contradicts": m > 0,
                                        "ops": []}).encode()
    moe = r.random() < 0.35
    arch = r.choice(MOE if moe else DENSE)
    lk, hk, nk = _keys(arch)
    m = r.randint(0, 12)
    cmd = _cmd(r, arch)
    if m == 0:
        return _spec(arch, [["set", lk, 1]], cmd, True)             # a layer past the count
    if m == 1:
        return _spec(arch, [["set", lk, 3]], cmd, True)             # a layer missing
    if m == 2:
        return _spec(arch, [["set", hk, r.choice([384, 512, 192])]], cmd, True)
    if m == 3:
        return _spec(arch, [["set", "vocab_size", r.choice([511, 513, 1024, 256])]], cmd, True)
    if m == 4:
        return _spec(arch, [["set", nk, r.choice([2, 8, 16])], ["set", "head_dim", 64]]
                     if arch not in ("gpt2", "bert") else [["set", nk, r.choice([3, 7])]],
                     cmd, True)
    if m == 5 and arch not in ("gpt2", "bert", "deepseek_v3"):
        return _spec(arch, [["set", "num_key_value_heads", r.choice([1, 4])]], cmd, True)
    if m == 6 and arch not in ("gpt2", "bert", "phi3", "deepseek_v3"):
        return _spec(arch, [["set", "intermediate_size", r.choice([256, 1024])]], cmd,
                     arch not in ("qwen3_moe",))
    if m == 7 and moe:
        key = {"qwen3_moe": "num_experts", "mixtral": "num_local_experts",
               "deepseek_v3": "n_routed_experts"}[arch]
        if arch == "qwen3_moe":
            key = "num_local_experts"
        return _spec(arch, [["set", key, r.choice([2, 3, 8])]], cmd, True)
    if m == 8 and moe:
        return _spec(arch, [["set", "num_experts_per_tok", r.choice([5, 9, 0])]], cmd, True)
    if m == 9:                  # a tensor no llama.cpp name exists for
        return _spec(arch, [["add", "model.layers.0.mlp.extra_proj.weight" if arch not in
                             ("gpt2", "bert") else "transformer.h.0.extra.weight", [8, 8]]],
                     "export-gguf", True)
    if m == 10 and arch == "mixtral":   # fused Mixtral experts: no llama.cpp name
        return _spec(arch, [["fuse", False, "block_sparse_moe"]], "export-gguf", True)
    if m == 11 and moe:         # a router of the wrong width
        prefix = "block_sparse_moe" if arch == "mixtral" else "mlp"
        layer = 1 if arch == "deepseek_v3" else 0
        return _spec(arch, [["drop", f"layers.{layer}.{prefix}.gate.weight"],
                            ["add", f"model.layers.{layer}.{prefix}.gate.weight", [6, 256]]],
                     cmd, True)
    # benign: keys nothing compares, or the same values written again: must still work
    benign = r.choice([[["set", "_comment", "edited"]], [["set", "max_position_embeddings", 1024]]
                       if arch not in ("gpt2", "bert") else [], [["set", "rms_norm_eps", 1e-5]]
                       if arch not in ("gpt2", "bert") else [], []])
    return _spec(arch, benign, r.choice(["allocate", "export-gguf", "export-ct"]), False)


# ---- 3 config-counts ------------------------------------------------------------------------
def config_counts(r: random.Random):
    moe = r.random() < 0.3
    arch = r.choice(MOE if moe else DENSE)
    lk, hk, nk = _keys(arch)
    m = r.randint(0, 8)
    cmd = _cmd(r, arch)
    if m == 0:
        return _spec(arch, [["set", lk, r.choice([10**6, 10**9, 2**40])]], cmd, True)
    if m == 1:
        return _spec(arch, [["set", "vocab_size", r.choice([10**12, 2**31 - 1, 10**9])]], cmd,
                     True)
    if m == 2:
        return _spec(arch, [["tok", "added_id", r.choice([10**12, 2**32, 10**6])]],
                     r.choice(["check", "calibrate", "allocate", "export-gguf"]), False)
    if m == 3:
        return _spec(arch, [["tok", "vocab_id", r.choice([10**12, 2**31, 10**6])]],
                     r.choice(["check", "calibrate", "export-gguf"]), False)
    if m == 4 and moe:
        key = {"qwen3_moe": "num_local_experts", "mixtral": "num_local_experts",
               "deepseek_v3": "n_routed_experts"}[arch]
        return _spec(arch, [["set", key, r.choice([10**9, 2**31 - 1, 10**6])]], cmd, True)
    if m == 5:
        keys = {"gpt2": ["n_inner", hk], "bert": ["intermediate_size", hk]}.get(
            arch, ["intermediate_size", hk, "head_dim"])
        if arch in ("phi3", "qwen3_moe", "deepseek_v3"):
            keys = [hk, "head_dim"]
        return _spec(arch, [["set", r.choice(keys), r.choice([10**12, 2**31 - 1, 10**9])]], cmd,
                     True)
    if m == 6:
        key = "n_positions" if arch == "gpt2" else "max_position_embeddings"
        n = r.choice([10**12, 2**31 - 1, 10**9])
        # a learnt position table (GPT-2, BERT) bounds it; elsewhere only the type check does
        return _spec(arch, [["set", key, n]], cmd, arch in ("gpt2", "bert") or n > 2**31 - 1)
    if m == 7 and moe:
        return _spec(arch, [["set", "num_experts_per_tok", r.choice([10**9, 10**12])]], cmd, True)
    return _spec(arch, [["set", r.choice(["num_nextn_predict_layers", "first_k_dense_replace",
                                          "sliding_window", "num_key_value_heads"]),
                         r.choice([10**12, 10**6])]], cmd, False)


# ---- 6 config-values ------------------------------------------------------------------------
BAD_VALUES = [0, -1, -64, float("nan"), float("inf"), True, "256", [256], {"a": 1}, 0.5, 1e308,
              None]


def config_values(r: random.Random):
    moe = r.random() < 0.25
    arch = r.choice(MOE if moe else DENSE)
    lk, hk, nk = _keys(arch)
    m = r.randint(0, 7)
    cmd = _cmd(r, arch)
    if m == 0:                       # a size or count that is no positive integer
        key = r.choice([lk, hk, nk, "num_key_value_heads", "head_dim", "vocab_size",
                        "intermediate_size", "num_experts_per_tok", "moe_intermediate_size",
                        "num_local_experts", "n_routed_experts", "qk_nope_head_dim",
                        "v_head_dim", "kv_lora_rank", "sliding_window", "type_vocab_size"])
        if r.random() < 0.2:         # left out: transformers' default is what runs
            return _spec(arch, [["del", key]], cmd, False)
        return _spec(arch, [["set", key, r.choice(BAD_VALUES)]], cmd, False)
    if m == 1:                       # a float hyper-parameter that is no finite number
        key = r.choice(["rope_theta", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
                        "final_logit_softcapping", "attn_logit_softcapping",
                        "query_pre_attn_scalar", "routed_scaling_factor",
                        "partial_rotary_factor"])
        return _spec(arch, [["set", key, r.choice(BAD_VALUES)]], cmd, False)
    if m == 2:                       # rope settings: yarn / llama3 missing keys, bad types
        rope = r.choice([{"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0},
                         {"rope_type": "yarn", "factor": "x", "rope_theta": 10000.0,
                          "original_max_position_embeddings": 128},
                         {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                          "original_max_position_embeddings": -1},
                         {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 1.0, "rope_theta": 10000.0,
                          "original_max_position_embeddings": 128},
                         {"rope_type": "llama3", "rope_theta": 10000.0},
                         {"rope_type": "linear", "factor": float("nan"), "rope_theta": 1e4},
                         {"rope_type": 7}, "yarn", [1, 2], {"rope_theta": -1.0},
                         {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}])
        key = r.choice(["rope_parameters", "rope_scaling"])
        return _spec(arch, [["set", key, rope]], r.choice(["export-gguf", "export-gguf",
                                                            "check", "allocate"]), False)
    if m == 3:                       # a hostile tokenizer.json
        what = r.choice([["raw", "{}"], ["raw", "garbage"], ["raw", "[]"],
                         ["model", {"type": "BPE", "vocab": [1, 2], "merges": []}],
                         ["model", {"type": "Unigram", "vocab": "x"}],
                         ["merges", [[1, 2]]], ["merges", "x"], ["vocab_id", "12"],
                         ["vocab_id", -5], ["added", "x"], ["added", [{"id": "3",
                                                                      "content": "a"}]],
                         ["added", [{"id": 3, "content": ["a"]}]]])
        return _spec(arch if arch != "bert" else "llama", [["tok", *what]],
                     r.choice(["check", "calibrate", "allocate", "export-gguf"]), False)
    if m == 4 and moe and arch != "deepseek_v3":   # fused and per-expert tensors both present
        return _spec(arch, [["fuse", True, "mlp"]], cmd, True)
    if m == 5:                       # --budget-bpw extremes
        return _spec(arch, [], "allocate", False,
                     argv=["--budget-bpw", r.choice(["1e308", "inf", "nan", "-1", "0", "1e-300",
                                                     "1024", "1e400"])])
    if m == 6:                       # layer_types of the wrong length or kind
        return _spec(arch, [["set", "layer_types", r.choice([["full_attention"] * 5, [1, 2],
                                                             "full", ["x", "y"]])]], cmd, False)
    return _spec(arch, [["set", r.choice(["architectures", "model_type", "tie_word_embeddings",
                                          "rope_scaling", "head_dim"]),
                         r.choice([None, 5, "x", [], {"a": 1}, ["NoSuchForCausalLM"]])]],
                 cmd, False)


GENERATORS = {"config-tensors": config_tensors, "config-counts": config_counts,
              "config-values": config_values}
