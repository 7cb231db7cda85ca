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

# require_free_space GB TAG: stop with a clear message, before pip starts, when the project's disk
# or pip's temporary folder ($TMPDIR, else /tmp) has less than GB gigabytes free. A full disk would
# otherwise stop pip halfway with "[Errno 28] No space left on device" and a half-built env.
require_free_space() {
    local need_gb="$1" tag="$2" dir free_kb
    for dir in . "${TMPDIR:-/tmp}"; do
        if [[ ! -d "$dir" ]]; then
            echo "[$tag] TMPDIR=$dir is not a folder: create it, or unset TMPDIR to use /tmp." >&2
            exit 2
        fi
        free_kb="$(df -Pk "$dir" | awk 'NR == 2 {print $4}')"
        if (( free_kb < need_gb * 1024 * 1024 )); then
            echo "[$tag] $(cd "$dir" && pwd) has $((free_kb / 1024)) MB free; this install needs about ${need_gb} GB" \
                "there (the env and pip's unpacked wheels). Free some space, or point TMPDIR at a disk" \
                "with room, and rerun." >&2
            exit 2
        fi
    done
}
