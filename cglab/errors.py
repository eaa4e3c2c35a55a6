"""The errors cglab raises: bad input is a ``ConfigError``, a broken capture rule a ``CaptureError``."""

from __future__ import annotations

from pathlib import Path

# What a closed runner says wherever its graphs are asked for (a step, a replay, a picture of them).
RELEASED = "the graphs were released by close(); build a new ModelRunner to capture them again"


class CglabError(Exception):
    """Base class: catch this to handle any cglab error."""


class ConfigError(CglabError, ValueError):
    """A bad argument or configuration value (a typo, a size out of range...)."""


class CaptureError(CglabError, RuntimeError):
    """A rule of graph capture was broken (host sync, missing metadata, wrong shape...)."""


class MissingMetadataError(CaptureError):
    """A strict stateful layer ran without attention metadata (the loud form of the bug)."""


class MetadataBuildError(CaptureError):
    """A builder cannot build the metadata asked for (a batch shape its ``cudagraph_support`` lacks)."""


class AddressChangedError(CaptureError):
    """A tensor a graph reads was replaced by a new one after capture; the graph would read the old one."""


class CapacityError(ConfigError, RuntimeError):
    """A cache or buffer ran out of room; the fix is a larger limit (named) or a smaller request."""


class NotSavedError(CglabError, OSError):
    """A result could not be written where asked; ``kept``: the pair written instead, or None."""

    def __init__(self, message: str, kept: tuple[Path, Path] | None) -> None:
        super().__init__(message)
        self.kept = kept
