"""The pictures in docs/loggers.md, taken from the tools' own viewers in a real browser.

A docs step, never run in CI. It needs what the loggers need (``pip install 'fedray[test]'``),
playwright (``pip install playwright``) and a Chromium (Debian's ``chromium`` package, or
``playwright install chromium``):

    .venv/bin/fedray tune jobs/configs/tune_digits_asha.yaml --output OUT --logger tensorboard --logger mlflow
    .venv/bin/python scripts/docs_screenshots.py OUT

It starts ``tensorboard`` and ``mlflow ui`` on the search's results folder, opens TensorBoard's
HParams view and the MLflow experiment (the search's run, its trials unfolded under it), and
writes docs/loggers-tensorboard-hparams.png and docs/loggers-mlflow-search.png.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serving(command: list[str], url: str, timeout_s: float = 90.0) -> Iterator[None]:
    """``command`` running until ``url`` answers; stopped on leaving."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{command[0]} did not serve {url}") from None
                time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def _browser(p):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    return (
        p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        if chromium
        else p.chromium.launch()
    )


def tensorboard_hparams(out: Path, png: Path) -> None:
    from playwright.sync_api import sync_playwright

    port = _free_port()
    command = [str(BIN / "tensorboard"), "--logdir", str(out / "tb"), "--port", str(port), "--bind_all"]
    with _serving(command, f"http://127.0.0.1:{port}/"), sync_playwright() as p:
        page = _browser(p).new_page(viewport={"width": 1500, "height": 900})
        page.goto(f"http://127.0.0.1:{port}/#hparams")
        page.wait_for_selector("text=Trial ID", timeout=60_000)
        page.wait_for_timeout(2000)
        page.screenshot(path=str(png))


def mlflow_search(out: Path, png: Path) -> None:
    from mlflow.tracking import MlflowClient
    from playwright.sync_api import sync_playwright

    uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
    client = MlflowClient(tracking_uri=uri)
    (experiment,) = [e for e in client.search_experiments() if client.search_runs([e.experiment_id])]
    port = _free_port()
    command = [str(BIN / "mlflow"), "ui", "--backend-store-uri", uri, "--port", str(port)]
    with _serving(command, f"http://127.0.0.1:{port}/"), sync_playwright() as p:
        page = _browser(p).new_page(viewport={"width": 1500, "height": 900})
        page.goto(f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}/runs")
        with contextlib.suppress(Exception):  # MLflow 3 opens on its GenAI pages: the runs' view
            page.get_by_text("Model training").first.click(timeout=10_000)
        page.wait_for_selector("text=search in", timeout=60_000)
        with contextlib.suppress(Exception):  # its assistant's panel, beside the table
            page.get_by_role("button", name="Close").last.click(timeout=3000)
        # the search's run folds its trials: the button before its name unfolds them
        search = page.get_by_text("search in").first
        search.locator("xpath=ancestor::*[@role='gridcell'][1]//button").first.click(timeout=10_000)
        page.wait_for_timeout(2000)
        page.screenshot(path=str(png))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a search's results folder, logged to tensorboard and mlflow")
    args = parser.parse_args(argv)
    docs = ROOT / "docs"
    tensorboard_hparams(args.out, docs / "loggers-tensorboard-hparams.png")
    mlflow_search(args.out, docs / "loggers-mlflow-search.png")
    print(f"wrote {docs / 'loggers-tensorboard-hparams.png'} and {docs / 'loggers-mlflow-search.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
