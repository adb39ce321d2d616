# shellcheck shell=bash
# Shared by bin/demo and bin/test (sourced, not executed).
#
#   venv_ensure ROOT   create ROOT/.venv when missing, (re)install the project with its
#                      `test` extra when pyproject.toml is newer than the install stamp,
#                      then put the venv first on PATH.
#
# Environment: PYTHON  interpreter used to create the venv (default: python3.11, else python3).

# Echo the first interpreter that satisfies requires-python (>=3.11,<3.12).
_venv_pick_python() {
    local candidate
    for candidate in ${PYTHON:-} python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

venv_ensure() {
    local root="$1"
    local venv="$root/.venv"
    local stamp="$venv/.dunning-installed"
    local python

    # A venv whose interpreter is gone or is not 3.11 (e.g. copied from another machine) is rebuilt.
    if [ -e "$venv" ] && ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
        >/dev/null 2>&1; then
        echo "==> .venv is broken or not Python 3.11; recreating it"
        rm -rf "$venv"
    fi

    if [ ! -e "$venv/bin/python" ]; then
        if ! python="$(_venv_pick_python)"; then
            echo "error: Python 3.11 is required (tried: ${PYTHON:-} python3.11 python3)." >&2
            echo "       Install it, or point PYTHON at a 3.11 interpreter." >&2
            return 1
        fi
        echo "==> creating virtualenv .venv ($("$python" --version 2>&1))"
        if ! "$python" -m venv "$venv"; then
            rm -rf "$venv"
            echo "error: '$python -m venv' failed. On Debian/Ubuntu: apt-get install python3-venv" >&2
            return 1
        fi
    fi

    if [ ! -e "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
        echo "==> installing dependencies (pip install -e '.[test]')"
        (cd "$root" && PYTHONWARNINGS=ignore::UserWarning "$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]') || {
            echo "error: dependency installation failed (see pip output above)" >&2
            return 1
        }
        touch "$stamp"
    fi

    export VIRTUAL_ENV="$venv"
    export PATH="$venv/bin:$PATH"
    unset PYTHONHOME
}

# Print a database URL with any password replaced by ***.
redact_url() {
    sed -E 's#^([a-zA-Z0-9+.-]+://[^:/@]*):[^@]*@#\1:***@#' <<<"$1"
}
