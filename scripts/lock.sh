#!/usr/bin/env bash
# Regenerate requirements/cpu.lock from the current .venv (after changing a pin in setup.py):
#   rm -rf .venv && : > requirements/cpu.lock && bash scripts/setup.sh cpu,test && bash scripts/lock.sh
set -euo pipefail
cd "$(dirname "$0")/.."
{
    echo "# Every package of the tested CPU environment, pinned (pip freeze of .venv after scripts/setup.sh cpu,test)."
    echo "# Used as pip constraints by scripts/setup.sh. Regenerate with: bash scripts/lock.sh"
    .venv/bin/python -m pip freeze --disable-pip-version-check | grep -v '^-e ' | grep -vi '^r3rag' | sed 's/+cpu$//'
} > requirements/cpu.lock.new
mv requirements/cpu.lock.new requirements/cpu.lock
echo "wrote requirements/cpu.lock ($(grep -vc '^#' requirements/cpu.lock) packages)"
