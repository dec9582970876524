"""Rewriting gate ASTs in time linear in their size.

sqlglot's ``Expression.transform`` re-parents the whole argument list each
time it replaces one element of it (``set(key, value, index)`` walks the
list), so replacing every literal of a 10,000-value IN list costs 10,000²
steps. :func:`transform` has the same contract (pre-order, a replaced node's
children are not visited, the input is copied unless ``copy=False``) but puts
a replacement into its slot in constant time, and walks without recursion, so
deep trees (long AND/OR chains, nested subqueries) never hit Python's
recursion limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlglot import exp


def flatten(node: exp.Expr, kind: type[exp.Connector]) -> Iterator[exp.Expr]:
    """The terms of a chain of ``kind`` (AND or OR), parentheses dropped, left to right.

    Iterative: a chain of 1,000 terms is a tree 1,000 levels deep.
    """
    stack = [node]
    while stack:
        n = stack.pop()
        while isinstance(n, exp.Paren):
            n = n.this
        if isinstance(n, kind):
            stack.append(n.right)
            stack.append(n.left)
        else:
            yield n


def transform(
    tree: exp.Expr, fun: Callable[[exp.Expr], exp.Expr | None], *, copy: bool = True
) -> exp.Expr:
    """``tree`` with each node ``n`` replaced by ``fun(n)`` (linear; see the module doc).

    ``fun`` returns the node itself to keep it (its children are then visited),
    another node to replace it, or None to remove it from its parent.
    """
    root = tree.copy() if copy else tree
    stack: list[exp.Expr] = [root]
    while stack:
        node = stack.pop()
        new = fun(node)
        if new is node:
            stack.extend(node.iter_expressions(reverse=True))
            continue
        if node is root:
            if new is None:
                raise ValueError("transform cannot remove the root of the tree")
            return new
        _put(node, new)
    return root


@contextmanager
def swapped(node: exp.Expr, stand_in: exp.Expr) -> Iterator[None]:
    """Put ``stand_in`` where ``node`` is for the duration of the block, then put it back.

    Lets a caller copy a statement without one large subtree (planning is
    synchronous, so nobody else sees the tree in between).
    """
    _put(node, stand_in)
    try:
        yield
    finally:
        _put(stand_in, node)


def _put(old: exp.Expr, new: exp.Expr | None) -> None:
    """Put ``new`` where ``old`` is in its parent, in O(1) for list slots."""
    parent, key, index = old.parent, old.arg_key, old.index
    assert parent is not None and key is not None
    slot = parent.args.get(key)
    if new is None or index is None or type(slot) is not list or \
            index >= len(slot) or slot[index] is not old:
        parent.set(key, new, index)  # rare cases: sqlglot's own (linear) way
    else:
        slot[index] = new
        new.parent, new.arg_key, new.index = parent, key, index
        _forget_hashes(parent)
    if old.parent is parent:  # (not when ``new`` wraps ``old``)
        old.parent, old.arg_key, old.index = None, None, None


def _forget_hashes(node: exp.Expr | None) -> None:
    """Drop the cached hashes of ``node`` and its ancestors (their subtree changed)."""
    while node is not None and node._hash is not None:
        node._hash = None
        node = node.parent
