#!/usr/bin/env bash
# Set up .venv-docs: MkDocs, the Material theme and mkdocstrings (requirements/docs.txt), which build the
# docs site (mkdocs.yml, docs/). scripts/setup_lint.sh runs it; tests/test_docs.py builds the site with
# `mkdocs build --strict`. An env of its own: mkdocs-material needs a newer requests than docker-compose
# (.venv-lint) runs with. mkdocstrings reads the code statically, so this env does not install r3rag.
#
#   bash scripts/setup_docs.sh
#   .venv-docs/bin/mkdocs build --strict -d site    # or `mkdocs serve` while editing
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=.venv-docs
REQS=requirements/docs.txt

# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ensure_venv "$VENV" setup-docs
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

stamp_value="$(sha256sum "$REQS" | cut -c1-16)"
if stamp_matches "$VENV" "$stamp_value"; then
    echo "[setup-docs] $VENV is up to date"
    exit 0
fi
start=$SECONDS
"${PIP[@]}" install -q -r "$REQS"
write_stamp "$VENV" "$stamp_value"
echo "[setup-docs] done in $((SECONDS - start)) s: $VENV"
