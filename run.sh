#!/usr/bin/env bash
# The project's two entry points; each sets up whatever is missing first.
#   ./run.sh demo [ARGS...]   run the main job (sentinel demo) against a real ZooKeeper
#   ./run.sh test [ARGS...]   lint, build the docs, then run the whole test suite (ARGS go to pytest),
#                             kazoo's own suite with the extension included (tests/kazoo_suite)
# Set-up: Debian's ZooKeeper and PostgreSQL packages when missing (needs root and apt-get),
# then a virtual environment in .venv with the project installed in editable mode: with the
# `demo` extra for demo (Spark, the PostgreSQL driver), with the `test` extra for test (which
# adds the test tools). Each line of progress says what is installed and why.
# RUN_SH_DRY_RUN=1 prints what would be installed and run, and does neither.
set -euo pipefail
cd "$(dirname "$0")"

die() { echo "run.sh: $*" >&2; exit "${2:-1}"; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

apt_updated=
apt_planning=
apt_planned=()
apt_install() {
    if [ -n "$apt_planning" ]; then apt_planned+=("$@"); return 0; fi
    if [ -n "${RUN_SH_DRY_RUN:-}" ]; then echo "run.sh: would install $* from Debian's packages" >&2; return 0; fi
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

ensure_dig() {
    # Only tests/integration/test_agent_dns.py needs it: it asks the agent's DNS server with
    # dig; without it that test skips, saying so.
    command -v dig >/dev/null || apt_install dnsutils \
        || echo "run.sh: dnsutils (dig) not installed; the agent's DNS tests skip" >&2
}

ensure_chromium() {
    # tests/unit/test_docs_site.py renders the docs at 1280 px and measures every table;
    # tests/integration/test_ui_browser.py drives the dashboard through Selenium, which needs
    # the driver too. Without them those checks skip, saying so.
    command -v chromium >/dev/null || apt_install chromium \
        || echo "run.sh: chromium not installed; the docs' table-width check skips" >&2
    command -v chromedriver >/dev/null || apt_install chromium-driver \
        || echo "run.sh: chromium-driver not installed; the dashboard's browser tests skip" >&2
}

ensure_curator() {
    # The interop tests run Apache Curator itself (a Java peer compiled at test time) against
    # the project's ZooKeeper; without it they skip, saying what to install.
    [ -f /usr/share/java/curator-x-discovery.jar ] && command -v javac >/dev/null && return
    apt_install default-jdk-headless libcurator-discovery-java libcurator-recipes-java libslf4j-java \
        || echo "run.sh: Curator not installed; the Curator interop tests skip" >&2
}

ensure_proxies() {
    # tests/integration/test_dns_haproxy.py puts Debian's HAProxy and nginx in front of services
    # they find through the agent's DNS; without them those tests skip, saying so.
    command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || apt_install haproxy \
        || echo "run.sh: haproxy not installed; the HAProxy DNS tests skip" >&2
    command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || apt_install nginx-light \
        || echo "run.sh: nginx not installed; the nginx DNS tests skip" >&2
}

ensure_test_packages() {
    ensure_zookeeper
    ensure_graphviz
    ensure_dig
    ensure_chromium
    ensure_curator
    ensure_postgresql
    ensure_proxies
}

ensure_node_peer() {
    # tests/integration/test_agent_xds_node.py calls through the agent from Node's gRPC
    # (@grpc/grpc-js-xds): its packages, pinned by tests/peers/node/package-lock.json, go into
    # tests/peers/node/node_modules (ignored by git), again whenever the lock file changes.
    # Without npm that test skips, saying so.
    local peer=tests/peers/node stamp
    command -v npm >/dev/null || { echo "run.sh: npm not found; the Node xDS client's test skips" >&2; return 0; }
    stamp=$(sha256sum "$peer/package-lock.json" | cut -d' ' -f1)
    if [ -n "${RUN_SH_DRY_RUN:-}" ]; then echo "run.sh: would install $peer's Node packages (npm ci)" >&2; return 0; fi
    [ "$(cat "$peer/node_modules/.sentinel-installed" 2>/dev/null)" = "$stamp" ] && return 0
    echo "run.sh: installing the Node gRPC client's packages into $peer/node_modules (npm ci) ..." >&2
    if npm ci --prefix "$peer" --ignore-scripts --no-audit --no-fund --loglevel=error >&2; then
        echo "$stamp" > "$peer/node_modules/.sentinel-installed"
    else
        echo "run.sh: npm ci failed; the Node xDS client's test skips" >&2
    fi
}

ensure_postgresql() {
    # The demo's databases, and the auth backend's, the collector's and the integration's
    # tests, are real PostgreSQL servers; without them the demo uses SQLite, the tests skip.
    [ -d /usr/lib/postgresql ] || command -v initdb >/dev/null || apt_install postgresql \
        || echo "run.sh: PostgreSQL not installed; the demo uses SQLite, its tests skip" >&2
}

# pip install ARGS into .venv, showing pip's own progress (each package as it is collected and
# downloaded), not its notices. --no-compile: a test run compiles into a cache of its own
# (PYTHONPYCACHEPREFIX below), so bytecode written beside the installed files would never be
# read by one.
pip_install() {
    local status=0
    PYTHONUNBUFFERED=1 .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off \
        --no-compile "$@" 2>&1 \
        | grep --line-buffered -E '^ *(Collecting|Downloading|Successfully installed|ERROR)' >&2 \
        || status=${PIPESTATUS[0]}
    return "$status"
}

# Install the project with EXTRA into .venv unless it is there already: .venv/.installed holds
# one line per extra, "EXTRA HASH" (the hash of pyproject.toml when it was installed).
ensure_venv() {
    local extra=$1 why=$2 stamp
    stamp="$extra $(sha256sum pyproject.toml | cut -d' ' -f1)"
    if [ -n "${RUN_SH_DRY_RUN:-}" ]; then
        echo "run.sh: would install .[$extra] ($why)" >&2
        return
    fi
    if [ ! -x .venv/bin/python ]; then
        echo "run.sh: creating the virtual environment .venv ..." >&2
        python3 -m venv .venv 2>/dev/null || { apt_install python3-venv && python3 -m venv .venv; } \
            || die "could not create a virtual environment: install python3-venv (Python >= 3.11)"
    fi
    if ! grep -qxF "$stamp" .venv/.installed 2>/dev/null; then
        echo "run.sh: installing the project with its '$extra' extra into .venv: $why ..." >&2
        # uv resolves and downloads side by side where pip takes one package after another
        # (docs/testing-history.md, "The install by uv"). pyspark ships as sources only: pip keeps the
        # wheel it builds from them under their address, where uv builds it again whenever the
        # registry's answer carries no cache validator, so pip installs it first and uv keeps it
        # (the requirement still decides: uv replaces a release it does not admit). Without uv,
        # or if it fails, pip installs everything.
        if ! { pip_install uv pyspark && .venv/bin/uv pip install --python .venv/bin/python -e ".[$extra]"; }; then
            echo "run.sh: uv could not install .[$extra]; pip installs it ..." >&2
            pip_install -e ".[$extra]" || die "pip could not install .[$extra] (exit $?)"
        fi
        { grep -v "^$extra " .venv/.installed 2>/dev/null || true; echo "$stamp"; } > .venv/.installed.new
        mv .venv/.installed.new .venv/.installed
        echo "run.sh: installed .[$extra] into .venv ($(du -sh .venv | cut -f1))" >&2
    fi
}

run() { if [ -n "${RUN_SH_DRY_RUN:-}" ]; then echo "run.sh: would run $*" >&2; else "$@"; fi; }

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
    demo)
        ensure_zookeeper
        ensure_postgresql
        ensure_venv demo "what the demo needs: Spark for its job, the PostgreSQL driver"
        [ -n "${RUN_SH_DRY_RUN:-}" ] && { run .venv/bin/sentinel demo "$@"; exit 0; }
        exec .venv/bin/sentinel demo "$@"
        ;;
    test)
        # The machine's own speed changes from one quarter of an hour to the next, and the
        # suite's time with it: read a run's time beside this line and the one after the suite.
        [ -n "${RUN_SH_DRY_RUN:-}" ] || python3 -m tests.machine_speed "before the set-up" || true
        # Every package missing is installed by one apt-get (each call reads the package lists
        # and runs dpkg's triggers again: seconds each on a fresh machine); the ensure_ functions
        # are asked first what they would install, then again to check, and install one by one
        # (saying so) only what the one call did not.
        if [ -z "${RUN_SH_DRY_RUN:-}" ]; then
            apt_planning=1
            ensure_test_packages
            apt_planning=
            [ "${#apt_planned[@]}" = 0 ] || apt_install "${apt_planned[@]}" \
                || echo "run.sh: one apt-get for ${apt_planned[*]} failed; trying each" >&2
        fi
        ensure_test_packages
        if [ -n "${RUN_SH_DRY_RUN:-}" ]; then
            ensure_node_peer
        else
            # The Node client's packages (npm ci, seconds of downloads) and the base of
            # kazoo's suite's environment (.venv-kazoo: its interpreter and test requirements)
            # need nothing of the project: both are installed beside the project's install,
            # since all three mostly wait on downloads. npm's lines go to stderr as they come;
            # the kazoo base's output is shown if it fails.
            ensure_node_peer &
            node_peer=$!
            kazoo_log=$(mktemp)
            python3 tests/kazoo_suite/environment.py >"$kazoo_log" 2>&1 &
            kazoo_base=$!
            trap 'kill "$node_peer" "$kazoo_base" 2>/dev/null || true; rm -f "$kazoo_log"' EXIT
        fi
        ensure_venv test "the test tools: pytest, ruff, mypy, mkdocs, gunicorn, Docker's client"
        [ -n "${RUN_SH_DRY_RUN:-}" ] && { run .venv/bin/python -m pytest "$@"; exit 0; }
        # The wheels tests/integration/test_wheel.py installs from (.wheelhouse, when missing or
        # stale: a fresh clone's pip mostly waits on the package index there): built beside the
        # rest of the set-up and the suite, under the lock the test takes, so that the test
        # finds them made rather than waiting on the index itself. Not waited for here; if it
        # fails, the test builds them again and reports pip's error.
        .venv/bin/python -m tests.wheelhouse >/dev/null 2>&1 &
        wheelhouse=$!
        # The docs and the API reference, with warnings (a broken link, a bad docstring) as errors;
        # tests/unit/test_docs_site.py reads this build rather than making its own. It runs
        # beside the linters and the build of kazoo's suite's environment (.venv-kazoo, when
        # missing or stale), and its output is shown once it has ended.
        site=$(mktemp -d)
        docs_log=$(mktemp)
        # Compiled modules, pytest's rewritten test modules among them, written once and read by
        # every process of the run (the workers, and each `sentinel` or `python` the tests
        # start: PYTHONDONTWRITEBYTECODE would have each compile what it imports again), in a
        # directory of the run's own rather than beside the sources.
        PYTHONPYCACHEPREFIX=$(mktemp -d)
        export PYTHONPYCACHEPREFIX
        unset PYTHONDONTWRITEBYTECODE
        NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site" >"$docs_log" 2>&1 &
        docs=$!
        # The workers collect side by side: one collection first fills the cache they read.
        .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 &
        collected=$!
        # The suite's ZooKeeper servers (hundreds, each living seconds) start from one archive
        # of the classes a server loads (sentinel.testing.zookeeper.write_class_archive); a run
        # without it is slower, not different.
        archive_dir=$(mktemp -d)
        export SENTINEL_ZK_CLASS_ARCHIVE="$archive_dir/zookeeper.jsa"
        .venv/bin/python -c 'import sys; from sentinel.testing.zookeeper import write_class_archive
write_class_archive(sys.argv[1])' "$SENTINEL_ZK_CLASS_ARCHIVE" >/dev/null 2>&1 &
        archived=$!
        # (|| true: the build has usually ended, and a failed kill must not become the exit status)
        trap 'kill "$docs" "$collected" "$node_peer" "$kazoo_base" "$archived" "$wheelhouse" 2>/dev/null || true
              rm -rf "$site" "$docs_log" "$kazoo_log" "$archive_dir" "$PYTHONPYCACHEPREFIX"' EXIT
        .venv/bin/ruff check sentinel policies balancers benchmarks tests docs/hooks
        .venv/bin/ruff format --check sentinel policies balancers benchmarks tests docs/hooks
        # kazoo's suite's test would build it too (under a lock); a failure here is its to report.
        wait "$kazoo_base" || cat "$kazoo_log" >&2
        .venv/bin/python -m tests.kazoo_suite.harness --prepare \
            || echo "run.sh: .venv-kazoo was not built; kazoo's suite's test will say why" >&2
        # (its errors, if any, are the suite's to report)
        wait "$collected" || true
        wait "$node_peer" || true  # it says why it failed, and the Node client's test skips
        wait "$archived" || echo "run.sh: no class-data archive for the test servers" >&2
        docs_status=0
        wait "$docs" || docs_status=$?
        cat "$docs_log" >&2
        [ "$docs_status" = 0 ] || die "the docs build failed"
        status=0
        # On several workers (pytest-xdist; tests/conftest.py groups what must share one, and
        # orders the work, longest first: --no-loadscope-reorder keeps that order). Five on two
        # cores: the tests wait more than they compute (docs/testing-history.md, "Suite time");
        # SENTINEL_TEST_WORKERS=0 runs the suite in this one process.
        SENTINEL_DOCS_SITE="$site" .venv/bin/python -m pytest \
            -n "${SENTINEL_TEST_WORKERS:-5}" --dist loadgroup --no-loadscope-reorder "$@" \
            || status=$?
        # pytest exits 5 when it collected nothing: a run that tested nothing has failed.
        [ "$status" = 5 ] && die "pytest collected no tests"
        python3 -m tests.machine_speed "after the suite" || true
        exit "$status"
        ;;
    *)
        die "usage: ./run.sh demo [ARGS...] | ./run.sh test [PYTEST ARGS...]" 2
        ;;
esac
