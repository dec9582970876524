"""The MySQL listener's normalizer, learned once per statement shape.

:func:`~shardgate.sql.literals.bind_literals` scans a statement's text in
Python, character class by character class (~19 µs for a point select); a
MySQL client sends the same few shapes over and over with other values.
:class:`Shapes` reads a statement's literals (integers, quoted strings) with
one C-level regex, keys the text left around them (its *shape*), and keeps
per shape what :func:`bind_literals` does with each literal: the text it
makes (the literals it leaves in place copied back) and which literal each
bind variable takes. A known shape is bound without the scan (~5 µs).

A shape is learned from the statement itself, with each literal replaced by
a marker of the same kind (an integer of 16 digits, a string of the same
quote): :func:`bind_literals` decides by the text around the literals,
never by their digits or the inside of a string, so it treats every
statement of a shape alike. What could make it look inside is kept out of
the cache: comments (a quote inside one), strings holding ``:`` or the word
``select`` (:func:`bind_literals` refuses those texts as a whole), NUL
characters. And each shape's recipe is checked once, when learned, against
:func:`bind_literals` on the statement it was learned from; a shape whose
recipe differs is never bound from the cache.

Invariant: :meth:`Shapes.bind` returns exactly what :func:`bind_literals`
returns for the same text.
"""

from __future__ import annotations

import re
from typing import Any

from shardgate.sql.literals import bind_literals, literal_value

#: One literal: a quoted string (backslash escapes, doubled quotes) or an integer
#: standing alone (not part of a name, a decimal, a hex or exponent literal).
#: (One group, the whole literal: ``split`` keeps the literals, ``findall`` gives them.)
_LITERAL = re.compile(
    r"""([\d'"](?<![\w.$]\d)"""  # (one first-character test, then which kind it was)
    r"""(?:(?<=')(?:[^'\\]|\\.|'')*'|(?<=")(?:[^"\\]|\\.|"")*"|(?<=\d)\d*(?![\w.$])))""", re.S)
#: Marker integers: ``_BASE + i`` for the i-th literal (16 digits, never a real one:
#: every integer of the text is replaced).
_BASE = 7_000_000_000_000_000
#: a literal's kind by its first character: its quote, or 0 for an integer
_KINDS = str.maketrans("123456789", "000000000")
#: Shapes kept; past this many the cache starts afresh.
CAPACITY = 2048

#: A shape :func:`bind_literals` finds nothing to bind in.
_NOTHING = "nothing"
#: A shape bound by :func:`bind_literals` on each statement (its recipe did not hold).
_SCAN = "scan"


class _Recipe:
    """What :func:`bind_literals` does with a shape: its text in ``parts`` (a str is
    copied, an int is the text of that literal, left in place), and per bind variable
    the literal it takes and whether negated (``-5`` is the literal ``5`` after ``-``)."""

    __slots__ = ("binds", "parts", "text")

    def __init__(self, parts: list[str | int], binds: list[tuple[str, int, bool]]) -> None:
        self.parts = parts
        self.binds = binds
        #: the text when no literal is left in place
        self.text = "".join(p for p in parts if isinstance(p, str)) \
            if all(isinstance(p, str) for p in parts) else None

    def apply(self, literals: list[str]) -> tuple[str, dict[str, Any]]:
        binds: dict[str, Any] = {}
        for name, i, negated in self.binds:
            tok = literals[i]
            if tok[0] == "'" or tok[0] == '"':
                binds[name] = literal_value(tok)
            else:
                binds[name] = -int(tok) if negated else int(tok)
        text = self.text
        if text is None:
            text = "".join(p if isinstance(p, str) else literals[p] for p in self.parts)
        return text, binds


class Shapes:
    """:func:`bind_literals` with its decisions kept per statement shape (see the module).

    One per listener process (module level: the listener's connections share it);
    used from the event loop's thread only."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._recipes: dict[tuple[str, str], _Recipe | str] = {}
        #: statements bound from a known shape, and shapes learned (for tests and benches)
        self.hits = 0
        self.learned = 0

    def bind(self, sql: str) -> tuple[str, dict[str, Any]] | None:
        """What ``bind_literals(sql)`` returns, from the shape's recipe when known."""
        if "/*" in sql or "--" in sql or "#" in sql or "\x00" in sql:
            return bind_literals(sql)
        pieces = _LITERAL.split(sql)  # text, literal, text, ...: the literals at odd places
        if len(pieces) == 1:
            return bind_literals(sql)
        literals = pieces[1::2]
        kinds = "".join([tok[0] for tok in literals]).translate(_KINDS)
        if "'" in kinds or '"' in kinds:
            for tok in literals:
                if tok[0] in "'\"" and (":" in tok or "select" in tok.lower()):
                    return bind_literals(sql)
        key = ("\x00".join(pieces[0::2]), kinds)
        recipe = self._recipes.get(key)
        if recipe is None:
            recipe = self._learn(sql, key, literals)
        else:
            self.hits += 1
        if recipe is _NOTHING:
            return None
        if recipe is _SCAN:
            return bind_literals(sql)
        assert isinstance(recipe, _Recipe)
        return recipe.apply(literals)

    def _learn(self, sql: str, key: tuple[str, str], literals: list[str]) -> _Recipe | str:
        """The recipe of ``sql``'s shape, worked out on its markers, checked on ``sql``."""
        pieces = _LITERAL.split(sql)
        markers: dict[str, int] = {}
        for i, tok in enumerate(literals):
            if tok[0] in "'\"":
                marker = f"{tok[0]}\x01{i}\x01{tok[0]}"
                markers[f"\x01{i}\x01"] = i
            else:
                marker = str(_BASE + i)
            pieces[2 * i + 1] = marker
        recipe: _Recipe | str
        bound = bind_literals("".join(pieces))
        if bound is None:
            recipe = _NOTHING if bind_literals(sql) is None else _SCAN
        else:
            recipe = self._recipe(bound, markers, len(literals))
            if isinstance(recipe, _Recipe) and recipe.apply(literals) != bind_literals(sql):
                recipe = _SCAN
        if len(self._recipes) >= self.capacity:
            self._recipes.clear()
        self._recipes[key] = recipe
        self.learned += 1
        return recipe

    @staticmethod
    def _recipe(bound: tuple[str, dict[str, Any]], markers: dict[str, int],
                count: int) -> _Recipe | str:
        text, values = bound
        binds: list[tuple[str, int, bool]] = []
        for name, value in values.items():
            if type(value) is int and _BASE <= abs(value) < _BASE + count:
                binds.append((name, abs(value) - _BASE, value < 0))
            elif type(value) is str and value in markers:
                binds.append((name, markers[value], False))
            else:
                return _SCAN
        # literals left in place: their markers in the text, copied back from the statement
        left = _LITERAL.split(text)
        parts: list[str | int] = []
        for j, piece in enumerate(left):
            if j % 2 == 0:
                parts.append(piece)
                continue
            inner = piece[1:-1] if piece[0] in "'\"" else None
            if inner is not None and inner in markers:
                parts.append(markers[inner])
            elif inner is None and _BASE <= int(piece) < _BASE + count:
                parts.append(int(piece) - _BASE)
            else:
                return _SCAN  # (a literal the markers did not make: never the case)
        return _Recipe(parts, binds)


#: the listener's shapes (all its connections')
SHAPES = Shapes()
