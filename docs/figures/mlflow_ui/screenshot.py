"""The MLflow chart view with runs' phase curves overlaid (docs/figures/mlflow_ui/phase_curves_chart.png).

    apt-get install chromium && pip install playwright
    mlflow server --backend-store-uri sqlite:///$PWD/mlruns/mlflow.db --host 127.0.0.1 --port 5055 &
    python docs/figures/mlflow_ui/screenshot.py "http://127.0.0.1:5055/#/experiments/<id>/runs?compareRunsMode=CHART" out.png

Switches the UI to "Model training", filters the charts to `phase_acc/` (the step series, step = residue) and saves a
1400x900 screenshot. Headless Chromium from Debian's package, driven by Playwright.
"""
import sys

from playwright.sync_api import sync_playwright

url, out = sys.argv[1], sys.argv[2]
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(url)
    page.wait_for_timeout(8000)
    page.get_by_text("Model training", exact=True).first.click(timeout=5000)  # the UI-wide GenAI / ML toggle
    page.goto(url)
    page.wait_for_timeout(6000)
    page.get_by_placeholder("Search metric charts").fill("phase_acc/")
    page.wait_for_timeout(5000)
    page.screenshot(path=out)
    browser.close()
