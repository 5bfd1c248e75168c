"""``python -m e2e.bench.scale``: the scale bench's curve (:func:`e2e.bench.scale.curve.main`)."""

from __future__ import annotations

import sys

from e2e.bench.scale.curve import main

sys.exit(main())
