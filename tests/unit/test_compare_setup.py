"""benchmarks.compare says what to install instead of failing when Curator cannot run."""

from benchmarks import common, compare


def test_no_java_skips_the_curator_column_with_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(common.shutil, "which", lambda name: None)
    java, why = compare.curator_classpath(tmp_path)
    assert java is None
    assert "no java/javac" in why and "libcurator-discovery-java" in why


def test_missing_jars_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(common.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(compare, "JARS", ("curator-not-installed",))
    java, why = compare.curator_classpath(tmp_path)
    assert java is None and "curator-not-installed.jar" in why and "apt-get install" in why
