import sys

from samebits.diagnostics.lint.cli import main

sys.exit(main())
