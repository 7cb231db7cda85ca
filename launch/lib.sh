#!/usr/bin/env bash
# Shared by the launch scripts (source it): --dry-run handling and command printing.

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
