"""A small FileCheck (after LLVM's) for testing printed IR against `// CHECK` lines.

Directives, read from any line of the check text that contains `CHECK...:` (usually `// CHECK: ...`):
  CHECK: p        p matches at or after the end of the previous match
  CHECK-NEXT: p   p matches on the line right after the previous match's line
  CHECK-SAME: p   p matches later on the same line as the previous match
  CHECK-NOT: p    p does not match between the previous match and the next one (or the end of the input)
  CHECK-DAG: p    consecutive DAG lines match in any order (without overlapping) after the previous match
  CHECK-LABEL: p  matched first, in order; splits the input so that the checks between two labels only see the
                  text between the two label matches (a failure stays inside one function)
Patterns are literal substrings, except `{{regex}}` (a Python regex), `[[NAME:regex]]` (matches regex and
captures it into NAME) and `[[NAME]]` (the text captured earlier). Runs of spaces match any run of spaces or tabs;
leading and trailing spaces are ignored. Matches never span lines (unless a regex says so).

    check(printed_ir, test_text)   # raises FileCheckError with the failing directive and the numbered input
"""
from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("CHECK", "CHECK-NEXT", "CHECK-SAME", "CHECK-NOT", "CHECK-DAG", "CHECK-LABEL")


class FileCheckError(AssertionError):
    """A check failed; the message says which directive, where, and shows the input."""


@dataclass(frozen=True)
class Directive:
    kind: str  # one of KINDS
    pattern: str
    line: int  # 1-based line in the check file

    def __str__(self) -> str:
        return f"{self.kind}: {self.pattern}"


def parse_directives(check_text: str, prefix: str = "CHECK", line_offset: int = 0) -> list[Directive]:
    """The directives in `check_text`, in order. A misspelt suffix (CHECK-NXT:) is an error, not ignored."""
    found = re.compile(rf"\b{re.escape(prefix)}(-[A-Z]+)?:(.*)$")
    directives = []
    for number, line in enumerate(check_text.splitlines(), start=1 + line_offset):
        m = found.search(line)
        if m is None:
            continue
        kind = prefix + (m.group(1) or "")
        if kind.replace(prefix, "CHECK", 1) not in KINDS:
            raise FileCheckError(f"line {number}: unknown directive {kind}:")
        pattern = m.group(2).strip()
        if not pattern and not kind.endswith("-NOT"):
            raise FileCheckError(f"line {number}: {kind}: has an empty pattern")
        directives.append(Directive(kind.replace(prefix, "CHECK", 1), pattern, number))
    return directives


# ------------------------------------------------------------------------------------------- patterns


def _closing(text: str, start: int, close: str) -> int:
    """Index of the `close` pair (`}}` or `]]`) that ends the block starting at `start`, skipping brackets of the
    same kind that the regex inside opens and closes, and backslash escapes."""
    opener = {"}": "{", "]": "["}[close[0]]
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if depth == 0 and text.startswith(close, i):
            return i
        depth += (c == opener) - (c == close[0])
        i += 1
    raise FileCheckError(f"unclosed block in pattern: {text[start - 2:]}")


def _literal(text: str) -> str:
    return r"[ \t]+".join(re.escape(part) for part in re.split(r"[ \t]+", text))


def compile_pattern(pattern: str, variables: dict[str, str]) -> re.Pattern[str]:
    """The regex of a directive's pattern; [[NAME]] reads `variables` (or a capture earlier in the pattern)."""
    parts: list[str] = []
    defined: set[str] = set()
    i = 0
    while i < len(pattern):
        if pattern.startswith("{{", i):
            end = _closing(pattern, i + 2, "}}")
            parts.append(f"(?:{pattern[i + 2:end]})")
            i = end + 2
        elif pattern.startswith("[[", i):
            end = _closing(pattern, i + 2, "]]")
            parts.append(_variable(pattern[i + 2:end], variables, defined))
            i = end + 2
        else:
            nxt = min((j for j in (pattern.find("{{", i), pattern.find("[[", i)) if j >= 0), default=len(pattern))
            parts.append(_literal(pattern[i:nxt]))
            i = nxt
    try:
        return re.compile("".join(parts), re.MULTILINE)
    except re.error as e:
        raise FileCheckError(f"bad regex in pattern {pattern!r}: {e}") from None


def _variable(body: str, variables: dict[str, str], defined: set[str]) -> str:
    name, sep, regex = body.partition(":")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise FileCheckError(f"bad variable name {name!r} in [[{body}]]")
    if sep:
        if name in defined:
            raise FileCheckError(f"variable {name} is defined twice in one pattern")
        defined.add(name)
        return f"(?P<{name}>{regex})"
    if name in defined:
        return f"(?P={name})"
    if name not in variables:
        raise FileCheckError(f"variable [[{name}]] is used before it is defined")
    return re.escape(variables[name])


# -------------------------------------------------------------------------------------------- matching


class _Matcher:
    def __init__(self, text: str, directives: list[Directive], name: str):
        self.text = text
        self.directives = directives
        self.name = name
        self.variables: dict[str, str] = {}

    def line_of(self, pos: int) -> int:
        return self.text.count("\n", 0, pos) + 1

    def line_text(self, line: int) -> str:
        lines = self.text.splitlines()
        return lines[line - 1] if 0 < line <= len(lines) else "<end of input>"

    def fail(self, d: Directive, problem: str, line: int) -> FileCheckError:
        numbered = "\n".join(f"{n:4d}  {t}" for n, t in enumerate(self.text.splitlines(), start=1))
        return FileCheckError(
            f"{self.name}:{d.line}: {d}\n  {problem}\n  at input line {line}: {self.line_text(line)}\n"
            f"input:\n{numbered}")

    def search(self, d: Directive, start: int, end: int) -> re.Match[str] | None:
        return compile_pattern(d.pattern, self.variables).search(self.text, start, end)

    def accept(self, m: re.Match[str]) -> None:
        self.variables.update({k: v for k, v in m.groupdict().items() if v is not None})

    def run(self) -> None:
        labels = [d for d in self.directives if d.kind == "CHECK-LABEL"]
        starts, ends, pos = [], [], 0
        for d in labels:
            m = self.search(d, pos, len(self.text))
            if m is None:
                raise self.fail(d, "label not found", self.line_of(pos))
            self.accept(m)
            starts.append(m.start())
            ends.append(m.end())
            pos = m.end()
        group: list[Directive] = []
        begin, label_index = 0, 0
        for d in self.directives:
            if d.kind != "CHECK-LABEL":
                group.append(d)
                continue
            self.match_range(group, begin, starts[label_index])
            group, begin = [], ends[label_index]
            label_index += 1
        self.match_range(group, begin, len(self.text))

    def match_range(self, directives: list[Directive], start: int, end: int) -> None:
        """Match `directives` (no labels) within text[start:end]; `start` is the end of the previous match."""
        pos, forbidden, i = start, [], 0
        while i < len(directives):
            d = directives[i]
            if d.kind == "CHECK-NOT":
                forbidden.append(d)
                i += 1
                continue
            if d.kind == "CHECK-DAG":
                dags = []
                while i < len(directives) and directives[i].kind == "CHECK-DAG":
                    dags.append(directives[i])
                    i += 1
                first, last = self.match_dags(dags, pos, end)
            else:
                m = self.match_one(d, pos, end)
                first, last = m.start(), m.end()
                i += 1
            self.check_absent(forbidden, pos, first)
            forbidden, pos = [], last
        self.check_absent(forbidden, pos, end)

    def match_one(self, d: Directive, pos: int, end: int) -> re.Match[str]:
        prev_line = self.line_of(pos)
        m = self.search(d, pos, end)
        if m is None:
            raise self.fail(d, "expected pattern not found (searching from here)", prev_line)
        line = self.line_of(m.start())
        if d.kind == "CHECK-NEXT" and line != prev_line + 1:
            raise self.fail(d, f"matched on line {line}, not on the line after the previous match "
                               f"(line {prev_line})", line)
        if d.kind == "CHECK-SAME" and line != prev_line:
            raise self.fail(d, f"matched on line {line}, not on the previous match's line {prev_line}", line)
        self.accept(m)
        return m

    def match_dags(self, dags: list[Directive], pos: int, end: int) -> tuple[int, int]:
        """Match each DAG pattern at its first place after `pos` that no other one took; (first start, last end)."""
        taken: list[tuple[int, int]] = []
        for d in dags:
            start = pos
            while True:
                m = self.search(d, start, end)
                if m is None:
                    raise self.fail(d, "expected pattern not found (searching from here)", self.line_of(pos))
                overlap = [e for s, e in taken if s < m.end() and m.start() < e]
                if not overlap:
                    break
                start = max(overlap)
            self.accept(m)
            taken.append((m.start(), m.end()))
        return min(s for s, _ in taken), max(e for _, e in taken)

    def check_absent(self, forbidden: list[Directive], start: int, end: int) -> None:
        for d in forbidden:
            m = self.search(d, start, end)
            if m is not None:
                raise self.fail(d, f"excluded pattern found: {m.group(0)!r}", self.line_of(m.start()))


def check(text: str, check_text: str, *, prefix: str = "CHECK", name: str = "<checks>",
          line_offset: int = 0) -> None:
    """Check `text` against the directives in `check_text`; raise FileCheckError on the first failure.

    `name` and `line_offset` place the directives in their file for error messages."""
    directives = parse_directives(check_text, prefix, line_offset)
    if not directives:
        raise FileCheckError(f"{name}: no {prefix} directives found")
    _Matcher(text, directives, name).run()
