"""The docs and the test suite say only what is true, checked here:

* docs/faults.md's reliability table is what ``python -m scripts.check.fault_counts`` prints from the
  fault suite's own collection (so counts cannot drift);
* docs/cli.md is what ``scripts/gen_cli_docs.py`` renders from ``--help`` today;
* every ``packer <command>`` and ``--flag`` that README.md, CONTRIBUTING.md and docs/ show exists
  in the CLI, every Python name they show under ``packer`` imports, and every relative link
  (with its ``#section``) leads somewhere;
* no doc describes code that does not exist (the records merge "fast path");
* CPU tests of the prefetcher and the device cache pin ``device="cpu"`` (on a CUDA machine the
  default device is the GPU and their CPU comparisons would mean something else).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
PROSE = [d for d in DOCS if d.name != "cli.md"]  # cli.md is click's own text
REFRESH_CLI = "python scripts/gen_cli_docs.py"

# ---------------------------------------------------------------- reading the Markdown

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m.group(1).lower(), m.group(2)) for m in FENCE.finditer(text)]


def inline_spans(text: str) -> list[str]:
    """Every inline code span outside fenced blocks."""
    return INLINE.findall(FENCE.sub("", text))


def shell_lines(body: str) -> list[str]:
    """Logical lines of a block: backslash continuations joined."""
    return re.sub(r"\s*\\\n\s*", " ", body).splitlines()


# A ``packer`` that starts a command: not ``packer.x``, ``packer[ray]``, ``packer/x`` or a
# ``from packer import``; the command ends at a shell separator or a comment.
COMMAND = re.compile(r"(?<![\w./'\"\[-])(?<!from )(?<!import )packer((?:\s+-[\w-]+)*)\s+([a-z][\w-]*)([^\n]*)")
SHELL_END = re.compile(r"\s(?:&&|\|\||;|\|)\s|\s#|\)$")
SHELL_LIKE = ("", "bash", "sh", "shell", "console")  # not ``text``: printed output
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")


def command_mentions(text: str) -> list[tuple[str, list[str], str]]:
    """(command, its --flags, the text) for each ``packer <command>`` in code or inline code."""
    found = []
    segments = []
    for lang, body in code_blocks(text):
        if lang in ("python", "py"):  # a command shown in a comment ("# once, offline: packer ...")
            segments += [line.split("#", 1)[1] for line in shell_lines(body) if "#" in line]
        elif lang in SHELL_LIKE:
            segments += [re.sub(r"(^|\s)#.*", "", line) for line in shell_lines(body)]
    segments += inline_spans(text)
    for seg in segments:
        for m in COMMAND.finditer(seg):
            if m.group(2) in ("import", "as"):
                continue
            rest = SHELL_END.split(m.group(3), maxsplit=1)[0]
            found.append((m.group(2), FLAG.findall(rest), m.group(0).strip()))
    return found


def bare_flags(text: str) -> list[str]:
    """Flags named on their own in inline code (``--short-side 256``, ``--fit crop|pad``), except
    in a section that runs a script (``scripts/...``, ``python -m scripts.``), whose flags may be
    the script's."""
    def runs_script(s: str) -> bool:
        return "scripts/" in s or "-m scripts." in s

    unfenced = FENCE.sub(lambda m: "(a script block: scripts/)" if runs_script(m.group(0)) else "", text)
    sections = re.split(r"^#+ ", unfenced, flags=re.M)
    return [f for sec in sections if not runs_script(sec)
            for span in inline_spans(sec) if span.startswith("--") for f in FLAG.findall(span)]


IMPORT = re.compile(r"^\s*from\s+(packer(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n]+)", re.M)
DOTTED = re.compile(r"(?<![\w.])packer(?:\.[A-Za-z_]\w*)+")
NOT_NAMES = {"packer.json", "packer.sha256"}  # file names: the manifest, the uploaded files' hashes


def python_names(text: str) -> list[str]:
    """``packer.x.y`` and ``from packer[.mod] import Y`` names in code blocks and inline code."""
    code = [re.sub(r"#[^\n]*", "", body) for lang, body in code_blocks(text) if lang in ("python", "py", "")]
    names = []
    for body in code:
        for mod, imported in IMPORT.findall(body):
            imported = re.sub(r"\s+as\s+\w+", "", imported)  # ``import X as Y``: X is packer's
            names += [f"{mod}.{n}" for n in re.split(r"[,\s()]+", imported) if n.isidentifier()]
    for chunk in code + inline_spans(text):
        names += [n for n in DOTTED.findall(chunk) if n not in NOT_NAMES]
    return names


def resolves(dotted: str) -> bool:
    """Whether ``packer.a.b`` is an importable module or an attribute reached from one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def cli_commands() -> dict[str, set[str]]:
    """Each command of the ``packer`` CLI with its option names (and the group's, under '')."""
    from packer.cli import main

    def opts(cmd) -> set[str]:
        return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}

    return {"": opts(main), **{name: opts(cmd) for name, cmd in main.commands.items()}}


def mentions_by_doc():
    for doc in PROSE:
        text = doc.read_text()
        yield doc.relative_to(REPO).as_posix(), text


# ---------------------------------------------------------------- the tests


def test_reliability_table_is_the_suites_own_count(request):
    """docs/faults.md's table is what scripts.check.fault_counts prints: counted from this run's
    own collection when it holds every fault suite, else collected in a subprocess as the script does."""
    from scripts.check import fault_counts
    from tests.conftest import COLLECTED

    cases = [c for c in request.config.stash.get(COLLECTED, []) if "/test_faults_" in c[0]]
    suites = {str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_faults_*.py")}
    if {c[0].split("::", 1)[0] for c in cases} != suites:
        cases = fault_counts.collect()
    printed = fault_counts.table(cases)
    assert printed.startswith("| suite |")
    assert printed in (REPO / "docs" / "faults.md").read_text(), \
        "docs/faults.md's table is stale: rerun python -m scripts.check.fault_counts"
    total = re.search(r"^\| \*\*all\*\* \| \| \*\*(\d+)\*\* \|", printed, re.M).group(1)
    assert f"concurrent runs) | {total} |" in (REPO / "README.md").read_text(), \
        f"README's fault-injection figure is not the suite's {total} cases"


def test_cli_reference_is_current():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", REPO / "scripts" / "gen_cli_docs.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    page = REPO / "docs" / "cli.md"
    assert page.is_file(), f"docs/cli.md is missing: run {REFRESH_CLI}"
    assert page.read_text() == gen.render(), f"docs/cli.md is stale: run {REFRESH_CLI}"
    assert "[docs/cli.md](docs/cli.md)" in (REPO / "README.md").read_text(), "README does not link the CLI reference"


def test_command_mentions_are_parsed():
    """The parser under the next tests finds what a doc shows (else they could pass on nothing)."""
    text = ("```bash\npip install -e . && packer demo --count 3  # a comment --not-a-flag\n"
            "packer -v to-lmdb a b \\\n    --short-side 256 | tee log\n```\n"
            "Inline `packer verify x --no-decode` and `--fit crop|pad`; `packer.json`, "
            "`from packer import pack` not a command.\n"
            "```python\nfrom packer.data import (IMAGENET_MEAN,\n    uint8_collate)\nimport packer\n"
            "packer.pack('a', 'b')  # packer.not_this\n```\n")
    assert command_mentions(text) == [("demo", ["--count"], "packer demo --count 3"),
                                      ("to-lmdb", ["--short-side"], "packer -v to-lmdb a b --short-side 256 | tee log"),
                                      ("verify", ["--no-decode"], "packer verify x --no-decode")]
    assert bare_flags(text) == ["--fit"]
    assert python_names(text) == ["packer.data.IMAGENET_MEAN", "packer.data.uint8_collate", "packer.data",
                                  "packer.pack"]
    assert resolves("packer.data.IMAGENET_MEAN") and not resolves("packer.data.NO_SUCH_NAME")


def test_every_command_and_flag_shown_exists():
    commands = cli_commands()
    every_flag = set().union(*commands.values())
    wrong, seen = [], 0
    for doc, text in mentions_by_doc():
        for command, flags, shown in command_mentions(text):
            seen += 1
            if command not in commands:
                wrong.append(f"{doc}: no command 'packer {command}' ({shown!r})")
                continue
            wrong += [f"{doc}: 'packer {command}' has no {f} ({shown!r})" for f in flags
                      if f not in commands[command] | commands[""]]
        wrong += [f"{doc}: no command has {f}" for f in bare_flags(text) if f not in every_flag]
    assert seen > 50, f"only {seen} commands found in the docs: is the parser broken?"
    assert wrong == [], "\n".join(wrong)


def _python_names() -> list[tuple[str, str]]:
    found: dict[str, list[str]] = {}
    for doc, text in mentions_by_doc():
        for name in python_names(text):
            found.setdefault(name, [])
            if doc not in found[name]:
                found[name].append(doc)
    return sorted((name, ", ".join(docs)) for name, docs in found.items())


@pytest.mark.parametrize("name,docs", _python_names(), ids=[n for n, _ in _python_names()])
def test_every_python_name_shown_exists(name, docs):
    assert resolves(name), f"{docs} show {name}, which does not import"


GITHUB_SLUG_DROP = re.compile(r"[^\w\- ]")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return GITHUB_SLUG_DROP.sub("", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def test_links_lead_somewhere():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", doc.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http(s)://, mailto:
            path, _, fragment = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{doc.name}: {target} (no such section)")
    assert broken == [], "\n".join(broken)


def test_scripts_and_tests_named_exist():
    """A ``scripts/...`` or ``tests/...`` file a doc names (to run or to read) is in the repository."""
    missing = []
    for doc, text in mentions_by_doc():
        for path in sorted(set(re.findall(r"(?<![\w/.])((?:scripts|tests)/[\w./-]*\w\.(?:py|md))", text))):
            if not (REPO / path).is_file():
                missing.append(f"{doc}: {path}")
    assert missing == [], "\n".join(missing)


def test_scripts_readme_names_every_script():
    """Every file under scripts/ is named in scripts/README.md (as ``scripts/x/y.py`` or as the
    module ``scripts.x.y`` it runs as), so none is there without a word on what it is for."""
    readme = (REPO / "scripts" / "README.md").read_text()
    unnamed = []
    for path in sorted((REPO / "scripts").rglob("*")):
        rel = path.relative_to(REPO)
        if not path.is_file() or "__pycache__" in rel.parts or path.name in ("__init__.py", "README.md"):
            continue
        module = ".".join(rel.with_suffix("").parts)
        if rel.as_posix() not in readme and not re.search(rf"{re.escape(module)}\b", readme):
            unnamed.append(rel.as_posix())
    assert unnamed == [], f"scripts/README.md does not name: {unnamed}"


def test_scripts_import_nothing_from_tests():
    """The benchmarks and checks stand on packer and scripts/ alone: what they share with the tests
    lives in scripts/ (or packer.synth), and the tests import it from there."""
    importing = []
    for path in sorted((REPO / "scripts").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "tests" or n.startswith("tests.") for n in names):
                importing.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert importing == [], f"scripts import tests: {importing}"


def test_contracts_are_in_the_repository():
    readme = (REPO / "README.md").read_text()
    assert "docs/contracts.md" in readme and (REPO / "docs" / "contracts.md").is_file()
    for doc in DOCS:
        assert "DESIGN.md" not in doc.read_text(), f"{doc.name} points at DESIGN.md, not in the repository"


def test_readme_is_short():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= 260, f"README.md has {lines} lines: move reference text into docs/ (issue 30 asks <= ~250)"


def test_no_doc_claims_a_records_merge_fast_path():
    from packer.formats.writer import Writer
    from packer.formats.records import RecordsWriter

    if RecordsWriter.merge_parts.__func__ is not Writer.merge_parts.__func__:
        pytest.skip("records has its own merge now: document it")
    for doc in DOCS:
        text = doc.read_text().lower()
        assert "merge fast path" not in text and "link the shards into one sequence" not in text, doc.name


@pytest.mark.parametrize("name", ["test_device_prefetch.py", "test_device_cache.py"])
def test_cpu_tests_pin_the_device(name):
    tree = ast.parse(next((REPO / "tests").rglob(name)).read_text())  # wherever the tests' layout puts it
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


def test_api_page_lists_the_public_api():
    """docs/api.md is the one page of the public API: every name of packer.__all__ and
    packer.data.__all__, and nothing that is not there."""
    import packer
    import packer.data

    text = (REPO / "docs" / "api.md").read_text()
    listed = set(re.findall(r"`(packer(?:\.data)?)\.([A-Za-z_0-9]+)(?:\(\.\.\.\))?`", text))
    public = {("packer", n) for n in packer.__all__ if n != "__version__"}
    public |= {("packer.data", n) for n in packer.data.__all__ if n not in packer.__all__}  # else listed once, as packer.X
    assert public - listed == set(), f"public names missing from docs/api.md: {sorted(public - listed)}"
    prose = {("packer", "__all__"), ("packer.data", "__all__"), ("packer", "cli"), ("packer", "data"), ("packer.data", "multigrid")}
    assert listed - public - prose == set(), f"docs/api.md lists non-public names: {sorted(listed - public)}"
