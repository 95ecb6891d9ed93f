#!/usr/bin/env bash
# Fetch pgTAP's SQL (not on PyPI) from Debian's postgresql-15-pgtap package into
# .cache/pgtap. The package is pure SQL and loads into PostgreSQL 18.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/pgtap
mkdir -p .cache
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! (cd "$work" && apt-get download postgresql-15-pgtap >/dev/null 2>&1); then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq >/dev/null
    else
        sudo apt-get update -qq >/dev/null
    fi
    (cd "$work" && apt-get download postgresql-15-pgtap)
fi
rm -rf "$dest"
dpkg-deb -x "$work"/postgresql-15-pgtap_*.deb "$dest"
test -f "$dest/usr/share/postgresql/15/extension/pgtap.sql"
echo "pgTAP SQL in $dest"
