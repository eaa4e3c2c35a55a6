"""A Ctrl-C while ``python -m cglab`` imports torch would print a traceback or break the import: until ``cli.main``
takes over, it ends the process at once, with one line. Only under ``-m`` (``sys.argv[0] == "-m"`` while importing)
and over Python's own handler. And ``termination_deferred``: SIGTERM and SIGHUP wait for a save to end."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


def end_at_once(signum: int, frame: FrameType | None) -> None:
    """The SIGINT handler while ``python -m cglab`` imports: one line, status 130 (128 + SIGINT)."""
    os.write(2, b"python -m cglab: interrupted\n")  # unbuffered: safe whatever the interrupted code was writing
    os._exit(130)


def keyboard_interrupt_from_here() -> None:
    """Give Ctrl-C back to Python's KeyboardInterrupt, for ``main`` to handle (if ``end_at_once`` has it)."""
    if signal.getsignal(signal.SIGINT) is end_at_once:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextmanager
def termination_deferred(names: tuple[str, ...] = ("SIGTERM", "SIGHUP")) -> Iterator[None]:
    """The signals ``names`` wait until the block ends, then act as they would have: a save in progress ends
    whole. Ctrl-C (SIGINT) is deferred only where named: elsewhere its KeyboardInterrupt undoes the save.
    Main thread only (elsewhere: no-op)."""
    main = threading.current_thread() is threading.main_thread()
    signums = [getattr(signal, name) for name in names if main and hasattr(signal, name)]
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(caught):
            os.kill(os.getpid(), signum)  # now with the handler it had before


if sys.argv[:1] == ["-m"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, end_at_once)
