"""Under ``python -m cglab``, a Ctrl-C before ``cli.main`` takes over (while torch imports) ends the process with
one line, not a traceback or a broken import. And ``termination_deferred``: SIGTERM and SIGHUP wait for a save."""

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


@contextmanager
def termination_deferred(names: tuple[str, ...] = ("SIGTERM", "SIGHUP")) -> Iterator[None]:
    """The signals ``names`` (main thread only) act when the block ends: a save ends whole. Ctrl-C, unless
    named, is not deferred: its KeyboardInterrupt undoes the save."""
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
