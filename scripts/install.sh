#!/usr/bin/env bash
# Installs vitbench and its stack into the active Python (a venv when one is active): what the cls
# task needs (mmcv without its compiled ops, no mmdet), and with EXTRAS=dense also what det/seg need
# (mmdet, and mmcv with its ops, built from source: minutes). Prints each stage's time.
# Idempotent: each step checks first, and a stamp skips everything when nothing changed.
# The pins live in constraints.txt (the install order below matters: see the comments).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
PIP="$PYTHON -m pip"
EXTRAS=${EXTRAS:-}
case "$EXTRAS" in
    "") extras="test"; checks="mmcv, mmpretrain" ;;
    dense) extras="test,dense"; checks="mmcv, mmcv.ops, mmdet, mmpretrain" ;;
    *) echo "install: error: EXTRAS=$EXTRAS is not an extra; valid: dense (or none)" >&2; exit 2 ;;
esac
imports="import vitbench, vitbench_plugins, $checks, timm, importlinter"
root=$(pwd)
stamp_dir=$($PYTHON -c 'import sys; print(sys.prefix)')/.vitbench-install
key=$(cat pyproject.toml setup.py constraints.txt | sha1sum | cut -c1-16)
stamp="$stamp_dir/$(echo "$root" | sha1sum | cut -c1-16)-$key"  # holds the extras installed
start=$SECONDS
step=$SECONDS
took() { echo "install: $1 in $((SECONDS - step)) s"; step=$SECONDS; }

# up to date: stamped, importable, and the editable install is this tree (a clone elsewhere re-points it).
# Checked from / : run here, `python -c` would import this checkout's own folder and pass for any install.
here="import os, vitbench; assert os.path.realpath(vitbench.__file__).startswith(os.path.realpath('$root') + os.sep)"
if [ -f "$stamp" ] && { [ -z "$EXTRAS" ] || grep -qx "$EXTRAS" "$stamp"; } && (cd / && $PYTHON -c "$imports") 2>/dev/null \
    && (cd / && $PYTHON -c "$here") 2>/dev/null; then
    echo "install: up to date ($PYTHON in $($PYTHON -c 'import sys; print(sys.prefix)')${EXTRAS:+, extras: $EXTRAS})"
    exit 0
fi

# 1. Fashion-MNIST for the embedded default (Debian package), when apt is available.
if [ ! -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] && command -v apt-get >/dev/null; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "install: apt-get install dataset-fashion-mnist"
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq dataset-fashion-mnist; } \
        || echo "install: warning: could not install dataset-fashion-mnist; the default model needs it"
    took "dataset-fashion-mnist installed"
fi

# 2. torch/torchvision pair and the build tools the editable install and mmcv need (pins and
#    reasons: constraints.txt).
if ! $PYTHON -c "import torch, torchvision, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
    echo "install: torch 2.13.0 + torchvision 0.28.0"
    $PIP install -q -c constraints.txt torch torchvision setuptools wheel
fi
$PIP install -q -c constraints.txt setuptools wheel
took "torch ready"

# 3. det/seg only (EXTRAS=dense): mmcv 2.1.0 with its CPU ops, built from source (~7-10 min once;
#    pip caches the wheel). Its files are mmcv-lite's (the cls install's mmcv) plus the compiled
#    ops, so it goes over a cls install as it is.
if [ -n "$EXTRAS" ] && ! $PYTHON -c "import mmcv, mmcv.ops, sys; sys.exit(mmcv.__version__ != '2.1.0')" 2>/dev/null; then
    $PIP install -q -c constraints.txt ninja
    echo "install: building mmcv 2.1.0 with ops (takes minutes the first time)"
    cuda=0; $PYTHON -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null && command -v nvcc >/dev/null && cuda=1
    if [ "$cuda" = 1 ]; then
        # CUDA ops for this GPU's architecture only (all of them take far longer), on every core;
        # no pip cache: a cached CPU-only wheel of the same version would be reused otherwise
        arch=${TORCH_CUDA_ARCH_LIST:-$($PYTHON -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")}
        jobs=${MAX_JOBS:-$(nproc)}
        echo "install: CUDA found: mmcv's CUDA ops for architecture $arch with $jobs jobs (about 5 min on 16 cores)"
        MMCV_WITH_OPS=1 FORCE_CUDA=1 MAX_JOBS=$jobs TORCH_CUDA_ARCH_LIST="$arch" \
            $PIP install -q --no-cache-dir --no-build-isolation -c constraints.txt mmcv
    else
        MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=${MAX_JOBS:-2} $PIP install -q --no-build-isolation -c constraints.txt mmcv
    fi
    took "mmcv with ops built (or taken from pip's wheel cache)"
fi

# 4. vitbench (editable, with the test extra: pytest, import-linter; EXTRAS=dense: mmdet) and its
#    built-in plugins; not the example plugin (`make install-example`, which `make test` runs).
echo "install: vitbench[$extras], mmengine, mmpretrain, timm and the rest"
$PIP install -q --no-build-isolation -c constraints.txt -e ".[$extras]"
$PYTHON -c "$imports"
took "vitbench and the rest installed"

# 5. numba's machine code for ToMe's CPU kernels (vitbench/engine/cpu_kernels.py), kept in numba's
#    cache, so that a first run does not wait for it (about 17 s on 2 cores).
$PYTHON -c "from vitbench.engine import cpu_kernels; cpu_kernels.warm()"
took "CPU kernels compiled"
mkdir -p "$stamp_dir" && rm -f "$stamp_dir/$(echo "$root" | sha1sum | cut -c1-16)"-* && echo "$EXTRAS" > "$stamp"
echo "install: done in $((SECONDS - start)) s${EXTRAS:+ (extras: $EXTRAS)}"
