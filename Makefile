# The two set-up commands of the README: `make demo` (main job end to end) and `make test`;
# `make docs` builds the documentation site (mkdocs.yml) and fails on any warning.
VENV ?= .venv
STAMP := $(VENV)/.installed

.PHONY: install demo test test-py312 bench docs

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh scripts/install_harnesses.sh scripts/install_vllm.sh harnesses.lock
	VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

demo: install
	$(VENV)/bin/harnessrl demo

test: install
	$(VENV)/bin/pytest -q

# --strict: a broken link or anchor, a missing page or one left out of the nav fails the build.
# The site goes under .cache/ (ignored by git); docs/hooks/cli_reference.py writes the CLI page.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d .cache/site

# The unit tests (-m unit) on Python 3.12 in their own venv; .ci/run finds the interpreter.
PYTHON312 ?= python3.12
test-py312:
	VENV=.venv-py312 PYTHON=$(PYTHON312) EXTRAS=dev MITM=0 HARNESSES=0 VLLM=0 bash scripts/install.sh
	.venv-py312/bin/python -m pytest -q -m unit
