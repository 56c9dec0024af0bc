"""Generator for issue 47's API-argument class: every public ``qw.*`` function called with a
cheap valid baseline and one or two of its arguments replaced by a hostile value (a wrong type,
NaN / infinities, negative, zero, huge, None, empty, over-long or NUL-holding text, numpy
scalars, a callable where data goes). Each case is a JSON spec that tests/fuzz/hostile_api.py
carries out on the demo model in-process:

    {"fn": "check_plan", "set": {"samples": {"$": "int", "v": -2}}}

A value is tagged, as JSON holds no NaN, bytes or objects ({"$": "nan"}, {"$": "bytes"} ...);
paths a function writes are only ever given inside the case's folder.
"""

from __future__ import annotations

import json
import random

#: the public functions and the parameters a case may replace (every parameter but the two whose
#: valid values start model-level runs of a minute or more: frontier's and diff's `check`)
FUNCTIONS = {
    "open_model": ["path", "device"],
    "statistics": ["model", "names", "executor", "progress", "cancel", "driver"],
    "make_plan": ["scheme", "path", "plan", "rules"],
    "with_methods": ["model", "plan", "method", "calib", "imatrix", "target", "say"],
    "evaluate_plan": ["model", "plan", "target", "strict", "quantize_all", "convention",
                      "method", "executor", "progress", "cancel", "driver"],
    "check_plan": ["model", "plan", "calib", "held_out", "samples", "target", "runtime",
                   "scoring", "ctx", "chunks", "quantize_all", "convention", "method",
                   "imatrix", "activations", "act_method", "accuracy_level", "save_onnx",
                   "save_gguf", "kld_exact", "use_cache", "say"],
    "export_plan": ["model", "plan", "fmt", "output", "target", "strict", "quantize_all",
                    "convention", "method", "activations", "act_method", "act_bits",
                    "act_type", "accuracy_level"],
    "parse_schemes": ["text", "target"],
    "list_schemes": ["variants"],
    "get_scheme": ["name"],
    "resolve_measure": ["model", "measure", "calib", "imatrix", "samples"],
    "measure_sensitivity": ["model", "schemes", "measure", "samples", "target", "pins",
                            "extra", "say"],
    "allocate_plan": ["model", "budget", "schemes", "measure", "samples", "target", "pins",
                      "methods", "table", "output", "notes", "estimate"],
    "compute_frontier": ["model", "from_bpw", "to_bpw", "points", "recipes",   # (check=K:
                         "check_samples", "schemes", "measure", "samples", "target"],   # runs)
    "diff_quantizations": ["a", "b", "source", "samples"],     # (check=True: runs both)
    "map_model": ["model", "plan", "overlay"],
    "convert_gguf": ["source", "to", "output", "dtype", "off_grid"],
    "Budget.bits_per_weight": ["value", "over"],
    "Budget.tensor_bytes": ["value"],
    "Budget.file_bytes": ["value"],
    "Budget.of_file": ["path"],
}
#: parameters whose value names a file the call writes: a hostile text is only ever a path
#: inside the case's folder (never a name relative to the worker's folder, the repository)
WRITES = {"output", "save_onnx", "save_gguf"}

#: (not "auto": valid, and for schemes / measure a pass over every scheme or the calibration
#: text, longer than a case's 10 s of CPU on its own)
_TEXT = ["", " ", "bogus", "q8_0", "Q4_K_M", "any", "llama.cpp", "x" * 5000, "x\x00y",
         "\udcff", "re:(a+)+$", "moe:experts", "../../etc/passwd", "int8", "chunks", "hf"]


def _value(r: random.Random, param: str):
    kind = r.choice(["int", "int", "float", "special", "text", "text", "none", "bool",
                     "container", "object", "numpy"])
    if kind == "int":
        return {"$": "int", "v": r.choice([-(2 ** 63), -2 ** 31, -5, -1, 0, 1, 2, 3, 4, 16, 17,
                                           255, 256, 257, 1000, 10 ** 6, 10 ** 6 + 1, 2 ** 31,
                                           2 ** 53 + 1, 2 ** 63, 2 ** 64, 10 ** 30])}
    if kind == "float":
        return {"$": "float", "v": r.choice([-1.0, -0.0, 0.0, 1e-300, 0.5, 2.0, 4.5, 8.0, 1024.0,
                                             1024.5, 1e9, 1e308])}
    if kind == "special":
        return {"$": r.choice(["nan", "inf", "-inf"])}
    if kind == "text":
        if param in WRITES:
            return {"$": "out", "v": r.choice(["", "x\x00y", "sub/none/out.bin", "out.bin",
                                               "."])}
        return {"$": "str", "v": r.choice(_TEXT)}
    if kind == "none":
        return {"$": "none"}
    if kind == "bool":
        return {"$": "bool", "v": r.random() < 0.5}
    if kind == "container":
        return {"$": r.choice(["list", "tuple", "dict", "set"]),
                "v": r.choice([[], ["q8_0"], [1, 2], [["x"]], [["a", "b", "c"]], [None]])}
    if kind == "numpy":
        return {"$": r.choice(["np.int64", "np.float32", "np.bool_", "np.array"]),
                "v": r.choice([-3, 0, 2, 7])}
    return {"$": r.choice(["object", "bytes", "callable", "model", "plan", "budget",
                           "path-object"])}


def api_args(r: random.Random):
    fn = r.choice(sorted(FUNCTIONS))
    params = FUNCTIONS[fn]
    chosen = r.sample(params, k=min(len(params), r.choice([1, 1, 1, 2])))
    spec = {"fn": fn, "set": {p: _value(r, p) for p in chosen}}
    return "case.json", json.dumps(spec).encode()


GENERATORS = {"api-args": api_args}
