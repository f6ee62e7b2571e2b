# The two commands of the README. Each installs what it needs into .venv first.
#   make tour    the tour of the lessons on real ranks
#   make test    the whole test suite: about 45 minutes on 2 cores (45:42 measured, loaded); it names
#                each test file as it starts (a progress bar per long command: MINIPAR_PROGRESS=1)
#                (as root it also installs Debian's chromium for tests/test_site.py)
#   make check   the quick tier: every test that starts no ranks, and lesson 01 end to end on each
#                backend (under 3 minutes on 2 cores): does my install work
#   make site    the course site into site/ (docs/site.md)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SITE_STAMP := $(VENV)/.installed-site

.PHONY: tour test check venv figures clean lint notebooks lab site browser

venv: $(STAMP)

# torch==2.13.0 first: on the course machines that is a local CPU wheel (no CUDA download),
# and it meets the [torch] extra's range, so the second install keeps it. Elsewhere PyPI's
# default Linux torch is the multi-GB CUDA build; for the CPU-only one name PyTorch's CPU index:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (the same as: pip install torch --index-url https://download.pytorch.org/whl/cpu)
TORCH_INDEX ?=
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "torch==2.13.0" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -e ".[torch,test]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# the site's packages (mkdocs and its plugins, selenium): for make site and the tests, not the tour
$(SITE_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[site]"
	touch $(SITE_STAMP)

tour: $(STAMP)
	$(BIN)/minipar tour

test: $(SITE_STAMP) browser
	$(BIN)/python -m pytest -q --durations=15

# the quick tier, "does my install work": every test that launches no ranks and is not marked
# slow, and one lesson end to end on each backend (lesson 01's collectives on 3 MPI ranks and
# 2 torch ranks, marked quick); under 3 minutes on 2 cores
check: $(STAMP)
	$(BIN)/python -m pytest -q -m "quick or not (mpi or torch or slow or gpu)"

# the browser tests/test_site.py drives: Debian's chromium and its driver, installed once where
# this runs as root with apt-get (CI, the course machines); elsewhere that test is skipped and says why
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -q && apt-get install -y -q chromium chromium-driver; \
	else echo "no chromium/chromedriver and not root: tests/test_site.py will be skipped (apt-get install chromium chromium-driver)"; fi

# the course site, into site/ (docs/site.md): open site/index.html, or serve it with
#   python -m http.server -d site 8000
site: $(SITE_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict
	@echo "the site is in site/: open site/index.html"

# the committed figures/, from real runs: about 11 minutes on 2 cores
figures: $(STAMP)
	$(BIN)/minipar figures --into figures

lint: $(STAMP)
	$(BIN)/ruff check .

# re-execute every notebook in place and store it with its outputs (text and figures)
notebooks: $(STAMP)
	$(BIN)/python -m minipar.cli.notebooks

# open the notebooks in JupyterLab (installs the notebooks extra first); as root (a container)
# jupyter refuses to start without --allow-root, so root gets it
lab: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[notebooks]"
	$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/

clean:
	rm -rf $(VENV) tour-output figures-out .pytest_cache site
