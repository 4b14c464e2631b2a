# The two set-up commands of the README: `make demo` (main job end to end) and `make test`.
VENV ?= .venv
STAMP := $(VENV)/.installed

.PHONY: install demo test bench

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh
	VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

demo: install
	$(VENV)/bin/harnessrl demo

test: install
	$(VENV)/bin/pytest -q
