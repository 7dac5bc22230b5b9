import sys

from kbd.cli import main

sys.exit(main())
