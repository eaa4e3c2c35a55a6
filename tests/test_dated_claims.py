"""DeepSeek V4 as it really ran, in every doc, notebook, translation, docstring and help text (issue 41).

What vLLM's history says, dated: until PR #43746 (May 2026) DeepSeek V4 was torch-compiled, its compressor
inside the custom op ``vllm::deepseek_v4_attention``; #43746 dropped torch.compile for it and turned
breakable graphs on; at the fix (#49364, July 2026) the compressor ran in an eager break with live
metadata; since #51430 model runner v2 captures it inside the breakable graph. Its guard is plain Python,
in ``DeepseekCompressor.forward``. So no text may put it in a splitting op today, say that it "would be
safe compiled", or liken the toy's custom-op guards to its guard. A sentence may name the op only
beside its date (#43746).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prose import sentences

from cglab.cli import build_parser

polib = pytest.importorskip("polib", reason="the translations need polib (make installs it)")

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "build", ".cache", "node_modules", "__pycache__", "cglab.egg-info"}
SUFFIXES = {".md", ".ipynb", ".po", ".py", ".txt", ".toml", ".cfg", ".yml", ".json"}

DSV4 = re.compile(r"DeepSeek[- ]?V4|\bDS ?V4\b|deepseek_v4", re.IGNORECASE)
SPLITTING = re.compile(r"splitting[ _-]?op|切分点|切分算子", re.IGNORECASE)
NEGATED = re.compile(r"\b(?:not|never|no|none)\b|n't|43746|不|没有|并非", re.IGNORECASE)
SAFE_COMPILED = re.compile(
    r"safe[^.。]{0,20}compiled|compiled[^.。]{0,12}\btoo\b|编译[^。]{0,12}(?:也|仍)[^。]{0,6}安全"
)
CUSTOM_OP_GUARD = re.compile(r"custom op|自定义算子|guard", re.IGNORECASE)
LIKENESS = re.compile(
    r"\bas (?:in )?DeepSeek[- ]?V4(?:'s)? (?:does|is|do|attention op is)\b|\blike DeepSeek[- ]?V4's\b"
    r"|(?:像|如同|和|与)\s*DeepSeek[- ]?V4\s*(?:的\s*)?(?:一样|那样)",
    re.IGNORECASE,
)


def _unnegated(sentence: str, a: re.Pattern[str], b: re.Pattern[str]) -> bool:
    """Whether ``sentence`` names both, with no negation or date between them ("DeepSeek V4 is not ...")."""
    first, second = a.search(sentence), b.search(sentence)
    if not (first and second):
        return False
    start, end = sorted((first.start(), second.start()))
    return not NEGATED.search(sentence, start, end + 1)


# (what is wrong, the test a sentence fails)
WRONG_FORMS: list[tuple[str, Callable[[str], bool]]] = [
    ("names vllm::deepseek_v4_attention without its date (#43746)", lambda s: "deepseek_v4_attention" in s
     and "43746" not in s),
    ("puts DeepSeek V4 in a splitting op", lambda s: _unnegated(s, DSV4, SPLITTING)),
    ("says DeepSeek V4 would be safe compiled", lambda s: bool(DSV4.search(s) and SAFE_COMPILED.search(s))),
    ("likens the toy's custom-op guards to DeepSeek V4's", lambda s: bool(LIKENESS.search(s)
     and CUSTOM_OP_GUARD.search(s))),
]  # fmt: skip


def claims(text: str) -> list[str]:
    """The clauses of ``text`` (Markdown, or Python with its comment marks): sentences cut at semicolons,
    Chinese ones at 。；too."""
    text = re.sub(r"\n\s*#+ ?(?=\S)", "\n", text)  # a comment block reads as one paragraph
    return [part for s in sentences(text) for part in re.split(r"(?<=[。；！？])|;\s", s) if part.strip()]


def wrong_forms(text: str) -> list[str]:
    return [f"{what}: {s!r}" for s in claims(text) for what, fails in WRONG_FORMS if fails(s)]


def _notebook_texts(path: Path) -> Iterator[str]:
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        yield "".join(cell["source"])
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            for text in (output.get("text", ""), data.get("text/plain", ""), data.get("text/markdown", "")):
                yield "".join(text)


def _po_texts(path: Path) -> Iterator[str]:
    for entry in polib.pofile(str(path)):
        if not entry.obsolete:  # an obsolete entry, or a fuzzy one's old English, is history, not a claim
            yield entry.msgid
            yield entry.msgstr


def texts(root: Path) -> Iterator[tuple[str, str]]:
    """(file, text) for every doc, notebook, translation and source file under ``root``, this file aside."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            path = Path(folder, name)
            if path.suffix not in SUFFIXES or path.resolve() == Path(__file__).resolve():
                continue
            where = path.relative_to(root).as_posix()
            if path.suffix == ".ipynb":
                yield from ((where, t) for t in _notebook_texts(path))
            elif path.suffix == ".po":
                yield from ((where, t) for t in _po_texts(path))
            else:
                yield where, path.read_text(encoding="utf-8", errors="replace")


def help_texts() -> Iterator[tuple[str, str]]:
    parser = build_parser()
    yield "python -m cglab --help", parser.format_help()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sub in action.choices.items():
        yield f"python -m cglab {name} --help", sub.format_help()


def test_no_text_in_either_language_carries_a_wrong_deepseek_v4_claim() -> None:
    found = [f"{where}: {problem}" for where, text in [*texts(ROOT), *help_texts()] for problem in wrong_forms(text)]
    assert not found, "DeepSeek V4 as it really ran is in this file's docstring:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "wrong",
    [
        "DeepSeek V4 would be safe compiled too: its compressor runs inside the custom op "
        "`vllm::deepseek_v4_attention`, a default splitting op, eagerly with live metadata.",
        "In `cglab` the guard sits inside the layer's custom op, as DeepSeek V4's does.",
        "The toy's guards sit inside custom ops, as DeepSeek V4's does; Inkling asks in plain Python.",
        "(vLLM runs Inkling and DeepSeek V4 on breakable graphs, and DeepSeek V4's compressor sits inside\n"
        "the splitting op that dynamo never traces).",
        "DeepSeek V4 的压缩器和 LFM2 的短卷积都在 splitting ops 内部（`vllm::short_conv`）。",
        "DeepSeek V4 即使被编译也是安全的。",
        "`cglab` 的 guard 放在自定义算子内部，和 DeepSeek V4 一样。",
        "# DeepSeek V4 keeps its compressor inside the splitting op\n# vllm::deepseek_v4_attention.",
    ],
)
def test_each_wrong_form_is_caught(wrong: str) -> None:
    assert wrong_forms(wrong), wrong


@pytest.mark.parametrize(
    "true",
    [
        "Until #43746 (May 2026) DeepSeek V4 was torch-compiled behind `vllm::deepseek_v4_attention`.",
        "vLLM has not compiled DeepSeek V4 since PR #43746 (May 2026): at the fix its compressor ran in an "
        "eager break with live metadata.",
        "DeepSeek V4 is not an example of a stateful op in a splitting op.",
        "LFM2's short conv (`vllm::short_conv`), the Mamba mixers and linear attention are default splitting ops.",
        "Inkling 和 DeepSeek V4 都用普通 Python 写 guard。LFM2 的短卷积本身就是 splitting op（`vllm::short_conv`）。",
        "`--python-guards` moves the guard out of their custom op, as Inkling and DeepSeek V4 write it.",
    ],
)
def test_the_dated_story_passes(true: str) -> None:
    assert not wrong_forms(true), wrong_forms(true)
