import contextlib
import os
import signal
import sys
from pathlib import Path

# Inductor's default cache, /tmp/torchinductor_USER, is a name any user can take first: unless told, the
# checkout's .cache (an installed package: the user's cache folder).
_root = Path(__file__).resolve().parents[1]
_cache = _root / ".cache" if (_root / "pyproject.toml").is_file() else Path.home() / ".cache" / "cglab"
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_cache / "torchinductor"))

from cglab.cli import main  # noqa: E402  (after the cache is set: torch reads it when it loads)

# main() checks the arguments, imports torch, then handles a Ctrl-C itself (undoing a save in progress).
status = main()
# The work is done and written. Tearing the interpreter down takes about a second (torch's objects),
# and a KeyboardInterrupt raised in it would print "Exception ignored" tracebacks: once what main()
# printed is out, a Ctrl-C ends the process at once, by the signal itself (status 130 in the shell).
signal.signal(signal.SIGINT, signal.SIG_IGN)
with contextlib.suppress(OSError):
    sys.stdout.flush()
    sys.stderr.flush()
signal.signal(signal.SIGINT, signal.SIG_DFL)
sys.exit(status)
