"""Notebook kernels that start warm: forked from one process that has imported torch, cglab and matplotlib.

nbval runs every notebook in a kernel of its own, and each kernel paid about 6 s of CPU to import torch,
dynamo, cglab and matplotlib before its first line ran: 17 kernels, over 100 s of a 2-core
``make test``. Here one server (``serve``, started by the Makefile for one run) imports them once. The
kernelspec ``python3-warm`` (``tests/jupyter``, which nbval is told to use) starts ``launch``: a small
process that asks the server for a kernel. The server forks; the child becomes the kernel, with the
launcher's connection file, folder, environment and standard streams. The notebook still runs top to
bottom in a new process and a new namespace: only the imports are done.

Towards jupyter_client the launcher stands for the kernel: it passes the signals it gets (interrupt,
terminate) on, and it exits when the kernel exits. The kernel exits when the launcher dies (a shutdown
with ``now=True`` kills the launcher). A fork is only safe from a process with one Python thread, and
only the same as a fresh start where the variables that torch reads at import are the same: where the
server finds otherwise, or is not running, the launcher starts an ordinary kernel instead.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Sequence

ENV = "CGLAB_KERNEL_ZYGOTE"  # the server's socket; unset: every kernel starts the ordinary way
# What notebook kernels import. Not ipykernel or IPython: they read the kernel's environment as they are
# imported (``JPY_PARENT_PID``), and each kernel imports them itself in a quarter of a second.
WARM = (
    "torch",
    "torch._dynamo",
    "matplotlib.pyplot",
    "cglab.lab.notebook",
    "cglab.lab.widgets",
    "cglab.lab.anatomy",
    "cglab.repro",
    "cglab.bench",
)
# Read once, when torch or Python starts: a kernel asked for with other values must start for itself.
FIXED_AT_IMPORT = (
    "ATEN_CPU_CAPABILITY",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "PYTHONPATH",
    "MPLBACKEND",
)
MAX_REQUEST = 1 << 20


def serve(path: str, warm: Sequence[str] = WARM) -> None:
    """Import ``warm``, then fork a kernel for every launcher that connects to ``path``, until the process
    that started this one is gone."""
    try:  # Linux 5.3 and Python 3.9 on: how launcher and kernel watch each other
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        print("kernel_zygote: warm kernels need Linux's pidfd; nbval's kernels start the ordinary way", file=sys.stderr)
        return
    started_by = os.getppid()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as server:
        # Listening before the imports: a launcher that comes early waits for them instead of importing itself.
        server.bind(path)
        server.listen(64)
        for name in warm:
            importlib.import_module(name)
        if "torch" in warm:  # the first torch.compile imports inductor's configuration (400 modules)
            import torch

            torch.compile(lambda x: x, backend="eager")
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernels are reaped as they exit
        sys.stdout.flush()
        sys.stderr.flush()
        while os.getppid() == started_by:
            if select.select([server], [], [], 1.0)[0]:
                conn, _ = server.accept()
                with conn:
                    _answer(conn, server)


def _answer(conn: socket.socket, server: socket.socket) -> None:
    data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
    try:
        request = json.loads(data)
        refusal = _refusal(request["env"], len(fds))
        if refusal:
            conn.send(f"refused: {refusal}".encode())
            return
        pid = os.fork()
        if pid == 0:
            server.close()
            conn.close()
            _become_kernel(request, fds)  # never returns
        conn.send(str(pid).encode())
    finally:
        for fd in fds:
            os.close(fd)


def _refusal(env: dict[str, str], streams: int) -> str:
    if streams != 3:
        return f"{streams} standard streams came, not 3"
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads run here: a fork could copy a lock another one holds"
    changed = [name for name in FIXED_AT_IMPORT if env.get(name) != os.environ.get(name)]
    return f"{', '.join(changed)} differ from this process's" if changed else ""


def _become_kernel(request: dict, fds: list[int]) -> None:
    """In the forked child: take the launcher's streams, folder and environment, and run ipykernel."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the kernel's own subprocesses are waited for
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        del sys.path[0]  # this file's folder; IPython puts the notebook's folder first, as for any kernel
        _exit_with(request["launcher"])
        from ipykernel import kernelapp

        sys.argv = ["ipykernel_launcher", *request["argv"]]
        try:
            kernelapp.launch_new_instance()
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 0
        atexit._run_exitfuncs()
    finally:
        os._exit(code)


def _exit_with(launcher: int) -> None:
    """End this kernel when ``launcher`` ends (jupyter_client kills it to shut the kernel down)."""
    try:
        pidfd = os.pidfd_open(launcher)
    except ProcessLookupError:
        os._exit(0)

    def watch() -> None:
        select.select([pidfd], [], [])
        os._exit(0)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def launch(argv: Sequence[str]) -> None:
    """A kernel with ipykernel's ``argv`` (``-f CONNECTION_FILE``): forked by the server, or started the
    ordinary way where there is none or it refuses."""
    kernel = _ask(os.environ.get(ENV, ""), argv)
    if kernel is None:
        os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])
    pidfd = os.pidfd_open(kernel)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda number, _frame: _send(pidfd, number))
    select.select([pidfd], [], [])  # until the kernel exits (signals handled meanwhile: PEP 475 resumes)
    sys.exit(0)


def _send(pidfd: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the kernel has just exited
        signal.pidfd_send_signal(pidfd, number)


def _ask(path: str, argv: Sequence[str]) -> int | None:
    if not path or not os.path.exists(path):  # no server (one that could not start has said why)
        return None
    request = {"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ), "launcher": os.getpid()}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.connect(path)
            socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
            answer = conn.recv(4096).decode()
    except OSError as error:
        print(f"kernel_zygote: no warm kernel ({error}); starting an ordinary one", file=sys.stderr)
        return None
    if not answer.isdigit():
        print(f"kernel_zygote: no warm kernel ({answer}); starting an ordinary one", file=sys.stderr)
        return None
    return int(answer)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], sys.argv[3].split(",") if len(sys.argv) > 3 else WARM)
    else:
        launch(sys.argv[1:])
