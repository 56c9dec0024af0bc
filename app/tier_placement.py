"""Where the tier board's cards are: which tier each weight matrix shows in and each tier's
running totals (:class:`TierPlacement`, updated per edit), and a column's list model
(:class:`TierListModel`: its cards, and the drag and drop of their names as MIME data). The
board's widgets are in :mod:`app.tier_board`."""

from __future__ import annotations

import json
from bisect import bisect_left

from PySide6.QtCore import QMimeData, QStringListModel, Qt

from .format import fmt_shape
from .tiers import on_board, tier_index

MIME = "application/x-quant-workbench-tensors"
NAME_ROLE = Qt.ItemDataRole.UserRole + 20


def members(doc, tier: int) -> list[str]:
    """The weight matrices shown in tier `tier` (in catalog order), worked out over the whole
    model (the board itself keeps them per edit: :class:`TierPlacement`)."""
    if doc.model is None:
        return []
    return [n for n, info in doc.model.tensors.items()
            if on_board(info) and tier_index(doc.tiers, doc.scheme_of(n), info) == tier]


class TierPlacement:
    """Which tier each weight matrix shows in, and each tier's totals (tensors, parameters,
    bytes, schemes), kept up to date per edit: an edit moves only the cards of the tensors it
    changed, and the column headers read running sums (issue 23: a 100,000-tensor catalog).

    Per tier: its members in catalog order (`names`, with their catalog positions in `keys`
    for a binary search); per tensor: (tier, scheme, bytes) as last placed."""

    #: more cards than this moving at once: the columns are reset instead of row by row
    BULK = 256

    def __init__(self, doc):
        self.doc = doc
        self.models: list = []        # TierListModel per tier (set by the board)
        self.rebuild(reset=False)

    def _tier(self, scheme: str, info) -> int:
        key = scheme if scheme != "keep" else ("keep", info.bits_per_weight)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = tier_index(self.doc.tiers, scheme, info)
        return t

    def rebuild(self, reset: bool = True) -> None:
        """Every tensor placed anew (a new model or a new tier setup)."""
        doc = self.doc
        n = len(doc.tiers)
        self._memo: dict = {}
        self.names: list[list[str]] = [[] for _ in range(n)]
        self.keys: list[list[int]] = [[] for _ in range(n)]
        self.params = [0] * n
        self.bytes = [0] * n
        self.schemes: list[dict[str, int]] = [{} for _ in range(n)]
        self.placed: dict[str, tuple] = {}
        if doc.model is not None:
            names, keys, params, sizes, schemes = (self.names, self.keys, self.params,
                                                   self.bytes, self.schemes)
            floats: dict[str, bool] = {}     # dtype -> is float (on_board, per dtype)
            for k, (name, info) in enumerate(doc.model.tensors.items()):
                f = floats.get(info.dtype)
                if f is None:
                    f = floats[info.dtype] = info.is_float
                if not f or len(info.shape) < 2:
                    continue
                s = doc.scheme_of(name)
                t = self._tier(s, info)
                b = doc.bytes_of(name)
                names[t].append(name)
                keys[t].append(k)
                params[t] += info.numel
                sizes[t] += b
                schemes[t][s] = schemes[t].get(s, 0) + 1
                self.placed[name] = (t, s, b)
        if reset:
            for m in self.models:
                m.reset()

    def row_of(self, tier: int, name: str) -> int | None:
        k = self.doc._pos.get(name)
        keys = self.keys[tier]
        i = bisect_left(keys, k) if k is not None else len(keys)
        return i if i < len(keys) and keys[i] == k else None

    def update(self, names) -> set[int]:
        """Place `names` again (their scheme, result or size changed); the cards that change
        tier move, the others are repainted. Returns the tiers whose header changed."""
        doc = self.doc
        if doc.model is None:
            return set()
        tensors = doc.model.tensors
        moves, touched = [], {}
        for name in names:
            was = self.placed.get(name)
            if was is None:
                continue      # not a card (a vector, an integer tensor) or not this model
            info = tensors[name]
            s = doc.scheme_of(name)
            t = self._tier(s, info)
            b = doc.bytes_of(name)
            if (t, s, b) == was:
                touched.setdefault(t, []).append(name)     # its SQNR may have arrived
                continue
            ot, os_, ob = was
            self.params[ot] -= info.numel
            self.bytes[ot] -= ob
            left = self.schemes[ot][os_] - 1
            if left:
                self.schemes[ot][os_] = left
            else:
                del self.schemes[ot][os_]
            self.params[t] += info.numel
            self.bytes[t] += b
            self.schemes[t][s] = self.schemes[t].get(s, 0) + 1
            self.placed[name] = (t, s, b)
            if t != ot:
                moves.append((name, ot, t))
            touched.setdefault(t, []).append(name)
        changed = set(touched)
        if moves:
            changed |= {ot for _n, ot, _t in moves}
            if len(moves) > self.BULK:
                for name, ot, t in moves:
                    self._take(ot, name)
                    self._put(t, name)
                for t in {x for _n, a, b in moves for x in (a, b)}:
                    self.models[t].reset()
            else:
                for name, ot, t in moves:
                    self.models[ot].take_row(self._take(ot, name))
                    self.models[t].put_row(self._put(t, name), name)
        for t, group in touched.items():
            self.models[t]._changed(group)
        return changed

    def _take(self, tier: int, name: str) -> int:
        r = self.row_of(tier, name)
        del self.names[tier][r]
        del self.keys[tier][r]
        return r

    def _put(self, tier: int, name: str) -> int:
        k = self.doc._pos[name]
        r = bisect_left(self.keys[tier], k)
        self.names[tier].insert(r, name)
        self.keys[tier].insert(r, k)
        return r


class TierListModel(QStringListModel):
    """One tier's cards: the names of the board's :class:`TierPlacement` for this tier, held
    in Qt's own string list so that laying out a column of 100,000 cards never calls back into
    Python per row (a Python rowCount was asked twice per card); the cards' other roles,
    drag and drop are Python."""

    def __init__(self, doc, tier: int, on_drop, placement: TierPlacement, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.tier = tier
        self.on_drop = on_drop
        self.placement = placement
        self.reset()

    @property
    def names(self) -> list[str]:
        return self.placement.names[self.tier]

    def detach(self) -> None:
        """Stop following the document (the column is being replaced)."""

    def reset(self) -> None:
        names = self.placement.names
        self.setStringList(names[self.tier] if self.tier < len(names) else [])

    def take_row(self, row: int) -> None:
        self.removeRows(row, 1)

    def put_row(self, row: int, name: str) -> None:
        self.insertRows(row, 1)
        self.setData(self.index(row), name, Qt.ItemDataRole.DisplayRole)

    def rebuild(self) -> None:
        self.reset()

    def _changed(self, names) -> None:
        # one dataChanged over the changed rows' span (the column's header is refreshed once
        # per signal by the board: per row, an edit of many tensors refreshed it once per card)
        rows = [r for r in (self.placement.row_of(self.tier, n) for n in names) if r is not None]
        if rows:
            self.dataChanged.emit(self.index(min(rows)), self.index(max(rows)))

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        name = super().data(index, Qt.ItemDataRole.DisplayRole)    # Qt's list: the rows shown
        if role == NAME_ROLE:
            return name
        if role == Qt.ItemDataRole.DisplayRole or role == Qt.ItemDataRole.EditRole:
            return name
        if role == Qt.ItemDataRole.ToolTipRole:
            info = self.doc.model.info(name)
            return f"{name}\n{fmt_shape(info.shape)} · {self.doc.scheme_of(name)}"
        return None

    def flags(self, index):
        if not index.isValid():
            return Qt.ItemFlag.ItemIsDropEnabled
        return (Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
                | Qt.ItemFlag.ItemIsDragEnabled)

    def supportedDropActions(self):
        return Qt.DropAction.MoveAction | Qt.DropAction.CopyAction

    def supportedDragActions(self):
        return Qt.DropAction.MoveAction

    def mimeTypes(self):
        return [MIME]

    def mimeData(self, indexes):
        names = []
        for i in indexes:
            n = self.names[i.row()]
            if n not in names:
                names.append(n)
        md = QMimeData()
        md.setData(MIME, json.dumps(names).encode("utf-8"))
        md.setText("\n".join(names))
        return md

    def canDropMimeData(self, data, action, row, column, parent) -> bool:
        return data.hasFormat(MIME)

    def dropMimeData(self, data, action, row, column, parent) -> bool:
        if not data.hasFormat(MIME):
            return False
        try:
            names = json.loads(bytes(data.data(MIME)).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return False
        placed = self.placement.placed
        names = [n for n in names if isinstance(n, str)
                 and (placed.get(n) or (None,))[0] != self.tier]
        if names:
            self.on_drop(names, self.tier)
        return False  # the move is done by the command; nothing for the source view to remove
