"""Decontamination and dedup between ingestion and validation."""

import dagster as dg

from assets.defs.metadata import mlflow_run, png
from assets.defs.resources import CatalogResource, DockerResource, MlflowResource, settings_from
from envforge import stages
from envforge.quality.params import DedupConfig, SemanticConfig


class DedupRunConfig(dg.Config):
    """Decision rules for one run (index parameters are the index's: `envforge dedup index --rebuild`)."""

    threshold: float = 0.5
    verbatim_ngram: int = 13
    code_run: int = 50
    semantic_url: str = ""
    semantic_model: str = ""
    judge_url: str = ""
    judge_model: str = ""

    def dedup_config(self) -> DedupConfig:
        semantic = SemanticConfig(enabled=bool(self.semantic_url), url=self.semantic_url, model=self.semantic_model,
                                  judge_url=self.judge_url, judge_model=self.judge_model)
        return DedupConfig(threshold=self.threshold, verbatim_ngram=self.verbatim_ngram, code_run=self.code_run,
                           semantic=semantic)


@dg.asset(
    group_name="quality", kinds={"python", "duckdb"}, owners=["team:envforge"], deps=["candidate_tasks"],
    description="Current tasks (instruction, workspace files, solution, tests, verifier files) checked against the "
                "reference corpora (built-in HumanEval, registered corpora, ENVFORGE_CORPORA) with MinHash LSH and "
                "an exact n-gram index (words, masked prose, normalized code), confirmed exactly, optionally with "
                "embeddings + a judge; and against each other with boilerplate removed. Contaminated tasks and "
                "non-representative near duplicates leave the pipeline but stay in the catalog with the evidence.",
)
def decontaminated_tasks(context: dg.AssetExecutionContext, config: DedupRunConfig, catalog: CatalogResource,
                         docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    tasks = catalog.catalog().load_tasks()
    report, run_id, chart = stages.decontaminate(settings, tasks, config.dedup_config(),
                                                 dagster_run_id=context.run.run_id)
    statuses = [r["status"] for r in report.rows]
    context.log.info(f"{statuses.count('clean')} clean, {statuses.count('contaminated')} contaminated, "
                     f"{statuses.count('duplicate')} duplicates; index +{report.sync.added_docs} docs")
    for warning in report.warnings + ([report.semantic.note()] if report.semantic.note() else []):
        context.log.warning(warning)
    return dg.MaterializeResult(metadata={
        "tasks": len(tasks), "clean": statuses.count("clean"), "contaminated": statuses.count("contaminated"),
        "duplicates": statuses.count("duplicate"), "duplicate_pairs": len(report.pairs),
        "index_docs_added": report.sync.added_docs, "semantic_stage": report.semantic.status,
        "chart": png(chart), "evidence_chart": png(report.charts["evidence"]),
        "mlflow_run": mlflow_run(settings, run_id),
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
