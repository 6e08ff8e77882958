"""`python -m sru_lightning <command> ...` (see `python -m sru_lightning --help`)."""

import sys

from sru_lightning.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
