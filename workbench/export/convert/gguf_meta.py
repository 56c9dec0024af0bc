"""transformers' GGUF metadata reading (``load_gguf_checkpoint`` without tensors), made fast
and parsed once, for the config and the tokenizer that `convert` and the on-the-fly model
build from a GGUF.

transformers reads the header with the gguf package's GGUFReader (a numpy view for every part
of every key/value: 2.3 s for 30k tokens, minutes and gigabytes for a vocabulary of millions)
and turns every element of every array into a Python value, one call each; it does so twice
(AutoConfig, then AutoTokenizer). Here, for the duration of one read:

* GGUFReader, for this file only, is the project's header parser
  (workbench.formats.loaders.gguf_reader: struct over the header's bytes), shown to
  transformers as GGUFReader's fields (parts / data / types);
* the large tokenizer arrays (``tokenizer.ggml.tokens`` / ``scores`` / ``token_type`` /
  ``merges``) reach transformers' per-element loop empty and are put into its result whole
  afterwards (strings decoded as it decodes them: UTF-8, strict), the vocabulary size it
  derives from the token count set from the real count;
* the result is kept and each caller gets its own copy of the containers (the strings shared);
* per-layer arrays become single values or are refused (carry.per_layer_scalars).

Where transformers has no such function, nothing changes.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

_PATCH_LOCK = threading.RLock()
HIDE_ABOVE = 256      # arrays of more items skip transformers' per-element loop


class _Field:
    """A GGUFReader field as transformers reads it: value i is parts[data[i]] with `types`."""

    def __init__(self, parts, data, types):
        self.parts, self.data, self.types = parts, data, types


class _Tensor:
    def __init__(self, name: str):
        self.name = name


class _Reader:
    """The header of `path` (workbench's parser) behind GGUFReader's interface; arrays named
    in `hidden` are shown empty."""

    def __init__(self, header, hidden: set):
        self.fields = {}
        for key, f in header.fields.items():
            types = [int(t) for t in f.types]
            v = f.value
            if key in hidden:
                self.fields[key] = _Field([], [], types)
            elif types[0] != 9:
                self.fields[key] = _Field([v if isinstance(v, bytes) else (v,)], [0], types)
            elif isinstance(v, list):        # strings (bytes) or nested arrays
                self.fields[key] = _Field(v if types[1] == 8 else [(x,) for x in v],
                                          range(len(v)), types)
            else:                            # a numpy array of numbers
                self.fields[key] = _Field(v.reshape(-1, 1), range(len(v)), types)
        self.tensors = [_Tensor(t.name) for t in header.tensors]


def _decoded(f) -> list:
    v = f.value
    if isinstance(v, list):
        return [b.decode() if isinstance(b, bytes) else b for b in v]
    return v.tolist()


def fast_parse(header, path: str, orig, mapping: dict, decode=None) -> dict:
    """transformers' ``load_gguf_checkpoint(path)`` (metadata only) over `header` (the
    project's parse of it); `mapping`: its GGUF_TO_TRANSFORMERS_MAPPING; `decode(key)`: a
    string array's values (default: decoded here)."""
    decode = decode or (lambda k: _decoded(header.fields[k]))
    import gguf
    hidden = {k for k, f in header.fields.items()
              if k.startswith("tokenizer.ggml.") and len(f.types) == 2 and int(f.types[0]) == 9
              and len(f.value) > HIDE_ABOVE}
    shim = _Reader(header, hidden)
    with _only_for(path, gguf, "GGUFReader", lambda *a, **kw: shim):
        parsed = orig(path, return_tensors=False)
    arch = header.fields["general.architecture"].contents() \
        if "general.architecture" in header.fields else ""
    for key in hidden:
        prefix, sub = key.split(".", 1)
        for parameter, renames in mapping.items():
            name = renames.get(prefix, {}).get(sub)
            if name is not None and name != -1:
                parsed.setdefault(parameter, {})[name] = decode(key)
    tokens = parsed.get("tokenizer", {}).get("tokens")
    if "tokenizer.ggml.tokens" in hidden and f"{arch}.vocab_size" not in header.fields:
        parsed.setdefault("config", {})["vocab_size"] = len(tokens)   # as transformers derives it
    return parsed


def fast_metadata(header, string_arrays=(), decode=None) -> tuple[dict, tuple]:
    """transformers' ``integrations.gguf.read_gguf_metadata`` over `header`: key -> value
    (strings decoded, number arrays as lists, string arrays as lists where named in
    `string_arrays`, else their length), and the tensor names; `decode(key)` as in
    fast_parse."""
    decode = decode or (lambda k: _decoded(header.fields[k]))
    md = {}
    for key, f in header.fields.items():
        t = int(f.types[0])
        v = f.value
        if t == 9:
            sub = int(f.types[1]) if len(f.types) > 1 else 9
            if sub == 8:
                md[key] = decode(key) if key in string_arrays else len(v)
            elif sub == 9:
                raise ValueError("GGUF metadata holds an array of type 9, which this reader "
                                 "cannot read.")
            else:
                md[key] = v.tolist()
        else:
            md[key] = v.decode("utf-8") if t == 8 else v
    if "general.architecture" not in md:
        raise ValueError(f"{header.path} has no `general.architecture` in its metadata.")
    return md, tuple(t.name for t in header.tensors)


@contextlib.contextmanager
def _only_for(path: str, module, attr: str, replacement):
    """module.attr replaced, for calls naming the file `path` only, during the block (one
    block at a time across threads)."""
    real = getattr(module, attr)
    target = str(Path(path).resolve())

    def choose(p, *a, **kw):
        if str(Path(p).resolve()) == target:
            return replacement(p, *a, **kw)
        return real(p, *a, **kw)

    with _PATCH_LOCK:
        setattr(module, attr, choose)
        try:
            yield
        finally:
            setattr(module, attr, real)


def _copy(v):
    """A copy of the parsed dict's containers (strings and numbers are immutable: shared)."""
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        if v and isinstance(v[0], (list, dict)):
            return [_copy(x) for x in v]
        return list(v) if len(v) <= HIDE_ABOVE else v   # a vocabulary: shared, not copied
    return v


@contextlib.contextmanager
def parse_once(path: Path, arch: str, header=None):
    """For the block: transformers' GGUF metadata reading of `path` through fast_parse and
    fast_metadata over `header` (the loader's GGUFFile of it; default: parsed here), done once
    (each caller gets a copy of the containers; the string arrays decoded once and shared),
    per-layer arrays made single values."""
    from workbench.export.convert.carry import per_layer_scalars
    from workbench.formats.loaders.gguf_reader import GGUFFile
    try:
        import transformers.integrations.gguf as tg
        import transformers.integrations.gguf.reader as tg_reader
        import transformers.modeling_gguf_pytorch_utils as mod
        orig, mapping = mod.load_gguf_checkpoint, mod.GGUF_TO_TRANSFORMERS_MAPPING
        getattr(tg, "read_gguf_metadata")
    except (ImportError, AttributeError):
        yield
        return
    gguf_path = str(path)
    if header is None:
        header = GGUFFile(gguf_path)  # the header, parsed once for every reader below
    memo: dict = {}
    strings: dict = {}

    def decode(key):
        if key not in strings:
            strings[key] = _decoded(header.fields[key])
        return strings[key]

    def once(p, return_tensors=False, **kw):
        if return_tensors or kw:
            return orig(p, return_tensors=return_tensors, **kw)
        if "parsed" not in memo:
            parsed = fast_parse(header, gguf_path, orig, mapping, decode)
            per_layer_scalars(parsed.get("config", {}), header.fields, arch, gguf_path)
            memo["parsed"] = parsed
        return _copy(memo["parsed"])

    def metadata(p, string_arrays=()):
        return fast_metadata(header, string_arrays, decode)

    with contextlib.ExitStack() as stack:
        stack.enter_context(_only_for(gguf_path, mod, "load_gguf_checkpoint", once))
        stack.enter_context(_only_for(gguf_path, tg, "read_gguf_metadata", metadata))
        stack.enter_context(_only_for(gguf_path, tg_reader, "read_gguf_metadata", metadata))
        yield
