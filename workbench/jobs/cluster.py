"""Where the per-tensor work runs: in this process (the default), or on a Dask.distributed
cluster — a local one (`local[:N]`: N single-threaded worker processes on this machine) or a
running one by address (`tcp://HOST:PORT`).

Only names, scheme names and small results travel: each worker opens the checkpoint itself by
path (shared storage) and keeps it open for the next task. Results are computed by the same
functions as the in-process path (workbench.quant.evaluate.evaluate_tensor, ...), so they are the
same figures and the same exported bytes. A task lost with a worker is run again by the
scheduler elsewhere; the scheduler gone is a WorkbenchError; closing a job (Cancel) cancels
its tasks on the cluster.

    with open_executor("local:2") as ex:
        ev = progress.run(evaluate(model, plan, executor=ex))
"""

from __future__ import annotations

import os
import socket
import threading
import time

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress

LOCAL = "local"
IN_PROCESS = "none"
#: seconds the client waits for a scheduler to answer before the address is refused
CONNECT_TIMEOUT = 10
#: the most tasks of one sweep submitted and not yet collected (bounds the scheduler's queue)
SWEEP_WINDOW = 2000
#: how often a waiting job yields progress (so Cancel is seen while tasks run)
POLL_SECONDS = 0.25


def parse_spec(text: str | None) -> tuple[str, object]:
    """("none", None) | ("local", N or None) | ("address", "tcp://host:port") from the
    `--cluster` text; a WorkbenchError naming the problem for anything else."""
    t = (text or "").strip()
    if t in ("", IN_PROCESS, "in-process"):
        return IN_PROCESS, None
    if t == LOCAL or t.startswith(LOCAL + ":"):
        n = t[len(LOCAL) + 1:]
        if not n:
            return LOCAL, None
        if not (n.isascii() and n.isdigit()) or int(n[:12]) < 1:
            raise WorkbenchError(f"--cluster {t[:60]}: the worker count after 'local:' must be "
                                 "a whole number of at least 1")
        return LOCAL, int(n) if len(n) <= 12 else 10 ** 12   # (capped by the cores anyway)
    if "://" in t:
        scheme, rest = t.split("://", 1)
        host, _, port = rest.rpartition(":")
        if scheme not in ("tcp", "tls") or not host or not port.isdigit():
            raise WorkbenchError(f"--cluster {t}: give a scheduler address tcp://HOST:PORT")
        return "address", t
    raise WorkbenchError(f"--cluster {t}: expected local, local:N or tcp://HOST:PORT")


def cores() -> int:
    """The cores this process may run on (its CPU affinity; os.cpu_count where that is not
    known)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def local_workers(n: int | None) -> tuple[int, str | None]:
    """(workers a local cluster starts for `local:N`, a note when N was capped): at most one
    single-threaded worker per core (more only contend for the same cores, each with its own
    copy of the model open)."""
    c = cores()
    if n is None:
        return c, None
    if n > c:
        shown = f"{n:,}" if n < 10 ** 12 else "more than 10^12"
        return c, (f"--cluster local:{shown}: this machine has {c} core{'s' if c != 1 else ''} "
                   f"for this process; starting {c} worker{'s' if c != 1 else ''}")
    return n, None


def add_cluster_arg(p) -> None:
    """--cluster for the commands that sweep tensors (evaluate, sensitivity, allocate,
    frontier, export)."""
    p.add_argument("--cluster", default=None, metavar="SPEC",
                   help="run the per-tensor work on Dask workers: local (one worker per core), "
                        "local:N (N single-threaded workers on this machine) or tcp://HOST:PORT "
                        "(a running scheduler; workers open the model by the same path); "
                        "default: in this process. Needs the [cluster] extra")


def open_executor(spec: str | None):
    """An executor for `spec` (see parse_spec): None for the in-process path, else a
    ClusterExecutor (a context manager: closing it closes a local cluster it started)."""
    kind, arg = parse_spec(spec)
    if kind == IN_PROCESS:
        return None
    return ClusterExecutor(kind, arg)


class ClusterExecutor:
    """A Dask client, and the local cluster behind it when it started one."""

    def __init__(self, kind: str, arg=None):
        from workbench.core.optional import require
        distributed = require("distributed", "cluster")
        self._distributed = distributed
        self.cluster = None
        self.note = None      # a line for the user (the worker count capped by the cores)
        self.spec = f"local:{arg}" if kind == LOCAL and arg else (LOCAL if kind == LOCAL
                                                                   else str(arg))
        try:
            if kind == LOCAL:
                n, self.note = local_workers(arg)
                self.spec = f"local:{n}" if arg else LOCAL
                self.cluster = distributed.LocalCluster(
                    n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                    dashboard_address=None, silence_logs=50)
                self.client = distributed.Client(self.cluster, timeout=CONNECT_TIMEOUT)
            else:
                self.client = distributed.Client(arg, timeout=CONNECT_TIMEOUT)
        except WorkbenchError:
            raise
        except Exception as exc:   # noqa: BLE001 - any failure to reach it is one line
            self.close()
            raise WorkbenchError(f"cannot reach the cluster {self.spec}: "
                                 f"{type(exc).__name__}: {exc}") from None

    # ---- the pool interface -------------------------------------------------------------------
    @property
    def address(self) -> str:
        return self.client.scheduler.address

    def workers(self) -> int:
        """Worker threads the cluster has now (at least 1)."""
        try:
            info = self.client.scheduler_info(n_workers=-1)
        except TypeError:
            info = self.client.scheduler_info()
        except Exception as exc:   # noqa: BLE001
            raise self.gone(exc) from None
        return max(1, sum(int(w.get("nthreads", 1)) for w in info.get("workers", {}).values()))

    def submit(self, fn, *args, key: str | None = None):
        """A future running fn(*args) on a worker (each submission a task of its own)."""
        kw = {"pure": False}
        if key:
            import uuid
            kw["key"] = f"{key}-{uuid.uuid4().hex[:12]}"
        try:
            return self.client.submit(fn, *args, **kw)
        except Exception as exc:   # noqa: BLE001
            raise self.gone(exc) from None

    def result(self, fut):
        """The result of a future: its WorkbenchError re-raised as is, the scheduler or the
        connection lost as one line. Waits in short steps so a closed scheduler is seen."""
        while True:
            done, _ = self._wait([fut])
            if done:
                break
        return self._value(fut)

    def _value(self, fut):
        try:
            return fut.result()
        except WorkbenchError:
            raise
        except Exception as exc:   # noqa: BLE001
            if fut.status == "error" and not self._lost(exc):
                raise    # a bug in a task: its own traceback
            raise self.gone(exc) from None

    def _wait(self, futs):
        """(done, not done) after at most POLL_SECONDS; the scheduler gone raises."""
        self.check_alive()
        try:
            res = self._distributed.wait(futs, timeout=POLL_SECONDS, return_when="FIRST_COMPLETED")
            return res.done, res.not_done
        except self._timeout_errors():
            return set(), set(futs)
        except Exception as exc:   # noqa: BLE001
            raise self.gone(exc) from None

    def _timeout_errors(self):
        import asyncio
        import concurrent.futures
        return (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError,
                self._distributed.TimeoutError if hasattr(self._distributed, "TimeoutError")
                else TimeoutError)

    def _lost(self, exc) -> bool:
        name = type(exc).__name__
        return name in ("CancelledError", "FutureCancelledError", "FuturesCancelledError",
                        "CommClosedError", "KilledWorker", "StreamClosedError") or \
            self.client.status not in ("running", "connecting", "newly-created")

    def check_alive(self) -> None:
        if self.client.status != "running":
            raise self.gone(None)

    def gone(self, exc) -> WorkbenchError:
        what = "" if exc is None else f" ({type(exc).__name__}: {exc})".rstrip(": )") + ")"
        if exc is not None and type(exc).__name__ == "KilledWorker":
            return WorkbenchError(f"cluster {self.spec}: a task killed its workers too often, "
                                  f"so the scheduler gave it up{what}; nothing was written")
        return WorkbenchError(f"cluster {self.spec}: the scheduler is gone or unreachable"
                              f"{what}; nothing was written")

    def cancel(self, futs) -> None:
        futs = [f for f in futs if f is not None]
        if not futs:
            return
        try:
            self.client.cancel(futs, force=True)
        except Exception:   # noqa: BLE001 - a gone scheduler has nothing left to cancel
            pass

    def close(self) -> None:
        for obj in (getattr(self, "client", None), self.cluster):
            if obj is not None:
                try:
                    obj.close()
                except Exception:   # noqa: BLE001
                    pass
        self.cluster = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- sweeps -----------------------------------------------------------------------------
    # ---- what the lower packages call (they take an executor, they never import this) ----
    def takes(self, model) -> bool:
        """Whether this executor's workers can work on `model` (a loader's model, opened by
        path: workbench.jobs.cluster.is_plain)."""
        return is_plain(model)

    def prefetch_evaluations(self, model, requests, cache, message: str = "measuring",
                             per_scheme: bool = False):
        """Job: workbench.quant.evaluate's results for `requests` put in `cache` from the
        workers (prefetch_evaluations)."""
        return prefetch_evaluations(self, model, requests, cache, message, per_scheme)

    def tensor_stats(self, model, names, bins: int):
        """Job: [workbench.quant.stats.TensorStats] of `names`, one task per tensor on the
        workers, weighted by the tensors' bytes."""
        sig = signature(model)
        return (yield from self.sweep(stats_task, [(sig, n, bins) for n in names], "statistics",
                                      [max(model.info(n).nbytes, 1) for n in names]))

    def sweep(self, fn, tasks, message: str = "", weights=None):
        """Job: fn(*task) for every task on the workers, results in task order. Progress counts
        finished tasks (weighted by `weights` when given); closing the job (Cancel) cancels
        the tasks still on the cluster."""
        tasks = list(tasks)
        w = list(weights) if weights is not None else [1] * len(tasks)
        total = float(sum(w)) or 1.0
        results: list = [None] * len(tasks)
        live: dict = {}
        nxt, done, shown = 0, 0.0, 0.0
        ac = self._distributed.as_completed([], raise_errors=False)
        try:
            while nxt < len(tasks) or live:
                while nxt < len(tasks) and len(live) < SWEEP_WINDOW:
                    fut = self.submit(fn, *tasks[nxt], key=getattr(fn, "__name__", "task"))
                    live[fut] = nxt
                    ac.add(fut)
                    nxt += 1
                self.check_alive()
                finished = [f for f in ac.next_batch(block=False) if f in live]
                for f in finished:
                    i = live.pop(f)
                    results[i] = self._value(f)
                    done += w[i]
                if not finished:
                    time.sleep(0.01)
                now = time.monotonic()
                if finished or now - shown >= POLL_SECONDS:   # Cancel is seen between these
                    shown = now
                    yield Progress(done, total, f"{message} on {self.spec}: "
                                                f"{len(tasks) - nxt + len(live)} of {len(tasks)}"
                                                " tasks left")
        finally:
            ac.clear()
            self.cancel(list(live))
        return results


# ---- the worker side ----------------------------------------------------------------------------
_OPEN: dict = {}
_OPEN_LOCK = threading.Lock()


def signature(model) -> tuple:
    """What a worker checks before it works on `model`: its path and the file's size/mtime
    (workbench.quant.stats.file_signature), so a different file at that path is refused."""
    from workbench.quant.stats import file_signature
    return (str(model.path), file_signature(model.path))


def worker_model(sig: tuple):
    """The model at sig's path, opened once per worker process. A path the worker cannot see
    (no shared storage) or a different file there is a one-line WorkbenchError."""
    path, fsig = sig
    _one_kernel_thread()
    with _OPEN_LOCK:    # a worker with several threads opens the model once
        hit = _OPEN.get(path)
        if hit is not None and hit[0] == fsig:
            return hit[1]
        model = _open_checked(path, fsig)
        _OPEN.clear()    # one model at a time per worker: its maps are released
        _OPEN[path] = (fsig, model)
        return model


def _same_file(a, b) -> bool:
    """Signatures (mtime_ns, size) of one file as two machines see it: the same size, and
    modification times within 2 s (file systems store them at different precisions)."""
    if a is None or b is None:
        return a == b
    return a[1] == b[1] and abs(a[0] - b[0]) < 2_000_000_000


def _open_checked(path: str, fsig):
    host = socket.gethostname()
    if not os.path.exists(path):
        raise WorkbenchError(f"worker on {host} (pid {os.getpid()}) cannot see the checkpoint "
                             "at this path: workers open the model by the client's path, so it "
                             "must be on storage they share", path=path)
    from workbench.quant.stats import file_signature
    if not _same_file(file_signature(path), fsig):
        raise WorkbenchError(f"worker on {host} sees a different file at this path than the "
                             "client (size or modification time differ)", path=path)
    from workbench.formats.loaders import open_model
    return open_model(path)


def _one_kernel_thread() -> None:
    """A task's kernels run on its worker thread alone (numba's setting is per thread): a
    machine's cores are used by running one single-threaded worker per core."""
    try:
        import numba
        if numba.get_num_threads() != 1:
            numba.set_num_threads(1)
    except ImportError:
        pass


def is_plain(model) -> bool:
    """Whether workers can rebuild `model` from its path: a loader's model, not a method's
    (GPTQ/AWQ statistics live in this process), which stays on the in-process path."""
    from workbench.formats.model import Model
    return isinstance(model, Model)


def evaluate_task(sig, name: str, requests: list) -> list:
    """On a worker: evaluate_tensor for each (scheme, decision) of one tensor."""
    from workbench.quant.evaluate import evaluate_tensor
    model = worker_model(sig)
    return [evaluate_tensor(model, name, s, None, decision=d) for s, d in requests]


def prefetch_evaluations(executor, model, requests, cache, message: str = "measuring",
                         per_scheme: bool = False):
    """Job: evaluate_tensor's results for `requests` [(name, scheme, decision)] computed on the
    cluster, one task per tensor (`per_scheme`: per tensor x scheme, for one tensor's
    comparison), put in `cache` under the keys evaluate_tensor looks up, so the caller's
    in-process loop finds every one there (the same results it would compute). Entries
    already cached are not sent."""
    by_name: dict[str, list] = {}
    for n, s, d in requests:
        key = (model.path, n, s, d.applied, d.kind)
        if cache.get(key) is None:
            by_name.setdefault(n, [])
            if (s, d) not in by_name[n]:
                by_name[n].append((s, d))
    if not by_name:
        return 0
    sig = signature(model)
    groups = [(n, [r]) for n, rs in by_name.items() for r in rs] if per_scheme \
        else list(by_name.items())
    weights = [max(model.info(n).numel, 1) * len(rs) for n, rs in groups]
    out = yield from executor.sweep(evaluate_task, [(sig, n, rs) for n, rs in groups],
                                    message, weights)
    for (n, rs), results in zip(groups, out):
        for (s, d), r in zip(rs, results):
            cache.put((model.path, n, s, d.applied, d.kind), r)
    return sum(len(v) for v in by_name.values())


class Ahead:
    """Results of `tasks` [(key, args)] computed ahead on the cluster, taken in their order
    with take(key); at most `window` submitted and not taken (an export's bounded memory).
    close() cancels the rest."""

    def __init__(self, executor, fn, tasks, window: int):
        self.ex, self.fn, self.tasks, self.window = executor, fn, list(tasks), max(1, window)
        self.next, self.live = 0, {}
        self._fill()

    def _fill(self) -> None:
        while self.next < len(self.tasks) and len(self.live) < self.window:
            key, args = self.tasks[self.next]
            self.live[key] = self.ex.submit(self.fn, *args, key=self.fn.__name__)
            self.next += 1

    def take(self, key):
        fut = self.live.pop(key)
        try:
            return self.ex.result(fut)
        finally:
            self._fill()

    def close(self) -> None:
        self.ex.cancel(list(self.live.values()))
        self.live = {}


def quantize_task(sig, name: str, scheme: str):
    """On a worker: (QuantizedTensor, matrix shape) of one tensor, workbench.quant.evaluate.quantize."""
    from workbench.core.errors import context
    from workbench.quant.evaluate import quantize
    model = worker_model(sig)
    with context(model.info(name).file or model.path, name):
        w = model.read_matrix(name)
        return quantize(w, scheme, tensor=name), w.shape


def activation_task(sig, name: str, applied: list, ex2, rows: bool) -> list:
    from workbench.quant.streaming import activation_error
    model = worker_model(sig)
    return [activation_error(model, name, a, ex2, rows=rows) for a in applied]


def stats_task(sig, name: str, bins: int):
    """On a worker: workbench.quant.stats.tensor_stats of one tensor."""
    from workbench.core.errors import context
    from workbench.core.progress import run
    from workbench.quant.stats import tensor_stats
    model = worker_model(sig)
    with context(model.info(name).file or model.path, name):
        return run(tensor_stats(model, name, bins))


def timed_noop(x):
    """bench-cluster: a task that does nothing (the per-task overhead)."""
    return x

