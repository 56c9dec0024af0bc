"""`--budget-of` an mlx-lm folder: its safetensors bytes (the sum of its .safetensors files'
sizes) as a file budget for the mlx target.

A plan's mlx-lm folder holds each tensor's bytes as the schemes count them (the sensitivity
table's bytes: an MLX scheme's codes, scales and biases; a tensor left float in its dtype) and
one safetensors header. :func:`header_bound` bounds that header from above without writing
it: every tensor's entries (``p.weight``, and ``p.scales``, ``p.biases`` / ``p.global_scale``
for a quantized one, at the longest of those names), each number written with as many digits
as the largest byte offset can have, the dtype at four characters, the metadata block, the
8-byte length and 7 bytes of padding. A plan solved within ``budget − header_bound`` bytes
of tensors therefore writes a folder no bigger than the budget (:func:`solve_folder`,
workbench.planning.budget.solve).
"""

from __future__ import annotations

from pathlib import Path

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP

#: the header's metadata block, at most (mlx writes {"format":"mlx"})
METADATA_BOUND = 256
#: quantized modules store the weight and up to this many arrays beside it
PARTS = 3


def folder_files(folder) -> list[Path]:
    """The .safetensors files of an mlx-lm folder (config.json with mlx's quantization)."""
    from workbench.formats.loaders.mlx_format import mlx_quantization
    p = Path(folder)
    if mlx_quantization(p) is None:
        raise WorkbenchError("--budget-of: a folder is an mlx-lm folder's budget, but its "
                             "config.json has no mlx \"quantization\" object", path=str(p))
    files = sorted(f for f in p.glob("*.safetensors") if f.is_file())
    if not files:
        raise WorkbenchError("--budget-of: an mlx-lm folder with no .safetensors files",
                             path=str(p))
    return files


def folder_bytes(folder) -> int:
    """The sum of the folder's .safetensors files' sizes (the folder opened by the mlx loader
    first: a damaged folder is refused, naming it)."""
    from workbench.planning.budget import _readable
    files = folder_files(folder)
    _readable(Path(folder), "an mlx-lm")
    return sum(f.stat().st_size for f in files)


def _quantized(scheme: str) -> bool:
    return scheme != KEEP and not scheme.startswith(("fp", "bf", "f16", "f32"))


def header_bound(model, plan, total: int) -> int:
    """An upper bound of the safetensors header (with its 8-byte length) of `plan`'s folder,
    whose data is at most `total` bytes."""
    digits = len(str(max(int(total), 1)))
    assignment = plan.resolve(model)
    n = METADATA_BOUND + 2 + 8 + 7
    for name, info in model.tensors.items():
        scheme = assignment.get(name, KEEP)
        entries = PARTS if _quantized(scheme) else 1
        ndim = max(info.ndim, 1)
        # "name":{"data_offsets":[D,D],"dtype":"XXXX","shape":[D,..]},
        one = (len(name) + 6 + 3 + len('{"data_offsets":[,],"dtype":"","shape":[]}') + 2 * digits
               + 4 + ndim * digits + (ndim - 1) + 1)
        n += entries * one
    return n


def solve_folder(model, table, budget, pins: dict, finish):
    """(Plan, Solution, cap) of an mlx-lm folder budget: tensors within the budget less the
    plan's header bound, tightened until the bound fits (workbench.planning.budget.solve)."""
    cap = int(budget.value)
    want = cap
    size = None
    for _ in range(6):
        plan, sol = table.solve(want, pins)
        plan = finish(plan)
        data = table.fixed_bytes + int(sol.cost)
        size = data + header_bound(model, plan, data)
        if size <= cap:
            return plan, sol, cap
        want -= size - cap
    raise WorkbenchError(f"no plan found whose mlx-lm folder fits {cap:,d} bytes (the last "
                         f"was at most {size:,d})", path=model.path)
