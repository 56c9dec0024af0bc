"""Generator for mlx-lm folders (issue 48's source): a JSON spec of one quantized module (and a
float norm) that tests/fuzz/hostile_mlx.py writes as config.json + model.safetensors and opens;
valid folders in every mode, bits, group size, scale dtype and 2-D / 3-D shape, then 0-3
mutations: the config's bits / group / mode / entries (overrides, false, true, junk values and
keys), the arrays' dtypes and shapes (one dimension off, zero, swapped), companions dropped,
added or orphaned, global scales where they do not belong.

    mlx          config.json's "quantization" against the stored .weight / .scales / .biases
    mlx-shards   the same behind model.safetensors.index.json, its layout mutated (shards
                 outside the folder, in a subfolder, missing, stray, mislisted)
    mlx-budget   either folder as `--budget-of` (its bytes, or a refusal naming it)
    mlx-export   `export --format mlx` on the demo model with hostile schemes, plans, outputs
                 and options
"""

from __future__ import annotations

import json
import random

MODES = [("affine", b, g) for b in (1, 2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] + [
    ("mxfp4", 4, 32), ("nvfp4", 4, 16), ("mxfp8", 8, 32)]
JUNK = [None, True, False, -1, 0, 7, 3.5, "4", [], {}, 2**63, 48, 16, 256]
MOD = "model.layers.0.mlp.down_proj"


def mlx(r: random.Random):
    mode, bits, group = r.choice(MODES)
    lead = [r.randint(1, 3)] if r.random() < 0.2 else []
    rows, cols = r.randint(1, 6), group * r.randint(1, 3)
    sdt = r.choice(["F16", "BF16", "F32"]) if mode == "affine" else "U8"
    arrays = {"weight": ["U32", [*lead, rows, cols * bits // 32]],
              "scales": [sdt, [*lead, rows, cols // group]]}
    if mode == "affine":
        arrays["biases"] = [sdt, [*lead, rows, cols // group]]
    quant = {"group_size": group, "bits": bits, "mode": mode}
    if r.random() < 0.3:          # the module named in its own entry
        quant = {"group_size": 64, "bits": 4, MOD: {"group_size": group, "bits": bits,
                                                    "mode": mode}}
    for _ in range(r.choice([0, 1, 1, 2, 3])):
        m = r.randint(0, 9)
        if m == 0:
            quant[r.choice(["group_size", "bits", "mode"])] = r.choice(
                JUNK + ["affine", "mxfp4", "nvfp4", "mxfp8", "int4"])
        elif m == 1:
            quant[MOD] = r.choice([False, True, {"bits": r.choice(JUNK)},
                                   {"group_size": r.choice(JUNK)}, {"mode": r.choice(JUNK)},
                                   {"global_scale": r.choice(JUNK)}, {"x": 1}, r.choice(JUNK)])
        elif m == 2:
            key = r.choice(list(arrays))
            arrays[key][0] = r.choice(["U32", "I32", "U8", "F16", "BF16", "F32", "I8"])
        elif m == 3:
            key = r.choice(list(arrays))
            shape = arrays[key][1]
            if shape:
                shape[r.randrange(len(shape))] = r.choice([0, 1, 2, 3, 5, 31, 33, 64])
        elif m == 4:
            arrays.pop(r.choice(list(arrays)), None)
        elif m == 5:
            arrays["global_scale"] = [r.choice(["F32", "F16"]),
                                      r.choice([[], [1], lead or [1], [2, 2]])]
        elif m == 6:
            arrays[r.choice(["biases", "scales"])] = [sdt, [rows, r.randint(0, 4)]]
        elif m == 7:
            key = r.choice(list(arrays))
            arrays[key][1] = list(reversed(arrays[key][1]))
        elif m == 8:
            quant = r.choice([None, [], "affine", {"quant_method": "mlx"}, {"bits": 4}])
        else:
            arrays["orphan"] = [r.choice(["F16", "U8"]), [rows, 1]]
    spec = {"quantization": quant, "arrays": arrays, "seed": r.randint(0, 2**31)}
    return "mlx.json", json.dumps(spec).encode()


GENERATORS = {"mlx": mlx}


def mlx_shards(r: random.Random):
    """A valid or mutated module spec (mlx()) stored in two shards behind
    model.safetensors.index.json, whose layout is then mutated: a shard name with '..', an
    absolute path, a subfolder, a symlink out of the folder, a missing shard, a stray unlisted
    .safetensors, a tensor listed in the wrong shard or in none, a weight_map that is not one."""
    spec = json.loads(mlx(r)[1])
    layout = r.choice(["plain", "plain", "dotdot", "absolute", "subfolder", "symlink-out",
                       "missing", "stray", "wrong-shard", "unlisted", "extra-listed",
                       "junk-map", "junk-index", "nul", "empty-name", "same-shard-twice"])
    spec["shards"] = {"layout": layout, "split": r.randint(0, 3)}
    return "mlx-shards.json", json.dumps(spec).encode()


def mlx_budget(r: random.Random):
    """A folder spec (mlx() or mlx_shards()) used as `--budget-of`: its budget is the
    folder's safetensors bytes or a one-line refusal naming it."""
    name, data = (mlx_shards if r.random() < 0.4 else mlx)(r)
    spec = json.loads(data)
    spec["budget"] = {"tensors_only": r.random() < 0.1, "no_config": r.random() < 0.05}
    return "mlx-budget.json", json.dumps(spec).encode()


#: export --format mlx: schemes, plan entries and option values, valid and not
EXPORT_SCHEMES = ["mlx-q4-g64", "mlx-q2-g32", "mlx-q3-g128", "mlx-q8-g64", "mlx-mxfp4",
                  "mlx-nvfp4", "mlx-mxfp8", "q4_k", "q8_0", "int4-g128", "fp16", "keep",
                  "nope", "MLX-Q4-G64"]
OUTPUTS = ["new", "new", "new-nested", "empty-dir", "full-dir", "file", "model-dir",
           "inside-model", "under-file", "the-plan", "model-weights", "dotdot-model"]


def mlx_export(r: random.Random):
    """`export MODEL (--scheme S | --plan P) --format mlx -o OUT [options]` on a copy of the demo
    model: the scheme or plan (assignments of MLX and other schemes, unknown tensors, junk),
    the output (new, existing, the model's own folder or a file in it, under a file, the plan),
    and options the mlx format takes or not (--target, --overwrite, --strict, --quantize-all,
    --method, --activations, --accuracy-level, --act-bits, --threads)."""
    opts = []
    if r.random() < 0.4:
        opts += ["--scheme", r.choice(EXPORT_SCHEMES)]
        plan = None
    else:
        plan = {"default": r.choice(EXPORT_SCHEMES[:8] + [None, 3, "keep"]),
                "assign": {}}
        for _ in range(r.randint(0, 3)):
            plan["assign"][r.choice(["model.layers.0.mlp.up_proj.weight", "lm_head.weight",
                                     "model.embed_tokens.weight", "no.such.tensor",
                                     "model.norm.weight", ""])] = r.choice(EXPORT_SCHEMES)
        if r.random() < 0.1:
            plan = r.choice([[], "x", {"default": "mlx-q4-g64", "assign": []}, {}])
    for flag, values in (("--target", ["mlx", "any", "llama.cpp", "vllm", "onnxruntime"]),
                         ("--method", ["rtn", "imatrix"]),
                         ("--activations", ["int8", "minmax"]),
                         ("--accuracy-level", ["0", "4"]),
                         ("--act-bits", ["8", "4", "0", "99"]),
                         ("--threads", ["1", "0", "-3", "2"])):
        if r.random() < 0.15:
            opts += [flag, r.choice(values)]
    for flag in ("--overwrite", "--strict", "--quantize-all", "--check", "--json"):
        if r.random() < 0.15:
            opts.append(flag)
    spec = {"plan": plan, "opts": opts, "output": r.choice(OUTPUTS)}
    return "mlx-export.json", json.dumps(spec).encode()


GENERATORS.update({"mlx-shards": mlx_shards, "mlx-budget": mlx_budget,
                   "mlx-export": mlx_export})
