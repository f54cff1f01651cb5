import sys

from fp4ref.cli import main

sys.exit(main())
