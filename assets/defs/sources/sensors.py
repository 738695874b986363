"""The task-sources sensor: new or changed files under task_sources/ trigger their partitions.

The cursor is the {source key: {kind, fingerprint}} state of the last tick; the diffing lives
in `envforge.sources.watch` so it is tested without Dagster.
"""

import json

import dagster as dg

from assets.defs.sources.assets import PARTITIONS, ingest_jobs
from envforge.config import Settings
from envforge.sources.watch import scan


@dg.sensor(jobs=ingest_jobs, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Watches task_sources/ (all folders but examples/): registers new sources as partitions "
                       "of their kind's asset, requests an ingest run for every new or changed source, and drops "
                       "partitions whose source was deleted.")
def task_sources_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    settings = Settings.from_env()
    previous = json.loads(context.cursor) if context.cursor else {}
    changes = scan(settings.bundled_sources(), settings.task_sources_dir, previous)
    root = settings.task_sources_dir
    added: dict[str, list[str]] = {}
    for ref in changes.new:
        added.setdefault(ref.kind, []).append(ref.key(root))
    removed: dict[str, list[str]] = {}
    for kind, key in changes.removed:
        if kind in PARTITIONS:
            removed.setdefault(kind, []).append(key)
    requests = [dg.RunRequest(run_key=f"{ref.key(root)}@{changes.state[ref.key(root)]['fingerprint']}",
                              job_name=f"ingest_{ref.kind}_sources", partition_key=ref.key(root),
                              tags={"envforge/source": ref.key(root)})
                for ref in changes.to_ingest]
    if changes:
        context.log.info(f"{len(changes.new)} new, {len(changes.changed)} changed, {len(changes.removed)} removed")
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[PARTITIONS[k].build_add_request(keys) for k, keys in added.items()]
        + [PARTITIONS[k].build_delete_request(keys) for k, keys in removed.items()],
        cursor=json.dumps(changes.state, sort_keys=True),
    )
