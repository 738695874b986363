#!/usr/bin/env bash
# First start on an empty data directory: initdb with POSTGRES_USER/POSTGRES_PASSWORD, create
# POSTGRES_DB, run /docker-entrypoint-initdb.d/*.sql in it; then (every start) serve on all interfaces
# with password authentication for network clients.
set -euo pipefail
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
USER_NAME="${POSTGRES_USER:-postgres}"
DB="${POSTGRES_DB:-$USER_NAME}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$USER_NAME" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  [ "$DB" = postgres ] || psql -v ON_ERROR_STOP=1 -U "$USER_NAME" -d postgres -c "CREATE DATABASE \"$DB\"" >/dev/null
  for f in /docker-entrypoint-initdb.d/*.sql; do
    [ -e "$f" ] && psql -v ON_ERROR_STOP=1 -U "$USER_NAME" -d "$DB" -f "$f" >/dev/null
  done
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
