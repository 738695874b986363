"""Decontamination and dedup between ingestion and validation."""

import dagster as dg

from assets.defs.config import run_config, to_library
from assets.defs.metadata import mlflow_run, png, stage_context, upstream
from assets.defs.resources import CatalogResource, DockerResource, MlflowResource, settings_from
from envforge.quality.params import DedupConfig
from envforge.stages.decontaminate import decontaminate

DedupRunConfig = run_config(DedupConfig, "DedupRunConfig", "Decontamination and dedup settings (part of the "
                                                           "task-set version); the index parameters are the "
                                                           "index's own (`envforge dedup index --rebuild`).")


@dg.asset(
    group_name="quality", kinds={"python", "duckdb"}, owners=["team:envforge"], deps=["candidate_tasks"],
    description="The candidate task versions (instruction, workspace files, solution, tests, verifier files) checked "
                "against the reference corpora (built-in HumanEval, registered corpora, ENVFORGE_CORPORA) with MinHash "
                "LSH and an exact n-gram index (words, masked prose, normalized code), confirmed exactly, optionally "
                "with embeddings + a judge; and against each other with boilerplate removed. Contaminated tasks and "
                "non-representative near duplicates leave the pipeline but stay in the catalog with the evidence.",
)
def decontaminated_tasks(context: dg.AssetExecutionContext, config: DedupRunConfig, catalog: CatalogResource,
                         docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    tasks = catalog.catalog().load_versions(upstream(context, "candidate_tasks")["task_versions"])
    dedup = to_library(config, DedupConfig)
    result = decontaminate.tracked(settings, dedup, tasks, context=stage_context(context))
    n = result.counts()
    context.log.info(f"{n['clean']} clean, {n['contaminated']} contaminated, {n['duplicate']} duplicates; "
                     f"index +{result.sync.added_docs} docs")
    for warning in result.warnings():
        context.log.warning(warning)
    return dg.MaterializeResult(metadata={
        "tasks": len(tasks), "clean": n["clean"], "contaminated": n["contaminated"], "duplicates": n["duplicate"],
        "duplicate_pairs": len(result.pairs), "index_docs_added": result.sync.added_docs,
        "semantic_stage": result.semantic.status, "chart": png(result.chart),
        "evidence_chart": png(result.evidence_chart),
        "mlflow_run": mlflow_run(settings, result.mlflow_run_id),
        # what the stages after this one take: the clean versions, and for the task set's lineage what left and why
        "clean_versions": dg.MetadataValue.json(result.kept_hashes()),
        "removed": dg.MetadataValue.json(result.removed()), "params": dg.MetadataValue.json(result.config.as_params()),
    })


@dg.asset(
    group_name="quality", kinds={"duckdb"}, owners=["team:envforge"], deps=[decontaminated_tasks],
    description="The latest contamination and dedup verdict of every current task: matched corpus and document, "
                "estimated and exact Jaccard, longest shared word run, duplicate-of, with a similarity histogram.",
)
def contamination_report(catalog: CatalogResource) -> dg.MaterializeResult:
    frame = catalog.catalog().latest_quality()
    flagged = frame.filter(frame["status"] != "clean")
    table = ["| task | status | field | match | exact J | longest run | reason |", "|---|---|---|---|---|---|---|"]
    table += [f"| {r['task_id']} | {r['status']} | {r['field'] or '-'} | {r['corpus'] or '-'}/{r['doc_id'] or '-'} | "
              f"{r['exact_jaccard']:.2f} | {r['longest_shared_ngram']} | {r['reason'][:160].replace('|', '/')} |"
              for r in frame.iter_rows(named=True)]
    return dg.MaterializeResult(metadata={
        "tasks": frame.height, "flagged": flagged.height, "report": dg.MetadataValue.md("\n".join(table)),
        "max_corpus_jaccard_among_clean": float(frame.filter(frame["status"] == "clean")["exact_jaccard"].max() or 0),
    })
