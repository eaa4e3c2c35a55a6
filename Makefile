# Two commands do everything on a fresh machine:
#   make lab    open the notebook suite in JupyterLab
#   make test   run every test: unit tests and nbval on every notebook
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb notebooks/solutions/*.ipynb))

# Caches that would otherwise land in $HOME stay inside the project (and out of the tests' way).
export MPLCONFIGDIR := $(CURDIR)/.cache/matplotlib
export IPYTHONDIR := $(CURDIR)/.cache/ipython
export JUPYTER_RUNTIME_DIR := $(CURDIR)/.cache/jupyter/runtime
export TORCHINDUCTOR_CACHE_DIR := $(CURDIR)/.cache/torchinductor
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: lab test notebooks clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

test: $(STAMP)
	MPLBACKEND=Agg $(PY) -m pytest tests $(if $(NOTEBOOKS),$(NOTEBOOKS) --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg)

# Re-execute every notebook in a clean kernel on the CPU and save the outputs (commit them).
notebooks: $(STAMP)
	MPLBACKEND=module://matplotlib_inline.backend_inline $(PY) -m cglab.notebook_runner $(NOTEBOOKS)

clean:
	rm -rf $(VENV) .cache
