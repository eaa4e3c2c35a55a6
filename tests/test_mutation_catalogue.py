"""tools/mutations.toml still applies: each planted bug's text occurs once in its file, and the tests
meant to catch it exist. A refactor that moves the text shows here, in ``make test``, rather than as
NOT APPLIED the next time someone runs the (minutes long) mutation tool."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

if sys.version_info < (3, 11):
    pytest.skip("tools/mutations.py reads its catalogue with tomllib (Python 3.11+)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutations_tool", ROOT / "tools" / "mutations.py")
mutations = sys.modules["mutations_tool"] = importlib.util.module_from_spec(_spec)  # its dataclass looks it up
_spec.loader.exec_module(mutations)

CATALOGUE = mutations.load_mutations()


def test_the_catalogue_has_one_entry_per_name() -> None:
    names = [m.name for m in CATALOGUE]
    assert len(names) == len(set(names)) == 60


@pytest.mark.parametrize("mutation", CATALOGUE, ids=lambda m: m.name)
def test_each_mutation_still_applies(mutation: mutations.Mutation) -> None:
    source = (ROOT / mutation.path).read_text()
    assert source.count(mutation.old) == 1, f"update {mutation.name}'s old text in tools/mutations.toml"
    assert mutation.new != mutation.old and mutation.tests
    missing = [test for test in mutation.tests if not (ROOT / test).is_file()]
    assert not missing, f"{mutation.name} names test files that do not exist: {missing}"
