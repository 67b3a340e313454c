#!/bin/sh
# Run once by the postgres image when it makes a primary's data directory
# (/docker-entrypoint-initdb.d): its streaming replica may connect for replication, as
# the `punctual` user with its password. docker-compose.yml mounts this on both primaries.
set -e
echo "host replication ${POSTGRES_USER} all scram-sha-256" >>"$PGDATA/pg_hba.conf"
