"""What the fuzz worker does with issue 47's nested-config kinds (tests/fuzz/cases_nested.py),
and the multimodal folder the tests share (tests/workbench/test_config_nested.py).

Outcomes: a contradiction (a text_config value the tensors contradict, of the wrong type, or a
text_config that is not an object; a head_count_kv array that is not one true value per layer)
must end in exit 2 (a WorkbenchError in-process) on one line naming the file (config.json, or
the GGUF) with no output left; a true one must work (exit 0), or, for the multimodal folder
whose network the workbench may not run, end in a clean exit 2. Anything else is a failure.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError

_GGUF: Path | None = None


def multimodal_folder(src: Path, dst: Path, prefix: str = "", vision_layers: int = 5,
                      **text) -> Path:
    """The tiny gemma3_text folder `src` as a multimodal Gemma 3 folder at `dst`: its config
    under text_config (with `text` set), a vision_config beside it; the language model's
    tensor names under `prefix` (e.g. "model.language_model."), plus `vision_layers` layers of
    a vision tower's q_proj."""
    from safetensors.numpy import load_file, save_file
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, dst / f.name)
    inner = json.loads((src / "config.json").read_text())
    inner.pop("architectures", None)
    inner.update(text)
    cfg = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
           "text_config": inner,
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 64,
                             "num_hidden_layers": vision_layers, "num_attention_heads": 2,
                             "intermediate_size": 128, "image_size": 32, "patch_size": 16}}
    (dst / "config.json").write_text(json.dumps(cfg))
    st = load_file(str(src / "model.safetensors"))
    out = {(prefix + k[len("model."):] if prefix and k.startswith("model.") else k): v
           for k, v in st.items()}
    rng = np.random.default_rng(0)
    for i in range(vision_layers):   # more vision layers than text layers: not the model's
        out[f"model.vision_tower.vision_model.encoder.layers.{i}.self_attn.q_proj.weight"] = \
            rng.standard_normal((64, 64)).astype(np.float32)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _error_lines(err: str, cmd: str) -> list[str]:
    return [x for x in err.strip().splitlines() if not x.startswith(f"{cmd}: ")
            and "%" not in x[:40]]


def _cli_case(argv: list, out: Path | None, names: tuple, must_fail: bool, what: str) -> None:
    from .hostile import Finding, cli
    rc, err = cli(argv)
    if rc not in (0, 2):
        raise Finding(f"{what}: exit {rc}: {err[-700:]}")
    if rc == 0:
        if must_fail:
            raise Finding(f"{what}: exit 0 on a contradicting input")
        return
    lines = _error_lines(err, str(argv[0]))
    if len(lines) != 1:
        raise Finding(f"{what}: exit 2 with {len(lines)} lines: {err[-400:]!r}")
    if out is not None and out.exists():
        raise Finding(f"{what}: exit 2 but the output {out.name} was left")
    if must_fail and not any(n in lines[0] for n in names):
        raise Finding(f"{what}: refused without naming {names}: {lines[0][:300]}")
    raise WorkbenchError(lines[0])


def exercise_text(path: str) -> None:
    from workbench.formats.config_check import check_config
    from workbench.formats.loaders import open_model
    from .hostile import Finding
    from .hostile_config import tiny
    spec = json.loads(Path(path).read_text())
    where = Path(path).parent
    text = {} if spec["op"] != "set" else {spec["key"]: spec["value"]}
    folder = multimodal_folder(tiny("gemma3_text"), where / "m", spec["prefix"], spec["vision"],
                               **text)
    cfg = json.loads((folder / "config.json").read_text())
    if spec["op"] == "delete":
        cfg["text_config"].pop(spec["key"], None)
    elif spec["op"] == "replace":
        cfg["text_config"] = spec["value"]
    (folder / "config.json").write_text(json.dumps(cfg))
    must_fail = spec["contradicts"] is True or spec["contradicts"] == "bad-value" or (
        spec["contradicts"] == "replace" and spec["value"] is not None
        and not isinstance(spec["value"], dict))
    what = f"{spec['cmd']} {spec['op']} {spec.get('key')}={spec.get('value')!r}"
    if spec["cmd"] == "config":
        try:
            check_config(open_model(folder), cfg, folder / "config.json")
        except WorkbenchError as exc:
            if must_fail and ("config.json" not in str(exc) or "text_config" not in str(exc)):
                raise Finding(f"{what}: refused without naming config.json / text_config: "
                              f"{exc}") from None
            raise
        if must_fail:
            raise Finding(f"{what}: check_config accepted a contradicting text_config")
        return
    out = where / "ct" if spec["cmd"] == "export-ct" else None
    argv = (["export", folder, "--scheme", "int4-g32", "--format", "compressed-tensors", "-o",
             out] if out is not None else
            ["check", folder, "--scheme", "q8_0", "--samples", "2"])
    _cli_case(argv, out, ("config.json",), must_fail, what)


def _llama_gguf() -> Path:
    """The tiny llama as an F32 GGUF (built once per process)."""
    global _GGUF
    if _GGUF is None:
        import tempfile
        from workbench.core.progress import run
        from workbench.export import export
        from workbench.formats.loaders import open_model
        from workbench.quant.plan import Plan
        from .hostile_config import tiny
        d = Path(tempfile.mkdtemp(prefix="qw-nested-"))
        _GGUF = d / "llama.gguf"
        run(export(open_model(tiny("llama")), Plan(default="fp32"), "gguf", _GGUF))
    return _GGUF


def exercise_kv(path: str) -> None:
    from tests.gguf_rewrite import rewrite_gguf
    from workbench.formats.config_check import check_gguf_metadata
    from workbench.formats.loaders import open_model
    from .hostile import Finding
    spec = json.loads(Path(path).read_text())
    where = Path(path).parent
    g = where / "g" / "m.gguf"
    g.parent.mkdir()
    rewrite_gguf(_llama_gguf(), g, kv={f"llama.{spec['key']}": spec["value"]})
    v = spec["value"]
    true = (isinstance(v, list) and len(v) == 2
            and all(isinstance(x, int) and x == spec["true"] for x in v))
    what = f"{spec['cmd']} llama.{spec['key']}={v!r}"
    if spec["cmd"] == "metadata":
        try:
            check_gguf_metadata(open_model(g))
        except WorkbenchError as exc:
            if true:
                raise Finding(f"{what}: a true per-layer array refused: {exc}") from None
            if str(g) not in str(exc):
                raise Finding(f"{what}: refused without naming the GGUF: {exc}") from None
            raise
        if not true:
            raise Finding(f"{what}: the metadata check accepted an array the tensors "
                          "contradict")
        return
    out = {"convert": where / "hf", "export-gguf": where / "o.gguf", "check": None}[spec["cmd"]]
    argv = {"convert": ["convert", g, "--to", "hf", out],
            "export-gguf": ["export", g, "--scheme", "q8_0", "--format", "gguf", "-o", out],
            "check": ["check", g, "--scheme", "q8_0", "--samples", "2"]}[spec["cmd"]]
    try:
        _cli_case(argv, out, (str(g),), not true, what)
    except WorkbenchError:
        if true:
            raise Finding(f"{what}: a true per-layer array refused") from None
        raise


EXERCISES = {"nested-text": exercise_text, "nested-kv": exercise_kv}
