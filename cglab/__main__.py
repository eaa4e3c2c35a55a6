import contextlib
import signal
import sys

from cglab.cli import main

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
