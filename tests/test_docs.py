"""The docs and the test suite say only what is true, checked here:

* README's reliability table is what ``python -m scripts.check.fault_counts`` prints from the fault suite's
  own collection (so counts cannot drift);
* the contracts README points to exist in the repository, and no doc describes code that does
  not exist (the records merge "fast path");
* CPU tests of the prefetcher and the device cache pin ``device="cpu"`` (on a CUDA machine the
  default device is the GPU and their CPU comparisons would mean something else).
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_reliability_tables_are_the_suites_own_count():
    printed = subprocess.run([sys.executable, "-m", "scripts.check.fault_counts"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.strip()
    assert printed.startswith("| suite |")
    for doc in ("README.md", "docs/faults.md"):
        assert printed in (REPO / doc).read_text(), f"{doc}'s table is stale: rerun python -m scripts.check.fault_counts"


def test_contracts_are_in_the_repository():
    readme = (REPO / "README.md").read_text()
    assert "docs/contracts.md" in readme and (REPO / "docs" / "contracts.md").is_file()
    for doc in DOCS:
        assert "DESIGN.md" not in doc.read_text(), f"{doc.name} points at DESIGN.md, not in the repository"
    for link in re.findall(r"\]\(((?:docs|scripts|tests)/[^)#]+)\)", readme):
        assert (REPO / link).exists(), f"README links to {link}, which does not exist"


def test_no_doc_claims_a_records_merge_fast_path():
    from packer.formats.base import Writer
    from packer.formats.records import RecordsWriter

    if RecordsWriter.merge_parts.__func__ is not Writer.merge_parts.__func__:
        pytest.skip("records has its own merge now: document it")
    for doc in DOCS:
        text = doc.read_text().lower()
        assert "merge fast path" not in text and "link the shards into one sequence" not in text, doc.name


@pytest.mark.parametrize("name", ["test_prefetch.py", "test_cache.py"])
def test_cpu_tests_pin_the_device(name):
    tree = ast.parse((REPO / "tests" / name).read_text())
    unpinned = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
        marks = {ast.unparse(d) for d in fn.decorator_list}
        if "needs_cuda" in marks or "cuda" in fn.name:
            continue  # the separate CUDA tests
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            callee = ast.unparse(call.func)
            if callee in ("DevicePrefetcher", "DevicePrefetcher.cache") and not any(
                    k.arg == "device" for k in call.keywords):
                unpinned.append(f"{fn.name}:{call.lineno}")
    assert unpinned == [], f"CPU tests using the default device: {unpinned}"
