"""An explorer (controls above a plot) driven the way a learner drives it, in a JupyterLab page.

``explore`` moves every control of one rendered explorer and checks that the plot follows: each
move must redraw it, and after a burst of quick changes that brings every control back to its first
value the plot must be exactly the first one (the explorers are deterministic), not one for values
held during the burst (a stale redraw finishing last, or a change that was dropped). A control the
explorer disabled (it changes nothing for the other values) is not moved, only looked at: every control
must lie within its row's visible box in a 1280 x 800 window and in a narrower one, at the start and
once the first control's steps have disabled others.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.async_api import Locator

REDRAW_TIMEOUT_S = 60.0  # only a redraw that never comes waits this long; a busy machine takes over 30 s
QUIET_S = 0.4  # how long the kernel must stay idle, and the plot unchanged, before a redraw counts as done

# A short fingerprint of the last image in an explorer's output area (its data URI hashed in the page,
# so polling does not ship the image to Python each time), or null when there is none.
_PLOT_FINGERPRINT = """(explorer) => {
  const images = explorer.querySelectorAll('.widget-output img');
  if (!images.length) return null;
  const source = images[images.length - 1].getAttribute('src') || '';
  let hash = 2166136261;
  for (let i = 0; i < source.length; i++) hash = Math.imul(hash ^ source.charCodeAt(i), 16777619);
  return source.length + ':' + (hash >>> 0).toString(16);
}"""

# The controls (and lines of text) of the explorer that stick out of their row's visible box: the row
# (the box holding them) clipped to the explorer and to the window. On a narrow window a row of
# controls that does not wrap hides its last ones behind a horizontal scrollbar. Each is named by its
# label (a line of text by its first words) and which side sticks out.
_OFF_SCREEN = """(explorer) => {
  const seen = explorer.getBoundingClientRect();
  const name = n => Array.from(n.querySelectorAll('.widget-label, .widget-label-basic'))
      .map(label => label.textContent.replace(/\u200b/g, '').trim()).find(text => text)
    || n.textContent.trim().slice(0, 40) || n.className;
  return Array.from(explorer.querySelectorAll('.widget-inline-hbox'))
    .filter(n => !n.closest('.widget-output'))
    .flatMap(n => {
      const row = (n.parentElement && n.parentElement.closest('.widget-box')) || explorer;
      const box = row.getBoundingClientRect(), control = n.getBoundingClientRect();
      const left = Math.max(box.left, seen.left, 0) - 1, right = Math.min(box.right, seen.right, window.innerWidth) + 1;
      const top = Math.max(box.top, seen.top) - 1, bottom = Math.min(box.bottom, seen.bottom) + 1;
      const sides = [['left', control.left < left], ['right', control.right > right], ['top', control.top < top],
                     ['bottom', control.bottom > bottom]].filter(([, out]) => out).map(([side]) => side);
      return sides.length ? [`${name(n)} (${sides.join(', ')})`] : [];
    });
}"""

KernelStatus = Callable[[], Awaitable[str]]
# The windows the controls must fit: a 1280 x 800 laptop screen, and the same screen with JupyterLab's
# file browser open, which leaves about 1000 pixels.
WINDOWS = ((1280, 800), (1000, 800))
LAYOUT_SETTLE_S = 5.0


async def _off_screen(explorer: Locator) -> list[str]:
    """The controls ``_OFF_SCREEN`` finds, in each of the ``WINDOWS``, as ``"1000x800: label (right)"``.

    JupyterLab lays its panels out again some frames after the window changes size, later still while
    the kernels keep the cores busy: a control counts as off screen only if it is still there after
    ``LAYOUT_SETTLE_S``.
    """
    page = explorer.page
    size = page.viewport_size
    found = []
    try:
        for width, height in WINDOWS:
            await page.set_viewport_size({"width": width, "height": height})
            deadline = time.monotonic() + LAYOUT_SETTLE_S
            while True:
                await page.wait_for_timeout(200)
                off_screen = await explorer.evaluate(_OFF_SCREEN)
                if not off_screen or time.monotonic() > deadline:
                    break
            found += [f"{width}x{height}: {control}" for control in off_screen]
    finally:
        await page.set_viewport_size(size)
        await page.wait_for_timeout(300)
    return found


async def plot_fingerprint(explorer: Locator) -> str | None:
    return await explorer.evaluate(_PLOT_FINGERPRINT)


async def wait_for_new_plot(explorer: Locator, kernel_status: KernelStatus, before: str | None) -> str:
    """Wait until the plot differs from ``before`` and, with the kernel idle, has stayed the same for
    ``QUIET_S``; return its fingerprint."""
    deadline = time.monotonic() + REDRAW_TIMEOUT_S
    last, quiet_since, status = None, None, "unknown"
    while time.monotonic() < deadline:
        status = await kernel_status()
        plot = await plot_fingerprint(explorer)
        if status == "idle" and plot is not None and plot == last and plot != before:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= QUIET_S:
                return plot
        else:
            quiet_since = None
        last = plot
        await asyncio.sleep(0.1)
    raise TimeoutError(f"the plot did not change within {REDRAW_TIMEOUT_S:.0f} s (kernel {status})")


# The burst: every step of every control dispatched in one task of the page, so they all reach the
# widgets within a millisecond, far faster than any pointer; the widgets send them to the kernel as
# they would a learner's quick clicks. Each step: [kind, node index, argument].
_BURST = """(nodes, steps) => {
  for (const [kind, index, argument] of steps) {
    const node = nodes[index];
    if (kind === 'slider') {
      node.dispatchEvent(new KeyboardEvent('keydown', {key: argument > 0 ? 'ArrowRight' : 'ArrowLeft', bubbles: true}));
    } else if (kind === 'checkbox') {
      node.click();
    } else {
      Array.from(node.options).forEach((option, k) => { option.selected = argument.includes(k); });
      node.dispatchEvent(new Event('change', {bubbles: true}));
    }
  }
}"""


class Control:
    """One control, moved with the keyboard or the mouse. A step forward and a step back are inverse:
    a slider step right and left (left where the slider is near its end), the next and the previous
    option, a toggle, a step through a cycle of selections (``selections``: how many options, from the
    first, each one selects). ``values``: how many values the steps go through (a slider: many)."""

    def __init__(
        self,
        kind: str,
        locator: Locator,
        index: int,
        values: int,
        *,
        position: int = 0,
        direction: int = 1,
        selections: tuple[int, ...] = (),
    ) -> None:
        self.kind, self.locator, self.index, self.values = kind, locator, index, values
        self.direction, self.selections = direction, selections
        self._position = position

    @property
    def burst_steps(self) -> int:
        """Quick steps forward that pass a value and end on another one than the start: two, or three
        when the control has only two values (two would come back)."""
        return 2 if self.values >= 3 else 3

    def _advance(self, sign: int) -> Any:
        """Take one step in the model of the control; return the burst argument for it."""
        if self.kind == "slider":
            return sign * self.direction
        if self.kind == "checkbox":
            return None
        self._position = (self._position + sign) % self.values
        if self.kind == "dropdown":
            return [self._position]
        return list(range(self.selections[self._position]))

    async def step(self, sign: int) -> None:
        """One step, as a learner takes it (a key press, a click, a choice in the list)."""
        argument = self._advance(sign)
        if self.kind == "slider":
            await self.locator.press("ArrowRight" if argument > 0 else "ArrowLeft")
        elif self.kind == "checkbox":
            await self.locator.click()
        else:
            await self.locator.select_option(index=argument)

    async def is_enabled(self) -> bool:
        """Whether a learner can move it now: an explorer disables the controls that change nothing for
        the other controls' values (a disabled one must not be stepped: Playwright would wait for it)."""
        return await self.locator.evaluate(
            "n => !(n.disabled || n.closest('[disabled]') || n.getAttribute('aria-disabled') === 'true')"
        )

    def burst(self, steps: int) -> list[list[Any]]:
        """``steps`` steps forward, as steps for ``_BURST``."""
        return [[self.kind, self.index, self._advance(1)] for _ in range(steps)]

    def burst_back(self, *, extra: bool) -> list[list[Any]]:
        """One step back, as steps for ``_BURST``; with ``extra``, through a further value first (forward
        once, back twice: forward, where a slider has room)."""
        signs = (1, -1, -1) if extra else (-1,)
        return [[self.kind, self.index, self._advance(sign)] for sign in signs]


_CONTROLS = (
    ".widget-slider .noUi-handle, .widget-checkbox input, .widget-dropdown select, .widget-select-multiple select"
)


async def controls_of(explorer: Locator) -> list[Control]:
    """The explorer's controls that can take another value, in the order they are shown."""
    found = []
    for index, node in enumerate(await explorer.locator(_CONTROLS).all()):
        classes = await node.evaluate("n => (n.closest('.widget-inline-hbox') || n).className")
        if "widget-slider" in classes:
            value, top = await node.evaluate(
                "n => [Number(n.getAttribute('aria-valuenow')), Number(n.getAttribute('aria-valuemax'))]"
            )
            found.append(Control("slider", node, index, values=99, direction=1 if value + 3 <= top else -1))
        elif "widget-checkbox" in classes:
            found.append(Control("checkbox", node, index, values=2))
        else:
            options, *selected = await node.evaluate(
                "n => [n.options.length, n.selectedIndex, Array.from(n.options).filter(o => o.selected).length]"
            )
            if "widget-dropdown" in classes:
                control = Control("dropdown", node, index, values=options, position=max(selected[0], 0))
            else:  # every option, all but the last, the first one (fewer when there are few options)
                selections = tuple(dict.fromkeys(n for n in (options, options - 1, 1) if n > 0))
                position = selections.index(selected[1]) if selected[1] in selections else 0
                control = Control(
                    "multiple", node, index, values=len(selections), position=position, selections=selections
                )
            if control.values >= 2:
                found.append(control)
    return found


async def is_explorer(widget: Locator) -> bool:
    """An explorer draws into an Output widget; other widgets (a progress bar) are only looked at."""
    return await widget.locator(".widget-output").count() > 0


async def explore(explorer: Locator, kernel_status: KernelStatus) -> tuple[list[str], int]:
    """Drive every control of ``explorer``; return the problems seen and the number of steps taken.

    Each control enabled at its turn steps forward once, one after another, and each step must redraw
    the plot. Then, in one burst, every control stepped comes back: the first one through a further value
    (forward, then back twice), each other one a step back. Once the redraws settle, the plot must be
    exactly the first plot (the explorers are deterministic), the one drawn for these values alone, not one
    drawn for values some control held during the burst. Last, the first control takes ``burst_steps``
    quick steps forward from the first values, which may disable others. Disabled controls are never
    stepped; every control, disabled or not, must lie within its row's visible box at the start and at
    the end."""
    controls = await controls_of(explorer)
    initial = await plot_fingerprint(explorer)
    if not controls:
        return [
            (
                "has no control this test can move (sliders, dropdowns, checkboxes, multiple selections); "
                "teach lab_explorer.controls_of the new kind"
            )
        ], 0
    if initial is None:
        return ["shows no plot"], 0
    problems, steps = [], 0
    off_screen = await _off_screen(explorer)
    if off_screen:
        problems.append(f"controls stick out of their row (a learner must scroll sideways): {off_screen}")
    moved, plot = [], initial
    for control in controls:
        if not await control.is_enabled():  # checked at its turn: an earlier control may have changed it
            continue
        moved.append(control)
        await control.step(1)
        plot = await wait_for_new_plot(explorer, kernel_status, before=plot)
        steps += 1
    if not moved:
        return [*problems, "every control is disabled"], steps
    for number, control in enumerate(moved):
        if not await control.is_enabled():
            return [
                *problems,
                f"control {number} ({control.kind}) was disabled by a later one: it cannot step back",
            ], steps
    burst = [step for number, control in enumerate(moved) for step in control.burst_back(extra=number == 0)]
    await explorer.locator(_CONTROLS).evaluate_all(_BURST, burst)
    after_burst = await wait_for_new_plot(explorer, kernel_status, before=plot)
    steps += len(burst)
    if after_burst != initial:
        problems.append(
            f"after a burst of {len(burst)} quick changes the plot is not the one drawn for the final values "
            "(the first values: the first plot)"
        )
    first = moved[0]
    await explorer.locator(_CONTROLS).evaluate_all(_BURST, first.burst(first.burst_steps))
    await wait_for_new_plot(explorer, kernel_status, before=after_burst)
    steps += first.burst_steps
    disabled = len([control for control in controls if not await control.is_enabled()])
    off_screen = await _off_screen(explorer)
    if off_screen:
        problems.append(f"with {disabled} control(s) disabled, controls stick out of their row: {off_screen}")
    return problems, steps
