"""numba's CUDA simulator with a blocking `syncthreads` (for cudasim_checks.py).

The simulator runs a thread block as one Python thread per CUDA thread; its block manager
(numba.cuda.simulator.kernel.BlockManager.run) finds out that every live thread has reached
`cuda.syncthreads()` by polling them in a loop that holds the GIL, so each barrier costs
switch intervals of busy polling: the fused error kernel (9 barriers a row) took 0.2-0.35 s
of CPU per launch on a 2-row matrix, most of the simulator run. Here the threads meet at a
condition variable instead: the last live thread to arrive (or to exit, as the stock manager
counts only live threads) releases the others, and the manager just joins them. Every thread
still runs the kernel's Python code, with the same barrier semantics, so the kernels' results
are what the stock simulator gives (cudasim_checks.py compares them bit for bit).

`install()` patches the simulator when its internals are the ones this was written for (numba
0.59-0.68: BlockManager with run and _block_dim, BlockThread with syncthreads) and returns
True, else leaves the stock simulator in place and returns False (slower, same checks).
"""

from __future__ import annotations

import threading


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


def install() -> bool:
    try:
        from numba.cuda.simulator import kernel as sim
    except ImportError:
        return False
    if not (hasattr(sim, "BlockManager") and hasattr(sim, "BlockThread")
            and hasattr(sim.BlockThread, "syncthreads") and hasattr(sim.BlockManager, "run")):
        return False
    if getattr(sim.BlockManager.run, "_blocking_barrier", False):
        return True

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
        import numpy as np
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

    run._blocking_barrier = True
    sim.BlockManager.run = run
    return True
