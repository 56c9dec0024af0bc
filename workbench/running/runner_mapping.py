"""Where each checkpoint tensor goes in a transformers network: a Slot per tensor (fused
experts, GGUF names, tied embeddings, GPT-2's Conv1D), the buffers, and a parameter's value
built from its tensors (q/k rows un-permuted for a Llama GGUF). The Runner inherits it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.running.runner_config import ARCH


# ---- where a checkpoint tensor goes in the network ---------------------------------------------
@dataclass(frozen=True)
class Slot:
    """The region of a network parameter one workbench tensor fills: ``param[expert]`` (fused
    experts; None: all of dim 0), then part `part` of `parts` equal chunks of the next dim."""
    param: str
    expert: int | None = None
    part: int = 0
    parts: int = 1

    def region(self, t):
        if self.expert is not None:
            t = t[self.expert]
            dim = 0
        else:
            dim = 1 if (self.parts > 1 or t.ndim == 3) else 0
        if self.parts > 1:
            n = t.shape[dim] // self.parts
            # plain slicing: a view of a torch tensor or of a numpy array alike
            t = t[(slice(None),) * dim + (slice(self.part * n, (self.part + 1) * n),)]
        return t


def _star_regex(pattern: str):
    return re.compile(re.escape(pattern).replace(r"\*", r"(\d+)"))


_SUPPORTED_OPS = {"MergeModulelist", "Concatenate"}


def _conversions(model_type: str) -> list:
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        return list(get_checkpoint_conversion_mapping(model_type) or [])
    except Exception:        # an older transformers without conversion mappings: none needed
        return []


class TensorMapping:
    """The Runner's checkpoint <-> network methods (self.model, self.net, self._meta, ...
    are the Runner's)."""

    # -- checkpoint <-> network --------------------------------------------------------------------
    def _candidates(self, hf: str) -> list[str]:
        prefix = getattr(self.net, "base_model_prefix", "") or ""
        c = [hf]
        if prefix and hf.startswith(prefix + "."):
            c.append(hf[len(prefix) + 1:])
        elif prefix:
            c.append(f"{prefix}.{hf}")
        return c

    def _map_tensors(self) -> None:
        names = list(self.model.tensors)
        params = set(self._meta)
        self.slots: dict[str, Slot] = {}
        self.buffer_for: dict[str, str] = {}
        buffers = {n for n, _ in self.net.named_buffers()}
        convs = _conversions(self.cfg["model_type"])
        gguf = any(n.startswith("blk.") or n == "token_embd.weight" for n in names)
        if gguf:
            self._map_gguf(names, params)
        else:
            for n in names:
                key, slot = n, None
                for t in convs:
                    new, matched = t.rename_source_key(key)
                    if matched is None:
                        continue
                    ops = [type(o).__name__ for o in getattr(t, "operations", [])]
                    if ops:
                        if not set(ops) <= _SUPPORTED_OPS:
                            raise WorkbenchError(
                                f"not runnable: checkpoint conversion {ops} of {n} is not "
                                "supported by the workbench runner", path=str(self.model.path))
                        srcs = t._original_source_patterns
                        part, expert = 0, None
                        for k, s in enumerate(srcs):
                            m = _star_regex(s).search(n)
                            if m:
                                part = k
                                expert = int(m.group(1)) if m.groups() else None
                                break
                        slot = (part, len(srcs) if "Concatenate" in ops else 1, expert)
                    key = new
                for c in self._candidates(key):
                    if c in params:
                        if slot is None:
                            self.slots[n] = Slot(c)
                        else:
                            self.slots[n] = Slot(c, slot[2], slot[0], slot[1])
                        break
                    if c in buffers:
                        self.buffer_for[n] = c
                        break
        # every parameter the run materializes must have its tensor(s)
        covered = {s.param for s in self.slots.values()}
        needed = [p for group in (self.pre_params, self.norm_params, self.head_params,
                                  *self.layer_params) for p in group]
        missing = [p for p in needed if p not in covered and not self._is_tied_copy(p)]
        if missing:
            raise WorkbenchError(f"not runnable: {len(missing)} parameters of the network have no "
                                 f"tensor in the file (first: {missing[0]})",
                                 path=str(self.model.path))
        self.by_param: dict[str, list[str]] = {}
        for n, s in self.slots.items():
            self.by_param.setdefault(s.param, []).append(n)

    def _is_tied_copy(self, pname: str) -> bool:
        p = self._meta[pname]
        return any(q is p and o in {s.param for s in self.slots.values()}
                   for o, q in self._meta.items() if o != pname)

    def _map_gguf(self, names, params) -> None:
        """llama.cpp names: the file's own `general.architecture` picks gguf-py's tensor-name
        map (else the model type's family in ARCH["gguf_family"])."""
        import gguf
        from workbench.formats.llama_names import llama_cpp_name
        have = set(names)
        arch = self.model.metadata.get("general.architecture")
        self.unpermute = arch in ARCH["gguf_rope_permuted"]
        name_map = None
        if isinstance(arch, str):
            key = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(arch)
            if key is not None:
                name_map = gguf.get_tensor_name_map(key, max(len(self.layers), 1))
        family = ARCH["gguf_family"].get(self.cfg["model_type"], "llama")
        for pname in params:
            leaf = pname.rsplit(".", 1)[-1]
            m = re.search(r"\.(\d+)\.", pname)
            if leaf in ARCH["gguf_experts"] and m:
                parts = ARCH["gguf_experts"][leaf]
                for k, g in enumerate(parts):
                    g = f"blk.{m.group(1)}.{g}.weight"
                    if g in have:
                        self.slots[g] = Slot(pname, None, k, len(parts))
                continue
            for c in self._candidates(pname):
                if c in have:
                    g = c
                elif name_map is not None:
                    g = name_map.get_name(c, try_suffixes=(".weight", ".bias"))
                else:
                    g = llama_cpp_name(c, family)
                if g in have and g not in self.slots:
                    self.slots[g] = Slot(pname)
                    break

    def _load_buffers(self) -> None:
        import torch
        for n, b in self.buffer_for.items():
            buf = self.net.get_buffer(b)
            w = torch.from_numpy(np.array(self.model.read(n)))
            if tuple(w.shape) == tuple(buf.shape):
                buf.data = w.to(buf.dtype)

    # -- weights -----------------------------------------------------------------------------------
    def _source(self, pname: str) -> list[str]:
        srcs = self.by_param.get(pname)
        if srcs:
            return srcs
        p = self._meta[pname]      # a tied copy (lm_head = embeddings)
        for o, q in self._meta.items():
            if q is p and o in self.by_param:
                return self.by_param[o]
        raise KeyError(pname)

    def param_tensor(self, pname: str, override=None):
        """The float32 (CPU) tensor of parameter `pname` from its checkpoint tensor(s);
        `override(name) -> array | None` replaces a workbench tensor (e.g. dequantized)."""
        import torch
        shape = tuple(self._meta[pname].shape)
        srcs = self._source(pname)
        single = len(srcs) == 1 and self.slots[srcs[0]].expert is None \
            and self.slots[srcs[0]].parts == 1
        out = None if single else torch.empty(shape, dtype=torch.float32)
        for n in srcs:
            w = override(n) if override is not None else None
            if w is None:
                w = self.model.read(n)
            t = torch.from_numpy(np.require(w, np.float32, ["C", "W"]))
            if getattr(self, "unpermute", False):
                t = self._rope_unpermute(pname, t)
            if single:
                return self._fit(t, shape, n)
            region = self.slots[n].region(out)
            region.copy_(self._fit(t, tuple(region.shape), n))
        return out

    def _rope_unpermute(self, pname: str, t):
        """Undo convert_hf_to_gguf's q/k row permutation (rows (head, 2, d/2) <- (head, d/2, 2))."""
        m = re.search(r"self_attn\.([qk])_proj\.(weight|bias)$", pname)
        if m is None:
            return t
        n_head = int(self.config.num_attention_heads)
        if m.group(1) == "k":
            n_head = int(getattr(self.config, "num_key_value_heads", None) or n_head)
        rows = t.shape[0]
        return (t.reshape(n_head, rows // n_head // 2, 2, *t.shape[1:]).swapaxes(1, 2)
                .reshape(t.shape).contiguous())

    def _fit(self, t, shape, name):
        if tuple(t.shape) == shape:
            return t
        if t.ndim == 2 and tuple(t.T.shape) == shape:       # GPT-2 Conv1D stores (in, out)
            return t.T.contiguous()
        if t.numel() == int(np.prod(shape)):
            return t.reshape(shape)
        raise WorkbenchError(f"shape {tuple(t.shape)} does not fit the network's {shape}",
                             path=str(self.model.path), tensor=name)
