"""The README's examples run as pasted: each Python block compiles as a module (a top-level `async with` does not),
and each `pdcluster` command line it shows parses with the real parser."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from scripts.cli import build_parser

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
COMMANDS = [line.split("#")[0].strip() for block in re.findall(r"```bash\n(.*?)```", README, re.S)
            for line in block.splitlines() if line.strip().startswith("pdcluster ")]


@pytest.mark.parametrize("source", PYTHON_BLOCKS, ids=[f"block{i}" for i in range(len(PYTHON_BLOCKS))])
def test_each_python_example_compiles_as_a_module(source):
    compile(source, "README.md", "exec")


def test_the_readme_shows_commands_and_code():
    assert len(PYTHON_BLOCKS) >= 3 and len(COMMANDS) >= 4


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_line_parses(command):
    words = [w for w in shlex.split(command)[1:] if w not in ("...",)]
    build_parser().parse_args(words)  # SystemExit(2) on a flag that does not exist
