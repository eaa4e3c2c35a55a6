"""The Chinese edition (notebooks/zh/, issue 35): generated from the English files and notebooks/zh/po/ by
tools/translations.py (``make zh``). A translation whose English changed fails here, naming the file, the cell
or line, and the command that updates it; so does a committed file that differs from what the generator makes.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

polib = pytest.importorskip("polib", reason="the translation files need polib (make installs it)")

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("translations", ROOT / "tools" / "translations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["translations"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


translations = _load()
DOCUMENTS = translations.DOCUMENTS
by_document = pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: d.target.removeprefix("notebooks/zh/"))


@by_document
def test_every_translation_is_current(doc) -> None:
    _, problems = translations.build(doc)
    assert not problems, "\n".join(problems)


@by_document
def test_the_committed_files_are_what_the_generator_makes(doc) -> None:
    text, _ = translations.build(doc)
    committed = (ROOT / doc.target).read_text(encoding="utf-8")
    assert committed == text, f"{doc.target} is not what {doc.source} and {doc.po} make now: run `make zh`"


@by_document
def test_every_po_entry_records_the_hash_of_its_english(doc) -> None:
    for entry in [e for e in polib.pofile(str(ROOT / doc.po)) if not e.obsolete]:  # obsolete: kept, not used
        recorded = entry.msgctxt.split()[-1]
        assert recorded == translations.text_hash(entry.msgid), f"{doc.po}: {entry.msgctxt} does not hash its msgid"
        assert "fuzzy" not in entry.flags and entry.msgstr.strip(), f"{doc.po}: {entry.msgctxt} is not translated"


# --- the break a maintainer meets: an English cell edited, its translation not ----------------------------------


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of every English file and PO file the generator reads, which it then reads instead."""
    for doc in DOCUMENTS:
        for relative in (doc.source, doc.po, doc.target):
            (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / relative, tmp_path / relative)
    monkeypatch.setattr(translations, "ROOT", tmp_path)
    return tmp_path


def _edit_notebook_cell(path: Path, cell_id: str, old: str, new: str) -> None:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    cell = next(c for c in notebook["cells"] if c["id"] == cell_id)
    source = "".join(cell["source"])
    assert old in source
    cell["source"] = source.replace(old, new, 1)
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def test_an_english_cell_edited_alone_fails_with_the_cell_and_the_command(scratch: Path) -> None:
    doc = next(d for d in DOCUMENTS if d.source.endswith("04_missing_metadata_bug.ipynb"))
    _edit_notebook_cell(scratch / doc.source, "e23519aa", "16 decode steps", "12 decode steps")
    _, problems = translations.build(doc)
    named = "cell e23519aa ('That holds for attention, not for the other…')"  # its first words: no heading
    assert problems == [
        f"{doc.source} {named}: changed since it was translated; run `.venv/bin/python "
        f"tools/translations.py update`, translate the entries it marks fuzzy or leaves empty in "
        f"{doc.po}, then `make zh`"
    ]
    assert translations.main(["check"]) == 1

    notes = translations.update(doc)  # keeps the old translation as a start, flags it, shows the old English
    assert notes == [f"{doc.po}: fuzzy, the English changed: {named}"]
    entry = next(e for e in polib.pofile(str(scratch / doc.po)) if e.msgctxt.startswith("e23519aa "))
    assert "fuzzy" in entry.flags and "16 decode steps" in entry.previous_msgid and "12 decode steps" in entry.msgid
    _, problems = translations.build(doc)
    assert len(problems) == 1 and f"{named}: its translation is marked fuzzy" in problems[0]

    catalog = polib.pofile(str(scratch / doc.po))
    entry = next(e for e in catalog if e.msgctxt.startswith("e23519aa "))
    entry.msgstr, entry.flags = entry.msgstr.replace("16 个 decode step", "12 个 decode step"), []
    catalog.save()
    text, problems = translations.build(doc)
    assert problems == [] and "12 个 decode step" in text


def _entry(path: Path, cell_id: str) -> polib.POEntry:
    return next(e for e in polib.pofile(str(path)) if e.msgctxt.startswith(f"{cell_id} ") and not e.obsolete)


def test_the_fuzzy_entrys_previous_msgid_is_the_english_its_translation_translates(scratch: Path) -> None:
    """Another sync before the translator comes keeps the previous msgid; a second edit keeps the first
    English, the one the old translation was written for, not the intermediate one."""
    doc = next(d for d in DOCUMENTS if d.source.endswith("04_missing_metadata_bug.ipynb"))
    _edit_notebook_cell(scratch / doc.source, "e23519aa", "16 decode steps", "12 decode steps")
    translations.update(doc)
    assert translations.update(doc) == []  # nothing changed: no note, and the fuzzy entry stays as it is
    entry = _entry(scratch / doc.po, "e23519aa")
    assert "fuzzy" in entry.flags and "16 decode steps" in entry.previous_msgid
    assert '#| msgid "' in (scratch / doc.po).read_text(encoding="utf-8")

    _edit_notebook_cell(scratch / doc.source, "e23519aa", "12 decode steps", "10 decode steps")
    translations.update(doc)
    entry = _entry(scratch / doc.po, "e23519aa")
    assert "10 decode steps" in entry.msgid and "16 decode steps" in entry.previous_msgid
    assert "16 个 decode step" in entry.msgstr


def test_a_cell_whose_id_changed_keeps_its_translation(scratch: Path) -> None:
    doc = next(d for d in DOCUMENTS if d.source.endswith("04_missing_metadata_bug.ipynb"))
    path = scratch / doc.source
    path.write_text(path.read_text(encoding="utf-8").replace('"id": "e23519aa"', '"id": "c0ffee00"'), encoding="utf-8")
    before = _entry(scratch / doc.po, "e23519aa")
    _, problems = translations.build(doc)
    assert len(problems) == 1 and "cell c0ffee00 ('That holds for attention" in problems[0]

    notes = translations.update(doc)  # the same English under a new id: its translation, not fuzzy
    assert notes == [
        f"{doc.po}: kept, the same English under a new msgctxt (was {before.msgctxt}): "
        "cell c0ffee00 ('That holds for attention, not for the other…')"
    ]
    entry = _entry(scratch / doc.po, "c0ffee00")
    assert entry.msgstr == before.msgstr and entry.msgid == before.msgid and "fuzzy" not in entry.flags
    assert not [e for e in polib.pofile(str(scratch / doc.po)) if e.obsolete]
    text, problems = translations.build(doc)
    cell = next(c for c in json.loads(text)["cells"] if c["id"] == "c0ffee00")
    assert problems == [] and "".join(cell["source"]) == before.msgstr


def test_an_entry_whose_english_is_gone_stays_obsolete_and_comes_back(scratch: Path) -> None:
    doc = next(d for d in DOCUMENTS if d.source.endswith("04_missing_metadata_bug.ipynb"))
    path, po = scratch / doc.source, scratch / doc.po
    english, before = path.read_text(encoding="utf-8"), _entry(po, "ebf50a30")
    notebook = json.loads(english)
    notebook["cells"] = [c for c in notebook["cells"] if c["id"] != "ebf50a30"]
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert translations.update(doc) == [f"{doc.po}: obsolete, kept as #~ (its English is gone): {before.msgctxt}"]
    assert f'#~ msgctxt "{before.msgctxt}"' in po.read_text(encoding="utf-8")
    obsolete = [e for e in polib.pofile(str(po)) if e.obsolete]
    assert [(e.msgctxt, e.msgstr) for e in obsolete] == [(before.msgctxt, before.msgstr)]
    assert translations.update(doc) == []  # and it stays there, sync after sync

    path.write_text(english, encoding="utf-8")  # the cell comes back: so does its translation
    assert translations.update(doc) == []
    assert not [e for e in polib.pofile(str(po)) if e.obsolete]
    assert _entry(po, "ebf50a30").msgstr == before.msgstr
    assert translations.build(doc)[1] == []


def test_a_stale_cell_is_named_by_its_heading(scratch: Path) -> None:
    doc = next(d for d in DOCUMENTS if d.source.endswith("04_missing_metadata_bug.ipynb"))
    _edit_notebook_cell(scratch / doc.source, "041f39c5", "already safe", "always safe")
    _, problems = translations.build(doc)
    assert len(problems) == 1
    assert problems[0].startswith(f"{doc.source} cell 041f39c5 ('Breakable PIECEWISE was always safe'): changed")


def test_check_fails_on_a_generated_file_that_differs_from_what_the_sources_make(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = scratch / "notebooks" / "zh" / "handout.md"
    target.write_text(target.read_text(encoding="utf-8").replace("一页纸", "两页纸"), encoding="utf-8")
    assert translations.main(["check"]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "notebooks/zh/handout.md is not what the English and notebooks/zh/po/handout.po make now: run `make zh`"
    ]
    assert "OK" not in out
    assert translations.main(["build"]) == 0 and translations.main(["check"]) == 0


def test_check_prints_one_ok_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert translations.main(["check"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and len(out.splitlines()) == 1 and out.startswith("translations OK: the ")


def test_the_generated_notes_link_the_heading_their_cut_is_under(scratch: Path) -> None:
    """A note's anchor is the heading at (or nearest to) the cut, so renaming that heading moves the link with
    it; a cut at a code cell (zh 00) or a bold line (zh 04's end, under Explore) links the nearest heading."""
    doc = next(d for d in DOCUMENTS if d.target.endswith("00_glossary.ipynb"))
    _edit_notebook_cell(scratch / doc.source, "d5b2fb27", "## Glossary", "## Glossary of terms")
    text, problems = translations.build(doc)
    assert "../00_welcome.ipynb#Glossary-of-terms)" in text and not [p for p in problems if "names no heading" in p]
    welcome = next(d for d in DOCUMENTS if d.target.endswith("zh/00_welcome.ipynb"))
    assert "../00_welcome.ipynb#Your-environment)" in translations.build(welcome)[0]
    bug = next(d for d in DOCUMENTS if d.target.endswith("zh/04_missing_metadata_bug.ipynb"))
    assert "../04_missing_metadata_bug.ipynb#Explore)" in translations.build(bug)[0]


def test_anchors_are_read_as_jupyterlab_and_a_code_host_make_them() -> None:
    doc = next(d for d in DOCUMENTS if d.target.endswith("04_missing_metadata_bug.ipynb"))
    good = (
        "[a](../04_missing_metadata_bug.ipynb#The-fix) [b](../01_cuda_graphs_101.ipynb#Static-buffers:-copy_,"
        "-never-rebinding) [c](../../CONTRIBUTING.md#the-chinese-edition-make-zh) [d](https://x.org/a.md#Nowhere)"
    )
    assert translations.anchor_problems(good, doc) == []
    bad = translations.anchor_problems("[e](../04_missing_metadata_bug.ipynb#The-fixes)", doc)
    assert len(bad) == 1 and "the link ../04_missing_metadata_bug.ipynb#The-fixes names no heading" in bad[0]


def test_an_edited_markdown_paragraph_keeps_its_translation_as_a_fuzzy_start(scratch: Path) -> None:
    doc = next(d for d in DOCUMENTS if d.source.endswith("handout.md"))
    path = scratch / doc.source
    path.write_text(
        path.read_text(encoding="utf-8").replace("wrong outputs, no error.", "wrong outputs, no error!"),
        encoding="utf-8",
    )
    _, problems = translations.build(doc)
    assert len(problems) == 1 and problems[0].startswith(f"{doc.source} line 3 ('**The bug in two sentences.**")
    notes = translations.update(doc)
    assert len(notes) == 1 and notes[0].startswith(f"{doc.po}: fuzzy, the English changed: line 3 ('**The bug in")
    fuzzy = [e for e in polib.pofile(str(path.parents[2] / doc.po)) if "fuzzy" in e.flags]
    assert len(fuzzy) == 1 and fuzzy[0].msgstr.startswith("**两句话讲清 bug。**")


def test_a_new_english_cell_is_an_empty_entry_and_the_rest_stays(scratch: Path) -> None:
    doc = next(d for d in DOCUMENTS if d.source.endswith("00b_express.ipynb"))
    notebook = json.loads((scratch / doc.source).read_text(encoding="utf-8"))
    notebook["cells"].insert(3, {"cell_type": "markdown", "id": "n3wce11", "metadata": {}, "source": ["A new note."]})
    (scratch / doc.source).write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert translations.update(doc) == [f"{doc.po}: new, to translate: cell n3wce11 ('A new note.')"]
    text, problems = translations.build(doc)
    assert problems == [
        f"{doc.source} cell n3wce11 ('A new note.'): not translated yet; " + translations.FIX.format(po=doc.po)
    ]
    assert "A new note." in text and "快速路径" in text  # English where there is no translation, Chinese elsewhere


# --- the pieces --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", [d for d in DOCUMENTS if not d.is_notebook], ids=lambda d: d.source)
def test_markdown_units_put_the_file_back_together(doc) -> None:
    text = (ROOT / doc.source).read_text(encoding="utf-8")
    units = translations.markdown_units(text)
    assert "\n".join(u.text for u in units) == text
    verbatim = [u.text for u in units if not u.translatable and u.text.strip()]
    assert all(v.startswith(("```", "<!--", "|-")) for v in verbatim), verbatim


def test_lint_names_a_lost_marker_code_span_or_link() -> None:
    english = "- **Run** `make zh` ([CONTRIBUTING](../CONTRIBUTING.md#x))."
    assert translations.lint(english, "- **运行** `make zh`（[说明](../CONTRIBUTING.md)）。") == []
    assert translations.lint(english, "**运行** make zh。") == [
        "does not start with '- ' as the English does",
        "lost `make zh`, link (../CONTRIBUTING.md#x)",
    ]


def test_links_lead_to_the_translation_or_back_to_the_english_file() -> None:
    doc = next(d for d in DOCUMENTS if d.source.endswith("answers.md"))
    text = "[guide](../../notebooks/FACILITATOR.md), [laptops](../LAPTOPS.md), [pr](https://x.org/a.md), [top](#a)"
    assert (
        translations.relink(text, doc) == "[guide](FACILITATOR.md), [laptops](../../docs/LAPTOPS.md), "
        "[pr](https://x.org/a.md), [top](#a)"
    )
    notebook = next(d for d in DOCUMENTS if d.source.endswith("00b_express.ipynb"))
    assert (
        translations.relink("[g](00_welcome.ipynb#Glossary) [w](00_welcome.ipynb#How-to-run-it)", notebook)
        == "[g](00_glossary.ipynb) [w](../00_welcome.ipynb#How-to-run-it)"
    )


# --- the generated files, as a reader meets them ------------------------------------------------------------------


def _texts(doc) -> list[str]:
    """The Markdown a reader of the translation sees: a notebook's markdown cells, or the whole file."""
    path = ROOT / doc.target
    if not doc.is_notebook:
        return [path.read_text(encoding="utf-8")]
    return [
        "".join(c["source"])
        for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
        if c["cell_type"] == "markdown"
    ]


@by_document
def test_relative_links_resolve_from_the_new_folder(doc) -> None:
    links = [link for text in _texts(doc) for link in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text)]
    broken = [link for link in links if "://" not in link and not (ROOT / doc.target).parent.joinpath(link).exists()]
    assert links and not broken, f"{doc.target}: links to nothing: {broken}"


@by_document
def test_the_translation_is_chinese_and_every_pr_is_a_link_at_its_first_mention(doc) -> None:
    text = "\n".join(_texts(doc))
    assert len(re.findall(r"[\u4e00-\u9fff]", text)) > 100, f"{doc.target}: hardly any Chinese"
    links = [(m.start(1), m.end(1), m.group(2)) for m in re.finditer(r"\[([^\]\n]*)\]\(([^)\s]+)\)", text)]
    first: dict[str, int] = {}
    for match in re.finditer(r"#(\d{5})\b", text):
        first.setdefault(match.group(1), match.start())
    unlinked = [
        n
        for n, at in first.items()
        if not any(start <= at < end and url.endswith(f"/{n}") for start, end, url in links)
    ]
    if not doc.source.endswith("handout.md"):  # the printed handout names PRs unlinked, as the English one does
        assert not unlinked, f"{doc.target}: the first mention of these PRs is not a link to them: {unlinked}"


def test_the_glossary_uses_the_digests_words() -> None:
    glossary = "\n".join(_texts(next(d for d in DOCUMENTS if d.target.endswith("00_glossary.ipynb"))))
    pairs = [
        ("CUDA graph", "CUDA 图"),
        ("capture", "捕获"),
        ("replay", "重放"),
        ("Attention metadata", "注意力元数据"),
        ("Speculative decoding", "推测解码"),
    ]
    missing = [
        f"{english} / {chinese}"
        for english, chinese in pairs
        if not re.search(rf"{re.escape(english)}（{re.escape(chinese)}）", glossary)
    ]
    kept = ["FULL", "PIECEWISE", "`for_capture=True`", "Profiling run", "splitting ops"]
    missing += [term for term in kept if term not in glossary]
    assert not missing, f"the Chinese glossary lacks: {missing}"


# "04，*静默偏离*", "**00b，*1 · 复现 bug*：**", "从 *PIECEWISE 的两种捕获方式* 到": the Chinese docs name sections as
# the notebook a reader opens titles them: the Chinese one where it exists, else the English one.
SECTION_REF = re.compile(r"(?<![\w#-])(0[0-6]b?)(?: [^*，\n]{0,30}?)?(?:\*\*)?[，,]\s*(?:从 )?\*([^*]+)\*")


def _headings(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [
        line.lstrip("#").strip()
        for c in cells
        if c["cell_type"] == "markdown"
        for line in "".join(c["source"]).splitlines()
        if line.startswith("#")
    ]


@pytest.mark.parametrize("doc", [d for d in DOCUMENTS if not d.is_notebook], ids=lambda d: d.target)
def test_every_section_a_chinese_doc_names_exists(doc) -> None:
    refs = SECTION_REF.findall((ROOT / doc.target).read_text(encoding="utf-8"))
    stale = []
    for number, section in refs:
        english = next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
        chinese = ROOT / "notebooks" / "zh" / english.name
        headings = _headings(english) + (_headings(chinese) if chinese.exists() else [])
        if not any(section in heading for heading in headings):
            stale.append((number, section))
    assert refs and not stale, f"{doc.target} names sections no notebook has: {stale}"


# --- make zh-check: no torch ---------------------------------------------------------------------------------------


def test_the_check_runs_where_torch_cannot_be_imported() -> None:
    """make zh-check runs in a venv of nbformat and polib alone: the tool imports nothing of the suite's.
    Nor the IRI grammar that the lab's jsonschema extras add (seconds to import; that venv has none)."""
    blocked = ("torch", "cglab", "matplotlib", "numpy", "mistune", "ipywidgets", "rfc3987_syntax")
    code = (
        f"import runpy, sys; sys.modules.update(dict.fromkeys({blocked!r})); sys.argv = ['translations.py', 'check']; "
        "runpy.run_path('tools/translations.py', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("translations OK"), done.stderr[-2000:]


def test_make_zh_check_installs_no_torch_and_pyprojects_pins() -> None:
    """Without the project's venv, make zh-check makes a venv of its two packages, at pyproject.toml's pins."""
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", "zh-check", "VENV=.no-such-venv", "ZH_VENV=.cache/no-such-zh-venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "torch" not in dry and "-m venv .cache/no-such-zh-venv" in dry
    assert dry.splitlines()[-1] == ".cache/no-such-zh-venv/bin/python tools/translations.py check"
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    pins = re.findall(r'"((?:nbformat|polib)[=<>]=[\d.]+)"', pyproject)
    assert len(pins) == 2 and all(f'"{pin}"' in dry for pin in pins), (pins, dry)


# --- the Chinese notebooks are not run or counted a second time ---------------------------------------------------


def test_nbval_and_the_word_cap_leave_the_chinese_notebooks_out() -> None:
    shown = subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "--eval",
            "show-%: ; @echo $($*)",
            "show-NOTEBOOKS",
            "show-ZH_NOTEBOOKS",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    notebooks, chinese = shown.stdout.splitlines()
    assert "notebooks/00b_express.ipynb" in notebooks.split() and "notebooks/zh/" not in notebooks
    assert sorted(chinese.split()) == sorted(d.target for d in DOCUMENTS if d.is_notebook)
    import test_notebook_hygiene

    assert not [p for p in test_notebook_hygiene.NOTEBOOKS if "zh" in p.parts]
