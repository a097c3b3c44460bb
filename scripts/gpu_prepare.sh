#!/usr/bin/env bash
# Builds .gpu/, what the lent GPU machine lacks for scripts/gpu_check.sh, here on the development
# machine (about 40 s, most of it compressing Ray):
#
#   bash scripts/gpu_prepare.sh        # then, on the GPU: bash scripts/gpu_check.sh [MODE], carrying .gpu
#
# That machine has Python 3.12, torch and fedray's other dependencies, but neither Ray nor what Ray
# imports beyond them (jsonschema, jsonschema-specifications, referencing, rpds-py), nor
# Fashion-MNIST, and nothing to download them from. So .gpu/ holds:
#   site.tar.xz     Ray (this machine's version, its CPython 3.12 wheel) and those packages,
#                   unpacked, without the parts fedray never imports (Ray's Java jars, RLlib, Data,
#                   Serve, Tune, Train, LLM, the dashboard's web client): about 30 MB;
#   fashion-mnist/  the four .gz files (30 MB), from /usr/share/datasets/fashion-mnist;
#   setup.sh        sourced by gpu_check.sh there: unpacks the site once, puts it and the tree on
#                   PYTHONPATH, and puts Fashion-MNIST where fedray looks for it by default.
# All of it stays under the 64 MiB a call may carry. .gpu/ is not committed (.gitignore).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
ray_version=$("$PY" -c 'import ray; print(ray.__version__)')
fmnist=${FMNIST:-/usr/share/datasets/fashion-mnist}
files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
for f in "${files[@]}"; do
    [ -f "$fmnist/$f" ] || { echo "gpu_prepare: $fmnist/$f is missing (apt-get install dataset-fashion-mnist, or FMNIST=DIR)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# --only-binary with a target Python and platform: the wheels that machine's CPython 3.12 on
# x86-64 Linux installs, whatever this machine's Python is
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$work/wheels" "ray==$ray_version" jsonschema jsonschema-specifications referencing rpds-py
mkdir "$work/site"
# unzip keeps the modes the wheel records (Ray's raylet and gcs_server must stay executable)
for w in "$work"/wheels/*.whl; do
    unzip -q -o "$w" -d "$work/site"
done
for part in jars rllib data serve tune train llm dashboard/client; do
    rm -rf "$work/site/ray/$part"
done
rm -rf .gpu.new
mkdir -p .gpu.new/fashion-mnist
tar -C "$work/site" -cf - . | xz -T0 -6 > .gpu.new/site.tar.xz
cp "${files[@]/#/$fmnist/}" .gpu.new/fashion-mnist/
cat > .gpu.new/setup.sh <<EOF
# Sourced by scripts/gpu_check.sh on the GPU machine (written by scripts/gpu_prepare.sh, Ray $ray_version).
gpu_dir=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
site=\${TMPDIR:-/tmp}/fedray-gpu-site-$ray_version
if [ ! -f "\$site/.unpacked" ]; then
    mkdir -p "\$site" && tar -C "\$site" -xJf "\$gpu_dir/site.tar.xz" && touch "\$site/.unpacked" || return 1
fi
export PYTHONPATH="\$site:\$PWD\${PYTHONPATH:+:\$PYTHONPATH}"
# Fashion-MNIST where fedray looks by default (the configs name no data_root)
data=/usr/share/datasets/fashion-mnist
if [ ! -f "\$data/train-images-idx3-ubyte.gz" ]; then
    mkdir -p "\$data" && cp "\$gpu_dir"/fashion-mnist/*.gz "\$data"/ \\
        || { echo "gpu setup: cannot write \$data (not root?)" >&2; return 1; }
fi
python3 -c 'import ray, torch; print(f"gpu setup: ray {ray.__version__}, torch {torch.__version__}, cuda {torch.cuda.is_available()}")' || return 1
EOF
rm -rf .gpu
mv .gpu.new .gpu
du -sh .gpu .gpu/*
