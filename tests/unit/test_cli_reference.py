"""The site's command-line reference (docs/cli.md) is what ``tools/cli_reference.py`` makes of the parsers now."""

from __future__ import annotations

import argparse
import importlib.util
import os

from tests.conftest import ROOT


def load_generator():
    spec = importlib.util.spec_from_file_location("cli_reference", os.path.join(ROOT, "tools", "cli_reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_page_is_current():
    generator = load_generator()
    assert os.path.exists(generator.PAGE), "docs/cli.md is missing: run python tools/cli_reference.py"
    with open(generator.PAGE) as handle:
        committed = handle.read()
    assert committed == generator.render(), "docs/cli.md is stale: run python tools/cli_reference.py"


def test_the_page_names_every_command_and_option():
    from zqsync.cli import build_parser

    parser = build_parser()
    page = load_generator().render()
    commands = parser._subparsers._group_actions[0].choices
    for name, sub in commands.items():
        assert f"## zqsync {name}\n" in page
        for action in sub._actions:  # but --help, and the options --help hides (the deprecated --direct)
            for option in action.option_strings if action.dest != "help" and action.help != argparse.SUPPRESS else ():
                assert f"`{option}" in page, (name, option)
