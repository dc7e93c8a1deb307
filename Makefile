# The README's quick start: `make demo` and `make test`, each from a fresh machine.
PYTHON ?= python
export PYTHON

.PHONY: install demo demo-training-free sweep-demo test test-fast lint lint-imports

install:  ## install everything into the active Python (idempotent, quick when done)
	bash scripts/install.sh

# F = 0.831: the GMACs fraction IBTM's default ratio 0.7 keeps on the default model (0.026695 of
# 0.032115 GMACs, counted with its class statistics in place), so ToMe is matched to IBTM's cost.
DEMO_MATCH_GMACS ?= 0.831

demo: install  ## the main job on the embedded default: IBTM (fine-tuned) and ToMe vs the baseline, at IBTM's compute
	rm -rf reports/flagship  # the kept report is regenerated whole, not appended to
	$(PYTHON) -m vitbench run --methods ibtm,tome --task cls --match-gmacs $(DEMO_MATCH_GMACS) --out reports/flagship

demo-training-free: install  ## ToMe, PPT and top-k on the embedded default (reports/demo)
	$(PYTHON) -m vitbench run --task cls --methods tome,ppt,topk --param tome.r=4 --param ppt.r=12 --out reports/demo

sweep-demo: install  ## tome, ppt, topk, ltmp and ltm at 5 matched budgets on the embedded default (reports/sweep; trains ltm/ltmp 5 times each, ~30 min on 2 cores)
	$(PYTHON) -m vitbench sweep --task cls --methods tome,ppt,topk,ltmp,ltm --budgets 0.9,0.8,0.7,0.6,0.5 --out reports/sweep

test: install  ## the whole suite, slow end-to-end tests included (what CI runs)
	$(PYTHON) -m pytest -q

test-fast: install  ## the suite without the slow end-to-end tests
	$(PYTHON) -m pytest -q -m "not slow"

lint:
	tox -e lint

lint-imports:  ## the one-way layers: import-linter's contracts in pyproject.toml (also a test in `make test`)
	lint-imports --no-cache
