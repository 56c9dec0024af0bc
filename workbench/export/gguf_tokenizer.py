"""The tokenizer key/values of a runnable GGUF, from a Hugging Face folder's tokenizer.json
(`write_tokenizer`): a byte-level BPE with its pre-tokenizer recognised from the split regex,
WordPiece, or a SentencePiece-style BPE written as llama.cpp's ``llama`` tokenizer; every token
id checked against the model's vocabulary size. Also what llama.cpp's vocabulary loader makes of
general.name (`name_breaks_loading`).
"""

from __future__ import annotations

import re
from pathlib import Path

from workbench.core.errors import WorkbenchError
from workbench.export.gguf_arch import CONVERTER_HINT, HFTarget, _config_values, _hp


# the pre-tokenizer llama.cpp applies, from tokenizer.json's split regex (llama.cpp's
# convert_hf_to_gguf identifies it by a hash of known tokenizers' outputs; the regex is what
# differs between them). A byte-level pre-tokenizer with its built-in regex is GPT-2's.
_PRE_BY_REGEX = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": "gpt-2",
}


def _check_vocab_sidecars(folder: Path) -> None:
    """The files the `gguf` package's SpecialVocab reads beside tokenizer.json (already read
    by _tokenizer_json), within their size limits and, for JSON, depth (its plain json.load
    of a 1,000-deep tokenizer_config.json was a RecursionError): errors name the file."""
    from workbench.core.limits import check_sidecar, load_sidecar_json
    for name in ("tokenizer_config.json", "config.json", "chat_template.json"):
        if (folder / name).is_file():
            load_sidecar_json(folder / name, name)
    for name in ("merges.txt", "chat_template.jinja"):
        if (folder / name).is_file():
            check_sidecar(folder / name, name)
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for f in sorted(extra.glob("*.jinja"))[:1000]:
            check_sidecar(f, f"additional_chat_templates/{f.name}")


def _tokenizer_json(folder: Path) -> dict:
    path = folder / "tokenizer.json"
    from workbench.core.limits import load_sidecar_json
    data = load_sidecar_json(path, "tokenizer.json")   # size, depth, duplicates: errors name it
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise WorkbenchError("not a Hugging Face tokenizer.json", path=str(path))
    return data


def write_tokenizer(writer, t: HFTarget) -> int:
    """Vocabulary, token types, merges and special token ids. Returns the vocabulary size."""
    tok = _tokenizer_json(t.folder)
    model = tok["model"]
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise WorkbenchError(f"tokenizer model {model.get('type')} is not supported "
                             f"(WordPiece or BPE vocabularies); {CONVERTER_HINT}",
                             path=str(t.folder / "tokenizer.json"))
    id_to_tok, added, n_vocab = _token_ids(t, tok, vocab)
    with _config_values(t.folder / "tokenizer.json", "tokenizer.json"):
        return _write_vocab(writer, t, tok, model, id_to_tok, added, n_vocab)


def _token_ids(t: HFTarget, tok: dict, vocab: dict) -> tuple[dict, dict, int]:
    """(id -> token, added tokens, the vocabulary size written): every id an integer below the
    model's vocabulary size (config.json's vocab_size, which config_check holds to the
    embedding's rows; convert_hf_to_gguf asserts the same): a hostile id (10^12) never sizes
    the vocabulary written."""
    path = t.folder / "tokenizer.json"
    limit = _hp(t.config, "vocab_size")
    if limit is None:
        limit = next((o.shape[0] for o in t.layout if o.out == "token_embd.weight"), None)
    raw_added = tok.get("added_tokens", [])
    if not isinstance(raw_added, list):
        raise WorkbenchError("added_tokens is not a list", path=str(path))
    known = limit is not None
    if limit is None:
        limit = len(vocab) + len(raw_added)
    where = "vocab_size in config.json" if _hp(t.config, "vocab_size") is not None else \
        "the embedding's rows"

    def check_id(i, what: str) -> int:
        if isinstance(i, bool) or not isinstance(i, int):
            raise WorkbenchError(f"{what}: id {str(i)[:40]!r} is not an integer", path=str(path))
        if not 0 <= i < limit:
            raise WorkbenchError(f"{what}: id {i:,} is outside the model's vocabulary "
                                 f"(0..{limit - 1:,}, {where}); llama.cpp could not load it; "
                                 "nothing was written", path=str(path))
        return i

    id_to_tok = {check_id(i, f"token {s[:40]!r}"): s for s, i in vocab.items()}
    added = {}
    for a in raw_added:
        if not (isinstance(a, dict) and "content" in a and "id" in a):
            continue
        if not isinstance(a["content"], str):
            raise WorkbenchError(f"an added token's content is {str(a['content'])[:40]!r}, not a "
                                 "string", path=str(path))
        added[a["content"]] = a
        id_to_tok[check_id(a["id"], f"added token {a['content'][:40]!r}")] = a["content"]
    if not id_to_tok:
        raise WorkbenchError("the vocabulary is empty", path=str(path))
    return id_to_tok, added, (limit if known else max(id_to_tok) + 1)


def _write_vocab(writer, t: HFTarget, tok: dict, model: dict, id_to_tok: dict, added: dict,
                 n_vocab: int) -> int:
    import gguf
    if model.get("type") == "BPE" and (space_prefix := _spm_style(tok)) is not None:
        return _write_spm(writer, t, tok, id_to_tok, added, n_vocab, space_prefix)
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
    _check_vocab_sidecars(t.folder)   # gguf.SpecialVocab reads them with plain json.load
    if wpm:
        writer.add_tokenizer_model("bert")
        writer.add_tokenizer_pre("default")
        writer.add_token_type_count(int(_hp(t.config, "type_vocab_size", default=1)))
        special = gguf.SpecialVocab(t.folder, n_vocab=len(tokens))
    elif model.get("type") == "BPE":
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(_bpe_pre(tok, t))
        special = gguf.SpecialVocab(t.folder, load_merges=True, n_vocab=len(tokens))
        if not special.merges:
            raise WorkbenchError("BPE tokenizer without merges", path=str(t.folder / "tokenizer.json"))
    else:
        raise WorkbenchError(f"tokenizer model {model.get('type')} is not supported "
                             f"(WordPiece or BPE); {CONVERTER_HINT}",
                             path=str(t.folder / "tokenizer.json"))
    t.tokens = tokens
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special.add_to_gguf(writer, quiet=True)
    return len(tokens)


def _spm_style(tok: dict) -> bool | None:
    """Whether this BPE tokenizer.json is a SentencePiece model in disguise (Gemma, Llama 2,
    Mistral: transformers' conversion of a SentencePiece BPE model): byte fallback, spaces
    written as U+2581 by the normalizer (Replace, optionally after Prepend) or by a Metaspace
    pre-tokenizer that does not split, and no other pre-tokenizer. Returns whether a U+2581 is
    put in front of the text (llama.cpp's add_space_prefix), or None when it is not such a
    tokenizer (then it is a byte-level BPE: GPT-2, Llama 3, Qwen)."""
    m = tok["model"]
    if not m.get("byte_fallback") or m.get("ignore_merges"):
        return None
    norm, pre = tok.get("normalizer"), tok.get("pre_tokenizer")
    norms = norm.get("normalizers", []) if isinstance(norm, dict) and \
        norm.get("type") == "Sequence" else ([norm] if norm else [])
    pres = pre.get("pretokenizers", []) if isinstance(pre, dict) and \
        pre.get("type") == "Sequence" else ([pre] if pre else [])
    prefix, spaces = False, False
    for n in norms:
        kind = n.get("type") if isinstance(n, dict) else None
        if kind == "Prepend" and n.get("prepend") == "\u2581" and not spaces:
            prefix = True
        elif kind == "Replace" and n.get("pattern") == {"String": " "} and \
                n.get("content") == "\u2581":
            spaces = True
        else:
            return None
    for p in pres:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "Metaspace" and p.get("replacement", "\u2581") == "\u2581" and \
                not p.get("split", True) and not spaces:
            spaces = True
            prefix = p.get("prepend_scheme", "always") in ("always", "first") or \
                bool(p.get("add_prefix_space"))
        elif kind == "Split" and p.get("pattern") == {"String": " "} and spaces and \
                p.get("behavior") == "MergedWithPrevious" and not p.get("invert"):
            pass    # after the normalizer's Replace there is no space left to split on
        else:
            return None
    return prefix if spaces else None


def _write_spm(writer, t: HFTarget, tok: dict, id_to_tok: dict, added: dict, n_vocab: int,
               space_prefix: bool) -> int:
    """A SentencePiece-style BPE tokenizer.json as llama.cpp's ``llama`` tokenizer (what
    convert_hf_to_gguf writes for Gemma, Llama 2, Mistral from tokenizer.model): tokens,
    scores and token types, no merges. llama.cpp merges the adjacent pair whose joined text is
    the highest-scored token, so a token's score is minus the rank of the first merge that
    makes it (tokens no merge makes score below every merge, in id order). Types: added tokens
    marked special are CONTROL, other added tokens USER_DEFINED with U+2581 written as a space
    (llama.cpp matches them in the raw text), ``<0xNN>`` BYTE; score -1000 for added tokens and
    0 for bytes, as the converter writes them; ids without a token UNUSED ``[PADn]``."""
    import gguf
    rank: dict[str, int] = {}
    for r, pair in enumerate(tok["model"].get("merges") or []):
        a, b = pair.split(" ", 1) if isinstance(pair, str) else pair
        rank.setdefault(a + b, r)
    n_merges = len(rank) and max(rank.values()) + 1
    byte = re.compile(r"<0x[0-9A-F]{2}>$")
    tokens, scores, types = [], [], []
    for i in range(n_vocab):
        s = id_to_tok.get(i)
        if s is None:
            tokens.append(f"[PAD{i}]")
            scores.append(-10000.0)
            types.append(gguf.TokenType.UNUSED)
        elif s in added:
            special = bool(added[s].get("special"))
            tokens.append(s if special else s.replace("\u2581", " "))
            scores.append(-1000.0)
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        elif byte.match(s):
            tokens.append(s)
            scores.append(0.0)
            types.append(gguf.TokenType.BYTE)
        else:
            tokens.append(s)
            scores.append(-float(rank[s]) if s in rank else -float(n_merges + i))
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix(space_prefix)
    t.tokens = tokens
    special = gguf.SpecialVocab(t.folder, n_vocab=len(tokens))
    special.add_special_token.setdefault("eos", False)   # as transformers: no eos appended
    special.add_to_gguf(writer, quiet=True)
    return len(tokens)


def name_breaks_loading(name: str, t: HFTarget) -> str | None:
    """Why writing `name` as general.name would make llama.cpp refuse the file (None: it
    would not). llama.cpp's vocabulary loader (src/llama-vocab.cpp) gives a model whose name
    contains "phi-3" or "phi3" special attributes on the tokens </s>, <unk>, <s> and
    <|endoftext|>, looking each up with unordered_map::at: a vocabulary without one of them
    fails to load ("error loading model vocabulary: unordered_map::at")."""
    low = name.lower()
    if "phi-3" in low or "phi3" in low:
        missing = [s for s in ("</s>", "<unk>", "<s>", "<|endoftext|>") if s not in t.tokens]
        if missing:
            return (f"general.name {name!r} not written: llama.cpp's Phi-3 vocabulary rule for "
                    f"such names needs the tokens {', '.join(missing)}, which this tokenizer "
                    "lacks (the file would not load)")
    return None


def _bpe_pre(tok: dict, t: HFTarget) -> str:
    """llama.cpp's pre-tokenizer name for a byte-level BPE tokenizer.json: from its split regex
    (_PRE_BY_REGEX); a ByteLevel pre-tokenizer with its own regex is GPT-2's. Unknown regexes
    are refused: another pre-tokenizer would cut the text differently from transformers."""
    pre = tok.get("pre_tokenizer")
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) and \
        pre.get("type") == "Sequence" else [pre]
    for st in steps:
        if not isinstance(st, dict):
            continue
        if st.get("type") == "Split":
            pat = st.get("pattern", {})
            rx = pat.get("Regex") if isinstance(pat, dict) else None
            if rx in _PRE_BY_REGEX:
                return _PRE_BY_REGEX[rx]
            raise WorkbenchError(
                "the tokenizer's pre-tokenizer regex is not one this exporter knows "
                f"(GPT-2, Llama 3, Qwen2); {CONVERTER_HINT}", path=str(t.folder / "tokenizer.json"))
        if st.get("type") == "ByteLevel" and st.get("use_regex", True):
            return "gpt-2"
    raise WorkbenchError(f"the tokenizer has no pre-tokenizer this exporter knows; "
                         f"{CONVERTER_HINT}", path=str(t.folder / "tokenizer.json"))
