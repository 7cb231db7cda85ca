#!/usr/bin/env bash
# Browser tests' tools: Debian's Chromium (/usr/bin/chromium) and playwright-core from npm (tests/browser).
#
#   bash scripts/setup_browser.sh
#
# Playwright drives the system Chromium; it never downloads a browser of its own. Installing
# Chromium needs root (apt-get); on a machine where that is not possible the report's browser
# test skips with a message. Re-running is cheap: both steps are skipped when already done.
set -euo pipefail

cd "$(dirname "$0")/.."

if [[ -x /usr/bin/chromium ]]; then
    echo "[setup_browser] /usr/bin/chromium is installed"
else
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
        echo "[setup_browser] /usr/bin/chromium is missing and apt-get cannot run here: the browser test will skip" >&2
    else
        echo "[setup_browser] apt-get install chromium chromium-driver"
        packages=(chromium chromium-driver)
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null; then
            apt-get update -q >/dev/null
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null
        fi
    fi
fi

if ! command -v npm >/dev/null; then
    echo "[setup_browser] npm is missing: the browser test will skip (install Node.js 20 or newer)" >&2
    exit 0
fi
stamp=tests/browser/node_modules/.r3rag-stamp
lock_hash="$(sha256sum tests/browser/package-lock.json | cut -c1-16)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$lock_hash" ]]; then
    echo "[setup_browser] tests/browser/node_modules is up to date"
    exit 0
fi
echo "[setup_browser] npm ci in tests/browser (playwright-core)"
(cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
echo "$lock_hash" >"$stamp"
echo "[setup_browser] done"
