"""GPTQ (Frantar et al. 2022): quantize columns in order, each column's rounding error
compensated on the columns not yet quantized through the inverse Hessian of the layer
output error.

    H = 2 X Xᵀ / N                    (LayerStats.H, in x in)
    dead columns (H_jj = 0): H_jj = 1, W[:, j] = 0
    H += 0.01 · mean(diag H) · I      (dampening, `damp`)
    U = upper Cholesky factor of H⁻¹  (H⁻¹ = Uᵀ U)
    for each column i (blocks of 128 columns, updates to later blocks applied lazily):
        q = Q(w_i);  err = (w_i − q) / U_ii;  W[:, i:] −= err · U[i, i:]

Computed in float64 (torch). How Q is defined per scheme family:

* integer schemes: each group's scale (and zero point) is chosen from the group's *current*
  (already updated) weights when the first column of the group is reached — the group
  boundaries of the stored format, in natural order; per-channel / per-tensor: from the
  whole matrix at the start. Then every column is rounded on its own with those qparams.
  Symmetric schemes choose the group scale amax/d, d = P, P + 1/4, ..., P + 3 (the scheme's
  own divisors P ... P + 1 and clipping ones), by the diag(H)-weighted squared error of the
  group, sum_j H_jj (w_j − Q(w_j))², instead of the plain one (intq.weighted_sym_scale;
  MiniLM int4-g128 in compressed-tensors: cosine_mean 0.99190; 0.99064 over P ... P + 1 only,
  0.99109 over P ... P + 3 by the plain error; docs/methods.md); per-tensor scales and -asym
  keep the scheme's own qparams.
  ``act_order=True`` processes columns by decreasing diag(H) ("static groups": all groups'
  qparams are chosen from W before any update, so the stored fixed groups stay consistent).
* GGML block formats: when a block's first column
  is reached, the block (its current weights, every row) is encoded with the format's own
  quantizer; its decoded values are the q of its columns, and the sequential error updates
  carry the block's rounding error to the later blocks (the block-wise OBS update). Activation
  order is not available here (the blocks are fixed runs of columns).
* MLX schemes: the same block-wise form over MLX's groups, each group's scale and bias (or
  scale byte) from the importance-weighted search weighted by diag(H) (methods/mlx_gptq.py);
  the stored arrays are the groups' own, so the result is in MLX's layout.

Rows are independent given H, so the result of a row subset equals those rows of the result.
"""

from __future__ import annotations

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.schemes.base import QuantizedTensor
from workbench.schemes.ggml.common import GGMLScheme
from workbench.quant.methods import intq
from workbench.quant.methods.base import Method

BLOCK = 128


def prepare_hessian(H: np.ndarray, w: np.ndarray, damp: float = 0.01):
    """(H damped float64, W float64 with dead columns zeroed, dead mask). `H` may be a
    memory-mapped array (`LayerStats.spilled`): its pages are let go once copied."""
    from workbench.core.pages import release
    src = H
    H = np.array(H, dtype=np.float64, copy=True)
    release(src)
    W = np.array(w, dtype=np.float64, copy=True)
    diag = np.diag(H).copy()
    dead = ~(diag > 0)
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H[np.diag_indices_from(H)] += damp * float(np.mean(np.diag(H)))
    return H, W, dead


def _invert_upper_in_place(R, base: int = 256) -> None:
    """R ← R⁻¹ for an upper-triangular torch matrix R, by halves: [[A, B], [0, C]]⁻¹ =
    [[A⁻¹, −A⁻¹ B C⁻¹], [0, C⁻¹]], the corner from two triangular solves (temporaries a
    quarter of R each). About n³/3 flops, like LAPACK's trtri, in BLAS-3 calls."""
    import torch
    n = R.shape[0]
    if n <= base:
        R.copy_(torch.linalg.solve_triangular(R, torch.eye(n, dtype=R.dtype), upper=True))
        return
    h = n // 2
    A, B, C = R[:h, :h], R[:h, h:], R[h:, h:]
    X = torch.linalg.solve_triangular(A, B, upper=True)
    B.copy_(torch.linalg.solve_triangular(C, X, upper=True, left=False).neg_())
    del X
    _invert_upper_in_place(A, base)
    _invert_upper_in_place(C, base)


def inverse_cholesky_upper(H) -> np.ndarray:
    """U upper triangular with H⁻¹ = Uᵀ U. `H`: the matrix, or a one-element list holding it
    that this reverses in place and lets go of, so about 1.5 in x in matrices are alive at
    once (an 8 B model's down projection: 1.6 GB each).

    With J the order reversal, the lower Cholesky factor of J H J gives H = R Rᵀ with
    R = J L J upper triangular, so H⁻¹ = R⁻ᵀ R⁻¹ and U = R⁻¹: one Cholesky and one
    triangular inverse (2n³/3 flops) instead of Cholesky, cholesky_inverse and a second
    Cholesky (4n³/3; torch's cholesky_inverse was also the slowest of the three: 4096²
    took 8.2-16.5 s, this 1.8-2.6 s, alternately in one script on 2 cores). Equal to the old chain to ~1e-15 relative."""
    import torch
    if isinstance(H, list):                 # ours to change: reversed in place
        M = H.pop()
        _reverse_in_place(M)
    else:
        M = np.asarray(H, dtype=np.float64)[::-1, ::-1].copy()
    L = torch.linalg.cholesky(torch.from_numpy(M))
    del M
    _reverse_in_place(L.numpy())            # R = J L J, in L's memory
    _invert_upper_in_place(L)               # U = R⁻¹, in the same memory
    return L.numpy()


def _reverse_in_place(M: np.ndarray, chunk: int = 1 << 20) -> None:
    """M[::-1, ::-1] written into a square M stored contiguously in either order (its flat
    order reversed), through chunk-sized temporaries rather than a second matrix."""
    flat = M.reshape(-1, order="F" if not M.flags.c_contiguous else "C")
    if not np.shares_memory(flat, M):
        raise ValueError("a contiguous matrix is needed")
    n = flat.size
    for a in range(0, n // 2, chunk):
        b = min(a + chunk, n // 2)
        tmp = flat[a:b].copy()
        flat[a:b] = flat[n - b:n - a][::-1]
        flat[n - b:n - a] = tmp[::-1]


def hessian_factor(H, w, damp: float = 0.01, tensor=None):
    """(W float64 with dead columns zeroed, U, dead mask, diag of the damped H): what GPTQ
    computes once per weight and Hessian, whatever the scheme. Pass it as ``factor=`` to
    `GPTQ.quantize` to quantize one weight under several schemes (the allocator's (scheme,
    method) pairs: workbench.planning.allocate_methods); W is not modified. The factor of the last
    Hessian is kept (`GPTQ._factor`), so row chunks of one tensor factor it once."""
    U, dead, hdiag = GPTQ._factor(H, damp, tensor)
    W = np.array(w, dtype=np.float64, copy=True)
    W[:, dead] = 0.0
    return W, U, dead, hdiag


class _IntColumns:
    """Column rounding for an integer scheme with qparams at group starts."""

    def __init__(self, scheme, rows, cols, static_from=None, hdiag=None):
        self.s = scheme
        self.hdiag = hdiag
        self.G = intq.group_len(scheme, cols)
        self.rows, self.cols = rows, cols
        self.per_tensor = not (scheme.block_size or getattr(scheme.gran, "label", "") == "channel")
        ng = cols // self.G
        self.scale = np.zeros((rows, ng), scheme.scale_dtype)
        self.zero = np.zeros((rows, ng), np.uint8) if scheme.asym else None
        self.static = static_from is not None
        if self.static:
            for g in range(ng):
                self._set(g, static_from[:, g * self.G:(g + 1) * self.G])

    def _set(self, g, cur):
        cur = np.asarray(cur, np.float32)
        blocks = cur.reshape(1, -1) if self.per_tensor else cur
        if self.hdiag is not None and not self.s.asym and not self.per_tensor:
            sc, z = intq.weighted_sym_scale(
                self.s, blocks, self.hdiag[g * self.G:(g + 1) * self.G]), None
        else:
            sc, z = self.s.choose_qparams(blocks)
        self.scale[:, g] = np.broadcast_to(sc, (self.rows,))
        if self.zero is not None:
            self.zero[:, g] = np.broadcast_to(z, (self.rows,))

    def start(self, j, current):
        if not self.static:
            self._set(j // self.G, current(j, self.G))

    def round(self, w, j):
        g = j // self.G
        z = None if self.zero is None else self.zero[:, g]
        return intq.codes_for(self.s, w.astype(np.float32)[:, None], self.scale[:, g], z)[:, 0]

    def value(self, code, j):
        g = j // self.G
        q = code.astype(np.float64)
        if self.zero is not None:
            q = q - self.zero[:, g]
        return q * self.scale[:, g].astype(np.float32).astype(np.float64)

    def result(self, codes, shape, meta):
        rows, cols = shape
        if self.per_tensor:
            return intq.build(self.s, shape, codes.reshape(1, -1), self.scale[:1, 0],
                              None if self.zero is None else self.zero[:1, 0], meta)
        return intq.build(self.s, shape, codes.reshape(-1, self.G), self.scale.reshape(-1),
                          None if self.zero is None else self.zero.reshape(-1), meta)


class _BlockColumns:
    """Column values for a block format: each block encoded from its current weights."""

    def __init__(self, scheme, rows, cols):
        self.s = scheme
        self.G = scheme.block_size
        self.deq = np.zeros((rows, cols), np.float64)
        self.parts = []

    def start(self, j, current):
        from workbench.quant.accel import dequantize, quantize     # the kernels: the reference's bytes
        cur = np.ascontiguousarray(current(j, self.G), np.float32)
        qt = quantize(self.s, cur)
        self.parts.append(qt)
        self.deq[:, j:j + self.G] = dequantize(qt).reshape(cur.shape)

    def round(self, w, j):
        return self.deq[:, j]

    def value(self, code, j):
        return code

    def result(self, codes, shape, meta):
        # every part holds the blocks of its columns for every row: interleave them per row
        keys = self.parts[0].arrays.keys()
        arrays = {}
        for k in keys:
            pieces = [p.arrays[k].reshape(shape[0], -1) for p in self.parts]
            arrays[k] = np.ascontiguousarray(np.concatenate(pieces, axis=1))
        if set(keys) != {"blocks"}:
            return None
        return QuantizedTensor(self.s.name, shape, arrays, meta)


def gptq_columns(W, U, cols_q, order, block=BLOCK):
    """The GPTQ loop over columns (`order`: a permutation, or None for natural order) with
    lazy block updates. W float64 is updated in place; returns the codes (what
    cols_q.round returned per column)."""
    rows, cols = W.shape
    codes = np.zeros((rows, cols), np.float64)
    G = cols_q.G
    # a group's first column is either a block start (every earlier update applied) or lies
    # inside the block with the whole group (G divides the block)
    blk = block if (G >= block and G % block == 0) or block % G == 0 or G == cols else G
    perm = np.arange(cols) if order is None else order
    Wp = np.ascontiguousarray(W[:, perm])
    Up = U[np.ix_(perm, perm)] if order is not None else U

    def current(jp_start, n):
        # the current weights of natural-order columns j..j+n (natural order only)
        return Wp[:, jp_start:jp_start + n]

    for i1 in range(0, cols, blk):
        i2 = min(i1 + blk, cols)
        W1 = Wp[:, i1:i2]          # a view: updates land in Wp
        U1 = Up[i1:i2, i1:i2]
        Err = np.zeros((rows, i2 - i1))
        for i in range(i2 - i1):
            jp = i1 + i
            j = perm[jp]
            if order is None and j % G == 0:
                cols_q.start(j, current)
            w = W1[:, i]
            c = cols_q.round(w, j)
            codes[:, j] = c
            q = cols_q.value(c, j)
            err = (w - q) / U1[i, i]
            W1[:, i:] -= np.outer(err, U1[i, i:])
            Err[:, i] = err
        if i2 < cols:
            Wp[:, i2:] -= Err @ Up[i1:i2, i2:]
    W[:, perm] = Wp
    return codes


class GPTQ(Method):
    name = "gptq"
    row_local = True
    needs = ("H",)
    description = "GPTQ: column-wise rounding with inverse-Hessian error compensation"

    def supports(self, scheme):
        from workbench.schemes.mlx import MLXScheme
        if intq.is_int(scheme) or isinstance(scheme, (GGMLScheme, MLXScheme)):
            return None
        return f"method gptq supports the integer, GGML and MLX schemes, not {scheme.name}"

    _factor_cache: tuple | None = None     # ((id of H, damp), weakref to H, (U, dead, hdiag))

    @staticmethod
    def _factor(Hsrc, damp: float, tensor=None):
        """(U, dead-column mask, diag of the damped H) for Hessian `Hsrc`. The last one is kept:
        the row chunks of a big tensor (workbench.quant.streaming) and the projections that share
        an input (q/k/v, gate/up) reuse it instead of factoring an in x in matrix again (an
        8 B model's down projection: 14336², a minute of float64 Cholesky per row chunk)."""
        import weakref
        key = (id(Hsrc), float(damp))
        hit = GPTQ._factor_cache
        if hit is not None and hit[0] == key and hit[1]() is Hsrc:
            return hit[2]
        GPTQ._factor_cache = None           # the old factor goes before the new one is built
        H, _, dead = prepare_hessian(Hsrc, np.zeros((0, np.shape(Hsrc)[0])), damp)
        hdiag = np.diag(H).copy()
        try:
            box = [H]
            del H
            U = inverse_cholesky_upper(box)
        except Exception:  # noqa: BLE001  (not positive definite even after dampening)
            H2, _, dead = prepare_hessian(Hsrc, np.zeros((0, np.shape(Hsrc)[0])), damp * 10)
            try:
                U = inverse_cholesky_upper(H2)
            except Exception:  # noqa: BLE001
                raise WorkbenchError("GPTQ: the calibration Hessian is not positive definite",
                                     tensor=tensor) from None
        out = (U, dead, hdiag)
        try:
            ref = weakref.ref(Hsrc)
        except TypeError:                   # not weak-referenceable: nothing kept
            return out
        GPTQ._factor_cache = (key, ref, out)
        # kept no longer than the Hessian it came from (the statistics of a job)
        weakref.finalize(Hsrc, GPTQ._drop, key)
        return out

    @staticmethod
    def _drop(key) -> None:
        hit = GPTQ._factor_cache
        if hit is not None and hit[0] == key:
            GPTQ._factor_cache = None

    @staticmethod
    def forget() -> None:
        """Drop the kept factor (its memory: in x in float64)."""
        GPTQ._factor_cache = None

    def _quantize(self, w, scheme, stats, *, tensor=None, damp: float = 0.01,
                  act_order: bool = False, block: int = BLOCK, factor=None, **opts):
        rows, cols = w.shape
        if factor is None:
            factor = hessian_factor(stats.H, w, damp, tensor)
        W, U, dead, hdiag = factor
        W = W.copy()
        meta = {"method": self.name}
        if intq.is_int(scheme):
            order = None
            static = None
            if act_order:
                order = np.argsort(-hdiag, kind="stable")
                static = W.astype(np.float32)
                meta["act_order"] = True
            cq = _IntColumns(scheme, rows, cols, static, hdiag)
            codes = gptq_columns(W, U, cq, order, block)
            return cq.result(codes, (rows, cols), meta)
        if act_order:
            raise WorkbenchError(f"GPTQ act-order is not available for {scheme.name} (its "
                                 "blocks are fixed runs of columns)", tensor=tensor)
        from workbench.schemes.mlx import MLXScheme
        if isinstance(scheme, MLXScheme):      # groups by the weighted search (mlx_gptq)
            from workbench.quant.methods.mlx_gptq import MlxColumns
            cq = MlxColumns(scheme, rows, cols, hdiag)
            gptq_columns(W, U, cq, None, block)
            return cq.result(None, (rows, cols), meta)
        cq = _BlockColumns(scheme, rows, cols)
        gptq_columns(W, U, cq, None, block)
        qt = cq.result(None, (rows, cols), meta)
        if qt is None:  # a scheme whose arrays are not per-row blocks: re-encode the result
            raise WorkbenchError(f"GPTQ cannot assemble {scheme.name} tensors", tensor=tensor)
        return qt
