"""The errors cglab raises. Every message says what went wrong *and* what to do instead."""

from __future__ import annotations


class CglabError(Exception):
    """Base class: catch this to handle any cglab error."""


class ConfigError(CglabError, ValueError):
    """A bad argument or configuration value (a typo, a size out of range...)."""


class CaptureError(CglabError, RuntimeError):
    """A rule of graph capture was broken (host sync, missing metadata, wrong shape...)."""


class MissingMetadataError(CaptureError):
    """A strict stateful layer ran without attention metadata (the loud form of the bug)."""


class CapacityError(CglabError, RuntimeError):
    """A cache or buffer ran out of room; the message names the limit to raise."""
