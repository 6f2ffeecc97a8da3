"""examples/bevformer/walkthrough.ipynb runs on the `test` config without an error."""
from pathlib import Path

import nbclient
import nbformat

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "bevformer" / "walkthrough.ipynb"


def test_the_walkthrough_notebook_runs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.cells[1].source.startswith('CONFIG, HW, SCORE_THRESHOLD = "test"')
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "Top-10 BEV IoU match: 10/10 (mean IoU=1.000)" in text        # program vs INT8 golden
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2   # timeline, detections


def test_the_walkthrough_is_committed_with_its_outputs():
    """A reader on GitHub sees what each step prints and draws: every code cell of the
    stored notebook ran, in order, without an error, and the pictures are there."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert "Top-10 BEV IoU match: 10/10" in "".join(o.get("text", "") for o in outputs)
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2
