"""Decontamination and dedup between ingestion and validation."""

import dagster as dg

from assets.defs.metadata import mlflow_run, png
from assets.defs.resources import CatalogResource, DockerResource, MlflowResource, settings_from
from envforge import stages
from envforge.quality.params import DedupConfig


class DedupRunConfig(dg.Config):
    threshold: float = 0.5
    num_perm: int = 128


@dg.asset(
    group_name="quality", kinds={"python", "duckdb"}, owners=["team:envforge"], deps=["candidate_tasks"],
    description="Current tasks checked against the reference corpora (built-in HumanEval plus ENVFORGE_CORPORA) "
                "with MinHash LSH + exact confirmation, and against each other; contaminated tasks and "
                "non-representative near duplicates leave the pipeline but stay in the catalog with the reason.",
)
def decontaminated_tasks(context: dg.AssetExecutionContext, config: DedupRunConfig, catalog: CatalogResource,
                         docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    tasks = catalog.catalog().load_tasks()
    report, run_id, chart = stages.decontaminate(settings, tasks, DedupConfig(config.threshold, config.num_perm),
                                                 dagster_run_id=context.run.run_id)
    statuses = [r["status"] for r in report.rows]
    context.log.info(f"{statuses.count('clean')} clean, {statuses.count('contaminated')} contaminated, "
                     f"{statuses.count('duplicate')} duplicates; index +{report.sync.added_docs} docs")
    return dg.MaterializeResult(metadata={
        "tasks": len(tasks), "clean": statuses.count("clean"), "contaminated": statuses.count("contaminated"),
        "duplicates": statuses.count("duplicate"), "duplicate_pairs": len(report.pairs),
        "index_docs_added": report.sync.added_docs, "chart": png(chart), "mlflow_run": mlflow_run(settings, run_id),
    })


@dg.asset(
    group_name="quality", kinds={"duckdb"}, owners=["team:envforge"], deps=[decontaminated_tasks],
    description="The latest contamination and dedup verdict of every current task: matched corpus and document, "
                "estimated and exact Jaccard, longest shared word run, duplicate-of, with a similarity histogram.",
)
def contamination_report(catalog: CatalogResource) -> dg.MaterializeResult:
    frame = catalog.catalog().latest_quality()
    flagged = frame.filter(frame["status"] != "clean")
    table = ["| task | status | match | exact J | longest run | reason |", "|---|---|---|---|---|---|"]
    table += [f"| {r['task_id']} | {r['status']} | {r['corpus'] or '-'}/{r['doc_id'] or '-'} | "
              f"{r['exact_jaccard']:.2f} | {r['longest_shared_ngram']} | {r['reason'][:120]} |"
              for r in frame.iter_rows(named=True)]
    return dg.MaterializeResult(metadata={
        "tasks": frame.height, "flagged": flagged.height, "report": dg.MetadataValue.md("\n".join(table)),
        "max_corpus_jaccard_among_clean": float(frame.filter(frame["status"] == "clean")["exact_jaccard"].max() or 0),
    })
