"""``dra-driver controller``: resolve pending claims, say why they cannot be satisfied, and allocate
the ones that ask for it."""
