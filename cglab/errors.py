"""The errors cglab raises. Every message says what went wrong *and* what to do instead.

Bad input is a ``ConfigError`` (a ``ValueError``); a broken rule of graph capture or replay is a
``CaptureError``. Catch ``CglabError`` to handle any of them.
"""

from __future__ import annotations

from pathlib import Path


class CglabError(Exception):
    """Base class: catch this to handle any cglab error."""


class ConfigError(CglabError, ValueError):
    """A bad argument or configuration value (a typo, a size out of range...)."""


class CaptureError(CglabError, RuntimeError):
    """A rule of graph capture was broken (host sync, missing metadata, wrong shape...)."""


class MissingMetadataError(CaptureError):
    """A strict stateful layer ran without attention metadata (the loud form of the bug)."""


class MetadataBuildError(CaptureError):
    """A metadata builder cannot build the metadata asked for, e.g. capture metadata for a batch shape
    its ``cudagraph_support`` does not cover."""


class AddressChangedError(CaptureError):
    """A tensor a graph reads was replaced by a new one after capture; the graph would read the old one."""


class CapacityError(ConfigError, RuntimeError):
    """A cache or buffer ran out of room; the message names the limit to raise.

    A ``ConfigError`` because the fix is a larger limit or a smaller request.
    """


class NotSavedError(CglabError, OSError):
    """A result could not be written where it was asked for. ``kept`` is the pair it was written as
    instead, or ``None`` when nothing could be written; the message says which, and where."""

    def __init__(self, message: str, kept: tuple[Path, Path] | None) -> None:
        super().__init__(message)
        self.kept = kept
