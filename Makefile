# opruntime: `make demo` runs the main job, `make test` the tests; each bootstraps .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Extras installed into .venv: the test tools, the backends that run without a GPU (cpu: numba, for
# the cpu backend's compiled kernels), and the models' peers (torch, onnxruntime:
# tests/system/test_models.py and `opruntime bench --suite models`).
EXTRAS ?= test,lint,cpu,opencl,jax,docs,plot,models

.PHONY: demo test test-slow test-gpu compile-cu opencl-icd docs docs-check lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip "setuptools>=70.1" wheel
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

# OpenCL on the CPU: Debian's PoCL ICD (pip's PoCL wheel cannot build kernels on these CPUs).
opencl-icd:
	@if ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing pocl-opencl-icd (OpenCL on the CPU)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pocl-opencl-icd ocl-icd-libopencl1) >/dev/null \
	    || echo "could not install pocl-opencl-icd: OpenCL tests will skip"; \
	else echo "no OpenCL ICD and apt-get unusable: OpenCL tests will skip"; fi

# Every .cu source must compile for sm_90 and sm_80 (nvcc when present, else NVRTC through CuPy).
compile-cu: $(VENV)/.installed
	$(BIN)/python scripts/compile_cu.py

# The plugin template installed as a real package (its entry point), outside .venv so that its
# kernels do not join .venv's own benchmarks; tests/test_examples.py puts it on PYTHONPATH.
build/plugin_template: $(VENV)/.installed examples/plugin_template/pyproject.toml $(wildcard examples/plugin_template/src/*/*.py)
	rm -rf $@ && $(BIN)/python -m pip install -q --no-deps --no-build-isolation --target $@ examples/plugin_template

# The docs site; strict: a broken link or a stale generated page fails (no -q: it hides warnings).
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# The built site in a real browser: Debian's chromium (installed here when missing) renders every page;
# console errors, missing images and broken links fail (scripts/docs_check.py; about 15 s on 2 cores).
docs-check: docs
	@if command -v chromium >/dev/null 2>&1 || [ -n "$$CHROMIUM" ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing chromium (the docs check's browser)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null; \
	else echo "no chromium and apt-get unusable: install Debian's chromium, or set CHROMIUM"; exit 2; fi
	$(BIN)/python scripts/docs_check.py --site build/site

# CI: the docs rendered in headless Chromium (docs-check, about 15 s), and every test but the GPU
# ones and the slow ones (S = 32768 attention on PoCL and JAX, numba's cross-process cache), which
# `make test-slow` runs (about 4 minutes more on 2 cores).
test: $(VENV)/.installed opencl-icd lint compile-cu build/plugin_template docs docs-check
	$(BIN)/python -m pytest -q -m "not gpu and not slow" -p no:cacheprovider

test-slow: $(VENV)/.installed opencl-icd
	$(BIN)/python -m pytest -q -m "slow and not gpu" -p no:cacheprovider

# On the GPU machine: scripts/gpu.sh sets it up offline and runs the GPU tests and benchmarks.
test-gpu:
	scripts/gpu.sh

demo: $(VENV)/.installed opencl-icd
	$(BIN)/opruntime info
	$(BIN)/opruntime bench --suite demo

# The rules are pinned in pyproject.toml ([tool.ruff.lint]) and ruff in the `lint` extra.
lint: $(VENV)/.installed
	$(BIN)/python -m ruff check opruntime backends tests examples scripts

clean:
	rm -rf $(VENV) build *.egg-info
