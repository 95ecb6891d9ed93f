"""Engine, embedded server, session binding and mapped tables."""
