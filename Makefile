# `make test` and `make app` each work on a fresh machine: they create .venv and install the
# project into it first. The install re-runs only when pyproject.toml changes (stamp file).
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-fast fixtures app bench book lessons chromium gpu-pack

# The fast lane first, so that `make test` (and CI, through .ci/run) fails whenever `make
# test-fast` would: a core test that needs an expression missing from the fixtures, or a core
# module that imports TVM. Then every test on two pytest workers: most tests keep one core busy
# (a serial run on the 2-core development machine took 27 min, two workers 16 min), the rest
# start their own worker processes; tests pick free ports and temporary stores, so they run side
# by side. Tests marked `quiet` measure this machine (calibration refuses numbers a busy core
# distorts) and run afterwards, alone.
test: test-fast chromium
	$(PYTHON) -m pytest -q -n 2 -m "not quiet"
	$(PYTHON) -m pytest -q -m quiet

# The pure core (construction, rTile model, specs) without TVM, in at most 90 s on 2 cores; the
# catalog expressions it needs come from tests/fixtures/tensor_exprs.json (see tests/conftest.py).
test-fast: $(STAMP)
	WORKBENCH_TEST_LANE=fast $(PYTHON) -m pytest -q -p no:cacheprovider -n $(shell nproc)

# Rewrite tests/fixtures/tensor_exprs.json from real TVM builds (after adding a core test that
# needs a new catalog expression); `make test` checks the file against fresh builds.
fixtures: $(STAMP)
	WORKBENCH_TEST_LANE=record $(PYTHON) -m pytest -q -p no:cacheprovider

app: $(STAMP)
	$(VENV)/bin/streamlit run app.py --server.address 127.0.0.1 --server.port 8501 \
		--server.headless true --browser.gatherUsageStats false

bench: $(STAMP)
	$(VENV)/bin/workbench bench construct --suite cpu-core

# The lessons as a static site (scripts/book.py): every notebook run here, one at a time, then one
# page per lesson and an index in book/, read from the files (no server, no network: plotly.js is
# written once beside the pages). `make lessons` also saves the outputs into notebooks/*.ipynb.
book: $(STAMP)
	$(PYTHON) scripts/book.py --out book

lessons: $(STAMP)
	$(PYTHON) scripts/book.py --out book --save

# The kernels for the GPU machine (docs/gpu.md): roller-table1 and the sample models' GEMMs on
# the h200 at top 10, built and compiled here (needs nvcc), into $(GPU_PACK), ready to send. Top 10,
# not 5: a construction at top 5 stops at the first five programs it emits, and misses better-predicted
# ones a top-10 construction ranks first (fp16 4096^3: its 128 x 256 tiles, docs/gpu.md).
GPU_PACK := gpu-pack

gpu-pack: $(STAMP)
	rm -rf $(GPU_PACK)
	$(VENV)/bin/workbench gpu pack --suite roller-table1 --suite sample-gemms --device h200 --topk 10 --out $(GPU_PACK)

# tests/test_browser.py drives Debian's chromium (Playwright's Python package, no downloaded
# browser). CI runs as root and gets it here; elsewhere a missing chromium only skips that test.
CHROMIUM := /usr/bin/chromium

chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y chromium || { apt-get update && apt-get install -y chromium; }; \
		else \
			echo "note: $(CHROMIUM) is missing and this user cannot install it: tests/test_browser.py will skip"; \
		fi; \
	fi

$(PYTHON):
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install -e '.[dev]'
	touch $@
