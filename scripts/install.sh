#!/usr/bin/env bash
# Installs vitbench and its whole stack into the active Python (a venv when one is active).
# Idempotent: each step checks first, and a stamp skips everything when nothing changed.
# The pins live in constraints.txt (the install order below matters: see the comments).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
PIP="$PYTHON -m pip"
root=$(pwd)
stamp_dir=$($PYTHON -c 'import sys; print(sys.prefix)')/.vitbench-install
key=$(cat pyproject.toml setup.py constraints.txt examples/vitbench-example-plugin/pyproject.toml | sha1sum | cut -c1-16)
stamp="$stamp_dir/$(echo "$root" | sha1sum | cut -c1-16)-$key"

if [ -f "$stamp" ] && $PYTHON -c "import vitbench, vitbench_plugins, vitbench_example_plugin, mmcv.ops, mmdet, mmpretrain, timm, importlinter" 2>/dev/null; then
    echo "install: up to date ($PYTHON in $($PYTHON -c 'import sys; print(sys.prefix)'))"
    exit 0
fi

# 1. Fashion-MNIST for the embedded default (Debian package), when apt is available.
if [ ! -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] && command -v apt-get >/dev/null; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "install: apt-get install dataset-fashion-mnist"
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq dataset-fashion-mnist; } \
        || echo "install: warning: could not install dataset-fashion-mnist; the default model needs it"
fi

# 2. torch/torchvision pair and the build tools mmcv needs (pins and reasons: constraints.txt).
if ! $PYTHON -c "import torch, torchvision, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
    echo "install: torch 2.13.0 + torchvision 0.28.0"
    $PIP install -q -c constraints.txt torch torchvision setuptools wheel ninja
fi
$PIP install -q -c constraints.txt setuptools wheel ninja

# 3. mmcv 2.1.0 with its CPU ops, built from source (~7-10 min once; pip caches the wheel).
if ! $PYTHON -c "import mmcv, mmcv.ops, sys; sys.exit(mmcv.__version__ != '2.1.0')" 2>/dev/null; then
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
fi

# 4. vitbench (editable, with the test extra: pytest, import-linter), its built-in plugins, and the example plugin.
echo "install: vitbench, mmengine, mmdet, mmpretrain, timm and the rest"
$PIP install -q --no-build-isolation -c constraints.txt -e ".[test]" -e examples/vitbench-example-plugin
$PYTHON -c "import vitbench, vitbench_plugins, vitbench_example_plugin, mmcv.ops, mmdet, mmpretrain, timm, importlinter"
mkdir -p "$stamp_dir" && rm -f "$stamp_dir/$(echo "$root" | sha1sum | cut -c1-16)"-* && touch "$stamp"
echo "install: done"
