#!/usr/bin/env bash
# Creates (or refreshes) .venv-tools/: checkov, kubernetes-validate and hadolint for tests/deploy,
# apart from the project's .venv. Idempotent: does nothing while the stamp is newer than the
# requirements. Called by `make test`'s setup; TOOLS_VENV overrides the location.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${TOOLS_VENV:-$root/.venv-tools}"
requirements="$root/tests/deploy/tools-requirements.txt"
stamp="$venv/.installed"
python="${PYTHON:-python3}"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$stamp" -nt "$requirements" ]; then
  exit 0
fi
echo "installing deploy test tools into $venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q -r "$requirements"
touch "$stamp"
