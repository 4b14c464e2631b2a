# The two set-up commands of the README: `make demo` (main job end to end) and `make test`.
VENV ?= .venv
STAMP := $(VENV)/.installed

.PHONY: install demo test test-py312 bench

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh scripts/install_harnesses.sh scripts/install_vllm.sh harnesses.lock
	VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

demo: install
	$(VENV)/bin/harnessrl demo

test: install
	$(VENV)/bin/pytest -q

# The unit tests (-m unit) on Python 3.12 in their own venv; .ci/run finds the interpreter.
PYTHON312 ?= python3.12
test-py312:
	VENV=.venv-py312 PYTHON=$(PYTHON312) EXTRAS=dev MITM=0 HARNESSES=0 VLLM=0 bash scripts/install.sh
	.venv-py312/bin/python -m pytest -q -m unit
