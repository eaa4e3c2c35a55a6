"""README's picture: the silent divergence, drawn from a real run (``make picture``).

    python tools/readme_picture.py [--out docs/divergence.png]

Runs the toy engine on the CPU simulator twice, compiled PIECEWISE captured the old way
(``legacy_skip_attn=True``) and the fixed way, each against the same model run eagerly, and draws
both with the suite's own plotting code: the figure of notebook 04, *The silent divergence*
(``cglab.lab.widgets.divergence_explorer``). Nothing is drawn by hand; rerun it when the engine or
the plot changes, and commit the PNG.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # a file, not a window: chosen before anything imports pyplot

from cglab.lab.notebook import setup_notebook
from cglab.lab.widgets import divergence_explorer

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "divergence.png",
                        help="where to write the PNG (default docs/divergence.png)")
    args = parser.parse_args(argv)
    device = setup_notebook("cpu")  # one thread, the simulator: the run the committed notebooks show
    figure = divergence_explorer("piecewise", legacy=True, flavor="compiled", device=device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # No "Software" stamp: the file changes only when the picture does.
    figure.savefig(args.out, format="png", metadata={"Software": None})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
