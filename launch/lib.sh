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

# count_gpus: the GPUs nvidia-smi ($NVIDIA_SMI) lists on this node (0 without it).
count_gpus() {
    local smi="${NVIDIA_SMI:-nvidia-smi}"
    if command -v "$smi" >/dev/null 2>&1; then "$smi" -L 2>/dev/null | grep -c '^GPU' || true; else echo 0; fi
}

# require_ray COMMAND: exit 2 unless the ray command runs here.
require_ray() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "$1 is not installed here: pip install 'ray[default]==2.55.0' (or use docker/Dockerfile.gpu)" >&2
        exit 2
    fi
}

# free_port: a TCP port on 127.0.0.1 that nothing listens on now, drawn from 20000-31999 (above Ray's worker
# ports, below the kernel's ephemeral range).
free_port() {
    local port tries
    for (( tries = 0; tries < 100; tries++ )); do
        port=$(( 20000 + RANDOM % 12000 ))
        if ! (: <"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return 0; fi
    done
    echo "no free port found on 127.0.0.1 in 100 tries" >&2
    return 1
}

# Background services (launch/eval.sh, launch/smoke_1gpu.sh): each runs in a session of its own (setsid),
# so stopping it stops everything it started (a judge's vLLM, Ray's raylet and workers). The caller sets
# WAIT_S (seconds to wait for each) and runs `trap stop_services EXIT`.
services=()

# start_background LOG COMMAND...: start COMMAND in a session of its own, its output in LOG; sets service_pid.
start_background() {
    local log="$1"
    shift
    setsid "$@" >"$log" 2>&1 &
    service_pid=$!
    services+=("$service_pid")
}

# wait_ready NAME LOG PID CHECK...: wait until CHECK succeeds; exit 1, naming LOG, if PID exits first or
# WAIT_S seconds pass.
wait_ready() {
    local name="$1" log="$2" pid="$3"
    shift 3
    local deadline=$((SECONDS + WAIT_S))
    until "$@" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$name exited before it was ready: see $log" >&2
            exit 1
        fi
        if (( SECONDS > deadline )); then
            echo "$name was not ready within $WAIT_S s: see $log" >&2
            exit 1
        fi
        sleep 2
    done
}

# start_service URL NAME LOG COMMAND...: start an HTTP service unless something already answers at URL,
# then wait until its /health answers.
start_service() {
    local url="$1" name="$2" log="$3"
    shift 3
    if curl -fsS "$url/health" >/dev/null 2>&1; then
        echo "something already answers at $url: stop it, or pass its URL (RETRIEVER_URL / REWARD_URL)" >&2
        exit 1
    fi
    start_background "$log" "$@"
    wait_ready "$name" "$log" "$service_pid" curl -fsS "$url/health"
    echo "$name is up at $url" >&2
}

# group_alive PGID: whether a process of that group is still running (zombies, exited but not reaped, aside).
group_alive() {
    ps -e -o pgid=,stat= | awk -v group="$1" '$1 == group && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

# stop_service PID: stop the service started as PID and everything in its session (SIGTERM, then SIGKILL
# after 30 s), and wait until they are gone.
stop_service() {
    local pid="$1" waited kept=() other
    for other in ${services[@]+"${services[@]}"}; do [[ "$other" == "$pid" ]] || kept+=("$other"); done
    services=(${kept[@]+"${kept[@]}"})
    kill -- "-$pid" 2>/dev/null || return 0
    for (( waited = 0; waited < 30; waited++ )); do
        group_alive "$pid" || break
        sleep 1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# stop_services: stop every service started here, the newest first.
stop_services() {
    while (( ${#services[@]} )); do stop_service "${services[-1]}"; done
}
