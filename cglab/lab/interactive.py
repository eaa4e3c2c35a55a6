"""ipywidgets controls above an output area that redraws an explorer: what every ``interactive_*`` shares."""

from __future__ import annotations

import base64
import functools
import html
import threading
from collections.abc import Callable, Collection
from typing import Any

from matplotlib.figure import Figure

STILL_LINE = "Run this cell to get the controls."

# What ``interactive``'s ``state`` returns for some control values: the names of the controls that
# change nothing for them, and one line saying why ("" when there is nothing to say).
ControlState = tuple[Collection[str], str]

# One lock for every explorer's redraw: a kernel can run widget callbacks on several threads at once,
# and neither matplotlib (its mathtext parser) nor an Output widget's capture is thread-safe.
_DRAW_LOCK = threading.Lock()


class _Redraw:
    """Calls ``draw`` one at a time; a burst of requests ends in one draw of the newest values."""

    def __init__(self, draw: Callable[[], None]) -> None:
        self._draw = draw
        self._drawing = threading.Lock()
        self._stale = False

    def request(self, _change: Any = None) -> None:
        self._stale = True
        # A request that finds a draw running returns at once: that thread sees the flag after its draw (it
        # checks only once it has released the lock) and draws again with the newest values.
        while self._stale and self._drawing.acquire(blocking=False):
            try:  # a request during this draw marks it stale: this thread then draws once more
                self._stale = False
                with _DRAW_LOCK:
                    self._draw()
            finally:
                self._drawing.release()  # a failed draw must not wedge later redraws


def still_html(figure: Figure | None) -> str:
    """What an explorer shows where its widget cannot be drawn: ``STILL_LINE`` above ``figure``."""
    from IPython.core.pylabtools import print_figure

    still = f"<p><b>{STILL_LINE}</b></p>"
    if figure is not None:
        png = base64.b64encode(print_figure(figure, "png")).decode("ascii")
        still += f'<img src="data:image/png;base64,{png}" alt="the explorer\'s plot">'
    return still


class _WithStill:
    """Mixed into an explorer's VBox: its display carries a still of its latest figure too."""

    # JupyterLab shows the still in a notebook it did not run itself (fresh from git): it draws no widget there.

    latest_figure: Callable[[], Figure | None]

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = super()._repr_mimebundle_(**kwargs)  # type: ignore[misc]  # the widget's own view
        return {**bundle, "text/plain": STILL_LINE, "text/html": still_html(self.latest_figure())}


@functools.cache
def explorer_type() -> type:
    """The explorers' widget class, made on first use: importing this module needs no ipywidgets."""
    import ipywidgets as widgets

    return type("Explorer", (_WithStill, widgets.VBox), {"__module__": __name__})


def interactive(
    explorer: Callable[..., Figure],
    controls: dict[str, Any],
    *,
    hint: str = "",
    state: Callable[[dict[str, Any]], ControlState] | None = None,
    notes: Callable[..., list[str]] | None = None,
    **fixed: Any,
) -> Any:
    """Controls above ``explorer(**controls, **fixed)`` and ``notes``' lines; ``state``: what to disable, and why."""
    # Not ipywidgets' interactive_output: it draws on every thread at once.
    import ipywidgets as widgets
    from IPython.display import display

    output, status = widgets.Output(), widgets.HTML()
    latest: list[Figure] = []

    def values() -> dict[str, Any]:
        return {name: control.value for name, control in controls.items()}

    def draw() -> None:
        chosen = values()
        with output:  # shows an explorer's exception in the output area, as interactive_output did
            output.clear_output(wait=True)
            latest[:] = [explorer(**chosen, **fixed)]
            display(latest[0])
            for line in notes(**chosen, **fixed) if notes else ():
                print(line)

    redraw = _Redraw(draw)

    def changed(_change: Any = None) -> None:
        if state is not None:  # the controls' state follows a change at once, before the (slower) redraw
            disabled, why = state(values())
            for name, control in controls.items():
                control.disabled = name in disabled
            status.value = f"<small>{html.escape(why)}</small>" if why else ""
        redraw.request()

    for control in controls.values():
        control.observe(changed, "value")
    changed()  # the initial state and figure
    # The row wraps: on a narrow window (a laptop, JupyterLab's file browser open) no control may end up
    # behind a horizontal scrollbar.
    row = widgets.HBox(list(controls.values()), layout=widgets.Layout(flex_flow="row wrap"))
    above = [widgets.HTML(f"<small>{html.escape(hint)}</small>")] if hint else []
    box = explorer_type()([*above, row, *([status] if state else []), output])
    box.latest_figure = lambda: latest[0] if latest else None
    return box
