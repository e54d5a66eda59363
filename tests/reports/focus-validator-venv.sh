#!/usr/bin/env bash
# Creates (or refreshes) .venv-focus/: focus-validator for tests/reports/focus_checks.py, on Python 3.12
# (it needs >= 3.12; the project's .venv may be 3.11). Idempotent: does nothing while the stamp is
# newer than the requirements. Called by `make test`'s setup; FOCUS_VENV overrides the location,
# PYTHON312 the interpreter (default: python3.12 on PATH, else pyenv's newest 3.12).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${FOCUS_VENV:-$root/.venv-focus}"
requirements="$root/tests/reports/focus-validator-requirements.txt"
stamp="$venv/.installed"

if [ -x "$venv/bin/focus-validator" ] && [ -f "$stamp" ] && [ "$stamp" -nt "$requirements" ]; then
  exit 0
fi
is_312() { [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; }
python=""
pyenv_root="$( (pyenv root 2>/dev/null) || echo "$HOME/.pyenv")"
# the first that runs as 3.12: a pyenv shim on PATH may name a version it cannot run
for candidate in "${PYTHON312:-}" "$(command -v python3.12 || true)" \
  $(ls -d "$pyenv_root"/versions/3.12*/bin/python3.12 2>/dev/null | sort -rV); do
  if is_312 "$candidate"; then python="$candidate"; break; fi
done
if [ -z "$python" ]; then
  echo "focus-validator-venv.sh: no Python 3.12 found (python3.12 on PATH, pyenv, or PYTHON312=...)" >&2
  exit 1
fi
echo "installing focus-validator into $venv ($python)"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q -r "$requirements"
touch "$stamp"
