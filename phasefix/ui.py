"""`python -m phasefix.ui [port=5000]`: the MLflow UI on the project's store, opened on the phase curves.

MLflow keeps a view's layout in the browser, so what a project can set is the address and the experiment's tags:
`workflowType=machine_learning` puts the UI in its "Model training" mode (MLflow 3.17 takes the mode from that query
parameter or the browser's last choice, GenAI by default, and then ignores the experiment's `mlflow.experimentKind`
tag), and `viewStateShareKey` opens the saved view phasefix writes into every experiment
(`tracking.phase_curves_view`: the phase curves first, on a 0-1 axis). docs/ui.md shows what a user sees.
"""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from phasefix.errors import ConfigError, check

MODE = "workflowType=machine_learning"  # the UI's "Model training" mode, whatever the browser chose before


def url(host: str, port: int, experiment_id: str) -> str:
    """The address of the experiment's chart view, in the saved view of the phase curves (every run overlaid)."""
    from phasefix.tracking import VIEW_KEY

    return (f"http://{host}:{port}/#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_KEY}"
            f"&compareRunsMode=CHART&{MODE}")


def target(cfg: DictConfig) -> tuple[str, str]:
    """(tracking URI, experiment id) for the config, the experiment tagged with the saved view (a store written
    before phasefix wrote it gets it now); ConfigError naming the key when the store or the experiment is missing."""
    from phasefix import tracking

    uri = tracking.tracking_uri(cfg.tracking_uri)
    if uri.startswith("sqlite:///"):
        check(Path(uri[len("sqlite:///"):]).exists(), "tracking_uri", uri,
              "no MLflow store there yet: train a run first (python -m phasefix.fit)")
    c = tracking.client(uri)
    check(c.get_experiment_by_name(cfg.experiment) is not None, "experiment", cfg.experiment,
          f"no such experiment in {uri}")
    return uri, tracking.get_or_create_experiment(c, cfg.experiment)


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def serve(cfg: DictConfig) -> int:
    """Start `mlflow server` on the store, print the URL once it answers, wait for Ctrl-C (or the server's end)."""
    check(1 <= cfg.port <= 65535, "port", cfg.port, "must be in 1..65535")
    uri, experiment_id = target(cfg)
    check(port_free(cfg.host, cfg.port), "port", cfg.port,
          f"{cfg.host}:{cfg.port} is in use (an MLflow UI already running there? else choose another port=)")
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", cfg.host,
           "--port", str(cfg.port), "--workers", str(cfg.workers)]
    log = None if cfg.verbose else subprocess.DEVNULL
    address = url(cfg.host, cfg.port, experiment_id)
    print(f"phasefix ui: starting the MLflow UI on {uri} ...", flush=True)
    server = subprocess.Popen(cmd, stdout=log, stderr=log)
    # SIGTERM (kill, a closed terminal) ends the launcher through `finally`, which stops the server it started
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        while not answers(cfg.host, cfg.port):
            if server.poll() is not None:
                raise ConfigError(f"mlflow server exited with code {server.returncode} (run again with -v to see why)")
            time.sleep(0.5)
        print(f"phasefix ui: open {address}\n(Ctrl-C stops the server)", flush=True)
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()


def answers(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m phasefix.ui`: 0 stopped (Ctrl-C), 2 a bad option or no store (one line)."""
    from phasefix import cli

    return cli.run("ui", argv, serve, shim=lambda words: cli.overrides(words, "ui"))


if __name__ == "__main__":
    sys.exit(main())
