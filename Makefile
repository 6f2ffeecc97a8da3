# `make demo` and `make test` work on a fresh machine: they create .venv and install
# everything first. torch is pinned (2.13.0: its CPU build where the machine's wheels hold
# it) before the package is installed, so that the package's own torch requirement is
# already satisfied, with the torchvision made for it (timm needs torchvision; a newer one
# would pull a newer torch); then the package with all its extras and the test tools
# (without setuptools' banner about editable installs).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0 torchvision==0.28.0
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e '.[all,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py
	$(PY) examples/bevformer/e2e.py --config test --out out/bevformer_test

# PYTEST_ARGS narrows or adds to either: make test-fast PYTEST_ARGS=tests/passes
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) out
