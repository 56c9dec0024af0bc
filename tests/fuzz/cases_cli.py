"""Generators for issue 32's classes 1, 4, 5, 7 and 8, one kind each; every case is a JSON spec
that tests/fuzz/hostile_cli.py carries out on a tiny generated Llama folder
(tests/tiny_archs.py) through the CLI, in-process.

    r4-outputs    1  check --save-onnx / --save-gguf, calibrate -o, allocate -o (with
                     --budget-of), export -o (with --imatrix) and bench-onnx --keep naming an
                     input (--calib, --held-out, --plan, --imatrix, --budget-of, the model's
                     weights, config.json, tokenizer.json, the folder) by the same path, a
                     relative one, a symbolic or hard link; or a fresh path
    r4-sidecars   4  config.json, tokenizer.json, tokenizer_config.json, generation_config.json,
                     special_tokens_map.json or a shard index made sparse-huge (17 MiB..1 TB),
                     one byte over its limit, or exactly at it
    r4-nesting    5  those JSON files nested 100..200,000 deep; compressed-tensors re: targets
                     that backtrack (re:(.*.*)*X, re:(a+)+$ ...) or that RE2 refuses, for diff
    r4-messages   7  --budget-of a GGUF cut, damaged or without tensors (against inspect's
                     refusal); --format / --scheme values that are also folder names; a GGUF
                     followed by up to 1 TB of sparse padding; an ONNX export to a full disk
    r4-leftovers  8  folders holding temporary files / folders of killed runs (dead pids, this
                     process, the pid-less .qwb-onnx-* of earlier versions, look-alikes); kill
                     -9 of a real export, then the next export there; --cluster local:N texts
"""

from __future__ import annotations

import json
import random

SIDECARS = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
            "special_tokens_map.json", "model.safetensors.index.json"]
COMMANDS = ["inspect", "export-gguf", "export-ct", "calibrate", "allocate", "check"]


def _spec(**kw):
    return "case.json", json.dumps(kw).encode()


# ---- 1 r4-outputs ---------------------------------------------------------------------------
# per command: the input targets it reads (beyond the model's own files)
OUTPUT_CMDS = {"check-onnx": ["calib", "held"], "check-gguf": ["calib"],
               "calibrate": ["calib"], "allocate-of": ["budget"],
               "export-imatrix": ["plan", "imatrix"], "bench-onnx-keep": []}
MODEL_TARGETS = ["weights", "config", "tokenizer", "folder"]


def r4_outputs(r: random.Random):
    cmd = r.choice(list(OUTPUT_CMDS))
    if r.random() < 0.15:      # a fresh output (the cheap commands only: the work runs)
        return _spec(cmd=r.choice(["allocate-of", "export-imatrix"]), target="none",
                     link="none")
    if cmd == "bench-onnx-keep":
        target = "folder"
    else:
        target = r.choice(OUTPUT_CMDS[cmd] + MODEL_TARGETS)
    link = r.choice(["same", "symlink", "hardlink", "relative"])
    if target == "folder":
        link = r.choice(["same", "symlink", "relative"])
    return _spec(cmd=cmd, target=target, link=link)


# ---- 4 r4-sidecars --------------------------------------------------------------------------
def r4_sidecars(r: random.Random):
    return _spec(file=r.choice(SIDECARS), cmd=r.choice(COMMANDS),
                 size=r.choice(["sparse", "sparse", "over", "at-limit", "normal"]),
                 sparse=r.choice([17 << 20, 65 << 20, 1 << 30, 8 << 30, 100 << 30, 1 << 40]))


# ---- 5 r4-nesting ---------------------------------------------------------------------------
HOSTILE_TARGETS = ["re:(.*.*)*X", "re:(a+)+$", "re:(x|x|x)*y", "re:(.*)*(.*)*(.*)*Z",
                   "re:(", "re:(a)\\1", "re:(?=a)", "re:a{2000}", "re:" + "(" * 300 + ")" * 300,
                   "re:.*mlp.*", "re:.*"]


def r4_nesting(r: random.Random):
    if r.random() < 0.3:
        return _spec(where="ct-target", targets=r.sample(HOSTILE_TARGETS, r.randint(1, 3)),
                     cmd="diff")
    return _spec(where=r.choice(["config.json", "model.safetensors.index.json",
                                 "tokenizer_config.json", "tokenizer.json", "plan"]),
                 depth=r.choice([63, 65, 100, 1000, 200_000]), style=r.choice(["[", '{"a":']),
                 cmd=r.choice(COMMANDS))


# ---- 7 r4-messages --------------------------------------------------------------------------
def r4_messages(r: random.Random):
    kind = r.choice(["budget-cut", "budget-cut", "budget-empty", "format-folder", "padding",
                     "full-disk"])
    return _spec(kind=kind, cut=r.random(), flips=r.choice([0, 0, 1, 4]),
                 fmt=r.choice(["gguf", "plan", "safetensors", "llama-tensor-types"]),
                 scheme=r.choice(["q8_0", "q4_0"]),
                 pad=r.choice([1 << 30, 10 << 30, 100 << 30, 1 << 40]), seed=r.randint(0, 999))


# ---- 8 r4-leftovers -------------------------------------------------------------------------
CLUSTER_TEXTS = ["local", "local:1", "local:2", "local:3", "local:64", "local:100000",
                 "local:" + "9" * 30, "local:" + "9" * 5000, "local:0", "local:-1", "local:1.5",
                 "local:\u00b2", "local:\u0663", "local: 2", "local:", "tcp://h:1", "nonsense"]


def r4_leftovers(r: random.Random):
    kind = r.choice(["temps", "temps", "kill", "cluster", "cluster"])
    return _spec(kind=kind, cluster=r.choice(CLUSTER_TEXTS),
                 entries=r.sample(["dead-file", "dead-dir", "live-dir", "legacy-old",
                                   "legacy-fresh", "look-alike", "dead-data"], r.randint(1, 5)),
                 fmt=r.choice(["gguf", "onnx", "safetensors"]), delay=r.uniform(0.2, 6.0))


GENERATORS = {"r4-outputs": r4_outputs, "r4-sidecars": r4_sidecars, "r4-nesting": r4_nesting,
              "r4-messages": r4_messages, "r4-leftovers": r4_leftovers}
