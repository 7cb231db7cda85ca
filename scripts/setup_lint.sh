#!/usr/bin/env bash
# Set up .venv-lint: hadolint (the Dockerfiles) and docker-compose v1 (`docker-compose config` validates
# docker/compose.yaml against the Compose spec without a Docker engine), for tests/test_docker.py; then
# .venv-docs (scripts/setup_docs.sh), the docs site's tools, for tests/test_docs.py.
#
#   bash scripts/setup_lint.sh
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=.venv-lint
REQS=requirements/lint.txt

# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ensure_venv "$VENV" setup-lint
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

stamp_value="$(sha256sum "$REQS" | cut -c1-16)"
if stamp_matches "$VENV" "$stamp_value"; then
    echo "[setup-lint] $VENV is up to date"
    bash scripts/setup_docs.sh
    exit 0
fi
start=$SECONDS
"${PIP[@]}" install -q -r "$REQS"
"${PIP[@]}" install -q --no-deps docker-compose==1.29.2
write_stamp "$VENV" "$stamp_value"
echo "[setup-lint] done in $((SECONDS - start)) s: $VENV"
bash scripts/setup_docs.sh
