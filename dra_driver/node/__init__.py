"""The node plugin (``dra-driver kubelet-plugin``): discovers GPUs, publishes ResourceSlices and
prepares claims for the kubelet."""
