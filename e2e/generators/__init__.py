"""Generators of test objects that both test trees use: the slices our plugin publishes for a
simulated node and a fleet of such nodes (``fleet``), a GPU cluster's objects as the API server
returns them (``clusterobjects``), and the differential's scenario corpus and its 1.38 family
(``scenarios``, ``scenarios_names``). They live apart from the suites and the benches, so a unit test
imports a generator, never a test module."""
