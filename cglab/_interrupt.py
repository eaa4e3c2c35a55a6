"""One line, not a traceback, for a Ctrl-C while ``python -m cglab`` is still starting.

Once ``cglab.cli.main`` runs, it turns a Ctrl-C into one line and exit status 130, after a save
in progress has been undone. Before that, ``python -m cglab`` spends seconds importing this
package and torch, and a KeyboardInterrupt raised there either reaches the interpreter, which
prints a traceback, or is swallowed by a library's import (torch's NumPy set-up), which then
fails oddly or runs on as if no key had been pressed. So while it imports, a Ctrl-C ends the
process at once: nothing has been measured or written yet.

Set only under ``python -m cglab`` (while Python imports the package for ``-m``, ``sys.argv[0]``
reads ``"-m"``), and only over Python's own handler: a program that imports cglab, or a shell that
made the process ignore Ctrl-C, keeps its own.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def end_at_once(signum: int, frame: FrameType | None) -> None:
    """The SIGINT handler while ``python -m cglab`` imports: one line, status 130 (128 + SIGINT)."""
    os.write(2, b"python -m cglab: interrupted\n")  # unbuffered: safe whatever the interrupted code was writing
    os._exit(130)


def keyboard_interrupt_from_here() -> None:
    """Give Ctrl-C back to Python's KeyboardInterrupt, for ``main`` to handle (if ``end_at_once`` has it)."""
    if signal.getsignal(signal.SIGINT) is end_at_once:
        signal.signal(signal.SIGINT, signal.default_int_handler)


if sys.argv[:1] == ["-m"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, end_at_once)
