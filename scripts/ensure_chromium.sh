#!/usr/bin/env bash
# The browser test drives Debian's Chromium (headless) with Playwright; Playwright's own browser
# download does not work here. Installs it once where that is possible (root with apt-get, as on
# CI); otherwise says what to do.
set -u
[ -x /usr/bin/chromium ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
  echo "Installing Debian's chromium for the browser test (once, about a minute)..."
  if apt-get update -qq > /dev/null && DEBIAN_FRONTEND=noninteractive \
     apt-get install -y -qq chromium > /dev/null; then
    exit 0
  fi
  echo "error: apt-get install chromium failed (see above)"
  exit 1
fi
echo "missing: /usr/bin/chromium for the browser test: install Debian's chromium" \
  "(sudo apt-get install chromium), then run the command again"
exit 1
