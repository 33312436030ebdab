"""Write ``docs/cli.md``, the command-line reference, from the ``zqsync`` argparse parsers.

    python tools/cli_reference.py          # rewrite docs/cli.md
    python tools/cli_reference.py --check  # exit 1 if docs/cli.md is stale

``tests/unit/test_cli_reference.py`` fails when the committed page differs from what this prints.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "cli.md")
WIDTH = 100
INTRO = """# Command-line reference

Generated from the `zqsync` argument parsers by `python tools/cli_reference.py`; `zqsync COMMAND --help`
prints the same. Every client command (`call`, `enqueue`, `job`, `stats`, `ping`, `beat`, `dashboard`)
takes its ENDPOINT from `ZQSYNC_ENDPOINT` when it is left out, and reads the other `ZQSYNC_*` client
settings of the [Client](reference/client.md) (timeouts, pool size). Mistakes print one line on stderr and
exit with status 1. Shell completion: `zqsync --print-completion bash`.
"""


def _cell(text: str) -> str:
    """One line of Markdown showing ``text`` as it is (no emphasis from ``*.key`` or ``_zqsync._tcp``)."""
    text = " ".join(text.split())
    for char in "\\|*_`":
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;")


def _name(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    if not action.option_strings:
        return f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
    if action.nargs == 0:
        return ", ".join(f"`{option}`" for option in action.option_strings)
    value = formatter._format_args(action, action.dest.upper())
    return ", ".join(f"`{option} {value}`" for option in action.option_strings)


def _section(title: str, parser: argparse.ArgumentParser) -> list[str]:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=WIDTH)  # type: ignore[assignment]
    formatter = parser._get_formatter()
    lines = [f"## {title}", "", "```text", parser.format_usage().strip(), "```", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    rows = [(_name(action, formatter), _cell(formatter._expand_help(action) if action.help else ""))
            for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
            and action.help != argparse.SUPPRESS]  # hidden, as in --help
    if rows:
        lines += ["| argument | meaning |", "|---|---|", *(f"| {name} | {text} |" for name, text in rows), ""]
    if parser.epilog:
        lines += [_cell(parser.epilog), ""]
    return lines


def render() -> str:
    """The page's Markdown."""
    sys.path.insert(0, ROOT)
    from zqsync.cli import build_parser

    parser = build_parser()
    lines = [INTRO, *_section("zqsync", parser)]
    (commands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    for name, sub in commands.choices.items():
        lines += _section(f"zqsync {name}", sub)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        with open(PAGE) as handle:
            stale = handle.read() != text
        if stale:
            print(f"{PAGE} is stale: run python tools/cli_reference.py", file=sys.stderr)
        return int(stale)
    with open(PAGE, "w") as handle:
        handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
