"""Generators for issue 47's block-format headers, one kind per format; every case is a JSON
spec that tests/fuzz/hostile_blocks.py builds into a folder (config.json + model.safetensors,
packed with torch and the compressed-tensors package) and opens:

    r5-ct      compressed-tensors: int 1..8 bits (group / channel / tensor, symmetric or not),
               float8 (tensor / channel / group / block), NVFP4, MXFP4; a quantization_config
               field or a tensor mutated (a companion dropped, its dtype or shape changed,
               num_bits / group_size / strategy / symmetric / type / format / targets edited,
               an orphan companion, a huge weight_shape, a GPTQ weight_g_idx) or a
               benign edit
    r5-fp8     DeepSeek-V3 FP8 (weight_scale_inv per block): the same kinds of mutation
    r5-mxfp4   gpt-oss MXFP4 (_blocks / _scales, 2-D and 3-D experts)
"""

from __future__ import annotations

import json
import random

CT_KINDS = ("int", "int", "int", "fp8", "fp8", "nvfp4", "mxfp4")
CT_MUTATIONS = (
    "none", "none", "benign-extra", "benign-format", "benign-targets", "benign-keys",
    "drop-scale", "drop-zp", "drop-shape", "drop-global",
    "scale-dtype", "scale-shape", "zp-dtype", "zp-shape", "shape-values", "shape-huge",
    "shape-dtype", "shape-rank", "packed-dtype", "packed-cut", "weight-dtype",
    "num_bits", "group_size", "strategy", "symmetric", "type", "format", "block_structure",
    "targets-none", "orphan", "groups-type", "g-idx")
FP8_MUTATIONS = ("none", "none", "benign-extra", "drop-scale", "orphan", "scale-dtype",
                 "scale-shape", "weight-dtype", "block-size", "block-bad", "fmt", "unscaled-f8")
MX_MUTATIONS = ("none", "none", "benign-extra", "drop-scales", "drop-blocks", "blocks-last",
                "scales-shape", "blocks-dtype", "scales-dtype", "rank")


def _spec(**kw):
    return "case.json", json.dumps(kw).encode()


def r5_ct(r: random.Random):
    kind = r.choice(CT_KINDS)
    return _spec(kind=kind, seed=r.randint(0, 1 << 30), mutation=r.choice(CT_MUTATIONS),
                 bits=r.randint(1, 8), strategy=r.choice(["group", "group", "channel",
                                                          "tensor", "block"]),
                 asym=r.random() < 0.5, rows=r.choice([1, 3, 8, 130]),
                 cols=r.choice([64, 96, 128, 256]), gs=r.choice([16, 32]),
                 pick=r.randint(0, 1 << 30))


def r5_fp8(r: random.Random):
    return _spec(seed=r.randint(0, 1 << 30), mutation=r.choice(FP8_MUTATIONS),
                 rows=r.choice([1, 16, 130, 200]), cols=r.choice([64, 128, 300]),
                 block=r.choice([[128, 128], [64, 64], [128, 64]]), pick=r.randint(0, 1 << 30))


def r5_mxfp4(r: random.Random):
    return _spec(seed=r.randint(0, 1 << 30), mutation=r.choice(MX_MUTATIONS),
                 experts=r.choice([0, 1, 2, 4]), rows=r.choice([1, 8, 64]),
                 groups=r.choice([1, 2, 3]), pick=r.randint(0, 1 << 30))


GENERATORS = {"r5-ct": r5_ct, "r5-fp8": r5_fp8, "r5-mxfp4": r5_mxfp4}
