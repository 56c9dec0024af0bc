"""A runnable model through `transformers` (optional extra `.[model]`), run one block at a time.

The network is built from the folder's ``config.json`` with transformers' Auto classes
(``AutoConfig.for_model`` + ``AutoModelForCausalLM`` / ``AutoModel``, chosen from the config's
``architectures`` and transformers' model mappings: nothing downloaded, no code from the folder
executed) as a skeleton whose parameters live on the ``meta`` device (no memory). Weights come
from the workbench's own loaders (memory-mapped; GGUF dequantized) one block at a time:

1. the embeddings are materialized and every calibration batch runs up to the first block; the
   arguments each block receives (hidden states, masks, rotary position embeddings, …) are
   captured for every block, so per-layer masks (sliding-window layers) come out right;
2. per block: its weights are materialized (dequantized under a plan where asked), the cached
   activations of every batch run through it and replace the block's inputs (an
   ``ActivationStore`` spills to disk beyond ``QUANT_WORKBENCH_ACTIVATION_MB``, default 2048),
   the block is freed;
3. the final norm and the head run in token chunks (a 128k vocabulary is never materialized for
   every token at once).

Peak memory is one block (or the embedding / head table) plus the activations, not the model.
The mapping from checkpoint tensors to network parameters (``Slot``) covers transformers 5's
fused mixture-of-experts parameters (per-expert ``experts.N.gate_proj`` / ``w1`` … → slices of
``experts.gate_up_proj`` / ``experts.down_proj``, from transformers' own conversion mapping),
GGUF names (``blk.*``, merged 3-D ``ffn_*_exps``), tied embeddings and GPT-2's Conv1D.

Encoders give the attention-masked mean-pooled final hidden state per sample; causal LMs
next-token log-probabilities. Compute dtype: float32 on CPU; on CUDA the checkpoint's
bf16 / fp16 (statistics and the head's softmax accumulate in float32).
"""

from __future__ import annotations

from contextlib import contextmanager

from workbench.core.errors import WorkbenchError
from workbench.running.runner_config import (ARCH, _import_transformers, current_device, model_kind,
                                             read_config)
from workbench.running.runner_mapping import TensorMapping
from workbench.running.runner_store import ActivationStore, Batch, _Stop


@contextmanager
def _params_on_meta():
    """Construct modules with every parameter on the meta device (buffers stay real: rotary
    frequencies, position ids)."""
    import torch
    orig = torch.nn.Module.register_parameter

    def register(self, name, param):
        orig(self, name, param)
        p = self._parameters.get(name)
        if p is not None and p.device.type != "meta":
            self._parameters[name] = torch.nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = orig


# ---- the runner --------------------------------------------------------------------------------

def takes_use_cache(module) -> bool:
    """Whether `module`'s forward names a ``use_cache`` parameter (Hugging Face's decoders do;
    an encoder such as BERT's may not): read from its signature, not from a failed call."""
    import inspect
    try:
        return "use_cache" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):      # a forward without a readable signature: not passed
        return False

class Runner(TensorMapping):
    """A meta-device transformers skeleton of the model, run one block at a time."""

    def __init__(self, model, device: str | None = None):
        transformers = _import_transformers()
        import torch
        self.model = model
        self.cfg = read_config(model)
        self.kind = model_kind(self.cfg)
        self.device = torch.device(device or current_device())
        mt = self.cfg["model_type"]
        kwargs = {k: v for k, v in self.cfg.items()
                  if not k.startswith("_") and k not in ("auto_map", "model_type")}
        try:
            import warnings
            with warnings.catch_warnings():
                # transformers' notes on a config's deprecated keys (rope_scaling ...) are not
                # the user's to act on, and would break the CLI's one-line errors
                warnings.simplefilter("ignore")
                config = transformers.AutoConfig.for_model(mt, **kwargs)
                config._attn_implementation = "eager"
                from workbench.formats.config_check import check_effective, config_path
                check_effective(model, self.cfg, config, config_path(model))
                cls = transformers.AutoModel if self.kind == "encoder" \
                    else transformers.AutoModelForCausalLM
                with _params_on_meta():
                    net = cls.from_config(config, attn_implementation="eager")
        except WorkbenchError:
            raise
        except Exception as exc:
            from workbench.core.optional import missing_from
            missing = missing_from(exc)     # transformers needs one of its own optional packages
            if missing:
                raise WorkbenchError(missing, path=str(model.path)) from None
            raise WorkbenchError(f"not runnable: transformers cannot build model_type {mt!r} "
                                 f"from config.json ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}); "
                                 "weight-only features still work", path=str(model.path)) from None
        self.config = config
        self.resident: dict | None = None        # see materialize
        self.net = net.eval()
        self.dtype = self._compute_dtype()
        self._structure()
        self._map_tensors()
        self._load_buffers()

    # -- structure ---------------------------------------------------------------------------------
    def _compute_dtype(self):
        import torch
        if self.device.type != "cuda":
            return torch.float32
        dts = {self.model.info(n).dtype for n in self.model.tensors}
        if "BF16" in dts and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        if "F16" in dts:
            return torch.float16
        return torch.float32

    def _structure(self) -> None:
        import torch
        n_layers = getattr(self.config, "num_hidden_layers", None)
        if n_layers is None and hasattr(self.config, "get_text_config"):
            n_layers = getattr(self.config.get_text_config(), "num_hidden_layers", None)
        self.base = self.net.base_model
        best = None
        for name, mod in self.base.named_modules():
            if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0:
                if n_layers is not None and len(mod) != n_layers:
                    continue
                if best is None or name.count(".") < best[0].count("."):
                    best = (name, mod)
        if best is None:
            raise WorkbenchError("not runnable: no list of blocks found in the network "
                                 f"({type(self.net).__name__})", path=str(self.model.path))
        base_path = self._module_path(self.base)
        lname = best[0]
        self.layers = best[1]
        self.layers_path = (base_path + "." if base_path else "") + lname
        top = lname.split(".")[0]
        children = [n for n, _ in self.base.named_children()]
        idx = children.index(top)
        pre_children, post_children = children[:idx], children[idx + 1:]
        norm = None
        for c in post_children:
            m = getattr(self.base, c)
            if "norm" in type(m).__name__.lower() or "norm" in c.lower():
                norm = c
                break
        if norm is None and "." in lname:   # e.g. a norm inside the blocks' container
            parent = self.base.get_submodule(lname.rsplit(".", 1)[0])
            kids = [n for n, _ in parent.named_children()]
            for c in kids[kids.index(lname.rsplit(".", 1)[1]) + 1:]:
                if "norm" in type(getattr(parent, c)).__name__.lower():
                    norm = lname.rsplit(".", 1)[0] + "." + c
                    break
        pre = (base_path + "." if base_path else "")
        self.final_norm = self.base.get_submodule(norm) if norm else None
        self.head = self.net.get_output_embeddings() if self.kind == "causal-lm" else None
        names = [n for n, _ in self.net.named_parameters(remove_duplicate=False)]
        self.layer_params = [[] for _ in range(len(self.layers))]
        self.pre_params, self.norm_params, self.head_params = [], [], []
        head_path = self._module_path(self.head) if self.head is not None else None
        norm_path = pre + norm if norm else None
        for n in names:
            if n.startswith(self.layers_path + "."):
                i = int(n[len(self.layers_path) + 1:].split(".")[0])
                self.layer_params[i].append(n)
            elif norm_path and n.startswith(norm_path + "."):
                self.norm_params.append(n)
            elif head_path is not None and n.startswith(head_path + "."):
                self.head_params.append(n)
            elif any(n.startswith(pre + c + ".") for c in pre_children):
                self.pre_params.append(n)
        self._meta = {n: p for n, p in self.net.named_parameters(remove_duplicate=False)}
        self._owner = {}
        for mname, mod in self.net.named_modules(remove_duplicate=False):
            for pname in mod._parameters:
                self._owner[(mname + "." if mname else "") + pname] = (mod, pname)
        self.tied = bool(self.head is not None and self.head.weight is
                         self.net.get_input_embeddings().weight)

    def _module_path(self, module) -> str:
        for n, m in self.net.named_modules():
            if m is module:
                return n
        return ""


    def materialize(self, pnames, override=None, grad: bool = False) -> None:
        """Put parameters `pnames` in the network (read, widened to the compute dtype; with
        `override`, its tensors instead). While `resident` is a dict (a pass over a small
        model: `runner_measures.keep_resident`), the source weights read stay there, so a
        pass that visits each block twice reads and widens them once."""
        import torch
        keep = self.resident if override is None else None
        for pn in pnames:
            mod, attr = self._owner[pn]
            t = keep.get(pn) if keep is not None else None
            if t is None:
                t = self.param_tensor(pn, override).to(self.device, self.dtype)
                if keep is not None:
                    keep[pn] = t
            mod._parameters[attr] = torch.nn.Parameter(t, requires_grad=grad)

    def release(self, pnames) -> None:
        for pn in pnames:
            mod, attr = self._owner[pn]
            mod._parameters[attr] = self._meta[pn]

    def all_params(self) -> list[str]:
        return [p for g in (self.pre_params, *self.layer_params, self.norm_params,
                            self.head_params) for p in g]

    def whole_params(self) -> list[str]:
        """Every parameter of the network with a tensor in the checkpoint: the blocks' and the
        ones no pass of the runner reads (a BERT pooler), for a caller that needs the whole
        network at once (the ONNX export's tracing)."""
        have = self.all_params()
        seen = set(have)
        for pn in self._owner:
            if pn in seen:
                continue
            try:
                self._source(pn)
            except KeyError:
                continue            # no tensor in the file: left as the runner leaves it
            have.append(pn)
        return have

    def block_of(self, name: str):
        """'pre', a block index, 'norm' or 'head' for a workbench tensor (None: not read)."""
        s = self.slots.get(name)
        if s is None:
            return None
        for i, g in enumerate(self.layer_params):
            if s.param in g:
                return i
        if s.param in self.pre_params:
            return "pre"
        if s.param in self.norm_params:
            return "norm"
        if s.param in self.head_params:
            return "head"
        return None

    def module_of(self, name: str):
        s = self.slots.get(name)
        return None if s is None else self._owner[s.param][0]

    def linear_names(self) -> list[str]:
        """Workbench names of 2-D weights read by a Linear/Conv1D module (hookable), in the
        blocks and the head."""
        out = []
        for n, s in self.slots.items():
            mod, attr = self._owner[s.param]
            cname = type(mod).__name__
            if attr == "weight" and (cname in ARCH["linear_classes"]
                                     or cname.lower().endswith(ARCH["router_suffixes"])) \
                    and s.expert is None and self._meta[s.param].ndim == 2 \
                    and self.block_of(n) is not None:
                out.append(n)
        return out

    def expert_names(self) -> dict:
        """{fused experts module: {param attr: {expert index: [workbench names]}}}."""
        out: dict = {}
        for n, s in self.slots.items():
            mod, attr = self._owner[s.param]
            if s.expert is None and not (self._meta[s.param].ndim == 3
                                          and attr in ARCH["gguf_experts"]):
                continue
            out.setdefault(mod, {}).setdefault(attr, {}).setdefault(s.expert, []).append(n)
        return out

    # -- running -----------------------------------------------------------------------------------
    def _base_call(self, ids_t, mask_t):
        if takes_use_cache(self.base):    # no key/value cache kept for the next token
            return self.base(input_ids=ids_t, attention_mask=mask_t, use_cache=False)
        return self.base(input_ids=ids_t, attention_mask=mask_t)

    def capture(self, data, batch_size: int = 16, override=None, store=None, grad: bool = False,
                only_first: bool = False):
        """Embed every batch and capture each block's call arguments. Returns (batches, store
        of block-0 inputs). With `grad`, the embedding parameters require gradients and the
        captured first-block inputs keep their graph (`only_first` then)."""
        from workbench.running.calibration import batches as make_batches
        store = store if store is not None else ActivationStore()
        out = []
        self.materialize(self.pre_params, override, grad=grad)
        try:
            for bi, (ids, mask) in enumerate(make_batches(data, batch_size)):
                b = Batch(ids, mask, [None] * len(self.layers))
                b.first = None
                self._run_capture(b, grad, only_first)
                if not grad:          # with gradients the caller keeps b.first's graph
                    store.put(bi, b.first)
                    b.first = None
                out.append(b)
        finally:
            if not grad:
                self.release(self.pre_params)
        return out, store

    def _run_capture(self, b: Batch, grad: bool, only_first: bool) -> None:
        import torch
        last = 0 if only_first else len(self.layers) - 1

        def catcher(i, layer):
            def fwd(*args, **kwargs):
                if args:
                    h, rest, pos = args[0], args[1:], True
                else:
                    h, rest, pos = kwargs.pop("hidden_states"), (), False
                kwargs.pop("hidden_states", None)
                b.calls[i] = (pos, rest, kwargs)
                if i == 0:
                    b.first = h
                if i >= last:
                    raise _Stop
                return h
            return fwd

        for i, layer in enumerate(self.layers):
            layer.forward = catcher(i, layer)
        try:
            ids_t = torch.from_numpy(b.ids).to(self.device)
            mask_t = torch.from_numpy(b.mask).to(self.device)
            with torch.set_grad_enabled(grad):
                self._base_call(ids_t, mask_t)
        except _Stop:
            pass
        finally:
            for layer in self.layers:
                del layer.forward
        if b.first is None:
            raise WorkbenchError("not runnable: the network never reached its first block",
                                 path=str(self.model.path))

    def call_block(self, i: int, b: Batch, h):
        pos, rest, kwargs = b.calls[i]
        layer = self.layers[i]
        out = layer(h, *rest, **kwargs) if pos else layer(*rest, hidden_states=h, **kwargs)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out

    def run_block(self, i: int, batches, src: ActivationStore, dst: ActivationStore,
                  on_batch=None) -> None:
        import torch
        for bi, b in enumerate(batches):
            self.current = b
            with torch.no_grad():
                dst.put(bi, self.call_block(i, b, src.get(bi)))
            if on_batch is not None:
                on_batch(bi, b)
        self.current = None

    def finish(self, h):
        """The final norm over the last block's output."""
        return self.final_norm(h) if self.final_norm is not None else h

    def finish_store(self, batches, store, override=None) -> None:
        """Replace each batch's last-block output in `store` by its final-normed state (the
        norm's weights under `override`)."""
        import torch
        self.materialize(self.norm_params, override)
        try:
            for bi in range(len(batches)):
                with torch.no_grad():
                    store.put(bi, self.finish(store.get(bi)))
        finally:
            self.release(self.norm_params)

    def head_weights(self, override):
        """{head parameter attr: tensor} under `override`, or None when it changes nothing."""
        names = [n for p in self.head_params for n in self._source(p)]
        changes = getattr(override, "changes", None)
        if override is None or not any(changes(n) if changes else override(n) is not None
                                       for n in names):
            return None
        out = {}
        for p in self.head_params:
            out[self._owner[p][1]] = self.param_tensor(p, override).to(self.device, self.dtype)
        return out

    def logits(self, x, params=None):
        """float32 logits of the head over hidden rows `x` (final-normed), with the
        architecture's logit transforms (table ARCH["logit_transforms"]); `params`: head
        parameters to use instead of the materialized ones (head_weights)."""
        import torch
        if params:
            z = torch.func.functional_call(self.head, params, (x,)).float()
        else:
            z = self.head(x).float()
        for attr, op in ARCH["logit_transforms"].items():
            v = getattr(self.config, attr, None)
            if v is None or isinstance(v, bool):
                continue
            v = float(v)
            if op == "softcap" and v > 0:
                z = torch.tanh(z / v) * v
            elif op == "scale":
                z = z * v
            elif op == "divide" and v != 0:
                z = z / v
        return z

    def token_chunk(self) -> int:
        vocab = int(self._meta[self.head_params[0]].shape[0]) if self.head_params else 1
        return max(16, int((64 << 20) // (4 * max(vocab, 1))))

    def forward(self, batch, override=None):
        """One batch through the whole network, block by block (see `run_outputs`)."""
        data = [batch[0][i, : int(batch[1][i].sum())] for i in range(batch[0].shape[0])]
        from workbench.core.progress import run as run_job
        from workbench.running.runner_passes import run_outputs
        return run_job(run_outputs(self, data, batch_size=len(data), override=override))
