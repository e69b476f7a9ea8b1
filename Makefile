# `make test` and `make app` each work on a fresh machine: they create .venv and install the
# project into it first. The install re-runs only when pyproject.toml changes (stamp file).
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test app bench

test: $(STAMP)
	$(PYTHON) -m pytest -q

app: $(STAMP)
	$(VENV)/bin/streamlit run app.py --server.address 127.0.0.1 --server.port 8501 \
		--server.headless true --browser.gatherUsageStats false

bench: $(STAMP)
	$(VENV)/bin/workbench bench construct --suite cpu-core

$(PYTHON):
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install -e '.[dev]'
	touch $@
