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
# its pyOpenSSL cannot have): stage the modules, which import only kazoo, the standard library
# and each other, under those names, and the extension's own modules as sentinel.zk.* of a
# namespace package (no __init__.py) on the path.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/sentinel/zk"
cp "$root/sentinel/zk/transport.py" "$stage/sentinel/transport.py"
cp "$root/sentinel/zk/protocol.py" "$stage/sentinel/zkprotocol.py"
cp "$root/sentinel/zk/protocol.py" "$root/sentinel/zk/kazoo_internals.py" \
    "$root/sentinel/zk/wire.py" "$stage/sentinel/zk/"
# The shared run.sh, with this plug-in and the staged modules on its path and after kzpatch,
# and the tests to run taken from the arguments.
script=$(sed -e "s|PYTHONPATH=\$here |PYTHONPATH=\$here:$ext:$stage |" \
    -e "s|-p kzpatch |-p kzpatch -p kzext |" \
    -e "s|--pyargs kazoo.tests |--pyargs \"\$@\" |" "$shared/run.sh")
for piece in "-p kzext" ":$ext:$stage " '"$@"'; do
    [[ $script == *"$piece"* ]] || { echo "$0: $shared/run.sh changed; kzext not wired" >&2; exit 2; }
done
(cd "$stage" && bash -c "$script" "$shared/run.sh" "${@:-kazoo.tests}")
