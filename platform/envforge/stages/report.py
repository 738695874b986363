"""Report: the run report of a task-set version, one self-contained HTML page kept with the MLflow run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envforge.config import Settings
from envforge.report import RunReport, build_run_report
from envforge.stages.base import StageContext, StageResult, stage
from envforge.stages.configs import ReportConfig


@dataclass
class ReportResult(StageResult):
    report: RunReport

    def params(self) -> dict[str, Any]:
        return {"task_set_version": self.report.task_set_version or ""}

    def metrics(self) -> dict[str, float]:
        return {f"report_{k}": v for k, v in self.report.counts.items()}

    def files(self) -> list[tuple[Path, str]]:
        return [(self.report.path, "report")]


@stage("report")
def report(
    settings: Settings, config: ReportConfig, version: str | None, context: StageContext = StageContext()
) -> ReportResult:
    """The run report of `version` (a full version; None before any task set exists)."""
    return ReportResult(build_run_report(settings, version, context.mlflow_run_id or "", context.dagster_run_id))
