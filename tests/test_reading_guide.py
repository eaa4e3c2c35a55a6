"""README's "Read the engine" table: it names modules that exist, in the order ``cglab/__init__.py``
gives, with line counts that have not drifted (counted as the package's budgets count them)."""

from __future__ import annotations

import re
from pathlib import Path

import cglab

ROOT = Path(__file__).resolve().parents[1]


def _code_lines(path: Path) -> int:
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    skip = {"caching.py"}  # compilation/caching.py is listed under "skip"
    return sum(
        1
        for f in files
        if f.name not in skip
        for line in f.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    )


def _table() -> list[tuple[str, int]]:
    section = (ROOT / "README.md").read_text().split("\n## Read the engine", 1)[1].split("\n## ", 1)[0]
    return [(m, int(n)) for m, n in re.findall(r"^\| `([\w/]+\.py|[\w]+/)` \|.*\| (\d+) \|$", section, re.M)]


def test_the_reading_guide_names_each_module_in_the_package_order() -> None:
    table = _table()
    order = re.search(r"go in README's order \(\"Read the engine\"\): (.*?)\.\n", cglab.__doc__, re.S).group(1)
    assert [m.removesuffix(".py").removesuffix("/") for m, _ in table] == [m.strip() for m in order.split(",")]


def test_the_reading_guide_sizes_have_not_drifted() -> None:
    """Each size within a quarter of the real count, so the table cannot go stale unnoticed."""
    for module, quoted in _table():
        actual = _code_lines(ROOT / "cglab" / module)
        assert abs(actual - quoted) <= quoted / 4, f"README says {module} has {quoted} lines; it has {actual}"
