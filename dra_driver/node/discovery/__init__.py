"""GPU discovery: backends behind one interface (see ``backend.Backend``)."""
