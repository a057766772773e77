"""Print the fault suite's counts as the markdown table pasted into README.md and docs/faults.md.

The counts come from the suite itself (pytest's collection of ``tests/faults/test_faults_*.py``),
so the docs cannot drift from what the tests run: one row per test function, with how many cases
it runs in all and how many of those are in the quick run (``-m "not slow"``).

    python -m scripts.check.fault_counts
    PACKER_FAULT_STATS=/tmp/s.json python -m pytest tests/faults/test_faults_corrupt.py
    python -m scripts.check.fault_counts --corruption /tmp/s.json   # what those corruptions did
"""
from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def collect() -> list[tuple[str, bool]]:
    """(node id, marked slow) for every case pytest collects from the fault suites."""
    code = ("import sys, pytest\n"
            "class P:\n"
            "    def pytest_collection_finish(self, session):\n"
            "        for i in session.items:\n"
            "            print('CASE', int(i.get_closest_marker('slow') is not None), i.nodeid)\n"
            "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', '-o', 'addopts=', "
            "*sys.argv[1:]], plugins=[P()]))\n")
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_faults_*.py"))
    out = subprocess.run([sys.executable, "-c", code, *files], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return [(line.split(" ", 2)[2], line.split(" ", 2)[1] == "1") for line in out.splitlines()
            if line.startswith("CASE ")]


def table(cases: list[tuple[str, bool]]) -> str:
    """The markdown table of fault cases per test function: (node id, marked slow) pairs in."""
    everything = collections.Counter(i.split("[", 1)[0] for i, _ in cases)
    quick = collections.Counter(i.split("[", 1)[0] for i, slow in cases if not slow)
    lines = ["| suite | test | cases | in the quick run |", "|---|---|---|---|"]
    for name in sorted(everything):
        path, test = name.split("::", 1)
        lines.append(f"| `{Path(path).name}` | `{test}` | {everything[name]} | {quick.get(name, 0)} |")
    lines.append(f"| **all** | | **{sum(everything.values())}** | **{sum(quick.values())}** |")
    return "\n".join(lines)


def corruption(path: str) -> None:
    """Summarise a ``PACKER_FAULT_STATS`` file of the corruption suite: caught vs harmless."""
    counts: collections.Counter = collections.Counter()
    for line in open(path):
        counts.update(json.loads(line))
    rows: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for key, n in counts.items():
        fmt, target, _op, outcome = key.split(":")
        rows[(fmt, target)][outcome] += n
    print("| output | damaged file | caught by verify | harmless |")
    print("|---|---|---|---|")
    for (fmt, target), c in sorted(rows.items()):
        print(f"| {fmt} | {target} | {c['caught']} | {c['harmless']} |")
    print(f"| **all** | | **{sum(c['caught'] for c in rows.values())}** | "
          f"**{sum(c['harmless'] for c in rows.values())}** |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corruption", metavar="FILE", help="summarise a PACKER_FAULT_STATS file instead")
    args = ap.parse_args()
    if args.corruption:
        corruption(args.corruption)
        return
    print(table(collect()))

if __name__ == "__main__":
    main()
