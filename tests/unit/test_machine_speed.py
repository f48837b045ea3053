"""``tests.machine_speed``: the reading ``./run.sh test`` prints before and after the suite."""

import re

from tests import machine_speed


def test_a_reading_is_a_median_between_its_fastest_and_slowest_loop():
    median, fastest, slowest = machine_speed.reading(samples=3)
    assert 0 < fastest <= median <= slowest


def test_the_line_names_its_label_and_the_reading(capsys):
    assert machine_speed.main(["after", "the", "suite"]) == 0
    line = capsys.readouterr().err
    assert re.fullmatch(
        r"run\.sh: machine speed after the suite: a fixed loop took \d+ ms of CPU "
        r"\(median of 5, \d+-\d+; docs/testing-history\.md, 'Machine speed'\)\n",
        line,
    ), line
