"""README's size of `make up`'s venv stays true as dependencies change (issue 34 item 9).

`make up` installs the package and its required dependencies (no extras) into a
fresh venv. The size of that closure is measured here from the installed
distributions' own file lists (``RECORD``), so no venv has to be built: the
README's figure must be within 15% of it plus a fresh venv's own pip (whose
size is measured the same way).
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

README = Path(__file__).resolve().parents[2] / "README.md"


def _closure(root: str) -> set[str]:
    """``root`` and every distribution it requires, without extras' optional ones."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = metadata.distribution(todo.pop()).metadata["Name"].lower()
        if name in seen:
            continue
        seen.add(name)
        for raw in metadata.distribution(name).requires or ():
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # an extra's dependency, or not for this platform
            todo.append(req.name)
            for extra in req.extras:  # psycopg[binary]: the extra's own requirements
                for inner in metadata.distribution(req.name).requires or ():
                    sub = Requirement(inner)
                    if sub.marker is not None and sub.marker.evaluate({"extra": extra}) \
                            and not sub.marker.evaluate({"extra": ""}):
                        todo.append(sub.name)
    return seen


def _size(name: str) -> int:
    dist = metadata.distribution(name)
    total = 0
    for f in dist.files or ():
        path = Path(str(dist.locate_file(f)))
        if path.is_file():
            total += path.stat().st_size
    return total


def test_readme_states_the_venv_size_of_make_up() -> None:
    stated = re.search(r"into \.venv \(~(\d+) MB\)", README.read_text())
    assert stated is not None, "README's `make up` line no longer states the venv's size"
    names = _closure("shardgate") | {"pip"}  # a fresh venv holds pip too
    measured = sum(_size(n) for n in names) / 1e6
    assert measured > 50, sorted(names)  # the closure was found (grpcio alone is ~30 MB)
    assert abs(int(stated.group(1)) - measured) <= 0.15 * measured, (
        f"README says ~{stated.group(1)} MB; the packages `make up` installs take "
        f"{measured:.0f} MB: {sorted(names)}"
    )
