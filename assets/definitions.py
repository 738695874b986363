"""The envforge code location: assets, checks and resources per pipeline stage."""

import dagster as dg

from assets.defs.environments import assets as environments_assets, checks as environments_checks
from assets.defs.quality import assets as quality_assets, checks as quality_checks
from assets.defs.resources import default_resources
from assets.defs.sources import assets as sources_assets, checks as sources_checks
from assets.defs.verification import assets as verification_assets, checks as verification_checks

main_job = dg.define_asset_job(
    "main_job", selection=dg.AssetSelection.all(),
    description="Ingest the specs, decontaminate and dedup them, build their images, and put every task through "
                "the flakiness gate.",
)

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([sources_assets, quality_assets, environments_assets, verification_assets]),
    asset_checks=dg.load_asset_checks_from_modules([sources_checks, quality_checks, environments_checks,
                                                    verification_checks]),
    jobs=[main_job],
    resources=default_resources(),
)
