"""llama.cpp's CPU rounding of the activations, emulated in process.

ggml's CPU backend multiplies a quantized weight by an activation row only after converting the
row to the weight type's ``vec_dot_type`` (ggml-cpu.c, ``type_traits_cpu``): Q8_K for the
k-quants, IQ2/IQ3/IQ1, IQ4_XS and TQ types (blocks of 256, one float32 scale from the element of
largest magnitude: ``q = min(127, round(-127/max · x))``, ``x̂ = q · (max/-127)``;
``quantize_row_q8_K``), Q8_0 / Q8_1 for Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4, NVFP4 and Q4_1, Q5_1
(blocks of 32, ``d = amax/127`` stored as float16, ``q = round(x/d)``, ``x̂ = q · fp16(d)``;
``quantize_row_q8_0`` / ``_q8_1``, whose extra block sum only re-rounds the weight minimum's
term), F16 and BF16 for F16 / BF16 weights (the row rounded to that float type). F32 weights
use the row as it is.

:func:`llama_cpu_hooks` puts this rounding in front of each Linear of a Runner whose weight the
plan stores in such a type (the blocks' projections and the output head), as forward pre-hooks
that act only while ``switch["on"]`` is true, so the float model's passes through the same
modules stay exact. Fused expert tensors (MoE) are not covered (their matmuls are not Linear
modules): the hooks skip them.
"""

from __future__ import annotations

from workbench.core.errors import WorkbenchError
from workbench.schemes.registry import llama_type_names

#: ggml's vec_dot_type of each weight type (ggml-cpu.c); types not listed: the row as it is
VEC_DOT = {
    "q4_0": "q8_0", "q5_0": "q8_0", "q8_0": "q8_0", "iq4_nl": "q8_0", "mxfp4": "q8_0",
    "nvfp4": "q8_0", "q4_1": "q8_1", "q5_1": "q8_1",
    "q2_K": "q8_K", "q3_K": "q8_K", "q4_K": "q8_K", "q5_K": "q8_K", "q6_K": "q8_K",
    "iq2_xxs": "q8_K", "iq2_xs": "q8_K", "iq2_s": "q8_K", "iq3_xxs": "q8_K", "iq3_s": "q8_K",
    "iq1_s": "q8_K", "iq1_m": "q8_K", "iq4_xs": "q8_K", "tq1_0": "q8_K", "tq2_0": "q8_K",
    "f16": "f16", "bf16": "bf16",
}
#: the source dtype of a tensor a llama.cpp export keeps as it is, as a ggml type
_KEPT = {"float16": "f16", "bfloat16": "bf16", "f16": "f16", "bf16": "bf16"}


def vec_dot_of(scheme: str, source_dtype: str | None = None) -> str | None:
    """The activation type llama.cpp's CPU backend converts a row to before its dot products
    with a weight stored as `scheme` ("keep": the source's dtype), None when it keeps float32."""
    if scheme == "keep":
        t = _KEPT.get(str(source_dtype or "").lower().replace("torch.", ""))
    else:
        t = llama_type_names().get(scheme)
    return VEC_DOT.get(t) if t else None


def fake_q8_0(x):
    """x rounded as quantize_row_q8_0 rounds it (last dim a multiple of 32), dequantized."""
    import torch
    shape = x.shape
    b = x.float().reshape(*shape[:-1], shape[-1] // 32, 32)
    amax = b.abs().amax(-1, keepdim=True)
    c127 = torch.full_like(amax, 127.0)       # tensor / tensor: IEEE division, as in C (a
    d = torch.div(amax, c127)                 # Python number over a tensor is a reciprocal
    inv = torch.where(amax > 0, torch.div(c127, amax.clamp(min=1e-38)),   # times it)
                      torch.zeros_like(amax))
    q = torch.round(b * inv)
    return (q * d.half().float()).reshape(shape).to(x.dtype)


def fake_q8_K(x):
    """x rounded as quantize_row_q8_K rounds it (last dim a multiple of 256), dequantized:
    the scale from the signed element of largest magnitude, codes clipped at 127."""
    import torch
    shape = x.shape
    b = x.float().reshape(*shape[:-1], shape[-1] // 256, 256)
    i = b.abs().argmax(-1, keepdim=True)
    mx = b.gather(-1, i)
    live = mx != 0
    one = torch.ones_like(mx)
    iscale = torch.where(live, torch.div(torch.full_like(mx, -127.0), torch.where(live, mx, one)),
                         torch.zeros_like(mx))
    q = torch.round(iscale * b).clamp(max=127)
    d = torch.where(live, torch.div(one, torch.where(live, iscale, one)), torch.zeros_like(mx))
    return (q * d).reshape(shape).to(x.dtype)


def fake_round(x, kind: str):
    """x as llama.cpp's CPU dot products see it when the weight's vec_dot_type is `kind`."""
    import torch
    n = x.shape[-1]
    if kind in ("q8_0", "q8_1") and n % 32 == 0:
        return fake_q8_0(x)
    if kind == "q8_K" and n % 256 == 0:
        return fake_q8_K(x)
    if kind == "f16":
        return x.to(torch.float16).to(x.dtype)
    if kind == "bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    return x


def module_kinds(runner, decisions) -> dict:
    """{Linear module of `runner`: vec_dot kind} for the blocks' projections and the head, from
    `decisions` ({workbench name: scheme applied, or "keep"}) and the source dtypes."""
    out = {}
    for n in runner.linear_names():
        kind = vec_dot_of(decisions.get(n, "keep"), runner.model.info(n).dtype)
        if kind:
            out[runner.module_of(n)] = kind
    head = runner.head
    if head is not None and runner.head_params:
        for n in runner._source(runner.head_params[0]):
            kind = vec_dot_of(decisions.get(n, "keep"), runner.model.info(n).dtype)
            if kind:
                out[head] = kind
    return out


def llama_cpu_hooks(runner, decisions):
    """(hook handles, switch): forward pre-hooks rounding each quantized Linear's input rows as
    llama.cpp's CPU backend does, active while ``switch["on"]``."""
    switch = {"on": False}
    handles = []
    for mod, kind in module_kinds(runner, decisions).items():
        def pre(module, args, _kind=kind):
            if not switch["on"] or not args:
                return None
            return (fake_round(args[0], _kind), *args[1:])
        handles.append(mod.register_forward_pre_hook(pre))
    return handles, switch


def emulated_decisions(model, plan, emulate) -> dict | None:
    """{workbench name: scheme applied} of `plan` for llama.cpp when `emulate` is
    "llama.cpp", None when it is None; before any work: an unknown `emulate` or a scheme
    llama.cpp cannot store is the one-line error."""
    if emulate not in (None, "llama.cpp"):
        raise WorkbenchError(f"emulate={emulate!r}: the only runtime emulated is 'llama.cpp'")
    if emulate is None:
        return None
    from workbench.quant.runtimes import plan_decisions
    return {n: d.applied for n, d in plan_decisions(model, plan, "llama.cpp").items()} \
        if plan is not None else {}


def emulation(runner, decisions):
    """(hook handles, switch): :func:`llama_cpu_hooks` of `decisions`
    (:func:`emulated_decisions`; None: no hooks, a switch nothing reads). The caller turns
    ``switch["on"]`` on around the quantized passes only and removes the handles."""
    if decisions is None:
        return [], {"on": False}
    return llama_cpu_hooks(runner, decisions)
