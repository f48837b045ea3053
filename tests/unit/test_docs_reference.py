"""The reference's docstring converter (docs/hooks/reference.py), on its own: reST roles,
literals and ``::`` blocks in, the site's Markdown out. tests/unit/test_docs_site.py checks
the built site as a whole."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("reference", ROOT / "docs/hooks/reference.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)

KNOWN = {
    "sentinel.errors.ValidationError": "sentinel.errors.ValidationError",
    "start": "sentinel.client.Sentinel.start",
    "sentinel.zk.tls.TlsConfig.from_env": "sentinel.zk.tls.TlsConfig.from_env",
}


def convert(text: str) -> str:
    return reference.convert(text, KNOWN.get)


def test_roles_become_cross_references_titled_as_sphinx_titles_them():
    assert convert(":class:`~sentinel.errors.ValidationError`") == (
        "[`ValidationError`][sentinel.errors.ValidationError]"
    )
    assert convert(":class:`sentinel.errors.ValidationError`") == (
        "[`sentinel.errors.ValidationError`][sentinel.errors.ValidationError]"
    )
    assert convert("call :meth:`start` first") == (
        "call [`start()`][sentinel.client.Sentinel.start] first"
    )
    assert convert(":meth:`TlsConfig.from_env() <sentinel.zk.tls.TlsConfig.from_env>`") == (
        "[`TlsConfig.from_env()`][sentinel.zk.tls.TlsConfig.from_env]"
    )


def test_a_name_the_reference_does_not_show_is_code_not_a_broken_link():
    assert convert(":class:`DeprecationWarning`") == "`DeprecationWarning`"
    assert convert(":func:`~sentinel.memo.identity`") == "`identity()`"


def test_double_backquotes_become_code_spans():
    assert convert("``$SENTINEL_ZK``, else ``sentinel zk start``") == (
        "`$SENTINEL_ZK`, else `sentinel zk start`"
    )


def test_a_literal_block_becomes_a_fenced_block_at_its_paragraph_s_indentation():
    text = "Use it so::\n\n    with x:\n        y()\n\nAfter."
    assert convert(text) == "Use it so:\n\n```python\nwith x:\n    y()\n```\n\nAfter."
    nested = "    Example ::\n\n        $ sentinel ls\n"
    assert convert(nested) == "    Example\n\n    ```console\n    $ sentinel ls\n    ```\n"


def test_code_is_left_as_written():
    text = "```python\nx = ':class:`y`'  # ``z``\n```\n"
    assert convert(text) == text
    text = "Run::\n\n    print(':meth:`x`')\n"
    assert ":meth:`x`" in convert(text)


def test_a_default_given_in_prose_is_markdown():
    line = "hosts : str, default ``$SENTINEL_ZK``, else the development server\n"
    assert convert(line) == (
        'hosts : str, default <span class="doc-default">`$SENTINEL_ZK`, else the development'
        " server</span>\n"
    )
    assert '<span class="doc-default">`None` (plain TCP)</span>' in convert(
        "tls : bool or None, default None (plain TCP)"
    )
    assert '<span class="doc-default">`10.0`</span>' in convert("timeout : float, default 10.0")


def test_the_plug_in_folders_are_read_under_their_installed_names():
    assert reference.installed_packages() == {
        "sentinel.policies": ROOT / "policies",
        "sentinel.balancers": ROOT / "balancers",
    }
