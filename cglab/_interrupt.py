"""One line, not a traceback, for a Ctrl-C while ``python -m cglab`` imports torch: a KeyboardInterrupt
there prints a traceback or is swallowed by an import that then fails oddly, so until ``cli.main`` takes
over, Ctrl-C ends the process at once. Only under ``-m`` (``sys.argv[0] == "-m"`` while importing) and
only over Python's own handler."""

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
