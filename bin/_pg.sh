# shellcheck shell=bash
# Throwaway PostgreSQL cluster for bin/test (sourced, not executed).
#
#   pg_throwaway_start   initdb a cluster in a fresh temp dir, start it on a free 127.0.0.1 port,
#                        create database "dunning" and export DATABASE_URL. Sets PG_THROWAWAY_DIR,
#                        PG_THROWAWAY_PORT, PG_THROWAWAY_VERSION.
#   pg_throwaway_stop    stop it (immediate) and delete the temp dir. Idempotent; call it from a trap:
#                            trap pg_throwaway_stop EXIT
#                            trap 'exit 130' INT; trap 'exit 143' TERM; trap 'exit 129' HUP
#
# PostgreSQL refuses to run as root, so as root the server runs as the `postgres` system user.
# Environment: PG_BINDIR  directory holding initdb/pg_ctl (default: found automatically).

PG_THROWAWAY_DIR=""
PG_THROWAWAY_PORT=""
PG_THROWAWAY_VERSION=""
_PG_BINDIR=""

# Echo the directory holding initdb: $PG_BINDIR, `pg_config --bindir`, the highest
# /usr/lib/postgresql/*/bin, then initdb on PATH.
_pg_find_bindir() {
    local dir
    if [ -n "${PG_BINDIR:-}" ] && [ -x "$PG_BINDIR/initdb" ]; then
        echo "$PG_BINDIR"
        return 0
    fi
    if command -v pg_config >/dev/null 2>&1 && dir="$(pg_config --bindir 2>/dev/null)" && [ -x "$dir/initdb" ]; then
        echo "$dir"
        return 0
    fi
    dir="$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -type d -name bin 2>/dev/null | sort -V | tail -n 1)"
    if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then
        echo "$dir"
        return 0
    fi
    if dir="$(command -v initdb 2>/dev/null)"; then
        dirname "$dir"
        return 0
    fi
    return 1
}

# Find PostgreSQL server binaries; as root with apt-get, install Debian's `postgresql` if absent.
_pg_require_binaries() {
    if _PG_BINDIR="$(_pg_find_bindir)"; then
        return 0
    fi
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "==> PostgreSQL server not found; installing Debian package 'postgresql'"
        if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null &&
            _PG_BINDIR="$(_pg_find_bindir)"; then
            return 0
        fi
        echo "error: installing the 'postgresql' package failed." >&2
        return 1
    fi
    cat >&2 <<'EOF'
error: bin/test needs PostgreSQL server binaries (initdb, pg_ctl) for its throwaway test database.
       Install them (Debian/Ubuntu: sudo apt-get install postgresql; macOS: brew install postgresql@15),
       or set PG_BINDIR to the directory holding initdb,
       or set DATABASE_URL=postgres://USER@HOST:PORT/DBNAME to use an existing server.
EOF
    return 1
}

# Run a server binary, as the `postgres` user when we are root; always from inside the temp dir so
# the server user never needs access to the caller's working directory.
_pg_run() {
    if [ "$(id -u)" -eq 0 ]; then
        (cd "$PG_THROWAWAY_DIR" && runuser -u postgres -- "$@")
    else
        (cd "$PG_THROWAWAY_DIR" && "$@")
    fi
}

_pg_free_port() {
    python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

pg_throwaway_start() {
    local base attempt
    _pg_require_binaries || return 1
    # shellcheck disable=SC2034  # read by callers
    PG_THROWAWAY_VERSION="$("$_PG_BINDIR/postgres" --version 2>/dev/null | awk '{print $3}')"

    base="${TMPDIR:-/tmp}"
    if [ "$(id -u)" -eq 0 ]; then
        if ! id -u postgres >/dev/null 2>&1; then
            echo "error: running as root, but there is no 'postgres' system user to run PostgreSQL as." >&2
            echo "       Create one (useradd -r -m postgres) or set DATABASE_URL." >&2
            return 1
        fi
        # The postgres user must be able to reach the directory (TMPDIR may be e.g. under /root).
        if ! runuser -u postgres -- test -x "$base"; then
            base=/tmp
        fi
    fi
    PG_THROWAWAY_DIR="$(mktemp -d "$base/dunning-pg.XXXXXX")" || return 1
    if [ "$(id -u)" -eq 0 ]; then
        chown postgres: "$PG_THROWAWAY_DIR"
    fi

    if ! _pg_run "$_PG_BINDIR/initdb" -D "$PG_THROWAWAY_DIR/data" -A trust -U postgres -E UTF8 --no-locale \
        --no-sync >"$PG_THROWAWAY_DIR/initdb.log" 2>&1; then
        echo "error: initdb failed:" >&2
        cat "$PG_THROWAWAY_DIR/initdb.log" >&2
        return 1
    fi

    # The port is picked by binding port 0; retry if someone grabs it before the server binds.
    for attempt in 1 2 3; do
        PG_THROWAWAY_PORT="$(_pg_free_port)" || return 1
        if _pg_run "$_PG_BINDIR/pg_ctl" -D "$PG_THROWAWAY_DIR/data" -l "$PG_THROWAWAY_DIR/server.log" \
            -w -t 60 start -o "-p $PG_THROWAWAY_PORT -c listen_addresses=127.0.0.1 \
-c unix_socket_directories='$PG_THROWAWAY_DIR' -c fsync=off -c synchronous_commit=off \
-c full_page_writes=off -c max_connections=200" >/dev/null; then
            break
        fi
        if [ "$attempt" -eq 3 ] || ! grep -q 'could not bind\|Address already in use' "$PG_THROWAWAY_DIR/server.log"; then
            echo "error: PostgreSQL did not start; server log:" >&2
            cat "$PG_THROWAWAY_DIR/server.log" >&2
            return 1
        fi
    done

    if ! "$_PG_BINDIR/createdb" -h 127.0.0.1 -p "$PG_THROWAWAY_PORT" -U postgres dunning; then
        echo "error: could not create database 'dunning' in the throwaway cluster" >&2
        return 1
    fi
    export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_THROWAWAY_PORT/dunning"
}

pg_throwaway_stop() {
    local dir="$PG_THROWAWAY_DIR" pid=""
    [ -n "$dir" ] || return 0
    if [ -f "$dir/data/postmaster.pid" ]; then
        pid="$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null || true)"
        _pg_run "$_PG_BINDIR/pg_ctl" -D "$dir/data" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
        # Belt and braces: never leave a postmaster behind.
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    PG_THROWAWAY_DIR=""
    rm -rf "$dir"
    return 0
}
