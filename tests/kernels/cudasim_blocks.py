"""numba's CUDA simulator with cheaper thread blocks (for cudasim_checks.py).

The stock simulator runs a thread block as one OS thread per CUDA thread, started and joined
per block, and finds out that every live thread has reached `cuda.syncthreads()` by polling
them in a loop that holds the GIL. cudasim_checks.py launches about 470 blocks of 128-256
threads: 98,000 OS threads, whose start, join and barrier wake-ups (one per thread per barrier,
through the GIL) were most of its minute of run time, a third of it in the kernel (system time).

Here each CUDA thread of a block is a greenlet (`greenlet`, the test extra) in the launching
thread: a barrier is a switch back to the block's scheduler, which resumes the threads in turn
once every live one has reached it (the stock rule: a thread that has returned no longer
counts). The simulator's `threading.current_thread()` lookups (threadIdx, blockIdx, the
barrier) find the running greenlet's thread record. Every thread still runs the kernel's
Python code in full, so the kernels' results are the stock simulator's; cudasim_checks.py
compares them bit for bit with the numpy references.

Without greenlet, `install()` falls back to OS threads that meet at a condition variable (the
last live thread to arrive releases the others): no polling, same semantics.

`install()` patches the simulator when its internals are the ones this was written for (numba
0.59-0.68: kernel.BlockManager with run and _block_dim, kernel.BlockThread, kernelapi's module
`threading`), returning "greenlets" or "threads"; else it leaves the stock simulator in place
and returns None (slower, same checks).

Also patched: `cuda.shared.array` finds its allocation by the caller's file and line as the
stock one does, reading them off the caller's frame instead of extracting (and reading the
source lines of) the whole stack on every call.
"""

from __future__ import annotations

import sys
import threading

import numpy as np


class _Barrier:
    """A barrier for a changing number of parties: `leave` is a thread that has returned."""

    def __init__(self, parties: int):
        self._cond = threading.Condition()
        self._alive = parties
        self._waiting = 0
        self._round = 0

    def wait(self) -> None:
        with self._cond:
            self._waiting += 1
            if self._waiting == self._alive:
                self._release()
                return
            mine = self._round
            while self._round == mine:
                self._cond.wait()

    def leave(self) -> None:
        with self._cond:
            self._alive -= 1
            if self._waiting and self._waiting == self._alive:
                self._release()

    def _release(self) -> None:
        self._waiting = 0
        self._round += 1
        self._cond.notify_all()


def _known(sim, api) -> bool:
    return (hasattr(sim, "BlockManager") and hasattr(sim, "BlockThread")
            and hasattr(sim.BlockThread, "syncthreads") and hasattr(sim.BlockManager, "run")
            and getattr(api, "threading", None) is threading
            and hasattr(api, "FakeCUDAShared") and hasattr(api, "Dim3"))


def install() -> str | None:
    try:
        from numba.cuda.simulator import kernel as sim
        from numba.cuda.simulator import kernelapi as api
    except ImportError:
        return None
    done = getattr(sim.BlockManager.run, "_cudasim_blocks", None)
    if done:
        return done
    if not _known(sim, api):
        return None
    _shared_by_frame(api)
    try:
        import greenlet
    except ImportError:
        _threads(sim)
        return "threads"
    _greenlets(sim, api, greenlet)
    return "greenlets"


def _shared_by_frame(api) -> None:
    stock = api.FakeCUDAShared.array

    def array(self, shape, dtype):
        if shape == 0:
            return stock(self, shape, dtype)
        from numba.core import types
        from numba.np import numpy_support
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        f = sys._getframe(1)
        caller = (f.f_code.co_filename, f.f_lineno)
        res = self._allocations.get(caller)
        if res is None:
            res = self._allocations[caller] = np.empty(shape, dtype)
        return res

    api.FakeCUDAShared.array = array


def _threads(sim) -> None:
    class Thread(sim.BlockThread):
        def __init__(self, f, manager, block, point, debug, barrier):
            super().__init__(f, manager, block, point, debug)
            self._barrier = barrier

        def run(self):
            try:
                super().run()          # the stock run keeps the kernel's exception
            finally:
                self._barrier.leave()

        def syncthreads(self):
            self._barrier.wait()

    def run(self, grid_point, *args):
        points = list(np.ndindex(*self._block_dim))
        barrier = _Barrier(len(points))

        def target():
            self._f(*args)
        threads = [Thread(target, self, grid_point, p, self._debug, barrier) for p in points]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for t in threads:
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    run._cudasim_blocks = "threads"
    sim.BlockManager.run = run


def _greenlets(sim, api, greenlet) -> None:
    class SimThread:
        """What the simulator reads off `threading.current_thread()` for one CUDA thread."""

        def __init__(self, manager, block, point, scheduler):
            dim = manager._block_dim
            self._manager = manager
            self._scheduler = scheduler
            self.blockIdx = api.Dim3(*block)
            self.threadIdx = api.Dim3(*point)
            self.thread_id = point[0] + dim[0] * (point[1] + dim[1] * point[2])

        def syncthreads(self):
            self._scheduler.switch()

        def _reduce(self, value, op):
            state = self._manager.block_state
            state[self.threadIdx.x, self.threadIdx.y, self.threadIdx.z] = value
            self.syncthreads()
            out = op(state)
            self.syncthreads()
            return out

        def syncthreads_count(self, value):
            return self._reduce(value, np.count_nonzero)

        def syncthreads_and(self, value):
            return self._reduce(value, lambda s: 1 if np.all(s) else 0)

        def syncthreads_or(self, value):
            return self._reduce(value, lambda s: 1 if np.any(s) else 0)

    real = threading.current_thread

    class _Threading:
        """kernelapi's `threading`: current_thread() is the running greenlet's CUDA thread."""

        def __getattr__(self, name):
            return getattr(threading, name)

        @staticmethod
        def current_thread():
            return getattr(greenlet.getcurrent(), "sim_thread", None) or real()

    def run(self, grid_point, *args):
        scheduler = greenlet.getcurrent()
        live = []
        for point in np.ndindex(*self._block_dim):
            g = greenlet.greenlet(lambda: self._f(*args), parent=scheduler)
            g.sim_thread = SimThread(self, grid_point, point, scheduler)
            live.append(g)
        while live:                     # a round: every live thread runs to its next barrier
            for g in live:
                try:
                    g.switch()
                except Exception as e:
                    t = g.sim_thread
                    where = f"tid={list(t.threadIdx)} ctaid={list(t.blockIdx)}"
                    for other in live:  # the stock manager aborts the block's other threads
                        if other is not g and not other.dead:
                            other.throw(greenlet.GreenletExit)
                    raise type(e)(f"{where}: {e}" if str(e) else where).with_traceback(
                        e.__traceback__) from None
            live = [g for g in live if not g.dead]

    run._cudasim_blocks = "greenlets"
    api.threading = _Threading()
    sim.BlockManager.run = run
