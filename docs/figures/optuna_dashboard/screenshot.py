"""optuna-dashboard on a phasefix study (docs/figures/optuna_dashboard/*.png).

    apt-get install chromium && pip install playwright optuna-dashboard
    python -m phasefix.study spec=studies/mean_vs_worst.yaml dashboard=8080 storage=sqlite:///$PWD/browse.db \
        import_trials=studies/reports/mean_vs_worst/trials.csv &
    python docs/figures/optuna_dashboard/screenshot.py http://127.0.0.1:8080 docs/figures/optuna_dashboard

Saves the study list (`studies.png`) and the study's page (`study.png`: history, Pareto front, trials) as
1400x1000 screenshots. Headless Chromium from Debian's package, driven by Playwright.
"""
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

url, out = sys.argv[1].rstrip("/"), Path(sys.argv[2])
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}/dashboard")
    page.wait_for_timeout(6000)
    page.screenshot(path=str(out / "studies.png"))
    page.goto(f"{url}/dashboard/studies/1")
    page.wait_for_timeout(10000)
    page.screenshot(path=str(out / "study.png"), full_page=True)
    browser.close()
