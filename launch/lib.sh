#!/usr/bin/env bash
# Shared by the launch scripts (source it): --dry-run handling, command printing, checks of variables.

# split_dry_run ARGS...: sets dry_run (0/1) and extra (every argument but --dry-run) for the caller.
# shellcheck disable=SC2034
split_dry_run() {
    dry_run=0
    extra=()
    local arg
    for arg in "$@"; do
        if [[ "$arg" == "--dry-run" ]]; then dry_run=1; else extra+=("$arg"); fi
    done
}

# print_command ARGS...: one shell-quoted line that can be pasted back into a shell.
print_command() {
    printf '%q ' "$@"
    echo
}

# warn_if_exposed HOST KEY_VARIABLE: a service bound beyond this machine without a token is open to anyone.
warn_if_exposed() {
    local host="$1" key_variable="$2"
    if [[ -n "$host" && "$host" != "127.0.0.1" && "$host" != "localhost" && -z "${!key_variable:-}" ]]; then
        echo "warning: serving on $host without $key_variable: anyone on the network can use it" >&2
    fi
}

# require_int MIN NAME...: exit 2, naming the variable, unless each named variable is a whole number >= MIN.
require_int() {
    local min="$1" name
    shift
    for name in "$@"; do
        if [[ ! "${!name:-}" =~ ^(0|[1-9][0-9]{0,17})$ ]] || (( ${!name} < min )); then
            echo "$name must be a whole number of $min or more, got '${!name:-}'" >&2
            exit 2
        fi
    done
}

# require_number NAME...: exit 2, naming the variable, unless each named variable is a number of 0 or more
# written as JSON and OpenRLHF's flags read it (2, 0.3, 1e-6).
require_number() {
    local name
    for name in "$@"; do
        if [[ ! "${!name:-}" =~ ^(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; then
            echo "$name must be a number of 0 or more (like 0.3 or 1e-6), got '${!name:-}'" >&2
            exit 2
        fi
    done
}

# count_gpus: the GPUs nvidia-smi lists on this node (0 without it).
count_gpus() {
    if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true; else echo 0; fi
}

# require_ray COMMAND: exit 2 unless the ray command runs here.
require_ray() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "$1 is not installed here: pip install 'ray[default]==2.55.0' (or use docker/Dockerfile.gpu)" >&2
        exit 2
    fi
}
