"""The Horus view in headless Chromium (Debian's chromium and chromium-driver, driven by Selenium).

The main flow runs the real ``airflow api-server`` on 127.0.0.1 with this repository's plugins folder:
sign in through Airflow's own token endpoint, find "Horus" in Airflow's navigation, open every page.
Pages that need another Horus home (an empty one, a missing MLflow server, a 1,024-node cluster on the
Kubernetes API test double) are served by the same app under uvicorn in this process, with tokens from
Airflow's auth manager. Screenshots go to ``test-artifacts/screenshots`` (``HORUS_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from horus_airflow.settings import Settings
from tests.servers import airflow_api_server, free_port, serve_in_thread
from tests.ui_seed import LIVE_OWNER, TEST_INPUT_UTIL, Seeded, seed

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parent.parent
SHOTS = Path(os.environ.get("HORUS_TEST_ARTIFACTS") or REPO / "test-artifacts") / "screenshots"
CHROMIUM, DRIVER = shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    home = tmp_path_factory.mktemp("browser") / "horus"
    return seed(Settings.from_env({"HORUS_HOME": str(home), "HORUS_LOCAL_GPUS": "2xa100-80gb"}))


@pytest.fixture(scope="module")
def airflow(seeded: Seeded, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``airflow api-server`` with the Horus plugin; yields its URL and an admin's token from ``/auth/token``."""
    env = {"HORUS_HOME": str(seeded.settings.home), "HORUS_LOCAL_GPUS": "2xa100-80gb"}
    with airflow_api_server(tmp_path_factory.mktemp("api-server"), env) as (base, token):
        yield base, token


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert Path(CHROMIUM).exists() and Path(DRIVER).exists(), (
        "headless Chromium is needed: apt-get install chromium chromium-driver (make test does this)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def open_signed_in(driver, base: str, token: str, path: str) -> None:  # type: ignore[no-untyped-def]
    """Open ``base + path`` as the user of ``token``, in the cookie Airflow's UI sets after sign-in."""
    driver.get(f"{base}/favicon.ico")  # any page of the origin: a cookie is set for the page's origin
    driver.delete_all_cookies()
    driver.add_cookie({"name": "_token", "value": token, "path": "/"})
    driver.get(base + path)


def wait(driver, css: str, count: int = 1, timeout_s: float = 30):  # type: ignore[no-untyped-def]
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout_s).until(lambda d: (found := d.find_elements("css selector", css)) and len(found) >= count and found)


def shot(driver, name: str) -> None:  # type: ignore[no-untyped-def]
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


# --- through the real Airflow API server ----------------------------------------------------------
def test_anonymous_browser_is_asked_to_sign_in(browser, airflow) -> None:  # type: ignore[no-untyped-def]
    base, _ = airflow
    browser.delete_all_cookies()
    browser.get(f"{base}/horus/")
    assert "Sign in to Airflow first" in browser.find_element("tag name", "body").text
    browser.get(f"{base}/horus/api/v1/cluster")
    assert "Not authenticated" in browser.find_element("tag name", "body").text
    shot(browser, "anonymous")


def test_horus_is_in_airflows_navigation_and_opens_the_map(browser, airflow) -> None:  # type: ignore[no-untyped-def]
    base, token = airflow
    open_signed_in(browser, base, token, "/")
    [link] = wait(browser, "a[href$='/plugin/horus'], a[href='plugin/horus']", timeout_s=60)
    link.click()
    frame = wait(browser, "iframe", timeout_s=30)[0]
    assert frame.get_attribute("src").endswith("/horus/")
    browser.switch_to.frame(frame)
    wait(browser, ".gpu", count=2)
    browser.switch_to.default_content()
    shot(browser, "airflow-nav-horus")


def test_cluster_map_shows_the_seeded_gpus_and_a_gpus_tasks(browser, airflow, seeded: Seeded) -> None:  # type: ignore[no-untyped-def]
    base, token = airflow
    open_signed_in(browser, base, token, "/horus/")
    cells = wait(browser, ".gpu", count=2)
    assert sorted(c.get_attribute("data-gpu") for c in cells) == ["local/0", "local/1"]
    assert all(c.size["width"] >= 60 and c.size["height"] >= 60 for c in cells)  # two GPUs fill the page, not a corner
    assert "1 nodes · 2 GPUs · 1 busy" in browser.find_element("id", "summary").text
    next(c for c in cells if c.get_attribute("data-gpu") == seeded.live_gpu).click()
    detail = wait(browser, "#gpu-detail .detail")[0].text
    assert "ui_dag.train_big" in detail and f"{TEST_INPUT_UTIL:.0f} %" in detail and "55 %" in detail
    task_link = browser.find_element("css selector", "#gpu-detail a[target=_top]")
    assert task_link.get_attribute("href") == f"{base}/dags/ui_dag/runs/{LIVE_OWNER.split('/')[2].replace(':', '%3A').replace('+', '%2B')}/tasks/train_big"
    shot(browser, "cluster-map")
    from selenium.webdriver.support.ui import Select, WebDriverWait

    Select(browser.find_element("id", "f-dag")).select_by_visible_text("ui_dag")
    WebDriverWait(browser, 30).until(lambda d: len(d.find_elements("css selector", ".gpu")) == 1)
    assert browser.find_element("css selector", ".gpu").get_attribute("data-gpu") == seeded.live_gpu


def test_a_decision_row_opens_its_explanation(browser, airflow, seeded: Seeded) -> None:  # type: ignore[no-untyped-def]
    base, token = airflow
    open_signed_in(browser, base, token, "/horus/decisions")
    rows = wait(browser, "tr.decision", count=2)
    finished = next(r for r in rows if r.get_attribute("data-id") == seeded.finished_reservation)
    finished.click()
    explanation = wait(browser, "tr.explain table.candidates")[0]
    assert "chosen" in explanation.text and "memory" in explanation.text.lower()
    assert "finished_job" in browser.find_element("css selector", "tr.explain").text  # the MLflow profiling run
    shot(browser, "decisions-explained")
    dag_filter = browser.find_element("id", "f-dag")
    dag_filter.send_keys("nobody_runs_this")
    browser.find_element("id", "refresh").click()  # the input's change event loads too: only the newest answer is drawn
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    note = WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException]).until(lambda d: "".join(n.text for n in d.find_elements("css selector", "#list .note")))
    assert "No placements yet for DAG nobody_runs_this" in note and "make demo" in note
    shot(browser, "decisions-empty-filter")


def test_predictor_page_plots_versions_and_predicted_vs_measured(browser, airflow) -> None:  # type: ignore[no-untyped-def]
    base, token = airflow
    open_signed_in(browser, base, token, "/horus/predictor")
    charts = wait(browser, "svg.chart", count=3)
    headings = [h.text for h in browser.find_elements("css selector", "h2")]
    assert headings[:2] == ["horus-gpu-utilization", "horus-interference"]
    assert browser.find_elements("css selector", ".badge.champion")
    assert len(charts[-1].find_elements("css selector", "circle")) == 1  # the one measured profiling run
    assert "not plotted" in browser.find_element("id", "scatter").text
    shot(browser, "predictor")


def test_simulations_page_shows_the_report_and_its_plot(browser, airflow) -> None:  # type: ignore[no-untyped-def]
    base, token = airflow
    open_signed_in(browser, base, token, "/horus/simulations")
    [image] = wait(browser, "img.plot")
    browser.execute_script("arguments[0].scrollIntoView()", image)
    wait(browser, "img.plot")
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 30).until(lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", image))
    table = browser.find_element("css selector", ".simulation table").text
    assert "exclusive" in table and "horus-paper" in table and "makespan" in table and "OOM crashes" in table
    import re

    cells = {c.get_attribute("data-metric"): c.text for c in browser.find_elements("css selector", ".simulation tr:nth-child(2) td.num")}
    assert re.fullmatch(r"\d+(\.\d)? (s|min|h|d)", cells["makespan_s"]), cells  # a duration people read, not raw seconds
    assert re.fullmatch(r"\d{1,3}(,\d{3})*", cells["finished"]), cells  # a count, not "97.000"
    assert re.fullmatch(r"\d+\.\d %", cells["gpu_util"]), cells
    shot(browser, "simulations")


# --- the same app under uvicorn, for other Horus homes ----------------------------------------------
def serve(settings: Settings) -> Iterator[str]:
    from horus_airflow.ui import create_app

    with serve_in_thread(create_app(lambda: settings, cache_s=0.0, stale_s=0.0)) as base:
        yield base


def test_empty_states_say_what_to_do(browser, token: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings.from_env({"HORUS_HOME": str(tmp_path / "empty"), "HORUS_LOCAL_GPUS": "2xt4"})
    for base in serve(settings):
        open_signed_in(browser, base, token, "/")
        assert "No placements yet" in wait(browser, "#notes .note")[0].text
        assert len(wait(browser, ".gpu", count=2)) == 2
        shot(browser, "empty-cluster")
        browser.get(f"{base}/predictor")
        assert "No version registered yet" in wait(browser, "#models .note")[0].text
        assert "No profiling run has measured a GPU yet" in browser.find_element("id", "scatter").text
        shot(browser, "empty-predictor")
        browser.get(f"{base}/simulations")
        assert "horus simulate" in wait(browser, "main .note")[0].text


def test_the_queue_page_lists_waiting_tasks_with_why_they_wait(browser, token: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from horus_airflow.backends import LocalBackend
    from horus_airflow.backends.ledger import Booking
    from horus_airflow.backends.scheduler import run_round
    from horus_airflow.predictor.demand import Demand, GpuDemand

    settings = Settings.from_env({"HORUS_HOME": str(tmp_path / "queued"), "HORUS_LOCAL_GPUS": "1xa100-80gb"})
    backend = LocalBackend(settings)
    backend.ledger.reserve(0, "holder", "other_dag/hold/r/-1", [Booking("local/0", 90, 95, 70_000)], backend.now(), 600)
    backend.enqueue("q_dag/waiting/manual__1/-1", Demand("waiting-1", 1, {"a100-80gb": GpuDemand(40, 50, 8_000)}), "exclusive")
    run_round(backend)
    for base in serve(settings):
        open_signed_in(browser, base, token, "/queue")
        [row] = wait(browser, "#queue tbody tr")
        assert "waiting" in row.text and "memory-fit" in row.text
        shot(browser, "queue")


def test_a_missing_mlflow_server_is_a_clear_message(browser, token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = f"http://127.0.0.1:{free_port()}"
    settings = Settings.from_env({"HORUS_HOME": str(tmp_path / "h"), "HORUS_LOCAL_GPUS": "1xt4", "MLFLOW_TRACKING_URI": uri})
    for base in serve(settings):
        open_signed_in(browser, base, token, "/predictor")
        message = wait(browser, ".error", timeout_s=60)[0].text
        assert message.startswith("503") and f"MLflow at {uri} could not" in message
        shot(browser, "mlflow-missing")


def test_a_1024_node_kubernetes_cluster_draws_every_gpu(browser, token: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.kube_double import FakeKubeApi, gpu_node

    with FakeKubeApi() as fake:
        for i in range(1024):
            fake.add_node(gpu_node(f"node-{i:04d}", count=8))
        settings = Settings.from_env({"HORUS_HOME": str(tmp_path / "h"), "HORUS_UI_SOURCE": "kubernetes",
                                      "HORUS_KUBECONFIG": str(fake.kubeconfig(tmp_path / "kc.json"))})
        for base in serve(settings):
            open_signed_in(browser, base, token, "/")
            wait(browser, ".gpu", count=8192, timeout_s=60)
            assert "1024 nodes · 8192 GPUs" in browser.find_element("id", "summary").text
            shot(browser, "cluster-1024x8")
