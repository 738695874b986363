"""The layer contracts hold (the same check as `make lint`'s lint-imports), docs/architecture.md
draws the layers the contracts and the import graph define (regenerate: python -m tools.architecture),
and the mypy baseline only shrinks."""

from collections import Counter

import grimp
from importlinter.cli import EXIT_STATUS_SUCCESS, lint_imports

from tests.conftest import REPO
from tools.architecture import embedded, mermaid, read_contracts, transitive_reduction
from tools.mypy_baseline import compare, count_errors


def test_import_contracts_are_kept():
    status = lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True, no_logo=True)
    assert status == EXIT_STATUS_SUCCESS, (
        "an import breaks the layers in pyproject.toml [tool.importlinter] (the report is above)"
    )


def test_docs_show_the_current_layers():
    committed = embedded((REPO / "docs" / "architecture.md").read_text())
    assert committed == mermaid(), "docs/architecture.md is stale: paste the output of python -m tools.architecture"


def test_every_package_of_the_library_has_a_layer():
    layered = {name for layer in read_contracts().layers for name in layer}
    packages = {m.split(".")[1] for m in grimp.build_graph("envforge").modules if m.count(".") >= 1}
    assert packages <= layered, packages - layered


def test_transitive_reduction_keeps_only_arrows_with_no_detour():
    edges = {("cli", "stages"), ("stages", "rollout"), ("cli", "rollout"), ("rollout", "sandbox")}
    assert transitive_reduction(edges) == {("cli", "stages"), ("stages", "rollout"), ("rollout", "sandbox")}


def test_mypy_baseline_flags_growth_and_shrinkage():
    output = "\n".join(
        [
            "platform/envforge/a.py:3: error: Incompatible types  [assignment]",
            "platform/envforge/a.py:9:5: error: Missing return  [return]",
            "platform/envforge/a.py:9: note: see above",
            "platform/envforge/b.py:1: error: Name 'x' is not defined  [name-defined]",
        ]
    )
    counts, lines = count_errors(output)
    assert counts == Counter({"platform/envforge/a.py": 2, "platform/envforge/b.py": 1})
    assert len(lines["platform/envforge/a.py"]) == 2
    grown, shrunk = compare(counts, {"platform/envforge/a.py": 2, "platform/envforge/c.py": 4})
    assert grown == {"platform/envforge/b.py": (0, 1)}
    assert shrunk == {"platform/envforge/c.py": (4, 0)}
