#!/usr/bin/env bash
# On a GPU machine that reaches no package index, from the root of a checkout that carries
# .gpu-wheels/ (made by deploy/gpu-wheels.sh on a machine that reaches one): install what the
# machine lacks, start a Redis for the tests and write an env file to source.
#
#   bash deploy/gpu-install.sh && . /tmp/rlfleet-site/env.sh
#   python3 -m pytest tests/unit/...        # or: rlfleet up --config ... learner.device=cuda
#
# Nothing goes into the system's Python: the wheels are installed with `pip install --target`
# into RLFLEET_SITE (default /tmp/rlfleet-site), which the env file puts on PYTHONPATH, in
# front of the machine's own packages (torch with CUDA, numpy, ... stay the machine's).
# rlfleet itself runs from this checkout: the `rlfleet` package installed there is replaced by
# links to the checkout's folders, mapped as pyproject.toml's package-dir maps them, so edits
# made after the wheel was built are what runs; the wheel gives the metadata and the `rlfleet`
# command. RLFLEET_FROM_WHEEL=1 keeps the wheel's copy of the code instead.
#
# Redis: .gpu-wheels/redis/ (a redis-server and redis-cli with the shared libraries they
# need), copied to RLFLEET_SITE/redis-server/ and started on 127.0.0.1:REDIS_PORT, in memory
# only (--save '' --appendonly no), as a daemon; the env file puts it on PATH, for the tests
# that start their own. REDIS_PORT=0 starts none; one
# that already answers on the port is left as it is.
#
# Settings (environment): PYTHON (python3), GPU_WHEELS_DIR (.gpu-wheels), RLFLEET_SITE,
# REDIS_PORT (6379), RLFLEET_FROM_WHEEL.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
WHEELS=${GPU_WHEELS_DIR:-.gpu-wheels}
SITE=${RLFLEET_SITE:-/tmp/rlfleet-site}
REDIS_PORT=${REDIS_PORT:-6379}

if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "gpu-install: no wheels in $WHEELS: run deploy/gpu-wheels.sh where a package index" \
       "answers and bring $WHEELS with the checkout" >&2
  exit 1
fi
WHEELS=$(cd "$WHEELS" && pwd)
"$PYTHON" -c 'import sys, torch
print(f"gpu-install: Python {sys.version.split()[0]}, torch {torch.__version__},",
      f"CUDA available: {torch.cuda.is_available()} ({torch.cuda.device_count()} GPUs)")'

# 1. The wheels, exactly those in the folder (no resolution: torch and the other packages the
# machine has are not there to resolve against).
rm -rf "$SITE"
mkdir -p "$SITE"
if "$PYTHON" -m pip --version >/dev/null 2>&1; then
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index \
    --find-links "$WHEELS" --no-deps --target "$SITE" "$WHEELS"/*.whl
else  # no pip: a wheel is a zip laid out for site-packages
  echo "gpu-install: $PYTHON has no pip: unpacking the wheels instead"
  for wheel in "$WHEELS"/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$SITE"; done
  mkdir -p "$SITE/bin"
  printf '#!%s\nimport sys\nfrom rlfleet.cli import main\nsys.exit(main())\n' \
    "$(command -v "$PYTHON")" >"$SITE/bin/rlfleet"
  chmod +x "$SITE/bin/rlfleet"
fi

# 2. rlfleet from this checkout.
if [ -z "${RLFLEET_FROM_WHEEL:-}" ] && [ -f pyproject.toml ] && [ -f services/__init__.py ]; then
  "$PYTHON" - "$SITE" <<'EOF'
import os
import shutil
import sys
import tomllib

site = sys.argv[1]
with open("pyproject.toml", "rb") as f:
    dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
root = os.path.join(site, "rlfleet")
shutil.rmtree(root, ignore_errors=True)
os.makedirs(root)
for entry in os.listdir(dirs["rlfleet"]):  # the top package's own modules and folders
    if entry != "__pycache__":
        os.symlink(os.path.abspath(os.path.join(dirs["rlfleet"], entry)),
                   os.path.join(root, entry))
for package, folder in dirs.items():  # rlfleet.shared -> shared/, ...
    if package != "rlfleet":
        os.symlink(os.path.abspath(folder), os.path.join(root, *package.split(".")[1:]))
print(f"gpu-install: rlfleet runs from {os.getcwd()} ({', '.join(sorted(set(dirs.values())))})")
EOF
fi

# 3. Redis, copied out of the folder so that its mode bits and a read-only checkout do not
# matter.
cp -r "$WHEELS/redis" "$SITE/redis-server"  # not $SITE/redis: that is redis-py
chmod +x "$SITE"/redis-server/bin/* "$SITE"/redis-server/libexec/*
mkdir -p "$SITE/redis-server/data"

ping_redis() {  # PONG from 127.0.0.1:$1, with bash alone
  local reply=""
  { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
  printf 'PING\r\n' >&3
  read -r -t 2 reply <&3 || true
  exec 3>&-
  [[ $reply == +PONG* ]]
}

if [ "$REDIS_PORT" != 0 ]; then
  if ping_redis "$REDIS_PORT"; then
    echo "gpu-install: a Redis already answers on 127.0.0.1:$REDIS_PORT: left as it is"
  else
    "$SITE/redis-server/bin/redis-server" --bind 127.0.0.1 --port "$REDIS_PORT" --save '' \
      --appendonly no --daemonize yes --dir "$SITE/redis-server/data" \
      --logfile "$SITE/redis-server/redis.log" --pidfile "$SITE/redis-server/redis.pid"
    for _ in $(seq 100); do ping_redis "$REDIS_PORT" && break; sleep 0.1; done
    if ! ping_redis "$REDIS_PORT"; then
      echo "gpu-install: redis-server did not answer on 127.0.0.1:$REDIS_PORT" >&2
      cat "$SITE/redis-server/redis.log" >&2 || true
      exit 1
    fi
    echo "gpu-install: redis-server on 127.0.0.1:$REDIS_PORT," \
         "pid $(cat "$SITE/redis-server/redis.pid"), log $SITE/redis-server/redis.log"
  fi
fi

# 4. The env file, and a check that everything imports with it.
cat >"$SITE/env.sh" <<EOF
# Made by deploy/gpu-install.sh: . $SITE/env.sh
export PYTHONPATH="$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="$SITE/bin:$SITE/redis-server/bin:\$PATH"
EOF
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c 'import importlib
for name in ("flask", "pydantic", "cheroot", "gymnasium", "redis", "hiredis", "spectree",
             "zstandard", "lz4", "setproctitle", "matplotlib", "torch", "rlfleet.cli"):
    importlib.import_module(name)
import rlfleet
print("gpu-install: rlfleet imports from", rlfleet.__path__[0])'
echo "gpu-install: done; in this shell:"
echo "  . $SITE/env.sh"
echo "  (that is: export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH};" \
     "export PATH=$SITE/bin:$SITE/redis-server/bin:\$PATH)"
