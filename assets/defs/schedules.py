"""The nightly task refresh: re-ingest every source, decontaminate, validate and re-tier.

Task-set versions are content hashes of their members, so a night where nothing changed
produces the same version (`tiered_task_set` reports `new_version: false`) and no new
rollout partition.
"""

import dagster as dg

from assets.defs.rollouts.assets import tiered_task_set
from assets.defs.sources.assets import candidate_tasks

nightly_refresh_job = dg.define_asset_job(
    "nightly_refresh_job",
    selection=dg.AssetSelection.assets(candidate_tasks).downstream()
    & dg.AssetSelection.assets(tiered_task_set).upstream(),
    description="Re-ingest every source under task_sources/, then decontaminate, build images, run the gate and "
                "re-tier; a new task-set version appears only when a task changed.",
)

nightly_refresh = dg.ScheduleDefinition(
    name="nightly_refresh", job=nightly_refresh_job, cron_schedule="0 2 * * *", execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    run_config={"ops": {"candidate_tasks": {"config": {"reingest": True}}}},
    description="Every night at 02:00 UTC: the full task refresh (nightly_refresh_job with reingest on).",
)
