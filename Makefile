# The README's quick start: `make demo` and `make test`, each from a fresh machine.
PYTHON ?= python
export PYTHON
# `make install EXTRAS=dense` is `make install-dense`
EXTRAS ?=
export EXTRAS

.PHONY: install install-dense install-example demo demo-training-free sweep-demo test test-fast test-retrain docs lint lint-imports

install:  ## what the cls task needs, into the active Python (idempotent, quick when done)
	bash scripts/install.sh

install-dense:  ## also what det/seg need: mmdet, and mmcv's ops (compiled: minutes the first time)
	EXTRAS=dense bash scripts/install.sh

# the example plugin (random-drop, the agreement task, --agreement-top) is for the tests, not for users
install-example:  ## the example plugin (examples/vitbench-example-plugin), which the suite tests
	$(PYTHON) -c "import os, vitbench_example_plugin as m; assert os.path.realpath(m.__file__).startswith(os.path.realpath('examples'))" 2>/dev/null \
		|| $(PYTHON) -m pip install -q --no-deps --no-build-isolation -e examples/vitbench-example-plugin

# F = 0.735: the GMACs fraction IBTM's default ratio 0.7 keeps on the default model (0.25788 of
# 0.35093 GMACs; its IB step in training only), so ToMe and the random control run at IBTM's cost.
DEMO_MATCH_GMACS ?= 0.735
# the speed-up against batch size: where each method starts to pay (the report's batch plot)
DEMO_BATCH_SIZES ?= 1,8,32,128

demo: install  ## the main job on the embedded default: IBTM (shipped 1-epoch weights), ToMe and random vs the baseline, at IBTM's compute
	rm -rf reports/flagship  # the kept report is regenerated whole, not appended to
	$(PYTHON) -m vitbench run --methods ibtm,tome,random --task cls --match-gmacs $(DEMO_MATCH_GMACS) \
		--batch-sizes $(DEMO_BATCH_SIZES) --out reports/flagship

demo-training-free: install  ## ToMe, PPT and top-k at 0.7x the baseline's GMACs on the embedded default (reports/demo)
	rm -rf reports/demo  # the kept report is regenerated whole, not appended to
	$(PYTHON) -m vitbench run --task cls --methods tome,ppt,topk --match-gmacs 0.7 --out reports/demo

sweep-demo: install  ## tome, ppt, topk, ltmp and ltm at 5 matched budgets on the embedded default (reports/sweep; trains ltm/ltmp 5 times each on 1,000 images: hours on 2 cores)
	$(PYTHON) -m vitbench sweep --task cls --methods tome,ppt,topk,ltmp,ltm --budgets 0.9,0.8,0.7,0.6,0.5 --train-limit 1000 --out reports/sweep

test: install-dense install-example  ## the whole suite, slow end-to-end tests included (what CI runs)
	$(PYTHON) -m pytest -q

test-fast: install-dense install-example  ## the suite without the slow end-to-end tests
	$(PYTHON) -m pytest -q -m "not slow"

test-retrain: install  ## retrain the default model and check it reproduces the shipped one (about 2 hours on 2 cores)
	$(PYTHON) -m pytest -q -m retrain tests/tasks/test_cls_default_retrain.py

docs: install  ## the documentation site into site/ (mkdocs --strict; installs the docs extra once)
	$(PYTHON) -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null \
		|| $(PYTHON) -m pip install -q --no-build-isolation -c constraints.txt -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --site-dir site

lint:
	tox -e lint

lint-imports:  ## the one-way layers: import-linter's contracts in pyproject.toml (also a test in `make test`)
	lint-imports --no-cache
