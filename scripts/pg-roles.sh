#!/usr/bin/env bash
# Gives each service its own PostgreSQL role (deploy/postgres/roles.sql) and
# writes each one's DATABASE_URL into OUT_DIR/<service>.url (mode 0600),
# generating a password per role on the first run and keeping it after.
#
#   scripts/pg-roles.sh ADMIN_URL OUT_DIR
#
# ADMIN_URL: a superuser's URL of the platform's database, e.g.
# postgres://postgres@127.0.0.1:5432/leasehold. Safe to run again.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ADMIN_URL=${1:?usage: pg-roles.sh ADMIN_URL OUT_DIR}
OUT=${2:?usage: pg-roles.sh ADMIN_URL OUT_DIR}
PSQL=${PSQL:-psql}

case "$ADMIN_URL" in
    postgres://* | postgresql://*) ;;
    *) echo "pg-roles: ADMIN_URL must be a postgres:// URL" >&2; exit 64 ;;
esac
# The URL's parts: database (path) and the rest, for the services' URLs.
rest=${ADMIN_URL#*://}
hostpart=${rest#*@}
[ "$hostpart" = "$rest" ] && hostpart=$rest
db=${hostpart#*/}; db=${db%%\?*}
query=""; case "$hostpart" in *\?*) query="?${hostpart#*\?}" ;; esac
hostport=${hostpart%%/*}
[ -n "$db" ] && [ "$db" != "$hostpart" ] || { echo "pg-roles: ADMIN_URL names no database" >&2; exit 64; }

umask 077
mkdir -p "$OUT"
password() {
    local f="$OUT/$1.password"
    [ -s "$f" ] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$f"
    cat "$f"
}
gw=$(password gateway); pr=$(password pricing); au=$(password audit)

"$PSQL" -X -q -v ON_ERROR_STOP=1 -v db="$db" \
    -v gateway_password="$gw" -v pricing_password="$pr" -v audit_password="$au" \
    -d "$ADMIN_URL" -f "$ROOT/deploy/postgres/roles.sql" >/dev/null

for svc in gateway pricing audit; do
    printf 'postgres://lh_%s:%s@%s/%s%s\n' "$svc" "$(cat "$OUT/$svc.password")" "$hostport" "$db" "$query" \
        >"$OUT/$svc.url"
done
echo "pg-roles: roles lh_gateway, lh_pricing, lh_audit ready; URLs in $OUT/{gateway,pricing,audit}.url"
