#!/usr/bin/env bash
# Build, on a machine that reaches a package index, everything a GPU machine without one needs
# to run rlfleet and its tests from this checkout, into .gpu-wheels/ (ignored by git):
#
#   bash deploy/gpu-wheels.sh            # here: wheels, the rlfleet wheel, a redis-server
#   # copy the checkout with .gpu-wheels/ to the GPU machine, then there, from its root:
#   bash deploy/gpu-install.sh           # installs them, starts Redis, writes an env file
#
# The GPU machine it is made for: x86_64 Linux (glibc 2.28 or newer: Ubuntu 24.04 here),
# CPython 3.12, with torch (a CUDA build) and the heavy or common packages already installed:
# those named in GPU_PREINSTALLED below are left out, and so is everything only they need.
# What is left is computed, not listed by hand: the closure of pyproject.toml's
# `dependencies` (plus GPU_EXTRA: what the tests import beyond them), evaluated for Python
# 3.12 on Linux, each pinned to the version this checkout's virtual environment runs (the
# versions the tests pass with), or to what pip picks where that environment lacks it.
#
# Settings (environment): PYTHON (default .venv/bin/python: a Python with pip, setuptools and
# packaging, in which rlfleet is installed), GPU_WHEELS_DIR (default .gpu-wheels),
# GPU_PREINSTALLED, GPU_EXTRA, GPU_PY (3.12.3), GPU_MAX_MIB (refuse a folder above it;
# 56, so that the folder and the working tree copied with it stay under 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
OUT=${GPU_WHEELS_DIR:-.gpu-wheels}
GPU_PY=${GPU_PY:-3.12.3}
GPU_MAX_MIB=${GPU_MAX_MIB:-56}
GPU_PREINSTALLED=${GPU_PREINSTALLED:-"torch numpy pandas rich pyyaml requests safetensors
  tensorboard prometheus-client opencv-python-headless psutil pytest pytest-xdist"}
GPU_EXTRA=${GPU_EXTRA:-"jsonschema pytest-timeout ale-py"}
# Every glibc 2.x tag up to Ubuntu 24.04's 2.39: pip does not widen a --platform by itself.
PLATFORMS=(manylinux2014_x86_64)
for minor in 17 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39; do
  PLATFORMS+=("manylinux_2_${minor}_x86_64")
done

command -v "$PYTHON" >/dev/null || { echo "gpu-wheels: no $PYTHON (set PYTHON)" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"

# 1. What to download: name==version, one a line.
"$PYTHON" - "$GPU_PY" "$GPU_PREINSTALLED" "$GPU_EXTRA" >"$OUT/requirements.txt" <<'EOF'
import importlib.metadata as md
import sys
import tomllib

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

py, preinstalled, extra = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
skip = {canonicalize_name(n) for n in preinstalled}
target = {"python_version": ".".join(py.split(".")[:2]), "python_full_version": py,
          "implementation_name": "cpython", "platform_python_implementation": "CPython",
          "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
          "os_name": "posix"}

with open("pyproject.toml", "rb") as f:
    roots = tomllib.load(f)["project"]["dependencies"] + extra

pins: dict[str, str] = {}
expanded: set[tuple[str, str]] = set()
todo = [Requirement(r) for r in roots]
while todo:
    req = todo.pop()
    name = canonicalize_name(req.name)
    if name in skip:
        continue
    try:
        dist = md.distribution(req.name)
    except md.PackageNotFoundError:  # not in this environment: pip picks a version
        pins.setdefault(name, f"{req.name}{req.specifier}")
        continue
    if req.specifier and not req.specifier.contains(dist.version, prereleases=True):
        sys.exit(f"gpu-wheels: {req} is wanted, this environment has {name} {dist.version}")
    pins[name] = f"{dist.metadata['Name']}=={dist.version}"
    for wanted_extra in {"", *req.extras}:
        if (name, wanted_extra) in expanded:
            continue
        expanded.add((name, wanted_extra))
        for line in dist.requires or ():
            dep = Requirement(line)
            if dep.marker is None or dep.marker.evaluate({**target, "extra": wanted_extra}):
                todo.append(dep)

print("\n".join(pins[n] for n in sorted(pins)))
EOF
echo "gpu-wheels: $(wc -l <"$OUT/requirements.txt") packages for CPython $GPU_PY:" \
     "$(tr '\n' ' ' <"$OUT/requirements.txt")"

# 2. Their wheels, binary only, for the GPU machine's Python and platform, no dependencies
# (the list is already the closure; pip would otherwise pull torch and numpy in again).
platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
# (A pip configured with a local index that lacks a package warns about each: dropped.)
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
  --python-version "$GPU_PY" "${platform_args[@]}" -d "$OUT" -r "$OUT/requirements.txt" \
  2> >(sed '/is neither a file nor a directory/d' >&2)

# 3. rlfleet's own wheel, from a copy of what the wheel is built from (this working tree,
# uncommitted files included), so the build leaves nothing behind in the checkout.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
mapfile -t package_dirs < <("$PYTHON" -c 'import tomllib
dirs = tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"]
print("\n".join(sorted(set(dirs.values()))))')
tar --exclude=__pycache__ --exclude='*.pyc' -cf - pyproject.toml README.md "${package_dirs[@]}" \
  | tar -xf - -C "$src"
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w "$OUT" "$src"

# 4. A redis-server (and redis-cli) with the shared libraries that a base Ubuntu 24.04 image
# lacks, or may lack: all but glibc's own and those every Ubuntu base image has. The wrapper
# in redis/bin sets LD_LIBRARY_PATH for that process alone. (/usr/bin/redis-server is a
# link to redis-check-rdb, which acts by the name it is run as: so the copy is named
# redis-server.)
BASE_LIBS="linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0
  librt.so.1 libresolv.so.2 libutil.so.1 libstdc++.so.6 libgcc_s.so.1 libsystemd.so.0 libcap.so.2
  libgcrypt.so.20 libgpg-error.so.0 liblzma.so.5 libzstd.so.1 liblz4.so.1 libselinux.so.1
  libpcre2-8.so.0 libz.so.1"
mkdir -p "$OUT/redis/bin" "$OUT/redis/libexec" "$OUT/redis/lib"
for tool in redis-server redis-cli; do
  found=$(command -v "$tool") || { echo "gpu-wheels: no $tool on this machine" \
                                        "(apt-get install redis-server)" >&2; exit 1; }
  cp -L "$found" "$OUT/redis/libexec/$tool"
  ldd "$found" | while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] && [ -f "$path" ] || continue
    case " $(echo $BASE_LIBS) " in *" $soname "*) continue ;; esac
    cp -L "$path" "$OUT/redis/lib/$soname"
  done
  cat >"$OUT/redis/bin/$tool" <<EOF
#!/bin/sh
# $("$OUT/redis/libexec/$tool" --version | head -n 1), from $(. /etc/os-release && echo "$PRETTY_NAME")
here=\$(CDPATH= cd -- "\$(dirname -- "\$0")/.." && pwd)
LD_LIBRARY_PATH="\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/libexec/$tool" "\$@"
EOF
  chmod +x "$OUT/redis/bin/$tool" "$OUT/redis/libexec/$tool"
done
"$OUT/redis/bin/redis-server" --version >/dev/null

# 5. What came out, and its size: the folder travels with the working tree.
ls "$OUT"/*.whl | sed 's|.*/|  |'
echo "  redis/: $(ls "$OUT/redis/libexec" | tr '\n' ' ')+ $(ls "$OUT/redis/lib" | tr '\n' ' ')"
mib=$(( $(du -sk "$OUT" | cut -f1) / 1024 ))
echo "gpu-wheels: $(ls "$OUT"/*.whl | wc -l) wheels and redis in $OUT: $(du -sh "$OUT" | cut -f1)"
if [ "$mib" -gt "$GPU_MAX_MIB" ]; then
  echo "gpu-wheels: $OUT is $mib MiB, above GPU_MAX_MIB=$GPU_MAX_MIB" >&2
  exit 1
fi
