"""Names a package imports on first use (PEP 562): ``python -m cglab`` refuses a typo before importing torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]], namespace: dict[str, Any], names: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each module to its names."""
    module_of = {name: module for module, held in exports.items() for name in held}

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value = getattr(importlib.import_module(module_of[name]), name)
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
