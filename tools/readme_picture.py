"""README's picture: the silent divergence, drawn from a real run (``make picture``).

    python tools/readme_picture.py [--out docs/divergence.png]

Runs the toy engine on the CPU simulator twice, compiled PIECEWISE captured the old way
(``legacy_skip_attn=True``) and the fixed way, each against the same model run eagerly, and draws
both with the suite's own plotting code (``cglab.lab.draw.draw_divergence``, the picture of notebook
04, *The silent divergence*). Nothing is drawn by hand; rerun it when the engine or the plot changes,
and commit the PNG.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # a file, not a window: chosen before anything imports pyplot

from cglab import CompilationConfig, run_repro
from cglab.lab.draw import draw_divergence
from cglab.lab.notebook import setup_notebook
from cglab.lab.widgets import verdict

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs" / "divergence.png",
        help="where to write the PNG (default docs/divergence.png)",
    )
    args = parser.parse_args(argv)
    device = setup_notebook("cpu")  # one thread, the simulator: the run the committed notebooks show
    runs = {
        f"{path} capture path": run_repro(CompilationConfig("piecewise", legacy_skip_attn=legacy), device=device)
        for path, legacy in (("old", True), ("fixed", False))
    }
    figure = draw_divergence(runs)
    layers = next(iter(runs.values())).layers
    figure.suptitle(
        f"toy model {layers}, compiled PIECEWISE graphs replayed against the eager model\n"
        + "; ".join(f"{label}: {verdict(result)}" for label, result in runs.items()),
        fontsize=10,
    )
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # No "Software" stamp: the file changes only when the picture does.
    figure.savefig(args.out, format="png", metadata={"Software": None})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
