"""The layer browser's tree model (:mod:`app.layer_browser` is the panel that shows it):
tensors grouped by block, a block's mixture-of-experts tensors in one "experts" row (a row per
projection holding its per-expert tensors, or the merged 3-D tensor), its item roles and
columns, and its filter (a substring or an RE2 `re:` pattern, one scan over all names)."""

from __future__ import annotations

import re

from workbench.core.errors import WorkbenchError
from workbench.core.patterns import compile_pattern

import numpy as np
from PySide6.QtCore import QAbstractItemModel, QModelIndex, Qt

from .format import fmt_count, fmt_shape, plural
from .theme import mono_font

NAME_ROLE = Qt.ItemDataRole.UserRole + 1
SORT_ROLE = Qt.ItemDataRole.UserRole + 2
GROUP_ROLE = Qt.ItemDataRole.UserRole + 3   # an expert group key ('layer 5 experts down')
_PROJ_ORDER = {"gate": 0, "up": 1, "gate_up": 2, "down": 3}
COLUMNS = ("Tensor", "Shape", "Params", "DType", "Role")


def _group_key(group: str) -> tuple:
    if group == "embeddings":
        return (0, 0)
    if group.startswith("layer "):
        return (1, int(group.split()[1]))
    return (2, 0) if group == "head" else (3, 0)


def _expert_label(name: str) -> str:
    """'mlp.experts.3.down_proj.weight' -> 'expert 3 · down_proj'."""
    from workbench.api.models import expert_index
    e = expert_index(name)
    tail = name[:-7] if name.endswith(".weight") else name
    return f"expert {e} · {tail.rsplit('.', 1)[-1]}" if e is not None else tail


def _short(name: str, group: str) -> str:
    """The name inside its group: 'model.layers.3.mlp.up_proj.weight' -> 'mlp.up_proj.weight'."""
    short = name[:-7] if name.endswith(".weight") else name
    if group.startswith("layer "):
        m = re.search(r"(?:^|\.)(?:layers|layer|h|blk|blocks|block)\.\d+\.(.*)$", short)
        if m:
            return m.group(1)
    return short


_GROUP, _EXPERTS, _PROJ, _TENSOR = range(4)
# the view asks every painted cell for seven roles; these four the tree never answers
_UNANSWERED = frozenset(r.value for r in (Qt.ItemDataRole.DecorationRole,
                                          Qt.ItemDataRole.BackgroundRole,
                                          Qt.ItemDataRole.ForegroundRole,
                                          Qt.ItemDataRole.CheckStateRole))
_ROW_FLAGS = Qt.ItemFlag.ItemIsEnabled      # a group or experts row (not selectable)
_TENSOR_FLAGS = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable


def _find_all(text: str, needle: str):
    """The start of every occurrence of `needle` in `text` (overlapping ones too)."""
    i = text.find(needle)
    while i >= 0:
        yield i
        i = text.find(needle, i + 1)


class _Node:
    __slots__ = ("kind", "parent", "children", "row", "text", "name", "key", "members")

    def __init__(self, kind, parent, text=None, name=None, key=None):
        self.kind, self.parent, self.text, self.name, self.key = kind, parent, text, name, key
        self.children: list[int] | None = []
        self.row = 0
        self.members = None     # an experts row: its tensors, until its rows are made


class TreeModel(QAbstractItemModel):
    """The browser's tree: groups → tensors, a block's routed experts in one "experts" row →
    a row per projection → the per-expert tensors. Made for 100,000-tensor catalogs (issue 23):
    nodes are small records, a cell's text is made when the view asks for it, an experts row's
    rows are made the first time they are needed (expanded, found, filtered), and the filter is
    one scan of all names (a substring: one case-insensitive search over the names joined by
    newlines; `re:` patterns: RE2 per name) — the same matches as a per-row proxy filter, with a
    group shown when any tensor under it matches."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._mono = mono_font()
        self.clear()

    def clear(self) -> None:
        self.nodes: list[_Node] = [_Node(_GROUP, -1)]      # 0: the invisible root
        self.where: dict[str, int] = {}     # tensor name -> its node, or its experts row's
        self.group_nodes: dict[str, int] = {}   # expert group key -> projection / merged node
        self.infos: dict = {}
        self._cells: dict = {}      # (tensor node, column) -> its text
        self.names: list[str] = []
        self._blob = None
        self.visible: dict[int, list[int]] | None = None   # None: no filter
        self.vrow: dict[int, int] = {}
        self._pattern = None
        self.error = ""

    # ---- building ---------------------------------------------------------------------------
    def build(self, model) -> None:
        self.beginResetModel()
        self.clear()
        if model is not None:
            self._build(model)
        self.endResetModel()

    def _add(self, kind, parent: int, **kw) -> int:
        node = _Node(kind, parent, **kw)
        siblings = self.nodes[parent].children
        node.row = len(siblings)
        siblings.append(len(self.nodes))
        self.nodes.append(node)
        return len(self.nodes) - 1

    def _build(self, model) -> None:
        from workbench.api.models import grouping
        self.infos = infos = model.tensors
        self.names = list(infos)
        groups: dict[str, list] = {}
        egroup: dict[str, str | None] = {}
        for name, info in infos.items():
            role, group, eg = grouping(name, len(info.shape))
            groups.setdefault(group, []).append(name)
            if eg is not None and role == "expert":
                egroup[name] = eg
        self._egroup = egroup
        for g in sorted(groups, key=_group_key):
            names = groups[g]
            gi = self._add(_GROUP, 0, text=(g, plural(len(names), "tensor"),
                                            fmt_count(sum(infos[n].numel for n in names)),
                                            "", ""), key=g)
            experts = [n for n in names if n in egroup]
            ei = None
            for name in names:
                if name in egroup:
                    if ei is None:
                        ei = self._experts_row(gi, experts)
                    self.where[name] = ei
                    continue
                self.where[name] = self._add(_TENSOR, gi, name=name, key=g)

    def _experts_row(self, gi: int, experts: list[str]) -> int:
        infos, egroup = self.infos, self._egroup
        per: dict[str, list[str]] = {}
        for n in experts:
            per.setdefault(egroup[n], []).append(n)
        def held(n):     # experts a tensor holds (TensorInfo.n_experts; these are experts)
            shape = infos[n].shape
            return shape[0] if len(shape) == 3 and infos[n].merged_experts else 1
        n_exp = max(sum(held(n) for n in members) for members in per.values())
        ei = self._add(_EXPERTS, gi, text=(f"experts ×{n_exp}", plural(len(experts), "tensor"),
                                           fmt_count(sum(infos[n].numel for n in experts)),
                                           "", "expert"))
        self.nodes[ei].members = per
        self.nodes[ei].children = None        # made when first needed
        for key in per:
            self.group_nodes[key] = ei        # (until the rows are made)
        return ei

    def _children(self, i: int) -> list[int]:
        node = self.nodes[i]
        if node.children is None:
            self._make_experts(i)
        return node.children

    def _make_experts(self, ei: int) -> None:
        """The rows of an experts row: one per projection (its experts under it), or a merged
        3-D tensor's own row."""
        node = self.nodes[ei]
        node.children = []
        group = self.nodes[node.parent].key
        infos = self.infos

        def order(key):
            return _PROJ_ORDER.get(key.rsplit(" ", 1)[-1], 9)
        for key in sorted(node.members, key=order):
            members = node.members[key]
            if len(members) == 1 and infos[members[0]].merged_experts:
                t = self._add(_TENSOR, ei, name=members[0], key=group)
                self.where[members[0]] = t
                self.group_nodes[key] = t
                continue
            members.sort(key=lambda n: (-1 if infos[n].expert is None else infos[n].expert))
            first = infos[members[0]]
            proj = key.rsplit(" ", 1)[-1]
            pi = self._add(_PROJ, ei, key=key, text=(
                f"{proj} · {len(members)} experts", fmt_shape(first.shape),
                fmt_count(sum(infos[n].numel for n in members)), first.display_dtype, "expert"))
            self.group_nodes[key] = pi
            for n in members:
                self.where[n] = self._add(_TENSOR, pi, name=n, key=None)

    def node_of(self, name: str) -> int | None:
        """The tensor's node (its experts row's rows made if need be)."""
        i = self.where.get(name)
        if i is None:
            return None
        if self.nodes[i].kind == _EXPERTS:
            self._children(i)
            i = self.where.get(name)
        return i

    def group_members(self, key: str) -> list[str]:
        i = self.group_nodes.get(key)
        if i is None:
            return []
        if self.nodes[i].kind == _EXPERTS:
            return list(self.nodes[i].members.get(key, []))
        node = self.nodes[i]
        if node.kind == _TENSOR:
            return [node.name]
        return [self.nodes[c].name for c in node.children]

    # ---- filtering --------------------------------------------------------------------------
    def set_filter(self, text: str) -> None:
        text = text.strip()
        self.error = ""
        pattern = None
        if text.startswith("re:"):
            try:  # RE2: a pattern cannot make the GUI thread backtrack for minutes
                pattern = compile_pattern(text[3:], ignore_case=True)
            except WorkbenchError as exc:
                self.error = str(exc)
        elif text:
            pattern = text
        self.beginResetModel()
        self._pattern = pattern
        if pattern is None:
            self.visible = None
        else:
            self._show(self.matches(pattern))
        self.endResetModel()

    def matches(self, pattern) -> list[str]:
        """The names a filter keeps, in catalog order: a substring (case-insensitive, as
        re.IGNORECASE) found by one search over all the names, or an RE2 pattern per name."""
        names = self.names
        if not isinstance(pattern, str):
            return [n for n in names if pattern.search(n)]
        if self._blob is None:
            self._blob = "\n".join(names)
            # ASCII names: case-insensitive is lower-case equality, and str.find scans the
            # lower-cased names at memchr speed (re.IGNORECASE: ~30 ms per keystroke)
            self._lower = self._blob.lower() if self._blob.isascii() else None
            lens = np.fromiter(map(len, names), np.int64, len(names)) + 1
            self._starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        if "\n" in pattern:
            return []
        if self._lower is not None and pattern.isascii():
            pos = np.fromiter(_find_all(self._lower, pattern.lower()), np.int64)
        else:
            pos = np.fromiter((m.start() for m in re.finditer(re.escape(pattern), self._blob,
                                                               re.IGNORECASE)), np.int64)
        if not pos.size:
            return []
        rows = np.unique(np.searchsorted(self._starts, pos, side="right") - 1)
        return [names[r] for r in rows.tolist()]

    def _show(self, names) -> None:
        """Keep the matched tensors and every row above them."""
        nodes = self.nodes
        keep: dict[int, None] = {}
        for n in names:
            i = self.node_of(n)
            while i is not None and i > 0 and i not in keep:
                keep[i] = None
                i = nodes[i].parent
        visible: dict[int, list[int]] = {0: []}
        for i in sorted(keep):        # a parent is made before its children: ids ascend
            p = nodes[i].parent
            visible.setdefault(p, [])
            visible[i] = []
        for p, kids in visible.items():
            if nodes[p].children:
                kids.extend(c for c in nodes[p].children if c in keep)
        self.vrow = {c: r for kids in visible.values() for r, c in enumerate(kids)}
        self.visible = visible

    def kids(self, i: int) -> list[int]:
        if self.visible is None:
            return self._children(i) if self.nodes[i].kind != _TENSOR else []
        return self.visible.get(i, [])

    def row_of_node(self, i: int) -> int:
        return self.nodes[i].row if self.visible is None else self.vrow.get(i, -1)

    def index_of(self, i: int, column: int = 0) -> QModelIndex:
        if i <= 0:
            return QModelIndex()
        r = self.row_of_node(i)
        return self.createIndex(r, column, i) if r >= 0 else QModelIndex()

    # ---- the model interface ----------------------------------------------------------------
    def index(self, row, column, parent=QModelIndex()):
        p = parent.internalId() if parent.isValid() else 0
        kids = self.kids(p)
        if 0 <= row < len(kids) and 0 <= column < len(COLUMNS):
            return self.createIndex(row, column, kids[row])
        return QModelIndex()

    def parent(self, index=QModelIndex()):
        # asked several times per painted row (branches, selection): index_of inlined
        if not index.isValid():
            return QModelIndex()
        p = self.nodes[index.internalId()].parent
        if p <= 0:
            return QModelIndex()
        r = self.nodes[p].row if self.visible is None else self.vrow.get(p, -1)
        return self.createIndex(r, 0, p) if r >= 0 else QModelIndex()

    def rowCount(self, parent=QModelIndex()) -> int:
        if parent.isValid():
            if parent.column() != 0:
                return 0
            i = parent.internalId()
            node = self.nodes[i]
            if node.kind == _TENSOR:
                return 0
            if self.visible is None and node.children is None:
                return len(node.members)    # a row per projection, made when asked for
            return len(self.kids(i))
        return len(self.kids(0))

    def hasChildren(self, parent=QModelIndex()) -> bool:
        if not parent.isValid():
            return bool(self.kids(0))
        if parent.column() != 0:
            return False
        node = self.nodes[parent.internalId()]
        if node.kind == _TENSOR:
            return False
        if self.visible is None and node.children is None:
            return bool(node.members)      # without making the rows
        return bool(self.kids(parent.internalId()))

    def columnCount(self, parent=QModelIndex()) -> int:
        return len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def flags(self, index):
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        if self.nodes[index.internalId()].kind in (_GROUP, _EXPERTS):
            return _ROW_FLAGS
        return _TENSOR_FLAGS

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if role in _UNANSWERED or not index.isValid():
            return None
        node = self.nodes[index.internalId()]
        col = index.column()
        kind = node.kind
        if role == Qt.ItemDataRole.DisplayRole:
            if kind == _TENSOR:
                key = (index.internalId(), col)
                text = self._cells.get(key)
                if text is None:     # made once per cell: a repaint asks again
                    text = self._cells[key] = self._tensor_text(node, col)
                return text
            return node.text[col]
        if kind == _TENSOR:
            if role == NAME_ROLE or role == Qt.ItemDataRole.ToolTipRole:
                return node.name
            if role == GROUP_ROLE:
                info = self.infos[node.name]
                return info.expert_group if info.merged_experts else None
            if role == Qt.ItemDataRole.FontRole and col in (1, 2):
                return self._mono
            if role == Qt.ItemDataRole.TextAlignmentRole and col == 2:
                return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            return None
        if kind == _PROJ:
            if role == GROUP_ROLE:
                return node.key
            if role == Qt.ItemDataRole.ToolTipRole:
                return f"{node.key}: {len(node.children)} tensors (one llama.cpp tensor)"
            if role == Qt.ItemDataRole.FontRole and col in (1, 2):
                return self._mono
            return None
        if role == GROUP_ROLE + 1 and kind == _EXPERTS:
            return True
        if role == Qt.ItemDataRole.FontRole and col == 2:
            return self._mono
        if role == SORT_ROLE and kind == _GROUP and col == 0:
            k = _group_key(node.key)
            return k[0] * 10000 + k[1]
        return None

    def _tensor_text(self, node, col: int) -> str:
        info = self.infos[node.name]
        if col == 0:
            if node.text is None:
                parent = self.nodes[node.parent]
                node.text = _expert_label(node.name) if parent.kind == _PROJ \
                    else _short(node.name, node.key)
            return node.text
        if col == 1:
            return fmt_shape(info.shape)
        if col == 2:
            return fmt_count(info.numel)
        if col == 3:
            return info.display_dtype
        return info.role
