"""Task sources: one asset per source kind, partitioned by source, and the merged candidates.

A partition is one source (a task.yaml, a runbook, a tickets.yaml, a reviews.yaml, a SWE-bench
JSONL), keyed by its path under task_sources/. The sensor in sensors.py adds partitions as
sources appear and requests runs for the ones that changed.
"""

import dagster as dg

from assets.defs.config import run_config, to_library
from assets.defs.metadata import mlflow_run, problems_table, stage_context
from assets.defs.resources import SANDBOX_POOL, CatalogResource, DockerResource, MlflowResource, settings_from
from envforge.sources import KINDS
from envforge.stages.configs import IngestConfig
from envforge.stages.ingest import ingest

DESCRIPTIONS = {
    "spec": "Hand-written YAML task specs (task.yaml).",
    "runbook": "Runbook tasks (Markdown: setup, instruction, checkpoints, solution).",
    "swebench": "SWE-bench instances against local repositories (history scrubbed, test patch held back).",
    "ticket": "Tickets with fix commits (Jira/GitHub exports mapped by tickets.yaml); FAIL_TO_PASS and "
              "PASS_TO_PASS derived by running the tests before and after the fix in a sandbox.",
    "review": "Code-review records: 'address this review comment', graded by the tests the follow-up commit "
              "changed, derived the same way.",
    "history": "A repository's own commits (history.yaml: range, filters, optional issue exports): each commit "
               "that changes source and tests becomes a task, its tests derived the same way.",
}
PARTITIONS = {kind: dg.DynamicPartitionsDefinition(name=f"{kind}_sources") for kind in KINDS}
IngestRunConfig = run_config(IngestConfig, "IngestRunConfig", "How one source partition is ingested.")
SANDBOX_KINDS = ("ticket", "review", "history")  # their tests are derived by running the suite in sandboxes


def _source_asset(kind: str) -> dg.AssetsDefinition:
    @dg.asset(
        name=f"{kind}_tasks", partitions_def=PARTITIONS[kind], group_name="sources", kinds={"python", "duckdb"},
        owners=["team:envforge"], pool=SANDBOX_POOL if kind in SANDBOX_KINDS else None,
        description=f"{DESCRIPTIONS[kind]} One partition per source file under task_sources/; each run stores "
                    f"the source's tasks and rejects (file, record, field, reason) as its latest load.",
    )
    def _asset(context: dg.AssetExecutionContext, config: IngestRunConfig, catalog: CatalogResource,
               docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
        settings = settings_from(catalog, docker, mlflow)
        path = settings.source_path(context.partition_key)
        tracked = ingest.tracked(settings, to_library(config, IngestConfig), [path], context=stage_context(context))
        res, summ = tracked.result, tracked.summary
        total = len(res.tasks) + len(res.rejects)
        context.log.info(f"{context.partition_key}: {len(res.tasks)} valid, {len(res.rejects)} rejected, "
                         f"{summ.added} new")
        return dg.MaterializeResult(metadata={
            "valid": len(res.tasks), "rejected": len(res.rejects), "added": summ.added,
            "unchanged": summ.unchanged, "reject_rate": round(len(res.rejects) / total, 4) if total else 0.0,
            "batch_id": summ.batch_id, "tasks": dg.MetadataValue.json(sorted(t.id for t in res.tasks)),
            "rejects": problems_table(res.rejects), "mlflow_run": mlflow_run(settings, tracked.mlflow_run_id),
            "statements": dg.MetadataValue.json(tracked.statements.as_json()),
            "funnel": dg.MetadataValue.json(tracked.funnel().as_json()),
        })

    return _asset


source_assets = [_source_asset(kind) for kind in KINDS]
ingest_jobs = [dg.define_asset_job(f"ingest_{kind}_sources", selection=[f"{kind}_tasks"],
                                   description=f"Ingest one {kind} source (a partition of {kind}_tasks).")
               for kind in KINDS]


def register_source_partitions(instance: dg.DagsterInstance, refs, root) -> list[tuple[str, str]]:
    """Add each discovered source as a partition of its kind's asset (if new); returns (kind, key) per source."""
    keys = [(ref.kind, ref.key(root)) for ref in refs]
    for kind in KINDS:
        known = set(instance.get_dynamic_partitions(PARTITIONS[kind].name))
        instance.add_dynamic_partitions(PARTITIONS[kind].name, [k for kd, k in keys if kd == kind and k not in known])
    return keys


class CandidateConfig(dg.Config):
    """`reingest`: ingest every source under task_sources/ first (what the nightly refresh does), registering
    new sources as partitions; otherwise merge what the per-source runs stored."""

    reingest: bool = False


@dg.asset(
    group_name="sources", kinds={"duckdb"}, owners=["team:envforge"], deps=[a.key for a in source_assets],
    pool=SANDBOX_POOL,  # with `reingest` it derives ticket/review tests in sandboxes
    description="Every live task from every source's latest load: the input of decontamination. Sources that "
                "no longer exist under task_sources/ are retired here, so their tasks stop flowing downstream.",
)
def candidate_tasks(context: dg.AssetExecutionContext, config: CandidateConfig, catalog: CatalogResource,
                    docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    from envforge.sources import scan_sources

    settings = settings_from(catalog, docker, mlflow)
    cat = catalog.catalog()
    found = scan_sources(settings.bundled_sources())
    refs = found.refs
    if config.reingest:
        tracked = ingest.tracked(settings, IngestConfig(), settings.bundled_sources(), context=stage_context(context))
        context.log.info(f"re-ingested {len(tracked.sources)} sources: {len(tracked.result.tasks)} valid, "
                         f"{len(tracked.result.rejects)} rejected, {tracked.summary.added} new task versions")
        register_source_partitions(context.instance, refs, settings.task_sources_dir)
    retired = cat.retire_missing_sources({r.key(settings.task_sources_dir) for r in refs},
                                         settings.task_sources_dir, under=settings.bundled_sources())
    if retired:
        context.log.info(f"retired {len(retired)} source(s) no longer on disk: {retired}")
    frame = cat.tasks()
    rejects = cat.current_rejects()
    loads = cat.source_loads()
    by_kind = {k: int((frame["source"] == k).sum()) for k in KINDS}
    table = ["| source | kind | tasks | rejects |", "|---|---|---|---|"]
    table += [f"| {r['source_key']} | {r['source_kind']} | {r['n_tasks']} | {r['n_rejects']} |"
              for r in loads.iter_rows(named=True)]
    return dg.MaterializeResult(metadata={
        "tasks": frame.height, "rejects": rejects.height, "sources": loads.height,
        "by_kind": dg.MetadataValue.json(by_kind), "sources_table": dg.MetadataValue.md("\n".join(table)),
        "retired_sources": dg.MetadataValue.json(retired),
        "skipped_files": problems_table(found.skipped),  # e.g. a .md without front matter among runbooks
        "task_versions": dg.MetadataValue.json(frame["content_hash"].to_list()),  # what decontamination takes
    })
