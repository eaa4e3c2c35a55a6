"""Dynamo traces shared between the processes of one ``make test``: a test-speed device, like ``caching.install``.

In one process, equal models already share one trace (``cglab/compilation/caching.py``). But ``make test``
runs two test workers, one kernel per notebook and the browser tests' kernels, and they trace the same
models again: in one measured run, 208 traces, of which 42 repeated a trace made in another process (the
default repro's model in 12 processes). Where ``CGLAB_TEST_TRACES`` names a folder (the Makefile makes one
for each ``make test``), ``install`` backs the process's traces with it: a trace missing from memory is read
from there, and a new one is written there, for the processes that come later.

A trace goes to the folder only under a key that means the same model in every process: the fingerprint as
text, where each class and function is named by module and name. One whose fingerprint holds a function or
class that a name cannot pin down (a notebook's own, from ``__main__``; one defined inside a function; a
closure; an object printed with its address) stays in memory only. The key also holds the source of cglab
and of the tests, so an edit between runs, or a mutated copy of the package, never reads an old trace.
Notebook kernels install it through ``tests/kernel_startup.py`` (``PYTHONSTARTUP``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import pickle
import sys
import types
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path
from typing import Any

ENV = "CGLAB_TEST_TRACES"
CACHING = "cglab.compilation.caching"
ROOT = Path(__file__).resolve().parents[1]


class _Unshareable(Exception):
    """The fingerprint holds something another process could not name the same way."""


def _text(obj: Any) -> str:
    """``obj`` (a fingerprint or a part of one) as text that every process writes the same."""
    if isinstance(obj, tuple):
        return "(" + ",".join(map(_text, obj)) + ")"
    if isinstance(obj, (type, types.FunctionType)):
        local = "<locals>" in obj.__qualname__ or obj.__module__ == "__main__"
        if local or getattr(obj, "__closure__", None):
            raise _Unshareable(obj)
        return f"{obj.__module__}.{obj.__qualname__}"
    text = repr(obj)
    if " at 0x" in text:
        raise _Unshareable(text)
    return text


@functools.cache
def _sources() -> str:
    """The code the traces come from: cglab's and the tests' sources, and torch's version."""
    import torch

    digest = hashlib.sha256(torch.__version__.encode())
    for path in sorted([*(ROOT / "cglab").rglob("*.py"), *(ROOT / "tests").glob("*.py")]):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _nodes(trace: Any) -> list[Any]:
    return list(trace.graph.graph.nodes)


def _dumps(trace: Any) -> bytes | None:
    """The trace with each node's module path (``nn_module_stack``, which the anatomy tables print), or None
    where it cannot be written so that a reader gets the same graph. A pickled graph keeps its code, not
    its nodes' other metadata (dynamo's fake values): a test that reads those makes its own trace."""
    stacks = [node.meta.get("nn_module_stack") for node in _nodes(trace)]
    try:
        data = pickle.dumps((trace, stacks))
    except (pickle.PicklingError, TypeError, AttributeError):  # a class or function defined in a test
        return None
    same = [(n.op, str(n.target)) for n in _nodes(trace)] == [(n.op, str(n.target)) for n in _nodes(_loads(data))]
    return data if same else None


def _loads(data: bytes) -> Any:
    trace, stacks = pickle.loads(data)
    for node, stack in zip(_nodes(trace), stacks, strict=True):
        if stack is not None:
            node.meta["nn_module_stack"] = stack
    return trace


class SharedTraces(OrderedDict):
    """``caching._TRACES`` backed by a folder: a miss in memory reads the folder, a new trace is written to it."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def _path(self, fingerprint: Hashable) -> Path | None:
        try:
            text = _text(fingerprint)
        except _Unshareable:
            return None
        return self.folder / hashlib.sha256(f"{_sources()}{text}".encode()).hexdigest()

    def get(self, fingerprint: Hashable, default: Any = None) -> Any:
        if fingerprint is not None and fingerprint not in self:
            path = self._path(fingerprint)
            if path is not None and path.exists():
                super().__setitem__(fingerprint, _loads(path.read_bytes()))
        return super().get(fingerprint, default)

    def __setitem__(self, fingerprint: Hashable, trace: Any) -> None:
        super().__setitem__(fingerprint, trace)
        path = self._path(fingerprint)
        data = _dumps(trace) if path is not None and not path.exists() else None
        if data is not None:
            assert path is not None
            part = path.with_name(f"{path.name}.{os.getpid()}.part")
            part.write_bytes(data)
            part.replace(path)  # atomic: a reader sees the whole trace or none


class _OnImport(importlib.abc.MetaPathFinder):
    """Backs ``caching._TRACES`` with the folder once the module is imported: a kernel that never imports
    cglab (the browser tests' self-tests) pays no torch import for it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != CACHING:
            return None
        sys.meta_path.remove(self)  # the search below, and any later import, goes on without it
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is not None
        run = spec.loader.exec_module

        def run_and_back(module: types.ModuleType) -> None:
            run(module)
            module._TRACES = SharedTraces(self.folder)

        spec.loader.exec_module = run_and_back  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Back this process's traces with the folder ``CGLAB_TEST_TRACES`` names (unset: nothing changes), now if
    cglab's trace cache is imported, else when it is."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    if CACHING in sys.modules:
        sys.modules[CACHING]._TRACES = SharedTraces(Path(folder))
    else:
        sys.meta_path.insert(0, _OnImport(Path(folder)))
