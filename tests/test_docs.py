"""The docs: a short README, commands that run, a site that builds strictly, code that points into the repository.

- README.md stays at 250 lines or fewer; the rest lives in docs/, a MkDocs site (mkdocs.yml).
- Every ``r3rag ...`` command in a shell block of README.md or docs/ parses with the current CLI's
  parser (without running), so a renamed or removed flag fails here, not in a user's terminal.
- ``mkdocs build --strict`` passes (broken links, anchors and API references are errors); the tools
  come from .venv-docs (``bash scripts/setup_docs.sh``, run by ``scripts/setup_lint.sh``) and these
  tests skip, saying so, where it is missing.
- Comments and docstrings cite docs pages (``docs/recipes/lws.md``), never files outside the
  repository, and every docs page (and heading) they cite exists.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import re
import shlex
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from conftest import ROOT

from r3_env.cli import build_parser

README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS = ROOT / ".venv-docs" / "bin" / "mkdocs"
SETUP_DOCS = "run `bash scripts/setup_docs.sh` (MkDocs and its plugins in .venv-docs; setup_lint.sh runs it)"
MAX_README_LINES = 250

SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
OPERATORS = set("();<>|&")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line number of the opening fence, language, body) of every fenced code block, list indentation removed."""
    blocks, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        language = opening["info"].strip().split(" ")[0].lstrip(".").lower()
        body, index = [], index + 1
        start = index
        while index < len(lines) and not (
            lines[index].strip().startswith(fence) and set(lines[index].strip()) == {fence[0]}
        ):
            line = lines[index]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            index += 1
        blocks.append((start, language, "\n".join(body)))
        index += 1
    return blocks


def logical_lines(body: str) -> list[tuple[int, str]]:
    """(offset, line) of a shell block's commands, a backslash-newline joining a line to the next."""
    joined, start, current = [], 0, ""
    for offset, line in enumerate(body.splitlines()):
        if not current:
            start = offset
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        joined.append((start, current + line))
        current = ""
    if current:
        joined.append((start, current))
    return joined


def r3rag_invocations(line: str) -> list[list[str]]:
    """The arguments of each ``r3rag`` (or ``.venv/bin/r3rag``) command in one shell line; ``...`` elides."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    segments: list[list[str]] = [[]]
    for token in lexer:
        if set(token) <= OPERATORS:
            segments.append([])
        else:
            segments[-1].append(token)
    found = []
    for words in segments:
        while words and (ENV_ASSIGNMENT.match(words[0]) or words[0] == "env"):
            words = words[1:]
        if words and (words[0] == "r3rag" or words[0].endswith("/r3rag")):
            found.append([word for word in words[1:] if word != "..."])
    return found


def documented_commands(text: str, where: str) -> list[tuple[str, list[str] | None]]:
    """(file:line, arguments) of every r3rag command in the shell blocks of a markdown text.

    A line that does not split into shell words (an unclosed quote) comes back with None.
    """
    commands = []
    for start, language, body in fenced_blocks(text):
        if language not in SHELL_LANGUAGES:
            continue
        for offset, line in logical_lines(body):
            try:
                invocations = r3rag_invocations(line)
            except ValueError:  # shlex: no closing quotation
                invocations = [None] if "r3rag" in line else []
            commands.extend((f"{where}:{start + offset + 1}", args) for args in invocations)
    return commands


@functools.cache
def cli_parser() -> argparse.ArgumentParser:
    """The real CLI's parser with abbreviations off everywhere: docs spell every flag out in full."""
    parser = build_parser()
    pending = [parser]
    while pending:
        current = pending.pop()
        current.allow_abbrev = False
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    return parser


def parse_error(args: list[str] | None) -> str | None:
    """Why the CLI rejects ``args`` (argparse's message), or None when they parse. Nothing runs."""
    if args is None:
        return "the line does not split into shell words (an unclosed quote?)"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            cli_parser().parse_args(args)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            return stderr.getvalue().strip().splitlines()[-1] if stderr.getvalue().strip() else f"exit {exit_.code}"
    return None


def all_documented_commands() -> list[tuple[str, list[str] | None]]:
    return [
        command
        for path in doc_files()
        for command in documented_commands(path.read_text(), str(path.relative_to(ROOT)))
    ]


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines; move detail into docs/ (at most {MAX_README_LINES})"
    )


def test_every_code_block_names_its_language():
    """A block without a language would hide its commands from the command check below."""
    unnamed = [
        f"{path.relative_to(ROOT)}:{start}"
        for path in doc_files()
        for start, language, _ in fenced_blocks(path.read_text())
        if not language
    ]
    assert not unnamed, f"code blocks without a language (bash, text, yaml, python, ...): {unnamed}"


def test_every_documented_r3rag_command_parses():
    commands = all_documented_commands()
    assert len(commands) >= 40, f"only {len(commands)} r3rag commands found in README.md and docs/"
    subcommands = {args[0] for _, args in commands if args}
    assert {"demo", "world", "index", "retriever", "reward", "coldstart", "train", "eval", "r2ag", "model"} <= (
        subcommands
    )
    failures = [
        f"{where}: r3rag {shlex.join(args or [])}\n    {error}"
        for where, args in commands
        if (error := parse_error(args))
    ]
    assert not failures, "documented commands the CLI rejects:\n" + "\n".join(failures)


def test_the_command_check_fails_on_an_invented_flag():
    page = """Some text.

```bash
r3rag index build --corpus_path runs/world/corpus.jsonl --save_dir runs/index  # fine
OPENAI_API_KEY=... .venv/bin/r3rag coldstart synth --samples 4 \\
    --no_such_flag 3 --out runs/coldstart
r3rag demoo --quick
```

```text
r3rag demo --flag-in-output-is-not-a-command
```
"""
    commands = documented_commands(page, "page.md")
    assert [where for where, _ in commands] == ["page.md:4", "page.md:5", "page.md:7"]
    valid, invented, unknown_command = (parse_error(args) for _, args in commands)
    assert valid is None
    assert invented is not None and "--no_such_flag" in invented
    assert unknown_command is not None and "demoo" in unknown_command
    # an abbreviation the real CLI would accept is refused: docs spell flags out
    assert parse_error(["demo", "--qui"]) is not None and parse_error(["demo", "--quick"]) is None
    assert parse_error(["train", "local", "--ppo.actor_lr", "not-a-number"]) is not None
    [(_, unsplittable)] = documented_commands("```bash\nr3rag demo --out 'demo_out\n```\n", "page.md")
    assert unsplittable is None and parse_error(unsplittable) is not None


WORKED_EXAMPLES = ["development/step-format.md", "development/reward-scheme.md"]


@pytest.mark.parametrize("page", WORKED_EXAMPLES)
def test_the_worked_examples_run(page):
    """The python blocks of a worked example run in order, in a process of their own (they register names)."""
    blocks = [body for _, language, body in fenced_blocks((DOCS / page).read_text()) if language == "python"]
    assert blocks, f"docs/{page} has no python blocks"
    result = subprocess.run(
        [sys.executable, "-c", "\n\n".join(blocks)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"docs/{page}:\n{result.stdout}{result.stderr}"


def headings(path: Path) -> set[str]:
    """The anchors of a markdown page's headings, as MkDocs' toc extension makes them (or their {#id})."""
    anchors, in_code = set(), False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_code or match is None:
            continue
        title = match.group(1)
        explicit = re.search(r"\{[^}]*#([\w-]+)[^}]*\}\s*$", title)
        if explicit:
            anchors.add(explicit.group(1))
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
        text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
        text = re.sub(r"[^\w\s-]", "", text).strip().lower()
        anchors.add(re.sub(r"[-\s]+", "-", text))
    return anchors


CODE_SUFFIXES = {".py", ".sh", ".sbatch", ".yaml", ".yml", ".toml", ".ini", ".txt", ".mjs", ".md", ".cfg"}
OUTSIDE_REFERENCE = re.compile(r"\b(?:LWS|R2AG|R3-RAG)\.md\b|shared/spec\b|\bspec section\b|\bspec (?:LWS|R2AG)\b")
DOCS_REFERENCE = re.compile(r"\bdocs/([\w./-]+\.md)(?:#([\w-]+))?")


def repository_files() -> list[Path]:
    """The repository's text files: tracked, or new and not ignored (git's view, so envs and run outputs stay out)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    if listed.returncode != 0:
        pytest.skip(f"git ls-files failed: {listed.stderr.strip()}")
    paths = {ROOT / name for name in listed.stdout.splitlines()}
    return sorted(
        path
        for path in paths
        if path.is_file() and (path.suffix in CODE_SUFFIXES or path.name.startswith("Dockerfile"))
    )


def test_nothing_cites_a_file_outside_the_repository():
    this_file = Path(__file__).resolve()
    cited = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path in repository_files()
        if path.resolve() != this_file
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE_REFERENCE.search(line)
    ]
    assert not cited, "cite the docs pages (docs/recipes/*.md, ...), not the specs outside the repository:\n" + (
        "\n".join(cited)
    )


def test_every_cited_docs_page_and_heading_exists():
    """References like ``docs/recipes/lws.md#reward`` in code, comments, configs and READMEs resolve."""
    this_file = Path(__file__).resolve()
    broken, in_code = [], 0
    for path in repository_files():
        if path.resolve() == this_file or DOCS in path.parents:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for page, anchor in DOCS_REFERENCE.findall(line):
                in_code += path.suffix != ".md"
                target = DOCS / page
                if not target.is_file():
                    broken.append(f"{path.relative_to(ROOT)}:{number}: docs/{page} does not exist")
                elif anchor and anchor not in headings(target):
                    broken.append(f"{path.relative_to(ROOT)}:{number}: docs/{page} has no heading #{anchor}")
    assert not broken, "\n".join(broken)
    assert in_code >= 20, f"only {in_code} references to docs pages outside markdown files"


def test_readme_links_resolve():
    text = README.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    broken = []
    for link in links:
        if re.match(r"^[a-z]+:", link) or link.startswith("#"):
            continue
        page, _, anchor = link.partition("#")
        target = ROOT / page
        if not target.exists():
            broken.append(link)
        elif anchor and target.suffix == ".md" and anchor not in headings(target):
            broken.append(link)
    assert not broken, f"README.md links to missing files or headings: {broken}"


def mkdocs(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    if not MKDOCS.exists():
        pytest.skip(f"no {MKDOCS}: {SETUP_DOCS}")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2, not a finding
    return subprocess.run([str(MKDOCS), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_docs_build_strictly(tmp_path):
    result = mkdocs("build", "--strict", "--site-dir", str(tmp_path / "site"))
    assert result.returncode == 0, result.stdout + result.stderr
    built = tmp_path / "site"
    assert (built / "index.html").is_file() and (built / "recipes" / "r3-rag" / "index.html").is_file()
    api = (built / "api" / "rewards" / "index.html").read_text()
    assert "register_scheme" in api and "RewardScheme" in api, "the API pages lost their docstrings"


def test_the_strict_build_fails_on_a_broken_link_or_anchor(tmp_path):
    """The site's validation settings make broken links and anchors errors under --strict."""
    import yaml

    settings = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n## A section\n\nSee [the other page](other.md).\n")
    (tmp_path / "docs" / "other.md").write_text("# Other\n\nBack to [a section](index.md#a-section).\n")
    config = {"site_name": "check", "docs_dir": "docs", "validation": settings["validation"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    ok = mkdocs("build", "--strict", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for broken in ("[gone](missing.md)", "[gone](index.md#no-such-heading)"):
        (tmp_path / "docs" / "other.md").write_text(f"# Other\n\nBack to {broken}.\n")
        result = mkdocs("build", "--strict", cwd=tmp_path)
        assert result.returncode != 0, f"{broken} did not fail the build"
        assert "missing.md" in result.stderr + result.stdout or "no-such-heading" in result.stderr + result.stdout
