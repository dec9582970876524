"""The package has no import cycles, and every part of it has a layer.

import-linter's ``acyclic_siblings`` contract (``make lint``) checks cycles
between the siblings of each package; a cycle through a package's
``__init__`` is not between siblings, so this test looks at the whole module
graph (every import, also under ``TYPE_CHECKING`` and inside functions) and
fails on any strongly connected component of more than one module.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import grimp
import pytest

import shardgate

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = []
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work.append((root, sorted(graph.find_modules_directly_imported_by(root))))
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.find_modules_directly_imported_by(nxt))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("shardgate", cache_dir=None)


def test_no_import_cycles(graph: grimp.ImportGraph) -> None:
    cycles = import_cycles(graph)
    assert cycles == [], "import cycles (move the shared code down a layer): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_cycle_finder_finds_cycles() -> None:
    g = grimp.ImportGraph()
    for name in ("p", "p.a", "p.b", "p.c", "p.d"):
        g.add_module(name)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.c")
    g.add_import(importer="p.c", imported="p.a")
    g.add_import(importer="p.c", imported="p.d")
    g.add_import(importer="p", imported="p.d")
    assert import_cycles(g) == [["p.a", "p.b", "p.c"]]


def test_every_top_level_module_has_a_layer() -> None:
    """A new package (``workflows/``, ``auth/``...) must be placed in the layers contract."""
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    placed = {part.strip() for layer in layers for part in layer.split("|")}
    root = Path(shardgate.__file__).parent
    children = {
        p.stem for p in root.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    assert sorted(children - placed) == [], "add these to the layers contract in pyproject.toml"


#: what names the trusted path (shardgate.ports.Trusted / auth.identity.TRUSTED)
_TRUSTED_NAMES = frozenset({"TRUSTED", "Trusted", "trusted_session"})


def trusted_uses(source: str) -> list[str]:
    """Where ``source`` could reach the gate without the caller's identity: a name,
    attribute, import or string naming the trusted marker, a ``.session(...)`` call
    (or the gate's ``update_stream`` / ``explain_shards``, which default to or open
    sessions) without ``identity=``, or a gate ``Session(...)`` built directly."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        match node:
            case ast.Name(id=name) | ast.Attribute(attr=name) if name in _TRUSTED_NAMES:
                found.append(f"{line}: {name}")
            case ast.alias(name=name) if name.rpartition(".")[2] in _TRUSTED_NAMES:
                found.append(f"{line}: import {name}")
            case ast.Constant(value=str() as text) if text in _TRUSTED_NAMES:
                found.append(f"{line}: {text!r}")
            case ast.Call(func=ast.Attribute(attr="session"), keywords=kws) if not any(
                    k.arg == "identity" for k in kws):
                found.append(f"{line}: .session() without identity=")
            case ast.Call(func=ast.Attribute(attr=("update_stream" | "explain_shards") as name,
                                             value=ast.Name(id="gate")
                                             | ast.Attribute(attr="gate")),
                          keywords=kws) if not any(k.arg == "identity" for k in kws):
                found.append(f"{line}: gate.{name}() without identity=")
            case ast.Call(func=ast.Attribute(attr="Session", value=ast.Attribute(attr="_stub"))):
                pass  # the gate's Session RPC: a call carrying the caller's credential
            case ast.Call(func=ast.Name(id="Session") | ast.Attribute(attr="Session")):
                found.append(f"{line}: Session(...) built directly")
    return sorted(found, key=lambda f: int(f.partition(":")[0]))


def test_no_front_door_reaches_the_gate_on_the_trusted_path() -> None:
    """Every door passes the caller's identity (issue 30): nothing under shardgate/api/
    names the trusted marker, opens a session without ``identity=`` or builds one."""
    api = Path(shardgate.__file__).parent / "api"
    offenders = {
        str(path.relative_to(api.parent)): uses
        for path in sorted(api.rglob("*.py"))
        if (uses := trusted_uses(path.read_text()))
    }
    assert offenders == {}, "front doors must pass the caller's Identity to the gate"


def test_the_trusted_path_finder_finds_uses() -> None:
    source = (
        "from shardgate.auth.identity import TRUSTED\n"
        "import shardgate.auth.identity as i\n"
        "s = gate.session('ks', identity=i.TRUSTED)\n"
        "t = gate.session('ks')\n"
        "u = gate.session('ks', identity=caller())\n"
        "v = Session(keyspace='ks', identity=who)\n"
        "w = getattr(i, 'TRUSTED')\n"
        "x = self.gate.update_stream('ks', None, None)\n"
        "y = client.update_stream('ks')\n"
        "z = self._stub.Session(metadata=md)\n"
        "a = self.gates.Session(keyspace='ks')\n"
    )
    assert trusted_uses(source) == [
        "1: import TRUSTED", "3: TRUSTED", "4: .session() without identity=",
        "6: Session(...) built directly", "7: 'TRUSTED'",
        "8: gate.update_stream() without identity=", "11: Session(...) built directly",
    ]
