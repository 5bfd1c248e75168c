"""Generators of test objects that both test trees use: the differential's scenario corpus and its
1.38 family (``scenarios``, ``scenarios_names``), and the synthetic inventories of the resolution
benchmark (``synthetic``). They live apart from the suites and the benches, so a unit test imports a
generator, never a test module."""
