#!/usr/bin/env bash
# The project's two entry points; each sets up whatever is missing first.
#   ./run.sh demo [ARGS...]   run the main job (sentinel demo) against a real ZooKeeper
#   ./run.sh test [ARGS...]   lint, build the docs, then run the whole test suite (ARGS go to pytest),
#                             kazoo's own suite with the extension included (tests/kazoo_suite)
# Set-up: Debian's ZooKeeper and PostgreSQL packages when missing (needs root and apt-get),
# then a virtual environment in .venv with the project installed in editable mode.
set -euo pipefail
cd "$(dirname "$0")"

die() { echo "run.sh: $*" >&2; exit "${2:-1}"; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

apt_updated=
apt_install() {
    command -v apt-get >/dev/null || return 1
    echo "run.sh: installing $* from Debian's packages ..." >&2
    if [ -z "$apt_updated" ]; then as_root apt-get update -qq && apt_updated=1 || return 1; fi
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

ensure_zookeeper() {
    if [ -n "${ZOOKEEPER_HOME:-}${SENTINEL_ZK_CLASSPATH:-}" ]; then
        return
    fi
    if [ -f /usr/share/java/zookeeper.jar ]; then
        # TLS servers need Netty's codec, which Debian's manifest does not list.
        [ -f /usr/share/java/netty-codec.jar ] || apt_install libnetty-java \
            || echo "run.sh: libnetty-java not installed; TLS ZooKeeper servers will not start" >&2
        return
    fi
    apt_install zookeeper || die "no ZooKeeper found and it could not be installed: run
  'apt-get install zookeeper' as root, or set ZOOKEEPER_HOME to an Apache ZooKeeper release" 4
}

ensure_graphviz() {
    # Only the tests need it (they render `sentinel deps --format dot`); without apt they say so.
    command -v dot >/dev/null || apt_install graphviz || echo "run.sh: graphviz not installed" >&2
}

ensure_curator() {
    # The interop tests run Apache Curator itself (a Java peer compiled at test time) against
    # the project's ZooKeeper; without it they skip, saying what to install.
    [ -f /usr/share/java/curator-x-discovery.jar ] && command -v javac >/dev/null && return
    apt_install default-jdk-headless libcurator-discovery-java libcurator-recipes-java libslf4j-java \
        || echo "run.sh: Curator not installed; the Curator interop tests skip" >&2
}

ensure_postgresql() {
    # The demo's databases, and the auth backend's, the collector's and the integration's
    # tests, are real PostgreSQL servers; without them the demo uses SQLite, the tests skip.
    [ -d /usr/lib/postgresql ] || command -v initdb >/dev/null || apt_install postgresql \
        || echo "run.sh: PostgreSQL not installed; the demo uses SQLite, its tests skip" >&2
}

ensure_venv() {
    local stamp
    stamp=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [ ! -x .venv/bin/python ]; then
        python3 -m venv .venv 2>/dev/null || { apt_install python3-venv && python3 -m venv .venv; } \
            || die "could not create a virtual environment: install python3-venv (Python >= 3.11)"
    fi
    if [ "$(cat .venv/.installed 2>/dev/null)" != "$stamp" ]; then
        echo "run.sh: installing the project and its test tools into .venv ..." >&2
        .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
        echo "$stamp" > .venv/.installed
    fi
}

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
    demo)
        ensure_zookeeper
        ensure_postgresql
        ensure_venv
        exec .venv/bin/sentinel demo "$@"
        ;;
    test)
        ensure_zookeeper
        ensure_graphviz
        ensure_curator
        ensure_postgresql
        ensure_venv
        .venv/bin/ruff check sentinel policies balancers benchmarks tests
        .venv/bin/ruff format --check sentinel policies balancers benchmarks tests
        # The docs and the API reference, with warnings (a broken link, a bad docstring) as errors,
        # built beside the tests (it needs little of a core) and judged after them.
        site=$(mktemp -d)
        .venv/bin/mkdocs build --strict --site-dir "$site/site" > "$site/log" 2>&1 &
        docs=$!
        status=0
        # On several workers (pytest-xdist; tests/conftest.py groups what must share one):
        # SENTINEL_TEST_WORKERS=0 runs the suite in this one process.
        .venv/bin/python -m pytest -n "${SENTINEL_TEST_WORKERS:-3}" --dist loadgroup "$@" || status=$?
        wait "$docs" || { cat "$site/log" >&2; rm -rf "$site"; die "the docs build failed"; }
        rm -rf "$site"
        # pytest exits 5 when it collected nothing: a run that tested nothing has failed.
        [ "$status" = 5 ] && die "pytest collected no tests"
        exit "$status"
        ;;
    *)
        die "usage: ./run.sh demo [ARGS...] | ./run.sh test [PYTEST ARGS...]" 2
        ;;
esac
