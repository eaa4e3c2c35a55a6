"""Prose for second-language readers (issue 35): the express path's and the kit's sentences stay short; the
"Read the code" boxes of 00b and 04 point at files and functions that exist."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from prose import sentences

ROOT = Path(__file__).resolve().parents[1]
MAX_SENTENCE_WORDS = 30
SHORT_PROSE = ["00b_express.ipynb"]
SHORT_DOCS = ["docs/facilitator/answers.md", "docs/facilitator/handout.md", "docs/LAPTOPS.md"]
READ_THE_CODE = ["00b_express.ipynb", "04_missing_metadata_bug.ipynb"]


def _markdown_cells(name: str) -> list[str]:
    cells = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]
    return ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown"]


def test_sentences_end_at_stops_and_blocks_not_at_colons_or_dots_in_code() -> None:
    text = (
        "# A title\n\nOne: two; three. Four (`torch.compile`, 0.4) five!\n- an item, [a link](x.md)\n"
        "- a second item. With two sentences.)\n\n```\nnot. prose.\n```\nLast"
    )
    assert sentences(text) == [
        "A title",
        "One: two; three.",
        "Four (`torch.compile`, 0.4) five!",
        "an item, a link",
        "a second item.",
        "With two sentences.)",
        "Last",
    ]


@pytest.mark.parametrize("name", SHORT_PROSE + SHORT_DOCS)
def test_no_sentence_over_30_words(name: str) -> None:
    texts = _markdown_cells(name) if name.endswith(".ipynb") else [(ROOT / name).read_text(encoding="utf-8")]
    long = [(len(s.split()), s) for text in texts for s in sentences(text) if len(s.split()) > MAX_SENTENCE_WORDS]
    assert not long, f"{name}: sentences over {MAX_SENTENCE_WORDS} words (split them): {long}"


# --- "Read the code": the files and names the boxes point at exist ------------------------------------

CODE_PATH = re.compile(r"cglab/[\w/]+\.py")
NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?")
# The box's promise: the three files of the mechanism, then the runner, then what to skip.
BOX_FILES = {
    "cglab/cudagraph_utils.py",
    "cglab/layers/sconv.py",
    "cglab/compilation/cuda_graph.py",
    "cglab/runner.py",
    "cglab/graphs/sim.py",
    "cglab/__init__.py",
}


def _definitions(path: Path) -> set[str]:
    """Functions and classes a file defines, and ``Class.method`` for their methods."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{item.name}" for item in node.body if isinstance(item, ast.FunctionDef)}
    return names


def stale_references(box: str, root: Path = ROOT) -> list[str]:
    """What a "Read the code" box names that the code lacks. Each list item or paragraph names files;
    every other code span in it is a name (``func``, ``Class.method``) one of those files defines, or
    a piece of code that one of them contains word for word."""
    problems = []
    for block in re.split(r"\n(?=\s*\d+\.\s)|\n\s*\n", box):
        spans = re.findall(r"`([^`]+)`", block)
        paths = [root / p for s in spans for p in CODE_PATH.findall(s)]
        problems += [f"no file {p.relative_to(root)}" for p in paths if not p.exists()]
        files = [p for p in paths if p.exists()]
        for span in (s for s in spans if not CODE_PATH.search(s)):
            if NAME.fullmatch(span):
                found = any(span in _definitions(p) for p in files)
            else:
                found = any(span in p.read_text(encoding="utf-8") for p in files)
            if not found:
                problems.append(f"`{span}` is not in {[p.relative_to(root).as_posix() for p in files]}")
    return problems


def _read_the_code_box(name: str) -> str:
    cells = _markdown_cells(name)
    boxes = [i for i, cell in enumerate(cells) if cell.startswith("## Read the code")]
    assert len(boxes) == 1, f"{name}: one markdown cell starting with '## Read the code' expected, found {len(boxes)}"
    assert cells[boxes[0] + 1].startswith("## Summary"), f"{name}: the 'Read the code' box belongs just before Summary"
    return cells[boxes[0]]


@pytest.mark.parametrize("name", READ_THE_CODE)
def test_read_the_code_points_at_files_and_functions_that_exist(name: str) -> None:
    box = _read_the_code_box(name)
    assert set(CODE_PATH.findall(box)) == BOX_FILES, f"{name}: the box should name exactly {sorted(BOX_FILES)}"
    problems = stale_references(box)
    assert not problems, f"{name}, 'Read the code' is stale: {problems}"


def test_stale_references_sees_a_renamed_function_and_a_vanished_line(tmp_path: Path) -> None:
    (tmp_path / "cglab").mkdir()
    (tmp_path / "cglab" / "a.py").write_text("class K:\n    def run(self):\n        if x is None:\n            pass\n")
    box = (
        "1. `cglab/a.py`: `K.run`, whose `if x is None:` guard.\n2. `cglab/a.py`: `K.walk`, `if y:`.\n\n"
        "Then `cglab/b.py`."
    )
    assert stale_references(box, tmp_path) == [
        "`K.walk` is not in ['cglab/a.py']",
        "`if y:` is not in ['cglab/a.py']",
        "no file cglab/b.py",
    ]


# --- printed source: notebooks print these functions with inspect.getsource -------------------------------

PRINTED_SOURCE_WIDTH = 100  # what a notebook's output area shows beside JupyterLab's file browser


def _printed_functions() -> list[object]:
    from cglab import cudagraph_utils as cu
    from cglab.spec_decode.draft_model import InputFusion

    printed = [cu.prepare_inputs_to_capture, cu.prepare_inputs_to_capture_legacy, cu.prepare_capture_metadata]
    return [*printed, cu._prepare_dummy, InputFusion.forward]


@pytest.mark.parametrize("function", _printed_functions(), ids=lambda f: getattr(f, "__qualname__", "?"))
def test_printed_functions_fit_the_notebook_output_area(function: object) -> None:
    import inspect

    long = [line for line in inspect.getsource(function).splitlines() if len(line) > PRINTED_SOURCE_WIDTH]
    assert not long, f"lines over {PRINTED_SOURCE_WIDTH} characters, which a notebook prints wrapped: {long}"
