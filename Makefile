# Two commands do everything on a fresh machine:
#   make lab    open the notebook suite in JupyterLab
#   make test   run every test: unit tests and nbval on every notebook, then the browser tests
# and one more for readers without a kernel:
#   make html   the committed, executed suite as static pages in build/html/ (plots and widgets, no network)
#   make zh     the Chinese edition in notebooks/zh/, generated from the English files and notebooks/zh/po/
#   make zh-check  is notebooks/zh/ current and every translation up to date? (no torch needed)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb notebooks/solutions/*.ipynb))
# The Chinese edition's notebooks are generated, their code cells and outputs copied from the English ones:
# nbval checks those once, so NOTEBOOKS leaves these out; make html builds them too.
ZH_NOTEBOOKS := $(sort $(wildcard notebooks/zh/*.ipynb))

# Caches that would otherwise land in $HOME stay inside the project (and out of the tests' way).
export MPLCONFIGDIR := $(CURDIR)/.cache/matplotlib
export IPYTHONDIR := $(CURDIR)/.cache/ipython
export JUPYTER_RUNTIME_DIR := $(CURDIR)/.cache/jupyter/runtime
export TORCHINDUCTOR_CACHE_DIR := $(CURDIR)/.cache/torchinductor
# Python writes the bytecode of what it imports (pip installs without it, see below), even where the
# shell says not to: without it every process would compile torch's sources again.
unexport PYTHONDONTWRITEBYTECODE
# Nothing here sets the thread count: the notebooks (setup_notebook), the tests (conftest) and the
# CLI set one thread themselves, so a plain `pytest --nbval notebooks` gives what `make test` gives.
# The checks run with the variable unset, as on a CI runner that has never heard of it.
unexport OMP_NUM_THREADS

.PHONY: setup lab lint test test-e2e test-gpu notebooks html zh zh-check picture kit clean FORCE

# TORCH_INDEX_URL (unset by default) installs the pinned torch from another index first, e.g. the
# CPU-only build: make lab TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_INDEX_URL ?=

# pip installs the pinned torch (no --quiet: on Linux a first download is several GB with the CUDA
# libraries, and its progress bars show that it moves; pip also takes a torch wheel the machine holds
# locally) and uv, which installs the rest: about 80 packages, which pip resolves and unpacks one after
# another in most of a minute of CPU, and uv in seconds. Neither compiles bytecode; one import of what
# the notebooks, the tests, Lab and the browser tests load (WARM_IMPORTS) then writes it for those modules
# only, in a third of the time it takes to compile every file installed, once: without it the first
# processes of make test (two workers, the first kernels) each compile the same modules at the same time.
# The import also builds matplotlib's font cache. uv reads no pip configuration: where only pip reaches the
# packages (a private index), pip installs them after uv fails.
WARM_IMPORTS := torch._dynamo, torch._inductor.compile_fx, torch.export, sympy.combinatorics, networkx, \
  cglab.cli, cglab.lab.widgets, cglab.bench.run, cglab.capture_matrix, cglab.bug_zoo, matplotlib.pyplot, \
  ipywidgets, ipykernel.ipkernel, ipykernel.debugger, nbval.plugin, nbclient, nbconvert, jupyterlab.labapp, \
  anyio, xdist.remote, hypothesis.strategies, playwright.async_api, psutil, polib
PIP_INSTALL := $(PY) -m pip install --disable-pip-version-check --no-compile
# Set-up needs Python 3.10 or newer (pyproject.toml's requires-python). PYTHON is checked only when
# the venv is to be made, before anything is built: an older one (macOS's command-line tools install
# 3.9 as python3) stops with one line instead of pip's "ResolutionImpossible" for torch minutes later.
# A venv whose Python no longer runs (its base Python was removed), is too old or has no pip is made
# again, not reused, even with its stamp (an up-to-date stamp costs one Python start, 30 ms).
VENV_WORKS := $(PY) -c 'import sys, importlib.util as u; sys.exit(sys.version_info < (3, 10) or not u.find_spec("pip"))' \
  2>/dev/null
PYTHON_VERSION = $(shell $(PYTHON) -c 'import sys; v = sys.version_info; sys.stdout.write("%d.%d.%d %s" % (v[0], v[1], v[2], v >= (3, 10)))' 2>/dev/null)
PYTHON_CHECK = $(if $(filter True,$(word 2,$(PYTHON_VERSION))),,$(error PYTHON=$(PYTHON) is \
  $(or $(word 1,$(PYTHON_VERSION)),not a Python that runs); cglab needs Python 3.10 or newer: install one \
  (python.org; macOS: brew install python@3.12; anywhere: uv python install 3.12), then add PYTHON=python3.12 \
  to the make command (docs/LAPTOPS.md)))
$(STAMP): pyproject.toml tools/uv_overrides.txt $(if $(shell test -f $(STAMP) && $(VENV_WORKS) && echo yes),,FORCE)
	$(if $(shell $(VENV_WORKS) && echo yes),,$(PYTHON_CHECK)rm -rf $(VENV) && $(PYTHON) -m venv $(VENV))
	$(PIP_INSTALL) torch==2.13.0 $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(PIP_INSTALL) --quiet uv==0.13.9
	$(PY) -m uv pip install --python $(PY) --override tools/uv_overrides.txt -e ".[dev]" || $(PIP_INSTALL) -e ".[dev]"
	PYDEVD_DISABLE_FILE_VALIDATION=1 $(PY) -c "import $(WARM_IMPORTS)"  # the variable: no debugger notice
	touch $(STAMP)

# Only the environment, for those who work from a terminal (lab and test do this themselves).
setup: $(STAMP)

# Containers often run as root, where Jupyter refuses to start without --allow-root.
# VIRTUAL_ENV names the venv, so `$VIRTUAL_ENV/bin/python -m cglab ...` works in a JupyterLab terminal
# even where the shell's start-up files (pyenv, conda, Homebrew) put another Python first on PATH.
# No news or update toast over the first notebook: tools/jupyterlab_overrides.json sets the defaults of
# JupyterLab's notification settings (it asks about news while fetchNews is "none", its default), and
# the same two server options as the browser tests' server (tests/lab_server.py) stop the fetches.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.d/cglab.json
LAB_QUIET := --LabApp.news_url=None --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate
# JupyterLab draws widgets only in outputs it trusts: a notebook it ran and saved itself (signed in a
# database). Saved from one session, an explorer names widgets that the next session's kernel lacks:
# "Error displaying widget: model not found". Kept in memory, the signatures last one server, so a notebook
# from an earlier session, like one fresh from git, shows each explorer's still until its cell runs.
LAB_TRUST := --NotebookNotary.db_file=:memory:
# The server listens on this machine only, with a fresh token, whatever ~/.jupyter says (an ip of 0.0.0.0
# and an empty token there would open the kernels to the network). Jupyter masks a token it did not make
# ("token=..."), so the recipe prints the address itself. The root is the repository: the file browser
# and the terminal reach cglab/ and README.md. Port in use: make lab LAB_PORT=8890.
LAB_PORT ?= 8888
LAB_SAFE = --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) --ServerApp.port_retries=0
lab: $(STAMP)
	mkdir -p $(dir $(LAB_OVERRIDES)) && cp tools/jupyterlab_overrides.json $(LAB_OVERRIDES)
	@token=$$($(PY) -c "import secrets; print(secrets.token_hex(16))"); \
	echo "make lab: open http://127.0.0.1:$(LAB_PORT)/lab?token=$$token (a browser may open it for you)"; \
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" VIRTUAL_ENV="$(CURDIR)/$(VENV)" $(VENV)/bin/jupyter lab \
	  --ServerApp.root_dir="$(CURDIR)" $(LAB_SAFE) --IdentityProvider.token=$$token $(LAB_QUIET) $(LAB_TRUST) \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

# ruff, configured in pyproject.toml. make test runs it first: it takes a second, and a dirty tree
# fails the build before the long suites start.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# -n auto: one pytest worker per core (pytest-xdist); --dist loadscope keeps each test file, and
# each notebook's cells, on one worker, so a notebook runs top to bottom in a single kernel. The
# notebooks come first: they are the longest units, and the short test files then fill the gaps.
# Then the browser tests, after the others rather than beside them: both suites keep the cores
# busy, so running them together saved no time, and it starved the browser tests' clocks (Run All
# and redraw timeouts). Both parts run whatever the first one's result; either failing fails.
# The processes of one run (test workers, notebook kernels, the browser tests' kernels) share their dynamo
# traces through a folder made for the run and removed at its end, Ctrl-C too (tests/trace_store.py;
# kernels load it with PYTHONSTARTUP). nbval's kernels start warm: forked from one process that has
# imported torch and cglab, through the kernelspec python3-warm (tests/kernel_zygote.py).
test: $(STAMP) lint
	@traces=$$(mktemp -d); MPLBACKEND=Agg $(PY) tests/kernel_zygote.py serve "$$traces/kernels" & zygote=$$!; \
	trap 'kill $$zygote 2>/dev/null; rm -rf "$$traces"' EXIT; \
	export CGLAB_TEST_TRACES=$$traces PYTHONSTARTUP="$(CURDIR)/tests/kernel_startup.py"; \
	MPLBACKEND=Agg CGLAB_KERNEL_ZYGOTE="$$traces/kernels" JUPYTER_PATH="$(CURDIR)/tests/jupyter" \
	  $(PY) -m pytest -n auto --dist loadscope $(if $(NOTEBOOKS),$(NOTEBOOKS) --nbval --nbval-kernel-name python3-warm) tests; \
	unit=$$?; kill $$zygote 2>/dev/null; \
	echo "== browser tests (make test-e2e) =="; $(MAKE) --no-print-directory test-e2e; e2e=$$?; \
	test $$unit -eq 0 && test $$e2e -eq 0

# The browser tests (pytest -m e2e), in headless Chromium: every notebook opened in JupyterLab as committed,
# the cells the widgets need run there (nbval has run every cell) and the explorers driven, and make html's
# pages read offline; screenshots land in build/e2e/. They need the system's Chromium (.ci/run installs
# it); without one they are skipped, and said so.
CHROMIUM ?= $(firstword $(shell command -v chromium chromium-browser 2>/dev/null))
test-e2e: $(STAMP)
ifeq ($(CHROMIUM),)
	@echo "SKIPPED the browser tests (JupyterLab, make html): no Chromium; install it (Debian: apt-get install chromium) or pass CHROMIUM=/path/to/chromium"
else
	CHROMIUM=$(CHROMIUM) $(PY) -m pytest -m e2e tests/test_e2e_lab.py tests/test_e2e_fresh.py tests/test_e2e_html.py \
	  tests/test_e2e_zh.py
endif

# On a GPU box: the unit tests (their cuda halves), every notebook executed on the GPU (not saved) and
# README's repro examples with --device cuda --check; one summary at the end (tools/test_gpu.py).
# PY=python3 uses a Python that already has torch with CUDA (and Jupyter), instead of the venv.
test-gpu: $(if $(filter $(PY),$(VENV)/bin/python),$(STAMP))
	MPLBACKEND=Agg $(PY) tools/test_gpu.py

# Re-execute every notebook in a clean kernel on the CPU and save the outputs (commit them).
notebooks: $(STAMP)
	$(PY) tools/execute_notebooks.py $(NOTEBOOKS)

# Static pages of the committed (executed) notebooks, each as HEAD holds it: Run All rewrites the files
# on disk, and the pages should show what the suite ships (FROM=worktree builds the files as they are).
# The widget manager is downloaded once into .cache/.
FROM ?= head
html: $(STAMP)
	$(PY) tools/build_html.py --from $(FROM) --out build/html $(NOTEBOOKS) $(ZH_NOTEBOOKS)

# The Chinese edition (notebooks/zh/): the English files with the translations of notebooks/zh/po/ (tools/translations.py).
# After an English edit: .venv/bin/python tools/translations.py update, revise the entries it marks fuzzy, then make zh.
# The tool imports only nbformat, polib and the standard library, so a translator needs no torch (several GB):
# where the project's venv is set up, it runs there; elsewhere a venv of just those two packages (a few MB, once)
# in .cache/zh-venv. The pins are pyproject.toml's (tests/test_translations.py compares them).
ZH_VENV := .cache/zh-venv
ZH_PY := $(if $(wildcard $(STAMP)),$(PY),$(ZH_VENV)/bin/python)
ZH_PACKAGES := "nbformat>=5.10" "polib==1.2.0"
$(ZH_VENV)/.installed-stamp:
	$(if $(shell $(ZH_VENV)/bin/python -c '' 2>/dev/null && echo yes),,$(PYTHON_CHECK)rm -rf $(ZH_VENV) && $(PYTHON) -m venv $(ZH_VENV))
	$(ZH_VENV)/bin/python -m pip install --disable-pip-version-check --quiet $(ZH_PACKAGES)
	touch $@
ZH_ENV := $(if $(wildcard $(STAMP)),,$(ZH_VENV)/.installed-stamp)
zh: $(ZH_ENV)
	$(ZH_PY) tools/translations.py

# One OK line, or each stale file, missing or fuzzy translation and broken link anchor, and exit 1.
zh-check: $(ZH_ENV)
	$(ZH_PY) tools/translations.py check

# README's picture (docs/divergence.png), drawn by the suite's own plotting code from a real CPU run.
picture: $(STAMP)
	MPLBACKEND=Agg $(PY) tools/readme_picture.py --out docs/divergence.png

# The facilitator's kit in build/kit/: slides (the suite's own figures, drawn from fresh CPU runs and the
# recorded H200 data, in one self-contained file), the handout for one A4 page, the model answers. Offline.
# The same three pages in Chinese go to build/kit/zh/, from notebooks/zh/ (make zh writes those).
kit: $(STAMP)
	MPLBACKEND=Agg $(PY) tools/build_kit.py --out build/kit

clean:
	rm -rf $(VENV) .cache

FORCE:
