"""The kubelet's side: the plugin's gRPC servers (DRA, resource health, registration) and the probe."""
