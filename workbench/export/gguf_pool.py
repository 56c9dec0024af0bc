"""Where a GGUF export's encoding tasks run: local worker threads (as many as numba's thread
count, at most 8, one kernel thread each), or a cluster's workers (workbench.jobs.cluster), which
open the model by path, run the task (a function of workbench.export.gguf_tensor_data) and send
its bytes back.
"""

from __future__ import annotations

import os

from workbench.export import gguf_tensor_data
from workbench.export.gguf_items import _Item


def _workers() -> int:
    """Tensors quantized at once: numba's thread count (all cores, or `export --threads N`,
    or NUMBA_NUM_THREADS), at most 8. Each worker runs its kernels on one thread, so the
    export computes on exactly that many threads."""
    try:
        import numba
        n = numba.get_num_threads()
    except ImportError:
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def _one_kernel_thread() -> None:
    try:
        import numba
        numba.set_num_threads(1)
    except ImportError:
        pass


class _ClusterPool:
    """The export's pool on a cluster (workbench.jobs.cluster): a task's item and rows travel, the
    worker opens the model by path and sends the encoded bytes back; this process writes them
    in order, as with the local threads. Leaving it cancels what is still queued."""

    REMOTE = ("_tensor_data", "_part_data", "_kept_data", "_chunk_data")

    def __init__(self, executor, model):
        from workbench.jobs.cluster import signature
        self.ex, self.sig, self.futs = executor, signature(model), []

    def submit(self, fn, *args):
        if getattr(fn, "__name__", "") not in self.REMOTE:
            return _Done(fn(*args))           # data held here already (rope_freqs)
        item, rest = args[1], args[2:]
        if fn.__name__ == "_tensor_data":
            rest = ()                         # the source reader and layout: rebuilt there
        fut = self.ex.submit(_remote_task, self.sig, fn.__name__, item, *rest,
                             key=f"gguf{fn.__name__}")
        self.futs.append(fut)
        return _Remote(self.ex, fut)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.ex.cancel([f for f in self.futs if not f.done()])
        self.futs = []


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class _Remote:
    def __init__(self, ex, fut):
        self.ex, self.fut = ex, fut

    def result(self):
        return self.ex.result(self.fut)


_REMOTE_TARGETS: dict = {}


def _remote_task(sig, fn_name: str, item: _Item, *rest):
    """On a worker: one export task against the worker's own copy of the model."""
    from workbench.jobs.cluster import worker_model
    model = worker_model(sig)
    if fn_name == "_tensor_data":
        reader_tensors = {}
        if model.format == "gguf" and model.source is not None:
            reader_tensors = {t.name: t for t in model.source.tensors}
        hf = None
        if item.transform:
            if sig not in _REMOTE_TARGETS:
                from workbench.export.gguf_target import hf_target
                _REMOTE_TARGETS.clear()
                _REMOTE_TARGETS[sig] = hf_target(model)[0]
            hf = _REMOTE_TARGETS[sig]
        rest = (reader_tensors, hf)
    return getattr(gguf_tensor_data, fn_name)(model, item, *rest)
