import sys

from samebits.lint.cli import main

sys.exit(main())
