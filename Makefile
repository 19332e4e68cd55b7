# Two entry points for a fresh machine: `make up` (train CartPole on a local cluster until
# solved) and `make test`. Both create .venv and install the project first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
GAMES  := $(VENV)/.games-stamp
PYTHON ?= python3.11
# The exact torch (and whatever else needs pinning) every install here uses; pyproject.toml
# declares the range users get. README, "Pythons and torch".
CONSTRAINTS ?= constraints/pinned.txt
PIP_INSTALL  = -m pip install --quiet --disable-pip-version-check -c $(CONSTRAINTS)

# `make test-py313`: Python 3.13 with the newest torch of the range (PyPI's build, several GB
# at its first install), in a virtual environment of its own.
PY313      ?= python3.13
VENV313    ?= .venv313
STAMP313   := $(VENV313)/.installed-stamp
# Every extra: each has wheels for 3.13.
EXTRAS313  ?= dev,games,atari,mujoco,envpool,datasets,browser,video,tables,docs,notebook,server,mlflow
# What it runs there: the unit suite, the wheel's tests, and the must-show test (the wheel in a
# fresh 3.13 venv that already has a torch; RLFLEET_PY313 selects it). The whole suite on 3.13:
#   make test-py313 PY313_TESTS='tests' PY313_ARGS=
PY313_TESTS ?= tests/unit tests/integration/test_wheel.py tests/integration/test_py313.py
PY313_ARGS  ?= --durations=10

# The project's own modules compiled once, as pip compiles what it installs: where
# PYTHONDONTWRITEBYTECODE is set (CI machines, containers) every process would otherwise
# compile them again at each start, on the path to `rlfleet up`'s first chunk. A module edited
# later is compiled in memory (Python checks each file's time stamp).
COMPILE = @$(PY) -m compileall -q -j 0 shared coordinator collector learner services >/dev/null

.PHONY: install up test test-all test-py313 lint bench docs clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) $(PIP_INSTALL) -e '.[dev]'
	$(COMPILE)
	@touch $(STAMP)

# The tests also cover the extras (`games`, `atari`, `mujoco`, `envpool`, `datasets`,
# `browser` for the dashboard's test, `docs` for the site's): installed on top, so `make up`
# stays lean.
# One pip run for all of it on a fresh machine (not `.[dev]` first and then again).
$(GAMES): pyproject.toml $(CONSTRAINTS)
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) $(PIP_INSTALL) -e '.[dev,games,atari,mujoco,envpool,datasets,browser,video,tables,docs,mlflow]'
	$(COMPILE)
	@touch $(STAMP) $(GAMES)

install: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/rlfleet up --config configs/cartpole-dqn.yaml --collectors 2

# The unit suite on two workers (pytest-xdist): its tests are independent and mostly wait on
# their coordinators, so two at a time take about 60% of the time one at a time does. The
# other suites on two workers too, a module to a worker, the longest modules first
# (tests/conftest.py): a cluster test keeps about one core busy. Then the tests marked
# `alone`, one at a time: each holds a wall-clock budget or a heartbeat a second test could
# starve.
SUITES = tests/integration tests/chaos tests/netns tests/compose tests/slurm
PARALLEL = -n 2 --dist loadscope --no-loadscope-reorder

test: $(GAMES)
	@bash .ci/ensure-redis
	@bash .ci/ensure-chromium
	@bash .ci/ensure-slurm
	$(PY) -m pytest -q -rs --durations=10 -n 2 tests/unit
	$(PY) -m pytest -q -rs --durations=15 $(PARALLEL) -m 'not slow and not alone' $(SUITES)
	$(PY) -m pytest -q -rs --durations=5 -m 'alone and not slow' $(SUITES)

test-all: $(GAMES)
	@bash .ci/ensure-redis
	@bash .ci/ensure-chromium
	@bash .ci/ensure-slurm
	$(PY) -m pytest -q -m ''

# Python 3.13 and torch at the top of the range (constraints/newest.txt instead of the pin).
$(STAMP313): pyproject.toml constraints/newest.txt
	@$(PY313) --version >/dev/null 2>&1 || { echo "need $(PY313): make test-py313 PY313=/path/to/python3.13"; exit 1; }
	@test -x $(VENV313)/bin/python || $(PY313) -m venv $(VENV313)
	$(VENV313)/bin/python -m pip install --quiet --disable-pip-version-check \
		-c constraints/newest.txt -e '.[$(EXTRAS313)]'
	@touch $(STAMP313)

test-py313: $(STAMP313)
	@bash .ci/ensure-redis
	@bash .ci/ensure-chromium
	RLFLEET_PY313=$(PY313) $(VENV313)/bin/python -m pytest -q -rs $(PY313_ARGS) $(PY313_TESTS)

# ruff, then mypy over the `rlfleet` package (configured in pyproject.toml; .ci/typecheck.py
# lays the package out for it from package-dir, then names the real files in what it says).
# Its cache, .mypy_cache/, is kept between runs.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) .ci/typecheck.py

# The documentation site, built with --strict (a broken link or anchor fails) into a
# temporary folder; `$(VENV)/bin/mkdocs serve` shows it while you edit.
docs: $(STAMP)
	$(PY) $(PIP_INSTALL) -e '.[docs]'
	@out=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d "$$out/site" \
		&& echo "docs built in $$out/site"

bench: $(STAMP)
	$(PY) -m bench.throughput
	$(PY) -m bench.time_to_solve --algo dqn

clean:
	rm -rf $(VENV) $(VENV313) runs .pytest_cache .ruff_cache .mypy_cache build/typecheck
