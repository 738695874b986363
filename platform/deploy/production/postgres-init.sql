-- Run once by the postgres image on an empty data volume (/docker-entrypoint-initdb.d/):
-- POSTGRES_DB creates Dagster's database; MLflow's backend store gets its own.
CREATE DATABASE mlflow;
