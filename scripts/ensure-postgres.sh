#!/usr/bin/env bash
# A PostgreSQL server on 127.0.0.1:5432 with the role the tests use (sbx_test, may create
# databases). Uses a server that answers; else, as root on Debian, installs Debian's
# postgresql package when missing and starts its cluster. The tests make and drop their own
# databases; nothing else on the server is touched.
set -euo pipefail
PORT="${SBX_TEST_PG_PORT:-5432}"

answers() { pg_isready -q -h 127.0.0.1 -p "$PORT" 2>/dev/null; }
as_postgres() { runuser -u postgres -- "$@"; }

if ! answers; then
    if [ "$(id -u)" != 0 ]; then
        echo "ensure-postgres: no PostgreSQL answers on 127.0.0.1:$PORT; start one, or run as root" >&2
        exit 1
    fi
    if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
    version="$(ls /usr/lib/postgresql | sort -V | tail -1)"
    if ! pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main"' | grep -q .; then
        pg_createcluster "$version" main --port "$PORT" >/dev/null
    fi
    pg_ctlcluster "$version" main start
    for _ in $(seq 1 50); do answers && break; sleep 0.2; done
    answers || { echo "ensure-postgres: PostgreSQL $version did not start" >&2; exit 1; }
fi

if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then
    if ! as_postgres psql -p "$PORT" -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'sbx_test'" | grep -q 1; then
        as_postgres psql -p "$PORT" -q -c "CREATE ROLE sbx_test LOGIN CREATEDB PASSWORD 'sbx_test'"
    fi
    # DROP DATABASE ... WITH (FORCE) ends the sessions on the test's database; an autovacuum
    # worker there belongs to no role, and only pg_signal_backend may end it.
    as_postgres psql -p "$PORT" -q -c "GRANT pg_signal_backend TO sbx_test" 2>/dev/null
fi
echo "PostgreSQL answers on 127.0.0.1:$PORT"
