"""A pytest plug-in for mutmut runs only (``pytest_add_cli_args`` in ``pyproject.toml``).

The plug-in folders ``policies/`` and ``balancers/`` install as ``sentinel.policies`` and
``sentinel.balancers``, but mutmut names a mutant after its file (``policies.metrics.x_...``)
and switches it on only in a module of that name. Without this plug-in the tests import the
installed folders under their ``sentinel.`` names and no mutant of them ever runs (mutmut
reports them all "not checked"). Here the two are imported as the top-level packages mutmut
copied into ``mutants/`` (first on ``sys.path``), and ``sentinel.policies`` and
``sentinel.balancers`` are made those same modules, so the tests exercise the mutated code.
"""

import importlib
import sys

import sentinel

for _folder in ("policies", "balancers"):
    _package = importlib.import_module(_folder)
    setattr(sentinel, _folder, _package)
    for _name, _module in list(sys.modules.items()):
        if _name == _folder or _name.startswith(f"{_folder}."):
            sys.modules[f"sentinel.{_name}"] = _module
