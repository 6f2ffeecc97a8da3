"""Every ```python block in docs/*.md runs (blocks of one page share a namespace, in order);
on the pages users copy examples from one at a time (STANDALONE), each block runs alone too."""
import re
from pathlib import Path

import pytest

DOCS = sorted((Path(__file__).resolve().parents[2] / "docs").glob("*.md"))
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
#: pages whose examples each run on their own (a test file, a script)
STANDALONE = ("testing.md",)


@pytest.mark.parametrize("page", [p for p in DOCS if BLOCK.search(p.read_text())],
                         ids=lambda p: p.name)
def test_doc_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs.{page.stem}"}
    for i, code in enumerate(BLOCK.findall(page.read_text())):
        exec(compile(code, f"{page.name}[block {i}]", "exec"), namespace)


@pytest.mark.parametrize("page", [p for p in DOCS if p.name in STANDALONE], ids=lambda p: p.name)
def test_doc_examples_run_alone(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i, code in enumerate(BLOCK.findall(page.read_text())):
        exec(compile(code, f"{page.name}[block {i}]", "exec"), {"__name__": f"docs.{page.stem}"})
