"""README's repro examples and the outcomes ``make test-gpu`` expects of them stay one list."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("test_gpu_driver", ROOT / "tools" / "test_gpu.py")
test_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(test_gpu)


def test_every_readme_repro_example_has_an_expected_exit_status() -> None:
    examples = test_gpu.readme_repro_examples((ROOT / "README.md").read_text())
    assert len(examples) == len(set(examples)) == 14
    assert set(examples) == set(test_gpu.EXPECTED), "README and tools/test_gpu.py's EXPECTED list differ"


def test_examples_are_read_across_continuation_lines_and_without_comments() -> None:
    readme = (
        "intro\n## Headless\n```bash\n.venv/bin/python -m cglab repro --mode full   # a comment\n"
        ".venv/bin/python -m cglab repro --layers a,b \\\n    --steps 3    # more\n"
        "                                  # a comment line\n.venv/bin/python -m cglab repro --help\n"
        "```\n## Next\n.venv/bin/python -m cglab repro --not-this\n"
    )
    assert test_gpu.readme_repro_examples(readme) == ["--mode full", "--layers a,b --steps 3"]
