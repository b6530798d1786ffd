"""Kubernetes label selectors as kube-apiserver parses a `labelSelector` query
(k8s.io/apimachinery `pkg/labels/selector.go` at v0.20.2: its lexer, parser and
`Requirement.Matches`): `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`,
`k>1`, `k<1`, comma separated, all of them required."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

_SPECIAL = frozenset("=!(),><")
_WHITESPACE = frozenset(" \t\r\n")
_TOKENS = frozenset({")", ",", "!", "==", "=", ">", "in", "<", "!=", "notin", "("})
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
IDENTIFIER, END, ERROR = "identifier", "end", "error"

_Scan = Callable[[], tuple[str, str]]


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    """One of `=`, `==`, `!=`, `in`, `notin`, `exists`, `!`, `>`, `<`."""
    values: tuple[str, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        if self.operator in ("=", "==", "in"):
            return has and labels[self.key] in self.values
        if self.operator in ("!=", "notin"):
            return not has or labels[self.key] not in self.values
        if self.operator == "exists":
            return has
        if self.operator == "!":
            return not has
        try:
            value, bound = int(labels[self.key]), int(self.values[0])
        except (KeyError, ValueError):
            return False
        return value > bound if self.operator == ">" else value < bound


def _lex(text: str) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in _WHITESPACE:
            pos += 1
        if pos >= len(text):
            items.append((END, ""))
            return items
        if text[pos] in _SPECIAL:
            buffer, last = "", ""
            while pos < len(text) and text[pos] in _SPECIAL:
                if buffer + text[pos] in _TOKENS:
                    buffer += text[pos]
                    last = buffer
                elif last:
                    break
                else:
                    buffer += text[pos]
                pos += 1
            if not last:
                items.append((ERROR, f"error expected: keyword found '{buffer}'"))
            else:
                items.append((last, last))
            continue
        start = pos
        while pos < len(text) and text[pos] not in _SPECIAL and text[pos] not in _WHITESPACE:
            pos += 1
        word = text[start:pos]
        items.append((word if word in _TOKENS else IDENTIFIER, word))


def parse(text: str) -> list[Requirement]:
    """The requirements of a selector, sorted by key; ValueError with kube-apiserver's
    message if it does not parse."""
    items = _lex(text)
    position = 0

    def look(values: bool = True) -> tuple[str, str]:
        token, literal = items[min(position, len(items) - 1)]
        return (IDENTIFIER if values and token in ("in", "notin") else token), literal

    def take(values: bool = True) -> tuple[str, str]:
        nonlocal position
        item = look(values)
        position += 1
        return item

    def requirement() -> Requirement:
        operator = ""
        token, key = take()
        if token == "!":
            operator = "!"
            token, key = take()
        if token != IDENTIFIER:
            raise ValueError(f"found '{key}', expected: identifier")
        _check_key(key)
        if operator or look()[0] in (END, ","):
            return Requirement(key, operator or "exists", ())
        token, literal = take(values=False)
        if token not in ("=", "==", "!=", "in", "notin", ">", "<"):
            raise ValueError(f"found '{literal}', expected: '=', '!=', '==', 'in', notin'")
        values = _values(take, look) if token in ("in", "notin") else _exact(take, look)
        if token in (">", "<") and not re.fullmatch(r"[-+]?\d+", values[0]):
            raise ValueError("for 'Gt', 'Lt' operators, the value must be an integer")
        for value in values:
            _check_value(key, value)
        return Requirement(key, token, tuple(sorted(set(values))))

    requirements: list[Requirement] = []
    while True:
        token, literal = look()
        if token == END:
            break
        if token not in (IDENTIFIER, "!"):
            raise ValueError(f"found '{literal}', expected: !, identifier, or 'end of string'")
        try:
            requirements.append(requirement())
        except ValueError as exc:
            raise ValueError(f"unable to parse requirement: {exc}") from None
        token, literal = take()
        if token == END:
            break
        if token != ",":
            raise ValueError(f"found '{literal}', expected: ',' or 'end of string'")
        if look()[0] not in (IDENTIFIER, "!"):
            raise ValueError(f"found '{look()[1]}', expected: identifier after ','")
    return sorted(requirements, key=lambda r: r.key)


def _values(take: _Scan, look: _Scan) -> list[str]:
    token, literal = take()
    if token != "(":
        raise ValueError(f"found '{literal}' expected: '('")
    token, literal = look()
    if token == ")":
        take()
        return [""]
    if token not in (IDENTIFIER, ","):
        raise ValueError(f"found '{literal}', expected: ',', ')' or identifier")
    values: list[str] = []
    while True:
        token, literal = take()
        if token == IDENTIFIER:
            values.append(literal)
            following, text = look()
            if following == ",":
                continue
            if following == ")":
                take()
                return values
            raise ValueError(f"found '{text}', expected: ',' or ')'")
        if token == ",":
            if not values:
                values.append("")
            following, _ = look()
            if following == ")":
                take()
                return [*values, ""]
            if following == ",":
                take()
                values.append("")
            continue
        raise ValueError(f"found '{literal}', expected: ',', or identifier")


def _exact(take: _Scan, look: _Scan) -> list[str]:
    if look()[0] in (END, ","):
        return [""]
    token, literal = take()
    if token != IDENTIFIER:
        raise ValueError(f"found '{literal}', expected: identifier")
    return [str(literal)]


def _check_key(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    ok = bool(_NAME.fullmatch(name)) and len(name) <= 63
    if "/" in key:
        ok = ok and bool(prefix) and len(prefix) <= 253 and bool(_PREFIX.fullmatch(prefix))
    if not ok:
        raise ValueError(f"invalid label key {key!r}")


def _check_value(key: str, value: str) -> None:
    if value and not (len(value) <= 63 and _NAME.fullmatch(value)):
        raise ValueError(f'invalid label value: "{value}": at key: "{key}"')
