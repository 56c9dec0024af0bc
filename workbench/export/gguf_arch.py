"""What makes a GGUF from a Hugging Face folder runnable by llama.cpp: the architecture and its
hyper-parameters (from ``config.json``), llama.cpp tensor names (the `gguf` package's map), the
tensor layout changes llama.cpp's converter makes, and the tokenizer (``tokenizer.json``).

Follows llama.cpp's ``convert_hf_to_gguf.py`` (``conversion/base.py`` ``TextModel``,
``bert.py``, ``qwen.py``, ``llama.py``, ``gpt2.py``) for Llama/Mistral (BPE tokenizers),
Qwen2, GPT-2 and BERT (WordPiece). Other architectures get a message pointing to that
converter.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import WorkbenchError
from ..llama_names import CONV1D, SUPPORTED_LABEL, Arch, detect_arch, gguf_names, model_folder, \
    read_config

CONVERTER_HINT = ("convert it with llama.cpp's convert_hf_to_gguf.py, then `quant-workbench "
                  "export MODEL.gguf ...` (or llama-quantize with a `--format llama-tensor-types` "
                  "file)")
# Llama/Mistral q/k projections (weights and biases) convert_hf_to_gguf permutes for the rope
_ROPE_PERMUTED = re.compile(r"self_attn\.(q|k)_proj\.(weight|bias)$")
BPE_PRE = {"QWEN2": "qwen2", "GPT2": "gpt-2", "LLAMA": "llama-bpe"}


@dataclass
class HFTarget:
    """A runnable GGUF layout for a Hugging Face model."""
    arch: Arch
    config: dict
    folder: Path
    names: dict          # HF name -> llama.cpp name (None: dropped)

    @property
    def arch_name(self) -> str:
        return self.arch.arch_name


def hf_target(model) -> tuple[HFTarget | None, str | None]:
    """(target, None) when `model` can become a runnable GGUF, else (None, why not)."""
    if model.format == "gguf":
        return None, None
    try:
        config = read_config(model)
    except WorkbenchError as exc:
        return None, str(exc)
    if not config:
        return None, ("no config.json beside the weights, so the architecture and its "
                      "hyper-parameters are unknown: the GGUF keeps Hugging Face names and "
                      f"llama.cpp will not run it; {CONVERTER_HINT}")
    arch = detect_arch(model, config)
    if arch is None or arch.gguf_arch == "UNSUPPORTED":
        hf = arch.hf_name if arch else config.get("model_type", "unknown")
        return None, (f"architecture {hf} is not one the workbench converts ({SUPPORTED_LABEL}): "
                      f"the GGUF keeps Hugging Face names and llama.cpp will not run it; "
                      f"{CONVERTER_HINT}")
    if not (model_folder(model) / "tokenizer.json").is_file():
        return None, ("no tokenizer.json in the model folder: llama.cpp needs the vocabulary; "
                      f"{CONVERTER_HINT}")
    names = gguf_names(model, arch)
    return HFTarget(arch, config, model_folder(model), names), None


def _hp(config: dict, *keys, default=None):
    for k in keys:
        v = config.get(k)
        if v is not None and not isinstance(v, bool):
            return v
    return default


def write_hparams(writer, t: HFTarget) -> None:
    import gguf
    c, a = t.config, t.arch.gguf_arch
    writer.add_block_count(t.arch.n_blocks)
    if (n := _hp(c, "max_position_embeddings", "n_ctx", "n_positions")) is not None:
        writer.add_context_length(int(n))
    n_embd = _hp(c, "hidden_size", "n_embd")
    if n_embd is not None:
        writer.add_embedding_length(int(n_embd))
    n_ff = _hp(c, "intermediate_size", "n_inner")
    if n_ff is None and a == "GPT2" and n_embd is not None:
        n_ff = 4 * int(n_embd)
    if n_ff is not None:
        writer.add_feed_forward_length(int(n_ff))
    n_head = _hp(c, "num_attention_heads", "n_head")
    if n_head is not None:
        writer.add_head_count(int(n_head))
    if (kv := _hp(c, "num_key_value_heads")) is not None:
        writer.add_head_count_kv(int(kv))
    rope = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
    if (theta := _hp(rope, "rope_theta") or _hp(c, "rope_theta")) is not None:
        writer.add_rope_freq_base(float(theta))
    if (eps := _hp(c, "rms_norm_eps")) is not None:
        writer.add_layer_norm_rms_eps(float(eps))
    if (eps := _hp(c, "layer_norm_eps", "layer_norm_epsilon")) is not None:
        writer.add_layer_norm_eps(float(eps))
    if a == "LLAMA" and n_embd and n_head:
        head_dim = _hp(c, "head_dim") or int(n_embd) // int(n_head)
        writer.add_rope_dimension_count(int(head_dim))
        writer.add_vocab_size(int(_hp(c, "vocab_size", default=0)))
    if a == "BERT":
        writer.add_causal_attention(False)
        pooling = _pooling_type(t.folder)
        if pooling is not None:
            writer.add_pooling_type(pooling)
    del gguf


def _pooling_type(folder: Path):
    """sentence-transformers' pooling (modules.json -> 1_Pooling/config.json), as convert does."""
    import gguf
    path = folder / "1_Pooling" / "config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if cfg.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if cfg.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    if cfg.get("pooling_mode_lasttoken"):
        return gguf.PoolingType.LAST
    return None


def _tokenizer_json(folder: Path) -> dict:
    path = folder / "tokenizer.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise WorkbenchError(f"cannot read the tokenizer ({exc})", path=str(path)) from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise WorkbenchError("not a Hugging Face tokenizer.json", path=str(path))
    return data


def write_tokenizer(writer, t: HFTarget) -> int:
    """Vocabulary, token types, merges and special token ids. Returns the vocabulary size."""
    import gguf
    tok = _tokenizer_json(t.folder)
    model = tok["model"]
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise WorkbenchError(f"tokenizer model {model.get('type')} is not supported "
                             f"(WordPiece or BPE vocabularies); {CONVERTER_HINT}",
                             path=str(t.folder / "tokenizer.json"))
    added = {a["content"]: a for a in tok.get("added_tokens", []) if isinstance(a, dict)
             and "content" in a and "id" in a}
    id_to_tok = {int(i): s for s, i in vocab.items()}
    for s, a in added.items():
        id_to_tok[int(a["id"])] = s
    n_vocab = max(int(_hp(t.config, "vocab_size", default=0)), max(id_to_tok) + 1)
    tokens, types = [], []
    wpm = model.get("type") == "WordPiece"
    for i in range(n_vocab):
        s = id_to_tok.get(i)
        if s is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        if s in added:
            kind = gguf.TokenType.CONTROL if added[s].get("special") else \
                gguf.TokenType.USER_DEFINED
        else:
            kind = gguf.TokenType.NORMAL
        if wpm and kind != gguf.TokenType.CONTROL:
            # llama.cpp's WPM tokenizer: word-initial pieces carry U+2581, "##" pieces do not
            s = s[2:] if s.startswith("##") else "\u2581" + s
        tokens.append(s)
        types.append(kind)
    if wpm:
        writer.add_tokenizer_model("bert")
        writer.add_tokenizer_pre("default")
        writer.add_token_type_count(int(_hp(t.config, "type_vocab_size", default=1)))
        special = gguf.SpecialVocab(t.folder, n_vocab=len(tokens))
    elif model.get("type") == "BPE":
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(BPE_PRE.get(t.arch.gguf_arch, "default"))
        special = gguf.SpecialVocab(t.folder, load_merges=True, n_vocab=len(tokens))
        if not special.merges:
            raise WorkbenchError("BPE tokenizer without merges", path=str(t.folder / "tokenizer.json"))
    else:
        raise WorkbenchError(f"tokenizer model {model.get('type')} is not supported "
                             f"(WordPiece or BPE); {CONVERTER_HINT}",
                             path=str(t.folder / "tokenizer.json"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special.add_to_gguf(writer, quiet=True)
    return len(tokens)


def transform(t: HFTarget, hf_name: str, w: np.ndarray) -> np.ndarray | None:
    """The layout llama.cpp expects for this tensor (None: unchanged).

    * Llama/Mistral q_proj/k_proj rows (weights and biases) are permuted from Hugging Face's rotate-half rope layout
      to llama.cpp's interleaved one (convert_hf_to_gguf ``LlamaModel.permute``).
    * GPT-2 Conv1D weights are stored (in, out) and transposed."""
    a = t.arch.gguf_arch
    if a == "GPT2" and CONV1D.search(hf_name) and w.ndim == 2:
        return np.ascontiguousarray(w.T)
    if a == "LLAMA" and _ROPE_PERMUTED.search(hf_name):
        n_head = int(_hp(t.config, "num_attention_heads"))
        if ".k_proj." in hf_name:
            n_head = int(_hp(t.config, "num_key_value_heads", default=n_head))
        rows = w.shape[0]
        return np.ascontiguousarray(
            w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
    return None


def transformed_shape(t: HFTarget, hf_name: str, shape: tuple) -> tuple:
    if t.arch.gguf_arch == "GPT2" and CONV1D.search(hf_name) and len(shape) == 2:
        return (shape[1], shape[0])
    return shape


def needs_transform(t: HFTarget, hf_name: str) -> bool:
    a = t.arch.gguf_arch
    return (a == "GPT2" and bool(CONV1D.search(hf_name))) or (
        a == "LLAMA" and bool(_ROPE_PERMUTED.search(hf_name)))
