"""The tensors a nested language-model config describes (workbench.formats.config_check checks
a ``text_config`` against them as it checks the top level of a plain model's config).

Gemma 3 and the multimodal wrappers keep the language model's hyper-parameters under
``text_config``; their folders hold the language model's tensors (under ``language_model.``
in transformers' own layout) beside a vision or audio tower and a projector, whose layers are
not the language model's.
"""

from __future__ import annotations

import re

#: the keys of nested language-model configs
NESTED = ("text_config",)
#: name parts of the tensors of towers that are not the language model
_NOT_TEXT = re.compile(r"(?:^|\.)(?:vision_tower|vision_model|visual|multi_modal_projector|"
                       r"mm_projector|audio_tower|audio_model|embed_vision|embed_audio|"
                       r"image_newline|vision_embed_tokens)(?:\.|$)")


class _Part:
    """Some of a model's tensors (the language model's), with their own cached Facts."""

    def __init__(self, tensors: dict):
        self.tensors = tensors


def text_part(model):
    """The tensors a nested text config describes: those under ``language_model.`` (and a
    top-level head) where there are such, else all but the vision / audio towers' and
    projectors'. Cached on the model."""
    cached = model.__dict__.get("_qw_text_part")
    if cached is not None:
        return cached
    names = model.tensors
    if any("language_model." in n for n in names):
        keep = {n: i for n, i in names.items() if "language_model." in n or n == "lm_head.weight"}
    else:
        keep = {n: i for n, i in names.items() if not _NOT_TEXT.search(n)}
    part = model if len(keep) == len(names) else _Part(keep)
    model.__dict__["_qw_text_part"] = part
    return part
