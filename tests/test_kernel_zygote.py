"""The warm kernels of ``make test`` (tests/kernel_zygote.py) behave as ordinary ones towards jupyter_client:
they run in the notebook's folder with the launcher's environment, stop on an interrupt, and are gone after a
shutdown; and where the server cannot fork the same process, an ordinary kernel starts instead."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

jupyter_client = pytest.importorskip("jupyter_client", reason="the kernels need Jupyter (make installs it)")

from kernel_zygote import ENV  # noqa: E402

TESTS = Path(__file__).resolve().parent
WARM_MODULE = "colorsys"  # imported by the server, and by nothing a kernel imports on its own
PROBE = (
    "import json, os, sys\n"
    "print(json.dumps({'pid': os.getpid(), 'parent': os.getppid(), 'cwd': os.getcwd(), "
    f"'warm': {WARM_MODULE!r} in sys.modules, 'probe': os.environ.get('CGLAB_ZYGOTE_PROBE')}}))"
)


@pytest.fixture
def zygote(monkeypatch: pytest.MonkeyPatch) -> Iterator[psutil.Process]:
    """A server warmed with ``WARM_MODULE`` only, and the environment that sends kernels to it."""
    folder = tempfile.mkdtemp(prefix="zygote")  # a short path: a socket's name has at most 107 bytes
    socket_path = os.path.join(folder, "kernels")
    server = subprocess.Popen([sys.executable, str(TESTS / "kernel_zygote.py"), "serve", socket_path, WARM_MODULE])
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(socket_path):  # until it listens: a launcher that comes earlier starts an ordinary one
            assert server.poll() is None and time.monotonic() < deadline, "the kernel server did not start"
            time.sleep(0.05)
        monkeypatch.setenv(ENV, socket_path)
        monkeypatch.setenv("JUPYTER_PATH", str(TESTS / "jupyter"))
        monkeypatch.setenv("CGLAB_ZYGOTE_PROBE", "from the launcher")
        yield psutil.Process(server.pid)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(folder)


@contextlib.contextmanager
def _kernel(cwd: Path) -> Iterator[tuple[jupyter_client.KernelManager, jupyter_client.BlockingKernelClient]]:
    """A ``python3-warm`` kernel in ``cwd``, shut down at the end as nbval does (``now=True``: the launcher killed)."""
    manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3-warm", cwd=str(cwd))
    try:
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _probe(client: jupyter_client.BlockingKernelClient) -> dict:
    lines: list[str] = []

    def keep(message: dict) -> None:
        if message["msg_type"] == "stream":
            lines.append(message["content"]["text"])

    reply = client.execute_interactive(PROBE, timeout=60, output_hook=keep)
    assert reply["content"]["status"] == "ok", reply["content"]
    return json.loads("".join(lines))


def test_a_warm_kernel_runs_in_the_notebooks_folder_with_the_launchers_environment(
    zygote: psutil.Process, tmp_path: Path
) -> None:
    with _kernel(tmp_path) as (manager, client):
        seen = _probe(client)
        launcher = manager.provisioner.process.pid
        assert seen["warm"] and seen["parent"] == zygote.pid and seen["pid"] != launcher
        assert (seen["cwd"], seen["probe"]) == (str(tmp_path), "from the launcher")


def test_an_interrupt_reaches_the_warm_kernel_and_a_shutdown_ends_it(zygote: psutil.Process, tmp_path: Path) -> None:
    with _kernel(tmp_path) as (manager, client):
        kernel = psutil.Process(_probe(client)["pid"])
        client.execute("import time; time.sleep(60)")
        time.sleep(1.0)
        manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=20)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    kernel.wait(timeout=10)  # the shutdown killed the launcher: the kernel must follow it


def test_where_torch_would_start_otherwise_an_ordinary_kernel_starts(
    zygote: psutil.Process, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # read once, when torch loads: the server's differs
    with _kernel(tmp_path) as (manager, client):
        seen = _probe(client)
        assert not seen["warm"] and seen["pid"] == manager.provisioner.process.pid  # the launcher became it
        assert seen["cwd"] == str(tmp_path)
