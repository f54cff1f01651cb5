"""`python -m fp4ref <command>`: the same as the `fp4ref` console script.

The command table lives in the top layer (reports/cli.py) because it names commands of
every layer; this module is the one documented upward import of fp4ref/ (tests/
test_layering.py exempts it), and nothing imports it.
"""
import sys

from reports.cli import main

sys.exit(main())
