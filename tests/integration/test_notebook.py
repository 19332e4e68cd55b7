"""The Python API's notebook (docs/notebooks/python-api.ipynb), executed as a reader would run
it: a real Jupyter kernel, a one-process run trained for a budget and a local cluster
started and stopped from its cells (tests/integration/test_python_api.py trains one to solved)."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook extra (nbformat, nbclient)")
nbclient = pytest.importorskip("nbclient", reason="the notebook extra (nbformat, nbclient)")

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "notebooks" / "python-api.ipynb"


def test_the_python_api_notebook_runs(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # runs/ lands in the kernel's working directory: a temporary one
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                     for out in cell.get("outputs", []))
    assert "'outcome': 'stopped'" in text or "'outcome': 'solved'" in text, text
    assert "interrupted" in text, text
    assert any("image/png" in out.get("data", {}) for cell in nb.cells
               if cell.cell_type == "code" for out in cell.get("outputs", []))
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all((r / "summary.json").is_file() for r in runs)
