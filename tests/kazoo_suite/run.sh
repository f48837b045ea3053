#!/usr/bin/env bash
# kazoo's own suite (../shared/kazoo-suite/run.sh: stock mode, then the project's transport)
# with sentinel.zkprotocol also installed on every client of the patched mode (kzext.py).
# usage, from the project root: tests/kazoo_suite/run.sh [KAZOO_TEST_MODULE ... PYTEST_ARGS]
#   no arguments: the whole suite (kazoo.tests), ~8 min on 2 cores
#   e.g. tests/kazoo_suite/run.sh kazoo.tests.test_client -k test_request_queuing
set -eu
ext=$(cd "$(dirname "$0")" && pwd)
shared=${KAZOO_SUITE:-$ext/../../../shared/kazoo-suite}
shared=$(cd "$shared" && pwd)
# The shared run.sh, with this plug-in on its path and after kzpatch, and the tests to run
# taken from the arguments.
script=$(sed -e "s|PYTHONPATH=\$here |PYTHONPATH=\$here:$ext |" \
    -e "s|-p kzpatch |-p kzpatch -p kzext |" \
    -e "s|--pyargs kazoo.tests |--pyargs \"\$@\" |" "$shared/run.sh")
for piece in "-p kzext" ":$ext " '"$@"'; do
    [[ $script == *"$piece"* ]] || { echo "$0: $shared/run.sh changed; kzext not wired" >&2; exit 2; }
done
bash -c "$script" "$shared/run.sh" "${@:-kazoo.tests}"
