"""The public surface: every exported name resolves, and the CLI rejects bad commands."""
import subprocess
import sys

import fp4ref
from reports.cli import COMMANDS, main


def test_every_export_resolves():
    for name in fp4ref.__all__:
        assert getattr(fp4ref, name) is not None, name


def test_unknown_command_names_choices(capsys):
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "frobnicate" in err and all(c in err for c in COMMANDS)


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "fp4ref", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and all(c in out.stdout for c in COMMANDS)
