import sys

from cglab.cli import main

sys.exit(main())
