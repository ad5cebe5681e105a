"""`python -m phasefix.ui`: one-line errors before any server starts; the server it starts answers on 127.0.0.1, the
address it prints opens the saved view phasefix wrote into the experiment, and SIGTERM stops the server too."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from phasefix import tracking
from phasefix.paths import PROJECT_ROOT
from phasefix.ui import main, port_free


def store(tmp_path) -> str:
    """A store with the phasefix experiment and no runs (what a first fit leaves, without training)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.get_or_create_experiment(tracking.client(uri), "phasefix")
    return uri


def test_a_missing_store_or_a_busy_port_is_one_line_and_starts_nothing(tmp_path, capsys):
    assert main([f"tracking_uri=sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: tracking_uri='sqlite:///{tmp_path / 'none.db'}' is invalid: no "
                                               "MLflow store there yet: train a run first (python -m phasefix.fit)")
    assert not (tmp_path / "none.db").exists()
    uri = store(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main([f"tracking_uri={uri}", f"port={port}"]) == 2
    assert f"port={port} is invalid: 127.0.0.1:{port} is in use" in capsys.readouterr().err
    assert main([f"tracking_uri={uri}", "experiment=nope"]) == 2
    assert "experiment='nope' is invalid: no such experiment" in capsys.readouterr().err


def test_an_old_experiment_gets_the_view_when_the_ui_opens_it(tmp_path):
    from phasefix import ui
    from phasefix.cli import options

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    exp_id = c.create_experiment("phasefix")  # as an experiment written before phasefix set the view
    assert ui.target(options([f"tracking_uri={uri}"], "ui")) == (uri, exp_id)
    tags = c.get_experiment(exp_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags["mlflow.sharedViewState.phase-curves"])
    sections = json.loads(view["state"])["compareRunSections"]
    assert view["name"] == "Phase curves" and sections[0]["name"] == "phase curves (x = residue)"


@pytest.mark.slow
def test_the_launcher_serves_on_localhost_and_sigterm_stops_the_server(tmp_path):
    uri = store(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "phasefix.ui", f"tracking_uri={uri}", f"port={port}"],
                            stdout=subprocess.PIPE, text=True, cwd=PROJECT_ROOT,
                            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    try:
        deadline, address = time.time() + 240, None
        while address is None and time.time() < deadline:
            line = proc.stdout.readline()
            if line.startswith("phasefix ui: open "):
                address = line.split("open ", 1)[1].strip()
        assert address and address.startswith(f"http://127.0.0.1:{port}/#/experiments/")
        assert "viewStateShareKey=phase-curves" in address and "workflowType=machine_learning" in address
        with urllib.request.urlopen(address.split("#")[0], timeout=30) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert port_free("127.0.0.1", port)  # the server went with the launcher
