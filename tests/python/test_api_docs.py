"""Every public name of the documented modules has a docstring and an entry in the reference.

The reference pages (docs/api/*.md) list names one `::: dotted.path` directive each, which
mkdocstrings renders with the signature and docstring. This test imports the modules, lists
their public names (those not starting with `_`, defined in bluefog, plus the ones the modules
make on first access), and fails when a name has no docstring or no directive resolves to it.
It also checks that docs/env.md lists every `BLUEFOG_*` variable the code reads. Single process.
"""

from __future__ import annotations

import ast
import glob
import importlib
import inspect
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = ("bluefog.tensorflow", "bluefog.tensorflow.keras", "bluefog.tensorflow.elastic",
           "bluefog.common.topology_util", "bluefog.ray")
# Names the modules resolve in `__getattr__` (so `dir()` does not show them): imported lazily
# because they import Keras.
LAZY = {"bluefog.tensorflow": ("SyncBatchNormalization",),
        "bluefog.tensorflow.elastic": ("CommitStateCallback", "UpdateBatchStateCallback",
                                       "UpdateEpochStateCallback")}
DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.M)


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _public(module_name: str, scan: bool = False) -> dict:
    """The module's public names: its ``__all__`` when it has one (the API is what it lists),
    else (or with ``scan``) what its namespace holds."""
    mod = importlib.import_module(module_name)
    if hasattr(mod, "__all__") and not scan:
        return {name: getattr(mod, name) for name in mod.__all__}
    names = {}
    for name in list(vars(mod)) + list(LAZY.get(module_name, ())):
        if name.startswith("_"):
            continue
        obj = getattr(mod, name)
        if inspect.ismodule(obj):
            continue  # submodules (bf.elastic, bfk.callbacks) are documented as modules
        if isinstance(obj, (str, int, float)):
            # Constants: public when assigned in the module that exports them or in bluefog.
            names[name] = obj
            continue
        if not (getattr(obj, "__module__", "") or "").startswith("bluefog"):
            continue  # imported from elsewhere (typing, networkx, __future__)
        names[name] = obj
    return names


def _attribute_docstring(name: str) -> str | None:
    """The string literal right after `name = ...` in a bluefog module that assigns it, if any."""
    for mod_name, mod in sorted(sys.modules.items()):
        if not mod_name.startswith("bluefog") or not getattr(mod, "__file__", None) or \
                not mod.__file__.endswith(".py"):
            continue
        body = ast.parse(open(mod.__file__, encoding="utf-8").read()).body
        for i, node in enumerate(body[:-1]):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                nxt = body[i + 1]
                if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and \
                        isinstance(nxt.value.value, str):
                    return nxt.value.value
    return None


def _documented() -> list:
    """(dotted path, object) for every `:::` directive of the reference pages."""
    out = []
    for page in sorted(glob.glob(os.path.join(ROOT, "docs", "api", "*.md"))):
        for dotted in DIRECTIVE.findall(open(page, encoding="utf-8").read()):
            out.append((dotted, _resolve(dotted)))
    return out


@pytest.fixture(scope="module")
def documented():
    return _documented()


@pytest.mark.parametrize("module_name", MODULES)
def test_public_names_have_docstrings(module_name):
    missing = []
    for name, obj in sorted(_public(module_name).items()):
        if inspect.isclass(obj) or inspect.isfunction(obj):
            doc = obj.__doc__  # not inspect.getdoc: a base class's docstring says nothing here
        elif callable(obj) and not isinstance(obj, (str, int, float)):
            doc = getattr(obj, "__doc__", None)
        else:  # a constant or an instance: the docstring written under its assignment
            doc = _attribute_docstring(name)
        if not doc or not doc.strip():
            missing.append(name)
    assert not missing, (f"{module_name}: these public names have no docstring: {missing}. "
                         "Write one (what it does, its arguments, what ranks must agree on).")


@pytest.mark.parametrize("module_name", MODULES)
def test_public_names_are_in_the_reference(module_name, documented):
    missing = []
    for name, obj in sorted(_public(module_name).items()):
        if isinstance(obj, (str, int, float)):
            found = any(d.rsplit(".", 1)[1] == name and o == obj for d, o in documented)
        else:
            found = any(o is obj for _, o in documented)
        if not found:
            missing.append(name)
    assert not missing, (f"{module_name}: these public names are missing from the reference "
                         f"(docs/api/*.md): {missing}. Add a `::: {module_name}.NAME` line to "
                         "the page and group where it belongs.")


def test_tensorflow_all_is_the_public_names_only():
    """``bluefog.tensorflow.__all__`` lists every public name once and nothing else, and
    ``dir(bf)`` shows it and the public subpackages, none of the implementation's submodules."""
    import bluefog.tensorflow as bf

    assert len(bf.__all__) == len(set(bf.__all__)), "a name is listed twice in __all__"
    assert set(bf.__all__) == set(_public("bluefog.tensorflow", scan=True)), (
        set(bf.__all__) ^ set(_public("bluefog.tensorflow", scan=True)))
    modules = [n for n in dir(bf) if inspect.ismodule(getattr(bf, n))]
    assert sorted(modules) == ["elastic", "keras", "util"], modules
    assert set(dir(bf)) == set(bf.__all__) | {"elastic", "keras", "util"}
    namespace: dict = {}
    exec("from bluefog.tensorflow import *", namespace)  # noqa: S102 - what users may write
    assert set(namespace) - {"__builtins__"} == set(bf.__all__)


def test_every_name_in_tensorflow_all_is_documented(documented):
    """Each name of ``bluefog.tensorflow.__all__`` has a `::: ` entry in docs/api/*.md that
    resolves to the same object."""
    import bluefog.tensorflow as bf

    missing = [name for name in bf.__all__
               if not any(o is getattr(bf, name) for _, o in documented)]
    assert not missing, (f"bluefog.tensorflow.__all__ names missing from docs/api/*.md: "
                         f"{missing}. Add a `::: bluefog.tensorflow.NAME` line to the page.")


def test_every_directive_resolves(documented):
    assert len(documented) >= 100, f"only {len(documented)} reference entries"


def test_env_page_lists_every_variable_the_code_reads():
    used = set()
    for pattern in ("csrc/**/*.cc", "csrc/**/*.h", "bluefog/**/*.py"):
        for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            text = open(path, encoding="utf-8", errors="replace").read()
            used |= set(re.findall(r"[\"'](BLUEFOG_[A-Z0-9_]+)[\"']", text))
    env_page = open(os.path.join(ROOT, "docs", "env.md"), encoding="utf-8").read()
    missing = sorted(v for v in used if v not in env_page)
    assert used, "found no BLUEFOG_ variable in the code: the pattern is wrong"
    assert not missing, f"docs/env.md does not list {missing}"
