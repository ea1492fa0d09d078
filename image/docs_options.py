"""The option tables of docs/commands.md, generated from the commands' own argparse parsers.

    python -m image.docs_options --write    # rewrite the generated block of docs/commands.md
    python -m image.docs_options --check    # exit 1 (and print a diff) when the block is stale
    python -m image.docs_options            # print the block

The block sits between ``<!-- options:begin -->`` and ``<!-- options:end -->``. It holds one
table per command and subcommand (flag, value, default, environment variable, help text), the
table of every ``EDGE_*`` variable of :data:`edge.config.env.ENVIRONMENT` (the runtime's source
of truth), and the table of the ``EDGE_*`` names that are not the runtime's
(:data:`NOT_RUNTIME`). ``tests/test_docs.py`` compares the block with :func:`render`, so a
flag added without regenerating the docs fails the tests.

How each parser is reached (:data:`COMMANDS`):

* ``edge serve``: :func:`edge.runtime.serve_args.serve_parser` called with ``env={}``, so the defaults
  shown are the built-in ones, not whatever ``EDGE_*`` the caller has set.
* Every other command builds its parser inside ``main()``; those modules are not changed for
  the docs. :func:`parser_of` replaces ``argparse.ArgumentParser.parse_args`` (and
  ``parse_known_args``) for the length of one call by a function that raises :class:`_Caught`
  carrying the parser it was called on, then calls ``main([])``: the parser comes back fully
  built, and nothing after the parse (a build, a server, a benchmark) runs. ``_Caught``
  derives from ``BaseException`` so that a ``main`` wrapping its body in ``except Exception``
  cannot swallow it. Subcommands (``build``, ``verify``, ``compile``, ...) are found by walking
  the ``argparse._SubParsersAction`` among each parser's actions (what ``parser._subparsers``
  adds), recursively; an alias is listed once.

Rendering is deterministic across machines: a default that is a path inside this repository
is shown relative to it, one inside an installed distribution as ``<site-packages>/...``;
``-h/--help`` and options whose help is ``argparse.SUPPRESS`` are left out. A parser's epilog
is not rendered (it is prose, not an option).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import importlib
import re
import sys
import sysconfig
from pathlib import Path
from typing import Callable

__all__ = ["COMMANDS", "NOT_COMMANDS", "NOT_RUNTIME", "BEGIN", "END", "DOC", "Command", "parser_of", "walk", "render",
           "current_block", "write", "check", "main"]

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "commands.md"
BEGIN = "<!-- options:begin -->"
END = "<!-- options:end -->"


class Command:
    """One documented command: its name as typed, the module that owns its parser, its doc."""

    def __init__(self, name: str, module: str, doc: str, get: Callable[[], argparse.ArgumentParser] | None = None,
                 note: str = "") -> None:
        self.name = name
        self.module = module
        self.doc = doc  # the docs/ page (and #section) that explains the command; "" for none
        self._get = get
        self.note = note

    def parser(self) -> argparse.ArgumentParser:
        if self._get is not None:
            return self._get()
        return parser_of(importlib.import_module(self.module).main)


def _gateway_parser() -> argparse.ArgumentParser:
    from edge.gateway.options import gateway_parser

    return gateway_parser()


def _serve_parser() -> argparse.ArgumentParser:
    from edge.runtime.serve_args import serve_parser

    return serve_parser(env={})  # built-in defaults, whatever EDGE_* the caller has set


# Every command with a command line, in the order the docs list them. tests/test_docs.py checks
# that every console script of pyproject.toml and every module of edge/, image/ and bench/ that
# builds an ArgumentParser is here (or in NOT_COMMANDS).
COMMANDS = [
    Command("edge serve", "edge.runtime.serve_args", "protocol.md", _serve_parser,
            note="`python -m edge.boot` takes the same options (it is what `edge serve` execs)."),
    Command("edge gateway", "edge.gateway.options", "gateway.md", _gateway_parser,
            note="The HTTP gateway, a process of its own (systemd/edge-gateway.service)."),
    Command("edge", "edge.cli", "protocol.md",
            note="`edge serve` and `edge gateway` are documented above; their subcommand entries here only "
                 "forward to them."),
    Command("edge-package", "image.package_cli", "architecture.md"),
    Command("edge-tokenizer", "image.tokenizer.cli", "commands.md#edge-tokenizer-compile-prune-encode"),
    Command("edge-bundle", "image.build_bundle", "bundle.md"),
    Command("edge-supervise", "edge.supervise.main", "bundle.md#systemd-systemdedgeservice-and-edge-supervise",
            note="Run by systemd (edge.service), installed as one file at /usr/local/lib/edge/edge-supervise by "
                 "`edge-bundle supervisor --out FILE`; `python -m edge.supervise` from a checkout."),
    Command("edge-trial", "edge.update.install.trial", "update.md",
            note="Run by systemd (edge.service, edge-trial.service, edge-trial-failed.service), not by hand."),
    Command("edge-coldstart", "bench.coldstart.cli", "coldstart.md",
            note="`python -m bench.coldstart.cli` is the same command."),
    Command("python -m bench.engines", "bench.engines", "benchmarks.md#engines-benchenginespy"),
    Command("python -m bench.tokenizer", "bench.tokenizer", "benchmarks.md#tokenizer-benchtokenizerpy"),
    Command("python -m bench.serve", "bench.serve", "benchmarks.md#serve-benchservepy"),
    Command("python -m bench.health_load", "bench.health_load", "benchmarks.md#health-under-load-benchhealth_loadpy"),
    Command("python -m bench.gateway", "bench.gateway", "gateway.md#benchmarks"),
    Command("python -m bench.http_stacks", "bench.http_stacks", "gateway.md#the-http-stack"),
    Command("python -m bench.textmix", "bench.textmix", "benchmarks.md#the-text-mix"),
    Command("python -m bench.telemetry_stats", "bench.telemetry_stats", "telemetry.md#benchmark"),
    Command("python -m bench.journal_lookup", "bench.journal_lookup", "trace.md#benchmark"),
    Command("python -m bench.glue_server", "bench.glue_server", "benchmarks.md#serve-benchservepy"),
    Command("python -m image.bundle.measure", "image.bundle.measure",
            "bundle.md#start-time-the-bundle-under-runc-vs-a-plain-process"),
    Command("python -m image.tokenizer.schema", "image.tokenizer.schema",
            "architecture.md#tokenizer-build-side-imagetokenizer"),
    Command("python -m image.docs_options", "image.docs_options", "",
            note="It writes the tables of this page; with neither option it prints them."),
]

# Modules of edge/, image/ and bench/ that build an ArgumentParser but are not commands of the
# project, with the reason (none today; tests/ holds helpers such as tests/support/serve_fake.py,
# which are not commands and are not looked at).
NOT_COMMANDS: dict[str, str] = {
    "bench.coldstart.args": "edge-coldstart's parser, documented through its command (bench.coldstart.cli)",
}

# EDGE_* names in the repository that are not variables the runtime reads, and why. Everything
# the runtime (edge/) reads is in edge.config.env.ENVIRONMENT; tests/test_docs.py checks that every
# EDGE_ name in the tracked files is in one of the two, and in only one.
NOT_RUNTIME = {
    "EDGE_GATEWAY_ARGS": "the gateway unit's setting (systemd/edge-gateway.service, /etc/default/edge-gateway), "
                         "read by systemd: more `edge gateway` flags (docs/gateway.md)",
    "EDGE_BUILD_CHECKOUT": "packaging only: build_backend.py sets it for a checkout's editable install, and "
                           "setup.py then adds the build-host tools (image/, bench/) and their console scripts",
    "EDGE_IMAGE": "the podman unit's setting (deploy/podman/edge-podman.service), read by systemd: the image "
                  "podman runs (docs/fleet.md)",
    "EDGE_PODMAN_GLOBAL": "the podman unit's setting (deploy/podman/edge-podman.service): podman's global "
                          "flags for this host (docs/fleet.md)",
    "EDGE_PODMAN_ARGS": "the podman unit's setting (deploy/podman/edge-podman.service): extra podman run "
                        "flags for this host (docs/fleet.md)",
    "EDGE_TRACE_OUT": "build host only: `edge-bundle build` sets it for the boot it traces; the trace hook "
                      "(image/bundle/_trace_hook.py, loaded into that child) writes the trace there",
    "EDGE_BUNDLE": "the unit's setting (systemd/edge.service, /etc/default/edge), read by systemd: the bundle "
                   "directory, passed to edge-supervise as --bundle",
    "EDGE_CONTAINER_ID": "the unit's setting, read by systemd: the runc container id (default `edge`), passed to "
                         "edge-supervise as --id",
    "EDGE_PROBE_INTERVAL": "the unit's setting, read by systemd: seconds between edge-supervise's health probes "
                           "(default 10, below WatchdogSec), passed as --interval",
    "EDGE_SNAPSHOT": "the unit's setting, read by systemd: auto (default: restore from a matching snapshot, take "
                     "one after a fresh READY) or off, passed to edge-supervise as --snapshot",
    "EDGE_TRIAL_SUSTAIN": "the trial unit's setting (systemd/edge-trial.service, /etc/default/edge), read by "
                          "systemd: seconds the self-test must pass before an update commits, passed to "
                          "`edge-trial watch` as --sustain",
    "EDGE_TRIAL_INTERVAL": "the trial unit's setting, read by systemd: seconds between the trial's self-test runs, "
                           "passed to `edge-trial watch` as --interval",
    "EDGE_UNIT": "tests only: the renamed unit a scenario in tests/support/trial_machine.py's machine drives",
    "EDGE_TEST_VARIANT": "tests only: a variable tests/support/trial_machine.py puts in a bundle's config.json so "
                         "that two variants of one bundle have two digests",
    "EDGE_ROOT": "not a variable: a constant of tests/test_launch.py (the checkout's root)",
}


# ------------------------------------------------------------------ reaching the parsers


class _Caught(BaseException):
    """Raised in place of parsing; carries the parser ``main()`` built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def parser_of(main: Callable[..., object], argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser ``main(argv)`` builds, caught at its first ``parse_args``; nothing after it runs."""

    def grab(self, args=None, namespace=None):
        raise _Caught(self)

    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = grab
    argparse.ArgumentParser.parse_known_args = grab
    try:
        main([] if argv is None else list(argv))
    except _Caught as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    raise RuntimeError(f"{main.__module__}.main returned without parsing its arguments")


def walk(name: str, parser: argparse.ArgumentParser, help_: str | None = None):
    """``(command name, parser, its help line)`` for ``parser`` and every subcommand below it."""
    yield name, parser, help_
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help for a in action._choices_actions}
        seen: set[int] = set()
        for sub_name, sub in action.choices.items():
            if id(sub) in seen:  # an alias
                continue
            seen.add(id(sub))
            yield from walk(f"{name} {sub_name}", sub, helps.get(sub_name))


# ------------------------------------------------------------------ rendering


def _site_dirs() -> list[Path]:
    dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    dirs |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    return sorted((Path(d).resolve() for d in dirs), key=lambda p: -len(str(p)))


def _path_text(value: str) -> str:
    p = Path(value)
    if not p.is_absolute():
        return value
    for site in _site_dirs():  # first: a virtual environment may live inside the checkout
        try:
            return f"<site-packages>/{p.resolve().relative_to(site)}"
        except ValueError:
            continue
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return value


def _cell(text: str) -> str:
    """Markdown table cell: ``|`` escaped; ``<``, ``>``, ``*`` escaped outside code spans."""
    text = " ".join(str(text).split())
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*")
    return "`".join(parts).replace("|", r"\|")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off"
    d = action.default
    if d is None or d is argparse.SUPPRESS or d == []:
        return "—"
    if isinstance(d, Path):
        return _code(_path_text(str(d)))
    if isinstance(d, str):
        return _code(_path_text(d) if d.startswith("/") else d)
    return _code(repr(d) if not isinstance(d, (int, float)) else str(d))


def _value(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if action.nargs == 0:
        return "—"
    a = copy.copy(action)
    if a.metavar is None:
        if a.choices:
            a.metavar = "|".join(map(str, a.choices))
        else:
            a.metavar = a.dest.upper() if a.option_strings else a.dest
    a.choices = None
    fmt = parser._get_formatter()
    return _code(fmt._format_args(a, a.metavar))


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = action.help or ""
    if text:
        try:
            text = parser._get_formatter()._expand_help(action)
        except (KeyError, TypeError, ValueError):
            pass
    if isinstance(action, argparse._AppendAction) and "repeatable" not in text:
        text = f"{text} (repeatable)" if text else "repeatable"
    if not action.option_strings:
        text = f"positional; {text}" if text else "positional"
    return text


def _env_names(command: str, action: argparse.Action, help_text: str) -> list[str]:
    """``EDGE_*`` names the help text names, and those ENVIRONMENT maps to ``command --flag``."""
    from edge.config.env import ENVIRONMENT

    names = re.findall(r"EDGE_[A-Z0-9_]+", help_text)
    for flag in action.option_strings:
        pattern = re.compile(re.escape(f"{command} {flag}") + r"(?![\w-])")
        names += [k for k, v in ENVIRONMENT.items() if pattern.search(v)]
    return list(dict.fromkeys(names))


def _options(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help is argparse.SUPPRESS:
            continue
        yield action


def _table(command: str, parser: argparse.ArgumentParser, env_of: dict[str, list[str]]) -> list[str]:
    rows = ["| option | value | default | env | meaning |", "|---|---|---|---|---|"]
    for action in _options(parser):
        help_text = _help(parser, action)
        names = _env_names(command, action, help_text)
        label = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        for n in names:
            env_of.setdefault(n, []).append(f"`{command}` {label}")
        rows.append(f"| {_cell(label)} | {_cell(_value(parser, action))} | {_cell(_default(action))} | "
                    f"{_cell(', '.join(f'`{n}`' for n in names))} | {_cell(help_text)} |")
    return rows


def _first_line(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split()).replace("``", "`")


def render() -> str:
    """The generated block, markers included (one trailing newline)."""
    from edge.config.env import ENVIRONMENT

    out = [BEGIN, "<!-- generated by `python -m image.docs_options --write`; edit the parsers, not this block -->",
           ""]
    env_of: dict[str, list[str]] = {}
    names = {c.name for c in COMMANDS}
    for cmd in COMMANDS:
        root = cmd.parser()
        for i, (name, parser, help_) in enumerate(walk(cmd.name, root)):
            if i and name in names:  # documented as a command of its own (edge serve)
                continue
            options = list(_options(parser))
            subs = any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
            if subs and not options:  # a program of subcommands only: its subcommands carry the tables
                continue
            out.append(f"### `{name}`")
            out.append("")
            line = _first_line(help_ if i else parser.description)
            bits = [_cell(line)] if line else []
            if cmd.doc.startswith(f"{DOC.name}#"):  # a prose section of this page
                bits.append(f"More: [above]({cmd.doc[len(DOC.name):]}).")
            elif cmd.doc:
                bits.append(f"More: [docs/{cmd.doc.split('#')[0]}]({cmd.doc}).")
            if i == 0 and cmd.note:
                bits.append(cmd.note)
            if bits:
                out.append(" ".join(b if b.endswith((".", ")", ":")) else b + "." for b in bits))
                out.append("")
            if options:
                out.extend(_table(name, parser, env_of))
            else:
                out.append("No options.")
            out.append("")
    out.append("### `EDGE_*` environment variables")
    out.append("")
    out.append("Every variable the runtime reads (`edge.config.env.ENVIRONMENT`). A flag given on the command "
               "line wins over its variable.")
    out.append("")
    out.append("| variable | what it sets | option |")
    out.append("|---|---|---|")
    for name, what in ENVIRONMENT.items():
        out.append(f"| `{name}` | {_cell(what)} | {_cell(', '.join(env_of.get(name, [])) or '—')} |")
    out.append("")
    out.append("`EDGE_*` names in the repository that the runtime does not read "
               "(`image.docs_options.NOT_RUNTIME`):")
    out.append("")
    out.append("| name | what it is |")
    out.append("|---|---|")
    for name, what in NOT_RUNTIME.items():
        out.append(f"| `{name}` | {_cell(what)} |")
    out.append("")
    out.append(END)
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ the doc


def current_block(text: str | None = None) -> str:
    """The block as docs/commands.md holds it now, markers included."""
    text = DOC.read_text() if text is None else text
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC}: no {BEGIN} ... {END} block")
    return text[start:end + len(END)] + "\n"


def write() -> bool:
    """Rewrite the block; True when it changed."""
    text = DOC.read_text()
    old = current_block(text)
    new = render()
    if old == new:
        return False
    start = text.find(BEGIN)
    DOC.write_text(text[:start] + new + text[start + len(old):])
    return True


def check() -> list[str]:
    """The unified diff from the doc's block to the generated one (empty: up to date)."""
    return list(difflib.unified_diff(current_block().splitlines(), render().splitlines(),
                                     "docs/commands.md (now)", "generated", lineterm=""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m image.docs_options", description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the generated block of docs/commands.md")
    mode.add_argument("--check", action="store_true", help="exit 1 and print a diff when the block is stale")
    args = ap.parse_args(argv)
    if args.write:
        print(f"{'rewrote' if write() else 'unchanged:'} {DOC.relative_to(REPO)}")
        return 0
    if args.check:
        diff = check()
        if diff:
            print("\n".join(diff))
            print("docs/commands.md is stale: run `python -m image.docs_options --write`", file=sys.stderr)
            return 1
        print("docs/commands.md is up to date")
        return 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
