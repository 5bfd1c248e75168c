import sys

from e2e.demo.run import main

sys.exit(main())
