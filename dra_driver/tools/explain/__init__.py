"""``dra-driver explain``: why a pod waits, and why a ResourceClaim is, could be, or cannot be allocated.

Imports go one way (the ``tools.explain`` contract in ``pyproject.toml``): :mod:`.command` (the
command: arguments, the cluster's rules, the output format) → :mod:`.pod` (``explain pod/NAME``: each
claim of a pod) | :mod:`.pending` (``explain -n NS`` and ``-A``: the pending claims, grouped by the
reason the controller wrote on them) → :mod:`.claim` (``explain claim/NAME``: one claim's report,
the controller's engine run for it) → :mod:`.targets` (what the arguments name, read as kubectl
reads them) | :mod:`.drivers` (which drivers a claim is for). Nothing is imported here, so that
reading :mod:`.targets` (the command line does, to declare its flags) loads no report.
"""
