"""End to end the way the UI does it: a real Prefect server, deployments from prefect.yaml, a process
worker, a flow run created through the API, waited on to Completed; and a cancelled run leaves no engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from cli.commands.campaign import prefect_server_argv
from tasks.launch.local import free_port

REPO = Path(__file__).resolve().parent.parent
TINY = str(REPO / "tests" / "data" / "specs" / "tiny.yaml")
# As a person types it in the form (and the README's screenshot shows it): repo-relative, resolved by the flow.
TINY_IN_REPO = "tests/data/specs/tiny.yaml"
CHROMEDRIVER = "/usr/bin/chromedriver"

# A campaign through a worker waits up to 15 minutes for its flow run (the default timeout is 5).
pytestmark = [pytest.mark.server, pytest.mark.engine, pytest.mark.timeout(1200)]


def engine_pids(home: Path) -> list[int]:
    """Engine processes started for this test's SPECGAUGE_HOME (their log lives under it)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if "vllm.entrypoints.openai.api_server" in cmd and str(home) in (proc.info["cwd"] or ""):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, engine_lock) -> Iterator[dict[str, str]]:
    home = tmp_path_factory.mktemp("prefect-e2e")
    port, reports_port = free_port(), free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_PROFILE": "server",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        "PREFECT_WORKER_PREFETCH_SECONDS": "2",
        "SPECGAUGE_HOME": str(home / "specgauge"),
        "SPECGAUGE_SPEC_DIRS": str(REPO / "tests" / "data" / "specs"),  # where TINY lives (a deployment's run
        # reads specs only from experiments/, HOME/specs and these folders)
        "SPECGAUGE_REPO": str(REPO),
        "SPECGAUGE_REPORTS_URL": f"http://127.0.0.1:{reports_port}",  # the worker's runs link reports there
    }
    with open(home / "server.log", "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            prefect_server_argv(port),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = None
    reports = subprocess.Popen(  # the report server `specgauge prefect server` starts beside the UI
        [sys.executable, "-m", "cli", "reports", "serve", "--port", str(reports_port)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (home / "server.log").read_text()[-3000:]
            time.sleep(1)
        deploy = subprocess.run(
            [sys.executable, "-m", "cli", "prefect", "deploy"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
        with open(home / "worker.log", "wb") as worker_log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", "specgauge"],
                env=env,
                cwd=REPO,
                stdout=worker_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        yield {
            "api": f"http://127.0.0.1:{port}/api",
            "ui": f"http://127.0.0.1:{port}",
            "reports": env["SPECGAUGE_REPORTS_URL"],
            "home": str(home),
            "specgauge_home": env["SPECGAUGE_HOME"],
            "env": json.dumps(env),
        }
    finally:
        for p in (worker, proc, reports):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)  # the worker ignores a first SIGTERM at times
        # A test that failed mid-run leaves its flow run's engine behind once the worker is killed (the
        # engine has its own session; a SIGKILLed flow run runs no hook): the ledger's reaper stops it.
        subprocess.run(
            [sys.executable, "-m", "cli", "reap"], env=env, cwd=REPO, capture_output=True, timeout=180
        )


# The README's screenshots come from the browser test: with SPECGAUGE_UPDATE_SCREENSHOTS=1 it writes them into
# docs/img/ (a plain test run leaves the working tree alone and keeps them under its tmp_path).
UPDATE_SCREENSHOTS = os.environ.get("SPECGAUGE_UPDATE_SCREENSHOTS") == "1"


@contextmanager
def browser(tmp_path: Path) -> Iterator[Any]:
    """Debian's chromium, headless, driven through its chromedriver by selenium."""
    if not Path(CHROMEDRIVER).exists():
        pytest.skip("Debian's chromium-driver is not installed (apt-get install chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1100"):
        options.add_argument(argument)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium'}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, ready: Any, timeout_s: float = 30) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout_s, poll_frequency=0.5).until(lambda _: ready())


def submit_form(driver: Any, created: Any, tmp_path: Path) -> None:
    """Press the form's Submit until the run exists, as a person would. Now and then (2 runs in 5 here) the
    server answered the UI's request with an error (the UI's toast "Oops. Something went wrong"; Prefect's
    SQLite server answers 503 when busy, and its UI does not retry) and the page stayed on the form.
    Pressing again only while the page is still the form cannot create a second run; the retry presses
    through the toast, which covers the button."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By

    for attempt in range(3):
        if driver.current_url.endswith("/run"):
            button = driver.find_element(By.XPATH, "//button[normalize-space()='Submit']")
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", button)
            if attempt == 0:
                button.click()
            else:
                driver.execute_script("arguments[0].click();", button)
        try:
            wait_for(driver, created, timeout_s=20)
            return
        except TimeoutException:
            driver.save_screenshot(str(tmp_path / f"after-submit-{attempt}.png"))
    raise AssertionError(f"no flow run after pressing Submit 3 times; page {driver.current_url}")


def runs_labelled(server: dict[str, str], deployment_id: str, label: str) -> list[str]:
    """Ids of the deployment's flow runs whose request's `label` is `label`."""
    runs = api(
        server, "POST", "/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment_id]}}}
    ).json()
    return [r["id"] for r in runs if (r["parameters"].get("request") or {}).get("label") == label]


def fill_text_parameter(driver: Any, name: str, value: str) -> None:
    """An optional string field of Prefect's run form, by the label the form shows (a request's field:
    its pydantic title, `Spec Path`): pick its `str` type (it shows `None` first), then type into the field
    that appears."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    where = (
        f"//label[normalize-space()='{name} (Optional)']/ancestor::*[.//button[normalize-space()='str']][1]"
    )
    text_input = f"{where}//textarea"  # Prefect's form renders a string parameter as a textarea

    def choose_str() -> bool:  # the form renders its parameters after the page (and may re-render them)
        try:
            driver.find_element(By.XPATH, f"{where}//button[normalize-space()='str']").click()
        except (NoSuchElementException, StaleElementReferenceException):
            return False
        return True

    wait_for(driver, choose_str)
    wait_for(driver, lambda: driver.find_elements(By.XPATH, text_input))  # the form re-renders the parameter
    field = driver.find_element(By.XPATH, text_input)
    field.clear()
    field.send_keys(value)
    field.send_keys(Keys.TAB)  # leave the field: the form takes the value on blur


# Prefect's server answers 503 for errors a client may retry (a busy SQLite database, say) and its own
# clients retry them (prefect.client.base); so does this helper, a few times with backoff.
RETRYABLE = {429, 502, 503}


def api(server: dict[str, str], method: str, path: str, **kwargs) -> httpx.Response:
    for attempt in range(6):
        response = httpx.request(method, f"{server['api']}{path}", timeout=30, **kwargs)
        if response.status_code not in RETRYABLE or attempt == 5:
            break
        time.sleep(0.5 * 2**attempt)
    response.raise_for_status()
    return response


def run_deployment(server: dict[str, str], name: str, parameters: dict) -> str:
    """Create a flow run from a deployment exactly as the UI's 'Run' button does."""
    deployment = api(server, "GET", f"/deployments/name/campaign/{name}").json()
    run = api(
        server,
        "POST",
        f"/deployments/{deployment['id']}/create_flow_run",
        json={"parameters": parameters, "state": {"type": "SCHEDULED"}},
    ).json()
    return run["id"]


def wait_state(server: dict[str, str], run_id: str, final: set[str], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = api(server, "GET", f"/flow_runs/{run_id}").json()
        if run["state"]["type"] in final:
            return run
        time.sleep(2)
    worker_log = (Path(server["home"]) / "worker.log").read_text()[-4000:]
    raise AssertionError(f"flow run {run_id} not in {final} after {timeout_s}s; worker log:\n{worker_log}")


def test_deployments_from_prefect_yaml_exist_with_a_nightly_schedule(server) -> None:
    names = {d["name"] for d in api(server, "POST", "/deployments/filter", json={}).json()}
    assert {"campaign", "regression", "analyze"} <= names
    regression = api(server, "GET", "/deployments/name/regression/regression").json()
    assert [s["schedule"]["cron"] for s in regression["schedules"]] == ["0 2 * * *"]


@pytest.mark.chromium
def test_a_campaign_started_from_the_form_in_a_browser_completes_and_its_report_opens(
    server, tmp_path: Path
) -> None:
    """A person's path through the UI, in Debian's chromium (selenium): the campaign deployment's run form,
    filled (a spec file and a label); Submit; the run completes on the worker and lands in the warehouse;
    its artifacts link the report through the report server, where a chart renders."""
    from selenium.webdriver.common.by import By

    shots = REPO / "docs" / "img" if UPDATE_SCREENSHOTS else tmp_path
    deployment = api(server, "GET", "/deployments/name/campaign/campaign").json()
    with browser(tmp_path) as driver:
        driver.get(f"{server['ui']}/deployments/deployment/{deployment['id']}/run")
        wait_for(driver, lambda: driver.find_elements(By.XPATH, "//button[normalize-space()='Submit']"))
        fill_text_parameter(driver, "Spec Path", TINY_IN_REPO)
        fill_text_parameter(driver, "Label", "from-the-browser")
        driver.save_screenshot(str(shots / "ui-run-form.png"))
        submit_form(driver, lambda: runs_labelled(server, deployment["id"], "from-the-browser"), tmp_path)
        (run_id,) = runs_labelled(server, deployment["id"], "from-the-browser")
        run = wait_state(server, run_id, {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}, timeout_s=900)
        assert run["state"]["type"] == "COMPLETED", run["state"]
        request = run["parameters"]["request"]
        assert request["spec_path"] == TINY_IN_REPO and request["label"] == "from-the-browser"

        driver.get(f"{server['ui']}/runs/flow-run/{run_id}?tab=Artifacts")
        time.sleep(5)  # the run page renders its tabs asynchronously; the screenshot is for the README
        driver.save_screenshot(str(shots / "ui-finished-run.png"))
        # the campaign run's "where the results are" artifact, opened as a person clicks it in that tab
        (artifact,) = api(
            server,
            "POST",
            "/artifacts/filter",
            json={"flow_runs": {"id": {"any_": [run_id]}}, "artifacts": {"key": {"like_": "-report"}}},
        ).json()
        driver.get(f"{server['ui']}/artifacts/artifact/{artifact['id']}")
        report_links = f"//a[starts-with(@href, '{server['reports']}/')]"
        wait_for(driver, lambda: driver.find_elements(By.XPATH, report_links), timeout_s=60)
        driver.save_screenshot(str(shots / "ui-report-artifact.png"))
        link = driver.find_element(By.XPATH, report_links)
        assert link.get_attribute("href").endswith("/index.html")
        driver.get(link.get_attribute("href"))  # the link's target, in this tab
        rendered = "return document.querySelectorAll('.chart svg').length"
        wait_for(driver, lambda: driver.execute_script(rendered) > 0, timeout_s=60)
        assert "tiny-" in driver.title or "tiny-" in driver.page_source

    env = json.loads(server["env"])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "sql",
            "--format",
            "json",
            "SELECT campaign_id, variant, requests_ok FROM v_cells",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows and all(r["campaign_id"].startswith("tiny-") and r["requests_ok"] == 3 for r in rows)
    assert engine_pids(Path(server["specgauge_home"])) == []


def test_a_cancelled_campaign_leaves_no_engine_process(server) -> None:
    home = Path(server["specgauge_home"])
    run_id = run_deployment(
        server, "campaign", {"request": {"spec_path": TINY, "label": "to-cancel", "gate": False}}
    )
    deadline = time.monotonic() + 600
    while not engine_pids(home):  # cancel while the engine is up (starting or serving)
        assert time.monotonic() < deadline, "the engine never started"
        time.sleep(1)
    api(
        server,
        "POST",
        f"/flow_runs/{run_id}/set_state",
        json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True},
    )
    run = wait_state(server, run_id, {"CANCELLED", "FAILED", "CRASHED", "COMPLETED"}, timeout_s=180)
    assert run["state"]["type"] == "CANCELLED", run["state"]
    deadline = time.monotonic() + 60
    while engine_pids(home) and time.monotonic() < deadline:
        time.sleep(1)
    assert engine_pids(home) == [], "an engine survived the cancellation"


def test_the_campaign_form_is_typed_and_explains_itself(server) -> None:
    """What the UI renders as the campaign's run form: one typed request, its spec as a select of the repo's
    experiment specs, and each override with the description the form shows under it."""
    deployment = api(server, "GET", "/deployments/name/campaign/campaign").json()
    schema = deployment["parameter_openapi_schema"]
    assert {"$ref": "#/definitions/CampaignRequest"} in schema["properties"]["request"]["anyOf"]
    choices = schema["definitions"]["ExperimentFile"]["enum"]
    assert "experiments/demo.yaml" in choices and "experiments/nightly.yaml" in choices
    request = schema["definitions"]["CampaignRequest"]["properties"]
    assert request["spec"]["$ref"] == "#/definitions/ExperimentFile"
    for name in ("spec_path", "label", "variants", "strata", "concurrencies", "repeats", "gate"):
        assert request[name].get("description"), name
    assert "plain baselines are" in request["variants"]["description"]
    # a value the form could not have produced is refused by the API itself
    refused = httpx.post(
        f"{server['api']}/deployments/{deployment['id']}/create_flow_run",
        json={"parameters": {"request": {"spec": "experiments/none.yaml"}}, "state": {"type": "SCHEDULED"}},
        timeout=30,
    )
    assert refused.status_code in (409, 422), refused.text
    assert "experiments/none.yaml" in refused.text


def test_a_bad_override_from_the_form_fails_before_anything_launches(server) -> None:
    home = Path(server["specgauge_home"])
    run_id = run_deployment(
        server, "campaign", {"request": {"spec": "experiments/demo.yaml", "variants": ["draft-k9"]}}
    )
    run = wait_state(server, run_id, {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}, timeout_s=300)
    assert run["state"]["type"] == "FAILED", run["state"]
    message = " ".join(run["state"]["message"].split())
    assert "variants: no variant draft-k9 (the spec has plain, ngram-k3" in message, message
    assert not list((home / "raw").glob("demo-*")), "a campaign folder was written"
    assert engine_pids(home) == []


class Receiver(ThreadingHTTPServer):
    """A local webhook: keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                received.append(json.loads(self.rfile.read(length) or b"{}"))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def test_a_regression_alert_reaches_the_webhook_with_what_moved(server) -> None:
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    env = json.loads(server["env"])
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    try:
        created = subprocess.run(
            [sys.executable, "-m", "cli", "prefect", "alerts", "--webhook", url],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert created.returncode == 0, created.stdout + created.stderr
        assert "automation specgauge-alerts" in created.stdout
        # the event the regression flow emits when a figure regressed (tests/test_regression.py checks the
        # flow emits it), sent from another process as a worker's run would
        fire = (
            "from flows.alerts import REGRESSION_DETECTED, alert\n"
            "alert(REGRESSION_DETECTED, 'nightly-20261202t020000', "
            "title='1 figure(s) of nightly regressed against nightly-20261201t020000', "
            "summary='draft-k3/code/c4 tpot_p50_speedup x0.62 [0.58, 0.66]', "
            "report='http://127.0.0.1:4280/nightly-20261202t020000/index.html')\n"
        )
        fired = subprocess.run(
            [sys.executable, "-c", fire], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert fired.returncode == 0, fired.stderr
        deadline = time.monotonic() + 120
        while not receiver.bodies and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        receiver.shutdown()
    assert len(receiver.bodies) == 1, receiver.bodies
    message = receiver.bodies[0]
    assert message["subject"] == "specgauge: 1 figure(s) of nightly regressed against nightly-20261201t020000"
    text = message["text"]
    assert "draft-k3/code/c4 tpot_p50_speedup x0.62 [0.58, 0.66]" in text  # what, by how much
    assert "Campaign: nightly-20261202t020000" in text
    assert "Report: http://127.0.0.1:4280/nightly-20261202t020000/index.html" in text
