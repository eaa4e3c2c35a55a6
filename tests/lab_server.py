"""A JupyterLab server for the browser tests: loopback only, a free port, a token, its own settings.

``LabServer(root)`` runs ``jupyter lab`` from the test's Python on 127.0.0.1 with configuration,
data (notebook signatures), settings, workspaces and runtime files in a folder of its own, so the
machine's Jupyter setup (a disabled extension, a saved layout) cannot change what the test sees. Every cell is attached to the
page (no windowing), so a widget far down a notebook is rendered like the first one; autosave is off,
so the run never writes a notebook. ``disabled_extensions`` switches lab extensions off, which is how
the tests show that a missing widget manager is caught. ``stop`` shuts down the kernels and the
server, and names any of their processes that outlived it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from lab_notebook import NotebookRun

# User settings, per plugin. Windowing "none": the default modes attach only the cells near the
# viewport, and a widget that is not attached is not rendered, so it could be neither checked nor
# shown in a screenshot. The news and update checks would reach for the network.
SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}
# As `make lab` (its LAB_TRUST says why): notebook signatures last one server, so a notebook signed
# earlier (``data_dir``'s database) opens untrusted, its explorers as stills.
TRUST_OPTIONS = ("--NotebookNotary.db_file=:memory:",)
START_TIMEOUT_S = 60.0
# A race in jupyter_server (2.21): a starting kernel is listed one event-loop turn before its
# last_activity is set, and GET /api/kernels in that turn fails with 500 and this error in the log.
# Lab polls that list and simply asks again, so a learner sees nothing; the page logs a failed load.
KERNEL_LIST_RACE = "'last_activity' trait of a ServerKernelManager instance expected a datetime, not the NoneType"
SERVER_ERROR_IN_PAGE = (
    "console error: Failed to load resource: the server responded with a status of 500 (Internal Server Error)"
)
# No proxy: one set in the environment would not reach the server on 127.0.0.1.
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LabServer:
    """``jupyter lab`` serving ``root``: ``start``, ``wait_ready``, then ``stop``."""

    def __init__(
        self, root: Path, home: Path, *, disabled_extensions: Sequence[str] = (), log: Path | None = None
    ) -> None:
        self.root, self.home, self.log = root, home, log or home / "jupyterlab.log"
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.disabled_extensions = tuple(disabled_extensions)
        self._process: subprocess.Popen[bytes] | None = None
        self._descendants: list[psutil.Process] = []

    def url(self, path: str = "lab") -> str:
        separator = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}/{path}{separator}token={self.token}"

    def _write_config(self) -> dict[str, str]:
        """The config folders the server reads, filled in; returns the environment naming them."""
        dirs = {name: self.home / name for name in ("config", "data", "settings", "workspaces", "runtime")}
        for folder in dirs.values():
            folder.mkdir(parents=True, exist_ok=True)
        for plugin, values in SETTINGS.items():
            package, name = plugin.rsplit("/", 1)
            target = dirs["settings"] / package / f"{name}.jupyterlab-settings"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(values))
        # No build check: at each page load Lab asks whether the app needs a rebuild, and the server starts
        # Node (yarn config) to answer; the installed app never does here.
        page_config: dict[str, Any] = {"buildCheck": False, "buildAvailable": False}
        if self.disabled_extensions:
            page_config["disabledExtensions"] = {name: True for name in self.disabled_extensions}
        (dirs["config"] / "labconfig").mkdir(exist_ok=True)
        (dirs["config"] / "labconfig" / "page_config.json").write_text(json.dumps(page_config))
        return {
            "JUPYTER_CONFIG_DIR": str(dirs["config"]),
            "JUPYTER_DATA_DIR": str(dirs["data"]),
            "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
            "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
            "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        }

    def start(self) -> None:
        env = {**os.environ, **self._write_config()}
        # The kernels should run as in `make lab`: the inline plots of a Lab, not the Agg backend the
        # unit tests set; on the CPU, like the committed outputs.
        env.pop("MPLBACKEND", None)
        env["CUDA_VISIBLE_DEVICES"] = ""
        command = [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
            *TRUST_OPTIONS,
        ]
        if os.geteuid() == 0:
            command.append("--allow-root")  # containers run as root, where Jupyter refuses without it
        with open(self.log, "wb") as log:
            self._process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def wait_ready(self) -> None:
        """Block until the server answers its status API; raise with its log if it died or hung."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited at start:\n{self.log.read_text()[-3000:]}")
            try:
                self._api("api/status")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        raise RuntimeError(
            f"jupyter lab did not answer within {START_TIMEOUT_S:.0f} s:\n{self.log.read_text()[-3000:]}"
        )

    def kernel_list_races(self) -> int:
        """How many of the server's 500 answers were the kernel-list race (``KERNEL_LIST_RACE``): only
        those where every 500 in its log is a GET /api/kernels, each matched by the race's error."""
        text = self.log.read_text() if self.log.exists() else ""
        errors = [line for line in text.splitlines() if "ServerApp] 500 " in line]
        races = text.count(KERNEL_LIST_RACE)
        return races if errors and len(errors) == races and all(" GET /api/kernels" in e for e in errors) else 0

    def _api(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(self.url(path), method=method)
        with _LOOPBACK.open(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def stop(self) -> list[str]:
        """Shut down every kernel, then the server. Returns the processes that had to be killed
        because they outlived it (empty when everything stopped as it should)."""
        if self._process is None:
            return []
        try:
            self._descendants = psutil.Process(self._process.pid).children(recursive=True)
            for kernel in self._api("api/kernels"):
                self._api(f"api/kernels/{kernel['id']}", method="DELETE")
        except (urllib.error.URLError, ConnectionError, psutil.Error):
            pass  # the server is already gone; what is left over is found below
        self._process.terminate()
        try:
            self._process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        _, alive = psutil.wait_procs(self._descendants, timeout=10)
        leftovers = []
        for process in alive:
            with contextlib.suppress(psutil.Error):
                leftovers.append(f"{process.pid} {' '.join(process.cmdline()[:4])}")
                process.kill()
        self._process = None
        return leftovers


def excuse_kernel_list_races(runs: Iterable[NotebookRun], server: LabServer) -> int:
    """Drop the page's report of a server error from the runs, once for each 500 that ``server``'s
    log shows to be the kernel-list race, and no more; return how many were dropped."""
    allowed, excused = server.kernel_list_races(), 0
    for run in runs:
        kept = []
        for problem in run.problems:
            if problem == SERVER_ERROR_IN_PAGE and excused < allowed:
                excused += 1
            else:
                kept.append(problem)
        run.problems = kept
    return excused
