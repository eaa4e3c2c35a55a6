"""The package's size budgets, per part, so that a new feature pays for itself.

Lines of code are counted as README's reading guide counts them: every line of ``ruff format``ted code
that is not blank and not only a comment. Run this file as a script to see each part against its budget:
``.venv/bin/python tests/test_budgets.py``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cglab"
MAX_MODULE_LINES = 400
# The helpers a command needs beside the engine: the CLI, the package's entry points, and the trace cache
# that only tests and notebooks install.
FRONT = {"cli.py", "_arguments.py", "__main__.py", "__init__.py", "_interrupt.py", "_lazy.py", "compilation/caching.py"}
REPRO = {"repro.py", "repro_report.py"}
# A user's layer kinds and the capture matrix that checks them; the bug zoo that the matrix diagnoses.
PLUGINS = {"layer_registry.py", "capture_matrix.py", "matrix_cli.py"}
ZOO = {"bug_zoo.py"}
# part: (budget, does this module, relative to cglab/, belong to it)
PARTS = {
    # the engine's top-level modules and three of its packages
    "core a learner reads": (
        3180,
        lambda m: (
            m not in FRONT | REPRO | PLUGINS | ZOO
            and ("/" not in m or m.split("/")[0] in {"compilation", "layers", "graphs"})
        ),
    ),
    "repro": (370, lambda m: m in REPRO),
    "plug-ins: layer registry and capture matrix": (450, lambda m: m in PLUGINS),
    "bug zoo": (300, lambda m: m in ZOO),
    "spec_decode": (650, lambda m: m.startswith("spec_decode/")),
    "kernels": (800, lambda m: m.startswith("kernels/")),
    "bench": (1350, lambda m: m.startswith("bench/")),
    "lab": (1300, lambda m: m.startswith("lab/")),
    "CLI, entry points, helpers, trace cache": (500, lambda m: m in FRONT),
}
WHOLE_PACKAGE = 8880


def code_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))


def modules() -> dict[str, Path]:
    return {p.relative_to(PACKAGE).as_posix(): p for p in sorted(PACKAGE.rglob("*.py"))}


def part_of(module: str) -> str:
    owners = [name for name, (_, owns) in PARTS.items() if owns(module)]
    assert len(owners) == 1, f"{module} belongs to {owners or 'no part'}: say which part in tests/test_budgets.py"
    return owners[0]


def sizes() -> dict[str, int]:
    totals = dict.fromkeys(PARTS, 0)
    for module, path in modules().items():
        totals[part_of(module)] += code_lines(path)
    return totals


@pytest.mark.parametrize("part", PARTS)
def test_each_part_stays_within_its_budget(part: str) -> None:
    budget = PARTS[part][0]
    assert sizes()[part] <= budget, f"{part}: {sizes()[part]} lines of code, over its budget of {budget}"


def test_the_whole_package_stays_within_its_budget() -> None:
    assert sum(sizes().values()) <= WHOLE_PACKAGE


@pytest.mark.parametrize("module", modules())
def test_each_module_stays_under_400_lines(module: str) -> None:
    lines = len(modules()[module].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module} has {lines} lines: split it by concept, or make it smaller"


def _imports(module: str, path: Path) -> set[str]:
    """The cglab modules ``module`` imports, at the top or inside a function."""
    names = set(modules())
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cglab"):
            base = node.module.replace(".", "/").removeprefix("cglab").strip("/")
            for alias in node.names:  # `from cglab.x import y`: y may be a module of its own
                sub = f"{base}/{alias.name}".strip("/")
                found.add(f"{sub}.py" if f"{sub}.py" in names else _module_file(base, names))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("cglab"):
                    found.add(_module_file(alias.name.replace(".", "/").removeprefix("cglab").strip("/"), names))
    return {m for m in found if m and m != module}


def _module_file(base: str, names: set[str]) -> str:
    return f"{base}.py" if f"{base}.py" in names else f"{base}/__init__.py".lstrip("/")


def test_no_two_modules_import_each_other() -> None:
    """No import cycle between cglab's modules, counting imports inside functions (a package's
    ``__init__`` that re-exports its modules is left out: importing a module never needs it back)."""
    graph = {m: {i for i in _imports(m, p) if not i.endswith("__init__.py")} for m, p in modules().items()}
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    cycles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles)))


def test_the_engine_reads_in_small_pieces() -> None:
    """The set-up a learner reads before the first step, and the signatures the configs narrowed."""
    import inspect

    from cglab.compilation.wrapper import build_forward_model
    from cglab.compilation_config import CompilationConfig
    from cglab.repro import run_repro
    from cglab.runner import ModelRunner
    from cglab.spec_decode import run_spec_repro

    init = inspect.getsource(ModelRunner.__init__).splitlines()
    body = [line for line in init if line.strip() and not line.strip().startswith("#")]
    assert len(body) <= 35, f"ModelRunner.__init__ has {len(body)} lines of code"
    assert len(inspect.signature(build_forward_model).parameters) <= 3
    for run in (run_repro, run_spec_repro):
        first = next(iter(inspect.signature(run).parameters.values()))
        assert "CompilationConfig" in str(first.annotation), f"{run.__name__} takes {first}"
    assert CompilationConfig.resolve.__qualname__ == "CompilationConfig.resolve"


if __name__ == "__main__":
    for part, total in sizes().items():
        print(f"{total:6d} / {PARTS[part][0]:5d}  {part}")
    print(f"{sum(sizes().values()):6d} / {WHOLE_PACKAGE:5d}  whole package")
    sys.exit(0)
