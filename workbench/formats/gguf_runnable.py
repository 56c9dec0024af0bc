"""Which GGUF files the workbench can run as a Hugging Face model on the fly
(workbench.export.convert.live builds the config.json and tokenizer): their architectures, and
the one-line reason when a GGUF cannot run.
"""

from __future__ import annotations

from pathlib import Path

#: general.architecture values read on the fly (tested on tiny generated models; the real
#: SmolLM2 and Gemma 3 GGUFs): transformers reads their config and tokenizer from the GGUF and
#: the runner's name map places every tensor
LIVE_ARCHES = ("llama", "gemma3", "gemma2", "qwen2", "qwen3")


def gguf_metadata(path) -> dict | None:
    """The key/values of the GGUF at `path` (None: not a GGUF file)."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        with open(p, "rb") as fh:
            if fh.read(4) != b"GGUF":
                return None
    except OSError:
        return None
    from workbench.formats.loaders.gguf_format import open_gguf
    m = open_gguf(p)
    try:
        return dict(m.metadata)
    finally:
        m.close()


def gguf_architecture(path) -> str | None:
    """general.architecture of the GGUF at `path` (None: not a GGUF file or no such key)."""
    arch = (gguf_metadata(path) or {}).get("general.architecture")
    return arch if isinstance(arch, str) else None


def live_problem(metadata: dict) -> str | None:
    """Why a GGUF with these key/values cannot be read on the fly (None: it can): an
    architecture not in LIVE_ARCHES, or no tokenizer / hyper-parameters to build the
    config.json and tokenizer from."""
    arch = metadata.get("general.architecture")
    if arch not in LIVE_ARCHES:
        return (f"GGUF architecture {arch!r} is not one the workbench converts on the fly "
                f"({', '.join(LIVE_ARCHES)})")
    missing = [k for k in ("tokenizer.ggml.model", f"{arch}.block_count",
                           f"{arch}.embedding_length") if k not in metadata]
    if missing:
        return (f"this {arch} GGUF has no {missing[0]} in its metadata, so no config.json and "
                "tokenizer can be built from it")
    return None


def unsupported_message(metadata: dict) -> str:
    why = live_problem(metadata)
    if why is None:
        return ("not runnable: no config.json beside this GGUF (model-level commands read it "
                "through workbench.export.convert.live.open_live, which builds one)")
    return (f"not runnable: {why}; put its Hugging Face config.json and tokenizer.json beside "
            "it, or convert the original checkpoint")
