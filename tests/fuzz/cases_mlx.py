"""Generator for mlx-lm folders (issue 48's source): a JSON spec of one quantized module (and a
float norm) that tests/fuzz/hostile_mlx.py writes as config.json + model.safetensors and opens;
valid folders in every mode, bits, group size, scale dtype and 2-D / 3-D shape, then 0-3
mutations: the config's bits / group / mode / entries (overrides, false, true, junk values and
keys), the arrays' dtypes and shapes (one dimension off, zero, swapped), companions dropped,
added or orphaned, global scales where they do not belong.

    mlx   config.json's "quantization" against the stored .weight / .scales / .biases
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
