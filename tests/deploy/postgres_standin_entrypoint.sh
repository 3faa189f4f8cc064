#!/bin/sh
# The entrypoint of the postgres:15 stand-in (tests/deploy/docker_engine.py), for
# machines that cannot pull the official image: the same interface, the part the
# compose file uses. POSTGRES_USER [postgres], POSTGRES_PASSWORD (required unless
# POSTGRES_HOST_AUTH_METHOD is trust), POSTGRES_DB [the user] and
# POSTGRES_HOST_AUTH_METHOD [scram-sha-256]; the cluster is made in PGDATA at the
# first start, then `postgres` runs as the postgres user on every address.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"

if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    user="${POSTGRES_USER:-postgres}"
    method="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
    if [ "$method" != trust ] && [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "postgres stand-in: set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust)" >&2
        exit 1
    fi
    password_file="$(mktemp)"
    printf '%s\n' "${POSTGRES_PASSWORD:-unused}" > "$password_file"
    initdb --username="$user" --pwfile="$password_file" --auth-local=trust \
        --auth-host="$method" --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$password_file"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    echo "host all all all $method" >> "$PGDATA/pg_hba.conf"
    database="${POSTGRES_DB:-$user}"
    if [ "$database" != postgres ]; then
        echo "CREATE DATABASE \"$database\" OWNER \"$user\"" |
            postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
    echo "postgres stand-in: initialised $PGDATA (database $database, user $user)"
fi
exec "$@"
