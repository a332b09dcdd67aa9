"""The conformance suite: pytest modules parametrized from the specs by mlconf.plugin."""
