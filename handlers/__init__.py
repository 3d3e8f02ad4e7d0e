"""Protocol handlers: one package per protocol, each a sans-IO codec and a trio session."""
