"""Run first by each notebook kernel of ``make test`` (``PYTHONSTARTUP``, which the Makefile sets): the kernel
shares dynamo traces with the run's other processes (``trace_store``). IPython runs it in the notebook's
namespace, with this folder on the path: it leaves no name behind."""

import trace_store as _trace_store

_trace_store.install()
del _trace_store
