"""Publish: the described devices as ResourceSlices, and their health as it changes."""
