"""House rules (issue 33): sizes of modules and classes, and the strings that types replaced.

Each rule is a finder over the package's source; each finder is first shown to find a
planted offence (so a rule that matches nothing by mistake fails here, not silently).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "shardgate"

#: generated modules (protobuf stubs, collation and case tables, function-name lists)
GENERATED = ("_pb2.py", "_pb2_grpc.py", "general_ci.py", "casemap.py", "function_names.py")
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 500

#: (rule, regular expression, the folder where it is allowed: None for nowhere)
STRINGS: list[tuple[str, re.Pattern[str], str | None]] = [
    ("statement type compared as a string (use StatementType)",
     re.compile(r"""==\s*["']DDL["']"""), None),
    ("dialect compared outside the dialect package (ask sql_dialect(d))",
     re.compile(r"""\bdialect\s*(?:==|!=|\bis\b(?:\s+not)?\s+Dialect\.)"""),
     "sql/dialects"),
    ("tablet type compared as a string (use TabletType)",
     re.compile(r"""tablet_type\s*(?:==|!=)\s*["']"""), None),
    ("table type compared as a string (use vschema.TableType)",
     re.compile(r"""\.type\s*(?:==|!=)\s*["'](?:reference|sequence|queue|lookup|normal)["']"""),
     None),
    ("shard name parsed by hand (use keys.ShardId.parse)",
     re.compile(r"""split\(\s*["']/["']\s*,\s*1\s*\)"""), None),
    ("targeted keyspace detected by ':' (use planner.target)",
     re.compile(r"""["']:["']\s+in\s+keyspace\b"""), None),
]


def _modules(root: Path = PACKAGE) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        if not path.name.endswith(GENERATED):
            yield path


def long_modules(paths: list[Path]) -> list[str]:
    """Modules longer than MAX_MODULE_LINES, as 'path: n lines'."""
    out = []
    for path in paths:
        n = len(path.read_text().splitlines())
        if n > MAX_MODULE_LINES:
            out.append(f"{path}: {n} lines")
    return out


def long_classes(paths: list[Path]) -> list[str]:
    """Classes longer than MAX_CLASS_LINES (decorators included), as 'path:Class: n lines'."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                n = (node.end_lineno or node.lineno) - first + 1
                if n > MAX_CLASS_LINES:
                    out.append(f"{path}:{node.name}: {n} lines")
    return out


def string_offences(paths: list[Path]) -> list[str]:
    """Lines matching a rule of STRINGS outside where the rule allows them."""
    out = []
    for path in paths:
        posix = path.as_posix()
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for rule, pattern, allowed in STRINGS:
                if allowed is not None and f"/{allowed}/" in posix:
                    continue
                if pattern.search(code):
                    out.append(f"{path}:{lineno}: {rule}: {line.strip()}")
    return out


# -- the finders find ---------------------------------------------------------------------


def test_the_finders_find_planted_offences(tmp_path: Path) -> None:
    pkg = tmp_path / "shardgate"
    (pkg / "sql" / "dialects").mkdir(parents=True)
    long = pkg / "long.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    long.write_text(f"class Big:\n{body}\n" + "y = 1\n" * (MAX_MODULE_LINES - MAX_CLASS_LINES))
    (pkg / "ok_pb2.py").write_text("z = 1\n" * (MAX_MODULE_LINES + 1))
    bad = pkg / "bad.py"
    bad.write_text(
        'if plan.statement_type == "DDL": pass\n'
        'if backend.dialect == "mysql": pass\n'
        "if d is not Dialect.MYSQL and dialect is Dialect.SQLITE: pass\n"
        'if rec.tablet_type != "primary": pass\n'
        'if t.type == "reference": pass\n'
        'ks, shard = name.split("/", 1)\n'
        'if ":" in keyspace: pass\n'
        '# dialect == "mysql" in a comment is fine\n'
    )
    (pkg / "sql" / "dialects" / "mine.py").write_text('if dialect == "mysql": pass\n')
    paths = list(_modules(pkg))
    assert [p.name for p in paths] == ["bad.py", "long.py", "mine.py"]
    assert long_modules(paths) == [f"{long}: {MAX_MODULE_LINES + 1} lines"]
    assert long_classes(paths) == [f"{long}:Big: {MAX_CLASS_LINES + 1} lines"]
    found = string_offences(paths)
    assert [f.split(":")[1] for f in found] == ["1", "2", "3", "4", "5", "6", "7"], found


# -- the package keeps them ---------------------------------------------------------------


@pytest.mark.parametrize("finder", [long_modules, long_classes, string_offences])
def test_the_package_keeps_the_house_rules(finder: object) -> None:
    assert callable(finder)
    offences = finder(list(_modules()))
    assert offences == [], "\n".join(offences)


def test_the_drivers_contract_names_every_part_but_backends() -> None:
    """import-linter's drivers contract lists its sources by hand: a new top-level part of
    the package must be added to it (only shardgate.backends may import a driver)."""
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"]
                    if c["id"] == "drivers-in-backends")
    parts = {f"shardgate.{p.stem}" for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__")
             or (p.is_dir() and (p / "__init__.py").exists())}
    assert set(contract["source_modules"]) == parts - {"shardgate.backends"}
