#!/usr/bin/env bash
# Shared by scripts/setup.sh and scripts/setup_vllm.sh (source it): the virtual env and its stamp.

# pick_python: $PYTHON, else the first Python 3.10-3.12 on PATH.
pick_python() {
    if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
    for candidate in python3.11 python3.12 python3.10 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then echo "$candidate"; return; fi
    done
    echo "no python3 found: install Python 3.10-3.12 or set PYTHON=/path/to/python" >&2
    exit 2
}

# ensure_venv DIR TAG: create the virtual env DIR unless it exists.
ensure_venv() {
    local venv="$1" tag="$2" py
    if [[ ! -x "$venv/bin/python" ]]; then
        py="$(pick_python)" || exit 2
        echo "[$tag] creating $venv with $($py --version)"
        "$py" -m venv "$venv"
    fi
}

# stamp_matches DIR VALUE: DIR was set up for VALUE (what was installed, recorded by write_stamp).
stamp_matches() {
    [[ -f "$1/.r3rag-setup" && "$(cat "$1/.r3rag-setup")" == "$2" ]]
}

# write_stamp DIR VALUE: record that DIR is set up for VALUE, so a re-run can skip the install.
write_stamp() {
    echo "$2" > "$1/.r3rag-setup"
}
