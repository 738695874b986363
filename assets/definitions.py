"""The envforge code location: assets, checks, jobs, sensors and resources per pipeline stage."""

import dagster as dg

from assets.defs.environments import assets as environments_assets
from assets.defs.environments import checks as environments_checks
from assets.defs.logging import compact_console_logger
from assets.defs.quality import assets as quality_assets
from assets.defs.quality import checks as quality_checks
from assets.defs.reporting import assets as reporting_assets
from assets.defs.resources import default_resources
from assets.defs.rollouts import assets as rollouts_assets
from assets.defs.rollouts import checks as rollouts_checks
from assets.defs.schedules import nightly_refresh, nightly_refresh_job
from assets.defs.sources import assets as sources_assets
from assets.defs.sources import checks as sources_checks
from assets.defs.sources.sensors import task_sources_sensor
from assets.defs.training import assets as training_assets
from assets.defs.verification import assets as verification_assets
from assets.defs.verification import checks as verification_checks

main_job = dg.define_asset_job(
    "main_job", selection=dg.AssetSelection.assets(sources_assets.candidate_tasks).downstream()
    - dg.AssetSelection.assets(rollouts_assets.rollout_batch),
    description="The whole pipeline from the live tasks of every source's latest load: decontaminate and dedup, "
                "build images, put every task through the flakiness gate, tier the accepted ones into a task-set "
                "version, train (SFT, then GRPO) and evaluate before/after, and write the run report. Sources are "
                "ingested per partition (the task_sources_sensor, or a backfill of the *_tasks assets); rollout "
                "batches per (task set, policy) partition with rollout_job.",
)
rollout_job = dg.define_asset_job(
    "rollout_job", selection=dg.AssetSelection.assets(rollouts_assets.rollout_batch),
    description="One rollout batch: a (task-set version, policy) partition of rollout_batch.",
)
report_job = dg.define_asset_job(
    "report_job", selection=dg.AssetSelection.assets(reporting_assets.run_report),
    description="Re-render the HTML run report of the newest task set (e.g. after a rollout batch).",
)

defs = dg.Definitions(
    assets=[*sources_assets.source_assets, sources_assets.candidate_tasks,
            *dg.load_assets_from_modules([quality_assets, environments_assets, verification_assets,
                                          rollouts_assets, training_assets, reporting_assets])],
    asset_checks=[*sources_checks.reject_rate_checks, sources_checks.candidate_tasks_schema,
                  sources_checks.candidate_statements,
                  *dg.load_asset_checks_from_modules([quality_checks, environments_checks, verification_checks,
                                                      rollouts_checks])],
    jobs=[main_job, rollout_job, report_job, nightly_refresh_job, *sources_assets.ingest_jobs],
    schedules=[nightly_refresh],
    sensors=[task_sources_sensor],
    resources=default_resources(),
    loggers={"console": compact_console_logger},
)
