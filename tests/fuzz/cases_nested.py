"""Generators for issue 47's nested-config kinds; every case is a JSON spec that
tests/fuzz/hostile_nested.py carries out.

    nested-text   a multimodal Gemma 3 folder (tests/tiny_archs.py's gemma3_text under
                  ``text_config``, a vision tower's tensors beside it, the language model's
                  under ``model.language_model.`` or at the top): text_config keys set to
                  contradicting values, to their true values, left out, of the wrong type;
                  text_config itself not an object or null; checked in-process (check_config)
                  or by export --format compressed-tensors / check
    nested-kv     a tiny llama GGUF whose ``llama.attention.head_count_kv`` (or head_count,
                  feed_forward_length) is a per-layer array: uniform and true, uniform and
                  false, of the wrong length, mixed, zero, negative, huge, of floats or strings;
                  run through convert --to hf, check, export --format gguf or the GGUF
                  metadata check
"""

from __future__ import annotations

import json
import random

TEXT_KEYS = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 512, "intermediate_size": 512,
             "head_dim": 64}
WRONG = {"num_hidden_layers": [1, 3, 26], "hidden_size": [128, 512, 2304],
         "num_attention_heads": [2, 8, 16], "num_key_value_heads": [1, 4],
         "vocab_size": [511, 1024, 262144], "intermediate_size": [256, 1024],
         "head_dim": [32, 128]}
BAD_TYPES = ["2", 2.5, True, [2], {"a": 1}, -1, 0, 2**40]


def _spec(**kw):
    return "case.json", json.dumps(kw).encode()


def nested_text(r: random.Random):
    prefix = r.choice(["", "model.language_model."])
    cmd = r.choice(["config", "config", "export-ct", "check"])
    vision_layers = r.choice([1, 5, 40])
    m = r.randint(0, 6)
    if m <= 2:
        key = r.choice(list(WRONG))
        return _spec(prefix=prefix, cmd=cmd, vision=vision_layers, op="set", key=key,
                     value=r.choice(WRONG[key]), contradicts=True)
    if m == 3:
        key = r.choice(list(TEXT_KEYS))
        return _spec(prefix=prefix, cmd=cmd, vision=vision_layers, op="set", key=key,
                     value=TEXT_KEYS[key], contradicts=False)
    if m == 4:
        return _spec(prefix=prefix, cmd=cmd, vision=vision_layers, op="delete",
                     key=r.choice(list(TEXT_KEYS)), contradicts=False)
    if m == 5:
        return _spec(prefix=prefix, cmd=cmd, vision=vision_layers, op="set",
                     key=r.choice(list(TEXT_KEYS)), value=r.choice(BAD_TYPES),
                     contradicts="bad-value")
    return _spec(prefix=prefix, cmd=cmd, vision=vision_layers, op="replace",
                 value=r.choice([[1, 2], "gemma", 3, None, {}]), contradicts="replace")


KV_ARRAYS = [[2, 2], [2, 2], [4, 4], [1, 1], [2], [2, 2, 2], [2, 1], [2, 4], [2, 0], [0, 0],
             [-1, 2], [2, 2**31 - 1], [2.0, 2.0], ["2", "2"]]


def nested_kv(r: random.Random):
    key = r.choice(["attention.head_count_kv"] * 4 + ["attention.head_count",
                                                       "feed_forward_length"])
    true = {"attention.head_count_kv": 2, "attention.head_count": 4,
            "feed_forward_length": 512}[key]
    arr = r.choice(KV_ARRAYS)
    if key != "attention.head_count_kv" and arr and all(isinstance(x, int) for x in arr):
        arr = [true if x == 2 else x for x in arr]
    return _spec(key=key, value=arr, true=true,
                 cmd=r.choice(["convert", "convert", "metadata", "metadata", "check",
                               "export-gguf"]))


GENERATORS = {"nested-text": nested_text, "nested-kv": nested_kv}
