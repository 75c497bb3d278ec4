"""End to end in a real browser (Debian's chromium, driven by Selenium through /usr/bin/chromedriver):
the page loads, link utilisation updates, switching to spraying lowers the imbalance shown, clicking a
link cuts it and the traffic moves off it, a bad loss value gets a clear message.

Runs `fabriclab live --port 0` as a user would: with --fake (synthetic counters, no root) and, marked
root, against a real fabric. Each run saves a screenshot in its tmp dir; with
FABRICLAB_LIVE_SCREENSHOT=1 it also refreshes docs/img/live.png, the README's picture.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
README_PICTURE = Path(__file__).resolve().parents[2] / "docs" / "img" / "live.png"

pytestmark = [
    pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                       reason="needs Debian's chromium and chromium-driver (scripts/setup.sh installs them)"),
    pytest.mark.timeout(300),
]


@pytest.fixture
def live_url(request):
    fake = request.param == "fake"
    cmd = [sys.executable, "-m", "cli", "live", "--port", "0"] + (["--fake"] if fake else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "live view on http://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.split()[3]
        deadline = time.monotonic() + (10 if fake else 180)
        while b'"phase": "running"' not in urllib.request.urlopen(url + "api/state", timeout=10).read():
            assert time.monotonic() < deadline, "the fabric did not come up"
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        yield url, fake
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C does: tear down in order
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, proc.stderr.read()


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    # Chromium's profile and its process-singleton directory (org.chromium.Chromium.*, made in TMPDIR
    # and left there when it exits) go into a directory of our own, removed afterwards.
    scratch = tempfile.TemporaryDirectory(prefix="fabriclab-browser-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000",
                f"--user-data-dir={scratch.name}/profile"):
        opts.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER, env={**os.environ, "TMPDIR": scratch.name}),
                                  options=opts)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        scratch.cleanup()


def wait(driver, what, timeout, message):
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def js(driver, code):
    return driver.execute_script(code)


def imbalance(driver) -> float:
    return float(driver.find_element("id", "m-imbalance").get_attribute("data-value") or "nan")


def mean_imbalance(driver, seconds: float) -> float:
    values = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        values.append(imbalance(driver))
        time.sleep(0.25)
    return sum(values) / len(values)


def click_link(driver, name: str) -> None:
    """Click a link a quarter of the way up from its lower end, where no other link crosses it (a real
    pointer click at that spot in the window: the page decides which element gets it)."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    hit = driver.find_element("css selector", f'.link[data-link="{name}"] .hit')
    x, y = driver.execute_script("""
        const l = arguments[0], svg = l.ownerSVGElement, pt = svg.createSVGPoint();
        l.scrollIntoView({block: "center"});
        const [x1, y1, x2, y2] = ["x1", "y1", "x2", "y2"].map(k => l[k].baseVal.value);
        pt.x = x1 + 0.25 * (x2 - x1); pt.y = y1 + 0.25 * (y2 - y1);
        const p = pt.matrixTransform(l.getScreenCTM());
        return [p.x, p.y];""", hit)
    action = ActionBuilder(driver)
    action.pointer_action.move_to_location(int(x), int(y)).click()
    action.perform()


def link_state(driver) -> dict[str, tuple[float, bool]]:
    rows = js(driver, "return [...document.querySelectorAll('#fabric .link')].map("
                      "g => [g.dataset.link, g.dataset.util, g.dataset.up])")
    return {name: (float(u or 0), up == "1") for name, u, up in rows}


@pytest.mark.parametrize("live_url", ["fake", pytest.param("real", marks=pytest.mark.root)], indirect=True)
def test_page_follows_the_fabric_and_drives_it(live_url, browser, tmp_path):
    url, fake = live_url
    driver = browser
    driver.get(url)
    # The page loads and draws every tier.
    wait(driver, lambda: js(driver, "return window.fabriclabLive && window.fabriclabLive.updates >= 2"), 15,
         "no updates reached the page")
    tiers = js(driver, "return [...document.querySelectorAll('.tier-label')].map(e => e.textContent)")
    assert tiers == ["spine", "leaf", "host"]
    # Link utilisation is drawn and keeps updating, about once a second (a starved machine may stall
    # one sample: two updates are awaited for up to five seconds).
    before = js(driver, "return window.fabriclabLive.updates")
    wait(driver, lambda: js(driver, "return window.fabriclabLive.updates") - before >= 2, 5,
         "the page stopped updating")
    links = link_state(driver)
    assert max(u for u, _ in links.values()) > 0.2
    lag = js(driver, "return window.fabriclabLive.lastLagMs")
    assert lag is not None and lag < 2000, lag

    # ECMP with one path per flow, then per-packet spraying: the imbalance shown falls.
    ecmp = mean_imbalance(driver, 2.0 if fake else 5.0)
    driver.find_element("css selector", "[data-policy=spray]").click()
    wait(driver, lambda: "/ spray" in driver.find_element("id", "phase").text, 30, "policy did not switch")
    driver.find_element("css selector", "[data-mode=spray]").click()
    wait(driver, lambda: "spray / spray" in driver.find_element("id", "phase").text, 30, "mode did not switch")
    time.sleep(1.0 if fake else 6.0)  # real senders restart and ramp up
    spray = mean_imbalance(driver, 2.0 if fake else 5.0)
    if fake or ecmp > 1.15:  # a real ECMP hash may, by luck, already be even
        assert spray < ecmp, (ecmp, spray)
    events = driver.find_element("id", "events").text
    assert "path policy single -> spray" in events and "routing mode ecmp -> spray" in events

    # Click the busiest switch-to-switch link: it is cut, and the traffic moves off it.
    hosts = set(js(driver, "return Object.keys(window.fabriclabLive.layout.nodes).filter("
                           "n => window.fabriclabLive.layout.nodes[n].host)"))
    fabric = {n: v for n, v in link_state(driver).items() if not set(n.split("-")) & hosts}
    target = max(fabric, key=lambda n: fabric[n][0])
    leaf = next(x for x in target.split("-") if x.startswith("leaf"))
    click_link(driver, target)  # the middle of a link may lie under a crossing one

    def cut_and_idle() -> bool:
        util, up = link_state(driver)[target]
        return not up and util < 0.02

    wait(driver, cut_and_idle, 20 if fake else 30, f"{target} still carries traffic")

    def others() -> list[float]:
        return [u for n, (u, up) in link_state(driver).items() if leaf in n.split("-") and n != target
                and n in fabric and up]

    wait(driver, lambda: max(others()) > 0.3, 10, f"the traffic did not move off {target}: {others()}")
    assert f"cut {target}" in driver.find_element("id", "events").text
    assert "✕ cut" in driver.find_element("css selector", f'.link[data-link="{target}"] .mark').text

    # A bad loss value: a clear message on the page, and nothing changes.
    box = driver.find_element("id", "lp-loss")
    box.clear()
    box.send_keys("150")
    # The cut's own message ("Done: cut ...") may still be showing: wait for the next one.
    shown = driver.find_element("id", "toast").text
    driver.find_element("id", "lp-loss-set").click()
    toast = wait(driver, lambda: driver.find_element("id", "toast").is_displayed()
                 and driver.find_element("id", "toast").text != shown
                 and driver.find_element("id", "toast").text, 10, "no message for a bad loss value")
    assert "outside 0-100" in toast
    shot = tmp_path / "live.png"
    driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("FABRICLAB_LIVE_SCREENSHOT") == "1":
        README_PICTURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, README_PICTURE)

    # Click it again: restored.
    click_link(driver, target)
    wait(driver, lambda: link_state(driver)[target][1], 20, f"{target} was not restored")
    assert f"restored {target}" in driver.find_element("id", "events").text
    logs = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not [e for e in logs if "/api/loss" not in e["message"]], logs  # the 400 for 150 % is expected
