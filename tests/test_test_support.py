"""Test helpers outside the test folders go with the test change (sources/test_support.py): a real git
repository, split the way every history source splits a commit."""

from __future__ import annotations

from pathlib import Path

from envforge.sources.gitrepo import split_change
from envforge.sources.test_support import module_names
from tests.test_history_sources import commit, git

CORE = "def size(items):\n    return len(items)\n"
PROBES = "def has_fork():\n    return True\n"
TESTS = (
    "from pkg.core import size\n"
    "from probes import has_fork\n"
    "from marks import skip_without_fork\n\n\n"
    "def test_size():\n    assert size([1]) == 1\n"
)


def _repo(tmp_path: Path) -> tuple[Path, str]:
    """(the repository, its first commit): src/pkg (the project), helpers/ (loose modules on the tests'
    path), tools/ (used by a script and the tests), lib/other/ (a package outside the known layouts), tests/."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit(
        repo,
        "initial",
        {
            "src/pkg/__init__.py": "",
            "src/pkg/core.py": CORE,
            "helpers/probes.py": PROBES,
            "helpers/marks.py": "import probes\n\nskip_without_fork = probes.has_fork\n",
            "tools/gen.py": "VERSION = 1\n",
            "scripts/release.py": "from gen import VERSION\n",
            "lib/other/__init__.py": "",
            "lib/other/leaf.py": "X = 1\n",
            "tests/test_core.py": TESTS + "from gen import VERSION\nfrom other.leaf import X\n",
            "docs/changes.rst": "changes\n",
        },
        0,
    )
    return repo, git(repo, "rev-parse", "HEAD")


def _commit_fix(repo: Path, message: str, test_imports: str = "", more: dict[str, str] | None = None) -> str:
    """A fix of pkg.core whose tests use a probe it adds to helpers/probes.py (and `more` files changed)."""
    files = {
        "src/pkg/core.py": CORE.replace("len(items)", "len(list(items))"),
        "helpers/probes.py": PROBES + "\n\ndef has_links():\n    return True\n",
        "tests/test_core.py": TESTS + test_imports + "from probes import has_links\n",
    }
    return commit(repo, message, {**files, **(more or {})}, 1)


def test_a_changed_helper_only_the_tests_import_goes_with_the_test_change(tmp_path):
    repo, before = _repo(tmp_path)
    after = _commit_fix(
        repo,
        "size: count None too; tests use a new probe",
        "from gen import VERSION\nfrom other.leaf import X\n",
        {"tools/gen.py": "VERSION = 2\n", "lib/other/leaf.py": "X = 2\n"},
    )
    split = split_change(repo, before, after)
    # probes.py is imported by a test and by marks.py (unchanged), itself imported only by tests.
    assert split.support_files == ["helpers/probes.py"]
    assert split.test_files == ["helpers/probes.py", "tests/test_core.py"]
    # gen.py is imported by a script too; leaf.py is in a package: both stay with the code to write.
    assert split.source_files == ["lib/other/leaf.py", "src/pkg/core.py", "tools/gen.py"]
    assert "has_links" in split.test_patch and "has_links" not in split.source_patch
    assert "len(list(items))" in split.source_patch


def test_nothing_moves_when_no_code_change_would_be_left(tmp_path):
    repo, before = _repo(tmp_path)
    after = commit(
        repo,
        "probes: detect links",
        {
            "helpers/probes.py": PROBES + "\n\ndef has_links():\n    return True\n",
            "docs/changes.rst": "changes\n- links\n",
            "tests/test_core.py": TESTS + "from probes import has_links\n",
        },
        1,
    )
    split = split_change(repo, before, after)
    assert split.support_files == []
    assert split.source_files == ["docs/changes.rst", "helpers/probes.py"]


def test_relative_imports_are_followed_and_a_file_that_does_not_parse_imports_nothing(tmp_path):
    repo, before = _repo(tmp_path)
    after = commit(
        repo,
        "size: count None too",
        {
            "src/pkg/core.py": CORE.replace("len(items)", "len(list(items))"),
            "helpers/probes.py": PROBES + "\nNEW = 1\n",
            "helpers/runner.py": "from . import probes\n",  # a non-test importer, relative
            "helpers/broken.py": "import probes\ndef (:\n",  # does not parse
        },
        1,
    )
    split = split_change(repo, before, after)
    assert split.support_files == []
    assert "helpers/probes.py" in split.source_files


def test_module_names_are_the_dotted_suffixes_of_a_path():
    assert module_names("tasks/coverage_pragmas.py") == {"tasks.coverage_pragmas", "coverage_pragmas"}
    assert module_names("a/b/__init__.py") == {"a.b", "b"}
    assert module_names("my-tools/x.py") == {"x"}


def test_a_history_candidate_and_its_dry_run_say_which_helpers_are_held_back(tmp_path, allow_tmp_sources):
    from envforge.quality.source_scan import scan_rows
    from envforge.sources import scan_sources
    from envforge.sources.history import load_history_source

    repo, _ = _repo(tmp_path)
    _commit_fix(repo, "size: count what an iterator yields")
    source = tmp_path / "history"
    source.mkdir()
    (source / "history.yaml").write_text(f"repository: {repo}\nproject: pkg\nrange: {{last: 1}}\n")
    [ref] = scan_sources([source]).refs
    loaded = load_history_source(ref.path)
    [candidate] = loaded.candidates
    assert candidate.provisional_task().spec.metadata["test_support_files"] == ["helpers/probes.py"]
    [row] = [r for r in scan_rows([(ref, loaded)]) if r["becomes"] == "candidate"]
    assert row["reason"].endswith("; test helpers held back with the tests: helpers/probes.py")
