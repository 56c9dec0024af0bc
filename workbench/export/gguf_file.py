"""Export a GGUF file (llama.cpp's format), each tensor encoded per the plan.

* From a GGUF source: every key/value is copied (``general.architecture`` and
  ``general.alignment`` included), then ``general.file_type`` is set to the llama_ftype of the
  type that holds most weight parameters (the way llama-quantize labels its output; K-quants
  map to the _M variants that llama-quantize's plain ``Q4_K`` etc. aliases name) and
  ``general.quantization_version`` to 2. A ``keep`` tensor is copied byte for byte.
* From safetensors / PyTorch: the tensors keep their original names (llama.cpp will not run
  such a file, but every GGUF reader can open it); ``general.architecture`` is
  ``quant_workbench``.
* Both carry the plan as JSON in ``quant_workbench.plan``.

Tensor types: ``keep`` (the source's own type; types GGUF lacks are widened exactly:
U8->I16, U16->I32, U32->I64, BOOL->I8, FP8->F16), ``fp32``/``fp16``/``bf16`` (F32/F16/BF16) and
every GGML block scheme (Q4_0 ... Q6_K, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, MXFP4, TQ1_0, TQ2_0, NVFP4), whose bytes are exactly
``scheme.quantize(w).arrays["blocks"]``. Any other scheme, or a tensor whose row length
(innermost dimension) is not a multiple of the GGML block, is refused with a WorkbenchError
naming the tensor, before anything is written.

Header, key/values and tensor infos are written with gguf.GGUFWriter, then the tensor data in
file order (padded to the alignment as the package pads it) with os.write. Re-encoded tensors
are cut into row chunks that worker threads quantize in parallel (numba kernels, GIL released)
while this thread writes finished chunks in order; at most 2 x workers + 2 tasks are in
flight, so memory is bounded by a few chunks (and whole tensors for copies and widenings).
F16/BF16 rows bound for Q4_0/Q8_0 are widened inside the quantize kernel itself
(accel.quantize_widening), the same bytes as widening them first.
Atomic: a temporary file beside the target, renamed over it on success, removed on error or
cancel.

The parts, one module each: gguf_items (what each tensor becomes, decided before anything is
written), gguf_header (key/values and tensor infos), gguf_tensor_data (each tensor's bytes),
gguf_pool (where the encoding tasks run), gguf_size (the file's size without writing it). This
module is the driver that writes the file.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from pathlib import Path

import numpy as np

from workbench.core.atomic import default_file_mode, make_temp
from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress
from workbench.export import register_exporter
from workbench.export.gguf_header import QUANTIZATION_VERSION, _fast_writer_class, _write_head
from workbench.export.gguf_items import _prepare
from workbench.export.gguf_pool import _ClusterPool, _one_kernel_thread, _workers
from workbench.export.gguf_tensor_data import _chunk_data, _kept_data, _part_data, _row_chunks, \
    _tensor_data


def _write_all(fd: int, data) -> int:
    """Write bytes or a C-contiguous array to fd entirely; returns the byte count."""
    mv = memoryview(data if isinstance(data, bytes) else data.reshape(-1).view(np.uint8))
    n = len(mv)
    while mv:
        mv = mv[os.write(fd, mv):]
    return n


#: tasks per worker started before the header is written (row chunks of at most
#: gguf_tensor_data.CHUNK_ELEMENTS: their results, held until written, stay bounded)
HEAD_TASKS = 8


@register_exporter("gguf", ".gguf",
                   "GGUF for llama.cpp: F32/F16/BF16 and GGML block types (q4_0 ... q6_k, iq4_nl, iq4_xs, iq3_xxs, iq3_s, iq2_xxs, iq2_xs, iq2_s, iq1_s, iq1_m, mxfp4, tq1_0, tq2_0, nvfp4) "
                   "per the plan; metadata copied from a GGUF source")
def export_gguf(model, plan, out_path, strict: bool = False, executor=None):
    import gguf
    from concurrent.futures import ThreadPoolExecutor

    from workbench.quant.runtimes import summarize
    target = Path(out_path)       # checked by the export door (workbench.core.outputs)
    yield Progress(0, 1, "checking the plan")
    prep = _prepare(model, plan, strict)
    items, dropped, decisions, hf = prep.items, prep.dropped, prep.decisions, prep.hf
    from_gguf, reader, arch, not_runnable = prep.from_gguf, prep.reader, prep.arch, \
        prep.not_runnable
    summary = summarize(d for n, d in decisions.items() if n not in dropped)
    reader_tensors = {t.name: t for t in reader.tensors} if reader is not None else {}

    fd, tmp = make_temp(target)
    os.close(fd)
    writer = None
    try:
        writer = _fast_writer_class()(tmp, arch)
        total = sum(max(int(np.prod(it.shape)), 1) for it in items) or 1
        done = 0
        types: dict[str, int] = {}
        # tasks in file order: a row chunk of a re-encoded tensor, or a whole tensor. Workers
        # run them in parallel (the kernels release the GIL); this thread writes the results
        # in order. At most `window` tasks are queued or held (HEAD_TASKS per worker while the
        # header is packed), so memory stays bounded.
        tasks = ((i, task, k == 0, k == len(chunks) - 1) for i, it in enumerate(items)
                 for chunks in [_row_chunks(model, it) or [None]]
                 for k, task in enumerate(chunks))
        from workbench.jobs.cluster import is_plain
        if executor is not None and is_plain(model):
            workers = executor.workers()
            pool_cm = _ClusterPool(executor, model)
        else:
            workers = _workers()
            pool_cm = ThreadPoolExecutor(max_workers=workers, initializer=_one_kernel_thread)
        window = 2 * workers + 2
        with pool_cm as pool:
            pending: deque = deque()

            def submit() -> None:
                task = next(tasks, None)
                if task is None:
                    return
                i, what, first, last = task
                if what is None:
                    fut = pool.submit(_tensor_data, model, items[i], reader_tensors, hf)
                elif what[0] == "part":
                    fut = pool.submit(_part_data, model, items[i], what[1])
                elif what[0] == "extra":
                    fut = pool.submit(lambda a: [a], what[1])
                elif what[0] == "kept":
                    fut = pool.submit(_kept_data, model, items[i], what[1], what[2])
                else:
                    fut = pool.submit(_chunk_data, model, items[i], what[1], what[2])
                pending.append((i, first, last, fut))

            # the first tensors are quantized while this thread packs the header (the
            # tokenizer's key/values: most of a second for a 49k-token vocabulary)
            for _ in range(HEAD_TASKS * workers):
                submit()
            skipped, n_vocab, name_note, file_type = _write_head(writer, model, plan, prep)
            writer.write_header_to_file(Path(tmp))
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            # tensor data: written here straight from the arrays (each tensor padded to the
            # alignment, as GGUFWriter.write_tensor_data does), part by part, no joined copy
            fout = writer.fout[0]
            fout.flush()
            fd, pos, align = fout.fileno(), fout.tell(), writer.data_alignment
            written = 0
            while pending:
                i, first, last, fut = pending.popleft()
                it = items[i]
                if first:
                    yield Progress(done, total,
                                   f"writing {i + 1}/{len(items)} {it.out} ({it.gtype})")
                    pos += _write_all(fd, b"\0" * (-pos % align))
                    written = 0
                parts = fut.result()
                if len(pending) < window:
                    submit()
                n = sum(p.nbytes for p in parts)
                if written + n > it.nbytes or (last and written + n != it.nbytes):
                    raise WorkbenchError(f"internal error: {written + n} bytes for a {it.gtype} "
                                         f"tensor of {it.nbytes}", tensor=it.name)
                for p in parts:
                    pos += _write_all(fd, p)
                written += n
                del parts
                if last:
                    pos += _write_all(fd, b"\0" * (-written % align))
                    types[it.gtype] = types.get(it.gtype, 0) + 1
                    done += max(int(np.prod(it.shape)), 1)
        os.fsync(fd)
        writer.close()
        writer = None
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, target)
    except BaseException as exc:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise WorkbenchError(f"write failed ({exc.strerror or exc}); existing file left "
                                 "unchanged", path=str(target)) from exc
        raise
    yield Progress(total, total, "done")
    try:
        ftype_name = gguf.LlamaFileType(file_type).name
    except ValueError:
        ftype_name = str(file_type)
    out = {"path": str(target), "format": "gguf", "tensors": len(items),
           "bytes": target.stat().st_size, "file_type": ftype_name,
           "quantization_version": QUANTIZATION_VERSION, "types": types,
           "architecture": arch, "skipped_keys": skipped,
           "runnable_by_llama_cpp": from_gguf or hf is not None,
           "dropped_by_converter": dropped,
           "fallbacks": summary.to_dict(),
           "notes": {d.name: d.note for d in decisions.values()
                     if d.note and d.kind in ("fallback", "skipped") and d.name not in dropped}}
    if n_vocab is not None:
        out["vocab_size"] = n_vocab
    if not_runnable:
        out["not_runnable"] = not_runnable
    if name_note:
        out["notes"]["general.name"] = name_note
    return out
