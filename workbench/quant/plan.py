"""Mixed-precision plans: versioned data that survive JSON (DESIGN.md example 4).

A plan maps every tensor to a scheme by ordered rules:
  1. an exact tensor name,
  2. then ``re:`` patterns in order (first match wins, ``re.search`` semantics, on RE2:
     linear time, no backreferences or look-around — workbench.core.patterns),
  3. then the default — except that 1-D / 0-D tensors and non-float tensors default to
     ``keep`` (stored unchanged in their own dtype).

JSON form (version 1)::

    {"format": "quant-workbench-plan", "version": 1,
     "default": "int8-channel",
     "rules": [{"match": "model.embed_tokens.weight", "scheme": "fp16"},
               {"match": "re:\\.mlp\\.down_proj\\.", "scheme": "int8-channel"}]}

Mixture-of-experts (docs/moe.md):

* a rule whose ``match`` is a ``moe:`` selector (``moe:experts``, ``moe:experts.down@5``,
  ``moe:shared.up@2-7``, ``moe:router`` — workbench.running.moe) addresses a set of MoE tensors by role;
  selectors and ``re:`` patterns are tried together, in list order, after exact names;
* a router (catalog role ``router``: ``mlp.gate``, ``block_sparse_moe.gate``, GGUF
  ``ffn_gate_inp`` ...) stays in float: the default scheme and ``re:`` patterns never reach it,
  only an exact-name rule or a ``moe:router`` selector does.

A plan using a ``moe:`` selector is written as version 2 (an older reader refuses it rather than
ignoring the rule); version 1 plans load unchanged.

An optional ``"fallback"`` (plan-level, or per rule) names the scheme for tensors whose shape
cannot take theirs (e.g. ``q4_k`` on rows that are not a multiple of 256); without one the
target runtime's own rule applies (:mod:`workbench.quant.runtimes`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from workbench.core.atomic import write_text_atomic
from workbench.formats.catalog import is_router as _is_router_name
from workbench.core.errors import WorkbenchError

PLAN_FORMAT = "quant-workbench-plan"
PLAN_VERSION = 1
#: versions this reader takes; 2 = a plan with moe: selectors (written only when it has one)
PLAN_VERSIONS = (1, 2)
KEEP = "keep"


@dataclass(frozen=True)
class Rule:
    match: str
    scheme: str
    fallback: str | None = None   # used when a tensor's shape cannot take `scheme`
    method: str | None = None     # quantization method (workbench.quant.methods); None: the plan's

    @property
    def is_regex(self) -> bool:
        """A pattern rule (``re:`` or a ``moe:`` selector): not an exact name."""
        return self.match.startswith(("re:", "moe:"))

    @property
    def is_selector(self) -> bool:
        return self.match.startswith("moe:")

    def to_dict(self) -> dict:
        d = {"match": self.match, "scheme": self.scheme}
        if self.fallback:
            d["fallback"] = self.fallback
        if self.method:
            d["method"] = self.method
        return d


def _check_method(name, where: str, path=None) -> str:
    """The canonical method name (rtn, imatrix, gptq, awq) or a clear error."""
    if name in ("rtn", "imatrix", "gptq", "awq"):   # METHOD_NAMES, without the import
        return name
    from workbench.quant.methods.base import METHOD_NAMES
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in METHOD_NAMES:
        raise WorkbenchError(f"{where}: unknown method {name!r} (choose from "
                             f"{', '.join(METHOD_NAMES)})", path=path)
    return key


def _check_activations(data, path=None) -> dict:
    """{linear weight name: activation entry} (workbench.quant.methods.activations.activation_entry)."""
    if not isinstance(data, dict):
        raise WorkbenchError("'activations' must be an object {tensor: {num_bits, type, ...}}",
                             path=path)
    out = {}
    for name, e in data.items():
        if not (isinstance(e, dict) and type(e.get("num_bits")) is int
                and e.get("type") in ("int", "float")
                and isinstance(e.get("scale", 1.0), (int, float))):
            raise WorkbenchError(f"activations '{str(name)[:80]}': needs integer 'num_bits' and "
                                 "'type' int|float (and a numeric 'scale')", path=path)
        out[str(name)] = dict(e)
    return out


_CANONICAL: dict = {KEEP: KEEP}   # scheme name as written -> registered name (a plan repeats a few)


def _check_scheme(name: str, where, path=None) -> str:
    """The registered name of scheme `name`; `where` (text, or a callable giving it: built
    only for the error) names the place in the message."""
    hit = _CANONICAL.get(name) if isinstance(name, str) else None
    if hit is not None:
        return hit
    from workbench.schemes import get_scheme
    try:
        canon = get_scheme(name).name
    except WorkbenchError:
        where = where() if callable(where) else where
        raise WorkbenchError(f"{where}: unknown scheme '{name}'", path=path) from None
    if len(_CANONICAL) < 4096:
        _CANONICAL[name] = canon
    return canon


def _canonical_rule(r: "Rule", path=None) -> "Rule":
    """The rule validated, with registered scheme and method names: the same object when they
    already are (a plan of 100,000 rules loads in one pass of dictionary look-ups)."""
    match, scheme, fallback, method = r.match, r.scheme, r.fallback, r.method
    canon = _CANONICAL.get(scheme) if type(scheme) is str else None
    if canon is None:   # the message's text is built only for an error
        canon = _check_scheme(scheme, lambda: f"rule '{match}'", path)
    fb = _check_scheme(fallback, lambda: f"rule '{match}' fallback", path) if fallback else None
    meth = _check_method(method, f"rule '{match[:80]}'", path) if method else None
    if type(match) is str and match.startswith("moe:"):
        from workbench.formats.moe_selectors import parse_selector
        try:
            parse_selector(match)
        except WorkbenchError as exc:
            raise WorkbenchError(str(exc), path=path) from None
    if canon == scheme and fb == fallback and meth == method:
        return r
    return Rule(match, canon, fb, meth)


class _Checked(list):
    """Rules from_dict has already passed through _canonical_rule."""


@dataclass
class Plan:
    default: str = "int8-channel"
    rules: list[Rule] = field(default_factory=list)
    version: int = PLAN_VERSION
    #: the scheme for tensors whose shape cannot take theirs (None: the runtime's own rule)
    fallback: str | None = None
    #: the method for tensors whose rule names none (workbench.quant.methods; "rtn" = the scheme's own)
    method: str = "rtn"
    #: per linear weight, its input's activation quantization (calibrated ranges), written by
    #: exporters whose format carries them (compressed-tensors ``input_activations``)
    activations: dict = field(default_factory=dict)

    def __post_init__(self):
        self.default = _check_scheme(self.default, "default")
        self.method = _check_method(self.method or "rtn", "method")
        self.activations = _check_activations(self.activations or {})
        if self.fallback is not None:
            self.fallback = _check_scheme(self.fallback, "fallback")
        # validated, with canonical scheme names, so the plan reports (and exports) what is
        # applied: one pass, the rules reused when already canonical (a loaded plan's are)
        if type(self.rules) is _Checked:   # from from_dict: checked there, under its path
            self.rules = list(self.rules)
        else:
            self.rules = [_canonical_rule(r if isinstance(r, Rule) else Rule(**r))
                          for r in self.rules]
        self._compiled = None
        self._index()   # validates every pattern (a bad one names its rule)

    # ---- resolution ---------------------------------------------------------------------
    def _index(self):
        if self._compiled is None:
            from workbench.formats.moe_selectors import parse_selector
            from workbench.core.patterns import PatternSet
            exact = {}
            regex, regex_pos = [], []   # re: rules and their positions in the rule list
            selectors = []              # (position, workbench.formats.moe_selectors.Selector, rule)
            for i, r in enumerate(self.rules):
                if r.is_selector:
                    selectors.append((i, parse_selector(r.match), r))
                elif r.is_regex:
                    regex.append(r)
                    regex_pos.append(i)
                else:
                    exact.setdefault(r.match, r)
            try:
                pset = PatternSet([r.match[3:] for r in regex])
            except WorkbenchError as exc:
                bad = next((r for r in regex if _bad_pattern(r.match[3:])), None)
                where = f"rule '{bad.match[:80]}': " if bad is not None else ""
                raise WorkbenchError(f"{where}{exc}") from None
            self._compiled = (exact, regex, regex_pos, pset, selectors)
        return self._compiled

    def rule_for(self, name: str) -> Rule | None:
        """The rule that assigns `name` (None: the default applies): an exact name first, then
        the first ``re:`` or ``moe:`` rule in list order that matches (all ``re:`` patterns
        matched in one RE2 pass: linear in the name, whatever the number of rules). A router is
        reached only by its exact name or a ``moe:router`` selector."""
        exact, regex, regex_pos, pset, selectors = self._index()
        if name in exact:
            return exact[name]
        sel = next(((i, r) for i, s, r in selectors if s.matches(name)), None)
        if (regex or sel is not None) and self._is_router(name):
            return sel[1] if sel is not None else None   # patterns never reach a router
        k = pset.first(name) if regex else None
        if k is not None and (sel is None or regex_pos[k] < sel[0]):
            return regex[k]
        return sel[1] if sel is not None else None

    @staticmethod
    def _is_router(name: str) -> bool:
        return _is_router_name(name)

    def scheme_and_source(self, name: str, ndim: int = 2, is_float: bool = True):
        """(scheme, explicit): the scheme for a tensor and whether a rule chose it."""
        rule = self.rule_for(name)
        if rule is not None:
            return rule.scheme, True
        if ndim < 2 or not is_float or self._is_router(name):
            return KEEP, False   # routers stay in float unless a rule names them
        return self.default, False

    def scheme_for(self, name: str, ndim: int = 2, is_float: bool = True) -> str:
        """The scheme name for a tensor (or ``keep``)."""
        return self.scheme_and_source(name, ndim, is_float)[0]

    def method_for(self, name: str) -> str:
        """The quantization method for a tensor: its rule's, else the plan's (default rtn)."""
        rule = self.rule_for(name)
        if rule is not None and rule.method:
            return rule.method
        return self.method

    def methods_used(self) -> set[str]:
        return {self.method, *(r.method for r in self.rules if r.method)}

    def with_method(self, method: str, names=None) -> "Plan":
        """The plan-level method (names None), or exact-name rules carrying `method` for `names`
        (each keeps the scheme it resolves to now)."""
        if names is None:
            return self._copy(method=method)
        rules = list(self.rules)
        for n in names:
            cur = self.rule_for(n)
            scheme = cur.scheme if cur is not None else self.default
            rules = [r for r in rules if r.is_regex or r.match != n]
            rules.append(Rule(n, scheme, cur.fallback if cur is not None else None, method))
        return self._copy(rules=rules)

    def with_activations(self, activations: dict) -> "Plan":
        """The plan with these calibrated activation entries ({weight name: entry})."""
        return self._copy(activations=dict(activations))

    def _copy(self, **kw) -> "Plan":
        d = {"default": self.default, "rules": list(self.rules), "version": self.version,
             "fallback": self.fallback, "method": self.method,
             "activations": dict(self.activations)}
        d.update(kw)
        return Plan(**d)

    def fallback_for(self, name: str) -> str | None:
        """The plan's fallback for a tensor: its rule's, else the plan's."""
        rule = self.rule_for(name)
        if rule is not None and rule.fallback:
            return rule.fallback
        return self.fallback

    def resolve(self, model, names=None) -> dict[str, str]:
        """Scheme for every tensor of a model, or for `names` only (non-float tensors are always
        kept)."""
        return {name: scheme for name, _info, scheme, _explicit, _rule
                in self.sources(model, names)}

    def sources(self, model, names=None):
        """(name, info, scheme, explicit, rule) for every tensor of `model` (or `names`): the
        scheme as :meth:`resolve` gives it, whether a rule chose it (:meth:`scheme_and_source`)
        and that rule (None: the default or keep). A plan without ``re:`` patterns or selectors
        (exact names and the default) needs no rule search per tensor: a 100,000-tensor catalog
        in tens of ms."""
        exact, regex, _pos, _pset, selectors = self._index()
        tensors = model.tensors
        searched = bool(regex or selectors)
        default = self.default
        for name in (tensors if names is None else names):
            info = tensors[name]
            rule = self.rule_for(name) if searched else exact.get(name)
            if not info.is_float:
                yield name, info, KEEP, rule is not None, rule
            elif rule is not None:
                yield name, info, rule.scheme, True, rule
            elif len(info.shape) < 2 or _is_router_name(name):
                yield name, info, KEEP, False, None   # routers stay in float unless named
            else:
                yield name, info, default, False, None

    def exact_changes(self, other: "Plan") -> set[str] | None:
        """The tensor names whose scheme, method or fallback can differ between this plan and
        `other` when the two differ only in exact-name rules (an assignment: the names of the
        rules added, removed or changed); None when anything else differs (default, plan
        fallback or method, a pattern or selector rule), so every tensor may have changed."""
        if (self.default, self.fallback, self.method) != (other.default, other.fallback,
                                                         other.method):
            return None
        if [r for r in self.rules if r.is_regex] != [r for r in other.rules if r.is_regex]:
            return None
        a, b = self._index()[0], other._index()[0]
        return {n for n in a.keys() | b.keys() if a.get(n) != b.get(n)}

    # ---- edits (return a new plan; commands in the GUI keep the old one for undo) -------
    def with_assignments(self, assignments: dict[str, str]) -> "Plan":
        """Exact-name assignments replacing any earlier exact rule for those names."""
        old = {r.match: r for r in self.rules if not r.is_regex}
        keep = [r for r in self.rules if r.is_regex or r.match not in assignments]
        new = [Rule(n, _check_scheme(s, f"tensor '{n}'"), None,
                    old[n].method if n in old else None) for n, s in assignments.items()]
        return self._copy(rules=keep + new)

    def with_rule(self, match: str, scheme: str, index: int | None = None) -> "Plan":
        rules = list(self.rules)
        rule = Rule(match, scheme)
        rules.insert(len(rules) if index is None else index, rule)
        return self._copy(rules=rules)

    def without_rule(self, index: int) -> "Plan":
        rules = list(self.rules)
        del rules[index]
        return self._copy(rules=rules)

    def with_default(self, scheme: str) -> "Plan":
        return self._copy(default=scheme)

    # ---- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        version = 2 if any(r.is_selector for r in self.rules) else PLAN_VERSION
        d = {"format": PLAN_FORMAT, "version": version, "default": self.default}
        if self.fallback:
            d["fallback"] = self.fallback
        if self.method != "rtn":
            d["method"] = self.method
        d["rules"] = [r.to_dict() for r in self.rules]
        if self.activations:
            d["activations"] = self.activations
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data, path=None) -> "Plan":
        if not isinstance(data, dict):
            raise WorkbenchError("plan must be a JSON object", path=path)
        if data.get("format", PLAN_FORMAT) != PLAN_FORMAT:
            raise WorkbenchError(f"not a plan file (format is {data.get('format')!r})", path=path)
        version = data.get("version")
        if type(version) is not int or version not in PLAN_VERSIONS:
            raise WorkbenchError(f"unsupported plan version {version!r} (expected "
                                 f"{' or '.join(map(str, PLAN_VERSIONS))})", path=path)
        default = data.get("default", "int8-channel")
        if not isinstance(default, str):
            raise WorkbenchError("'default' must be a scheme name", path=path)
        raw_rules = data.get("rules", [])
        if not isinstance(raw_rules, list):
            raise WorkbenchError("'rules' must be a list", path=path)
        rules = []
        canon = _CANONICAL
        for i, r in enumerate(raw_rules):
            if type(r) is dict:
                match, scheme = r.get("match"), r.get("scheme")
                fallback, method = r.get("fallback"), r.get("method")
                if (type(match) is str and type(scheme) is str
                        and (fallback is None or type(fallback) is str)
                        and (method is None or type(method) is str)):
                    if (fallback is None and method is None and canon.get(scheme) == scheme
                            and not match.startswith("moe:")):
                        rules.append(Rule(match, scheme))   # the common rule: nothing to check
                    else:
                        rules.append(_canonical_rule(Rule(match, scheme, fallback or None,
                                                          method or None), path))
                    continue
            if not (isinstance(r, dict) and isinstance(r.get("match"), str)
                    and isinstance(r.get("scheme"), str)
                    and isinstance(r.get("fallback", ""), str)
                    and isinstance(r.get("method", ""), str)):
                raise WorkbenchError(f"rule {i} must be an object with string 'match' and 'scheme'"
                                     " (and optionally 'fallback', 'method')", path=path)
            rules.append(_canonical_rule(Rule(r["match"], r["scheme"], r.get("fallback") or None,
                                              r.get("method") or None), path))
        fallback = data.get("fallback")
        if fallback is not None and not isinstance(fallback, str):
            raise WorkbenchError("'fallback' must be a scheme name", path=path)
        try:
            default = _check_scheme(default, "default", path)
            if fallback:
                fallback = _check_scheme(fallback, "fallback", path)
        except WorkbenchError as exc:
            raise WorkbenchError(str(exc)) from None
        method = data.get("method", "rtn")
        if not isinstance(method, str):
            raise WorkbenchError("'method' must be a method name", path=path)
        method = _check_method(method, "method", path)
        acts = _check_activations(data.get("activations", {}), path)
        from workbench.core.errors import context
        with context(path):
            return cls(default, _Checked(rules), version, fallback or None, method, acts)

    @classmethod
    def from_json(cls, text: str, path=None) -> "Plan":
        from workbench.core.limits import gc_paused, loads
        with gc_paused():   # a plan's rules are all kept (100,000 of them: no cycles)
            return cls.from_dict(loads(text, path, "plan JSON"), path)

    @classmethod
    def load(cls, path) -> "Plan":
        p = Path(path)
        if not p.exists():
            raise WorkbenchError("plan file not found", path=str(p))
        from workbench.core.limits import MAX_JSON_BYTES, read_sidecar
        # its size before any byte is read (an 8 GB sparse file), a regular file (not a FIFO)
        raw = read_sidecar(p, "plan JSON", MAX_JSON_BYTES)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WorkbenchError(f"cannot read plan ({exc})", path=str(p)) from None
        return cls.from_json(text, str(p))

    def save(self, path) -> None:
        write_text_atomic(path, self.to_json())

    def __eq__(self, other) -> bool:
        return isinstance(other, Plan) and self.to_dict() == other.to_dict()


def _bad_pattern(text: str) -> bool:
    """Whether RE2 (with the project's checks) refuses this pattern on its own."""
    from workbench.core.patterns import compile_pattern
    try:
        compile_pattern(text)
        return False
    except WorkbenchError:
        return True


def default_plan(model, scheme: str | None = None) -> Plan:
    """The plan a newly opened model starts from: `scheme` (default Plan's, int8-channel) for
    every weight matrix, except that no tensor gets more bits than it already has: a tensor
    stored quantized (a GGUF's Q4_1 or Q8_0, a ``TensorInfo.quant``) or one `scheme` would store in more
    bytes than it takes now (FP8) is kept as it is, unless the user asks. A float model's is
    ``Plan(default=scheme)``; where most matrices are kept the default is keep and the others
    are named."""
    from workbench.formats.dtypes import STORAGE
    from workbench.schemes import get_scheme
    sch = get_scheme(scheme or Plan.default)
    keep, requant = [], []
    for n, info in model.tensors.items():
        if not (info.ndim >= 2 and info.is_float):
            continue          # never a plan's default (norms, biases, integer tensors)
        stored_quantized = info.quant is not None or info.dtype not in STORAGE   # GGML types
        if stored_quantized or sch.nbytes(info.shape) > info.nbytes:
            keep.append(n)
        else:
            requant.append(n)
    if not keep:
        return Plan(default=sch.name)
    if len(requant) < len(keep):
        return Plan(default=KEEP, rules=[Rule(n, sch.name) for n in requant])
    return Plan(default=sch.name, rules=[Rule(n, KEEP) for n in keep])
