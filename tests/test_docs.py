"""The docs cannot drift from the code, and refer to nothing outside the repository.

* docs/commands.md's generated block is what ``image.docs_options`` renders from the live
  parsers now (a flag added without ``python -m image.docs_options --write`` fails here), and
  every command (console script, module building an ArgumentParser) is in it.
* Every ``EDGE_*`` name the runtime's code (edge/) uses is a key of
  ``edge.config.env.ENVIRONMENT``; every other ``EDGE_*`` name in the repository is one of
  ``image.docs_options.NOT_RUNTIME`` (launcher, unit and build-host names, each with its reason).
* Every relative link and ``.md`` path in README.md and docs/*.md resolves to a file in the
  repository (and a ``#fragment`` to a heading there); each file README's command table names
  exists; each ``--flag`` a doc shows after a command name is a flag of that command.
* No file of the repository points outside it (the lab notes, the design and style pages
  kept beside the checkout, the workspace's absolute paths).
"""

from __future__ import annotations

import argparse
import re
import tomllib
import subprocess
from pathlib import Path

import pytest

from edge.config.env import ENVIRONMENT
from image import docs_options as D

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
VARIABLE = re.compile(r"\bEDGE_[A-Z0-9_]*[A-Z0-9]")
SKIP_DIRS = {".git", ".venv", ".cache", "__pycache__", "build", "dist", ".pytest_cache", ".hypothesis", "out"}

# Pointers to files that live beside the checkout, not in it (written so that this file does
# not match them itself).
OUTSIDE = re.compile("|".join([
    r"\.\./shared\b",
    r"\b(?:LAB|DESIGN|STYLE)\.md\b",
    r"(?<![\w.])/wor[k]/",
]))


# ------------------------------------------------------------------ helpers


def _repo_files() -> list[Path]:
    """Tracked files and new files git does not ignore; a walk when this is not a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True, timeout=60).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.SubprocessError):
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                 if p.is_file() and not SKIP_DIRS & set(p.relative_to(REPO).parts)
                 and not any(part.endswith(".egg-info") for part in p.relative_to(REPO).parts)]
    return [REPO / n for n in sorted(set(names)) if (REPO / n).is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def _py_files(top: str) -> list[Path]:
    return sorted(p for p in (REPO / top).rglob("*.py") if "__pycache__" not in p.parts)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M):
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path: Path) -> list[str]:
    """Targets of ``[text](target)`` outside fenced code."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every documented command and subcommand name -> its parser."""
    out = {}
    for cmd in D.COMMANDS:
        for name, parser, _ in D.walk(cmd.name, cmd.parser()):
            out.setdefault(name, parser)
    return out


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def _code_spans(text: str) -> list[str]:
    """Inline code spans, and the lines of fenced blocks (a line starting with whitespace
    continues the line before it)."""
    spans = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.splitlines():
            if line[:1].isspace() and spans and line.strip():
                spans[-1] += " " + line.strip()
            else:
                spans.append(line.split("  #")[0])
    rest = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    spans += re.findall(r"`([^`\n]+)`", rest)
    return spans


# ------------------------------------------------------------------ generated options


def test_generated_block_is_current():
    now, generated = D.current_block(), D.render()
    if now != generated:
        diff = "\n".join(D.check()[:60])
        pytest.fail(f"docs/commands.md is stale; run `python -m image.docs_options --write`:\n{diff}")


def test_every_command_is_in_the_generator():
    modules = {c.module for c in D.COMMANDS}
    tables = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["edge"]["scripts"]
    scripts = {**tables["device"], **tables["build-host"]}
    assert len(scripts) == len(tables["device"]) + len(tables["build-host"])  # no name in both
    for name, entry in scripts.items():
        target = entry.removesuffix(":main")
        if name == "edge":
            continue  # edge.cli: its serve subcommand is edge.runtime.serve_args' parser; both are listed
        assert target in modules, f"console script {name} ({target}) is not in image.docs_options.COMMANDS"
    assert {"edge.cli", "edge.runtime.serve_args"} <= modules
    for top in ("edge", "image", "bench"):
        for path in _py_files(top):
            if "ArgumentParser(" not in path.read_text():
                continue
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            assert module in modules or module in D.NOT_COMMANDS, (
                f"{module} builds an ArgumentParser: add it to image.docs_options.COMMANDS "
                "(or NOT_COMMANDS, with the reason) and regenerate docs/commands.md")


def test_every_subcommand_has_a_table():
    block = D.current_block()
    names = _commands()
    for name in names:
        if name == "edge serve" or any(isinstance(a, argparse._SubParsersAction) for a in names[name]._actions):
            continue
        assert f"### `{name}`" in block, name
    for sub in ("edge-package build", "edge-tokenizer compile", "edge-tokenizer prune", "edge-tokenizer encode",
                "edge-bundle build", "edge-bundle verify", "edge embed", "edge health", "edge stats"):
        assert sub in names, sub


def test_parser_of_stops_before_main_runs():
    ran = []

    def main(argv):
        ap = argparse.ArgumentParser(prog="x")
        ap.add_argument("--flag")
        try:
            ap.parse_args(argv)
        except Exception:  # a main that swallows every Exception cannot swallow the sentinel
            ran.append("swallowed")
        ran.append("ran")
        return 0

    parser = D.parser_of(main)
    assert parser.prog == "x" and "--flag" in _flags(parser) and ran == []
    assert argparse.ArgumentParser.parse_args.__name__ == "parse_args"  # restored
    assert argparse.ArgumentParser(prog="y").parse_args([]) == argparse.Namespace()


# ------------------------------------------------------------------ EDGE_* variables


def test_runtime_names_are_in_environment():
    used = {}
    for path in _py_files("edge"):
        for name in VARIABLE.findall(path.read_text()):
            used.setdefault(name, str(path.relative_to(REPO)))
    missing = {n: f for n, f in used.items() if n not in ENVIRONMENT}
    assert not missing, f"EDGE_* names in edge/ that edge.config.env.ENVIRONMENT does not list: {missing}"
    assert not set(ENVIRONMENT) & set(D.NOT_RUNTIME), set(ENVIRONMENT) & set(D.NOT_RUNTIME)


def test_every_edge_name_in_the_repository_is_documented():
    found: dict[str, str] = {}
    for path in _repo_files():
        text = _text(path)
        if text is None:
            continue
        for name in VARIABLE.findall(text):
            found.setdefault(name, str(path.relative_to(REPO)))
    unknown = {n: f for n, f in found.items() if n not in ENVIRONMENT and n not in D.NOT_RUNTIME}
    assert not unknown, (f"EDGE_* names that are neither in edge.config.env.ENVIRONMENT nor in "
                         f"image.docs_options.NOT_RUNTIME (with the reason): {unknown}")
    generated = {"docs/commands.md", "image/docs_options.py"}
    for name in D.NOT_RUNTIME:
        users = [p for p in _repo_files() if str(p.relative_to(REPO)) not in generated
                 and name in (_text(p) or "")]
        assert users, f"{name} is in NOT_RUNTIME but nothing uses it any more"


# ------------------------------------------------------------------ links and paths


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve_inside_the_repository(doc):
    problems = []
    for target in _links(doc):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, fragment = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.is_relative_to(REPO) or not dest.exists():
            problems.append(f"{target}: no such file in the repository")
            continue
        if fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            problems.append(f"{target}: no heading #{fragment} in {dest.relative_to(REPO)}")
    for ref in re.findall(r"`([^`\s]+\.md)`", doc.read_text()):
        if ref.startswith("/"):
            continue  # an install destination on the device (/usr/local/share/doc/...), not a source
        if not any((base / ref).resolve().is_file() and (base / ref).resolve().is_relative_to(REPO)
                   for base in (doc.parent, REPO)):
            problems.append(f"`{ref}`: no such file in the repository")
    assert not problems, problems


def _readme_table() -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    section = text.split("## What is here", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    assert rows and rows[0] == ["command", "what it does", "doc"], rows[:1]
    return rows[1:]


def test_readme_command_table_names_existing_files_and_commands():
    commands = _commands()
    rows = _readme_table()
    assert any("docs/commands.md" in r[2] for r in rows), "README's table has no line for docs/commands.md"
    for command, _, doc in rows:
        paths = re.findall(r"\]\(([^)#\s]+)", doc) + re.findall(r"`([^`\s]+)`", doc)
        assert paths, f"no doc named for {command}"
        for p in paths:
            assert (REPO / p).is_file(), f"README: {command}: {p} does not exist"
        for span in re.findall(r"`([^`]+)`", command):
            name = max((n for n in commands if span == n or span.startswith(n + " ")), key=len, default=None)
            assert name is not None, f"README names a command the docs do not: {span}"
            subs = re.match(re.escape(name) + r" (\w[\w-]*(?:/\w[\w-]*)+)\b", span)
            for sub in (subs.group(1).split("/") if subs else []):
                assert f"{name} {sub}" in commands, f"README: {span}: no subcommand {sub}"


def test_flags_the_docs_show_exist():
    commands = _commands()
    problems = []
    for doc in DOCS:
        for span in _code_spans(doc.read_text()):
            span = span.strip().replace("\\|", "|")
            name = max((n for n in commands if span == n or span.startswith(n + " ")), key=len, default=None)
            if name is None:
                continue
            own, _, passed = span[len(name):].partition(" -- ")
            for command, part in ((name, own), (PASSED_TO.get(name), passed)):
                if command is None or not part:
                    continue
                known = _flags(commands[command]) | {"-h", "--help"}
                for flag in re.findall(r"(?<![\w=-])(--?[a-z][a-z0-9-]*)", part):
                    if flag not in known:
                        problems.append(f"{doc.relative_to(REPO)}: `{span}`: {command} has no {flag}")
    assert not problems, problems


# The command whose arguments follow `--` on a command line of these (edge-bundle emulated runs
# edge-bundle build in another architecture's root).
PASSED_TO = {"edge-bundle emulated": "edge-bundle build"}


# ------------------------------------------------------------------ nothing outside the repository


def test_nothing_refers_to_files_outside_the_repository():
    hits = []
    for path in _repo_files():
        text = _text(path)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            m = OUTSIDE.search(line)
            if m:
                hits.append(f"{path.relative_to(REPO)}:{n}: {m.group()}: {line.strip()[:100]}")
    assert not hits, "replace each with the fact itself or a file in the repository:\n" + "\n".join(hits)
