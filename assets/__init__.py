"""The Dagster code location: thin wiring of the envforge library into assets."""
