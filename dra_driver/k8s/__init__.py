"""The one way to the API server: client, credentials, informers, leader election, and helpers for
the objects it returns (quantities, names, claims, the protobuf wire form)."""
