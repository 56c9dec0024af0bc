"""Export to ONNX Runtime: the network traced from ``config.json`` with the plan's integer
block-wise Linears as ``com.microsoft.MatMulNBits`` (workbench.export.onnx_layout) and, for
W8A8, ``QuantizeLinear``/``DequantizeLinear`` on the inputs of the Linears the plan gives an
activation range (``plan.activations``: ``export --activations``).

Rules (target runtime ``onnxruntime``, workbench.quant.runtimes): only Linear weights are re-typed
(attention and MLP projections, the LM head); embeddings, norms and biases stay float32; a scheme
MatMulNBits cannot hold takes the plan's fallback when that is expressible, else stays float
(a note). GPT-2's Conv1D weights are stored transposed (in × out) and stay float.

W8A8: a Linear with an activation entry gets its input quantized to int8 (symmetric, zero point 0,
scale = the calibrated amax / 127). If its weight is int8 per-channel or per-tensor, the weight is
written as int8 codes + ``DequantizeLinear`` (axis 1) + ``MatMul``, which ONNX Runtime's QDQ
fusion turns into an integer matmul (``MatMulIntegerToFloat``); other weights keep MatMulNBits.

The file's metadata (``metadata_props``) holds ``quant_workbench.plan`` (the plan JSON),
``quant_workbench.opset``, ``quant_workbench.onnxruntime`` (the onnxruntime version the writer ran
with), ``quant_workbench.accuracy_level`` and ``quant_workbench.model_kind``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP
from workbench.core.progress import Progress
from workbench.schemes import get_scheme
from workbench.export import register_exporter

ACCURACY_LEVELS = (0, 1, 2, 3, 4)
DEFAULT_ACCURACY_LEVEL = 4
META = "quant_workbench."


def _dq_form(scheme, qt):
    """(int8/uint8 codes [K, N], scale [N], zero [N]) of an int8 per-channel/per-tensor weight
    for DequantizeLinear (axis 1), or None for other schemes."""
    from workbench.schemes.integer import IntAffine
    from workbench.schemes.packing import unpack_bits
    if not isinstance(scheme, IntAffine) or scheme.bits != 8 or \
            scheme.gran_name not in ("channel", "tensor"):
        return None
    N, K = qt.matrix_shape
    codes = unpack_bits(qt.arrays["codes"], 8, N * K).reshape(N, K)
    scales = np.asarray(qt.arrays["scales"], np.float32).reshape(-1)
    scale = np.full(N, scales[0], np.float32) if scheme.gran_name == "tensor" else scales.copy()
    if scheme.asym:
        zeros = np.asarray(qt.arrays["zeros"], np.uint8).reshape(-1)
        zero = np.full(N, zeros[0], np.uint8) if scheme.gran_name == "tensor" else zeros.copy()
        return np.ascontiguousarray(codes.T), scale, zero
    q = (codes.astype(np.int16) - 128).astype(np.int8)
    return np.ascontiguousarray(q.T), scale, np.zeros(N, np.int8)


def _act_scale(name: str, entry: dict) -> float:
    if entry.get("type", "int") != "int" or int(entry.get("num_bits", 8)) != 8:
        raise WorkbenchError(f"ONNX export takes int8 activations; the plan gives "
                             f"{entry.get('type')}{entry.get('num_bits')} (use act_bits=8 "
                             "act_type=int)", tensor=name, params=("act_bits", "act_type"))
    s = float(entry.get("scale") or 0.0)
    if not (s > 0 and np.isfinite(s)):
        s = float(entry.get("amax") or 0.0) / 127.0
    if not (s > 0 and np.isfinite(s)):
        s = 1.0 / 127.0   # an input that was always zero: any positive scale is exact
    return s


def _constant_value(graph, name: str):
    from onnx import numpy_helper
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return numpy_helper.to_array(node.attribute[0].t)
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    return None


def _split_shared(graph, op_type: str) -> int:
    """Give each consumer of a shared `op_type` node's output its own copy of the node, with its
    own scale and zero-point initializers (ONNX Runtime's common-subexpression elimination would
    merge copies that share them again)."""
    from onnx import numpy_helper
    consumers: dict[str, list] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, i))
    outputs = {o.name for o in graph.output}
    made = 0
    new_nodes = []
    for node in list(graph.node):
        new_nodes.append(node)
        if node.op_type != op_type or node.output[0] in outputs:
            continue
        for k, (user, idx) in enumerate(consumers.get(node.output[0], [])[1:], start=1):
            copy = type(node)()
            copy.CopyFrom(node)
            copy.name = f"{node.name or op_type}_u{k}"
            copy.output[0] = f"{node.output[0]}_u{k}"
            for j in (1, 2):
                v = _constant_value(graph, node.input[j]) if j < len(node.input) else None
                if v is not None:
                    copy.input[j] = f"{copy.name}_in{j}"
                    graph.initializer.append(numpy_helper.from_array(v.copy(), copy.input[j]))
            user.input[idx] = copy.output[0]
            new_nodes.append(copy)
            made += 1
    if made:
        del graph.node[:]
        graph.node.extend(new_nodes)
    return made


def unique_dequantize(graph) -> int:
    """Give every Linear its own QuantizeLinear/DequantizeLinear pair (the tracer merges the
    identical input QDQ of q/k/v and of gate/up; ONNX Runtime fuses a QDQ pair into an integer
    matmul only where each node of the pair feeds one node). Returns the copies made."""
    return _split_shared(graph, "DequantizeLinear") + _split_shared(graph, "QuantizeLinear")


def _sample(runner) -> tuple[np.ndarray, np.ndarray]:
    vocab = int(runner.cfg.get("vocab_size", 100) or 100)
    ids = (np.arange(16, dtype=np.int64).reshape(2, 8) * 7 + 3) % max(vocab, 1)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    return ids, mask


def build_onnx(model, plan, out_path, *, accuracy_level: int = DEFAULT_ACCURACY_LEVEL,
               strict: bool = False):
    """Job: write the ONNX file; returns what `export` reports (see export_onnx)."""
    from workbench.running.onnx_graph import OPSET, float_network, import_onnx, swap_linears, trace_to_onnx
    from workbench.quant.runtimes import check_strict, plan_decisions, summarize
    from workbench.export.onnx_layout import matmulnbits_arrays
    onnx, ort = import_onnx()
    if accuracy_level not in ACCURACY_LEVELS:
        raise WorkbenchError(f"accuracy_level={accuracy_level!r}: choose one of 0..4",
                             params=("accuracy_level",))
    out = Path(out_path)          # checked by the export door (workbench.core.outputs)
    yield Progress(0, 100, "building the float network")
    decisions = plan_decisions(model, plan, "onnxruntime")
    if strict:
        check_strict(decisions.values(), path=model.path)
    base = model.base if type(model).__name__ == "MethodModel" else model
    fold = {n for n in getattr(model, "folded_names", [])   # a method's folded float tensors
            if decisions.get(n) is not None and decisions[n].applied == KEEP}   # (AWQ's norms)
    runner, linears = float_network(base, lambda n: model.read(n) if n in fold else None)
    acts = dict(getattr(plan, "activations", None) or {})
    notes: dict[str, str] = {}
    weights, act_scales = {}, {}
    quantized_bytes = 0
    names = [n for n in linears if n in decisions]
    for i, n in enumerate(names):
        yield Progress(5 + int(70 * i / max(len(names), 1)), 100, f"quantizing {n}")
        d = decisions[n]
        qual, mod = linears[n]
        if n in acts:
            act_scales[n] = _act_scale(n, acts[n])
        if d.applied == KEEP:
            continue
        if type(mod).__name__ != "Linear":
            notes[n] = f"{type(mod).__name__} weight (in x out) has no MatMulNBits form: kept float"
            continue
        scheme = get_scheme(d.applied)
        w = np.ascontiguousarray(model.read_matrix(n), np.float32)
        qt = model.quantize_tensor(n, w, d.applied) if hasattr(model, "quantize_tensor") \
            else _quantize(w, d.applied, n)
        w_deq = np.asarray(scheme.dequantize(qt), np.float32).reshape(w.shape)
        dq = _dq_form(scheme, qt) if n in act_scales else None
        nb = None
        if dq is None:
            nb = matmulnbits_arrays(scheme, qt)
            for note in nb.notes:
                notes[n] = note
            quantized_bytes += nb.nbytes
        else:
            quantized_bytes += dq[0].nbytes + dq[1].nbytes + dq[2].nbytes
        weights[n] = (nb, w_deq, dq)
    swap_linears(runner, linears, weights, act_scales, accuracy_level)
    yield Progress(75, 100, "tracing the network")
    from workbench.core.atomic import make_temp_dir, write_problem
    # named with this process's id: a kill -9 leaves it for the next write here to remove
    tmpdir = make_temp_dir(out.parent, out.name)
    try:
        raw = Path(tmpdir) / "traced.onnx"
        try:
            trace_to_onnx(runner, raw, _sample(runner),
                          contrib=any(v[0] is not None for v in weights.values()))
        except WorkbenchError:
            raise
        except Exception as exc:  # noqa: BLE001 (the exporter's own errors are many types)
            why = write_problem(exc)
            if why is not None:     # the disk, not the network: say so
                raise WorkbenchError(f"cannot write the traced network in {out.parent} ({why}); "
                                     "nothing was written", path=str(out)) from None
            raise WorkbenchError(f"torch.onnx could not trace the {runner.cfg.get('model_type')} "
                                 f"network: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                                 path=str(model.path)) from None
        yield Progress(90, 100, "writing")
        try:
            proto = onnx.load(str(raw))
        except Exception as exc:  # noqa: BLE001 - a traced file cut short by a full disk
            why = write_problem(exc)
            if why is None:
                raise
            raise WorkbenchError(f"cannot write the traced network in {out.parent} ({why}); "
                                 "nothing was written", path=str(out)) from None
        if act_scales:
            unique_dequantize(proto.graph)
        meta = {"plan": plan.to_json(), "opset": str(OPSET), "onnxruntime": ort.__version__,
                "onnx": onnx.__version__, "accuracy_level": str(accuracy_level),
                "model_kind": runner.kind, "source": os.path.basename(str(model.path)),
                "activations": "int8" if act_scales else "float"}
        del proto.metadata_props[:]
        for k, v in meta.items():
            p = proto.metadata_props.add()
            p.key, p.value = META + k, v
        proto.producer_name = "quant-workbench"
        data = proto.SerializeToString()
    finally:
        import shutil
        shutil.rmtree(tmpdir, ignore_errors=True)
    from workbench.core.atomic import atomic_write
    with atomic_write(out) as fh:
        fh.write(data)
    summary = summarize(decisions.values())
    counts = {"matmulnbits": sum(1 for v in weights.values() if v[0] is not None),
              "dequantize_linear": sum(1 for v in weights.values() if v[2] is not None),
              "activation_qdq": len(act_scales)}
    yield Progress(100, 100, "done")
    return {"path": str(out), "format": "onnx", "bytes": len(data), "opset": OPSET,
            "onnxruntime": ort.__version__, "accuracy_level": accuracy_level,
            "model_kind": runner.kind, "quantized_weight_bytes": int(quantized_bytes),
            "nodes": counts, "notes": notes,
            "fallbacks": summary.to_dict() if summary.changed else None}


def _quantize(w, scheme_name, name):
    from workbench.quant.evaluate import quantize
    return quantize(w, scheme_name, tensor=name)


@register_exporter("onnx", ".onnx", activations=True, description=
                   "ONNX Runtime: the traced network, the plan's int2/int4/int8 and q4_0/q4_1/"
                   "q8_0 Linears as com.microsoft.MatMulNBits (W8A8 with --activations)")
def export_onnx(model, plan, out_path, strict: bool = False,
                accuracy_level: int = DEFAULT_ACCURACY_LEVEL):
    return (yield from build_onnx(model, plan, out_path, accuracy_level=accuracy_level,
                                  strict=strict))


def read_metadata(path) -> dict:
    """The quant_workbench.* metadata of an ONNX file written by this exporter."""
    from workbench.running.onnx_graph import import_onnx
    onnx, _ = import_onnx()
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001
        raise WorkbenchError(f"not an ONNX file ({type(exc).__name__})", path=str(path)) from None
    return {p.key[len(META):]: p.value for p in proto.metadata_props if p.key.startswith(META)}

