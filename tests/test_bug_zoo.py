"""The bug zoo through the capture matrix: each op breaks in exactly its expected configurations, with its
finding, and matches eager in every other; the correct op matches on every row of the fixed capture path
(and, asking for its metadata strictly, fails loudly where the legacy path captures it without any)."""

from __future__ import annotations

import pytest

from cglab import bug_zoo
from cglab.capture_matrix import CASES, padding_changes, run_capture_matrix
from cglab.config import ToyConfig

LEGACY_COMPILED = ("piecewise/compiled/legacy/uniform_decode", "full_and_piecewise/compiled/legacy/chunked_prefill")
STRICT = dict.fromkeys(LEGACY_COMPILED, "error")  # MissingMetadataError at capture: loud, not silent
CHUNKED_PIECEWISE = (
    "piecewise/compiled/fixed/chunked_prefill",
    "piecewise/breakable/fixed/chunked_prefill",
    "full_and_piecewise/compiled/fixed/chunked_prefill",
)
PADDED = (
    "full/-/fixed/padded",
    "piecewise/compiled/fixed/padded",
    "piecewise/breakable/legacy/padded",
    "piecewise/breakable/fixed/padded",
    *CHUNKED_PIECEWISE,
)
COMPILED_PIECEWISE = (
    "piecewise/compiled/fixed/uniform_decode",
    "piecewise/compiled/fixed/padded",
    "piecewise/compiled/fixed/chunked_prefill",
    "full_and_piecewise/compiled/fixed/chunked_prefill",
)
GRAPH_ROWS = tuple(c.key for c in CASES if c.key not in LEGACY_COMPILED)

# kind -> {row key: verdict} of every row that does not match eager, and the finding those rows share
EXPECTED: dict[str, tuple[dict[str, str], str | None]] = {
    "window": (STRICT, None),
    "guard_49364": (dict.fromkeys(LEGACY_COMPILED, "diverged"), "no attention metadata at capture"),
    "python_int_48892": ({**STRICT, **dict.fromkeys(CHUNKED_PIECEWISE, "diverged")}, "a Python value frozen"),
    "fresh_tensor": ({**STRICT, **dict.fromkeys(GRAPH_ROWS, "diverged")}, "an address baked at capture"),
    "real_batch_49302": ({"full/-/fixed/padded": "diverged"}, "a padded request read as real"),
    "pad_slot": ({**STRICT, **dict.fromkeys(PADDED, "diverged")}, "a padded row written"),
    "lazy_plan_42444": ({**STRICT, **dict.fromkeys(COMPILED_PIECEWISE, "diverged")}, "a Python value frozen"),
}


def test_every_zoo_kind_has_its_expectation() -> None:
    assert set(EXPECTED) == set(bug_zoo.ZOO)
    assert [kind for kind, rule in bug_zoo.ZOO.items() if rule is None] == ["window"]


@pytest.mark.parametrize("kind", EXPECTED)
def test_each_op_breaks_exactly_where_expected(kind: str, device: str) -> None:
    failing, finding = EXPECTED[kind]
    matrix = run_capture_matrix(f"{kind},attn", device=device)
    assert {r.case.key: r.verdict for r in matrix.rows if r.verdict != "matches"} == failing
    for row in matrix.rows:
        assert row.replays > 0 or row.verdict == "error", f"{row.case.key}: no graph replayed"
        if row.verdict == "diverged":
            assert row.finding.startswith(finding), f"{row.case.key}: {row.finding}"
        elif row.verdict == "error":
            assert row.finding.startswith("MissingMetadataError: ")
        else:
            assert row.finding is None


def test_padding_changes_a_cache_only_for_the_padding_ops() -> None:
    for pad_requests, expected in ((False, {"pad_slot"}), (True, {"pad_slot", "real_batch_49302"})):
        changed = {
            kind for kind in EXPECTED if padding_changes(ToyConfig(layers=f"{kind},attn"), pad_requests=pad_requests)
        }
        assert changed == expected
