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
