"""What makes a GGUF from a Hugging Face folder runnable by llama.cpp: the architecture and its
hyper-parameters (from ``config.json``), llama.cpp tensor names (the `gguf` package's map), the
tensor layout changes llama.cpp's converter makes, and the tokenizer (``tokenizer.json``).

Facts from llama.cpp's ``convert_hf_to_gguf.py`` (llama-cpp-python 0.3.36's vendored copy:
``conversion/base.py`` ``TextModel``, ``llama.py``, ``qwen.py``, ``gemma.py``, ``phi.py``,
``deepseek.py``, ``gpt2.py``, ``bert.py``) and ``src/models/*.cpp``; the code is this project's.
What is architecture-specific is one table, :data:`ARCH_SPECS`: per llama.cpp architecture its
extra hyper-parameters and layout changes:

* Llama/Mistral/Mixtral: q/k rows (and biases) permuted to llama.cpp's rope layout;
  ``rope_freqs`` for Llama 3's rope scaling.
* Gemma 2/3: RMSNorm weights stored as ``1 + w`` (Hugging Face adds the 1 at run time);
  queries scaled when ``query_pre_attn_scalar`` is not the scale llama.cpp fixes; Gemma 3's
  per-layer sliding pattern written when it is not llama.cpp's every-6th-global.
* SentencePiece-style BPE tokenizers (Gemma, Llama 2, Mistral: byte fallback, spaces as
  U+2581) written as llama.cpp's ``llama`` tokenizer (tokens, scores, types), not as BPE.
* GPT-2: Conv1D weights transposed.
* DeepSeek-V3 (llama.cpp ``deepseek2``, MLA): ``kv_b_proj`` split per head into ``attn_k_b``
  (transposed) and ``attn_v_b``; the router's ``e_score_correction_bias`` is ``exp_probs_b``.
* Mixtures of experts: every layer's experts of one projection stacked into one 3-D tensor
  ``blk.N.ffn_{gate,up,down}_exps.weight`` (numpy shape (n_expert, rows, cols)), streamed one
  expert at a time; routers (``ffn_gate_inp``) stay float (runtimes.py: llama.cpp never
  re-types them); shared experts ``*_shexp``.

Other architectures are refused (see :data:`CONVERTER_HINT`).

This module holds that table, the types the rest share (:class:`HFTarget`, :class:`OutTensor`,
:class:`Part`) and config.json's readers; the rest, one module each: gguf_target (`hf_target`:
the output tensors), gguf_transform (the layout changes), gguf_hparams (the hyper-parameters),
gguf_tokenizer (the tokenizer).
"""

from __future__ import annotations

import struct
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.formats.llama_names import Arch


CONVERTER_HINT = ("the way through: convert the folder with llama.cpp's convert_hf_to_gguf.py "
                  "(python convert_hf_to_gguf.py FOLDER --outtype f16 --outfile MODEL-f16.gguf), "
                  "open that GGUF here and re-type it with a plan (`quant-workbench export "
                  "MODEL-f16.gguf --plan PLAN.json --format gguf -o OUT.gguf`): the GGUF->GGUF "
                  "path keeps llama.cpp's own names and metadata, for every architecture "
                  "llama.cpp has")


@dataclass(frozen=True)
class ArchSpec:
    """What one llama.cpp architecture needs beyond the gguf package's name map."""
    permute_qk: bool = False      # Llama-family rope layout (LlamaModel.permute)
    norm_plus_one: bool = False   # Gemma: RMSNorm weight stored as 1 + w
    rope_dim: bool = False        # write rope.dimension_count = head_dim (and vocab_size)
    mla: bool = False             # DeepSeek multi-head latent attention
    extra: tuple = ()             # names of extra hyper-parameter writers below


ARCH_SPECS: dict[str, ArchSpec] = {
    "LLAMA": ArchSpec(permute_qk=True, rope_dim=True, extra=("llama3_rope",)),
    "QWEN2": ArchSpec(),
    "QWEN3": ArchSpec(),
    "QWEN3MOE": ArchSpec(extra=("expert_ff",)),
    "GEMMA2": ArchSpec(norm_plus_one=True, extra=("gemma2",)),
    "GEMMA3": ArchSpec(norm_plus_one=True, extra=("gemma3",)),
    "PHI3": ArchSpec(extra=("phi3",)),
    "DEEPSEEK2": ArchSpec(mla=True, extra=("deepseek2",)),
    "GPT2": ArchSpec(),
    "BERT": ArchSpec(extra=("bert",)),
}


@dataclass
class Part:
    """Rows of one source tensor that make up part of an output tensor, in order: rows r0:r1 of
    the source's (rows x cols) matrix, reshaped to `reshape_rows` rows, rows `sub` of that, and
    transposed when `transpose`. The output's bytes are its parts' bytes one after the other."""
    src: str
    r0: int
    r1: int
    reshape_rows: int | None = None
    sub: tuple | None = None
    transpose: bool = False


@dataclass
class OutTensor:
    """One tensor of the runnable GGUF: the source tensor(s) it comes from and its shape."""
    out: str
    sources: tuple           # Hugging Face names (the experts of a merged tensor, in order)
    shape: tuple             # numpy order, as written
    parts: list | None = None    # None: the whole source (through `transform`)
    resplit: bool = False    # rows differ from the source's: the plan is decided again

    @property
    def matrix_shape(self) -> tuple:
        return (int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1, int(self.shape[-1]))


@dataclass
class HFTarget:
    """A runnable GGUF layout for a Hugging Face model."""
    arch: Arch
    config: dict
    folder: Path
    names: dict          # HF name -> llama.cpp name (None: dropped)
    layout: list = field(default_factory=list)   # OutTensor in file order
    tokens: list = field(default_factory=list)   # the vocabulary written (write_tokenizer)

    @property
    def arch_name(self) -> str:
        return self.arch.arch_name

    @property
    def spec(self) -> ArchSpec:
        return ARCH_SPECS[self.arch.gguf_arch]


@contextmanager
def _config_values(path: Path, what: str = "config.json"):
    """A value the writer reads from config.json / tokenizer.json that config_check does not
    type (a missing or malformed key the architecture needs) as one line naming the file, not
    a traceback."""
    try:
        yield
    except KeyError as exc:
        raise WorkbenchError(f"{what} lacks the key {exc.args[0]!r} the GGUF writer needs; "
                             "nothing was written", path=str(path)) from None
    except (TypeError, ValueError, OverflowError, ArithmeticError, AttributeError,
            struct.error) as exc:
        raise WorkbenchError(f"{what} holds a value the GGUF writer cannot use "
                             f"({type(exc).__name__}: {str(exc)[:200]}); nothing was written",
                             path=str(path)) from None


def _hp(config: dict, *keys, default=None):
    for k in keys:
        v = config.get(k)
        if v is not None and not isinstance(v, bool):
            return v
    return default


def _rope(config: dict) -> dict:
    """The rope parameters of full attention (transformers 5 ``rope_parameters``, possibly per
    layer type; older configs: ``rope_scaling`` plus ``rope_theta``)."""
    r = config.get("rope_parameters")
    if not isinstance(r, dict):
        r = config.get("rope_scaling") if isinstance(config.get("rope_scaling"), dict) else {}
        r = dict(r)
        if "rope_theta" in config:
            r.setdefault("rope_theta", config["rope_theta"])
        if "type" in r:
            r.setdefault("rope_type", r["type"])
    if isinstance(r.get("full_attention"), dict):
        return r["full_attention"]
    return r


def _n_experts(config: dict) -> int | None:
    n = _hp(config, "num_local_experts", "num_experts", "n_routed_experts")
    return int(n) if n is not None else None
