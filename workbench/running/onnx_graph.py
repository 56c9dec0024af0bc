"""The float torch network of a checkpoint, and its ONNX graph with the plan's quantized Linears.

:func:`float_network` builds the transformers model from ``config.json`` with the checkpoint's
weights (workbench.running.runner.Runner: nothing downloaded, no code from the folder run) and says which
workbench tensor each Linear (or GPT-2 Conv1D) reads. :func:`trace_to_onnx` swaps the Linears the
plan quantizes for modules that trace to ``com.microsoft.MatMulNBits`` (or, for W8A8 int8
per-channel weights, ``DequantizeLinear`` + ``MatMul``), optionally preceded by a
``QuantizeLinear``/``DequantizeLinear`` pair on the input, and traces the whole network with
``torch.onnx.export`` (TorchScript exporter, opset :data:`OPSET`).

Graph inputs ``input_ids``, ``attention_mask`` (int64, [batch, sequence]); outputs: encoders
``last_hidden_state`` and ``pooled`` (attention-masked mean), causal LMs ``logits``.
"""

from __future__ import annotations

import warnings

import numpy as np

from workbench.core.errors import WorkbenchError

OPSET = 17
MS_DOMAIN = "com.microsoft"


def import_onnx():
    """(onnx, onnxruntime), or a one-line error naming the extra."""
    try:
        import onnx
        import onnxruntime
    except ImportError:
        raise WorkbenchError("ONNX export/runtime needs the optional extra: "
                             "pip install -e \".[onnx]\" (onnx, onnxruntime, onnxscript)") from None
    return onnx, onnxruntime


def float_network(model, override=None):
    """(Runner, {workbench weight name: (qualified module name, module)}) for every Linear /
    Conv1D weight of the network built from `model`'s config.json, every weight loaded in
    float32 on the CPU (tracing needs the whole network; the runner otherwise holds one block at
    a time). `override(name) -> array | None` replaces a tensor's weights (a method's folded
    float tensors)."""
    from workbench.running.runner import Runner
    runner = Runner(model, device="cpu")
    runner.materialize(runner.whole_params(), override=override)
    names = {id(m): q for q, m in runner.net.named_modules()}
    linears = {}
    for n in runner.linear_names():
        mod = runner.module_of(n)
        if id(mod) in names:
            linears[n] = (names[id(mod)], mod)
    return runner, linears


# ---- modules that trace to the quantized ops ------------------------------------------------
def _modules():
    import torch

    class _NBitsFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b, scales, zp, w, K, N, bits, block, acc):
            return x @ w.t()

        @staticmethod
        def symbolic(g, x, b, scales, zp, w, K, N, bits, block, acc):
            ins = [x, b, scales] + ([zp] if zp is not None and not _is_none(zp) else [])
            y = g.op(f"{MS_DOMAIN}::MatMulNBits", *ins, K_i=K, N_i=N, bits_i=bits,
                     block_size_i=block, accuracy_level_i=acc)
            _set_type(y, x, N)
            return y

    class _DQMatMulFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, wq_t, scale, zero, w):
            return x @ w.t()

        @staticmethod
        def symbolic(g, x, wq_t, scale, zero, w):
            deq = g.op("DequantizeLinear", wq_t, scale, zero, axis_i=1)
            return g.op("MatMul", x, deq)

    class QuantLinear(torch.nn.Module):
        """A Linear whose weight is MatMulNBits arrays (or int8 DequantizeLinear codes)."""

        def __init__(self, nb, w_deq, bias, act_scale=None, accuracy_level=0, dq=None):
            super().__init__()
            self.nb = nb
            self.acc = int(accuracy_level)
            self.register_buffer("w", torch.from_numpy(np.ascontiguousarray(w_deq, np.float32)))
            self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone(),
                                                                     requires_grad=False)
            self.act_scale = act_scale
            self.dq = dq
            if dq is not None:
                wq_t, scale, zero = dq
                self.register_buffer("wq_t", torch.from_numpy(wq_t))
                self.register_buffer("dq_scale", torch.from_numpy(scale))
                self.register_buffer("dq_zero", torch.from_numpy(zero))
            else:
                self.register_buffer("b", torch.from_numpy(np.ascontiguousarray(nb.B)))
                self.register_buffer("scales", torch.from_numpy(nb.scales))
                zp = nb.zero_points
                self.register_buffer("zp", None if zp is None else torch.from_numpy(zp))

        def forward(self, x):
            if self.act_scale is not None:
                x = torch.fake_quantize_per_tensor_affine(x, float(self.act_scale), 0, -128, 127)
            if self.dq is not None:
                y = _DQMatMulFn.apply(x, self.wq_t, self.dq_scale, self.dq_zero, self.w)
            else:
                nb = self.nb
                y = _NBitsFn.apply(x, self.b, self.scales, self.zp, self.w, nb.K, nb.N, nb.bits,
                                   nb.block_size, self.acc)
            if self.bias is not None:
                y = y + self.bias
            return y

    class FakeQuantInput(torch.nn.Module):
        """A float Linear (kept) whose input is quantized to int8 (W8A8 on a kept weight)."""

        def __init__(self, inner, act_scale):
            super().__init__()
            self.inner = inner
            self.act_scale = act_scale

        def forward(self, x):
            x = torch.fake_quantize_per_tensor_affine(x, float(self.act_scale), 0, -128, 127)
            return self.inner(x)

    class EncoderOut(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask):
            h = self.net(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1)
            return h, pooled

    class CausalOut(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask):
            return self.net(input_ids=input_ids, attention_mask=attention_mask,
                            use_cache=False).logits

    return QuantLinear, FakeQuantInput, EncoderOut, CausalOut


def _is_none(v) -> bool:
    try:
        return v.node().mustBeNone()
    except AttributeError:
        return v is None


def _set_type(y, x, n_out: int) -> None:
    """Give the custom node's output its shape (x's, last dim N) so the exporter's shape
    inference does not lose it."""
    try:
        sizes = x.type().varyingSizes()
        if sizes:
            y.setType(x.type().with_sizes(list(sizes[:-1]) + [n_out]))
        else:
            y.setType(x.type())
    except (AttributeError, RuntimeError):
        pass


def _set_submodule(root, qualified: str, new) -> None:
    parent_name, _, attr = qualified.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, attr, new)


def swap_linears(runner, linears: dict, weights: dict, act_scales: dict,
                 accuracy_level: int) -> None:
    """Replace the Linears named in `weights` ({name: (NBits or None, dequantized W [N, K],
    dq or None)}) and wrap those in `act_scales` ({name: float scale}) with an input QDQ."""
    QuantLinear, FakeQuantInput, _, _ = _modules()
    for name, (qual, mod) in linears.items():
        act = act_scales.get(name)
        if name in weights:
            nb, w_deq, dq = weights[name]
            new = QuantLinear(nb, w_deq, getattr(mod, "bias", None), act, accuracy_level, dq)
            _set_submodule(runner.net, qual, new)
        elif act is not None:
            _set_submodule(runner.net, qual, FakeQuantInput(mod, act))


def trace_to_onnx(runner, out_path, sample, opset: int = OPSET, contrib: bool = True) -> None:
    """torch.onnx.export of the runner's (already swapped) network to `out_path`."""
    import torch
    _, _, EncoderOut, CausalOut = _modules()
    wrapper = EncoderOut(runner.net) if runner.kind == "encoder" else CausalOut(runner.net)
    wrapper.eval()
    ids, mask = sample
    outputs = ["last_hidden_state", "pooled"] if runner.kind == "encoder" else ["logits"]
    dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    for o in outputs:
        dyn[o] = {0: "batch"} if o == "pooled" else {0: "batch", 1: "sequence"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, (torch.from_numpy(ids), torch.from_numpy(mask)), str(out_path),
                          input_names=["input_ids", "attention_mask"], output_names=outputs,
                          dynamic_axes=dyn, opset_version=opset, dynamo=False,
                          do_constant_folding=True,
                          custom_opsets={MS_DOMAIN: 1} if contrib else None)
