# The two commands of the README. Each installs what it needs into .venv first.
#   make tour    the tour of the lessons on real ranks
#   make test    the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: tour test venv figures clean

venv: $(STAMP)

# torch is pinned to 2.13.0: on the course machines that is a local CPU wheel (no CUDA download)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e ".[torch,test]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

tour: $(STAMP)
	$(BIN)/minipar tour

test: $(STAMP)
	$(BIN)/python -m pytest -q

figures: $(STAMP)
	$(BIN)/minipar figures

clean:
	rm -rf $(VENV) tour-output .pytest_cache
