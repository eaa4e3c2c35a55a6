"""The names a notebook's code cells bind and load, read from their source (``ast``), never run.

``tests/test_notebook_hygiene.py`` uses them to find an exercise that loads a name no earlier cell
defines; the browser test (``tests/test_e2e_lab.py``) to run in JupyterLab only the cells a notebook's
widgets need (``cells_widgets_need``), since nbval runs every cell already.
"""

from __future__ import annotations

import ast
from typing import Any

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"  # the MIME type of a saved widget output


def without_magics(source: str) -> str:
    """The cell's Python: its line magics (``%matplotlib inline``) and shell lines blanked."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def names_bound(tree: ast.AST) -> set[str]:
    """Every name a cell binds anywhere: assignments, for/with/except targets, comprehensions, walrus,
    imports, defs, classes and parameters (a parameter is bound where its body loads it)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
    return bound


def names_loaded(tree: ast.AST) -> set[str]:
    """Every name a cell reads anywhere."""
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def holds_widget(cell: Any) -> bool:
    """A code cell whose saved outputs show a widget."""
    return cell.cell_type == "code" and any(WIDGET_VIEW in output.get("data", {}) for output in cell.outputs)


def cells_widgets_need(cells: list[Any]) -> set[int]:
    """The indices (in ``cells``, markdown cells counted) of the code cells that show a widget, of the
    notebook's first code cell (``setup_notebook()``) and of every earlier code cell that binds a name
    one of those loads, and so on back. Generous where unsure: a cell that binds a wanted name anywhere,
    even inside a function, is kept, and the name stays wanted, so an earlier binding is kept too."""
    code = [index for index, cell in enumerate(cells) if cell.cell_type == "code" and cell.source.strip()]
    kept, wanted = set(), set()
    for index in reversed(code):
        source = cells[index].source
        tree = ast.parse("" if source.lstrip().startswith("%%") else without_magics(source))  # a cell magic: not Python
        if index == code[0] or holds_widget(cells[index]) or names_bound(tree) & wanted:
            kept.add(index)
            wanted |= names_loaded(tree)
    return kept
