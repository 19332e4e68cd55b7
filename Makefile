# Two entry points for a fresh machine: `make up` (train CartPole on a local cluster until
# solved) and `make test`. Both create .venv and install the project first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
GAMES  := $(VENV)/.games-stamp
PYTHON ?= python3.11

# The project's own modules compiled once, as pip compiles what it installs: where
# PYTHONDONTWRITEBYTECODE is set (CI machines, containers) every process would otherwise
# compile them again at each start, on the path to `rlfleet up`'s first chunk. A module edited
# later is compiled in memory (Python checks each file's time stamp).
COMPILE = @$(PY) -m compileall -q -j 0 shared coordinator collector learner services >/dev/null

.PHONY: install up test test-all lint bench docs clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(COMPILE)
	@touch $(STAMP)

# The tests also cover the extras (`games`, `atari`, `mujoco`, `envpool`, `datasets`,
# `browser` for the dashboard's test, `docs` for the site's): installed on top, so `make up`
# stays lean.
# One pip run for all of it on a fresh machine (not `.[dev]` first and then again).
$(GAMES): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,games,atari,mujoco,envpool,datasets,browser,video,tables,docs]'
	$(COMPILE)
	@touch $(STAMP) $(GAMES)

install: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/rlfleet up --config configs/cartpole-dqn.yaml --collectors 2

test: $(GAMES)
	@bash .ci/ensure-redis
	@bash .ci/ensure-chromium
	$(PY) -m pytest -q -rs --durations=15

test-all: $(GAMES)
	@bash .ci/ensure-redis
	@bash .ci/ensure-chromium
	$(PY) -m pytest -q -m ''

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The documentation site, built with --strict (a broken link or anchor fails) into a
# temporary folder; `$(VENV)/bin/mkdocs serve` shows it while you edit.
docs: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[docs]'
	@out=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d "$$out/site" \
		&& echo "docs built in $$out/site"

bench: $(STAMP)
	$(PY) bench/throughput.py
	$(PY) bench/time_to_solve.py --algo dqn

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
