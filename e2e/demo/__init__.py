"""``make demo``: a bed with simulated GPU nodes, the example pods, and what each container got."""
