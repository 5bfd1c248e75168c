"""Operator tools that read what both programs leave behind: ``dra-driver explain`` (the controller's
verdict on one claim, worked out here) and ``dra-driver debug-bundle`` (the cluster's view and the
node plugin's files)."""
