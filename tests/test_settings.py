"""envforge.settings: every environment variable declared once and read in one place; the generated
docs/configuration.md; `envforge config show`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envforge.config import Settings
from envforge.fleet.config import FleetConfig, FleetConfigError
from envforge.settings import DEPLOY_VARIABLES, NOT_SETTINGS, EnvSettings, SettingsError, origins, read_env, variables
from envforge.settings_docs import MASK, configuration_markdown, effective

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "platform" / "envforge").rglob("*.py")) + sorted((ROOT / "assets").rglob("*.py"))
NAME = re.compile(r"(?<![A-Za-z0-9_])ENVFORGE_[A-Z0-9_]+")
# Literal reads of the process environment outside envforge.settings, each with why it is not
# through the model. Anything else reading a variable must go through read_env().
DIRECT_READS = {
    ("platform/envforge/verify/config.py", "ENVFORGE_GATE_RUNS"): "CLI option default built at start-up",
    ("platform/envforge/track.py", "MLFLOW_TRACKING_URI"): "saved and restored around MLflow's fluent API",
    ("assets/demo.py", "DAGSTER_HOME"): "Dagster's own variable, set for Dagster",
    ("platform/envforge/verify/runners/envforge_reporter.py", "ENVFORGE_TEST_FILES"): "runs inside the sandbox",
    ("platform/envforge/verify/runners/envforge_reporter.py", "ENVFORGE_TEST_ORDER"): "runs inside the sandbox",
    ("platform/envforge/verify/runners/envforge_reporter.py", "ENVFORGE_FAIL_FAST"): "runs inside the sandbox",
    ("platform/envforge/verify/runners/envforge_reporter.py", "ENVFORGE_TEST_IDS"): "runs inside the sandbox",
    ("platform/envforge/verify/runners/envforge_reporter.py", "ENVFORGE_TRACE_CALLS"): "runs inside the sandbox",
    ("platform/envforge/verify/runners/unittest_runner.py", "ENVFORGE_TEST_ORDER"): "runs inside the sandbox",
    ("platform/envforge/verify/runners/pytest_launcher.py", "ENVFORGE_PYTHONPATH"): "runs inside the sandbox",
    ("platform/envforge/verify/runners/pytest_launcher.py", "ENVFORGE_PROJECT_MODULES"): "runs inside the sandbox",
}
READ = re.compile(r"""os\.(?:environ\.get|environ\.pop|getenv)\(\s*["']([A-Z][A-Z0-9_]+)["']"""
                  r"""|os\.environ\[\s*["']([A-Z][A-Z0-9_]+)["']\](?!\s*=[^=])"""
                  r"""|\b(?:env|environ)(?:\.get\(|\[)\s*["'](ENVFORGE_[A-Z0-9_]+)["']""")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_envforge_name_in_the_source_is_a_declared_setting_or_a_known_non_setting():
    declared = set(variables())
    unknown = {}
    for path in SOURCES:
        for name in set(NAME.findall(path.read_text(encoding="utf-8"))):
            if name.endswith("_"):  # a prefix in prose: ENVFORGE_FLEET_<NAME>, ENVFORGE_HEALTH_<FIELD>
                ok = any(v.startswith(name) for v in declared)
            else:
                ok = name in declared or name in NOT_SETTINGS or name in DEPLOY_VARIABLES
            if not ok:
                unknown.setdefault(name, _rel(path))
    assert not unknown, f"declare these in envforge.settings (or NOT_SETTINGS): {unknown}"


def test_only_the_settings_module_reads_variables_by_name():
    reads = set()
    for path in SOURCES:
        if path.name == "settings.py" and path.parent.name == "envforge":
            continue
        for m in READ.finditer(path.read_text(encoding="utf-8")):
            reads.add((_rel(path), next(g for g in m.groups() if g)))
    assert reads - set(DIRECT_READS) == set(), "read these through envforge.settings.read_env()"
    assert set(DIRECT_READS) <= reads, "a listed direct read is gone: drop it from DIRECT_READS"


def test_the_one_direct_read_keeps_the_declared_default(monkeypatch):
    from envforge.verify.config import GateConfig

    monkeypatch.delenv("ENVFORGE_GATE_RUNS", raising=False)
    assert GateConfig().runs == EnvSettings.model_fields["gate_runs"].default
    monkeypatch.setenv("ENVFORGE_GATE_RUNS", "3")
    assert GateConfig().runs == read_env().gate_runs == 3


def test_defaults_with_an_empty_environment(tmp_path):
    env = read_env({})
    assert env.mlflow_experiment == "envforge" and env.env == "local" and env.service_port == 8080
    assert env.fleet_max_idle_per_image == 4 and env.ray_address == "" and env.metrics is True
    assert env.store_url is None and env.corpus_specs == [] and env.health_max_fault_rate is None
    assert set(origins({}).values()) == {"default"}
    s = Settings.from_env({"ENVFORGE_DATA_DIR": str(tmp_path)})
    assert s.mlflow_tracking_uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"


def test_environment_overrides_and_empty_values(tmp_path):
    env = read_env({"ENVFORGE_SERVICE_PORT": " 9090 ", "ENVFORGE_METRICS": "off", "ENVFORGE_STORE_URL": "",
                    "ENVFORGE_SOURCE_ROOTS": "", "ENVFORGE_CORPORA": "a=/x; ;b=/y",
                    "ENVFORGE_FLEET_IMAGE_DISTRIBUTION": "build", "ENVFORGE_DATA_DIR": str(tmp_path)})
    assert env.service_port == 9090 and env.metrics is False and env.fleet_image_distribution == "build"
    assert env.store_url is None  # empty is unset ...
    assert env.source_roots == ""  # ... except where empty means something (no extra roots)
    assert env.corpus_specs == ["a=/x", "b=/y"]
    came = origins({"ENVFORGE_SERVICE_PORT": "9090", "ENVFORGE_STORE_URL": "", "ENVFORGE_SOURCE_ROOTS": ""})
    assert came["service_port"] == "environment" and came["store_url"] == "default"
    assert came["source_roots"] == "environment"
    assert FleetConfig.from_env({"ENVFORGE_RAY_ADDRESS": " ray://head:10001 "}).ray_address == "ray://head:10001"


def test_a_bad_value_names_the_variable_and_what_it_expects():
    with pytest.raises(SettingsError) as exc:
        read_env({"ENVFORGE_SANDBOX_THREADS": "many", "ENVFORGE_MOVING_REFS": "sometimes",
                  "ENVFORGE_METRICS_LINGER_S": "5"})
    message = str(exc.value)
    assert "environment variable ENVFORGE_SANDBOX_THREADS: expected a whole number, got 'many'" in message
    assert "environment variable ENVFORGE_MOVING_REFS: expected one of resolve or refuse, got 'sometimes'" in message
    assert "LINGER" not in message
    assert {p[0] for p in exc.value.problems} == {"ENVFORGE_SANDBOX_THREADS", "ENVFORGE_MOVING_REFS"}
    with pytest.raises(FleetConfigError, match="ENVFORGE_FLEET_DRIVER_TIMEOUT_S: expected a number"):
        FleetConfig.from_env({"ENVFORGE_FLEET_DRIVER_TIMEOUT_S": "soon"})


def test_each_variable_is_declared_once_with_help_and_a_group():
    names = [str(f.validation_alias) for f in EnvSettings.model_fields.values()]
    assert len(names) == len(set(names))
    for name, f in EnvSettings.model_fields.items():
        assert f.description, f"{name}: no help text"


def test_the_configuration_doc_is_generated_from_the_model():
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert doc == configuration_markdown(), "regenerate it: envforge config docs -o docs/configuration.md"
    for var in variables():
        assert f"| `{var}` |" in doc


def test_effective_values_mask_secrets_and_say_where_they_came_from(tmp_path):
    rows = {r["variable"]: r for r in effective({"ENVFORGE_API_KEY": "k-123", "ENVFORGE_DATA_DIR": str(tmp_path),
                                                 "AWS_SECRET_ACCESS_KEY": "s3cret"})}
    assert rows["ENVFORGE_API_KEY"]["value"] == MASK and rows["AWS_SECRET_ACCESS_KEY"]["value"] == MASK
    assert rows["ENVFORGE_API_KEY"]["origin"] == "environment"
    assert rows["ENVFORGE_DATA_DIR"]["value"] == str(tmp_path.resolve())
    assert rows["MLFLOW_TRACKING_URI"]["value"] == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert rows["MLFLOW_TRACKING_URI"]["origin"] == "default"
    assert rows["ENVFORGE_HEALTH_MAX_FAULT_RATE"]["value"] == "(unset: 0.2)"
    assert rows["AWS_ACCESS_KEY_ID"]["value"] == "(unset)"


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envforge.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_config_show_and_docs_commands(tmp_path):
    done = _cli("config", "show", "--json", env={"ENVFORGE_DATA_DIR": str(tmp_path), "ENVFORGE_API_KEY": "k-123",
                                                 "ENVFORGE_SERVICE_PORT": "9091"})
    assert done.returncode == 0, done.stderr
    rows = {r["variable"]: r for r in json.loads(done.stdout)}
    assert rows["ENVFORGE_SERVICE_PORT"] == {"setting": "service_port", "variable": "ENVFORGE_SERVICE_PORT",
                                             "group": "service", "value": 9091, "origin": "environment"}
    assert rows["ENVFORGE_API_KEY"]["value"] == MASK and "k-123" not in done.stdout
    table = _cli("config", "show", env={"ENVFORGE_DATA_DIR": str(tmp_path), "COLUMNS": "200"})
    assert table.returncode == 0 and "ENVFORGE_FLEET_ACQUIRE_TIMEOUT_S" in table.stdout
    bad = _cli("config", "show", env={"ENVFORGE_SERVICE_PORT": "eighty"})
    assert bad.returncode == 64 and "ENVFORGE_SERVICE_PORT" in bad.stderr and "Traceback" not in bad.stderr
    out = tmp_path / "configuration.md"
    assert _cli("config", "docs", "-o", str(out), env={}).returncode == 0
    assert out.read_text(encoding="utf-8") == configuration_markdown()
