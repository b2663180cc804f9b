"""``python -m hw.board`` (``make bitstream``): :func:`hw.board.board.main`; a failed stage
ends the program with its message (status 1) rather than a traceback."""

import sys

from hw.board.board import main
from hw.board.flow import BuildError

try:
    main()
except BuildError as exc:
    sys.exit(f"make bitstream: {exc}")
