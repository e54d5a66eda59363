# Sourced by run.sh and xid.sh from the repo root on the GPU node: gpumeter and the runtime wheels it needs
# installed from .whl/ (no registry is reachable there, docs/real-gpu.md), OUT and REPO set, and
# D=$OUT/$1 made for the evidence. The caller then leaves the repo root, whose gpumeter/ folder would
# shadow the installed package.
set -u
OUT=${OUT:-/tmp/real-gpu-out}
REPO=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/$1; mkdir -p "$D"
