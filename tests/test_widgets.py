"""Notebook 05's sliders in a real browser: JupyterLab on loopback, headless Chromium, β moved, plot re-drawn.

Widgets only live in a browser, so tests/test_notebooks.py (nbclient) cannot reach them. This test needs Debian's
`chromium` and `chromium-driver` (`make test` installs them with apt-get) and skips where they are missing.
Screenshots before and after moving β land in pytest's tmp_path and, when AGENTLAB_SCREENSHOTS is set, there too:

    AGENTLAB_SCREENSHOTS=/tmp/shots .venv/bin/python -m pytest -q tests/test_widgets.py
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "05_reward_design.ipynb"
# JupyterLab user settings for the test server: start the notebook's kernel without the "Select Kernel"
# dialog, no news/update toasts over the page (and no calls out to jupyter.org), no autosave (the server only
# sees a temp copy anyway).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


def _executables() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if not (chromium and chromedriver):
        pytest.skip(f"needs Chromium and chromedriver on PATH (found chromium={chromium}, "
                    f"chromedriver={chromedriver}); on Debian/Ubuntu `make test` installs them with apt-get")
    return chromium, chromedriver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _copy_notebooks(root: Path) -> None:
    """A clean copy of notebooks/ for the server: the repo's notebook is never opened, so never saved over.

    Saved outputs and widget state are dropped: JupyterLab would otherwise re-create the committed plot
    from the notebook's widget metadata, and the test could find that image instead of a live one.
    """
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    path = root / "notebooks" / NOTEBOOK
    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, path)


def _start_lab(root: Path, port: int, token: str, log) -> subprocess.Popen:
    settings = root / "lab-settings"
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    env = dict(os.environ, AGENTLAB_SMOKE="1", AGENTLAB_RUNS=str(root / "runs-agentlab"),
               JUPYTER_CONFIG_DIR=str(root / "jupyter-config"), JUPYTER_RUNTIME_DIR=str(root / "jupyter-runtime"),
               IPYTHONDIR=str(root / "ipython"))
    env.pop("MPLBACKEND", None)  # the kernel must use the inline backend, which draws an <img> in the page
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={root / 'lab-workspaces'}"]
    if os.geteuid() == 0:  # CI containers run as root; the server refuses that unless told
        cmd.append("--allow-root")
    # start_new_session: one killpg in the finally block also ends the kernel the server started.
    return subprocess.Popen(cmd, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_lab(proc: subprocess.Popen, url: str, log_path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer {url} within {timeout:.0f} s:\n{log_path.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
    try:  # kernels the server started share its process group and may outlive it by a moment
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass


def _kernel_idle(driver) -> bool:
    return bool(driver.find_elements(By.CSS_SELECTOR, ".jp-Notebook-ExecutionIndicator[data-status=idle]"))


# The pixels of a loaded <img> as a data URL. The widget's image is a blob: URL, new on every update whatever it
# shows, so the test compares what is drawn, not the address (same origin: the canvas is not tainted).
_PIXELS = """const img = arguments[0];
if (!img.complete || !img.naturalWidth) return null;
const canvas = document.createElement('canvas');
canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
canvas.getContext('2d').drawImage(img, 0, 0);
return canvas.toDataURL('image/png');"""


def _plot_state(driver) -> tuple[str, str] | None:
    """(the image's pixels as a data URL, the summary text) of the widget's plot area, or None while unset."""
    try:
        area = driver.find_element(By.CSS_SELECTOR, ".agentlab-reward-plot")
        imgs = area.find_elements(By.CSS_SELECTOR, "img")
        text = area.get_attribute("textContent").strip()
        pixels = driver.execute_script(_PIXELS, imgs[0]) if imgs else None
        if pixels and text:
            return pixels, text
    except WebDriverException:  # stale element: the plot area was re-built between two calls
        pass
    return None


def _settled_plot(driver, unlike=None, quiet_s: float = 2.0, timeout: float = 60) -> tuple[str, str]:
    """The plot area's state once drawing has finished: set, different from `unlike`, unchanged for quiet_s
    with the kernel idle. (Each slider step re-draws once: the image and the text arrive as two updates.)"""
    state, since, deadline = None, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = _plot_state(driver)
        if now != state or not _kernel_idle(driver):
            state, since = now, time.monotonic()
        elif state is not None and state != unlike and time.monotonic() - since > quiet_s:
            return state
        time.sleep(0.25)
    pytest.fail(f"the reward plot did not settle{' on a new drawing' if unlike else ''} within {timeout:.0f} s; "
                f"its text: {state[1] if state else None!r}\n{_page_report(driver)}")


def _page_report(driver) -> str:
    """What the page shows, for a failure message: cell prompts, whether the widget's output area exists, any
    error output, any widget that failed to render. (CI keeps only the log, not the screenshot.)"""
    try:
        prompts = [e.get_attribute("textContent").strip() for e in
                   driver.find_elements(By.CSS_SELECTOR, ".jp-CodeCell .jp-InputPrompt")]
        areas = driver.find_elements(By.CSS_SELECTOR, ".agentlab-reward-plot")
        errors = [e.text[-800:] for e in driver.find_elements(
            By.CSS_SELECTOR, "[data-mime-type='application/vnd.jupyter.stderr']") if e.text.strip()]
        widget_text = [e.text[:200] for e in driver.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output")
                       if "widget" in e.text.lower()]
        kernel = driver.find_element(By.CSS_SELECTOR, ".jp-Notebook-ExecutionIndicator").get_attribute("data-status")
        return (f"kernel status: {kernel}; cell prompts: {prompts}; plot areas: {len(areas)}; "
                f"widget messages: {widget_text}; errors: {errors}")
    except WebDriverException as e:
        return f"(page not readable: {e.msg})"


def _run_all(driver, wait) -> None:
    """Run → Run All Cells, and make sure it took: a cell must show an execution prompt (`[*]` or a number)
    within 15 s, else the menu click is repeated once (a click can land while the menu is still being built)."""
    for attempt in range(2):
        wait.until(lambda d: d.find_elements(
            By.XPATH, "//li[contains(@class, 'lm-MenuBar-item')][normalize-space(.)='Run']"))[0].click()
        wait.until(lambda d: d.find_elements(
            By.XPATH, "//li[contains(@class, 'lm-Menu-item')]"
                      "[.//*[contains(@class, 'lm-Menu-itemLabel')][normalize-space(.)='Run All Cells']]"))[0].click()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            prompts = [e.get_attribute("textContent") for e in
                       driver.find_elements(By.CSS_SELECTOR, ".jp-CodeCell .jp-InputPrompt")]
            if any("[" in p and p.strip() != "[ ]:" for p in prompts):
                return
            time.sleep(0.25)
    pytest.fail("Run All Cells did not start the notebook (no cell got an execution prompt) after two clicks")


def _screenshot(driver, tmp_path: Path, name: str) -> Path:
    # The widget's whole box (sliders over the plot) in the middle of the window.
    driver.execute_script("(arguments[0].closest('.widget-vbox') || arguments[0]).scrollIntoView({block: 'center'});",
                          driver.find_element(By.CSS_SELECTOR, ".agentlab-beta"))
    path = tmp_path / name
    driver.save_screenshot(str(path))
    if os.environ.get("AGENTLAB_SCREENSHOTS"):
        out = Path(os.environ["AGENTLAB_SCREENSHOTS"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, out / name)
    return path


def test_moving_beta_redraws_the_reward_plot(tmp_path):
    chromium, chromedriver = _executables()
    root = tmp_path / "lab"
    root.mkdir()
    _copy_notebooks(root)
    repo_notebook = (ROOT / "notebooks" / NOTEBOOK).read_bytes()
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "jupyter.log"
    driver = None
    with open(log_path, "w") as log:
        lab = _start_lab(root, port, token, log)
        try:
            _wait_for_lab(lab, f"{base}/api/status?token={token}", log_path)
            options = Options()
            options.binary_location = chromium
            for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
                options.add_argument(arg)
            # An explicit chromedriver path keeps Selenium Manager from trying to download one.
            driver = webdriver.Chrome(service=Service(chromedriver), options=options)
            driver.get(f"{base}/lab/tree/notebooks/{NOTEBOOK}?token={token}")
            wait = WebDriverWait(driver, 60, poll_frequency=0.25)

            # Run → Run All Cells, once the notebook's kernel is up. Both signs are needed: the toolbar's status
            # indicator says idle while there is no kernel yet, and Run All then starts a second one.
            wait.until(lambda d: _kernel_idle(d) and d.find_element(
                By.CSS_SELECTOR, ".jp-Toolbar-kernelName").get_attribute("textContent").strip() not in ("", "No Kernel"))
            _run_all(driver, wait)

            # The first drawing waits for the kernel's imports and every cell above the sliders: generous, as on
            # a loaded CI machine (60 s was once not enough there; alone it takes under 20 s).
            before = _settled_plot(driver, timeout=180)
            shot_before = _screenshot(driver, tmp_path, "05_widgets_before.png")

            # β 4.0 → 1.0: six steps of 0.5 with the arrow key on the focused slider handle, as a learner would.
            handle = driver.find_element(By.CSS_SELECTOR, ".agentlab-beta .noUi-handle")
            driver.execute_script("arguments[0].focus();", handle)
            for _ in range(6):
                handle.send_keys(Keys.ARROW_LEFT)
            readout = driver.find_element(By.CSS_SELECTOR, ".agentlab-beta .widget-readout")
            wait.until(lambda d: readout.get_attribute("textContent").strip() == "1.00")

            after = _settled_plot(driver, unlike=before)
            shot_after = _screenshot(driver, tmp_path, "05_widgets_after.png")

            assert before[0].startswith("data:image/png;base64,")
            assert after[0].startswith("data:image/png;base64,")
            assert after[0] != before[0], "moving β did not re-draw the plot"
            assert after[1] != before[1], f"moving β did not change the printed numbers:\n{after[1]}"
            assert shot_before.stat().st_size > 0 and shot_after.stat().st_size > 0
            errors = driver.find_elements(By.CSS_SELECTOR, "[data-mime-type='application/vnd.jupyter.stderr']")
            assert not [e.text for e in errors if "Traceback" in e.text]
        except Exception:
            if driver is not None:  # what the page showed when it went wrong, for the CI log's reader
                driver.save_screenshot(str(tmp_path / "05_widgets_failure.png"))
                print(f"screenshot of the failure: {tmp_path / '05_widgets_failure.png'}")
            print(log_path.read_text()[-3000:])
            raise
        finally:
            if driver is not None:
                driver.quit()
            _stop(lab)
    assert (ROOT / "notebooks" / NOTEBOOK).read_bytes() == repo_notebook, "the test modified the repo's notebook"
