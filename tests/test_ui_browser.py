"""End to end through the Dagster UI in Debian's headless Chromium (Selenium + the system chromedriver).

The webserver serves workspace.yaml on loopback with a private DAGSTER_HOME and data directory and no
daemon, so the code location's sensor and schedule never tick. The test opens the global asset graph,
launches a materialization of `candidate_tasks` by clicking (asset page -> Materialize -> Confirm ->
the toast's View), waits for the run page to show Success, and checks the run over GraphQL as well.
Screenshots land in the test's tmp_path (and under $ENVFORGE_TEST_ARTIFACTS when set); on failure a
screenshot, the page source and the webserver log are saved there first.

`ENVFORGE_UPDATE_DOCS_IMAGES=1` also writes the full asset graph (after the run) to docs/images/asset-graph.png.

Chromium and chromedriver come from Debian (`platform/deploy/host-packages.sh`); nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# As root Chromium needs --no-sandbox; without the background-networking flags it can hang on refused connections.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--disable-extensions", "--mute-audio"]
WIDTH, HEIGHT = 1800, 1100
ASSET = "candidate_tasks"
SERVER_TIMEOUT_S = 180
LAUNCH_TIMEOUT_S = 120
RUN_TIMEOUT_S = 240
# No daemon: runs must start when launched, not wait in the (default) queued run coordinator.
DAGSTER_YAML = """\
telemetry:
  enabled: false
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 6000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError as e:
        return f"(no log: {e})"


class Webserver:
    """dagster-webserver on 127.0.0.1 serving workspace.yaml, in its own process group."""

    def __init__(self, root: Path):
        self.home, self.data, self.log = root / "dagster_home", root / "data", root / "webserver.log"
        self.home.mkdir(parents=True)
        (self.home / "dagster.yaml").write_text(DAGSTER_YAML)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.seeded_tasks = 0

    def start(self) -> None:
        env = {**os.environ, "DAGSTER_HOME": str(self.home), "ENVFORGE_DATA_DIR": str(self.data),
               "DAGSTER_DISABLE_TELEMETRY": "1", "PYTHONUNBUFFERED": "1"}
        exe = Path(sys.executable).parent / "dagster-webserver"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(exe), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(self.port)], cwd=REPO, env=env,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None and not self._group_alive():
            return
        for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            deadline = time.monotonic() + wait_s  # the code server and run workers share the group
            while self._group_alive() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self._group_alive():
                break

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = json.load(resp)
        assert "errors" not in body, body["errors"]
        return body["data"]

    def wait_ready(self) -> None:
        """Until /server_info answers and the envforge code location has loaded."""
        deadline = time.monotonic() + SERVER_TIMEOUT_S
        state = "no answer from /server_info"
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"dagster-webserver exited ({self.proc.returncode}):\n{_tail(self.log)}"
            try:
                urllib.request.urlopen(f"{self.url}/server_info", timeout=5).read()
                entries = self.graphql("""{ workspaceOrError { ... on Workspace { locationEntries {
                    name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }""")
                [entry] = entries["workspaceOrError"]["locationEntries"]
                state = json.dumps(entry)
                loaded = entry["locationOrLoadError"]
                assert loaded is None or loaded["__typename"] != "PythonError", \
                    f"the code location failed to load: {loaded['message']}"
                if entry["loadStatus"] == "LOADED" and loaded and loaded["__typename"] == "RepositoryLocation":
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        pytest.fail(f"dagster-webserver not ready after {SERVER_TIMEOUT_S}s ({state}); log:\n{_tail(self.log)}")

    def runs(self) -> list[dict]:
        data = self.graphql("""{ runsOrError { ... on Runs { results {
            runId status jobName assetSelection { path } } } } }""")
        return data["runsOrError"]["results"]


def _seed_catalog(data_dir: Path) -> int:
    """The bundled YAML specs in the private catalog, so candidate_tasks and its schema check have rows
    (ingesting specs needs no Docker)."""
    from envforge.config import Settings
    from envforge.stages.configs import IngestConfig
    from envforge.stages.ingest import ingest

    settings = Settings.from_env().with_data_dir(data_dir)
    settings.ensure_dirs()
    report = ingest(settings, IngestConfig(), [settings.task_sources_dir / "specs"])
    assert report.result.tasks and not report.result.rejects, report.result.rejects
    return len(report.result.tasks)


@pytest.fixture
def artifacts(tmp_path: Path):
    """The test's output folder; copied to $ENVFORGE_TEST_ARTIFACTS/test_ui_browser at the end, pass or fail."""
    out = tmp_path / "artifacts"
    out.mkdir()
    yield out
    dest = os.environ.get("ENVFORGE_TEST_ARTIFACTS")
    if dest:
        shutil.copytree(out, Path(dest) / "test_ui_browser", dirs_exist_ok=True)


@pytest.fixture
def webserver(tmp_path: Path, artifacts: Path):
    server = Webserver(tmp_path / "dagster")
    server.seeded_tasks = _seed_catalog(server.data)
    server.start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        shutil.copy(server.log, artifacts / "webserver.log")


@pytest.fixture
def browser(tmp_path: Path, monkeypatch):
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: this test drives Debian's Chromium. Install it with "
                    f"`platform/deploy/host-packages.sh` (as root), i.e. `apt-get install -y chromium chromium-driver`")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # never let Selenium Manager look for a driver online
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path)
    for flag in [*CHROMIUM_FLAGS, f"--window-size={WIDTH},{HEIGHT}", f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.set_page_load_timeout(60)
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
        yield driver
    finally:
        driver.quit()


def _wait(driver, timeout: float, condition, message: str):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.25, ignored_exceptions=[StaleElementReferenceException]) \
        .until(condition, message)


def _visible(driver, xpath: str):
    """The first displayed element matching xpath, or None (also when React re-rendered it meanwhile)."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        return next((e for e in driver.find_elements("xpath", xpath) if e.is_displayed()), None)
    except StaleElementReferenceException:
        return None


def _click(driver, xpath: str, timeout: float = 60, what: str = "") -> None:
    from selenium.webdriver.support import expected_conditions as ec

    _wait(driver, timeout, ec.element_to_be_clickable(("xpath", xpath)), f"not clickable: {what or xpath}").click()


def _button(label: str) -> str:
    return f"//button[normalize-space()='{label}']"


def _settle(driver, seconds: float = 1.5) -> None:
    """Let layout and fonts finish before a screenshot."""
    driver.execute_script("return document.fonts ? document.fonts.ready.then(() => true) : true")
    time.sleep(seconds)


def _open_asset_graph(driver, server: Webserver) -> None:
    """The global asset graph with every group expanded (saved the way the UI saves it, in localStorage)."""
    nodes = server.graphql("{ assetNodes { groupName } }")["assetNodes"]
    groups = sorted({n["groupName"] for n in nodes})
    expanded = ",".join(f"global@global:{g}" for g in groups)
    prefs = {"asset-graph-open-graph-nodes-global-__GLOBAL__": json.dumps({"expanded": expanded}),
             "communityNux": json.dumps("1"), "dagster-nav-collapsed": "true"}  # no "join the community" dialog
    driver.get(f"{server.url}/server_info")
    for key, value in prefs.items():
        driver.execute_script("localStorage.setItem(arguments[0], arguments[1])", key, value)
    driver.get(f"{server.url}/asset-groups")
    for name in [*groups, ASSET]:  # every group expanded in the graph, and the asset to launch
        _wait(driver, 90, lambda d, n=name: _visible(d, f"//*[local-name()='svg']//*[normalize-space(text())='{n}']"),
              f"{name} never rendered in the asset graph")
    _settle(driver)


def _launch_from_asset_page(driver, server: Webserver) -> str:
    """Asset page -> Materialize -> Confirm (upstream partitions never materialized) -> the toast's View.
    Returns the run id; the browser is on the run's page."""
    from selenium.common.exceptions import WebDriverException

    known = {r["runId"] for r in server.runs()}
    driver.get(f"{server.url}/assets/{ASSET}")
    _wait(driver, 60, lambda d: _visible(d, f"//*[normalize-space(text())='{ASSET}']"), "asset page did not load")
    _click(driver, _button("Materialize"), what="Materialize")
    view_xpath = "//a[contains(@href, '/runs/')][normalize-space()='View']"
    t0 = time.monotonic()
    confirmed, launched, href, new = False, False, None, []
    while time.monotonic() - t0 < LAUNCH_TIMEOUT_S and not href:
        try:
            if not confirmed and (confirm := _visible(driver, _button("Confirm"))):
                confirm.click()  # "Are you sure? ... upstream assets ... have not been materialized yet"
                confirmed = True
            if not launched and (pad := _visible(driver, _button("Materialize") + "[ancestor::*[@role='dialog']]")):
                pad.click()  # a launchpad (if config were required): launch with the defaults
                launched = True
            if view := _visible(driver, view_xpath):
                href = view.get_attribute("href")
        except WebDriverException:  # re-rendered under us: look again
            pass
        new = [r for r in server.runs() if r["runId"] not in known]
        if new and not href and time.monotonic() - t0 > 20:
            break  # the toast came and went between polls; the run itself is what matters
        time.sleep(0.25)
    if href:
        run_id = href.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
        print(f"run {run_id} launched; opening it from the toast's View link ({time.monotonic() - t0:.1f}s)")
        try:
            driver.find_element("xpath", view_xpath).click()
            _wait(driver, 15, lambda d: f"/runs/{run_id}" in d.current_url, "View did not open the run")
        except WebDriverException:
            driver.get(href)
    else:
        assert new, f"clicking Materialize launched no run within {LAUNCH_TIMEOUT_S}s"
        run_id = new[0]["runId"]
        print(f"run {run_id} launched, its toast not seen; opening the run page by URL")
        driver.get(f"{server.url}/runs/{run_id}")
    [run] = [r for r in server.runs() if r["runId"] == run_id]
    assert [ASSET] in [a["path"] for a in run["assetSelection"]], run
    return run_id


def _wait_run_success_in_ui(driver, server: Webserver, run_id: str) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    status = None
    while time.monotonic() < deadline:
        status = next(r["status"] for r in server.runs() if r["runId"] == run_id)
        assert status not in ("FAILURE", "CANCELED"), f"run {run_id} ended {status}; log:\n{_tail(server.log)}"
        if status == "SUCCESS" and _visible(driver, "//*[normalize-space(text())='Success']"):
            return
        time.sleep(2)
    pytest.fail(f"run {run_id} not shown as Success within {RUN_TIMEOUT_S}s (last status {status}); "
                f"log:\n{_tail(server.log)}")


def _save(driver, artifacts: Path, name: str) -> Path:
    path = artifacts / name
    assert driver.save_screenshot(str(path)), f"could not save {path}"
    return path


def test_materialize_from_the_ui(webserver: Webserver, browser, artifacts: Path):
    try:
        _open_asset_graph(browser, webserver)
        _save(browser, artifacts, "asset-graph.png")

        run_id = _launch_from_asset_page(browser, webserver)
        _wait_run_success_in_ui(browser, webserver, run_id)
        _settle(browser)
        _save(browser, artifacts, "run-success.png")

        # The same, over GraphQL: the run succeeded, materialized the asset and passed its blocking check.
        data = webserver.graphql("""query($runId: ID!, $key: AssetKeyInput!) {
            runOrError(runId: $runId) { ... on Run { status stepStats { stepKey status } } }
            assetOrError(assetKey: $key) { ... on Asset { assetMaterializations(limit: 1) {
                runId metadataEntries { label ... on IntMetadataEntry { intValue } } } } }
            assetNodeOrError(assetKey: $key) { ... on AssetNode { assetChecksOrError { ... on AssetChecks {
                checks { name executionForLatestMaterialization { runId status } } } } } } }""",
                                 {"runId": run_id, "key": {"path": [ASSET]}})
        run = data["runOrError"]
        assert run["status"] == "SUCCESS", run
        assert {s["stepKey"]: s["status"] for s in run["stepStats"]}.get(ASSET) == "SUCCESS", run["stepStats"]
        [mat] = data["assetOrError"]["assetMaterializations"]
        assert mat["runId"] == run_id
        metadata = {e["label"]: e.get("intValue") for e in mat["metadataEntries"]}
        assert metadata["tasks"] == webserver.seeded_tasks and metadata["rejects"] == 0, metadata  # the YAML specs
        checks = {c["name"]: c["executionForLatestMaterialization"]
                  for c in data["assetNodeOrError"]["assetChecksOrError"]["checks"]}
        assert checks["candidate_tasks_schema"] == {"runId": run_id, "status": "SUCCEEDED"}, checks

        if os.environ.get("ENVFORGE_UPDATE_DOCS_IMAGES"):
            _open_asset_graph(browser, webserver)
            _save(browser, artifacts, "asset-graph-after-run.png")
            docs = REPO / "docs" / "images"
            docs.mkdir(parents=True, exist_ok=True)
            shutil.copy(artifacts / "asset-graph-after-run.png", docs / "asset-graph.png")
    except BaseException:
        try:
            browser.save_screenshot(str(artifacts / "failure.png"))
            (artifacts / "failure-page.html").write_text(browser.page_source)
            (artifacts / "failure-url.txt").write_text(browser.current_url)
        finally:
            shutil.copy(webserver.log, artifacts / "webserver.log")
        raise
