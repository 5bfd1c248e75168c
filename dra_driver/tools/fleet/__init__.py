"""The fleet through kubectl: ``get gpus`` (also ``devices``), ``get nodes``, ``top`` and ``fit``,
all read-only.

Imports go one way (the ``tools.fleet`` contract in ``pyproject.toml``): :mod:`.command` (the
commands: the kubeconfig, the read-only client, the output format) → :mod:`.gpus` | :mod:`.nodes` |
:mod:`.top` | :mod:`.fit` (the views, pure but for ``fit``'s read of its template or pod) →
:mod:`.devices` (every device's state and holders) → :mod:`.reads` (what is read, and the client
that can only read) | :mod:`.args` (the flags, what ``fit`` is asked about) | :mod:`.table`
(columns). Nothing is imported here, so that reading :mod:`.args` (the command line does, to declare
its flags) loads no view.
"""
