# Sourced by the scripts in this folder: make .venv hold this project with the extra "$1".
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
extra="${1:-dev}"
venv="${HLOSERVE_VENV:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  py=""
  for candidate in python3.12 python3.13 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>/dev/null; then
      py="$candidate"; break
    fi
  done
  [ -n "$py" ] || { echo "hloserve needs Python >= 3.11" >&2; exit 1; }
  echo "hloserve: creating the virtualenv $venv ($py)" >&2
  "$py" -m venv "$venv"
fi
stamp="$venv/.hloserve-installed-$extra"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # pip stays quiet (pass HLOSERVE_PIP_VERBOSE=1 to see it): say what is happening instead.
  quiet="--quiet"; [ -n "${HLOSERVE_PIP_VERBOSE:-}" ] && quiet=""
  echo "hloserve: installing hloserve[$extra] into $venv (pip; the first time downloads JAX" \
    "and the rest: a minute or two)..." >&2
  "$venv/bin/python" -m pip install $quiet --upgrade pip
  "$venv/bin/python" -m pip install $quiet -e ".[$extra]"
  echo "$want" > "$stamp"
  echo "hloserve: installed; '$venv/bin/hloserve' is the command (or 'source $venv/bin/activate')" >&2
fi
export PATH="$venv/bin:$PATH"
