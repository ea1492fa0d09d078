"""``python -m edge.supervise``: edge-supervise from a checkout (the installed file is built by ``edge-bundle supervisor``)."""

import sys

from edge.supervise.main import main

sys.exit(main())
