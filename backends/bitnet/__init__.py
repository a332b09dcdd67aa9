"""The bitnet backend (issue 6): placeholder package; see backends/bitnet/src."""
