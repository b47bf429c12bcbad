#!/usr/bin/env bash
# Debian's packages that tests drive as real programs: Chromium (headless, through Playwright:
# its own browser download does not work here) for the browser tests, PostgreSQL and Redis for
# the fleet's tests (Airflow's metadata database and the Celery broker, tests/e2e/test_fleet.py).
# Installs what is missing once, where that is possible (root with apt-get, as on CI);
# otherwise says what to do.
set -u
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v redis-server > /dev/null || missing+=(redis-server)
{ command -v pg_ctl || ls /usr/lib/postgresql/*/bin/pg_ctl; } > /dev/null 2>&1 || missing+=(postgresql)
[ "${#missing[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
  echo "Installing Debian's ${missing[*]} for the tests (once, a minute or two)..."
  if apt-get update -qq > /dev/null && DEBIAN_FRONTEND=noninteractive \
     apt-get install -y -qq "${missing[@]}" > /dev/null; then
    # Debian starts the servers it installs; the tests start their own on other ports.
    for service in redis-server postgresql; do
      command -v service > /dev/null && service "$service" stop > /dev/null 2>&1
    done
    exit 0
  fi
  echo "error: apt-get install ${missing[*]} failed (see above)"
  exit 1
fi
echo "missing: ${missing[*]} for the tests: install Debian's packages" \
  "(sudo apt-get install ${missing[*]}), then run the command again"
exit 1
