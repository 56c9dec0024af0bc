"""Name patterns that cannot backtrack: plan rules (``re:...``) and the GUI's filters run on
RE2 (``google-re2``), whose matching time is linear in the name's length whatever the pattern.

RE2 takes Python's syntax except backreferences and look-around; a pattern it cannot take is
a WorkbenchError that says so. Matching keeps ``re.search`` semantics.
"""

from __future__ import annotations

import re
from functools import lru_cache

from workbench.core.errors import WorkbenchError

MAX_PATTERN = 4096
_REPEAT = re.compile(r"\{(\d*)(?:,(\d*))?\}")
MAX_MEM = 8 << 20   # bytes RE2 may use for one compiled pattern
MAX_REPEAT = 1000   # RE2's limit on a counted repetition; a larger count must not become a literal


def _check_repeats(text: str) -> None:
    """Refuse counted repetitions above MAX_REPEAT. RE2 refuses {1001} but reads a count that
    overflows its integer (``a{4294967296}``) as literal text, where Python's re refuses it."""
    if "{" not in text:
        return
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # a character class: '{' is literal inside it
            j = i + 1
            if j < n and text[j] == "^":
                j += 1
            if j < n and text[j] == "]":
                j += 1
            while j < n and text[j] != "]":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c == "{":
            m = _REPEAT.match(text, i)
            if m:
                for num in m.groups():
                    if num and (len(num) > 9 or int(num) > MAX_REPEAT):
                        raise WorkbenchError(f"bad regular expression {text[:80]!r} (repetition "
                                             f"count {num[:20]} is above {MAX_REPEAT})")
        i += 1


@lru_cache(maxsize=512)
def compile_pattern(text: str, ignore_case: bool = False):
    """A compiled pattern with ``.search(name)``; WorkbenchError for one RE2 cannot take."""
    import re2
    if len(text) > MAX_PATTERN:
        raise WorkbenchError(f"regular expression longer than {MAX_PATTERN} characters")
    _check_repeats(text)
    opts = re2.Options()
    opts.log_errors = False
    opts.max_mem = MAX_MEM
    opts.case_sensitive = not ignore_case
    try:
        return re2.compile(text, opts)
    except re2.error as exc:
        why = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(
            exc.args[0], bytes) else str(exc)
        hint = ("; RE2 has no backreferences or look-around"
                if "escape" in why or "perl operator" in why else "")
        raise WorkbenchError(f"bad regular expression {text[:80]!r} ({why}{hint})") from None
    except (TypeError, ValueError) as exc:
        raise WorkbenchError(f"bad regular expression {text[:80]!r} ({exc})") from None


SET_MAX_MEM = 512 << 20   # bytes RE2 may use for a plan's patterns matched together


def check_pattern_text(text: str) -> None:
    """The checks made before RE2 sees a pattern (length, counted repetitions)."""
    if len(text) > MAX_PATTERN:
        raise WorkbenchError(f"regular expression longer than {MAX_PATTERN} characters")
    _check_repeats(text)


SET_CHUNK = 1024         # patterns per RE2 set while few names are matched: compiles fastest
SET_CHUNK_MANY = 8192   # ... after MERGE_AFTER names: fewer sets, each name matched faster
MERGE_AFTER = 4096


class PatternSet:
    """Many patterns matched together (RE2's Set): `first(name)` is the index of the first
    pattern (in the order given) that ``re.search`` would find in `name`, or None. Building and
    matching are linear in the patterns' total length and the name's length, not in their
    product: a plan of 100,000 rules resolves a tensor about as fast as a plan of ten.

    RE2's compile of one set costs more than its size (75,000 patterns: 0.32 s in sets of
    8,192, 0.15 s in sets of 1,024), and matching a name costs a call per set. So the patterns
    go into sets of SET_CHUNK in their order, a name is matched against the sets in order
    until one finds a pattern, and once MERGE_AFTER names have been matched (a large model)
    the sets are compiled again as sets of SET_CHUNK_MANY. A pattern repeated later can never
    be the first match and is left out. A pattern RE2 cannot take is the WorkbenchError
    compile_pattern gives."""

    def __init__(self, patterns: list[str]):
        self.n = len(patterns)
        self._sets: list = []          # (RE2 set, the original index of each of its patterns)
        self._unique: list = []        # (original index, pattern) of the patterns kept
        self._matched = 0
        if not patterns:
            return
        seen: set = set()
        for i, text in enumerate(patterns):
            if text in seen:
                continue
            seen.add(text)
            if len(text) > MAX_PATTERN or "{" in text:
                check_pattern_text(text)
            self._unique.append((i, text))
        self._sets = self._build(SET_CHUNK)

    def _build(self, chunk: int) -> list:
        import re2
        opts = re2.Options()
        opts.log_errors = False
        # the plan's memory budget shared between its sets (at least 32 MiB each: 8,192
        # short patterns take about 16)
        opts.max_mem = max(32 << 20, SET_MAX_MEM // -(-len(self._unique) // chunk))
        sets = []
        for k in range(0, len(self._unique), chunk):
            s, index = re2.Set.SearchSet(opts), []
            for i, text in self._unique[k:k + chunk]:
                try:
                    ok = s.Add(text) == len(index)
                except re2.error:
                    ok = False
                if not ok:
                    compile_pattern(text)   # raises the precise reason
                    raise WorkbenchError(f"bad regular expression {text[:80]!r}")
                index.append(i)
            try:
                s.Compile()
            except re2.error as exc:
                raise WorkbenchError(f"the plan's {self.n:,} patterns do not fit RE2's memory "
                                     f"limit together ({exc})") from None
            sets.append((s, index))
        return sets

    def first(self, name: str) -> int | None:
        if not self._sets:
            return None
        import re2
        self._matched += 1
        if self._matched == MERGE_AFTER and len(self._sets) > 1 and SET_CHUNK_MANY > SET_CHUNK:
            self._sets = self._build(SET_CHUNK_MANY)
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:   # a lone surrogate (RE2 takes UTF-8): matched as "?"
            name = name.encode("utf-8", "replace").decode("utf-8")
        for s, index in self._sets:
            try:
                hits = s.Match(name)
            except re2.error as exc:
                raise WorkbenchError(f"matching {self.n:,} patterns against {name[:80]!r} "
                                     f"failed ({exc})") from None
            if hits:
                return index[min(hits)]
        return None
