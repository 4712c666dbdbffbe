"""The node side of data staging: the manifest and the fan-out of a dataset over private links."""
