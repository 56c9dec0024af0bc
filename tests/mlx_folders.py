"""mlx-lm's own folders of the tiny generated models (tests/tiny_archs.py), for the tests.

``tiny_hf(arch, folder)`` writes the tiny Hugging Face folder with the config keys mlx-lm's
model classes read under their older names (transformers 5 saves ``rope_parameters`` and
``num_local_experts``; mlx-lm's Qwen3-MoE wants ``rope_theta`` and ``num_experts``: a real
checkpoint's config carries both). ``mlx_quantized(hf, out, **kw)`` is ``mlx_lm.convert(hf,
out, quantize=True, **kw)`` (offline on a local folder), its chatter kept off the test's
output.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path


def tiny_hf(arch: str, folder, dtype: str = "bfloat16", **overrides) -> Path:
    from tests.tiny_archs import make_tiny
    hf = make_tiny(arch, folder, dtype=dtype, overrides=overrides or None)
    cfg_path = hf / "config.json"
    cfg = json.loads(cfg_path.read_text())
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]
    if "num_local_experts" in cfg and "num_experts" not in cfg:
        cfg["num_experts"] = cfg["num_local_experts"]
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return hf


def mlx_quantized(hf, out, **kw) -> Path:
    import mlx_lm
    with contextlib.redirect_stdout(io.StringIO()):
        mlx_lm.convert(str(hf), str(out), quantize=True, **kw)
    return Path(out)


def run_cli(*argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the domain CLI run in process on `argv`."""
    from workbench.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()
