#!/usr/bin/env bash
# kazoo's own suite (../shared/kazoo-suite/run.sh: stock mode, then the project's transport)
# with sentinel's protocol extension also installed on every client of the patched mode
# (kzext.py).
# usage, from the project root: tests/kazoo_suite/run.sh [KAZOO_TEST_MODULE ... PYTEST_ARGS]
#   no arguments: the whole suite (kazoo.tests), ~8 min on 2 cores
#   e.g. tests/kazoo_suite/run.sh kazoo.tests.test_client -k test_request_queuing
set -eu
ext=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$ext/../.." && pwd)
shared=${KAZOO_SUITE:-$root/../shared/kazoo-suite}
shared=$(cd "$shared" && pwd)
# The harness loads the transport and the extension by file path, as sentinel/transport.py and
# sentinel/zkprotocol.py of the directory it runs from (sentinel/__init__ needs a cryptography
# its pyOpenSSL cannot have): stage the two modules, which import only kazoo and the standard
# library, under those names.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/sentinel"
cp "$root/sentinel/zk/transport.py" "$stage/sentinel/transport.py"
cp "$root/sentinel/zk/protocol.py" "$stage/sentinel/zkprotocol.py"
# The shared run.sh, with this plug-in on its path and after kzpatch, and the tests to run
# taken from the arguments.
script=$(sed -e "s|PYTHONPATH=\$here |PYTHONPATH=\$here:$ext |" \
    -e "s|-p kzpatch |-p kzpatch -p kzext |" \
    -e "s|--pyargs kazoo.tests |--pyargs \"\$@\" |" "$shared/run.sh")
for piece in "-p kzext" ":$ext " '"$@"'; do
    [[ $script == *"$piece"* ]] || { echo "$0: $shared/run.sh changed; kzext not wired" >&2; exit 2; }
done
(cd "$stage" && bash -c "$script" "$shared/run.sh" "${@:-kazoo.tests}")
