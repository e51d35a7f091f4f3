#!/usr/bin/env bash
# The report tests' browser: Debian's headless Chromium, a system package (apt-get, as root or
# with sudo). Run by .ci/run, never by commands/test.sh; run it yourself to have the browser
# tests run too. Does nothing when chromium is already on PATH.
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
command -v apt-get >/dev/null 2>&1 || { echo "install_browser: no apt-get here; install Chromium yourself" >&2; exit 1; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
{ $SUDO apt-get install -y -qq chromium || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium; }; } >/dev/null
command -v chromium >/dev/null 2>&1
