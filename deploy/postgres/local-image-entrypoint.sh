#!/bin/sh
# The entrypoint of localhost/leasehold/postgres:15, the stand-in that
# scripts/images.sh makes from Debian's postgresql-15 for the official
# postgres:15 image where no registry is reachable (compose under podman,
# scripts/compose.sh). It does what the official entrypoint does with what
# docker-compose.yml passes it, and no more:
#
#   - a command that is not the server (psql, sh: postgres-roles and
#     master-key run the image that way) runs as it is;
#   - as root it gives PGDATA to the postgres user and runs itself again as
#     that user;
#   - on an empty PGDATA it makes the cluster: superuser POSTGRES_USER
#     (postgres) with POSTGRES_PASSWORD (required unless
#     POSTGRES_HOST_AUTH_METHOD=trust), POSTGRES_INITDB_ARGS, the database
#     POSTGRES_DB (POSTGRES_USER), connections from the network with
#     POSTGRES_HOST_AUTH_METHOD (scram-sha-256), the socket without a
#     password; then the *.sh and *.sql of /docker-entrypoint-initdb.d, on
#     a server that listens on its socket only;
#   - then the server, listening on every address (the container's).
set -eu

if [ $# -eq 0 ]; then
    set -- postgres
elif [ "${1#-}" != "$1" ]; then
    set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
    exec "$@"
fi

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    # A fresh volume is root's; anything already the cluster's stays as is.
    chown postgres:postgres "$PGDATA"
    chmod 0700 "$PGDATA"
    chown postgres:postgres /var/run/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

POSTGRES_USER=${POSTGRES_USER:-postgres}
POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
AUTH=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}

if ! [ -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$AUTH" != trust ]; then
        echo "postgres: POSTGRES_PASSWORD is not set (or set POSTGRES_HOST_AUTH_METHOD=trust)" >&2
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of flags.
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
        --auth-host="$AUTH" ${POSTGRES_INITDB_ARGS:-} >/dev/null
    rm -f "$pwfile"
    printf '\nhost all all all %s\n' "$AUTH" >>"$PGDATA/pg_hba.conf"
    printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"

    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    psql="psql -X -v ON_ERROR_STOP=1 --username=$POSTGRES_USER --no-password"
    if [ "$POSTGRES_DB" != postgres ]; then
        $psql --dbname=postgres -q -v db="$POSTGRES_DB" <<'EOF'
CREATE DATABASE :"db";
EOF
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case $f in
            *.sh)
                echo "postgres: running $f" >&2
                if [ -x "$f" ]; then "$f"; else . "$f"; fi
                ;;
            *.sql)
                echo "postgres: running $f" >&2
                $psql --dbname="$POSTGRES_DB" -f "$f"
                ;;
            */\*) ;;
            *) echo "postgres: ignoring $f" >&2 ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "postgres: cluster made in $PGDATA" >&2
fi

exec "$@"
