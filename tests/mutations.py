"""Break the code on purpose, one way at a time, and show which test catches each break.

Each mutation below is a bug that once went unnoticed (issue 30): the code still ran, and the
test whose name promised the behaviour stayed green. This script copies the repository's
working tree to a temporary directory, applies one mutation there, runs the test file meant to
catch it, reverts, and goes on to the next; the checkout itself is never modified. It prints
a table: mutation, the test that failed (caught) or ``SURVIVED``.

Run it from the repository's root (not collected by pytest: nothing here is a test)::

    python -m tests.mutations              # every mutation
    python -m tests.mutations zsh decode   # those whose name contains a word given
    python -m tests.mutations --why        # and the first line of each failure
    python -m tests.mutations --tests-from 63070e5^  # the control: the tests before issue 30

It exits 1 when a mutation survived or could not be applied (its code moved: update it);
with ``--tests-from`` it only reports.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    """Replace ``old`` (which must occur exactly once in ``path``) by ``new``, and each
    ``(old, new)`` pair of ``also`` likewise; ``tests`` are the pytest node ids that must fail."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    also: tuple[tuple[str, str], ...] = ()


ZK_WATCHES = "tests/integration/test_zk_watches.py::"
CONNECTION_EVENTS = (
    "tests/faults/test_connection_events.py::"
    "test_a_listener_hears_the_connection_lost_while_it_is_lost"
)
TELEMETRY = (
    "tests/integration/test_telemetry.py::test_lookup_counters_move_and_cache_events_are_exported"
)

MUTATIONS = (
    Mutation(
        "zsh-no-top-level-commands",
        "sentinel/cli/__init__.py",
        "print(shtab.complete(build_parser(), shell=args.shell))",
        # the zsh script without its list of top-level commands
        'print(__import__("re").sub(r"(?s)_shtab_sentinel_commands\\(\\) \\{.*?\\n\\}\\n", "", '
        "shtab.complete(build_parser(), shell=args.shell)))",
        ("tests/unit/test_cli_parser.py::test_zsh_completion_names_every_command",),
    ),
    Mutation(
        "telemetry-snapshot-age-in-milliseconds",
        "sentinel/client.py",
        "return {name: now - s.built_at for name, s in dict(self._snapshots).items()}",
        "return {name: (now - s.built_at) * 1000 for name, s in dict(self._snapshots).items()}",
        (TELEMETRY,),
    ),
    Mutation(
        "telemetry-propagation-delay-clamped-to-0",
        "sentinel/telemetry.py",
        "observe(max(time.time() - stat.mtime / 1000.0, 0.0))",
        "observe(0.0)",
        (TELEMETRY,),
    ),
    Mutation(
        "forked-child-inherits-no-cache",
        "sentinel/session.py",
        "self._serve_restored(served, inherited.shard_maps, stale_since)",
        "self._serve_restored({}, {}, stale_since)",
        (
            "tests/integration/test_fork.py::"
            "test_a_child_within_inherited_max_age_serves_the_inherited_snapshot_with_no_zookeeper",
            # the "served, not loaded" check the issue found weak (a 1 s bound)
            "tests/integration/test_fork.py::"
            "test_a_forked_child_gets_its_own_session_and_sees_changes_after_the_fork",
        ),
    ),
    Mutation(
        "postgres-old-pool-closed-1.5s-late",
        "sentinel/integrations/postgres.py",
        "    def _drain(self, pool: ConnectionPool[Any]) -> None:\n        pool.close(timeout=0)\n",
        "    def _drain(self, pool: ConnectionPool[Any]) -> None:\n"
        '        __import__("threading").Timer(1.5, lambda: pool.close(timeout=0)).start()\n',
        (
            "tests/integration/test_integration_postgres.py::"
            "test_after_a_rotation_no_connection_logs_in_with_the_revoked_credential",
        ),
    ),
    Mutation(
        "snapshot-rate-limit-100x-weaker",
        "sentinel/cache/snapshot_file.py",
        "self._stop.wait(self._min_interval)",
        "self._stop.wait(self._min_interval / 100)",
        ("tests/faults/test_snapshot.py::test_snapshot_writes_are_rate_limited",),
    ),
    Mutation(
        "decode-errors-not-counted",
        "sentinel/cache/reads.py",
        "        self._stats.decode_errors += 1\n",
        "        pass\n",
        (
            "tests/faults/test_hostile_json.py::test_hostile_json_is_a_counted_skip_everywhere",
            "tests/faults/test_hostile_json.py::test_each_hostile_node_is_counted_exactly_once",
        ),
    ),
    Mutation(
        "decode-errors-counted-twice",
        "sentinel/cache/reads.py",
        "        self._stats.decode_errors += 1\n",
        "        self._stats.decode_errors += 2\n",
        ("tests/faults/test_hostile_json.py::test_each_hostile_node_is_counted_exactly_once",),
    ),
    Mutation(
        "resync-on-every-reconnection",
        "sentinel/cache/registry_cache.py",
        "        if state == KazooState.CONNECTED:\n"
        "            self.worker.put(Task(self.worker.schedule_resync))\n",
        "        if state == KazooState.CONNECTED:\n"
        "            self.worker.put(Task(self._resync))\n",
        (
            "tests/faults/test_faults.py::"
            "test_a_flapping_connection_keeps_serving_and_resyncs_once_per_burst",
        ),
    ),
    Mutation(
        "help-a-command-without-summary",
        "sentinel/cli/options.py",
        "        help=summary,\n",
        '        help=summary if name != "prune" else None,\n',
        ("tests/integration/test_cli.py::test_help_explains_every_command",),
    ),
    Mutation(
        "help-a-subcommand-without-description",
        "sentinel/cli/options.py",
        "        description=description,\n",
        '        description=description if name != "stats" else None,\n',
        ("tests/integration/test_operator_cli.py::test_every_command_has_help",),
    ),
    Mutation(
        "connect-timeout-doubled",
        "sentinel/session.py",
        "self.zk.start(timeout=self.connect_timeout)",
        "self.zk.start(timeout=self.connect_timeout * 2)",
        (
            "tests/integration/test_connection.py::"
            "test_no_server_within_the_timeout_raises_and_leaves_no_threads",
        ),
    ),
    Mutation(
        "sasl-refusal-reported-late",
        "sentinel/zk/errors.py",
        "    if isinstance(exc, AuthFailedError):\n",
        # a refused login reported only after a wait, as if retried until a timeout
        "    if isinstance(exc, AuthFailedError):\n        __import__('time').sleep(2)\n",
        ("tests/integration/test_sasl.py::test_a_wrong_password_is_refused_at_once_and_typed",),
    ),
    Mutation(
        "ephemeral-nodes-not-restored-on-a-new-session",
        "sentinel/zk/ephemeral.py",
        "restored = self._restore_all()",
        "restored = 0",
        (
            "tests/integration/test_instance_labels.py::"
            "test_a_restore_meeting_another_endpoint_skips_that_node_and_restores_the_rest",
        ),
    ),
    Mutation(
        # One delete conditional on the version of our own last write, whoever holds the node
        # now: the successor's node (version 0 like ours) is deleted.
        "deregistration-trusts-the-version-alone",
        "sentinel/zk/ephemeral.py",
        "        if version is None:\n            return False, -1\n",
        "        return True, 0\n",
        (
            "tests/integration/test_publisher.py::"
            "test_an_old_process_cannot_delete_its_successors_node",
            "tests/integration/test_publisher.py::"
            "test_an_old_process_cannot_delete_a_node_created_after_its_successor_left",
        ),
    ),
    Mutation(
        # A take-over writes the successor's node at version 0 whatever it replaced: the old
        # process's one-request delete, its event not heard yet, removes the successor's node.
        "take-over-keeps-the-successor-at-version-0",
        "sentinel/zk/ephemeral.py",
        "steps = stat.version + 1 if stat.version < _TRUSTED_VERSIONS else 0",
        "steps = 0",
        (
            "tests/integration/test_publisher.py::"
            "test_an_old_process_cannot_delete_its_successors_node",
        ),
    ),
    Mutation(
        # The one-request delete trusted at any version, past the bound a take-over keeps.
        "deregistration-trusts-versions-past-the-bound",
        "sentinel/zk/ephemeral.py",
        "            if version < _TRUSTED_VERSIONS:\n",
        "            if True:\n",
        (
            "tests/integration/test_publisher.py::"
            "test_a_node_written_past_the_trusted_versions_is_read_before_it_is_deleted",
        ),
    ),
    Mutation(
        # What the watch read trusted after an event or a lost connection since.
        "deregistration-ignores-what-was-heard-since-the-read",
        "sentinel/zk/ephemeral.py",
        "        if (events, losses) != (self._events.get(path, 0), self._losses):\n"
        "            return None\n",
        "",
        (
            "tests/integration/test_publisher.py::"
            "test_a_take_over_heard_but_not_read_yet_makes_the_deregistration_read",
            "tests/integration/test_publisher.py::"
            "test_after_a_lost_connection_deregistration_reads_before_it_deletes",
        ),
    ),
    Mutation(
        # Ctrl-C handled only once ready: one landing while the services load exits 130.
        "watch-ctrl-c-handled-only-once-ready",
        "sentinel/cli/watch.py",
        "        signal.signal(signum, lambda *_: stop.set())\n",
        "        pass\n",
        ("tests/integration/test_operator_cli.py::test_watch_exits_cleanly_whenever_ctrl_c_lands",),
        also=(
            (
                '            print("watching every service; Ctrl-C to stop", file=sys.stderr, '
                "flush=True)\n",
                "            for signum in (signal.SIGINT, signal.SIGTERM):\n"
                "                signal.signal(signum, lambda *_: stop.set())\n"
                '            print("watching every service; Ctrl-C to stop", file=sys.stderr, '
                "flush=True)\n",
            ),
        ),
    ),
    Mutation(
        # An event's read cut off by the connection forgotten (the chaos run's relayed reader).
        "interrupted-read-not-run-again",
        "sentinel/cache/worker.py",
        "                        self._interrupted.add(task)\n",
        "                        pass\n",
        (
            "tests/faults/test_interrupted_reads.py::"
            "test_a_read_cut_off_by_the_connection_is_retried_after_it[instance-persistent]",
            "tests/unit/test_cache_worker.py::"
            "test_a_merged_read_interrupted_by_the_connection_runs_again_after_the_resync",
        ),
    ),
    Mutation(
        # A flood of newcomers past a section's bound read from their events.
        "read-at-once-past-the-bound",
        "sentinel/cache/followers.py",
        "        if not self._reads.has_room(section, current, name):\n            return None\n",
        "",
        (
            "tests/integration/test_cache_watches.py::"
            "test_a_flood_of_a_followed_section_past_its_bound_costs_the_server_no_reads",
        ),
    ),
    Mutation(
        # A claimed client name's credential watch kept after its processes left.
        "agent-keeps-claimed-credential-watches",
        "sentinel/agent/credentials.py",
        "        if client is None or any(c.auth_client == client for c in connections):\n",
        "        if True:\n",
        (
            "tests/integration/test_agent.py::"
            "test_a_claimed_client_name_costs_the_agent_no_watch_once_its_process_leaves",
        ),
    ),
    Mutation(
        # A caller's request written ahead of those queued for the connection thread.
        "direct-send-jumps-the-queue",
        "sentinel/zk/kazoo_internals.py",
        "            if not self._direct or client._queue or client._state",
        "            if not self._direct or client._state",
        (ZK_WATCHES + "test_a_request_waits_behind_those_queued_for_the_connection_thread",),
    ),
    Mutation(
        # The connection thread's queued writes not ordered with callers' writes.
        "direct-send-unlocked-queue",
        "sentinel/zk/kazoo_internals.py",
        "        with self._send_lock:\n"
        "            super()._send_request(read_timeout, connect_timeout)\n",
        "        super()._send_request(read_timeout, connect_timeout)\n",
        (ZK_WATCHES + "test_threads_writing_at_once_each_get_their_own_replies_in_order",),
    ),
    Mutation(
        # A failed write from a caller's thread left waiting for a ping to time out.
        "direct-send-failure-kept",
        "sentinel/zk/kazoo_internals.py",
        "                    self._socket.shutdown(socket.SHUT_RDWR)\n",
        "                    pass\n",
        (
            ZK_WATCHES
            + "test_a_write_that_fails_on_the_callers_thread_loses_the_connection_not_the_request",
        ),
    ),
    Mutation(
        # The cache's worker waiting for a connection like any thread: the news of the lost
        # connection queued behind its read reaches listeners only once it is back.
        "unwaited-worker-waits",
        "sentinel/cache/registry_cache.py",
        "        not_waiting = functools.partial(self._waiting_for_connection, False)\n",
        "        not_waiting = functools.partial(self._waiting_for_connection, True)\n",
        (CONNECTION_EVENTS,),
    ),
    Mutation(
        # A load the lost connection stopped failed at once instead of run again once connected.
        "unwaited-load-not-retried",
        "sentinel/cache/registry_cache.py",
        "            if queued and isinstance(error, ZooKeeperUnavailable)"
        " and not self._connected():",
        "            if False:",
        (CONNECTION_EVENTS,),
    ),
    Mutation(
        # A request of a thread that does not wait, queued just after the drop failed the queue.
        "unwaited-request-queued-after-the-drop",
        "sentinel/zk/kazoo_internals.py",
        "        if not self.connected():\n            self._unqueue(",
        "        if False:\n            self._unqueue(",
        (ZK_WATCHES + "test_an_unwaited_request_is_failed_when_the_drop_beats_its_queueing",),
    ),
    Mutation(
        # The relay registering a connection it set up while being cut.
        "relay-cut-race",
        "sentinel/testing/helpers.py",
        "                if not self._open.is_set():\n                    downstream.close()\n",
        "                if False:\n                    downstream.close()\n",
        (
            "tests/unit/test_tcp_proxy.py::"
            "test_a_connection_being_set_up_as_the_relay_is_cut_is_refused",
        ),
    ),
    Mutation(
        # A deregistration without its departure mark: caches take it for an expiry, and a
        # protecting one holds a removed instance back.
        "deregistration-unmarked",
        "sentinel/publisher.py",
        "mark=departure_path(path) if path in self._marked else None",
        "mark=None",
        (
            "tests/integration/test_mass_loss.py::"
            "test_deregistrations_are_never_held_back_and_unmarked_deletes_only_for_the_hold",
        ),
    ),
    Mutation(
        # A closing client leaving its nodes to the session's end, unmarked.
        "close-leaves-unmarked",
        "sentinel/publisher.py",
        "        if not self._marked:\n            return\n",
        "        if True:\n            return\n",
        (
            "tests/integration/test_mass_loss.py::"
            "test_a_mass_expiry_is_protected_and_visible_and_a_deregistration_of_its_size_is_not",
        ),
    ),
    Mutation(
        # Every deregistration marked, whatever the service's spec: each pays a transaction.
        "deregistration-marked-without-the-spec",
        "sentinel/publisher.py",
        "        if spec.mark_departures:\n            self._marked.add(path)",
        "        if True:\n            self._marked.add(path)",
        ("tests/integration/test_publisher.py::test_deregistration_costs_one_conditional_delete",),
    ),
    Mutation(
        # A cache protecting a service whose publishers do not mark: it holds back every
        # deregistration of a mass deletion.
        "protection-without-the-spec",
        "sentinel/cache/protection.py",
        "        if not new.spec.mark_departures:\n",
        "        if False:\n",
        (
            "tests/integration/test_mass_loss.py::"
            "test_a_service_whose_spec_does_not_mark_departures_is_never_protected",
            "tests/unit/test_protection.py::test_a_service_whose_spec_does_not_mark_is_never_protected",
        ),
    ),
    Mutation(
        # A task with no read queued at once, ahead of an earlier event's read: a replacement's
        # deletion overtook the creation and the snapshot held neither (issue 38).
        "deletion-overtakes-creation-read",
        "sentinel/cache/followers.py",
        "            held.released = held.released or not waits\n",
        "            if not waits:\n"
        "                self._worker.merge(held.task)\n"
        "                return\n",
        (
            "tests/faults/test_event_order.py::"
            "test_a_replacement_never_leaves_the_cache_empty[persistent]",
            "tests/unit/test_cache_tasks.py::"
            "test_a_deletion_waits_for_the_read_of_a_creation_before_it",
        ),
    ),
    Mutation(
        # The follower ignoring the mark: every deletion counts as a loss.
        "follower-ignores-departure-marks",
        "sentinel/cache/followers.py",
        "            if kind == EventType.DELETED:\n                kind = DEREGISTERED\n",
        "",
        (
            "tests/integration/test_mass_loss.py::"
            "test_deregistrations_are_never_held_back_and_unmarked_deletes_only_for_the_hold",
        ),
    ),
)


def copy_tree(destination: Path) -> None:
    """The working tree as it is (tracked and untracked files, not ignored ones)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def use_tests_from(revision: str, tree: Path) -> None:
    """Replace the copy's ``tests/`` by the one of ``revision`` (the control: older tests)."""
    shutil.rmtree(tree / "tests")
    archive = subprocess.run(
        ["git", "archive", revision, "tests"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)


def existing(tests: tuple[str, ...], tree: Path) -> tuple[str, ...]:
    """Those of ``tests`` whose function is defined in ``tree``."""
    return tuple(
        test
        for test in tests
        if (tree / test.split("::")[0]).is_file()
        and f"def {test.split('::')[-1]}(" in (tree / test.split("::")[0]).read_text()
    )


def run(mutation: Mutation, tree: Path, why: bool = False) -> tuple[str, float]:
    """Apply ``mutation`` in ``tree``, run its tests, revert: (outcome, seconds)."""
    tests = existing(mutation.tests, tree)
    if not tests:
        return "no such test in this tree", 0.0
    path = tree / mutation.path
    original = mutated = path.read_text()
    for old, new in ((mutation.old, mutation.new), *mutation.also):
        if mutated.count(old) != 1:
            return f"NOT APPLIED ({old[:40]!r} found {mutated.count(old)}x)", 0.0
        mutated = mutated.replace(old, new)
    path.write_text(mutated)
    started = time.monotonic()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-rf",
                *tests,
            ],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        path.write_text(original)
    seconds = time.monotonic() - started
    failed = re.findall(r"^FAILED (\S+)", result.stdout, re.M)
    if failed:
        caught = "caught by " + ", ".join(sorted({name.split("::", 1)[-1] for name in failed}))
        if why:  # the first line pytest marked as the error
            caught += "\n    " + next(
                (line for line in result.stdout.splitlines() if line.startswith("E ")), ""
            )
        return caught, seconds
    if result.returncode == 0:
        return "SURVIVED", seconds
    return f"ERROR (pytest exit {result.returncode}): {result.stdout[-300:]}", seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("words", nargs="*", help="only mutations whose name contains one")
    parser.add_argument("--why", action="store_true", help="show each failure's first line")
    parser.add_argument(
        "--tests-from",
        metavar="REV",
        help="run the tests of git revision REV instead (the control: did they catch it?)",
    )
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.words or any(w in m.name for w in args.words)]
    bad = 0
    with tempfile.TemporaryDirectory(prefix="sentinel-mutations-") as directory:
        tree = Path(directory)
        copy_tree(tree)
        if args.tests_from:
            use_tests_from(args.tests_from, tree)
        width = max(len(m.name) for m in chosen)
        print(f"{'mutation':<{width}}  {'seconds':>7}  outcome", flush=True)
        for mutation in chosen:
            outcome, seconds = run(mutation, tree, args.why)
            bad += not outcome.startswith("caught")
            print(f"{mutation.name:<{width}}  {seconds:7.1f}  {outcome}", flush=True)
    print(f"{len(chosen) - bad} of {len(chosen)} mutations caught")
    return 1 if bad and not args.tests_from else 0


if __name__ == "__main__":
    sys.exit(main())
