"""The size of the GGUF file an export would write for a plan, without quantizing anything:
the measure of a file budget (workbench.planning.budget, `--budget-file-bytes`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path

from workbench.export.gguf_header import _fast_writer_class, _write_head
from workbench.export.gguf_items import _prepare


#: {model path: the thread of `prefetch`} not yet joined by `layout_bytes`
_PREFETCH: dict = {}
_PREFETCH_LOCK = threading.Lock()


def prefetch(model, plan) -> None:
    """Start measuring `plan`'s header on a background thread, so that the tokenizer's
    key/values (read and packed once per process: about a second for a 49k-token vocabulary)
    are ready when a file budget's solve asks for the file's size (`allocate` calls this before
    its sensitivity pass, whose torch and numba work leave the interpreter free). An error
    there is dropped: the solve's own call meets it and reports it."""
    def work():
        with contextlib.suppress(Exception):
            _layout_bytes(model, plan)
    t = threading.Thread(target=work, name="gguf-header", daemon=True)
    with _PREFETCH_LOCK:
        _PREFETCH[str(model.path)] = t
    t.start()


def layout_bytes(model, plan) -> dict:
    """The size of the GGUF file `export_gguf` would write for `plan`, without quantizing
    anything: the header (key/values, the plan's JSON, tensor infos) written to a scratch
    file, and each tensor's bytes padded to the alignment as the export pads them.
    {"file": total, "header": header bytes padded, "tensors": {source name: padded bytes}}."""
    with _PREFETCH_LOCK:
        pending = _PREFETCH.pop(str(model.path), None)
    if pending is not None:
        pending.join()             # its work is this call's first half: never done twice
    return _layout_bytes(model, plan)


def _layout_bytes(model, plan) -> dict:
    prep = _prepare(model, plan)
    fd, tmp = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    writer = None
    try:
        writer = _fast_writer_class()(tmp, prep.arch)
        _write_head(writer, model, plan, prep)
        writer.write_header_to_file(Path(tmp))
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        fout = writer.fout[0]
        fout.flush()
        align = writer.data_alignment
        head = fout.tell()
        writer.close()
        writer = None
    finally:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    head += -head % align
    per: dict[str, int] = {}
    for it in prep.items:
        per[it.name] = per.get(it.name, 0) + it.nbytes + (-it.nbytes % align)
    return {"file": head + sum(per.values()), "header": head, "tensors": per,
            "dropped": list(prep.dropped), "alignment": align}
